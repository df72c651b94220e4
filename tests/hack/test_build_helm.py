"""hack/build-helm builds Helm 4 (default) or Helm 3 from their pinned modules. A fake
``GO`` records what the script asks of Go, so its own logic runs in a second."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from tests.paths import ROOT

SCRIPT = ROOT / "hack" / "build-helm"

# `go list -m` answers a version per module; `go build` writes a stub and records its
# arguments in $FAKE_GO_LOG.
FAKE_GO = """\
#!/usr/bin/env bash
set -eu
case "$1" in
  list)
    case "$*" in
      *client-go*) echo v0.37.1 ;;
      *helm/v3*) echo v3.22.0 ;;
      *) echo v4.3.1 ;;
    esac ;;
  mod) ;;
  build)
    printf '%s\\n' "$*" >> "$FAKE_GO_LOG"
    while [ "$1" != -o ]; do shift; done
    printf '#!/bin/sh\\necho helm\\n' > "$2"
    chmod +x "$2" ;;
  *) echo "unexpected: $*" >&2; exit 9 ;;
esac
"""


def build(tmp_path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    go = tmp_path / "go"
    go.write_text(FAKE_GO)
    go.chmod(0o755)
    env = {
        **os.environ,
        "GO": str(go),
        "GPUSHARE_HELM_CACHE": str(tmp_path / "cache"),
        "FAKE_GO_LOG": str(tmp_path / "builds"),
    }
    return subprocess.run(
        [str(SCRIPT), *argv], capture_output=True, text=True, env=env, check=False, timeout=60
    )


def builds(tmp_path: Path) -> list[str]:
    return (tmp_path / "builds").read_text().splitlines()


@pytest.mark.parametrize("argv", [(), ("4",)])
def test_helm_4_is_the_default(tmp_path: Path, argv: tuple[str, ...]) -> None:
    result = build(tmp_path, *argv)
    assert result.returncode == 0, result.stderr
    (line,) = builds(tmp_path)
    assert line.endswith("helm.sh/helm/v4/cmd/helm")
    assert "helm.sh/helm/v4/internal/version.version=v4.3.1" in line
    assert "k8sVersion" not in line
    assert Path(result.stdout.splitlines()[-1]).is_file()


def test_helm_3_is_stamped_with_the_kubernetes_version_of_its_client(tmp_path: Path) -> None:
    """Without the stamp Helm 3 assumes Kubernetes 1.20 and refuses the chart."""
    result = build(tmp_path, "3")
    assert result.returncode == 0, result.stderr
    (line,) = builds(tmp_path)
    assert line.endswith("helm.sh/helm/v3/cmd/helm")
    assert "helm.sh/helm/v3/internal/version.version=v3.22.0" in line
    for package in ("pkg/lint/rules", "pkg/chartutil"):
        assert f"helm.sh/helm/v3/{package}.k8sVersionMajor=1" in line
        assert f"helm.sh/helm/v3/{package}.k8sVersionMinor=37" in line


def test_each_major_has_its_own_cache_entry(tmp_path: Path) -> None:
    four = build(tmp_path).stdout.splitlines()[-1]
    three = build(tmp_path, "3").stdout.splitlines()[-1]
    assert four != three
    again = build(tmp_path, "3")
    assert again.stdout.splitlines()[-1] == three and "cached" in again.stderr
    assert len(builds(tmp_path)) == 2, "a cached binary is not built again"


@pytest.mark.parametrize("argv", [("5",), ("3", "extra")])
def test_a_bad_argument_is_refused(tmp_path: Path, argv: tuple[str, ...]) -> None:
    result = build(tmp_path, *argv)
    assert result.returncode == 2
    assert "unexpected argument" in result.stderr
