"""The decision core: an admitted object and a policy in, a verdict and JSON Patch out.

Nothing here does I/O. The HTTP server, the CLI and the tests all call
:func:`decide` (one endpoint's view) or :func:`review_object` (mutate, then validate
the mutated object: what the apiserver does with both webhooks registered).
"""

from __future__ import annotations

import base64
import copy
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Literal, TypedDict

import jsonpatch
import orjson

from webhook.mode import choose_mode
from webhook.mutation import PatchOp, mutate
from webhook.policy import Action, Mode, Policy, match_any
from webhook.resources import Finding, read_pod
from webhook.rules import Phase, Subject, evaluate
from webhook.workload import as_mapping, find_pod

MAX_WARNING: Final = 120
_SEVERITY: Final[Mapping[str, int]] = {"off": 0, "audit": 1, "warn": 2, "deny": 3}


# -- wire format (admission.k8s.io/v1 and v1beta1 share it) -------------------------


class GroupVersionKind(TypedDict, total=False):
    group: str
    version: str
    kind: str


class GroupVersionResource(TypedDict, total=False):
    group: str
    version: str
    resource: str


class UserInfo(TypedDict, total=False):
    username: str
    uid: str
    groups: list[str]
    extra: dict[str, list[str]]


class AdmissionRequest(TypedDict, total=False):
    uid: str
    kind: GroupVersionKind
    resource: GroupVersionResource
    subResource: str
    requestKind: GroupVersionKind
    name: str
    namespace: str
    operation: str
    userInfo: UserInfo
    object: dict[str, Any] | None
    oldObject: dict[str, Any] | None
    dryRun: bool
    options: dict[str, Any] | None


class Status(TypedDict, total=False):
    code: int
    message: str
    reason: str


class AdmissionResponse(TypedDict, total=False):
    uid: str
    allowed: bool
    status: Status
    patch: str
    patchType: str
    warnings: list[str]
    auditAnnotations: dict[str, str]


class AdmissionReview(TypedDict, total=False):
    apiVersion: str
    kind: str
    request: AdmissionRequest
    response: AdmissionResponse


class Violation(TypedDict):
    rule: str
    action: Action
    message: str


class ReviewEntry(TypedDict):
    """One object's result of the offline review (the CLI contract)."""

    kind: str
    namespace: str
    name: str
    allowed: bool
    mode: Mode
    violations: list[Violation]
    warnings: list[str]
    patch: list[PatchOp]
    object: Any


# -- the decision ---------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Request:
    """The facts of an admission request that a decision depends on."""

    kind: str
    operation: str = "CREATE"
    namespace: str = ""
    username: str = ""
    groups: tuple[str, ...] = ()


@dataclass(slots=True)
class Decision:
    allowed: bool = True
    mode: Mode = "none"
    violations: list[Violation] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    patch: list[PatchOp] = field(default_factory=list)
    exempt: bool = False

    @property
    def denials(self) -> list[Violation]:
        return [v for v in self.violations if v["action"] == "deny"]

    def message(self) -> str:
        """The denial text shown to the user: every denying rule with what to change."""
        return "; ".join(f"[{v['rule']}] {v['message']}" for v in self.denials)


def _shorten(text: str) -> str:
    return text if len(text) <= MAX_WARNING else text[: MAX_WARNING - 1] + "\u2026"


def exempt(request: Request, policy: Policy) -> bool:
    if policy.exempt_namespaces and match_any(request.namespace, policy.exempt_namespaces):
        return True
    if request.username in policy.exempt_users:
        return True
    if policy.exempt_groups.intersection(request.groups):
        return True
    if policy.exempt_service_accounts and request.username.startswith("system:serviceaccount:"):
        namespace, _, name = request.username[len("system:serviceaccount:") :].partition(":")
        return match_any(f"{namespace}/{name}", policy.exempt_service_accounts)
    return False


def decide(obj: Mapping[str, Any], request: Request, policy: Policy, *, phase: Phase) -> Decision:
    """The verdict of one endpoint (``mutate`` or ``validate``) on ``obj``."""
    decision = Decision()
    if request.operation not in ("CREATE", "UPDATE"):
        return decision
    view = find_pod(obj, request.kind)
    if view is None:
        return decision
    if exempt(request, policy):
        decision.exempt = True
        return decision
    namespace = request.namespace or str(
        as_mapping(obj.get("metadata")).get("namespace") or "default"
    )
    requests = read_pod(view.spec, policy)
    choice = choose_mode(
        annotations=as_mapping(as_mapping(view.metadata).get("annotations")),
        node_selector=as_mapping(view.spec.get("nodeSelector")),
        namespace=namespace,
        requests=requests,
        policy=policy,
    )
    decision.mode = choice.mode
    subject = Subject(
        view=view, requests=requests, mode=choice.mode, operation=request.operation, phase=phase
    )
    findings = evaluate(subject, policy)
    if subject.created:
        findings.extend(choice.findings)
    # A pod's spec cannot change after creation (bar ephemeral containers): mutate
    # new pods and templates only.
    mutable = subject.created and requests.sharing
    capped: list[Finding] = []
    if mutable:
        mutation = mutate(view, requests, choice.mode, policy)
        if phase == "validate" and mutation.ops:
            findings.append(
                Finding(
                    "unmutated-gpu-pod",
                    f"{choice.mode} pod lacks {len(mutation.ops)} of its injected settings; "
                    "is the gpushare mutating webhook registered?",
                )
            )
        elif phase == "mutate":
            decision.patch = mutation.ops
            capped = [Finding("limit-tampering", text) for text in mutation.overwritten]
    _apply_actions(decision, findings, capped, policy)
    if mutable:
        for request_ in requests.containers:
            decision.warnings.extend(_shorten(note) for note in request_.notes)
    if not decision.allowed:
        decision.patch = []
    return decision


def _apply_actions(
    decision: Decision, findings: Sequence[Finding], capped: Sequence[Finding], policy: Policy
) -> None:
    if not findings and not capped:
        return
    seen: set[tuple[str, str]] = set()
    for finding, cap in [(f, "deny") for f in findings] + [(f, "warn") for f in capped]:
        key = (finding.rule, finding.message)
        if key in seen:
            continue
        seen.add(key)
        action = policy.action(finding.rule)
        if _SEVERITY[action] > _SEVERITY[cap]:
            action = "warn"
        if action == "off":
            continue
        decision.violations.append(
            {"rule": finding.rule, "action": action, "message": finding.message}
        )
        if action == "deny":
            decision.allowed = False
        elif action == "warn":
            decision.warnings.append(_shorten(f"{finding.rule}: {finding.message}"))


def request_facts(request: AdmissionRequest, obj: Mapping[str, Any]) -> Request:
    """The :class:`Request` of a wire AdmissionRequest (its object already chosen)."""
    kind = as_mapping(request.get("kind")).get("kind") or as_mapping(obj).get("kind") or ""
    user = as_mapping(request.get("userInfo"))
    groups = user.get("groups")
    return Request(
        kind=str(kind),
        operation=str(request.get("operation") or "CREATE"),
        namespace=str(request.get("namespace") or ""),
        username=str(user.get("username") or ""),
        groups=tuple(str(g) for g in groups) if isinstance(groups, list) else (),
    )


def review_object(
    obj: Mapping[str, Any],
    policy: Policy,
    *,
    namespace: str | None = None,
    username: str = "",
    groups: Sequence[str] = (),
    operation: str = "CREATE",
) -> ReviewEntry:
    """Mutate, then validate the mutated object: both webhooks, as the apiserver runs them."""
    metadata = as_mapping(obj.get("metadata"))
    kind = str(obj.get("kind") or "")
    ns = namespace or str(metadata.get("namespace") or "default")
    request = Request(
        kind=kind, operation=operation, namespace=ns, username=username, groups=tuple(groups)
    )
    mutated = decide(obj, request, policy, phase="mutate")
    final: Any = obj
    if mutated.patch:
        final = jsonpatch.apply_patch(copy.deepcopy(dict(obj)), mutated.patch)
    validated = decide(final, request, policy, phase="validate") if mutated.allowed else Decision()
    violations = list(mutated.violations)
    for violation in validated.violations:
        if violation not in violations:
            violations.append(violation)
    warnings = list(dict.fromkeys([*mutated.warnings, *validated.warnings]))
    return {
        "kind": kind,
        "namespace": ns,
        "name": str(metadata.get("name") or metadata.get("generateName") or ""),
        "allowed": mutated.allowed and validated.allowed,
        "mode": mutated.mode,
        "violations": violations,
        "warnings": warnings,
        "patch": mutated.patch,
        "object": final,
    }


# -- the wire protocol ------------------------------------------------------------------

Endpoint = Literal["mutate", "validate"]
API_VERSIONS: Final = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")


class ReviewError(Exception):
    """A request that is not a usable AdmissionReview; the HTTP edge answers 400."""


@dataclass(slots=True)
class Answer:
    """An AdmissionReview response with the decision and facts behind it (for audit)."""

    review: AdmissionReview
    decision: Decision
    request: AdmissionRequest
    facts: Request


def parse_review(body: Any) -> tuple[str, AdmissionRequest]:
    """The apiVersion and request of an AdmissionReview, or :class:`ReviewError`."""
    if not isinstance(body, dict):
        raise ReviewError("body is not a JSON object")
    version = body.get("apiVersion")
    if version not in API_VERSIONS:
        raise ReviewError(f"apiVersion {version!r} is not one of {', '.join(API_VERSIONS)}")
    if body.get("kind") != "AdmissionReview":
        raise ReviewError(f"kind {body.get('kind')!r} is not AdmissionReview")
    request = body.get("request")
    if not isinstance(request, dict):
        raise ReviewError("AdmissionReview has no request")
    uid = request.get("uid")
    if not isinstance(uid, str) or not uid:
        raise ReviewError("request has no uid")
    operation = request.get("operation")
    if operation in ("CREATE", "UPDATE") and not isinstance(request.get("object"), dict):
        raise ReviewError(f"{operation} request has no object")
    for key in ("kind", "userInfo"):
        if key in request and not isinstance(request[key], dict):
            raise ReviewError(f"request.{key} is not an object")
    return version, request  # type: ignore[return-value]  # shape checked above


def _response(
    version: str, uid: str, decision: Decision, policy: Policy, *, endpoint: Endpoint
) -> AdmissionReview:
    response: AdmissionResponse = {"uid": uid, "allowed": decision.allowed}
    if not decision.allowed:
        response["status"] = {"code": 403, "reason": "Forbidden", "message": decision.message()}
    if decision.patch and endpoint == "mutate":
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(orjson.dumps(decision.patch)).decode()
    if decision.warnings:
        response["warnings"] = decision.warnings
    annotations = {"mode": decision.mode, "policy": policy.digest}
    rules = sorted({v["rule"] for v in decision.violations})
    if rules:
        annotations["rules"] = ",".join(rules)
    if decision.exempt:
        annotations["exempt"] = "true"
    response["auditAnnotations"] = annotations
    return {"apiVersion": version, "kind": "AdmissionReview", "response": response}


def answer(body: Any, policy: Policy, *, endpoint: Endpoint) -> Answer:
    """Answer one AdmissionReview body at ``endpoint``. Raises ReviewError for bad input."""
    version, request = parse_review(body)
    obj = request.get("object")
    if not isinstance(obj, dict):
        obj = {}
    facts = request_facts(request, obj)
    decision = decide(obj, facts, policy, phase=endpoint)
    review = _response(version, request["uid"], decision, policy, endpoint=endpoint)
    return Answer(review=review, decision=decision, request=request, facts=facts)


def error_answer(body: Any, policy: Policy, *, endpoint: Endpoint, error: str) -> Answer:
    """The answer when evaluating failed unexpectedly: the policy's onError decides."""
    version, request = parse_review(body)
    decision = Decision(allowed=policy.on_error == "allow")
    review = _response(version, request["uid"], decision, policy, endpoint=endpoint)
    if not decision.allowed:
        review["response"]["status"] = {
            "code": 500,
            "reason": "InternalError",
            "message": f"gpushare-webhook could not evaluate the request ({error}); "
            "the policy's onError is deny",
        }
    facts = request_facts(request, request.get("object") or {})
    return Answer(review=review, decision=decision, request=request, facts=facts)
