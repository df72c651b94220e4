"""Building the AdmissionReviews the apiserver sends, for tests, benchmarks and examples.

One builder, so every test speaks the same wire format as kube-apiserver does
(``kind``, ``resource``, ``requestKind``, ``userInfo``, ``options`` included).
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from webhook.core.wire import (
    AdmissionRequest,
    AdmissionReview,
    GroupVersionKind,
    GroupVersionResource,
)

_OPTIONS_KIND = {"CREATE": "CreateOptions", "UPDATE": "UpdateOptions", "DELETE": "DeleteOptions"}


def _group_version(api_version: str) -> tuple[str, str]:
    group, _, version = api_version.rpartition("/")
    return group, version


def admission_review(
    obj: Mapping[str, Any] | None,
    *,
    operation: str = "CREATE",
    uid: str | None = None,
    version: str = "admission.k8s.io/v1",
    namespace: str | None = None,
    username: str = "alice",
    groups: Sequence[str] = ("system:authenticated",),
    dry_run: bool = False,
    kind: str | None = None,
    sub_resource: str | None = None,
    old: Mapping[str, Any] | None = None,
) -> AdmissionReview:
    """The AdmissionReview for ``operation`` on ``obj`` (a Pod when it names no kind).

    ``namespace`` defaults to the object's (else ``default``); ``old`` is the
    ``oldObject`` of an UPDATE.
    """
    subject: Mapping[str, Any] = obj or old or {}
    kind = kind or str(subject.get("kind") or "Pod")
    group, api = _group_version(str(subject.get("apiVersion") or "v1"))
    metadata = subject.get("metadata")
    metadata = metadata if isinstance(metadata, Mapping) else {}
    gvk: GroupVersionKind = {"group": group, "version": api, "kind": kind}
    gvr: GroupVersionResource = {"group": group, "version": api, "resource": kind.lower() + "s"}
    request: AdmissionRequest = {
        "uid": uid or str(uuid.uuid4()),
        "kind": gvk,
        "resource": gvr,
        "requestKind": gvk,
        "name": str(metadata.get("name") or ""),
        "namespace": namespace or str(metadata.get("namespace") or "default"),
        "operation": operation,
        "userInfo": {"username": username, "groups": list(groups)},
        "object": dict(obj) if obj is not None else None,
        "oldObject": dict(old) if old is not None else None,
        "dryRun": dry_run,
        "options": {
            "apiVersion": "meta.k8s.io/v1",
            "kind": _OPTIONS_KIND.get(operation, "CreateOptions"),
        },
    }
    if sub_resource:
        request["subResource"] = sub_resource
    return {"apiVersion": version, "kind": "AdmissionReview", "request": request}
