"""`serve --cluster` options: refused in one line when they cannot work."""

from __future__ import annotations

import io
from contextlib import redirect_stderr
from pathlib import Path

import pytest

from webhook.cli import main


def run(*argv: str) -> tuple[int, str]:
    err = io.StringIO()
    with redirect_stderr(err):
        try:
            status = main(["serve", "--port", "0", "--health-port", "0", *argv])
        except SystemExit as exc:
            status = int(exc.code or 0)
    return status, err.getvalue()


def test_no_api_access_is_a_usage_error_naming_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "absent.kubeconfig"
    status, err = run("--cluster", "--kubeconfig", str(missing))
    assert status == 2
    assert f"--cluster: {missing}: no Kubernetes API access" in err
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["--cluster-resync", "600"], "--cluster-resync: only with --cluster"),
        (["--cluster-stale-after", "60"], "--cluster-stale-after: only with --cluster"),
        (["--kubeconfig", "k"], "--kubeconfig: only with --self-managed"),
    ],
)
def test_view_options_need_the_view(argv: list[str], said: str) -> None:
    status, err = run(*argv)
    assert (status, said in err) == (2, True), err


def test_too_short_timings_are_refused(tmp_path: Path) -> None:
    # Only parsed: nothing dials 127.0.0.1:1 before the options are refused.
    kubeconfig = tmp_path / "k"
    kubeconfig.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:1'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    status, err = run("--cluster", "--kubeconfig", str(kubeconfig), "--cluster-stale-after", "1")
    assert status == 2 and "--cluster-stale-after must be at least 10" in err, err
