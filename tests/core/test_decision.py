"""The decision core on manifests as users write them: modes, mutations and every rule."""

from __future__ import annotations

import copy
from typing import Any, Final

import jsonpatch
import pytest
import yaml

from tests.paths import EXAMPLES, MANIFESTS
from webhook.core.decision import Request, decide
from webhook.core.policy import Policy
from webhook.core.review import ReviewEntry, review_object
from webhook.policies import DEFAULT_POLICY, load_policy, parse_policy


def manifest(name: str) -> dict[str, Any]:
    data = yaml.safe_load((MANIFESTS / name).read_text())
    assert isinstance(data, dict)
    return data


def gpu_pod(
    limits: dict[str, Any] | None = None, *, namespace: str = "ml", **spec: Any
) -> dict[str, Any]:
    container: dict[str, Any] = {
        "name": "main",
        "image": "cuda:12",
        "resources": {"limits": limits if limits is not None else {"nvidia.com/gpumem": "3000"}},
    }
    pod_spec: dict[str, Any] = {"containers": [container]}
    pod_spec.update(spec)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": namespace},
        "spec": pod_spec,
    }


def env_of(obj: dict[str, Any], index: int = 0, kind: str = "containers") -> dict[str, str]:
    return {e["name"]: e.get("value") for e in obj["spec"][kind][index].get("env", [])}


def rules_of(entry: ReviewEntry, action: str = "deny") -> set[str]:
    return {v["rule"] for v in entry["violations"] if v["action"] == action}


def policy_with(text: str) -> Policy:
    return parse_policy(f"apiVersion: gpushare.io/v1alpha1\nkind: GPUSharePolicy\nspec:\n{text}")


# -- modes and mutations ---------------------------------------------------------------


def test_hami_vgpu_pod_gets_its_slice() -> None:
    entry = review_object(manifest("hami-vgpu-pod.yaml"), DEFAULT_POLICY)
    assert entry["allowed"]
    assert entry["mode"] == "vgpu"
    pod = entry["object"]
    assert pod["spec"]["schedulerName"] == "hami-scheduler"
    assert pod["metadata"]["annotations"]["gpushare.io/mode"] == "vgpu"
    env = env_of(pod)
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m"
    assert env["CUDA_DEVICE_SM_LIMIT"] == "30"
    assert env["LD_PRELOAD"] == "/usr/local/vgpu/libvgpu.so"
    # HAMi's device plugin sets the region where its monitor reads it; nothing overrides it.
    assert "CUDA_DEVICE_MEMORY_SHARED_CACHE" not in env
    mounts = {m["mountPath"]: m for m in pod["spec"]["containers"][0]["volumeMounts"]}
    assert mounts["/usr/local/vgpu/libvgpu.so"]["readOnly"] is True
    assert "/tmp/vgpulock" in mounts
    volumes = {v["name"]: v for v in pod["spec"]["volumes"]}
    assert volumes["gpushare-vgpu-lib"]["hostPath"]["path"] == "/usr/local/vgpu/libvgpu.so"
    assert volumes["gpushare-vgpu-lock"]["hostPath"]["path"] == "/tmp/vgpulock"


def test_mutation_is_idempotent_on_its_own_output() -> None:
    for name in ("hami-vgpu-pod.yaml", "pytorch-force.yaml", "ack-mps-job.yaml"):
        entry = review_object(manifest(name), DEFAULT_POLICY)
        again = review_object(entry["object"], DEFAULT_POLICY)
        assert entry["patch"], name
        assert again["patch"] == [], name
        assert again["allowed"], name


def test_patch_applies_to_the_original_object() -> None:
    original = manifest("pytorch-force.yaml")
    entry = review_object(copy.deepcopy(original), DEFAULT_POLICY)
    assert jsonpatch.apply_patch(original, entry["patch"]) == entry["object"]


def test_user_preload_and_tightened_policy_are_kept() -> None:
    entry = review_object(manifest("pytorch-force.yaml"), DEFAULT_POLICY)
    assert entry["allowed"]
    trainer = env_of(entry["object"])
    assert trainer["LD_PRELOAD"] == (
        "/usr/local/vgpu/libvgpu.so:/usr/lib/x86_64-linux-gnu/libjemalloc.so.2"
    )
    assert trainer["GPU_CORE_UTILIZATION_POLICY"] == "force"
    assert trainer["NCCL_DEBUG"] == "INFO"
    assert trainer["CUDA_DEVICE_MEMORY_LIMIT_0"] == "8000m"
    assert trainer["CUDA_DEVICE_MEMORY_LIMIT_1"] == "8000m"
    # The init container is mutated too, and gets the implied nvidia.com/gpu: 1.
    init = entry["object"]["spec"]["initContainers"][0]
    assert env_of(entry["object"], kind="initContainers")["CUDA_DEVICE_MEMORY_LIMIT_0"] == "1024m"
    assert init["resources"]["limits"]["nvidia.com/gpu"] == "1"
    # The container without a GPU request gets no device and no driver files.
    assert entry["object"]["spec"]["containers"][1]["env"] == [
        {"name": "NVIDIA_VISIBLE_DEVICES", "value": "void"}
    ]
    assert {v["name"] for v in entry["object"]["spec"]["volumes"]} >= {"data", "gpushare-vgpu-lib"}


def test_job_with_memory_percentage_leaves_memory_to_the_device_plugin() -> None:
    entry = review_object(manifest("job-percentage.yaml"), DEFAULT_POLICY)
    assert entry["allowed"]
    assert entry["mode"] == "vgpu"
    assert entry["patch"][0]["path"].startswith("/spec/template/spec/")
    env = env_of(entry["object"]["spec"]["template"])
    assert env["CUDA_DEVICE_SM_LIMIT"] == "25"
    assert not any(name.startswith("CUDA_DEVICE_MEMORY_LIMIT") for name in env)
    assert entry["object"]["spec"]["template"]["metadata"]["annotations"] == {
        "gpushare.io/mode": "vgpu"
    }


def test_gpumem_wins_over_percentage_with_a_warning() -> None:
    pod = gpu_pod({"nvidia.com/gpumem": "2000", "nvidia.com/gpumem-percentage": "50"})
    entry = review_object(pod, DEFAULT_POLICY)
    assert entry["allowed"]
    assert env_of(entry["object"])["CUDA_DEVICE_MEMORY_LIMIT_0"] == "2000m"
    assert any("MiB wins" in w for w in entry["warnings"])


def test_ack_mps_job_gets_host_ipc_and_pinned_memory_in_mib() -> None:
    entry = review_object(manifest("ack-mps-job.yaml"), load_policy(EXAMPLES / "ack-mps.yaml"))
    assert entry["allowed"]
    assert entry["mode"] == "mps"
    spec = entry["object"]["spec"]["template"]["spec"]
    assert spec["hostIPC"] is True
    assert "schedulerName" not in spec  # the ACK policy keeps the default scheduler
    env = env_of(entry["object"]["spec"]["template"])
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=7168M"
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps"
    assert "LD_PRELOAD" not in env
    assert spec["containers"][0]["volumeMounts"] == [
        {"name": "gpushare-mps-pipe", "mountPath": "/tmp/nvidia-mps", "readOnly": True}
    ]


# ACK's gpushare extender counts aliyun.com/gpu-mem in MiB where its device plugin
# reports MiB (AliyunContainerService/gpushare-scheduler-extender docs/designs/designs.md:
# "a single device 16GiB memory, its corresponding resource is 16276MiB").
ACK_MIB: Final = {"aliyun.com/gpu-mem": "16276"}


@pytest.mark.parametrize(
    ("annotations", "variable", "value"),
    [
        ({}, "CUDA_DEVICE_MEMORY_LIMIT_0", "16276m"),
        ({"gpushare.io/mode": "mps"}, "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=16276M"),
    ],
)
def test_a_gib_resource_above_1024_is_read_as_mib_with_a_warning(
    annotations: dict[str, str], variable: str, value: str
) -> None:
    pod = gpu_pod(dict(ACK_MIB))
    pod["metadata"]["annotations"] = annotations
    # HAMi-core's limits where the policy gives ACK's resources the library (by default
    # their vgpu pods get none: vgpu.withoutLibrary).
    library = policy_with("  vgpu: {withoutLibrary: []}\n")
    entry = review_object(pod, library)
    assert entry["allowed"], entry["violations"]
    assert env_of(entry["object"])[variable] == value
    (warning,) = [w for w in entry["warnings"] if "read as MiB" in w]
    assert "aliyun.com/gpu-mem 16276" in warning
    assert "move it from resources.memoryGiB to memoryMiB" in warning
    assert [w for w in review_object(pod, DEFAULT_POLICY)["warnings"] if "read as MiB" in w]
    # 1024 and below stay GiB, without a word.
    entry = review_object(gpu_pod({"aliyun.com/gpu-mem": "7"}), library)
    assert env_of(entry["object"])["CUDA_DEVICE_MEMORY_LIMIT_0"] == "7168m"
    assert entry["warnings"] == []
    # Declared MiB in the policy, it is MiB without a warning.
    mib = policy_with(
        "  resources: {memoryGiB: [], memoryMiB: [aliyun.com/gpu-mem]}\n"
        "  vgpu: {withoutLibrary: []}\n"
    )
    entry = review_object(gpu_pod(dict(ACK_MIB)), mib)
    assert env_of(entry["object"])["CUDA_DEVICE_MEMORY_LIMIT_0"] == "16276m"
    assert entry["warnings"] == []


def test_mps_pod_gets_node_selector_and_thread_percentage() -> None:
    pod = gpu_pod({"nvidia.com/gpu": "2", "nvidia.com/gpumem": "4000", "nvidia.com/gpucores": "40"})
    pod["metadata"]["annotations"] = {"gpushare.io/mode": "mps"}
    entry = review_object(pod, DEFAULT_POLICY)
    assert entry["allowed"]
    assert entry["mode"] == "mps"
    assert entry["object"]["spec"]["nodeSelector"] == {"ack.node.gpu.schedule": "mps"}
    env = env_of(entry["object"])
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=4000M,1=4000M"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "40"


def test_eks_mig_deployment_is_untouched() -> None:
    original = manifest("eks-mig-deployment.yaml")
    entry = review_object(copy.deepcopy(original), DEFAULT_POLICY)
    assert entry == {**entry, "allowed": True, "mode": "mig", "patch": [], "violations": []}
    assert entry["object"] == original


def test_plain_pod_passes_through() -> None:
    original = manifest("plain-pod.yaml")
    entry = review_object(copy.deepcopy(original), DEFAULT_POLICY)
    assert entry["allowed"]
    assert entry["mode"] == "none"
    assert entry["patch"] == []
    assert entry["object"] == original


def test_hami_core_annotation_means_vgpu() -> None:
    pod = gpu_pod()
    pod["metadata"]["annotations"] = {"nvidia.com/vgpu-mode": "hami-core"}
    entry = review_object(pod, DEFAULT_POLICY)
    assert entry["mode"] == "vgpu"
    assert entry["allowed"]


def test_namespace_mode_and_preload_file() -> None:
    policy = policy_with("  modes:\n    namespaces: {mps: [mps-team]}\n  vgpu: {preload: file}\n")
    assert review_object(gpu_pod(namespace="mps-team"), policy)["mode"] == "mps"
    entry = review_object(gpu_pod(namespace="ml"), policy)
    assert entry["mode"] == "vgpu"
    mounts = {m["mountPath"] for m in entry["object"]["spec"]["containers"][0]["volumeMounts"]}
    assert "/etc/ld.so.preload" in mounts
    assert "LD_PRELOAD" not in env_of(entry["object"])


def test_scheduler_is_overwritten_only_when_default() -> None:
    entry = review_object(gpu_pod(schedulerName="default-scheduler"), DEFAULT_POLICY)
    assert entry["object"]["spec"]["schedulerName"] == "hami-scheduler"
    assert {"op": "replace", "path": "/spec/schedulerName", "value": "hami-scheduler"} in entry[
        "patch"
    ]


def test_containers_that_ask_for_no_gpu_are_voided() -> None:
    pod = gpu_pod()
    pod["spec"]["containers"].append({"name": "side", "image": "busybox"})
    entry = review_object(pod, load_policy(EXAMPLES / "strict.yaml"))
    assert entry["allowed"]
    assert env_of(entry["object"], 1) == {"NVIDIA_VISIBLE_DEVICES": "void"}
    assert env_of(entry["object"])["GPU_CORE_UTILIZATION_POLICY"] == "force"


def test_annotation_keys_are_escaped_in_pointers() -> None:
    pod = gpu_pod()
    pod["metadata"]["annotations"] = {"team": "a"}
    entry = review_object(pod, DEFAULT_POLICY)
    assert {
        "op": "add",
        "path": "/metadata/annotations/gpushare.io~1mode",
        "value": "vgpu",
    } in entry["patch"]


# -- rules -----------------------------------------------------------------------------


def test_privileged_sidecar_in_gpu_pod() -> None:
    entry = review_object(manifest("privileged-sidecar.yaml"), DEFAULT_POLICY)
    assert not entry["allowed"]
    assert rules_of(entry) == {"privileged-gpu"}
    assert 'container "sidecar"' in entry["violations"][0]["message"]
    assert entry["patch"] == []


def test_privileged_ephemeral_container_on_update() -> None:
    pod = gpu_pod(nodeName="node-1")
    pod["spec"]["ephemeralContainers"] = [
        {"name": "debug", "image": "busybox", "securityContext": {"privileged": True}}
    ]
    entry = review_object(pod, DEFAULT_POLICY, operation="UPDATE")
    # nodeName on a running pod is the scheduler's doing: only the privileged debugger counts.
    assert rules_of(entry) == {"privileged-gpu"}


def test_node_name_pinning() -> None:
    entry = review_object(gpu_pod(nodeName="gpu-node-3"), DEFAULT_POLICY)
    assert rules_of(entry) == {"node-name-pinning"}
    assert "gpu-node-3" in entry["violations"][0]["message"]
    plain = manifest("plain-pod.yaml")
    plain["spec"]["nodeName"] = "n"
    assert review_object(plain, DEFAULT_POLICY)["allowed"]


@pytest.mark.parametrize(
    ("value", "denied"),
    [
        ("all", True),
        ("0,1", True),
        ("GPU-1234", True),
        ("none", False),
        ("void", False),
        ("", False),
    ],
)
def test_raw_visible_devices(value: str, denied: bool) -> None:
    pod = manifest("plain-pod.yaml")
    pod["spec"]["containers"][0]["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": value}]
    entry = review_object(pod, DEFAULT_POLICY)
    assert (rules_of(entry) == {"raw-visible-devices"}) is denied
    assert entry["allowed"] is not denied


def test_raw_visible_devices_from_value_from() -> None:
    entry = review_object(manifest("visible-devices-all.yaml"), DEFAULT_POLICY)
    assert rules_of(entry) == {"raw-visible-devices"}
    pod = manifest("plain-pod.yaml")
    pod["spec"]["containers"][0]["env"] = [
        {
            "name": "NVIDIA_VISIBLE_DEVICES",
            "valueFrom": {"configMapKeyRef": {"name": "x", "key": "y"}},
        }
    ]
    assert "valueFrom" in review_object(pod, DEFAULT_POLICY)["violations"][0]["message"]


@pytest.mark.parametrize(
    "path", ["/dev/nvidia0", "/dev", "/run/nvidia/driver", "/usr/local/vgpu", "/tmp/vgpulock", "/"]
)
def test_host_device_access(path: str) -> None:
    pod = manifest("plain-pod.yaml")
    pod["spec"]["volumes"] = [{"name": "dev", "hostPath": {"path": path}}]
    entry = review_object(pod, DEFAULT_POLICY)
    assert rules_of(entry) == {"host-device-access"}


def test_host_path_elsewhere_and_injected_volumes_are_fine() -> None:
    pod = manifest("plain-pod.yaml")
    pod["spec"]["volumes"] = [{"name": "logs", "hostPath": {"path": "/var/log"}}]
    assert review_object(pod, DEFAULT_POLICY)["allowed"]
    mutated = review_object(manifest("hami-vgpu-pod.yaml"), DEFAULT_POLICY)["object"]
    assert decide(mutated, Request(kind="Pod"), DEFAULT_POLICY, phase="validate").violations == []
    # The same injected volume on a pod that shares no GPU is access, not mutation.
    plain = manifest("plain-pod.yaml")
    plain["spec"]["volumes"] = mutated["spec"]["volumes"]
    assert rules_of(review_object(plain, DEFAULT_POLICY)) == {"host-device-access"}


def test_cdi_annotation_naming_nvidia_devices() -> None:
    pod = manifest("plain-pod.yaml")
    pod["metadata"]["annotations"] = {"cdi.k8s.io/gpu": "nvidia.com/gpu=all"}
    assert rules_of(review_object(pod, DEFAULT_POLICY)) == {"host-device-access"}


@pytest.mark.parametrize(
    ("name", "value"),
    [("CUDA_DISABLE_CONTROL", "true"), ("GPU_CORE_UTILIZATION_POLICY", "disable")],
)
def test_limit_tampering_is_denied(name: str, value: str) -> None:
    pod = gpu_pod()
    pod["spec"]["containers"][0]["env"] = [{"name": name, "value": value}]
    entry = review_object(pod, DEFAULT_POLICY)
    assert rules_of(entry) == {"limit-tampering"}
    assert name in entry["violations"][0]["message"]


def test_disable_utilization_policy_when_the_policy_allows_it() -> None:
    pod = gpu_pod()
    pod["spec"]["containers"][0]["env"] = [
        {"name": "GPU_CORE_UTILIZATION_POLICY", "value": "disable"}
    ]
    policy = policy_with("  vgpu: {allowDisableCoreUtilizationPolicy: true}\n")
    assert review_object(pod, policy)["allowed"]


def test_user_limits_are_overwritten_with_a_warning() -> None:
    pod = gpu_pod({"nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "30"})
    pod["spec"]["containers"][0]["env"] = [
        {"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": "80000m"},
        {"name": "CUDA_DEVICE_MEMORY_LIMIT", "value": "80g"},
        {"name": "CUDA_DEVICE_SM_LIMIT", "value": "100"},
    ]
    entry = review_object(pod, DEFAULT_POLICY)
    assert entry["allowed"]
    assert rules_of(entry, "warn") == {"limit-tampering"}
    env = env_of(entry["object"])
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m"
    assert env["CUDA_DEVICE_SM_LIMIT"] == "30"
    assert "CUDA_DEVICE_MEMORY_LIMIT" not in env
    assert all(len(w) <= 120 for w in entry["warnings"])


def test_validation_denies_limits_above_the_request() -> None:
    mutated = review_object(manifest("hami-vgpu-pod.yaml"), DEFAULT_POLICY)["object"]
    env = mutated["spec"]["containers"][0]["env"]
    for item in env:
        if item["name"] == "CUDA_DEVICE_MEMORY_LIMIT_0":
            item["value"] = "40g"
    decision = decide(mutated, Request(kind="Pod"), DEFAULT_POLICY, phase="validate")
    assert not decision.allowed
    assert {v["rule"] for v in decision.violations} == {"limit-tampering", "unmutated-gpu-pod"}


@pytest.mark.parametrize(
    ("limits", "fragment"),
    [
        ({"nvidia.com/gpumem": "3Gi"}, 'write "3072"'),
        ({"nvidia.com/gpumem": "3G"}, 'bytes? write "2861"'),
        ({"nvidia.com/gpumem": "1M"}, "must be 1..524288 MiB"),
        ({"nvidia.com/gpumem": "0"}, "1..524288"),
        ({"nvidia.com/gpumem": "3221225472"}, 'bytes? write "3072"'),
        ({"nvidia.com/gpucores": "1Ki"}, "without a suffix"),
        ({"nvidia.com/gpucores": "150"}, "1..100"),
        ({"nvidia.com/gpumem-percentage": "0"}, "1..100"),
        ({"nvidia.com/gpu": "0.5"}, "whole number"),
        ({"nvidia.com/gpu": "500m"}, "whole number"),
        ({"nvidia.com/gpumem": "lots"}, "not a quantity"),
        ({"aliyun.com/gpu-mem": "7Gi"}, "GiB as a plain integer"),
        # Above 1024 a GiB resource is read as MiB (ACK's MiB unit), up to the MiB maximum:
        # bytes, zero and fractions stay refused.
        ({"aliyun.com/gpu-mem": "524289"}, "1..1024 GiB, or 1025..524288 read as MiB"),
        ({"aliyun.com/gpu-mem": "17066622976"}, "1..1024 GiB, or 1025..524288 read as MiB"),
        ({"aliyun.com/gpu-mem": "16G"}, "1..1024 GiB, or 1025..524288 read as MiB"),
        ({"aliyun.com/gpu-mem": "0"}, "1..1024 GiB"),
        ({"aliyun.com/gpu-mem": "1.5"}, "whole number"),
        ({"nvidia.com/gpumem": "1000", "volcano.sh/vgpu-memory": "1000"}, "memory twice"),
    ],
)
def test_invalid_gpu_request(limits: dict[str, str], fragment: str) -> None:
    entry = review_object(gpu_pod(limits), DEFAULT_POLICY)
    assert rules_of(entry) == {"invalid-gpu-request"}
    assert fragment in entry["violations"][0]["message"]


# Every spelling the apiserver's resource.Quantity reads as zero (it stores each as "0").
ZEROS: Final[tuple[Any, ...]] = (0, "0", "00", "0m", "0.0", "-0", "+0", "0e3", "0Gi", 0.0)


@pytest.mark.parametrize("zero", ZEROS)
def test_a_zero_gpu_count_asks_for_no_gpu(zero: Any) -> None:
    # Volcano's MPI launchers write nvidia.com/gpu: 0: the kubelet gives them no GPU.
    limits = {"nvidia.com/gpu": zero, "cpu": "1"}
    pod = gpu_pod(limits, schedulerName="volcano")
    pod["spec"]["containers"][0]["resources"]["requests"] = dict(limits)
    entry = review_object(pod, DEFAULT_POLICY)
    assert entry["allowed"], entry["violations"]
    assert entry["mode"] == "none"
    assert entry["patch"] == []


@pytest.mark.parametrize("zero", ZEROS)
def test_a_zero_count_beside_a_gpu_container_is_voided(zero: Any) -> None:
    pod = gpu_pod({"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000"})
    limits = {"nvidia.com/gpu": zero}
    launcher = {"name": "launcher", "image": "cuda:12", "resources": {"limits": limits}}
    pod["spec"]["containers"].append(launcher)
    entry = review_object(pod, DEFAULT_POLICY)
    assert entry["allowed"], entry["violations"]
    assert entry["mode"] == "vgpu"
    assert env_of(entry["object"], 1) == {"NVIDIA_VISIBLE_DEVICES": "void"}
    assert "LD_PRELOAD" in env_of(entry["object"], 0)


@pytest.mark.parametrize(
    ("limits", "requests"),
    [
        # A zero count beside a slice is no empty container: the slice implies a GPU.
        ({"nvidia.com/gpu": "0", "nvidia.com/gpumem": "3000"}, None),
        ({"nvidia.com/gpu": "0m", "nvidia.com/gpucores": "30"}, None),
        ({"nvidia.com/gpu": "00", "nvidia.com/mig-1g.5gb": "1"}, None),
        ({"volcano.sh/vgpu-number": "0", "volcano.sh/vgpu-memory": "1024"}, None),
        # Zero memory alone implies a count of one (HAMi's DefaultGPUNum).
        ({"nvidia.com/gpumem": "0"}, None),
        ({"aliyun.com/gpu-mem": "0m"}, None),
        # 0 is a priority (HAMi's high), not an amount.
        ({"nvidia.com/gpu": "0", "nvidia.com/priority": "0"}, None),
        # Zero in limits, a GPU in requests.
        ({"nvidia.com/gpu": "0"}, {"nvidia.com/gpu": "1"}),
        # Not a quantity the apiserver reads as zero.
        ({"nvidia.com/gpu": "0x0"}, None),
        ({"nvidia.com/gpu": " 0"}, None),
        ({"nvidia.com/gpu": False}, None),
    ],
)
def test_a_zero_count_hides_no_slice(limits: dict[str, Any], requests: Any) -> None:
    pod = gpu_pod(limits)
    if requests is not None:
        pod["spec"]["containers"][0]["resources"]["requests"] = requests
    entry = review_object(pod, DEFAULT_POLICY)
    assert "invalid-gpu-request" in rules_of(entry), entry["violations"]


def test_a_zero_count_opens_nothing_the_rules_guard() -> None:
    # A container without a GPU is judged as any: it may not name every device.
    pod = gpu_pod({"nvidia.com/gpu": "0"})
    pod["spec"]["containers"][0]["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    assert "raw-visible-devices" in rules_of(review_object(pod, DEFAULT_POLICY))
    entry = review_object(
        gpu_pod({"nvidia.com/gpu": "0"}, runtimeClassName="nvidia"), DEFAULT_POLICY
    )
    assert entry["allowed"] and entry["mode"] == "none"
    # Under a GPU runtime class it gets no device (the image's ENV cannot open one).
    assert env_of(entry["object"])["NVIDIA_VISIBLE_DEVICES"] == "void"


def test_canonical_quantities_from_the_apiserver_are_plain_numbers() -> None:
    # The apiserver stores `gpumem: 3000` as "3k" and `gpucores: 100` as "100".
    pod = gpu_pod({"nvidia.com/gpumem": "3k", "nvidia.com/gpucores": "100"})
    entry = review_object(pod, DEFAULT_POLICY)
    assert entry["allowed"]
    assert env_of(entry["object"])["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m"


def test_requests_must_equal_limits() -> None:
    pod = gpu_pod({"nvidia.com/gpumem": "3000"})
    pod["spec"]["containers"][0]["resources"]["requests"] = {"nvidia.com/gpumem": "2000"}
    assert rules_of(review_object(pod, DEFAULT_POLICY)) == {"invalid-gpu-request"}
    only_requests = gpu_pod({})
    only_requests["spec"]["containers"][0]["resources"] = {"requests": {"nvidia.com/gpumem": "10"}}
    entry = review_object(only_requests, DEFAULT_POLICY)
    assert "set it in limits" in entry["violations"][0]["message"]


@pytest.mark.parametrize(
    ("annotation", "limits"),
    [
        ("mig", {"nvidia.com/gpumem": "1000"}),
        ("vgpu", {"nvidia.com/mig-1g.5gb": "1"}),
        ("turbo", {"nvidia.com/gpumem": "1000"}),
        (None, {"nvidia.com/mig-1g.5gb": "1", "nvidia.com/gpumem": "1000"}),
    ],
)
def test_mode_conflict(annotation: str | None, limits: dict[str, str]) -> None:
    pod = gpu_pod(limits)
    if annotation:
        pod["metadata"]["annotations"] = {"gpushare.io/mode": annotation}
    assert "mode-conflict" in rules_of(review_object(pod, DEFAULT_POLICY))


def test_mps_restricted_to_namespaces_in_strict_policy() -> None:
    strict = load_policy(EXAMPLES / "strict.yaml")
    pod = gpu_pod(namespace="ml", nodeSelector={"ack.node.gpu.schedule": "mps"})
    entry = review_object(pod, strict)
    assert rules_of(entry) == {"mode-conflict"}
    assert "may not use mode mps" in entry["violations"][0]["message"]
    assert review_object(
        gpu_pod(namespace="gpu-mps-a", nodeSelector={"ack.node.gpu.schedule": "mps"}), strict
    )["allowed"]


def test_vgpu_annotation_on_mps_nodes_conflicts() -> None:
    pod = gpu_pod(nodeSelector={"ack.node.gpu.schedule": "mps"})
    pod["metadata"]["annotations"] = {"gpushare.io/mode": "vgpu"}
    assert rules_of(review_object(pod, DEFAULT_POLICY)) == {"mode-conflict"}


def test_gpu_quota_per_container_and_per_pod() -> None:
    strict = load_policy(EXAMPLES / "strict.yaml")
    big = gpu_pod({"nvidia.com/gpu": "3", "nvidia.com/gpumem": "1000"})
    assert rules_of(review_object(big, strict)) == {"gpu-quota"}
    pod = gpu_pod({"nvidia.com/gpumem": "30000"})
    for name in ("b", "c"):
        pod["spec"]["containers"].append(
            copy.deepcopy(pod["spec"]["containers"][0]) | {"name": name}
        )
    entry = review_object(pod, strict)
    assert [v["message"] for v in entry["violations"]] == [
        "pod: 90000 MiB of GPU memory in all, at most 81920"
    ]
    # Off in the default policy.
    assert review_object(big, DEFAULT_POLICY)["allowed"]


def test_init_containers_count_by_peak_not_sum() -> None:
    policy = policy_with("  rules: {gpu-quota: deny}\n  limits: {perPod: {memoryMiB: 5000}}\n")
    pod = gpu_pod({"nvidia.com/gpumem": "4000"})
    pod["spec"]["initContainers"] = [
        {"name": f"init{i}", "image": "x", "resources": {"limits": {"nvidia.com/gpumem": "4000"}}}
        for i in range(3)
    ]
    assert review_object(pod, policy)["allowed"]


def test_scheduler_bypass() -> None:
    entry = review_object(gpu_pod(schedulerName="my-scheduler"), DEFAULT_POLICY)
    assert rules_of(entry) == {"scheduler-bypass"}
    allowed = policy_with("  allowedSchedulers: [my-scheduler]\n")
    assert review_object(gpu_pod(schedulerName="my-scheduler"), allowed)["allowed"]


def test_forged_allocation_even_with_another_scheduler() -> None:
    pod = gpu_pod(schedulerName="my-scheduler")
    pod["metadata"]["annotations"] = {"hami.io/vgpu-devices-to-allocate": "GPU-1,NVIDIA,1000,30:;"}
    assert rules_of(review_object(pod, DEFAULT_POLICY)) == {"scheduler-bypass", "forged-allocation"}


def test_unmutated_gpu_pod_only_at_validation() -> None:
    pod = manifest("hami-vgpu-pod.yaml")
    request = Request(kind="Pod", namespace="ml")
    assert decide(pod, request, DEFAULT_POLICY, phase="mutate").allowed
    validated = decide(pod, request, DEFAULT_POLICY, phase="validate")
    assert [v["rule"] for v in validated.violations] == ["unmutated-gpu-pod"]
    assert "mutating webhook" in validated.message()


# -- actions and exemptions ------------------------------------------------------------


def test_audit_only_policy_never_denies_but_records() -> None:
    audit = load_policy(EXAMPLES / "audit-only.yaml")
    entry = review_object(manifest("privileged-sidecar.yaml"), audit)
    assert entry["allowed"]
    assert rules_of(entry, "audit") == {"privileged-gpu"}
    assert entry["warnings"] == []


def test_warn_action_produces_a_short_warning() -> None:
    policy = policy_with("  rules: {node-name-pinning: warn}\n")
    entry = review_object(gpu_pod(nodeName="n1"), policy)
    assert entry["allowed"]
    assert entry["warnings"]
    assert entry["warnings"][0].startswith("node-name-pinning: ")
    assert all(len(w) <= 120 for w in entry["warnings"])


def test_off_action_drops_the_rule() -> None:
    policy = policy_with("  rules: {privileged-gpu: off}\n")
    entry = review_object(manifest("privileged-sidecar.yaml"), policy)
    assert entry["allowed"]
    assert entry["violations"] == []


@pytest.mark.parametrize(
    ("exemption", "kwargs"),
    [
        ("namespaces: [ml]", {}),
        ("users: [alice]", {"username": "alice"}),
        ("groups: [gpu-admins]", {"groups": ["gpu-admins"]}),
        ("serviceAccounts: [ml/trainer]", {"username": "system:serviceaccount:ml:trainer"}),
    ],
)
def test_exemptions(exemption: str, kwargs: dict[str, Any]) -> None:
    policy = policy_with(f"  exemptions: {{{exemption}}}\n")
    entry = review_object(manifest("privileged-sidecar.yaml"), policy, **kwargs)
    assert entry["allowed"]
    assert entry["patch"] == []
    other = review_object(
        manifest("privileged-sidecar.yaml"), policy, namespace="team", username="bob"
    )
    assert not other["allowed"]


def test_labels_cannot_opt_out() -> None:
    pod = manifest("privileged-sidecar.yaml")
    pod["metadata"]["labels"] = {
        "gpushare.io/exempt": "true",
        "admission.gatekeeper.sh/ignore": "1",
    }
    assert not review_object(pod, DEFAULT_POLICY)["allowed"]


def test_workload_templates_are_validated() -> None:
    deployment = manifest("eks-mig-deployment.yaml")
    deployment["spec"]["template"]["spec"]["containers"][0]["securityContext"] = {
        "privileged": True
    }
    entry = review_object(deployment, DEFAULT_POLICY, operation="UPDATE")
    assert rules_of(entry) == {"privileged-gpu"}


@pytest.mark.parametrize("kind", ["StatefulSet", "DaemonSet", "ReplicaSet", "Job"])
def test_every_workload_kind_is_mutated(kind: str) -> None:
    pod = manifest("hami-vgpu-pod.yaml")
    workload = {
        "apiVersion": "apps/v1",
        "kind": kind,
        "metadata": {"name": "w", "namespace": "ml"},
        "spec": {"template": {"metadata": {"labels": {"a": "b"}}, "spec": pod["spec"]}},
    }
    entry = review_object(workload, DEFAULT_POLICY)
    assert entry["allowed"]
    assert entry["patch"]
    assert all(op["path"].startswith("/spec/template/") for op in entry["patch"])


def test_cronjob_template_is_mutated() -> None:
    pod = manifest("hami-vgpu-pod.yaml")
    cron = {
        "apiVersion": "batch/v1",
        "kind": "CronJob",
        "metadata": {"name": "c"},
        "spec": {
            "schedule": "* * * * *",
            "jobTemplate": {"spec": {"template": {"spec": pod["spec"]}}},
        },
    }
    entry = review_object(cron, DEFAULT_POLICY)
    assert entry["allowed"]
    assert all(op["path"].startswith("/spec/jobTemplate/spec/template/") for op in entry["patch"])
    assert review_object(entry["object"], DEFAULT_POLICY)["patch"] == []


def test_non_pod_objects_pass_through() -> None:
    service = {"apiVersion": "v1", "kind": "Service", "metadata": {"name": "s"}, "spec": {}}
    entry = review_object(service, DEFAULT_POLICY)
    assert entry["allowed"]
    assert entry["patch"] == []
    assert entry["mode"] == "none"


def test_delete_is_not_evaluated() -> None:
    decision = decide(
        manifest("privileged-sidecar.yaml"),
        Request(kind="Pod", operation="DELETE"),
        DEFAULT_POLICY,
        phase="validate",
    )
    assert decision.allowed
    assert decision.violations == []


# -- what each stack's node provides ---------------------------------------------------


def test_an_ack_pod_gets_no_library_its_nodes_do_not_have() -> None:
    # ACK's gpushare nodes isolate with cGPU: a libvgpu hostPath of type File would keep
    # the pod from starting there, and nothing on them reads HAMi-core's variables.
    entry = review_object(gpu_pod({"aliyun.com/gpu-mem": "4"}), DEFAULT_POLICY)
    assert entry["allowed"], entry["violations"]
    assert entry["mode"] == "vgpu"
    mutated = entry["object"]
    assert "volumes" not in mutated["spec"]
    assert "env" not in mutated["spec"]["containers"][0]
    assert "schedulerName" not in mutated["spec"]  # ACK's extender is the cluster's own
    assert mutated["metadata"]["annotations"] == {"gpushare.io/mode": "vgpu"}
    request = Request(kind="Pod", namespace="ml")
    assert decide(mutated, request, DEFAULT_POLICY, phase="validate").allowed
    assert decide(mutated, request, DEFAULT_POLICY, phase="mutate").patch == []


def test_an_ack_pod_that_also_asks_hami_for_a_slice_gets_the_library() -> None:
    pod = gpu_pod({"aliyun.com/gpu-mem": "4", "nvidia.com/gpucores": "30"})
    mutated = review_object(pod, DEFAULT_POLICY)["object"]
    assert any(v["name"] == "gpushare-vgpu-lib" for v in mutated["spec"]["volumes"])


def test_an_ack_mps_pod_still_gets_the_mps_daemons_pipe() -> None:
    pod = gpu_pod({"aliyun.com/gpu-mem": "4"}, nodeSelector={"ack.node.gpu.schedule": "mps"})
    entry = review_object(pod, DEFAULT_POLICY)
    assert entry["mode"] == "mps"
    assert entry["object"]["spec"]["hostIPC"] is True
    assert [v["name"] for v in entry["object"]["spec"]["volumes"]] == ["gpushare-mps-pipe"]


def test_an_ack_pod_still_meets_the_switch_rules() -> None:
    pod = gpu_pod({"aliyun.com/gpu-mem": "4"})
    pod["spec"]["containers"][0]["env"] = [{"name": "CUDA_DISABLE_CONTROL", "value": "true"}]
    assert rules_of(review_object(pod, DEFAULT_POLICY)) == {"limit-tampering"}


@pytest.mark.parametrize("value", ["true", "1", "yes", " TRUE "])
def test_an_ack_pod_may_not_switch_cgpu_isolation_off(value: str) -> None:
    pod = gpu_pod({"aliyun.com/gpu-mem": "4"})
    pod["spec"]["containers"][0]["env"] = [{"name": "CGPU_DISABLE", "value": value}]
    assert rules_of(review_object(pod, DEFAULT_POLICY)) == {"limit-tampering"}
    pod["spec"]["containers"][0]["env"] = [
        {"name": "CGPU_DISABLE", "valueFrom": {"configMapKeyRef": {"name": "c", "key": "k"}}}
    ]
    assert rules_of(review_object(pod, DEFAULT_POLICY)) == {"limit-tampering"}


def test_cgpu_isolation_left_on_is_admitted() -> None:
    pod = gpu_pod({"aliyun.com/gpu-mem": "4"})
    pod["spec"]["containers"][0]["env"] = [{"name": "CGPU_DISABLE", "value": "false"}]
    assert review_object(pod, DEFAULT_POLICY)["allowed"]


def test_a_configmap_may_not_carry_cgpu_disable() -> None:
    config = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "namespace": "ml"}}
    config["data"] = {"CGPU_DISABLE": "true"}
    assert rules_of(review_object(config, DEFAULT_POLICY)) == {"raw-visible-devices"}


@pytest.mark.parametrize("value", ["mig,hami-core", "hami-core,mig", "mig hami-core"])
def test_a_dynamic_mig_annotation_with_another_mode_in_it_is_refused(value: str) -> None:
    # HAMi matches the annotation as a substring of the card's mode: only "mig" alone
    # keeps the pod off shared cards.
    pod = gpu_pod({"nvidia.com/gpumem": "3000"})
    pod["metadata"]["annotations"] = {"nvidia.com/vgpu-mode": value}
    assert "mode-conflict" in rules_of(review_object(pod, DEFAULT_POLICY))


def test_a_dynamic_mig_pod_meets_the_switch_rules() -> None:
    pod = gpu_pod({"nvidia.com/gpumem": "3000"})
    pod["metadata"]["annotations"] = {"nvidia.com/vgpu-mode": "mig"}
    pod["spec"]["containers"][0]["env"] = [{"name": "CUDA_DISABLE_CONTROL", "value": "true"}]
    assert rules_of(review_object(pod, DEFAULT_POLICY)) == {"limit-tampering"}


def test_kai_binders_ledger_annotation_is_its_own() -> None:
    # KAI's scheduler rebuilds a pod's GPU type from it when the pod has no BindRequest.
    pod = gpu_pod({"nvidia.com/gpu": "1"}, schedulerName="kai-scheduler")
    pod["metadata"]["annotations"] = {"received-resource-type": "Regular"}
    assert rules_of(review_object(pod, DEFAULT_POLICY)) == {"forged-allocation"}
    binder = "system:serviceaccount:kai-scheduler:binder"
    assert review_object(pod, DEFAULT_POLICY, username=binder)["allowed"]


# -- KAI's fractional GPUs: NVIDIA_VISIBLE_DEVICES from the binder's ConfigMap ------------

KAI_PREFIX = "gpu-sharing-x7k2p9q-shared-gpu"
BINDER = "system:serviceaccount:kai-scheduler:binder"


def kai_fraction_pod(
    name: str = f"{KAI_PREFIX}-0", *, annotations: dict[str, str] | None = None, **spec: Any
) -> dict[str, Any]:
    """A pod as KAI's admission webhook leaves it (gpusharing Mutate)."""
    ref = {"name": name, "key": "NVIDIA_VISIBLE_DEVICES"}
    container = {
        "name": "gpu-workload",
        "image": "nvidia/cuda:13.0.2-base-ubi8",
        "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "valueFrom": {"configMapKeyRef": ref}}],
    }
    pod_spec: dict[str, Any] = {"schedulerName": "kai-scheduler", "containers": [container]}
    pod_spec.update(spec)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "gpu-sharing",
            "namespace": "ml",
            "annotations": (
                annotations
                if annotations is not None
                else {"gpu-fraction": "0.5", "runai/shared-gpu-configmap": KAI_PREFIX}
            ),
        },
        "spec": pod_spec,
    }


def test_a_kai_fraction_takes_its_devices_from_the_binders_config_map() -> None:
    entry = review_object(kai_fraction_pod(), DEFAULT_POLICY)
    assert entry["allowed"], entry["violations"]
    assert entry["mode"] == "none"
    assert entry["object"]["spec"]["schedulerName"] == "kai-scheduler"


def _ref(pod: dict[str, Any]) -> dict[str, Any]:
    ref: dict[str, Any] = pod["spec"]["containers"][0]["env"][0]["valueFrom"]["configMapKeyRef"]
    return ref


def _other_key(pod: dict[str, Any]) -> None:
    _ref(pod)["key"] = "GPU_PORTION"


def _optional(pod: dict[str, Any]) -> None:
    # An absent optional ConfigMap leaves the image's NVIDIA_VISIBLE_DEVICES=all.
    _ref(pod)["optional"] = True


def _pinned(pod: dict[str, Any]) -> None:
    # Past KAI's binder: nothing writes the ConfigMap for it.
    pod["spec"]["nodeName"] = "node-1"


def _whole_gpu_too(pod: dict[str, Any]) -> None:
    pod["spec"]["containers"][0]["resources"] = {"limits": {"nvidia.com/gpu": "1"}}


def _second_container(pod: dict[str, Any]) -> None:
    # The ConfigMap of container 0 named by container 1: another container's devices.
    other = copy.deepcopy(pod["spec"]["containers"][0])
    other["name"] = "thief"
    pod["spec"]["containers"].append(other)


def _not_the_fraction_container(pod: dict[str, Any]) -> None:
    # Container 1 reads its own ConfigMap while KAI serves container 0 (its default): the
    # binder writes none for container 1, so it reads another pod's map of that name,
    # whose GPU KAI counted for that pod (a thief pod beside a victim with one prefix).
    thief = copy.deepcopy(pod["spec"]["containers"][0])
    thief["name"] = "thief"
    _ref_of(thief)["name"] = f"{KAI_PREFIX}-1"
    pod["spec"]["containers"][0].pop("env")
    pod["spec"]["containers"].append(thief)


def _named_elsewhere(pod: dict[str, Any]) -> None:
    # KAI serves the container its annotation names; container 0 still reads <prefix>-0.
    pod["spec"]["containers"].append({"name": "served", "image": "busybox"})
    pod["metadata"]["annotations"]["gpu-fraction-container-name"] = "served"


def _ref_of(container: dict[str, Any]) -> dict[str, Any]:
    ref: dict[str, Any] = container["env"][0]["valueFrom"]["configMapKeyRef"]
    return ref


def _init_container(pod: dict[str, Any]) -> None:
    pod["spec"]["initContainers"] = pod["spec"].pop("containers")
    pod["spec"]["containers"] = [{"name": "main", "image": "busybox"}]


def _field_ref_too(pod: dict[str, Any]) -> None:
    pod["spec"]["containers"][0]["env"][0]["valueFrom"]["fieldRef"] = {"fieldPath": "x"}


def _no_scheduler(pod: dict[str, Any]) -> None:
    # Another scheduler (or none) counts no fraction for it.
    pod["spec"].pop("schedulerName")


def _no_fraction(pod: dict[str, Any]) -> None:
    # KAI schedules it as a CPU pod, and its binder writes nothing for it.
    pod["metadata"]["annotations"].pop("gpu-fraction")


def _another_pods(pod: dict[str, Any]) -> None:
    _ref(pod)["name"] = "gpu-sharing-aaaaaaa-shared-gpu-0"


def _outside_the_ledger(pod: dict[str, Any]) -> None:
    # A prefix of the author's that the ledger's configMaps do not hold: anyone writes it.
    pod["metadata"]["annotations"]["runai/shared-gpu-configmap"] = "mine"
    _ref(pod)["name"] = "mine-0"


def _no_prefix(pod: dict[str, Any]) -> None:
    pod["metadata"]["annotations"].pop("runai/shared-gpu-configmap")


# Each a way to take NVIDIA_VISIBLE_DEVICES from a ConfigMap past KAI's accounting.
KAI_ATTACKS: Final[dict[str, Any]] = {
    "no-scheduler": _no_scheduler,
    "default-scheduler": lambda p: p["spec"].update(schedulerName="default-scheduler"),
    "no-fraction": _no_fraction,
    "another-pods": _another_pods,
    "outside-the-ledger": _outside_the_ledger,
    "no-prefix": _no_prefix,
    "other-key": _other_key,
    "optional": _optional,
    "pinned": _pinned,
    "whole-gpu-too": _whole_gpu_too,
    "second-container": _second_container,
    "init-container": _init_container,
    "not-the-fraction-container": _not_the_fraction_container,
    "named-elsewhere": _named_elsewhere,
}


@pytest.mark.parametrize("attack", sorted(KAI_ATTACKS))
def test_devices_from_any_other_config_map_stay_refused(attack: str) -> None:
    pod = kai_fraction_pod()
    KAI_ATTACKS[attack](pod)
    entry = review_object(pod, DEFAULT_POLICY)
    assert "raw-visible-devices" in rules_of(entry), entry["violations"]


def test_a_second_source_in_the_entry_is_refused() -> None:
    # The apiserver refuses two sources; a manifest reviewed offline may hold them.
    pod = kai_fraction_pod()
    _field_ref_too(pod)
    assert "raw-visible-devices" in rules_of(review_object(pod, DEFAULT_POLICY))


def test_an_init_container_takes_its_own_config_map() -> None:
    pod = kai_fraction_pod(f"{KAI_PREFIX}-i0")
    _init_container(pod)
    pod["metadata"]["annotations"]["gpu-fraction-container-name"] = "gpu-workload"
    assert review_object(pod, DEFAULT_POLICY)["allowed"]


def test_the_named_fraction_container_takes_its_config_map() -> None:
    # KAI's gpu-fraction-container-name: container 1 is served, and reads <prefix>-1.
    pod = kai_fraction_pod(f"{KAI_PREFIX}-1")
    served = pod["spec"]["containers"][0]
    served["name"] = "served"
    pod["spec"]["containers"].insert(0, {"name": "sidecar", "image": "busybox"})
    pod["metadata"]["annotations"]["gpu-fraction-container-name"] = "served"
    entry = review_object(pod, DEFAULT_POLICY)
    assert entry["allowed"], entry["violations"]


def test_a_policy_without_the_ledgers_config_maps_refuses_it() -> None:
    policy = policy_with(
        "  ledgers:\n    - name: kai\n      annotations: [received-resource-type]\n"
        "      writers: {serviceAccounts: [kai-scheduler/binder]}\n"
    )
    assert "raw-visible-devices" in rules_of(review_object(kai_fraction_pod(), policy))


def config_map(name: str, data: dict[str, str]) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "namespace": "ml"},
        "data": data,
    }


@pytest.mark.parametrize(
    ("name", "username", "admitted"),
    [
        (f"{KAI_PREFIX}-0", BINDER, True),
        (f"{KAI_PREFIX}-0-evar", BINDER, True),
        # A tenant writing the binder's ConfigMap, or the binder another one.
        (f"{KAI_PREFIX}-0", "alice", False),
        (f"{KAI_PREFIX}-0", "system:serviceaccount:ml:binder", False),
        ("gpu-sharing-env", BINDER, False),
    ],
)
def test_only_kais_binder_writes_devices_into_its_config_maps(
    name: str, username: str, admitted: bool
) -> None:
    obj = config_map(name, {"NVIDIA_VISIBLE_DEVICES": "GPU-1234", "GPU_PORTION": "0.5"})
    for operation in ("CREATE", "UPDATE"):
        request = Request(kind="ConfigMap", operation=operation, namespace="ml", username=username)
        decision = decide(obj, request, DEFAULT_POLICY, phase="validate")
        assert decision.allowed == admitted, decision.violations


# ------------------------------------------------------------------ exceptions

EXCEPTED = parse_policy(
    """
apiVersion: gpushare.io/v1alpha1
kind: GPUSharePolicy
spec:
  exceptions:
    - name: privileged-trainer
      rules: [privileged-gpu]
      namespaces: [ml]
      reason: the trainer needs its device nodes until the rewrite
      owner: ml-platform
      expires: 2027-03-31
    - name: operator-validator
      rules: [raw-visible-devices]
      serviceAccounts: [gpu-operator/*]
      reason: the operator's validator
      owner: platform
"""
)
PRIVILEGED: Final = gpu_pod(
    containers=[
        {
            "name": "main",
            "image": "cuda:12",
            "securityContext": {"privileged": True},
            "resources": {"limits": {"nvidia.com/gpumem": "3000"}},
        }
    ]
)


def _validate(obj: dict[str, Any], *, namespace: str, username: str = "", today: str) -> Any:
    request = Request(kind="Pod", namespace=namespace, username=username, groups=(), today=today)
    return decide(obj, request, EXCEPTED, phase="validate")


def test_an_exception_takes_its_rule_off_in_its_namespace_and_says_so() -> None:
    decision = _validate(PRIVILEGED, namespace="ml", today="2027-01-10")
    assert "privileged-gpu" not in {v["rule"] for v in decision.violations}
    assert decision.excepted == [
        {
            "rule": "privileged-gpu",
            "exception": "privileged-trainer",
            "message": decision.excepted[0]["message"],
        }
    ]
    assert 'container "main"' in decision.excepted[0]["message"]
    # Other rules stay: the unmutated pod is still refused for what it lacks.
    assert {v["rule"] for v in decision.violations} == {"unmutated-gpu-pod"}


@pytest.mark.parametrize(
    ("namespace", "today"),
    [("ml", "2027-04-01"), ("ml", ""), ("other", "2027-01-10")],
    ids=["past-its-last-day", "no-clock", "another-namespace"],
)
def test_outside_its_scope_or_days_an_exception_takes_nothing_off(
    namespace: str, today: str
) -> None:
    decision = _validate(PRIVILEGED, namespace=namespace, today=today)
    assert "privileged-gpu" in {v["rule"] for v in decision.violations}
    assert decision.excepted == []


def test_an_exception_by_requester_holds_for_that_requester_alone() -> None:
    raw = gpu_pod(
        containers=[
            {
                "name": "validator",
                "image": "cuda:12",
                "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
            }
        ]
    )
    validator = "system:serviceaccount:gpu-operator:nvidia-operator-validator"
    by_validator = _validate(raw, namespace="gpu-operator", username=validator, today="")
    by_tenant = _validate(raw, namespace="gpu-operator", username="alice", today="")
    assert [e["rule"] for e in by_validator.excepted] == ["raw-visible-devices"]
    assert by_validator.allowed
    assert not by_tenant.allowed and by_tenant.excepted == []


def test_review_shows_what_an_exception_took_off() -> None:
    entry = review_object(PRIVILEGED, EXCEPTED, namespace="ml", today="2027-01-10")
    assert [e["exception"] for e in entry.get("excepted", [])] == ["privileged-trainer"]
    assert entry["allowed"]
