"""Removing the install: what ``manifests`` (or the chart) applied and what the running
leader wrote since, and nothing that belongs to anyone else.

What is ours, found two ways so that neither a renamed label nor a missing one hides it:

- by name: every object the install renders (:func:`webhook.install.manifests.build` of
  each overlay, the cluster view's RBAC included, moved to the install's namespace), the
  Secrets its Certificates name, and what the self-managed leader creates at run time:
  the Secret ``gpushare-webhook-tls``, the Lease ``gpushare-webhook-tls-leader`` and the
  CEL policies and bindings of every name in :data:`~webhook.render.validating.POLICY_NAMES`
  and the MutatingAdmissionPolicies and bindings of every name in
  :data:`~webhook.render.mutating.POLICY_NAMES` (the 1.36+ install);
- by label: ``app.kubernetes.io/part-of=gpushare`` on every kind the install or the chart
  creates (cluster-wide for cluster-scoped kinds, in the install's namespace for the rest:
  a labelled object elsewhere is not the install's to delete). This catches the chart's
  optional objects (metrics Service, ServiceMonitor, PrometheusRule, dashboard ConfigMap,
  NetworkPolicy) and an older install's CEL policies under names no longer rendered;
- the policy reports the leader wrote (``serve --reports``) in every namespace, by the
  ``app.kubernetes.io/managed-by=gpushare-webhook`` label it writes them with, once the
  Deployment's pods are gone.

Never a CustomResourceDefinition: the ServiceMonitor, PrometheusRule, cert-manager and
report kinds belong to the tools that define them, and other installs use them too. A CR
of such a kind is deleted when it is ours; when the kind is not served (its CRD is not
installed) there is nothing of it to delete.

The order keeps the cluster safe while it runs: the webhook configurations go first (no
GPU pod is refused by a webhook whose Service is about to vanish), then the Deployment,
and the uninstall waits for its pods to stop (a leader still running would write its
Secret, Lease and CEL policies back), then the CEL policies (bindings before the policies
they name), then the rest (cert-manager's Certificates before the Secrets they would
re-issue), the Namespace last, and only when the install created it (it carries the
label: ``manifests`` renders it, ``helm install --create-namespace`` does not).

Blocking calls through a ``kubernetes`` ApiClient, as raw REST (one code path for built-in
and custom kinds).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import orjson

from webhook.core.scan import API_VERSIONS as REPORT_APIS
from webhook.core.scan import MANAGED_BY
from webhook.install.manifests import (
    APISERVER_OVERLAY,
    OVERLAYS,
    build,
    deploy_root,
    overlay_dir,
    set_namespace,
)
from webhook.render.targets import TARGETS

Obj = dict[str, Any]

PART_OF: Final = "app.kubernetes.io/part-of"
LABEL_SELECTOR: Final = f"{PART_OF}=gpushare"
# The pods of the install's Deployment (its selector).
POD_SELECTOR: Final = "app.kubernetes.io/name=gpushare-webhook"
# What `serve --self-managed` creates with its default names (webhook.certs.selfmanaged;
# tests/install/test_uninstall.py holds the two equal).
LEADER_SECRET: Final = "gpushare-webhook-tls"  # noqa: S105  # the Secret's name
LEADER_LEASE: Final = f"{LEADER_SECRET}-leader"
POD_WAIT: Final = 120.0

_OK: Final = 200
_ACCEPTED: Final = 202
_NOT_FOUND: Final = 404
_FORBIDDEN: Final = 403


@dataclass(frozen=True, slots=True)
class Kind:
    """One REST collection: enough to list, read and delete without discovery."""

    kind: str
    api_version: str
    plural: str
    namespaced: bool

    def path(self, namespace: str, name: str = "") -> str:
        root = "/api/v1" if self.api_version == "v1" else f"/apis/{self.api_version}"
        where = f"/namespaces/{namespace}" if self.namespaced else ""
        return f"{root}{where}/{self.plural}" + (f"/{name}" if name else "")


def _kind(kind: str, api_version: str, plural: str, *, namespaced: bool = True) -> Kind:
    return Kind(kind, api_version, plural, namespaced)


_ADMISSION: Final = "admissionregistration.k8s.io/v1"
_RBAC: Final = "rbac.authorization.k8s.io/v1"

# Deleted in this order, stage by stage (see the module's docstring for why).
WEBHOOK_KINDS: Final = (
    _kind(
        "MutatingWebhookConfiguration",
        _ADMISSION,
        "mutatingwebhookconfigurations",
        namespaced=False,
    ),
    _kind(
        "ValidatingWebhookConfiguration",
        _ADMISSION,
        "validatingwebhookconfigurations",
        namespaced=False,
    ),
)
WORKLOAD_KINDS: Final = (_kind("Deployment", "apps/v1", "deployments"),)
CEL_KINDS: Final = tuple(
    # Bindings before their policies; the MutatingAdmissionPolicies are not served before
    # 1.36 (404: nothing of them to delete).
    _kind(kind, _ADMISSION, resource, namespaced=False)
    for target in TARGETS
    for kind, resource in (
        (target.binding_kind, target.binding_resource),
        (target.policy_kind, target.policy_resource),
    )
)
REST_KINDS: Final = (
    _kind("ServiceMonitor", "monitoring.coreos.com/v1", "servicemonitors"),
    _kind("PrometheusRule", "monitoring.coreos.com/v1", "prometheusrules"),
    _kind("Certificate", "cert-manager.io/v1", "certificates"),
    _kind("Issuer", "cert-manager.io/v1", "issuers"),
    _kind("PodDisruptionBudget", "policy/v1", "poddisruptionbudgets"),
    _kind("NetworkPolicy", "networking.k8s.io/v1", "networkpolicies"),
    _kind("Service", "v1", "services"),
    _kind("ConfigMap", "v1", "configmaps"),
    _kind("Secret", "v1", "secrets"),
    _kind("Lease", "coordination.k8s.io/v1", "leases"),
    _kind("RoleBinding", _RBAC, "rolebindings"),
    _kind("Role", _RBAC, "roles"),
    _kind("ClusterRoleBinding", _RBAC, "clusterrolebindings", namespaced=False),
    _kind("ClusterRole", _RBAC, "clusterroles", namespaced=False),
    _kind("ServiceAccount", "v1", "serviceaccounts"),
)
NAMESPACE_KIND: Final = _kind("Namespace", "v1", "namespaces", namespaced=False)
# The policy reports the leader writes in every namespace it judges (serve --reports):
# found cluster-wide by the label it writes them with. Their CRDs are shared, and stay.
REPORT_KINDS: Final = (
    _kind("Report", REPORT_APIS["openreports"][0], "reports"),
    _kind("PolicyReport", REPORT_APIS["wgpolicyk8s"][0], "policyreports"),
)
REPORT_SELECTOR: Final = ",".join(f"{k}={v}" for k, v in sorted(MANAGED_BY.items()))
STAGES: Final = (WEBHOOK_KINDS, WORKLOAD_KINDS, CEL_KINDS, REST_KINDS)
KINDS: Final = tuple(kind for stage in STAGES for kind in stage)


def installed_names(namespace: str) -> dict[str, set[str]]:
    """Per kind, the names of what the install creates in (or for) ``namespace``: every
    object of every overlay and of the cluster view, the Secrets its Certificates name,
    and what the self-managed leader writes."""
    objects: list[Obj] = []
    for overlay in (*OVERLAYS, APISERVER_OVERLAY):
        objects.extend(build(overlay_dir(overlay)))
    cluster_view = deploy_root() / "cluster-view"
    objects.extend(build(cluster_view))
    objects.extend(
        obj
        for path in sorted(cluster_view.glob("*.yaml"))
        if path.name != "kustomization.yaml"
        for obj in _documents(path.read_text("utf-8"))
    )
    set_namespace(objects, namespace)
    names: dict[str, set[str]] = {}
    for obj in objects:
        names.setdefault(obj["kind"], set()).add(obj["metadata"]["name"])
        if obj["kind"] == "Certificate":
            names.setdefault("Secret", set()).add(obj["spec"]["secretName"])
    names.setdefault("Secret", set()).add(LEADER_SECRET)
    names.setdefault("Lease", set()).add(LEADER_LEASE)
    for target in TARGETS:
        for kind in target.kinds:
            names.setdefault(kind, set()).update(target.names)
    # The Namespace is decided on apart: only when the install created it.
    names.pop("Namespace", None)
    return names


def _documents(text: str) -> Iterator[Obj]:
    import yaml

    for document in yaml.safe_load_all(text):
        if isinstance(document, dict) and isinstance(document.get("kind"), str):
            yield document


@dataclass(frozen=True, slots=True)
class Found:
    kind: Kind
    name: str
    namespace: str
    labelled: bool
    terminating: bool

    def __str__(self) -> str:
        where = f"{self.namespace}/" if self.kind.namespaced else ""
        return f"{self.kind.kind} {where}{self.name}"


@dataclass(slots=True)
class Outcome:
    """What was (or, in a dry run, would be) deleted, and what went wrong."""

    done: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)


class UninstallError(Exception):
    """The apiserver cannot be asked at all (as opposed to one object that failed)."""


# What Helm writes on every object it creates (its adoption check reads it back).
HELM_RELEASE: Final = "meta.helm.sh/release-name"


class HelmReleaseError(UninstallError):
    """The install is a Helm release: Helm removes it first, then uninstall what it left."""

    def __init__(self, release: str, namespace: str) -> None:
        self.release = release
        super().__init__(
            f"the install in {namespace} is the Helm release {release!r}: remove it in this "
            f"order: 1. helm uninstall {release} --namespace {namespace} (what the chart "
            f"created, and the release record); 2. gpushare-webhook uninstall --namespace "
            f"{namespace} (what Helm never knew: the leader's Secret, Lease and re-rendered "
            "admission policies, the policy reports, the Namespace). Deleting the chart's "
            "objects first would leave a release that helm upgrade and helm uninstall "
            "then trip over"
        )


class _Rest:
    """Raw REST through a ``kubernetes`` ApiClient: status and JSON, no exceptions for 4xx."""

    def __init__(self, api_client: Any, *, timeout: float) -> None:
        self._client = api_client
        self._timeout = timeout

    def call(
        self,
        method: str,
        path: str,
        *,
        query: Sequence[tuple[str, str]] = (),
        body: Obj | None = None,
    ) -> tuple[int, Any]:
        from kubernetes.client.exceptions import ApiException
        from urllib3.exceptions import HTTPError

        headers = {"Accept": "application/json"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        try:
            method_, url, headers_, body_, _ = self._client.param_serialize(
                method,
                path,
                query_params=list(query),
                header_params=headers,
                body=body,
                auth_settings=["BearerToken"],
            )
            response = self._client.call_api(
                method_, url, header_params=headers_, body=body_, _request_timeout=self._timeout
            )
            data = response.read()
        except (ApiException, HTTPError, OSError) as exc:
            raise UninstallError(f"{method} {path}: {exc}") from None
        try:
            decoded = orjson.loads(data) if data else None
        except orjson.JSONDecodeError:
            decoded = None
        return int(response.status), decoded


def _message(status: int, body: Any) -> str:
    message = body.get("message", "") if isinstance(body, dict) else ""
    return f"{status}" + (f": {message}" if message else "")


class Uninstaller:
    """Finds and deletes the install in ``namespace``; ``dry_run`` asks the apiserver to
    check each delete (RBAC, existence) without doing it."""

    def __init__(
        self,
        api_client: Any,
        *,
        namespace: str,
        dry_run: bool = False,
        pod_wait: float = POD_WAIT,
        request_timeout: float = 10.0,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self._rest = _Rest(api_client, timeout=request_timeout)
        self.namespace = namespace
        self.dry_run = dry_run
        self._pod_wait = pod_wait
        self._sleep = sleep
        self._names = installed_names(namespace)

    # -- finding -------------------------------------------------------------------

    def find(self, kinds: Iterable[Kind] = KINDS, *, outcome: Outcome | None = None) -> list[Found]:
        """Ours among ``kinds``, by name and by label, in the order given."""
        found: list[Found] = []
        for kind in kinds:
            found.extend(self._find_kind(kind, outcome))
        return found

    def _find_kind(self, kind: Kind, outcome: Outcome | None) -> list[Found]:
        status, body = self._rest.call(
            "GET", kind.path(self.namespace), query=[("labelSelector", LABEL_SELECTOR)]
        )
        if status == _NOT_FOUND:
            # The kind is not served (a CRD that is not installed): nothing of it exists.
            return []
        by_name: dict[str, Found] = {}
        if status == _OK:
            for item in body.get("items") or []:
                by_name[item["metadata"]["name"]] = self._found(kind, item, labelled=True)
        elif outcome is not None:
            # Reading by name may still be allowed: the objects we know go on below.
            outcome.problems.append(f"cannot list {kind.plural}: {_message(status, body)}")
        for name in sorted(self._names.get(kind.kind, set()) - set(by_name)):
            status, item = self._rest.call("GET", kind.path(self.namespace, name))
            if status == _OK:
                by_name[name] = self._found(kind, item, labelled=False)
            elif status != _NOT_FOUND and outcome is not None:
                outcome.problems.append(f"cannot read {kind.kind} {name}: {_message(status, item)}")
        return [by_name[name] for name in sorted(by_name)]

    def _found(self, kind: Kind, item: Obj, *, labelled: bool) -> Found:
        metadata = item.get("metadata") or {}
        return Found(
            kind=kind,
            name=str(metadata.get("name")),
            namespace=self.namespace if kind.namespaced else "",
            labelled=labelled,
            terminating=bool(metadata.get("deletionTimestamp")),
        )

    def namespace_state(self, outcome: Outcome) -> tuple[bool, bool, bool]:
        """(exists, created by the install: it carries the part-of label, terminating)."""
        status, body = self._rest.call("GET", NAMESPACE_KIND.path("", self.namespace))
        if status == _NOT_FOUND:
            return False, False, False
        if status != _OK:
            outcome.problems.append(
                f"cannot read Namespace {self.namespace}: {_message(status, body)}"
            )
            return False, False, False
        metadata = body.get("metadata") or {}
        labels = metadata.get("labels") or {}
        return True, labels.get(PART_OF) == "gpushare", bool(metadata.get("deletionTimestamp"))

    def helm_release(self) -> str | None:
        """The Helm release the install belongs to while Helm still records it: the name
        Helm stamps on every object it creates (``meta.helm.sh/release-name``), when a
        release record of that name (Helm's Secret or ConfigMap storage) is in the
        namespace."""
        names = set()
        for kind, name in (("deployments", "gpushare-webhook"), ("configmaps", "gpushare-policy")):
            group = "/apis/apps/v1" if kind == "deployments" else "/api/v1"
            status, body = self._rest.call(
                "GET", f"{group}/namespaces/{self.namespace}/{kind}/{name}"
            )
            if status == _OK:
                annotations = (body.get("metadata") or {}).get("annotations") or {}
                if release := annotations.get(HELM_RELEASE):
                    names.add(str(release))
        for release in sorted(names):
            for kind in ("secrets", "configmaps"):
                status, body = self._rest.call(
                    "GET",
                    f"/api/v1/namespaces/{self.namespace}/{kind}",
                    query=[("labelSelector", f"owner=helm,name={release}")],
                )
                if status == _OK and body.get("items"):
                    return release
        return None

    # -- deleting ------------------------------------------------------------------

    def run(self) -> Outcome:
        """Delete the install; refused (:class:`HelmReleaseError`) while a Helm release
        holds it, which deleting its objects underneath would leave broken."""
        release = self.helm_release()
        if release is not None:
            raise HelmReleaseError(release, self.namespace)
        outcome = Outcome()
        verb = "would delete" if self.dry_run else "deleted"
        for stage in STAGES:
            for found in self.find(stage, outcome=outcome):
                if found.terminating:
                    outcome.done.append(f"{found} is already being deleted")
                    continue
                self._delete(found.kind, found.name, outcome, verb=verb, what=str(found))
            if stage is WORKLOAD_KINDS and not self.dry_run:
                self._wait_for_pods(outcome)
            if stage is WORKLOAD_KINDS:
                for report in self.reports(outcome):
                    self._delete(
                        report.kind,
                        report.name,
                        outcome,
                        verb=verb,
                        what=str(report),
                        namespace=report.namespace,
                    )
        self._delete_namespace(outcome, verb=verb)
        if not self.dry_run:
            # What could not be read was said above: this pass names only what is left.
            for left in [*self.find(KINDS), *self.reports()]:
                if not left.terminating:
                    outcome.problems.append(f"{left} is still there after its delete")
        return outcome

    def reports(self, outcome: Outcome | None = None) -> list[Found]:
        """The policy reports the leader wrote, in every namespace."""
        found: list[Found] = []
        for kind in REPORT_KINDS:
            root = f"/apis/{kind.api_version}/{kind.plural}"
            status, body = self._rest.call("GET", root, query=[("labelSelector", REPORT_SELECTOR)])
            if status == _NOT_FOUND:
                continue  # the CRD is not installed: no report of that kind exists
            if status != _OK:
                if outcome is not None:
                    outcome.problems.append(f"cannot list {kind.plural}: {_message(status, body)}")
                continue
            for item in body.get("items") or []:
                metadata = item.get("metadata") or {}
                found.append(
                    Found(
                        kind=kind,
                        name=str(metadata.get("name")),
                        namespace=str(metadata.get("namespace")),
                        labelled=True,
                        terminating=bool(metadata.get("deletionTimestamp")),
                    )
                )
        return found

    def _delete(
        self,
        kind: Kind,
        name: str,
        outcome: Outcome,
        *,
        verb: str,
        what: str,
        namespace: str | None = None,
    ) -> None:
        # Background: the Deployment's ReplicaSets and pods go by garbage collection.
        body: Obj = {"apiVersion": "v1", "kind": "DeleteOptions", "propagationPolicy": "Background"}
        if self.dry_run:
            # In the body: with a body, the apiserver reads DeleteOptions from it alone and
            # ignores a dryRun query parameter (the delete would happen).
            body["dryRun"] = ["All"]
        where = self.namespace if namespace is None else namespace
        status, answer = self._rest.call("DELETE", kind.path(where, name), body=body)
        if status in (_OK, _ACCEPTED):
            outcome.done.append(f"{verb} {what}")
        elif status == _NOT_FOUND:
            # Gone in between (a garbage collector or another uninstall): nothing to do.
            return
        else:
            hint = " (your user may not delete it)" if status == _FORBIDDEN else ""
            outcome.problems.append(f"cannot delete {what}: {_message(status, answer)}{hint}")

    def _wait_for_pods(self, outcome: Outcome) -> None:
        """Until no pod of the Deployment runs: a leader still running would write its
        Secret, Lease and CEL policies back after they are deleted."""
        path = f"/api/v1/namespaces/{self.namespace}/pods"
        deadline = time.monotonic() + self._pod_wait
        while True:
            status, body = self._rest.call("GET", path, query=[("labelSelector", POD_SELECTOR)])
            if status != _OK:
                outcome.problems.append(
                    f"cannot list the webhook's pods: {_message(status, body)}; if one still "
                    "runs, it may write its Secret and Lease back: run uninstall again once "
                    "they are gone"
                )
                return
            pods = [item["metadata"]["name"] for item in body.get("items") or []]
            if not pods:
                return
            if time.monotonic() >= deadline:
                outcome.problems.append(
                    f"pods still running after {self._pod_wait:.0f}s: {', '.join(sorted(pods))}; "
                    "they may write their Secret and Lease back: run uninstall again once "
                    "they are gone"
                )
                return
            self._sleep(1.0)

    def _delete_namespace(self, outcome: Outcome, *, verb: str) -> None:
        exists, ours, terminating = self.namespace_state(outcome)
        if not exists:
            return
        if terminating:
            outcome.done.append(f"Namespace {self.namespace} is already being deleted")
            return
        if not ours:
            outcome.kept.append(
                f"Namespace {self.namespace}: not created by the install (no {LABEL_SELECTOR} "
                "label); delete it yourself if nothing else lives there"
            )
            return
        self._delete(
            NAMESPACE_KIND, self.namespace, outcome, verb=verb, what=f"Namespace {self.namespace}"
        )
