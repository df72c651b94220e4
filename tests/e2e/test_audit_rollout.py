"""The audit-first rollout on Kubernetes 1.36: `report --audit-log` reads the apiserver's
audit log (what the in-apiserver policies decided) and gives the rollout report the
webhook's own audit log gives for the same requests.

One control plane (kube-apiserver 1.36.3 auditing as deploy/examples/apiserver-audit-policy.yaml
says) with both the webhook and the ValidatingAdmissionPolicies registered, under a policy
that audits (and, for one rule, warns) instead of denying: every request then reaches
both, and each records what it found in its own log. Each object breaks rules CEL holds;
one breaks two (the apiserver's own failure annotation keeps only the first: the
policies' per-rule audit annotations name both).
"""

from __future__ import annotations

import io
import json
import time
from collections.abc import Iterator
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.rest import Api, gpu_pod
from webhook.cli import main
from webhook.dev.cluster import DevCluster
from webhook.install.mode import WEBHOOKS

pytestmark = pytest.mark.e2e

TENANT = "rollout"
POLICY = """\
apiVersion: gpushare.io/v1alpha1
kind: GPUSharePolicy
metadata: {name: rollout}
spec:
  rules:
    privileged-gpu: audit
    node-name-pinning: audit
    raw-visible-devices: audit
    host-device-access: warn
"""
ROW_FIELDS = ("rule", "namespace", "workload", "wouldRefuse", "refusedNow")


def privileged(name: str) -> dict[str, Any]:
    pod = gpu_pod(name)
    pod["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    return pod


def pinned(name: str) -> dict[str, Any]:
    pod = gpu_pod(name)
    pod["spec"]["nodeName"] = "node-1"
    return pod


def visible(name: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [
                {
                    "name": "app",
                    "image": "x",
                    "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
                }
            ]
        },
    }


def device(name: str) -> dict[str, Any]:
    pod = gpu_pod(name)
    pod["spec"]["volumes"] = [{"name": "dev", "hostPath": {"path": "/dev/nvidia0"}}]
    pod["spec"]["containers"][0]["volumeMounts"] = [{"name": "dev", "mountPath": "/dev/nvidia0"}]
    return pod


def both(name: str) -> dict[str, Any]:
    pod = privileged(name)
    pod["spec"]["nodeName"] = "node-1"
    return pod


@pytest.fixture
def cluster(bin_dir: Path, tmp_path: Path) -> Iterator[DevCluster]:
    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    cluster = DevCluster(workdir=tmp_path / "cluster", bin_dir=bin_dir, policy=policy)
    cluster.workdir.mkdir()
    try:
        cluster.start_control_plane()
        cluster.start_webhook(cluster_view=False)
        cluster.register_cel_policies()
        cluster.register_webhooks(WEBHOOKS)
        cluster.probe(refusal=False)
        yield cluster
    finally:
        cluster.stop()


def events(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def report(*logs: Path) -> list[tuple[Any, ...]]:
    out = io.StringIO()
    argv = ["report", "--namespace", TENANT, "-o", "json"]
    for log in logs:
        argv += ["--audit-log", str(log)]
    with redirect_stdout(out):
        assert main(argv) == 0
    rows = json.loads(out.getvalue())["rows"]
    return sorted(tuple(row[field] for field in ROW_FIELDS) for row in rows)


def test_the_apiservers_audit_log_gives_the_webhooks_rollout_report(cluster: DevCluster) -> None:
    api = Api(cluster)
    # The policies take effect on the apiserver's own time: wait until one is recorded.
    cluster.create_namespace("warmup")
    deadline = time.monotonic() + 60
    while not any(
        "gpushare-audit/node-name-pinning" in (e.get("annotations") or {})
        for e in events(cluster.apiserver_audit_log)
    ):
        assert time.monotonic() < deadline, "the ValidatingAdmissionPolicies never audited"
        assert api.create("Pod", "warmup", pinned("warmup")).status == 201
        time.sleep(0.5)
    cluster.create_namespace(TENANT)
    for make, count in ((privileged, 2), (pinned, 1), (visible, 3), (device, 1), (both, 2)):
        for index in range(count):
            sent = api.create("Pod", TENANT, make(f"{make.__name__}-{index}"), dry_run=False)
            assert sent.status == 201, sent.body
    configmap = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "gpu-env"},
        "data": {"NVIDIA_VISIBLE_DEVICES": "all"},
    }
    assert api.create("ConfigMap", TENANT, configmap, dry_run=False).status == 201
    assert cluster.webhook is not None
    webhook = report(cluster.webhook.audit_log)
    apiserver = report(cluster.apiserver_audit_log)
    # ConfigMaps are judged when written by the in-apiserver policies alone (the webhooks
    # are not registered for them): the apiserver's log has that row more.
    written = ("raw-visible-devices", TENANT, "ConfigMap/gpu-env", 1, 0)
    assert written in apiserver and written not in webhook
    apiserver.remove(written)
    assert apiserver == webhook
    # What the report says, so that an empty or partial pair cannot pass.
    assert (
        ("node-name-pinning", TENANT, "Pod/both-0", 1, 0) in apiserver
        and ("privileged-gpu", TENANT, "Pod/both-0", 1, 0) in apiserver
        and ("host-device-access", TENANT, "Pod/device-0", 1, 0) in apiserver
    ), apiserver
    assert len(apiserver) == 2 + 1 + 3 + 1 + 2 * 2, apiserver
