"""forged-allocation in CEL: a ledger's reserved annotations written, changed or removed by
anyone but its writers.

Held equal to its core twins (:data:`CORE_TWINS`) by the differential tests.
"""

from __future__ import annotations

from typing import Final

from webhook.core import rules as core_rules
from webhook.core.policy import Ledger, Policy
from webhook.render.cel import glob_test
from webhook.render.pod import identity_test

# The core functions this family renders: a rename there breaks the import here.
CORE_TWINS: Final = (core_rules.forged_allocation,)


def _forged_in(ledger: Ledger) -> str:
    """A reserved annotation of ``ledger`` set at create, or added, changed or removed by a
    pod update, by an identity that is not one of its writers."""
    reserved = glob_test("k", ledger.annotations) if ledger.annotations else "false"
    created = f"variables.created && variables.annotations.exists(k, {reserved})"
    new, old = "variables.annotations", "variables.oldAnnotations"
    updated = (
        "variables.podUpdate && ("
        f"{new}.exists(k, ({reserved}) && !(k in {old} && {old}[k] == {new}[k])) || "
        f"{old}.exists(k, ({reserved}) && !(k in {new})))"
    )
    return f"!({identity_test(ledger.writers)}) && (({created}) || ({updated}))"


def forged_allocation(policy: Policy) -> str:
    """forged-allocation: no ledger's annotations touched by anyone but its writers (a key
    several ledgers reserve needs a writer of each, as ``Policy.forbidden_to``)."""
    terms = [_forged_in(ledger) for ledger in policy.ledgers]
    return "!(" + (" || ".join(f"({t})" for t in terms) or "false") + ")"
