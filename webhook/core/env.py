"""Container environment as the kubelet will see it: literal values, valueFrom, $(VAR)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final, Literal

from webhook.core.workload import MAPPINGS

# The toolkit's device list: judged wherever it is set, the void where a GPU is not asked.
VISIBLE_DEVICES: Final = "NVIDIA_VISIBLE_DEVICES"


def env_value(entry: Mapping[str, Any]) -> str | None:
    """An env entry's literal value; None when it comes from valueFrom."""
    if "valueFrom" in entry:
        return None
    value = entry.get("value", "")
    return value if isinstance(value, str) else str(value)


def effective_env(container: Mapping[str, Any]) -> dict[str, Mapping[str, Any]]:
    """Env entries by name; the last entry of a name wins, as in the kubelet."""
    env = container.get("env")
    if not isinstance(env, list):
        return {}
    return {
        entry["name"]: entry
        for entry in env
        if isinstance(entry, MAPPINGS) and isinstance(entry.get("name"), str)
    }


def opaque(value: str | None) -> bool:
    """A value the kubelet decides: from valueFrom, or with $(VAR) references it expands."""
    return value is None or "$(" in value


# The env names that decide which GPUs a container gets or whether its limits hold, and
# that a ConfigMap or Secret may not carry into a pod through envFrom (raw-visible-devices):
# the device list, the variable that makes an image "legacy" (every GPU) without it, and
# the switches that turn HAMi-core's enforcement off or loosen it.
GUARDED_NAMES: Final = (
    "NVIDIA_VISIBLE_DEVICES",
    "CUDA_VERSION",
    "CUDA_DISABLE_CONTROL",
    "GPU_CORE_UTILIZATION_POLICY",
    "CUDA_REDIRECT",
    "ACTIVE_OOM_KILLER",
    # ACK's cGPU isolation reads it: true switches the container's isolation off.
    "CGPU_DISABLE",
)
# ... and every name that starts with these: HAMi-core's per-device limits, which the
# mutation cannot pin when memory is a percentage the device plugin turns into MiB (the
# kubelet puts the pod's env, envFrom's included, after the device plugin's).
GUARDED_PREFIXES: Final = ("CUDA_DEVICE_MEMORY_LIMIT", "CUDA_DEVICE_SM_LIMIT")


def guarded(name: str) -> bool:
    """``name`` is one a ConfigMap or Secret may not hand a container, whatever its value."""
    return name in GUARDED_NAMES or name.startswith(GUARDED_PREFIXES)


# The env channel, default-deny: every name a component of the node's GPU stack reads is
# refused unless the policy's env.allowed admits it (Policy.env_allowances).
#
# "devices": the NVIDIA container toolkit's names, which decide which devices and driver
# files a container gets: every NVIDIA_* name (internal/config/image/envvars.go, the gated
# modifiers of internal/modifier/cdi.go:133-145, IMEX channels at :154), the swarm resource
# variables (DOCKER_RESOURCE_*, the toolkit's swarm-resource setting) and the legacy
# CUDA_VERSION (cuda_image.go:99-104); nvidia-container-toolkit @d34b304. Judged in every
# container of every pod: the NVIDIA runtime may be a node's default.
DEVICE_PREFIXES: Final = ("NVIDIA_", "DOCKER_RESOURCE_")
DEVICE_NAMES: Final = ("CUDA_VERSION",)
# "limits": exactly the names HAMi-core reads (its getenv calls, Project-HAMi/HAMi-core
# @8f3a89c: libvgpu.c:95 CUDA_REDIRECT, log_utils.c:13 LIBCUDA_LOG_LEVEL,
# multiprocess_memory_limit.c:96 the limits, :1031 ACTIVE_OOM_KILLER, :1047
# GPU_CORE_UTILIZATION_POLICY, :1077 CUDA_DEVICE_MEMORY_SHARED_CACHE, :1140
# CUDA_TASK_PRIORITY, :1196 RECORD_KERNEL_INTERVAL), the device plugins' switches
# (HAMi's CUDA_DISABLE_CONTROL, ACK's CGPU_DISABLE) and the MPS client's CUDA_MPS_*.
# Judged in the containers of a GPU pod: nothing reads them where no GPU is.
LIMIT_NAMES: Final = (
    "CUDA_REDIRECT",
    "LIBCUDA_LOG_LEVEL",
    "ACTIVE_OOM_KILLER",
    "GPU_CORE_UTILIZATION_POLICY",
    "CUDA_DEVICE_MEMORY_SHARED_CACHE",
    "CUDA_TASK_PRIORITY",
    "RECORD_KERNEL_INTERVAL",
    "CUDA_DISABLE_CONTROL",
    "CGPU_DISABLE",
)
LIMIT_PREFIXES: Final = ("CUDA_DEVICE_MEMORY_LIMIT", "CUDA_DEVICE_SM_LIMIT", "CUDA_MPS_")
# Names of those channels that other rules judge by their meaning, or that the mutation
# sets and overwrites (raw-visible-devices' device list and legacy images, the switches,
# the limits limit-tampering compares with the request, the MPS client's settings, the
# region and priority): the allowlist never refuses them.
MANAGED_NAMES: Final = frozenset(
    {*GUARDED_NAMES, "CUDA_DEVICE_MEMORY_SHARED_CACHE", "CUDA_TASK_PRIORITY"}
)
MANAGED_PREFIXES: Final = GUARDED_PREFIXES
# The MPS client's settings the mutation sets, and overwrites, in the slice containers of
# an MPS pod (mutation.wanted_env). Anywhere else nothing sets them: a vGPU slice or a
# whole GPU shared by another stack's MPS daemon (the NVIDIA device plugin's) that points
# its client at another pipe directory, or raises its own limits, leaves its daemon's
# limits, so the allowlist judges them there.
MPS_SETTINGS: Final = frozenset(
    {
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
        "CUDA_MPS_PIPE_DIRECTORY",
    }
)

Channel = Literal["devices", "limits"]
# The rule a name refused on each channel falls under.
CHANNEL_RULES: Final[Mapping[Channel, str]] = {
    "devices": "raw-visible-devices",
    "limits": "limit-tampering",
}


def channel_of(name: str) -> Channel | None:
    """The channel ``name`` reaches the node's GPU stack on, or None (not guarded)."""
    if name.startswith(DEVICE_PREFIXES) or name in DEVICE_NAMES:
        return "devices"
    if name in LIMIT_NAMES or name.startswith(LIMIT_PREFIXES):
        return "limits"
    return None


def managed(name: str, *, mps_client: bool) -> bool:
    """``name`` is judged by its own rule or set by the mutation, not by the allowlist,
    in a container that is (``mps_client``) or is not a slice of an MPS pod."""
    return (
        name in MANAGED_NAMES
        or name.startswith(MANAGED_PREFIXES)
        or (mps_client and name in MPS_SETTINGS)
    )


# What grants nothing, for each name that adds device nodes beside a device list (the
# gated modifiers, internal/modifier/cdi.go:133-145: only "enabled" counts; IMEX channels,
# cuda_image.go:148-176: "void" is none). Image ENV cannot be seen, so the mutation pins
# these in a slice container's pod env (containerd's WithEnv replaces the image's value
# with the CRI's) unless the container sets the name itself (judged by env.allowed) or
# the policy admits it in slices with any value (then a device plugin or image may
# grant it on purpose: HAMi's device plugin sets the first three when its flags are on).
DEVICE_PINS: Final[Mapping[str, str]] = {
    "NVIDIA_GDS": "disabled",
    "NVIDIA_MOFED": "disabled",
    "NVIDIA_GDRCOPY": "disabled",
    "NVIDIA_NVSWITCH": "disabled",
    "NVIDIA_IMEX_CHANNELS": "void",
}


# What a container is to the allowlist: it asks for part of a GPU (vGPU memory or cores,
# MPS, a MIG instance: "slice"), only for a count of whole GPUs ("whole"), or for none.
ContainerClass = Literal["slice", "whole", "none"]
CONTAINER_CLASSES: Final[tuple[ContainerClass, ...]] = ("slice", "whole", "none")


def _set(entries: list[Mapping[str, Any]]) -> bool:
    """Some entry may give a non-empty value (valueFrom and $(VAR) may)."""
    return any(opaque(value) or value for value in map(env_value, entries))


def _surely_set(entries: list[Mapping[str, Any]]) -> bool:
    """Every entry gives a non-empty literal value, and there is one."""
    return bool(entries) and all(
        not opaque(value) and bool(value) for value in map(env_value, entries)
    )


def legacy_image(container: Mapping[str, Any]) -> bool:
    """The NVIDIA runtime would treat the container as a legacy CUDA image, which gets
    every GPU: ``CUDA_VERSION`` set, ``NVIDIA_REQUIRE_CUDA`` empty and no
    ``NVIDIA_VISIBLE_DEVICES`` (whose value raw-visible-devices judges).

    Every entry of a name counts, not only the last: runtimes differ on duplicates.
    """
    env = container.get("env")
    if not isinstance(env, list):
        return False
    by_name: dict[str, list[Mapping[str, Any]]] = {}
    for entry in env:
        if isinstance(entry, MAPPINGS):
            name = entry.get("name")
            # A string first: a list or map as a name is unhashable.
            if isinstance(name, str) and name in _LEGACY_NAMES:
                by_name.setdefault(name, []).append(entry)
    return (
        _set(by_name.get("CUDA_VERSION", []))
        and not _surely_set(by_name.get("NVIDIA_REQUIRE_CUDA", []))
        and "NVIDIA_VISIBLE_DEVICES" not in by_name
    )


_LEGACY_NAMES: Final = frozenset({"CUDA_VERSION", "NVIDIA_REQUIRE_CUDA", "NVIDIA_VISIBLE_DEVICES"})


def names_nvidia_env(container: Mapping[str, Any]) -> bool:
    """The container's env names ``CUDA_VERSION`` or an ``NVIDIA_*`` variable."""
    env = container.get("env")
    if not isinstance(env, list):
        return False
    for entry in env:
        if isinstance(entry, MAPPINGS):
            name = entry.get("name")
            if isinstance(name, str) and (name == "CUDA_VERSION" or name.startswith("NVIDIA_")):
                return True
    return False


def spelling_prefixes(container: Mapping[str, Any]) -> list[str]:
    """The ``envFrom`` prefixes of ``container`` that, with some key, spell a guarded
    name (``NVIDIA_`` + ``VISIBLE_DEVICES``): the write-time guard on ConfigMaps and
    Secrets looks at keys, not at the names a prefix makes of them."""
    sources = container.get("envFrom")
    found: list[str] = []
    for source in sources if isinstance(sources, list) else ():
        if not isinstance(source, MAPPINGS):
            continue
        prefix = source.get("prefix")
        if isinstance(prefix, str) and prefix and spells_guarded(prefix):
            found.append(prefix)
    return found


def spells_guarded(prefix: str) -> bool:
    """Some key after ``prefix`` makes a guarded name, or a name of a guarded channel."""
    return any(name.startswith(prefix) and name != prefix for name in SPELLED_NAMES) or any(
        name.startswith(prefix) or prefix.startswith(name) for name in SPELLED_PREFIXES
    )


# What an envFrom prefix may not spell (spells_guarded), one table for the core and the CEL.
SPELLED_NAMES: Final = (*GUARDED_NAMES, *DEVICE_NAMES, *LIMIT_NAMES)
SPELLED_PREFIXES: Final = (*GUARDED_PREFIXES, *DEVICE_PREFIXES, *LIMIT_PREFIXES)
