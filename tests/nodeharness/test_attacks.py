"""The rows of docs/threat-model.md that say a node component honours an input, on a
real node: with the guarding rule at ``audit`` the attack pod is admitted and the node
shows what the row says (an extra device, env or file) where the row says the input is
honoured, and nothing extra where it is not; with the rule at ``deny`` it is refused."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.nodeharness.conftest import on
from tests.nodeharness.pods import ALL_CARDS, NodeHarness, Report, cards, container, gpu_limits, pod
from webhook.dev.node import GPU_UUIDS, LOCK_DIR


@dataclass(frozen=True)
class Attack:
    name: str
    rule: str
    manifest: Callable[[str], dict[str, Any]]
    # The node profiles that honour the input (docs/threat-model.md, the row's last columns).
    honoured_on: frozenset[str]
    # What the container shows when the input is honoured.
    shows: Callable[[Report], bool]
    container: str = "main"
    # Host files the attack makes where it is honoured (removed after).
    leaves: tuple[Path, ...] = ()


def _env_visible_devices(name: str) -> dict[str, Any]:
    env = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    return pod(name, container("main", env=env))


def _privileged(name: str) -> dict[str, Any]:
    main = container("main", resources=gpu_limits(), securityContext={"privileged": True})
    return pod(name, main)


def _device_mount(name: str) -> dict[str, Any]:
    # The toolkit's volume-mount device request (cuda_image.go requestsFromMounts):
    # /dev/null at /var/run/nvidia-container-devices/<id>.
    mount = {"name": "request", "mountPath": f"/var/run/nvidia-container-devices/{GPU_UUIDS[3]}"}
    volume = {"name": "request", "hostPath": {"path": "/dev/null"}}
    return pod(name, container("main", volumeMounts=[mount]), volumes=[volume])


def _cdi_annotation(name: str) -> dict[str, Any]:
    return pod(name, container("main"), annotations={"cdi.k8s.io/gpushare": "nvidia.com/gpu=all"})


def _disable_control(name: str) -> dict[str, Any]:
    env = [{"name": "CUDA_DISABLE_CONTROL", "value": "true"}]
    return pod(name, container("main", resources=gpu_limits(), env=env))


def _file_over(name: str, path: str, *, gpu: bool = True) -> dict[str, Any]:
    # A file any tenant can write: the downward API's pod name, mounted by subPath.
    volume = {
        "name": "file",
        "downwardAPI": {"items": [{"path": "name", "fieldRef": {"fieldPath": "metadata.name"}}]},
    }
    mount = {"name": "file", "mountPath": path, "subPath": "name"}
    resources = gpu_limits() if gpu else {}
    return pod(name, container("main", resources=resources, volumeMounts=[mount]), volumes=[volume])


def _vgpu_directory(name: str) -> dict[str, Any]:
    mount = {"name": "scratch", "mountPath": "/usr/local/vgpu"}
    main = container("main", args=["region", "sleep"], resources=gpu_limits(), volumeMounts=[mount])
    return pod(name, main, volumes=[{"name": "scratch", "emptyDir": {}}])


def _null_at(name: str, path: str, *, gpu: bool) -> dict[str, Any]:
    mount = {"name": "request", "mountPath": path}
    volume = {"name": "request", "hostPath": {"path": "/dev/null"}}
    resources = gpu_limits() if gpu else {}
    return pod(name, container("main", resources=resources, volumeMounts=[mount]), volumes=[volume])


def _annotated(key: str) -> Callable[[str], dict[str, Any]]:
    return lambda name: pod(name, container("main"), annotations={key: "all"})


def _region_in_lock_dir(name: str) -> dict[str, Any]:
    env = [{"name": "CUDA_DEVICE_MEMORY_SHARED_CACHE", "value": f"/tmp/vgpulock/{name}.cache"}]
    main = container("main", args=["region", "sleep"], resources=gpu_limits(), env=env)
    return pod(name, main)


ATTACKS = (
    # 2.1 NVIDIA_VISIBLE_DEVICES in a pod's env: every card, unless node setting 1.
    Attack(
        "env-visible-devices",
        "raw-visible-devices",
        _env_visible_devices,
        frozenset({"default"}),
        lambda r: cards(r) == list(ALL_CARDS),
    ),
    # 2.1 CAP_SYS_ADMIN: a privileged container gets every host device, whatever the
    # toolkit's settings.
    Attack(
        "privileged",
        "privileged-gpu",
        _privileged,
        frozenset({"default", "hardened"}),
        lambda r: cards(r) == list(ALL_CARDS),
    ),
    # 2.1 a device-request mount: honoured only with node setting 2.
    Attack(
        "device-request-mount",
        "host-device-access",
        _device_mount,
        frozenset({"hardened"}),
        lambda r: cards(r) == ["/dev/nvidia3"],
    ),
    # 2.1 a CDI annotation on the pod: containerd passes no pod annotation to the
    # container's OCI spec unless its runtime lists it in pod_annotations (node
    # setting 3): honoured on neither profile here.
    Attack(
        "cdi-annotation",
        "host-device-access",
        _cdi_annotation,
        frozenset(),
        lambda r: bool(cards(r)),
    ),
    # 2.2 CUDA_DISABLE_CONTROL=true in the pod spec: HAMi's device plugin leaves out
    # /etc/ld.so.preload (server.go:866-884).
    Attack(
        "disable-control",
        "limit-tampering",
        _disable_control,
        frozenset({"default", "hardened"}),
        lambda r: r["preload"] is None,
    ),
    # 2.11 a pod file at /etc/ld.so.preload: the kubelet puts it after HAMi's, containerd
    # keeps that order at equal depth, so the pod's file is what the loader reads.
    Attack(
        "preload-shadow",
        "host-device-access",
        lambda name: _file_over(name, "/etc/ld.so.preload"),
        frozenset({"default", "hardened"}),
        lambda r: r["preload"] == "preload-shadow",
    ),
    # 2.11 HAMi-core's /overrideEnv: the pod's file is in the container (the harness's
    # libvgpu.so is a stand-in that reads nothing). In a container that asks for no GPU
    # it is refused; in a vGPU slice the mutation's pin replaces it
    # (test_a_tenants_override_file_in_a_slice_is_replaced_by_the_pin).
    Attack(
        "override-env",
        "host-device-access",
        lambda name: _file_over(name, "/overrideEnv", gpu=False),
        frozenset({"default", "hardened"}),
        lambda r: "/overrideEnv" in r["mounts"],
    ),
    # 2.11 a pod directory at /usr/local/vgpu lands on HAMi's per-container directory
    # (both mounted, the pod's on top): the region is created in it, not where HAMi's
    # monitor reads (tests/nodeharness/test_channels.py looks on the host).
    Attack(
        "vgpu-directory",
        "host-device-access",
        _vgpu_directory,
        frozenset({"default", "hardened"}),
        lambda r: r["mounts"].count("/usr/local/vgpu") == 2,
    ),
    # 2.11 the toolkit's device-request root matched as a string prefix
    # (cuda_image.go:361-386): "...devicesall" is the device "all", with node setting 2.
    Attack(
        "device-request-prefix",
        "host-device-access",
        lambda name: _null_at(name, "/var/run/nvidia-container-devicesall", gpu=False),
        frozenset({"hardened"}),
        lambda r: cards(r) == list(ALL_CARDS),
    ),
    # 2.11 a CDI name as a device-request mount (cuda_image.go:343-350).
    Attack(
        "device-request-cdi",
        "host-device-access",
        lambda name: _null_at(
            name, "/var/run/nvidia-container-devices/cdi/nvidia.com/gpu=all", gpu=False
        ),
        frozenset({"hardened"}),
        lambda r: cards(r) == list(ALL_CARDS),
    ),
    # 2.11 the same beside a vGPU container's own device-request mount: the slice gets
    # every card.
    Attack(
        "vgpu-device-request",
        "host-device-access",
        lambda name: _null_at(name, "/var/run/nvidia-container-devicesall", gpu=True),
        frozenset({"hardened"}),
        lambda r: cards(r) == list(ALL_CARDS),
    ),
    # 2.11 the same spelled with "..": the toolkit cleans the destination
    # (cuda_image.go:372), runc resolves it; CEL cannot (threat model section 4, item 7).
    Attack(
        "device-request-dotdot",
        "host-device-access",
        lambda name: _null_at(name, "/var/run/nvidia-container-devices/x/../all", gpu=False),
        frozenset({"hardened"}),
        lambda r: cards(r) == list(ALL_CARDS),
    ),
    Attack(
        "preload-dotdot",
        "host-device-access",
        lambda name: _file_over(name, "/tmp/../etc/ld.so.preload"),
        frozenset({"default", "hardened"}),
        lambda r: r["preload"] == "preload-dotdot",
    ),
    # 2.12 a bare device name (the runtime's default kind makes it nvidia.com/gpu=all)
    # and the GPU Operator's prefix: containerd copies neither without pod_annotations.
    Attack(
        "cdi-bare-name",
        "host-device-access",
        _annotated("cdi.k8s.io/gpushare"),
        frozenset(),
        lambda r: bool(cards(r)),
    ),
    Attack(
        "cdi-operator-prefix",
        "host-device-access",
        _annotated("nvidia.cdi.k8s.io/gpushare"),
        frozenset(),
        lambda r: bool(cards(r)),
    ),
    # 2.10 the region on the lock directory, a host directory every vGPU pod of the node
    # mounts read-write: the pod's value beats HAMi's, and the file is created there.
    Attack(
        "region-in-lock-dir",
        "limit-tampering",
        _region_in_lock_dir,
        frozenset({"default", "hardened"}),
        lambda r: r.get("region") == "/tmp/vgpulock/region-in-lock-dir.cache",
        leaves=(LOCK_DIR / "region-in-lock-dir.cache",),
    ),
)


@pytest.mark.parametrize("attack", ATTACKS, ids=lambda a: a.name)
@on("default-audit", "hardened-audit")
def test_attack_is_real_where_the_row_says(node: NodeHarness, attack: Attack) -> None:
    namespace = node.namespace(attack.name)
    try:
        report = node.run(namespace, attack.manifest(attack.name), attack.container)
    finally:
        for path in attack.leaves:
            path.unlink(missing_ok=True)
    honoured = node.profile in attack.honoured_on
    assert attack.shows(report) is honoured, report


@pytest.mark.parametrize("attack", ATTACKS, ids=lambda a: a.name)
@on("default")
def test_attack_is_refused_at_deny(node: NodeHarness, attack: Attack) -> None:
    namespace = node.namespace(attack.name)
    refusal = node.refusal(namespace, attack.manifest(attack.name))
    assert f"[{attack.rule}]" in refusal or attack.rule in refusal, refusal


@on("default")
def test_a_tenants_override_file_in_a_slice_is_replaced_by_the_pin(node: NodeHarness) -> None:
    namespace = node.namespace("override-pin")
    report = node.run(namespace, _file_over("override-pin", "/overrideEnv"))
    assert "/overrideEnv" in report["mounts"]
    mounts = node.stored_spec(namespace, "override-pin")["containers"][0]["volumeMounts"]
    at = [m for m in mounts if m["mountPath"] == "/overrideEnv"]
    assert at == [
        {"name": "gpushare-vgpu-override-env", "mountPath": "/overrideEnv", "readOnly": True}
    ], at
