"""Raw REST calls to the dev cluster's kube-apiserver, shared by the e2e differentials.

Objects go as written (junk included), so generated examples test what the apiserver
and the webhooks do with them, not what a client library would have cleaned up.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

import orjson
import urllib3
from hypothesis import HealthCheck, settings

from tests.core.strategies import IDENTITIES, template_of
from webhook.certs.lease import read_json
from webhook.dev.cluster import DevCluster

Obj = dict[str, Any]

# Generated differentials through the apiserver: slow examples, and the same ones every
# run, so the coverage thresholds the tests assert cannot hang on a seed.
DIFFERENTIAL: Final = settings(
    deadline=None,
    database=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

# The REST collection of each kind the webhooks are registered for.
COLLECTIONS: Final[Mapping[str, str]] = {
    "Pod": "/api/v1/namespaces/{ns}/pods",
    "ReplicationController": "/api/v1/namespaces/{ns}/replicationcontrollers",
    "Deployment": "/apis/apps/v1/namespaces/{ns}/deployments",
    "StatefulSet": "/apis/apps/v1/namespaces/{ns}/statefulsets",
    "DaemonSet": "/apis/apps/v1/namespaces/{ns}/daemonsets",
    "ReplicaSet": "/apis/apps/v1/namespaces/{ns}/replicasets",
    "Job": "/apis/batch/v1/namespaces/{ns}/jobs",
    "CronJob": "/apis/batch/v1/namespaces/{ns}/cronjobs",
}
# What pods take env and devices from: judged when written (webhook.core.objects).
SOURCE_COLLECTIONS: Final[Mapping[str, str]] = {
    "ConfigMap": "/api/v1/namespaces/{ns}/configmaps",
    "Secret": "/api/v1/namespaces/{ns}/secrets",
    "ResourceClaim": "/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaims",
    "ResourceClaimTemplate": "/apis/resource.k8s.io/v1/namespaces/{ns}/resourceclaimtemplates",
    "DeviceClass": "/apis/resource.k8s.io/v1/deviceclasses",
}
API_VERSIONS: Final[Mapping[str, str]] = {
    kind: "/".join(path.split("/")[2:4]) if path.startswith("/apis/") else "v1"
    for kind, path in COLLECTIONS.items()
}
SELECTOR: Final = {"app": "scope"}


@dataclass
class Sent:
    """One dry-run create and what the apiserver answered."""

    name: str
    kind: str
    obj: Obj
    status: int
    body: Any


class Api:
    """Raw REST calls to the dev cluster: the objects go as written, junk included."""

    def __init__(self, cluster: DevCluster) -> None:
        self.server = cluster.server
        self.http = urllib3.PoolManager(ca_certs=str(cluster.ca_file), cert_reqs="CERT_REQUIRED")
        self.headers = {
            "Authorization": f"Bearer {cluster.token}",
            "Content-Type": "application/json",
        }

    def create(
        self, kind: str, namespace: str, obj: Obj, *, dry_run: bool = True, user: str | None = None
    ) -> Sent:
        """A create of ``obj`` (dry-run unless told), as ``user`` where one is given."""
        collection = COLLECTIONS.get(kind) or SOURCE_COLLECTIONS[kind]
        url = self.server + collection.format(ns=namespace)
        if dry_run:
            url += "?dryRun=All"
        headers = self.headers if user is None else {**self.headers, "Impersonate-User": user}
        response = self.http.request(
            "POST", url, body=orjson.dumps(obj, default=str), headers=headers, timeout=30
        )
        try:
            body = orjson.loads(response.data)
        except orjson.JSONDecodeError:
            body = response.data.decode(errors="replace")
        name = str(obj.get("metadata", {}).get("name", ""))
        return Sent(name=name, kind=kind, obj=obj, status=response.status, body=body)

    def grant_pod_patch(self, namespace: str, *users: str) -> None:
        """RBAC for ``users`` to update pods and their ephemeral containers in
        ``namespace`` (no controller-manager runs here to fill the aggregated roles,
        so a Role of its own)."""
        rules = [
            {
                "apiGroups": [""],
                "resources": ["pods", "pods/ephemeralcontainers"],
                "verbs": ["get", "patch", "update"],
            }
        ]
        self.grant(namespace, "pod-patcher", rules, *users)

    def grant_config_map_writes(self, namespace: str, *users: str) -> None:
        """RBAC for ``users`` to create and update ConfigMaps in ``namespace``."""
        rules = [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["create", "update"]}]
        self.grant(namespace, "config-map-writer", rules, *users)

    def grant(self, namespace: str, name: str, rules: list[Obj], *users: str) -> None:
        """A Role ``name`` of ``rules`` in ``namespace``, bound to ``users``."""
        rbac = f"{self.server}/apis/rbac.authorization.k8s.io/v1/namespaces/{namespace}"
        role = {"metadata": {"name": name}, "rules": rules}
        binding = {
            "metadata": {"name": name},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "Role",
                "name": name,
            },
            "subjects": [
                {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": user}
                for user in users
            ],
        }
        for collection, obj in (("roles", role), ("rolebindings", binding)):
            response = self.http.request(
                "POST", f"{rbac}/{collection}", body=orjson.dumps(obj), headers=self.headers
            )
            assert response.status in (201, 409), response.data

    def update_pod(self, namespace: str, old: Obj, new: Obj, *, user: str) -> Sent:
        """A dry-run UPDATE of stored pod ``old`` to ``new`` as ``user``:
        through pods/ephemeralcontainers when only ephemeral containers change (as
        `kubectl debug` does), else a merge patch of labels and annotations."""
        name = old["metadata"]["name"]
        url = f"{self.server}/api/v1/namespaces/{namespace}/pods/{name}"
        # The user only: the default policy names its writers by service account.
        headers = {**self.headers, "Impersonate-User": user}
        if new["spec"] != old["spec"]:
            method, url, body = "PUT", url + "/ephemeralcontainers", new
        else:
            patch: Obj = {}
            for field in ("annotations", "labels"):
                before = old["metadata"].get(field) or {}
                after = new["metadata"].get(field) or {}
                changed = {k: v for k, v in after.items() if before.get(k) != v}
                changed.update({k: None for k in before if k not in after})
                if changed:
                    patch[field] = changed
            method, body = "PATCH", {"metadata": patch}
            headers["Content-Type"] = "application/merge-patch+json"
        response = self.http.request(
            method, url + "?dryRun=All", body=orjson.dumps(body), headers=headers, timeout=30
        )
        return Sent(name, "Pod", new, response.status, orjson.loads(response.data))

    def patch_pod(self, namespace: str, name: str, patch: Obj, *, user: str | None = None) -> Sent:
        """A JSON merge patch of a stored pod (an UPDATE to admission), as ``user``."""
        url = f"{self.server}/api/v1/namespaces/{namespace}/pods/{name}"
        headers = {**self.headers, "Content-Type": "application/merge-patch+json"}
        if user is not None:
            headers["Impersonate-User"] = user
        response = self.http.request(
            "PATCH", url, body=orjson.dumps(patch), headers=headers, timeout=30
        )
        return Sent(name, "Pod", patch, response.status, orjson.loads(response.data))


def gpu_pod(name: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [
                {
                    "name": "cuda",
                    "image": "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04",
                    "resources": {"limits": {"nvidia.com/gpumem": "3000"}},
                }
            ]
        },
    }


def sendable(kind: str, obj: Obj, name: str) -> Obj:
    """``obj`` named ``name``, with what the apiserver checks before admission made to
    fit (metadata a mapping without a namespace of its own, selectors that match the
    template), so most examples reach the webhooks. What the rules look at is kept."""
    obj = copy.deepcopy(obj)
    metadata = obj.get("metadata")
    if not isinstance(metadata, dict):
        metadata = obj["metadata"] = {}
    metadata.pop("namespace", None)
    metadata.pop("generateName", None)
    metadata["name"] = name
    if kind != "Pod":
        template = template_of(obj, kind)
        if isinstance(template, dict):
            template_metadata = template.get("metadata")
            if not isinstance(template_metadata, dict):
                template_metadata = template["metadata"] = {}
            template_metadata["labels"] = dict(SELECTOR)
        spec = obj["spec"]
        if kind == "ReplicationController":
            spec["selector"] = dict(SELECTOR)
        elif kind in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet"):
            spec["selector"] = {"matchLabels": dict(SELECTOR)}
    return obj


def plain_container(**extra: Any) -> Obj:
    return {"name": "app", "image": "nginx:1.27", **extra}


# Pods as they are stored when an update comes: a plain pod, one the scheduler wrote
# its allocation on, and a GPU-sharing pod (mutated at creation).
ALLOCATION: Final = {
    "hami.io/vgpu-node": "gpu-node-1",
    "hami.io/vgpu-devices-allocated": "GPU-0,NVIDIA,3000,30:;",
    "hami.io/bind-phase": "allocating",
}
SCHEDULER: Final = IDENTITIES["scheduler"][0]


def pod_to_store(name: str, base: str) -> Obj:
    """The pod :func:`stored_pod` creates for ``base`` ("allocated" is "plain", patched)."""
    if base == "gpu":
        return gpu_pod(name)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": {"team": "ml"}},
        # Volumes the `kubectl debug` containers of tests/core/strategies.py mount.
        "spec": {
            "containers": [plain_container()],
            "volumes": [{"name": "data", "emptyDir": {}}, {"name": "cache", "emptyDir": {}}],
        },
    }


def stored_pod(api: Api, namespace: str, name: str, base: str) -> Obj:
    pod = pod_to_store(name, base)
    created = api.create("Pod", namespace, pod, dry_run=False)
    assert created.status == 201, created.body
    stored: Obj = created.body
    if base == "allocated":
        patch = {"metadata": {"annotations": ALLOCATION}}
        written = api.patch_pod(namespace, name, patch, user=SCHEDULER)
        assert written.status == 200, written.body
        stored = written.body
    return stored


def idle_webhook(name: str, *, label: str, resource: str, **extra: Any) -> Obj:
    """A webhook registration the apiserver never calls: it matches no namespace (none
    carries ``label: never``), for tests of what writes the configurations themselves."""
    return {
        "name": name,
        "admissionReviewVersions": ["v1"],
        "sideEffects": "None",
        "failurePolicy": "Ignore",
        "timeoutSeconds": 1,
        "namespaceSelector": {"matchLabels": {label: "never"}},
        "clientConfig": {"url": "https://127.0.0.1:9/never"},
        "rules": [
            {
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "resources": [resource],
                "operations": ["CREATE"],
            }
        ],
        **extra,
    }


def account_client(cluster: DevCluster, core: Any, account: str, namespace: str) -> Any:
    """An ApiClient acting as service account ``account`` (a 10-minute token): what the
    install's RBAC lets the webhook do, rather than the admin's kubeconfig. Close it."""
    from kubernetes import client

    token = read_json(
        core.create_namespaced_service_account_token(
            account, namespace, {"spec": {"expirationSeconds": 600}}, _preload_content=False
        )
    )["status"]["token"]
    configuration = client.Configuration()
    configuration.host = cluster.server
    configuration.ssl_ca_cert = str(cluster.ca_file)
    configuration.api_key = {"authorization": f"Bearer {token}"}
    return client.ApiClient(configuration)
