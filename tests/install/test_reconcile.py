"""The patches and comparisons that keep the install's scope in step (no apiserver here;
tests/e2e/test_reconcile.py runs them against one)."""

from __future__ import annotations

import copy

import jsonpatch

from webhook.install.reconcile import _holds, _stamped, conditions_patch
from webhook.render.scope import MatchCondition
from webhook.render.validating import validating_policies

OLD: list[MatchCondition] = [{"name": "gpu", "expression": "true"}]
NEW: list[MatchCondition] = [{"name": "gpu", "expression": "false"}]


def config(*conditions: list[MatchCondition] | None) -> dict[str, object]:
    hooks = []
    for index, wanted in enumerate(conditions):
        hook: dict[str, object] = {"name": f"h{index}.gpushare.io"}
        if wanted is not None:
            hook["matchConditions"] = [dict(c) for c in wanted]
        hooks.append(hook)
    return {"webhooks": hooks}


def test_only_webhooks_that_differ_are_patched() -> None:
    before = config(OLD, NEW, None)
    operations = conditions_patch(before, NEW)
    assert [op["path"] for op in operations] == [
        "/webhooks/0/name",
        "/webhooks/0/matchConditions",
        "/webhooks/2/name",
        "/webhooks/2/matchConditions",
    ]
    after = jsonpatch.apply_patch(before, operations)
    assert after == config(NEW, NEW, NEW)
    assert conditions_patch(after, NEW) == []


def test_no_conditions_removes_them() -> None:
    after = jsonpatch.apply_patch(config(OLD), conditions_patch(config(OLD), []))
    assert after == config(None)


def test_a_reordered_list_fails_the_patch_instead_of_landing_elsewhere() -> None:
    before = config(OLD, NEW)
    operations = conditions_patch(before, NEW)
    hooks = before["webhooks"]
    assert isinstance(hooks, list)
    hooks.reverse()
    try:
        jsonpatch.apply_patch(before, operations)
    except jsonpatch.JsonPatchTestFailed:
        return
    raise AssertionError("the name test did not catch the reorder")


def test_defaults_the_apiserver_adds_are_no_difference() -> None:
    from webhook.policies import DEFAULT_POLICY

    wanted = _stamped(validating_policies(DEFAULT_POLICY)[0])
    stored = copy.deepcopy(wanted)
    stored["spec"]["matchConstraints"]["objectSelector"] = {}
    stored["metadata"]["resourceVersion"] = "7"
    assert _holds(stored, wanted)
    edited = copy.deepcopy(stored)
    edited["spec"]["failurePolicy"] = "Ignore"
    assert not _holds(edited, wanted), "a hand edit is undone"
    unstamped = copy.deepcopy(stored)
    del unstamped["metadata"]["annotations"]
    assert not _holds(unstamped, wanted), "what the policy no longer sets must go too"
