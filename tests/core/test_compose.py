"""The mutation composed with what HAMi's node side adds at container start.

HAMi's device plugin, at ``Allocate`` (Project-HAMi/HAMi
pkg/device-plugin/nvidiadevice/nvinternal/plugin/server.go:830-890 @ 4707fb02), sets
``CUDA_DEVICE_MEMORY_SHARED_CACHE=/usr/local/vgpu/<uuid>.cache`` and mounts the host's
per-container directory read-write at ``/usr/local/vgpu``; HAMi's vGPU monitor reads the
regions only as ``.cache`` files directly in those directories (pkg/monitor/nvidia/
cudevshr.go:227-260) and sizes its priority table by each region's priority
(cmd/vGPUmonitor/feedback.go:90-97).

Attacks first: each refused shape was admitted before the change, and the mutation
pinned the region below /usr/local/vgpu, out of the monitor's sight.
"""

from __future__ import annotations

import posixpath
from typing import Any, Final

import pytest

from tests.core.test_bypass import (
    GPU_LIMITS,
    assert_clean,
    assert_refused,
    container,
    env_of,
    gpu,
    pod,
    review,
    stored,
    workload,
)
from webhook.core.decision import Request, decide
from webhook.core.injection import OVERRIDE_ENV_FILE, VOLUME_OVERRIDE_ENV
from webhook.policies import DEFAULT_POLICY

Obj = dict[str, Any]

REGION: Final = "CUDA_DEVICE_MEMORY_SHARED_CACHE"
PRIORITY: Final = "CUDA_TASK_PRIORITY"
# HAMi's device plugin mounts its per-container directory here (HOOK_PATH/vgpu).
REGION_DIR: Final = "/usr/local/vgpu"


def validated(obj: Obj) -> set[str]:
    """The rules /validate refuses ``obj`` under, as it arrives (no mutation before)."""
    facts = Request(kind=str(obj["kind"]), namespace="ml", username="alice")
    decision = decide(obj, facts, DEFAULT_POLICY, phase="validate")
    return {v["rule"] for v in decision.denials}


# ======================================================================================
# Channel 6: the shared region where HAMi's monitor reads it
# ======================================================================================


def _visible_to_monitor(value: str) -> bool:
    return posixpath.dirname(value) == REGION_DIR and value.endswith(".cache")


@pytest.mark.parametrize("read_only_root", [False, True])
def test_the_mutation_leaves_the_region_where_hamis_monitor_reads_it(
    read_only_root: bool,
) -> None:
    main = gpu(securityContext={"readOnlyRootFilesystem": read_only_root})
    entry = review(pod(main))
    assert entry["allowed"], entry["violations"]
    final = entry["object"]
    region = env_of(final).get(REGION)
    # Unset: the device plugin's value (a file directly in its per-container directory,
    # which it mounts read-write, so a read-only root filesystem does not matter) stands.
    assert region is None or _visible_to_monitor(region), region
    # No mount the mutation adds hides that directory's files from the monitor, or the
    # directory itself: below /usr/local/vgpu only the read-only library.
    for item in final["spec"]["containers"][0].get("volumeMounts", []):
        path = posixpath.normpath(item["mountPath"])
        if path == REGION_DIR or path.startswith(REGION_DIR + "/"):
            assert path == f"{REGION_DIR}/libvgpu.so" and item.get("readOnly") is True, item
    # The one emptyDir is the pin of HAMi-core's /overrideEnv, mounted there read-only.
    empty = [v["name"] for v in final["spec"].get("volumes", []) if "emptyDir" in v]
    assert empty == [VOLUME_OVERRIDE_ENV], final
    at = [m for m in final["spec"]["containers"][0]["volumeMounts"] if m["name"] in empty]
    assert at == [{"name": VOLUME_OVERRIDE_ENV, "mountPath": OVERRIDE_ENV_FILE, "readOnly": True}]


REFUSED_REGIONS: Final[dict[str, Obj]] = {
    # A host path every vGPU pod on the node shares read-write: another pod maps the
    # same region, and HAMi-core takes the limits of whoever initialised it first.
    "shared-lock-dir": {"name": REGION, "value": "/tmp/vgpulock/shared.cache"},
    "below-the-dir": {"name": REGION, "value": "/usr/local/vgpu/cache/main.cache"},
    "dot-dot": {"name": REGION, "value": "/usr/local/vgpu/../vgpulock/x.cache"},
    "hami-core-default": {"name": REGION, "value": "/tmp/cudevshr.cache"},
    # The monitor reads only names that end in .cache and skips those naming libvgpu.so.
    "no-cache-suffix": {"name": REGION, "value": "/usr/local/vgpu/region"},
    "library-name": {"name": REGION, "value": "/usr/local/vgpu/libvgpu.so.cache"},
    "relative": {"name": REGION, "value": "usr/local/vgpu/x.cache"},
    "empty": {"name": REGION, "value": ""},
    "expanded": {"name": REGION, "value": "$(ELSEWHERE)"},
    "value-from": {
        "name": REGION,
        "valueFrom": {"configMapKeyRef": {"name": "c", "key": "region"}},
    },
}


@pytest.mark.parametrize("shape", sorted(REFUSED_REGIONS))
def test_a_region_the_monitor_cannot_read_is_refused(shape: str) -> None:
    entry = review(pod(gpu(env=[REFUSED_REGIONS[shape]])))
    assert_refused(entry, "limit-tampering")


@pytest.mark.parametrize("shape", ["shared-lock-dir", "value-from"])
def test_a_region_the_monitor_cannot_read_is_refused_in_every_container(shape: str) -> None:
    sidecar = container("helper", env=[REFUSED_REGIONS[shape]])
    assert_refused(review(pod(gpu(), sidecar)), "limit-tampering")
    init = container("fetch", env=[REFUSED_REGIONS[shape]])
    assert_refused(review(pod(gpu(), init=[init])), "limit-tampering")


def test_a_region_the_monitor_cannot_read_is_refused_in_a_template() -> None:
    template = pod(gpu(env=[REFUSED_REGIONS["shared-lock-dir"]]))
    assert_refused(review(workload("Deployment", template)), "limit-tampering")


def test_a_region_set_after_the_mutation_is_refused_at_validation() -> None:
    final = stored(pod(gpu()))
    final["spec"]["containers"][0]["env"].append(REFUSED_REGIONS["shared-lock-dir"])
    assert "limit-tampering" in validated(final)


@pytest.mark.parametrize(
    "value",
    ["/usr/local/vgpu/main.cache", "/usr/local/vgpu//main.cache", "/usr/local/vgpu/./a.cache"],
)
def test_a_region_directly_in_the_device_plugins_directory_is_kept(value: str) -> None:
    entry = review(pod(gpu(env=[{"name": REGION, "value": value}])))
    assert_clean(entry)
    assert env_of(entry["object"])[REGION] == value


def test_a_region_in_a_pod_without_a_gpu_is_not_hami_cores() -> None:
    assert_clean(review(pod(container("app", env=[REFUSED_REGIONS["shared-lock-dir"]]))))


# ======================================================================================
# Channel 6: CUDA_TASK_PRIORITY is 0 (high) or 1 (low), as HAMi documents
# ======================================================================================


@pytest.mark.parametrize("value", ["0", "1"])
def test_a_documented_priority_is_pinned_from_the_resource(value: str) -> None:
    entry = review(pod(gpu(limits={**GPU_LIMITS, "nvidia.com/priority": value})))
    assert_clean(entry)
    assert env_of(entry["object"])[PRIORITY] == value


@pytest.mark.parametrize("value", ["2", "5", "-1", "999999999"])
def test_another_priority_resource_is_refused(value: str) -> None:
    # The monitor grows its table to the priority (feedback.go:94-96): 999999999 costs it
    # gigabytes; a negative one is never counted nor blocked.
    entry = review(pod(gpu(limits={**GPU_LIMITS, "nvidia.com/priority": value})))
    assert_refused(entry, "invalid-gpu-request")


@pytest.mark.parametrize("value", ["5", "-1", "2", " 7", "1x", "$(P)"])
def test_another_priority_in_the_env_is_refused(value: str) -> None:
    entry = review(pod(gpu(env=[{"name": PRIORITY, "value": value}])))
    assert_refused(entry, "limit-tampering")


def test_a_priority_in_the_env_of_a_sidecar_is_refused() -> None:
    sidecar = container("helper", env=[{"name": PRIORITY, "value": "5"}])
    assert_refused(review(pod(gpu(), sidecar)), "limit-tampering")


def test_a_documented_priority_in_the_env_is_overwritten_by_the_resources() -> None:
    entry = review(pod(gpu(env=[{"name": PRIORITY, "value": "0"}])))
    assert entry["allowed"], entry["violations"]
    assert env_of(entry["object"])[PRIORITY] == "1"
    assert [v["rule"] for v in entry["violations"]] == ["limit-tampering"]
    assert {v["action"] for v in entry["violations"]} == {"warn"}
