"""Translating a GPU memory request into a MIG instance where the policy says a pool is MIG.

A workload written for vGPU (``nvidia.com/gpumem: 10000``) cannot run unchanged on nodes
cut into MIG instances: they expose ``nvidia.com/mig-<profile>`` and nothing else. With a
synced cluster view and a pool in the policy's ``mig.pools``, a pod whose nodeSelector
picks that pool gets, per container, the smallest MIG profile the pool's nodes expose
that holds its memory, in place of its vGPU resources.

The translation is decided before the pod's mode: the pod is then judged and mutated as
the MIG pod it becomes, and ``/validate`` sees any pod that still needs it as unmutated.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from webhook.core.cluster import MIG_PREFIX, ClusterView
from webhook.core.context import resolve_percentages, where
from webhook.core.finding import Finding
from webhook.core.mode import named_mode
from webhook.core.mutation import escape
from webhook.core.policy import MigPool, Policy
from webhook.core.pool import Pool, pool_of
from webhook.core.resources import ContainerRequest, PodRequests
from webhook.core.wire import PatchOp
from webhook.core.workload import PodView, as_mapping

_PARTS: Final = ("limits", "requests")


@dataclass(slots=True)
class Translation:
    """The ops that turn a pod's vGPU requests into MIG instances, or why they cannot."""

    ops: list[PatchOp] = field(default_factory=list)
    findings: list[Finding] = field(default_factory=list)
    # (kind, index) of the containers whose fit was judged here, against MIG profiles.
    judged: set[tuple[str, int]] = field(default_factory=set)


def selected_pool(node_selector: Mapping[str, Any], policy: Policy) -> MigPool | None:
    """The first MIG pool of the policy that ``node_selector`` confines a pod to."""
    for pool in policy.mig_pools:
        if pool.selected_by(node_selector):
            return pool
    return None


def smallest_profile(pool: Pool, memory_mib: int) -> tuple[str, int] | None:
    """The MIG profile of ``pool`` with the least memory that still holds ``memory_mib``
    (a plain profile before its ``+me`` variant of the same size)."""
    fitting = [
        (memory, len(name), name) for name, (memory, _) in pool.mig.items() if memory >= memory_mib
    ]
    if not fitting:
        return None
    memory, _, name = min(fitting)
    return name, memory


def _largest(pool: Pool) -> tuple[str, int] | None:
    if not pool.mig:
        return None
    _, _, name = max((memory, -len(name), name) for name, (memory, _) in pool.mig.items())
    return name, pool.mig[name][0]


def _why_not(request: ContainerRequest, where: str) -> str:
    """Why ``request`` (more than one GPU, or a percentage) cannot become one MIG instance."""
    if request.gpus != 1:
        return (
            f"{request.label}: {request.gpus} GPUs of GPU memory {where}, a MIG pool; a "
            "process sees one MIG instance: ask for nvidia.com/gpu: 1 or for nvidia.com/mig-*"
        )
    return (
        f"{request.label}: memory as a percentage {where}, a MIG pool whose cards differ "
        "in size or are unknown; ask for nvidia.com/gpumem in MiB or for nvidia.com/mig-*"
    )


def _container_ops(
    view: PodView, request: ContainerRequest, resource: str, ops: list[PatchOp]
) -> None:
    """Remove the container's vGPU resources, add one ``resource``."""
    container = view.spec[request.kind][request.index]
    pointer = f"{view.spec_pointer}/{request.kind}/{request.index}/resources"
    resources = as_mapping(as_mapping(container).get("resources"))
    for part in _PARTS:
        current = resources.get(part)
        if not isinstance(current, Mapping):
            continue
        removed = [name for name in request.sharing_resources if name in current]
        for name in removed:
            ops.append({"op": "remove", "path": f"{pointer}/{part}/{escape(name)}"})
        # Requests follow limits for extended resources: only where they were written.
        if part == "limits" or removed:
            ops.append({"op": "add", "path": f"{pointer}/{part}/{escape(resource)}", "value": "1"})


def _become_mig(request: ContainerRequest, resource: str) -> None:
    """Make ``request`` read as the MIG request it is translated into."""
    request.mig = {resource: 1}
    request.sharing_resources = []
    request.gpus = 0
    request.memory_mib = request.memory_percentage = request.cores = request.priority = None
    request.implied_count_resource = None


def translate(
    view: PodView,
    requests: PodRequests,
    *,
    annotations: Mapping[str, Any],
    policy: Policy,
    cluster: ClusterView,
) -> Translation | None:
    """The MIG translation of a new pod or template (``cluster`` synced), or None when the
    pod picks no MIG pool, names another mode, or asks for no GPU memory.

    On success ``requests`` is changed in place to the MIG requests the patched pod has.
    """
    if not policy.mig_pools or not requests.sharing:
        return None
    raw = as_mapping(view.spec.get("nodeSelector"))
    selector = {str(k): v for k, v in raw.items() if isinstance(v, str)}
    pool = selected_pool(selector, policy)
    if pool is None or named_mode(
        annotations=annotations, node_selector=selector, policy=policy
    ) not in (None, "mig"):
        return None
    candidates = [
        r
        for r in requests.containers
        if r.shares
        and not r.mig
        and r.kind != "ephemeralContainers"
        and (r.memory_mib is not None or r.memory_percentage is not None)
    ]
    # A malformed request is invalid-gpu-request's to report, untranslated.
    if not candidates or any(r.problems for r in candidates):
        return None
    nodes = pool_of(cluster, selector)
    place = where(selector)
    if nodes.nodes == 0:
        # None of the pool's nodes the pod narrows to is up (a pool scaling from zero):
        # the profiles of the pool's other nodes, as its nodes are alike.
        nodes = pool_of(cluster, pool.node_selector)
        place = where(pool.node_selector)
    resolve_percentages(requests, nodes, where=place)
    translation = Translation()
    chosen: list[tuple[ContainerRequest, str, int]] = []
    for request in candidates:
        translation.judged.add((request.kind, request.index))
        memory = request.memory_mib
        if request.gpus != 1 or memory is None:
            translation.findings.append(Finding("mode-conflict", _why_not(request, place)))
            continue
        fit = smallest_profile(nodes, memory)
        if fit is not None and pool.translate:
            chosen.append((request, *fit))
        elif fit is not None:
            translation.findings.append(
                Finding(
                    "mode-conflict",
                    f"{request.label}: GPU memory {place} is MIG only (policy mig.pools); "
                    f"ask for {MIG_PREFIX}{fit[0]}: 1, the smallest that holds {memory} MiB",
                )
            )
        elif nodes.nodes == 0:
            translation.findings.append(
                Finding(
                    "mode-conflict",
                    f"{request.label}: no node {place} is up to pick a MIG profile from; "
                    "ask for nvidia.com/mig-* instead of GPU memory",
                )
            )
        else:
            largest = _largest(nodes)
            which = (
                f"the largest MIG profile is {largest[0]} ({largest[1]:,} MiB); "
                f"ask for at most {largest[1]}"
                if largest is not None
                else "they expose no MIG profile"
            )
            translation.findings.append(
                Finding(
                    "no-fitting-node",
                    f"{request.label}: {memory:,} MiB fits no MIG instance {place}: {which}",
                )
            )
    if translation.findings:
        return translation
    for request, profile, memory in chosen:
        resource = f"{MIG_PREFIX}{profile}"
        _container_ops(view, request, resource, translation.ops)
        request.notes.append(
            f"{request.label}: {request.memory_mib} MiB becomes MIG {profile} ({memory} MiB)"
        )
        if request.cores is not None:
            request.notes.append(
                f"{request.label}: {request.cores}% cores dropped: MIG {profile} has its own"
            )
        _become_mig(request, resource)
    return translation
