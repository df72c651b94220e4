"""Who holds which GPU slice: cards from node registrations and labels, holders from pods."""

from __future__ import annotations

import json
from typing import Any

import orjson
from hypothesis import given, settings
from hypothesis import strategies as st

from webhook.core.allocation import (
    INVENTORY_KIND,
    CardAllocation,
    NodeAllocation,
    allocations,
    pod_devices,
    to_document,
)
from webhook.policies import DEFAULT_POLICY

Obj = dict[str, Any]
H100 = "NVIDIA-H100-80GB-HBM3"


def hami_device(uuid: str, index: int, **extra: Any) -> Obj:
    device: Obj = {
        "id": uuid,
        "count": 10,
        "devmem": 81559,
        "devcore": 100,
        "type": H100,
        "numa": 0,
        "mode": "hami-core",
        "health": True,
        **extra,
    }
    if index:  # HAMi's omitempty drops a zero index
        device["index"] = index
    return device


def node(
    name: str,
    status: Obj | None = None,
    *,
    annotations: Obj | None = None,
    labels: Obj | None = None,
) -> Obj:
    return {
        "metadata": {"name": name, "annotations": annotations or {}, "labels": labels or {}},
        "status": {"allocatable": status or {}, "capacity": status or {}},
    }


def hami_node(name: str, *devices: Obj) -> Obj:
    register = json.dumps(list(devices) or [hami_device("GPU-a", 0), hami_device("GPU-b", 1)])
    return node(
        name, {"nvidia.com/gpu": "20"}, annotations={"hami.io/node-nvidia-register": register}
    )


def pod(
    name: str,
    *,
    node_name: str | None = "n1",
    annotations: Obj | None = None,
    limits: Obj | None = None,
    phase: str = "Running",
    namespace: str = "ml",
    **spec: Any,
) -> Obj:
    containers = [{"name": "main", "image": "cuda", "resources": {"limits": limits or {}}}]
    body: Obj = {"containers": containers, **spec}
    if node_name:
        body["nodeName"] = node_name
    return {
        "metadata": {"name": name, "namespace": namespace, "annotations": annotations or {}},
        "spec": body,
        "status": {"phase": phase},
    }


def allocated(devices: str, **more: str) -> Obj:
    return {"hami.io/vgpu-devices-allocated": devices, **more}


def one(nodes: Any, pods: Any = ()) -> NodeAllocation:
    found = allocations(nodes, pods, DEFAULT_POLICY)
    assert len(found) == 1, found
    return found[0]


def card(found: NodeAllocation, index: int) -> CardAllocation:
    return next(c for c in found.cards if c.index == index)


# -- cards ------------------------------------------------------------------------------


def test_hami_registration_gives_cards_with_ids_indexes_and_modes() -> None:
    found = one([hami_node("n1")])
    assert found.source == "hami"
    assert [(c.index, c.uuid, c.model, c.mode, c.memory_mib, c.slots) for c in found.cards] == [
        (0, "GPU-a", H100, "vgpu", 81559, 10),
        (1, "GPU-b", H100, "vgpu", 81559, 10),
    ]
    assert found.memory_mib == 2 * 81559 and found.cores == 200


def test_legacy_registration_form_is_read_too() -> None:
    legacy = (
        "GPU-x,10,16384,100,NVIDIA-Tesla-T4,0,true:GPU-y,4,16384,100,NVIDIA-Tesla-T4,0,false,1,mps:"
    )
    found = one([node("n1", annotations={"hami.io/node-nvidia-register": legacy})])
    assert [(c.index, c.uuid, c.mode, c.slots, c.healthy) for c in found.cards] == [
        (0, "GPU-x", "vgpu", 10, True),
        (1, "GPU-y", "mps", 4, False),
    ]


def test_unhealthy_card_is_one_without_health_as_hami_omits_false() -> None:
    sick = hami_device("GPU-a", 0)
    del sick["health"]
    assert card(one([hami_node("n1", sick)]), 0).healthy is False


def test_gfd_labels_give_alike_cards_and_the_policy_maps_labels_to_a_mode() -> None:
    labels = {
        "nvidia.com/gpu.count": "2",
        "nvidia.com/gpu.memory": "40960",
        "nvidia.com/gpu.product": "NVIDIA-A100-SXM4-40GB",
        "ack.node.gpu.schedule": "mps",
    }
    found = one([node("n1", {"nvidia.com/gpu": "2"}, labels=labels)])
    assert found.source == "gfd"
    assert [(c.index, c.model, c.mode, c.memory_mib) for c in found.cards] == [
        (0, "NVIDIA-A100-SXM4-40GB", "mps", 40960),
        (1, "NVIDIA-A100-SXM4-40GB", "mps", 40960),
    ]


def test_a_broken_registration_falls_back_to_the_labels() -> None:
    labels = {"nvidia.com/gpu.count": "1", "nvidia.com/gpu.memory": "16384"}
    found = one([node("n1", annotations={"hami.io/node-nvidia-register": "[{oops"}, labels=labels)])
    assert found.source == "gfd" and [c.memory_mib for c in found.cards] == [16384]


def test_ack_capacity_gives_cards_and_its_card_index_places_the_pod() -> None:
    labels = {"aliyun.accelerator/nvidia_name": "Tesla-V100-SXM2-16GB"}
    ack = node("n1", {"aliyun.com/gpu-count": "2", "aliyun.com/gpu-mem": "32"}, labels=labels)
    holder = pod(
        "share",
        limits={"aliyun.com/gpu-mem": "3"},
        annotations={"ALIYUN_COM_GPU_MEM_IDX": "1"},
    )
    found = one([ack], [holder])
    assert found.source == "ack"
    assert [c.memory_mib for c in found.cards] == [16384, 16384]
    assert card(found, 0).holders == ()
    assert [(h.pod, h.memory_mib) for h in card(found, 1).holders] == [("ml/share", 3072)]
    assert found.unassigned == ()


def test_nodes_without_gpus_and_pods_are_left_out_and_node_name_keeps_one() -> None:
    plain = node("cpu-only", {"cpu": "8"})
    assert [n.name for n in allocations([plain, hami_node("n1")], [], DEFAULT_POLICY)] == ["n1"]
    both = [hami_node("n1"), hami_node("n2")]
    assert [n.name for n in allocations(both, [], DEFAULT_POLICY, node_name="n2")] == ["n2"]


# -- holders ------------------------------------------------------------------------------


def test_hami_allocation_places_the_pod_on_its_card_with_memory_and_cores() -> None:
    pods = [
        pod("a", annotations=allocated("GPU-a,NVIDIA,3000,30:;")),
        pod("b", annotations=allocated("GPU-a,NVIDIA,5000,0:;")),
    ]
    found = one([hami_node("n1")], pods)
    first = card(found, 0)
    assert [(h.pod, h.mode, h.memory_mib, h.cores) for h in first.holders] == [
        ("ml/a", "vgpu", 3000, 30),
        ("ml/b", "vgpu", 5000, 0),
    ]
    assert (first.allocated_memory_mib, first.allocated_cores) == (8000, 30)
    assert card(found, 1).holders == ()
    assert (found.allocated_memory_mib, found.pods) == (8000, 2)


def test_containers_and_devices_of_one_pod_sum_per_card() -> None:
    # Two containers (";"), the first on two cards (":"), the second on card a again.
    devices = "GPU-a,NVIDIA,1000,10:GPU-b,NVIDIA,1000,10:;GPU-a,NVIDIA,2000,20:;"
    found = one([hami_node("n1")], [pod("multi", annotations=allocated(devices))])
    assert [(h.memory_mib, h.cores, h.gpus) for h in card(found, 0).holders] == [(3000, 30, 2)]
    assert [(h.memory_mib, h.cores, h.gpus) for h in card(found, 1).holders] == [(1000, 10, 1)]
    assert found.pods == 1


def test_to_allocate_counts_until_the_device_plugin_writes_allocated() -> None:
    scheduled = {"hami.io/vgpu-devices-to-allocate": "GPU-b,NVIDIA,4000,40:;"}
    both = {**scheduled, "hami.io/vgpu-devices-allocated": "GPU-a,NVIDIA,1000,10:;"}
    found = one([hami_node("n1")], [pod("p", annotations=scheduled)])
    assert [h.memory_mib for h in card(found, 1).holders] == [4000]
    found = one([hami_node("n1")], [pod("p", annotations=both)])
    assert [h.memory_mib for h in card(found, 0).holders] == [1000]
    assert card(found, 1).holders == ()


def test_assigned_node_annotation_places_a_pod_not_yet_bound() -> None:
    annotations = allocated("GPU-a,NVIDIA,3000,30:;", **{"hami.io/vgpu-node": "n1"})
    found = one([hami_node("n1")], [pod("binding", node_name=None, annotations=annotations)])
    assert [h.pod for h in card(found, 0).holders] == ["ml/binding"]


def test_finished_and_pending_pods_hold_nothing() -> None:
    pods = [
        pod("done", phase="Succeeded", annotations=allocated("GPU-a,NVIDIA,3000,30:;")),
        pod("crashed", phase="Failed", limits={"nvidia.com/gpumem": "1000"}),
        pod("pending", node_name=None, limits={"nvidia.com/gpumem": "1000"}),
    ]
    found = one([hami_node("n1")], pods)
    assert found.allocated_memory_mib == 0 and found.pods == 0


def test_a_bound_gpu_pod_without_device_annotation_is_unassigned_to_a_card() -> None:
    limits = {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "25"}
    found = one([hami_node("n1")], [pod("plain", limits=limits)])
    assert all(c.holders == () for c in found.cards)
    assert [(h.pod, h.mode, h.gpus, h.memory_mib, h.cores) for h in found.unassigned] == [
        ("ml/plain", "vgpu", 2, 6000, 50)
    ]
    assert (found.allocated_memory_mib, found.allocated_cores, found.pods) == (6000, 50, 1)


def test_a_whole_gpu_is_the_card_memory_when_every_card_is_alike() -> None:
    whole = pod("whole", limits={"nvidia.com/gpu": "1"})
    found = one([hami_node("n1")], [whole])
    assert [(h.memory_mib, h.cores) for h in found.unassigned] == [(81559, 100)]
    small = hami_device("GPU-b", 1, devmem=40960)
    mixed = one([hami_node("n1", hami_device("GPU-a", 0), small)], [whole])
    assert [h.memory_mib for h in mixed.unassigned] == [None]
    assert mixed.allocated_memory_mib == 0


def test_a_memory_percentage_is_resolved_against_alike_cards() -> None:
    found = one([hami_node("n1")], [pod("half", limits={"nvidia.com/gpumem-percentage": "50"})])
    assert [h.memory_mib for h in found.unassigned] == [81559 // 2]


def test_mps_pod_on_an_ack_mps_node_is_held_in_mps_mode_in_mib() -> None:
    labels = {
        "nvidia.com/gpu.count": "1",
        "nvidia.com/gpu.memory": "81559",
        "ack.node.gpu.schedule": "mps",
    }
    mps = pod(
        "client",
        limits={"aliyun.com/gpu-mem": "7", "aliyun.com/gpu-core.percentage": "30"},
        nodeSelector={"ack.node.gpu.schedule": "mps"},
    )
    found = one([node("n1", labels=labels)], [mps])
    assert [(h.mode, h.memory_mib, h.cores) for h in found.unassigned] == [("mps", 7168, 30)]


def test_init_containers_count_when_they_ask_for_more_than_the_containers() -> None:
    spec_pod = pod("init", limits={"nvidia.com/gpumem": "1000"})
    spec_pod["spec"]["initContainers"] = [
        {
            "name": "warm",
            "image": "cuda",
            "resources": {"limits": {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "4000"}},
        }
    ]
    found = one([hami_node("n1")], [spec_pod])
    assert [(h.gpus, h.memory_mib) for h in found.unassigned] == [(2, 8000)]


def test_a_pod_on_a_card_the_node_does_not_register_is_shown_on_an_unregistered_card() -> None:
    found = one(
        [hami_node("n1")], [pod("ghost", annotations=allocated("GPU-zzz,NVIDIA,1000,10:;"))]
    )
    ghost = found.cards[-1]
    assert (ghost.uuid, ghost.registered, ghost.index) == ("GPU-zzz", False, 2)
    assert [h.pod for h in ghost.holders] == ["ml/ghost"]


def test_pods_on_a_node_that_is_not_listed_still_show() -> None:
    found = one([], [pod("orphan", node_name="gone", limits={"nvidia.com/gpumem": "1000"})])
    assert (found.name, found.source, found.cards) == ("gone", "none", ())
    assert [h.memory_mib for h in found.unassigned] == [1000]


# -- MIG ----------------------------------------------------------------------------------


def test_hami_mig_card_lists_profiles_exposed_and_in_use() -> None:
    profiles = [
        {
            "name": "1g.10gb",
            "memoryMB": 9856,
            "core": 14,
            "sliceCount": 1,
            "placements": [{"start": i, "size": 1} for i in range(7)],
        },
        {
            "name": "3g.40gb",
            "memoryMB": 40192,
            "core": 42,
            "sliceCount": 3,
            "placements": [{"start": 0, "size": 4}, {"start": 4, "size": 4}],
        },
    ]
    mig_card = hami_device("GPU-m", 0, mode="mig", migProfiles=profiles, count=7)
    reservations = [
        {"containerIndex": 0, "deviceIndex": 0, "gpuUUID": "GPU-m", "profile": "1g.10gb",
         "placement": {"start": 0, "size": 1}},
        {"containerIndex": 1, "deviceIndex": 0, "gpuUUID": "GPU-m", "profile": "1g.10gb",
         "placement": {"start": 1, "size": 1}},
    ]  # fmt: skip
    annotations = allocated(
        "GPU-m,NVIDIA,9856,14:;GPU-m,NVIDIA,9856,14:;",
        **{"hami.io/vgpu-mig-allocations": json.dumps(reservations)},
    )
    found = one([hami_node("n1", mig_card)], [pod("mig", annotations=annotations)])
    only = card(found, 0)
    assert only.mode == "mig"
    assert [(p.name, p.memory_mib, p.total, p.used) for p in only.mig] == [
        ("1g.10gb", 9856, 7, 2),
        ("3g.40gb", 40192, 2, 0),
    ]
    assert [(h.mode, h.mig_profiles, h.memory_mib) for h in only.holders] == [
        ("mig", ("1g.10gb", "1g.10gb"), 2 * 9856)
    ]


def test_device_plugin_mig_resources_are_the_node_layout_and_requests_use_them() -> None:
    labels = {"nvidia.com/mig-1g.5gb.memory": "4864", "nvidia.com/mig.strategy": "mixed"}
    mig_node = node(
        "n1", {"nvidia.com/mig-1g.5gb": "7", "nvidia.com/mig-2g.10gb": "1"}, labels=labels
    )
    user = pod("mig-user", limits={"nvidia.com/mig-1g.5gb": "2"})
    found = one([mig_node], [user])
    assert [(p.name, p.memory_mib, p.total, p.used) for p in found.mig] == [
        ("1g.5gb", 4864, 7, 2),
        # No label for 2g.10gb: the nominal size's lower bound (webhook.core.cluster).
        ("2g.10gb", 10 * 950, 1, 0),
    ]
    assert [(h.mode, h.mig_profiles) for h in found.unassigned] == [("mig", ("1g.5gb", "1g.5gb"))]


# -- robustness and the document ------------------------------------------------------------


def test_pod_devices_skips_malformed_entries() -> None:
    parsed = pod_devices("GPU-a,NVIDIA,3000,30:bad:GPU-b,NVIDIA,x,1:;;GPU-c,NVIDIA,1,2")
    assert [(d.uuid, d.memory_mib, d.cores, d.container) for d in parsed] == [
        ("GPU-a", 3000, 30, 0),
        ("GPU-c", 1, 2, 2),
    ]


junk = st.one_of(
    st.text(max_size=40),
    st.text(alphabet='GPU-ab,:;[]{}0123456789"', max_size=40),
)


@settings(max_examples=200, deadline=None)
@given(register=junk, devices=junk, mig=junk, index=junk)
def test_any_annotation_text_gives_an_inventory_never_an_error(
    register: str, devices: str, mig: str, index: str
) -> None:
    annotations = {
        "hami.io/vgpu-devices-allocated": devices,
        "hami.io/vgpu-mig-allocations": mig,
        "ALIYUN_COM_GPU_MEM_IDX": index,
    }
    nodes = [node("n1", annotations={"hami.io/node-nvidia-register": register})]
    document = to_document(allocations(nodes, [pod("p", annotations=annotations)], DEFAULT_POLICY))
    orjson.dumps(document)


def test_document_has_stable_keys_and_totals() -> None:
    pods = [
        pod("a", annotations=allocated("GPU-a,NVIDIA,3000,30:;")),
        pod("u", limits={"nvidia.com/gpumem": "1000"}),
    ]
    document = to_document(allocations([hami_node("n1")], pods, DEFAULT_POLICY))
    assert (document["apiVersion"], document["kind"]) == ("gpushare.io/v1alpha1", INVENTORY_KIND)
    [entry] = document["nodes"]
    assert list(entry) == ["name", "source", "gpus", "unassigned", "mig", "totals"]
    assert entry["totals"] == {
        "gpus": 2,
        "memoryMiB": 2 * 81559,
        "allocatedMemoryMiB": 4000,
        "cores": 200,
        "allocatedCores": 30,
        "pods": 2,
    }
    first = entry["gpus"][0]
    assert (first["uuid"], first["allocatedMemoryMiB"], first["pods"][0]["name"]) == (
        "GPU-a",
        3000,
        "a",
    )
    assert entry["unassigned"][0] == {
        "namespace": "ml",
        "name": "u",
        "mode": "vgpu",
        "memoryMiB": 1000,
        "cores": 0,
        "gpus": 1,
        "migProfiles": [],
    }
