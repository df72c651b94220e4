"""deploy/reports' RBAC is what `serve --cluster --reports` needs: as the webhook's
service account, the view lists and watches pods and the keeper writes and deletes
its reports, in any namespace."""

from __future__ import annotations

import asyncio
import contextlib
import time
from typing import Any

import pytest
import yaml

from tests.cluster.test_rbac import SERVICE_ACCOUNT
from tests.paths import ROOT
from webhook.cluster.reports import ReportKeeper, ReportSettings
from webhook.cluster.watch import ClusterWatch, Settings
from webhook.dev.cluster import DevCluster
from webhook.policies import DEFAULT_POLICY

pytestmark = pytest.mark.e2e

NAMESPACE = "reports-rbac"


def _apply(cluster: DevCluster, path: str) -> None:
    from kubernetes import client

    rbac: Any = client.RbacAuthorizationV1Api(cluster.api_client())
    for obj in yaml.safe_load_all((ROOT / "deploy" / path).read_text()):
        with contextlib.suppress(client.ApiException):  # the view's may be there already
            if obj["kind"] == "ClusterRole":
                rbac.create_cluster_role(obj)
            else:
                rbac.create_cluster_role_binding(obj)


def _report(cluster: DevCluster) -> Any:
    from kubernetes import client

    custom: Any = client.CustomObjectsApi(cluster.api_client())
    with contextlib.suppress(client.ApiException):
        return custom.get_namespaced_custom_object(
            "openreports.io", "v1alpha1", NAMESPACE, "reports", "gpushare-webhook"
        )
    return None


async def test_the_reports_are_kept_as_the_service_account(control_plane: DevCluster) -> None:
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    control_plane.install_report_crds()
    control_plane.create_namespace(NAMESPACE)
    admin: Any = client.CoreV1Api(control_plane.api_client())
    # No webhook runs here: the pod is stored as written, a GPU pod without its mutation.
    admin.create_namespaced_pod(
        NAMESPACE,
        {
            "metadata": {"name": "raw"},
            "spec": {
                "containers": [
                    {
                        "name": "cuda",
                        "image": "cuda",
                        "resources": {"limits": {"nvidia.com/gpumem": "3000"}},
                    }
                ]
            },
        },
    )
    as_webhook = control_plane.api_client()
    as_webhook.set_default_header("Impersonate-User", SERVICE_ACCOUNT)
    as_webhook.set_default_header("Impersonate-Group", "system:serviceaccounts")
    core: Any = client.CoreV1Api(as_webhook)
    _apply(control_plane, "cluster-view/rbac.yaml")
    with pytest.raises(ApiException) as denied:
        core.list_pod_for_all_namespaces(limit=1)
    assert denied.value.status == 403  # not granted by the view alone: the test means something
    _apply(control_plane, "reports/rbac.yaml")
    watch = ClusterWatch(core, settings=Settings(publish_delay=0.05), pods=True)
    keeper = ReportKeeper(
        as_webhook,
        watch,
        lambda: DEFAULT_POLICY,
        settings=ReportSettings(kinds=("openreports", "wgpolicyk8s"), interval=0.5),
    )
    tasks = [asyncio.create_task(watch.run()), asyncio.create_task(keeper.run())]
    try:
        deadline = time.monotonic() + 30
        while (body := await asyncio.to_thread(_report, control_plane)) is None:
            assert time.monotonic() < deadline, (watch.status(), keeper.passes)
            await asyncio.sleep(0.2)
        assert [r["rule"] for r in body["results"]] == ["unmutated-gpu-pod"]
        admin.delete_namespaced_pod("raw", NAMESPACE, grace_period_seconds=0)
        while await asyncio.to_thread(_report, control_plane) is not None:  # deleted too
            assert time.monotonic() < deadline + 30
            await asyncio.sleep(0.2)
    finally:
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
