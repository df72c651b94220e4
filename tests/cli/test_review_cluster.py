"""`review --cluster SNAPSHOT`: the README's example, run as written."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from tests.cli.test_cli import run
from tests.paths import documentation

README = documentation()


def test_readme_cluster_example_runs_as_written() -> None:
    match = re.search(
        r"\n    \$ gpushare-webhook (review [^\n]*--cluster [^\n]*)\n((?:    [^$\n][^\n]*\n)+)",
        README,
    )
    assert match is not None, "README lost its review --cluster example"
    result = run(*match.group(1).split())
    assert result.returncode == 1, result.stderr
    expected = "".join(line[4:] + "\n" for line in match.group(2).splitlines())
    assert result.stdout == expected


def test_a_missing_snapshot_is_a_usage_error() -> None:
    result = run(
        "review",
        "-f",
        "tests/clusters/pod-90g.yaml",
        "--cluster",
        "tests/clusters/no-such-snapshot.yaml",
    )
    assert result.returncode == 2
    assert "no-such-snapshot.yaml" in result.stderr and "Traceback" not in result.stderr


def _template(name: str, device_class: str) -> dict[str, Any]:
    request = {"name": "r", "exactly": {"deviceClassName": device_class}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name, "namespace": "ml"},
        "spec": {"spec": {"devices": {"requests": [request]}}},
    }


def _pod(template: str) -> dict[str, Any]:
    resources = {"limits": {"nvidia.com/gpu": "4"}, "claims": [{"name": "c"}]}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": template, "namespace": "ml"},
        "spec": {
            "containers": [{"name": "main", "image": "cuda", "resources": resources}],
            "resourceClaims": [{"name": "c", "resourceClaimTemplateName": template}],
        },
    }


def test_a_snapshot_tells_a_gpu_claim_beside_slices_from_an_imex_channel(
    tmp_path: Path,
) -> None:
    # JSON documents are YAML: one a line.
    snapshot = tmp_path / "snapshot.yaml"
    templates = [
        _template("gpus", "gpu.nvidia.com"),
        _template("channel", "compute-domain-default-channel.nvidia.com"),
    ]
    snapshot.write_text("---\n".join(json.dumps(t) + "\n" for t in templates))
    manifest = tmp_path / "pods.yaml"
    manifest.write_text("---\n".join(json.dumps(_pod(t)) + "\n" for t in ("gpus", "channel")))
    result = run("review", "-f", str(manifest), "--cluster", str(snapshot), "-o", "json")
    assert result.returncode == 1, result.stderr
    gpus, channel = json.loads(result.stdout)
    assert [v["rule"] for v in gpus["violations"]] == ["gpu-claim"]
    assert channel["allowed"], channel["violations"]
    # Without the snapshot the class is unknown: both admitted.
    assert run("review", "-f", str(manifest)).returncode == 0
