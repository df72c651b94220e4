"""GPU runtime classes: a RuntimeClass whose handler runs the NVIDIA runtime.

HAMi's chart makes a class of handler ``nvidia`` (Project-HAMi/HAMi
charts/hami/templates/device-plugin/runtime-class.yaml @ 4707fb02); the GPU Operator
makes ``nvidia``, ``nvidia-cdi`` and ``nvidia-legacy`` for the runtimes the toolkit's
installer configures (NVIDIA/nvidia-container-toolkit
cmd/nvidia-ctk-installer/container/operator/operator.go:49-59 @ d34b3046). Under one of
them a CUDA image's baked ``NVIDIA_VISIBLE_DEVICES=all`` hands every GPU to a container
that asks for none. Attacks first: each voided or refused shape below was admitted
untouched before the policy listed the classes.
"""

from __future__ import annotations

import copy
from typing import Any, Final

import pytest

from tests.core.test_bypass import (
    assert_clean,
    assert_refused,
    container,
    env_of,
    pod,
    policy_with,
    review,
    stored,
    update,
    with_ephemeral,
    workload,
)
from webhook.core.decision import Request, decide
from webhook.policies import DEFAULT_POLICY

Obj = dict[str, Any]

VOID: Final = {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}


def validated(obj: Obj) -> set[str]:
    """The rules /validate refuses ``obj`` under, as it arrives (no mutation before)."""
    facts = Request(kind=str(obj["kind"]), namespace="ml", username="alice")
    decision = decide(obj, facts, DEFAULT_POLICY, phase="validate")
    return {v["rule"] for v in decision.denials}


GPU_CLASSES: Final = ("nvidia", "nvidia-cdi", "nvidia-legacy")


def under(runtime_class: str, *containers: Obj, **kw: Any) -> Obj:
    return pod(*containers, runtimeClassName=runtime_class, **kw)


def visible(obj: Obj, index: int = 0, kind: str = "containers") -> Any:
    return env_of(obj, index, kind).get("NVIDIA_VISIBLE_DEVICES")


@pytest.mark.parametrize("runtime_class", GPU_CLASSES)
def test_a_plain_pod_under_a_gpu_runtime_class_is_voided(runtime_class: str) -> None:
    # A CUDA image bakes NVIDIA_VISIBLE_DEVICES=all: under the NVIDIA runtime, every GPU.
    entry = review(under(runtime_class, container("app"), init=[container("fetch")]))
    assert entry["allowed"], entry["violations"]
    assert visible(entry["object"]) == "void"
    assert visible(entry["object"], 0, "initContainers") == "void"
    assert review(entry["object"])["patch"] == []


@pytest.mark.parametrize("runtime_class", GPU_CLASSES)
def test_a_plain_pod_under_a_gpu_runtime_class_without_the_void_is_refused(
    runtime_class: str,
) -> None:
    assert "host-device-access" in validated(under(runtime_class, container("app")))


def test_a_template_under_a_gpu_runtime_class_is_voided() -> None:
    entry = review(workload("Deployment", under("nvidia", container("app"))))
    assert entry["allowed"], entry["violations"]
    template = entry["object"]["spec"]["template"]
    assert visible(template) == "void"


def test_a_debug_container_under_a_gpu_runtime_class_needs_the_void() -> None:
    old = stored(under("nvidia", container("app")))
    new = with_ephemeral(old, container("debugger"))
    assert_refused(update(old, new, sub_resource="ephemeralcontainers"), "host-device-access")
    new = with_ephemeral(old, container("debugger", env=[VOID]))
    assert_clean(update(old, new, sub_resource="ephemeralcontainers"))


def test_a_gpu_container_under_a_gpu_runtime_class_keeps_its_gpus() -> None:
    whole = container("train", limits={"nvidia.com/gpu": "1"})
    entry = review(under("nvidia", whole, container("logger")))
    assert entry["allowed"], entry["violations"]
    assert visible(entry["object"], 0) is None
    assert visible(entry["object"], 1) == "void"


def test_a_value_the_user_set_under_a_gpu_runtime_class_is_judged_not_rewritten() -> None:
    none = {"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"}
    entry = review(under("nvidia", container("app", env=[none])))
    assert_clean(entry)
    assert visible(entry["object"]) == "none"
    every = {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}
    assert_refused(review(under("nvidia", container("app", env=[every]))), "raw-visible-devices")


@pytest.mark.parametrize("runtime_class", ["runc", "kata", "gvisor", "nvidia-kata"])
def test_other_runtime_classes_are_left_alone(runtime_class: str) -> None:
    entry = review(under(runtime_class, container("app")))
    assert_clean(entry)
    assert entry["patch"] == []


def test_the_gpu_runtime_classes_are_the_policys() -> None:
    own = policy_with("  runtimeClasses: {gpu: [gpu-runc]}")
    entry = review(under("gpu-runc", container("app")), own)
    assert visible(entry["object"]) == "void"
    assert review(under("nvidia", container("app")), own)["patch"] == []
    none = policy_with("  runtimeClasses: {gpu: []}")
    assert review(under("nvidia", container("app")), none)["patch"] == []


def test_a_pod_update_is_judged_by_what_it_adds() -> None:
    # A pod stored before the class was listed is not refused for a label change.
    old = under("nvidia", container("app"))
    new = copy.deepcopy(old)
    new["metadata"]["labels"] = {"team": "a"}
    assert_clean(update(old, new))
