"""The offline review (the CLI contract): both webhooks on one object, as the apiserver runs them."""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any, TypedDict

import jsonpatch

from webhook.core.decision import Decision, Request, Violation, decide
from webhook.core.policy import Mode, Policy
from webhook.core.wire import PatchOp
from webhook.core.workload import as_mapping


class ReviewEntry(TypedDict):
    """One object's result of the offline review."""

    kind: str
    namespace: str
    name: str
    allowed: bool
    mode: Mode
    violations: list[Violation]
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
