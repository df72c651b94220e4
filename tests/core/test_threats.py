"""The threat model's families (docs/threat-model.md), attacked offline as a tenant would.

Each family is a row of what the node's GPU stack honours that the rules did not cover:
the NVIDIA runtime's legacy-image rule (F1) and privileged test (F2), host namespaces
(F3), the host's GPU stack written (F4), the other schedulers' ledgers (F5), MPS given a
percentage (F6), env that arrives from ConfigMaps and Secrets (F7), Dynamic Resource
Allocation (F8) and updates (F9). Attacks go through ``review`` (both webhooks on a
CREATE, as the apiserver runs them) or, for an UPDATE, the wire adapter at /validate;
each asserts the rule id with a deny. Controls assert what must stay allowed.
"""

from __future__ import annotations

import base64
import copy
import functools
from collections.abc import Mapping
from typing import Any, Final

import pytest

from tests.core.test_bypass import (
    DEVICE_PLUGIN,
    GPU_LIMITS,
    MPS,
    SCHEDULER,
    TENANT,
    VOLCANO_SCHEDULER,
    User,
    annotated,
    assert_clean,
    assert_refused,
    container,
    env_of,
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
from tests.paths import EXAMPLES
from webhook.core.cluster import ClusterView, view_from_objects
from webhook.core.decision import Request, decide
from webhook.core.policy import Policy
from webhook.core.review import review_object
from webhook.policies import DEFAULT_POLICY, load_policy

Obj = dict[str, Any]

CUDA_VERSION: Final = {"name": "CUDA_VERSION", "value": "9.0"}
ACK_EXTENDER: Final[User] = (
    "system:serviceaccount:kube-system:gpushare-schd-extender",
    ("system:serviceaccounts", "system:serviceaccounts:kube-system", "system:authenticated"),
)
VOID: Final = {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}


@functools.cache
def strict() -> Policy:
    return load_policy(EXAMPLES / "strict.yaml")


@functools.cache
def ack_mps() -> Policy:
    return load_policy(EXAMPLES / "ack-mps.yaml")


def visible(obj: Obj, index: int = 0, kind: str = "containers") -> Any:
    return env_of(obj, index, kind).get("NVIDIA_VISIBLE_DEVICES")


# ======================================================================================
# F1 legacy CUDA images: CUDA_VERSION without NVIDIA_REQUIRE_CUDA gets every GPU
# ======================================================================================

LEGACY_PODS: Final[dict[str, Obj]] = {
    "plain-pod": pod(container("app", env=[CUDA_VERSION])),
    "sidecar-of-gpu-pod": pod(gpu(), container("helper", env=[CUDA_VERSION])),
    "init-of-gpu-pod": pod(gpu(), init=[container("fetch", env=[CUDA_VERSION])]),
    "sidecar-init-of-gpu-pod": pod(gpu(), init=[sidecar(env=[CUDA_VERSION])]),
    "value-from": pod(
        container(
            "app",
            env=[
                {
                    "name": "CUDA_VERSION",
                    "valueFrom": {"configMapKeyRef": {"name": "cuda", "key": "v"}},
                }
            ],
        )
    ),
    "require-cuda-empty": pod(
        container("app", env=[CUDA_VERSION, {"name": "NVIDIA_REQUIRE_CUDA", "value": ""}])
    ),
    "require-cuda-overridden-empty": pod(
        container(
            "app",
            env=[
                CUDA_VERSION,
                {"name": "NVIDIA_REQUIRE_CUDA", "value": "cuda>=9.0"},
                {"name": "NVIDIA_REQUIRE_CUDA", "value": ""},
            ],
        )
    ),
    "mig-pod-sidecar": pod(
        gpu(limits={"nvidia.com/mig-1g.5gb": "1"}), container("helper", env=[CUDA_VERSION])
    ),
}


@pytest.mark.parametrize("shape", sorted(LEGACY_PODS))
def test_legacy_cuda_container_is_voided_by_the_mutation(shape: str) -> None:
    entry = review(LEGACY_PODS[shape])
    assert entry["allowed"], entry["violations"]
    final = entry["object"]
    for kind in ("containers", "initContainers"):
        for index, item in enumerate(final["spec"].get(kind, [])):
            if "resources" not in item:
                assert visible(final, index, kind) == "void", (kind, index)


@pytest.mark.parametrize("kind", ["Deployment", "StatefulSet", "Job", "CronJob"])
def test_legacy_cuda_container_in_a_template_is_voided(kind: str) -> None:
    entry = review(workload(kind, pod(gpu(), container("helper", env=[CUDA_VERSION]))))
    assert entry["allowed"], entry["violations"]
    template = entry["object"]["spec"]
    template = (template["jobTemplate"]["spec"] if kind == "CronJob" else template)["template"]
    assert visible(template, 1) == "void"


@pytest.mark.parametrize("shape", sorted(LEGACY_PODS))
def test_legacy_cuda_container_that_missed_the_mutation_is_refused(shape: str) -> None:
    # What /validate sees when the mutating webhook was skipped (failed open).
    obj = LEGACY_PODS[shape]
    facts = Request(kind="Pod", namespace="ml", username="alice")
    decision = decide(obj, facts, DEFAULT_POLICY, phase="validate")
    assert "raw-visible-devices" in {v["rule"] for v in decision.denials}


def test_kubectl_debug_with_cuda_version_is_refused() -> None:
    old = stored(pod(gpu()))
    new = with_ephemeral(old, container("debugger", env=[CUDA_VERSION]))
    assert_refused(update(old, new, sub_resource="ephemeralcontainers"), "raw-visible-devices")


def test_kubectl_debug_with_cuda_version_and_void_is_allowed() -> None:
    old = stored(pod(gpu()))
    new = with_ephemeral(old, container("debugger", env=[CUDA_VERSION, VOID]))
    assert_clean(update(old, new, sub_resource="ephemeralcontainers"))


VOIDED_WITHOUT_CUDA: Final[dict[str, Obj]] = {
    # nvidia/cuda images bake NVIDIA_VISIBLE_DEVICES=all; pod env beats it.
    "gpu-pod-sidecar": pod(gpu(), container("helper")),
    "nvidia-env-plain-pod": pod(
        container("app", env=[{"name": "NVIDIA_DRIVER_CAPABILITIES", "value": "compute,utility"}])
    ),
}


@pytest.mark.parametrize("shape", sorted(VOIDED_WITHOUT_CUDA))
def test_containers_that_ask_for_no_gpu_get_void(shape: str) -> None:
    entry = review(VOIDED_WITHOUT_CUDA[shape])
    assert entry["allowed"]
    final = entry["object"]
    index = 1 if shape == "gpu-pod-sidecar" else 0
    assert visible(final, index) == "void"


GETS_A_GPU_ANOTHER_WAY: Final[dict[str, Obj]] = {
    "time-sliced": container("app", limits={"nvidia.com/gpu.shared": "1"}, env=[CUDA_VERSION]),
    "amd": container("app", limits={"amd.com/gpu": "1"}, env=[CUDA_VERSION]),
    "claim": container("app", env=[CUDA_VERSION], resources={"claims": [{"name": "gpu"}]}),
}


@pytest.mark.parametrize("shape", sorted(GETS_A_GPU_ANOTHER_WAY))
def test_a_container_that_gets_a_gpu_another_way_is_not_voided(shape: str) -> None:
    entry = review(pod(GETS_A_GPU_ANOTHER_WAY[shape]))
    assert visible(entry["object"]) is None


def test_a_value_the_user_set_is_never_rewritten() -> None:
    entry = review(
        pod(gpu(), container("helper", env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "none"}]))
    )
    assert entry["allowed"]
    assert visible(entry["object"], 1) == "none"
    refused = review(
        pod(gpu(), container("helper", env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]))
    )
    assert_refused(refused, "raw-visible-devices")


def test_the_void_is_idempotent() -> None:
    entry = review(pod(gpu(), container("helper", env=[CUDA_VERSION])))
    again = review(entry["object"])
    assert again["patch"] == []


def test_a_plain_pod_without_nvidia_env_is_left_alone() -> None:
    entry = review(pod(container("app", env=[{"name": "LANG", "value": "C"}])))
    assert_clean(entry)
    assert entry["patch"] == []


# ======================================================================================
# F2 CAP_SYS_ADMIN: the NVIDIA runtime's isPrivileged()
# ======================================================================================

SYS_ADMIN_SPELLINGS: Final = [
    "SYS_ADMIN",
    "CAP_SYS_ADMIN",
    "sys_admin",
    "Cap_Sys_Admin",
    "ALL",
    "all",
]


def with_caps(name: str, *caps: str, **kw: Any) -> Obj:
    return container(name, securityContext={"capabilities": {"add": list(caps)}}, **kw)


@pytest.mark.parametrize("cap", SYS_ADMIN_SPELLINGS)
@pytest.mark.parametrize("where", ["main", "sidecar", "init", "sidecar-init"])
def test_sys_admin_in_a_gpu_pod_is_refused(cap: str, where: str) -> None:
    if where == "main":
        obj = pod(gpu(securityContext={"capabilities": {"add": [cap]}}))
    elif where == "sidecar":
        obj = pod(gpu(), with_caps("helper", cap))
    elif where == "init":
        obj = pod(gpu(), init=[with_caps("setup", cap)])
    else:
        obj = pod(gpu(), init=[with_caps("proxy", cap, restartPolicy="Always")])
    assert_refused(review(obj), "privileged-gpu")


@pytest.mark.parametrize(
    "obj",
    [
        pytest.param(
            pod(gpu(limits={"aliyun.com/gpu-mem": "3"}), with_caps("h", "SYS_ADMIN")), id="ack"
        ),
        pytest.param(
            pod(gpu(limits={"nvidia.com/mig-1g.5gb": "1"}), with_caps("h", "ALL")), id="mig"
        ),
        pytest.param(
            workload("StatefulSet", pod(gpu(), with_caps("h", "SYS_ADMIN"))), id="statefulset"
        ),
    ],
)
def test_sys_admin_in_other_gpu_pods_is_refused(obj: Obj) -> None:
    assert_refused(review(obj), "privileged-gpu")


def test_sys_admin_added_by_kubectl_debug_is_refused() -> None:
    old = stored(pod(gpu()))
    new = with_ephemeral(old, with_caps("debugger", "SYS_ADMIN"))
    assert_refused(update(old, new, sub_resource="ephemeralcontainers"), "privileged-gpu")


def test_other_capabilities_and_plain_pods_are_allowed() -> None:
    assert_clean(review(pod(gpu(securityContext={"capabilities": {"add": ["NET_ADMIN"]}}))))
    assert_clean(review(pod(with_caps("app", "SYS_ADMIN"))))


# ======================================================================================
# F3 host namespaces in a GPU pod
# ======================================================================================


@pytest.mark.parametrize(
    "obj",
    [
        pytest.param(pod(gpu(), hostPID=True), id="hostPID"),
        pytest.param(workload("Deployment", pod(gpu(), hostPID=True)), id="hostPID-deployment"),
        pytest.param(pod(gpu(), hostIPC=True), id="hostIPC-vgpu"),
        pytest.param(
            pod(gpu(limits={"nvidia.com/mig-1g.5gb": "1"}), hostIPC=True), id="hostIPC-mig"
        ),
    ],
)
def test_host_namespaces_in_a_gpu_pod_are_refused(obj: Obj) -> None:
    assert_refused(review(obj), "host-device-access")


def test_host_ipc_outside_the_mps_namespaces_is_refused_under_strict() -> None:
    assert_refused(review(pod(gpu(), hostIPC=True), strict()), "host-device-access")


def test_the_host_ipc_the_mps_mode_grants_is_allowed() -> None:
    entry = review(pod(gpu(), annotations=MPS))
    assert entry["allowed"], entry["violations"]
    assert entry["object"]["spec"]["hostIPC"] is True
    assert_clean(review(entry["object"]))


def test_host_namespaces_in_a_plain_pod_are_pod_securitys() -> None:
    assert_clean(review(pod(container("app"), hostPID=True, hostIPC=True)))


# ======================================================================================
# F4 the host's GPU stack, written
# ======================================================================================

STACK_PATHS: Final = [
    "/sys",
    "/sys/bus/pci",
    "/sys/bus/pci/devices/0000:3b:00.0",
    "/sys/module/nvidia",
    "/usr/lib/x86_64-linux-gnu",
    "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
    "/lib/x86_64-linux-gnu",
    "/usr/lib64",
    "/usr/lib64/libnvidia-ml.so.1",
    "/opt/driver/lib/libcuda.so.580.159",
    "/usr/bin/nvidia-smi",
    "/usr/bin/nvidia-container-runtime-hook",
    "/usr/local/bin/nvidia-ctk",
    "/usr",
    "/lib",
    "/bin",
]


# The driver roots of the default policy (hostPaths.driverRoots), their insides and the
# directories above them: GKE's COS and Ubuntu installers, the GPU Operator's driver
# container, the toolkit's install directory.
DRIVER_PATHS: Final = [
    "/home/kubernetes/bin/nvidia",
    "/home/kubernetes/bin/nvidia/lib64",
    "/home/kubernetes/bin/nvidia/bin/nvidia-smi",
    "/home/kubernetes//bin/nvidia/",
    "/home/kubernetes/bin",
    "/home",
    "/var/lib/nvidia/lib64",
    "/run/nvidia/driver/usr/lib",
    "/usr/local/nvidia/toolkit",
]


@pytest.mark.parametrize("path", STACK_PATHS + DRIVER_PATHS)
@pytest.mark.parametrize("gpu_pod", [True, False], ids=["gpu-pod", "plain-pod"])
def test_writable_host_path_of_the_gpu_stack_is_refused(path: str, gpu_pod: bool) -> None:
    app = gpu if gpu_pod else functools.partial(container, "app")
    obj = pod(app(mounts=[mount("stack", "/host")]), volumes=[host_volume("stack", path)])
    assert_refused(review(obj), "host-device-access")


# /usr holds the libvgpu directory and /run/nvidia device state: protected even read-only.
@pytest.mark.parametrize(
    "path", [p for p in STACK_PATHS + DRIVER_PATHS if p != "/usr" and not p.startswith("/run/")]
)
def test_read_only_host_path_of_the_gpu_stack_is_allowed(path: str) -> None:
    obj = pod(
        container("app", mounts=[mount("stack", "/host", read_only=True)]),
        volumes=[host_volume("stack", path)],
    )
    assert_clean(review(obj))


def test_driver_roots_are_the_policys() -> None:
    own = policy_with("  hostPaths: {driverRoots: [/opt/drivers/nvidia/]}")
    written = pod(
        container("app", mounts=[mount("driver", "/host")]),
        volumes=[host_volume("driver", "/opt/drivers/nvidia/lib")],
    )
    assert_clean(review(written))
    assert_refused(review(written, own), "host-device-access")
    # A list of its own replaces the default's.
    gke = pod(
        container("app", mounts=[mount("driver", "/host")]),
        volumes=[host_volume("driver", "/home/kubernetes/bin/nvidia")],
    )
    assert_clean(review(gke, own))


@pytest.mark.parametrize(
    "path",
    [
        "/usr/share/fonts",
        "/opt/models",
        "/usr/libexec",
        "/sysroot",
        "/home/kubernetes/bin/other",
        "/home/alice",
        "/var/lib/nvidia-backup",
    ],
)
def test_writable_host_paths_beside_the_gpu_stack_are_allowed(path: str) -> None:
    obj = pod(
        container("app", mounts=[mount("data", "/data")]), volumes=[host_volume("data", path)]
    )
    assert_clean(review(obj))


# ======================================================================================
# F5 the other schedulers' ledgers
# ======================================================================================

ACK_LEDGER: Final[Mapping[str, str]] = {
    "ALIYUN_COM_GPU_MEM_IDX": "1",
    "ALIYUN_COM_GPU_MEM_POD": "3",
    "ALIYUN_COM_GPU_MEM_DEV": "80",
    "ALIYUN_COM_GPU_MEM_ASSIGNED": "true",
    "ALIYUN_COM_GPU_MEM_ASSUME_TIME": "1732312345",
}
VOLCANO_LEDGER: Final[Mapping[str, str]] = {
    "volcano.sh/vgpu-ids-new": "GPU-1,NVIDIA,3000,30:;",
    "volcano.sh/devices-to-allocate": "GPU-1,NVIDIA,3000,30:;",
    "volcano.sh/vgpu-node": "gpu-node-1",
    "volcano.sh/bind-phase": "allocating",
}
ACK_POD: Final = pod(gpu(limits={"aliyun.com/gpu-mem": "3"}))
VOLCANO_POD: Final = pod(
    gpu(limits={"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-memory": "3000"})
)


@pytest.mark.parametrize(
    ("base", "key", "value"),
    [
        *[pytest.param(ACK_POD, k, v, id=k) for k, v in ACK_LEDGER.items()],
        *[pytest.param(VOLCANO_POD, k, v, id=k) for k, v in VOLCANO_LEDGER.items()],
    ],
)
@pytest.mark.parametrize("policy", [DEFAULT_POLICY, None], ids=["default", "ack-mps"])
def test_ledger_annotations_are_reserved_at_create(
    base: Obj, key: str, value: str, policy: Policy | None
) -> None:
    assert_refused(review(annotated(base, {key: value}), policy or ack_mps()), "forged-allocation")


# HAMi's scheduler decodes every vendor's allocated key for every pod, and leaves a pod
# whose value does not decode out of its ledger (HAMi pkg/scheduler/scheduler.go:160-164
# @ 4707fb02); Kunlun's has no -devices- in its name (hami.io/kunlun-allocated).
@pytest.mark.parametrize(
    "value", ["forged", "GPU-1,NVIDIA,-80000,-100:;"], ids=["undecodable", "negative"]
)
def test_a_vendors_allocated_key_is_hamis_ledger(value: str) -> None:
    old = stored(pod(gpu()))
    assert_refused(
        update(old, annotated(old, {"hami.io/kunlun-allocated": value})), "forged-allocation"
    )
    assert_refused(
        review(annotated(pod(gpu()), {"hami.io/kunlun-allocated": value})), "forged-allocation"
    )


@pytest.mark.parametrize("change", ["add", "move", "remove"])
def test_tenant_moving_the_ack_index_is_refused(change: str) -> None:
    old = stored(ACK_POD)
    if change != "add":
        old = annotated(old, ACK_LEDGER)
    new = annotated(old, {"ALIYUN_COM_GPU_MEM_IDX": None if change == "remove" else "0"})
    assert_refused(update(old, new), "forged-allocation")


@pytest.mark.parametrize("key", sorted(VOLCANO_LEDGER))
def test_tenant_writing_volcanos_ledger_by_update_is_refused(key: str) -> None:
    old = stored(VOLCANO_POD)
    assert_refused(update(old, annotated(old, {key: VOLCANO_LEDGER[key]})), "forged-allocation")


@pytest.mark.parametrize(
    ("writer", "base", "ledger", "own"),
    [
        pytest.param(VOLCANO_SCHEDULER, VOLCANO_POD, VOLCANO_LEDGER, True, id="volcano-own"),
        pytest.param(ACK_EXTENDER, ACK_POD, ACK_LEDGER, True, id="ack-own"),
        pytest.param(SCHEDULER, VOLCANO_POD, VOLCANO_LEDGER, False, id="hami-on-volcano"),
        pytest.param(DEVICE_PLUGIN, ACK_POD, ACK_LEDGER, False, id="hami-dp-on-ack"),
        pytest.param(VOLCANO_SCHEDULER, ACK_POD, ACK_LEDGER, False, id="volcano-on-ack"),
    ],
)
def test_each_ledger_is_written_by_its_own_scheduler_only(
    writer: User, base: Obj, ledger: Mapping[str, str], own: bool
) -> None:
    old = stored(base)
    verdict = update(old, annotated(old, ledger), user=writer)
    if own:
        assert_clean(verdict)
    else:
        assert_refused(verdict, "forged-allocation")


def test_the_mode_annotation_stays_the_users() -> None:
    entry = review(annotated(VOLCANO_POD, {"volcano.sh/vgpu-mode": "hami-core"}))
    assert entry["allowed"], entry["violations"]


# ======================================================================================
# F6 MPS with a memory percentage
# ======================================================================================


@pytest.mark.parametrize(
    "obj",
    [
        pytest.param(
            pod(gpu(limits={"nvidia.com/gpumem-percentage": "25"}), annotations=MPS),
            id="annotation",
        ),
        pytest.param(
            pod(
                gpu(
                    limits={
                        "volcano.sh/vgpu-number": "1",
                        "volcano.sh/vgpu-memory-percentage": "25",
                    }
                ),
                annotations=MPS,
            ),
            id="volcano",
        ),
        pytest.param(
            pod(
                gpu(limits={"nvidia.com/gpumem-percentage": "25"}),
                nodeSelector={"ack.node.gpu.schedule": "mps"},
            ),
            id="node-selector",
        ),
        pytest.param(
            workload(
                "CronJob", pod(gpu(limits={"nvidia.com/gpumem-percentage": "25"}), annotations=MPS)
            ),
            id="cronjob",
        ),
    ],
)
def test_mps_with_a_memory_percentage_is_refused_without_the_view(obj: Obj) -> None:
    assert_refused(review(obj), "mode-conflict")


def test_vgpu_with_a_memory_percentage_is_the_device_plugins() -> None:
    assert review(pod(gpu(limits={"nvidia.com/gpumem-percentage": "25"})))["allowed"]


# ======================================================================================
# F7 env from ConfigMaps and Secrets, guarded when they are written
# ======================================================================================


def config_map(data: Mapping[str, str], kind: str = "ConfigMap") -> Obj:
    field = "data"
    values = dict(data)
    if kind == "Secret":
        values = {k: base64.b64encode(v.encode()).decode() for k, v in data.items()}
    return {
        "apiVersion": "v1",
        "kind": kind,
        "metadata": {"name": "env", "namespace": "ml"},
        field: values,
    }


@pytest.mark.parametrize("kind", ["ConfigMap", "Secret"])
@pytest.mark.parametrize(
    "key",
    [
        "NVIDIA_VISIBLE_DEVICES",
        "CUDA_VERSION",
        "CUDA_DISABLE_CONTROL",
        "GPU_CORE_UTILIZATION_POLICY",
        "CUDA_REDIRECT",
        "ACTIVE_OOM_KILLER",
    ],
)
def test_env_source_holding_a_guarded_name_is_refused(kind: str, key: str) -> None:
    assert_refused(review(config_map({"LANG": "C", key: "all"}, kind)), "raw-visible-devices")


def test_secret_string_data_is_judged_too() -> None:
    secret = config_map({}, "Secret")
    secret["stringData"] = {"NVIDIA_VISIBLE_DEVICES": "all"}
    assert_refused(review(secret), "raw-visible-devices")


def test_env_sources_without_guarded_names_are_allowed() -> None:
    assert_clean(review(config_map({"LANG": "C", "NVIDIA_DRIVER_CAPABILITIES": "compute"})))
    assert_clean(review(config_map({"NCCL_DEBUG": "INFO"}, "Secret")))


def test_an_exempt_namespace_may_hold_guarded_names() -> None:
    policy = policy_with("  exemptions: {namespaces: [ml]}")
    assert review(config_map({"NVIDIA_VISIBLE_DEVICES": "all"}), policy)["allowed"]


@pytest.mark.parametrize("prefix", ["NVIDIA_", "NVIDIA_VISIBLE_", "N", "CUDA_", "GPU_CORE_"])
@pytest.mark.parametrize("gpu_pod", [True, False], ids=["gpu-pod", "plain-pod"])
def test_env_from_prefix_that_spells_a_guarded_name_is_refused(prefix: str, gpu_pod: bool) -> None:
    source = {"prefix": prefix, "configMapRef": {"name": "env"}}
    app = gpu(envFrom=[source]) if gpu_pod else container("app", envFrom=[source])
    assert_refused(review(pod(app)), "raw-visible-devices")


@pytest.mark.parametrize("prefix", ["APP_", "X_NVIDIA_", "CUDA_VISIBLE_"])
def test_env_from_prefixes_that_spell_nothing_guarded_are_allowed(prefix: str) -> None:
    source = {"prefix": prefix, "configMapRef": {"name": "env"}}
    entry = review(pod(gpu(envFrom=[source])))
    assert entry["allowed"], entry["violations"]


# ======================================================================================
# F8 Dynamic Resource Allocation: gpu-claim
# ======================================================================================


def claim_spec(device_class: str = "gpu.nvidia.com", **request: Any) -> Obj:
    exactly: Obj = {"deviceClassName": device_class, "allocationMode": "ExactCount", "count": 1}
    exactly.update(request)
    return {"devices": {"requests": [{"name": "gpu", "exactly": exactly}]}}


def claim(device_class: str = "gpu.nvidia.com", namespace: str = "ml", **request: Any) -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "gpu", "namespace": namespace},
        "spec": claim_spec(device_class, **request),
    }


def claim_template(device_class: str = "gpu.nvidia.com") -> Obj:
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "gpu", "namespace": "ml"},
        "spec": {"spec": claim_spec(device_class)},
    }


CLAIM_ATTACKS: Final[dict[str, Obj]] = {
    "claim-gpu": claim(),
    "claim-mig": claim("mig.nvidia.com"),
    "claim-all": claim(allocationMode="All"),
    "claim-admin-access": claim(adminAccess=True),
    "claim-first-available": {
        **claim(),
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "firstAvailable": [
                            {"name": "small", "deviceClassName": "example.com/fpga"},
                            {"name": "big", "deviceClassName": "gpu.nvidia.com"},
                        ],
                    }
                ]
            }
        },
    },
    "claim-v1beta1": {
        "apiVersion": "resource.k8s.io/v1beta1",
        "kind": "ResourceClaim",
        "metadata": {"name": "gpu", "namespace": "ml"},
        "spec": {"devices": {"requests": [{"name": "gpu", "deviceClassName": "gpu.nvidia.com"}]}},
    },
    "template-gpu": claim_template(),
    "template-mig": claim_template("mig.nvidia.com"),
    "device-class-serving-gpu": {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "whole-gpus"},
        "spec": {"extendedResourceName": "nvidia.com/gpu"},
    },
    "device-class-serving-gpumem": {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "whole-gpus"},
        "spec": {"extendedResourceName": "nvidia.com/gpumem"},
    },
}


@pytest.mark.parametrize("attack", sorted(CLAIM_ATTACKS))
def test_gpu_claims_outside_the_allowed_namespaces_are_refused(attack: str) -> None:
    assert_refused(review(CLAIM_ATTACKS[attack]), "gpu-claim")


# The NVIDIA DRA driver's ComputeDomain: its controller writes a ResourceClaimTemplate
# on this class (an IMEX channel, no GPU) that pods take beside nvidia.com/gpu
# (NVIDIA/k8s-dra-driver-gpu, templates/compute-domain-workload-claim-template.tmpl.yaml).
IMEX_CLASS: Final = "compute-domain-default-channel.nvidia.com"


def mixed(source: str = "resourceClaimTemplateName", name: str = "gpu") -> Obj:
    """A vGPU pod that also takes the claim (or template) ``name``."""
    return pod(
        gpu(resources={"limits": dict(GPU_LIMITS), "claims": [{"name": "claim"}]}),
        resourceClaims=[{"name": "claim", source: name}],
    )


def view_of(*objects: Obj) -> ClusterView:
    """A synced view holding ``objects`` (claims and templates), as ``review --cluster``."""
    return view_from_objects(objects)


def review_in(obj: Obj, cluster: ClusterView, policy: Policy | None = None) -> Any:
    return review_object(
        obj,
        policy or DEFAULT_POLICY,
        username=TENANT[0],
        groups=TENANT[1],
        operation="CREATE",
        cluster=cluster,
    )


@pytest.mark.parametrize("device_class", ["gpu.nvidia.com", "mig.nvidia.com"])
@pytest.mark.parametrize("kind", ["Pod", "Deployment"])
def test_a_vgpu_pod_that_also_takes_a_gpu_claim_template_is_refused(
    device_class: str, kind: str
) -> None:
    # The attack: whole GPUs from DRA beside the slices. The view knows the class.
    cluster = view_of(claim_template(device_class))
    obj = mixed()
    entry = review_in(obj if kind == "Pod" else workload(kind, obj), cluster)
    assert_refused(entry, "gpu-claim")
    (message,) = [v["message"] for v in entry["violations"] if v["rule"] == "gpu-claim"]
    assert f'ResourceClaimTemplate "gpu" on device class "{device_class}"' in message
    # Allowed to claim GPUs is not allowed to mix them with slices.
    allowed = policy_with("  dra: {allowedNamespaces: [ml]}")
    assert_refused(review_in(obj, cluster, allowed), "gpu-claim")


def test_a_vgpu_pod_that_also_takes_a_gpu_claim_is_refused() -> None:
    gpus = {**claim(), "spec": CLAIM_ATTACKS["claim-first-available"]["spec"]}
    assert_refused(review_in(mixed("resourceClaimName"), view_of(gpus)), "gpu-claim")
    # Before Kubernetes 1.31 the names sat in a source object.
    old = pod(gpu(), resourceClaims=[{"name": "claim", "source": {"resourceClaimName": "gpu"}}])
    assert_refused(review_in(old, view_of(claim())), "gpu-claim")
    # A claim of that name in another namespace is not the pod's.
    assert review_in(mixed("resourceClaimName"), view_of(claim(namespace="other")))["allowed"]


def test_a_gpu_pod_taking_a_claim_of_another_class_is_allowed() -> None:
    # ComputeDomain (and KAI's IMEX pods): nvidia.com/gpu beside an IMEX channel claim.
    resources = {"limits": {"nvidia.com/gpu": "4"}, "claims": [{"name": "channel"}]}
    imex = pod(
        gpu(resources=resources),
        resourceClaims=[{"name": "channel", "resourceClaimTemplateName": "imex-channel"}],
    )
    template = claim_template(IMEX_CLASS)
    template["metadata"]["name"] = "imex-channel"
    assert review(imex)["allowed"]
    assert review_in(imex, view_of(template))["allowed"]
    # The class unknown (no view, or a view without the template): the template was
    # judged when it was written.
    assert review(mixed())["allowed"]
    assert review_in(mixed(), view_of(claim_template(IMEX_CLASS)))["allowed"]
    assert review_in(mixed(), ClusterView(synced=True))["allowed"]


@pytest.mark.parametrize(
    "attack", sorted(a for a in CLAIM_ATTACKS if "claim" in a or "template" in a)
)
def test_a_refused_claim_names_the_policy_field_that_would_allow_it(attack: str) -> None:
    (violation,) = review(CLAIM_ATTACKS[attack])["violations"]
    assert 'namespace "ml" is not in the policy\'s dra.allowedNamespaces' in violation["message"]


def test_a_device_class_serving_a_mig_resource_is_allowed() -> None:
    # As in the NVIDIA DRA driver's extended-resource example: a MIG instance served by
    # DRA is a hardware partition, no slice the sharing ledger counts.
    mig_class = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "DeviceClass",
        "metadata": {"name": "mig-1g.12gb.nvidia.com"},
        "spec": {"extendedResourceName": "nvidia.com/mig-1g.12gb"},
    }
    assert_clean(review(mig_class))


def test_claims_in_an_allowed_namespace_and_other_classes_are_allowed() -> None:
    policy = policy_with("  dra: {allowedNamespaces: [ml]}")
    assert_clean(review(claim(), policy))
    assert_clean(review(claim("example.com/fpga")))
    assert_clean(review(claim_template("example.com/fpga")))
    # A pod using a claim and asking for no sharing resource: judged through its claim.
    entry = review(
        pod(
            container("app", resources={"claims": [{"name": "gpu"}]}),
            resourceClaims=[{"name": "gpu", "resourceClaimName": "gpu"}],
        )
    )
    assert entry["allowed"], entry["violations"]


# ======================================================================================
# F9 updates: judged with update semantics
# ======================================================================================


def test_an_update_is_judged_by_what_it_adds() -> None:
    # A pod admitted before hostPID was refused: a label change must not be refused.
    old = copy.deepcopy(stored(pod(gpu())))
    old["spec"]["hostPID"] = True
    new = copy.deepcopy(old)
    new["metadata"]["labels"] = {"team": "ml"}
    assert_clean(update(old, new))


def test_node_name_set_by_binding_is_not_pinning() -> None:
    old = stored(pod(gpu()))
    new = copy.deepcopy(old)
    new["spec"]["nodeName"] = "gpu-node-1"
    assert_clean(update(old, new, user=SCHEDULER))


@pytest.mark.parametrize("kind", ["Pod", "Deployment"])
def test_asking_dra_for_a_gpu_class_by_its_extended_resource_is_refused(kind: str) -> None:
    # DRAExtendedResource: no claim in the pod, the class named as a resource.
    obj = pod(container("app", limits={"deviceclass.resource.kubernetes.io/gpu.nvidia.com": "1"}))
    entry = review(obj if kind == "Pod" else workload(kind, obj))
    assert_refused(entry, "gpu-claim")
    (message,) = [v["message"] for v in entry["violations"] if v["rule"] == "gpu-claim"]
    assert "not in the policy's dra.allowedNamespaces" in message
    # It gets a GPU, so it is not voided either.
    assert review(obj, policy_with("  dra: {allowedNamespaces: [ml]}"))["allowed"]


def test_a_config_map_with_a_per_device_limit_is_refused() -> None:
    # A percentage pod has no pinned CUDA_DEVICE_MEMORY_LIMIT_0 for envFrom to lose to.
    assert_refused(review(config_map({"CUDA_DEVICE_MEMORY_LIMIT_0": "80g"})), "raw-visible-devices")
    source = {"prefix": "CUDA_DEVICE_MEMORY_LIMIT_", "configMapRef": {"name": "env"}}
    assert_refused(review(pod(gpu(envFrom=[source]))), "raw-visible-devices")
