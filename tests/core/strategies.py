"""Hypothesis strategies for pod-shaped objects: as users write them, as attackers write them,
and as nobody should write them (JSON-ish junk in every position).

The realistic strategies keep what the apiserver guarantees (container names unique across
every container kind, volume names unique, JSON types) and nothing else: values are often
out of range, duplicated, contradictory or hostile, because that is what the webhook sees.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any, Final

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

Obj = dict[str, Any]

PROPERTY_SETTINGS: Final = settings(
    max_examples=250,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

CONTAINER_KINDS: Final = ("containers", "initContainers", "ephemeralContainers")

# JSON Pointer segments from the object root to the pod template, per workload kind.
TEMPLATE_PATHS: Final[Mapping[str, tuple[str, ...]]] = {
    "Deployment": ("spec", "template"),
    "StatefulSet": ("spec", "template"),
    "DaemonSet": ("spec", "template"),
    "ReplicaSet": ("spec", "template"),
    "ReplicationController": ("spec", "template"),
    "Job": ("spec", "template"),
    "CronJob": ("spec", "jobTemplate", "spec", "template"),
}
WORKLOAD_KINDS: Final = tuple(TEMPLATE_PATHS)
ALL_KINDS: Final = ("Pod", *WORKLOAD_KINDS)

# -- resources -------------------------------------------------------------------------

COUNT_RESOURCES: Final = ("nvidia.com/gpu", "volcano.sh/vgpu-number")
MIB_RESOURCES: Final = ("nvidia.com/gpumem", "volcano.sh/vgpu-memory")
GIB_RESOURCES: Final = ("aliyun.com/gpu-mem",)
PERCENT_RESOURCES: Final = (
    "nvidia.com/gpumem-percentage",
    "nvidia.com/gpucores",
    "aliyun.com/gpu-core.percentage",
    "volcano.sh/vgpu-cores",
)
PRIORITY_RESOURCES: Final = ("nvidia.com/priority",)
MIG_RESOURCES: Final = ("nvidia.com/mig-1g.5gb", "nvidia.com/mig-3g.20gb")
GPU_RESOURCES: Final = (
    *COUNT_RESOURCES,
    *MIB_RESOURCES,
    *GIB_RESOURCES,
    *PERCENT_RESOURCES,
    *PRIORITY_RESOURCES,
    *MIG_RESOURCES,
)
PLAIN_RESOURCES: Final = ("cpu", "memory", "ephemeral-storage")

# Quantities that are wrong in the ways people get them wrong.
BAD_QUANTITIES: Final = (
    "3Gi",
    "0.5",
    "500m",
    "-1",
    "150",
    "0",
    "garbage",
    "",
    " 3",
    "1e3",
    "1e999999",
    "NaN",
    "1_000",
    "\u00b2",
    "--5",
    "9" * 60,
    0,
    -1,
    150,
    0.5,
    True,
    None,
)


PROFILES: Final[Mapping[str, tuple[str, ...]]] = {
    # Resource names that go together, as each GPU-sharing stack documents them.
    "hami": ("nvidia.com/gpu", "nvidia.com/gpumem", "nvidia.com/gpucores", "nvidia.com/priority"),
    "hami-percentage": ("nvidia.com/gpu", "nvidia.com/gpumem-percentage", "nvidia.com/gpucores"),
    "ack": ("aliyun.com/gpu-mem", "aliyun.com/gpu-core.percentage"),
    "volcano": ("volcano.sh/vgpu-number", "volcano.sh/vgpu-memory", "volcano.sh/vgpu-cores"),
    "mig": ("nvidia.com/mig-1g.5gb",),
}


def _valid_value(resource: str) -> st.SearchStrategy[Any]:
    if resource in COUNT_RESOURCES or resource in MIG_RESOURCES:
        return st.one_of(st.integers(1, 4), st.sampled_from(["1", "2", "4"]))
    if resource in MIB_RESOURCES:
        return st.one_of(st.integers(1, 81920), st.sampled_from(["3000", "1024", "40960", "3k"]))
    if resource in GIB_RESOURCES:
        return st.one_of(st.integers(1, 80), st.sampled_from(["7", "16"]))
    if resource in PERCENT_RESOURCES:
        return st.one_of(st.integers(1, 100), st.sampled_from(["30", "50", "100"]))
    if resource in PRIORITY_RESOURCES:
        return st.one_of(st.integers(0, 1), st.sampled_from(["0", "1"]))
    return st.sampled_from(["1", "500m", "4", "16Gi", "512Mi", 2])


def quantities(resource: str, *, odds: int = 4) -> st.SearchStrategy[Any]:
    """A valid value for ``resource``, or about once in ``odds`` a classic mistake."""
    return st.integers(0, odds - 1).flatmap(
        lambda n: st.sampled_from(BAD_QUANTITIES) if n == 0 else _valid_value(resource)
    )


def sometimes(
    strategy: st.SearchStrategy[Any], otherwise: Any = None, odds: int = 4
) -> st.SearchStrategy[Any]:
    """``strategy`` about once in ``odds`` draws, else the constant ``otherwise``."""
    return st.integers(0, odds - 1).flatmap(lambda n: strategy if n == 0 else st.just(otherwise))


@st.composite
def resource_blocks(draw: st.DrawFn, *, gpu: Sequence[str], hostile: bool) -> Obj:
    """``resources`` with limits (and often equal, sometimes different, requests).

    ``gpu`` holds the GPU resource names to draw from (none: a GPU-less container).
    """
    names: list[str] = []
    if gpu:
        names += draw(st.lists(st.sampled_from(gpu), min_size=1, max_size=4, unique=True))
    names += draw(st.lists(st.sampled_from(PLAIN_RESOURCES), max_size=2, unique=True))
    odds = 4 if hostile else 12
    limits = {name: draw(quantities(name, odds=odds)) for name in names}
    block: Obj = {"limits": limits}
    shapes = ["none", "none", "equal", "equal", "plain"]
    how = draw(st.sampled_from([*shapes, "changed", "only"] if hostile else shapes))
    if not hostile and draw(st.integers(0, 11)) == 0:
        how = draw(st.sampled_from(["changed", "only"]))
    if how == "equal":
        block["requests"] = dict(limits)
    elif how == "plain":
        block["requests"] = {n: v for n, v in limits.items() if n in PLAIN_RESOURCES}
    elif how == "changed" and limits:
        requests = dict(limits)
        name = draw(st.sampled_from(sorted(requests)))
        requests[name] = draw(quantities(name))
        block["requests"] = requests
    elif how == "only":
        # GPU resources written in requests only (limits lack them).
        block = {"requests": limits}
    return block


# -- env -------------------------------------------------------------------------------

GPU_UUID: Final = "GPU-5fd4c8a1-3f1e-9b2c-1d2e-aa33bb44cc55"
_ENV_VALUES: Final[Mapping[str, Sequence[str]]] = {
    "NVIDIA_VISIBLE_DEVICES": (
        "all",
        "0",
        "0,1",
        "none",
        "void",
        "",
        "NONE",
        " none ",
        GPU_UUID,
        "$(GPUS)",
    ),
    "LD_PRELOAD": (
        "/usr/lib/x86_64-linux-gnu/libjemalloc.so.2",
        "/opt/lib/libtcmalloc.so:/opt/lib/libfoo.so",
        "liba.so libb.so",
        "/usr/local/vgpu/libvgpu.so",
        "/opt/a.so:/usr/local/vgpu/libvgpu.so",
        "",
        ":",
    ),
    "CUDA_DISABLE_CONTROL": ("true", "false", "1", "0", "TRUE", "yes", "t", "", "$(OFF)"),
    "GPU_CORE_UTILIZATION_POLICY": (
        "default",
        "force",
        "disable",
        "DISABLE",
        "Disable",
        " disable",
        "$(P)",
    ),
    # HAMi-core resolves every cu* symbol in this library instead of hooking it.
    "CUDA_REDIRECT": ("", "/usr/lib/x86_64-linux-gnu/libcuda.so.1", "libcuda.so.1", " ", "$(LIB)"),
    # HAMi-core reads exactly "false" and "0" as off.
    "ACTIVE_OOM_KILLER": ("true", "1", "false", "0", "FALSE", "$(OOM)"),
    # ACK's cGPU: anything but an explicit false switches isolation off.
    "CGPU_DISABLE": ("true", "false", " 0", "$(OFF)"),
    "CUDA_DEVICE_MEMORY_LIMIT": ("3000m", "1g", "99999m", "0", "abc"),
    "CUDA_DEVICE_MEMORY_LIMIT_0": ("3000m", "1g", "99999m", "0", "abc", "8000m"),
    "CUDA_DEVICE_MEMORY_LIMIT_1": ("3000m", "80g"),
    "CUDA_DEVICE_SM_LIMIT": ("30", "100", "0", "50", "\u00b2", "9" * 40),
    "CUDA_DEVICE_SM_LIMIT_0": ("100", "30"),
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": ("0=7168M", "0=99999M", "0=1G,1=1G", "x"),
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": ("100", "30", "\u00b2", "abc"),
    "CUDA_MPS_PIPE_DIRECTORY": ("/tmp/nvidia-mps", "/elsewhere"),
    "CUDA_TASK_PRIORITY": ("0", "1"),
    "CUDA_DEVICE_MEMORY_SHARED_CACHE": ("/tmp/cache",),
    "CUDA_VISIBLE_DEVICES": ("0", "0,1"),
    "NCCL_DEBUG": ("INFO",),
    "OMP_NUM_THREADS": ("4",),
    "PATH": ("/usr/local/bin:/usr/bin",),
    "GPUS": ("all", "none"),
    "OFF": ("true",),
    "P": ("disable",),
    "LIB": ("/usr/lib/x86_64-linux-gnu/libcuda.so.1",),
    "OOM": ("false",),
}
ENV_NAMES: Final = tuple(_ENV_VALUES)
# The env channel's other names (env.allowed decides them by name, value and class):
# drawn by attackers only, so that well-formed pods stay what they were.
_CHANNEL_VALUES: Final[Mapping[str, Sequence[str]]] = {
    "NVIDIA_DRIVER_CAPABILITIES": ("compute,utility", " video", "graphics", "all", "compute,,"),
    "NVIDIA_GDS": ("enabled", "disabled"),
    "NVIDIA_IMEX_CHANNELS": ("0", "all", "channelall", "1, channel2", "0,all"),
    "NVIDIA_REQUIRE_JETPACK": ("csv-mounts=all",),
    "NVIDIA_REQUIRE_CUDA": ("cuda>=12.0",),
    "NVIDIA_API_KEY": ("nvapi-x",),
    "NVIDIA_MIG_CONFIG_DEVICES": ("all",),
    "DOCKER_RESOURCE_GPU": ("0",),
    "RECORD_KERNEL_INTERVAL": ("1000",),
    "LIBCUDA_LOG_LEVEL": ("4",),
    "CUDA_MPS_CLIENT_PRIORITY": ("0", "1", "2"),
    "CUDA_MPS_LOG_DIRECTORY": ("/tmp",),
    "CUDA_MPS_PIPE_DIRECTORY": ("/tmp/nvidia-mps",),
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE": ("100",),
}
# Names drawn more often: the ones the webhook reads, writes or forbids.
_WEIGHTED_NAMES: Final = (
    *ENV_NAMES,
    *["LD_PRELOAD"] * 4,
    *["NVIDIA_VISIBLE_DEVICES", "CUDA_DISABLE_CONTROL", "GPU_CORE_UTILIZATION_POLICY"] * 2,
    *["CUDA_REDIRECT", "ACTIVE_OOM_KILLER"] * 2,
    *["CUDA_DEVICE_MEMORY_LIMIT_0", "CUDA_DEVICE_SM_LIMIT", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] * 2,
)
VALUE_FROM: Final = (
    {"fieldRef": {"fieldPath": "metadata.annotations['gpus']"}},
    {"configMapKeyRef": {"name": "gpu-config", "key": "devices"}},
    {"secretKeyRef": {"name": "s", "key": "k", "optional": True}},
)


# What a careful user sets for the variables that can switch limits or devices off.
_BENIGN: Final[Mapping[str, Sequence[str]]] = {
    "NVIDIA_VISIBLE_DEVICES": ("none", "void", ""),
    "CUDA_DISABLE_CONTROL": ("false", "0"),
    "GPU_CORE_UTILIZATION_POLICY": ("default", "force"),
    "CUDA_REDIRECT": ("",),
    "ACTIVE_OOM_KILLER": ("true",),
    "CGPU_DISABLE": ("false",),
}


@st.composite
def env_entries(draw: st.DrawFn, *, hostile: bool = True) -> Obj:
    name = draw(st.sampled_from(_WEIGHTED_NAMES))
    careful = not hostile and name in _BENIGN and draw(st.integers(0, 9)) > 0
    shape = "value" if careful else draw(st.sampled_from(["value"] * 6 + ["valueFrom", "bare"]))
    if shape == "value":
        values = _BENIGN[name] if careful else _ENV_VALUES[name]
        return {"name": name, "value": draw(st.sampled_from(values))}
    if shape == "valueFrom":
        return {"name": name, "valueFrom": draw(st.sampled_from(VALUE_FROM))}
    return {"name": name}


# -- volumes and mounts ----------------------------------------------------------------

PROTECTED_HOST_PATHS: Final = (
    "/dev/nvidia0",
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev",
    "/",
    "/run/nvidia",
    "/run/nvidia/driver",
    "/var/run/nvidia-container-devices",
    "/var/run",
    "/usr/local/vgpu",
    "/usr/local/vgpu/libvgpu.so",
    "/tmp/vgpulock",
    "/tmp/nvidia-mps",
    "/tmp",
    "/dev/../dev/nvidia0",
    "//dev/nvidia1",
    "/dev/nvidia0/",
    "/dev/./nvidia0",
    "dev/nvidia0",
    "",
    # The kubelet's state, /proc and the container runtimes: the accounting from the side.
    "/var/lib/kubelet",
    "/var/lib/kubelet/device-plugins",
    "//var/lib/kubelet/pod-resources/",
    "var/lib/kubelet/pods",
    "/var/lib",
    "/proc",
    "/proc/self",
    "/proc/./sys",
    "/run/containerd/containerd.sock",
    "/var/run/containerd",
    "/var/lib/containerd",
    "/run/crio/crio.sock",
    "/var/run/docker.sock",
    "/run/./docker.sock",
    "/var/lib/docker",
    "/run/cri-dockerd.sock",
    "/run/k3s/containerd/containerd.sock",
)
HARMLESS_HOST_PATHS: Final = (
    "/data",
    "/var/log",
    "/opt/models",
    "/home/user",
    "/etc/localtime",
    "/var/lib/kubelet-backup",
    "/procfs",
)
INJECTED_VOLUMES: Final[tuple[Obj, ...]] = (
    {
        "name": "gpushare-vgpu-lib",
        "hostPath": {"path": "/usr/local/vgpu/libvgpu.so", "type": "File"},
    },
    {
        "name": "gpushare-vgpu-lock",
        "hostPath": {"path": "/tmp/vgpulock", "type": "DirectoryOrCreate"},
    },
    {
        "name": "gpushare-mps-pipe",
        "hostPath": {"path": "/tmp/nvidia-mps", "type": "Directory"},
    },
    {"name": "gpushare-vgpu-override-env", "emptyDir": {}},
)
INJECTED_NAMES: Final = (
    "gpushare-vgpu-lib",
    "gpushare-vgpu-lock",
    "gpushare-vgpu-preload",
    "gpushare-mps-pipe",
    "gpushare-vgpu-override-env",
)
MOUNT_PATHS: Final = (
    "/data",
    "/models",
    "/dev/shm",
    "/usr/local/vgpu/libvgpu.so",
    "/tmp/vgpulock",
    "/etc/ld.so.preload",
    "/tmp/nvidia-mps",
    "/var/run/nvidia-container-devices/all",
    # Where the GPU stack reads inside the container, and above it (no shadow).
    "/overrideEnv",
    "/usr/local/vgpu/x.cache",
    "/var/run/nvidia-container-devicesall",
    "/etc",
    "/usr/local",
)


@st.composite
def volumes(draw: st.DrawFn, name: str, *, hostile: bool = True) -> Obj:
    shapes = ["emptyDir", "configMap", "pvc", "host-ok"] + ["host-bad"] * (2 if hostile else 0)
    shape = draw(st.sampled_from(shapes))
    if not hostile and draw(st.integers(0, 11)) == 0:
        shape = "host-bad"
    if shape == "emptyDir":
        return {"name": name, "emptyDir": draw(st.sampled_from([{}, {"medium": "Memory"}]))}
    if shape == "configMap":
        return {"name": name, "configMap": {"name": "cfg"}}
    if shape == "pvc":
        return {"name": name, "persistentVolumeClaim": {"claimName": "data"}}
    paths = HARMLESS_HOST_PATHS if shape == "host-ok" else PROTECTED_HOST_PATHS
    host: Obj = {"path": draw(st.sampled_from(paths))}
    kind = draw(st.sampled_from([None, "Directory", "CharDevice", "DirectoryOrCreate"]))
    if kind is not None:
        host["type"] = kind
    return {"name": name, "hostPath": host}


@st.composite
def mounts(draw: st.DrawFn, volume_names: Sequence[str]) -> list[Obj]:
    result: list[Obj] = []
    names = [*volume_names, *INJECTED_NAMES]
    paths = draw(st.lists(st.sampled_from(MOUNT_PATHS), max_size=3, unique=True))
    for path in paths:
        mount: Obj = {"name": draw(st.sampled_from(names)), "mountPath": path}
        if draw(st.booleans()):
            mount["readOnly"] = draw(st.booleans())
        sub = draw(sometimes(st.sampled_from(["subPath", "subPathExpr"]), None, odds=6))
        if sub is not None:
            mount[sub] = "sub" if sub == "subPath" else "$(POD_NAME)"
        result.append(mount)
    return result


# -- containers and pods ---------------------------------------------------------------

IMAGES: Final = (
    "pytorch/pytorch:2.4.0-cuda12.1-cudnn9-runtime",
    "nvcr.io/nvidia/cuda:12.4.1-base-ubuntu22.04",
    "busybox:1.36",
    "fluent/fluent-bit:3.1",
)


@st.composite
def containers(
    draw: st.DrawFn,
    name: str,
    kind: str,
    volume_names: Sequence[str],
    gpu: Sequence[str],
    hostile: bool,
) -> Obj:
    """One container; ``gpu`` holds the GPU resource names it may ask for."""
    container: Obj = {"name": name, "image": draw(st.sampled_from(IMAGES))}
    if draw(st.booleans()):
        container["command"] = ["python", "train.py"]
    odds = 3 if hostile else 12
    env = draw(st.lists(env_entries(hostile=hostile), max_size=6))
    empty_env: bool = draw(st.booleans())
    if env or empty_env:
        container["env"] = env
    # Ephemeral containers may not have resources; hostile ones have them anyway.
    if (kind != "ephemeralContainers" or hostile) and draw(st.integers(0, 3)) > 0:
        asks = gpu if draw(st.integers(0, 3)) > 0 else ()
        container["resources"] = draw(resource_blocks(gpu=asks, hostile=hostile))
    privileged = draw(sometimes(st.booleans(), None, odds=odds))
    if privileged is not None:
        container["securityContext"] = {"privileged": privileged}
    mount_list = draw(mounts(volume_names))
    if mount_list:
        container["volumeMounts"] = mount_list
    return container


ANNOTATIONS: Final[Mapping[str, Sequence[Any]]] = {
    "gpushare.io/mode": ("vgpu", "mps", "mig", "none", "hami-core", "VGPU", "bogus", None, 1),
    "nvidia.com/vgpu-mode": ("hami-core", "mps"),
    "hami.io/vgpu-devices-allocated": ("GPU-0,NVIDIA,3000,30:;",),
    "hami.io/vgpu-devices-to-allocate": ("GPU-0,NVIDIA,3000,30:;",),
    "hami.io/bind-phase": ("success",),
    "hami.io/bind-time": ("1732312345",),
    "hami.io/vgpu-node": ("gpu-node-1",),
    "hami.io/vgpu-time": ("1732312345",),
    "hami.io/mig-devices-allocated": ("GPU-0,NVIDIA,3000,30:;",),
    "cdi.k8s.io/x": (
        "nvidia.com/gpu=all",
        "example.com/dev=1",
        "k8s.device-plugin.nvidia.com/gpu=GPU-0",
        "management.nvidia.com/gpu=all",
        "all",
    ),
    "io.kubernetes.cri-o.Devices": ("/dev/fuse", "/dev/nvidia0", "/dev/fuse,/dev/nvidia0:/dev/x"),
    "devices.crio.io": ("/dev/net/tun:rw", "/dev/fuse:/dev/fuse:rwm:x"),
    "prometheus.io/scrape": ("true",),
    "team": ("ml",),
}
# What a careful user writes: a mode the pod's resources can have, nothing reserved.
_CAREFUL_ANNOTATIONS: Final[Mapping[str, Sequence[Any]]] = {
    "gpushare.io/mode": ("vgpu", "mps", "hami-core", "VGPU"),
    "nvidia.com/vgpu-mode": ("hami-core",),
    "prometheus.io/scrape": ("true",),
    "team": ("ml",),
}
NODE_SELECTORS: Final[tuple[Obj, ...]] = (
    {"ack.node.gpu.schedule": "mps"},
    {"ack.node.gpu.schedule": "exclusive"},
    {"kubernetes.io/os": "linux"},
    {"ack.node.gpu.schedule": "mps", "pool": "a100"},
)
SCHEDULERS: Final = ("hami-scheduler", "default-scheduler", "", "volcano", "my-scheduler")
_CONTAINER_NAMES: Final = ("trainer", "sidecar", "init", "warmup", "debug", "app", "log-shipper")
_VOLUME_NAMES: Final = ("data", "models", "shm", "devices", "cache", "gpushare-vgpu-lock")


@st.composite
def pod_specs(draw: st.DrawFn, *, hostile: bool = False, gpu: Sequence[str] = GPU_RESOURCES) -> Obj:
    """A pod spec: names unique across every container kind, volumes unique by name."""
    odds = 2 if hostile else 10
    spec: Obj = {}
    volume_names = draw(st.lists(st.sampled_from(_VOLUME_NAMES), max_size=3, unique=True))
    volume_list = [draw(volumes(n, hostile=hostile)) for n in volume_names]
    injected = st.lists(st.sampled_from(INJECTED_VOLUMES), max_size=2)
    volume_list += draw(sometimes(injected, [], odds=4 if hostile else 8))
    unique: dict[str, Obj] = {}
    for volume in volume_list:
        unique.setdefault(volume["name"], volume)
    volume_list = list(unique.values())
    empty_volumes: bool = draw(st.booleans())
    if volume_list or empty_volumes:
        spec["volumes"] = volume_list
    names = draw(st.lists(st.sampled_from(_CONTAINER_NAMES), min_size=1, max_size=5, unique=True))
    # The first name is a regular container; the others go to any kind.
    kinds = ["containers"] + [
        draw(st.sampled_from(["containers", "containers", "initContainers", "ephemeralContainers"]))
        for _ in names[1:]
    ]
    for name, kind in zip(names, kinds, strict=True):
        volume_names = [v["name"] for v in volume_list]
        container = draw(containers(name, kind, volume_names, gpu, hostile))
        spec.setdefault(kind, []).append(container)
    schedulers = SCHEDULERS if hostile else SCHEDULERS[:3]
    for key, value in (
        ("nodeName", draw(sometimes(st.sampled_from(["node-1", ""]), None, odds))),
        ("schedulerName", draw(sometimes(st.sampled_from(schedulers), None, 2))),
        ("nodeSelector", draw(sometimes(st.sampled_from(NODE_SELECTORS), None, 3))),
        ("hostIPC", draw(sometimes(st.booleans(), None, 4))),
    ):
        if value is not None:
            spec[key] = copy.deepcopy(value)
    if not hostile and draw(st.integers(0, 15)) == 0:
        spec["schedulerName"] = draw(st.sampled_from(SCHEDULERS[3:]))
    if draw(st.booleans()):
        spec["restartPolicy"] = "Never"
    return spec


@st.composite
def pod_metadata(draw: st.DrawFn, *, hostile: bool = False, mig: bool = False) -> Obj:
    metadata: Obj = {"name": draw(st.sampled_from(["train-0", "infer", "x"]))}
    if draw(st.booleans()):
        metadata["namespace"] = draw(st.sampled_from(["default", "ml", "gpu-mps"]))
    if draw(st.booleans()):
        metadata["labels"] = {"app": "trainer"}
    careful = not hostile and draw(st.integers(0, 9)) > 0
    choices = _CAREFUL_ANNOTATIONS if careful else ANNOTATIONS
    keys = draw(st.lists(st.sampled_from(sorted(choices)), max_size=3, unique=True))
    annotations = {k: draw(st.sampled_from(choices[k])) for k in keys}
    if careful and mig:
        annotations = {k: v for k, v in annotations.items() if "mode" not in k}
    empty_annotations: bool = draw(st.booleans())
    if annotations or empty_annotations:
        metadata["annotations"] = annotations
    return metadata


@st.composite
def pods(draw: st.DrawFn, *, hostile: bool | None = None) -> Obj:
    """A Pod as users write it (``hostile``: bypass attempts are common; None: either).

    A careful user's GPU containers ask for the resources of one stack (HAMi, ACK,
    Volcano or MIG); a hostile one mixes any.
    """
    if hostile is None:
        hostile = draw(st.booleans())
    profile = "any" if hostile else draw(st.sampled_from(sorted(PROFILES)))
    gpu = GPU_RESOURCES if hostile else PROFILES[profile]
    pod: Obj = {"apiVersion": "v1", "kind": "Pod"}
    if draw(st.integers(0, 9)) > 0:
        pod["metadata"] = draw(pod_metadata(hostile=hostile, mig=profile == "mig"))
    pod["spec"] = draw(pod_specs(hostile=hostile, gpu=gpu))
    if not hostile and profile == "mig":
        pod["spec"].pop("nodeSelector", None)
    return pod


def wrap(pod: Mapping[str, Any], kind: str) -> Obj:
    """``pod`` as the template of a workload of ``kind`` (a copy of the pod for "Pod")."""
    if kind == "Pod":
        return copy.deepcopy(dict(pod))
    template: Obj = {"spec": copy.deepcopy(pod.get("spec"))}
    metadata = pod.get("metadata")
    if isinstance(metadata, Mapping):
        template["metadata"] = {k: v for k, v in copy.deepcopy(metadata).items() if k != "name"}
    elif "metadata" in pod:
        template["metadata"] = copy.deepcopy(metadata)
    api = {"Job": "batch/v1", "CronJob": "batch/v1", "ReplicationController": "v1"}.get(
        kind, "apps/v1"
    )
    obj: Obj = {"apiVersion": api, "kind": kind, "metadata": {"name": "w", "namespace": "ml"}}
    if kind == "CronJob":
        obj["spec"] = {"schedule": "*/5 * * * *", "jobTemplate": {"spec": {"template": template}}}
    elif kind == "ReplicationController":
        obj["spec"] = {"replicas": 2, "selector": {"app": "a"}, "template": template}
    elif kind == "Job":
        obj["spec"] = {"backoffLimit": 2, "template": template}
    else:
        obj["spec"] = {"replicas": 2, "selector": {"matchLabels": {"app": "a"}}}
        obj["spec"]["template"] = template
    return obj


def template_of(obj: Mapping[str, Any], kind: str) -> Any:
    """The pod (for "Pod") or the pod template inside ``obj``; None when absent."""
    if kind == "Pod":
        return obj
    node: Any = obj
    for part in TEMPLATE_PATHS[kind]:
        node = node.get(part) if isinstance(node, Mapping) else None
    return node


@st.composite
def objects(draw: st.DrawFn, *, hostile: bool | None = None) -> tuple[str, Obj]:
    """(kind, object): a Pod, or a workload of any kind around a pod template."""
    kind = draw(st.sampled_from(ALL_KINDS))
    return kind, wrap(draw(pods(hostile=hostile)), kind)


# -- junk ------------------------------------------------------------------------------

_SCALARS: Final = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**63), 2**64),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(["", "true", "/dev/nvidia0", "nvidia.com/gpu", "NVIDIA_VISIBLE_DEVICES", "-"]),
)
junk: Final[st.SearchStrategy[Any]] = st.recursive(
    _SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(
            st.one_of(
                st.sampled_from(
                    [
                        "name",
                        "value",
                        "valueFrom",
                        "env",
                        "limits",
                        "requests",
                        "resources",
                        "path",
                        "hostPath",
                        "mountPath",
                        "privileged",
                        "containers",
                    ]
                ),
                st.text(max_size=8),
            ),
            inner,
            max_size=4,
        ),
    ),
    max_leaves=12,
)


@st.composite
def corrupted(draw: st.DrawFn, value: Any, odds: int = 20) -> Any:
    """``value`` with any node (the root included) replaced by junk about once in ``odds``."""
    if draw(st.integers(0, odds - 1)) == 0:
        return draw(junk)
    if isinstance(value, dict):
        return {k: draw(corrupted(v, odds)) for k, v in value.items()}
    if isinstance(value, list):
        return [draw(corrupted(v, odds)) for v in value]
    return value


@st.composite
def wild_objects(draw: st.DrawFn) -> tuple[str, Any]:
    """(kind, object) where any part of a pod-shaped object may be junk of any JSON type."""
    kind, obj = draw(objects())
    mangled = draw(corrupted(obj))
    if not isinstance(mangled, dict):
        # decide() takes a mapping; the server has already refused non-object bodies.
        mangled = {"kind": kind, "spec": mangled}
    return kind, mangled


# -- attacks ---------------------------------------------------------------------------

# Path segments from which host paths are built: device directories, the mutation's
# own directories, and the dots and empty segments that normalisation must see through.
_SEGMENTS: Final = (
    "",
    ".",
    "..",
    "dev",
    "nvidia0",
    "nvidiactl",
    "char",
    "run",
    "nvidia",
    "nvidia-container-devices",
    "var",
    "tmp",
    "vgpulock",
    "nvidia-mps",
    "usr",
    "local",
    "vgpu",
    "libvgpu.so",
    "data",
    "proc",
    "1",
    "root",
    "self",
    "lib",
    "kubelet",
    "device-plugins",
    "pod-resources",
    "containerd",
    "containerd.sock",
    "docker.sock",
    "docker",
    "crio",
    "k3s",
)


@st.composite
def spelled(draw: st.DrawFn, path: str) -> str:
    """``path`` (absolute) spelled another way that normalises back to it: doubled
    slashes, ``.`` and ``x/..`` segments, a trailing slash, no leading slash."""
    out: list[str] = []
    for part in [p for p in path.split("/") if p]:
        noise = draw(st.sampled_from(["", "", "", "", ".", "..", "/"]))
        if noise == ".":
            out.append(".")
        elif noise == "..":
            out += [draw(st.sampled_from(["tmp", "x", part])), ".."]
        elif noise == "/":
            out.append("")
        out.append(part)
    lead = draw(st.sampled_from(["/", "/", "/", "//", ""]))
    tail = draw(st.sampled_from(["", "", "/", "/."]))
    return lead + "/".join(out) + tail


# Host paths every pod is refused (DESIGN, "Rules cover what a pod can reach"), and
# directories below which a mount destination is a device request to the NVIDIA runtime.
SIDE_HOST_PATHS: Final = (
    "/var/lib/kubelet",
    "/var/lib/kubelet/device-plugins/kubelet.sock",
    "/var/lib/kubelet/pod-resources",
    "/var/lib/kubelet/pods",
    "/var/lib",
    "/proc",
    "/proc/1/root",
    "/proc/sys",
    "/run/containerd",
    "/run/containerd/containerd.sock",
    "/var/run/containerd/containerd.sock",
    "/run/crio/crio.sock",
    "/var/run/crio",
    "/run/docker.sock",
    "/var/run/docker.sock",
    "/run/cri-dockerd.sock",
    "/var/run/cri-dockerd.sock",
    "/run/k3s/containerd/containerd.sock",
    "/var/lib/containerd",
    "/var/lib/docker",
)
DEVICE_REQUEST_DIRS: Final = ("/var/run/nvidia-container-devices", "/run/nvidia-container-devices")


@st.composite
def host_paths(draw: st.DrawFn) -> str:
    """Host paths as a grammar of segments (absolute or not, with any dots and slashes),
    or a protected path spelled another way."""
    if draw(st.integers(0, 2)) == 0:
        return draw(spelled(draw(st.sampled_from(SIDE_HOST_PATHS))))
    segments = draw(st.lists(st.sampled_from(_SEGMENTS), max_size=5))
    lead = draw(st.sampled_from(["/", "/", "/", "//", ""]))
    tail = draw(st.sampled_from(["", "", "/"]))
    return lead + "/".join(segments) + tail


@st.composite
def device_request_paths(draw: st.DrawFn) -> str:
    """A mount destination the NVIDIA runtime reads as a device request, spelled any way."""
    leaf = draw(st.sampled_from(["", "/all", "/0", "/GPU-0", "/all/x"]))
    return draw(spelled(draw(st.sampled_from(DEVICE_REQUEST_DIRS)) + leaf))


# capabilities.add entries: CAP_SYS_ADMIN however spelled (runtimes upper-case them, as
# Python does: the long s upper-cases to S), and others.
CAPABILITIES: Final = (
    "SYS_ADMIN",
    "CAP_SYS_ADMIN",
    "sys_admin",
    "Cap_Sys_Admin",
    "ALL",
    "all",
    "\u017fys_admin",
    "NET_ADMIN",
    "SYS_PTRACE",
    " SYS_ADMIN",
)
# The host's GPU stack (rules.STACK_ROOTS and the driver files), and beside it.
STACK_PATHS: Final = (
    "/sys",
    "/sys/bus/pci/devices/0000:3b:00.0/remove",
    "/sys/module/nvidia",
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
    "/lib/x86_64-linux-gnu/libnvidia-ml.so.1",
    "/usr/lib64",
    "/opt/driver/libcuda.so.580",
    "/usr/bin/nvidia-smi",
    "/usr/local/bin/nvidia-ctk",
    "/usr/bin/nvidia-container-runtime-hook",
    "/lib",
    "/usr/share",
    "/opt/libcudart.so",
    "/sysroot",
)
# envFrom prefixes: ones that spell a guarded name with some key, and ones that cannot.
ENV_PREFIXES: Final = (
    "NVIDIA_",
    "NVIDIA_VISIBLE_",
    "CUDA_",
    "CUDA_DEVICE_MEMORY_LIMIT_",
    "GPU_",
    "APP_",
    "NVIDIA_VISIBLE_DEVICES",
    "",
    "X",
)
# DRA's extended resources of device classes (DRAExtendedResource).
CLASS_RESOURCES: Final = (
    "deviceclass.resource.kubernetes.io/gpu.nvidia.com",
    "deviceclass.resource.kubernetes.io/mig.nvidia.com",
    "deviceclass.resource.kubernetes.io/example.com-fpga",
)


@st.composite
def legacy_env(draw: st.DrawFn) -> list[Obj]:
    """CUDA_VERSION, and sometimes what makes the image no legacy one after all."""
    version: Obj = draw(
        st.sampled_from(
            [
                {"name": "CUDA_VERSION", "value": "9.0"},
                {"name": "CUDA_VERSION", "value": "12.4.1"},
                {"name": "CUDA_VERSION", "value": ""},
                {"name": "CUDA_VERSION", "valueFrom": VALUE_FROM[1]},
            ]
        )
    )
    entries = [version]
    extra = draw(
        st.sampled_from(
            [
                None,
                None,
                {"name": "NVIDIA_REQUIRE_CUDA", "value": "cuda>=9.0"},
                {"name": "NVIDIA_REQUIRE_CUDA", "value": ""},
                {"name": "NVIDIA_REQUIRE_CUDA", "value": "$(X)"},
                {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"},
                {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "compute"},
            ]
        )
    )
    if extra is not None:
        entries.append(extra)
    return entries


# Env names an attacker combines: the switches, and variables to reference from them.
_ATTACK_ENV: Final = (
    *["CUDA_DISABLE_CONTROL"] * 3,
    *["GPU_CORE_UTILIZATION_POLICY"] * 2,
    *["CUDA_REDIRECT"] * 2,
    *["ACTIVE_OOM_KILLER"] * 2,
    "NVIDIA_VISIBLE_DEVICES",
    *_CHANNEL_VALUES,
    "GPUS",
    "OFF",
    "P",
    "LIB",
    "OOM",
)
_REFERENCED: Final = ("GPUS", "OFF", "P", "LIB", "OOM")


@st.composite
def attack_env(draw: st.DrawFn) -> list[Obj]:
    """A few entries over a small set of names: duplicates and references are common."""
    entries: list[Obj] = []
    for _ in range(draw(st.integers(1, 4))):
        name = draw(st.sampled_from(_ATTACK_ENV))
        if draw(st.integers(0, 7)) == 0:
            entries.append({"name": name, "valueFrom": draw(st.sampled_from(VALUE_FROM))})
            continue
        known = _ENV_VALUES.get(name) or _CHANNEL_VALUES[name]
        values = [*known, *(f"$({n})" for n in _REFERENCED), "$$(OFF)"]
        entries.append({"name": name, "value": draw(st.sampled_from(values))})
    return entries


_ATTACKS: Final = (
    *["env"] * 3,
    "privileged",
    "capability",
    "hostNamespace",
    *["cuda-legacy"] * 2,
    "env-prefix",
    "stack-path",
    "claim",
    "nodeName",
    *["hostPath"] * 2,
    "annotation",
    "scheduler",
    "ephemeral",
    *["injected-mount"] * 2,
    "device-request-mount",
    "sidecar",
)
# The injected volumes (by name) and where a tenant mounts them: at the injected path,
# beside it (a trailing slash), or anywhere else.
_INJECTED_MOUNT_PATHS: Final = (
    "/usr/local/vgpu/libvgpu.so",
    "/usr/local/vgpu/libvgpu.so/",
    "/etc/ld.so.preload",
    "/tmp/nvidia-mps",
    "/tmp/vgpulock",
    "/overrideEnv",
    "/hook",
    "/opt/lib/libvgpu.so",
)


def _asks_for_gpu(container: Obj) -> bool:
    resources = container.get("resources")
    if not isinstance(resources, dict):
        return False
    parts = [resources.get("limits"), resources.get("requests")]
    return any(isinstance(p, dict) and set(p) & set(GPU_RESOURCES) for p in parts)


def _all_containers(spec: Obj) -> list[Obj]:
    return [c for kind in CONTAINER_KINDS for c in spec.get(kind, []) if isinstance(c, dict)]


@st.composite
def attacked_pods(draw: st.DrawFn, attacks: Sequence[str] = _ATTACKS) -> Obj:
    """A careful user's pod with bypass attempts of the kinds in ``attacks`` spliced in.

    Mostly one attempt: a pod refused for an obvious attempt hides a subtle one.
    """
    pod = draw(pods(hostile=False))
    spec = pod["spec"]
    for _ in range(draw(st.sampled_from([1, 1, 1, 2, 3]))):
        attack = draw(st.sampled_from(attacks))
        # Mostly a container that asks for a GPU: that is where limits can be switched off.
        every = _all_containers(spec)
        gpu = [c for c in every if _asks_for_gpu(c)]
        prefer_gpu: bool = draw(st.integers(0, 3)) > 0
        target = draw(st.sampled_from(gpu if gpu and prefer_gpu else every))
        if attack == "env":
            env = target.setdefault("env", [])
            if not isinstance(env, list):
                continue
            at = draw(st.integers(0, len(env)))
            env[at:at] = draw(attack_env())
        elif attack == "privileged":
            target["securityContext"] = {"privileged": True}
        elif attack == "capability":
            caps = draw(st.lists(st.sampled_from(CAPABILITIES), min_size=1, max_size=2))
            target["securityContext"] = {"capabilities": {"add": caps}}
        elif attack == "hostNamespace":
            spec[draw(st.sampled_from(["hostPID", "hostIPC"]))] = True
        elif attack == "cuda-legacy":
            env = target.setdefault("env", [])
            if not isinstance(env, list):
                continue
            env.extend(draw(legacy_env()))
            if draw(st.integers(0, 2)) == 0:
                debugger: Obj = {"name": "debugger", "image": "busybox:1.36"}
                debugger["env"] = draw(legacy_env())
                _add_container(spec, "ephemeralContainers", debugger)
        elif attack == "env-prefix":
            source = {"prefix": draw(st.sampled_from(ENV_PREFIXES)), "configMapRef": {"name": "e"}}
            sources = target.setdefault("envFrom", [])
            if isinstance(sources, list):
                sources.append(source)
        elif attack == "stack-path":
            volumes = spec.setdefault("volumes", [])
            volumes[:] = [v for v in volumes if v.get("name") != "stack"]
            volumes.append(
                {
                    "name": "stack",
                    "hostPath": {"path": draw(spelled(draw(st.sampled_from(STACK_PATHS))))},
                }
            )
            stack_mount: Obj = {"name": "stack", "mountPath": "/host"}
            if draw(st.booleans()):
                stack_mount["readOnly"] = True
            _add_mount(target, stack_mount)
        elif attack == "claim":
            resources = target.setdefault("resources", {})
            if not isinstance(resources, dict):
                continue
            if draw(st.booleans()):
                spec["resourceClaims"] = [{"name": "gpu", "resourceClaimTemplateName": "gpu"}]
                resources["claims"] = [{"name": "gpu"}]
            else:
                limits = resources.setdefault("limits", {})
                if isinstance(limits, dict):
                    limits[draw(st.sampled_from(CLASS_RESOURCES))] = "1"
        elif attack == "nodeName":
            spec["nodeName"] = "gpu-node-7"
        elif attack == "hostPath":
            name = draw(st.sampled_from(["devices", "host", *INJECTED_NAMES]))
            volumes = spec.setdefault("volumes", [])
            volumes[:] = [v for v in volumes if v.get("name") != name]
            volumes.append({"name": name, "hostPath": {"path": draw(host_paths())}})
        elif attack == "annotation":
            key = draw(st.sampled_from(sorted(ANNOTATIONS)))
            metadata = pod.setdefault("metadata", {})
            annotations = metadata.get("annotations")
            if not isinstance(annotations, dict):
                metadata["annotations"] = annotations = {}
            annotations[key] = draw(st.sampled_from(ANNOTATIONS[key]))
        elif attack == "scheduler":
            spec["schedulerName"] = draw(st.sampled_from(SCHEDULERS))
        elif attack == "injected-mount":
            _add_mount(target, draw(injected_mounts()))
        elif attack == "device-request-mount":
            _ensure_volume(spec, {"name": "req", "emptyDir": {}})
            request: Obj = {"name": "req", "mountPath": draw(device_request_paths())}
            if draw(st.booleans()):
                request["readOnly"] = True
            _add_mount(target, request)
        elif attack == "sidecar":
            _add_container(spec, "initContainers", draw(sidecars()))
        else:
            _add_container(spec, "ephemeralContainers", draw(debuggers()))
    return pod


def _add_mount(container: Obj, mount: Obj) -> None:
    mounts = container.setdefault("volumeMounts", [])
    if isinstance(mounts, list):
        mounts.append(mount)


def _ensure_volume(spec: Obj, volume: Obj) -> None:
    volumes = spec.setdefault("volumes", [])
    if isinstance(volumes, list) and all(v.get("name") != volume["name"] for v in volumes):
        volumes.append(volume)


def _add_container(spec: Obj, kind: str, container: Obj) -> None:
    """Add ``container`` unless its name is taken (the apiserver keeps names unique)."""
    if container["name"] not in {c.get("name") for c in _all_containers(spec)}:
        spec.setdefault(kind, []).append(container)


@st.composite
def injected_mounts(draw: st.DrawFn) -> Obj:
    """A mount of a volume the mutation injects: often writable, sometimes a subPath."""
    mount: Obj = {
        "name": draw(st.sampled_from(INJECTED_NAMES)),
        "mountPath": draw(st.sampled_from(_INJECTED_MOUNT_PATHS)),
    }
    read_only = draw(st.sampled_from([None, None, False, True]))
    if read_only is not None:
        mount["readOnly"] = read_only
    sub = draw(sometimes(st.sampled_from(["subPath", "subPathExpr"]), None, odds=3))
    if sub is not None:
        mount[sub] = "x" if sub == "subPath" else "$(POD_NAME)"
    return mount


@st.composite
def sidecars(draw: st.DrawFn) -> Obj:
    """A sidecar init container (restartPolicy Always): a GPU slice, a switch, or a mount."""
    container: Obj = {"name": "proxy", "image": "envoyproxy/envoy:v1.31", "restartPolicy": "Always"}
    if draw(st.booleans()):
        profile = draw(st.sampled_from(["hami", "hami-percentage"]))
        container["resources"] = draw(resource_blocks(gpu=PROFILES[profile], hostile=False))
    what = draw(st.sampled_from(["nothing", "env", "mount"]))
    if what == "env":
        container["env"] = draw(attack_env())
    elif what == "mount":
        container["volumeMounts"] = [draw(injected_mounts())]
    return container


@st.composite
def debuggers(draw: st.DrawFn) -> Obj:
    """An ephemeral container as `kubectl debug` adds it (no resources: the apiserver
    refuses them): privileged, with a switch in its env, or mounting what it must not."""
    container: Obj = {"name": "debugger", "image": "busybox:1.36"}
    what = draw(st.sampled_from(["privileged", "env", "injected-mount", "device-request", "plain"]))
    if what == "privileged":
        container["securityContext"] = {"privileged": True}
    elif what == "env":
        container["env"] = draw(attack_env())
    elif what == "injected-mount":
        container["volumeMounts"] = [draw(injected_mounts())]
    elif what == "device-request":
        # The pod's own volumes: the lock directory the mutation adds, or the tenant's.
        volume = draw(st.sampled_from(["gpushare-vgpu-lock", *_VOLUME_NAMES]))
        container["volumeMounts"] = [{"name": volume, "mountPath": draw(device_request_paths())}]
    return container


# -- updates ---------------------------------------------------------------------------

# Who sends an update: the tenant, the identities HAMi's scheduler and device plugin run
# as (the default policy's reserved-annotation writers), and identities that look alike.
IDENTITIES: Final[Mapping[str, tuple[str, tuple[str, ...]]]] = {
    "tenant": ("alice", ("system:authenticated",)),
    "scheduler": (
        "system:serviceaccount:kube-system:hami-scheduler",
        ("system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"),
    ),
    "device-plugin": (
        "system:serviceaccount:kube-system:hami-device-plugin",
        ("system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"),
    ),
    "own-namespace-scheduler": (
        "system:serviceaccount:ml:hami-scheduler",
        ("system:serviceaccounts", "system:serviceaccounts:ml", "system:authenticated"),
    ),
    "user-named-scheduler": ("hami-scheduler", ("system:authenticated",)),
    "kube-system-default": (
        "system:serviceaccount:kube-system:default",
        ("system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"),
    ),
}
# Annotations an update adds, changes or removes: the scheduler's, CDI, the mode, others.
_UPDATE_ANNOTATIONS: Final[Mapping[str, Sequence[str]]] = {
    "hami.io/vgpu-devices-to-allocate": ("GPU-0,NVIDIA,3000,30:;", "GPU-0,NVIDIA,81920,100:;"),
    "hami.io/vgpu-devices-allocated": ("GPU-0,NVIDIA,3000,30:;", "GPU-0,NVIDIA,81920,100:;"),
    "hami.io/vgpu-node": ("gpu-node-1", "gpu-node-2"),
    "hami.io/bind-phase": ("allocating", "success", "failed"),
    "hami.io/bind-time": ("1732312345",),
    "hami.io/vgpu-time": ("1732312345",),
    "hami.io/mig-devices-allocated": ("GPU-0,NVIDIA,3000,30:;",),
    "cdi.k8s.io/devices": ("nvidia.com/gpu=all", "example.com/fpga=0"),
    "devices.crio.io": ("/dev/fuse", "/dev/nvidia0"),
    "team": ("ml", "infra"),
}


@st.composite
def pod_updates(draw: st.DrawFn) -> list[tuple[str, Any, Any]]:
    """Edits one UPDATE of a pod makes (what a pod's spec allows to change after create):
    ("annotate", key, value or None to remove), ("label", key, value), ("debug", container)."""
    edits: list[tuple[str, Any, Any]] = []
    for _ in range(draw(st.integers(1, 3))):
        what = draw(st.sampled_from(["annotate", "annotate", "annotate", "label", "debug"]))
        if what == "annotate":
            key = draw(st.sampled_from(sorted(_UPDATE_ANNOTATIONS)))
            value = draw(st.one_of(st.none(), st.sampled_from(_UPDATE_ANNOTATIONS[key])))
            edits.append(("annotate", key, value))
        elif what == "label":
            edits.append(("label", "team", draw(st.sampled_from(["ml", "infra"]))))
        else:
            edits.append(("debug", draw(debuggers()), None))
    return edits


def apply_update(old: Mapping[str, Any], edits: Sequence[tuple[str, Any, Any]]) -> Obj:
    """A copy of the pod ``old`` with ``edits`` (from :func:`pod_updates`) applied."""
    new: Obj = copy.deepcopy(dict(old))
    metadata = new.setdefault("metadata", {})
    for what, first, second in edits:
        if what == "annotate":
            annotations = metadata.setdefault("annotations", {})
            if second is None:
                annotations.pop(first, None)
            else:
                annotations[first] = second
        elif what == "label":
            metadata.setdefault("labels", {})[first] = second
        else:
            spec = new.setdefault("spec", {})
            name = f"debugger-{len(spec.get('ephemeralContainers') or [])}"
            _add_container(spec, "ephemeralContainers", {**copy.deepcopy(first), "name": name})
    return new


# -- quota -----------------------------------------------------------------------------


@st.composite
def quota_pods(draw: st.DrawFn) -> Obj:
    """A vGPU pod with valid slices in main, plain init and sidecar init containers, in
    any order: the arithmetic of what runs together is all there is to get wrong."""

    def ask() -> Obj | None:
        shape = draw(st.sampled_from(["none", "count", "slice", "memory", "percentage", "volcano"]))
        gpus = str(draw(st.integers(1, 3)))
        mib = str(draw(st.sampled_from([1000, 2000, 3000, 4500])))
        limits = {
            "none": None,
            "count": {"nvidia.com/gpu": gpus},
            "slice": {"nvidia.com/gpu": gpus, "nvidia.com/gpumem": mib},
            "memory": {"nvidia.com/gpumem": mib},
            "percentage": {"nvidia.com/gpumem-percentage": "25"},
            "volcano": {"volcano.sh/vgpu-number": gpus},
        }[shape]
        return {"limits": limits} if limits is not None else None

    def container(name: str, *, sidecar: bool = False) -> Obj:
        result: Obj = {"name": name, "image": "cuda:12"}
        resources = ask()
        if resources is not None:
            result["resources"] = resources
        if sidecar:
            result["restartPolicy"] = "Always"
        return result

    main = [container(f"main-{i}") for i in range(draw(st.integers(1, 3)))]
    init = [
        container(f"init-{i}", sidecar=draw(st.booleans())) for i in range(draw(st.integers(0, 3)))
    ]
    spec: Obj = {"containers": main}
    if init:
        spec["initContainers"] = init
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "q", "namespace": "ml"},
        "spec": spec,
    }


@st.composite
def attacked_objects(draw: st.DrawFn, attacks: Sequence[str] = _ATTACKS) -> tuple[str, Obj]:
    """(kind, object): an attacked pod, bare or as the template of any workload kind."""
    kind = draw(st.sampled_from(ALL_KINDS))
    return kind, wrap(draw(attacked_pods(attacks)), kind)
