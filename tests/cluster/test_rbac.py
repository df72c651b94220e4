"""deploy/cluster-view's RBAC is what `serve --cluster` needs: the view syncs as the
webhook's service account with it, Secrets stay out of reach until secrets-rbac.yaml."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
import yaml

from tests.paths import ROOT
from webhook.cluster.watch import ClusterWatch, Settings
from webhook.dev.cluster import DevCluster

pytestmark = pytest.mark.e2e

VIEW = ROOT / "deploy" / "cluster-view"
SERVICE_ACCOUNT = "system:serviceaccount:gpushare-system:gpushare-webhook"


def _apply(cluster: DevCluster, path: str) -> None:
    from kubernetes import client

    rbac: Any = client.RbacAuthorizationV1Api(cluster.api_client())
    for obj in yaml.safe_load_all((VIEW / path).read_text()):
        if obj["kind"] == "ClusterRole":
            rbac.create_cluster_role(obj)
        else:
            rbac.create_cluster_role_binding(obj)


def _as_webhook(cluster: DevCluster) -> Any:
    from kubernetes import client

    api = cluster.api_client()
    api.set_default_header("Impersonate-User", SERVICE_ACCOUNT)
    api.set_default_header("Impersonate-Group", "system:serviceaccounts")
    return client.CoreV1Api(api)


def test_the_view_needs_only_list_and_watch_of_six_kinds() -> None:
    (role, _binding) = yaml.safe_load_all((VIEW / "rbac.yaml").read_text())
    (core_rule, claim_rule) = role["rules"]
    assert core_rule["apiGroups"] == [""]
    assert set(core_rule["resources"]) == {"nodes", "namespaces", "resourcequotas", "configmaps"}
    assert claim_rule["apiGroups"] == ["resource.k8s.io"]
    assert set(claim_rule["resources"]) == {"resourceclaims", "resourceclaimtemplates"}
    for rule in role["rules"]:
        assert set(rule["verbs"]) == {"list", "watch"}
    kustomization = yaml.safe_load((VIEW / "kustomization.yaml").read_text())
    assert "secrets-rbac.yaml" not in kustomization["resources"]


async def test_the_view_syncs_as_the_service_account_and_no_secret_is_read(
    control_plane: DevCluster,
) -> None:
    from kubernetes.client.exceptions import ApiException

    core = _as_webhook(control_plane)
    with pytest.raises(ApiException) as denied:
        core.list_node(limit=1)
    assert denied.value.status == 403  # nothing granted yet: the test means something
    _apply(control_plane, "rbac.yaml")
    watch = ClusterWatch(core, settings=Settings(publish_delay=0.05), secrets=False)
    task = asyncio.create_task(watch.run())
    try:
        deadline = time.monotonic() + 20
        while not watch.view.synced:
            assert time.monotonic() < deadline, watch.status()
            await asyncio.sleep(0.1)
        for kind in ("resourceclaims", "resourceclaimtemplates"):  # listed, not absent
            assert "served" not in watch.status()["kinds"][kind]
        with pytest.raises(ApiException) as secrets:
            core.list_secret_for_all_namespaces(limit=1)
        assert secrets.value.status == 403
        _apply(control_plane, "secrets-rbac.yaml")
        watch.want("secrets", True)
        deadline = time.monotonic() + 20
        while not (watch.view.synced and watch.status()["kinds"]["secrets"]["listed"]):
            assert time.monotonic() < deadline, watch.status()
            await asyncio.sleep(0.1)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
