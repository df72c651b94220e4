"""Default-deny on three channels from a pod spec to the node's GPU stack, attacked offline.

- Files the stack reads inside the container (host-device-access): a pod mount at a path
  a node component reads, or below a directory it reads, shadows what the device plugin or
  the mutation put there. Any volume type, any container kind, with or without subPath.
- Annotations runtimes copy into the OCI spec (host-device-access): any ``cdi.k8s.io/``
  key whatever its value, and CRI-O's device annotations naming a device off the policy's
  list.
- DRA claim configuration (gpu-claim): an opaque config the NVIDIA DRA driver applies over
  its DeviceClass's, unless the policy lists it.

Attacks go through ``review`` (both webhooks on a CREATE) or the wire adapter for an
UPDATE; controls assert what must stay admitted, a correctly mutated pod above all.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Mapping
from typing import Any, Final

import pytest

from tests.core.test_bypass import (
    GPU_OR_PLAIN,
    MPS,
    VOLUME_LIBRARY,
    VOLUME_LOCK,
    annotated,
    assert_clean,
    assert_refused,
    container,
    file_preload,
    gpu,
    host_volume,
    mount,
    pod,
    policy_with,
    review,
    sidecar,
    stored,
    update,
    with_ephemeral,
    workload,
)
from webhook.core.decision import Request, decide
from webhook.core.injection import OVERRIDE_ENV_FILE, VOLUME_OVERRIDE_ENV, injection_for
from webhook.core.policy import Policy
from webhook.core.review import ReviewEntry
from webhook.policies import DEFAULT_POLICY

Obj = dict[str, Any]

# ======================================================================================
# Channel 2: files the GPU stack reads inside the container
# ======================================================================================

# Where a pod mount shadows what a node component reads (each spelled as the kubelet
# passes it on; containerd cleans the destination, the toolkit cleans and then matches
# its root as a string prefix).
SHADOWING_PATHS: Final = (
    # HAMi's device plugin mounts its ld.so.preload here (CUDA_DISABLE_CONTROL without it).
    "/etc/ld.so.preload",
    "/etc//ld.so.preload",
    "/etc/./ld.so.preload",
    "/etc/ld.so.preload/",
    "etc/ld.so.preload",
    "/tmp/../etc/ld.so.preload",
    # HAMi-core setenv()s every line of it at NVML init.
    "/overrideEnv",
    "//overrideEnv",
    "/overrideEnv/",
    "/./overrideEnv",
    # HAMi's per-container directory: libvgpu.so, the shared region the monitor reads.
    "/usr/local/vgpu",
    "/usr/local/vgpu/",
    "/usr/local/vgpu/libvgpu.so",
    "/usr/local/vgpu/ld.so.preload",
    "/usr/local/vgpu/x.cache",
    "/usr/local/./vgpu/a/b",
    "/usr/local/vgpu/../vgpu/libvgpu.so",
    # HAMi-core's lock directory (/tmp/vgpulock/lock).
    "/tmp/vgpulock",
    "/tmp/vgpulock/lock",
    # HAMi's license file and validator, where the node has a license.
    "/tmp/license",
    "/usr/bin/vgpuvalidator",
    # The toolkit's device-request root, matched as a string prefix.
    "/var/run/nvidia-container-devicesall",
    "/var/run/nvidia-container-devicescdi/nvidia.com/gpu=all",
    "/var/run/nvidia-container-devicesimex/0",
    "/var/run/nvidia-container-devices-x",
    "//var/run/nvidia-container-devicesall",
    "/var/run/./nvidia-container-devicesall",
    "/run/nvidia-container-devicesall",
    # Not a request to the toolkit (it compares /var/run as written, and the root itself
    # names no device), refused all the same: nothing legitimate mounts there.
    "/run/nvidia-container-devices/all",
    "/var/run/nvidia-container-devices",
)


@pytest.mark.parametrize("path", SHADOWING_PATHS)
@pytest.mark.parametrize("gpu_pod", GPU_OR_PLAIN)
def test_a_mount_where_the_gpu_stack_reads_is_refused(path: str, gpu_pod: bool) -> None:
    main = gpu if gpu_pod else functools.partial(container, "app")
    obj = pod(main(mounts=[mount("mine", path)]), volumes=[{"name": "mine", "emptyDir": {}}])
    assert_shadow_undone(review(obj), path, in_slice=gpu_pod)


def assert_shadow_undone(verdict: ReviewEntry, path: str, *, in_slice: bool) -> None:
    """A tenant's mount at ``path`` in the first container (a slice if ``in_slice``) is
    refused, or, at a path where the mutation mounts its own in a slice, replaced by it
    (by mountPath, as the MutatingAdmissionPolicy's apply does), with a warning: nothing
    of the tenant's stays."""
    if in_slice and path in INJECTED_PATHS:
        assert verdict["allowed"], verdict["violations"]
        mounts = verdict["object"]["spec"]["containers"][0]["volumeMounts"]
        assert all(m["name"] != "mine" for m in mounts if m["mountPath"] == path)
        return
    assert_refused(verdict, "host-device-access")


# Where the default policy's vgpu mutation mounts its own volumes.
INJECTED_PATHS: Final = frozenset(
    m["mountPath"] for m in injection_for("vgpu", DEFAULT_POLICY).mounts
)


# Every source a volume can have: the files come from the tenant either way.
VOLUME_SOURCES: Final[Mapping[str, Obj]] = {
    "emptyDir": {"emptyDir": {}},
    "emptyDir-memory": {"emptyDir": {"medium": "Memory"}},
    "configMap": {"configMap": {"name": "preload"}},
    "secret": {"secret": {"secretName": "preload"}},
    "projected": {"projected": {"sources": [{"configMap": {"name": "preload"}}]}},
    "downwardAPI": {
        "downwardAPI": {"items": [{"path": "x", "fieldRef": {"fieldPath": "metadata.name"}}]}
    },
    "image": {"image": {"reference": "registry.example/preload:1", "pullPolicy": "IfNotPresent"}},
    "csi": {"csi": {"driver": "inline.example.com"}},
    "ephemeral": {
        "ephemeral": {
            "volumeClaimTemplate": {
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "resources": {"requests": {"storage": "1Gi"}},
                }
            }
        }
    },
    "persistentVolumeClaim": {"persistentVolumeClaim": {"claimName": "data"}},
    "hostPath-harmless": {"hostPath": {"path": "/data/preload"}},
}


# The toolkit takes a mount whose cleaned source is /dev/null as a request; containerd
# resolves a hostPath's symlinks first (a masked systemd unit is one to /dev/null).
DEV_NULL_SOURCES: Final = ("/dev/null", "/etc/systemd/system/masked.service")


@pytest.mark.parametrize("source", DEV_NULL_SOURCES)
@pytest.mark.parametrize(
    "path",
    [
        "/var/run/nvidia-container-devices/all",
        "/var/run/nvidia-container-devicesall",
        "/var/run/nvidia-container-devices/cdi/nvidia.com/gpu/all",
        "/var/run/nvidia-container-devices/imex/0",
    ],
)
def test_a_device_request_from_a_host_file_is_refused(source: str, path: str) -> None:
    volume = {"name": "null", "hostPath": {"path": source}}
    obj = pod(container("app", mounts=[mount("null", path)]), volumes=[volume])
    assert_refused(review(obj), "host-device-access")


@pytest.mark.parametrize(
    "path", ["/usr/local/vgpu/containers", "/usr/local//vgpu/containers/", "/usr/local/vgpu/./x"]
)
def test_the_monitors_region_directory_from_the_host_is_refused(path: str) -> None:
    # HAMi's vGPU monitor reads and writes every container's region below it.
    obj = pod(gpu(), container("side", mounts=[mount("v", "/x")]), volumes=[host_volume("v", path)])
    assert_refused(review(obj), "host-device-access")


@pytest.mark.parametrize("source", sorted(VOLUME_SOURCES))
@pytest.mark.parametrize("sub_path", [None, "subPath", "subPathExpr"])
@pytest.mark.parametrize("path", ["/etc/ld.so.preload", "/overrideEnv", "/usr/local/vgpu/x"])
def test_every_volume_source_is_refused_at_a_read_path(
    source: str, sub_path: str | None, path: str
) -> None:
    extra = {} if sub_path is None else {sub_path: "ld.so.preload"}
    volume = {"name": "mine", **VOLUME_SOURCES[source]}
    obj = pod(gpu(mounts=[mount("mine", path, read_only=True, **extra)]), volumes=[volume])
    assert_shadow_undone(review(obj), path, in_slice=True)


CONTAINER_SHAPES: Final = ("containers", "second-container", "initContainers", "sidecar")


@pytest.mark.parametrize("where", CONTAINER_SHAPES)
@pytest.mark.parametrize("path", ["/etc/ld.so.preload", "/overrideEnv"])
def test_every_container_kind_is_refused_at_a_read_path(where: str, path: str) -> None:
    shadow = [mount("mine", path)]
    volumes = [{"name": "mine", "configMap": {"name": "c"}}]
    if where == "containers":
        obj = pod(gpu(mounts=shadow), volumes=volumes)
    elif where == "second-container":
        obj = pod(gpu(), container("helper", mounts=shadow), volumes=volumes)
    elif where == "initContainers":
        obj = pod(gpu(), init=[container("setup", mounts=shadow)], volumes=volumes)
    else:
        obj = pod(gpu(), init=[sidecar(mounts=shadow)], volumes=volumes)
    assert_shadow_undone(review(obj), path, in_slice=where == "containers")


@pytest.mark.parametrize("path", ["/etc/ld.so.preload", "/overrideEnv", "/usr/local/vgpu"])
def test_an_ephemeral_container_at_a_read_path_is_refused(path: str) -> None:
    old = stored(pod(gpu(), volumes=[{"name": "scratch", "emptyDir": {}}]))
    new = with_ephemeral(old, container("debugger", mounts=[mount("scratch", path)]))
    decision = update(old, new, sub_resource="ephemeralcontainers")
    assert_refused(decision, "host-device-access")


@pytest.mark.parametrize("kind", ["Deployment", "ReplicationController", "CronJob"])
def test_a_template_mounting_at_a_read_path_is_refused(kind: str) -> None:
    template = pod(
        gpu(mounts=[mount("mine", "/etc/ld.so.preload")]),
        volumes=[{"name": "mine", "configMap": {"name": "c"}}],
    )
    assert_refused(review(workload(kind, template)), "host-device-access")


def _injected_name_of_another_kind(preload: bool) -> Obj:
    # The injected volume's name on a volume of the tenant's own: under preload: env the
    # mutation injects no preload volume, so nothing replaces it.
    name = "gpushare-vgpu-preload" if preload else VOLUME_LIBRARY
    path = "/etc/ld.so.preload" if preload else "/usr/local/vgpu/libvgpu.so"
    return pod(
        gpu(mounts=[mount(name, path, read_only=True)]),
        volumes=[{"name": name, "configMap": {"name": "c"}}],
    )


SPOOFS: Final[Mapping[str, Any]] = {
    # The mutation's own volume name on the tenant's ConfigMap (preload: env injects none).
    "preload-name-on-a-config-map": lambda: (_injected_name_of_another_kind(True), None),
    # The injected preload volume, mounted read-only at /etc/ld.so.preload by a container
    # the mutation does not inject it into, is what the mutation does: admitted below.
    # A sidecar's ConfigMap at the injected preload path under preload: file.
    "file-preload-sidecar-shadow": lambda: (
        pod(
            gpu(),
            container("sidecar", mounts=[mount("mine", "/etc/ld.so.preload", read_only=True)]),
            volumes=[{"name": "mine", "configMap": {"name": "c"}}],
        ),
        file_preload(),
    ),
    # The injected library mounted into HAMi's directory at another path.
    "library-volume-elsewhere-below-vgpu": lambda: (
        pod(
            gpu(),
            container("s", mounts=[mount(VOLUME_LIBRARY, "/usr/local/vgpu/x.so", read_only=True)]),
        ),
        None,
    ),
    # The injected lock volume mounted read-only: HAMi-core cannot take its lock, and the
    # mount is not the injected one.
    "lock-volume-spelled-apart": lambda: (
        pod(gpu(), container("sidecar", mounts=[mount(VOLUME_LOCK, "/tmp//vgpulock")])),
        None,
    ),
    # An MPS client's pipe directory shadowed by the tenant's own (a daemon of its own).
    "mps-pipe-shadowed": lambda: (
        pod(
            gpu(),
            container("client", mounts=[mount("mine", "/tmp/nvidia-mps")]),
            volumes=[{"name": "mine", "emptyDir": {}}],
            annotations=MPS,
        ),
        None,
    ),
}


@pytest.mark.parametrize("spoof", sorted(SPOOFS))
def test_a_mount_posing_as_the_injected_one_is_refused(spoof: str) -> None:
    obj, policy = SPOOFS[spoof]()
    assert_refused(review(obj, policy), "host-device-access")


# Ancestors are no shadow: containerd sorts mounts by depth, so the deeper injected or
# device-plugin mount wins. And paths beside the read ones are not read.
NOT_SHADOWING: Final = (
    "/etc",
    "/usr/local",
    "/usr",
    "/tmp",
    "/dev/shm",
    "/var/run",
    "/run",
    "/etc/ld.so.preload.d",
    "/etc/ld.so.conf.d",
    "/overrideEnvironment",
    "/opt/overrideEnv",
    "/usr/local/vgpu-tools",
    "/usr/local/nvgpu",
    "/data/var/run/nvidia-container-devices",
    "/var/run/nvidia",
    "/tmp/vgpulock2",
    "/tmp/nvidia-mps-logs",
)


@pytest.mark.parametrize("path", NOT_SHADOWING)
@pytest.mark.parametrize("policy", [None, "file"], ids=["preload-env", "preload-file"])
def test_a_mount_above_or_beside_the_read_paths_is_admitted(path: str, policy: str | None) -> None:
    obj = pod(gpu(mounts=[mount("mine", path)]), volumes=[{"name": "mine", "emptyDir": {}}])
    assert_clean(review(obj, file_preload() if policy else None))


MUTATED: Final[Mapping[str, Any]] = {
    "vgpu": lambda: (pod(gpu()), None),
    "vgpu-two-containers": lambda: (pod(gpu(), gpu("second")), None),
    "vgpu-init": lambda: (pod(gpu(), init=[gpu("setup")]), None),
    "vgpu-preload-file": lambda: (pod(gpu()), file_preload()),
    "mps": lambda: (pod(gpu(), annotations=MPS), None),
    "mig": lambda: (pod(gpu(limits={"nvidia.com/mig-1g.5gb": "1"})), None),
    "whole-gpus": lambda: (pod(gpu(limits={"nvidia.com/gpu": "2"})), None),
    # A sidecar mounting the injected volumes where the mutation does.
    "sidecar-library": lambda: (
        pod(
            gpu(),
            container(
                "s", mounts=[mount(VOLUME_LIBRARY, "/usr/local/vgpu/libvgpu.so", read_only=True)]
            ),
        ),
        None,
    ),
    "sidecar-lock": lambda: (
        pod(gpu(), container("s", mounts=[mount(VOLUME_LOCK, "/tmp/vgpulock")])),
        None,
    ),
}


@pytest.mark.parametrize("shape", sorted(MUTATED))
def test_a_correctly_mutated_pod_finds_nothing(shape: str) -> None:
    obj, policy = MUTATED[shape]()
    entry = review(obj, policy)
    assert_clean(entry)
    # /validate on what /mutate produced, as the apiserver sends it.
    decision = decide(
        entry["object"],
        Request(kind=entry["kind"], operation="CREATE", namespace="ml"),
        policy or DEFAULT_POLICY,
        phase="validate",
    )
    assert decision.allowed and decision.violations == []


def test_the_policy_adds_paths_the_stack_reads() -> None:
    policy = policy_with("  containerPaths: {protected: [/opt/vendor/hook]}")
    shadow = pod(
        gpu(mounts=[mount("m", "/opt/vendor/hook/x")]), volumes=[{"name": "m", "emptyDir": {}}]
    )
    assert_refused(review(shadow, policy), "host-device-access")
    above = pod(gpu(mounts=[mount("m", "/opt/vendor")]), volumes=[{"name": "m", "emptyDir": {}}])
    assert_clean(review(above, policy))


# ======================================================================================
# Channel 3: annotations runtimes copy into the OCI spec
# ======================================================================================

# In cdi mode the toolkit reads every annotation under its prefixes (cdi.k8s.io/ by
# default, nvidia.cdi.k8s.io/ under the GPU Operator) and gives a bare name the default
# kind: "all" is nvidia.com/gpu=all.
CDI_ATTACKS: Final[Mapping[str, tuple[str, str]]] = {
    "bare-all": ("cdi.k8s.io/devices", "all"),
    "bare-index": ("cdi.k8s.io/devices", "0"),
    "bare-uuid": ("cdi.k8s.io/x", "GPU-5fd4c8a1-3f1e-9b2c-1d2e-aa33bb44cc55"),
    "bare-list": ("cdi.k8s.io/x", "0,1"),
    "other-vendor": ("cdi.k8s.io/fpga", "example.com/fpga=0"),
    "empty": ("cdi.k8s.io/devices", ""),
    "operator-prefix-bare": ("nvidia.cdi.k8s.io/container.app", "all"),
    "any-prefix": ("example.cdi.k8s.io/devices", "all"),
}


@pytest.mark.parametrize("attack", sorted(CDI_ATTACKS))
@pytest.mark.parametrize("gpu_pod", GPU_OR_PLAIN)
def test_a_cdi_annotation_is_refused_whatever_its_value(attack: str, gpu_pod: bool) -> None:
    key, value = CDI_ATTACKS[attack]
    obj = pod(gpu() if gpu_pod else container("app"), annotations={key: value})
    assert_refused(review(obj), "host-device-access")


def test_a_cdi_annotation_changed_by_update_is_refused() -> None:
    old = stored(pod(container("app")))
    first = annotated(old, {"cdi.k8s.io/devices": "all"})
    assert_refused(update(old, first), "host-device-access")


# CRI-O's devices annotation: $SRC[:$DST[:$MODE]] entries, comma-separated, each source
# checked against allowed_devices (default /dev/fuse, /dev/net/tun) only.
CRIO_KEYS: Final = ("io.kubernetes.cri-o.Devices", "devices.crio.io")
CRIO_ATTACKS: Final = (
    "/dev/nvidia0",
    "/dev/nvidiactl:/dev/nvidiactl:rwm",
    "/dev/nvidia-uvm:rw",
    "/dev/fuse,/dev/nvidia0",
    "/dev/fuse:/dev/fuse:rwm,/dev/dri/card0",
    "/dev/nvidia0:/dev/fuse",
)
# What CRI-O itself refuses (a source spelled apart from the list, a fourth part):
# refused too, nothing to gain by admitting it.
CRIO_MALFORMED: Final = (
    ("io.kubernetes.cri-o.Devices", "/dev/./fuse"),
    ("io.kubernetes.cri-o.Devices", "/dev/fuse/"),
    ("devices.crio.io", "/dev/fuse:/dev/x:rwm:extra"),
)


@pytest.mark.parametrize("value", CRIO_ATTACKS)
@pytest.mark.parametrize("key", CRIO_KEYS)
@pytest.mark.parametrize("gpu_pod", GPU_OR_PLAIN)
def test_a_crio_device_annotation_off_the_list_is_refused(
    value: str, key: str, gpu_pod: bool
) -> None:
    obj = pod(gpu() if gpu_pod else container("app"), annotations={key: value})
    assert_refused(review(obj), "host-device-access")


@pytest.mark.parametrize(("key", "value"), CRIO_MALFORMED)
def test_a_crio_device_annotation_crio_would_refuse_is_refused(key: str, value: str) -> None:
    assert_refused(review(pod(container("app"), annotations={key: value})), "host-device-access")


CRIO_CONTROLS: Final = (
    "/dev/fuse",
    "/dev/net/tun",
    "/dev/fuse,/dev/net/tun",
    "/dev/fuse:/dev/fuse:rwm",
    "/dev/fuse:rw",
    "/dev/net/tun:/dev/net/tun",
    "/dev/fuse,",
    "",
)


@pytest.mark.parametrize("value", CRIO_CONTROLS)
@pytest.mark.parametrize("key", CRIO_KEYS)
def test_a_crio_device_annotation_on_the_list_is_admitted(value: str, key: str) -> None:
    assert_clean(review(pod(container("app"), annotations={key: value})))


def test_the_policy_lists_the_devices_and_adds_prefixes() -> None:
    policy = policy_with(
        "  runtimeAnnotations:\n"
        "    allowedDevices: [/dev/fuse, /dev/kvm]\n"
        "    refusedPrefixes: [io.katacontainers., example.com/devices]"
    )
    kvm = {"io.kubernetes.cri-o.Devices": "/dev/kvm"}
    assert_clean(review(pod(container("app"), annotations=kvm), policy))
    tun = {"devices.crio.io": "/dev/net/tun"}
    assert_refused(review(pod(container("app"), annotations=tun), policy), "host-device-access")
    for key in ("io.katacontainers.config.hypervisor.default_vcpus", "example.com/devices-x"):
        refused = review(pod(container("app"), annotations={key: "1"}), policy)
        assert_refused(refused, "host-device-access")
    assert_clean(review(pod(container("app"), annotations={"example.com/other": "1"}), policy))


def test_a_crio_device_annotation_changed_by_update_is_refused() -> None:
    old = stored(pod(container("app"), annotations={"devices.crio.io": "/dev/fuse"}))
    new = annotated(old, {"devices.crio.io": "/dev/fuse,/dev/nvidia0"})
    assert_refused(update(old, new), "host-device-access")


def test_annotations_runtimes_leave_alone_are_admitted() -> None:
    harmless = {
        "prometheus.io/scrape": "true",
        "io.kubernetes.cri-o.userns-mode": "auto",
        "kubectl.kubernetes.io/default-container": "app",
        # Read by no runtime or NRI plugin; a key holding cdi.k8s.io, with or without a
        # slash, is refused (the NVIDIA toolkit's NRI plugin reads nvidia.cdi.k8s.io bare).
        "cdi.example.com": "not a CDI key",
        # CRI-O looks its key up exactly (GetAnnotationValue).
        "devices.crio.io/app": "/dev/nvidia0",
    }
    assert_clean(review(pod(gpu(), annotations=harmless)))


# ======================================================================================
# Channel 5: DRA claim configuration
# ======================================================================================

CONFIG_API: Final = "resource.nvidia.com/v1beta1"


def _opaque(
    parameters: Obj, driver: str = "gpu.nvidia.com", requests: list[str] | None = None
) -> Obj:
    config: Obj = {"opaque": {"driver": driver, "parameters": parameters}}
    if requests is not None:
        config["requests"] = requests
    return config


def claim(
    configs: list[Obj],
    *,
    device_class: str = "gpu.nvidia.com",
    kind: str = "ResourceClaim",
    namespace: str = "research",
) -> Obj:
    spec: Obj = {
        "devices": {
            "requests": [{"name": "gpu", "exactly": {"deviceClassName": device_class}}],
            "config": copy.deepcopy(configs),
        }
    }
    if kind == "ResourceClaimTemplate":
        spec = {"spec": spec}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": kind,
        "metadata": {"name": "gpu", "namespace": namespace},
        "spec": spec,
    }


@functools.cache
def dra_open() -> Policy:
    return policy_with("  dra: {allowedNamespaces: [research]}")


def judge(obj: Obj, policy: Policy) -> Any:
    namespace = obj["metadata"]["namespace"]
    return decide(
        obj,
        Request(kind=obj["kind"], operation="CREATE", namespace=namespace),
        policy,
        phase="validate",
    )


def _gpu_config(sharing: Obj | None) -> Obj:
    config: Obj = {"apiVersion": CONFIG_API, "kind": "GpuConfig"}
    if sharing is not None:
        config["sharing"] = sharing
    return config


# What the NVIDIA DRA driver reads from a claim and applies over the class's config
# (kubernetes-sigs/dra-driver-nvidia-gpu api/nvidia.com/resource/v1beta1).
CLAIM_CONFIGS: Final[Mapping[str, Obj]] = {
    "mps-full": _opaque(
        _gpu_config({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 100}})
    ),
    "mps-pinned-memory": _opaque(
        _gpu_config({"strategy": "MPS", "mpsConfig": {"defaultPinnedDeviceMemoryLimit": "80Gi"}})
    ),
    "mps-per-device": _opaque(
        _gpu_config(
            {"strategy": "MPS", "mpsConfig": {"defaultPerDevicePinnedMemoryLimit": {"0": "80Gi"}}}
        )
    ),
    "mps-multi-user": _opaque(_gpu_config({"strategy": "MPS", "mpsConfig": {"multiUser": True}})),
    "time-slicing-long": _opaque(
        _gpu_config({"strategy": "TimeSlicing", "timeSlicingConfig": {"interval": "Long"}})
    ),
    # No sharing at all overrides a class that set MPS limits.
    "gpu-config-no-sharing": _opaque(_gpu_config(None)),
    "mig-mps": _opaque(
        {"apiVersion": CONFIG_API, "kind": "MigDeviceConfig", "sharing": {"strategy": "MPS"}}
    ),
    "vfio-api-device": _opaque(
        {
            "apiVersion": CONFIG_API,
            "kind": "VfioDeviceConfig",
            "iommu": {"backendPolicy": "PreferIommuFD", "enableAPIDevice": True},
        }
    ),
    "for-one-request": _opaque(_gpu_config({"strategy": "TimeSlicing"}), requests=["gpu"]),
    "unknown-kind": _opaque({"apiVersion": "resource.nvidia.com/v1beta2", "kind": "GpuConfig"}),
}


@pytest.mark.parametrize("config", sorted(CLAIM_CONFIGS))
@pytest.mark.parametrize("kind", ["ResourceClaim", "ResourceClaimTemplate"])
def test_a_claim_config_the_policy_does_not_list_is_refused(config: str, kind: str) -> None:
    obj = claim([CLAIM_CONFIGS[config]], kind=kind)
    assert_refused(judge(obj, dra_open()), "gpu-claim")


@pytest.mark.parametrize("config", ["mps-full", "time-slicing-long"])
def test_a_claim_config_on_a_class_the_policy_does_not_list_is_refused(config: str) -> None:
    # A DeviceClass of the cluster's own that selects the driver's GPUs: the claim
    # config still overrides the class's.
    obj = claim([CLAIM_CONFIGS[config]], device_class="shared-gpu.example.com", namespace="ml")
    assert_refused(judge(obj, DEFAULT_POLICY), "gpu-claim")


def test_a_claim_config_the_policy_lists_is_admitted() -> None:
    allowed = _gpu_config({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 25}})
    policy = policy_with(
        "  dra:\n"
        "    allowedNamespaces: [research]\n"
        "    claimConfigs:\n"
        "      gpu.nvidia.com:\n"
        f"        - {{apiVersion: {CONFIG_API}, kind: GpuConfig, sharing: {{strategy: MPS, "
        "mpsConfig: {defaultActiveThreadPercentage: 25}}}"
    )
    assert_clean(judge(claim([_opaque(allowed)]), policy))
    looser = _gpu_config({"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 50}})
    assert_refused(judge(claim([_opaque(looser)]), policy), "gpu-claim")


CLAIM_CONTROLS: Final[Mapping[str, Obj]] = {
    "no-config": claim([]),
    # Another driver's configuration is that driver's (the ComputeDomain controller's).
    "compute-domain-channel": claim(
        [
            _opaque(
                {
                    "apiVersion": CONFIG_API,
                    "kind": "ComputeDomainChannelConfig",
                    "domainID": "5f0c1a2e",
                    "allocationMode": "Single",
                },
                driver="compute-domain.nvidia.com",
            )
        ],
        device_class="compute-domain-default-channel.nvidia.com",
    ),
    "other-vendor": claim(
        [_opaque({"mtu": 9000}, driver="nic.example.com")], device_class="nic.example.com"
    ),
}


@pytest.mark.parametrize("control", sorted(CLAIM_CONTROLS))
def test_a_claim_without_a_gpu_driver_config_is_admitted(control: str) -> None:
    assert_clean(judge(CLAIM_CONTROLS[control], dra_open()))


def test_the_namespace_rule_still_holds_beside_the_config_rule() -> None:
    assert_refused(judge(claim([], namespace="ml"), DEFAULT_POLICY), "gpu-claim")


def test_hami_cores_override_file_is_pinned_by_the_mutation() -> None:
    """An image that ships /overrideEnv would rewrite the limits at NVML init (HAMi-core
    src/nvml/hook.c:307): each vGPU slice gets an empty directory mounted read-only there
    (fopen opens it, fgets reads no line). The mount is judged by ``Injection``, not by a
    list of its own: admitted as injected, refused writable or spelled apart."""
    entry = review(pod(gpu()))
    assert_clean(entry)
    final = entry["object"]["spec"]
    pin = {"name": VOLUME_OVERRIDE_ENV, "mountPath": OVERRIDE_ENV_FILE, "readOnly": True}
    assert pin in final["containers"][0]["volumeMounts"]
    assert {"name": VOLUME_OVERRIDE_ENV, "emptyDir": {}} in final["volumes"]
    for side in (
        container("side", mounts=[mount(VOLUME_OVERRIDE_ENV, OVERRIDE_ENV_FILE)]),
        container("side", mounts=[mount(VOLUME_OVERRIDE_ENV, "/elsewhere")]),
    ):
        assert_refused(review(pod(gpu(), side)), "host-device-access")
    # Under its name, another source is no pin: the tenant's files would be read.
    spelled = pod(
        gpu(mounts=[mount(VOLUME_OVERRIDE_ENV, OVERRIDE_ENV_FILE, read_only=True)]),
        volumes=[{"name": VOLUME_OVERRIDE_ENV, "configMap": {"name": "env"}}],
    )
    verdict = review(spelled)
    if verdict["allowed"]:
        # Replaced by the mutation's own volume of that name, as with the library's.
        volumes = verdict["object"]["spec"]["volumes"]
        assert {"name": VOLUME_OVERRIDE_ENV, "emptyDir": {}} in volumes, volumes
        assert all("configMap" not in v for v in volumes), volumes
    else:
        assert_refused(verdict, "host-device-access")


@pytest.mark.parametrize(
    "path",
    [
        "/etc/ld.so.preload",
        "/usr/local/vgpu/libvgpu.so",
        "/overrideEnv",
        "/var/run/nvidia-container-devices/all",
        "/x/../etc/ld.so.preload",
    ],
)
@pytest.mark.parametrize("gpu_pod", GPU_OR_PLAIN)
def test_a_block_device_where_the_gpu_stack_reads_is_refused(path: str, gpu_pod: bool) -> None:
    # A Block PVC's volumeDevices: runc makes (or, in a user namespace, bind-mounts) the
    # device node at devicePath, over the preload list or the library.
    main = gpu if gpu_pod else functools.partial(container, "app")
    device = {"name": "disk", "devicePath": path}
    claim = {"name": "disk", "persistentVolumeClaim": {"claimName": "raw"}}
    obj = pod(main(volumeDevices=[device]), volumes=[claim])
    assert_refused(review(obj), "host-device-access")


def test_a_block_device_elsewhere_is_admitted() -> None:
    device = {"name": "disk", "devicePath": "/dev/xvdb"}
    claim = {"name": "disk", "persistentVolumeClaim": {"claimName": "raw"}}
    assert review(pod(gpu(volumeDevices=[device]), volumes=[claim]))["allowed"]
