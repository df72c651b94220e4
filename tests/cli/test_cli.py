"""The command line as users run it: a real subprocess, exit codes, no tracebacks."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections.abc import Mapping
from pathlib import Path

import pytest
import yaml

from tests.paths import EXAMPLES, MANIFESTS, ROOT
from webhook.dev.cluster import free_port


def run(
    *args: str,
    stdin: str | None = None,
    cwd: Path = ROOT,
    env: Mapping[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "webhook", *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=cwd,
        env=env,
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


@pytest.mark.parametrize(
    ("busy", "workers"), [("--port", "1"), ("--health-port", "1"), ("--port", "2")]
)
def test_serve_on_a_port_in_use_names_it_in_one_line(
    tmp_path: Path, busy: str, workers: str
) -> None:
    ports = {"--port": free_port(), "--health-port": free_port()}
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        ports[busy] = taken.getsockname()[1]
        result = run(
            "serve",
            "--host=127.0.0.1",
            f"--workers={workers}",
            *(f"{flag}={port}" for flag, port in ports.items()),
            f"--cert-dir={tmp_path}",
            f"--audit-log={tmp_path / 'audit.log'}",
            cwd=tmp_path,
            env={**os.environ, "PYTHONWARNINGS": "error"},
        )
    assert result.returncode == 2
    last = result.stderr.splitlines()[-1]
    assert last.startswith(f"gpushare-webhook: cannot listen on 127.0.0.1:{ports[busy]} "), last
    assert "address already in use" in last.lower()
    assert last.endswith(busy)
    # Nothing after the one line: no traceback, no "never awaited", no unclosed socket.
    assert "Traceback" not in result.stderr
    assert "Warning" not in result.stderr, result.stderr
    assert "Exception ignored" not in result.stderr, result.stderr


def test_review_and_lint_show_exceptions_and_their_expiry() -> None:
    policy = str(EXAMPLES / "exceptions.yaml")
    pod = str(MANIFESTS / "privileged-sidecar.yaml")
    within = run("review", "--policy", policy, "--today", "2027-01-05", "-f", pod)
    assert within.returncode == 0, within.stderr
    assert 'except privileged-gpu: container "sidecar"' in within.stdout
    assert "(exception ml-sidecar-debugger)" in within.stdout
    past = run("review", "--policy", policy, "--today", "2027-07-01", "-f", pod, "-o", "json")
    assert past.returncode == 1
    (entry,) = json.loads(past.stdout)
    assert "excepted" not in entry and not entry["allowed"]
    assert "exception ml-sidecar-debugger (owner ml-platform@example.com) expired" in past.stderr
    lint = run("lint", "--today", "2027-07-01", policy)
    assert lint.returncode == 0, lint.stderr
    assert "warning: exception ml-sidecar-debugger" in lint.stdout
    assert "warning" not in run("lint", "--today", "2027-06-30", policy).stdout
    bad = run("lint", "--today", "2027-02-30", policy)
    assert bad.returncode == 2 and "is no date" in bad.stderr and "Traceback" not in bad.stderr
