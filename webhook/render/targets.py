"""What an install renders into the apiserver: one list of targets, each a kind of admission
policy with its binding, the names it may render and the function that renders them.

``reconcile``, ``uninstall`` and ``manifests`` loop over :data:`TARGETS`, so a kind the
install adds is kept current, removed and rewritten alike.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Final

from webhook.core.policy import Policy
from webhook.render import mutating, validating
from webhook.render.pod import Obj


@dataclass(frozen=True, slots=True)
class Target:
    """One kind of admission policy and its binding, as the install renders them."""

    # The API's word for the kind ("validating" admission policy): the client's calls
    # and the resources are named after it.
    family: str
    policy_kind: str
    binding_kind: str
    # Every name the policies and bindings may take, whatever the policy: the install's
    # RBAC and uninstall reach these and no other.
    names: tuple[str, ...]
    # (policy, *, namespace=..., today=...) -> the policies and their bindings, with the
    # policy's exceptions as they stand on today (an ISO day).
    render: Callable[..., list[Obj]]

    @property
    def kinds(self) -> tuple[str, str]:
        return (self.policy_kind, self.binding_kind)

    @property
    def policy_resource(self) -> str:
        return f"{self.family}admissionpolicies"

    @property
    def binding_resource(self) -> str:
        return f"{self.family}admissionpolicybindings"


VALIDATING: Final = Target(
    "validating",
    validating.POLICY_KIND,
    validating.BINDING_KIND,
    tuple(validating.POLICY_NAMES),
    validating.validating_policies,
)


def _mutating(policy: Policy, *, namespace: str = "gpushare-system", today: str = "") -> list[Obj]:
    # An exception takes a rule's findings off, never the mutation: the day changes nothing.
    return mutating.mutating_policies(policy, namespace=namespace)


# Served from Kubernetes 1.36 (webhook.install.mode).
MUTATING: Final = Target(
    "mutating",
    mutating.POLICY_KIND,
    mutating.BINDING_KIND,
    tuple(mutating.POLICY_NAMES),
    _mutating,
)
TARGETS: Final = (VALIDATING, MUTATING)
