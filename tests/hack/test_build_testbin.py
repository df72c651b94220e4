"""hack/build-testbin as a newcomer runs it: minutes of ``go build`` are not minutes of
silence, and the directory is still the last line on stdout. A fake ``GO`` stands in for
Go so that the script's own logic runs in seconds."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.paths import ROOT

SCRIPT = ROOT / "hack" / "build-testbin"

# Answers the `go list`, `go mod download` and `go build` calls the script makes; a
# build sleeps $FAKE_GO_SLEEP_<name> seconds and fails for $FAKE_GO_FAIL.
FAKE_GO = """\
#!/usr/bin/env bash
set -eu
case "$1" in
  list)
    case "$*" in
      *Time*) echo 2026-01-01T00:00:00Z ;;
      *etcd*) echo v3.6.8 ;;
      *) echo v1.36.3 ;;
    esac ;;
  mod) ;;
  build)
    while [ "$1" != -o ]; do shift; done
    out=$2
    name=$(basename "$out")
    var="FAKE_GO_SLEEP_${name//-/_}"
    sleep "${!var:-0}"
    if [ "${FAKE_GO_FAIL:-}" = "$name" ]; then echo "fake compile error in $name" >&2; exit 3; fi
    printf '#!/bin/sh\\necho %s\\n' "$name" > "$out"
    chmod +x "$out" ;;
  *) echo "unexpected: $*" >&2; exit 9 ;;
esac
"""


def build(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    fake = tmp_path / "fake-go"
    fake.write_text(FAKE_GO)
    fake.chmod(0o755)
    return subprocess.run(
        [str(SCRIPT)],
        env={
            **os.environ,
            "GO": str(fake),
            "GPUSHARE_TESTBIN_CACHE": str(tmp_path / "cache"),
            "GPUSHARE_TESTBIN_PROGRESS_EVERY": "1",
            **env,
        },
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_a_long_build_says_what_it_builds_and_that_it_still_runs(tmp_path: Path) -> None:
    result = build(tmp_path, FAKE_GO_SLEEP_kube_apiserver="2.5")

    assert result.returncode == 0, result.stderr
    directory = Path(result.stdout.splitlines()[-1])
    assert directory.parent == tmp_path / "cache"
    assert sorted(p.name for p in directory.iterdir() if not p.name.startswith(".")) == [
        "etcd",
        "kube-apiserver",
        "kubectl",
    ]
    log = result.stderr.splitlines()
    assert (
        "build-testbin: building kube-apiserver (1/3): k8s.io/kubernetes/cmd/kube-apiserver" in log
    )
    assert "build-testbin: building kube-apiserver (1/3), 1 s" in log
    assert "build-testbin: building kube-apiserver (1/3), 2 s" in log
    assert "build-testbin: building etcd (3/3): go.etcd.io/etcd/server/v3" in log
    assert any(line.startswith("build-testbin: first build: about") for line in log)
    # Progress is on stderr only: stdout is the directory, for `| tail -1`.
    assert result.stdout == f"{directory}\n"


def test_a_cached_build_prints_the_directory_at_once(tmp_path: Path) -> None:
    first = build(tmp_path)
    again = build(tmp_path, FAKE_GO_FAIL="kube-apiserver")

    assert first.returncode == again.returncode == 0, again.stderr
    assert again.stdout == first.stdout
    assert "build-testbin: cached: " in again.stderr


def test_a_failed_build_fails_and_leaves_no_binary(tmp_path: Path) -> None:
    result = build(tmp_path, FAKE_GO_FAIL="kubectl", FAKE_GO_SLEEP_kubectl="1.5")

    assert result.returncode == 3
    assert result.stdout == ""
    assert "fake compile error in kubectl" in result.stderr
    assert "build-testbin: building kubectl (2/3), 1 s" in result.stderr
    (directory,) = (tmp_path / "cache").iterdir()
    assert not (directory / "kubectl").exists()
    assert not list(directory.glob(".build.*"))


def test_without_go_it_says_what_to_install(tmp_path: Path) -> None:
    result = build(tmp_path, GO=str(tmp_path / "no-such-go"))

    assert result.returncode == 1
    assert result.stdout == ""
    assert "not found: install Go 1.26.0 or later" in result.stderr
    assert "GPUSHARE_TESTBIN" in result.stderr
