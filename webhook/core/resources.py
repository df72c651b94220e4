"""GPU requests of a pod spec: which containers ask for what, parsed and unit-checked.

Quantities are parsed by the Kubernetes quantity grammar (:mod:`webhook.core.quantity`); on top of it the
unit contract of each resource is enforced (MiB and GiB are plain integers, percents
are 1..100), because ``gpumem: 3Gi`` parses fine and means something absurd.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from webhook.core import quantity
from webhook.core.env import ContainerClass
from webhook.core.finding import Finding, quoted
from webhook.core.policy import Policy
from webhook.core.workload import MAPPINGS, as_mapping

ContainerKind = Literal["containers", "initContainers", "ephemeralContainers"]
CONTAINER_KINDS: Final[tuple[ContainerKind, ...]] = (
    "containers",
    "initContainers",
    "ephemeralContainers",
)
KIND_LABELS: Final = {
    "containers": "container",
    "initContainers": "init container",
    "ephemeralContainers": "ephemeral container",
}

MAX_MIB: Final = 1 << 19  # 512 GiB, above any card made: anything more is bytes or a unit slip
MAX_GIB: Final = 1 << 10
MAX_COUNT: Final = 64
# A GiB resource above MAX_GIB (and up to MAX_MIB) is read as MiB: ACK's gpushare counts
# aliyun.com/gpu-mem in MiB where its device plugin reports MiB
# (AliyunContainerService/gpushare-scheduler-extender docs/designs/designs.md: "16GiB
# memory, its corresponding resource is 16276MiB"), and no card holds 1025 GiB.
_RANGES: Final[dict[str, tuple[int, int]]] = {
    "count": (1, MAX_COUNT),
    "MiB": (1, MAX_MIB),
    "GiB": (1, MAX_MIB),
    "percent": (1, 100),
}
_RANGE_TEXT: Final = {"GiB": f"1..{MAX_GIB} GiB, or {MAX_GIB + 1}..{MAX_MIB} read as MiB"}
# ASCII digits only: str.isdigit() takes "\u00b2" and int() then raises.
_PRIORITY: Final = re.compile(r"-?[0-9]{1,9}")
# The task priorities HAMi documents (0 high, 1 low: Project-HAMi/HAMi CHANGELOG.md:57 @
# 4707fb02). Its vGPU monitor grows a table to the priority of each region and skips a
# negative one (cmd/vGPUmonitor/feedback.go:90-97): 999999999 costs it gigabytes, -1
# escapes its blocking.
PRIORITIES: Final = (0, 1)


def describe(kind: ContainerKind, name: str) -> str:
    return f'{KIND_LABELS[kind]} "{name}"'


@dataclass(slots=True)
class ContainerRequest:
    kind: ContainerKind
    index: int
    name: str
    gpus: int = 0
    # An init container with restartPolicy Always runs beside the main containers.
    sidecar: bool = False
    memory_mib: int | None = None
    memory_percentage: int | None = None
    cores: int | None = None
    priority: int | None = None
    mig: dict[str, int] = field(default_factory=dict)
    # Resource name to add to limits when only memory/cores were given (HAMi does too).
    implied_count_resource: str | None = None
    sharing_resources: list[str] = field(default_factory=list)
    problems: list[Finding] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def label(self) -> str:
        return describe(self.kind, self.name)

    @property
    def shares(self) -> bool:
        """Asks for a slice (or a whole vGPU) rather than a MIG instance."""
        return bool(self.sharing_resources)


@dataclass(slots=True)
class PodRequests:
    containers: list[ContainerRequest]

    @property
    def gpu(self) -> bool:
        return bool(self.containers)

    # Loops rather than any() over a generator (SIM110): a generator costs more than
    # the check, and this is asked several times per decision.
    @property
    def sharing(self) -> bool:
        for container in self.containers:  # noqa: SIM110
            if container.sharing_resources:
                return True
        return False

    @property
    def mig(self) -> bool:
        for container in self.containers:  # noqa: SIM110
            if container.mig:
                return True
        return False


def _integer(
    raw: Any,
    *,
    resource: str,
    request: ContainerRequest,
    unit: Literal["count", "MiB", "GiB", "percent"],
) -> tuple[int | None, Finding | None]:
    """Parse one quantity of ``request`` to an int under the unit contract of ``resource``."""
    # Fast path for what nearly every request holds: a plain integer within range.
    if type(raw) is int or (type(raw) is str and len(raw) < 10 and raw.isdigit() and raw.isascii()):
        low, high = _RANGES[unit]
        number = int(raw)
        if low <= number <= high:
            return number, None
    label = request.label
    text = str(raw).strip() if isinstance(raw, int | float | str) else None
    parsed = quantity.parse(text) if text is not None and not isinstance(raw, bool) else None
    if text is None or parsed is None:
        return None, Finding(
            "invalid-gpu-request",
            f"{label}: {resource} {quoted(raw)} is not a quantity; write a plain integer",
        )
    value = parsed.value
    # The apiserver stores quantities canonically: a plain 3000 arrives as "3k", so
    # decimal suffixes are numbers like any other. Binary suffixes are always a unit
    # mistake: nobody means 3 GiB of MiB.
    if parsed.binary:
        if unit in ("MiB", "GiB"):
            scale = 1 << 20 if unit == "MiB" else 1 << 30
            # Bounded: int() of a huge Decimal takes seconds (a request must not).
            hint = f'; write "{int(value / scale)}"' if scale <= value < scale << 40 else ""
            return None, Finding(
                "invalid-gpu-request",
                f"{label}: {resource} {quoted(text)} must be {unit} as a plain integer{hint}",
            )
        return None, Finding(
            "invalid-gpu-request",
            f"{label}: {resource} {quoted(text)} must be a plain integer ({unit}), without a suffix",
        )
    if value != value.to_integral_value():
        return None, Finding(
            "invalid-gpu-request", f"{label}: {resource} {quoted(text)} must be a whole number"
        )
    low, high = _RANGES[unit]
    # Compare as Decimal first: int("1e999999") would build a million-digit integer.
    if not low <= value <= high:
        hint = ""
        if unit == "MiB" and value > high:
            hint = " (bytes written as MiB?)"
            if value < (high + 1) << 20:
                hint = f'; bytes? write "{int(value) >> 20}"'
        allowed = _RANGE_TEXT.get(unit, f"{low}..{high} {unit}")
        return None, Finding(
            "invalid-gpu-request", f"{label}: {resource} {quoted(text)} must be {allowed}{hint}"
        )
    return int(value), None


def _same_quantity(a: Any, b: Any) -> bool:
    """Equal as quantities ("3k" is 3000), or as text when either does not parse."""
    if str(a) == str(b):
        return True
    first, second = quantity.parse(str(a).strip()), quantity.parse(str(b).strip())
    return first is not None and second is not None and first.value == second.value


def _raw_value(
    resource: str,
    limits: Mapping[str, Any],
    requests: Mapping[str, Any],
    request: ContainerRequest,
) -> Any:
    """The value of ``resource`` (its limit), with findings when requests and limits disagree."""
    if resource not in limits:
        request.problems.append(
            Finding(
                "invalid-gpu-request",
                f"{request.label}: {resource} is in requests but not limits; set it in limits",
            )
        )
        return requests[resource]
    raw = limits[resource]
    if resource in requests and not _same_quantity(requests[resource], raw):
        request.problems.append(
            Finding(
                "invalid-gpu-request",
                f"{request.label}: {resource} request {quoted(requests[resource])} differs from "
                f"limit {quoted(raw)}; make them equal",
            )
        )
    return raw


def _read_sharing(resource: str, raw: Any, request: ContainerRequest, policy: Policy) -> None:
    """One slice resource (count, memory, percentage, cores, priority) into ``request``."""
    problem: Finding | None
    if resource in policy.count_resources:
        count, problem = _integer(raw, resource=resource, request=request, unit="count")
        request.gpus = count or 1
    elif resource in policy.memory_mib_resources:
        value, problem = _integer(raw, resource=resource, request=request, unit="MiB")
        if value is not None:
            request.memory_mib = value
    elif resource in policy.memory_gib_resources:
        value, problem = _integer(raw, resource=resource, request=request, unit="GiB")
        if value is not None and value > MAX_GIB:
            request.memory_mib = value
            # Short: a warning is cut at 120 characters.
            request.notes.append(
                f"{request.label}: {resource} {value} read as MiB; to declare MiB, move it "
                "from resources.memoryGiB to memoryMiB"
            )
        elif value is not None:
            request.memory_mib = value * 1024
    elif resource in policy.memory_percentage_resources:
        request.memory_percentage, problem = _integer(
            raw, resource=resource, request=request, unit="percent"
        )
    elif resource in policy.cores_resources:
        request.cores, problem = _integer(raw, resource=resource, request=request, unit="percent")
    else:  # priority
        text = str(raw).strip()
        problem = None
        if _PRIORITY.fullmatch(text) and int(text) in PRIORITIES:
            request.priority = int(text)
        else:
            problem = Finding(
                "invalid-gpu-request",
                f"{request.label}: {resource} {quoted(raw)} must be 0 (high) or 1 (low)",
            )
    if problem:
        request.problems.append(problem)


def is_zero(raw: Any) -> bool:
    """``raw`` is a quantity the apiserver reads as zero: ``0``, ``"0"``, ``"00"``,
    ``"0m"``, ``"0Gi"``, ``"-0"``, ``"0e3"`` (resource.Quantity's grammar; it stores each
    as ``0``). A bool is none, and text is taken as written, as the apiserver takes it."""
    if type(raw) is int:
        return raw == 0
    if not isinstance(raw, float | str) or isinstance(raw, bool):
        return False
    parsed = quantity.parse(str(raw))
    return parsed is not None and parsed.value == 0


def vacant(container: Mapping[str, Any], policy: Policy) -> bool:
    """The container names GPU resources of the policy, and every one of them is zero in
    limits and requests alike (``nvidia.com/gpu: 0``, as Volcano's MPI examples write for
    their launchers): it asks for no GPU, and is a container without one everywhere. One
    of them is a count or a MIG instance: memory or cores alone imply a count of one
    (HAMi's webhook adds its DefaultGPUNum where the count is absent, Project-HAMi/HAMi
    pkg/device/nvidia/device.go MutateAdmission @ 4707fb02), so zero memory alone is read
    as written and refused. A priority resource is no amount (0 is HAMi's high priority):
    beside one, a zero count is read as written, and refused as a count below 1."""
    resources = as_mapping(container.get("resources"))
    gpu, mig = policy.gpu_resources, policy.mig_prefixes
    counted = False
    for part in ("limits", "requests"):
        amounts = as_mapping(resources.get(part))
        for name in amounts:
            if not isinstance(name, str) or not (name in gpu or name.startswith(mig)):
                continue
            if name in policy.priority_resources or not is_zero(amounts[name]):
                return False
            counted = counted or name in policy.count_resources or name.startswith(mig)
    return counted


def read_container(
    container: Mapping[str, Any], *, kind: ContainerKind, index: int, policy: Policy
) -> ContainerRequest | None:
    """The GPU request of one container, or None when it asks for no GPU resource (or
    only for zero of each: :func:`vacant`)."""
    resources = as_mapping(container.get("resources"))
    limits = as_mapping(resources.get("limits"))
    requests = as_mapping(resources.get("requests"))
    # Policy.is_gpu_resource inlined: this runs on every resource of every container.
    gpu, mig = policy.gpu_resources, policy.mig_prefixes
    names = [n for n in limits if isinstance(n, str) and (n in gpu or n.startswith(mig))]
    names += [
        n
        for n in requests
        if isinstance(n, str) and (n in gpu or n.startswith(mig)) and n not in limits
    ]
    if not names or vacant(container, policy):
        return None
    name = container.get("name")
    request = ContainerRequest(
        kind=kind,
        index=index,
        name=name if isinstance(name, str) else "",
        sidecar=kind == "initContainers" and container.get("restartPolicy") == "Always",
    )
    for resource in names:
        raw = _raw_value(resource, limits, requests, request)
        if resource.startswith(mig):
            count, problem = _integer(raw, resource=resource, request=request, unit="count")
            if problem:
                request.problems.append(problem)
            request.mig[resource] = count or 1
        else:
            request.sharing_resources.append(resource)
            _read_sharing(resource, raw, request, policy)
    memory_names = [n for n in request.sharing_resources if n in policy.memory_resources]
    if len(memory_names) > 1:
        request.problems.append(
            Finding(
                "invalid-gpu-request",
                f"{request.label}: asks for memory twice ({', '.join(sorted(memory_names))}); "
                "keep one",
            )
        )
    if request.memory_mib is not None and request.memory_percentage is not None:
        request.memory_percentage = None
        request.notes.append(f"{request.label}: memory in MiB and percent both set; MiB wins")
    if request.sharing_resources and request.gpus == 0:
        request.gpus = 1
        request.implied_count_resource = _implied_count_resource(request.sharing_resources, policy)
    return request


def _implied_count_resource(names: list[str], policy: Policy) -> str | None:
    """The count resource the first of the slice resources implies (``Policy.implied_counts``)."""
    for resource in names:
        count = policy.implied_counts.get(resource)
        if count is not None:
            return count
    return None


def read_pod(spec: Mapping[str, Any], policy: Policy) -> PodRequests:
    """GPU requests of every container, init container and ephemeral container of a pod spec."""
    found: list[ContainerRequest] = []
    for kind in CONTAINER_KINDS:
        containers = spec.get(kind)
        if not isinstance(containers, list):
            continue
        for index, container in enumerate(containers):
            if not isinstance(container, MAPPINGS):
                continue
            request = read_container(container, kind=kind, index=index, policy=policy)
            if request is not None:
                found.append(request)
    return PodRequests(containers=found)


def claims(container: Mapping[str, Any]) -> bool:
    """The container takes a Dynamic Resource Allocation claim (``resources.claims``)."""
    taken = as_mapping(container.get("resources")).get("claims")
    return isinstance(taken, list) and bool(taken)


def asks_for_gpu(container: Mapping[str, Any], policy: Policy) -> bool:
    """The container may get a GPU some way: a resource of the policy, one whose name says
    GPU under any vendor (``nvidia.com/gpu.shared``, ``amd.com/gpu``, ``gpu.intel.com/i915``),
    a MIG instance, or a DRA claim. What asks for none gets ``NVIDIA_VISIBLE_DEVICES=void``:
    voiding a container that gets a GPU another way would break it. The policy's GPU
    resources of a :func:`vacant` container ask for none."""
    resources = as_mapping(container.get("resources"))
    taken = resources.get("claims")
    if isinstance(taken, list) and taken:
        return True
    gpu, mig = policy.gpu_resources, policy.mig_prefixes
    empty = vacant(container, policy)
    for part in ("limits", "requests"):
        for name in as_mapping(resources.get(part)):
            if not isinstance(name, str):
                continue
            if name in gpu or name.startswith(mig):
                if not empty:
                    return True
            elif "gpu" in name.lower():
                return True
    return False


def container_class(container: Mapping[str, Any], policy: Policy) -> ContainerClass:
    """What a container is to the env allowlist: it asks only for whole GPUs (the policy's
    wholeGpus.resources, beside a priority; or a GPU another way: a claim, another
    vendor's resource), for part of one (memory, cores, a MIG instance, a vGPU count:
    a slice), or for none."""
    if vacant(container, policy):
        return "whole" if asks_for_gpu(container, policy) else "none"
    resources = as_mapping(container.get("resources"))
    asked: set[str] = set()
    for part in ("limits", "requests"):
        for name in as_mapping(resources.get(part)):
            if isinstance(name, str) and policy.is_gpu_resource(name):
                asked.add(name)
    asked -= policy.priority_resources
    if asked:
        return "whole" if asked <= policy.whole_gpu_resources else "slice"
    return "whole" if asks_for_gpu(container, policy) else "none"
