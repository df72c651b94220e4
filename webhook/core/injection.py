"""What the webhook injects into a GPU-sharing pod: names, paths and the volumes themselves.

The mutation adds these and the rules allow them (and only them), so both read the
vocabulary from here and neither imports the other.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from webhook.core.policy import Mode, Policy

LIBRARY_PATH: Final = "/usr/local/vgpu/libvgpu.so"  # HAMi-core hard-codes it for its dlsym hook
PRELOAD_FILE: Final = "/etc/ld.so.preload"
MODE_ANNOTATION: Final = "gpushare.io/mode"

VOLUME_LIBRARY: Final = "gpushare-vgpu-lib"
VOLUME_LOCK: Final = "gpushare-vgpu-lock"
VOLUME_PRELOAD: Final = "gpushare-vgpu-preload"
VOLUME_MPS_PIPE: Final = "gpushare-mps-pipe"
VOLUME_OVERRIDE_ENV: Final = "gpushare-vgpu-override-env"
# HAMi-core setenv()s every KEY=VALUE line of this file at NVML init, after the pod's env
# is read (Project-HAMi/HAMi-core src/nvml/hook.c:307, multiprocess_memory_limit.c:152-176,
# .h:29 @ 8f3a89c): an image that ships one would rewrite the limits and switches. An
# empty directory mounted read-only there pins it: fopen() opens a directory and fgets()
# reads no line from it, and nothing in the container can put a file in its place.
OVERRIDE_ENV_FILE: Final = "/overrideEnv"

# HAMi-core's shared region (CUDA_DEVICE_MEMORY_SHARED_CACHE) belongs directly in the
# directory HAMi's device plugin mounts read-write per container at Allocate (its own
# value is <uuid>.cache there: Project-HAMi/HAMi pkg/device-plugin/nvidiadevice/
# nvinternal/plugin/server.go:838,859 @ 4707fb02); the vGPU monitor reads only the .cache
# files directly in each of those directories, skipping names that hold libvgpu.so
# (pkg/monitor/nvidia/cudevshr.go:234-256). The mutation sets no region: the device
# plugin's value beats image ENV, and any pinned value beats the device plugin's.
REGION_VARIABLE: Final = "CUDA_DEVICE_MEMORY_SHARED_CACHE"
REGION_DIR: Final = "/usr/local/vgpu"
REGION_SUFFIX: Final = ".cache"
_REGION_SEGMENTS: Final = tuple(REGION_DIR.strip("/").split("/"))


def region_readable(value: str) -> bool:
    """``value`` names a region HAMi's monitor reads: a ``.cache`` file directly in
    :data:`REGION_DIR`. Segments are compared as written (``//`` and ``.`` dropped): a
    ``..`` fails the comparison, as in CEL, which cannot resolve it."""
    if not value.startswith("/"):
        return False
    segments = [s for s in value.split("/") if s not in ("", ".")]
    return (
        len(segments) == len(_REGION_SEGMENTS) + 1
        and tuple(segments[:-1]) == _REGION_SEGMENTS
        and segments[-1].endswith(REGION_SUFFIX)
        and "libvgpu.so" not in segments[-1]
    )


# Env vars that limit a container: any user value is replaced or removed by the mutation.
VGPU_LIMIT_PREFIXES: Final = ("CUDA_DEVICE_MEMORY_LIMIT", "CUDA_DEVICE_SM_LIMIT")
MPS_LIMIT_VARS: Final = ("CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE")


@dataclass(frozen=True, slots=True)
class Injection:
    """The pod volumes and per-container mounts of one mode under one policy."""

    volumes: tuple[dict[str, Any], ...] = ()
    mounts: tuple[dict[str, Any], ...] = ()
    # Host volumes every GPU pod on the node shares: any mount of them must be read-only.
    read_only_volumes: frozenset[str] = frozenset()

    def allows(self, volume: Mapping[str, Any]) -> bool:
        """``volume`` is exactly one the mutation injects."""
        return any(same_volume(volume, injected) for injected in self.volumes)


NOTHING: Final = Injection()


@dataclass(frozen=True, slots=True)
class Treatment:
    """What a pod's mode alone does not say about its mutation."""

    # Asks only for whole GPUs under a scheduler of its own (webhook.core.whole): kept
    # off the sharing pool, nothing of a slice injected.
    whole: bool = False
    # A mig pod of the scheduler's dynamic MIG (ModeChoice.dynamic): scheduled as a
    # slice, given its scheduler and count only.
    dynamic: bool = False
    # A vgpu pod gets HAMi-core (Policy.library_for); always True in other modes.
    library: bool = True
    # An mps pod its scheduler places by the card's mode (ModeChoice.placed): no
    # mps.nodeSelector.
    placed: bool = False


# The treatment of nearly every pod: one object, not one per request.
PLAIN: Final = Treatment()
_VGPU_READ_ONLY: Final = frozenset({VOLUME_LIBRARY, VOLUME_PRELOAD, VOLUME_OVERRIDE_ENV})
_MPS_READ_ONLY: Final = frozenset({VOLUME_MPS_PIPE})


def injection_for(mode: Mode, policy: Policy) -> Injection:
    """What the mutation injects for ``mode``; :data:`NOTHING` for mig and none."""
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
            {"name": VOLUME_OVERRIDE_ENV, "emptyDir": {}},
        ]
        mounts: list[dict[str, Any]] = [
            {"name": VOLUME_LIBRARY, "mountPath": LIBRARY_PATH, "readOnly": True},
            {"name": VOLUME_LOCK, "mountPath": policy.lock_host_path},
            {"name": VOLUME_OVERRIDE_ENV, "mountPath": OVERRIDE_ENV_FILE, "readOnly": True},
        ]
        if policy.preload == "file":
            volumes.append(
                {
                    "name": VOLUME_PRELOAD,
                    "hostPath": {"path": policy.preload_host_path, "type": "File"},
                }
            )
            mounts.append({"name": VOLUME_PRELOAD, "mountPath": PRELOAD_FILE, "readOnly": True})
        return Injection(
            volumes=tuple(volumes),
            mounts=tuple(mounts),
            read_only_volumes=_VGPU_READ_ONLY,
        )
    if mode == "mps":
        return Injection(
            volumes=(
                # Directory, not DirectoryOrCreate: on a node without the daemon's pipe
                # directory an empty one would be made, the client would find no daemon
                # and CUDA would run without MPS, and without its limits
                # (nvidia-cuda-mps-control(1)); the pod fails to start instead.
                {
                    "name": VOLUME_MPS_PIPE,
                    "hostPath": {"path": policy.mps_pipe_directory, "type": "Directory"},
                },
            ),
            # Read-only: clients still reach the daemon's pipes and socket (FIFOs and
            # sockets ignore a read-only mount), but cannot replace them for other pods.
            mounts=(
                {"name": VOLUME_MPS_PIPE, "mountPath": policy.mps_pipe_directory, "readOnly": True},
            ),
            read_only_volumes=_MPS_READ_ONLY,
        )
    return NOTHING


def gpu_runtime(spec: Mapping[str, Any], policy: Policy) -> bool:
    """The pod runs under a RuntimeClass whose handler is the NVIDIA runtime
    (``runtimeClasses.gpu``): a CUDA image's baked NVIDIA_VISIBLE_DEVICES=all holds there."""
    name = spec.get("runtimeClassName")
    return isinstance(name, str) and name in policy.gpu_runtime_classes


def same_volume(have: Mapping[str, Any], want: Mapping[str, Any]) -> bool:
    return dict(have) == want
