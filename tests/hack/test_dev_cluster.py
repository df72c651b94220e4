"""``make dev-cluster`` and hack/dev-cluster on a fresh clone: they prepare what they need
(the virtualenv, the control plane) with a line saying so, instead of telling the user
to. Stand-ins for make, Go and the virtualenv's python keep the logic's test fast;
tests/e2e/test_dev_cluster.py runs the real cluster."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.hack.test_build_testbin import FAKE_GO
from tests.paths import ROOT

SCRIPT = ROOT / "hack" / "dev-cluster"

# `make -C ROOT venv VENV=DIR`: writes a python that prints how it was called.
FAKE_MAKE = """\
#!/usr/bin/env bash
set -eu
echo "make $*" >> "$FAKE_LOG"
for arg in "$@"; do case "$arg" in VENV=*) venv=${arg#VENV=} ;; esac; done
mkdir -p "$venv/bin"
printf '#!/bin/sh\\necho "python $*"\\n' > "$venv/bin/python"
chmod +x "$venv/bin/python"
"""


def executable(path: Path, text: str) -> Path:
    path.write_text(text)
    path.chmod(0o755)
    return path


def dev_cluster(tmp_path: Path, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("GPUSHARE_TESTBIN", "PYTHON")}
    return subprocess.run(
        [str(SCRIPT), *args],
        env={
            **base,
            "VENV": str(tmp_path / "venv"),
            "MAKE": str(executable(tmp_path / "fake-make", FAKE_MAKE)),
            "FAKE_LOG": str(tmp_path / "make.log"),
            "GO": str(executable(tmp_path / "fake-go", FAKE_GO)),
            "GPUSHARE_TESTBIN_CACHE": str(tmp_path / "cache"),
            **env,
        },
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_without_a_virtualenv_or_control_plane_it_prepares_both(tmp_path: Path) -> None:
    result = dev_cluster(tmp_path, "--kubeconfig", "k")

    assert result.returncode == 0, result.stderr
    venv = tmp_path / "venv"
    assert f"dev-cluster: no virtualenv at {venv} yet: creating it with 'make venv'" in (
        result.stderr
    )
    assert (tmp_path / "make.log").read_text() == f"make -C {ROOT} venv VENV={venv}\n"
    assert "build-testbin: building kube-apiserver (1/3)" in result.stderr
    (bin_dir,) = (tmp_path / "cache").iterdir()
    assert result.stdout == f"python -m webhook.dev.cluster --bin-dir {bin_dir} --kubeconfig k\n"


def test_with_a_virtualenv_and_a_bin_dir_it_starts_at_once(tmp_path: Path) -> None:
    executable(tmp_path / "fake-make", FAKE_MAKE)
    subprocess.run(
        [str(tmp_path / "fake-make"), f"VENV={tmp_path / 'venv'}"],
        env={**os.environ, "FAKE_LOG": str(tmp_path / "setup.log")},
        check=True,
    )

    given = dev_cluster(tmp_path, "--kubeconfig", "k", "--bin-dir", "/bins")
    from_env = dev_cluster(tmp_path, "--kubeconfig", "k", GPUSHARE_TESTBIN="/bins")

    assert given.returncode == from_env.returncode == 0, given.stderr + from_env.stderr
    assert given.stderr == from_env.stderr == ""
    assert not (tmp_path / "make.log").exists()
    assert not (tmp_path / "cache").exists()
    assert given.stdout == "python -m webhook.dev.cluster --kubeconfig k --bin-dir /bins\n"
    assert from_env.stdout == "python -m webhook.dev.cluster --kubeconfig k\n"


def test_a_python_named_by_the_user_is_not_replaced(tmp_path: Path) -> None:
    result = dev_cluster(tmp_path, "--kubeconfig", "k", PYTHON=str(tmp_path / "nope"))

    assert result.returncode == 2
    assert (
        result.stderr
        == f"dev-cluster: PYTHON={tmp_path / 'nope'} is not an executable: unset it to use {tmp_path / 'venv'}\n"
    )
    assert not (tmp_path / "make.log").exists()


def make_dry_run(venv: Path, **env: str) -> list[str]:
    base = {k: v for k, v in os.environ.items() if k != "GPUSHARE_TESTBIN"}
    result = subprocess.run(
        ["make", "-n", "-C", str(ROOT), "dev-cluster", f"VENV={venv}", "ARGS=--policy p.yaml"],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    return [line for line in result.stdout.splitlines() if not line.startswith("make")]


def test_make_dev_cluster_creates_the_venv_builds_the_control_plane_and_runs(
    tmp_path: Path,
) -> None:
    venv = tmp_path / "venv"

    steps = make_dry_run(venv)

    assert steps[0] == f"python3 -m venv {venv}"
    assert steps[-2:] == [
        "hack/build-testbin >/dev/null",
        f"VENV={venv} hack/dev-cluster --kubeconfig /tmp/gpushare-dev.kubeconfig --policy p.yaml",
    ]
    assert "hack/build-testbin >/dev/null" not in make_dry_run(venv, GPUSHARE_TESTBIN="/bins")
