"""The rules: pure checks of a pod view that return findings tagged with a fixed rule id."""

from __future__ import annotations

import functools
import posixpath
import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal, NamedTuple

from webhook.core.env import (
    CHANNEL_RULES,
    CONTAINER_CLASSES,
    DEVICE_NAMES,
    DEVICE_PINS,
    DEVICE_PREFIXES,
    LIMIT_NAMES,
    LIMIT_PREFIXES,
    ContainerClass,
    channel_of,
    effective_env,
    env_value,
    legacy_image,
    managed,
    opaque,
    spelling_prefixes,
)
from webhook.core.finding import Finding, quoted
from webhook.core.injection import (
    LIBRARY_PATH,
    MPS_LIMIT_VARS,
    OVERRIDE_ENV_FILE,
    PLAIN,
    PRELOAD_FILE,
    REGION_DIR,
    REGION_VARIABLE,
    VGPU_LIMIT_PREFIXES,
    Injection,
    Treatment,
    gpu_runtime,
    region_readable,
)
from webhook.core.policy import (
    DEFAULT_SCHEDULER,
    DEVICE_CLASS_RESOURCE,
    RULE_IDS,
    DevicesFrom,
    Mode,
    Policy,
    match_any,
    normalised,
)
from webhook.core.resources import (
    CONTAINER_KINDS,
    PRIORITIES,
    ContainerKind,
    ContainerRequest,
    PodRequests,
    asks_for_gpu,
    container_class,
    describe,
    is_zero,
)
from webhook.core.whole import pool_selection
from webhook.core.workload import MAPPINGS, PodView, as_mapping

Phase = Literal["mutate", "validate"]

# Tuples, not sets: the in-apiserver rendering spells them in this order.
HARMLESS_VISIBLE_DEVICES: Final = ("void", "none", "")
# capabilities.add entries that give CAP_SYS_ADMIN (runtimes upper-case them and add
# CAP_): the NVIDIA toolkit's isPrivileged() tests for it in the bounding set.
SYS_ADMIN: Final = frozenset({"SYS_ADMIN", "CAP_SYS_ADMIN", "ALL"})
TRUTHY: Final = ("1", "true", "yes", "on", "y", "t")
FALSY: Final = ("0", "false")
# The env switches that turn HAMi-core's enforcement off or loosen it.
_SWITCHES: Final = frozenset(
    {
        "CUDA_DISABLE_CONTROL",
        "GPU_CORE_UTILIZATION_POLICY",
        "CUDA_REDIRECT",
        "ACTIVE_OOM_KILLER",
        "CGPU_DISABLE",
        # Where HAMi-core keeps a container's limits and usage, and its task priority:
        # judged here, never pinned by the mutation (the priority is, from the resource).
        REGION_VARIABLE,
        "CUDA_TASK_PRIORITY",
    }
)
_JUDGED_ENV: Final = frozenset({"NVIDIA_VISIBLE_DEVICES"})
# What every guarded name starts with (env's tables, a name being its own prefix): one
# startswith per env entry turns nearly all away before channel_of runs.
_CHANNEL_STARTS: Final = (*DEVICE_PREFIXES, *DEVICE_NAMES, *LIMIT_NAMES, *LIMIT_PREFIXES)
_GPU_JUDGED_ENV: Final = _JUDGED_ENV | _SWITCHES
# A percent as ASCII digits: str.isdigit() takes "\u00b2", and int() then raises.
_PERCENT: Final = re.compile(r"[0-9]{1,9}")
# Mounting any of these from the host hands out GPUs behind the scheduler's back
# (/dev/char/<major>:<minor> are the same device nodes under their numbers).
DEVICE_PATH_PREFIXES: Final = ("/dev/nvidia", "/run/nvidia", "/var/run/nvidia", "/dev/char")
# Mounting a parent directory exposes the device nodes as well.
DEVICE_PARENTS: Final = frozenset({"/", "/dev", "/run", "/var/run", "/var"})
# What reaches the accounting from the side: the kubelet's state (device-plugin sockets,
# other pods' volumes and limit caches), /proc (/proc/<pid>/root is the host's root),
# and the container runtimes' sockets and state. Their parents count too.
SIDE_ROOTS: Final = (
    "/var/lib/kubelet",
    "/proc",
    "/run/containerd",
    "/var/run/containerd",
    "/var/lib/containerd",
    "/run/crio",
    "/var/run/crio",
    "/var/lib/containers",
    "/run/docker.sock",
    "/var/run/docker.sock",
    "/var/lib/docker",
    "/run/cri-dockerd.sock",
    "/var/run/cri-dockerd.sock",
    "/run/k3s",
    "/var/lib/rancher",
)
# The GPU stack's configuration: CDI specs and the NVIDIA runtime's settings decide
# which devices every pod on the node gets. Reading them is harmless; writing is not.
CONFIG_ROOTS: Final = (
    "/etc/cdi",
    "/run/cdi",
    "/var/run/cdi",
    "/etc/nvidia-container-runtime",
    "/etc/nvidia-container-toolkit",
    "/usr/local/nvidia",
)
# The host's GPU stack: sysfs (a PCI remove, reset or unbind of a card other pods use),
# the driver libraries and tools the NVIDIA runtime mounts into every GPU container (and
# their usrmerge aliases), and the runtime's hook. Reading them is harmless; writing
# them changes what every GPU container on the node runs.
STACK_ROOTS: Final = (
    "/sys",
    "/usr/lib/x86_64-linux-gnu",
    "/lib/x86_64-linux-gnu",
    "/usr/lib/aarch64-linux-gnu",
    "/lib/aarch64-linux-gnu",
    "/usr/lib64",
    "/lib64",
    "/usr/bin/nvidia-smi",
    "/bin/nvidia-smi",
    "/usr/bin/nvidia-container-runtime",
    "/usr/bin/nvidia-container-runtime-hook",
    "/usr/bin/nvidia-container-toolkit",
    "/usr/bin/nvidia-ctk",
    "/bin/nvidia-container-runtime",
    "/bin/nvidia-container-runtime-hook",
    "/bin/nvidia-container-toolkit",
    "/bin/nvidia-ctk",
)
# ... and those files wherever a distribution or the GPU Operator puts them.
STACK_FILE_PREFIXES: Final = (
    "libcuda",
    "libnvidia-",
    "nvidia-smi",
    "nvidia-container-",
    "nvidia-ctk",
)
# The NVIDIA container toolkit reads device requests from mounts below these: it cleans
# a mount's destination and matches its root as a string prefix (internal/config/image/
# cuda_image.go, requestsFromMounts), so .../nvidia-container-devicesall asks for "all".
DEVICE_REQUEST_DIRS: Final = ("/var/run/nvidia-container-devices", "/run/nvidia-container-devices")
# In every spelling of a path those roots start (cleaned or not).
DEVICE_REQUEST_MARK: Final = "nvidia-container-devices"
# Paths inside the container that a node component reads (cleaned), besides the lock and
# MPS pipe directories of the policy and its containerPaths.protected: a pod mount at one
# or below one shadows what the device plugin or the mutation put there. HAMi's device
# plugin mounts its ld.so.preload at PRELOAD_FILE (a pod mount there at equal depth
# wins), and, where the node holds a vGPU license, /tmp/license and a validator at
# /usr/bin/vgpuvalidator; HAMi-core setenv()s each line of /overrideEnv at NVML init and
# hard-codes /usr/local/vgpu (HAMi's per-container directory, the library) and
# /tmp/vgpulock.
# Paths HAMi hard-codes inside the container, no temporary files of ours.
HAMI_LOCK_DIR: Final = "/tmp/vgpulock"  # noqa: S108
HAMI_LICENSE: Final = ("/tmp/license", "/usr/bin/vgpuvalidator")  # noqa: S108
READ_PATHS: Final = (
    PRELOAD_FILE,
    OVERRIDE_ENV_FILE,
    posixpath.dirname(LIBRARY_PATH),
    HAMI_LOCK_DIR,
    *HAMI_LICENSE,
)


class ReadPaths(NamedTuple):
    """Where a pod mount shadows the GPU stack under one policy."""

    roots: tuple[str, ...]
    # A mountPath cleans to one of them or below only if one of its "/"-separated parts
    # is a root's last component (normpath never creates or changes a component): a set
    # test of the split path, two C calls a mount (a pattern of the names costs ~3,000
    # instructions a search, a pod's worth ~10% of a /mutate).
    names: frozenset[str]


@functools.cache
def _read_paths(lock: str, pipe: str, extra: tuple[str, ...]) -> ReadPaths:
    roots = tuple(dict.fromkeys((*READ_PATHS, normalised(lock), normalised(pipe), *extra)))
    return ReadPaths(roots, frozenset(posixpath.basename(root) for root in roots))


def mount_marks(policy: Policy) -> list[str]:
    """What a mountPath must contain for :func:`_mount_findings` to look at it: the read
    paths' last components and the toolkit's device-request mark (the scope sends those)."""
    return sorted({*read_paths(policy).names, DEVICE_REQUEST_MARK} - {""})


def read_paths(policy: Policy) -> ReadPaths:
    """The paths inside containers that the GPU stack reads under ``policy``."""
    return _read_paths(policy.lock_host_path, policy.mps_pipe_directory, policy.container_paths)


# Not frozen: built per request, and a frozen field costs an object.__setattr__.
@dataclass(slots=True)
class Subject:
    """What the rules look at: the pod view, its requests and mode, and the request facts."""

    view: PodView
    requests: PodRequests
    mode: Mode
    operation: str
    phase: Phase
    # What the mutation injects for this pod (nothing unless it shares a GPU).
    injection: Injection
    # Who makes the request: the ledgers' writers may change their annotations.
    username: str = ""
    groups: tuple[str, ...] = ()
    # On an UPDATE of a pod: the annotations before it.
    previous: Mapping[str, Any] | None = None
    namespace: str = ""
    # Whole GPUs kept off the pool, dynamic MIG, a vgpu pod without HAMi-core.
    treatment: Treatment = PLAIN
    # A new pod, or a template (whose pods will all be created). Set once: most rules ask.
    created: bool = field(init=False)

    def __post_init__(self) -> None:
        self.created = self.view.template or self.operation == "CREATE"


def node_name_pinning(subject: Subject) -> Iterator[Finding]:
    if not subject.requests.gpu or not subject.created:
        return
    node = subject.view.spec.get("nodeName")
    if node:
        yield Finding(
            "node-name-pinning",
            f"spec.nodeName {quoted(node)} skips GPU scheduling; use nodeSelector or affinity instead",
        )


def _within(path: str, roots: Iterable[str]) -> bool:
    """``path`` is one of ``roots`` or lies below one."""
    return any(path == root or path.startswith(root.rstrip("/") + "/") for root in roots)


def _protected(path: str, policy: Policy) -> bool:
    """``path`` (normalised) reaches devices, limits or accounting, or contains what does."""
    if path in DEVICE_PARENTS or path.startswith(DEVICE_PATH_PREFIXES):
        return True
    roots = (
        *SIDE_ROOTS,
        posixpath.dirname(policy.library_host_path),
        policy.lock_host_path,
        policy.mps_pipe_directory,
        *policy.protected_host_paths,
    )
    for root in roots:
        root = normalised(root)
        if path == root or path.startswith(root + "/") or root.startswith(path + "/"):
            return True
    return False


def _contains(path: str, roots: Iterable[str]) -> bool:
    """``path`` is one of ``roots``, lies below one, or is a parent of one."""
    return any(
        path == root or path.startswith(root + "/") or root.startswith(path + "/") for root in roots
    )


def _written(spec: Mapping[str, Any]) -> set[str]:
    """Names of the volumes some container mounts without readOnly."""
    names: set[str] = set()
    for kind in CONTAINER_KINDS:
        containers = spec.get(kind)
        for container in containers if isinstance(containers, list) else ():
            mounts = as_mapping(container).get("volumeMounts")
            for mount in mounts if isinstance(mounts, list) else ():
                mount = as_mapping(mount)
                name = mount.get("name")
                if isinstance(name, str) and mount.get("readOnly") is not True:
                    names.add(name)
    return names


def _stack(path: str, policy: Policy) -> bool:
    """``path`` (normalised) is, lies in or contains the host's GPU stack, or one of the
    policy's driver roots (``hostPaths.driverRoots``)."""
    return (
        _contains(path, STACK_ROOTS)
        or _contains(path, policy.driver_roots)
        or posixpath.basename(path).startswith(STACK_FILE_PREFIXES)
    )


def _host_path_findings(subject: Subject, policy: Policy) -> Iterator[Finding]:
    volumes = subject.view.spec.get("volumes")
    if not isinstance(volumes, list):
        return
    # Allow-list mode binds pods that ask for a GPU; the deny list binds every pod.
    allowlist = policy.host_path_mode == "allowlist" and subject.requests.gpu
    written: set[str] | None = None  # found at the first configuration path
    for volume in volumes:
        if not isinstance(volume, MAPPINGS):
            continue
        host = volume.get("hostPath")
        # None first: most volumes have no hostPath, and isinstance(None, Mapping) goes
        # through ABCMeta.__instancecheck__.
        if host is None or not isinstance(host, MAPPINGS):
            continue
        raw = host.get("path")
        if not isinstance(raw, str) or subject.injection.allows(volume):
            continue
        path = normalised(raw)
        name = volume.get("name")
        if _protected(path, policy):
            yield Finding(
                "host-device-access",
                f'volume "{name}": hostPath {raw} exposes GPUs, their limits or the node\'s '
                "accounting; request GPUs in limits",
            )
        elif _contains(path, CONFIG_ROOTS) and name in (
            written if written is not None else (written := _written(subject.view.spec))
        ):
            yield Finding(
                "host-device-access",
                f'volume "{name}": hostPath {raw} holds the GPU runtime\'s configuration; '
                "mount it readOnly",
            )
        elif _stack(path, policy) and name in (
            written if written is not None else (written := _written(subject.view.spec))
        ):
            yield Finding(
                "host-device-access",
                f'volume "{name}": hostPath {raw} holds the node\'s GPU stack (sysfs, the '
                "driver's libraries and tools, the policy's hostPaths.driverRoots); mount it "
                "readOnly",
            )
        elif allowlist and not _within(path, policy.allowed_host_paths):
            yield Finding(
                "host-device-access",
                f'volume "{name}": hostPath {raw} is not in the policy\'s allowed host paths',
            )


def _label(kind: ContainerKind, container: Mapping[str, Any]) -> str:
    name = container.get("name")
    return describe(kind, name if isinstance(name, str) else "")


def _visible_devices(label: str, value: str | None, *, source: str = "") -> Finding | None:
    if value is None:
        return Finding(
            "raw-visible-devices",
            f"{label}: NVIDIA_VISIBLE_DEVICES from valueFrom; request GPUs in resources.limits",
        )
    if value.strip().lower() not in HARMLESS_VISIBLE_DEVICES:
        return Finding(
            "raw-visible-devices",
            f"{label}: NVIDIA_VISIBLE_DEVICES={quoted(value[:24])}{source}; remove it, request GPUs in limits",
        )
    return None


def devices_from_ledger(
    entry: Mapping[str, Any],
    container: Mapping[str, Any],
    *,
    kind: ContainerKind,
    index: int,
    subject: Subject,
    policy: Policy,
) -> bool:
    """The env ``entry`` takes NVIDIA_VISIBLE_DEVICES from the ConfigMap a ledger's
    writers keep for this very container (``visibleDevicesFrom``): KAI's admission webhook
    points a fractional pod's container there (configMapKeyRef, key NVIDIA_VISIBLE_DEVICES,
    not optional), named ``<nameAnnotation>-<index>`` (``i<index>`` in an init container:
    NVIDIA/KAI-Scheduler pkg/binder/common/gpusharingconfigmap/config_map.go:114-126 @
    72de64fc), and its binder writes there the GPUs its scheduler picked. Only the
    writers may write such a ConfigMap (:func:`~webhook.core.objects.kept_by_writer`), so
    the pod gets what the scheduler counted: when it names that scheduler, asks with one
    of its annotations, is not pinned to a node past it (nodeName), and the container asks
    for no GPU resource of its own and is the one container the writers serve (the one
    ``containerAnnotation`` names, else the first: KAI's GetFractionContainerRef,
    pkg/binder/common/gpu_access.go:161-198 @ 72de64fc). Any other container would read a
    ConfigMap of that name the binder wrote for another pod, whose GPU KAI counted there."""
    source = as_mapping(entry.get("valueFrom"))
    ref = as_mapping(source.get("configMapKeyRef"))
    name = ref.get("name")
    if (
        set(source) != {"configMapKeyRef"}
        or ref.get("key") != "NVIDIA_VISIBLE_DEVICES"
        or ref.get("optional") is True
        or not isinstance(name, str)
        or kind == "ephemeralContainers"
    ):
        return False
    spec = subject.view.spec
    if spec.get("nodeName") or asks_for_gpu(container, policy):
        return False
    annotations = as_mapping(as_mapping(subject.view.metadata).get("annotations"))
    suffix = f"i{index}" if kind == "initContainers" else str(index)
    for ledger in policy.ledgers:
        wanted = ledger.devices_from
        if wanted is None or spec.get("schedulerName") != wanted.scheduler_name:
            continue
        if not any(a in annotations for a in wanted.request_annotations):
            continue
        prefix = annotations.get(wanted.name_annotation)
        if (
            isinstance(prefix, str)
            and name == f"{prefix}-{suffix}"
            and match_any(name, ledger.config_maps)
            and _served(container, kind, index, annotations, wanted)
        ):
            return True
    return False


def _served(
    container: Mapping[str, Any],
    kind: ContainerKind,
    index: int,
    annotations: Mapping[str, Any],
    wanted: DevicesFrom,
) -> bool:
    """``container`` is the one whose devices the ledger's writers keep: the one its
    container annotation names, else the pod's first container."""
    named = annotations.get(wanted.container_annotation) if wanted.container_annotation else None
    if isinstance(named, str):
        return container.get("name") == named
    return kind == "containers" and index == 0


def variable_findings(
    label: str, name: Any, value: str | None, *, gpu: bool, policy: Policy, source: str = ""
) -> Iterator[Finding]:
    """The env rules on one variable ``name`` = ``value`` (None: from valueFrom) of a
    container; ``source`` says where a value that is not inline comes from."""
    if name == "NVIDIA_VISIBLE_DEVICES":
        finding = _visible_devices(label, value, source=source)
        if finding is not None:
            yield finding
    elif gpu and isinstance(name, str) and name in _SWITCHES:
        why = _loosening(name, value, policy)
        if why is not None:
            shown = " from valueFrom" if value is None else f"={quoted(value)}"
            yield Finding("limit-tampering", f"{label}: {name}{shown}{source} {why}; remove it")


# What _reached says of a path with a '..' segment beside anything the GPU stack reads.
_BACKSTEP: Final = ".."


def _reached(target: str, reads: ReadPaths) -> str | None:
    """What a container path ``target`` reaches of what the GPU stack reads: nothing
    (None: it names neither the device-request mark nor a read path's name, the cheap
    test nearly every path fails), :data:`_BACKSTEP`, or what :func:`_shadowed` says. The
    toolkit and the runtime clean a path; the in-apiserver policies cannot (CEL has no
    path resolution) and judge pods no webhook sees on 1.36+, so a '..' beside anything
    the stack reads is refused wherever it leads."""
    segments = target.split("/")
    if DEVICE_REQUEST_MARK not in target and reads.names.isdisjoint(segments):
        return None
    if _BACKSTEP in segments:
        return _BACKSTEP
    return _shadowed(target, reads)


def _shadowed(target: str, reads: ReadPaths) -> str | None:
    """What the GPU stack reads that a mount at ``target`` (which holds a read path's
    last component or the device-request mark) shadows, or None."""
    path = normalised(target)
    if target.startswith(DEVICE_REQUEST_DIRS) or path.startswith(DEVICE_REQUEST_DIRS):
        return "device-request"
    for root in reads.roots:
        if path == root or path.startswith(root + "/"):
            return root
    return None


def _injected_mount(mount: Mapping[str, Any], subject: Subject, *, mutated: bool) -> bool:
    """``mount`` is one the mutation injects, of the volume it injects under that name, or,
    in a container the mutation mutates (``mutated``), one at a path where the mutation puts
    its own mount instead (it matches mounts by mountPath, as the MutatingAdmissionPolicy's
    apply does)."""
    injection = subject.injection
    if (
        mutated
        and subject.phase == "mutate"
        and subject.created
        and any(mount.get("mountPath") == injected["mountPath"] for injected in injection.mounts)
    ):
        return True
    # As the mutation matches its own (mutation._same_mount): name, path, read-only as
    # injected, no subPath.
    if (
        mount.get("subPath")
        or mount.get("subPathExpr")
        or not any(
            mount.get("name") == injected["name"]
            and mount.get("mountPath") == injected["mountPath"]
            and bool(mount.get("readOnly")) == bool(injected.get("readOnly"))
            for injected in injection.mounts
        )
    ):
        return False
    if subject.phase == "mutate" and subject.created:
        # The mutation puts its own volume under that name, whatever the pod has there.
        return True
    volumes = subject.view.spec.get("volumes")
    return any(
        isinstance(v, MAPPINGS) and v.get("name") == mount["name"] and injection.allows(v)
        for v in (volumes if isinstance(volumes, list) else ())
    )


# Who reads each channel's names, for the messages.
_READERS: Final = {
    "raw-visible-devices": "the NVIDIA container runtime",
    "limit-tampering": "HAMi-core or the MPS client",
}
CLASS_WORDS: Final[dict[str, str]] = {
    "slice": "containers that ask for part of a GPU",
    "whole": "containers that ask only for whole GPUs",
    "none": "containers that ask for no GPU",
}


def _allowlist_finding(
    label: str,
    name: str,
    value: str | None,
    klass: ContainerClass,
    policy: Policy,
    *,
    mps_client: bool,
) -> Finding | None:
    """The env channel's default-deny on one entry of a guarded name that no rule of its
    own judges (webhook.core.env.channel_of, managed), in a container of class ``klass``
    that is or is not an MPS client the mutation sets up."""
    channel = channel_of(name)
    # A device pin's value grants nothing: what the mutation sets is no violation.
    if (
        channel is None
        or managed(name, mps_client=mps_client)
        or (value is not None and DEVICE_PINS.get(name) == value)
    ):
        return None
    shown_value = None if opaque(value) else value
    if policy.env_admits(name, shown_value, klass):
        return None
    rule = CHANNEL_RULES[channel]
    shown = " from valueFrom" if value is None else f"={quoted(value[:40])}"
    where = [c for c in CONTAINER_CLASSES if c != klass and policy.env_admits(name, shown_value, c)]
    if where:
        hint = "; the policy's env.allowed admits it only in " + " and ".join(
            CLASS_WORDS[c] for c in where
        )
    elif policy.env_allowances_for(name):
        hint = "; that value is not one the policy's env.allowed admits"
    else:
        hint = "; no entry of the policy's env.allowed admits it"
    return Finding(rule, f"{label}: {name}{shown} is read by {_READERS[rule]}{hint}; remove it")


def _mount_findings(
    kind: ContainerKind,
    container: Mapping[str, Any],
    mounts: list[Any],
    subject: Subject,
    reads: ReadPaths,
    read_only: frozenset[str],
    *,
    mutated: bool,
) -> list[Finding]:
    # A list, not a generator: it runs for every container and nearly always finds nothing.
    found: list[Finding] = []
    for mount in mounts:
        if not isinstance(mount, MAPPINGS):
            continue
        target = mount.get("mountPath")
        shadowed = _reached(target, reads) if isinstance(target, str) else None
        if shadowed == _BACKSTEP:
            found.append(
                Finding(
                    "host-device-access",
                    f"{_label(kind, container)}: a mount at {target} names a path the GPU "
                    "stack reads with '..'; write the path without '..'",
                )
            )
        elif shadowed == "device-request":
            found.append(
                Finding(
                    "host-device-access",
                    f"{_label(kind, container)}: a mount at {target} asks the NVIDIA runtime for "
                    "devices; request GPUs in limits",
                )
            )
        elif shadowed is not None and not _injected_mount(mount, subject, mutated=mutated):
            found.append(
                Finding(
                    "host-device-access",
                    f"{_label(kind, container)}: a mount at {target} shadows {shadowed}, which "
                    "the GPU stack reads inside the container; mount it elsewhere",
                )
            )
        name = mount.get("name")
        # A list or map as a name is unhashable; only a string can name our volume.
        if isinstance(name, str) and name in read_only and mount.get("readOnly") is not True:
            found.append(
                Finding(
                    "host-device-access",
                    f'{_label(kind, container)}: volume "{name}" is shared with every GPU pod '
                    "on the node; mount it readOnly",
                )
            )
    return found


def _sets(container: Mapping[str, Any], name: str) -> bool:
    """Some env entry of ``container`` is named ``name``."""
    env = container.get("env")
    return isinstance(env, list) and any(
        isinstance(entry, MAPPINGS) and entry.get("name") == name for entry in env
    )


def _shared_host_volumes(spec: Mapping[str, Any], policy: Policy) -> frozenset[str]:
    """Names of the pod's hostPath volumes of a file every vGPU or MPS pod of the node
    shares (the library, the preload file, the MPS pipe directory), whatever the volume
    is called and whether or not the pod asks for a GPU: a writable mount of one, even in
    a debug container added later to a pod admitted under an older policy, rewrites it
    for every pod of the node."""
    volumes = spec.get("volumes")
    if not isinstance(volumes, list):
        return frozenset()
    shared = policy.shared_host_paths
    names: set[str] = set()
    for volume in volumes:
        if isinstance(volume, MAPPINGS):
            host = volume.get("hostPath")
            if isinstance(host, MAPPINGS):
                path, name = host.get("path"), volume.get("name")
                if isinstance(path, str) and isinstance(name, str) and normalised(path) in shared:
                    names.add(name)
    return frozenset(names)


def _container_findings(subject: Subject, policy: Policy) -> Iterator[Finding]:
    """The rules that look inside each container, in one walk over every container,
    init container and ephemeral container: privileged-gpu, raw-visible-devices,
    limit-tampering's switches and host-device-access's mounts."""
    gpu = subject.requests.gpu
    # A legacy image is fixed by the mutation's void, which a new pod gets before
    # validation; what reaches validation without it (or an update) is refused.
    legacy = subject.phase == "validate" or not subject.created
    # The env names variable_findings judges: one set lookup per entry.
    judged = _GPU_JUDGED_ENV if gpu else _JUDGED_ENV
    reads = read_paths(policy)
    # The containers whose mounts the mutation sets (mutation.mutate: sharing containers
    # and init containers, when the mode injects any).
    mutated = (
        {
            r.name
            for r in subject.requests.containers
            if r.shares and r.kind != "ephemeralContainers"
        }
        if subject.injection.mounts
        else set()
    )
    # The containers the mutation gives the MPS client's settings (wanted_env): those
    # that share a GPU in an MPS pod (an ephemeral container cannot ask for one).
    mps_clients = (
        {r.name for r in subject.requests.containers if r.shares}
        if subject.mode == "mps"
        else set()
    )
    spec = subject.view.spec
    read_only = subject.injection.read_only_volumes | _shared_host_volumes(spec, policy)
    # Under the NVIDIA runtime a container without the void sees what its image bakes.
    runtime = legacy and gpu_runtime(spec, policy)
    for kind in CONTAINER_KINDS:
        containers = spec.get(kind)
        if not isinstance(containers, list):
            continue
        for index, container in enumerate(containers):
            if not isinstance(container, MAPPINGS):
                continue
            if gpu:
                context = as_mapping(container.get("securityContext"))
                if context.get("privileged") is True:
                    yield Finding(
                        "privileged-gpu",
                        f"{_label(kind, container)}: privileged in a GPU pod sees every GPU; "
                        "remove securityContext.privileged",
                    )
                added = as_mapping(context.get("capabilities")).get("add")
                if isinstance(added, list) and any(
                    isinstance(c, str) and c.upper() in SYS_ADMIN for c in added
                ):
                    yield Finding(
                        "privileged-gpu",
                        f"{_label(kind, container)}: CAP_SYS_ADMIN in a GPU pod makes the NVIDIA "
                        "runtime honour any device list it asks for; remove it from "
                        "securityContext.capabilities.add",
                    )
            if legacy_image(container):
                if not asks_for_gpu(container, policy):
                    if legacy:
                        yield Finding(
                            "raw-visible-devices",
                            f"{_label(kind, container)}: CUDA_VERSION without NVIDIA_REQUIRE_CUDA "
                            "makes the NVIDIA runtime hand it every GPU; set "
                            "NVIDIA_VISIBLE_DEVICES=void or request GPUs in limits",
                        )
                elif (
                    gpu
                    and _sets(container, "NVIDIA_REQUIRE_CUDA")
                    and container_class(container, policy) == "slice"
                ):
                    # Only where the pod's own empty NVIDIA_REQUIRE_CUDA overrides the
                    # image's: an image's requirement cannot be seen, and modern ones set it.
                    # container_config.go: a legacy image gets every driver capability,
                    # graphics and display too, which HAMi-core does not meter.
                    yield Finding(
                        "raw-visible-devices",
                        f"{_label(kind, container)}: CUDA_VERSION without NVIDIA_REQUIRE_CUDA "
                        "makes the NVIDIA runtime give a GPU slice every driver capability "
                        "(graphics, display); set NVIDIA_REQUIRE_CUDA or remove CUDA_VERSION",
                    )
            if (
                runtime
                and not asks_for_gpu(container, policy)
                and not _sets(container, "NVIDIA_VISIBLE_DEVICES")
            ):
                yield Finding(
                    "host-device-access",
                    f"{_label(kind, container)}: runtimeClassName {spec['runtimeClassName']} "
                    "hands every GPU to a container that asks for none; set "
                    "NVIDIA_VISIBLE_DEVICES=void or request GPUs in limits",
                )
            for prefix in spelling_prefixes(container) if "envFrom" in container else ():
                yield Finding(
                    "raw-visible-devices",
                    f"{_label(kind, container)}: envFrom prefix {quoted(prefix)} can spell "
                    "NVIDIA_VISIBLE_DEVICES or a HAMi-core switch from a key; remove the prefix",
                )
            env = container.get("env")
            klass: ContainerClass | None = None  # asked for at the first guarded name
            # Every entry counts, not only the last: runtimes differ on which duplicate wins.
            for entry in env if isinstance(env, list) else ():
                if isinstance(entry, MAPPINGS):
                    name = entry.get("name")
                    if not isinstance(name, str):
                        continue
                    if name in judged:
                        if name == "NVIDIA_VISIBLE_DEVICES" and devices_from_ledger(
                            entry, container, kind=kind, index=index, subject=subject, policy=policy
                        ):
                            continue
                        yield from variable_findings(
                            _label(kind, container), name, env_value(entry), gpu=gpu, policy=policy
                        )
                    elif name.startswith(_CHANNEL_STARTS) and (
                        gpu or channel_of(name) == "devices"
                    ):
                        if klass is None:
                            klass = container_class(container, policy)
                        finding = _allowlist_finding(
                            _label(kind, container),
                            name,
                            env_value(entry),
                            klass,
                            policy,
                            # A string first: a list or map as a name is unhashable.
                            mps_client=isinstance(cname := container.get("name"), str)
                            and cname in mps_clients,
                        )
                        if finding is not None:
                            yield finding
            mounts = container.get("volumeMounts")
            if isinstance(mounts, list):
                yield from _mount_findings(
                    kind,
                    container,
                    mounts,
                    subject,
                    reads,
                    read_only,
                    # A string first: a list or map as a name is unhashable.
                    mutated=isinstance(name := container.get("name"), str) and name in mutated,
                )
            devices = container.get("volumeDevices")
            if isinstance(devices, list):
                yield from _device_findings(kind, container, devices, reads)


def _device_findings(
    kind: ContainerKind, container: Mapping[str, Any], devices: list[Any], reads: ReadPaths
) -> Iterator[Finding]:
    """A raw block device (a Block PVC's ``volumeDevices``) at a path the GPU stack reads:
    runc makes or bind-mounts the device node there, over what the device plugin or the
    mutation put (the library, the preload list). No device is ever injected."""
    for device in devices:
        if not isinstance(device, MAPPINGS):
            continue
        target = device.get("devicePath")
        if isinstance(target, str) and _reached(target, reads) is not None:
            yield Finding(
                "host-device-access",
                f"{_label(kind, container)}: a block device at {target} replaces what the "
                "GPU stack reads there; put it elsewhere",
            )


# Any key containing cdi.k8s.io: the NVIDIA runtime's cdi mode reads the keys under its
# annotation-prefixes (cdi.k8s.io/ by default, nvidia.cdi.k8s.io/ under the GPU Operator)
# and gives a bare device name its default kind, so "all" is nvidia.com/gpu=all; the
# toolkit's NRI plugin reads its domain as a bare key too, where containerd/nri's
# GetEffectiveAnnotation finds no /container.<name> or /pod form
# (nvidia-container-toolkit cmd/nvidia-ctk-installer/container/runtime/nri/plugin.go:42,
# 85,105 @ d34b3046).
CDI_MARK: Final = "cdi.k8s.io"
# Keys starting so are CDI device requests to NRI plugins: the toolkit's
# (nodeResourceCDIDeviceKey, nriCDIDeviceKey) and containerd's device injector.
CDI_PREFIXES: Final = ("cdi-devices.noderesource.dev", "cdi-devices.nri.io")
# CRI-O's devices annotation (cri-o pkg/annotations/v2: Devices and the deprecated
# V1Devices), read from the sandbox's annotations for every container it creates.
CRIO_DEVICE_KEYS: Final = ("devices.crio.io", "io.kubernetes.cri-o.Devices")


def unlisted_devices(value: str, allowed: frozenset[str]) -> list[str]:
    """The entries of a CRI-O devices annotation ``value`` that name a host device off
    ``allowed``, as CRI-O parses it: ``$SRC[:$DST[:$MODE]]`` entries, comma-separated,
    empty ones skipped, the source compared as written (a fourth part CRI-O refuses)."""
    return [
        entry
        for entry in value.split(",")
        if entry and (entry.count(":") > 2 or entry.partition(":")[0] not in allowed)
    ]


def _cdi_findings(subject: Subject, policy: Policy) -> Iterator[Finding]:
    """The annotations runtimes copy into the OCI spec that ask for devices: any CDI key,
    CRI-O's devices off the policy's list, and the policy's refused prefixes."""
    annotations = as_mapping(as_mapping(subject.view.metadata).get("annotations"))
    if not annotations:
        return
    mark = CDI_MARK
    prefixes = policy.refused_annotation_prefixes
    for key, value in annotations.items():
        if not isinstance(key, str):
            continue
        if mark in key or key.startswith(CDI_PREFIXES):
            yield Finding(
                "host-device-access",
                f"annotation {key}={quoted(value)} asks the container runtime for CDI devices "
                "(a bare name is the NVIDIA runtime's default kind); request GPUs in limits",
            )
        elif prefixes and key.startswith(prefixes):
            yield Finding(
                "host-device-access",
                f"annotation {key} is one the policy's runtimeAnnotations.refusedPrefixes "
                "keeps from the container runtime; remove it",
            )
    # CRI-O looks its keys up exactly (GetAnnotationValue): two lookups, not a test a key.
    for key in CRIO_DEVICE_KEYS:
        value = annotations.get(key)
        if value is None:
            continue
        unlisted = unlisted_devices(str(value), policy.annotation_devices)
        if unlisted:
            yield Finding(
                "host-device-access",
                f"annotation {key} asks CRI-O for {quoted(','.join(unlisted))}, not in "
                "the policy's runtimeAnnotations.allowedDevices; request GPUs in limits",
            )


def _memory_mib(text: str) -> float | None:
    """A HAMi-core memory limit value in MiB: suffix g/m/k, no suffix means bytes."""
    text = text.strip().lower()
    scale = {"g": 1024.0, "m": 1.0, "k": 1 / 1024}.get(text[-1:] if text else "")
    number = text[:-1] if scale is not None else text
    try:
        value = float(number)
    except ValueError:
        return None
    return value * scale if scale is not None else value / (1 << 20)


def _exceeds(name: str, value: str | None, request: ContainerRequest, mode: Mode) -> str | None:
    """Why a limit variable's value exceeds what the request entitles, or None.

    Only a variable the request limits is judged (one for cores that were not requested
    only limits its own author); valueFrom hides the value, so it counts as exceeding.
    """
    hidden = "set through valueFrom"
    if mode == "vgpu" and name.startswith("CUDA_DEVICE_MEMORY_LIMIT"):
        if request.memory_mib is None:
            return None if request.memory_percentage is not None else "no memory was requested"
        if value is None:
            return hidden
        mib = _memory_mib(value)
        if mib is None or mib <= 0 or mib > request.memory_mib:
            return f"above the {request.memory_mib} MiB requested"
    elif request.cores is not None and (
        (mode == "vgpu" and name.startswith("CUDA_DEVICE_SM_LIMIT"))
        or (mode == "mps" and name == "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")
    ):
        if value is None:
            return hidden
        if not _PERCENT.fullmatch(value) or not 0 < int(value) <= request.cores:
            return f"above the {request.cores}% cores requested"
    elif mode == "mps" and name == "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT" and request.memory_mib:
        if value is None:
            return hidden
        for part in value.split(","):
            _, _, amount = part.partition("=")
            mib = _memory_mib(amount)
            if mib is None or mib <= 0 or mib > request.memory_mib:
                return f"above the {request.memory_mib} MiB requested"
    return None


# Why each switch, when it loosens, does so: the webhook's messages and the CEL's alike.
LOOSENING: Final[Mapping[str, str]] = {
    "CUDA_DISABLE_CONTROL": "switches GPU limits off",
    "GPU_CORE_UTILIZATION_POLICY": "loosens limits; use default or force",
    "CUDA_REDIRECT": "makes HAMi-core skip its hooks",
    "ACTIVE_OOM_KILLER": "turns HAMi-core's out-of-memory killer off",
    "CGPU_DISABLE": "switches ACK's cGPU isolation off",
    REGION_VARIABLE: "hides HAMi-core's region from HAMi's vGPU monitor or shares it; leave it "
    f"unset, or a .cache file directly in {REGION_DIR}",
    "CUDA_TASK_PRIORITY": "is no priority HAMi knows (0 high, 1 low); ask for nvidia.com/priority",
}


def _loosening(name: str, value: str | None, policy: Policy) -> str | None:
    """Why an env entry switches HAMi-core's enforcement off or loosens it, or None.

    A value from valueFrom or with $(VAR) references is only known once the kubelet
    expands it, so it counts as loosening.
    """
    if _loosens(name, value, policy):
        return LOOSENING[name]
    return None


def _loosens(name: str, value: str | None, policy: Policy) -> bool:
    if name == "CUDA_DISABLE_CONTROL":
        # HAMi's device plugin drops the preload when any entry parses true.
        return opaque(value) or str(value).strip().lower() in TRUTHY
    if name == "GPU_CORE_UTILIZATION_POLICY":
        return not policy.allow_disable_core_utilization_policy and (
            opaque(value) or str(value).strip().lower() == "disable"
        )
    if name == "CUDA_REDIRECT":
        # HAMi-core resolves every CUDA symbol in the named library instead: no hooks.
        return opaque(value) or bool(value)
    if name == "ACTIVE_OOM_KILLER":
        return opaque(value) or str(value).strip().lower() in FALSY
    if name == "CGPU_DISABLE":
        # ACK's device plugin sets it true only where the node's isolation is off
        # (gpushare-device-plugin allocate.go); from the pod it wins over the plugin's.
        return opaque(value) or str(value).strip().lower() not in FALSY
    if name == REGION_VARIABLE:
        # HAMi's device plugin sets a file in its per-container directory; the pod's
        # value wins over it (the kubelet appends the pod's env after the plugin's).
        return opaque(value) or not region_readable(str(value))
    if name == "CUDA_TASK_PRIORITY":
        return opaque(value) or str(value).strip() not in _PRIORITY_TEXTS
    return False


_PRIORITY_TEXTS: Final = frozenset(str(p) for p in PRIORITIES)


def limit_tampering(subject: Subject) -> Iterator[Finding]:
    """Limit variables above what the request entitles (the switches are judged in
    :func:`_container_findings`)."""
    if subject.phase != "validate" or not subject.created:
        return
    # What the mutation would overwrite is a warning at /mutate; reaching validation
    # with limits above the request means something else set them.
    # Without HAMi-core (vgpu.withoutLibrary) nothing on the node reads the vGPU limits.
    if subject.mode == "vgpu" and not subject.treatment.library:
        return
    for request in subject.requests.containers:
        if not request.shares or subject.mode not in ("vgpu", "mps"):
            continue
        container = subject.view.spec[request.kind][request.index]
        for name, entry in effective_env(container).items():
            managed = (
                name.startswith(VGPU_LIMIT_PREFIXES)
                if subject.mode == "vgpu"
                else name in MPS_LIMIT_VARS
            )
            if not managed:
                continue
            why = _exceeds(name, env_value(entry), request, subject.mode)
            if why:
                yield Finding("limit-tampering", f"{request.label}: {name} {why}; remove it")


def host_namespaces(subject: Subject) -> Iterator[Finding]:
    """hostPID and hostIPC in a GPU pod (or template), bar the hostIPC an mps pod gets."""
    spec = subject.view.spec
    if spec.get("hostPID") is True:
        yield Finding(
            "host-device-access",
            "hostPID in a GPU pod reaches every container's /proc/<pid>/root on the node, "
            "their GPUs and limits; remove spec.hostPID",
        )
    if spec.get("hostIPC") is True and not (subject.mode == "mps" and subject.requests.sharing):
        yield Finding(
            "host-device-access",
            f"hostIPC in a {subject.mode} GPU pod shares the node's IPC with the MPS daemon "
            "and other pods; remove spec.hostIPC (mps mode sets it where the policy allows)",
        )


def _class_resources(spec: Mapping[str, Any], policy: Policy) -> list[tuple[str, str]]:
    """(container label, class) of every resource a container asks DRA for by class."""
    # A lookup per GPU class and part, not a scan of every resource name: this runs on
    # every pod created.
    wanted = policy.gpu_class_resources
    found: list[tuple[str, str]] = []
    for kind in CONTAINER_KINDS:
        containers = spec.get(kind)
        for container in containers if isinstance(containers, list) else ():
            if not isinstance(container, MAPPINGS):
                continue
            resources = container.get("resources")
            if resources is None:
                continue
            resources = as_mapping(resources)
            for part in ("limits", "requests"):
                amounts = as_mapping(resources.get(part))
                for name, device_class in wanted:
                    # A zero amount asks for nothing (the kubelet allocates none); a zero
                    # of another GPU resource beside it leaves it asked.
                    if name in amounts and not is_zero(amounts[name]):
                        item = (_label(kind, container), device_class)
                        if item not in found:  # in limits and requests: once
                            found.append(item)
    return found


def gpu_claims(subject: Subject, policy: Policy) -> Iterator[Finding]:
    """A pod asking DRA for a GPU device class by its extended resource outside the
    namespaces that may claim GPUs.

    A claim beside GPU-sharing resources is judged by its device class, which only the
    cluster view knows (:func:`webhook.core.context.claimed_gpus`): from the pod spec
    alone a claim on the IMEX channel of a ComputeDomain looks like one on whole GPUs,
    and the claim itself was judged when it was written (:mod:`webhook.core.objects`).
    """
    if not policy.gpu_class_resources or match_any(subject.namespace, policy.claim_namespaces):
        return
    for label, device_class in _class_resources(subject.view.spec, policy):
        yield Finding(
            "gpu-claim",
            f"{label}: {DEVICE_CLASS_RESOURCE}{device_class} asks DRA for whole GPUs the "
            f"sharing scheduler never counts, and namespace {quoted(subject.namespace)} is "
            "not in the policy's dra.allowedNamespaces; claim GPUs in a namespace listed there",
        )


def mps_percentage(subject: Subject) -> Iterator[Finding]:
    """An mps pod asking for memory as a percentage the view did not turn into MiB: MPS
    caps memory only by CUDA_MPS_PINNED_DEVICE_MEM_LIMIT, in MiB, so the client would
    get the whole card."""
    if subject.mode != "mps":
        return
    for request in subject.requests.containers:
        if request.memory_percentage is not None and request.memory_mib is None:
            yield Finding(
                "mode-conflict",
                f"{request.label}: mps caps memory in MiB only, and a percentage of an unknown "
                "card cannot be turned into one; ask for nvidia.com/gpumem (MiB)",
            )


def invalid_gpu_request(subject: Subject) -> Iterator[Finding]:
    for request in subject.requests.containers:
        yield from request.problems


def _gpus(request: ContainerRequest) -> int:
    """GPU devices a container gets: its (v)GPUs, or its MIG instances."""
    return request.gpus if request.shares else sum(request.mig.values())


class Totals(NamedTuple):
    gpus: int
    memory_mib: int
    # Percent of a card, summed over every vGPU (HAMi's quota counts cores so).
    cores: int


def pod_totals(requests: PodRequests) -> Totals:
    """GPUs, MiB and cores the pod holds at its peak, as Kubernetes sums effective requests.

    Main containers and sidecars (restartPolicy Always init containers) run together;
    a plain init container runs alone, beside the sidecars declared before it.
    """
    # Scalars rather than per-container tuples: this runs on every GPU pod.
    main_gpus = main_memory = main_cores = 0
    side_gpus = side_memory = side_cores = 0
    init_gpus = init_memory = init_cores = 0
    for request in requests.containers:
        gpus = _gpus(request)
        memory = (request.memory_mib or 0) * request.gpus
        cores = (request.cores or 0) * request.gpus
        if request.kind == "containers":
            main_gpus += gpus
            main_memory += memory
            main_cores += cores
        elif request.kind == "initContainers" and request.sidecar:
            side_gpus += gpus
            side_memory += memory
            side_cores += cores
        elif request.kind == "initContainers":
            init_gpus = max(init_gpus, gpus + side_gpus)
            init_memory = max(init_memory, memory + side_memory)
            init_cores = max(init_cores, cores + side_cores)
    return Totals(
        max(main_gpus + side_gpus, init_gpus),
        max(main_memory + side_memory, init_memory),
        max(main_cores + side_cores, init_cores),
    )


def gpu_quota(subject: Subject, policy: Policy) -> Iterator[Finding]:
    if not subject.requests.containers:
        return
    per_container = policy.container_maxima
    per_pod = policy.pod_maxima
    for request in subject.requests.containers:
        gpus = _gpus(request)
        memory = (request.memory_mib or 0) * request.gpus
        if per_container.gpus is not None and gpus > per_container.gpus:
            yield Finding(
                "gpu-quota", f"{request.label}: {gpus} GPUs, at most {per_container.gpus}"
            )
        if per_container.memory_mib is not None and memory > per_container.memory_mib:
            yield Finding(
                "gpu-quota",
                f"{request.label}: {memory} MiB of GPU memory, at most {per_container.memory_mib}",
            )
        if (
            per_container.cores is not None
            and request.cores is not None
            and request.cores > per_container.cores
        ):
            yield Finding(
                "gpu-quota",
                f"{request.label}: {request.cores}% cores, at most {per_container.cores}",
            )
    gpus, memory, _ = pod_totals(subject.requests)
    if per_pod.gpus is not None and gpus > per_pod.gpus:
        yield Finding("gpu-quota", f"pod: {gpus} GPUs in all, at most {per_pod.gpus}")
    if per_pod.memory_mib is not None and memory > per_pod.memory_mib:
        yield Finding(
            "gpu-quota", f"pod: {memory} MiB of GPU memory in all, at most {per_pod.memory_mib}"
        )


def scheduler_bypass(subject: Subject, policy: Policy) -> Iterator[Finding]:
    if subject.treatment.whole and subject.created:
        selected = pool_selection(subject.view.spec, policy)
        if selected is not None:
            scheduler = subject.view.spec.get("schedulerName")
            yield Finding(
                "scheduler-bypass",
                f"schedulerName {quoted(scheduler)} may keep whole GPUs only off the nodes "
                f"that share them, but {selected} selects those nodes; remove it, or remove "
                f"schedulerName ({policy.scheduler_name} accounts for GPUs there)",
            )
        return
    scheduled = subject.mode in ("vgpu", "mps") or subject.treatment.dynamic
    if not scheduled or not subject.requests.sharing or not subject.created:
        return
    scheduler = subject.view.spec.get("schedulerName")
    wanted = policy.scheduler_for(subject.requests, mode=subject.mode)
    if scheduler in (None, "", DEFAULT_SCHEDULER, wanted):
        return
    if isinstance(scheduler, str) and scheduler in policy.allowed_schedulers:
        return
    yield Finding(
        "scheduler-bypass",
        f"schedulerName {quoted(scheduler)} skips GPU accounting; remove it "
        f"({wanted} accounts for these GPU resources)",
    )


def forged_allocation(subject: Subject, policy: Policy) -> Iterator[Finding]:
    annotations = as_mapping(as_mapping(subject.view.metadata).get("annotations"))
    if subject.created:
        for key in annotations:
            if (
                isinstance(key, str)
                and policy.is_reserved_annotation(key)
                and policy.forbidden_to(key, subject.username, subject.groups) is not None
            ):
                yield Finding(
                    "forged-allocation",
                    f"annotation {key} is written by the GPU scheduler only; remove it",
                )
        return
    before = subject.previous
    if before is None:
        return
    # An update may not add, change or remove what the scheduler and device plugin
    # wrote: removing an allocation frees it in the scheduler's ledger.
    keys = {k for k in (*before, *annotations) if isinstance(k, str)}
    for key in sorted(k for k in keys if policy.is_reserved_annotation(k)):
        if policy.forbidden_to(key, subject.username, subject.groups) is None:
            continue
        if key not in before:
            change = "added"
        elif key not in annotations:
            change = "removed"
        elif before[key] != annotations[key]:
            change = "changed"
        else:
            continue
        yield Finding(
            "forged-allocation",
            f"annotation {key} {change}: only the GPU scheduler and device plugin write it",
        )


# The order violations are reported in: by rule, then as found.
_RULE_ORDER: Final = {rule: rank for rank, rule in enumerate(RULE_IDS)}


def evaluate(subject: Subject, policy: Policy) -> list[Finding]:
    """Every finding of every rule that applies to ``subject`` (actions are applied later)."""
    findings = list(_host_path_findings(subject, policy))
    findings.extend(_container_findings(subject, policy))
    findings.extend(_cdi_findings(subject, policy))
    # Rules about GPU requests find nothing in a pod without any (each checks that
    # itself too); skipping them keeps the common case cheap.
    if subject.requests.gpu:
        findings.extend(node_name_pinning(subject))
        findings.extend(host_namespaces(subject))
        findings.extend(limit_tampering(subject))
        if subject.created:
            findings.extend(invalid_gpu_request(subject))
            findings.extend(mps_percentage(subject))
            findings.extend(gpu_quota(subject, policy))
            findings.extend(scheduler_bypass(subject, policy))
    findings.extend(forged_allocation(subject, policy))
    if subject.created:
        findings.extend(gpu_claims(subject, policy))
    if len(findings) > 1:
        findings.sort(key=lambda finding: _RULE_ORDER[finding.rule])
    return findings
