"""Whole GPUs under a scheduler of the pod's own (webhook.core.whole): kept, off the pool."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import pytest

from tests.core.test_decision import gpu_pod, policy_with, rules_of
from tests.paths import EXAMPLES
from webhook.core.decision import Request, decide
from webhook.core.review import review_object
from webhook.core.whole import REQUIRED
from webhook.policies import DEFAULT_POLICY, load_policy

AWAY = {"key": "gpu", "operator": "NotIn", "values": ["on"]}


def kai_pod(limits: dict[str, Any] | None = None, **spec: Any) -> dict[str, Any]:
    return gpu_pod(limits or {"nvidia.com/gpu": "1"}, schedulerName="kai-scheduler", **spec)


def terms(obj: dict[str, Any]) -> list[dict[str, Any]]:
    affinity = obj["spec"]["affinity"]["nodeAffinity"][REQUIRED]
    return list(affinity["nodeSelectorTerms"])


# -- the attacks the relaxation must not let through, first ---------------------------


@pytest.mark.parametrize(
    "limits",
    [
        {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"},
        {"nvidia.com/gpucores": "30"},
        {"nvidia.com/gpu": "1", "nvidia.com/priority": "0"},
        {"volcano.sh/vgpu-number": "1"},
        {"aliyun.com/gpu-mem": "4"},
    ],
)
def test_a_slice_under_another_scheduler_stays_a_bypass(limits: dict[str, str]) -> None:
    assert rules_of(review_object(kai_pod(limits), DEFAULT_POLICY)) == {"scheduler-bypass"}


@pytest.mark.parametrize(
    "annotations",
    [{"gpushare.io/mode": "vgpu"}, {"nvidia.com/vgpu-mode": "hami-core"}],
)
def test_whole_gpus_that_name_a_sharing_mode_stay_a_bypass(annotations: dict[str, str]) -> None:
    pod = kai_pod()
    pod["metadata"]["annotations"] = annotations
    assert rules_of(review_object(pod, DEFAULT_POLICY)) == {"scheduler-bypass"}


def test_whole_gpus_on_the_mps_node_selector_stay_a_bypass() -> None:
    pod = kai_pod(nodeSelector={"ack.node.gpu.schedule": "mps"})
    assert "scheduler-bypass" in rules_of(review_object(pod, DEFAULT_POLICY))


def test_whole_gpus_that_select_the_sharing_pool_are_a_bypass() -> None:
    entry = review_object(kai_pod(nodeSelector={"gpu": "on"}), DEFAULT_POLICY)
    assert rules_of(entry) == {"scheduler-bypass"}
    assert "nodeSelector gpu=on" in entry["violations"][0]["message"]
    into = {
        "nodeSelectorTerms": [
            {"matchExpressions": [{"key": "gpu", "operator": "In", "values": ["on"]}]}
        ]
    }
    entry = review_object(kai_pod(affinity={"nodeAffinity": {REQUIRED: into}}), DEFAULT_POLICY)
    assert rules_of(entry) == {"scheduler-bypass"}


def test_whole_gpus_still_meet_every_other_rule() -> None:
    pod = kai_pod()
    pod["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    pod["spec"]["hostPID"] = True
    assert rules_of(review_object(pod, DEFAULT_POLICY)) == {"privileged-gpu", "host-device-access"}


def test_a_kept_pod_without_the_affinity_is_unmutated() -> None:
    # The mutating webhook skipped (failed open, or not registered): the pod could land
    # on a sharing node, where HAMi's device plugin would serve it outside the ledger.
    validated = decide(
        kai_pod(), Request(kind="Pod", namespace="ml"), DEFAULT_POLICY, phase="validate"
    )
    assert [v["rule"] for v in validated.violations] == ["unmutated-gpu-pod"]
    assert "/spec/affinity" in validated.message()


# -- the relaxation ---------------------------------------------------------------------


@pytest.mark.parametrize("scheduler", ["kai-scheduler", "volcano", "scheduler-plugins-scheduler"])
def test_whole_gpus_keep_their_scheduler_off_the_pool(scheduler: str) -> None:
    pod = gpu_pod({"nvidia.com/gpu": "8"}, schedulerName=scheduler)
    pod["spec"]["containers"].append({"name": "side", "image": "busybox"})
    entry = review_object(pod, DEFAULT_POLICY)
    assert entry["allowed"], entry["violations"]
    assert entry["mode"] == "none"
    mutated = entry["object"]
    assert mutated["spec"]["schedulerName"] == scheduler
    assert terms(mutated) == [{"matchExpressions": [AWAY]}]
    main, side = mutated["spec"]["containers"]
    # Nothing of a slice: no preload, no limits, no libvgpu volume.
    assert "env" not in main and "volumeMounts" not in main
    assert "volumes" not in mutated["spec"]
    assert side["env"] == [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]


def test_the_affinity_joins_every_term_and_is_idempotent() -> None:
    zone = {"key": "zone", "operator": "In", "values": ["a"]}
    field = {"key": "metadata.name", "operator": "In", "values": ["n1"]}
    required = {"nodeSelectorTerms": [{"matchExpressions": [zone]}, {"matchFields": [field]}]}
    pod = kai_pod(affinity={"nodeAffinity": {REQUIRED: required}, "podAffinity": {}})
    request = Request(kind="Pod", namespace="ml")
    mutation = decide(pod, request, DEFAULT_POLICY, phase="mutate")
    mutated = jsonpatch.apply_patch(copy.deepcopy(pod), mutation.patch)
    assert terms(mutated) == [
        {"matchExpressions": [zone, AWAY]},
        {"matchFields": [field], "matchExpressions": [AWAY]},
    ]
    assert mutated["spec"]["affinity"]["podAffinity"] == {}
    assert decide(mutated, request, DEFAULT_POLICY, phase="mutate").patch == []
    assert decide(mutated, request, DEFAULT_POLICY, phase="validate").allowed


@pytest.mark.parametrize(
    "affinity",
    [
        None,
        {},
        {"nodeAffinity": {}},
        {"nodeAffinity": {REQUIRED: {}}},
        {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": []}}},
    ],
)
def test_the_affinity_is_added_at_the_level_that_is_missing(affinity: Any) -> None:
    pod = kai_pod() if affinity is None else kai_pod(affinity=affinity)
    request = Request(kind="Pod", namespace="ml")
    mutated = jsonpatch.apply_patch(
        copy.deepcopy(pod), decide(pod, request, DEFAULT_POLICY, phase="mutate").patch
    )
    assert terms(mutated) == [{"matchExpressions": [AWAY]}]
    assert decide(mutated, request, DEFAULT_POLICY, phase="validate").allowed


def test_a_pod_without_a_scheduler_still_goes_to_the_sharing_one() -> None:
    entry = review_object(gpu_pod({"nvidia.com/gpu": "1"}), DEFAULT_POLICY)
    assert entry["mode"] == "vgpu"
    assert entry["object"]["spec"]["schedulerName"] == "hami-scheduler"
    assert "affinity" not in entry["object"]["spec"]


def test_the_policy_sets_the_pool_and_the_whole_resources() -> None:
    policy = policy_with(
        "  wholeGpus:\n    resources: []\n    sharingPool: [{key: pool, value: shared}]\n"
    )
    assert rules_of(review_object(kai_pod(), policy)) == {"scheduler-bypass"}
    policy = policy_with("  wholeGpus:\n    sharingPool: [{key: pool, value: shared}]\n")
    entry = review_object(kai_pod(), policy)
    assert terms(entry["object"]) == [
        {"matchExpressions": [{"key": "pool", "operator": "NotIn", "values": ["shared"]}]}
    ]


def test_an_allowed_scheduler_is_the_sharing_path_as_before() -> None:
    policy = policy_with("  allowedSchedulers: [kai-scheduler]\n")
    entry = review_object(kai_pod(), policy)
    assert entry["mode"] == "vgpu"
    assert "affinity" not in entry["object"]["spec"]


# -- whole GPUs another stack serves (wholeGpus.otherPools, draResources) ---------------

MIG_SINGLE = {"nvidia.com/gpu.product": "A100-SXM4-40GB-MIG-1g.5gb"}
DRA_POLICY = load_policy(EXAMPLES / "dra-extended-gpu.yaml")


def test_a_slice_on_a_mig_single_pool_is_no_whole_gpu() -> None:
    # Attack: memory beside the pool's label must not lose HAMi's limits.
    entry = review_object(
        gpu_pod({"nvidia.com/gpumem": "3000"}, nodeSelector=MIG_SINGLE), DEFAULT_POLICY
    )
    assert entry["mode"] == "vgpu"
    assert entry["object"]["spec"]["schedulerName"] == "hami-scheduler"


def test_whole_gpus_on_both_pools_are_a_bypass() -> None:
    selector = {**MIG_SINGLE, "gpu": "on"}
    entry = review_object(gpu_pod({"nvidia.com/gpu": "1"}, nodeSelector=selector), DEFAULT_POLICY)
    assert rules_of(entry) == {"scheduler-bypass"}


def test_a_mode_named_beside_the_pool_is_the_sharing_path() -> None:
    pod = gpu_pod({"nvidia.com/gpu": "1"}, nodeSelector={"nvidia.com/mig.strategy": "single"})
    pod["metadata"]["annotations"] = {"gpushare.io/mode": "vgpu"}
    entry = review_object(pod, DEFAULT_POLICY)
    assert entry["mode"] == "vgpu"
    assert entry["object"]["spec"]["schedulerName"] == "hami-scheduler"


def test_a_kept_pod_of_another_stack_without_the_affinity_is_unmutated() -> None:
    pod = gpu_pod({"nvidia.com/gpu": "1"}, nodeSelector=MIG_SINGLE)
    validated = decide(pod, Request(kind="Pod", namespace="ml"), DEFAULT_POLICY, phase="validate")
    assert [v["rule"] for v in validated.violations] == ["unmutated-gpu-pod"]
    validated = decide(
        gpu_pod({"nvidia.com/gpu": "1"}),
        Request(kind="Pod", namespace="ml"),
        DRA_POLICY,
        phase="validate",
    )
    assert [v["rule"] for v in validated.violations] == ["unmutated-gpu-pod"]


@pytest.mark.parametrize(
    "spec",
    [
        {"nodeSelector": MIG_SINGLE},
        {"nodeSelector": {"nvidia.com/mig.strategy": "single"}},
        {"schedulerName": "default-scheduler", "nodeSelector": MIG_SINGLE},
        {
            "affinity": {
                "nodeAffinity": {
                    REQUIRED: {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {
                                        "key": "nvidia.com/gpu.product",
                                        "operator": "In",
                                        "values": ["H100-80GB-HBM3-MIG-1g.10gb"],
                                    }
                                ]
                            }
                        ]
                    }
                }
            }
        },
    ],
)
def test_whole_gpus_on_a_mig_single_pool_keep_the_default_scheduler(spec: dict[str, Any]) -> None:
    entry = review_object(gpu_pod({"nvidia.com/gpu": "1"}, **spec), DEFAULT_POLICY)
    assert entry["allowed"], entry["violations"]
    assert entry["mode"] == "none"
    mutated = entry["object"]
    assert mutated["spec"].get("schedulerName") == spec.get("schedulerName")
    assert all(AWAY in t["matchExpressions"] for t in terms(mutated))
    assert "volumes" not in mutated["spec"]


def test_whole_gpus_dra_serves_keep_the_default_scheduler() -> None:
    entry = review_object(gpu_pod({"nvidia.com/gpu": "2"}), DRA_POLICY)
    assert entry["allowed"] and entry["mode"] == "none"
    assert "schedulerName" not in entry["object"]["spec"]
    assert terms(entry["object"]) == [{"matchExpressions": [AWAY]}]
    # A slice is still HAMi's, and a DeviceClass may serve the whole GPUs only.
    entry = review_object(gpu_pod({"nvidia.com/gpu": "1", "nvidia.com/gpucores": "30"}), DRA_POLICY)
    assert entry["mode"] == "vgpu"


@pytest.mark.parametrize(
    ("resource", "policy", "refused"),
    [
        ("nvidia.com/gpu", DEFAULT_POLICY, True),
        ("nvidia.com/gpu", DRA_POLICY, False),
        ("nvidia.com/gpumem", DRA_POLICY, True),
        ("volcano.sh/vgpu-number", DRA_POLICY, True),
    ],
)
def test_a_device_class_may_serve_only_what_the_policy_gives_dra(
    resource: str, policy: Any, refused: bool
) -> None:
    device_class = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "gpu.example.com"},
        "spec": {"extendedResourceName": resource},
    }
    assert ("gpu-claim" in rules_of(review_object(device_class, policy))) == refused
