"""Choosing a pod's sharing mode: annotation, nodeSelector, namespace, resources, default."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from webhook.core.policy import Mode, Policy
from webhook.core.resources import Finding, PodRequests

# Values other projects write for the same modes (HAMi's nvidia.com/vgpu-mode: hami-core).
_ALIASES: Final[Mapping[str, Mode]] = {
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
    mode: Mode | None = None
    source = ""
    for key in policy.mode_annotations:
        raw = annotations.get(key)
        if raw is None:
            continue
        value = _ALIASES.get(str(raw).strip().lower())
        if value is None:
            findings.append(
                Finding(
                    "mode-conflict", f'annotation {key} "{raw}" is not a mode; use vgpu, mps or mig'
                )
            )
            continue
        mode, source = value, f"annotation {key}"
        break
    selected = [
        s for s in policy.node_selector_modes if str(node_selector.get(s.key, "\0")) == s.value
    ]
    if mode is None and selected:
        mode, source = selected[0].mode, f"nodeSelector {selected[0].key}={selected[0].value}"
    if mode is None and requests.mig:
        mode, source = "mig", "MIG resources"
    if mode is None:
        for candidate, namespaces in policy.namespace_modes.items():
            if namespace in namespaces:
                mode, source = candidate, f"namespace {namespace}"  # type: ignore[assignment]
                break
    if mode is None:
        mode, source = policy.default_mode, "policy default"

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
        elif request.shares and mode == "mig":
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
    for s in selected:
        if s.mode != mode:
            findings.append(
                Finding(
                    "mode-conflict",
                    f"nodeSelector {s.key}={s.value} means {s.mode} but the mode is {mode} ({source})",
                )
            )
    if mode == "mps":
        for key, wanted in policy.mps_node_selector.items():
            have = node_selector.get(key)
            if have is not None and str(have) != wanted:
                findings.append(
                    Finding(
                        "mode-conflict", f'nodeSelector {key}="{have}" but MPS pods need "{wanted}"'
                    )
                )
    if mode != "none" and not policy.mode_allowed(mode, namespace):
        findings.append(
            Finding("mode-conflict", f'namespace "{namespace}" may not use mode {mode} ({source})')
        )
    return ModeChoice(mode=mode, source=source, findings=findings)
