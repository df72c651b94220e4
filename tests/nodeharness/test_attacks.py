"""The rows of docs/threat-model.md that say a node component honours an input, on a
real node: with the guarding rule at ``audit`` the attack pod is admitted and the node
shows what the row says (an extra device, env or file) where the row says the input is
honoured, and nothing extra where it is not; with the rule at ``deny`` it is refused."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pytest

from tests.nodeharness.conftest import on
from tests.nodeharness.pods import (
    ALL_CARDS,
    NodeHarness,
    Report,
    cards,
    container,
    gpu_limits,
    opens,
    pod,
)
from webhook.dev.node import GPU_UUIDS, LOCK_DIR, MPS_PIPE_DIR, SHARED_RESOURCE


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


def _visible_devices_beside(resources: dict[str, Any]) -> Callable[[str], dict[str, Any]]:
    env = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    return lambda name: pod(name, container("main", resources=resources, env=env))


def _vgpu_joins_node_mps(name: str) -> dict[str, Any]:
    # A vGPU slice that mounts the node's MPS pipe directory and points its client at it.
    env = [{"name": "CUDA_MPS_PIPE_DIRECTORY", "value": str(MPS_PIPE_DIR)}]
    mount = {"name": "pipe", "mountPath": str(MPS_PIPE_DIR)}
    main = container("main", resources=gpu_limits(), env=env, volumeMounts=[mount])
    return pod(name, main, volumes=[{"name": "pipe", "hostPath": {"path": str(MPS_PIPE_DIR)}}])


def _mps_control_shadow(name: str) -> dict[str, Any]:
    # An MPS pod's file of its own over the daemon's control socket, in the read-only
    # pipe directory the mutation mounts: a client connecting there reaches no daemon.
    manifest = _file_over(name, f"{MPS_PIPE_DIR}/control")
    manifest["spec"]["nodeSelector"] = {"ack.node.gpu.schedule": "mps"}
    return manifest


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
    # toolkit's settings, and the device cgroup lets it open each.
    Attack(
        "privileged",
        "privileged-gpu",
        _privileged,
        frozenset({"default", "hardened"}),
        lambda r: cards(r) == list(ALL_CARDS) and opens(r, ALL_CARDS),
    ),
    # 2.2 the device list to the runtime: a GPU container's own NVIDIA_VISIBLE_DEVICES
    # comes after the device plugin's and wins (HAMi's device plugin, and NVIDIA's
    # serving nvidia.com/gpu.shared): every card where the toolkit honours env requests;
    # with node settings 1 and 2 the device plugin's mounts decide, and the slice keeps
    # its one card.
    Attack(
        "vgpu-env-visible-devices",
        "raw-visible-devices",
        _visible_devices_beside(gpu_limits()),
        frozenset({"default"}),
        lambda r: cards(r) == list(ALL_CARDS),
    ),
    Attack(
        "shared-env-visible-devices",
        "raw-visible-devices",
        _visible_devices_beside({"limits": {SHARED_RESOURCE: "1"}}),
        frozenset({"default"}),
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
    # 2.4 a vGPU slice that joins the node's MPS daemon: the pipe directory mounted
    # writable, the client pointed at it (the toolkit in cdi mode adds no IPC mount from
    # the harness's static CDI spec, so the pod's own hostPath is what brings it).
    Attack(
        "vgpu-joins-node-mps",
        "host-device-access",
        _vgpu_joins_node_mps,
        frozenset({"default", "hardened"}),
        lambda r: (
            r["env"]["CUDA_MPS_PIPE_DIRECTORY"] == str(MPS_PIPE_DIR)
            and str(MPS_PIPE_DIR) in r["mounts"]
            and str(MPS_PIPE_DIR) not in r["readOnly"]
        ),
    ),
    # 2.11 an MPS pod's own file over the daemon's control socket, on top of the
    # read-only pipe directory the mutation mounts (a directory could not be: runc
    # cannot make a mount point in a read-only mount, nor mount one over a socket).
    Attack(
        "mps-control-shadow",
        "host-device-access",
        _mps_control_shadow,
        frozenset({"default", "hardened"}),
        lambda r: f"{MPS_PIPE_DIR}/control" in r["mounts"],
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


def _host_devices(name: str, *, gpu: bool, paths: dict[str, str]) -> dict[str, Any]:
    # hostPath volumes of the node's device nodes, each at a path of the container.
    volumes = [{"name": f"host{i}", "hostPath": {"path": source}} for i, source in enumerate(paths)]
    mounts = [{"name": f"host{i}", "mountPath": target} for i, target in enumerate(paths.values())]
    resources = gpu_limits() if gpu else {}
    return pod(name, container("main", resources=resources, volumeMounts=mounts), volumes=volumes)


# 2.5 hostPath of GPU device nodes and of /dev: a plain pod and a vGPU pod.
HOST_DEVICES: Final[dict[str, Callable[[str], dict[str, Any]]]] = {
    "plain-card-nodes": lambda name: _host_devices(
        name, gpu=False, paths={"/dev/nvidia0": "/dev/nvidia0", "/dev/nvidiactl": "/dev/nvidiactl"}
    ),
    "plain-dev": lambda name: _host_devices(name, gpu=False, paths={"/dev": "/dev/host"}),
    "vgpu-dev": lambda name: _host_devices(name, gpu=True, paths={"/dev": "/dev/host"}),
}
HOST_NODES: Final = (
    *(f"/dev/host/nvidia{i}" for i in range(len(GPU_UUIDS))),
    "/dev/host/nvidiactl",
)


@on("default-audit")
def test_a_hostpath_device_node_is_there_and_the_device_cgroup_refuses_it(
    node: NodeHarness,
) -> None:
    # The kubelet mounts the host's nodes; runc's device cgroup lets a container open
    # only the devices of its OCI spec (the NVIDIA runtime's, from the CDI spec), by
    # major and minor, whatever path they are reached by. What a hostPath adds is a
    # name: opening it is refused (EPERM) unless the runtime gave that device anyway.
    namespace = node.namespace("host-devices")
    for name, manifest in HOST_DEVICES.items():
        node.create(namespace, manifest(name))
    reports: dict[str, Report] = {}
    for name in HOST_DEVICES:
        node.wait_running(namespace, name)
        reports[name] = node.report(namespace, name)

    plain = reports["plain-card-nodes"]
    assert cards(plain) == ["/dev/nvidia0"] and "/dev/nvidiactl" in plain["devices"], plain
    assert plain["access"] == {"/dev/nvidia0": "EPERM", "/dev/nvidiactl": "EPERM"}, plain

    whole = reports["plain-dev"]
    assert set(HOST_NODES) <= set(whole["devices"]), whole["devices"]
    assert all(whole["access"][path] == "EPERM" for path in HOST_NODES), whole["access"]

    vgpu = reports["vgpu-dev"]
    (own,) = cards(vgpu)
    assert opens(vgpu, [own, "/dev/nvidiactl"]), vgpu["access"]
    twin = own.replace("/dev/", "/dev/host/")
    assert opens(vgpu, [twin, "/dev/host/nvidiactl"]), vgpu["access"]
    others = [path for path in HOST_NODES[: len(GPU_UUIDS)] if path != twin]
    assert all(vgpu["access"][path] == "EPERM" for path in others), vgpu["access"]


@pytest.mark.parametrize("name", HOST_DEVICES)
@on("default")
def test_a_hostpath_device_node_is_refused_at_deny(node: NodeHarness, name: str) -> None:
    refusal = node.refusal(node.namespace(name), HOST_DEVICES[name](name))
    assert "host-device-access" in refusal, refusal


TO_ALLOCATE: Final = "hami.io/vgpu-devices-to-allocate"
ALLOCATED: Final = "hami.io/vgpu-devices-allocated"


def _forged(uuid: str, memory: int) -> str:
    # One container, one device: <uuid>,<type>,<MiB>,<cores> (HAMi pkg/device/devices.go
    # EncodeContainerDevices, as the extender writes it).
    return f"{uuid},NVIDIA,{memory},0:;"


def _wait_bound(node: NodeHarness, namespace: str, name: str) -> dict[str, str]:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        found = node.core.read_namespaced_pod(name, namespace)
        annotations: dict[str, str] = found.metadata.annotations or {}
        if found.spec.node_name and annotations.get("hami.io/bind-phase") == "allocating":
            return annotations
        time.sleep(0.1)
    raise AssertionError(f"{namespace}/{name} never bound")


def _forged_pod(to_allocate: str) -> dict[str, Any]:
    """A vGPU pod created with ``to_allocate`` as HAMi's allocation annotation."""
    return pod(
        "forged", container("main", resources=gpu_limits()), annotations={TO_ALLOCATE: to_allocate}
    )


@on("default-audit")
def test_a_forged_allocation_before_allocate_picks_the_card(node: NodeHarness) -> None:
    # HAMi's device plugin hands a container the cards of the pending pod's
    # hami.io/vgpu-devices-to-allocate (Project-HAMi/HAMi pkg/util/util.go:76-118,
    # GetPendingPod; server.go:759-827, Allocate, with enableGetPreferredAllocation at
    # its default false @ 4707fb02). The scheduler extender's Filter writes that key
    # (pkg/scheduler/scheduler.go:1124-1139), over a value the pod was created with. A
    # write after Filter and before the kubelet's Allocate is what Allocate reads: the
    # device plugin is held here so that the write lands there, as it may in a race.
    namespace = node.namespace("forged")
    manifest = _forged_pod(_forged(GPU_UUIDS[0], 16384))
    with node.paused("device-plugin"):
        node.create(namespace, manifest)
        annotations = _wait_bound(node, namespace, "forged")
        # Filter overwrote the value of the create: the scheduler's own choice, counted.
        counted = annotations[ALLOCATED]
        assert annotations[TO_ALLOCATE] == counted and counted.endswith(",1024,0:;"), annotations
        chosen = counted.split(",", 1)[0]
        other = next(uuid for uuid in GPU_UUIDS if uuid != chosen)
        patch = {"metadata": {"annotations": {TO_ALLOCATE: _forged(other, 16384)}}}
        node.core.patch_namespaced_pod("forged", namespace, patch)
    node.wait_running(namespace, "forged")
    report = node.report(namespace, "forged")

    # The container gets the forged card, which the scheduler never counted it on.
    assert cards(report) == [f"/dev/nvidia{GPU_UUIDS.index(other)}"], report["devices"]
    assert node.annotations(namespace, "forged")[ALLOCATED] == counted
    # The memory cap is the mutation's pin from the pod's request, not the forged one:
    # the pod's env comes after the device plugin's.
    assert report["env"]["CUDA_DEVICE_MEMORY_LIMIT_0"] == "1024m"


@on("default")
def test_a_forged_allocation_is_refused_at_deny(node: NodeHarness) -> None:
    namespace = node.namespace("forged")
    forged = _forged(GPU_UUIDS[3], 16384)
    assert "forged-allocation" in node.refusal(namespace, _forged_pod(forged))

    from kubernetes import client

    # Running, so that HAMi's device plugin is done with it (its stand-in takes the
    # first pending pod of the node, as GetPendingPod does without the node lock).
    node.run(namespace, pod("honest", container("main", resources=gpu_limits())))
    patch = {"metadata": {"annotations": {TO_ALLOCATE: forged}}}
    with pytest.raises(client.ApiException) as refused:
        node.core.patch_namespaced_pod("honest", namespace, patch)
    assert "forged-allocation" in str(refused.value.body)
