"""``report --cluster`` and ``kubectl gpushare report``: the usage around the API call
(the call itself is proved against a real apiserver in tests/e2e/test_reports.py)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.paths import ROOT


def run(*args: str, plugin: bool = False) -> subprocess.CompletedProcess[str]:
    program = "webhook.cli.inspect" if plugin else "webhook"
    return subprocess.run(
        [sys.executable, "-m", program, *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
    )


@pytest.mark.parametrize(
    ("args", "says"),
    [
        ((), "needs --audit-log FILE or --cluster"),
        (("--cluster", "--audit-log", "-"), "needs --audit-log FILE or --cluster"),
        (("--audit-log", "-", "--kubeconfig", "k"), "--kubeconfig, --context: only with --cluster"),
    ],
)
def test_one_source_of_findings(args: tuple[str, ...], says: str) -> None:
    done = run("report", *args)
    assert done.returncode == 2 and says in done.stderr, done.stderr


@pytest.mark.parametrize("plugin", [False, True])
def test_no_api_access_is_one_line(tmp_path: Path, plugin: bool) -> None:
    missing = tmp_path / "nowhere.kubeconfig"
    done = run("report", "--cluster", "--kubeconfig", str(missing), plugin=plugin)
    assert done.returncode == 2, done.stderr
    assert str(missing) in done.stderr and "Traceback" not in done.stderr
