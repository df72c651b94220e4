"""A bypass oracle: whatever DESIGN's rule table says must be refused, the engine refuses.

``should_block`` is written from DESIGN and from how the consumers of a pod spec read it
(the kubelet, the NVIDIA container runtime, HAMi's device plugin), without importing the
rules it checks. The engine may refuse more than the oracle; a pod the oracle blocks and
the engine admits is a bypass.

The same holds for a pod UPDATE (``should_block_update``: what the update adds, and
reserved annotations touched by anyone but their writers), for the mounts of the pod the
kubelet will run (after the mutation added its volumes), and for the quota, where
the oracle computes Kubernetes' effective requests and must agree with the engine both ways.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, Final

import pytest
from hypothesis import given
from hypothesis import strategies as st
from kubernetes.utils.quantity import parse_quantity

from tests.core.strategies import (
    IDENTITIES,
    PROPERTY_SETTINGS,
    Obj,
    apply_update,
    attacked_objects,
    attacked_pods,
    objects,
    pod_updates,
    quota_pods,
    template_of,
)
from webhook.core.admission import answer
from webhook.core.review import review_object
from webhook.dev.testing import admission_review
from webhook.policies import DEFAULT_POLICY, parse_policy

# DESIGN's resource table, plus nvidia.com/mig-<profile>.
GPU_RESOURCE_NAMES: Final = frozenset(
    {
        "nvidia.com/gpu",
        "nvidia.com/gpumem",
        "nvidia.com/gpumem-percentage",
        "nvidia.com/gpucores",
        "nvidia.com/priority",
        "aliyun.com/gpu-mem",
        "aliyun.com/gpu-core.percentage",
        "volcano.sh/vgpu-number",
        "volcano.sh/vgpu-memory",
        "volcano.sh/vgpu-cores",
        "volcano.sh/vgpu-memory-percentage",
    }
)
# Go's strconv.ParseBool, which HAMi's device plugin applies to CUDA_DISABLE_CONTROL.
PARSE_BOOL_TRUE: Final = frozenset({"1", "t", "T", "TRUE", "true", "True"})
# HAMi-core compares GPU_CORE_UTILIZATION_POLICY with exactly these two spellings.
CORE_POLICY_DISABLE: Final = frozenset({"disable", "DISABLE"})
# ... and ACTIVE_OOM_KILLER with these two for "off".
OOM_KILLER_OFF: Final = frozenset({"false", "0"})
# The NVIDIA runtime selects no device for these; other spellings are device lists (or
# errors: "NONE" names no device, so it exposes none either).
NO_DEVICES: Final = frozenset({"", "none", "void"})
# NVIDIA device nodes and runtime state, and /dev/char/<major>:<minor>: the same nodes
# by number.
DEVICE_DIRS: Final = ("/dev/nvidia", "/run/nvidia", "/var/run/nvidia", "/dev/char/")
# Directories the mutation itself mounts from the host (libvgpu, its lock, the MPS pipe).
SHARING_DIRS: Final = ("/usr/local/vgpu", "/tmp/vgpulock", "/tmp/nvidia-mps")
# What reaches the accounting from the side (DESIGN, "Rules cover what a pod can reach"):
# the kubelet's state, /proc, and the container runtimes' sockets and state.
SIDE_DIRS: Final = (
    "/var/lib/kubelet",
    "/proc",
    "/run/containerd",
    "/var/run/containerd",
    "/run/crio",
    "/var/run/crio",
    "/run/docker.sock",
    "/var/run/docker.sock",
    "/run/cri-dockerd.sock",
    "/var/run/cri-dockerd.sock",
    "/run/k3s",
    "/var/lib/containerd",
    "/var/lib/docker",
)
# The NVIDIA container toolkit reads device requests from mount destinations below these
# (accept-nvidia-visible-devices-as-volume-mounts), whatever volume is mounted there.
DEVICE_REQUEST_DIRS: Final = ("/var/run/nvidia-container-devices", "/run/nvidia-container-devices")
# Injected host volumes shared by every GPU pod of a node (libvgpu.so, the preload file,
# the MPS pipe directory), by name and by host path: any mount of them must be read-only.
# (The lock directory /tmp/vgpulock is the one injected volume mounted writable.)
READ_ONLY_VOLUMES: Final = frozenset(
    {"gpushare-vgpu-lib", "gpushare-vgpu-preload", "gpushare-mps-pipe"}
)
READ_ONLY_HOST_PATHS: Final = frozenset(
    {"/usr/local/vgpu/libvgpu.so", "/usr/local/vgpu/ld.so.preload", "/tmp/nvidia-mps"}
)
INJECTED_VOLUME_NAMES: Final = frozenset(
    {
        "gpushare-vgpu-lib",
        "gpushare-vgpu-lock",
        "gpushare-vgpu-preload",
        "gpushare-mps-pipe",
    }
)
SCHEDULER_OWNED_ANNOTATIONS: Final = frozenset(
    {
        "hami.io/vgpu-devices-to-allocate",
        "hami.io/vgpu-devices-allocated",
        "hami.io/vgpu-node",
        "hami.io/vgpu-time",
        "hami.io/bind-phase",
        "hami.io/bind-time",
    }
)
# Every device type's allocation keys (HAMi writes hami.io/<type>-devices-...).
SCHEDULER_OWNED_GLOBS: Final = ("hami.io/*-devices-to-allocate", "hami.io/*-devices-allocated")
# Who writes them: HAMi's scheduler and device plugin (policy reservedAnnotationWriters).
ALLOCATION_WRITERS: Final = frozenset(
    {
        "system:serviceaccount:kube-system:hami-scheduler",
        "system:serviceaccount:kube-system:hami-device-plugin",
    }
)
_REFERENCE: Final = re.compile(r"\$\$|\$\(([^)]*)\)")
UNKNOWN: Final = object()  # a value the webhook cannot know (valueFrom, or built from one)


def _containers(spec: Mapping[str, Any]) -> Iterator[Mapping[str, Any]]:
    for kind in ("containers", "initContainers", "ephemeralContainers"):
        items = spec.get(kind)
        if isinstance(items, list):
            yield from (c for c in items if isinstance(c, Mapping))


def _resource_names(container: Mapping[str, Any]) -> set[str]:
    resources = container.get("resources")
    if not isinstance(resources, Mapping):
        return set()
    names: set[str] = set()
    for part in ("limits", "requests"):
        amounts = resources.get(part)
        if isinstance(amounts, Mapping):
            names.update(n for n in amounts if isinstance(n, str))
    return names


def _gpu(name: str) -> bool:
    return name in GPU_RESOURCE_NAMES or name.startswith("nvidia.com/mig-")


def _zero(raw: Any) -> bool:
    """The apiserver reads ``raw`` as a zero quantity (the kubernetes client's parser)."""
    if isinstance(raw, bool) or not isinstance(raw, int | float | str):
        return False
    try:
        return bool(parse_quantity(raw) == 0)  # type: ignore[no-untyped-call]
    except ValueError:
        return False


def _no_gpu(container: Mapping[str, Any]) -> bool:
    """``nvidia.com/gpu: 0``: every GPU amount the container names is zero, a count or a
    MIG instance among them, no priority (0 is a priority): the kubelet gives it no GPU
    and no scheduler implies one."""
    resources = container.get("resources")
    if not isinstance(resources, Mapping):
        return False
    counted = False
    for part in ("limits", "requests"):
        amounts = resources.get(part)
        for name, raw in amounts.items() if isinstance(amounts, Mapping) else ():
            if not isinstance(name, str) or not _gpu(name):
                continue
            if name == "nvidia.com/priority" or not _zero(raw):
                return False
            counted = counted or name in COUNTS or name.startswith("nvidia.com/mig-")
    return counted


def _gpu_names(spec: Mapping[str, Any]) -> set[str]:
    names = set().union(*(_resource_names(c) for c in _containers(spec) if not _no_gpu(c)))
    return {n for n in names if _gpu(n)}


def _env(container: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    env = container.get("env")
    if not isinstance(env, list):
        return []
    return [e for e in env if isinstance(e, Mapping) and isinstance(e.get("name"), str)]


def _literal(entry: Mapping[str, Any]) -> Any:
    if "valueFrom" in entry:
        return UNKNOWN
    value = entry.get("value")
    return "" if value is None else str(value)


def kubelet_env(container: Mapping[str, Any]) -> dict[str, Any]:
    """The container's environment as the kubelet builds it: in order, each value with
    $(VAR) references to earlier variables expanded ($$ escapes), the last entry of a
    name winning. Values the webhook cannot know are UNKNOWN."""
    result: dict[str, Any] = {}
    for entry in _env(container):
        value = _literal(entry)
        if value is not UNKNOWN:
            unknown = False

            def expand(match: re.Match[str]) -> str:
                nonlocal unknown
                if match.group(0) == "$$":
                    return "$"
                referenced = result.get(match.group(1))
                if referenced is UNKNOWN:
                    unknown = True
                    return ""
                return match.group(0) if referenced is None else str(referenced)

            value = _REFERENCE.sub(expand, value)
            if unknown:
                value = UNKNOWN
        result[entry["name"]] = value
    return result


def _normalise(path: str) -> str:
    parts: list[str] = []
    for part in path.split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if parts:
                parts.pop()
        else:
            parts.append(part)
    return "/" + "/".join(parts)


def _under(path: str, directory: str) -> bool:
    return path == directory or path.startswith(directory.rstrip("/") + "/")


def _host_path_exposes(path: str, volume_name: Any) -> bool:
    # A relative hostPath is taken from the kubelet's working directory, which is "/".
    path = _normalise(path)
    if path.startswith(DEVICE_DIRS):
        return True
    # /proc as a whole (/proc/<pid>/root is the host's root filesystem under another
    # name), the kubelet's state and the runtimes' sockets, and what lies below them.
    if any(_under(path, d) for d in SIDE_DIRS):
        return True
    # A parent directory of the device nodes or of the side directories exposes them too.
    parents = ("/dev/nvidia0", "/run/nvidia", "/var/run/nvidia", *SIDE_DIRS)
    if any(_under(d, path) for d in parents):
        return True
    if volume_name in INJECTED_VOLUME_NAMES:
        return False  # the mutation's own volumes: it replaces them with its exact shape
    return any(_under(path, d) or _under(d, path) for d in SHARING_DIRS)


def reserved(key: Any) -> bool:
    """``key`` is an annotation only HAMi's scheduler and device plugin write."""
    if not isinstance(key, str):
        return False
    return key in SCHEDULER_OWNED_ANNOTATIONS or any(
        fnmatch.fnmatchcase(key, g) for g in SCHEDULER_OWNED_GLOBS
    )


def _mounts(container: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    mounts = container.get("volumeMounts")
    if not isinstance(mounts, list):
        return []
    return [m for m in mounts if isinstance(m, Mapping)]


def _switched_off(container: Mapping[str, Any]) -> bool:
    """HAMi-core's own switches loosened in ``container``'s env (value, valueFrom, $(VAR))."""
    env = kubelet_env(container)
    # CUDA_REDIRECT: any entry that is not empty; HAMi-core dlopens it instead of hooking.
    if any(
        _literal(e) is UNKNOWN or _literal(e)
        for e in _env(container)
        if e["name"] == "CUDA_REDIRECT"
    ):
        return True
    oom = env.get("ACTIVE_OOM_KILLER")
    if oom is UNKNOWN or oom in OOM_KILLER_OFF:
        return True
    # ACK's cGPU: any entry but an explicit false leaves isolation off for the container.
    return any(
        _literal(e) is UNKNOWN or str(_literal(e)).strip().lower() not in ("false", "0")
        for e in _env(container)
        if e["name"] == "CGPU_DISABLE"
    )


_ACCOUNTING: Final = {"aliyun.com": "default-scheduler", "volcano.sh": "volcano"}


def should_block(pod: Mapping[str, Any]) -> list[str]:
    """Why DESIGN's default policy must refuse ``pod`` (created now), or [] when it need not."""
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        return []
    metadata = pod.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, Mapping) else None
    annotations = annotations if isinstance(annotations, Mapping) else {}
    gpu_names = _gpu_names(spec)
    sharing = {n for n in gpu_names if not n.startswith("nvidia.com/mig-")}
    reasons: list[str] = []
    for container in _containers(spec):
        context = container.get("securityContext")
        if gpu_names and isinstance(context, Mapping) and context.get("privileged") is True:
            reasons.append("privileged-gpu")
        for entry in _env(container):
            if entry["name"] != "NVIDIA_VISIBLE_DEVICES":
                continue
            value = _literal(entry)
            if value is UNKNOWN or value.strip().lower() not in NO_DEVICES:
                reasons.append("raw-visible-devices")
        if gpu_names:
            # HAMi's device plugin reads every entry, unexpanded; processes see the
            # kubelet's environment.
            env = kubelet_env(container)
            raw = [_literal(e) for e in _env(container) if e["name"] == "CUDA_DISABLE_CONTROL"]
            effective = env.get("CUDA_DISABLE_CONTROL")
            if any(v is UNKNOWN or v in PARSE_BOOL_TRUE for v in [*raw, effective] if v):
                reasons.append("limit-tampering")
            core_policy = env.get("GPU_CORE_UTILIZATION_POLICY")
            if core_policy is UNKNOWN or core_policy in CORE_POLICY_DISABLE:
                reasons.append("limit-tampering")
            if _switched_off(container):
                reasons.append("limit-tampering")
        for mount in _mounts(container):
            target = mount.get("mountPath")
            # Relative: the runtime resolves it from the container's root.
            if isinstance(target, str) and any(
                _under(_normalise(target), d) for d in DEVICE_REQUEST_DIRS
            ):
                reasons.append("host-device-access")
    node = spec.get("nodeName")
    if gpu_names and node:
        reasons.append("node-name-pinning")
    volumes = spec.get("volumes")
    for volume in volumes if isinstance(volumes, list) else []:
        host = volume.get("hostPath") if isinstance(volume, Mapping) else None
        path = host.get("path") if isinstance(host, Mapping) else None
        if isinstance(path, str) and _host_path_exposes(path, volume.get("name")):
            reasons.append("host-device-access")
    for key, value in annotations.items():
        if str(key).startswith("cdi.k8s.io/") and "nvidia.com/" in str(value):
            reasons.append("host-device-access")
        if reserved(key):
            reasons.append("forged-allocation")
    scheduler = spec.get("schedulerName")
    # Who accounts for a vendor's slices: ACK's extender in the cluster's own scheduler,
    # Volcano's scheduler, HAMi's for the rest; a pod mixing vendors gets HAMi's.
    accounting = {_ACCOUNTING.get(n.split("/", 1)[0], "hami-scheduler") for n in sharing}
    wanted = accounting.pop() if len(accounting) == 1 else "hami-scheduler"
    # Whole GPUs alone, no mode asked for: another scheduler keeps them, off the nodes
    # HAMi labels gpu=on (policy wholeGpus), which the pod may not select itself.
    named = (
        any(str(annotations.get(k, "")).strip().lower() in _MODE_WORDS for k in _MODE_ANNOTATIONS)
        or str(_selector_of(spec).get("ack.node.gpu.schedule")) == "mps"
    )
    whole = gpu_names == {"nvidia.com/gpu"} and not named
    if (
        sharing
        and scheduler not in (None, "", "default-scheduler", wanted)
        and (not whole or _selector_of(spec).get("gpu") == "on")
    ):
        reasons.append("scheduler-bypass")
    return reasons


_MODE_ANNOTATIONS: Final = ("gpushare.io/mode", "nvidia.com/vgpu-mode", "volcano.sh/vgpu-mode")
_MODE_WORDS: Final = frozenset({"vgpu", "hami-core", "mps", "mig", "none"})


def _selector_of(spec: Mapping[str, Any]) -> Mapping[str, Any]:
    selector = spec.get("nodeSelector")
    return selector if isinstance(selector, Mapping) else {}


# The threat model's families (docs/threat-model.md), from the sources of what reads them.
# containerd and CRI-O upper-case capability names (Go's strings.ToUpper) and add CAP_;
# the NVIDIA toolkit's isPrivileged() tests for CAP_SYS_ADMIN.
SYS_ADMIN_NAMES: Final = frozenset({"CAP_SYS_ADMIN", "CAP_ALL"})
# Names a tenant must not hand a container through an envFrom prefix.
GUARDED_ENV: Final = (
    "NVIDIA_VISIBLE_DEVICES",
    "CUDA_VERSION",
    "CUDA_DISABLE_CONTROL",
    "GPU_CORE_UTILIZATION_POLICY",
    "CUDA_REDIRECT",
    "ACTIVE_OOM_KILLER",
    "CGPU_DISABLE",
)
# The host's GPU stack: sysfs, the driver's libraries and tools, the runtime's hook.
GPU_STACK_DIRS: Final = (
    "/sys",
    "/usr/lib/x86_64-linux-gnu",
    "/lib/x86_64-linux-gnu",
    "/usr/lib64",
    "/usr/bin/nvidia-smi",
    "/usr/bin/nvidia-container-runtime-hook",
)
GPU_STACK_FILES: Final = ("libcuda", "libnvidia-", "nvidia-smi", "nvidia-container-", "nvidia-ctk")
GPU_DEVICE_CLASSES: Final = ("gpu.nvidia.com", "mig.nvidia.com", "vfio.gpu.nvidia.com")


def _capability(name: str) -> str:
    upper = name.upper()
    return upper if upper.startswith("CAP_") else "CAP_" + upper


def _gets_a_gpu(container: Mapping[str, Any]) -> bool:
    """A device plugin or DRA hands the container a GPU: its NVIDIA_VISIBLE_DEVICES is
    theirs, not the image's."""
    resources = container.get("resources")
    if isinstance(resources, Mapping) and resources.get("claims"):
        return True
    names = _resource_names(container)
    if _no_gpu(container):
        names = {n for n in names if not _gpu(n)}
    return any("gpu" in n.lower() or n.startswith("nvidia.com/mig-") for n in names)


def family_reasons(pod: Mapping[str, Any]) -> list[str]:
    """Why the pod the kubelet will run (after the mutation) must be refused under the
    threat model's families, or []."""
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        return []
    gpu_names = _gpu_names(spec)
    reasons: list[str] = []
    writable: set[Any] = set()
    for container in _containers(spec):
        context = container.get("securityContext")
        caps = context.get("capabilities") if isinstance(context, Mapping) else None
        added = caps.get("add") if isinstance(caps, Mapping) else None
        if (
            gpu_names
            and isinstance(added, list)
            and any(isinstance(c, str) and _capability(c) in SYS_ADMIN_NAMES for c in added)
        ):
            reasons.append("privileged-gpu")
        env = kubelet_env(container)
        version, require = env.get("CUDA_VERSION"), env.get("NVIDIA_REQUIRE_CUDA")
        if (
            not _gets_a_gpu(container)
            and "NVIDIA_VISIBLE_DEVICES" not in env
            and (version is UNKNOWN or version)
            and (require is UNKNOWN or not require)
        ):
            reasons.append("raw-visible-devices")  # a legacy image: every GPU
        sources = container.get("envFrom")
        for source in sources if isinstance(sources, list) else []:
            prefix = source.get("prefix") if isinstance(source, Mapping) else None
            if (
                isinstance(prefix, str)
                and prefix
                and any(n.startswith(prefix) and n != prefix for n in GUARDED_ENV)
            ):
                reasons.append("raw-visible-devices")
        for mount in _mounts(container):
            if mount.get("readOnly") is not True:
                writable.add(mount.get("name"))
        for name in _resource_names(container):
            if (
                name.startswith("deviceclass.resource.kubernetes.io/")
                and name.split("/", 1)[1] in GPU_DEVICE_CLASSES
            ):
                reasons.append("gpu-claim")
    if gpu_names and spec.get("hostPID") is True:
        reasons.append("host-device-access")
    # A claim beside sharing resources blocks only when its device class is a GPU's,
    # which the pod spec does not say (the cluster view does; tests/core/test_threats.py F8).
    volumes = spec.get("volumes")
    for volume in volumes if isinstance(volumes, list) else []:
        host = volume.get("hostPath") if isinstance(volume, Mapping) else None
        path = host.get("path") if isinstance(host, Mapping) else None
        if not isinstance(path, str) or volume.get("name") not in writable:
            continue
        path = _normalise(path)
        if any(_under(path, d) or _under(d, path) for d in GPU_STACK_DIRS) or path.rsplit("/", 1)[
            -1
        ].startswith(GPU_STACK_FILES):
            reasons.append("host-device-access")
    return reasons


def writable_shared_mounts(pod: Mapping[str, Any]) -> list[str]:
    """Why the pod the kubelet will run (after the mutation) must be refused for a
    writable mount of a host volume every GPU pod of the node shares, or []."""
    spec = pod.get("spec")
    if not isinstance(spec, Mapping):
        return []
    volumes = spec.get("volumes")
    shared: set[str] = set()
    for volume in volumes if isinstance(volumes, list) else []:
        host = volume.get("hostPath") if isinstance(volume, Mapping) else None
        path = host.get("path") if isinstance(host, Mapping) else None
        name = volume.get("name") if isinstance(volume, Mapping) else None
        # By host path: the same file or directory of the node, whatever the volume's name.
        if (
            isinstance(path, str)
            and isinstance(name, str)
            and _normalise(path) in READ_ONLY_HOST_PATHS
        ):
            shared.add(name)
    return [
        "host-device-access"
        for container in _containers(spec)
        for mount in _mounts(container)
        if mount.get("name") in shared and mount.get("readOnly") is not True
    ]


def assert_no_bypass(kind: str, obj: Obj) -> None:
    pod = template_of(obj, kind)
    reasons = should_block(pod) if isinstance(pod, Mapping) else []
    entry = review_object(obj, DEFAULT_POLICY)
    if entry["allowed"]:
        final = template_of(entry["object"], kind)
        if isinstance(final, Mapping):
            reasons += writable_shared_mounts(final) + family_reasons(final)
    assert not (reasons and entry["allowed"]), (
        f"bypass: the oracle blocks for {reasons}, the engine admits"
    )


@PROPERTY_SETTINGS
@given(attacked_objects())
def test_no_bypass_in_attacked_pods(kind_obj: tuple[str, Obj]) -> None:
    assert_no_bypass(*kind_obj)


@PROPERTY_SETTINGS
@given(attacked_objects(["env"]))
def test_no_bypass_through_env(kind_obj: tuple[str, Obj]) -> None:
    assert_no_bypass(*kind_obj)


@PROPERTY_SETTINGS
@given(attacked_objects(["hostPath", "ephemeral"]))
def test_no_bypass_through_volumes_and_debug_containers(kind_obj: tuple[str, Obj]) -> None:
    assert_no_bypass(*kind_obj)


@PROPERTY_SETTINGS
@given(objects(hostile=True))
def test_no_bypass_in_hostile_pods(kind_obj: tuple[str, Obj]) -> None:
    assert_no_bypass(*kind_obj)


@PROPERTY_SETTINGS
@given(attacked_objects(["injected-mount", "device-request-mount", "sidecar"]))
def test_no_bypass_through_mounts_and_sidecars(kind_obj: tuple[str, Obj]) -> None:
    assert_no_bypass(*kind_obj)


# -- updates ---------------------------------------------------------------------------


def should_block_update(old: Mapping[str, Any], new: Mapping[str, Any], username: str) -> list[str]:
    """Why an UPDATE of ``old`` into ``new`` by ``username`` must be refused, or [].

    What the pod already had is not the update's doing; reserved annotations added,
    changed or removed by anyone but their writers are forged.
    """
    before = set(should_block(old)) | set(writable_shared_mounts(old))
    after = [*should_block(new), *writable_shared_mounts(new)]
    reasons = [r for r in after if r not in before and r != "forged-allocation"]

    def annotations(pod: Mapping[str, Any]) -> Mapping[str, Any]:
        metadata = pod.get("metadata")
        found = metadata.get("annotations") if isinstance(metadata, Mapping) else None
        return found if isinstance(found, Mapping) else {}

    old_annotations, new_annotations = annotations(old), annotations(new)
    touched = [
        key
        for key in {*old_annotations, *new_annotations}
        if reserved(key) and old_annotations.get(key) != new_annotations.get(key)
    ]
    if touched and username not in ALLOCATION_WRITERS:
        reasons.append("forged-allocation")
    return reasons


def stored(pod: Obj) -> Obj:
    """``pod`` as the apiserver holds it: mutated when admitted today, else as it was
    created under an older, looser policy."""
    entry = review_object(pod, DEFAULT_POLICY)
    result: Obj = entry["object"] if entry["allowed"] else pod
    return result


@PROPERTY_SETTINGS
@given(attacked_pods(), pod_updates(), st.sampled_from(sorted(IDENTITIES)))
def test_no_bypass_through_pod_updates(
    pod: Obj, edits: list[tuple[str, Any, Any]], identity: str
) -> None:
    old = stored(pod)
    new = apply_update(old, edits)
    username, groups = IDENTITIES[identity]
    reasons = should_block_update(old, new, username)
    wire = admission_review(new, operation="UPDATE", old=old, username=username, groups=groups)
    decision = answer(wire["apiVersion"], wire["request"], DEFAULT_POLICY, endpoint="validate")
    allowed = decision.decision.allowed
    assert not (reasons and allowed), f"bypass: the oracle blocks for {reasons}, the engine admits"


# -- quota -----------------------------------------------------------------------------

QUOTA_POLICY: Final = parse_policy(
    "apiVersion: gpushare.io/v1alpha1\nkind: GPUSharePolicy\nspec:\n"
    "  rules: {gpu-quota: deny}\n"
    "  limits:\n"
    "    perContainer: {gpus: 2, memoryMiB: 8000}\n"
    "    perPod: {gpus: 3, memoryMiB: 10000}\n"
)
COUNTS: Final = ("nvidia.com/gpu", "volcano.sh/vgpu-number")


def _asks(container: Mapping[str, Any]) -> tuple[int, int]:
    """(GPUs, MiB in all) a container asks for, as HAMi reads its limits."""
    resources = container.get("resources")
    limits = resources.get("limits") if isinstance(resources, Mapping) else None
    if not isinstance(limits, Mapping) or not set(limits) & GPU_RESOURCE_NAMES:
        return 0, 0
    # A slice without a count is one GPU (HAMi adds nvidia.com/gpu: 1).
    gpus = next((int(limits[c]) for c in COUNTS if c in limits), 1)
    mib = int(limits.get("nvidia.com/gpumem", 0))
    return gpus, mib * gpus


def quota_reasons(
    pod: Mapping[str, Any], per_container: tuple[int, int], per_pod: tuple[int, int]
) -> list[str]:
    """Over a maximum, with the pod's total as Kubernetes computes effective requests:
    max(sum(main) + sum(sidecars), max over plain init containers i of
    (init_i + sidecars declared before i)), each resource on its own."""
    spec = pod["spec"]
    reasons: list[str] = []
    every: Sequence[Mapping[str, Any]] = [*spec.get("initContainers", []), *spec["containers"]]
    for container in every:
        gpus, mib = _asks(container)
        if gpus > per_container[0] or mib > per_container[1]:
            reasons.append(f"container {container['name']}: {gpus} GPUs, {mib} MiB")
    totals = []
    for axis in (0, 1):
        running = sum(_asks(c)[axis] for c in spec["containers"])
        sidecars = 0
        peak = 0
        for init in spec.get("initContainers", []):
            need = _asks(init)[axis]
            if init.get("restartPolicy") == "Always":
                sidecars += need
            else:
                peak = max(peak, need + sidecars)
        totals.append(max(running + sidecars, peak))
    if totals[0] > per_pod[0] or totals[1] > per_pod[1]:
        reasons.append(f"pod: {totals[0]} GPUs, {totals[1]} MiB")
    return reasons


@PROPERTY_SETTINGS
@given(quota_pods())
def test_quota_agrees_with_effective_requests(pod: Obj) -> None:
    reasons = quota_reasons(pod, per_container=(2, 8000), per_pod=(3, 10000))
    entry = review_object(pod, QUOTA_POLICY)
    refused = {v["rule"] for v in entry["violations"] if v["action"] == "deny"}
    assert ("gpu-quota" in refused) == bool(reasons), (reasons, entry["violations"])


# -- the oracle itself -----------------------------------------------------------------


def _pod(container: Obj, **spec: Any) -> Obj:
    base: Obj = {"name": "main", "image": "cuda", "resources": {"limits": {"nvidia.com/gpu": 1}}}
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ml", "annotations": spec.pop("annotations", {})},
        "spec": {"containers": [{**base, **container}], **spec},
    }


def test_oracle_reads_env_as_the_kubelet_does() -> None:
    env = kubelet_env(
        {
            "env": [
                {"name": "A", "value": "disable"},
                {"name": "B", "value": "$(A)-$$(A)-$(C)"},
                {"name": "C", "valueFrom": {"fieldRef": {"fieldPath": "x"}}},
                {"name": "D", "value": "$(C)"},
                {"name": "A", "value": "force"},
            ]
        }
    )
    assert env["A"] == "force"
    assert env["B"] == "disable-$(A)-$(C)"
    assert env["C"] is UNKNOWN
    assert env["D"] is UNKNOWN


def test_oracle_admits_a_plain_vgpu_pod() -> None:
    assert should_block(_pod({"env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}]})) == []


# -- bypasses found while fuzzing, and their neighbours ---------------------------------

DISABLE_CONTROL_TWICE: Final = [
    {"name": "CUDA_DISABLE_CONTROL", "value": "true"},
    {"name": "CUDA_DISABLE_CONTROL", "value": "false"},
]
CORE_POLICY_BY_REFERENCE: Final = [
    {"name": "LOOSE", "value": "disable"},
    {"name": "GPU_CORE_UTILIZATION_POLICY", "value": "$(LOOSE)"},
]
REGRESSIONS: Final[dict[str, Obj]] = {
    # HAMi's device plugin skips the preload when any entry parses true; the kubelet
    # keeps only the last. Either reading switches limits off.
    "disable-control-duplicate": _pod({"env": DISABLE_CONTROL_TWICE}),
    # The kubelet expands $(LOOSE) to "disable" before HAMi-core reads it.
    "core-policy-by-reference": _pod({"env": CORE_POLICY_BY_REFERENCE}),
    "disable-control-by-reference": _pod(
        {
            "env": [
                {"name": "OFF", "value": "true"},
                {"name": "CUDA_DISABLE_CONTROL", "value": "$(OFF)"},
            ]
        }
    ),
    "visible-devices-last-wins-harmless": _pod(
        {
            "env": [
                {"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"},
                {"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"},
            ]
        }
    ),
    "visible-devices-by-reference": _pod(
        {
            "resources": {},
            "env": [
                {"name": "GPUS", "value": "all"},
                {"name": "NVIDIA_VISIBLE_DEVICES", "value": "$(GPUS)"},
            ],
        }
    ),
    "privileged-ephemeral": {
        **_pod({}),
        "spec": {
            "containers": [{"name": "main", "resources": {"limits": {"nvidia.com/gpumem": 3000}}}],
            "ephemeralContainers": [{"name": "dbg", "securityContext": {"privileged": True}}],
        },
    },
    "gpu-only-in-init-container": {
        **_pod({}),
        "spec": {
            "initContainers": [{"name": "w", "resources": {"limits": {"nvidia.com/gpu": 1}}}],
            "containers": [{"name": "main", "securityContext": {"privileged": True}}],
        },
    },
    "gpu-only-in-requests": _pod(
        {
            "resources": {"requests": {"nvidia.com/gpumem": 3000}},
            "securityContext": {"privileged": True},
        }
    ),
    "host-path-dotdot": _pod(
        {}, volumes=[{"name": "d", "hostPath": {"path": "/tmp/../dev/./nvidia0"}}]
    ),
    "host-path-double-slash": _pod({}, volumes=[{"name": "d", "hostPath": {"path": "//dev"}}]),
    "host-path-relative": _pod({}, volumes=[{"name": "d", "hostPath": {"path": "run/nvidia/"}}]),
    "host-path-root": _pod({}, volumes=[{"name": "d", "hostPath": {"path": "/"}}]),
    # Found by the fuzzer: "." normalised to "/." and passed.
    "host-path-dot": _pod({}, volumes=[{"name": "d", "hostPath": {"path": "."}}]),
    "host-path-proc-root": _pod(
        {}, volumes=[{"name": "d", "hostPath": {"path": "/proc/1/root/dev"}}]
    ),
    "host-path-char-device": _pod(
        {}, volumes=[{"name": "d", "hostPath": {"path": "/dev/char/195:0", "type": "CharDevice"}}]
    ),
    "lock-dir-parent": _pod({}, volumes=[{"name": "t", "hostPath": {"path": "/tmp"}}]),
    "cdi-annotation": _pod({}, annotations={"cdi.k8s.io/gpu": "nvidia.com/gpu=all"}),
    "mig-node-name": _pod(
        {"resources": {"limits": {"nvidia.com/mig-1g.5gb": 1}}},
        nodeName="gpu-node-3",
        annotations={"gpushare.io/mode": "mig"},
    ),
    # The hardening's families (issue 9): one shape each, as the fuzzer would find it.
    "kubelet-host-path": _pod(
        {}, volumes=[{"name": "k", "hostPath": {"path": "var/lib//kubelet/"}}]
    ),
    "proc-host-path": _pod({}, volumes=[{"name": "p", "hostPath": {"path": "/proc/./sys"}}]),
    "runtime-socket": _pod({}, volumes=[{"name": "s", "hostPath": {"path": "/run/./docker.sock"}}]),
    "var-lib": _pod({}, volumes=[{"name": "s", "hostPath": {"path": "/var/lib/"}}]),
    "device-request-mount": _pod(
        {
            "volumeMounts": [
                {"name": "v", "mountPath": "/var/run/x/../nvidia-container-devices/all"}
            ]
        },
        volumes=[{"name": "v", "emptyDir": {}}],
    ),
    "cuda-redirect-by-reference": _pod(
        {
            "env": [
                {"name": "LIB", "value": "/usr/lib/x86_64-linux-gnu/libcuda.so.1"},
                {"name": "CUDA_REDIRECT", "value": "$(LIB)"},
            ]
        }
    ),
    "oom-killer-off": _pod({"env": [{"name": "ACTIVE_OOM_KILLER", "value": "0"}]}),
    "glob-reserved-annotation": _pod({}, annotations={"hami.io/mig-devices-allocated": "x"}),
}


def test_oracle_sees_writable_mounts_of_shared_volumes_only() -> None:
    final = _pod(
        {
            "volumeMounts": [
                {
                    "name": "gpushare-vgpu-lib",
                    "mountPath": "/usr/local/vgpu/libvgpu.so",
                    "readOnly": True,
                },
                {"name": "gpushare-vgpu-lock", "mountPath": "/tmp/vgpulock"},
                {"name": "mine", "mountPath": "/hook"},
            ]
        },
        volumes=[
            {"name": "gpushare-vgpu-lib", "hostPath": {"path": "/usr/local/vgpu/libvgpu.so"}},
            {"name": "gpushare-vgpu-lock", "hostPath": {"path": "/tmp/vgpulock"}},
            {"name": "mine", "hostPath": {"path": "/usr/local/vgpu/libvgpu.so"}},
        ],
    )
    assert writable_shared_mounts(final) == ["host-device-access"]


def test_oracle_judges_updates_by_what_they_add() -> None:
    old = _pod({"securityContext": {"privileged": True}}, annotations={"hami.io/vgpu-node": "n1"})
    relabelled = {**old, "metadata": {**old["metadata"], "labels": {"team": "ml"}}}
    assert should_block_update(old, relabelled, "alice") == []
    moved = {**old, "metadata": {**old["metadata"], "annotations": {"hami.io/vgpu-node": "n2"}}}
    assert should_block_update(old, moved, "alice") == ["forged-allocation"]
    assert should_block_update(old, moved, "system:serviceaccount:kube-system:hami-scheduler") == []


def test_oracle_sums_sidecars_as_kubernetes_does() -> None:
    def ask(name: str, gpus: int, sidecar: bool = False) -> Obj:
        container: Obj = {"name": name, "resources": {"limits": {"nvidia.com/gpu": str(gpus)}}}
        if sidecar:
            container["restartPolicy"] = "Always"
        return container

    def total(init: list[Obj], main: list[Obj]) -> list[str]:
        return quota_reasons(
            {"spec": {"initContainers": init, "containers": main}}, (9, 99999), (2, 99999)
        )

    assert total([ask("s", 1, sidecar=True)], [ask("m", 2)]) != []
    assert total([ask("s", 1, sidecar=True), ask("i", 2)], [ask("m", 1)]) != []
    assert total([ask("i", 2), ask("s", 1, sidecar=True)], [ask("m", 1)]) == []


@pytest.mark.parametrize("name", sorted(REGRESSIONS))
def test_regression(name: str) -> None:
    pod = REGRESSIONS[name]
    reasons = should_block(pod)
    entry = review_object(pod, DEFAULT_POLICY)
    if name == "visible-devices-last-wins-harmless":
        # Every entry counts: runtimes differ on which duplicate wins.
        assert reasons == ["raw-visible-devices"]
    assert reasons, "the oracle must block this pod"
    assert not entry["allowed"], f"engine admits {name}"
    denied = {v["rule"] for v in entry["violations"] if v["action"] == "deny"}
    assert denied & set(reasons), (denied, reasons)
