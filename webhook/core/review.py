"""The offline review (the CLI contract): both webhooks on one object, as the apiserver runs them."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any, Final, NotRequired, TypedDict

import jsonpatch

from webhook.core.cluster import ClusterView
from webhook.core.decision import Decision, Excepted, Request, Violation, decide
from webhook.core.policy import Mode, Policy
from webhook.core.wire import PatchOp
from webhook.core.workload import as_mapping, is_inspected

# Deeper than any manifest nests its pod templates; YAML aliases can make a cycle.
_MAX_DEPTH: Final = 32


class ReviewEntry(TypedDict):
    """One object's result of the offline review."""

    kind: str
    namespace: str
    name: str
    allowed: bool
    mode: Mode
    violations: list[Violation]
    # What the policy's exceptions took off (by exception name); only where one did, so
    # the contract's keys stay as DESIGN.md lists them for a policy without exceptions.
    excepted: NotRequired[list[Excepted]]
    warnings: list[str]
    patch: list[PatchOp]
    object: Any


def review_object(
    obj: Mapping[str, Any],
    policy: Policy,
    *,
    namespace: str | None = None,
    username: str = "",
    groups: Sequence[str] = (),
    operation: str = "CREATE",
    cluster: ClusterView | None = None,
    today: str = "",
) -> ReviewEntry:
    """Mutate, then validate the mutated object: both webhooks, as the apiserver runs them
    (against ``cluster`` when given, as ``serve --cluster`` does), on ``today``."""
    metadata = as_mapping(obj.get("metadata"))
    kind = str(obj.get("kind") or "")
    ns = namespace or str(metadata.get("namespace") or "default")
    request = Request(
        kind=kind,
        operation=operation,
        namespace=ns,
        username=username,
        groups=tuple(groups),
        today=today,
    )
    mutated = decide(obj, request, policy, phase="mutate", cluster=cluster)
    final: Any = obj
    if mutated.patch:
        final = jsonpatch.apply_patch(copy.deepcopy(dict(obj)), mutated.patch)
    validated = (
        decide(final, request, policy, phase="validate", cluster=cluster)
        if mutated.allowed
        else Decision()
    )
    violations = list(mutated.violations)
    for violation in validated.violations:
        if violation not in violations:
            violations.append(violation)
    warnings = list(dict.fromkeys([*mutated.warnings, *validated.warnings]))
    excepted = list(mutated.excepted)
    excepted.extend(e for e in validated.excepted if e not in excepted)
    if not is_inspected(kind) and _names_gpu_resources(obj, policy, depth=_MAX_DEPTH):
        # Allowed here says nothing about the pods: a newcomer must not read it as a pass.
        warnings.append(f"kind {kind} is not inspected: its pods are judged when they are created")
    entry: ReviewEntry = {
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
    if excepted:
        entry["excepted"] = excepted
    return entry


def _names_gpu_resources(node: Any, policy: Policy, *, depth: int) -> bool:
    """Whether a ``limits`` or ``requests`` mapping anywhere in ``node`` names a GPU
    resource of ``policy``: how a custom resource's pod templates ask for a GPU."""
    if depth <= 0:
        return False
    if isinstance(node, Mapping):
        for key, value in node.items():
            if (
                key in ("limits", "requests")
                and isinstance(value, Mapping)
                and any(isinstance(name, str) and policy.is_gpu_resource(name) for name in value)
            ):
                return True
            if _names_gpu_resources(value, policy, depth=depth - 1):
                return True
    elif isinstance(node, list):
        return any(_names_gpu_resources(item, policy, depth=depth - 1) for item in node)
    return False
