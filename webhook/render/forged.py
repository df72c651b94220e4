"""forged-allocation in CEL: a ledger's reserved annotations written, changed or removed by
anyone but its writers.

Held equal to its core twins (:data:`CORE_TWINS`) by the differential tests.
"""

from __future__ import annotations

from typing import Final

from webhook.core import rules as core_rules
from webhook.core.policy import Ledger, Policy
from webhook.render.cel import NamedExpression, glob_test
from webhook.render.pod import identity_test

# The core functions this family renders: a rename there breaks the import here.
CORE_TWINS: Final = (core_rules.forged_allocation,)


def touched_annotations() -> str:
    """The annotation keys this request writes: every key of a created pod or template,
    and those a pod update adds, changes or removes (none on a workload update)."""
    new, old = "variables.annotations", "variables.oldAnnotations"
    return (
        f"variables.created ? {new}.map(k, k) : variables.podUpdate ? "
        f"{new}.filter(k, !(k in {old} && {old}[k] == {new}[k])) + "
        f"{old}.filter(k, !(k in {new})) : []"
    )


def forged_variables(policy: Policy) -> list[NamedExpression]:
    """What forged-allocation reads: the keys this request touched, once for every ledger."""
    return [{"name": "touchedAnnotations", "expression": touched_annotations()}]


def _forged_in(ledger: Ledger) -> str:
    """A reserved annotation of ``ledger`` set at create, or added, changed or removed by a
    pod update, by an identity that is not one of its writers."""
    reserved = glob_test("k", ledger.annotations) if ledger.annotations else "false"
    return (
        f"!({identity_test(ledger.writers)}) && variables.touchedAnnotations.exists(k, {reserved})"
    )


def forged_allocation(policy: Policy) -> str:
    """forged-allocation: no ledger's annotations touched by anyone but its writers (a key
    several ledgers reserve needs a writer of each, as ``Policy.forbidden_to``)."""
    terms = [_forged_in(ledger) for ledger in policy.ledgers]
    return "!(" + (" || ".join(f"({t})" for t in terms) or "false") + ")"
