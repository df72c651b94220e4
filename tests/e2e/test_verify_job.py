"""deploy/examples/verify-job.yaml, applied as an operator would, through a real apiserver."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import orjson
import pytest

pytestmark = pytest.mark.e2e

ROOT = Path(__file__).resolve().parent.parent.parent
JOB = ROOT / "deploy" / "examples" / "verify-job.yaml"


def test_verify_job_is_admitted_and_mutated_by_a_server_side_dry_run(
    cluster: Any, bin_dir: Path, namespace: str, tmp_path: Path
) -> None:
    kubectl = bin_dir / "kubectl"
    if not kubectl.exists():
        pytest.fail(f"{kubectl} missing: hack/build-testbin builds it with the control plane")
    kubeconfig = tmp_path / "kubeconfig"
    cluster.write_kubeconfig(kubeconfig)
    # The command the Job's header tells an operator to run, with --dry-run=server
    # (dryRun=All): both webhooks and every admission plugin run, nothing is stored.
    result = subprocess.run(
        [
            *(str(kubectl), "--kubeconfig", str(kubeconfig), "apply", "-n", namespace),
            *("--dry-run=server", "-o", "json", "-f", str(JOB)),
        ],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    job = orjson.loads(result.stdout)
    assert (job["kind"], job["metadata"]["namespace"]) == ("Job", namespace)
    template = job["spec"]["template"]
    assert template["metadata"]["annotations"]["gpushare.io/mode"] == "vgpu"
    spec = template["spec"]
    assert spec["schedulerName"] == "hami-scheduler"
    [container] = spec["containers"]
    assert container["command"] == ["gpushare-webhook", "verify"]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "1024m"
    assert env["LD_PRELOAD"] == "/usr/local/vgpu/libvgpu.so"
    assert "NVIDIA_VISIBLE_DEVICES" not in env
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts["/usr/local/vgpu/libvgpu.so"]["readOnly"] is True
    # The hardening the manifest asks for survives the mutation.
    security = container["securityContext"]
    assert security["readOnlyRootFilesystem"] is True
    assert security["allowPrivilegeEscalation"] is False
    assert security["capabilities"]["drop"] == ["ALL"]
    assert spec["restartPolicy"] == "Never"
    assert job["spec"]["backoffLimit"] == 0
    from kubernetes import client

    assert client.BatchV1Api(cluster.api_client()).list_namespaced_job(namespace).items == []
