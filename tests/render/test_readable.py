"""The generated admission objects read as people read them (issue 30, step 2): no line of a
generated file over 200 characters, CEL written as YAML blocks, and no CEL expression of
the default or an example policy over 3,000 characters but those still to be split."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pytest

from webhook.policies import DEFAULT_POLICY, parse_policy
from webhook.render.admission import CEL_FIELDS
from webhook.render.cel import printed, tokens
from webhook.render.scope import match_conditions, view_conditions
from webhook.render.targets import TARGETS

ROOT: Final = Path(__file__).resolve().parents[2]

GENERATED: Final = sorted(
    [
        ROOT / "deploy/base/celpolicies.yaml",
        ROOT / "deploy/mutatingpolicies/mutatingpolicies.yaml",
        ROOT / "deploy/webhooks/webhookconfigurations.yaml",
        ROOT / "deploy/overlays/apiserver-cluster-view/view-scope.yaml",
        *(ROOT / "charts/gpushare-webhook/files").glob("*.yaml"),
        *(ROOT / "charts/gpushare-webhook/ci").glob("*.yaml"),
    ]
)

MAX_LINE: Final = 200

MAX_EXPRESSION: Final = 3000

# The expressions still over MAX_EXPRESSION, by object and field (any policy), each kept
# whole for a reason it names. The test fails when one more goes over, and when one of
# these no longer does (then it leaves this list).
STILL_OVER: Final = frozenset(
    {
        # The scope's one condition: a matchCondition reads no variables, and conditions
        # only AND, so its alternatives cannot be spread over several.
        "gpushare-audit.matchConditions[gpushare.io/gpu-relevant].expression",
        # The container rules' messages: the apiserver evaluates every messageExpression on
        # every request it validates, and split into variables they cost a vGPU pod's
        # create about 1.4 ms more (docs/architecture.md).
        "gpushare-audit.validations[host-device-access].messageExpression",
        "gpushare-audit.validations[invalid-gpu-request].messageExpression",
        "gpushare-audit.validations[limit-tampering].messageExpression",
        "gpushare-audit.validations[raw-visible-devices].messageExpression",
        "gpushare-deny.matchConditions[gpushare.io/gpu-relevant].expression",
        "gpushare-deny.validations[host-device-access].messageExpression",
        "gpushare-deny.validations[invalid-gpu-request].messageExpression",
        "gpushare-deny.validations[limit-tampering].messageExpression",
        "gpushare-deny.validations[raw-visible-devices].messageExpression",
        "webhook[gpushare.io/gpu-relevant].expression",
    }
)


def _policies() -> list[tuple[str, Any]]:
    examples = sorted((ROOT / "policies/examples").glob("*.yaml"))
    return [("default", DEFAULT_POLICY)] + [
        (path.stem, parse_policy(path.read_text("utf-8"), source=str(path))) for path in examples
    ]


def _expressions(value: Any, path: str) -> Iterator[tuple[str, str]]:
    """(where, CEL) of every CEL field under ``value``; a list entry is named by its
    ``name`` or ``key`` where it has one, a validation by its rule, else by its place."""
    if isinstance(value, dict):
        for key, item in value.items():
            if key in CEL_FIELDS and isinstance(item, str):
                yield f"{path}.{key}", item
            else:
                yield from _expressions(item, f"{path}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            named: object = i
            if isinstance(item, dict):
                rule = str(item.get("message", "")).partition("]")[0].lstrip("[")
                named = item.get("name") or item.get("key") or rule or i
            yield from _expressions(item, f"{path}[{named}]")


def _rendered() -> Iterator[tuple[str, str, str]]:
    """(policy, where, CEL) of every CEL expression rendered from the default and the
    example policies: the in-apiserver policies and the webhooks' matchConditions."""
    for name, policy in _policies():
        for target in TARGETS:
            for obj in target.render(policy):
                yield from (
                    (name, where, cel)
                    for where, cel in _expressions(obj["spec"], obj["metadata"]["name"])
                )
        for conditions in (match_conditions(policy), view_conditions(policy)):
            yield from (
                (name, where, cel)
                for where, cel in _expressions([dict(c) for c in conditions], "webhook")
            )


@pytest.mark.parametrize("path", GENERATED, ids=lambda p: str(p.relative_to(ROOT)))
def test_no_line_of_a_generated_file_is_over_200_characters(path: Path) -> None:
    long = [
        (number, len(line))
        for number, line in enumerate(path.read_text("utf-8").splitlines(), 1)
        if len(line) > MAX_LINE
    ]
    assert not long, f"{path}: lines over {MAX_LINE} characters (line, length): {long[:5]}"


@pytest.mark.parametrize("path", GENERATED, ids=lambda p: str(p.relative_to(ROOT)))
def test_cel_is_written_as_yaml_blocks(path: Path) -> None:
    """A quoted scalar folds with escapes nobody reads (YAML quotes what has characters past
    ASCII or a space before a line break): every multi-line CEL field is a block."""
    text = path.read_text("utf-8")
    for field in CEL_FIELDS:
        assert f'{field}: "' not in text, f"{path}: a quoted {field}"


def test_the_printer_changes_only_whitespace_and_is_settled() -> None:
    for name, where, cel in _rendered():
        assert printed(cel) == cel, f"{name}: {where} is not printed"
        assert tokens(cel) == tokens(" ".join(cel.split())), f"{name}: {where}"


def test_no_expression_is_over_3000_characters_but_those_to_split() -> None:
    sizes: dict[str, int] = {}
    for _, where, cel in _rendered():
        sizes[where] = max(sizes.get(where, 0), len(cel))
    over = {where for where, size in sizes.items() if size > MAX_EXPRESSION}
    largest = max(sizes, key=sizes.__getitem__)
    # Recorded in the test log (pytest -s): the figure issue 30 tracks.
    print(f"largest CEL expression: {sizes[largest]} characters ({largest})")
    assert over - STILL_OVER == set(), f"over {MAX_EXPRESSION} characters: split them"
    assert STILL_OVER - over == set(), "now within the limit: take them off STILL_OVER"
