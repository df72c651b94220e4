"""The JSON Patch that gives a GPU-sharing pod its slice, built op by op.

Ops are computed directly against the object (never by diffing a mutated copy) and
only for what differs from the wanted state, so running the mutation on its own
output yields no ops: the apiserver may reinvoke us (reinvocationPolicy IfNeeded).
Lists are addressed by index for replacements, then removals in descending index
order, then ``-`` appends, so every pointer is valid when the op is applied.

The ops go to one :class:`Patch`, so ``/validate`` asks for the first missing setting
and stops there instead of building a patch it would throw away.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, Final

from webhook.core.env import (
    DEVICE_PINS,
    VISIBLE_DEVICES,
    ContainerClass,
    env_value,
    names_nvidia_env,
)
from webhook.core.finding import quoted
from webhook.core.injection import (
    LIBRARY_PATH,
    MODE_ANNOTATION,
    PLAIN,
    VGPU_LIMIT_PREFIXES,
    Injection,
    Treatment,
    gpu_runtime,
    same_volume,
)
from webhook.core.policy import DEFAULT_SCHEDULER, Mode, Policy
from webhook.core.resources import ContainerRequest, PodRequests, asks_for_gpu, container_class
from webhook.core.whole import REQUIRED, away_from_pool
from webhook.core.wire import PatchOp
from webhook.core.workload import MAPPINGS, PodView, as_mapping

# HAMi-core's task priority when CUDA_TASK_PRIORITY is unset.
_DEFAULT_PRIORITY: Final = 1


class _Enough(Exception):
    """The patch wanted only its first op, and has it."""


class Patch:
    """Where the mutation's ops go, with the notes on user values it overwrote.

    With ``first_only`` it stops the mutation at the first op (``/validate`` only asks
    whether anything is missing): a plain call per op, cheaper than generators.
    """

    __slots__ = ("add", "ops", "overwritten")

    def __init__(self, *, first_only: bool = False) -> None:
        self.ops: list[PatchOp] = []
        # User values the mutation overwrote; reported under limit-tampering as warnings.
        self.overwritten: list[str] = []
        # Adds an op. Without first_only, the list's own append: no Python frame per op.
        self.add: Callable[[PatchOp], None] = self._add_first if first_only else self.ops.append

    def _add_first(self, op: PatchOp) -> None:
        self.ops.append(op)
        raise _Enough


def escape(segment: str) -> str:
    """RFC 6901 escaping of one JSON Pointer segment."""
    return segment.replace("~", "~0").replace("/", "~1")


# Not frozen: built per request, and a frozen field costs an object.__setattr__.
@dataclass(slots=True)
class Want:
    """One env var the mutation wants; ``prepend`` keeps the user's value after ours,
    ``keep`` lists user values that stay because they are stricter than ours."""

    name: str
    value: str
    prepend: bool = False
    report: bool = True
    keep: tuple[str, ...] = ()
    # Set only where the container does not set the name: its own value is the env
    # allowlist's to judge (the device pins).
    absent_only: bool = False
    # Set only where the container sets the name (any entry, valueFrom too).
    present_only: bool = False


# The wants that depend on the policy alone, built once: a Want is never changed.
_PRELOAD: Final = Want("LD_PRELOAD", LIBRARY_PATH, prepend=True, report=False)
# With preload "file" glibc still loads LD_PRELOAD's objects before /etc/ld.so.preload's
# (elf/rtld.c dl_main): a user's library there would be searched before libvgpu.so for
# the symbols HAMi-core hooks. Ours goes first where the container sets one.
_PRELOAD_BEFORE_USERS: Final = Want(
    "LD_PRELOAD", LIBRARY_PATH, prepend=True, report=False, present_only=True
)
# Pinned in the pod's env, which wins over envFrom and the image's ENV: neither can
# then loosen the switches HAMi-core reads. A user's force is stricter than any policy
# value (HAMi-core compares the exact spellings).
_UTILIZATION: Final = {
    value: Want("GPU_CORE_UTILIZATION_POLICY", value, keep=("force", "FORCE"))
    for value in ("default", "force")
}
_SWITCHES: Final = (
    Want("CUDA_REDIRECT", ""),
    Want("ACTIVE_OOM_KILLER", "true", keep=("true", "1")),
)


_PINS: Final = {
    (name, value): Want(name, value, report=False, absent_only=True)
    for name, value in DEVICE_PINS.items()
}


# The names whose replaced value goes unreported (Want.report False): the preload keeps
# the user's libraries, the pins and the MPS pipe are policy, not a limit the user set.
UNREPORTED: Final = frozenset({_PRELOAD.name, "CUDA_MPS_PIPE_DIRECTORY", *DEVICE_PINS})


def wanted_env(
    request: ContainerRequest, mode: Mode, policy: Policy, *, klass: ContainerClass = "slice"
) -> list[Want]:
    """The env vars a sharing container of class ``klass`` must carry in ``mode``."""
    # The device pins of a slice (env.DEVICE_PINS the policy does not open).
    slice_ = klass == "slice" and mode in ("vgpu", "mps")
    wants: list[Want] = [_PINS[pin] for pin in policy.device_pins] if slice_ else []
    if mode == "vgpu":
        wants.append(_PRELOAD if policy.preload == "env" else _PRELOAD_BEFORE_USERS)
        if request.memory_mib is not None:
            memory = f"{request.memory_mib}m"
            for i in range(request.gpus):
                wants.append(Want(f"CUDA_DEVICE_MEMORY_LIMIT_{i}", memory))
        if request.cores is not None:
            cores = str(request.cores)
            wants.append(Want("CUDA_DEVICE_SM_LIMIT", cores))
            # HAMi-core reads CUDA_DEVICE_SM_LIMIT_<i> before CUDA_DEVICE_SM_LIMIT.
            for i in range(request.gpus):
                wants.append(Want(f"CUDA_DEVICE_SM_LIMIT_{i}", cores))
        wants.append(_UTILIZATION[policy.core_utilization_policy])
        wants.extend(_SWITCHES)
        # No CUDA_DEVICE_MEMORY_SHARED_CACHE (injection.REGION_DIR): the device plugin's
        # own value is where its monitor reads it, on its read-write mount.
        # HAMi-core schedules kernels by it (0 is high): without a request, its default.
        priority = request.priority if request.priority is not None else _DEFAULT_PRIORITY
        wants.append(Want("CUDA_TASK_PRIORITY", str(priority)))
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


def stray_env(request: ContainerRequest, wanted: set[str], name: str) -> bool:
    """A user-set vGPU limit variable that the wanted set does not own and that must go."""
    if not name.startswith(VGPU_LIMIT_PREFIXES) or name in wanted:
        return False
    if name.startswith("CUDA_DEVICE_MEMORY_LIMIT"):
        return True
    # CUDA_DEVICE_SM_LIMIT alone without a cores request is the user limiting themselves.
    return name.startswith("CUDA_DEVICE_SM_LIMIT_") or (
        name == "CUDA_DEVICE_SM_LIMIT" and request.cores is not None
    )


def _strays(request: ContainerRequest, wants: Sequence[Want], names: Iterable[str]) -> set[str]:
    """The names among ``names`` that :func:`stray_env` removes, given the ``wants``."""
    # The prefix first: nearly every name fails it, and then no set of wanted names.
    limits = [name for name in names if name.startswith(VGPU_LIMIT_PREFIXES)]
    if not limits:
        return set()
    wanted = {want.name for want in wants}
    return {name for name in limits if stray_env(request, wanted, name)}


def _merged(want: Want, current: str | None) -> str:
    if current is not None and current in want.keep:
        return current
    if not want.prepend or not current:
        return want.value
    rest = [p for p in current.replace(" ", ":").split(":") if p and p != want.value]
    return ":".join([want.value, *rest])


def _env_ops(
    out: Patch,
    pointer: str,
    container: Mapping[str, Any],
    wants: Iterable[Want],
    *,
    label: str,
    strays: Callable[[Iterable[str]], set[str]] | None,
) -> None:
    env = container.get("env")
    if env is None:
        env = []
    elif not isinstance(env, list):
        return  # a malformed env is the apiserver's to refuse
    last: dict[str, int] = {}
    for position, entry in enumerate(env):
        if isinstance(entry, MAPPINGS):
            name = entry.get("name")
            if isinstance(name, str):
                last[name] = position
    appends: list[dict[str, str]] = []
    for want in wants:
        index = last.get(want.name)
        if index is None:
            if not want.present_only:
                appends.append({"name": want.name, "value": want.value})
            continue
        if want.absent_only:
            continue
        current = env_value(env[index])
        value = _merged(want, current)
        # The apiserver stores an empty value as no value at all: {"name": N} is N="".
        if current == value and env[index].keys() <= {"name", "value"}:
            continue
        if want.report:
            shown = "valueFrom" if current is None else quoted(current)
            out.overwritten.append(f'{label}: {want.name} {shown} replaced by "{value}"')
        out.add(
            {
                "op": "replace",
                "path": f"{pointer}/env/{index}",
                "value": {"name": want.name, "value": value},
            }
        )
    # Each distinct name is judged once; the list is scanned only when one is stray.
    stray_names = strays(last) if strays is not None else ()
    if stray_names:
        removals = [
            index
            for index, entry in enumerate(env)
            if isinstance(entry, MAPPINGS)
            and isinstance(name := entry.get("name"), str)
            and name in stray_names
        ]
        for index in reversed(removals):
            out.overwritten.append(
                f"{label}: {env[index]['name']} removed (limits come from resources)"
            )
            out.add({"op": "remove", "path": f"{pointer}/env/{index}"})
    if appends:
        if container.get("env") is None:
            out.add({"op": "add", "path": f"{pointer}/env", "value": appends})
        else:
            end = f"{pointer}/env/-"
            for append in appends:
                out.add({"op": "add", "path": end, "value": append})


def _list_ops(
    out: Patch,
    pointer: str,
    current: Any,
    wanted: Sequence[dict[str, Any]],
    *,
    key: str,
    same: Callable[[Mapping[str, Any], Mapping[str, Any]], bool],
    label: str,
    what: str,
) -> None:
    """Ops that make the list at ``pointer`` hold every wanted item, matched by ``key``."""
    if current is None:
        if wanted:
            out.add({"op": "add", "path": pointer, "value": list(wanted)})
        return
    if not isinstance(current, list):
        return
    # Only string keys can match ours (and a list or map as a key is unhashable).
    where = {
        name: index
        for index, item in enumerate(current)
        if isinstance(item, MAPPINGS) and isinstance(name := item.get(key), str)
    }
    end = f"{pointer}/-"
    for item in wanted:
        index = where.get(item[key])
        if index is None:
            out.add({"op": "add", "path": end, "value": item})
        elif not same(current[index], item):
            out.overwritten.append(f"{label}: {what} {item[key]} replaced by the injected one")
            out.add({"op": "replace", "path": f"{pointer}/{index}", "value": item})


def _same_mount(have: Mapping[str, Any], want: Mapping[str, Any]) -> bool:
    return (
        have.get("name") == want["name"]
        and bool(have.get("readOnly")) == bool(want.get("readOnly"))
        and not have.get("subPath")
        and not have.get("subPathExpr")
    )


def _scheduler_ops(out: Patch, spec: Mapping[str, Any], sp: str, wanted: str) -> None:
    scheduler = spec.get("schedulerName")
    # The apiserver defaults a missing schedulerName to default-scheduler; another name
    # stays (scheduler-bypass judges it).
    effective = scheduler or DEFAULT_SCHEDULER
    if effective == DEFAULT_SCHEDULER and effective != wanted:
        op = "add" if scheduler is None else "replace"
        out.add({"op": op, "path": f"{sp}/schedulerName", "value": wanted})


def _mps_pod_ops(
    out: Patch, spec: Mapping[str, Any], sp: str, policy: Policy, *, placed: bool
) -> None:
    if spec.get("hostIPC") is not True:
        out.add(
            {
                "op": "replace" if "hostIPC" in spec else "add",
                "path": f"{sp}/hostIPC",
                "value": True,
            }
        )
    if not policy.mps_node_selector or placed:
        return
    selector = spec.get("nodeSelector")
    if not isinstance(selector, MAPPINGS):
        out.add(
            {"op": "add", "path": f"{sp}/nodeSelector", "value": dict(policy.mps_node_selector)}
        )
        return
    for key, value in policy.mps_node_selector.items():
        if key not in selector:
            out.add({"op": "add", "path": f"{sp}/nodeSelector/{escape(key)}", "value": value})


def _annotation_ops(out: Patch, view: PodView, mode: Mode) -> None:
    metadata = view.metadata
    mp = view.metadata_pointer
    if metadata is None:
        out.add({"op": "add", "path": mp, "value": {"annotations": {MODE_ANNOTATION: mode}}})
        return
    annotations = metadata.get("annotations")
    if not isinstance(annotations, MAPPINGS):
        out.add({"op": "add", "path": f"{mp}/annotations", "value": {MODE_ANNOTATION: mode}})
    elif annotations.get(MODE_ANNOTATION) != mode:
        op = "replace" if MODE_ANNOTATION in annotations else "add"
        out.add({"op": op, "path": f"{mp}/annotations/{escape(MODE_ANNOTATION)}", "value": mode})


def _container_ops(
    out: Patch,
    view: PodView,
    request: ContainerRequest,
    mode: Mode,
    policy: Policy,
    injection: Injection,
) -> None:
    """Env, mounts and the implied count resource of one sharing container."""
    container = view.spec[request.kind][request.index]
    cp = f"{view.spec_pointer}/{request.kind}/{request.index}"
    label = request.label
    wants = wanted_env(request, mode, policy, klass=container_class(container, policy))
    _env_ops(
        out,
        cp,
        container,
        wants,
        label=label,
        # Only vGPU limits leave strays behind. The partial is positional: a keyword
        # partial costs ~15% of a 20 KB pod's decision.
        strays=partial(_strays, request, wants) if mode == "vgpu" else None,
    )
    _list_ops(
        out,
        f"{cp}/volumeMounts",
        container.get("volumeMounts"),
        injection.mounts,
        key="mountPath",
        same=_same_mount,
        label=label,
        what="mount",
    )
    _implied_ops(out, view, request)


def _implied_ops(out: Patch, view: PodView, request: ContainerRequest) -> None:
    """The count resource a container that asks only for memory or cores implies."""
    count = request.implied_count_resource
    if count is not None:
        container = view.spec[request.kind][request.index]
        cp = f"{view.spec_pointer}/{request.kind}/{request.index}"
        resources = as_mapping(container.get("resources"))
        for part in ("limits", "requests"):
            current = resources.get(part)
            if isinstance(current, MAPPINGS) and count not in current:
                out.add(
                    {"op": "add", "path": f"{cp}/resources/{part}/{escape(count)}", "value": "1"}
                )


# What a container that asks for no GPU gets: no device and no driver files ("none"
# still mounts the driver's libraries). Pod env beats image ENV, so this also overrides an
# image's baked NVIDIA_VISIBLE_DEVICES=all and makes a CUDA_VERSION image no legacy one.
VOID: Final = "void"


def needs_void(spec: Mapping[str, Any], requests: PodRequests, policy: Policy) -> bool:
    """The pod's containers that ask for no GPU get NVIDIA_VISIBLE_DEVICES=void: in a GPU
    pod, in a pod under one of the policy's GPU runtime classes, and in a pod whose env
    names CUDA_VERSION or an NVIDIA_* variable."""
    if requests.gpu or gpu_runtime(spec, policy):
        return True
    for kind in ("containers", "initContainers"):
        containers = spec.get(kind)
        for container in containers if isinstance(containers, list) else ():
            if isinstance(container, MAPPINGS) and names_nvidia_env(container):
                return True
    return False


def _void_ops(out: Patch, view: PodView, requests: PodRequests, policy: Policy) -> None:
    """NVIDIA_VISIBLE_DEVICES=void for every container that asks for no GPU and does not
    set the variable itself (a value the user set is judged, never rewritten)."""
    # What asks for one of the policy's resources is known already: no second look.
    asking = {(request.kind, request.index) for request in requests.containers}
    for kind in ("containers", "initContainers"):
        containers = view.spec.get(kind)
        if not isinstance(containers, list):
            continue
        for index, container in enumerate(containers):
            if (
                (kind, index) in asking
                or not isinstance(container, MAPPINGS)
                or asks_for_gpu(container, policy)
            ):
                continue
            env = container.get("env")
            pointer = f"{view.spec_pointer}/{kind}/{index}/env"
            if env is None:
                out.add(
                    {
                        "op": "add",
                        "path": pointer,
                        "value": [{"name": VISIBLE_DEVICES, "value": VOID}],
                    }
                )
            elif isinstance(env, list) and not any(
                isinstance(entry, MAPPINGS) and entry.get("name") == VISIBLE_DEVICES
                for entry in env
            ):
                out.add(
                    {
                        "op": "add",
                        "path": f"{pointer}/-",
                        "value": {"name": VISIBLE_DEVICES, "value": VOID},
                    }
                )


def _pool_ops(out: Patch, view: PodView, policy: Policy) -> None:
    """A required node affinity away from the sharing pool (``whole.away_from_pool``) in
    every nodeSelectorTerm: terms are ORed, a term's requirements ANDed."""
    wanted = away_from_pool(policy)
    if not wanted:
        return
    spec, sp = view.spec, view.spec_pointer
    terms: list[dict[str, Any]] = [{"matchExpressions": wanted}]
    affinity = spec.get("affinity")
    node = as_mapping(affinity).get("nodeAffinity")
    required = as_mapping(node).get(REQUIRED)
    # JSON Patch's add replaces a member that is there (null included).
    if not isinstance(affinity, MAPPINGS):
        value: Any = {"nodeAffinity": {REQUIRED: {"nodeSelectorTerms": terms}}}
        out.add({"op": "add", "path": f"{sp}/affinity", "value": value})
        return
    if not isinstance(node, MAPPINGS):
        value = {REQUIRED: {"nodeSelectorTerms": terms}}
        out.add({"op": "add", "path": f"{sp}/affinity/nodeAffinity", "value": value})
        return
    pointer = f"{sp}/affinity/nodeAffinity/{REQUIRED}"
    if not isinstance(required, MAPPINGS):
        out.add({"op": "add", "path": pointer, "value": {"nodeSelectorTerms": terms}})
        return
    current = required.get("nodeSelectorTerms")
    if not isinstance(current, list) or not current:
        out.add({"op": "add", "path": f"{pointer}/nodeSelectorTerms", "value": terms})
        return
    for index, term in enumerate(current):
        expressions = as_mapping(term).get("matchExpressions")
        at = f"{pointer}/nodeSelectorTerms/{index}/matchExpressions"
        if not isinstance(expressions, list):
            out.add({"op": "add", "path": at, "value": wanted})
            continue
        for expression in wanted:
            if expression not in expressions:
                out.add({"op": "add", "path": f"{at}/-", "value": expression})


def _edits(
    out: Patch,
    view: PodView,
    requests: PodRequests,
    mode: Mode,
    policy: Policy,
    injection: Injection,
    treatment: Treatment,
) -> None:
    """Every op a pod (or template) in ``mode`` still needs, in an order that applies."""
    if mode in ("vgpu", "mps"):
        _mode_edits(out, view, requests, mode, policy, injection, treatment)
    elif treatment.whole:
        _pool_ops(out, view, policy)
    elif treatment.dynamic:
        # The scheduler cuts the MIG instance: it gets the pod, and nothing is preloaded.
        _scheduler_ops(out, view.spec, view.spec_pointer, policy.scheduler_for(requests, mode=mode))
        for request in requests.containers:
            if request.shares and request.kind != "ephemeralContainers":
                _implied_ops(out, view, request)
    if needs_void(view.spec, requests, policy):
        _void_ops(out, view, requests, policy)


def _mode_edits(
    out: Patch,
    view: PodView,
    requests: PodRequests,
    mode: Mode,
    policy: Policy,
    injection: Injection,
    treatment: Treatment,
) -> None:
    """The ops of a GPU-sharing pod in mode vgpu or mps; a vgpu pod without HAMi-core
    (``treatment.library`` False) gets its scheduler, mode and count, nothing of the
    library."""
    library = treatment.library
    spec, sp = view.spec, view.spec_pointer
    _scheduler_ops(out, spec, sp, policy.scheduler_for(requests, mode=mode))
    if mode == "mps":
        _mps_pod_ops(out, spec, sp, policy, placed=treatment.placed)
    _annotation_ops(out, view, mode)
    _list_ops(
        out,
        f"{sp}/volumes",
        spec.get("volumes"),
        injection.volumes,
        key="name",
        same=same_volume,
        label="pod",
        what="volume",
    )
    for request in requests.containers:
        if request.shares and request.kind != "ephemeralContainers":
            if library:
                _container_ops(out, view, request, mode, policy, injection)
            else:
                _implied_ops(out, view, request)


def mutate(
    view: PodView,
    requests: PodRequests,
    mode: Mode,
    policy: Policy,
    injection: Injection,
    treatment: Treatment = PLAIN,
) -> Patch:
    """The patch for a pod (or template) in ``mode``; empty when it already has it all."""
    out = Patch()
    _edits(out, view, requests, mode, policy, injection, treatment)
    return out


def first_missing(
    view: PodView,
    requests: PodRequests,
    mode: Mode,
    policy: Policy,
    injection: Injection,
    treatment: Treatment = PLAIN,
) -> PatchOp | None:
    """The first op the mutation would still make, or None when the pod has it all."""
    out = Patch(first_only=True)
    try:
        _edits(out, view, requests, mode, policy, injection, treatment)
    except _Enough:
        return out.ops[0]
    return None
