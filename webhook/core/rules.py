"""The rules: pure checks of a pod view that return findings tagged with a fixed rule id."""

from __future__ import annotations

import posixpath
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from webhook.core.env import effective_env, env_value, opaque
from webhook.core.injection import MPS_LIMIT_VARS, VGPU_LIMIT_PREFIXES, Injection
from webhook.core.policy import Mode, Policy
from webhook.core.resources import CONTAINER_KINDS, ContainerRequest, Finding, PodRequests, describe
from webhook.core.workload import PodView, as_mapping

Phase = Literal["mutate", "validate"]

_HARMLESS_VISIBLE_DEVICES: Final = frozenset({"void", "none", ""})
_TRUTHY: Final = frozenset({"1", "true", "yes", "on", "y", "t"})
# A percent as ASCII digits: str.isdigit() takes "\u00b2", and int() then raises.
_PERCENT: Final = re.compile(r"[0-9]{1,9}")
# Mounting any of these from the host hands out GPUs behind the scheduler's back
# (/dev/char/<major>:<minor> are the same device nodes under their numbers).
_DEVICE_PREFIXES: Final = ("/dev/nvidia", "/run/nvidia", "/var/run/nvidia", "/dev/char")
# /proc/<pid>/root (and cwd, for the kubelet "/") is the host's root under another name.
_ROOT_ALIAS: Final = re.compile(r"/proc/[^/]+/(?:root|cwd)(?:/|$)")
# Mounting a parent directory exposes the device nodes as well.
_DEVICE_PARENTS: Final = frozenset({"/", "/dev", "/run", "/var/run", "/var"})


@dataclass(frozen=True, slots=True)
class Subject:
    """What the rules look at: the pod view, its requests and mode, and the request facts."""

    view: PodView
    requests: PodRequests
    mode: Mode
    operation: str
    phase: Phase
    # What the mutation injects for this pod (nothing unless it shares a GPU).
    injection: Injection

    @property
    def created(self) -> bool:
        """A new pod, or a template (whose pods will all be created)."""
        return self.view.template or self.operation == "CREATE"


def iter_containers(spec: Mapping[str, Any]) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """(label, container) for every container, init container and ephemeral container."""
    for kind in CONTAINER_KINDS:
        containers = spec.get(kind)
        if not isinstance(containers, list):
            continue
        for container in containers:
            if isinstance(container, (dict, Mapping)):
                name = container.get("name")
                yield describe(kind, name if isinstance(name, str) else ""), container


def privileged_gpu(subject: Subject) -> Iterator[Finding]:
    if not subject.requests.gpu:
        return
    for label, container in iter_containers(subject.view.spec):
        if as_mapping(container.get("securityContext")).get("privileged") is True:
            yield Finding(
                "privileged-gpu",
                f"{label}: privileged in a GPU pod sees every GPU; remove securityContext.privileged",
            )


def node_name_pinning(subject: Subject) -> Iterator[Finding]:
    if not subject.requests.gpu or not subject.created:
        return
    node = subject.view.spec.get("nodeName")
    if node:
        yield Finding(
            "node-name-pinning",
            f'spec.nodeName "{node}" skips GPU scheduling; use nodeSelector or affinity instead',
        )


def raw_visible_devices(subject: Subject) -> Iterator[Finding]:
    for label, container in iter_containers(subject.view.spec):
        env = container.get("env")
        if not isinstance(env, list):
            continue
        # Every entry counts, not only the last: runtimes differ on which duplicate wins.
        for item in env:
            if (
                not isinstance(item, (dict, Mapping))
                or item.get("name") != "NVIDIA_VISIBLE_DEVICES"
            ):
                continue
            value = env_value(item)
            if value is None:
                yield Finding(
                    "raw-visible-devices",
                    f"{label}: NVIDIA_VISIBLE_DEVICES from valueFrom; request GPUs in resources.limits",
                )
            elif value.strip().lower() not in _HARMLESS_VISIBLE_DEVICES:
                yield Finding(
                    "raw-visible-devices",
                    f'{label}: NVIDIA_VISIBLE_DEVICES="{value[:24]}"; remove it, request GPUs in limits',
                )


def _protected(path: str, policy: Policy) -> bool:
    # Rooted before normalising: "." or "dev/.." would otherwise become "/.", not "/".
    path = "/" + posixpath.normpath("/" + path).lstrip("/")
    if path in _DEVICE_PARENTS or path.startswith(_DEVICE_PREFIXES) or _ROOT_ALIAS.match(path):
        return True
    roots = (
        posixpath.dirname(policy.library_host_path),
        policy.lock_host_path.rstrip("/") or "/",
        policy.mps_pipe_directory.rstrip("/") or "/",
    )
    for root in roots:
        if path == root or path.startswith(root + "/") or root.startswith(path + "/"):
            return True
    return False


def host_device_access(subject: Subject, policy: Policy) -> Iterator[Finding]:
    spec = subject.view.spec
    volumes = spec.get("volumes")
    if isinstance(volumes, list):
        for volume in volumes:
            if not isinstance(volume, (dict, Mapping)):
                continue
            host = volume.get("hostPath")
            if not isinstance(host, (dict, Mapping)):
                continue
            path = host.get("path")
            if not isinstance(path, str) or not _protected(path, policy):
                continue
            if subject.injection.allows(volume):
                continue
            yield Finding(
                "host-device-access",
                f'volume "{volume.get("name")}": hostPath {path} exposes GPUs or their limits; request GPUs in limits',
            )
    annotations = as_mapping(as_mapping(subject.view.metadata).get("annotations"))
    for key, value in annotations.items():
        if isinstance(key, str) and key.startswith("cdi.k8s.io/") and "nvidia.com/" in str(value):
            yield Finding(
                "host-device-access",
                f"annotation {key} injects NVIDIA devices through CDI; request GPUs in limits",
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


def limit_tampering(subject: Subject, policy: Policy) -> Iterator[Finding]:
    if not subject.requests.gpu:
        return
    for label, container in iter_containers(subject.view.spec):
        # Every CUDA_DISABLE_CONTROL entry counts: HAMi's device plugin drops the preload
        # when any entry parses true, while the kubelet keeps the last one. A value with
        # $(VAR) references is only known once the kubelet expands it, like valueFrom.
        disabled = False
        policy_entry: Mapping[str, Any] | None = None  # the last one wins, as in the kubelet
        entries = container.get("env")
        for entry in entries if isinstance(entries, list) else ():
            if not isinstance(entry, (dict, Mapping)):
                continue
            name = entry.get("name")
            if name == "CUDA_DISABLE_CONTROL" and not disabled:
                value = env_value(entry)
                disabled = opaque(value) or str(value).strip().lower() in _TRUTHY
            elif name == "GPU_CORE_UTILIZATION_POLICY":
                policy_entry = entry
        if disabled:
            yield Finding(
                "limit-tampering",
                f"{label}: CUDA_DISABLE_CONTROL switches GPU limits off; remove it",
            )
        if policy_entry is not None and not policy.allow_disable_core_utilization_policy:
            value = env_value(policy_entry)
            if opaque(value) or str(value).strip().lower() == "disable":
                yield Finding(
                    "limit-tampering",
                    f'{label}: GPU_CORE_UTILIZATION_POLICY="{value}" loosens limits; use default or force',
                )
    if subject.phase != "validate" or not subject.created:
        return
    # What the mutation would overwrite is a warning at /mutate; reaching validation
    # with limits above the request means something else set them.
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


def invalid_gpu_request(subject: Subject) -> Iterator[Finding]:
    for request in subject.requests.containers:
        yield from request.problems


def gpu_quota(subject: Subject, policy: Policy) -> Iterator[Finding]:
    if not subject.requests.containers:
        return
    per_container = policy.container_maxima
    per_pod = policy.pod_maxima
    total_gpus = total_memory = 0
    init_peak = [0, 0]
    for request in subject.requests.containers:
        if not request.shares:
            continue
        memory = (request.memory_mib or 0) * request.gpus
        if per_container.gpus is not None and request.gpus > per_container.gpus:
            yield Finding(
                "gpu-quota", f"{request.label}: {request.gpus} GPUs, at most {per_container.gpus}"
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
        if request.kind == "initContainers":
            # Init containers run one at a time: the pod needs their peak, not their sum.
            init_peak = [max(init_peak[0], request.gpus), max(init_peak[1], memory)]
        elif request.kind == "containers":
            total_gpus += request.gpus
            total_memory += memory
    gpus = max(total_gpus, init_peak[0])
    memory = max(total_memory, init_peak[1])
    if per_pod.gpus is not None and gpus > per_pod.gpus:
        yield Finding("gpu-quota", f"pod: {gpus} GPUs in all, at most {per_pod.gpus}")
    if per_pod.memory_mib is not None and memory > per_pod.memory_mib:
        yield Finding(
            "gpu-quota", f"pod: {memory} MiB of GPU memory in all, at most {per_pod.memory_mib}"
        )


def scheduler_bypass(subject: Subject, policy: Policy) -> Iterator[Finding]:
    if subject.mode not in ("vgpu", "mps") or not subject.requests.sharing or not subject.created:
        return
    scheduler = subject.view.spec.get("schedulerName")
    if scheduler in (None, "", "default-scheduler", policy.scheduler_name):
        return
    if isinstance(scheduler, str) and scheduler in policy.allowed_schedulers:
        return
    yield Finding(
        "scheduler-bypass",
        f'schedulerName "{scheduler}" skips GPU accounting; remove it (we set {policy.scheduler_name})',
    )


def forged_allocation(subject: Subject, policy: Policy) -> Iterator[Finding]:
    if not subject.created:
        return
    annotations = as_mapping(as_mapping(subject.view.metadata).get("annotations"))
    for key in annotations:
        if isinstance(key, str) and policy.is_reserved_annotation(key):
            yield Finding(
                "forged-allocation",
                f"annotation {key} is written by the GPU scheduler only; remove it",
            )


def evaluate(subject: Subject, policy: Policy) -> list[Finding]:
    """Every finding of every rule that applies to ``subject`` (actions are applied later)."""
    findings: list[Finding] = []
    # Rules about GPU requests find nothing in a pod without any (each checks that
    # itself too); skipping them keeps the common case cheap.
    gpu = subject.requests.gpu
    if gpu:
        findings.extend(privileged_gpu(subject))
        findings.extend(node_name_pinning(subject))
    findings.extend(raw_visible_devices(subject))
    findings.extend(host_device_access(subject, policy))
    if gpu:
        findings.extend(limit_tampering(subject, policy))
    if subject.created:
        if gpu:
            findings.extend(invalid_gpu_request(subject))
            findings.extend(gpu_quota(subject, policy))
            findings.extend(scheduler_bypass(subject, policy))
        findings.extend(forged_allocation(subject, policy))
    return findings
