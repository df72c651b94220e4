"""One kubelet node on loopback for the dev cluster: the real kubelet, kube-scheduler,
containerd, runc, CNI plugins and NVIDIA container runtime, with fake GPUs.

What a container ends up with (device nodes, env, preload, mounts) is decided on the
node, by parts this project does not own. :class:`Node` runs those parts, built from
their Go modules by ``hack/build-nodebin``, so that tests observe it instead of
inferring it:

- containerd with the NVIDIA container runtime as its default runtime, in ``cdi`` mode,
  over runc; a static CDI spec of 4 fake cards (``/dev/nvidia0``-``3``, ``nvidiactl``,
  ``nvidia-uvm``: device nodes made with ``mknod``, which need not open);
- the kubelet, registered with the dev cluster's apiserver;
- kube-scheduler with a profile per scheduler name the default policy routes to, and
  stand-ins for HAMi's scheduler extender and device plugin that answer as upstream
  does (hack/nodebin/cmd, each field cited to its source line), and for NVIDIA's
  k8s-device-plugin sharing the same cards by MPS as ``nvidia.com/gpu.shared``;
- the host files HAMi's stack expects: ``/usr/local/vgpu/libvgpu.so`` (a stand-in: the
  real one needs CUDA), HAMi's ``ld.so.preload`` and the lock directory.

Two profiles (:data:`PROFILES`): ``default`` is the toolkit at its defaults with device
lists passed by env; ``hardened`` is docs/threat-model.md §1: env device requests of
unprivileged containers refused, device lists passed as volume mounts.

Every process of the node runs in a mount and PID namespace of its own (``unshare``):
when the node stops, the kernel ends every container and shim and drops every mount
with it. What is left on the host is undone by :meth:`Node.stop`: the cgroups, the CNI
bridge, the device nodes it made, the sysctls the kubelet sets. One node per machine:
the kubelet hard-codes its device plugin directory. Needs root and cgroups.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import os
import secrets
import shutil
import signal
import socket
import stat
import subprocess
import tarfile
import time
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal

import yaml

from webhook.dev.cluster import REPO, ClusterError, DevCluster, free_port

Profile = Literal["default", "hardened"]
PROFILES: Final[tuple[Profile, ...]] = ("default", "hardened")

GPUS: Final = 4
CARD_MEMORY_MIB: Final = 16384
# NVIDIA's fixed character major (nvidia0-3 and nvidiactl at minor 255). nvidia-uvm's
# major is dynamic (the driver asks the kernel for one at load): this node uses 508,
# from the top of the kernel's dynamic range, and refuses to start if it is taken.
NVIDIA_MAJOR: Final = 195
UVM_MAJOR: Final = 508
GPU_UUIDS: Final = tuple(f"GPU-00000000-0000-0000-0000-00000000000{i}" for i in range(GPUS))

HOOK_PATH: Final = Path("/usr/local/vgpu")
# HAMi-core's lock directory, a fixed path shared by every vGPU pod of a node.
LOCK_DIR: Final = Path("/tmp/vgpulock")  # noqa: S108  # HAMi-core hard-codes it
MPS_PIPE_DIR: Final = Path("/tmp/nvidia-mps")  # noqa: S108  # the default mps.pipeDirectory
# The kubelet's device plugin directory is a constant of its API (v1beta1.DevicePluginPath).
DEVICE_PLUGIN_DIR: Final = Path("/var/lib/kubelet/device-plugins")
BRIDGE: Final = "gpushare0"
CGROUP_ROOT: Final = "gpushare-node"
POD_SUBNET: Final = "10.244.77.0/24"

# The nvidia/cuda images bake these (NVIDIA/cuda gitlab dist/12.4.1/ubuntu2204/base
# Dockerfile); a legacy image sets CUDA_VERSION alone and relies on the toolkit's
# legacy rule that such an image with no NVIDIA_VISIBLE_DEVICES gets every GPU.
_PATH_ENV: Final = "PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
IMAGES: Final[Mapping[str, tuple[str, ...]]] = {
    "gpushare.test/probe:1": (_PATH_ENV,),
    "gpushare.test/cuda:1": (
        _PATH_ENV,
        "NVIDIA_VISIBLE_DEVICES=all",
        "NVIDIA_DRIVER_CAPABILITIES=compute,utility",
        "NVIDIA_REQUIRE_CUDA=cuda>=12.4 brand=tesla,driver>=470,driver<471",
        "CUDA_VERSION=12.4.1",
    ),
    "gpushare.test/cuda-legacy:1": (_PATH_ENV, "CUDA_VERSION=12.4.1"),
    # A CUDA image that also bakes the toolkit's gated modifiers and IMEX channels (as
    # GPUDirect Storage and multi-node NVLink images do): what the mutation's pins in a
    # slice container must beat.
    "gpushare.test/gates:1": (
        _PATH_ENV,
        "NVIDIA_VISIBLE_DEVICES=all",
        "NVIDIA_GDS=enabled",
        "NVIDIA_MOFED=enabled",
        "NVIDIA_GDRCOPY=enabled",
        "NVIDIA_NVSWITCH=enabled",
        "NVIDIA_IMEX_CHANNELS=all",
    ),
}
PAUSE_IMAGE: Final = "gpushare.test/pause:1"

# NVIDIA's k8s-device-plugin beside HAMi's, sharing the same cards through its MPS
# daemon under the name it gives a shared resource by default (renameByDefault:
# NVIDIA/k8s-device-plugin api/config/v1/replicas.go:204-208, consts.go:26 @ 1b826acc).
# HAMi's takes nvidia.com/gpu, and one resource has one plugin on a node.
SHARED_RESOURCE: Final = "nvidia.com/gpu.shared"
# Where that plugin's MPS daemon keeps a resource's pipe directory inside the container
# (cmd/mps-control-daemon/mps/root.go:26,40-43).
SHARED_MPS_PIPE: Final = f"/mps/{SHARED_RESOURCE}/pipe"

# The service accounts HAMi's chart runs its scheduler and device plugin as; the
# default policy's ledger names them (webhook/policies/default.yaml, ledgers).
STANDIN_ACCOUNTS: Final = ("hami-scheduler", "hami-device-plugin")
# Node labels: HAMi's device plugin nodes (gpu=on, the policy's sharing pool) that also
# run MPS (the policy's MPS node selector).
NODE_LABELS: Final[Mapping[str, str]] = {"gpu": "on", "ack.node.gpu.schedule": "mps"}
# The scheduler names webhook/policies/default.yaml routes pods to.
SCHEDULERS: Final = ("default-scheduler", "hami-scheduler", "volcano")
# What HAMi's scheduler extender accounts for, which kube-scheduler must not
# (HAMi charts/hami/templates/scheduler/configmapnew.yaml: managedResources, all
# ignoredByScheduler but the count).
_EXTENDER_RESOURCES: Final = (
    "nvidia.com/gpumem",
    "nvidia.com/gpumem-percentage",
    "nvidia.com/gpucores",
    "nvidia.com/priority",
)
# Sysctls the kubelet sets when it starts (pkg/kubelet/cm/container_manager_linux.go,
# setupKernelTunables); put back on stop.
_KUBELET_SYSCTLS: Final = (
    "vm/overcommit_memory",
    "vm/panic_on_oom",
    "kernel/panic",
    "kernel/panic_on_oops",
    "kernel/keys/root_maxkeys",
    "kernel/keys/root_maxbytes",
)
_READY_TIMEOUT: Final = 120.0
_STOP_TIMEOUT: Final = 15.0

NODE_BINARIES: Final = (
    "kubelet",
    "kube-scheduler",
    "containerd",
    "containerd-shim-runc-v2",
    "ctr",
    "runc",
    "bridge",
    "loopback",
    "host-local",
    "crictl",
    "nvidia-container-runtime",
    "nvidia-ctk",
    "gpushare-probe",
    "gpushare-device-plugin",
    "gpushare-scheduler-extender",
)


def find_node_binaries(bin_dir: str | None = None) -> Path:
    """The directory ``hack/build-nodebin`` builds into (``$GPUSHARE_NODEBIN``), built on
    demand when Go is there."""
    candidate = bin_dir or os.environ.get("GPUSHARE_NODEBIN")
    if candidate:
        path = Path(candidate)
    else:
        if shutil.which("go") is None:
            raise ClusterError("Go is not installed: cannot build the node (hack/build-nodebin)")
        result = subprocess.run(
            [str(REPO / "hack" / "build-nodebin")],
            capture_output=True,
            text=True,
            check=False,
            cwd=REPO,
        )
        if result.returncode != 0:
            raise ClusterError(f"hack/build-nodebin failed:\n{result.stderr[-2000:]}")
        path = Path(result.stdout.strip().splitlines()[-1])
    missing = [name for name in NODE_BINARIES if not (path / name).is_file()]
    if missing:
        raise ClusterError(f"{path} lacks {', '.join(missing)} (hack/build-nodebin builds them)")
    return path


def node_unavailable() -> str | None:
    """Why this machine cannot run the node, or None."""
    if os.geteuid() != 0:
        return "the node runs as root (containerd, the kubelet, mknod)"
    if Path("/proc/driver/nvidia").exists():
        return "an NVIDIA driver is loaded: the node's fake device nodes would shadow real ones"
    if (
        not Path("/sys/fs/cgroup/memory").is_dir()
        and not Path("/sys/fs/cgroup/cgroup.controllers").exists()
    ):
        return "no cgroup hierarchy with a memory controller under /sys/fs/cgroup"
    if shutil.which("unshare") is None or shutil.which("nsenter") is None:
        return "unshare and nsenter (util-linux) are needed"
    return None


# -- images ------------------------------------------------------------------------


def _blob(blobs: dict[str, bytes], data: bytes) -> dict[str, Any]:
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    blobs[digest] = data
    return {"digest": digest, "size": len(data)}


def _tar_member(archive: tarfile.TarFile, name: str, *, data: bytes | None, mode: int) -> None:
    info = tarfile.TarInfo(name)
    info.mode = mode
    info.mtime = 0
    if data is None:
        info.type = tarfile.DIRTYPE
        archive.addfile(info)
    else:
        info.size = len(data)
        archive.addfile(info, io.BytesIO(data))


def image_archive(probe: Path) -> bytes:
    """An OCI image layout (as a tar) holding the harness's images, every one the probe
    binary with a different baked ``ENV``; the names ride in ``io.containerd.image.name``
    for ``ctr images import``."""
    layer_buffer = io.BytesIO()
    with tarfile.open(fileobj=layer_buffer, mode="w", format=tarfile.PAX_FORMAT) as layer:
        for directory, mode in (("etc", 0o755), ("tmp", 0o1777), ("dev", 0o755)):
            _tar_member(layer, directory, data=None, mode=mode)
        _tar_member(layer, "probe", data=probe.read_bytes(), mode=0o755)
    layer_tar = layer_buffer.getvalue()
    diff_id = "sha256:" + hashlib.sha256(layer_tar).hexdigest()
    blobs: dict[str, bytes] = {}
    layer_descriptor = {
        "mediaType": "application/vnd.oci.image.layer.v1.tar+gzip",
        **_blob(blobs, gzip.compress(layer_tar, mtime=0)),
    }
    manifests = []
    entrypoints = {name: ["/probe"] for name in IMAGES} | {PAUSE_IMAGE: ["/probe", "sleep"]}
    envs = dict(IMAGES) | {PAUSE_IMAGE: (_PATH_ENV,)}
    for name, entrypoint in entrypoints.items():
        config = {
            "architecture": "amd64",
            "os": "linux",
            "config": {"Entrypoint": entrypoint, "Env": list(envs[name])},
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        }
        config_descriptor = {
            "mediaType": "application/vnd.oci.image.config.v1+json",
            **_blob(blobs, json.dumps(config, sort_keys=True).encode()),
        }
        manifest = {
            "schemaVersion": 2,
            "mediaType": "application/vnd.oci.image.manifest.v1+json",
            "config": config_descriptor,
            "layers": [layer_descriptor],
        }
        manifests.append(
            {
                "mediaType": "application/vnd.oci.image.manifest.v1+json",
                **_blob(blobs, json.dumps(manifest, sort_keys=True).encode()),
                "platform": {"architecture": "amd64", "os": "linux"},
                "annotations": {
                    "io.containerd.image.name": name,
                    "org.opencontainers.image.ref.name": name.rsplit(":", 1)[1],
                },
            }
        )
    index = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.index.v1+json",
        "manifests": manifests,
    }
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as archive:
        _tar_member(archive, "oci-layout", data=b'{"imageLayoutVersion":"1.0.0"}', mode=0o644)
        _tar_member(archive, "index.json", data=json.dumps(index).encode(), mode=0o644)
        _tar_member(archive, "blobs", data=None, mode=0o755)
        _tar_member(archive, "blobs/sha256", data=None, mode=0o755)
        for digest, data in sorted(blobs.items()):
            _tar_member(archive, f"blobs/sha256/{digest.split(':')[1]}", data=data, mode=0o644)
    return out.getvalue()


# -- configuration -------------------------------------------------------------------


def cdi_spec() -> dict[str, Any]:
    """The static CDI spec of the fake cards: each by index and by UUID, and ``all``, as
    ``nvidia-ctk cdi generate`` names them; the control and UVM nodes go with any card."""
    devices: list[dict[str, Any]] = []
    for index, uuid in enumerate(GPU_UUIDS):
        edits = {"deviceNodes": [{"path": f"/dev/nvidia{index}"}]}
        devices.append({"name": str(index), "containerEdits": edits})
        devices.append({"name": uuid, "containerEdits": edits})
    devices.append(
        {
            "name": "all",
            "containerEdits": {
                "deviceNodes": [{"path": f"/dev/nvidia{i}"} for i in range(GPUS)],
            },
        }
    )
    return {
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": devices,
        "containerEdits": {
            "deviceNodes": [{"path": "/dev/nvidiactl"}, {"path": "/dev/nvidia-uvm"}],
        },
    }


def toolkit_config(*, profile: Profile, runc: Path, spec_dir: Path, log: Path) -> str:
    """``config.toml`` of the NVIDIA container runtime (nvidia-container-toolkit
    pkg/config: the keys and their defaults)."""
    hardened = profile == "hardened"
    return "\n".join(
        [
            # Defaults true (env honoured for unprivileged containers) and false.
            f"accept-nvidia-visible-devices-envvar-when-unprivileged = {str(not hardened).lower()}",
            f"accept-nvidia-visible-devices-as-volume-mounts = {str(hardened).lower()}",
            "",
            "[nvidia-container-runtime]",
            f'debug = "{log}"',
            'log-level = "debug"',
            'mode = "cdi"',
            f'runtimes = ["{runc}"]',
            "",
            "[nvidia-container-runtime.modes.cdi]",
            'default-kind = "nvidia.com/gpu"',
            'annotation-prefixes = ["cdi.k8s.io/"]',
            f'spec-dirs = ["{spec_dir}"]',
            "",
        ]
    )


def containerd_config(*, state: Path, bin_dir: Path, runtime: Path) -> str:
    cri_runtime = '[plugins."io.containerd.cri.v1.runtime"'
    return "\n".join(
        [
            "version = 3",
            f'root = "{state / "root"}"',
            f'state = "{state / "state"}"',
            "[grpc]",
            f'  address = "{state / "containerd.sock"}"',
            "[ttrpc]",
            f'  address = "{state / "containerd.sock.ttrpc"}"',
            '[plugins."io.containerd.grpc.v1.cri"]',
            # The streaming server for exec, attach and port-forward: loopback only.
            '  stream_server_address = "127.0.0.1"',
            '  stream_server_port = "0"',
            f"{cri_runtime}]",
            "  enable_cdi = true",
            f'  cdi_spec_dirs = ["{state / "cdi"}"]',
            # The machine has no CAP_SYS_RESOURCE: runc could not raise oom_score_adj.
            "  restrict_oom_score_adj = true",
            f"{cri_runtime}.containerd]",
            '  default_runtime_name = "nvidia"',
            f"{cri_runtime}.containerd.runtimes.nvidia]",
            '  runtime_type = "io.containerd.runc.v2"',
            f"{cri_runtime}.containerd.runtimes.nvidia.options]",
            f'  BinaryName = "{runtime}"',
            "  SystemdCgroup = false",
            f"{cri_runtime}.cni]",
            f'  bin_dirs = ["{bin_dir}"]',
            f'  conf_dir = "{state / "cni"}"',
            '[plugins."io.containerd.cri.v1.images"]',
            '  snapshotter = "overlayfs"',
            '[plugins."io.containerd.cri.v1.images".pinned_images]',
            f'  sandbox = "{PAUSE_IMAGE}"',
            "",
        ]
    )


def cni_config(state: Path) -> dict[str, Any]:
    # A bridge of the node's own, no gateway to the outside, no masquerade: pods reach
    # each other and the host, nothing beyond.
    return {
        "cniVersion": "1.0.0",
        "name": "gpushare",
        "plugins": [
            {
                "type": "bridge",
                "bridge": BRIDGE,
                "isGateway": False,
                "ipMasq": False,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{"subnet": POD_SUBNET}]],
                    "dataDir": str(state / "ipam"),
                },
            },
            {"type": "loopback"},
        ],
    }


def kubelet_config(*, state: Path, port: int, healthz_port: int) -> dict[str, Any]:
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": "127.0.0.1",
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        # The apiserver calls the kubelet (logs, exec) with no client certificate.
        "authentication": {"anonymous": {"enabled": True}, "webhook": {"enabled": False}},
        "authorization": {"mode": "AlwaysAllow"},
        "containerRuntimeEndpoint": f"unix://{state / 'containerd' / 'containerd.sock'}",
        "cgroupDriver": "cgroupfs",
        # Since 1.35 the kubelet refuses cgroup v1 unless told otherwise.
        "failCgroupV1": False,
        "failSwapOn": False,
        "cgroupRoot": f"/{CGROUP_ROOT}",
        "podLogsDir": str(state / "pods"),
        "resolvConf": "",
        # Nothing pulls: the imported images must never be collected.
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {
            "memory.available": "1Mi",
            "nodefs.available": "1%",
            "imagefs.available": "1%",
        },
        "serializeImagePulls": False,
        "registerWithTaints": [],
        "nodeStatusReportFrequency": "10s",
    }


def scheduler_config(*, kubeconfig: Path, extender_port: int) -> dict[str, Any]:
    fit_args = {
        "name": "NodeResourcesFit",
        "args": {"ignoredResources": list(_EXTENDER_RESOURCES)},
    }
    return {
        "apiVersion": "kubescheduler.config.k8s.io/v1",
        "kind": "KubeSchedulerConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "leaderElection": {"leaderElect": False},
        "profiles": [{"schedulerName": name, "pluginConfig": [fit_args]} for name in SCHEDULERS],
        # HAMi's extender (its stand-in): Filter writes the allocation, Bind binds.
        "extenders": [
            {
                "urlPrefix": f"http://127.0.0.1:{extender_port}",
                "filterVerb": "filter",
                "bindVerb": "bind",
                "nodeCacheCapable": True,
                "enableHTTPS": False,
                "managedResources": [
                    {"name": "nvidia.com/gpu", "ignoredByScheduler": False},
                    *({"name": r, "ignoredByScheduler": True} for r in _EXTENDER_RESOURCES),
                ],
            }
        ],
    }


# -- the node -------------------------------------------------------------------------


def _hierarchies() -> list[Path]:
    """The cgroup hierarchies the kubelet uses: /sys/fs/cgroup itself under cgroup v2,
    each v1 controller's mount otherwise (not a hybrid host's ``unified`` mount)."""
    top = Path("/sys/fs/cgroup")
    if (top / "cgroup.controllers").exists():
        return [top]
    return [
        hierarchy
        for hierarchy in sorted(top.iterdir())
        if (hierarchy / "cgroup.procs").exists() and hierarchy.name != "unified"
    ]


@dataclass
class _Proc:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self, lines: int = 30) -> str:
        with contextlib.suppress(OSError):
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        return ""


@dataclass
class Node:
    """A kubelet node of ``cluster`` with the node profile ``profile``."""

    cluster: DevCluster
    bin_dir: Path
    workdir: Path
    profile: Profile = "default"
    # The apiserver reaches a kubelet by its Hostname address first: "localhost" resolves
    # to loopback on every machine, where the kubelet listens (127.0.0.1 only).
    name: str = "localhost"
    processes: list[_Proc] = field(default_factory=list)
    _namespace_pid: int | None = None
    _holder: subprocess.Popen[bytes] | None = None
    _made: list[Path] = field(default_factory=list)
    _made_dirs: list[Path] = field(default_factory=list)
    _kept: set[Path] = field(default_factory=set)
    _sysctls: dict[str, str] = field(default_factory=dict)
    _bridge_existed: bool = True
    started_in: float = 0.0

    # -- paths --
    @property
    def state(self) -> Path:
        return self.workdir / "node"

    @property
    def containerd_socket(self) -> Path:
        return self.state / "containerd" / "containerd.sock"

    @property
    def kubeconfig(self) -> Path:
        return self.state / "kubeconfig"

    # -- start --
    def start(self) -> None:
        reason = node_unavailable()
        if reason is not None:
            raise ClusterError(reason)
        began = time.monotonic()
        for directory in ("containerd/cdi", "containerd/cni", "kubelet", "pods", "toolkit"):
            (self.state / directory).mkdir(parents=True, exist_ok=True)
        self.cluster.write_kubeconfig(self.kubeconfig)
        self._write_identities()
        self._prepare_host()
        self._write_configs()
        self._start_namespace()
        self._start_containerd()
        self._import_images()
        self._start_kubelet()
        self._start_standins()
        self._wait_node_ready()
        self.started_in = time.monotonic() - began

    def identity_kubeconfig(self, account: str) -> Path:
        return self.state / f"{account}.kubeconfig"

    def _write_identities(self) -> None:
        """Kubeconfigs with a token of HAMi's service accounts: the policy lets only these
        identities write HAMi's allocation annotations (``ledgers``), as in a cluster."""
        from kubernetes import client

        core: Any = client.CoreV1Api(self.cluster.api_client())
        rbac: Any = client.RbacAuthorizationV1Api(self.cluster.api_client())
        for account in STANDIN_ACCOUNTS:
            with contextlib.suppress(client.ApiException):
                core.create_namespaced_service_account(
                    "kube-system", {"metadata": {"name": account}}
                )
            with contextlib.suppress(client.ApiException):
                # HAMi's charts grant less; the stand-ins need only pods, nodes, bindings.
                rbac.create_cluster_role_binding(
                    {
                        "metadata": {"name": f"gpushare-node-{account}"},
                        "roleRef": {
                            "apiGroup": "rbac.authorization.k8s.io",
                            "kind": "ClusterRole",
                            "name": "cluster-admin",
                        },
                        "subjects": [
                            {"kind": "ServiceAccount", "name": account, "namespace": "kube-system"}
                        ],
                    }
                )
            token = core.create_namespaced_service_account_token(
                account, "kube-system", {"spec": {"expirationSeconds": 7 * 24 * 3600}}
            ).status.token
            config = self.cluster.kubeconfig()
            config["users"] = [{"name": "admin", "user": {"token": token}}]
            self.identity_kubeconfig(account).write_text(yaml.safe_dump(config))
            self.identity_kubeconfig(account).chmod(0o600)

    def _prepare_host(self) -> None:
        with contextlib.suppress(OSError):
            for line in Path("/proc/devices").read_text().splitlines():
                parts = line.split()
                if len(parts) == 2 and parts[0] == str(UVM_MAJOR):
                    raise ClusterError(f"character major {UVM_MAJOR} is taken: {line}")
        nodes = [(f"nvidia{i}", NVIDIA_MAJOR, i) for i in range(GPUS)]
        nodes += [("nvidiactl", NVIDIA_MAJOR, 255), ("nvidia-uvm", UVM_MAJOR, 0)]
        for name, major, minor in nodes:
            path = Path("/dev") / name
            if path.exists():
                continue
            os.mknod(path, 0o666 | stat.S_IFCHR, os.makedev(major, minor))
            # As the driver makes them: any process may open a GPU node (the device
            # cgroup decides); these ones give ENXIO.
            os.chmod(path, 0o666)  # noqa: S103  # as /dev/nvidia* are on a GPU node
            self._made.append(path)
        # Directories this node makes go again on stop; in ones that were there, only what
        # it adds (the device plugin's per-container directories, the sockets).
        for directory in (HOOK_PATH, DEVICE_PLUGIN_DIR.parent):
            if not directory.exists():
                self._made_dirs.append(directory)
        containers = HOOK_PATH / "containers"
        self._kept = set(containers.iterdir()) if containers.is_dir() else set()
        self._kept |= set(DEVICE_PLUGIN_DIR.iterdir()) if DEVICE_PLUGIN_DIR.is_dir() else set()
        HOOK_PATH.mkdir(parents=True, exist_ok=True)
        library = HOOK_PATH / "libvgpu.so"
        if not library.exists():
            # A stand-in: HAMi-core needs CUDA's driver library, which no CI machine has.
            # The probe is static, so nothing loads it; it only has to be there.
            library.write_bytes(b"")
            self._made.append(library)
        preload = HOOK_PATH / "ld.so.preload"
        if not preload.exists():
            # HAMi's (charts/hami: the device plugin's init copies it to the hook path).
            preload.write_text(f"{library}\n")
            self._made.append(preload)
        LOCK_DIR.mkdir(mode=0o777, exist_ok=True)
        # What an MPS control daemon makes on an MPS node (the injected hostPath is of
        # type Directory: without it an MPS pod does not start).
        MPS_PIPE_DIR.mkdir(mode=0o755, exist_ok=True)
        control = MPS_PIPE_DIR / "control"
        if not control.exists():
            # The daemon's control socket there (nvidia-cuda-mps-control(1): its Unix
            # sockets live in the pipe directory); nothing listens on this one.
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
                listener.bind(str(control))
            self._made.append(control)
        DEVICE_PLUGIN_DIR.mkdir(parents=True, exist_ok=True)
        for key in _KUBELET_SYSCTLS:
            with contextlib.suppress(OSError):
                self._sysctls[key] = (Path("/proc/sys") / key).read_text().strip()
        self._bridge_existed = Path(f"/sys/class/net/{BRIDGE}").exists()
        self._make_cgroups()

    def _make_cgroups(self) -> None:
        # The kubelet wants its cgroupRoot in every hierarchy before it starts.
        for hierarchy in _hierarchies():
            root = hierarchy / CGROUP_ROOT
            root.mkdir(exist_ok=True)
            if hierarchy.name == "cpuset":
                for key in ("cpuset.cpus", "cpuset.mems"):
                    (root / key).write_text((hierarchy / key).read_text())

    def _write_configs(self) -> None:
        containerd = self.state / "containerd"
        runtime = self.state / "toolkit" / "nvidia-container-runtime"
        toolkit = self.state / "toolkit" / "config.toml"
        toolkit.write_text(
            toolkit_config(
                profile=self.profile,
                runc=self.bin_dir / "runc",
                spec_dir=containerd / "cdi",
                log=self.state / "toolkit" / "runtime.log",
            )
        )
        # As nvidia-ctk-installer wraps the runtime (cmd/nvidia-ctk-installer/toolkit/
        # installer/executables.go: NVIDIA_CTK_CONFIG_FILE_PATH), so that the profile's
        # config is read instead of /etc/nvidia-container-runtime/config.toml.
        runtime.write_text(
            "#!/bin/sh\n"
            f'NVIDIA_CTK_CONFIG_FILE_PATH="{toolkit}" exec "{self.bin_dir / "nvidia-container-runtime"}" "$@"\n'
        )
        runtime.chmod(0o755)
        (containerd / "config.toml").write_text(
            containerd_config(state=containerd, bin_dir=self.bin_dir, runtime=runtime)
        )
        (containerd / "cdi" / "nvidia.yaml").write_text(yaml.safe_dump(cdi_spec()))
        (containerd / "cni" / "10-gpushare.conflist").write_text(
            json.dumps(cni_config(self.state), indent=1)
        )

    def _start_namespace(self) -> None:
        # A mount and PID namespace that holds every process of the node: its PID 1
        # ending ends them all, and their mounts go with the mount namespace.
        log = (self.state / "namespace.log").open("ab")
        self._holder = subprocess.Popen(
            [
                "unshare",
                "--mount",
                "--pid",
                "--fork",
                "--mount-proc",
                "--propagation",
                "private",
                "sleep",
                "infinity",
            ],
            stdout=log,
            stderr=log,
        )
        log.close()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            children = Path(f"/proc/{self._holder.pid}/task/{self._holder.pid}/children")
            with contextlib.suppress(OSError, ValueError):
                pids = children.read_text().split()
                if pids:
                    self._namespace_pid = int(pids[0])
                    return
            time.sleep(0.05)
        raise ClusterError("unshare did not start its namespace")

    def _spawn(
        self, name: str, argv: Sequence[str], *, env: Mapping[str, str] | None = None
    ) -> _Proc:
        assert self._namespace_pid is not None
        log = self.state / f"{name}.log"
        handle = log.open("ab")
        environment = dict(os.environ)
        environment["PATH"] = f"{self.bin_dir}:{environment.get('PATH', '/usr/bin:/bin')}"
        environment.update(env or {})
        popen = subprocess.Popen(
            ["nsenter", "-t", str(self._namespace_pid), "-m", "-p", "--", *argv],
            stdout=handle,
            stderr=handle,
            env=environment,
            cwd=self.state,
        )
        handle.close()
        process = _Proc(name, popen, log)
        self.processes.append(process)
        return process

    def _wait(
        self, what: str, process: _Proc, ready: Any, *, timeout: float = _READY_TIMEOUT
    ) -> None:
        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            if not process.alive():
                raise ClusterError(f"{process.name} exited:\n{process.tail()}")
            try:
                if ready():
                    return
            except Exception as exc:  # not ready yet, whatever the reason
                last = exc
            time.sleep(0.1)
        raise ClusterError(f"{what} not ready in {timeout:.0f}s ({last!r}):\n{process.tail()}")

    def _start_containerd(self) -> None:
        containerd = self._spawn(
            "containerd",
            [
                str(self.bin_dir / "containerd"),
                "--config",
                str(self.state / "containerd" / "config.toml"),
            ],
        )
        self._wait("containerd", containerd, lambda: self.ctr("version").returncode == 0)

    def ctr(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                str(self.bin_dir / "ctr"),
                "--address",
                str(self.containerd_socket),
                "-n",
                "k8s.io",
                *args,
            ],
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )

    def crictl(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [
                str(self.bin_dir / "crictl"),
                "--runtime-endpoint",
                f"unix://{self.containerd_socket}",
                "--image-endpoint",
                f"unix://{self.containerd_socket}",
                *args,
            ],
            capture_output=True,
            text=True,
            check=False,
            timeout=120,
        )

    def _import_images(self) -> None:
        archive = self.state / "images.tar"
        archive.write_bytes(image_archive(self.bin_dir / "gpushare-probe"))
        result = self.ctr("images", "import", "--no-unpack=false", str(archive))
        if result.returncode != 0:
            result = self.ctr("images", "import", str(archive))
        if result.returncode != 0:
            raise ClusterError(f"ctr images import failed:\n{result.stderr}")

    def _start_kubelet(self) -> None:
        config = self.state / "kubelet" / "config.yaml"
        config.write_text(
            yaml.safe_dump(
                kubelet_config(state=self.state, port=free_port(), healthz_port=free_port())
            )
        )
        labels = ",".join(f"{k}={v}" for k, v in NODE_LABELS.items())
        self._spawn(
            "kubelet",
            [
                str(self.bin_dir / "kubelet"),
                f"--config={config}",
                f"--kubeconfig={self.kubeconfig}",
                f"--root-dir={self.state / 'kubelet'}",
                f"--cert-dir={self.state / 'kubelet' / 'pki'}",
                f"--node-labels={labels}",
                f"--hostname-override={self.name}",
                "--v=2",
            ],
        )

    def _start_standins(self) -> None:
        port_file = self.state / "extender.port"
        extender = self._spawn(
            "scheduler-extender",
            [
                str(self.bin_dir / "gpushare-scheduler-extender"),
                f"--kubeconfig={self.identity_kubeconfig('hami-scheduler')}",
                f"--port-file={port_file}",
                f"--gpus={GPUS}",
                f"--memory={CARD_MEMORY_MIB}",
            ],
        )
        self._wait("the scheduler extender", extender, lambda: port_file.read_text().strip() != "")
        scheduler_file = self.state / "scheduler.yaml"
        scheduler_file.write_text(
            yaml.safe_dump(
                scheduler_config(
                    kubeconfig=self.kubeconfig, extender_port=int(port_file.read_text())
                )
            )
        )
        self._spawn(
            "kube-scheduler",
            [
                str(self.bin_dir / "kube-scheduler"),
                f"--config={scheduler_file}",
                "--bind-address=127.0.0.1",
                f"--secure-port={free_port()}",
                "--v=2",
            ],
        )
        strategy = "envvar" if self.profile == "default" else "volume-mounts"
        self._spawn(
            "device-plugin",
            [
                str(self.bin_dir / "gpushare-device-plugin"),
                "--flavour=hami",
                f"--strategy={strategy}",
                f"--gpus={GPUS}",
                f"--memory={CARD_MEMORY_MIB}",
                f"--kubeconfig={self.identity_kubeconfig('hami-device-plugin')}",
                f"--node-name={self.name}",
                f"--hook-path={HOOK_PATH.parent}",
            ],
        )
        self._start_nvidia_plugin(strategy)

    @property
    def mps_root(self) -> Path:
        """The host root of NVIDIA's MPS daemon (its chart's ``mps.root``)."""
        return self.state / "mps"

    def _start_nvidia_plugin(self, strategy: str) -> None:
        # What NVIDIA's MPS control daemon makes before the plugin serves (root.go:40-48):
        # the resource's pipe directory and the shared shm.
        for directory in (self.mps_root / SHARED_RESOURCE / "pipe", self.mps_root / "shm"):
            directory.mkdir(parents=True, exist_ok=True)
        self._spawn(
            "nvidia-device-plugin",
            [
                str(self.bin_dir / "gpushare-device-plugin"),
                "--flavour=nvidia",
                f"--strategy={strategy}",
                f"--resource={SHARED_RESOURCE}",
                f"--gpus={GPUS}",
                f"--mps-root={self.mps_root}",
            ],
        )

    def _wait_node_ready(self) -> None:
        from kubernetes import client

        core: Any = client.CoreV1Api(self.cluster.api_client())
        kubelet = next(p for p in self.processes if p.name == "kubelet")

        def ready() -> bool:
            node = core.read_node(self.name)
            conditions = {c.type: c.status for c in node.status.conditions or ()}
            allocatable = node.status.allocatable or {}
            return bool(
                conditions.get("Ready") == "True"
                and int(allocatable.get("nvidia.com/gpu", "0")) > 0
                and int(allocatable.get(SHARED_RESOURCE, "0")) > 0
                and "hami.io/node-nvidia-register" in (node.metadata.annotations or {})
            )

        self._wait("the node", kubelet, ready)
        # No controller-manager runs here to lift the not-ready taint once Ready.
        node = core.read_node(self.name)
        taints = [t for t in node.spec.taints or () if t.key != "node.kubernetes.io/not-ready"]
        core.patch_node(self.name, {"spec": {"taints": taints or None}})

    # -- stop --
    def exited(self) -> list[str]:
        """The node's processes that are no longer running."""
        return [p.name for p in self.processes if not p.alive()]

    def stop(self) -> None:
        from kubernetes import client

        with contextlib.suppress(Exception):
            # Pods first, while the kubelet runs: their volumes and sandboxes go cleanly.
            self.crictl("rmp", "--force", "--all")
        for process in reversed(self.processes):
            if process.alive():
                process.popen.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.popen.wait(_STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                process.popen.kill()
                process.popen.wait()
        self.processes.clear()
        if self._holder is not None:
            # PID 1 of the namespace: the kernel ends every process left in it.
            if self._namespace_pid is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(self._namespace_pid, signal.SIGKILL)
            self._holder.wait(_STOP_TIMEOUT)
            self._holder = None
        self._remove_cgroups()
        if not self._bridge_existed:
            subprocess.run(["ip", "link", "delete", BRIDGE], capture_output=True, check=False)
        for path in reversed(self._made):
            with contextlib.suppress(OSError):
                path.unlink()
        self._made.clear()
        for directory in (HOOK_PATH / "containers", DEVICE_PLUGIN_DIR):
            for entry in directory.iterdir() if directory.is_dir() else ():
                if entry not in self._kept:
                    if entry.is_dir() and not entry.is_symlink():
                        shutil.rmtree(entry, ignore_errors=True)
                    else:
                        with contextlib.suppress(OSError):
                            entry.unlink()
        for directory in self._made_dirs:
            shutil.rmtree(directory, ignore_errors=True)
        self._made_dirs.clear()
        for key, value in self._sysctls.items():
            with contextlib.suppress(OSError):
                (Path("/proc/sys") / key).write_text(value)
        with contextlib.suppress(Exception):
            client.CoreV1Api(self.cluster.api_client()).delete_node(self.name)

    def _remove_cgroups(self) -> None:
        for hierarchy in _hierarchies():
            root = hierarchy / CGROUP_ROOT
            if not root.is_dir():
                continue
            for directory in sorted(root.glob("**/"), key=lambda p: len(p.parts), reverse=True):
                with contextlib.suppress(OSError):
                    directory.rmdir()


@contextlib.contextmanager
def node_running(
    cluster: DevCluster, *, bin_dir: Path, workdir: Path, profile: Profile = "default"
) -> Iterator[Node]:
    node = Node(cluster=cluster, bin_dir=bin_dir, workdir=workdir, profile=profile)
    try:
        node.start()
        yield node
    finally:
        node.stop()


def random_suffix() -> str:
    return secrets.token_hex(3)
