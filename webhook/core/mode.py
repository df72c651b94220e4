"""Choosing a pod's sharing mode: annotation, nodeSelector, namespace, resources, default."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

from webhook.core.finding import Finding, quoted
from webhook.core.policy import Mode, NodeSelectorMode, Policy
from webhook.core.resources import PodRequests

# Values other projects write for the same modes (HAMi's nvidia.com/vgpu-mode: hami-core).
MODE_ALIASES: Final[Mapping[str, Mode]] = {
    "vgpu": "vgpu",
    "hami-core": "vgpu",
    "mps": "mps",
    "mig": "mig",
    "none": "none",
}


@dataclass(slots=True)
class ModeChoice:
    mode: Mode
    source: str
    findings: list[Finding] = field(default_factory=list)
    # Named by a mode annotation or a nodeSelector the policy maps: the pod asks for
    # that mode, not only for GPUs.
    named: bool = False
    # mig named by one of the policy's dynamicMigAnnotations: the scheduler cuts a MIG
    # instance that holds the memory the pod asks for (HAMi's and Volcano's dynamic MIG).
    dynamic: bool = False
    # mps named by one of the policy's mps.placedByAnnotations: its scheduler places the
    # pod on a card in MPS mode, so it gets no mps.nodeSelector.
    placed: bool = False


def _annotated_mode(
    annotations: Mapping[str, Any], policy: Policy, findings: list[Finding]
) -> tuple[Mode, str] | None:
    """The mode the first mode annotation names; findings for values that are no mode."""
    for key in policy.mode_annotations:
        raw = annotations.get(key)
        if raw is None:
            continue
        value = MODE_ALIASES.get(str(raw).strip().lower())
        if value is None:
            findings.append(
                Finding(
                    "mode-conflict",
                    f"annotation {key} {quoted(raw)} is not a mode; use vgpu, mps or mig",
                )
            )
            continue
        return value, f"annotation {key}"
    return None


def _naming(annotations: Mapping[str, Any], policy: Policy) -> tuple[str, Mode] | None:
    """The first mode annotation with a mode as its value, and that mode."""
    for key in policy.mode_annotations:
        raw = annotations.get(key)
        if raw is None:
            continue
        value = MODE_ALIASES.get(str(raw).strip().lower())
        if value is not None:
            return key, value
    return None


def _dynamic(annotations: Mapping[str, Any], policy: Policy) -> bool:
    """The first mode annotation with a mode as its value is a dynamic-MIG one saying mig."""
    naming = _naming(annotations, policy)
    return naming is not None and naming[1] == "mig" and naming[0] in policy.dynamic_mig_annotations


def _placed(annotations: Mapping[str, Any], policy: Policy) -> bool:
    """An annotation whose scheduler places mps pods itself says mps: that scheduler reads
    it whatever else the pod says (and the mutation adds gpushare.io/mode beside it)."""
    return any(
        MODE_ALIASES.get(str(annotations.get(key)).strip().lower()) == "mps"
        for key in policy.mps_placed_annotations
        if key in annotations
    )


def named_mode(
    *, annotations: Mapping[str, Any], node_selector: Mapping[str, Any], policy: Policy
) -> Mode | None:
    """The mode a pod's annotation or a nodeSelector the policy maps names, if any,
    before its resources have a say (conflicts are :func:`choose_mode`'s to report)."""
    chosen = _annotated_mode(annotations, policy, [])
    if chosen is not None:
        return chosen[0]
    for s in policy.node_selector_modes:
        if str(node_selector.get(s.key, "\0")) == s.value:
            return s.mode
    return None


def _container_conflicts(
    requests: PodRequests, mode: Mode, source: str, findings: list[Finding], *, dynamic: bool
) -> None:
    """Containers whose resources the pod's mode cannot satisfy, into ``findings``."""
    for request in requests.containers:
        if request.mig and request.shares:
            findings.append(
                Finding(
                    "mode-conflict",
                    f"{request.label}: MIG and shared-GPU resources in one container; keep one",
                )
            )
        elif request.mig and mode != "mig":
            findings.append(
                Finding(
                    "mode-conflict", f"{request.label}: asks for MIG but the pod's mode is {mode}"
                )
            )
        elif request.shares and mode == "mig" and not dynamic:
            findings.append(
                Finding(
                    "mode-conflict",
                    f"{request.label}: shared-GPU resources in a MIG pod; ask for nvidia.com/mig-*",
                )
            )
        elif request.shares and mode == "none" and source != "policy default":
            findings.append(
                Finding("mode-conflict", f"{request.label}: GPU resources but mode none ({source})")
            )


def _placement_conflicts(
    *,
    mode: Mode,
    placed: bool,
    source: str,
    selected: Sequence[NodeSelectorMode],
    node_selector: Mapping[str, Any],
    namespace: str,
    policy: Policy,
    findings: list[Finding],
) -> None:
    """Node selectors that mean another mode, and a mode the namespace may not use,
    into ``findings``."""
    for s in selected:
        if s.mode != mode:
            findings.append(
                Finding(
                    "mode-conflict",
                    f"nodeSelector {s.key}={s.value} means {s.mode} but the mode is {mode} ({source})",
                )
            )
    if mode == "mps" and not placed:
        for key, wanted in policy.mps_node_selector.items():
            have = node_selector.get(key)
            if have is not None and str(have) != wanted:
                findings.append(
                    Finding(
                        "mode-conflict",
                        f'nodeSelector {key}={quoted(have)} but MPS pods need "{wanted}"',
                    )
                )
    if mode != "none" and not policy.mode_allowed(mode, namespace):
        findings.append(
            Finding("mode-conflict", f'namespace "{namespace}" may not use mode {mode} ({source})')
        )


def choose_mode(
    *,
    annotations: Mapping[str, Any],
    node_selector: Mapping[str, Any],
    namespace: str,
    requests: PodRequests,
    policy: Policy,
) -> ModeChoice:
    """The mode of a pod, with mode-conflict findings when it cannot be honoured."""
    if not requests.gpu:
        return ModeChoice(mode="none", source="no GPU request")
    findings: list[Finding] = []
    chosen = _annotated_mode(annotations, policy, findings)
    selected = [
        s for s in policy.node_selector_modes if str(node_selector.get(s.key, "\0")) == s.value
    ]
    if chosen is None and selected:
        chosen = selected[0].mode, f"nodeSelector {selected[0].key}={selected[0].value}"
    named = chosen is not None
    if chosen is None and requests.mig:
        chosen = "mig", "MIG resources"
    if chosen is None:
        for candidate, namespaces in policy.namespace_modes.items():
            if namespace in namespaces:
                chosen = candidate, f"namespace {namespace}"  # type: ignore[assignment]
                break
    mode, source = chosen if chosen is not None else (policy.default_mode, "policy default")
    dynamic = mode == "mig" and named and _dynamic(annotations, policy)
    placed = mode == "mps" and _placed(annotations, policy)
    # Appended to the list rather than yielded: generators cost more than the checks.
    _container_conflicts(requests, mode, source, findings, dynamic=dynamic)
    _placement_conflicts(
        mode=mode,
        placed=placed,
        source=source,
        selected=selected,
        node_selector=node_selector,
        namespace=namespace,
        policy=policy,
        findings=findings,
    )
    return ModeChoice(
        mode=mode,
        source=source,
        findings=findings,
        named=named,
        dynamic=dynamic and requests.sharing,
        placed=placed,
    )
