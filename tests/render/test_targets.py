"""The list of what an install renders: each target renders its own kinds and names alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.paths import ROOT
from webhook.policies import DEFAULT_POLICY, parse_policy
from webhook.render.targets import MUTATING, TARGETS, VALIDATING

EXAMPLES = sorted((ROOT / "policies" / "examples").glob("*.yaml"))


@pytest.mark.parametrize("path", [None, *EXAMPLES], ids=lambda p: p.stem if p else "default")
def test_each_target_renders_its_kinds_under_names_it_lists(path: Path | None) -> None:
    policy = DEFAULT_POLICY if path is None else parse_policy(path.read_text("utf-8"))
    for target in TARGETS:
        objects = target.render(policy, namespace="gpu-admission")
        assert {o["kind"] for o in objects} == set(target.kinds), target.family
        names = {o["metadata"]["name"] for o in objects}
        assert names <= set(target.names), (target.family, names - set(target.names))


def test_the_targets_name_the_apis_resources() -> None:
    assert VALIDATING.policy_resource == "validatingadmissionpolicies"
    assert VALIDATING.binding_resource == "validatingadmissionpolicybindings"
    assert MUTATING.policy_resource == "mutatingadmissionpolicies"
    assert MUTATING.binding_resource == "mutatingadmissionpolicybindings"
