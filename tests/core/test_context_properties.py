"""Properties of the decision core with a cluster view, over generated clusters and pods.

Hypothesis generates the cluster as plain API objects (GPU nodes by GFD labels or HAMi's
registration, MIG nodes, namespaces with Pod Security labels, GPU quotas, ConfigMaps and
Secrets that pods take env from) and pods that pick its pools and reference its
ConfigMaps. What holds without a view must hold with one: the patch applies, the
mutation is idempotent, ``/validate`` finds nothing on the mutated pod and agrees with
``/mutate``. An unsynced view is no view at all. And two oracles written from DESIGN:
a MIG translation picks the smallest profile that holds the request, and an ``envFrom``
that brings ``NVIDIA_VISIBLE_DEVICES`` in is refused.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any, Final

from hypothesis import event, given, settings
from hypothesis import strategies as st

from tests.core.strategies import (
    CONTAINER_KINDS,
    PROPERTY_SETTINGS,
    Obj,
    objects,
    template_of,
    wrap,
)
from tests.core.test_properties import (
    POLICIES,
    mutate_once,
    namespace_of,
    request_for,
)
from webhook.core.cluster import ClusterView, view_from_objects
from webhook.core.decision import Decision, decide
from webhook.core.policy import Policy
from webhook.core.resources import read_pod
from webhook.core.review import review_object
from webhook.policies import parse_policy

# A view is 10-30 objects and each example runs several decisions: fewer than the
# view-less properties, which run on the same 2 cores.
VIEW_SETTINGS: Final = settings(PROPERTY_SETTINGS, max_examples=120)

MIG_POOL: Final = {"pool": "mig"}
RESERVED_MIG_POOL: Final = {"nvidia.com/mig.strategy": "mixed", "gpu-pool": "reserved"}
# Every cluster-aware setting on: envFrom judged, MIG pools, quotas enforced.
CLUSTER_POLICY: Final = parse_policy(
    "apiVersion: gpushare.io/v1alpha1\nkind: GPUSharePolicy\nmetadata: {name: cluster}\n"
    "spec:\n"
    "  cluster: {configMapEnv: true, secretEnv: true}\n"
    "  rules: {gpu-quota: deny}\n"
    "  mig:\n"
    "    pools:\n"
    f"      - nodeSelector: {json.dumps(RESERVED_MIG_POOL)}\n"
    "        translate: false\n"
    f"      - nodeSelector: {json.dumps(MIG_POOL)}\n"
)
policies: Final = st.one_of(
    st.just(CLUSTER_POLICY), st.sampled_from(sorted(POLICIES)).map(POLICIES.__getitem__)
)

NAMESPACES: Final = ("default", "ml", "gpu-mps")
CARD_MIB: Final = (24576, 40960, 81559)
# name -> (nominal MiB as GFD labels it on an A100 80GB, alternatives on other cards)
MIG_PROFILES: Final[Mapping[str, tuple[int, ...]]] = {
    "1g.5gb": (4864,),
    "1g.10gb": (9728, 9856),
    "2g.20gb": (19968,),
    "3g.40gb": (40192, 40448),
    "7g.80gb": (81152,),
}
LEVELS: Final = (None, "privileged", "baseline", "restricted")
ENV_DATA: Final[Mapping[str, tuple[str, ...]]] = {
    "NVIDIA_VISIBLE_DEVICES": ("all", "none", "0", "", "void"),
    "CUDA_DISABLE_CONTROL": ("true", "false"),
    "GPU_CORE_UTILIZATION_POLICY": ("disable", "force"),
    "LOG_LEVEL": ("debug",),
    "DEVICES": ("all",),
}
CONFIG_NAMES: Final = ("cuda-env", "app")
HARMLESS_VISIBLE: Final = frozenset({"", "void", "none"})


@st.composite
def gpu_nodes(draw: st.DrawFn, index: int) -> Obj:
    labels: dict[str, str] = {}
    pool = draw(st.sampled_from([None, "mig", "h100", "a100"]))
    if pool is not None:
        labels["pool"] = pool
    if draw(st.booleans()):
        labels["nvidia.com/mig.strategy"] = "mixed"
    if draw(st.integers(0, 3)) == 0:
        labels["gpu-pool"] = "reserved"
    if draw(st.integers(0, 3)) == 0:
        labels["ack.node.gpu.schedule"] = "mps"
    metadata: Obj = {"name": f"node-{index}", "labels": labels}
    allocatable: dict[str, str] = {"cpu": "64"}
    cards = draw(st.sampled_from(["none", "gfd", "hami"]))
    memory = draw(st.sampled_from(CARD_MIB))
    count = draw(st.integers(1, 8))
    if cards == "gfd":
        labels["nvidia.com/gpu.memory"] = str(memory)
        labels["nvidia.com/gpu.count"] = str(count)
        allocatable["nvidia.com/gpu"] = str(count)
    elif cards == "hami":
        devices = [
            {"id": f"GPU-{i}", "count": 10, "devmem": memory, "devcore": 100, "health": True}
            for i in range(count)
        ]
        metadata["annotations"] = {"hami.io/node-nvidia-register": json.dumps(devices)}
        allocatable["nvidia.com/gpu"] = str(count * 10)
    profiles = draw(st.lists(st.sampled_from(sorted(MIG_PROFILES)), max_size=3, unique=True))
    for profile in profiles:
        allocatable[f"nvidia.com/mig-{profile}"] = str(draw(st.integers(0, 7)))
        labels[f"nvidia.com/mig-{profile}.memory"] = str(
            draw(st.sampled_from(MIG_PROFILES[profile]))
        )
    return {
        "kind": "Node",
        "metadata": metadata,
        "status": {"allocatable": allocatable, "capacity": allocatable},
    }


@st.composite
def cluster_objects(draw: st.DrawFn) -> list[Obj]:
    """Nodes, Namespaces, ResourceQuotas, ConfigMaps and Secrets of a small cluster."""
    found: list[Obj] = [draw(gpu_nodes(i)) for i in range(draw(st.integers(0, 5)))]
    for namespace in NAMESPACES:
        if draw(st.integers(0, 3)) == 0:
            continue
        labels = {}
        for mode in ("enforce", "warn"):
            level = draw(st.sampled_from(LEVELS))
            if level is not None:
                labels[f"pod-security.kubernetes.io/{mode}"] = level
        found.append({"kind": "Namespace", "metadata": {"name": namespace, "labels": labels}})
        if draw(st.booleans()):
            hard = draw(st.integers(1000, 200000))
            found.append(
                {
                    "kind": "ResourceQuota",
                    "metadata": {"name": "gpu", "namespace": namespace},
                    "spec": {
                        "hard": {
                            "limits.nvidia.com/gpumem": str(hard),
                            "limits.nvidia.com/gpu": "4",
                        }
                    },
                    "status": {
                        "used": {"limits.nvidia.com/gpumem": str(draw(st.integers(0, hard)))}
                    },
                }
            )
        for name in CONFIG_NAMES:
            if draw(st.booleans()):
                keys = draw(st.lists(st.sampled_from(sorted(ENV_DATA)), max_size=3, unique=True))
                data = {key: draw(st.sampled_from(ENV_DATA[key])) for key in keys}
                kind = draw(st.sampled_from(["ConfigMap", "Secret"]))
                obj: Obj = {"kind": kind, "metadata": {"name": name, "namespace": namespace}}
                obj["stringData" if kind == "Secret" else "data"] = data
                found.append(obj)
    return found


SELECTORS: Final = (
    MIG_POOL,
    MIG_POOL,
    {**MIG_POOL, "nvidia.com/mig.strategy": "mixed"},
    RESERVED_MIG_POOL,
    {"pool": "h100"},
    {"pool": "a100", "ack.node.gpu.schedule": "mps"},
)
Scenario = tuple[str, Obj, ClusterView]
_LIMITS: Final = (
    {"nvidia.com/gpumem": "3000"},
    {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "20000", "nvidia.com/gpucores": "30"},
    {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "8000"},
    {"nvidia.com/gpumem-percentage": "50"},
    {"aliyun.com/gpu-mem": "7"},
    {"nvidia.com/mig-1g.10gb": "1"},
    {"cpu": "1"},
)


@st.composite
def clean_objects(draw: st.DrawFn) -> tuple[str, Obj]:
    """(kind, object) that breaks no rule by itself: what the view decides is all there is."""
    containers = [
        {
            "name": name,
            "image": "cuda:12",
            "resources": {"limits": dict(draw(st.sampled_from(_LIMITS)))},
        }
        for name in draw(st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, unique=True))
    ]
    spec: Obj = {"containers": containers[:2]}
    if len(containers) > 2:
        spec["initContainers"] = containers[2:]
    metadata: Obj = {"name": "p", "namespace": draw(st.sampled_from(NAMESPACES))}
    if draw(st.integers(0, 3)) == 0:
        metadata["annotations"] = {"gpushare.io/mode": draw(st.sampled_from(["vgpu", "mig"]))}
    kind = draw(st.sampled_from(["Pod", "Pod", "Deployment", "CronJob"]))
    return kind, wrap({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec}, kind)


@st.composite
def scenarios(draw: st.DrawFn, *, mig: bool = False) -> Scenario:
    """(kind, object, view): a careful user's object (``objects(hostile=False)``) in a
    generated cluster, often asking for GPU memory on one of its pools and taking env
    from its ConfigMaps and Secrets, so that the view has a say. With ``mig``: an object
    that breaks no rule by itself, on the MIG pool, in a cluster where it is up."""
    found = draw(cluster_objects())
    kind, obj = draw(clean_objects() if mig else st.one_of(objects(hostile=False), clean_objects()))
    namespace = namespace_of(obj)
    if mig or draw(st.booleans()):
        node = draw(gpu_nodes(len(found) + 100))
        node["metadata"]["labels"].update(MIG_POOL)
        node["status"]["allocatable"]["nvidia.com/mig-1g.10gb"] = "7"
        node["metadata"]["labels"]["nvidia.com/mig-1g.10gb.memory"] = "9728"
        found.append(node)
    if draw(st.integers(0, 2)) == 0:
        found.append(
            {
                "kind": draw(st.sampled_from(["ConfigMap", "Secret"])),
                "metadata": {"name": "cuda-env", "namespace": namespace},
                "data": {"NVIDIA_VISIBLE_DEVICES": draw(st.sampled_from(["all", "0", "none"]))},
            }
        )
    pod = template_of(obj, kind)
    spec = pod.get("spec") if isinstance(pod, dict) else None
    if isinstance(spec, dict):
        if mig or draw(st.booleans()):
            spec["nodeSelector"] = dict(draw(st.sampled_from(SELECTORS[: 3 if mig else None])))
        if draw(st.integers(0, 1 if mig else 2)) == 0:
            mib = draw(st.one_of(st.integers(1, 10000), st.integers(1, 90000)))
            limits = {"nvidia.com/gpumem": str(mib)}
            if draw(st.booleans()):
                limits["nvidia.com/gpucores"] = str(draw(st.integers(1, 100)))
            spec["containers"][0]["resources"] = {"limits": limits}
        stores = [
            ("configMapRef" if o["kind"] == "ConfigMap" else "secretRef", o["metadata"]["name"])
            for o in found
            if o["kind"] in ("ConfigMap", "Secret") and o["metadata"]["namespace"] == namespace
        ]
        for container_kind in CONTAINER_KINDS:
            for container in spec.get(container_kind, []):
                if not stores or draw(st.booleans()):
                    continue
                ref, name = draw(st.sampled_from(stores))
                source: Obj = {ref: {"name": name}}
                if draw(st.integers(0, 3)) == 0:
                    source["prefix"] = draw(st.sampled_from(["NVIDIA_VISIBLE_", "X_"]))
                container["envFrom"] = [source]
    return kind, obj, view_from_objects(found, secrets=True)


# Half on the MIG pool, where translations happen.
mixed_scenarios: Final = st.one_of(scenarios(), scenarios(mig=True))


def _decide(
    obj: Obj, kind: str, policy: Policy, phase: str, cluster: ClusterView | None
) -> Decision:
    return decide(obj, request_for(kind, obj), policy, phase=phase, cluster=cluster)  # type: ignore[arg-type]


@VIEW_SETTINGS
@given(mixed_scenarios, policies)
def test_patch_applies_and_gives_the_reviewed_object(scenario: Scenario, policy: Policy) -> None:
    kind, obj, cluster = scenario
    decision, mutated = mutate_once(kind, obj, policy, cluster=cluster)
    entry = review_object(obj, policy, namespace=namespace_of(obj), cluster=cluster)
    assert entry["patch"] == decision.patch
    assert entry["mode"] == decision.mode
    assert entry["object"] == (mutated if decision.allowed else obj)


@VIEW_SETTINGS
@given(mixed_scenarios, policies)
def test_mutation_is_idempotent_and_validates_clean(scenario: Scenario, policy: Policy) -> None:
    kind, obj, cluster = scenario
    decision, mutated = mutate_once(kind, obj, policy, cluster=cluster)
    if not decision.allowed:
        return
    again = _decide(mutated, kind, policy, "mutate", cluster)
    assert again.patch == [], (policy.name, again.patch)
    assert again.allowed, (policy.name, again.violations)
    event(f"admitted as {decision.mode}")
    validated = _decide(mutated, kind, policy, "validate", cluster)
    # The endpoints agree, and /validate finds nothing /mutate did not already report.
    assert validated.allowed, (policy.name, validated.violations)
    assert {v["rule"] for v in validated.violations} <= {v["rule"] for v in again.violations}


@VIEW_SETTINGS
@given(mixed_scenarios, policies, st.sampled_from(["mutate", "validate"]))
def test_an_unsynced_view_is_no_view(scenario: Scenario, policy: Policy, phase: str) -> None:
    kind, obj, cluster = scenario
    unsynced = dataclasses.replace(cluster, synced=False)
    assert _decide(obj, kind, policy, phase, unsynced) == _decide(obj, kind, policy, phase, None)


def _memory_requests(spec: Mapping[str, Any], policy: Policy) -> dict[tuple[str, int], int]:
    """MiB each container asks for, by (kind, index)."""
    return {
        (r.kind, r.index): r.memory_mib
        for r in read_pod(spec, policy).containers
        if r.memory_mib is not None
    }


def _pool_profiles(cluster: ClusterView, selector: Mapping[str, str]) -> dict[str, int]:
    """Profile -> the least memory (MiB) of one instance over the nodes ``selector`` picks,
    read from the labels the strategy wrote."""
    profiles: dict[str, int] = {}
    for node in cluster.nodes.values():
        if any(node.labels.get(k) != v for k, v in selector.items()):
            continue
        for resource, count in node.allocatable.items():
            if resource.startswith("nvidia.com/mig-") and count > 0:
                profile = resource.removeprefix("nvidia.com/mig-")
                memory = int(node.labels[f"{resource}.memory"])
                profiles[profile] = min(memory, profiles.get(profile, memory))
    return profiles


@VIEW_SETTINGS
@given(scenarios(mig=True))
def test_a_translation_picks_the_smallest_profile_that_holds_the_request(
    scenario: Scenario,
) -> None:
    kind, obj, cluster = scenario
    decision, mutated = mutate_once(kind, obj, CLUSTER_POLICY, cluster=cluster)
    before, after = template_of(obj, kind), template_of(mutated, kind)
    if not decision.allowed or not isinstance(before, dict):
        return
    selector = before["spec"].get("nodeSelector") or {}
    asked = _memory_requests(before["spec"], CLUSTER_POLICY)
    for (container_kind, index), mib in asked.items():
        limits = after["spec"][container_kind][index]["resources"]["limits"]
        added = [name.removeprefix("nvidia.com/mig-") for name in limits if "/mig-" in name]
        if not added:
            continue
        # Only a pod that picks the translating pool, and is then a MIG pod throughout.
        assert all(selector.get(k) == v for k, v in MIG_POOL.items()), selector
        assert decision.mode == "mig"
        (profile,) = added
        event("translated to MIG")
        profiles = _pool_profiles(cluster, selector) or _pool_profiles(cluster, MIG_POOL)
        assert profiles[profile] >= mib, (profile, mib, profiles)
        assert not [p for p, m in profiles.items() if mib <= m < profiles[profile]], profiles


def _visible_devices_from(spec: Mapping[str, Any], cluster: ClusterView, namespace: str) -> bool:
    """Some container takes a NVIDIA_VISIBLE_DEVICES that exposes GPUs through envFrom."""
    for container_kind in CONTAINER_KINDS:
        for container in spec.get(container_kind) or []:
            for source in container.get("envFrom") or []:
                for ref, store in (
                    ("configMapRef", cluster.config_maps),
                    ("secretRef", cluster.secrets),
                ):
                    if ref not in source:
                        continue
                    data = store.get((namespace, source[ref]["name"]), {})
                    prefix = source.get("prefix", "")
                    value = {prefix + key: v for key, v in data.items()}.get(
                        "NVIDIA_VISIBLE_DEVICES"
                    )
                    if value is not None and value.strip().lower() not in HARMLESS_VISIBLE:
                        return True
    return False


@VIEW_SETTINGS
@given(scenarios())
def test_envfrom_that_exposes_gpus_is_refused(scenario: Scenario) -> None:
    kind, obj, cluster = scenario
    pod = template_of(obj, kind)
    if not isinstance(pod, dict) or not isinstance(pod.get("spec"), dict):
        return
    namespace = namespace_of(obj)
    exposed = _visible_devices_from(pod["spec"], cluster, namespace)
    entry = review_object(obj, CLUSTER_POLICY, namespace=namespace, cluster=cluster)
    if exposed:
        event("envFrom exposes GPUs")
        assert not entry["allowed"]
        assert "raw-visible-devices" in {v["rule"] for v in entry["violations"]}
