"""The default-deny channels (docs/threat-model.md 2.8-2.12) on a real node: where a
pod's mount lands beside the device plugin's, which pod annotations reach the OCI spec,
what a GPU runtime class gives a CUDA image, whether the mutation's pins beat an image's
ENV, and whether the mutation's own mounts compose with HAMi's.

The OCI spec is read with ``crictl inspect``: it is what containerd hands the NVIDIA
runtime, before the runtime edits it."""

from __future__ import annotations

from typing import Any, Final

import pytest

from tests.nodeharness.conftest import on
from tests.nodeharness.pods import (
    ALL_CARDS,
    CUDA,
    CUDA_LEGACY,
    GATES,
    NodeHarness,
    cards,
    container,
    gpu_limits,
    pod,
)
from webhook.core.env import DEVICE_PINS
from webhook.dev.node import HOOK_PATH, LOCK_DIR, MPS_PIPE_DIR, SHARED_MPS_PIPE, SHARED_RESOURCE

LIBRARY: Final = "/usr/local/vgpu/libvgpu.so"
PRELOAD: Final = "/etc/ld.so.preload"
# Where HAMi's device plugin (its stand-in, -hook-path /usr/local) takes what it mounts.
HAMI_PRELOAD: Final = str(HOOK_PATH / "ld.so.preload")
# The class HAMi's chart and the toolkit's installer make (handler nvidia), and one of
# the same handler that the policy's runtimeClasses.gpu does not list.
LISTED_CLASS: Final = "nvidia"
UNLISTED_CLASS: Final = "gpushare-unlisted"


def mounts_at(spec: dict[str, Any], destination: str) -> list[dict[str, Any]]:
    """The OCI spec's mounts at ``destination``, in the order runc mounts them (the last
    one is what the container sees)."""
    return [m for m in spec["mounts"] if m["destination"] == destination]


def downward_file(name: str) -> dict[str, Any]:
    # A file any tenant can write: the downward API's pod name.
    items = [{"path": "name", "fieldRef": {"fieldPath": "metadata.name"}}]
    return {"name": name, "downwardAPI": {"items": items}}


@on("default-audit")
def test_pod_mounts_land_on_top_of_the_device_plugins_and_no_annotation_reaches_the_spec(
    node: NodeHarness,
) -> None:
    # host-device-access at audit: the shadows and annotations reach the node.
    namespace = node.namespace("shadow")
    main = container(
        "main",
        args=["region", "sleep"],
        resources=gpu_limits(),
        volumeMounts=[
            {"name": "file", "mountPath": PRELOAD, "subPath": "name"},
            {"name": "scratch", "mountPath": "/usr/local/vgpu"},
        ],
    )
    annotations = {
        "cdi.k8s.io/gpushare": "all",
        "nvidia.cdi.k8s.io/gpushare": "nvidia.com/gpu=all",
        "devices.crio.io": "/dev/nvidia0",
    }
    manifest = pod(
        "shadow",
        main,
        volumes=[downward_file("file"), {"name": "scratch", "emptyDir": {}}],
        annotations=annotations,
    )
    report = node.run(namespace, manifest)
    spec = node.runtime_spec(namespace, "shadow")
    uid = node.core.read_namespaced_pod("shadow", namespace).metadata.uid

    # Equal depth: HAMi's mount first, the pod's after it (the kubelet's order, kept by
    # containerd's stable sort by depth); runc mounts in order, so the pod's file is the
    # one the loader reads.
    preloads = mounts_at(spec, PRELOAD)
    assert len(preloads) == 2, preloads
    assert preloads[0]["source"] == HAMI_PRELOAD, preloads
    assert "volume-subpaths" in preloads[1]["source"], preloads
    assert report["preload"] == "shadow"

    # The same at /usr/local/vgpu: the region HAMi-core creates lands in the pod's
    # emptyDir, and HAMi's monitor (which reads the per-container directory on the host)
    # sees nothing of it.
    directories = mounts_at(spec, "/usr/local/vgpu")
    assert len(directories) == 2, directories
    assert directories[0]["source"] == str(HOOK_PATH / "containers" / f"{uid}_main")
    assert "empty-dir" in directories[1]["source"], directories
    region = report.get("region")
    assert isinstance(region, str) and region.startswith("/usr/local/vgpu/"), region
    monitored = HOOK_PATH / "containers" / f"{uid}_main"
    assert not any(p.name.endswith(".cache") for p in monitored.iterdir())

    # containerd copies no pod annotation into the container's spec (no pod_annotations
    # on its runtime handler): the CDI and CRI-O keys never reach the NVIDIA runtime.
    copied = spec.get("annotations") or {}
    assert not any("cdi.k8s.io/" in key or "crio" in key for key in copied), copied
    assert len(cards(report)) == 1


def _runtime_class(node: NodeHarness, name: str) -> None:
    from kubernetes import client

    # The client takes plain dicts at run time; its stubs only know its models.
    api: Any = client.NodeV1Api(node.node.cluster.api_client())
    body = {"apiVersion": "node.k8s.io/v1", "kind": "RuntimeClass", "metadata": {"name": name}}
    try:
        api.create_runtime_class({**body, "handler": "nvidia"})
    except client.ApiException as exc:
        if exc.status != 409:
            raise


@on("default", "hardened")
def test_a_gpu_runtime_class_voids_cuda_images_and_an_unlisted_one_does_not(
    node: NodeHarness,
) -> None:
    # containerd's runtime "nvidia" is the NVIDIA runtime (the node's default one too).
    for name in (LISTED_CLASS, UNLISTED_CLASS):
        _runtime_class(node, name)
    namespace = node.namespace("runtime-class")
    listed = pod(
        "listed",
        container("main", CUDA),
        container("legacy", CUDA_LEGACY),
        runtimeClassName=LISTED_CLASS,
    )
    node.run(namespace, listed)
    for name in ("main", "legacy"):
        report = node.report(namespace, "listed", name)
        assert report["env"]["NVIDIA_VISIBLE_DEVICES"] == "void", name
        assert report["devices"] == [], (name, report["devices"])

    # A class the policy does not list is left alone: the node decides, as for a plain
    # pod on a node whose default runtime is the NVIDIA runtime.
    report = node.run(
        namespace, pod("unlisted", container("main", CUDA), runtimeClassName=UNLISTED_CLASS)
    )
    assert "NVIDIA_VISIBLE_DEVICES" not in {
        e["name"] for e in node.stored_spec(namespace, "unlisted")["containers"][0].get("env", [])
    }
    if node.profile == "hardened":
        assert report["devices"] == []
    else:
        assert cards(report) == list(ALL_CARDS)


@on("default", "hardened")
def test_an_ephemeral_cuda_container(node: NodeHarness) -> None:
    # kubectl debug adds a container the mutation never sees. Under a GPU runtime class
    # one without the void is refused; in a GPU pod it is admitted and gets what its
    # image asks for, as a plain pod does: every card unless node setting 1.
    from kubernetes import client

    _runtime_class(node, LISTED_CLASS)
    namespace = node.namespace("debug")
    node.run(namespace, pod("classed", container("main"), runtimeClassName=LISTED_CLASS))
    with pytest.raises(client.ApiException) as refused:
        node.debug(namespace, "classed", CUDA)
    assert "host-device-access" in str(refused.value.body)

    node.run(namespace, pod("vgpu", container("main", resources=gpu_limits())))
    report = node.debug(namespace, "vgpu", CUDA)
    assert report["env"]["NVIDIA_VISIBLE_DEVICES"] == "all"
    if node.profile == "hardened":
        assert report["devices"] == []
    else:
        assert cards(report) == list(ALL_CARDS)


@on("default")
def test_the_slice_pins_beat_the_images_env(node: NodeHarness) -> None:
    namespace = node.namespace("pins")
    report = node.run(namespace, pod("slice", container("main", GATES, resources=gpu_limits())))
    for name, value in DEVICE_PINS.items():
        assert report["env"][name] == value, name
    assert len(cards(report)) == 1

    # Unpinned (a pod asking for no GPU), the image's values reach the container; the
    # runtime in cdi mode runs no gated modifier (nvidia-container-toolkit
    # internal/modifier/mode.go:24-35 @ v1.20.2), so they add no device node here.
    report = node.run(namespace, pod("plain", container("main", GATES)))
    assert report["env"]["NVIDIA_GDS"] == "enabled"
    assert report["env"]["NVIDIA_IMEX_CHANNELS"] == "all"
    assert cards(report) == list(ALL_CARDS)
    assert sorted(report["devices"]) == sorted([*ALL_CARDS, "/dev/nvidia-uvm", "/dev/nvidiactl"])


@on("default", "default-file")
def test_the_mutations_mounts_compose_with_hamis(node: NodeHarness) -> None:
    # The library and the lock directory (and with preload: file, ld.so.preload) are
    # mounted by HAMi's device plugin and by the mutation at the same paths: both stay in
    # the spec, the container starts, and the last of each is the host's file.
    namespace = node.namespace("compose")
    report = node.run(namespace, pod("compose", container("main", resources=gpu_limits())))
    spec = node.runtime_spec(namespace, "compose")

    assert [m["source"] for m in mounts_at(spec, LIBRARY)] == [LIBRARY, LIBRARY]
    assert [m["source"] for m in mounts_at(spec, str(LOCK_DIR))] == [str(LOCK_DIR)] * 2
    preloads = [m["source"] for m in mounts_at(spec, PRELOAD)]
    if node.name == "default-file":
        assert preloads == [HAMI_PRELOAD, HAMI_PRELOAD]
        assert "LD_PRELOAD" not in report["env"]
    else:
        assert preloads == [HAMI_PRELOAD]
        assert report["env"]["LD_PRELOAD"].split(":")[0] == LIBRARY
    assert report["preload"] == f"{LIBRARY}\n"
    assert LIBRARY in report["readOnly"] and PRELOAD in report["readOnly"]


@pytest.mark.parametrize("path", [LIBRARY, str(LOCK_DIR), PRELOAD])
@on("default", "default-file")
def test_a_tenant_file_where_the_mutation_mounts_is_replaced(node: NodeHarness, path: str) -> None:
    # A tenant's mount (a file of its own, by subPath) where the mutation mounts its own
    # in a slice container is replaced by the mutation's, subPath and all (the
    # MutatingAdmissionPolicy's apply on 1.36); where the mutation mounts nothing
    # (ld.so.preload with preload: env) it is refused.
    namespace = node.namespace("replaced")
    mount = {"name": "file", "mountPath": path, "subPath": "name"}
    main = container("main", resources=gpu_limits(), volumeMounts=[mount])
    manifest = pod("replaced", main, volumes=[downward_file("file")])
    if path == PRELOAD and node.name != "default-file":
        assert "host-device-access" in node.refusal(namespace, manifest)
        return
    report = node.run(namespace, manifest)
    stored = node.stored_spec(namespace, "replaced")
    at_path = [m for m in stored["containers"][0]["volumeMounts"] if m["mountPath"] == path]
    assert len(at_path) == 1 and at_path[0]["name"].startswith("gpushare-"), at_path
    assert "subPath" not in at_path[0], at_path
    assert report["preload"] == f"{LIBRARY}\n"
    assert report["mounts"].count(path) == 2


# Spellings with "..": the toolkit cleans the destination (cuda_image.go:372), runc
# resolves it. Those with "." or "//" instead are refused by the in-apiserver policies.
DOTDOT_REQUESTS: Final = (
    "/var/run/nvidia-container-devices/x/../all",
    "/var/run/../run/nvidia-container-devices/all",
    "/x/../var/run/nvidia-container-devices/all",
)


@pytest.mark.parametrize("path", DOTDOT_REQUESTS)
@on("hardened")
def test_a_dotdot_device_request_in_a_plain_pod_is_refused(node: NodeHarness, path: str) -> None:
    # On 1.36+ the webhooks see only pods that ask for a GPU (render.scope.view_conditions)
    # and CEL cannot resolve "..": a plain pod with this mount reaches a node where the
    # toolkit honours device-request mounts (node setting 2, the hardened profile). This
    # test shows what such a pod gets when the install admits it.
    from kubernetes import client

    namespace = node.namespace("dotdot")
    mount = {"name": "request", "mountPath": path}
    main = container("main", volumeMounts=[mount])
    manifest = pod("dotdot", main, volumes=[{"name": "request", "hostPath": {"path": "/dev/null"}}])
    try:
        node.create(namespace, manifest)
    except client.ApiException as exc:
        refusal = str(exc.body)
    else:
        refusal = ""
    if refusal:
        assert "host-device-access" in refusal, refusal
        return
    node.wait_running(namespace, "dotdot")
    got = cards(node.report(namespace, "dotdot"))
    pytest.fail(f"admitted: a pod asking for no GPU got {got}")


@on("default")
def test_an_mps_pods_own_pipe_and_limits_are_replaced(node: NodeHarness) -> None:
    # An MPS pod that brings a pipe directory of its own (an emptyDir where the
    # mutation mounts the node's) and its own client limits: the mutation replaces each
    # with the node's, the container sees the pipe read-only and the limits of its
    # request, and no directory of its own is mounted.
    namespace = node.namespace("mps-own")
    env = [
        {"name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "value": "100"},
        {"name": "CUDA_MPS_PIPE_DIRECTORY", "value": "/tmp/mine"},
        {"name": "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "value": "0=16384M"},
    ]
    limits = gpu_limits()
    limits["limits"]["nvidia.com/gpucores"] = "30"
    main = container(
        "main",
        resources=limits,
        env=env,
        volumeMounts=[{"name": "own", "mountPath": str(MPS_PIPE_DIR)}],
    )
    manifest = pod(
        "mps-own",
        main,
        volumes=[{"name": "own", "emptyDir": {}}],
        nodeSelector={"ack.node.gpu.schedule": "mps"},
    )
    report = node.run(namespace, manifest)
    spec = node.runtime_spec(namespace, "mps-own")

    assert report["env"]["CUDA_MPS_PIPE_DIRECTORY"] == str(MPS_PIPE_DIR)
    assert report["env"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    assert report["env"]["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=1024M"
    assert [m["source"] for m in mounts_at(spec, str(MPS_PIPE_DIR))] == [str(MPS_PIPE_DIR)]
    assert str(MPS_PIPE_DIR) in report["readOnly"]
    assert len(cards(report)) == 1


@on("default-audit")
def test_a_pods_pipe_directory_beats_nvidias_mps_daemon(node: NodeHarness) -> None:
    # NVIDIA's device plugin sharing by MPS (nvidia.com/gpu.shared) mounts its daemon's
    # pipe directory and names it in CUDA_MPS_PIPE_DIRECTORY (k8s-device-plugin
    # internal/plugin/mps.go:74-91 @ 1b826acc); the pod's own value comes after the
    # device plugin's and wins, so the client looks for a daemon elsewhere and, finding
    # none, runs without MPS and its limits (nvidia-cuda-mps-control(1)).
    namespace = node.namespace("nvidia-mps")
    shared = {"limits": {SHARED_RESOURCE: "1"}}
    env = [
        {"name": "CUDA_MPS_PIPE_DIRECTORY", "value": "/tmp/mine"},
        {"name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE", "value": "100"},
    ]
    manifest = pod(
        "nvidia-mps",
        container("main", resources=shared, env=env),
        container("plain", resources=shared),
    )
    node.run(namespace, manifest)
    plain = node.report(namespace, "nvidia-mps", "plain")
    assert plain["env"]["CUDA_MPS_PIPE_DIRECTORY"] == SHARED_MPS_PIPE
    assert SHARED_MPS_PIPE in plain["mounts"] and len(cards(plain)) == 1

    main = node.report(namespace, "nvidia-mps", "main")
    assert main["env"]["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/mine"
    assert main["env"]["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "100"
    assert SHARED_MPS_PIPE in main["mounts"] and len(cards(main)) == 1
