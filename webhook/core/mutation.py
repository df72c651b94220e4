"""The JSON Patch that gives a GPU-sharing pod its slice, built op by op.

Ops are computed directly against the object (never by diffing a mutated copy) and
only for what differs from the wanted state, so running the mutation on its own
output yields no ops: the apiserver may reinvoke us (reinvocationPolicy IfNeeded).
Lists are addressed by index for replacements, then removals in descending index
order, then ``-`` appends, so every pointer is valid when the op is applied.

The ops come from one generator, so ``/validate`` asks it for the first missing
setting and stops there instead of building a patch it would throw away.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Any

from webhook.core.env import env_value
from webhook.core.finding import quoted
from webhook.core.injection import (
    CACHE_DIR,
    LIBRARY_PATH,
    MODE_ANNOTATION,
    VGPU_LIMIT_PREFIXES,
    Injection,
    same_volume,
)
from webhook.core.policy import Mode, Policy
from webhook.core.resources import ContainerRequest, PodRequests, describe
from webhook.core.wire import PatchOp
from webhook.core.workload import PodView, as_mapping

# User values the mutation overwrote, reported under limit-tampering as warnings.
Notes = list[str]


@dataclass(slots=True)
class Mutation:
    ops: list[PatchOp] = field(default_factory=list)
    overwritten: Notes = field(default_factory=list)


def escape(segment: str) -> str:
    """RFC 6901 escaping of one JSON Pointer segment."""
    return segment.replace("~", "~0").replace("/", "~1")


@dataclass(frozen=True, slots=True)
class Want:
    """One env var the mutation wants; ``prepend`` keeps the user's value after ours,
    ``keep`` lists user values that stay because they are stricter than ours."""

    name: str
    value: str
    prepend: bool = False
    report: bool = True
    keep: tuple[str, ...] = ()


def wanted_env(request: ContainerRequest, mode: Mode, policy: Policy) -> list[Want]:
    """The env vars a sharing container must carry in ``mode``."""
    wants: list[Want] = []
    if mode == "vgpu":
        if policy.preload == "env":
            wants.append(Want("LD_PRELOAD", LIBRARY_PATH, prepend=True, report=False))
        if request.memory_mib is not None:
            wants.extend(
                Want(f"CUDA_DEVICE_MEMORY_LIMIT_{i}", f"{request.memory_mib}m")
                for i in range(request.gpus)
            )
        if request.cores is not None:
            wants.append(Want("CUDA_DEVICE_SM_LIMIT", str(request.cores)))
            # HAMi-core reads CUDA_DEVICE_SM_LIMIT_<i> before CUDA_DEVICE_SM_LIMIT.
            wants.extend(
                Want(f"CUDA_DEVICE_SM_LIMIT_{i}", str(request.cores)) for i in range(request.gpus)
            )
        # Pinned in the pod's env, which wins over envFrom and the image's ENV: neither
        # can then loosen the switches HAMi-core reads. A user's force is stricter than
        # any policy value (HAMi-core compares the exact spellings).
        wants.append(
            Want(
                "GPU_CORE_UTILIZATION_POLICY",
                policy.core_utilization_policy,
                keep=("force", "FORCE"),
            )
        )
        wants.append(Want("CUDA_REDIRECT", ""))
        wants.append(Want("ACTIVE_OOM_KILLER", "true"))
        wants.append(
            Want(
                "CUDA_DEVICE_MEMORY_SHARED_CACHE",
                f"{CACHE_DIR}/{request.name}.cache",
                report=False,
            )
        )
        if request.priority is not None:
            wants.append(Want("CUDA_TASK_PRIORITY", str(request.priority)))
    elif mode == "mps":
        if request.memory_mib is not None:
            wants.append(
                Want(
                    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
                    ",".join(f"{i}={request.memory_mib}M" for i in range(request.gpus)),
                )
            )
        if request.cores is not None:
            wants.append(Want("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", str(request.cores)))
        wants.append(Want("CUDA_MPS_PIPE_DIRECTORY", policy.mps_pipe_directory, report=False))
    return wants


def stray_env(request: ContainerRequest, mode: Mode, wanted: set[str], name: str) -> bool:
    """A user-set limit variable that the wanted set does not own and that must go."""
    if mode != "vgpu" or not name.startswith(VGPU_LIMIT_PREFIXES) or name in wanted:
        return False
    if name.startswith("CUDA_DEVICE_MEMORY_LIMIT"):
        return True
    # CUDA_DEVICE_SM_LIMIT alone without a cores request is the user limiting themselves.
    return name.startswith("CUDA_DEVICE_SM_LIMIT_") or (
        name == "CUDA_DEVICE_SM_LIMIT" and request.cores is not None
    )


def _merged(want: Want, current: str | None) -> str:
    if current is not None and current in want.keep:
        return current
    if not want.prepend or not current:
        return want.value
    rest = [p for p in current.replace(" ", ":").split(":") if p and p != want.value]
    return ":".join([want.value, *rest])


def _env_ops(
    pointer: str,
    container: Mapping[str, Any],
    wants: Iterable[Want],
    *,
    label: str,
    strays: Callable[[str], bool],
    notes: Notes,
) -> Iterator[PatchOp]:
    env = container.get("env")
    if env is None:
        env = []
    elif not isinstance(env, list):
        return  # a malformed env is the apiserver's to refuse
    last: dict[str, int] = {}
    for position, entry in enumerate(env):
        if isinstance(entry, (dict, Mapping)):
            name = entry.get("name")
            if isinstance(name, str):
                last[name] = position
    appends: list[dict[str, str]] = []
    for want in wants:
        index = last.get(want.name)
        current = env_value(env[index]) if index is not None else None
        value = _merged(want, current)
        if index is None:
            appends.append({"name": want.name, "value": value})
            continue
        # The apiserver stores an empty value as no value at all: {"name": N} is N="".
        if current == value and env[index].keys() <= {"name", "value"}:
            continue
        if want.report:
            shown = "valueFrom" if current is None else quoted(current)
            notes.append(f'{label}: {want.name} {shown} replaced by "{value}"')
        yield {
            "op": "replace",
            "path": f"{pointer}/env/{index}",
            "value": {"name": want.name, "value": value},
        }
    # Each distinct name is judged once; the list is scanned only when one is stray.
    stray_names = {name for name in last if strays(name)}
    if stray_names:
        removals = [
            index
            for index, entry in enumerate(env)
            if isinstance(entry, (dict, Mapping))
            and isinstance(name := entry.get("name"), str)
            and name in stray_names
        ]
        for index in reversed(removals):
            notes.append(f"{label}: {env[index]['name']} removed (limits come from resources)")
            yield {"op": "remove", "path": f"{pointer}/env/{index}"}
    if appends:
        if container.get("env") is None:
            yield {"op": "add", "path": f"{pointer}/env", "value": appends}
        else:
            for append in appends:
                yield {"op": "add", "path": f"{pointer}/env/-", "value": append}


def _list_ops(
    pointer: str,
    current: Any,
    wanted: Sequence[dict[str, Any]],
    *,
    key: str,
    same: Callable[[Mapping[str, Any], Mapping[str, Any]], bool],
    label: str,
    what: str,
    notes: Notes,
) -> Iterator[PatchOp]:
    """Ops that make the list at ``pointer`` hold every wanted item, matched by ``key``."""
    if current is None:
        if wanted:
            yield {"op": "add", "path": pointer, "value": list(wanted)}
        return
    if not isinstance(current, list):
        return
    # Only string keys can match ours (and a list or map as a key is unhashable).
    where = {
        item[key]: index
        for index, item in enumerate(current)
        if isinstance(item, (dict, Mapping)) and isinstance(item.get(key), str)
    }
    for item in wanted:
        index = where.get(item[key])
        if index is None:
            yield {"op": "add", "path": f"{pointer}/-", "value": item}
        elif not same(current[index], item):
            notes.append(f"{label}: {what} {item[key]} replaced by the injected one")
            yield {"op": "replace", "path": f"{pointer}/{index}", "value": item}


def _same_mount(have: Mapping[str, Any], want: Mapping[str, Any]) -> bool:
    return (
        have.get("name") == want["name"]
        and bool(have.get("readOnly")) == bool(want.get("readOnly"))
        and not have.get("subPath")
        and not have.get("subPathExpr")
    )


def _scheduler_ops(spec: Mapping[str, Any], sp: str, policy: Policy) -> Iterator[PatchOp]:
    scheduler = spec.get("schedulerName")
    # The apiserver defaults a missing schedulerName to default-scheduler.
    effective = scheduler or "default-scheduler"
    if effective == "default-scheduler" and effective != policy.scheduler_name:
        op = "add" if scheduler is None else "replace"
        yield {"op": op, "path": f"{sp}/schedulerName", "value": policy.scheduler_name}


def _mps_pod_ops(spec: Mapping[str, Any], sp: str, policy: Policy) -> Iterator[PatchOp]:
    if spec.get("hostIPC") is not True:
        yield {
            "op": "replace" if "hostIPC" in spec else "add",
            "path": f"{sp}/hostIPC",
            "value": True,
        }
    if not policy.mps_node_selector:
        return
    selector = spec.get("nodeSelector")
    if not isinstance(selector, (dict, Mapping)):
        yield {"op": "add", "path": f"{sp}/nodeSelector", "value": dict(policy.mps_node_selector)}
        return
    for key, value in policy.mps_node_selector.items():
        if key not in selector:
            yield {"op": "add", "path": f"{sp}/nodeSelector/{escape(key)}", "value": value}


def _annotation_ops(view: PodView, mode: Mode) -> Iterator[PatchOp]:
    metadata = view.metadata
    mp = view.metadata_pointer
    if metadata is None:
        yield {"op": "add", "path": mp, "value": {"annotations": {MODE_ANNOTATION: mode}}}
        return
    annotations = metadata.get("annotations")
    if not isinstance(annotations, (dict, Mapping)):
        yield {"op": "add", "path": f"{mp}/annotations", "value": {MODE_ANNOTATION: mode}}
    elif annotations.get(MODE_ANNOTATION) != mode:
        op = "replace" if MODE_ANNOTATION in annotations else "add"
        yield {"op": op, "path": f"{mp}/annotations/{escape(MODE_ANNOTATION)}", "value": mode}


def _container_ops(
    view: PodView,
    request: ContainerRequest,
    mode: Mode,
    policy: Policy,
    injection: Injection,
    notes: Notes,
) -> Iterator[PatchOp]:
    """Env, mounts and the implied count resource of one sharing container."""
    container = view.spec[request.kind][request.index]
    cp = f"{view.spec_pointer}/{request.kind}/{request.index}"
    label = request.label
    wants = wanted_env(request, mode, policy)
    wanted_names = {w.name for w in wants}
    yield from _env_ops(
        cp,
        container,
        wants,
        label=label,
        # Positional: a keyword partial costs ~15% of a 20 KB pod's decision.
        strays=partial(stray_env, request, mode, wanted_names),
        notes=notes,
    )
    yield from _list_ops(
        f"{cp}/volumeMounts",
        container.get("volumeMounts"),
        injection.mounts,
        key="mountPath",
        same=_same_mount,
        label=label,
        what="mount",
        notes=notes,
    )
    count = request.implied_count_resource
    if count is not None:
        resources = as_mapping(container.get("resources"))
        for part in ("limits", "requests"):
            current = resources.get(part)
            if isinstance(current, (dict, Mapping)) and count not in current:
                yield {"op": "add", "path": f"{cp}/resources/{part}/{escape(count)}", "value": "1"}


def _hidden_device_ops(
    view: PodView, sharing: set[tuple[str, int]], notes: Notes
) -> Iterator[PatchOp]:
    """NVIDIA_VISIBLE_DEVICES=none for every container that asked for no GPU."""
    for kind in ("containers", "initContainers"):
        containers = view.spec.get(kind)
        if not isinstance(containers, list):
            continue
        for index, container in enumerate(containers):
            if (kind, index) in sharing or not isinstance(container, (dict, Mapping)):
                continue
            name = container.get("name")
            yield from _env_ops(
                f"{view.spec_pointer}/{kind}/{index}",
                container,
                [Want("NVIDIA_VISIBLE_DEVICES", "none", report=False)],
                label=describe(kind, name if isinstance(name, str) else ""),
                strays=lambda _name: False,
                notes=notes,
            )


def edits(
    view: PodView,
    requests: PodRequests,
    mode: Mode,
    policy: Policy,
    injection: Injection,
    notes: Notes,
) -> Iterator[PatchOp]:
    """Every op a pod (or template) in ``mode`` still needs, in an order that applies."""
    if mode not in ("vgpu", "mps"):
        return
    spec, sp = view.spec, view.spec_pointer
    yield from _scheduler_ops(spec, sp, policy)
    if mode == "mps":
        yield from _mps_pod_ops(spec, sp, policy)
    yield from _annotation_ops(view, mode)
    yield from _list_ops(
        f"{sp}/volumes",
        spec.get("volumes"),
        injection.volumes,
        key="name",
        same=same_volume,
        label="pod",
        what="volume",
        notes=notes,
    )
    sharing: set[tuple[str, int]] = set()
    for request in requests.containers:
        if request.shares and request.kind != "ephemeralContainers":
            sharing.add((request.kind, request.index))
            yield from _container_ops(view, request, mode, policy, injection, notes)
    if policy.hide_devices_from_other_containers:
        yield from _hidden_device_ops(view, sharing, notes)


def mutate(
    view: PodView, requests: PodRequests, mode: Mode, policy: Policy, injection: Injection
) -> Mutation:
    """The patch for a pod (or template) in ``mode``; empty when it already has it all."""
    result = Mutation()
    result.ops.extend(edits(view, requests, mode, policy, injection, result.overwritten))
    return result


def first_missing(
    view: PodView, requests: PodRequests, mode: Mode, policy: Policy, injection: Injection
) -> PatchOp | None:
    """The first op the mutation would still make, or None when the pod has it all."""
    return next(edits(view, requests, mode, policy, injection, []), None)
