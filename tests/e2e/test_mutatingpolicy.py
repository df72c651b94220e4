"""The MutatingAdmissionPolicies through a real kube-apiserver, with no webhook at all.

A generated differential: each object is created (dry run) in a namespace the policy
exempts and in one the in-apiserver policies mutate and validate. The core's mutation
of the first answer (the object as admission sees it, defaulted) must equal the second
on every field the mutation touches, and an object the core admits must be admitted.
Pods are also created where a second mutating webhook adds a sidecar after the
policies ran, so they are reinvoked on its output.
"""

from __future__ import annotations

import copy
import difflib
import json
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final, NamedTuple

import jsonpatch
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.core.strategies import attacked_objects, objects, template_of, wrap
from tests.e2e import mutator
from tests.e2e.rest import COLLECTIONS, DIFFERENTIAL, Api, gpu_pod, sendable
from tests.e2e.test_apiserver import second_mutator
from tests.paths import ROOT
from webhook.core.decision import Request, decide
from webhook.core.injection import MODE_ANNOTATION
from webhook.core.policy import Policy
from webhook.core.workload import find_pod
from webhook.dev.cluster import DevCluster, running
from webhook.policies import parse_policy
from webhook.render.admission import OVERRIDES_ANNOTATION
from webhook.render.validating import RULES as CEL_RULES

pytestmark = pytest.mark.e2e

Obj = dict[str, Any]

# MUTATED matches strict.yaml's MPS namespaces (gpu-mps-*), so both policies reach mps.
MUTATED: Final = "gpu-mps-map"
UNTOUCHED: Final = "map-off"
CHAINED: Final = "gpu-mps-chain"
# The policies compared: the default, and the strict example (the preload as a file,
# mps only in some namespaces, quotas, a host path allowlist).
POLICY_FILES: Final = ("default.yaml", "examples/strict.yaml")


def exempting_untouched(path: Path) -> str:
    """The policy file's text with UNTOUCHED exempt: the in-apiserver policies (mutating
    and validating) skip it, so an object created there is what admission starts from."""
    document = yaml.safe_load(path.read_text())
    document["spec"].setdefault("exemptions", {})["namespaces"] = [UNTOUCHED]
    return yaml.safe_dump(document)


class MapCluster(NamedTuple):
    cluster: DevCluster
    policy: Policy


# Each example is two or three dry-run creates (~10 ms each).
EXAMPLES: Final = 700


@pytest.fixture(scope="module", params=POLICY_FILES)
def map_cluster(
    bin_dir: Path, tmp_path_factory: pytest.TempPathFactory, request: pytest.FixtureRequest
) -> Iterator[MapCluster]:
    """A cluster of its own: the webhook registrations deleted, the mutating policies
    created beside the validating ones, and in CHAINED a second mutating webhook that
    adds a sidecar after them (the policies are reinvoked)."""
    workdir = tmp_path_factory.mktemp("mapcluster")
    text = exempting_untouched(ROOT / "policies" / request.param)
    policy = parse_policy(text)
    (workdir / "policy.yaml").write_text(text)
    with running(bin_dir=bin_dir, policy=workdir / "policy.yaml", workdir=workdir) as cluster:
        cluster.unregister_webhooks()
        # The apiserver refuses a pod whose RuntimeClass does not exist.
        from kubernetes import client

        node: Any = client.NodeV1Api(cluster.api_client())
        for name in ("nvidia", "nvidia-cdi", "kata"):
            node.create_runtime_class({"metadata": {"name": name}, "handler": name})
        cluster.register_cel_policies()
        cluster.register_mutating_policies()
        api = Api(cluster)
        for namespace in (MUTATED, UNTOUCHED, CHAINED):
            cluster.create_namespace(namespace)
        # The policies load asynchronously: wait until one mutates.
        deadline = time.monotonic() + 30
        while MODE_ANNOTATION not in annotations_of(
            api.create("Pod", MUTATED, gpu_pod("ready")).body
        ):
            assert time.monotonic() < deadline, "the mutating policies never took effect"
            time.sleep(0.2)
        with second_mutator(cluster, CHAINED, workdir, sidecar=True):
            yield MapCluster(cluster, policy)


def annotations_of(body: Any) -> Mapping[str, Any]:
    if not isinstance(body, dict):
        return {}
    return body.get("metadata", {}).get("annotations") or {}


def _keyed(items: Any, key: str) -> Any:
    """A list of objects as a mapping by ``key`` (the last one wins, as the kubelet
    reads env), the service-account token's volume left out (its name is random), and
    an empty ``value`` as none (the apiserver stores it so; the kubelet reads both as
    the empty string)."""
    if not isinstance(items, list):
        return items
    return {
        item.get(key): {k: v for k, v in item.items() if not (k == "value" and v == "")}
        for item in items
        if not str(item.get("name", "")).startswith("kube-api-access-")
    }


def touched(kind: str, obj: Mapping[str, Any]) -> Obj:
    """What the mutation may touch in ``obj``: the pod's (or template's) annotations and
    spec, env and mounts and volumes keyed (apply merges by key; the core replaces in
    place, the policy removes and appends: the order is not the mutation's to keep)."""
    pod = obj if kind == "Pod" else template_of(obj, kind)
    spec = copy.deepcopy(pod.get("spec") or {})
    for part in ("containers", "initContainers"):
        containers = spec.get(part) or []
        for container in containers:
            # None as empty: the token's mount, left out, may have been the only one.
            container["env"] = _keyed(container.get("env") or [], "name")
            container["volumeMounts"] = _keyed(container.get("volumeMounts") or [], "mountPath")
        spec[part] = _keyed(containers, "name")
    spec["volumes"] = _keyed(spec.get("volumes"), "name")
    return {"annotations": dict((pod.get("metadata") or {}).get("annotations") or {}), "spec": spec}


def entries(kind: str, obj: Obj) -> Counter[str]:
    """How many env entries of each name, mounts at each path and volumes of each name
    the pod (or template) holds: what :func:`touched` keys by name, so that a repeat one
    side removes and the other keeps is told. The service-account token's volume and
    mounts left out, as there."""
    view = find_pod(obj, kind)
    assert view is not None
    counted: Counter[str] = Counter()

    def kept(item: Obj) -> bool:
        return not str(item.get("name", "")).startswith("kube-api-access-")

    for part in ("containers", "initContainers"):
        for c in view.spec.get(part) or []:
            counted.update(f"{c['name']} env {e['name']}" for e in c.get("env") or [])
            counted.update(
                f"{c['name']} mount {m['mountPath']}"
                for m in c.get("volumeMounts") or []
                if kept(m)
            )
    counted.update(f"volume {v['name']}" for v in view.spec.get("volumes") or [] if kept(v))
    return counted


# One bypass each, as a tenant would add it to a sharing pod: (where, what).
_ATTACKS: Final[tuple[tuple[str, Obj], ...]] = (
    ("container", {"securityContext": {"privileged": True}}),
    ("container", {"securityContext": {"capabilities": {"add": ["SYS_ADMIN"]}}}),
    ("container", {"env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]}),
    ("container", {"env": [{"name": "CUDA_DISABLE_CONTROL", "value": "true"}]}),
    ("container", {"env": [{"name": "GPU_CORE_UTILIZATION_POLICY", "value": "disable"}]}),
    ("container", {"volumeMounts": [{"name": "dev", "mountPath": "/dev/nvidia0"}]}),
    ("spec", {"volumes": [{"name": "dev", "hostPath": {"path": "/dev/nvidia0"}}]}),
    ("spec", {"nodeName": "node-1"}),
    ("spec", {"hostPID": True}),
    ("spec", {"schedulerName": "my-scheduler"}),
    ("metadata", {"annotations": {"hami.io/vgpu-devices-allocated": "GPU-0,NVIDIA,3000,30:;"}}),
)


@st.composite
def attacked_sharing_objects(draw: st.DrawFn) -> tuple[str, Obj]:
    """A careful user's sharing object with one bypass added."""
    kind, obj = draw(sharing_objects())
    pod = obj if kind == "Pod" else template_of(obj, kind)
    where, attack = draw(st.sampled_from(_ATTACKS))
    target = {
        "container": pod["spec"]["containers"][0],
        "spec": pod["spec"],
        "metadata": pod.setdefault("metadata", {}),
    }[where]
    for key, value in copy.deepcopy(attack).items():
        if isinstance(value, list):
            target[key] = [*(target.get(key) or []), *value]
        elif isinstance(value, dict):
            target[key] = {**(target.get(key) or {}), **value}
        else:
            target[key] = value
    if where == "container" and "volumeMounts" in attack:
        pod["spec"]["volumes"].append({"name": "dev", "emptyDir": {}})
    return kind, obj


class Core(NamedTuple):
    """The core's answer to an object as admission saw it."""

    denied: frozenset[str]  # the rules that refuse it; empty when admitted
    mode: str
    mutated: Obj
    # What its mutation replaced, redacted: the warnings the webhook gives.
    overrides: tuple[str, ...] = ()


def core_mutated(kind: str, admitted: Obj, policy: Policy) -> Core:
    """The core's verdict on ``admitted`` (as admission saw it), its mode and mutation."""
    request = Request(kind=kind, operation="CREATE", namespace=MUTATED, username="alice")
    decision = decide(admitted, request, policy, phase="mutate")
    if not decision.allowed:
        return Core(frozenset(v["rule"] for v in decision.denials), decision.mode, admitted)
    mutated = jsonpatch.apply_patch(admitted, decision.patch) if decision.patch else admitted
    validated = decide(mutated, request, policy, phase="validate")
    overrides = tuple(
        text
        for violation, text in zip(decision.violations, decision.redacted, strict=True)
        if violation["action"] == "warn" and violation["rule"] == "limit-tampering"
    )
    denied = frozenset(v["rule"] for v in validated.denials)
    return Core(denied, decision.mode, mutated, overrides)


def recorded(body: Any) -> tuple[str, ...]:
    """What the MutatingAdmissionPolicy recorded that it replaced (the object's own
    annotation, a workload's too), one line each."""
    text = annotations_of(body).get(OVERRIDES_ANNOTATION)
    return tuple(text.split("\n")) if isinstance(text, str) else ()


# What a GPU container may already carry that the mutation must merge with or fix: the
# user's own preloads, limits it overwrites, entries it pins, repeats and valueFrom of
# names it sets, a stray per-index limit.
_PRESET_ENV: Final[tuple[Obj, ...]] = (
    {"name": "LD_PRELOAD", "value": "libfoo.so"},
    {"name": "LD_PRELOAD", "value": " /usr/local/vgpu/libvgpu.so:libbar.so  libfoo.so"},
    {"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": "99999m"},
    {"name": "CUDA_DEVICE_MEMORY_LIMIT_7", "value": "1m"},
    {"name": "CUDA_DEVICE_SM_LIMIT", "value": "100"},
    {"name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "value": "100"},
    {"name": "GPU_CORE_UTILIZATION_POLICY", "value": "force"},
    {"name": "ACTIVE_OOM_KILLER", "value": "true"},
    {"name": "CUDA_TASK_PRIORITY", "value": "0"},
    # A region the device plugin's monitor reads: neither mutation touches it.
    {"name": "CUDA_DEVICE_MEMORY_SHARED_CACHE", "value": "/usr/local/vgpu/own.cache"},
    {"name": "MODEL", "value": "llama"},
    {"name": "MODEL", "value": "mistral"},
    # Names it sets taken from elsewhere, one of them set to what it sets ('').
    {"name": "CUDA_REDIRECT", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}},
    {"name": "LD_PRELOAD", "valueFrom": {"configMapKeyRef": {"name": "libs", "key": "preload"}}},
)
_STACKS: Final[Mapping[str, Mapping[str, tuple[int, ...]]]] = {
    "hami": {
        "nvidia.com/gpu": (1, 2, 3),
        "nvidia.com/gpumem": (1000, 3000, 24000),
        "nvidia.com/gpucores": (10, 30, 100),
        "nvidia.com/priority": (0, 1),
    },
    "hami-percentage": {
        "nvidia.com/gpu": (1, 2),
        "nvidia.com/gpumem-percentage": (25, 50),
        "nvidia.com/gpucores": (50,),
    },
    # Above 1024 a GiB value is read as MiB (ACK's MiB unit).
    "ack": {
        "aliyun.com/gpu-mem": (1, 7, 16, 1024, 1025, 16276),
        "aliyun.com/gpu-core.percentage": (20, 50),
    },
    "volcano": {
        "volcano.sh/vgpu-number": (1, 2),
        "volcano.sh/vgpu-memory": (2048, 8000),
        "volcano.sh/vgpu-cores": (25,),
    },
    # Volcano's older GPU-share device: MiB, no count.
    "volcano-gpushare": {"volcano.sh/gpu-memory": (1024, 2048, 11178)},
    "mig": {"nvidia.com/mig-1g.5gb": (1, 2)},
    # HAMi's dynamic MIG: memory on a MIG instance HAMi's scheduler cuts.
    "dynamic-mig": {"nvidia.com/gpu": (1,), "nvidia.com/gpumem": (5000, 10000)},
    # Whole GPUs, which another scheduler keeps off the sharing pool (webhook.core.whole).
    "whole": {"nvidia.com/gpu": (1, 2, 8)},
    # Zero GPUs beside whole ones: the launcher of a gang job asks for none.
    "whole-and-zero": {"nvidia.com/gpu": (0, 1)},
}
_REQUIRED: Final = "requiredDuringSchedulingIgnoredDuringExecution"
_AFFINITIES: Final[tuple[Obj | None, ...]] = (
    None,
    {"podAntiAffinity": {}},
    {
        "nodeAffinity": {
            _REQUIRED: {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a", "b"]}]},
                    {
                        "matchFields": [
                            {"key": "metadata.name", "operator": "NotIn", "values": ["n1"]}
                        ]
                    },
                ]
            }
        }
    },
    # Already kept off the pool (a re-applied manifest), and one that selects it.
    {
        "nodeAffinity": {
            _REQUIRED: {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "gpu", "operator": "NotIn", "values": ["on"]}]},
                ]
            }
        }
    },
    {
        "nodeAffinity": {
            _REQUIRED: {
                "nodeSelectorTerms": [
                    {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["on"]}]},
                ]
            }
        }
    },
)


@st.composite
def _gpu_container(draw: st.DrawFn, name: str, stack: str) -> Obj:
    choices = _STACKS[stack]
    names = draw(st.lists(st.sampled_from(sorted(choices)), min_size=1, unique=True))
    limits = {r: str(draw(st.sampled_from(choices[r]))) for r in names}
    resources: Obj = {"limits": limits}
    if draw(st.booleans()):
        resources["requests"] = dict(limits)
    container: Obj = {"name": name, "image": "pytorch/pytorch:2.4.0", "resources": resources}
    env = draw(st.lists(st.sampled_from(_PRESET_ENV), max_size=4))
    if env:
        container["env"] = [dict(e) for e in env]
    if draw(st.integers(0, 4)) == 0:
        container["volumeMounts"] = [{"name": "data", "mountPath": "/data"}]
    return container


@st.composite
def _plain_container(draw: st.DrawFn, name: str) -> Obj:
    container: Obj = {"name": name, "image": "busybox:1.36"}
    env = draw(
        st.sampled_from(
            [
                [],
                [{"name": "CUDA_VERSION", "value": "12.4"}],
                [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}],
            ]
        )
    )
    if env:
        container["env"] = env
    return container


@st.composite
def sharing_objects(draw: st.DrawFn) -> tuple[str, Obj]:
    """(kind, object) a careful user writes for each sharing stack, with what the
    mutation must merge with: preset env, sidecars, init containers, a node selector,
    a scheduler, the volumes it injects already there."""
    # Some twice: strict.yaml refuses many MIG and MPS pods, and each mode and stack is to
    # be reached under each policy.
    stack = draw(st.sampled_from([*sorted(_STACKS), "mig", "hami", "ack", "dynamic-mig"]))
    spec: Obj = {"containers": [], "volumes": [{"name": "data", "emptyDir": {}}]}
    for i in range(draw(st.integers(1, 3))):
        gpu = i == 0 or draw(st.booleans())
        spec["containers"].append(
            draw(_gpu_container(f"c{i}", stack)) if gpu else draw(_plain_container(f"c{i}"))
        )
    for i in range(draw(st.integers(0, 2))):
        init = (
            draw(_gpu_container(f"i{i}", stack))
            if draw(st.booleans())
            else draw(_plain_container(f"i{i}"))
        )
        if draw(st.booleans()):
            init["restartPolicy"] = "Always"
        spec.setdefault("initContainers", []).append(init)
    mode = (
        "none"
        if stack in ("mig", "whole", "whole-and-zero", "dynamic-mig")
        else "vgpu"
        if stack == "hami-percentage"
        else None
    )
    mode = mode or draw(st.sampled_from(["vgpu", "mps"]))
    selectors: list[Obj | None] = [None, {"zone": "a"}]
    if mode == "mps":
        mps = {"ack.node.gpu.schedule": "mps"}
        selectors = [mps, {**mps, "zone": "a"}, *selectors]
    whole = stack in ("whole", "whole-and-zero")
    if whole:
        # MIG's single strategy (wholeGpus.otherPools): the cluster's own scheduler.
        selectors += 2 * [
            {"nvidia.com/mig.strategy": "single"},
            {"nvidia.com/gpu.product": "A100-SXM4-40GB-MIG-1g.5gb"},
        ]
    selector = draw(st.sampled_from(selectors))
    if selector is not None:
        spec["nodeSelector"] = selector
    schedulers = [None, "", "default-scheduler"]
    if stack.startswith("hami"):
        schedulers.append("hami-scheduler")
    if whole:
        schedulers = [None, "kai-scheduler", "volcano", None, "kai-scheduler"]
        affinity = draw(st.sampled_from(_AFFINITIES))
        if affinity is not None:
            spec["affinity"] = copy.deepcopy(affinity)
    scheduler = draw(st.sampled_from(schedulers))
    if scheduler is not None:
        spec["schedulerName"] = scheduler
    if mode == "vgpu" and draw(st.booleans()):
        # As the mutation injects it: what a re-applied, once mutated, manifest holds.
        spec["volumes"].append(
            {
                "name": "gpushare-vgpu-lock",
                "hostPath": {"path": "/tmp/vgpulock", "type": "DirectoryOrCreate"},
            }
        )
    pod: Obj = {"apiVersion": "v1", "kind": "Pod", "spec": spec}
    if mode != "none" and (selector is None or "zone" in selector or draw(st.booleans())):
        pod["metadata"] = {"annotations": {MODE_ANNOTATION: mode}}
    if stack == "dynamic-mig":
        pod["metadata"] = {"annotations": {"nvidia.com/vgpu-mode": "mig"}}
    kind = draw(st.sampled_from(["Pod", "Pod", *COLLECTIONS]))
    if kind in ("Job", "CronJob"):
        spec["restartPolicy"] = "Never"
    return kind, wrap(pod, kind)


def chained(obj: Obj) -> Obj:
    """``obj`` as the second mutating webhook leaves it (tests/e2e/mutator.py)."""
    obj = copy.deepcopy(obj)
    obj.setdefault("metadata", {}).setdefault("annotations", {})[mutator.ANNOTATION] = "yes"
    obj["spec"]["containers"].append(
        # As the apiserver defaults it once the webhook has added it.
        {
            **mutator.SIDECAR,
            "imagePullPolicy": "IfNotPresent",
            "resources": {},
            "terminationMessagePath": "/dev/termination-log",
            "terminationMessagePolicy": "File",
        }
    )
    return obj


def test_the_policies_mutate_as_the_core_does(map_cluster: MapCluster) -> None:
    """Generated pods and workloads (careful users' mostly, attacks too): where the core
    admits, the apiserver admits and stores what the core's mutation gives, on every
    field it touches, also when another mutating webhook changed the pod after the
    policies (they are reinvoked); every mode and kind is reached."""
    api = Api(map_cluster.cluster)
    compared: Counter[str] = Counter()
    mismatches: list[tuple[str, str, Obj]] = []

    def compare(kind: str, namespace: str, start: Obj, sent: Obj) -> None:
        core = core_mutated(kind, start, map_cluster.policy)
        got = api.create(kind, namespace, sent)
        if core.denied:
            # The apiserver refuses what the core refuses by a rule CEL renders, naming
            # one of the rules; what only the webhook judges is not this test's.
            if core.denied & set(CEL_RULES):
                compared["refused"] += 1
                message = str(got.body.get("message")) if isinstance(got.body, dict) else ""
                if got.status == 201 or not any(f"[{r}]" in message for r in core.denied):
                    mismatches.append(
                        (namespace, f"{sorted(core.denied)}: {got.status} {message}", sent)
                    )
            return
        if got.status != 201:
            mismatches.append((namespace, f"refused: {got.status} {got.body}", sent))
            return
        compared[core.mode] += 1
        compared[namespace if namespace == CHAINED else kind] += 1
        scheduler = touched(kind, core.mutated)["spec"].get("schedulerName")
        if scheduler in ("kai-scheduler", "volcano"):
            compared["kept its scheduler"] += 1
        elif core.mode == "none" and set(
            touched(kind, core.mutated)["spec"].get("nodeSelector") or {}
        ) & {"nvidia.com/gpu.product", "nvidia.com/mig.strategy"}:
            # Whole GPUs another stack serves (a MIG single-strategy pool), kept off the
            # sharing pool under the cluster's own scheduler.
            compared["another stack's whole GPUs"] += 1
        if (
            core.mode == "mig"
            and "nvidia.com/vgpu-mode" in touched(kind, core.mutated)["annotations"]
        ):
            compared["dynamic MIG"] += 1
        if (
            core.mode == "vgpu"
            and "gpushare-vgpu-lib" not in touched(kind, core.mutated)["spec"]["volumes"]
        ):
            compared["vgpu without HAMi-core"] += 1
        stored = touched(kind, got.body)
        stored["annotations"].pop(OVERRIDES_ANNOTATION, None)
        if stored != touched(kind, core.mutated):
            diff = difference(stored, touched(kind, core.mutated))
            mismatches.append((namespace, diff, sent))
        have, want = entries(kind, got.body), entries(kind, core.mutated)
        if have != want:
            mismatches.append((namespace, f"entries +{have - want} -{want - have}", sent))
        # Reinvoked after the sidecar, the policy records nothing new: what it wrote
        # first, on the object as it came, stays.
        if recorded(got.body) != core.overrides:
            mismatches.append((namespace, f"recorded {recorded(got.body)}", sent))
        if core.overrides:
            compared["overrides recorded"] += 1

    @settings(DIFFERENTIAL, max_examples=EXAMPLES)
    @given(
        st.one_of(
            *[sharing_objects()] * 3,
            *[attacked_sharing_objects()] * 2,
            objects(),
            attacked_objects(),
        )
    )
    def send(example: tuple[str, Obj]) -> None:
        kind, obj = example
        sent = sendable(kind, obj, "diff")
        plain = api.create(kind, UNTOUCHED, sent)
        if plain.status != 201:
            return  # the apiserver refuses it before any admission plugin has a say
        compare(kind, MUTATED, plain.body, sent)
        if kind == "Pod":
            compare(kind, CHAINED, chained(plain.body), sent)

    send()
    print(f"mutating policies vs core: {sorted(compared.items())}, {len(mismatches)} differ")
    assert not mismatches, f"{len(mismatches)} differ; first: {mismatches[0]}"
    for mode in ("vgpu", "mps", "mig", "none"):
        assert compared[mode] >= 10, compared
    assert compared["Pod"] >= 20 and compared[CHAINED] >= 20, compared
    assert compared["kept its scheduler"] >= 10 and compared["dynamic MIG"] >= 5, compared
    assert compared["another stack's whole GPUs"] >= 3, compared
    assert compared["vgpu without HAMi-core"] >= 5, compared
    assert compared["refused"] >= 50, compared
    assert compared["overrides recorded"] >= 20, compared
    assert sum(compared[k] for k in COLLECTIONS if k != "Pod") >= 20, compared


def difference(got: Obj, want: Obj) -> str:
    """The lines that differ between the two, as a unified diff of their JSON."""
    lines = [json.dumps(x, indent=1, sort_keys=True).splitlines() for x in (got, want)]
    return "\n".join(difflib.unified_diff(lines[0], lines[1], "policies", "core", lineterm="", n=2))


def test_a_legacy_image_in_a_plain_pod_is_voided(map_cluster: MapCluster) -> None:
    """gpushare-void: a pod that asks for no GPU but names CUDA_VERSION (a legacy
    image to the NVIDIA hook: every GPU) gets NVIDIA_VISIBLE_DEVICES=void."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "legacy"},
        "spec": {
            "containers": [
                {
                    "name": "app",
                    "image": "nvidia/cuda:9.0-base",
                    "env": [{"name": "CUDA_VERSION", "value": "9.0"}],
                }
            ]
        },
    }
    created = Api(map_cluster.cluster).create("Pod", MUTATED, pod)
    assert created.status == 201, created.body
    env = created.body["spec"]["containers"][0]["env"]
    assert {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"} in env, env


@pytest.mark.parametrize("runtime_class", ["nvidia", "nvidia-cdi", "kata"])
def test_a_plain_pod_under_a_gpu_runtime_class_is_voided(
    map_cluster: MapCluster, runtime_class: str
) -> None:
    """gpushare-void: under a runtime class of the policy's runtimeClasses.gpu every
    container and init container that asks for no GPU gets NVIDIA_VISIBLE_DEVICES=void,
    as the core's mutation gives it; under another class the pod is left alone."""
    plain = {"name": "app", "image": "nvidia/cuda:12.4.0-base-ubuntu22.04"}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "runtime"},
        "spec": {
            "runtimeClassName": runtime_class,
            "initContainers": [{**plain, "name": "fetch"}],
            "containers": [plain, {**plain, "name": "set", "env": [{"name": "N", "value": "1"}]}],
        },
    }
    created = Api(map_cluster.cluster).create("Pod", MUTATED, pod)
    assert created.status == 201, created.body
    core = core_mutated("Pod", copy.deepcopy(pod), map_cluster.policy)
    assert not core.denied
    voided = runtime_class in map_cluster.policy.gpu_runtime_classes
    for kind in ("initContainers", "containers"):
        for got, want in zip(created.body["spec"][kind], core.mutated["spec"][kind], strict=True):
            assert got.get("env", []) == want.get("env", []), (kind, got, want)
            entry = {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}
            assert (entry in got.get("env", [])) == voided, got
