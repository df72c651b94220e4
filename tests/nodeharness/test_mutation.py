"""The mutation on a real node, in both node profiles: what the kubelet, containerd,
runc, the NVIDIA runtime and HAMi's device plugin (stand-in) give each container."""

from __future__ import annotations

from pathlib import Path

from tests.nodeharness.conftest import on
from tests.nodeharness.pods import CUDA, CUDA_LEGACY, NodeHarness, cards, container, gpu_limits, pod
from webhook.dev.node import GPU_UUIDS, HOOK_PATH

LIBRARY = "/usr/local/vgpu/libvgpu.so"


def allocated_card(node: NodeHarness, namespace: str, name: str) -> str:
    """The device node of the card HAMi's ledger gave the pod's first container."""
    ledger = node.annotations(namespace, name)["hami.io/vgpu-devices-allocated"]
    uuid = ledger.split(",", 1)[0]
    return f"/dev/nvidia{GPU_UUIDS.index(uuid)}"


@on("default", "hardened")
def test_vgpu_pod_sees_its_one_card_its_limits_and_libvgpu(node: NodeHarness) -> None:
    namespace = node.namespace("vgpu")
    report = node.run(namespace, pod("vgpu", container("main", resources=gpu_limits(memory=2048))))

    assert cards(report) == [allocated_card(node, namespace, "vgpu")]
    assert sorted(report["devices"]) == sorted(
        [*cards(report), "/dev/nvidia-uvm", "/dev/nvidiactl"]
    )
    env = report["env"]
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "2048m"
    assert not any(
        k.startswith("CUDA_DEVICE_MEMORY_LIMIT_") and k != "CUDA_DEVICE_MEMORY_LIMIT_0" for k in env
    )
    # Preloaded twice over: the mutation's LD_PRELOAD and the device plugin's
    # /etc/ld.so.preload, the library mounted read-only.
    assert env["LD_PRELOAD"].split(":")[0] == LIBRARY
    assert report["preload"] == f"{LIBRARY}\n"
    assert LIBRARY in report["mounts"]
    assert LIBRARY in report["readOnly"]
    if node.profile == "hardened":
        # The device list rides in a volume mount, not in the env.
        assert env["NVIDIA_VISIBLE_DEVICES"] == "/var/run/nvidia-container-devices"
    else:
        assert env["NVIDIA_VISIBLE_DEVICES"] in GPU_UUIDS


@on("default", "hardened")
def test_vgpu_region_is_where_hamis_monitor_looks(node: NodeHarness) -> None:
    # HAMi's monitor reads <HOOK_PATH>/containers/<pod uid>_<container>/*.cache on the
    # host (Project-HAMi/HAMi pkg/monitor/nvidia/cudevshr.go:133,169-262 @ 4707fb02): the
    # region HAMi-core creates must land there, through the device plugin's mount of
    # that directory at /usr/local/vgpu.
    namespace = node.namespace("region")
    manifest = pod("region", container("main", args=["region", "sleep"], resources=gpu_limits()))
    report = node.run(namespace, manifest)
    uid = node.core.read_namespaced_pod("region", namespace).metadata.uid

    region = report.get("region")
    assert isinstance(region, str) and not region.startswith("error"), region
    monitored = HOOK_PATH / "containers" / f"{uid}_main"
    assert (monitored / Path(region).name).is_file(), (region, sorted(monitored.iterdir()))


@on("default", "hardened")
def test_mps_pod_gets_its_pipe_read_only(node: NodeHarness) -> None:
    namespace = node.namespace("mps")
    manifest = pod(
        "mps",
        container("main", resources=gpu_limits()),
        nodeSelector={"ack.node.gpu.schedule": "mps"},
    )
    report = node.run(namespace, manifest)

    pipe = report["env"]["CUDA_MPS_PIPE_DIRECTORY"]
    assert pipe in report["mounts"]
    assert pipe in report["readOnly"]
    assert len(cards(report)) == 1


@on("default", "hardened")
def test_non_gpu_sidecar_of_a_gpu_pod_sees_no_gpu(node: NodeHarness) -> None:
    namespace = node.namespace("sidecar")
    manifest = pod("sidecar", container("main", resources=gpu_limits()), container("side", CUDA))
    node.run(namespace, manifest)

    main = node.report(namespace, "sidecar", "main")
    side = node.report(namespace, "sidecar", "side")
    assert len(cards(main)) == 1
    assert side["devices"] == []
    assert side["env"]["NVIDIA_VISIBLE_DEVICES"] == "void"


@on("default", "hardened")
def test_plain_pod_of_a_cuda_image(node: NodeHarness) -> None:
    # A pod asking for no GPU, running an image that bakes NVIDIA_VISIBLE_DEVICES=all or
    # (legacy) CUDA_VERSION alone: the mutation leaves it alone; the node decides.
    namespace = node.namespace("plain")
    for name, image in (("cuda", CUDA), ("legacy", CUDA_LEGACY)):
        report = node.run(namespace, pod(name, container("main", image)))
        if node.profile == "hardened":
            # accept-nvidia-visible-devices-envvar-when-unprivileged = false.
            assert report["devices"] == [], name
        else:
            # The toolkit's defaults honour the image's env: every card.
            assert cards(report) == [f"/dev/nvidia{i}" for i in range(4)], name
            assert "/dev/nvidiactl" in report["devices"]


@on("default")
def test_pod_env_wins_over_the_device_plugin_env(node: NodeHarness) -> None:
    # The kubelet puts a device plugin's env first and the container's env after it
    # (kubernetes v1.36.3 pkg/kubelet/kubelet_pods.go:632,656); containerd replaces an
    # earlier value of a name by a later one (containerd v2.4.2 pkg/oci/spec_opts.go:
    # 186-220, WithEnv; internal/cri/server/container_create.go:738). HAMi's device
    # plugin sets CUDA_DEVICE_SM_LIMIT to the ledger's cores (0 when none were asked);
    # the pod's own value must be what the container sees.
    namespace = node.namespace("precedence")
    main = container(
        "main", resources=gpu_limits(), env=[{"name": "CUDA_DEVICE_SM_LIMIT", "value": "30"}]
    )
    report = node.run(namespace, pod("precedence", main))

    assert report["env"]["CUDA_DEVICE_SM_LIMIT"] == "30"
