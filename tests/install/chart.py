"""The Helm chart under test, and the helm, kubectl and promtool that render and check it.

The chart is tested with Helm 4 and Helm 3 (:data:`HELM_MAJORS`). Helm 4 comes from
$GPUSHARE_HELM, Helm 3 from $GPUSHARE_HELM3, else `hack/build-helm [3]` builds it from
the Go module pinned in hack/helm or hack/helm3 (when Go is installed), else a helm on
PATH of that major; promtool from $GPUSHARE_PROMTOOL, else hack/build-promtool; kubectl
from $GPUSHARE_KUBECTL, else $GPUSHARE_TESTBIN/kubectl, else hack/build-testbin. Without
them a test is skipped locally and fails in CI (CI set), as the control plane is.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final, NoReturn

import pytest
import yaml

from tests.paths import ROOT

Obj = dict[str, Any]

CHART: Final = ROOT / "charts" / "gpushare-webhook"
EXAMPLES: Final = tuple(sorted((CHART / "ci").glob("*-values.yaml")))
NAMESPACE: Final = "gpushare-system"


def _unavailable(reason: str) -> NoReturn:
    if os.environ.get("CI"):
        pytest.fail(reason)
    pytest.skip(reason)


def _built(script: str, *, file: str, argv: Sequence[str] = ()) -> tuple[str | None, str]:
    """The path hack/SCRIPT prints last (joined with FILE when it is a directory)."""
    go = os.environ.get("GO", "go")
    if not shutil.which(go):
        return None, f"no Go toolchain ({go}) to run hack/{script}"
    built = subprocess.run(
        [str(ROOT / "hack" / script), *argv], capture_output=True, text=True, check=False
    )
    lines = built.stdout.strip().splitlines()
    if built.returncode == 0 and lines:
        path = Path(lines[-1])
        path = path / file if path.is_dir() else path
        if path.is_file():
            return str(path), ""
    return None, f"hack/{script} failed ({built.returncode}): {built.stderr[-2000:]}"


HELM_MAJORS: Final = (4, 3)
_HELM_ENV: Final = {4: "GPUSHARE_HELM", 3: "GPUSHARE_HELM3"}


def helm_major(helm: str) -> int | None:
    """The major version ``helm version`` reports, None when it does not answer."""
    result = run([helm, "version", "--template", "{{.Version}}"])
    version = result.stdout.strip().removeprefix("v")
    head = version.split(".", 1)[0]
    return int(head) if result.returncode == 0 and head.isdigit() else None


def find_helm(major: int = 4) -> str:
    """A helm of ``major``: the one its variable names, else built, else on PATH."""
    variable = _HELM_ENV[major]
    if explicit := os.environ.get(variable):
        return explicit
    path, problem = _built("build-helm", file="helm", argv=(str(major),))
    if path:
        return path
    on_path = shutil.which("helm")
    if on_path and helm_major(on_path) == major:
        return on_path
    _unavailable(
        f"cannot render the Helm chart with Helm {major}: {problem}; no Helm {major} on "
        f"PATH, {variable} unset"
    )


def find_promtool() -> str:
    """promtool from $GPUSHARE_PROMTOOL, else built by hack/build-promtool."""
    if explicit := os.environ.get("GPUSHARE_PROMTOOL"):
        return explicit
    path, problem = _built("build-promtool", file="promtool")
    if path:
        return path
    _unavailable(f"cannot check the alerting rules: {problem}; GPUSHARE_PROMTOOL unset")


def find_kubectl() -> str:
    if explicit := os.environ.get("GPUSHARE_KUBECTL"):
        return explicit
    testbin = os.environ.get("GPUSHARE_TESTBIN")
    if testbin and (Path(testbin) / "kubectl").is_file():
        return str(Path(testbin) / "kubectl")
    path, problem = _built("build-testbin", file="kubectl")
    if path:
        return path
    _unavailable(f"cannot run kustomize: {problem}")


def documents(text: str) -> list[Obj]:
    return [d for d in yaml.safe_load_all(text) if d is not None]


def run(argv: Sequence[str], *, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(list(argv), input=stdin, capture_output=True, text=True, check=False)


def template_text(
    helm: str,
    *,
    values: Sequence[Path] = (),
    settings: Sequence[str] = (),
    namespace: str = NAMESPACE,
    extra: Sequence[str] = (),
) -> str:
    argv = [helm, "template", "gpushare-webhook", str(CHART), "--namespace", namespace]
    for path in values:
        argv += ["--values", str(path)]
    for setting in settings:
        argv += ["--set", setting]
    result = run([*argv, *extra])
    assert result.returncode == 0, result.stderr
    return result.stdout


def template(helm: str, **options: Any) -> list[Obj]:
    return documents(template_text(helm, **options))


def kustomize(kubectl: str, directory: Path) -> list[Obj]:
    result = run([kubectl, "kustomize", str(directory)])
    assert result.returncode == 0, result.stderr
    return documents(result.stdout)


def identity(obj: Obj) -> tuple[str, str, str, str]:
    metadata = obj.get("metadata") or {}
    return (
        str(obj.get("apiVersion")),
        str(obj.get("kind")),
        str(metadata.get("namespace") or ""),
        str(metadata.get("name")),
    )


def by_identity(objects: Sequence[Obj]) -> dict[tuple[str, str, str, str], Obj]:
    keyed = {identity(obj): obj for obj in objects}
    assert len(keyed) == len(objects), "an object is rendered twice"
    return keyed
