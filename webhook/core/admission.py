"""An AdmissionReview answered: the wire request turned into facts, decided, and answered.

The review is parsed once by the caller (:func:`webhook.core.wire.parse_review`);
:func:`answer` and :func:`error_answer` take the parsed request, so the error path
never parses the body again.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import orjson
import pybase64

from webhook.core.cluster import ClusterView
from webhook.core.decision import Decision, Request, decide
from webhook.core.policy import Policy
from webhook.core.wire import AdmissionRequest, AdmissionResponse, AdmissionReview, Endpoint
from webhook.core.workload import as_mapping


@dataclass(slots=True)
class Answer:
    """An AdmissionReview response with the decision and facts behind it (for audit)."""

    review: AdmissionReview
    decision: Decision
    request: AdmissionRequest
    facts: Request


def request_facts(
    request: Mapping[str, Any], obj: Mapping[str, Any], *, today: str = ""
) -> Request:
    """The :class:`Request` of a wire AdmissionRequest (its object already chosen), on
    ``today`` (the edge's clock, for the policy's exceptions).

    Untyped on purpose, as :func:`_object` is: a client may send any JSON in any field."""
    kind = as_mapping(request.get("kind")).get("kind") or as_mapping(obj).get("kind") or ""
    user = as_mapping(request.get("userInfo"))
    groups = user.get("groups")
    return Request(
        kind=str(kind),
        operation=str(request.get("operation") or "CREATE"),
        namespace=str(request.get("namespace") or ""),
        username=str(user.get("username") or ""),
        groups=tuple(str(g) for g in groups) if isinstance(groups, list) else (),
        today=today,
    )


def _object(request: Mapping[str, object], key: str) -> dict[str, Any] | None:
    """``request[key]`` when it is a JSON object. Read through ``Mapping[str, object]``:
    the wire's TypedDict says what the apiserver sends, not what a client may, and the
    compiled core checks a TypedDict value's declared type when it is read (a list as
    ``oldObject`` raised TypeError)."""
    value = request.get(key)
    return value if isinstance(value, dict) else None


def _response(
    version: str, uid: str, decision: Decision, policy: Policy, *, endpoint: Endpoint
) -> AdmissionReview:
    response: AdmissionResponse = {"uid": uid, "allowed": decision.allowed}
    if not decision.allowed:
        response["status"] = {"code": 403, "reason": "Forbidden", "message": decision.message()}
    if decision.patch and endpoint == "mutate":
        response["patchType"] = "JSONPatch"
        # pybase64's SIMD encoder: binascii spends ~19 instructions a byte here (~35k of
        # ~1.3M a 5 KB GPU review, callgrind), this ~2 and no bytes-to-str decode.
        response["patch"] = pybase64.b64encode_as_string(orjson.dumps(decision.patch))
    if decision.warnings:
        response["warnings"] = decision.warnings
    annotations = {"mode": decision.mode, "policy": policy.digest}
    rules = sorted({v["rule"] for v in decision.violations})
    if rules:
        annotations["rules"] = ",".join(rules)
    if decision.exempt:
        annotations["exempt"] = "true"
    if decision.excepted:
        annotations["exceptions"] = ",".join(
            dict.fromkeys(f"{e['exception']}:{e['rule']}" for e in decision.excepted)
        )
    response["auditAnnotations"] = annotations
    return {"apiVersion": version, "kind": "AdmissionReview", "response": response}


def answer(
    version: str,
    request: AdmissionRequest,
    policy: Policy,
    *,
    endpoint: Endpoint,
    cluster: ClusterView | None = None,
    today: str = "",
) -> Answer:
    """Answer one parsed AdmissionReview at ``endpoint`` (with what ``cluster`` knows, on
    ``today``)."""
    obj = _object(request, "object") or {}
    facts = request_facts(request, obj, today=today)
    decision = decide(
        obj,
        facts,
        policy,
        phase=endpoint,
        old=_object(request, "oldObject"),
        cluster=cluster,
    )
    review = _response(version, request["uid"], decision, policy, endpoint=endpoint)
    return Answer(review=review, decision=decision, request=request, facts=facts)


def error_answer(
    version: str, request: AdmissionRequest, policy: Policy, *, endpoint: Endpoint, error: str
) -> Answer:
    """The answer when evaluating failed unexpectedly: the policy's onError decides."""
    decision = Decision(allowed=policy.on_error == "allow")
    review = _response(version, request["uid"], decision, policy, endpoint=endpoint)
    if not decision.allowed:
        review["response"]["status"] = {
            "code": 500,
            "reason": "InternalError",
            "message": f"gpushare-webhook could not evaluate the request ({error}); "
            "the policy's onError is deny",
        }
    facts = request_facts(request, _object(request, "object") or {})
    return Answer(review=review, decision=decision, request=request, facts=facts)
