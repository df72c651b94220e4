"""The CEL rules (webhook/install/celpolicy.py) alone, through a real kube-apiserver.

The webhook registrations are deleted: only the ValidatingAdmissionPolicies judge. They
must refuse each bypass they express, admit plain pods and correctly shaped GPU pods,
and agree with the decision core on generated objects, rule by rule.
"""

from __future__ import annotations

import copy
import itertools
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.core.strategies import IDENTITIES, apply_update, attacked_objects, objects, pod_updates
from tests.e2e.rest import COLLECTIONS, DIFFERENTIAL, Api, Sent, gpu_pod, sendable, stored_pod
from tests.paths import ROOT
from webhook.core.decision import Request, decide
from webhook.core.review import review_object
from webhook.dev.cluster import DevCluster, running
from webhook.install.celpolicy import RULES, validating_policies
from webhook.policies import load_policy

pytestmark = pytest.mark.e2e

Obj = dict[str, Any]

POLICY: Final = load_policy(None)
# Bounded for CI: each example is one dry-run request (~10 ms).
EXAMPLES: Final = 1000
# The denial differential only checks the first refusing rule: fewer suffice.
DENY_EXAMPLES: Final = 300
UPDATE_EXAMPLES: Final = 100
WARN_LABEL: Final = "gpushare.io/cel-warn-only"
_RULE_IN_WARNING: Final = re.compile(
    r"ValidatingAdmissionPolicy '[^']*' with binding [^:]*: \[([a-z-]+)\]"
)
_RULE_IN_MESSAGE: Final = re.compile(
    r"ValidatingAdmissionPolicy '[^']*' with binding [^:]*: \[([a-z-]+)\]"
)


@pytest.fixture(scope="module")
def cel_cluster(bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    """A cluster of its own: the webhook registrations deleted, the CEL policies created."""
    from kubernetes import client

    workdir = tmp_path_factory.mktemp("celcluster")
    policy = workdir / "policy.yaml"
    policy.write_text((ROOT / "policies" / "default.yaml").read_text())
    with running(bin_dir=bin_dir, policy=policy, workdir=workdir) as cluster:
        cluster.unregister_webhooks()
        admission: Any = client.AdmissionregistrationV1Api(cluster.api_client())
        assert not admission.list_validating_webhook_configuration().items
        assert not admission.list_mutating_webhook_configuration().items
        objects = validating_policies(POLICY)
        for obj in [o for o in objects if o["kind"] == "ValidatingAdmissionPolicyBinding"]:
            # As rendered, bar one label: in namespaces with it a binding of its own only
            # warns, so every rule that fails shows (a denial names the first policy only).
            warn = copy.deepcopy(obj)
            for binding, operator in ((obj, "DoesNotExist"), (warn, "Exists")):
                selector = binding["spec"]["matchResources"]["namespaceSelector"]
                selector["matchExpressions"].append({"key": WARN_LABEL, "operator": operator})
            warn["metadata"]["name"] += "-warn"
            warn["spec"]["validationActions"] = ["Warn"]
            objects.append(warn)
        cluster.register_cel_policies(objects)
        cluster.create_namespace("cel-ready")
        api = Api(cluster)
        # The policies and bindings are loaded asynchronously: wait until each refuses.
        shapes = {rule: pod for pod, rule in BYPASSES.values()}
        assert set(shapes) == set(RULES)
        deadline = time.monotonic() + 30
        for rule, pod in sorted(shapes.items()):
            while vap_rules(api.create("Pod", "cel-ready", pod)) != {rule}:
                assert time.monotonic() < deadline, f"the CEL policy of {rule} never took effect"
                time.sleep(0.2)
        api.http.clear()
        yield cluster


@pytest.fixture(scope="module")
def api(cel_cluster: DevCluster) -> Iterator[Api]:
    client = Api(cel_cluster)
    yield client
    client.http.clear()


@pytest.fixture
def ns(cel_cluster: DevCluster, request: pytest.FixtureRequest) -> str:
    name: str = "cel-" + request.node.name.replace("_", "-").lower()[:40].strip("-[]")
    name = re.sub(r"[^a-z0-9-]", "-", name).strip("-")
    cel_cluster.create_namespace(name)
    return name


def vap_rules(sent: Sent) -> set[str]:
    """The rule ids of the CEL policies that refused ``sent`` (none: not refused by them)."""
    if sent.status != 403 or not isinstance(sent.body, dict):
        return set()
    return set(_RULE_IN_MESSAGE.findall(str(sent.body.get("message", ""))))


def core_denials(obj: Any, namespace: str, **request: Any) -> set[str]:
    entry = review_object(obj, POLICY, namespace=namespace, **request)
    return {v["rule"] for v in entry["violations"] if v["action"] == "deny"} & set(RULES)


def _pod(name: str, *containers: Obj, **spec: Any) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {"containers": list(containers), **spec},
    }


def _c(name: str = "app", gpu: bool = True, **extra: Any) -> Obj:
    container: Obj = {"name": name, "image": "busybox", **extra}
    if gpu:
        container["resources"] = {"limits": {"nvidia.com/gpumem": "3000"}}
    return container


def _env(*pairs: tuple[str, Any]) -> list[Obj]:
    env = []
    for name, value in pairs:
        if isinstance(value, dict):
            env.append({"name": name, "valueFrom": value})
        else:
            env.append({"name": name, "value": value})
    return env


_FIELD: Final = {"fieldRef": {"fieldPath": "metadata.name"}}

# name -> (pod, the rule that refuses it)
BYPASSES: Final[dict[str, tuple[Obj, str]]] = {
    "privileged": (_pod("p", _c(securityContext={"privileged": True})), "privileged-gpu"),
    "privileged-init": (
        _pod(
            "p", _c(), initContainers=[_c("init", gpu=False, securityContext={"privileged": True})]
        ),
        "privileged-gpu",
    ),
    "node-name": (_pod("p", _c(), nodeName="gpu-node-1"), "node-name-pinning"),
    "visible-devices-all": (
        _pod("p", _c(gpu=False, env=_env(("NVIDIA_VISIBLE_DEVICES", "all")))),
        "raw-visible-devices",
    ),
    "visible-devices-index": (
        _pod("p", _c(env=_env(("NVIDIA_VISIBLE_DEVICES", " 0,1 ")))),
        "raw-visible-devices",
    ),
    "visible-devices-value-from": (
        _pod("p", _c(gpu=False, env=_env(("NVIDIA_VISIBLE_DEVICES", _FIELD)))),
        "raw-visible-devices",
    ),
    "disable-control": (
        _pod("p", _c(env=_env(("CUDA_DISABLE_CONTROL", " True")))),
        "limit-tampering",
    ),
    # Python's strip() drops \x1c-\x1f, CEL's trim() does not: matched as the core strips.
    "disable-control-odd-space": (
        _pod("p", _c(env=_env(("CUDA_DISABLE_CONTROL", "\x1cTrue\u3000")))),
        "limit-tampering",
    ),
    "core-policy-disable": (
        _pod("p", _c(env=_env(("GPU_CORE_UTILIZATION_POLICY", "DISABLE")))),
        "limit-tampering",
    ),
    "redirect": (_pod("p", _c(env=_env(("CUDA_REDIRECT", "libcuda.so")))), "limit-tampering"),
    "oom-killer-off": (
        _pod("p", _c(env=_env(("ACTIVE_OOM_KILLER", "0")))),
        "limit-tampering",
    ),
    "switch-expanded": (
        _pod("p", _c(env=_env(("X", "1"), ("CUDA_DISABLE_CONTROL", "$(X)")))),
        "limit-tampering",
    ),
    "switch-value-from": (
        _pod("p", _c(env=_env(("ACTIVE_OOM_KILLER", _FIELD)))),
        "limit-tampering",
    ),
    "scheduler": (_pod("p", _c(), schedulerName="my-scheduler"), "scheduler-bypass"),
    "scheduler-mps": (
        {
            **_pod("p", _c(), schedulerName="volcano"),
            "metadata": {"name": "p", "annotations": {"gpushare.io/mode": " MPS"}},
        },
        "scheduler-bypass",
    ),
    "forged-annotation": (
        {
            **_pod("p", _c()),
            "metadata": {"name": "p", "annotations": {"hami.io/vgpu-devices-allocated": "GPU-0"}},
        },
        "forged-allocation",
    ),
    "forged-glob": (
        {
            **_pod("p", _c(gpu=False)),
            "metadata": {"name": "p", "annotations": {"hami.io/mlu-devices-to-allocate": "x"}},
        },
        "forged-allocation",
    ),
}

ADMITTED: Final[dict[str, Obj]] = {
    "plain": _pod("p", _c(gpu=False)),
    "plain-privileged": _pod("p", _c(gpu=False, securityContext={"privileged": True})),
    "plain-node-name": _pod("p", _c(gpu=False), nodeName="node-1"),
    "gpu": _pod("p", _c()),
    "gpu-settings": _pod(
        "p",
        _c(
            env=_env(
                ("NVIDIA_VISIBLE_DEVICES", " None"),
                ("CUDA_DISABLE_CONTROL", "false"),
                ("GPU_CORE_UTILIZATION_POLICY", "force"),
                ("CUDA_REDIRECT", ""),
                ("ACTIVE_OOM_KILLER", "true"),
            )
        ),
    ),
    "plain-scheduler": _pod("p", _c(gpu=False), schedulerName="volcano"),
    "gpu-hami-scheduler": _pod("p", _c(), schedulerName="hami-scheduler"),
    "mig-scheduler": _pod(
        "p",
        _c(gpu=False, resources={"limits": {"nvidia.com/mig-1g.5gb": "1"}}),
        schedulerName="volcano",
    ),
    "gpu-odd-space": _pod(
        "p",
        _c(
            env=_env(
                ("NVIDIA_VISIBLE_DEVICES", "\x1fVoid\u00a0"),
                ("CUDA_DISABLE_CONTROL", "\x1c0"),
            )
        ),
    ),
    "plain-switches": _pod("p", _c(gpu=False, env=_env(("CUDA_DISABLE_CONTROL", "1")))),
    "other-annotations": {
        **_pod("p", _c()),
        "metadata": {"name": "p", "annotations": {"hami.io/vgpu-mode": "x", "team": "ml"}},
    },
}


def _deployment(pod: Obj) -> Obj:
    template = copy.deepcopy(pod)
    template.pop("apiVersion")
    template.pop("kind")
    template["metadata"] = {**template.get("metadata", {}), "labels": {"app": "cel"}}
    template["metadata"].pop("name", None)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "d"},
        "spec": {"selector": {"matchLabels": {"app": "cel"}}, "template": template},
    }


def _cronjob(pod: Obj) -> Obj:
    template = _deployment(pod)["spec"]["template"]
    template["spec"]["restartPolicy"] = "Never"
    return {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": "cj"},
        "spec": {"schedule": "* * * * *", "jobTemplate": {"spec": {"template": template}}},
    }


@pytest.mark.parametrize("shape", sorted(BYPASSES))
def test_each_bypass_is_refused_without_the_webhook(api: Api, ns: str, shape: str) -> None:
    pod, rule = BYPASSES[shape]
    assert rule in core_denials(pod, ns)
    for kind, obj in (("Pod", pod), ("Deployment", _deployment(pod)), ("CronJob", _cronjob(pod))):
        sent = api.create(kind, ns, obj)
        assert vap_rules(sent) == {rule}, (kind, sent.status, sent.body)


@pytest.mark.parametrize("shape", sorted(ADMITTED))
def test_plain_and_well_shaped_gpu_pods_are_admitted(api: Api, ns: str, shape: str) -> None:
    pod = ADMITTED[shape]
    for kind, obj in (("Pod", pod), ("Deployment", _deployment(pod)), ("CronJob", _cronjob(pod))):
        sent = api.create(kind, ns, obj)
        assert sent.status == 201, (kind, sent.body)


def test_forged_allocation_on_update_follows_the_writers(api: Api, ns: str) -> None:
    tenant, _ = IDENTITIES["tenant"]
    scheduler, _ = IDENTITIES["scheduler"]
    api.grant_pod_patch(ns, tenant, scheduler)
    created = api.create("Pod", ns, gpu_pod("victim"), dry_run=False)
    assert created.status == 201, created.body
    forged = {"metadata": {"annotations": {"hami.io/vgpu-node": "node-1"}}}
    refused = api.patch_pod(ns, "victim", forged, user=tenant)
    assert refused.status == 403 and "[forged-allocation]" in str(refused.body), refused.body
    written = api.patch_pod(ns, "victim", forged, user=scheduler)
    assert written.status == 200, written.body
    for patch in (
        {"metadata": {"annotations": {"hami.io/vgpu-node": "node-2"}}},
        {"metadata": {"annotations": {"hami.io/vgpu-node": None}}},
    ):
        sent = api.patch_pod(ns, "victim", patch, user=tenant)
        assert sent.status == 403 and "[forged-allocation]" in str(sent.body), sent.body
    labelled = api.patch_pod(ns, "victim", {"metadata": {"labels": {"a": "b"}}}, user=tenant)
    assert labelled.status == 200, labelled.body


def warned_rules(api: Api, kind: str, namespace: str, obj: Obj) -> tuple[int, Any, set[str]]:
    """A dry-run create; its status, body and the rule ids of the policies' warnings."""
    url = api.server + COLLECTIONS[kind].format(ns=namespace) + "?dryRun=All"
    response = api.http.request(
        "POST", url, body=orjson.dumps(obj, default=str), headers=api.headers, timeout=30
    )
    warnings = " ".join(response.headers.getlist("Warning"))
    return response.status, orjson.loads(response.data), set(_RULE_IN_WARNING.findall(warnings))


def test_cel_verdicts_equal_the_cores_rule_by_rule(cel_cluster: DevCluster, api: Api) -> None:
    """Differential, exact per rule: in a namespace where the bindings only warn, every
    failing CEL rule shows as a warning; for generated objects, the set of warned rules
    equals the set of rendered rules the core denies."""
    namespace = "cel-warn-only"
    from kubernetes import client

    core: Any = client.CoreV1Api(cel_cluster.api_client())
    core.create_namespace({"metadata": {"name": namespace, "labels": {WARN_LABEL: "1"}}})
    cel_cluster.create_namespace(namespace)
    results: list[tuple[str, Obj, int, Any, set[str]]] = []
    counter = itertools.count()

    @settings(DIFFERENTIAL, max_examples=EXAMPLES)
    @given(st.one_of(objects(), attacked_objects()))
    def send(example: tuple[str, Obj]) -> None:
        kind, obj = example
        obj = sendable(kind, obj, f"w{next(counter)}")
        results.append((kind, obj, *warned_rules(api, kind, namespace, obj)))

    started = time.monotonic()
    send()
    mismatches = []
    seen_rules: set[str] = set()
    admitted = 0
    for kind, obj, status, body, got in results:
        if status in (400, 422):
            continue
        assert status == 201, body
        admitted += 1
        want = core_denials(body, namespace)
        seen_rules |= got
        if got != want:
            mismatches.append((kind, sorted(got), sorted(want), obj))
    elapsed = time.monotonic() - started
    print(
        f"CEL rule-by-rule differential: {admitted} admitted of {len(results)} in {elapsed:.1f} s"
    )
    assert not mismatches, f"{len(mismatches)} differ; first: {mismatches[0]}"
    assert seen_rules == set(RULES), seen_rules
    assert admitted >= EXAMPLES // 20


def test_cel_verdicts_equal_the_cores(api: Api, ns: str) -> None:
    """Differential: for generated objects, the rules the CEL policies refuse equal the
    CEL-rendered rules the core denies. The apiserver names only the first policy that
    refuses, so per object: refused exactly when the core denies a rendered rule, and by
    one of the rules the core denies."""
    sent: list[Sent] = []
    counter = itertools.count()

    @settings(DIFFERENTIAL, max_examples=DENY_EXAMPLES)
    @given(st.one_of(objects(), attacked_objects()))
    def send(example: tuple[str, Obj]) -> None:
        kind, obj = example
        sent.append(api.create(kind, ns, sendable(kind, obj, f"x{next(counter)}")))

    started = time.monotonic()
    send()
    mismatches = []
    counts = {"refused": 0, "admitted": 0, "invalid": 0}
    refused_by: set[str] = set()
    for item in sent:
        if item.status in (400, 422):
            counts["invalid"] += 1
            continue
        assert item.status in (201, 403), (item.status, item.body)
        counts["refused" if item.status == 403 else "admitted"] += 1
        # What the policies saw: the object as decoded and defaulted (the dry-run answer).
        seen = item.body if item.status == 201 else item.obj
        want = core_denials(seen, ns)
        got = vap_rules(item)
        # The apiserver names the first refusing policy only: it must be one the core
        # denies, and the CEL policies refuse exactly when the core denies a CEL rule.
        if len(got) > 1 or not got <= want or bool(got) != bool(want):
            mismatches.append((item.kind, sorted(got), sorted(want), item.obj))
        refused_by.update(got)
    print(
        f"CEL differential over {len(sent)} objects in {time.monotonic() - started:.1f} s: {counts}"
    )
    assert not mismatches, f"{len(mismatches)} differ; first: {mismatches[0]}"
    assert counts["refused"] >= DENY_EXAMPLES // 50, counts
    assert counts["admitted"] >= DENY_EXAMPLES // 20, counts
    print(f"refused by: {sorted(refused_by)}")


class _Recording:
    """An HTTP pool that keeps the last response, for its Warning headers."""

    def __init__(self, http: Any) -> None:
        self.http = http
        self.last: Any = None

    def request(self, *args: Any, **kwargs: Any) -> Any:
        self.last = self.http.request(*args, **kwargs)
        return self.last


def test_cel_update_verdicts_equal_the_cores_rule_by_rule(cel_cluster: DevCluster) -> None:
    """Differential for pod UPDATEs (annotations added, changed or removed, labels,
    `kubectl debug` containers) by the tenant, the scheduler and look-alikes, in the
    warn-only namespace: the rules warned equal the rendered rules the core denies."""
    from kubernetes import client

    namespace = "cel-warn-only-updates"
    core: Any = client.CoreV1Api(cel_cluster.api_client())
    core.create_namespace({"metadata": {"name": namespace, "labels": {WARN_LABEL: "1"}}})
    cel_cluster.create_namespace(namespace)
    api = Api(cel_cluster)
    recording = _Recording(api.http)
    api.http = recording  # type: ignore[assignment]
    api.grant_pod_patch(namespace, *(user for user, _ in IDENTITIES.values()))
    sent: list[tuple[Sent, set[str], Obj, str, tuple[str, ...]]] = []
    counter = itertools.count()

    @settings(DIFFERENTIAL, max_examples=UPDATE_EXAMPLES)
    @given(
        st.sampled_from(["plain", "allocated", "gpu"]),
        pod_updates(),
        st.sampled_from(sorted(IDENTITIES)),
    )
    def send(base: str, edits: list[tuple[str, Any, Any]], identity: str) -> None:
        old = stored_pod(api, namespace, f"u{next(counter)}", base)
        debug = [e for e in edits if e[0] == "debug"]
        new = apply_update(old, debug or edits)
        user, groups = IDENTITIES[identity]
        answer = api.update_pod(namespace, old, new, user=user)
        warnings = " ".join(recording.last.headers.getlist("Warning"))
        got = set(_RULE_IN_WARNING.findall(warnings))
        sent.append((answer, got, old, user, groups))

    send()
    mismatches = []
    warned: set[str] = set()
    for answer, got, old, user, groups in sent:
        if answer.status in (400, 422):
            continue
        assert answer.status == 200, answer.body
        request = Request(
            kind="Pod", operation="UPDATE", namespace=namespace, username=user, groups=groups
        )
        decision = decide(answer.body, request, POLICY, phase="validate", old=old)
        want = {v["rule"] for v in decision.denials} & set(RULES)
        warned |= got
        if got != want:
            mismatches.append((user, sorted(got), sorted(want), answer.obj, old["metadata"]))
    assert not mismatches, f"{len(mismatches)} differ; first: {mismatches[0]}"
    assert "forged-allocation" in warned, warned
    recording.http.clear()


def test_policies_of_a_policy_with_exemptions_and_globs_compile(api: Api) -> None:
    """The apiserver compiles every expression of a policy with exemptions, writer
    globs and a mode of its own (a server-side dry-run create checks the CEL)."""
    from tests.install.test_celpolicy import CUSTOM

    for obj in validating_policies(CUSTOM):
        obj["metadata"]["name"] += "-custom"
        if obj["kind"] == "ValidatingAdmissionPolicyBinding":
            obj["spec"]["policyName"] += "-custom"
        collection = (
            "validatingadmissionpolicies"
            if obj["kind"] == "ValidatingAdmissionPolicy"
            else "validatingadmissionpolicybindings"
        )
        url = f"{api.server}/apis/admissionregistration.k8s.io/v1/{collection}?dryRun=All"
        response = api.http.request("POST", url, body=orjson.dumps(obj), headers=api.headers)
        assert response.status == 201, response.data


def test_large_pods_stay_within_the_cel_cost_limits(api: Api, ns: str) -> None:
    """A runtime cost limit exceeded is an error, and failurePolicy Fail refuses: a pod
    with 60 containers of 200 env entries each and 200 annotations is still judged."""
    containers = [
        _c(f"c{i}", env=[{"name": f"E{j}", "value": "v"} for j in range(200)]) for i in range(60)
    ]
    pod = _pod("big", *containers)
    pod["metadata"]["annotations"] = {f"example.com/a{k}": "v" for k in range(200)}
    admitted = api.create("Pod", ns, pod)
    assert admitted.status == 201, admitted.body
    containers[-1]["securityContext"] = {"privileged": True}
    refused = api.create("Pod", ns, pod)
    assert vap_rules(refused) == {"privileged-gpu"}, refused.body
