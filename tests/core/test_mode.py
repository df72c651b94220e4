"""Choosing a pod's mode (webhook.core.mode): HAMi's and Volcano's dynamic MIG, HAMi's mps placement."""

from __future__ import annotations

from typing import Any

import pytest

from tests.core.test_decision import gpu_pod, policy_with, rules_of
from webhook.core.decision import Request, decide
from webhook.core.review import review_object
from webhook.policies import DEFAULT_POLICY


def dynamic(
    limits: dict[str, Any], key: str = "nvidia.com/vgpu-mode", **spec: Any
) -> dict[str, Any]:
    pod = gpu_pod(limits, **spec)
    pod["metadata"]["annotations"] = {key: "mig"}
    return pod


# -- what stays refused, first --------------------------------------------------------


def test_a_mig_resource_beside_memory_stays_a_conflict() -> None:
    pod = dynamic({"nvidia.com/mig-1g.5gb": "1", "nvidia.com/gpumem": "3000"})
    assert rules_of(review_object(pod, DEFAULT_POLICY)) == {"mode-conflict"}


def test_our_own_mig_annotation_with_memory_stays_a_conflict() -> None:
    # gpushare.io/mode: mig names hardware MIG resources, not a scheduler that cuts them.
    pod = dynamic({"nvidia.com/gpumem": "3000"}, key="gpushare.io/mode")
    assert rules_of(review_object(pod, DEFAULT_POLICY)) == {"mode-conflict"}


def test_a_first_annotation_that_names_another_mode_wins() -> None:
    pod = dynamic({"nvidia.com/gpumem": "3000"})
    pod["metadata"]["annotations"] = {"gpushare.io/mode": "mig", "nvidia.com/vgpu-mode": "mig"}
    assert rules_of(review_object(pod, DEFAULT_POLICY)) == {"mode-conflict"}


def test_dynamic_mig_under_another_scheduler_is_a_bypass() -> None:
    pod = dynamic({"nvidia.com/gpumem": "3000"}, schedulerName="kai-scheduler")
    assert rules_of(review_object(pod, DEFAULT_POLICY)) == {"scheduler-bypass"}


def test_dynamic_mig_without_its_scheduler_is_unmutated() -> None:
    pod = dynamic({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"})
    validated = decide(pod, Request(kind="Pod", namespace="ml"), DEFAULT_POLICY, phase="validate")
    assert [v["rule"] for v in validated.violations] == ["unmutated-gpu-pod"]


# -- HAMi's and Volcano's dynamic MIG, read as they mean it ----------------------------


@pytest.mark.parametrize(
    ("key", "limits", "scheduler"),
    [
        (
            "nvidia.com/vgpu-mode",
            {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "8000"},
            "hami-scheduler",
        ),
        ("nvidia.com/vgpu-mode", {"nvidia.com/gpumem": "8000"}, "hami-scheduler"),
        (
            "volcano.sh/vgpu-mode",
            {"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-memory": "8000"},
            "volcano",
        ),
    ],
)
def test_dynamic_mig_keeps_its_scheduler_and_gets_no_libvgpu(
    key: str, limits: dict[str, str], scheduler: str
) -> None:
    entry = review_object(dynamic(limits, key=key), DEFAULT_POLICY)
    assert entry["allowed"], entry["violations"]
    assert entry["mode"] == "mig"
    spec = entry["object"]["spec"]
    assert spec["schedulerName"] == scheduler
    assert "volumes" not in spec and "env" not in spec["containers"][0]
    count = "volcano.sh/vgpu-number" if key.startswith("volcano") else "nvidia.com/gpu"
    assert spec["containers"][0]["resources"]["limits"][count] == "1"
    # Idempotent: the mutated pod needs nothing more.
    again = decide(
        entry["object"], Request(kind="Pod", namespace="ml"), DEFAULT_POLICY, phase="mutate"
    )
    assert again.patch == []


def test_the_policy_names_the_dynamic_mig_annotations() -> None:
    policy = policy_with("  modes:\n    dynamicMigAnnotations: []\n")
    pod = dynamic({"nvidia.com/gpumem": "3000"})
    assert rules_of(review_object(pod, policy)) == {"mode-conflict"}


# -- an mps pod HAMi's scheduler places by the card's mode ------------------------------


def mps_pod(key: str, **spec: Any) -> dict[str, Any]:
    pod = gpu_pod({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"}, **spec)
    pod["metadata"]["annotations"] = {key: "mps"}
    return pod


def test_hamis_mps_annotation_gets_no_ack_node_selector() -> None:
    """HAMi's scheduler puts a nvidia.com/vgpu-mode: mps pod on a card in MPS mode: ACK's
    node label would keep it off every HAMi node."""
    entry = review_object(mps_pod("nvidia.com/vgpu-mode"), DEFAULT_POLICY)
    assert entry["allowed"], entry["violations"]
    assert entry["mode"] == "mps"
    spec = entry["object"]["spec"]
    assert spec["hostIPC"] is True and spec["schedulerName"] == "hami-scheduler"
    assert "nodeSelector" not in spec
    # Idempotent, and not refused as unmutated for the selector it does not get.
    again = decide(
        entry["object"], Request(kind="Pod", namespace="ml"), DEFAULT_POLICY, phase="validate"
    )
    assert again.allowed and again.patch == [], again.violations


def test_our_own_mps_annotation_keeps_the_policys_node_selector() -> None:
    entry = review_object(mps_pod("gpushare.io/mode"), DEFAULT_POLICY)
    assert entry["allowed"], entry["violations"]
    assert entry["object"]["spec"]["nodeSelector"] == {"ack.node.gpu.schedule": "mps"}
    # ... and still refuses a selector that contradicts it.
    pod = mps_pod("gpushare.io/mode", nodeSelector={"ack.node.gpu.schedule": "cgpu"})
    assert rules_of(review_object(pod, DEFAULT_POLICY)) == {"mode-conflict"}


def test_a_placed_mps_pod_is_judged_by_its_own_selector_alone() -> None:
    pod = mps_pod("nvidia.com/vgpu-mode", nodeSelector={"ack.node.gpu.schedule": "cgpu"})
    entry = review_object(pod, DEFAULT_POLICY)
    assert entry["allowed"], entry["violations"]
    assert entry["object"]["spec"]["nodeSelector"] == {"ack.node.gpu.schedule": "cgpu"}


def test_hamis_annotation_places_the_pod_beside_ours() -> None:
    """HAMi's scheduler reads its annotation whatever gpushare.io/mode says (the mutation
    writes ours beside it)."""
    pod = mps_pod("nvidia.com/vgpu-mode")
    pod["metadata"]["annotations"] = {"gpushare.io/mode": "mps", "nvidia.com/vgpu-mode": "mps"}
    entry = review_object(pod, DEFAULT_POLICY)
    assert entry["allowed"], entry["violations"]
    assert "nodeSelector" not in entry["object"]["spec"]


def test_the_policy_names_the_annotations_whose_scheduler_places_mps_pods() -> None:
    policy = policy_with("  mps:\n    placedByAnnotations: []\n")
    entry = review_object(mps_pod("nvidia.com/vgpu-mode"), policy)
    assert entry["object"]["spec"]["nodeSelector"] == {"ack.node.gpu.schedule": "mps"}
