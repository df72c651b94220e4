"""`make image` (hack/build-image): builds with docker or podman when one works, and
otherwise prints the exact command it would run and fails. Fake engines on a PATH of
our own record what they are asked; no image is built here."""

from __future__ import annotations

import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from tests.paths import ROOT

VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["project"]["version"]
COMMAND = f"build --tag gpushare-webhook:{VERSION} --file Dockerfile ."
# What make and the script need from the system, and nothing else (no docker, no podman).
TOOLS = ("make", "bash", "sh", "sed", "head", "dirname", "cat", "env")


def fake_engine(directory: Path, name: str, *, info: int = 0, build: int = 0) -> None:
    """An engine whose `info` exits ``info`` and which records a build and exits ``build``."""
    script = directory / name
    script.write_text(
        "#!/bin/sh\n"
        f'if [ "$1" = info ]; then exit {info}; fi\n'
        f'echo "$(pwd) $*" >> "{directory}/{name}.calls"\n'
        f"exit {build}\n"
    )
    script.chmod(0o755)


@pytest.fixture
def path(tmp_path: Path) -> Path:
    """A bin directory with the tools above linked in, and no container engine."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for tool in TOOLS:
        found = shutil.which(tool)
        if found is None:
            pytest.skip(f"{tool} is not installed")
        (bin_dir / tool).symlink_to(found)
    return bin_dir


def make_image(path: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["make", "--no-print-directory", "-C", str(ROOT), "image", *argv],
        capture_output=True,
        text=True,
        env={"PATH": str(path), "HOME": str(path)},
        check=False,
        timeout=60,
    )


def calls(path: Path, name: str) -> list[str]:
    log = path / f"{name}.calls"
    return log.read_text().splitlines() if log.exists() else []


def test_without_an_engine_it_prints_the_command_and_fails(path: Path) -> None:
    result = make_image(path)
    assert result.returncode != 0
    assert result.stdout.splitlines()[-1] == f"docker {COMMAND}"
    assert "no container engine" in result.stderr
    assert "docker: not installed; podman: not installed" in result.stderr


def test_the_printed_command_is_the_one_an_engine_runs(path: Path) -> None:
    printed = make_image(path).stdout.splitlines()[-1]
    fake_engine(path, "docker")
    built = make_image(path)
    assert built.returncode == 0, built.stderr
    assert calls(path, "docker") == [f"{ROOT} {printed.removeprefix('docker ')}"]


def test_a_docker_client_without_a_daemon_is_no_engine(path: Path) -> None:
    fake_engine(path, "docker", info=1)
    result = make_image(path)
    assert result.returncode != 0
    assert "docker: installed, but `docker info` fails" in result.stderr
    assert calls(path, "docker") == []
    fake_engine(path, "podman")
    assert make_image(path).returncode == 0
    assert calls(path, "podman") == [f"{ROOT} {COMMAND}"]


def test_a_failed_build_fails_make_and_the_tag_can_be_set(path: Path) -> None:
    fake_engine(path, "podman", build=3)
    result = make_image(path, "IMAGE=registry.example/gpushare-webhook:dev")
    assert result.returncode != 0
    (call,) = calls(path, "podman")
    assert "--tag registry.example/gpushare-webhook:dev " in call
