"""The decision: an admitted object, the request's facts and a policy in; a verdict out.

Nothing here does I/O. :func:`decide` is one endpoint's view (``mutate`` or
``validate``); the wire adapter (:mod:`webhook.core.admission`) and the offline
review (:mod:`webhook.core.review`) call it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypedDict

from webhook.core.injection import NOTHING, injection_for
from webhook.core.mode import choose_mode
from webhook.core.mutation import first_missing, mutate
from webhook.core.policy import Action, Mode, Policy, match_any
from webhook.core.resources import Finding, read_pod
from webhook.core.rules import Phase, Subject, evaluate
from webhook.core.wire import PatchOp
from webhook.core.workload import as_mapping, find_pod

MAX_WARNING: Final = 120
_SEVERITY: Final[Mapping[str, int]] = {"off": 0, "audit": 1, "warn": 2, "deny": 3}


class Violation(TypedDict):
    rule: str
    action: Action
    message: str


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
    injection = injection_for(choice.mode, policy) if requests.sharing else NOTHING
    subject = Subject(
        view=view,
        requests=requests,
        mode=choice.mode,
        operation=request.operation,
        phase=phase,
        injection=injection,
    )
    findings = evaluate(subject, policy)
    if subject.created:
        findings.extend(choice.findings)
    # A pod's spec cannot change after creation (bar ephemeral containers): mutate
    # new pods and templates only.
    mutable = subject.created and requests.sharing
    capped: list[Finding] = []
    if mutable and phase == "validate":
        missing = first_missing(view, requests, choice.mode, policy, injection)
        if missing is not None:
            findings.append(
                Finding(
                    "unmutated-gpu-pod",
                    f"{choice.mode} pod lacks its injected settings (first: {missing['op']} "
                    f"{missing['path']}); is the gpushare mutating webhook registered?",
                )
            )
    elif mutable:
        mutation = mutate(view, requests, choice.mode, policy, injection)
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
