"""Policy loading: the bundled default, the examples, and errors that name their line."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.paths import ROOT
from webhook.core.policy import RULE_IDS, PolicyError
from webhook.policies import DEFAULT_POLICY, load_policy, parse_policy

EXAMPLES = sorted((ROOT / "policies" / "examples").glob("*.yaml"))


def test_repository_default_is_the_bundled_default() -> None:
    assert (ROOT / "policies" / "default.yaml").read_text() == (
        ROOT / "webhook" / "policies" / "default.yaml"
    ).read_text()
    assert load_policy(ROOT / "policies" / "default.yaml").digest == DEFAULT_POLICY.digest


def test_default_actions() -> None:
    assert {rule: DEFAULT_POLICY.action(rule) for rule in RULE_IDS} == {
        rule: "off" if rule == "gpu-quota" else "deny" for rule in RULE_IDS
    }
    assert DEFAULT_POLICY.scheduler_name == "hami-scheduler"
    assert DEFAULT_POLICY.default_mode == "vgpu"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_are_valid_and_differ_from_default(path: Path) -> None:
    policy = load_policy(path)
    assert policy.digest != DEFAULT_POLICY.digest


def test_expected_examples_exist() -> None:
    assert {p.name for p in EXAMPLES} >= {
        "audit-only.yaml",
        "strict.yaml",
        "ack-mps.yaml",
        "volcano.yaml",
    }


def test_partial_policy_keeps_defaults() -> None:
    policy = parse_policy(
        "apiVersion: gpushare.io/v1alpha1\nkind: GPUSharePolicy\nspec:\n  rules:\n    gpu-quota: off\n"
    )
    assert policy.action("gpu-quota") == "off"  # a bare YAML `off` reads as false
    assert policy.action("privileged-gpu") == "deny"
    assert policy.scheduler_name == DEFAULT_POLICY.scheduler_name


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("kind: GPUSharePolicy\n", ["line 1: (top level): 'apiVersion' is a required property"]),
        (
            "apiVersion: gpushare.io/v1alpha1\nkind: GPUSharePolicy\nspec:\n  schedulr: x\n",
            ["line 4: spec.schedulr: unknown field"],
        ),
        (
            "apiVersion: gpushare.io/v1alpha1\nkind: GPUSharePolicy\nspec:\n  rules:\n"
            "    privileged-gpu: deny\n    no-such-rule: deny\n",
            ["line 6: spec.rules.no-such-rule: 'no-such-rule' is not one of"],
        ),
        (
            "apiVersion: gpushare.io/v1alpha1\nkind: GPUSharePolicy\nspec:\n  vgpu:\n"
            "    preload: envv\n  limits:\n    perPod: {gpus: 0}\n",
            [
                "line 7: spec.limits.perPod.gpus: 0 is less than the minimum of 1",
                "line 5: spec.vgpu.preload: 'envv' is not one of env, file",
            ],
        ),
        ("apiVersion: [unclosed\n", ["line 2: not valid YAML"]),
        ("- a list\n", ["line 1: a policy is a YAML mapping"]),
    ],
)
def test_invalid_policies_name_each_line(text: str, expected: list[str]) -> None:
    with pytest.raises(PolicyError) as caught:
        parse_policy(text, source="p.yaml")
    assert len(caught.value.errors) == len(expected)
    for error, prefix in zip(caught.value.errors, expected, strict=True):
        assert error.startswith(prefix), error


def test_unreadable_file() -> None:
    with pytest.raises(PolicyError, match="cannot read"):
        load_policy("/nonexistent/policy.yaml")


def test_digest_changes_with_content() -> None:
    head = "apiVersion: gpushare.io/v1alpha1\nkind: GPUSharePolicy\nspec:\n"
    a = parse_policy(head + "  schedulerName: a\n")
    b = parse_policy(head + "  schedulerName: b\n")
    assert a.digest != b.digest
    assert parse_policy(head + "  schedulerName: a\n").digest == a.digest
