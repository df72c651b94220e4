"""The audit record: what the service writes for each decision, one JSON line each.

The service's sink (:mod:`webhook.service.audit`) writes these records and
``gpushare-webhook report`` (:mod:`webhook.core.rollout`) reads them back, so the
format lives here, below both. The record of each answer is built here too
(:func:`record_of`), in the compiled core, as it runs per request; the edge adds the time.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, TypedDict

from webhook.core.admission import Answer
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
    # A harness's dry-run probe (PROBE_LABEL): `report` leaves it out.
    probe: bool
    endpoint: str
    allowed: bool
    mode: str
    exempt: bool
    # "<exception>:<rule>" of each finding an exception of the policy took off.
    exceptions: list[str]
    violations: list[dict[str, str]]
    patchOps: int
    policyHash: str
    latencyMs: float
    error: str


# The label of a harness's own probe pods (the dev cluster's): their dry-run requests are
# recorded with ``probe`` and the rollout report leaves them out.
PROBE_LABEL: Final = "gpushare.io/probe"


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


_VERBS: Final = {"CREATE": "create", "UPDATE": "update", "DELETE": "delete", "CONNECT": "connect"}


def record_of(
    answer: Answer,
    *,
    endpoint: str,
    policy_hash: str,
    latency_s: float,
    error: str | None = None,
    stamped: str,
) -> AuditRecord:
    """The audit record of one answered review, with the time ``stamped`` (the edge's
    clock). Here, in the compiled core, rather than at the edge: it runs per request."""
    # Any JSON may stand in any field: read untyped, or the compiled core would check each.
    request: Mapping[str, Any] = answer.request
    resource = as_mapping(request.get("resource"))
    metadata = as_mapping(
        as_mapping(request.get("object") or request.get("oldObject")).get("metadata")
    )
    ref: ObjectRef = {"resource": str(resource.get("resource") or "")}
    if resource.get("group"):
        ref["apiGroup"] = str(resource["group"])
    if resource.get("version"):
        ref["apiVersion"] = str(resource["version"])
    if request.get("subResource"):
        ref["subresource"] = str(request["subResource"])
    namespace = request.get("namespace") or metadata.get("namespace")
    if namespace:
        ref["namespace"] = str(namespace)
    name = request.get("name") or metadata.get("name")
    if name:
        ref["name"] = str(name)
    # Kept beside the name the apiserver generates from it (validation sees both), so the
    # pods of one generateName group together at both endpoints.
    if metadata.get("generateName"):
        ref["generateName"] = str(metadata["generateName"])
    facts = answer.facts
    decision = answer.decision
    record: AuditRecord = {
        "auditID": str(request.get("uid", "")),
        "stage": "ResponseComplete",
        "timestamp": stamped,
        "verb": _VERBS.get(facts.operation, facts.operation.lower()),
        # The facts hold userInfo already read as strings (request_facts).
        "user": {"username": facts.username, "groups": list(facts.groups)},
        "objectRef": ref,
        "dryRun": request.get("dryRun") is True,
        "endpoint": endpoint,
        "allowed": decision.allowed,
        "mode": decision.mode,
        "violations": [
            {"rule": v["rule"], "action": v["action"], "message": message}
            for v, message in zip(decision.violations, decision.redacted, strict=True)
        ],
        "patchOps": len(decision.patch) if endpoint == "mutate" else 0,
        "policyHash": policy_hash,
        # Whole microseconds, as round(ms, 3) gives them, without its decimal rounding
        # (~0.35 us against ~0.12).
        "latencyMs": round(latency_s * 1_000_000) / 1000,
    }
    owner = owner_of(metadata)
    if owner is not None:
        record["owner"] = owner
    # Only a dry run: a label anyone can set must not hide a pod that was created.
    if record["dryRun"] and as_mapping(metadata.get("labels")).get(PROBE_LABEL) == "true":
        record["probe"] = True
    if decision.exempt:
        record["exempt"] = True
    if decision.excepted:
        record["exceptions"] = list(
            dict.fromkeys(f"{e['exception']}:{e['rule']}" for e in decision.excepted)
        )
    if error is not None:
        record["error"] = error
    return record
