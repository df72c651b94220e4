"""The webhooks' matchConditions through a real kube-apiserver: what reaches the webhook.

The conditions (webhook/render/scope.py, registered by the dev cluster from the policy
it serves) must send every object the decision core acts on, and nothing else that is
common: a plain pod never waits on the webhook, and with the webhook down plain pods
are admitted while GPU pods are still refused (validate.gpushare.io fails closed).

Whether the webhook was called is read from its audit log (one line per request, with
the object's name); the objects are server-side dry-run creates and updates, so nothing
is stored but the pods the updates start from.

Each target of the two differentials (a GPU resource, NVIDIA_VISIBLE_DEVICES, hostPath
volumes, device-request mounts, CDI and reserved annotations, the old object's
annotations, ephemeral containers) was checked to fail them when left out of the
generated conditions.
"""

from __future__ import annotations

import copy
import itertools
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.core.strategies import (
    ALL_KINDS,
    CONTAINER_KINDS,
    IDENTITIES,
    INJECTED_NAMES,
    apply_update,
    attack_env,
    attacked_objects,
    device_request_paths,
    host_paths,
    objects,
    pod_metadata,
    pod_specs,
    pod_updates,
    wrap,
)
from tests.e2e.rest import (
    ALLOCATION,
    API_VERSIONS,
    COLLECTIONS,
    DIFFERENTIAL,
    SELECTOR,
    Api,
    Obj,
    Sent,
    gpu_pod,
    plain_container,
    sendable,
    stored_pod,
)
from webhook.core.decision import Request, decide
from webhook.core.review import review_object
from webhook.dev.cluster import DevCluster, running
from webhook.policies import load_policy

pytestmark = pytest.mark.e2e


# Bounded for CI (2 cores): each example is one dry-run request (~10 ms); 500 take
# ~10 s here.
EXAMPLES: Final = 500
# An update example stores its pod first (one to three requests more).
UPDATE_EXAMPLES: Final = 150


@pytest.fixture(scope="module")
def api(cluster: DevCluster) -> Iterator[Api]:
    client = Api(cluster)
    yield client
    client.http.clear()


def admitted_names(cluster: DevCluster, namespace: str, *, sentinel: str | None = None) -> set[str]:
    """Names of the objects of ``namespace`` the webhook answered (either endpoint).

    With ``sentinel``: first wait until that name is logged. Records are written in the
    order they were answered, so everything sent before the sentinel is in by then.
    """
    assert cluster.webhook is not None
    deadline = time.monotonic() + 15
    while True:
        names = set()
        for line in cluster.webhook.audit_log.read_bytes().splitlines():
            ref = orjson.loads(line).get("objectRef") or {}
            if ref.get("namespace") == namespace:
                names.add(str(ref.get("name") or ""))
        if sentinel is None or sentinel in names or time.monotonic() > deadline:
            return names
        time.sleep(0.05)


def core_acts(obj: Any, namespace: str) -> list[str]:
    """What the decision core would do with ``obj``: its violations, a patch, warnings."""
    if not isinstance(obj, dict):
        return []
    entry = review_object(obj, POLICY, namespace=namespace)
    acts = [f"{v['rule']}: {v['message']}" for v in entry["violations"]]
    if entry["patch"]:
        acts.append(f"patch {entry['patch'][:2]}")
    acts.extend(f"warning {w}" for w in entry["warnings"])
    return acts


POLICY: Final = load_policy(None)


# Annotation keys a GPU-free pod can carry that the rules still read: CDI device
# requests (any *cdi.k8s.io/ prefix) and the scheduler's reserved keys.
_GPU_FREE_ANNOTATIONS: Final = (
    "cdi.k8s.io/gpu",
    "nvidia.cdi.k8s.io/gpu",
    "cdi.k8s.io/vfio",
    "hami.io/vgpu-node",
    "hami.io/mig-devices-allocated",
    "example.com/cdi.k8s.io",
)
_CDI_VALUES: Final = ("nvidia.com/gpu=all", "example.com/dev=1", "nvidia.com/gpu=GPU-0")


def _drop_injected(spec: Obj) -> None:
    for kind in CONTAINER_KINDS:
        for container in spec.get(kind, []):
            mounts = [
                m for m in container.get("volumeMounts", []) if m["name"] not in INJECTED_NAMES
            ]
            container.pop("volumeMounts", None)
            if mounts:
                container["volumeMounts"] = mounts
    if "volumes" in spec:
        spec["volumes"] = [v for v in spec["volumes"] if v["name"] not in INJECTED_NAMES]


@st.composite
def gpu_free_objects(draw: st.DrawFn) -> tuple[str, Obj]:
    """(kind, object) whose containers ask for no GPU, with one of the things the rules
    still judge in any pod spliced in (or not): what is left to catch is env, host
    paths, device-request mounts and annotations, and most of the rest is skipped."""
    kind = draw(st.sampled_from(ALL_KINDS))
    hostile = draw(st.integers(0, 3)) == 0
    metadata = draw(pod_metadata(hostile=hostile))
    spec = draw(pod_specs(hostile=hostile, gpu=()))
    if not hostile:
        # Without the injected volumes' names (which always reach the webhook), so that
        # what is spliced in below is often the one thing that decides.
        _drop_injected(spec)
    target = draw(st.sampled_from(spec["containers"]))
    what = draw(st.sampled_from(["nothing", "annotation", "env", "device-request", "hostPath"]))
    if what == "annotation":
        annotations = metadata.setdefault("annotations", {})
        annotations[draw(st.sampled_from(_GPU_FREE_ANNOTATIONS))] = draw(
            st.sampled_from(_CDI_VALUES)
        )
    elif what == "env":
        target.setdefault("env", []).extend(draw(attack_env()))
    elif what == "device-request":
        spec.setdefault("volumes", []).append({"name": "req", "emptyDir": {}})
        mounts = target.setdefault("volumeMounts", [])
        mounts.append({"name": "req", "mountPath": draw(device_request_paths())})
    elif what == "hostPath":
        volumes = spec.setdefault("volumes", [])
        volumes.append({"name": "host", "hostPath": {"path": draw(host_paths())}})
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}
    return kind, wrap(pod, kind)


def test_webhook_sees_everything_the_core_acts_on(
    cluster: DevCluster, api: Api, namespace: str
) -> None:
    """Differential: generated objects (every bypass family, GPU and not, every kind) as
    dry-run creates; any object the core would mutate, refuse or warn about must have
    reached the webhook. An object the webhook was not called for is judged as the
    apiserver decoded it (the dry-run answer), which is what the webhook would have seen."""
    sent: list[Sent] = []
    counter = itertools.count()

    @settings(DIFFERENTIAL, max_examples=EXAMPLES)
    @given(st.one_of(objects(), attacked_objects(), gpu_free_objects()))
    def send(example: tuple[str, Obj]) -> None:
        kind, obj = example
        name = f"x{next(counter)}"
        sent.append(api.create(kind, namespace, sendable(kind, obj, name)))

    send()
    sentinel = api.create("Pod", namespace, gpu_pod("sentinel"))
    assert sentinel.status == 201, sentinel.body
    called = admitted_names(cluster, namespace, sentinel="sentinel")

    missed = []
    counts = {"called": 0, "skipped": 0, "undecodable": 0}
    for item in sent:
        if item.name in called:
            counts["called"] += 1
            continue
        if item.status == 400:
            # Refused while decoding (junk where a typed field is): no admission at all.
            counts["undecodable"] += 1
            continue
        counts["skipped"] += 1
        # Admitted by the dry run: the webhook would have seen the decoded object.
        seen = item.body if item.status == 201 else item.obj
        acts = core_acts(seen, namespace)
        if acts:
            missed.append((item.kind, item.status, acts, seen))
    print(f"scope differential over {len(sent)} objects: {counts}")
    assert not missed, f"{len(missed)} skipped although the core acts on them; first: {missed[0]}"
    # The run means something only if both sides happened often.
    assert counts["called"] >= EXAMPLES // 4, counts
    assert counts["skipped"] >= EXAMPLES // 20, counts


# What clusters run all day: none of it asks for a GPU or touches the GPU stack.
PLAIN_SPECS: Final[Mapping[str, Obj]] = {
    "nginx": {"containers": [plain_container()]},
    "resources": {
        "containers": [
            plain_container(
                resources={
                    "limits": {"cpu": "1", "memory": "512Mi"},
                    "requests": {"cpu": "100m", "memory": "128Mi"},
                }
            )
        ]
    },
    "env-config": {
        "containers": [
            plain_container(
                env=[
                    {"name": "LOG_LEVEL", "value": "debug"},
                    {"name": "CUDA_VISIBLE_DEVICES", "value": "0"},
                    {
                        "name": "POD_NAME",
                        "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}},
                    },
                ],
                volumeMounts=[{"name": "config", "mountPath": "/etc/app"}],
            )
        ],
        "volumes": [
            {"name": "config", "configMap": {"name": "app"}},
            {"name": "scratch", "emptyDir": {}},
        ],
    },
    "init-and-sidecar": {
        "initContainers": [
            plain_container(name="migrate", command=["sh", "-c", "true"]),
            plain_container(name="proxy", restartPolicy="Always"),
        ],
        "containers": [plain_container()],
        "nodeSelector": {"kubernetes.io/os": "linux"},
    },
    "privileged-no-gpu": {
        "containers": [plain_container(securityContext={"privileged": True})],
        "hostNetwork": True,
    },
}
PLAIN_ANNOTATIONS: Final = {
    "prometheus.io/scrape": "true",
    "kubectl.kubernetes.io/restartedAt": "2026-01-01T00:00:00Z",
}


def plain_objects() -> Iterator[tuple[str, Obj]]:
    """Every plain spec as a Pod and as the template of every workload kind."""
    for label, spec in PLAIN_SPECS.items():
        for kind in COLLECTIONS:
            pod: Obj = {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": label, "annotations": dict(PLAIN_ANNOTATIONS)},
                "spec": copy.deepcopy(spec),
            }
            if kind == "Pod":
                yield kind, pod
                continue
            template = {
                "metadata": pod["metadata"] | {"labels": dict(SELECTOR)},
                "spec": pod["spec"],
            }
            del template["metadata"]["name"]
            obj: Obj = {"apiVersion": API_VERSIONS[kind], "kind": kind, "metadata": {"name": label}}
            if kind == "CronJob":
                template["spec"]["restartPolicy"] = "Never"
                obj["spec"] = {
                    "schedule": "*/5 * * * *",
                    "jobTemplate": {"spec": {"template": template}},
                }
            elif kind == "Job":
                template["spec"]["restartPolicy"] = "Never"
                obj["spec"] = {"template": template}
            elif kind == "ReplicationController":
                obj["spec"] = {"selector": dict(SELECTOR), "template": template}
            else:
                obj["spec"] = {"selector": {"matchLabels": dict(SELECTOR)}, "template": template}
            yield kind, obj


def test_plain_pods_and_workloads_never_reach_the_webhook(
    cluster: DevCluster, api: Api, namespace: str
) -> None:
    sent = []
    for number, (kind, obj) in enumerate(plain_objects()):
        obj = sendable(kind, obj, f"plain-{number}")
        answer = api.create(kind, namespace, obj)
        assert answer.status == 201, (kind, answer.body)
        assert not core_acts(obj, namespace), obj
        sent.append(answer.name)
    assert api.create("Pod", namespace, gpu_pod("sentinel")).status == 201
    called = admitted_names(cluster, namespace, sentinel="sentinel")
    assert called == {"sentinel"}, sorted(called & set(sent))


VISIBLE: Final = "NVIDIA_VISIBLE_DEVICES"
DEVICE_REQUEST: Final = "/var/run/nvidia-container-devices/all"
# What only a GPU-relevant update does to a plain pod, so that the conditions' pod
# UPDATE cases (the old object's annotations, ephemeral containers) decide alone.
_TARGETED: Final[Mapping[str, list[tuple[str, Any, Any]]]] = {
    "remove-allocation": [("annotate", key, None) for key in ALLOCATION],
    "debug-visible-devices": [
        (
            "debug",
            {"name": "d", "image": "busybox", "env": [{"name": VISIBLE, "value": "all"}]},
            None,
        )
    ],
    "debug-device-request": [
        (
            "debug",
            {
                "name": "d",
                "image": "busybox",
                "volumeMounts": [{"name": "data", "mountPath": DEVICE_REQUEST}],
            },
            None,
        )
    ],
}


def test_webhook_sees_every_pod_update_the_core_acts_on(
    cluster: DevCluster, api: Api, namespace: str
) -> None:
    """Differential for pod UPDATEs (labels, annotations added, changed or removed,
    `kubectl debug` containers) by the tenant, the scheduler and look-alikes, on plain,
    allocated and GPU pods: an update the core would refuse or warn about reached the
    webhook. An update the webhook was not called for is judged as the apiserver would
    have sent it (the dry-run answer against the stored pod)."""
    api.grant_pod_patch(namespace, *(user for user, _ in IDENTITIES.values()))
    sent: list[tuple[Sent, Obj, str, tuple[str, ...]]] = []
    counter = itertools.count()

    @settings(DIFFERENTIAL, max_examples=UPDATE_EXAMPLES)
    @given(
        st.sampled_from(["plain", "allocated", "gpu"]),
        st.one_of(pod_updates(), st.sampled_from(sorted(_TARGETED)).map(_TARGETED.__getitem__)),
        st.sampled_from(sorted(IDENTITIES)),
    )
    def send(base: str, edits: list[tuple[str, Any, Any]], identity: str) -> None:
        old = stored_pod(api, namespace, f"u{next(counter)}", base)
        # One subresource per request: ephemeral containers alone, or metadata alone.
        debug = [e for e in edits if e[0] == "debug"]
        new = apply_update(old, debug or edits)
        user, groups = IDENTITIES[identity]
        sent.append((api.update_pod(namespace, old, new, user=user), old, user, groups))

    send()
    assert api.create("Pod", namespace, gpu_pod("sentinel")).status == 201
    admitted_names(cluster, namespace, sentinel="sentinel")
    assert cluster.webhook is not None
    called = set()
    for line in cluster.webhook.audit_log.read_bytes().splitlines():
        record = orjson.loads(line)
        ref = record.get("objectRef") or {}
        # Dry-run updates only: the scheduler's real write of an allocation is not one.
        if (
            ref.get("namespace") == namespace
            and record.get("verb") == "update"
            and record.get("dryRun")
        ):
            called.add(ref.get("name"))
    missed = []
    counts = {"called": 0, "skipped": 0, "invalid": 0}
    for answer, old, user, groups in sent:
        if answer.name in called:
            counts["called"] += 1
            continue
        if answer.status != 200:
            # Refused by the apiserver's own validation, before validating admission.
            assert answer.status == 422, answer.body
            counts["invalid"] += 1
            continue
        counts["skipped"] += 1
        request = Request(
            kind="Pod", operation="UPDATE", namespace=namespace, username=user, groups=groups
        )
        decision = decide(answer.body, request, POLICY, phase="validate", old=old)
        if decision.violations or decision.warnings:
            missed.append((user, decision.violations, decision.warnings, answer.obj))
    print(f"scope update differential over {len(sent)} updates: {counts}")
    assert not missed, f"{len(missed)} skipped although the core acts on them; first: {missed[0]}"
    assert counts["called"] >= UPDATE_EXAMPLES // 4, counts
    assert counts["skipped"] >= UPDATE_EXAMPLES // 20, counts


def updates_of(cluster: DevCluster, namespace: str, name: str) -> dict[str, int]:
    """The webhook's update answers for a pod: the scheduler's, the tenant's by verdict."""
    assert cluster.webhook is not None
    counts = {"scheduler": 0, "tenant-refused": 0, "tenant-allowed": 0}
    for line in cluster.webhook.audit_log.read_bytes().splitlines():
        record = orjson.loads(line)
        ref = record.get("objectRef") or {}
        if ref.get("namespace") != namespace or ref.get("name") != name:
            continue
        if record.get("verb") != "update":
            continue
        if record["user"]["username"].endswith(":hami-scheduler"):
            counts["scheduler"] += 1
        else:
            counts["tenant-allowed" if record["allowed"] else "tenant-refused"] += 1
    return counts


def test_pod_updates_reach_the_webhook_when_they_touch_what_the_rules_read(
    cluster: DevCluster, api: Api, namespace: str
) -> None:
    """A plain pod is never sent at creation, yet an UPDATE that forges or removes the
    scheduler's annotations, or adds a CDI request, still reaches the webhook: the
    conditions read the new object and, for removals, the old one."""
    scheduler = "system:serviceaccount:kube-system:hami-scheduler"
    pod: Obj = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "plain"},
        "spec": {"containers": [plain_container()]},
    }
    created = api.create("Pod", namespace, pod, dry_run=False)
    assert created.status == 201, created.body
    api.grant_pod_patch(namespace, scheduler)
    # Not GPU-relevant: a label change is not sent.
    assert api.patch_pod(namespace, "plain", {"metadata": {"labels": {"a": "b"}}}).status == 200
    forged = {"metadata": {"annotations": {"hami.io/vgpu-node": "gpu-node-1"}}}
    answer = api.patch_pod(namespace, "plain", forged)
    assert answer.status == 403 and "forged-allocation" in answer.body["message"], answer.body
    cdi = {"metadata": {"annotations": {"cdi.k8s.io/gpu": "nvidia.com/gpu=all"}}}
    answer = api.patch_pod(namespace, "plain", cdi)
    assert answer.status == 403 and "host-device-access" in answer.body["message"], answer.body
    # The scheduler may write its key; anyone else removing it is forging: only the old
    # object still shows the key, and it alone sends this request.
    assert api.patch_pod(namespace, "plain", forged, user=scheduler).status == 200
    removed = {"metadata": {"annotations": {"hami.io/vgpu-node": None}}}
    answer = api.patch_pod(namespace, "plain", removed)
    assert answer.status == 403 and "forged-allocation" in answer.body["message"], answer.body
    assert api.create("Pod", namespace, gpu_pod("sentinel")).status == 201
    admitted_names(cluster, namespace, sentinel="sentinel")
    # The forged, CDI and removing updates were refused and the scheduler's admitted;
    # the label change never came (the apiserver may retry an update on a conflict, so
    # each is counted at least once, and the label change is the only allowed tenant one).
    updates = updates_of(cluster, namespace, "plain")
    assert updates["tenant-refused"] >= 3, updates
    assert updates["scheduler"] >= 1, updates
    assert updates["tenant-allowed"] == 0, updates


def test_pods_under_a_gpu_runtime_class_reach_the_webhook(
    cluster: DevCluster, api: Api, namespace: str
) -> None:
    """A plain pod under one of the policy's GPU runtime classes is voided by the core, so
    the webhooks must see it, as a Pod and as a template; under another class it is
    skipped like any plain pod."""
    from kubernetes import client

    node: Any = client.NodeV1Api(cluster.api_client())
    present = {item.metadata.name for item in node.list_runtime_class().items}
    for name in ("nvidia", "nvidia-cdi", "kata"):
        if name not in present:
            node.create_runtime_class({"metadata": {"name": name}, "handler": name})
    sent: list[str] = []
    skipped: list[str] = []
    for number, runtime_class in enumerate(("nvidia", "nvidia-cdi", "kata")):
        for kind, obj in plain_objects():
            if kind not in ("Pod", "Deployment"):
                continue
            obj = copy.deepcopy(obj)
            spec = obj["spec"] if kind == "Pod" else obj["spec"]["template"]["spec"]
            spec["runtimeClassName"] = runtime_class
            obj = sendable(kind, obj, f"rc{number}-{len(sent) + len(skipped)}")
            answer = api.create(kind, namespace, obj)
            assert answer.status == 201, (kind, answer.body)
            acts = core_acts(obj, namespace)
            if runtime_class == "kata":
                assert not acts, obj
                skipped.append(answer.name)
            else:
                assert acts, obj
                sent.append(answer.name)
    assert api.create("Pod", namespace, gpu_pod("rc-sentinel")).status == 201
    called = admitted_names(cluster, namespace, sentinel="rc-sentinel")
    assert set(sent) <= called, sorted(set(sent) - called)
    assert not called & set(skipped), sorted(called & set(skipped))


def test_webhook_down_admits_plain_objects_and_refuses_gpu_pods(
    cluster: DevCluster, api: Api, namespace: str
) -> None:
    """What `kubectl apply -k deploy/` before the webhook runs used to break: with the
    webhook process gone, every plain pod and workload is admitted; GPU pods, GPU
    templates and GPU-relevant plain pods are refused by validate.gpushare.io."""
    assert cluster.webhook is not None
    cluster.webhook.stop()
    try:
        plain = list(plain_objects())
        admitted = 0
        for number, (kind, obj) in enumerate(plain):
            answer = api.create(kind, namespace, sendable(kind, obj, f"down-{number}"))
            assert answer.status == 201, (kind, answer.body)
            admitted += 1
        assert admitted == len(plain)
        deployment = next(obj for kind, obj in plain if kind == "Deployment")
        gpu_deployment = copy.deepcopy(deployment)
        container = gpu_deployment["spec"]["template"]["spec"]["containers"][0]
        container["resources"] = {"limits": {"nvidia.com/gpu": "1", "nvidia.com/gpucores": "30"}}
        visible = gpu_pod("visible")
        visible["spec"]["containers"][0].pop("resources")
        visible["spec"]["containers"][0]["env"] = [
            {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}
        ]
        for kind, obj in (
            ("Pod", gpu_pod("gpu-down")),
            ("Deployment", sendable("Deployment", gpu_deployment, "gpu-deployment-down")),
            ("Pod", visible),
        ):
            answer = api.create(kind, namespace, obj)
            assert answer.status == 500, (kind, answer.body)
            assert 'failed calling webhook "validate.gpushare.io"' in answer.body["message"]
    finally:
        cluster.webhook.start()
    deadline = time.monotonic() + 20
    while api.create("Pod", namespace, gpu_pod("back")).status != 201:
        assert time.monotonic() < deadline, "the webhook did not come back"
        time.sleep(0.2)


CUSTOM_POLICY: Final = """\
apiVersion: gpushare.io/v1alpha1
kind: GPUSharePolicy
metadata: {name: custom}
spec:
  resources:
    count: [example.com/vgpu]
    # nvidia.com/gpumem stays: the dev cluster's start-up probe asks for it.
    memoryMiB: [nvidia.com/gpumem, example.com/vgpu-memory]
  reservedAnnotations: [example.io/alloc-*]
"""


@pytest.fixture(scope="module")
def custom_cluster(bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    """A second dev cluster whose webhook serves a policy with names of its own."""
    workdir = tmp_path_factory.mktemp("custom-cluster")
    policy = workdir / "policy.yaml"
    policy.write_text(CUSTOM_POLICY)
    with running(bin_dir=bin_dir, policy=policy, workdir=workdir) as started:
        yield started


def test_registrations_follow_the_policy_the_webhook_serves(custom_cluster: DevCluster) -> None:
    """The dev cluster scopes the webhooks to the policy it runs with: a pod that asks
    only for the policy's own resource reaches the webhook and is mutated, its own
    reserved annotation is refused, and a plain pod is still not sent."""
    namespace = "custom"
    custom_cluster.create_namespace(namespace)
    api = Api(custom_cluster)
    pod = gpu_pod("custom-gpu")
    pod["spec"]["containers"][0]["resources"] = {
        "limits": {"example.com/vgpu": "1", "example.com/vgpu-memory": "2000"}
    }
    answer = api.create("Pod", namespace, pod)
    assert answer.status == 201, answer.body
    env = {e["name"]: e.get("value") for e in answer.body["spec"]["containers"][0]["env"]}
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "2000m"
    forged: Obj = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "forged", "annotations": {"example.io/alloc-node": "n1"}},
        "spec": {"containers": [plain_container()]},
    }
    answer = api.create("Pod", namespace, forged)
    assert answer.status == 403 and "forged-allocation" in answer.body["message"], answer.body
    plain = {**forged, "metadata": {"name": "plain"}}
    assert api.create("Pod", namespace, plain).status == 201
    assert api.create("Pod", namespace, gpu_pod("sentinel")).status == 201
    called = admitted_names(custom_cluster, namespace, sentinel="sentinel")
    assert called == {"custom-gpu", "forged", "sentinel"}
    api.http.clear()
