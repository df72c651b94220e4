"""The audit record: what the service writes for each decision, one JSON line each.

The service's sink (:mod:`webhook.service.audit`) writes these records and
``gpushare-webhook report`` (:mod:`webhook.core.rollout`) reads them back, so the
format lives here, below both.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypedDict

from webhook.core.workload import as_mapping


class ObjectRef(TypedDict, total=False):
    resource: str
    subresource: str
    namespace: str
    name: str
    generateName: str
    apiGroup: str
    apiVersion: str


class Owner(TypedDict):
    """The workload an object belongs to: its controller, or the Deployment behind it."""

    kind: str
    name: str


class AuditRecord(TypedDict, total=False):
    auditID: str
    stage: str
    timestamp: str
    verb: str
    user: dict[str, Any]
    objectRef: ObjectRef
    owner: Owner
    dryRun: bool
    endpoint: str
    allowed: bool
    mode: str
    exempt: bool
    violations: list[dict[str, str]]
    patchOps: int
    policyHash: str
    latencyMs: float
    error: str


def owner_of(metadata: Mapping[str, Any]) -> Owner | None:
    """The controller of an object by its ``ownerReferences``, None when it has none.

    A ReplicaSet that a Deployment made is named ``<deployment>-<pod-template-hash>``
    and stamps that hash on its pods' ``pod-template-hash`` label: such a pod belongs
    to the Deployment, which is what its owner recognises and edits.
    """
    references = metadata.get("ownerReferences")
    if not references or type(references) is not list:
        return None
    for reference in references:
        reference = as_mapping(reference)
        if reference.get("controller") is not True:
            continue
        kind = str(reference.get("kind") or "")
        name = str(reference.get("name") or "")
        if kind == "ReplicaSet":
            template_hash = as_mapping(metadata.get("labels")).get("pod-template-hash")
            if template_hash and name.endswith(f"-{template_hash}"):
                return {"kind": "Deployment", "name": name[: -len(template_hash) - 1]}
        return {"kind": kind, "name": name}
    return None
