"""Attacks that exist only through a real apiserver, made by a hostile tenant.

The tenant is ``alice`` with edit rights in one namespace, reached by impersonation
(``kubectl --as``), as are HAMi's scheduler and device plugin service accounts. What is
checked is what the apiserver stored or refused: pod UPDATEs of reserved annotations,
CDI annotations added by an update, ephemeral containers (``kubectl debug``), workload
templates (Deployment, ReplicationController) refused at apply time, sidecar quota, and
the audit records of the denials. The webhook registrations come from ``deploy/``.
"""

from __future__ import annotations

import contextlib
import re
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

import orjson
import pytest
import yaml

from webhook.dev.cluster import DevCluster

pytestmark = pytest.mark.e2e

Obj = dict[str, Any]

TENANT: Final = "alice"
SCHEDULER: Final = "system:serviceaccount:kube-system:hami-scheduler"
DEVICE_PLUGIN: Final = "system:serviceaccount:kube-system:hami-device-plugin"
GPU_UUID: Final = "GPU-5fd4c8a1-3f1e-9b2c-1d2e-aa33bb44cc55"
# What HAMi's scheduler writes on a pod it places (then its device plugin).
ALLOCATION: Final[dict[str, str]] = {
    "hami.io/vgpu-node": "gpu-node-1",
    "hami.io/vgpu-time": "1732312345",
    "hami.io/vgpu-devices-to-allocate": f"{GPU_UUID},NVIDIA,3000,30:;",
    "hami.io/vgpu-devices-allocated": f"{GPU_UUID},NVIDIA,3000,30:;",
    "hami.io/bind-phase": "allocating",
    "hami.io/bind-time": "1732312345",
}
DENIED: Final = re.compile(
    r'admission webhook "(?:mutate|validate)\.gpushare\.io" denied the request'
)


# -- kubectl as anyone -----------------------------------------------------------------


class Kubectl:
    """kubectl against the dev cluster, as its admin or as an impersonated identity."""

    def __init__(self, binary: Path, kubeconfig: Path) -> None:
        self.binary = binary
        self.kubeconfig = kubeconfig

    def __call__(
        self, *args: str, user: str | None = None, stdin: str | None = None
    ) -> subprocess.CompletedProcess[str]:
        argv = [str(self.binary), "--kubeconfig", str(self.kubeconfig)]
        if user is not None:
            argv.append(f"--as={user}")
        return subprocess.run(
            [*argv, *args], input=stdin, capture_output=True, text=True, timeout=60, check=False
        )

    def ok(self, *args: str, user: str | None = None, stdin: str | None = None) -> str:
        result = self(*args, user=user, stdin=stdin)
        assert result.returncode == 0, result.stderr
        return result.stdout

    def apply(self, obj: Obj, *, user: str | None = None) -> subprocess.CompletedProcess[str]:
        return self("apply", "-f", "-", user=user, stdin=orjson.dumps(obj).decode())

    def get(self, kind: str, name: str, namespace: str) -> Obj:
        text = self.ok("get", kind, name, "-n", namespace, "-o", "json")
        result: Obj = orjson.loads(text)
        return result


@pytest.fixture(scope="module")
def kubectl(
    cluster: DevCluster, bin_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Kubectl:
    binary = bin_dir / "kubectl"
    if not binary.exists():
        pytest.fail(f"{binary} missing: hack/build-testbin builds it with the control plane")
    kubeconfig = tmp_path_factory.mktemp("kubectl") / "kubeconfig"
    cluster.write_kubeconfig(kubeconfig)
    return Kubectl(binary, kubeconfig)


TENANT_RULES: Final[list[Obj]] = [
    {
        "apiGroups": [""],
        "resources": ["pods", "replicationcontrollers", "serviceaccounts"],
        "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
    },
    {
        "apiGroups": [""],
        "resources": ["pods/ephemeralcontainers"],
        "verbs": ["get", "update", "patch"],
    },
    {
        "apiGroups": ["apps"],
        "resources": ["deployments"],
        "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
    },
]


def grant(kubectl: Kubectl, namespace: str, rules: list[Obj], subjects: list[Obj]) -> None:
    """A Role ``tenant`` of ``rules`` in ``namespace``, bound to ``subjects``."""
    role: Obj = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "tenant", "namespace": namespace},
        "rules": rules,
    }
    binding: Obj = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding",
        "metadata": {"name": "tenant", "namespace": namespace},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "tenant"},
        "subjects": subjects,
    }
    for obj in (role, binding):
        result = kubectl.apply(obj)
        assert result.returncode == 0, result.stderr


@pytest.fixture
def tenancy(cluster: DevCluster, kubectl: Kubectl) -> str:
    """A fresh namespace where alice has a tenant's edit rights, and HAMi's scheduler and
    device plugin service accounts may patch pods (as HAMi's chart lets them).

    No controller-manager runs here to aggregate the built-in ``edit`` role, so the
    rights are spelled out. (Parametrized ids make poor namespace names: a short
    random one instead.)"""
    namespace = f"bypass-{uuid.uuid4().hex[:10]}"
    cluster.create_namespace(namespace)
    subjects = [
        {"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": TENANT},
        {"kind": "ServiceAccount", "name": "hami-scheduler", "namespace": "kube-system"},
        {"kind": "ServiceAccount", "name": "hami-device-plugin", "namespace": "kube-system"},
        # What a tenant can make in its own namespace: an account named like HAMi's.
        {"kind": "ServiceAccount", "name": "hami-scheduler", "namespace": namespace},
    ]
    grant(kubectl, namespace, TENANT_RULES, subjects)
    return namespace


# -- objects ---------------------------------------------------------------------------

GPU_LIMITS: Final = {
    "nvidia.com/gpu": "1",
    "nvidia.com/gpumem": "3000",
    "nvidia.com/gpucores": "30",
}


def container(name: str, limits: dict[str, str] | None = None, **extra: Any) -> Obj:
    result: Obj = {"name": name, "image": "busybox:1.36", "command": ["sleep", "3600"]}
    if limits:
        result["resources"] = {"limits": dict(limits)}
    result.update(extra)
    return result


def pod(name: str, namespace: str, *containers: Obj, **spec: Any) -> Obj:
    annotations = spec.pop("annotations", None)
    metadata: Obj = {"name": name, "namespace": namespace}
    if annotations:
        metadata["annotations"] = annotations
    body: Obj = {"containers": list(containers) or [container("main", GPU_LIMITS)], **spec}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": body}


def template_of(obj: Obj) -> Obj:
    inner: Obj = {"metadata": {"labels": {"app": "a"}}, "spec": obj["spec"]}
    annotations = obj["metadata"].get("annotations")
    if annotations:
        inner["metadata"]["annotations"] = annotations
    return inner


def workload(kind: str, template: Obj, namespace: str) -> Obj:
    metadata = {"name": "w", "namespace": namespace}
    if kind == "ReplicationController":
        spec: Obj = {"replicas": 1, "selector": {"app": "a"}, "template": template_of(template)}
        return {"apiVersion": "v1", "kind": kind, "metadata": metadata, "spec": spec}
    spec = {
        "replicas": 1,
        "selector": {"matchLabels": {"app": "a"}},
        "template": template_of(template),
    }
    return {"apiVersion": "apps/v1", "kind": kind, "metadata": metadata, "spec": spec}


def assert_refused(result: subprocess.CompletedProcess[str], rule: str) -> None:
    """kubectl failed because one of our webhooks denied it for ``rule``."""
    assert result.returncode != 0, f"admitted: {result.stdout}"
    assert DENIED.search(result.stderr), result.stderr
    assert f"[{rule}]" in result.stderr, result.stderr


def annotations_of(kubectl: Kubectl, name: str, namespace: str) -> dict[str, str]:
    found: dict[str, str] = kubectl.get("pod", name, namespace)["metadata"].get("annotations", {})
    return found


def pending_pod(
    kubectl: Kubectl, namespace: str, name: str = "victim", *containers: Obj, **spec: Any
) -> None:
    """A GPU pod created by the tenant, mutated and stored; Pending (no scheduler runs)."""
    result = kubectl.apply(pod(name, namespace, *containers, **spec), user=TENANT)
    assert result.returncode == 0, result.stderr


def annotate(
    kubectl: Kubectl, namespace: str, *changes: str, user: str, name: str = "victim"
) -> subprocess.CompletedProcess[str]:
    return kubectl("annotate", "pod", name, "-n", namespace, "--overwrite", *changes, user=user)


# ======================================================================================
# F1 forged annotations after create
# ======================================================================================


@pytest.mark.parametrize("key", sorted(ALLOCATION))
def test_tenant_cannot_annotate_a_pending_pod_with_allocation_keys(
    kubectl: Kubectl, tenancy: str, key: str
) -> None:
    pending_pod(kubectl, tenancy)
    assert_refused(
        annotate(kubectl, tenancy, f"{key}={ALLOCATION[key]}", user=TENANT), "forged-allocation"
    )
    assert key not in annotations_of(kubectl, "victim", tenancy)


def test_tenant_cannot_change_or_remove_what_the_scheduler_wrote(
    kubectl: Kubectl, tenancy: str
) -> None:
    pending_pod(kubectl, tenancy)
    written = [f"{k}={v}" for k, v in ALLOCATION.items()]
    assert annotate(kubectl, tenancy, *written, user=SCHEDULER).returncode == 0
    bigger = f"hami.io/vgpu-devices-allocated={GPU_UUID},NVIDIA,81920,100:;"
    assert_refused(annotate(kubectl, tenancy, bigger, user=TENANT), "forged-allocation")
    assert_refused(
        annotate(kubectl, tenancy, "hami.io/bind-phase-", user=TENANT), "forged-allocation"
    )
    assert_refused(
        annotate(kubectl, tenancy, "hami.io/vgpu-node=gpu-node-9", user=TENANT), "forged-allocation"
    )
    stored = annotations_of(kubectl, "victim", tenancy)
    assert {k: stored.get(k) for k in ALLOCATION} == ALLOCATION


def test_scheduler_and_device_plugin_write_allocation_annotations(
    kubectl: Kubectl, tenancy: str
) -> None:
    pending_pod(kubectl, tenancy)
    written = [f"{k}={v}" for k, v in ALLOCATION.items()]
    result = annotate(kubectl, tenancy, *written, user=SCHEDULER)
    assert result.returncode == 0, result.stderr
    result = annotate(
        kubectl,
        tenancy,
        "hami.io/bind-phase=success",
        "hami.io/vgpu-devices-to-allocate-",
        user=DEVICE_PLUGIN,
    )
    assert result.returncode == 0, result.stderr
    stored = annotations_of(kubectl, "victim", tenancy)
    assert stored["hami.io/bind-phase"] == "success"
    assert "hami.io/vgpu-devices-to-allocate" not in stored
    assert stored["hami.io/vgpu-devices-allocated"] == ALLOCATION["hami.io/vgpu-devices-allocated"]


def test_an_account_named_like_the_scheduler_in_the_tenants_namespace_is_not_a_writer(
    kubectl: Kubectl, tenancy: str
) -> None:
    # Edit rights include creating service accounts: the tenant makes its own hami-scheduler.
    kubectl.ok("create", "serviceaccount", "hami-scheduler", "-n", tenancy, user=TENANT)
    pending_pod(kubectl, tenancy)
    lookalike = f"system:serviceaccount:{tenancy}:hami-scheduler"
    key = "hami.io/vgpu-devices-allocated"
    assert_refused(
        annotate(kubectl, tenancy, f"{key}={ALLOCATION[key]}", user=lookalike), "forged-allocation"
    )


def test_tenant_may_still_label_and_annotate_a_placed_pod(kubectl: Kubectl, tenancy: str) -> None:
    pending_pod(kubectl, tenancy)
    written = [f"{k}={v}" for k, v in ALLOCATION.items()]
    assert annotate(kubectl, tenancy, *written, user=SCHEDULER).returncode == 0
    kubectl.ok("label", "pod", "victim", "-n", tenancy, "team=ml", user=TENANT)
    assert annotate(kubectl, tenancy, "owner=alice", user=TENANT).returncode == 0


@pytest.mark.parametrize("gpu", [True, False], ids=["gpu-pod", "plain-pod"])
def test_cdi_annotation_added_by_update_is_refused(
    kubectl: Kubectl, tenancy: str, gpu: bool
) -> None:
    # A pending pod that asked for a slice, or for nothing, would get whole cards.
    if gpu:
        pending_pod(kubectl, tenancy)
    else:
        pending_pod(kubectl, tenancy, "victim", container("app"))
    for value in ("nvidia.com/gpu=all", "management.nvidia.com/gpu=all"):
        result = annotate(kubectl, tenancy, f"cdi.k8s.io/devices={value}", user=TENANT)
        assert_refused(result, "host-device-access")
    assert "cdi.k8s.io/devices" not in annotations_of(kubectl, "victim", tenancy)


# ======================================================================================
# F2/F3/F4 through kubectl debug: ephemeral containers
# ======================================================================================

DEBUG_ATTACKS: Final[dict[str, tuple[list[str], Obj | None, str]]] = {
    # (kubectl debug flags, --custom container fields, rule)
    "writable-library": (
        [],
        {"volumeMounts": [{"name": "gpushare-vgpu-lib", "mountPath": "/hook"}]},
        "host-device-access",
    ),
    "library-readonly-false": (
        [],
        {
            "volumeMounts": [
                {
                    "name": "gpushare-vgpu-lib",
                    "mountPath": "/usr/local/vgpu/libvgpu.so",
                    "readOnly": False,
                }
            ]
        },
        "host-device-access",
    ),
    "device-request-mount": (
        [],
        {
            "volumeMounts": [
                {
                    "name": "gpushare-vgpu-lock",
                    "mountPath": "/var/run/nvidia-container-devices/all",
                }
            ]
        },
        "host-device-access",
    ),
    "device-request-mount-spelled": (
        [],
        {
            "volumeMounts": [
                {
                    "name": "gpushare-vgpu-lock",
                    "mountPath": "/var/run/../run/nvidia-container-devices/all",
                }
            ]
        },
        "host-device-access",
    ),
    "cuda-redirect": (
        ["--env=CUDA_REDIRECT=/usr/lib/x86_64-linux-gnu/libcuda.so.1"],
        None,
        "limit-tampering",
    ),
    "oom-killer-off": (["--env=ACTIVE_OOM_KILLER=false"], None, "limit-tampering"),
    "core-policy-disable": (["--env=GPU_CORE_UTILIZATION_POLICY=disable"], None, "limit-tampering"),
    "privileged": (["--profile=sysadmin"], None, "privileged-gpu"),
}


def debug(
    kubectl: Kubectl,
    namespace: str,
    flags: list[str],
    custom: Obj | None,
    tmp_path: Path,
    *,
    name: str = "victim",
) -> subprocess.CompletedProcess[str]:
    """`kubectl debug` as the tenant: an ephemeral container in the running pod."""
    args = ["debug", f"pod/{name}", "-n", namespace, "--image=busybox:1.36", "--container=dbg"]
    if not any(f.startswith("--profile") for f in flags):
        args.append("--profile=general")
    if custom is not None:
        path = tmp_path / "custom.json"
        path.write_bytes(orjson.dumps(custom))
        args.append(f"--custom={path}")
    return kubectl(*args, *flags, user=TENANT)


def ephemeral_names(kubectl: Kubectl, namespace: str, name: str = "victim") -> list[str]:
    spec = kubectl.get("pod", name, namespace)["spec"]
    return [c["name"] for c in spec.get("ephemeralContainers", [])]


@pytest.mark.parametrize("attack", sorted(DEBUG_ATTACKS))
def test_kubectl_debug_attacks_are_refused(
    kubectl: Kubectl, tenancy: str, tmp_path: Path, attack: str
) -> None:
    pending_pod(kubectl, tenancy)
    flags, custom, rule = DEBUG_ATTACKS[attack]
    assert_refused(debug(kubectl, tenancy, flags, custom, tmp_path), rule)
    assert ephemeral_names(kubectl, tenancy) == []


def test_kubectl_debug_used_as_intended_is_allowed(
    kubectl: Kubectl, tenancy: str, tmp_path: Path
) -> None:
    pending_pod(kubectl, tenancy)
    read_only = {
        "volumeMounts": [{"name": "gpushare-vgpu-lib", "mountPath": "/hook", "readOnly": True}]
    }
    result = debug(kubectl, tenancy, [], read_only, tmp_path)
    assert result.returncode == 0, result.stderr
    assert ephemeral_names(kubectl, tenancy) == ["dbg"]


def test_debug_container_in_a_plain_pod_cannot_ask_the_runtime_for_gpus(
    kubectl: Kubectl, tenancy: str, tmp_path: Path
) -> None:
    # The pod asks for no GPU; the debugger mounts the pod's own emptyDir where the NVIDIA
    # runtime reads device requests from.
    app = container("app", volumeMounts=[{"name": "scratch", "mountPath": "/scratch"}])
    pending_pod(kubectl, tenancy, "plain", app, volumes=[{"name": "scratch", "emptyDir": {}}])
    custom = {
        "volumeMounts": [{"name": "scratch", "mountPath": "/var/run/nvidia-container-devices/all"}]
    }
    assert_refused(
        debug(kubectl, tenancy, [], custom, tmp_path, name="plain"), "host-device-access"
    )
    assert ephemeral_names(kubectl, tenancy, "plain") == []


def test_ephemeral_container_writing_the_mps_pipe_is_refused(
    kubectl: Kubectl, tenancy: str
) -> None:
    pending_pod(kubectl, tenancy, annotations={"gpushare.io/mode": "mps"})
    patch = {
        "spec": {
            "ephemeralContainers": [
                {
                    "name": "dbg",
                    "image": "busybox:1.36",
                    "volumeMounts": [{"name": "gpushare-mps-pipe", "mountPath": "/tmp/nvidia-mps"}],
                }
            ]
        }
    }
    result = kubectl(
        "patch",
        "pod",
        "victim",
        "-n",
        tenancy,
        "--subresource=ephemeralcontainers",
        "--type=strategic",
        "-p",
        orjson.dumps(patch).decode(),
        user=TENANT,
    )
    assert_refused(result, "host-device-access")
    assert ephemeral_names(kubectl, tenancy) == []


# ======================================================================================
# F2..F6 in templates, refused when applied
# ======================================================================================


def _shapes(namespace: str) -> dict[str, tuple[Obj, str]]:
    device_request = {"name": "req", "mountPath": "/var/run/nvidia-container-devices/all"}
    return {
        "privileged": (
            pod(
                "t", namespace, container("main", GPU_LIMITS, securityContext={"privileged": True})
            ),
            "privileged-gpu",
        ),
        "forged-annotation": (
            pod(
                "t",
                namespace,
                annotations={
                    "hami.io/vgpu-devices-allocated": ALLOCATION["hami.io/vgpu-devices-allocated"]
                },
            ),
            "forged-allocation",
        ),
        "writable-injected-mount": (
            pod(
                "t",
                namespace,
                container("main", GPU_LIMITS),
                container(
                    "sidecar", volumeMounts=[{"name": "gpushare-vgpu-lib", "mountPath": "/hook"}]
                ),
                volumes=[
                    {
                        "name": "gpushare-vgpu-lib",
                        "hostPath": {"path": "/usr/local/vgpu/libvgpu.so", "type": "File"},
                    }
                ],
            ),
            "host-device-access",
        ),
        "kubelet-host-path": (
            pod(
                "t",
                namespace,
                container(
                    "main",
                    GPU_LIMITS,
                    volumeMounts=[{"name": "k", "mountPath": "/k", "readOnly": True}],
                ),
                volumes=[{"name": "k", "hostPath": {"path": "/var/lib/kubelet/pod-resources"}}],
            ),
            "host-device-access",
        ),
        "runtime-socket": (
            pod(
                "t",
                namespace,
                container("app", volumeMounts=[{"name": "s", "mountPath": "/run/containerd.sock"}]),
                volumes=[{"name": "s", "hostPath": {"path": "/run/containerd/containerd.sock"}}],
            ),
            "host-device-access",
        ),
        "device-request-mount": (
            pod(
                "t",
                namespace,
                container("app", volumeMounts=[device_request]),
                volumes=[{"name": "req", "emptyDir": {}}],
            ),
            "host-device-access",
        ),
        # Default-deny, files: a mount where the GPU stack reads inside the container.
        "preload-shadow": (
            pod(
                "t",
                namespace,
                container(
                    "main",
                    GPU_LIMITS,
                    volumeMounts=[{"name": "p", "mountPath": "/etc/ld.so.preload", "subPath": "x"}],
                ),
                volumes=[{"name": "p", "configMap": {"name": "preload"}}],
            ),
            "host-device-access",
        ),
        "override-env": (
            pod(
                "t",
                namespace,
                container("app", volumeMounts=[{"name": "o", "mountPath": "//overrideEnv"}]),
                volumes=[{"name": "o", "emptyDir": {}}],
            ),
            "host-device-access",
        ),
        "device-request-prefix": (
            pod(
                "t",
                namespace,
                container(
                    "app",
                    volumeMounts=[
                        {"name": "r", "mountPath": "/var/run/nvidia-container-devicesall"}
                    ],
                ),
                volumes=[{"name": "r", "emptyDir": {}}],
            ),
            "host-device-access",
        ),
        # Default-deny, annotations runtimes copy into the OCI spec.
        "cdi-bare-name": (
            pod("t", namespace, container("app"), annotations={"cdi.k8s.io/devices": "all"}),
            "host-device-access",
        ),
        "crio-devices": (
            pod(
                "t",
                namespace,
                container("app"),
                annotations={"io.kubernetes.cri-o.Devices": "/dev/nvidia0"},
            ),
            "host-device-access",
        ),
        "cuda-redirect": (
            pod(
                "t",
                namespace,
                container(
                    "main", GPU_LIMITS, env=[{"name": "CUDA_REDIRECT", "value": "libcuda.so.1"}]
                ),
            ),
            "limit-tampering",
        ),
        "oom-killer-off": (
            pod(
                "t",
                namespace,
                container("main", GPU_LIMITS, env=[{"name": "ACTIVE_OOM_KILLER", "value": "0"}]),
            ),
            "limit-tampering",
        ),
    }


SHAPES: Final = (
    "privileged",
    "forged-annotation",
    "writable-injected-mount",
    "kubelet-host-path",
    "runtime-socket",
    "device-request-mount",
    "preload-shadow",
    "override-env",
    "device-request-prefix",
    "cdi-bare-name",
    "crio-devices",
    "cuda-redirect",
    "oom-killer-off",
)


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("kind", ["Pod", "Deployment", "ReplicationController"])
def test_attack_shapes_are_refused_at_apply(
    kubectl: Kubectl, tenancy: str, kind: str, shape: str
) -> None:
    template, rule = _shapes(tenancy)[shape]
    obj = template if kind == "Pod" else workload(kind, template, tenancy)
    assert_refused(kubectl.apply(obj, user=TENANT), rule)
    name = obj["metadata"]["name"]
    resource = {"Pod": "pod", "Deployment": "deployment", "ReplicationController": "rc"}[kind]
    missing = kubectl("get", resource, name, "-n", tenancy)
    assert missing.returncode != 0
    assert "NotFound" in missing.stderr


def test_replication_controller_template_is_mutated(kubectl: Kubectl, tenancy: str) -> None:
    rc = workload("ReplicationController", pod("t", tenancy), tenancy)
    result = kubectl.apply(rc, user=TENANT)
    assert result.returncode == 0, result.stderr
    spec = kubectl.get("rc", "w", tenancy)["spec"]["template"]["spec"]
    assert spec["schedulerName"] == "hami-scheduler"
    env = {e["name"]: e.get("value", "") for e in spec["containers"][0]["env"]}
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m"
    assert env["CUDA_REDIRECT"] == ""
    assert env["GPU_CORE_UTILIZATION_POLICY"] == "default"


# ======================================================================================
# F5 quota: sidecars run beside the main containers (with a quota policy in force)
# ======================================================================================


def _dry_run(kubectl: Kubectl, obj: Obj) -> subprocess.CompletedProcess[str]:
    return kubectl("apply", "--dry-run=server", "-f", "-", stdin=orjson.dumps(obj).decode())


@contextlib.contextmanager
def policy(
    cluster: DevCluster, change: Callable[[Obj], None], *, took: Callable[[], bool]
) -> Iterator[None]:
    """The webhook's policy file changed by ``change`` until the block ends; ``took`` says
    when the webhook applies the new policy (polled), and stops saying so once restored."""
    original = cluster.policy.read_text()
    document = yaml.safe_load(original)
    change(document)
    cluster.policy.write_text(yaml.safe_dump(document))
    try:
        _wait(took, "the changed policy")
        yield
    finally:
        cluster.policy.write_text(original)
        _wait(lambda: not took(), "the original policy")


def _wait(condition: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + 30
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not come into force"
        time.sleep(0.2)


def _quota(document: Obj) -> None:
    document["spec"]["rules"]["gpu-quota"] = "deny"
    document["spec"]["limits"] = {"perContainer": {"gpus": 1}, "perPod": {"gpus": 1}}


@pytest.mark.parametrize("kind", ["Pod", "Deployment", "ReplicationController"])
def test_sidecar_gpus_count_toward_the_pod_quota(
    cluster: DevCluster, kubectl: Kubectl, tenancy: str, kind: str
) -> None:
    probe = pod("probe", tenancy, container("main", {"nvidia.com/gpu": "2"}))

    def quota_in_force() -> bool:
        return "[gpu-quota]" in _dry_run(kubectl, probe).stderr

    one = {"nvidia.com/gpu": "1"}
    sidecar = container("proxy", one, restartPolicy="Always")
    with policy(cluster, _quota, took=quota_in_force):
        attack = pod("t", tenancy, container("main", one), initContainers=[sidecar])
        obj = attack if kind == "Pod" else workload(kind, attack, tenancy)
        assert_refused(kubectl.apply(obj, user=TENANT), "gpu-quota")
        # A plain init container runs before main, not beside it: within the quota.
        warmup = container("warmup", one)
        control = pod("t", tenancy, container("main", one), initContainers=[warmup])
        obj = control if kind == "Pod" else workload(kind, control, tenancy)
        result = kubectl.apply(obj, user=TENANT)
        assert result.returncode == 0, result.stderr


def _looser(document: Obj) -> None:
    document["spec"]["rules"]["privileged-gpu"] = "off"


def test_label_change_on_a_pod_admitted_under_a_looser_policy_is_allowed(
    cluster: DevCluster, kubectl: Kubectl, tenancy: str
) -> None:
    privileged = pod(
        "old", tenancy, container("main", GPU_LIMITS, securityContext={"privileged": True})
    )
    probe = {**privileged, "metadata": {**privileged["metadata"], "name": "probe"}}

    def looser_in_force() -> bool:
        return _dry_run(kubectl, probe).returncode == 0

    with policy(cluster, _looser, took=looser_in_force):
        assert kubectl.apply(privileged, user=TENANT).returncode == 0
    # Today's policy refuses the pod, not an update that adds nothing to it.
    kubectl.ok("label", "pod", "old", "-n", tenancy, "team=ml", user=TENANT)
    key = "hami.io/vgpu-node"
    assert_refused(
        annotate(kubectl, tenancy, f"{key}=gpu-node-1", user=TENANT, name="old"),
        "forged-allocation",
    )


# ======================================================================================
# F8 traceable denials
# ======================================================================================

SECRET: Final = "s3cr3t-Zq9w"


def _audit(cluster: DevCluster, namespace: str, *, count: int) -> list[Obj]:
    assert cluster.webhook is not None
    deadline = time.monotonic() + 10
    while True:
        lines = cluster.webhook.audit_log.read_bytes().splitlines()
        mine = [r for r in map(orjson.loads, lines) if r["objectRef"].get("namespace") == namespace]
        if len(mine) >= count or time.monotonic() > deadline:
            return mine
        time.sleep(0.05)


def test_audit_records_name_rule_action_and_message_without_the_values(
    cluster: DevCluster, kubectl: Kubectl, tenancy: str
) -> None:
    leaky = pod(
        "leaky",
        tenancy,
        container(
            "main", GPU_LIMITS, env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": f"GPU-{SECRET}"}]
        ),
    )
    assert_refused(kubectl.apply(leaky, user=TENANT), "raw-visible-devices")
    pending_pod(kubectl, tenancy)
    forged = annotate(kubectl, tenancy, f"hami.io/vgpu-node=node-{SECRET}", user=TENANT)
    assert_refused(forged, "forged-allocation")
    records = _audit(cluster, tenancy, count=4)
    violations = [v for r in records for v in r.get("violations", [])]
    by_rule = {v["rule"]: v for v in violations}
    visible = by_rule["raw-visible-devices"]
    assert visible["action"] == "deny"
    assert "NVIDIA_VISIBLE_DEVICES" in visible["message"]
    assert 'container "main"' in visible["message"]
    assert '"\u2026"' in visible["message"]
    forgery = by_rule["forged-allocation"]
    assert forgery["action"] == "deny"
    assert "hami.io/vgpu-node" in forgery["message"]
    log = cluster.webhook.audit_log.read_text() if cluster.webhook else ""
    assert SECRET not in log
