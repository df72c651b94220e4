"""The variables every pod policy shares: the pod spec and metadata of the object and the old
one, its containers, each container's class by name, the GPU request and the mode.

Read once per object, so that each rule reads a container's class by name instead of
deriving it again.
"""

from __future__ import annotations

from webhook.core.policy import Policy
from webhook.render.cel import NamedExpression, guarded, strings
from webhook.render.modes import NODE_SELECTOR, annotated_mode, chosen_mode, dynamic_mig, library
from webhook.render.pod import (
    asks_test,
    container_list,
    gpu_resource,
    gpu_test,
    mig_test,
    names_test,
    requests_test,
    sharing_test,
    template,
    vacant,
)
from webhook.render.scheduling import (
    REQUIRED_TERMS,
    keeps_scheduler,
    scheduler_for,
    scheduler_variables,
    served_elsewhere,
)


def _mig(policy: Policy, containers: str) -> str:
    """A MIG instance (``PodRequests.mig``)."""
    return requests_test(policy, containers, mig_test(policy))


def _annotations(meta: str) -> str:
    return f"(has({meta}.annotations) ? {meta}.annotations : {{}})"


def variables(policy: Policy) -> list[NamedExpression]:
    """The pod spec, metadata, containers and GPU request of the object and the old one."""
    pod_update = "request.kind.kind == 'Pod' && request.operation == 'UPDATE' && oldObject != null"
    return [
        {"name": "spec", "expression": template("object", "spec")},
        {"name": "meta", "expression": template("object", "metadata")},
        {"name": "containers", "expression": container_list("variables.spec")},
        {
            "name": "vacant",
            "expression": f"variables.containers.filter(c, {vacant(policy, 'c')}).map(c, c.name)",
        },
        {"name": "gpu", "expression": gpu_test(policy, "variables.containers")},
        # Each container's class, by name, read once (names are unique across a pod's
        # containers, and a pod update changes no container's name or resources, so the
        # old pod's containers are looked up here too, as in variables.vacant).
        {"name": "asking", "expression": _names_of(_asks_for_gpu(policy, "c"))},
        {"name": "slices", "expression": _names_of(_slice(policy, "c"))},
        {"name": "sharers", "expression": _names_of(_shares(policy, "c"))},
        {
            "name": "created",
            "expression": "request.kind.kind != 'Pod' || request.operation == 'CREATE'",
        },
        {"name": "podUpdate", "expression": pod_update},
        {
            "name": "oldSpec",
            "expression": f"{pod_update} ? {guarded('oldObject', ('spec',))} : {{}}",
        },
        {
            "name": "oldMeta",
            "expression": f"{pod_update} ? {guarded('oldObject', ('metadata',))} : {{}}",
        },
        {"name": "oldContainers", "expression": container_list("variables.oldSpec")},
        {"name": "oldGpu", "expression": gpu_test(policy, "variables.oldContainers")},
        {"name": "annotations", "expression": _annotations("variables.meta")},
        {"name": "nodeSelector", "expression": NODE_SELECTOR},
        {"name": "oldAnnotations", "expression": _annotations("variables.oldMeta")},
        {"name": "sharing", "expression": "size(variables.sharers) > 0"},
        {"name": "mig", "expression": _mig(policy, "variables.containers")},
        {"name": "annotatedMode", "expression": annotated_mode(policy)},
        {"name": "chosenMode", "expression": chosen_mode(policy)},
        *scheduler_variables(policy),
        {"name": "scheduler", "expression": scheduler_for(policy)},
        {"name": "dynamicMig", "expression": dynamic_mig(policy)},
        {"name": "nodeTerms", "expression": REQUIRED_TERMS},
        {"name": "servedElsewhere", "expression": served_elsewhere(policy)},
        {"name": "whole", "expression": keeps_scheduler(policy)},
        # A pod that keeps its own scheduler for whole GPUs uses no mode.
        {"name": "mode", "expression": "variables.whole ? 'none' : variables.chosenMode"},
        {"name": "library", "expression": library(policy)},
    ]


def _names_of(test: str) -> str:
    """The names of the object's containers ``c`` that pass ``test``."""
    return f"variables.containers.filter(c, {test}).map(c, c.name)"


def _shares(policy: Policy, c: str) -> str:
    return asks_test(c, sharing_test(policy), policy=policy)


def _asks_for_gpu(policy: Policy, c: str) -> str:
    """``resources.asks_for_gpu`` of container ``c``: a claim, a resource of the policy or
    a MIG instance (unless it is :func:`vacant`), a resource whose name says gpu."""
    gpu = gpu_resource(policy)
    other = f"!({gpu}) && r.lowerAscii().contains('gpu')"
    return (
        f"(has({c}.resources) && has({c}.resources.claims) && size({c}.resources.claims) > 0) "
        f"|| ({asks_test(c, gpu, policy=policy)}) || ({names_test(c, other)})"
    )


def _slice(policy: Policy, c: str) -> str:
    """Container ``c`` asks for part of a GPU (``rules.container_class`` 'slice')."""
    parts = sorted(policy.gpu_resources - policy.priority_resources - policy.whole_gpu_resources)
    listed = [f"r in {strings(parts)}"] if parts else []
    return asks_test(c, " || ".join([*listed, mig_test(policy)]), policy=policy)
