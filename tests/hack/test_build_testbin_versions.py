"""hack/build-testbin <minor>: the version matrix's kube-apiservers, one module each in
hack/testbin-<minor>, cached apart from the default build. A fake ``GO`` stands in for Go
(no build runs here); the modules themselves are checked as text."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.e2e.test_versions import VERSIONS
from tests.paths import ROOT

SCRIPT = ROOT / "hack" / "build-testbin"
MINORS = sorted(p.name.removeprefix("testbin-") for p in (ROOT / "hack").glob("testbin-1.*"))

# Answers `go list` from the go.mod of the directory it runs in, so the stamp is the
# module's; a build writes a script that prints its -ldflags.
FAKE_GO = """\
#!/usr/bin/env bash
set -eu
case "$1" in
  list)
    case "$*" in
      *Time*) echo 2026-01-01T00:00:00Z ;;
      *k8s.io/kubernetes*) sed -n 's/^require k8s.io\\/kubernetes //p; s/^\\tk8s.io\\/kubernetes //p' go.mod | head -1 ;;
      *) echo "unexpected: $*" >&2; exit 9 ;;
    esac ;;
  mod) ;;
  build)
    flags=
    while [ "$1" != -o ]; do
      case "$1" in -ldflags|-tags) flags="$flags $1=$2 " ;; esac
      shift
    done
    printf '#!/bin/sh\\necho "%s"\\n' "$flags" > "$2"
    chmod +x "$2" ;;
  *) echo "unexpected: $*" >&2; exit 9 ;;
esac
"""


def run(
    tmp_path: Path, *args: str, script: Path = SCRIPT, **env: str
) -> subprocess.CompletedProcess[str]:
    fake = tmp_path / "fake-go"
    fake.write_text(FAKE_GO)
    fake.chmod(0o755)
    return subprocess.run(
        [str(script), *args],
        env={
            **os.environ,
            "GO": str(fake),
            "GPUSHARE_TESTBIN_CACHE": str(tmp_path / "cache"),
            **env,
        },
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def key(moddir: Path, recipe: str = "1") -> str:
    text = f"recipe={recipe}\n".encode() + (moddir / "go.mod").read_bytes()
    text += (moddir / "go.sum").read_bytes()
    if (moddir / "build-tags").exists():
        text += f"tags={(moddir / 'build-tags').read_text().strip()}\n".encode()
    return hashlib.sha256(text).hexdigest()[:16]


def test_every_minor_has_a_module_and_a_place_in_the_matrix() -> None:
    assert MINORS == ["1.30", "1.34", "1.37"]
    assert {v.minor for v in VERSIONS} == {*MINORS, "1.36"}
    makefile = (ROOT / "Makefile").read_text()
    for minor in MINORS:
        variable = "GPUSHARE_TESTBIN_" + minor.replace(".", "_")
        assert (
            f'{variable}="$$(command -v go >/dev/null && hack/build-testbin {minor} | tail -1)"'
            in makefile
        )
        assert {v.env for v in VERSIONS if v.minor == minor} == {variable}


@pytest.mark.parametrize("minor", MINORS)
def test_a_minor_builds_only_its_kube_apiserver_stamped_with_its_release(
    tmp_path: Path, minor: str
) -> None:
    result = run(tmp_path, minor)

    assert result.returncode == 0, result.stderr
    directory = Path(result.stdout.strip())
    assert directory == tmp_path / "cache" / key(ROOT / "hack" / f"testbin-{minor}")
    assert sorted(p.name for p in directory.iterdir() if not p.name.startswith(".")) == [
        "kube-apiserver"
    ]
    stamp = subprocess.run(
        [str(directory / "kube-apiserver")], capture_output=True, text=True, check=True
    ).stdout
    major, minor_number = minor.split(".")
    assert f"gitMajor={major} " in stamp
    assert f"gitMinor={minor_number} " in stamp
    assert f"gitVersion=v{minor}." in stamp
    # Only 1.30 still links an in-tree cloud provider for "providerless" to leave out.
    assert ("-tags=providerless " in stamp) == (minor == "1.30")
    assert "building kube-apiserver (1/1)" in result.stderr
    assert "kube-apiserver only" in result.stderr


def test_each_minor_and_the_default_build_have_keys_of_their_own(tmp_path: Path) -> None:
    directories = {run(tmp_path, *args).stdout.strip() for args in ([], *([m] for m in MINORS))}

    assert len(directories) == len(MINORS) + 1
    # The default build's key is derived as before: its cached binaries stay valid.
    assert str(tmp_path / "cache" / key(ROOT / "hack" / "testbin")) in directories


def test_a_changed_go_sum_builds_into_a_fresh_directory(tmp_path: Path) -> None:
    hack = tmp_path / "hack"
    hack.mkdir()
    shutil.copy2(SCRIPT, hack / "build-testbin")
    shutil.copytree(ROOT / "hack" / "testbin-1.30", hack / "testbin-1.30")
    first = run(tmp_path, "1.30", script=hack / "build-testbin")
    with (hack / "testbin-1.30" / "go.sum").open("a") as sums:
        sums.write("example.com/m v1.0.0 h1:AAAA=\n")
    second = run(tmp_path, "1.30", script=hack / "build-testbin")
    again = run(tmp_path, "1.30", script=hack / "build-testbin")

    assert first.returncode == second.returncode == again.returncode == 0
    assert first.stdout != second.stdout
    assert again.stdout == second.stdout
    assert "build-testbin: cached: " in again.stderr


def test_build_tags_are_part_of_the_key_and_must_be_tags(tmp_path: Path) -> None:
    hack = tmp_path / "hack"
    hack.mkdir()
    shutil.copy2(SCRIPT, hack / "build-testbin")
    shutil.copytree(ROOT / "hack" / "testbin-1.30", hack / "testbin-1.30")
    first = run(tmp_path, "1.30", script=hack / "build-testbin")
    (hack / "testbin-1.30" / "build-tags").write_text("providerless,osusergo\n")
    second = run(tmp_path, "1.30", script=hack / "build-testbin")
    (hack / "testbin-1.30" / "build-tags").write_text("providerless -o /tmp/x\n")
    bad = run(tmp_path, "1.30", script=hack / "build-testbin")

    assert first.returncode == second.returncode == 0
    assert first.stdout != second.stdout
    stamp = subprocess.run(
        [second.stdout.strip() + "/kube-apiserver"], capture_output=True, text=True, check=True
    ).stdout
    assert "-tags=providerless,osusergo " in stamp
    assert bad.returncode == 2
    assert "build-tags: give tags as a,b" in bad.stderr


@pytest.mark.parametrize(
    "argument", ["1.29", "1.36", "testbin", "../testbin", "1.30/..", "1.3O", "v1.30"]
)
def test_an_argument_that_names_no_module_fails_and_lists_those_that_exist(
    tmp_path: Path, argument: str
) -> None:
    result = run(tmp_path, argument)

    assert result.returncode == 2
    assert result.stdout == ""
    assert f"unexpected argument: {argument} " in result.stderr
    assert ": 1.30 1.34 1.37;" in result.stderr
    assert not (tmp_path / "cache").exists()


def test_a_second_argument_is_refused(tmp_path: Path) -> None:
    result = run(tmp_path, "1.30", "1.34")

    assert result.returncode == 2
    assert "unexpected argument: 1.34" in result.stderr


def test_without_go_it_names_the_variable_that_takes_a_prebuilt_directory(tmp_path: Path) -> None:
    result = run(tmp_path, "1.34", GO=str(tmp_path / "no-such-go"))

    assert result.returncode == 1
    assert "GPUSHARE_TESTBIN_1_34 to a directory that holds kube-apiserver" in result.stderr


@pytest.mark.parametrize("minor", MINORS)
def test_a_module_points_every_staging_module_at_its_own_release(minor: str) -> None:
    """A half-done bump (one staging module of another release) builds a kube-apiserver
    that is neither; docs/development.md says how a module is written."""
    text = (ROOT / "hack" / f"testbin-{minor}" / "go.mod").read_text()
    (release,) = re.findall(r"^require k8s\.io/kubernetes v(\S+)$", text, re.M)
    assert release.startswith(f"{minor}.")
    replaced = dict(re.findall(r"^\t(k8s\.io/\S+) => \1 (v\S+)$", text, re.M))
    assert replaced, text
    assert set(replaced.values()) == {f"v0.{release.split('.', 1)[1]}"}
    for required in re.findall(r"^\t(k8s\.io/\S+) v\S+ // indirect$", text, re.M):
        assert required in replaced or required in (
            "k8s.io/klog/v2",
            "k8s.io/kube-openapi",
            "k8s.io/utils",
            "k8s.io/gengo/v2",
        ), required
