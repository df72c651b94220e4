"""`lint` lists schema and semantic errors in one pass, where the semantic checks can
run on what the schema accepted."""

from __future__ import annotations

import io
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path

import pytest

from webhook.cli import main
from webhook.core.policy import PolicyError
from webhook.policies import parse_policy

HEAD = "apiVersion: gpushare.io/v1alpha1\nkind: GPUSharePolicy\nspec:\n"
# Line 4: a schema error; line 7: a semantic one (a scheduler for a resource the
# policy does not know), found only on a compiled policy.
BOTH = (
    HEAD
    + "  onError: maybe\n"
    + "  schedulerName:\n"
    + "    default: hami-scheduler\n"
    + "    aliyun.com/gpumem: default-scheduler\n"
)


def cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        status = main(list(argv))
    return status, out.getvalue(), err.getvalue()


def test_schema_and_semantic_errors_in_one_pass() -> None:
    with pytest.raises(PolicyError) as caught:
        parse_policy(BOTH, source="p.yaml")
    errors = caught.value.errors
    assert len(errors) == 2, errors
    assert errors[0].startswith("line 4: spec.onError: 'maybe' is not one of")
    assert errors[1].startswith(
        "line 7: spec.schedulerName.aliyun.com/gpumem: not a GPU-sharing resource"
    )


def test_the_semantic_check_alone_is_unchanged() -> None:
    with pytest.raises(PolicyError) as caught:
        parse_policy(BOTH.replace("  onError: maybe\n", ""), source="p.yaml")
    assert len(caught.value.errors) == 1
    assert "line 6: spec.schedulerName.aliyun.com/gpumem" in caught.value.errors[0]


def test_a_schema_error_the_semantics_cannot_do_without_stays_alone() -> None:
    """With schedulerName itself refused there is nothing to check it against."""
    with pytest.raises(PolicyError) as caught:
        parse_policy(HEAD + "  schedulerName: [a]\n  onError: maybe\n", source="p.yaml")
    assert [e.split(":", 1)[0] for e in caught.value.errors] == ["line 4", "line 5"]


def test_lint_prints_every_error_of_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text(BOTH)
    status, _, err = cli("lint", str(bad))
    assert status == 1
    lines = err.splitlines()
    assert [line.split(": ", 2)[1] for line in lines] == ["line 4", "line 7"], err
