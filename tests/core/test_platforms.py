"""Each platform's own manifests under the default policy: what that platform expects.

HAMi's vGPU pod goes to hami-scheduler with libvgpu; Alibaba ACK's MPS Job stays on the
cluster's scheduler (ACK's extender lives in it) with hostIPC and the MPS client env;
Volcano's vGPU pod keeps the volcano scheduler; the GPU operator's MIG Deployment is
left exactly as written. The scheduler follows the resources, and the mode only where
the policy names a scheduler for it.
"""

from __future__ import annotations

import copy
from typing import Any, Final

import jsonpatch
import pytest
import yaml

from tests.paths import MANIFESTS
from webhook.core.injection import LIBRARY_PATH
from webhook.core.injection import MODE_ANNOTATION as MODE
from webhook.core.review import ReviewEntry, review_object
from webhook.policies import DEFAULT_POLICY, parse_policy

Obj = dict[str, Any]

ACK_MPS: Final = ("ack-mps-job.yaml", "ack-mps-job-hostipc.yaml")


def manifest(name: str) -> Obj:
    data = yaml.safe_load((MANIFESTS / name).read_text("utf-8"))
    assert isinstance(data, dict)
    return data


def pod_spec(obj: Obj) -> Obj:
    spec: Obj = obj["spec"]["template"]["spec"] if "template" in obj["spec"] else obj["spec"]
    return spec


def env_of(container: Obj) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in container.get("env", [])}


def review(obj: Obj) -> ReviewEntry:
    entry = review_object(obj, DEFAULT_POLICY)
    # Reinvoked on its own output the mutation has nothing left to do.
    if entry["allowed"]:
        assert review_object(entry["object"], DEFAULT_POLICY)["patch"] == []
    return entry


def denials(entry: ReviewEntry) -> list[str]:
    return [v["rule"] for v in entry["violations"] if v["action"] == "deny"]


def scheduler_ops(entry: ReviewEntry) -> list[Any]:
    return [op for op in entry["patch"] if op["path"].endswith("/schedulerName")]


# -- the documented manifests ------------------------------------------------------------


def test_hami_vgpu_pod_goes_to_hami_scheduler_with_libvgpu() -> None:
    entry = review(manifest("hami-vgpu-pod.yaml"))
    assert entry["allowed"], entry["violations"]
    assert entry["mode"] == "vgpu"
    spec = pod_spec(entry["object"])
    assert spec["schedulerName"] == "hami-scheduler"
    container = spec["containers"][0]
    env = env_of(container)
    assert env["LD_PRELOAD"].split(":")[0] == LIBRARY_PATH
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m"
    assert env["CUDA_DEVICE_SM_LIMIT"] == "30"
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert mounts[LIBRARY_PATH]["readOnly"] is True
    assert "hostIPC" not in spec


@pytest.mark.parametrize("name", ACK_MPS)
def test_ack_mps_job_stays_on_the_clusters_scheduler(name: str) -> None:
    written = manifest(name)
    entry = review(written)
    assert entry["allowed"], entry["violations"]
    assert entry["mode"] == "mps"
    assert scheduler_ops(entry) == []
    spec = pod_spec(entry["object"])
    assert "schedulerName" not in spec
    assert spec["hostIPC"] is True
    assert spec["nodeSelector"] == {"ack.node.gpu.schedule": "mps"}
    container = spec["containers"][0]
    env = env_of(container)
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=7168M"  # 7 GiB
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == DEFAULT_POLICY.mps_pipe_directory
    assert "LD_PRELOAD" not in env
    assert LIBRARY_PATH not in str(entry["patch"])
    # ACK counts aliyun.com/gpu-mem itself: no HAMi count resource is implied.
    assert container["resources"]["limits"] == {"aliyun.com/gpu-mem": 7}
    if pod_spec(written).get("hostIPC") is True:
        assert not [op for op in entry["patch"] if op["path"].endswith("/hostIPC")]


def test_ack_mps_job_naming_the_default_scheduler_keeps_it() -> None:
    job = manifest("ack-mps-job.yaml")
    pod_spec(job)["schedulerName"] = "default-scheduler"
    entry = review(job)
    assert entry["allowed"], entry["violations"]
    assert scheduler_ops(entry) == []
    assert pod_spec(entry["object"])["schedulerName"] == "default-scheduler"


def test_volcano_vgpu_pod_keeps_the_volcano_scheduler() -> None:
    entry = review(manifest("volcano-vgpu-pod.yaml"))
    assert entry["allowed"], entry["violations"]
    assert entry["mode"] == "vgpu"
    spec = pod_spec(entry["object"])
    assert spec["schedulerName"] == "volcano"
    env = env_of(spec["containers"][0])
    assert env["LD_PRELOAD"].split(":")[0] == LIBRARY_PATH
    assert [env[f"CUDA_DEVICE_MEMORY_LIMIT_{i}"] for i in range(2)] == ["3000m", "3000m"]


def test_eks_mig_deployment_is_left_as_written() -> None:
    written = manifest("eks-mig-deployment.yaml")
    entry = review(written)
    assert entry["allowed"], entry["violations"]
    assert entry["mode"] == "mig"
    assert entry["patch"] == []
    assert entry["object"] == written
    assert "schedulerName" not in pod_spec(entry["object"])


# -- the scheduler per resource family, mode by mode -------------------------------------


def _pod(limits: Obj, **spec: Any) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "p", "namespace": "ml", **spec.pop("metadata", {})},
        "spec": {
            "containers": [{"name": "main", "image": "cuda:12", "resources": {"limits": limits}}],
            **spec,
        },
    }


_MPS: Final = {"nodeSelector": {"ack.node.gpu.schedule": "mps"}}
_ANNOTATED_MPS: Final = {"metadata": {"annotations": {"gpushare.io/mode": "mps"}}}


@pytest.mark.parametrize(
    ("limits", "spec", "mode", "scheduler"),
    [
        ({"nvidia.com/gpumem": "3000"}, {}, "vgpu", "hami-scheduler"),
        # HAMi's own MPS pods ask for HAMi's resources: hami-scheduler counts them.
        ({"nvidia.com/gpumem": "3000"}, _ANNOTATED_MPS, "mps", "hami-scheduler"),
        ({"aliyun.com/gpu-mem": "3"}, _MPS, "mps", None),
        # ACK's cGPU pools: the same resources in vGPU mode stay on ACK's scheduler.
        ({"aliyun.com/gpu-mem": "3"}, {}, "vgpu", None),
        ({"volcano.sh/vgpu-memory": "3000"}, {}, "vgpu", "volcano"),
        # Volcano's older GPU-share plugin (its deviceshare gpushare device).
        ({"volcano.sh/gpu-memory": "2048"}, {}, "vgpu", "volcano"),
        ({"nvidia.com/mig-1g.5gb": "1"}, {}, "mig", None),
    ],
    ids=["hami-vgpu", "hami-mps", "ack-mps", "ack-vgpu", "volcano-vgpu", "volcano-gpushare", "mig"],
)
def test_scheduler_follows_the_resources_in_every_mode(
    limits: Obj, spec: Obj, mode: str, scheduler: str | None
) -> None:
    entry = review(_pod(limits, **copy.deepcopy(spec)))
    assert entry["allowed"], entry["violations"]
    assert entry["mode"] == mode
    assert pod_spec(entry["object"]).get("schedulerName") == scheduler


# volcano-sh/volcano docs/user-guide/how_to_use_gpu_sharing.md: "volcano.sh/gpu-memory:
# 1024 # requesting 1024MB GPU memory" (VOLCANO_GPU_MEMORY_TOTAL=11178 per card), the
# resource of pkg/scheduler/api/devices/nvidia/gpushare/type.go (VolcanoGPUResource).
@pytest.mark.parametrize("limit", ["2Gi", "0", "2147483648"])
def test_volcano_gpu_memory_is_mib(limit: str) -> None:
    entry = review(_pod({"volcano.sh/gpu-memory": limit}))
    assert denials(entry) == ["invalid-gpu-request"]
    assert "MiB" in entry["violations"][0]["message"]


@pytest.mark.parametrize("mode", ["vgpu", "mps"])
def test_a_volcano_gpushare_pod_gets_its_memory_limit_and_no_count(mode: str) -> None:
    pod = _pod({"volcano.sh/gpu-memory": "2048"}, metadata={"annotations": {MODE: mode}})
    entry = review(pod)
    assert entry["allowed"], entry["violations"]
    spec = pod_spec(entry["object"])
    env = env_of(spec["containers"][0])
    if mode == "vgpu":
        # Its device plugin (volcano-sh/devices) only picks the card: no HAMi-core there
        # to read a limit (vgpu.withoutLibrary), and no libvgpu hostPath to miss.
        assert "CUDA_DEVICE_MEMORY_LIMIT_0" not in env
        assert "volumes" not in spec
    else:
        assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=2048M"
    # Its plugin counts memory, not cards: no volcano.sh/vgpu-number (another device
    # plugin's resource, which its nodes lack) is implied.
    assert spec["containers"][0]["resources"]["limits"] == {"volcano.sh/gpu-memory": "2048"}
    # Volcano's vGPU resources still imply their count.
    vgpu = review(_pod({"volcano.sh/vgpu-memory": "3000"}))
    limits = pod_spec(vgpu["object"])["containers"][0]["resources"]["limits"]
    assert limits["volcano.sh/vgpu-number"] == "1"


def test_default_scheduler_named_by_hand_is_replaced_for_hami_pods_only() -> None:
    hami = review(_pod({"nvidia.com/gpumem": "3000"}, schedulerName="default-scheduler"))
    assert scheduler_ops(hami) == [
        {"op": "replace", "path": "/spec/schedulerName", "value": "hami-scheduler"}
    ]
    ack = review(_pod({"aliyun.com/gpu-mem": "3"}, schedulerName="default-scheduler", **_MPS))
    assert ack["allowed"] and scheduler_ops(ack) == []


# -- scheduler-bypass follows the resources ----------------------------------------------


@pytest.mark.parametrize(
    ("limits", "spec", "named"),
    [
        ({"nvidia.com/gpumem": "3000"}, {}, "volcano"),
        ({"nvidia.com/gpumem": "3000"}, _ANNOTATED_MPS, "my-scheduler"),
        ({"aliyun.com/gpu-mem": "3"}, _MPS, "hami-scheduler"),
        ({"aliyun.com/gpu-mem": "3"}, _MPS, "my-scheduler"),
        ({"volcano.sh/vgpu-memory": "3000"}, {}, "hami-scheduler"),
        ({"volcano.sh/gpu-memory": "2048"}, {}, "hami-scheduler"),
    ],
    ids=[
        "hami-to-volcano",
        "hami-mps-to-mine",
        "ack-to-hami",
        "ack-to-mine",
        "volcano-to-hami",
        "volcano-gpushare-to-hami",
    ],
)
def test_a_scheduler_that_does_not_account_for_the_resources_is_a_bypass(
    limits: Obj, spec: Obj, named: str
) -> None:
    entry = review(_pod(limits, schedulerName=named, **copy.deepcopy(spec)))
    assert not entry["allowed"]
    assert denials(entry) == ["scheduler-bypass"]
    wanted = DEFAULT_POLICY.resource_schedulers.get(next(iter(limits)), "hami-scheduler")
    assert f"({wanted} accounts for these GPU resources)" in entry["violations"][0]["message"]


def test_mixing_vendors_does_not_shake_off_hami_scheduler() -> None:
    """A sidecar asking for ACK's memory must not move a HAMi pod to a scheduler that does
    not count nvidia.com/gpumem."""
    pod = _pod({"nvidia.com/gpumem": "3000"}, schedulerName="default-scheduler")
    pod["spec"]["containers"].append(
        {"name": "side", "image": "cuda:12", "resources": {"limits": {"aliyun.com/gpu-mem": "1"}}}
    )
    entry = review(pod)
    assert pod_spec(entry["object"])["schedulerName"] == "hami-scheduler"
    pod["spec"]["schedulerName"] = "my-scheduler"
    assert denials(review(pod)) == ["scheduler-bypass"]


def test_allowed_schedulers_still_apply_per_resource() -> None:
    policy = parse_policy(
        "apiVersion: gpushare.io/v1alpha1\nkind: GPUSharePolicy\nspec:\n"
        "  allowedSchedulers: [my-scheduler]\n"
    )
    pod = _pod({"aliyun.com/gpu-mem": "3"}, schedulerName="my-scheduler", **_MPS)
    entry = review_object(pod, policy)
    assert entry["allowed"], entry["violations"]
    assert scheduler_ops(entry) == []


def test_validate_accepts_the_mutated_ack_job_as_the_apiserver_stores_it() -> None:
    """/validate sees the object after every mutating webhook: a stored ACK pod carries
    schedulerName default-scheduler (the apiserver's default) and is not unmutated."""
    entry = review(manifest("ack-mps-job.yaml"))
    stored = jsonpatch.apply_patch(
        copy.deepcopy(entry["object"]),
        [{"op": "add", "path": "/spec/template/spec/schedulerName", "value": "default-scheduler"}],
    )
    again = review_object(stored, DEFAULT_POLICY)
    assert again["allowed"], again["violations"]
    assert again["patch"] == []


# -- a scheduler per mode ----------------------------------------------------------------

MPS_ON_DEFAULT: Final = parse_policy(
    "apiVersion: gpushare.io/v1alpha1\nkind: GPUSharePolicy\nspec:\n"
    "  schedulerName:\n    mps: default-scheduler\n"
)


def test_a_policy_sending_mps_to_the_clusters_scheduler_keeps_ack_mps_pods_there() -> None:
    """On ACK's MPS pools the cluster's scheduler (ACK's extender) places MPS pods, also
    those asking for HAMi's resources: with ``mps: default-scheduler`` they keep it."""
    pod = _pod({"nvidia.com/gpumem": "3000"}, **copy.deepcopy(_MPS))
    entry = review_object(pod, MPS_ON_DEFAULT)
    assert entry["allowed"], entry["violations"]
    assert entry["mode"] == "mps"
    assert scheduler_ops(entry) == []
    assert "schedulerName" not in pod_spec(entry["object"])
    assert review_object(entry["object"], MPS_ON_DEFAULT)["patch"] == []
    # Under the default policy the same pod goes to hami-scheduler, which counts gpumem.
    assert pod_spec(review(pod)["object"])["schedulerName"] == "hami-scheduler"
    # Naming HAMi's scheduler by hand is now the bypass.
    named = _pod({"nvidia.com/gpumem": "3000"}, schedulerName="hami-scheduler", **_MPS)
    refused = review_object(named, MPS_ON_DEFAULT)
    assert denials(refused) == ["scheduler-bypass"]
    assert "(default-scheduler accounts for these GPU resources)" in str(refused["violations"])


def test_the_mode_entry_leaves_other_modes_and_listed_resources_alone() -> None:
    vgpu = review_object(_pod({"nvidia.com/gpumem": "3000"}), MPS_ON_DEFAULT)
    assert pod_spec(vgpu["object"])["schedulerName"] == "hami-scheduler"
    # Volcano's resources are counted by Volcano alone, whatever the mode.
    volcano = _pod({"volcano.sh/vgpu-memory": "3000"}, **copy.deepcopy(_ANNOTATED_MPS))
    entry = review_object(volcano, MPS_ON_DEFAULT)
    assert entry["allowed"], entry["violations"]
    assert entry["mode"] == "mps"
    assert pod_spec(entry["object"])["schedulerName"] == "volcano"


def test_a_pod_mutated_under_per_mode_schedulers_passes_its_own_validation() -> None:
    """gpucores listed for hami-scheduler, vGPU pods elsewhere: the nvidia.com/gpu the
    mutation adds must not move the pod off the scheduler it was given."""
    policy = parse_policy(
        "apiVersion: gpushare.io/v1alpha1\nkind: GPUSharePolicy\nspec:\n  schedulerName:\n"
        "    vgpu: my-scheduler\n    nvidia.com/gpucores: hami-scheduler\n"
    )
    entry = review_object(_pod({"nvidia.com/gpucores": "30"}), policy)
    assert entry["allowed"], entry["violations"]
    spec = pod_spec(entry["object"])
    assert spec["schedulerName"] == "hami-scheduler"
    assert spec["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] == "1"
    again = review_object(entry["object"], policy)
    assert again["allowed"], again["violations"]
    assert again["patch"] == []
