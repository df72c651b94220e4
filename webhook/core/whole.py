"""Pods that ask only for whole GPUs under a scheduler of their own.

KAI Scheduler's pods, Volcano's gang jobs and the pods the Kubeflow and KubeRay
operators give a gang scheduler ask for ``nvidia.com/gpu: N`` and name their own
scheduler. Whole GPUs take nothing from the sharing ledger as long as they never land
on a node whose cards are shared: such a pod keeps its scheduler, gets nothing of a
slice injected (mode ``none``), and the mutation adds a required node affinity away
from the policy's sharing pool (``wholeGpus.sharingPool``), which
``unmutated-gpu-pod`` then requires. What asks for a slice (memory, cores, a mode
named by annotation or nodeSelector) under another scheduler stays
``scheduler-bypass``, and so does a whole-GPU pod that selects the pool anyway.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any, Final

from webhook.core.mode import ModeChoice
from webhook.core.policy import DEFAULT_SCHEDULER, Policy, match_any
from webhook.core.resources import PodRequests
from webhook.core.workload import MAPPINGS, as_mapping

REQUIRED: Final = "requiredDuringSchedulingIgnoredDuringExecution"


def asks_whole(requests: PodRequests, policy: Policy) -> bool:
    """Every GPU resource the pod asks for is a whole-GPU count (no slice, no MIG)."""
    if not requests.containers or not policy.whole_gpu_resources:
        return False
    whole = policy.whole_gpu_resources
    for request in requests.containers:
        if request.mig:
            return False
        for resource in request.sharing_resources:
            if resource not in whole:
                return False
    return True


def keeps_scheduler(
    spec: Mapping[str, Any], requests: PodRequests, choice: ModeChoice, policy: Policy
) -> bool:
    """The pod asks only for whole GPUs, names no mode, and names a scheduler that is
    neither the cluster's own, the sharing one, nor one the policy allows: it keeps it.
    Under the cluster's own scheduler (named or not) it keeps it where its whole GPUs are
    another stack's (:func:`served_elsewhere`)."""
    if choice.named or not asks_whole(requests, policy):
        return False
    scheduler = spec.get("schedulerName")
    if scheduler is None or scheduler in ("", DEFAULT_SCHEDULER):
        return served_elsewhere(spec, requests, policy)
    if not isinstance(scheduler, str) or scheduler in policy.allowed_schedulers:
        return False
    return scheduler != policy.scheduler_for(requests, mode=choice.mode)


def served_elsewhere(spec: Mapping[str, Any], requests: PodRequests, policy: Policy) -> bool:
    """Another stack serves the pod's whole GPUs: each is a resource a DeviceClass serves
    through DRA (``wholeGpus.draResources``), or the pod selects a pool of
    ``wholeGpus.otherPools`` (MIG's single strategy: GFD labels such nodes
    nvidia.com/mig.strategy=single and their product <model>-MIG-<profile>)."""
    if policy.dra_resources and all(
        set(request.sharing_resources) <= policy.dra_resources for request in requests.containers
    ):
        return True
    return other_pool_selection(spec, policy) is not None


def away_from_pool(policy: Policy) -> list[dict[str, Any]]:
    """The node selector requirements that keep a pod off the sharing pool."""
    return [{"key": k, "operator": "NotIn", "values": [v]} for k, v in policy.sharing_pool]


def required_terms(spec: Mapping[str, Any]) -> Any:
    """The pod's required nodeSelectorTerms as written (None where a level is missing)."""
    affinity = spec.get("affinity")
    if not isinstance(affinity, MAPPINGS):
        return None
    node = affinity.get("nodeAffinity")
    if not isinstance(node, MAPPINGS):
        return None
    required = node.get(REQUIRED)
    if not isinstance(required, MAPPINGS):
        return None
    return required.get("nodeSelectorTerms")


def _expressions(terms: Any) -> Iterator[Mapping[str, Any]]:
    for term in terms if isinstance(terms, list) else ():
        expressions = as_mapping(term).get("matchExpressions")
        for expression in expressions if isinstance(expressions, list) else ():
            if isinstance(expression, MAPPINGS):
                yield expression


def other_pool_selection(spec: Mapping[str, Any], policy: Policy) -> str | None:
    """What in the pod selects a pool of ``wholeGpus.otherPools`` (its nodeSelector, or a
    required node affinity ``In`` a value the pool's glob matches); None if nothing does."""
    if not policy.other_pools:
        return None
    selector = as_mapping(spec.get("nodeSelector"))
    for key, value in policy.other_pools:
        if key in selector and match_any(str(selector[key]), (value,)):
            return f"nodeSelector {key}={selector[key]}"
    for expression in _expressions(required_terms(spec)):
        values = expression.get("values")
        if expression.get("operator") != "In" or not isinstance(values, list):
            continue
        for key, value in policy.other_pools:
            if expression.get("key") == key and any(
                isinstance(v, str) and match_any(v, (value,)) for v in values
            ):
                return f"node affinity {key} In {value}"
    return None


def pool_selection(spec: Mapping[str, Any], policy: Policy) -> str | None:
    """What in the pod selects the sharing pool (its nodeSelector, or a required node
    affinity ``In`` a pool label's value), said for a message; None if nothing does."""
    selector = as_mapping(spec.get("nodeSelector"))
    for key, value in policy.sharing_pool:
        if key in selector and str(selector[key]) == value:
            return f"nodeSelector {key}={value}"
    for expression in _expressions(required_terms(spec)):
        values = expression.get("values")
        for key, value in policy.sharing_pool:
            if (
                expression.get("key") == key
                and expression.get("operator") == "In"
                and isinstance(values, list)
                and value in values
            ):
                return f"node affinity {key} In {value}"
    return None
