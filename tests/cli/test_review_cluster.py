"""`review --cluster SNAPSHOT`: the README's example, run as written."""

from __future__ import annotations

import re

from tests.cli.test_cli import run
from tests.paths import documentation

README = documentation()


def test_readme_cluster_example_runs_as_written() -> None:
    match = re.search(
        r"\n    \$ gpushare-webhook (review [^\n]*--cluster [^\n]*)\n((?:    [^$\n][^\n]*\n)+)",
        README,
    )
    assert match is not None, "README lost its review --cluster example"
    result = run(*match.group(1).split())
    assert result.returncode == 1, result.stderr
    expected = "".join(line[4:] + "\n" for line in match.group(2).splitlines())
    assert result.stdout == expected


def test_a_missing_snapshot_is_a_usage_error() -> None:
    result = run(
        "review",
        "-f",
        "tests/clusters/pod-90g.yaml",
        "--cluster",
        "tests/clusters/no-such-snapshot.yaml",
    )
    assert result.returncode == 2
    assert "no-such-snapshot.yaml" in result.stderr and "Traceback" not in result.stderr
