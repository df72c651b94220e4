"""The scheduler a sharing pod must name (``Policy.scheduler_for``), whole GPUs that keep
their own scheduler and the sharing pool they stay away from, and scheduler-bypass.

Held equal to its core twins (:data:`CORE_TWINS`) by the differential tests.
"""

from __future__ import annotations

import re
from typing import Final

from webhook.core import rules as core_rules
from webhook.core import whole as core_whole
from webhook.core.policy import DEFAULT_SCHEDULER, Policy
from webhook.render.cel import NamedExpression, glob_test, literal, strings
from webhook.render.modes import SELECTOR, named_steps, selects
from webhook.render.pod import asks_test, mig_test

# The core functions this family renders: a rename there breaks the import here.
CORE_TWINS: Final = (
    core_whole.keeps_scheduler,
    core_whole.served_elsewhere,
    core_whole.pool_selection,
    core_rules.scheduler_bypass,
)

_SCHEDULER: Final = "variables.spec.schedulerName"


def keeps_scheduler(policy: Policy) -> str:
    """``whole.keeps_scheduler``: only whole-GPU resources, no mode named, and a
    schedulerName that is not the cluster's own, the sharing one or an allowed one; under
    the cluster's own, whole GPUs another stack serves (:func:`_served_elsewhere`)."""
    if not policy.whole_gpu_resources:
        return "false"
    gpu = f"r in {strings(sorted(policy.gpu_resources))} || {mig_test(policy)}"
    other = asks_test(
        "c", f"!(r in {strings(sorted(policy.whole_gpu_resources))}) && ({gpu})", policy=policy
    )
    named = " || ".join(f"({c})" for c, _ in named_steps(policy)) or "false"
    default = f"!has({_SCHEDULER}) || {_SCHEDULER} in {strings(['', DEFAULT_SCHEDULER])}"
    own = (
        f"!({_SCHEDULER} in {strings(sorted(policy.allowed_schedulers))}) && "
        f"{_SCHEDULER} != ({wanted_scheduler(policy)})"
    )
    return (
        f"variables.sharing && !variables.containers.exists(c, {other}) && !({named}) && "
        f"(({default}) ? variables.servedElsewhere : ({own}))"
    )


def served_elsewhere(policy: Policy) -> str:
    """``whole.served_elsewhere`` of a pod that asks only for whole GPUs: each is one of
    wholeGpus.draResources, or the pod selects a pool of wholeGpus.otherPools."""
    terms = []
    if policy.dra_resources:
        gpu = f"r in {strings(sorted(policy.gpu_resources))} || {mig_test(policy)}"
        outside = f"({gpu}) && !(r in {strings(sorted(policy.dra_resources))})"
        terms.append(f"!variables.containers.exists(c, {asks_test('c', outside, policy=policy)})")
    for key, value in policy.other_pools:
        terms.append(
            f"{literal(key)} in {SELECTOR} && "
            f"({glob_test(f'string({SELECTOR}[{literal(key)}])', [value])})"
        )
        terms.append(
            f"{NODE_TERMS}.exists(t, has(t.matchExpressions) && t.matchExpressions.exists(e, "
            f"e.key == {literal(key)} && e.operator == 'In' && has(e.values) && "
            f"e.values.exists(v, {glob_test('v', [value])})))"
        )
    return " || ".join(f"({t})" for t in terms) or "false"


_REQUIRED: Final = "requiredDuringSchedulingIgnoredDuringExecution"


# The pod's required nodeSelectorTerms, [] where a level is missing
# (``variables.nodeTerms``).
REQUIRED_TERMS: Final = (
    "has(variables.spec.affinity) && has(variables.spec.affinity.nodeAffinity) && "
    f"has(variables.spec.affinity.nodeAffinity.{_REQUIRED}) && "
    f"has(variables.spec.affinity.nodeAffinity.{_REQUIRED}.nodeSelectorTerms) ? "
    f"variables.spec.affinity.nodeAffinity.{_REQUIRED}.nodeSelectorTerms : []"
)
NODE_TERMS: Final = "variables.nodeTerms"


def holds_requirement(term: str, key: str, operator: str, value: str) -> str:
    """The nodeSelectorTerm ``term`` has the requirement ``key operator [value]`` (for In,
    among its values; for NotIn, exactly)."""
    values = (
        f"{literal(value)} in e.values" if operator == "In" else f"e.values == [{literal(value)}]"
    )
    return (
        f"has({term}.matchExpressions) && {term}.matchExpressions.exists(e, "
        f"e.key == {literal(key)} && e.operator == {literal(operator)} && has(e.values) && {values})"
    )


def _pool_selected(policy: Policy) -> str:
    """``whole.pool_selection`` finds something: the nodeSelector, or a required term
    ``In`` a pool label's value."""
    terms = [selects(key, value) for key, value in policy.sharing_pool]
    terms.extend(
        f"{NODE_TERMS}.exists(t, {holds_requirement('t', key, 'In', value)})"
        for key, value in policy.sharing_pool
    )
    return " || ".join(f"({t})" for t in terms) or "false"


def off_pool(policy: Policy) -> str:
    """The pod holds what ``mutation._pool_ops`` adds: every required term NotIn each pool
    label."""
    if not policy.sharing_pool:
        return "true"
    each = " && ".join(
        f"({holds_requirement('t', key, 'NotIn', value)})" for key, value in policy.sharing_pool
    )
    return f"size({NODE_TERMS}) > 0 && {NODE_TERMS}.all(t, {each})"


def wanted_scheduler(policy: Policy) -> str:
    """``Policy.scheduler_for`` of a sharing pod (``variables.scheduler``)."""
    return "variables.scheduler"


def _resources_by_scheduler(policy: Policy) -> dict[str, list[str]]:
    by_scheduler: dict[str, list[str]] = {}
    for resource, scheduler in policy.resource_schedulers.items():
        by_scheduler.setdefault(scheduler, []).append(resource)
    return by_scheduler


def beyond_name(scheduler: str, taken: set[str]) -> str:
    """The variable holding whether the pod asks for GPUs ``scheduler`` does not account
    for (``beyondHamiScheduler``), unlike any name in ``taken``."""
    words = re.split(r"[^A-Za-z0-9]+", scheduler)
    name = "beyond" + "".join(w[:1].upper() + w[1:] for w in words)
    unique, i = name, 2
    while unique in taken:
        unique, i = f"{name}{i}", i + 1
    taken.add(unique)
    return unique


def scheduler_variables(policy: Policy) -> list[NamedExpression]:
    """Per scheduler of the policy's resourceSchedulers, whether a container asks for GPUs
    it does not account for: a slice not listed for it, or a count resource not listed for
    it without slices of its own vendor beside it (``Policy.scheduling_resources``)."""
    sharing = sorted(r for r in policy.gpu_resources if not r.startswith(policy.mig_prefixes))
    slices = [r for r in sharing if r not in policy.count_resources]
    found: list[NamedExpression] = []
    taken: set[str] = set()
    for scheduler, resources in sorted(_resources_by_scheduler(policy).items()):
        terms = []
        other_slices = [r for r in slices if r not in resources]
        if other_slices:
            terms.append(asks_test("c", f"r in {strings(other_slices)}", policy=policy))
        for count in sharing:
            if count not in policy.count_resources or count in resources:
                continue
            term = asks_test("c", f"r == {literal(count)}", policy=policy)
            own = [r for r in slices if count.startswith(r.split("/", 1)[0] + "/")]
            if own:
                term += f" && !({asks_test('c', f'r in {strings(own)}', policy=policy)})"
            terms.append(term)
        other = " || ".join(f"({t})" for t in terms) or "false"
        found.append(
            {
                "name": beyond_name(scheduler, taken),
                "expression": f"variables.containers.exists(c, {other})",
            }
        )
    return found


def scheduler_for(policy: Policy) -> str:
    """``Policy.scheduler_for`` of a sharing pod: a resource's scheduler when every
    sharing resource the pod asks for is listed for that scheduler
    (:func:`scheduler_variables`), else its mode's (``variables.chosenMode``, chosen as the
    core chooses it), else the policy's."""
    expression = literal(policy.scheduler_name)
    for mode, scheduler in sorted(policy.mode_schedulers.items(), reverse=True):
        expression = (
            f"variables.chosenMode == {literal(mode)} ? {literal(scheduler)} : ({expression})"
        )
    schedulers = sorted(_resources_by_scheduler(policy))
    beyond = {v["name"]: s for v, s in zip(scheduler_variables(policy), schedulers, strict=True)}
    for name, scheduler in reversed(beyond.items()):
        expression = f"!variables.{name} ? {literal(scheduler)} : ({expression})"
    return expression


def scheduler_bypass(policy: Policy) -> str:
    name = "variables.spec.schedulerName"
    if policy.resource_schedulers or policy.mode_schedulers:
        static = {"", DEFAULT_SCHEDULER, *policy.allowed_schedulers}
        allowed = f"{name} in {strings(sorted(static))} || {name} == ({wanted_scheduler(policy)})"
    else:
        static = {"", DEFAULT_SCHEDULER, policy.scheduler_name, *policy.allowed_schedulers}
        allowed = f"{name} in {strings(sorted(static))}"
    kept = f"!(variables.created && variables.whole && ({_pool_selected(policy)}))"
    return (
        "!(variables.created && (variables.mode in ['vgpu', 'mps'] || variables.dynamicMig) && "
        f"variables.sharing && has({name}) && !({allowed})) && {kept}"
    )
