"""Choosing a pod's mode (webhook.core.mode): HAMi's and Volcano's dynamic MIG."""

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
