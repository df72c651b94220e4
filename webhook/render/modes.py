"""The pod's sharing mode in CEL, chosen as the core chooses it (mode annotations, node
selectors, MIG resources, the namespace's mode, the default), HAMi-core's library per
mode, and mode-conflict.

Held equal to its core twins (:data:`CORE_TWINS`) by the differential tests.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from webhook.core import mode as core_mode
from webhook.core import rules as core_rules
from webhook.core.mode import MODE_ALIASES
from webhook.core.policy import MODES, Policy
from webhook.render.cel import NamedExpression, glob_test, literal, strings, stripped_in
from webhook.render.pod import asks_test, mig_test, shares, sharing_test

# The core functions this family renders: a rename there breaks the import here.
CORE_TWINS: Final = (core_mode.choose_mode, core_mode.named_mode, core_rules.mps_percentage)

# The pod's nodeSelector, {} where it has none (``variables.nodeSelector``).
NODE_SELECTOR: Final = "has(variables.spec.nodeSelector) ? variables.spec.nodeSelector : {}"
SELECTOR: Final = "variables.nodeSelector"


def selects(key: str, value: str) -> str:
    """The pod's nodeSelector holds ``key`` as ``value`` (the core compares as text)."""
    return f"{literal(key)} in {SELECTOR} && string({SELECTOR}[{literal(key)}]) == {literal(value)}"


def annotated_mode(policy: Policy) -> str:
    """The mode the first mode annotation with a mode as its value names, '' where none
    does (``variables.annotatedMode``): each annotation's value is read once, and its
    meanings tried in order."""
    words: dict[str, list[str]] = {}
    for word, mode in MODE_ALIASES.items():
        words.setdefault(mode, []).append(word)
    ann = "variables.annotations"
    expression = "''"
    for key in reversed(policy.mode_annotations):
        meaning = "''"
        for named_mode, spelled in reversed(words.items()):
            meaning = f"{stripped_in('v', spelled)} ? {literal(named_mode)} : {meaning}"
        named = (
            f"({literal(key)} in {ann} ? [string({ann}[{literal(key)}])].map(v, {meaning})[0] : '')"
        )
        expression = (
            named if expression == "''" else f"[{named}].map(m, m != '' ? m : {expression})[0]"
        )
    return expression


def named_steps(policy: Policy) -> list[tuple[str, str]]:
    """(condition, mode) of the steps that name a mode (``ModeChoice.named``): a mode
    annotation with a mode as its value (:func:`annotated_mode`), each node selector of a
    mode."""
    steps: list[tuple[str, str]] = []
    if policy.mode_annotations:
        steps.append(("variables.annotatedMode != ''", "variables.annotatedMode"))
    for s in policy.node_selector_modes:
        steps.append((selects(s.key, s.value), literal(s.mode)))
    return steps


def mode_steps(policy: Policy) -> list[tuple[str, str]]:
    """(condition, mode) in the order :func:`webhook.core.mode.choose_mode` tries them: the
    :func:`named_steps`, MIG resources, the namespace's mode."""
    steps = named_steps(policy)
    steps.append(("variables.mig", "'mig'"))
    for mode, namespaces in policy.namespace_modes.items():
        steps.append((f"request.namespace in {strings(namespaces)}", literal(mode)))
    return steps


def chosen_mode(policy: Policy) -> str:
    """The pod's mode as :func:`webhook.core.mode.choose_mode` picks it: the first of
    :func:`mode_steps` that holds, else the policy's default."""
    expression = literal(policy.default_mode)
    for condition, mode in reversed(mode_steps(policy)):
        expression = f"({condition}) ? {mode} : ({expression})"
    return expression


def library(policy: Policy) -> str:
    """``Policy.library_for`` of a vgpu pod (true in other modes): it asks for a sharing
    resource that vgpu.withoutLibrary does not list."""
    if not policy.without_library:
        return "true"
    served = asks_test(
        "c",
        f"({sharing_test(policy)}) && !(r in {strings(sorted(policy.without_library))})",
        policy=policy,
    )
    return f"variables.mode != 'vgpu' || variables.containers.exists(c, {served})"


def placed_mps(policy: Policy) -> str:
    """``ModeChoice.placed``: an annotation of mps.placedByAnnotations says mps (its
    scheduler places the pod by the card's mode; no mps.nodeSelector)."""
    ann = "variables.annotations"
    words = [w for w, m in MODE_ALIASES.items() if m == "mps"]
    terms = [
        f"({literal(key)} in {ann} && {stripped_in(f'string({ann}[{literal(key)}])', words)})"
        for key in sorted(policy.mps_placed_annotations)
    ]
    return f"({' || '.join(terms)})" if terms else "false"


def dynamic_mig(policy: Policy) -> str:
    """``ModeChoice.dynamic``: the first mode annotation with a mode as its value is one of
    the policy's dynamicMigAnnotations and says mig, in a pod that asks for a slice."""
    ann = "variables.annotations"
    expression = "false"
    for key in reversed(policy.mode_annotations):
        value = f"string({ann}[{literal(key)}])"
        says = stripped_in(value, [w for w, m in MODE_ALIASES.items() if m == "mig"])
        dynamic = says if key in policy.dynamic_mig_annotations else "false"
        expression = (
            f"({literal(key)} in {ann} && {stripped_in(value, MODE_ALIASES)}) ? {dynamic} : "
            f"({expression})"
        )
    return f"variables.sharing && variables.chosenMode == 'mig' && ({expression})"


def _allowed_in_namespace(patterns: Iterable[str]) -> str:
    """``Policy.mode_allowed`` for the request's namespace (``match_any``)."""
    patterns = list(patterns)
    return "true" if "*" in patterns else glob_test("request.namespace", patterns)


def _conflicts(policy: Policy) -> dict[str, str]:
    """``mode.choose_mode``'s findings and ``rules.mps_percentage`` by name: a mode
    annotation whose value is no mode (before the first that is one), containers the mode
    cannot satisfy, node selectors of another mode, an MPS node selector with another
    value, a mode the namespace may not use, and an mps container asking for memory as a
    percentage (only the cluster view turns it into MiB; without it, refused)."""
    mode, ann = "variables.mode", "variables.annotations"
    misspelt = "false"
    for key in reversed(policy.mode_annotations):
        value = stripped_in(f"string({ann}[{literal(key)}])", MODE_ALIASES)
        misspelt = f"({literal(key)} in {ann} ? !({value}) : ({misspelt}))"
    named = f"!({' || '.join(f'({c})' for c, _ in mode_steps(policy))})"
    unnamed = f" && {named}" if policy.default_mode == "none" else ""
    mig, sharer = asks_test("c", mig_test(policy), policy=policy), shares(policy, "c")
    containers = (
        f"variables.containers.exists(c, [{mig}].exists(mig, [{sharer}].exists(shares, "
        f"(mig && (shares || {mode} != 'mig')) || "
        f"(shares && (({mode} == 'mig' && !variables.dynamicMig) || ({mode} == 'none'{unnamed}))))))"
    )
    selectors = [
        f"{selects(s.key, s.value)} && {mode} != {literal(s.mode)}"
        for s in policy.node_selector_modes
    ]
    for key, wanted in policy.mps_node_selector.items():
        selectors.append(
            f"{mode} == 'mps' && !{placed_mps(policy)} && {literal(key)} in {SELECTOR} && "
            f"string({SELECTOR}[{literal(key)}]) != {literal(wanted)}"
        )
    allowed = " || ".join(
        f"({mode} == {literal(m)} && "
        f"({_allowed_in_namespace(policy.allowed_namespaces.get(m, ()))}))"
        for m in MODES
    )
    conflicts = {
        "misspeltMode": misspelt,
        "unsatisfiedContainer": containers,
    }
    if selectors:
        conflicts["otherModeSelector"] = " || ".join(f"({t})" for t in selectors)
    conflicts["modeNotAllowed"] = f"{mode} != 'none' && !({allowed})"
    if policy.memory_percentage_resources:
        conflicts["mpsPercentage"] = (
            f"{mode} == 'mps' && variables.asks.exists(a, a['pct'] > 0 && a['m'] == 0)"
        )
    return conflicts


# The findings of :func:`_conflicts` held in variables (the longest); the others are read
# in place, as each variable the apiserver evaluates costs an evaluation of its own.
_NAMED_CONFLICTS: Final = ("misspeltMode", "unsatisfiedContainer")


def conflict_variables(policy: Policy) -> list[NamedExpression]:
    """What mode-conflict reads: its longest findings (:func:`_conflicts`)."""
    return [
        {"name": name, "expression": e}
        for name, e in _conflicts(policy).items()
        if name in _NAMED_CONFLICTS
    ]


def mode_conflict(policy: Policy) -> str:
    """mode-conflict: one of its findings (:func:`_conflicts`) holds. A pod that keeps its
    scheduler for whole GPUs uses no mode (the core drops the choice's findings)."""
    found = " || ".join(
        f"variables.{name}" if name in _NAMED_CONFLICTS else f"({e})"
        for name, e in _conflicts(policy).items()
    )
    return f"!(variables.created && variables.gpu && !variables.whole && ({found}))"
