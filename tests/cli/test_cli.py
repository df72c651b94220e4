"""The command line as users run it: a real subprocess, exit codes, no tracebacks."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.paths import EXAMPLES, MANIFESTS, ROOT


def run(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "webhook", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
    )


def test_review_json_contract_in_order() -> None:
    result = run(
        "review",
        "-f",
        str(MANIFESTS / "hami-vgpu-pod.yaml"),
        "-f",
        str(MANIFESTS / "privileged-sidecar.yaml"),
        "-o",
        "json",
    )
    assert result.returncode == 1, result.stderr
    entries = json.loads(result.stdout)
    assert [e["name"] for e in entries] == ["gpu-pod", "sneaky"]
    first, second = entries
    assert set(first) == {
        "kind",
        "namespace",
        "name",
        "allowed",
        "mode",
        "violations",
        "warnings",
        "patch",
        "object",
    }
    assert first["allowed"] is True
    assert first["mode"] == "vgpu"
    assert first["object"]["spec"]["schedulerName"] == "hami-scheduler"
    assert second["allowed"] is False
    assert second["violations"][0]["rule"] == "privileged-gpu"
    assert second["violations"][0]["action"] == "deny"


def test_review_all_allowed_exits_zero_and_yaml_output() -> None:
    result = run("review", "-f", str(MANIFESTS / "eks-mig-deployment.yaml"), "-o", "yaml")
    assert result.returncode == 0, result.stderr
    entries = yaml.safe_load(result.stdout)
    assert entries[0]["mode"] == "mig"
    assert entries[0]["patch"] == []


def test_review_stdin_multi_document_and_text_output() -> None:
    text = (
        (MANIFESTS / "plain-pod.yaml").read_text()
        + "---\n"
        + (MANIFESTS / "visible-devices-all.yaml").read_text()
    )
    result = run("review", "-f", "-", stdin=text)
    assert result.returncode == 1
    assert "Pod web/nginx: ALLOWED" in result.stdout
    assert "Pod ml/grab-all: DENIED" in result.stdout
    assert "raw-visible-devices" in result.stdout


def test_review_with_policy_namespace_and_user() -> None:
    args = ["review", "-f", str(MANIFESTS / "ack-mps-job.yaml"), "-o", "json"]
    strict = run(*args, "--policy", str(EXAMPLES / "strict.yaml"), "--namespace", "ml")
    assert strict.returncode == 1
    assert json.loads(strict.stdout)[0]["violations"][0]["rule"] == "mode-conflict"
    allowed = run(*args, "--policy", str(EXAMPLES / "strict.yaml"), "--namespace", "gpu-mps")
    assert allowed.returncode == 0


def test_review_update_operation() -> None:
    pod = yaml.safe_load((MANIFESTS / "hami-vgpu-pod.yaml").read_text())
    pod["spec"]["nodeName"] = "node-1"
    create = run("review", "-f", "-", "-o", "json", stdin=json.dumps(pod))
    update = run("review", "-f", "-", "-o", "json", "--operation", "UPDATE", stdin=json.dumps(pod))
    assert create.returncode == 1
    assert update.returncode == 0
    assert json.loads(update.stdout)[0]["patch"] == []


@pytest.mark.parametrize(
    ("args", "stdin", "fragment"),
    [
        (["review", "-f", "/nonexistent.yaml"], None, "cannot read"),
        (["review", "-f", "-"], "a: [unclosed\n", "not valid YAML"),
        (["review", "-f", "-"], "just a string\n", "not a Kubernetes object"),
        (["review", "-f", "-", "--policy", "/nonexistent"], "kind: Pod\n", "cannot read"),
        (["review"], None, "required"),
        (["review", "-f", "x", "-o", "xml"], None, "invalid choice"),
        (["frobnicate"], None, "invalid choice"),
    ],
)
def test_bad_input_is_one_line_and_exit_two(
    args: list[str], stdin: str | None, fragment: str
) -> None:
    result = run(*args, stdin=stdin)
    assert result.returncode == 2
    assert fragment in result.stderr
    assert "Traceback" not in result.stderr


def test_lint(tmp_path: Path) -> None:
    good = run("lint", str(ROOT / "policies" / "default.yaml"), *map(str, EXAMPLES.glob("*.yaml")))
    assert good.returncode == 0, good.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text(
        "apiVersion: gpushare.io/v1alpha1\nkind: GPUSharePolicy\nspec:\n  onError: maybe\n"
    )
    result = run("lint", str(bad))
    assert result.returncode == 1
    assert f"{bad}: line 4: spec.onError: 'maybe' is not one of deny, allow" in result.stderr
    assert run("lint").returncode == 2
