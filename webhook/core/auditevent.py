"""The apiserver's audit events (``audit.k8s.io/v1``) read as the webhook's audit records.

On Kubernetes 1.36+ no webhook sits in a GPU pod's path: the in-apiserver policies decide,
and their decisions land in the apiserver's audit log instead of the webhook's. The
rollout report (:mod:`webhook.core.rollout`) reads either, so each event is turned into
the record the webhook would have written for the same request:

- a rule of a ``warn`` or ``audit`` ValidatingAdmissionPolicy (``gpushare-warn``,
  ``gpushare-audit`` and their ``-sources`` twins) that the object breaks is the audit
  annotation ``<policy>/<rule id>`` (:func:`webhook.render.validating.audit_annotations`),
  and, for the request's first failure only, the apiserver's own
  ``validation.policy.admission.k8s.io/validation_failure``;
- a refusal is the response status: ``ValidatingAdmissionPolicy 'gpushare-deny' with
  binding 'gpushare-deny' denied request: [rule] ...`` (kubernetes
  staging/src/k8s.io/apiserver/pkg/admission/plugin/policy/validating/dispatcher.go), which
  names the first failing rule only; the webhook's own log names every one.

One event is one request (the webhook's log has one record per endpoint it was called
at), so each event is read as from one endpoint, ``apiserver``. Only ``ResponseComplete``
events carry the outcome; the others are no record.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Final

import orjson

from webhook.core.policy import RULE_IDS
from webhook.core.record import AuditRecord, ObjectRef
from webhook.core.workload import as_mapping

API_VERSION: Final = "audit.k8s.io/v1"
ENDPOINT: Final = "apiserver"
_FAILURE: Final = "validation.policy.admission.k8s.io/validation_failure"
_PREFIX: Final = "gpushare-"
_SOURCES: Final = "-sources"
_RECORDED: Final = {"warn": "warn", "audit": "audit"}
_DENIED: Final = re.compile(
    r"ValidatingAdmissionPolicy '(?P<policy>gpushare-[a-z-]+)' (?:with binding '[^']*' )?"
    r"denied request: (?P<message>\[(?P<rule>[a-z-]+)\].*)",
    re.DOTALL,
)
_REF_FIELDS: Final = ("resource", "subresource", "namespace", "name", "apiGroup", "apiVersion")


def is_event(record: Mapping[str, Any]) -> bool:
    """Whether ``record`` is an apiserver audit event rather than a webhook record."""
    return record.get("apiVersion") == API_VERSION and record.get("kind") == "Event"


def _action(policy: str) -> str | None:
    """The rule action a policy of the install holds (``gpushare-audit`` -> audit)."""
    if not policy.startswith(_PREFIX):
        return None
    return _RECORDED.get(policy.removeprefix(_PREFIX).removesuffix(_SOURCES))


def _millis(stamp: str) -> str:
    """``2026-01-02T03:04:05.678901Z`` as the webhook's records write it, to the
    millisecond: ``2026-01-02T03:04:05.678+00:00``."""
    second, _, fraction = stamp.removesuffix("Z").partition(".")
    return f"{second}.{(fraction + '000')[:3]}+00:00" if second else ""


def _violations(event: Mapping[str, Any]) -> list[dict[str, str]]:
    found: dict[str, dict[str, str]] = {}
    annotations = as_mapping(event.get("annotations"))
    for key, value in annotations.items():
        policy, _, rule = str(key).partition("/")
        action = _action(policy)
        if action and rule in RULE_IDS and rule not in found:
            found[rule] = {"rule": rule, "action": action, "message": str(value)}
    failures: Any = []
    if isinstance(annotations.get(_FAILURE), str):
        try:
            failures = orjson.loads(annotations[_FAILURE])
        except orjson.JSONDecodeError:
            failures = []
    for failure in failures if isinstance(failures, list) else []:
        failure = as_mapping(failure)
        action = _action(str(failure.get("policy") or ""))
        message = str(failure.get("message") or "")
        rule = message[1 : message.find("]")] if message.startswith("[") else ""
        if action and rule in RULE_IDS and rule not in found:
            found[rule] = {"rule": rule, "action": action, "message": message}
    status = as_mapping(event.get("responseStatus"))
    denied = _DENIED.search(str(status.get("message") or ""))
    if denied and denied["rule"] in RULE_IDS:
        found[denied["rule"]] = {
            "rule": denied["rule"],
            "action": "deny",
            "message": denied["message"],
        }
    return list(found.values())


def record_of_event(event: Mapping[str, Any]) -> AuditRecord | None:
    """The webhook's audit record for the request of ``event``; None for an event that is
    no request's outcome (a stage before ``ResponseComplete``)."""
    if event.get("stage") != "ResponseComplete":
        return None
    ref = as_mapping(event.get("objectRef"))
    object_ref: ObjectRef = {}
    for field in _REF_FIELDS:
        if ref.get(field):
            object_ref[field] = str(ref[field])
    user = as_mapping(event.get("user"))
    code = as_mapping(event.get("responseStatus")).get("code")
    return {
        "auditID": str(event.get("auditID") or ""),
        "stage": "ResponseComplete",
        "timestamp": _millis(str(event.get("stageTimestamp") or "")),
        "verb": str(event.get("verb") or ""),
        "user": {
            "username": str(user.get("username") or ""),
            "groups": list(user.get("groups") or []),
        },
        "objectRef": object_ref,
        "dryRun": "dryRun=All" in str(event.get("requestURI") or ""),
        "endpoint": ENDPOINT,
        "allowed": not (isinstance(code, int) and code >= 400),
        "violations": _violations(event),
    }
