"""The JSON Patch that gives a GPU-sharing pod its slice, built op by op.

Ops are computed directly against the object (never by diffing a mutated copy) and
only for what differs from the wanted state, so running the mutation on its own
output yields no ops: the apiserver may reinvoke us (reinvocationPolicy IfNeeded).
Lists are addressed by index for replacements, then removals in descending index
order, then ``-`` appends, so every pointer is valid when the op is applied.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Final, TypedDict

from webhook.policy import Mode, Policy
from webhook.resources import ContainerRequest, PodRequests, describe
from webhook.workload import PodView, as_mapping

LIBRARY_PATH: Final = "/usr/local/vgpu/libvgpu.so"  # HAMi-core hard-codes it for its dlsym hook
PRELOAD_FILE: Final = "/etc/ld.so.preload"
CACHE_DIR: Final = "/usr/local/vgpu/cache"
MODE_ANNOTATION: Final = "gpushare.io/mode"

VOLUME_LIBRARY: Final = "gpushare-vgpu-lib"
VOLUME_LOCK: Final = "gpushare-vgpu-lock"
VOLUME_CACHE: Final = "gpushare-vgpu-cache"
VOLUME_PRELOAD: Final = "gpushare-vgpu-preload"
VOLUME_MPS_PIPE: Final = "gpushare-mps-pipe"

# Env vars that limit a container: any user value is replaced or removed by the mutation.
VGPU_LIMIT_PREFIXES: Final = ("CUDA_DEVICE_MEMORY_LIMIT", "CUDA_DEVICE_SM_LIMIT")
MPS_LIMIT_VARS: Final = ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")


class PatchOp(TypedDict, total=False):
    op: str
    path: str
    value: Any


@dataclass(slots=True)
class Mutation:
    ops: list[PatchOp] = field(default_factory=list)
    # User values the mutation overwrote; reported under limit-tampering as warnings.
    overwritten: list[str] = field(default_factory=list)


def escape(segment: str) -> str:
    """RFC 6901 escaping of one JSON Pointer segment."""
    return segment.replace("~", "~0").replace("/", "~1")


@dataclass(frozen=True, slots=True)
class Want:
    """One env var the mutation wants; ``prepend`` keeps the user's value after ours."""

    name: str
    value: str
    prepend: bool = False
    report: bool = True


def injected_volumes(mode: Mode, policy: Policy) -> list[dict[str, Any]]:
    """The pod volumes the mutation adds for ``mode`` (also what host-device-access allows)."""
    if mode == "vgpu":
        volumes: list[dict[str, Any]] = [
            {
                "name": VOLUME_LIBRARY,
                "hostPath": {"path": policy.library_host_path, "type": "File"},
            },
            {
                "name": VOLUME_LOCK,
                "hostPath": {"path": policy.lock_host_path, "type": "DirectoryOrCreate"},
            },
            {"name": VOLUME_CACHE, "emptyDir": {}},
        ]
        if policy.preload == "file":
            volumes.append(
                {
                    "name": VOLUME_PRELOAD,
                    "hostPath": {"path": policy.preload_host_path, "type": "File"},
                }
            )
        return volumes
    if mode == "mps":
        return [
            {
                "name": VOLUME_MPS_PIPE,
                "hostPath": {"path": policy.mps_pipe_directory, "type": "DirectoryOrCreate"},
            }
        ]
    return []


def _mounts(mode: Mode, policy: Policy) -> list[dict[str, Any]]:
    if mode == "vgpu":
        mounts: list[dict[str, Any]] = [
            {"name": VOLUME_LIBRARY, "mountPath": LIBRARY_PATH, "readOnly": True},
            {"name": VOLUME_LOCK, "mountPath": policy.lock_host_path},
            {"name": VOLUME_CACHE, "mountPath": CACHE_DIR},
        ]
        if policy.preload == "file":
            mounts.append({"name": VOLUME_PRELOAD, "mountPath": PRELOAD_FILE, "readOnly": True})
        return mounts
    if mode == "mps":
        return [{"name": VOLUME_MPS_PIPE, "mountPath": policy.mps_pipe_directory}]
    return []


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
        if policy.core_utilization_policy != "default":
            wants.append(Want("GPU_CORE_UTILIZATION_POLICY", policy.core_utilization_policy))
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


def env_value(entry: Mapping[str, Any]) -> str | None:
    """An env entry's literal value; None when it comes from valueFrom."""
    if "valueFrom" in entry:
        return None
    value = entry.get("value", "")
    return value if isinstance(value, str) else str(value)


def _merged(want: Want, current: str | None) -> str:
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
) -> Mutation:
    result = Mutation()
    env = container.get("env")
    if env is None:
        env = []
    elif not isinstance(env, list):
        return result  # a malformed env is the apiserver's to refuse
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
        if current == value and len(env[index]) == 2:
            continue
        result.ops.append(
            {
                "op": "replace",
                "path": f"{pointer}/env/{index}",
                "value": {"name": want.name, "value": value},
            }
        )
        if want.report:
            shown = "valueFrom" if current is None else f'"{current}"'
            result.overwritten.append(f'{label}: {want.name} {shown} replaced by "{value}"')
    # Each distinct name is judged once; the list is scanned only when one is stray.
    stray_names = {name for name in last if strays(name)}
    removals = (
        [
            index
            for index, entry in enumerate(env)
            if isinstance(entry, (dict, Mapping))
            and isinstance(name := entry.get("name"), str)
            and name in stray_names
        ]
        if stray_names
        else []
    )
    for index in reversed(removals):
        result.ops.append({"op": "remove", "path": f"{pointer}/env/{index}"})
        result.overwritten.append(
            f"{label}: {env[index]['name']} removed (limits come from resources)"
        )
    if appends:
        if container.get("env") is None:
            result.ops.append({"op": "add", "path": f"{pointer}/env", "value": appends})
        else:
            result.ops.extend(
                {"op": "add", "path": f"{pointer}/env/-", "value": a} for a in appends
            )
    return result


def _list_ops(
    pointer: str,
    current: Any,
    wanted: list[dict[str, Any]],
    *,
    key: str,
    same: Callable[[Mapping[str, Any], Mapping[str, Any]], bool],
    label: str,
    what: str,
) -> Mutation:
    """Ops that make the list at ``pointer`` hold every wanted item, matched by ``key``."""
    result = Mutation()
    if current is None:
        if wanted:
            result.ops.append({"op": "add", "path": pointer, "value": wanted})
        return result
    if not isinstance(current, list):
        return result
    # Only string keys can match ours (and a list or map as a key is unhashable).
    where = {
        item[key]: index
        for index, item in enumerate(current)
        if isinstance(item, (dict, Mapping)) and isinstance(item.get(key), str)
    }
    for item in wanted:
        index = where.get(item[key])
        if index is None:
            result.ops.append({"op": "add", "path": f"{pointer}/-", "value": item})
        elif not same(current[index], item):
            result.ops.append({"op": "replace", "path": f"{pointer}/{index}", "value": item})
            result.overwritten.append(f"{label}: {what} {item[key]} replaced by the injected one")
    return result


def same_volume(have: Mapping[str, Any], want: Mapping[str, Any]) -> bool:
    return dict(have) == want


def _same_mount(have: Mapping[str, Any], want: Mapping[str, Any]) -> bool:
    return (
        have.get("name") == want["name"]
        and bool(have.get("readOnly")) == bool(want.get("readOnly"))
        and not have.get("subPath")
        and not have.get("subPathExpr")
    )


def mutate(view: PodView, requests: PodRequests, mode: Mode, policy: Policy) -> Mutation:
    """The patch for a pod (or template) in ``mode``; empty when it already has it all."""
    result = Mutation()
    if mode not in ("vgpu", "mps"):
        return result
    spec = view.spec
    sp = view.spec_pointer

    def merge(part: Mutation) -> None:
        result.ops.extend(part.ops)
        result.overwritten.extend(part.overwritten)

    # Pod-level fields.
    scheduler = spec.get("schedulerName")
    # The apiserver defaults a missing schedulerName to default-scheduler.
    effective = scheduler or "default-scheduler"
    if effective == "default-scheduler" and effective != policy.scheduler_name:
        op = "add" if scheduler is None else "replace"
        result.ops.append({"op": op, "path": f"{sp}/schedulerName", "value": policy.scheduler_name})
    if mode == "mps":
        if spec.get("hostIPC") is not True:
            op = "replace" if "hostIPC" in spec else "add"
            result.ops.append({"op": op, "path": f"{sp}/hostIPC", "value": True})
        selector = spec.get("nodeSelector")
        if policy.mps_node_selector:
            if not isinstance(selector, (dict, Mapping)):
                result.ops.append(
                    {
                        "op": "add",
                        "path": f"{sp}/nodeSelector",
                        "value": dict(policy.mps_node_selector),
                    }
                )
            else:
                for key, value in policy.mps_node_selector.items():
                    if key not in selector:
                        result.ops.append(
                            {
                                "op": "add",
                                "path": f"{sp}/nodeSelector/{escape(key)}",
                                "value": value,
                            }
                        )
    metadata = view.metadata
    annotations = metadata.get("annotations") if metadata is not None else None
    if metadata is None:
        result.ops.append(
            {
                "op": "add",
                "path": view.metadata_pointer,
                "value": {"annotations": {MODE_ANNOTATION: mode}},
            }
        )
    elif not isinstance(annotations, (dict, Mapping)):
        result.ops.append(
            {
                "op": "add",
                "path": f"{view.metadata_pointer}/annotations",
                "value": {MODE_ANNOTATION: mode},
            }
        )
    elif annotations.get(MODE_ANNOTATION) != mode:
        op = "replace" if MODE_ANNOTATION in annotations else "add"
        result.ops.append(
            {
                "op": op,
                "path": f"{view.metadata_pointer}/annotations/{escape(MODE_ANNOTATION)}",
                "value": mode,
            }
        )

    merge(
        _list_ops(
            f"{sp}/volumes",
            spec.get("volumes"),
            injected_volumes(mode, policy),
            key="name",
            same=same_volume,
            label="pod",
            what="volume",
        )
    )

    mounts = _mounts(mode, policy)
    gpu_names = set()
    for request in requests.containers:
        if not request.shares or request.kind == "ephemeralContainers":
            continue
        gpu_names.add((request.kind, request.index))
        container = spec[request.kind][request.index]
        cp = f"{sp}/{request.kind}/{request.index}"
        label = request.label
        wants = wanted_env(request, mode, policy)
        wanted_names = {w.name for w in wants}
        merge(
            _env_ops(
                cp,
                container,
                wants,
                label=label,
                # Positional: a keyword partial costs ~15% of a 20 KB pod's decision.
                strays=partial(stray_env, request, mode, wanted_names),
            )
        )
        merge(
            _list_ops(
                f"{cp}/volumeMounts",
                container.get("volumeMounts"),
                mounts,
                key="mountPath",
                same=_same_mount,
                label=label,
                what="mount",
            )
        )
        if request.implied_count_resource is not None:
            resources = as_mapping(container.get("resources"))
            for part in ("limits", "requests"):
                current = resources.get(part)
                if (
                    isinstance(current, (dict, Mapping))
                    and request.implied_count_resource not in current
                ):
                    result.ops.append(
                        {
                            "op": "add",
                            "path": f"{cp}/resources/{part}/{escape(request.implied_count_resource)}",
                            "value": "1",
                        }
                    )

    if policy.hide_devices_from_other_containers:
        for kind in ("containers", "initContainers"):
            containers = spec.get(kind)
            if not isinstance(containers, list):
                continue
            for index, container in enumerate(containers):
                if (kind, index) in gpu_names or not isinstance(container, (dict, Mapping)):
                    continue
                name = container.get("name")
                merge(
                    _env_ops(
                        f"{sp}/{kind}/{index}",
                        container,
                        [Want("NVIDIA_VISIBLE_DEVICES", "none", report=False)],
                        label=describe(kind, name if isinstance(name, str) else ""),
                        strays=lambda _name: False,
                    )
                )
    return result
