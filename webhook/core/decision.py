"""The decision: an admitted object, the request's facts and a policy in; a verdict out.

Nothing here does I/O. :func:`decide` is one endpoint's view (``mutate`` or
``validate``); the wire adapter (:mod:`webhook.core.admission`) and the offline
review (:mod:`webhook.core.review`) call it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypedDict

from webhook.core.cluster import ClusterView
from webhook.core.context import candidate_selector, judge, resolve_percentages, where
from webhook.core.finding import Finding
from webhook.core.injection import NOTHING, PLAIN, Treatment, injection_for
from webhook.core.mig import Translation, translate
from webhook.core.mode import ModeChoice, choose_mode
from webhook.core.mutation import first_missing, mutate, needs_void
from webhook.core.objects import JUDGED_KINDS, object_findings
from webhook.core.policy import RULE_IDS, Action, Mode, Policy, match_any
from webhook.core.pool import pool_of
from webhook.core.resources import read_pod
from webhook.core.rules import Phase, Subject, evaluate
from webhook.core.whole import keeps_scheduler
from webhook.core.wire import PatchOp
from webhook.core.workload import PodView, as_mapping, find_pod

MAX_WARNING: Final = 120
_SEVERITY: Final[Mapping[str, int]] = {"off": 0, "audit": 1, "warn": 2, "deny": 3}


class Violation(TypedDict):
    rule: str
    action: Action
    message: str


class Excepted(TypedDict):
    """A finding an exception of the policy took off: what it was and which one."""

    rule: str
    exception: str
    message: str


# Not frozen: built per request, and a frozen field costs an object.__setattr__.
@dataclass(slots=True)
class Request:
    """The facts of an admission request that a decision depends on."""

    kind: str
    operation: str = "CREATE"
    namespace: str = ""
    username: str = ""
    groups: tuple[str, ...] = ()
    # The day (ISO, UTC) exceptions' expiry is read against; "" where no clock is read.
    today: str = ""


@dataclass(slots=True)
class Decision:
    allowed: bool = True
    mode: Mode = "none"
    violations: list[Violation] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    patch: list[PatchOp] = field(default_factory=list)
    exempt: bool = False
    excepted: list[Excepted] = field(default_factory=list)
    # Each violation's message with user-supplied values redacted, in the same order.
    redacted: list[str] = field(default_factory=list)

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
    return policy.exempt.match(request.username, request.groups)


# Not frozen: built per request, and a frozen field costs an object.__setattr__.
@dataclass(slots=True)
class _Examined:
    """A pod view read and judged: its requests, mode, injection and findings."""

    subject: Subject
    choice: ModeChoice
    findings: list[Finding]
    # Warnings about the cluster that are no rule's finding.
    notes: list[str] = field(default_factory=list)
    # The pod's translation to MIG instances, when it picks a MIG pool.
    translation: Translation | None = None


def _examine(
    view: PodView,
    request: Request,
    policy: Policy,
    *,
    phase: Phase,
    namespace: str,
    previous: Mapping[str, Any] | None = None,
    cluster: ClusterView | None = None,
) -> _Examined:
    requests = read_pod(view.spec, policy)
    annotations = as_mapping(as_mapping(view.metadata).get("annotations"))
    translation = None
    # Before the mode: a translated pod is judged and mutated as the MIG pod it becomes.
    created = view.template or request.operation == "CREATE"
    if cluster is not None and policy.mig_pools and created:
        translation = translate(
            view, requests, annotations=annotations, policy=policy, cluster=cluster
        )
    choice = choose_mode(
        annotations=annotations,
        node_selector=as_mapping(view.spec.get("nodeSelector")),
        namespace=namespace,
        requests=requests,
        policy=policy,
    )
    whole = keeps_scheduler(view.spec, requests, choice, policy)
    if whole:
        # Whole GPUs under a scheduler of the pod's own: no slice to inject, and no mode
        # it uses (its namespace's or the policy's default mode is not asked for).
        choice = ModeChoice(mode="none", source="whole GPUs under the pod's own scheduler")
    # A vgpu pod of a stack whose nodes have no HAMi-core gets none injected.
    library = choice.mode != "vgpu" or policy.library_for(requests)
    if cluster is not None and requests.sharing and choice.mode in ("vgpu", "mps"):
        selector = candidate_selector(view.spec, choice.mode, policy, placed=choice.placed)
        resolve_percentages(requests, pool_of(cluster, selector), where=where(selector))
    subject = Subject(
        view=view,
        requests=requests,
        mode=choice.mode,
        operation=request.operation,
        phase=phase,
        injection=injection_for(choice.mode, policy) if requests.sharing and library else NOTHING,
        username=request.username,
        groups=request.groups,
        previous=previous,
        namespace=namespace,
        treatment=(
            Treatment(whole=whole, dynamic=choice.dynamic, library=library, placed=choice.placed)
            if whole or choice.dynamic or not library or choice.placed
            else PLAIN
        ),
    )
    findings = evaluate(subject, policy)
    if subject.created:
        findings.extend(choice.findings)
    notes: list[str] = []
    if cluster is not None:
        seen = judge(
            subject,
            policy,
            cluster,
            namespace=namespace,
            notes=notes,
            judged=translation.judged if translation is not None else (),
        )
        if translation is not None:
            seen.extend(translation.findings)
        if seen:
            findings.extend(seen)
            findings.sort(key=lambda finding: RULE_IDS.index(finding.rule))
    return _Examined(
        subject=subject, choice=choice, findings=findings, notes=notes, translation=translation
    )


def decide(
    obj: Mapping[str, Any],
    request: Request,
    policy: Policy,
    *,
    phase: Phase,
    old: Mapping[str, Any] | None = None,
    cluster: ClusterView | None = None,
) -> Decision:
    """The verdict of one endpoint (``mutate`` or ``validate``) on ``obj``.

    ``old`` is the object before an UPDATE (the AdmissionRequest's ``oldObject``).
    ``cluster`` adds the rules and settings that need the cluster; without it, or
    while it is not synced, the verdict is the pod spec's alone.
    """
    if cluster is not None and not cluster.synced:
        cluster = None
    decision = Decision()
    if request.operation not in ("CREATE", "UPDATE"):
        return decision
    view = find_pod(obj, request.kind)
    if view is None and request.kind not in JUDGED_KINDS:
        return decision
    if exempt(request, policy):
        decision.exempt = True
        return decision
    namespace = request.namespace or str(
        as_mapping(obj.get("metadata")).get("namespace") or "default"
    )
    if view is None:
        # Written once and read by pods later: judged whole at every write.
        _apply_actions(
            decision,
            object_findings(
                obj,
                request.kind,
                policy,
                namespace=namespace,
                username=request.username,
                groups=request.groups,
            ),
            (),
            policy,
            request,
            namespace,
        )
        return decision
    # An update of a pod is judged by what it adds: what the pod had before is not its
    # doing (a policy tightened since its creation must not refuse a label change).
    old_view = None
    if request.operation == "UPDATE" and not view.template and old is not None:
        old_view = find_pod(old, request.kind)
    previous = None
    if old_view is not None:
        previous = as_mapping(as_mapping(old_view.metadata).get("annotations"))
    examined = _examine(
        view,
        request,
        policy,
        phase=phase,
        namespace=namespace,
        previous=previous,
        cluster=cluster,
    )
    findings = examined.findings
    if old_view is not None:
        before = _examine(
            old_view, request, policy, phase=phase, namespace=namespace, cluster=cluster
        )
        seen = {(f.rule, f.message) for f in before.findings}
        findings = [f for f in findings if (f.rule, f.message) not in seen]
    subject, choice = examined.subject, examined.choice
    decision.mode = choice.mode
    # A pod's spec cannot change after creation (bar ephemeral containers): mutate
    # new pods and templates only.
    translated = examined.translation.ops if examined.translation is not None else []
    mutable = subject.created and (subject.requests.sharing or bool(translated))
    capped: list[Finding] = []
    if mutable and phase == "validate" and translated:
        findings.append(
            Finding(
                "unmutated-gpu-pod",
                f"pod asks for GPU memory on a MIG pool but is not translated to MIG (first: "
                f"{translated[0]['op']} {translated[0]['path']}); is the gpushare mutating "
                "webhook registered, its cluster view synced?",
            )
        )
    elif mutable and phase == "validate":
        missing = first_missing(
            view, subject.requests, choice.mode, policy, subject.injection, subject.treatment
        )
        if missing is not None:
            findings.append(
                Finding(
                    "unmutated-gpu-pod",
                    f"{choice.mode} pod lacks its injected settings (first: {missing['op']} "
                    f"{missing['path']}); is the gpushare mutating webhook registered?",
                )
            )
    elif (
        phase == "mutate"
        and subject.created
        and (mutable or needs_void(view.spec, subject.requests, policy))
    ):
        # A pod that shares no GPU may still need the void for its containers: mutated,
        # but never refused as unmutated (a legacy image is raw-visible-devices').
        mutation = mutate(
            view, subject.requests, choice.mode, policy, subject.injection, subject.treatment
        )
        decision.patch = [*translated, *mutation.ops] if translated else mutation.ops
        capped = [Finding("limit-tampering", text) for text in mutation.overwritten]
    _apply_actions(decision, findings, capped, policy, request, namespace)
    if mutable:
        for request_ in subject.requests.containers:
            if request_.notes:
                decision.warnings.extend(_shorten(note) for note in request_.notes)
        if examined.notes:
            decision.warnings.extend(_shorten(note) for note in examined.notes)
    if not decision.allowed:
        decision.patch = []
    return decision


def _apply_actions(
    decision: Decision,
    findings: Sequence[Finding],
    capped: Sequence[Finding],
    policy: Policy,
    request: Request,
    namespace: str,
) -> None:
    if not findings and not capped:
        return
    seen: set[tuple[str, str]] = set()
    for finding, cap in [(f, "deny") for f in findings] + [(f, "warn") for f in capped]:
        key = (finding.rule, finding.message)
        if key in seen:
            continue
        seen.add(key)
        exception = (
            policy.exception_for(
                finding.rule,
                namespace=namespace,
                username=request.username,
                groups=request.groups,
                today=request.today,
            )
            if policy.exceptions
            else None
        )
        if exception is not None:
            decision.excepted.append(
                {"rule": finding.rule, "exception": exception.name, "message": finding.redacted}
            )
            continue
        action = policy.action(finding.rule)
        if _SEVERITY[action] > _SEVERITY[cap]:
            action = "warn"
        if action == "off":
            continue
        decision.violations.append(
            {"rule": finding.rule, "action": action, "message": finding.message}
        )
        decision.redacted.append(finding.redacted)
        if action == "deny":
            decision.allowed = False
        elif action == "warn":
            decision.warnings.append(_shorten(f"{finding.rule}: {finding.message}"))
