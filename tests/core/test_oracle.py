"""A bypass oracle: whatever DESIGN's rule table says must be refused, the engine refuses.

``should_block`` is written from DESIGN and from how the consumers of a pod spec read it
(the kubelet, the NVIDIA container runtime, HAMi's device plugin), without importing the
rules it checks. The engine may refuse more than the oracle; a pod the oracle blocks and
the engine admits is a bypass.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Any, Final

import pytest
from hypothesis import given

from tests.core.strategies import PROPERTY_SETTINGS, Obj, attacked_objects, objects, template_of
from webhook.core.review import review_object
from webhook.policies import DEFAULT_POLICY

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
    }
)
# Go's strconv.ParseBool, which HAMi's device plugin applies to CUDA_DISABLE_CONTROL.
PARSE_BOOL_TRUE: Final = frozenset({"1", "t", "T", "TRUE", "true", "True"})
# HAMi-core compares GPU_CORE_UTILIZATION_POLICY with exactly these two spellings.
CORE_POLICY_DISABLE: Final = frozenset({"disable", "DISABLE"})
# The NVIDIA runtime selects no device for these; other spellings are device lists (or
# errors: "NONE" names no device, so it exposes none either).
NO_DEVICES: Final = frozenset({"", "none", "void"})
# NVIDIA device nodes and runtime state, and /dev/char/<major>:<minor>: the same nodes
# by number.
DEVICE_DIRS: Final = ("/dev/nvidia", "/run/nvidia", "/var/run/nvidia", "/dev/char/")
# Directories the mutation itself mounts from the host (libvgpu, its lock, the MPS pipe).
SHARING_DIRS: Final = ("/usr/local/vgpu", "/tmp/vgpulock", "/tmp/nvidia-mps")
INJECTED_VOLUME_NAMES: Final = frozenset(
    {
        "gpushare-vgpu-lib",
        "gpushare-vgpu-lock",
        "gpushare-vgpu-cache",
        "gpushare-vgpu-preload",
        "gpushare-mps-pipe",
    }
)
SCHEDULER_OWNED_ANNOTATIONS: Final = frozenset(
    {
        "hami.io/vgpu-devices-to-allocate",
        "hami.io/vgpu-devices-allocated",
        "hami.io/vgpu-node",
        "hami.io/bind-phase",
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


def _gpu_names(spec: Mapping[str, Any]) -> set[str]:
    names = set().union(*(_resource_names(c) for c in _containers(spec)))
    return {n for n in names if n in GPU_RESOURCE_NAMES or n.startswith("nvidia.com/mig-")}


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
    # /proc/<pid>/root is the host's root filesystem under another name.
    parts = path.split("/")
    if len(parts) >= 4 and parts[1] == "proc" and parts[3] in ("root", "cwd"):
        return True
    # A parent directory of the device nodes exposes them too.
    if any(_under(d, path) for d in ("/dev/nvidia0", "/run/nvidia", "/var/run/nvidia")):
        return True
    if volume_name in INJECTED_VOLUME_NAMES:
        return False  # the mutation's own volumes: it replaces them with its exact shape
    return any(_under(path, d) or _under(d, path) for d in SHARING_DIRS)


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
        if key in SCHEDULER_OWNED_ANNOTATIONS:
            reasons.append("forged-allocation")
    scheduler = spec.get("schedulerName")
    if sharing and scheduler not in (None, "", "default-scheduler", "hami-scheduler"):
        reasons.append("scheduler-bypass")
    return reasons


def assert_no_bypass(kind: str, obj: Obj) -> None:
    pod = template_of(obj, kind)
    reasons = should_block(pod) if isinstance(pod, Mapping) else []
    if not reasons:
        return
    entry = review_object(obj, DEFAULT_POLICY)
    assert not entry["allowed"], f"bypass: the oracle blocks for {reasons}, the engine admits"


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
}


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
