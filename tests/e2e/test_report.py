"""What the audit log records of a controller's pod through a real apiserver, and what
``report`` makes of it: the pod is named only at validation, its workload at both."""

from __future__ import annotations

import subprocess
import sys
from typing import Any

import orjson
import pytest

from tests.e2e.rest import Api, gpu_pod
from tests.e2e.test_apiserver import audit
from tests.paths import ROOT
from webhook.core.rollout import workload_of
from webhook.dev.cluster import DevCluster

pytestmark = pytest.mark.e2e


def replica(*, privileged: bool = False) -> dict[str, Any]:
    """A pod as the ReplicaSet of Deployment ``web`` creates it."""
    pod = gpu_pod("unused")
    pod["metadata"] = {
        "generateName": "web-5d8f7c9b4-",
        "labels": {"app": "web", "pod-template-hash": "5d8f7c9b4"},
        "ownerReferences": [
            {
                "apiVersion": "apps/v1",
                "kind": "ReplicaSet",
                "name": "web-5d8f7c9b4",
                "uid": "6b1e7a52-0000-4000-8000-000000000001",
                "controller": True,
                "blockOwnerDeletion": True,
            }
        ],
    }
    if privileged:
        pod["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    return pod


def test_a_controllers_pod_is_one_workload_at_both_endpoints(
    cluster: DevCluster, namespace: str
) -> None:
    api = Api(cluster)
    assert api.create("Pod", namespace, replica()).status == 201
    records = audit(cluster, namespace=namespace, count=2)
    by_endpoint = {r["endpoint"]: r["objectRef"] for r in records}
    # Mutating webhooks see the pod before the apiserver names it; validating ones after.
    assert "name" not in by_endpoint["mutate"]
    assert by_endpoint["validate"]["name"].startswith("web-5d8f7c9b4-")
    assert {r["objectRef"]["generateName"] for r in records} == {"web-5d8f7c9b4-"}
    assert [r["owner"] for r in records] == [{"kind": "Deployment", "name": "web"}] * 2
    assert {workload_of(r) for r in records} == {"Deployment/web"}


def test_report_on_the_services_own_log(cluster: DevCluster, namespace: str) -> None:
    assert cluster.webhook is not None
    api = Api(cluster)
    for _ in range(2):
        assert api.create("Pod", namespace, replica(privileged=True)).status == 403
    assert len(audit(cluster, namespace=namespace, count=2)) == 2
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "webhook",
            "report",
            "-o",
            "json",
            "--namespace",
            namespace,
            "--audit-log",
            str(cluster.webhook.audit_log),
        ],
        capture_output=True,
        timeout=60,
        check=False,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    rows = orjson.loads(result.stdout)["rows"]
    assert [(r["rule"], r["workload"], r["wouldRefuse"], r["refusedNow"]) for r in rows] == [
        ("privileged-gpu", "Deployment/web", 0, 2)
    ]
