"""The policy's exceptions in CEL: a rule taken off for some namespaces or requesters.

Held equal to its core twin (:data:`CORE_TWINS`) by the differential tests. The
apiserver's CEL has no clock: an exception is rendered as it stands on the day the
policies are rendered (``today``), so one past its last day is left out then, and one
with a last day stays in the apiserver until they are rendered again.
"""

from __future__ import annotations

from typing import Final

from webhook.core.policy import Policy, PolicyException
from webhook.render.cel import glob_test
from webhook.render.pod import identity_test

# The core function this renders: a rename there breaks the import here.
CORE_TWINS: Final = (PolicyException.covers,)


def excepted(policy: Policy, rule: str, *, today: str) -> str | None:
    """The request is one an exception of the policy takes ``rule`` off for
    (``Policy.exception_for``), or None where none can be."""
    terms = []
    for exception in policy.exceptions:
        if rule not in exception.rules or exception.expired(today):
            continue
        scope = []
        if exception.namespaces:
            scope.append(glob_test("request.namespace", exception.namespaces))
        who = exception.requesters
        if who.users or who.groups or who.service_accounts:
            scope.append(identity_test(who))
        terms.append(" && ".join(f"({t})" for t in scope))
    return " || ".join(f"({t})" for t in terms) or None


def unless_excepted(policy: Policy, rule: str, expression: str, *, today: str) -> str:
    """``expression`` (true: admitted), or true where an exception takes ``rule`` off."""
    exception = excepted(policy, rule, today=today)
    return expression if exception is None else f"({exception}) || ({expression})"
