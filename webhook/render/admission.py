"""What every rendered admission object shares: its API version, labels, names, the
resources it matches, the policy's exemptions as matchConditions, and the wire shapes of
the policies' specs (the fields this renderer writes).
"""

from __future__ import annotations

from typing import Any, Final, Literal, Required, TypedDict

from webhook.core.policy import Policy
from webhook.render.cel import NamedExpression, glob_test, printed
from webhook.render.pod import Obj, identity_test

API_VERSION: Final = "admissionregistration.k8s.io/v1"


FailurePolicy = Literal["Fail", "Ignore"]


class Validation(TypedDict, total=False):
    """A ValidatingAdmissionPolicy's validation."""

    expression: Required[str]
    message: str
    messageExpression: str
    reason: str


class AuditAnnotation(TypedDict):
    key: str
    valueExpression: str


class ValidatingSpec(TypedDict, total=False):
    failurePolicy: Required[FailurePolicy]
    matchConstraints: Required[Obj]
    matchConditions: list[NamedExpression]
    variables: list[NamedExpression]
    validations: Required[list[Validation]]
    auditAnnotations: list[AuditAnnotation]


class PatchExpression(TypedDict):
    expression: str


class Mutation(TypedDict):
    """A MutatingAdmissionPolicy's mutation: this renderer writes JSONPatch ones only."""

    patchType: Literal["JSONPatch"]
    jsonPatch: PatchExpression


class MutatingSpec(TypedDict):
    failurePolicy: FailurePolicy
    matchConstraints: Obj
    matchConditions: list[NamedExpression]
    reinvocationPolicy: Literal["IfNeeded", "Never"]
    variables: list[NamedExpression]
    mutations: list[Mutation]


NAME_PREFIX: Final = "gpushare-"


SYSTEM_NAMESPACES: Final = ("kube-system", "gpushare-system")


LABELS: Final = {
    "app.kubernetes.io/name": "gpushare-webhook",
    "app.kubernetes.io/part-of": "gpushare",
}


_RESOURCE_RULES: Final = (
    ("", "replicationcontrollers"),
    ("apps", "deployments"),
    ("apps", "statefulsets"),
    ("apps", "daemonsets"),
    ("apps", "replicasets"),
    ("batch", "jobs"),
    ("batch", "cronjobs"),
)


def exemption_conditions(policy: Policy) -> list[NamedExpression]:
    """The policy's exemptions: an exempt namespace or identity is not judged."""
    conditions: list[NamedExpression] = []
    if policy.exempt_namespaces:
        conditions.append(
            {
                "name": "gpushare.io/namespace-not-exempt",
                "expression": f"!({glob_test('request.namespace', policy.exempt_namespaces)})",
            }
        )
    exempt = policy.exempt
    if exempt.users or exempt.groups or exempt.service_accounts:
        conditions.append(
            {"name": "gpushare.io/user-not-exempt", "expression": f"!({identity_test(exempt)})"}
        )
    return conditions


def match_constraints(namespace: str = SYSTEM_NAMESPACES[1]) -> Obj:
    rules: list[Obj] = [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            # kubectl debug adds ephemeral containers through the subresource.
            "resources": ["pods", "pods/ephemeralcontainers"],
            "operations": ["CREATE", "UPDATE"],
            "scope": "Namespaced",
        }
    ]
    for group, resource in _RESOURCE_RULES:
        rules.append(
            {
                "apiGroups": [group],
                "apiVersions": ["v1"],
                "resources": [resource],
                "operations": ["CREATE", "UPDATE"],
                "scope": "Namespaced",
            }
        )
    return {
        "matchPolicy": "Equivalent",
        "namespaceSelector": {
            "matchExpressions": [
                {
                    "key": "kubernetes.io/metadata.name",
                    "operator": "NotIn",
                    "values": [SYSTEM_NAMESPACES[0], namespace],
                }
            ]
        },
        "resourceRules": rules,
    }


# Where the MutatingAdmissionPolicy records what it replaced (a memory limit, an SM limit,
# a switch, an MPS value the pod set): one line each, in the core's redacted words. On
# 1.36 the apiserver runs the MutatingAdmissionPolicies before the
# ValidatingAdmissionPolicies (kubernetes/kubernetes pkg/kubeapiserver/options/plugins.go
# AllOrderedPlugins, lines 114-117 @ 008b3652), and a validation sees only the object
# after every mutation: ``oldObject`` is null on a create and ``request`` carries no object
# (k8s.io/apiserver admission/plugin/cel CreateAdmissionRequest). A MutatingAdmissionPolicy
# has no warnings, but it evaluates its mutations in order on the object as each leaves it
# (staging/src/k8s.io/apiserver/pkg/admission/plugin/policy/mutating/dispatcher.go:181-193
# @ 072a6776, each through dispatchOne, which ends in versionedAttributes.UpdateObject):
# its first mutation reads the object as it came and writes this annotation, which the
# gpushare-overrides policy turns into warnings.
OVERRIDES_ANNOTATION: Final = "gpushare.io/overridden"


# ... and a label of the same key: the policy's objectSelector, which the apiserver
# matches before any CEL (admission/plugin/policy/generic/policy_dispatcher.go @ 072a6776,
# Dispatch: DefinitionMatches and BindingMatches, then the evaluator), so a pod without it
# pays nothing for the policy.
OVERRIDES_LABEL_VALUE: Final = "true"


# The fields of admission objects that hold CEL.
CEL_FIELDS: Final = ("expression", "messageExpression", "valueExpression")


def readable(objects: list[Obj]) -> list[Obj]:
    """``objects`` with every CEL field broken into lines (:func:`~webhook.render.cel.printed`):
    the same CEL, for people to read."""
    return [_readable(obj) for obj in objects]


def _readable(value: Any) -> Any:
    if isinstance(value, dict):
        return {
            k: printed(v) if k in CEL_FIELDS and isinstance(v, str) else _readable(v)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [_readable(v) for v in value]
    return value
