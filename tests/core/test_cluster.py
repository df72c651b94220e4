"""Facts read from cluster objects: HAMi's registration, GFD labels, quotas, ConfigMaps."""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest

from webhook.core.cluster import (
    HAMI_REGISTER,
    Card,
    ClusterView,
    claim_facts,
    config_map_data,
    hami_cards,
    mig_memory_mib,
    namespace_facts,
    node_facts,
    quota_facts,
    secret_data,
    view_from_objects,
)

# Verbatim shape of HAMi's docs/develop/protocol.md (the colon form older plugins write).
LEGACY = (
    "GPU-00552014-5c87-89ac-b1a6-7b53aa24b0ec,10,32768,100,NVIDIA-Tesla V100-PCIE-32GB,0,true:"
    "GPU-0fc3eda5-e98b-a25b-5b0d-cf5c855d1448,10,32768,100,NVIDIA-Tesla V100-PCIE-32GB,0,true:"
)


def node(
    name: str = "gpu-1",
    *,
    labels: dict[str, str] | None = None,
    annotations: dict[str, str] | None = None,
    allocatable: dict[str, Any] | None = None,
    unschedulable: bool = False,
) -> dict[str, Any]:
    obj: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": labels or {}, "annotations": annotations or {}},
        "status": {"allocatable": {"cpu": "64", "memory": "512Gi", **(allocatable or {})}},
    }
    if unschedulable:
        obj["spec"] = {"unschedulable": True}
    return obj


def test_hami_json_registration_gives_each_card() -> None:
    devices = [
        {
            "id": "GPU-a",
            "count": 10,
            "devmem": 81559,
            "devcore": 100,
            "type": "NVIDIA-H100",
            "health": True,
        },
        # Go's omitempty drops health=false, and devcore when 0.
        {"id": "GPU-b", "index": 1, "count": 10, "devmem": 81559, "type": "NVIDIA-H100"},
    ]
    cards = hami_cards(json.dumps(devices))
    assert cards == (
        Card(memory_mib=81559, cores=100, product="NVIDIA-H100", splits=10, healthy=True),
        Card(memory_mib=81559, cores=100, product="NVIDIA-H100", splits=10, healthy=False),
    )


def test_hami_json_registration_keeps_mig_profiles() -> None:
    devices = [
        {
            "id": "GPU-a",
            "count": 7,
            "devmem": 81920,
            "devcore": 100,
            "type": "NVIDIA-A100",
            "health": True,
            "mode": "mig",
            "migProfiles": [
                {"name": "1g.10gb", "memoryMB": 9728, "core": 14, "sliceCount": 1},
                {"name": "3g.40gb", "memoryMB": 40192, "core": 42, "sliceCount": 3},
            ],
        }
    ]
    (card,) = hami_cards(json.dumps(devices)) or ()
    assert card.mig_profiles == (("1g.10gb", 9728), ("3g.40gb", 40192))
    assert mig_memory_mib("3g.40gb", cards=[card]) == 40192


def test_hami_legacy_registration_of_seven_and_nine_fields() -> None:
    cards = hami_cards(LEGACY)
    assert cards is not None and len(cards) == 2
    assert cards[0] == Card(
        memory_mib=32768, cores=100, product="NVIDIA-Tesla V100-PCIE-32GB", splits=10
    )
    nine = hami_cards("GPU-0,4,24576,100,NVIDIA-L4,0,false,0,hami-core:")
    assert nine == (
        Card(memory_mib=24576, cores=100, product="NVIDIA-L4", splits=4, healthy=False),
    )


@pytest.mark.parametrize(
    "text", ["", "[", "{}", "[1]", '[{"devmem": "lots"}]', "GPU-0,10,big,100,x,0,true:", "a,b:"]
)
def test_garbled_registration_is_no_cards(text: str) -> None:
    assert not hami_cards(text)


def test_node_cards_from_hami_win_over_gfd() -> None:
    facts = node_facts(
        node(
            labels={"nvidia.com/gpu.memory": "40960", "nvidia.com/gpu.count": "8"},
            annotations={HAMI_REGISTER: LEGACY},
            allocatable={"nvidia.com/gpu": "20"},
        )
    )
    assert facts is not None
    assert [c.memory_mib for c in facts.cards] == [32768, 32768]
    assert facts.allocatable == {"nvidia.com/gpu": 20}


def test_node_cards_from_gfd_labels_when_hami_is_absent_or_garbled() -> None:
    labels = {
        "nvidia.com/gpu.memory": "81559",
        "nvidia.com/gpu.count": "8",
        "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
        "team": "ml",
    }
    facts = node_facts(node(labels=labels, annotations={HAMI_REGISTER: "garbage"}))
    assert facts is not None
    assert facts.cards == (Card(memory_mib=81559, product="NVIDIA-H100-80GB-HBM3"),) * 8
    assert facts.labels["team"] == "ml"


def test_node_allocatable_keeps_gpu_resources_only() -> None:
    facts = node_facts(
        node(
            allocatable={
                "nvidia.com/gpu": "8",
                "nvidia.com/mig-1g.10gb": "14",
                "aliyun.com/gpu-mem": "640",
                "ephemeral-storage": "100Gi",
                "nvidia.com/bogus-count": "1.5",
            },
            unschedulable=True,
        )
    )
    assert facts is not None
    assert facts.allocatable == {
        "nvidia.com/gpu": 8,
        "nvidia.com/mig-1g.10gb": 14,
        "aliyun.com/gpu-mem": 640,
    }
    assert facts.unschedulable


def test_a_node_without_gpus_is_not_a_fact() -> None:
    assert node_facts(node(allocatable={"nvidia.com/gpu": "0"})) is None
    assert node_facts(node()) is None


def test_mig_profiles_of_a_node_with_exact_memory_from_gfd_mixed_labels() -> None:
    facts = node_facts(
        node(
            labels={"nvidia.com/mig.strategy": "mixed", "nvidia.com/mig-1g.10gb.memory": "9728"},
            allocatable={"nvidia.com/mig-1g.10gb": "7", "nvidia.com/mig-3g.40gb": "2"},
        )
    )
    assert facts is not None
    # 3g.40gb has no memory label: a lower bound under the real 40,192 MiB.
    assert facts.mig_profiles == {"1g.10gb": 9728, "3g.40gb": 38000}


@pytest.mark.parametrize(
    ("profile", "real"),
    [
        ("1g.5gb", 4864),
        ("1g.10gb", 9728),
        ("2g.20gb", 19968),
        ("3g.40gb", 40192),
        ("7g.80gb", 80896),
    ],
)
def test_nominal_mig_memory_never_exceeds_the_real_instance(profile: str, real: int) -> None:
    estimate = mig_memory_mib(profile)
    assert estimate is not None and 0.9 * real < estimate <= real


def test_mig_memory_of_a_non_profile_is_none() -> None:
    assert mig_memory_mib("gpu") is None


def test_namespace_facts_keep_pod_security_labels() -> None:
    facts = namespace_facts(
        {
            "kind": "Namespace",
            "metadata": {
                "name": "team-a",
                "labels": {"pod-security.kubernetes.io/enforce": "baseline"},
            },
        }
    )
    assert facts.name == "team-a"
    assert facts.labels == {"pod-security.kubernetes.io/enforce": "baseline"}


def test_quota_facts_keep_gpu_keys_only() -> None:
    quota = {
        "kind": "ResourceQuota",
        "metadata": {"name": "gpu", "namespace": "team-a"},
        "spec": {"hard": {"limits.nvidia.com/gpumem": "100000", "pods": "10", "cpu": "4"}},
        "status": {"used": {"limits.nvidia.com/gpumem": "60000", "pods": "3"}},
    }
    facts = quota_facts(quota)
    assert facts is not None
    assert (facts.namespace, facts.name) == ("team-a", "gpu")
    assert facts.hard == {"limits.nvidia.com/gpumem": "100000"}
    assert facts.used == {"limits.nvidia.com/gpumem": "60000"}
    assert quota_facts({"kind": "ResourceQuota", "spec": {"hard": {"pods": "10"}}}) is None


def test_config_map_and_secret_data() -> None:
    assert config_map_data({"data": {"A": "1", "B": 2}, "binaryData": {"C": "AAAA"}}) == {"A": "1"}
    secret = {
        "data": {"A": base64.b64encode(b"all").decode(), "BAD": "!!notbase64"},
        "stringData": {"B": "0"},
    }
    assert secret_data(secret) == {"A": "all", "B": "0"}


def test_view_from_a_list_and_documents() -> None:
    objects: list[dict[str, Any]] = [
        {
            "kind": "List",
            "items": [
                node(
                    "a",
                    labels={"nvidia.com/gpu.memory": "81559", "nvidia.com/gpu.count": "8"},
                ),
                node("cpu-only"),
            ],
        },
        {"kind": "Namespace", "metadata": {"name": "team-a"}},
        {
            "kind": "ConfigMap",
            "metadata": {"name": "env", "namespace": "team-a"},
            "data": {"X": "1"},
        },
        {
            "kind": "Secret",
            "metadata": {"name": "s", "namespace": "team-a"},
            "stringData": {"Y": "2"},
        },
        {
            "kind": "ResourceQuota",
            "metadata": {"name": "q", "namespace": "team-a"},
            "spec": {"hard": {"limits.nvidia.com/gpu": "4"}},
        },
        {"kind": "Pod", "metadata": {"name": "ignored"}},
    ]
    view = view_from_objects(objects)
    assert view.synced
    assert list(view.nodes) == ["a"]
    assert list(view.namespaces) == ["team-a"]
    assert view.config_maps == {("team-a", "env"): {"X": "1"}}
    assert view.secrets == {}
    assert [q.name for q in view.quotas["team-a"]] == ["q"]
    with_secrets = view_from_objects(objects, secrets=True)
    assert with_secrets.secrets == {("team-a", "s"): {"Y": "2"}}


def test_claims_and_templates_are_kept_as_their_device_classes() -> None:
    def requests(*classes: str) -> dict[str, Any]:
        return {
            "devices": {
                "requests": [
                    {"name": "a", "exactly": {"deviceClassName": classes[0]}},
                    {"name": "b", "firstAvailable": [{"deviceClassName": c} for c in classes]},
                ]
            }
        }

    claim = {
        "kind": "ResourceClaim",
        "metadata": {"name": "c", "namespace": "ml"},
        "spec": requests("mig.nvidia.com", "gpu.nvidia.com"),
    }
    template = {
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": "t", "namespace": "ml"},
        "spec": {"spec": requests("compute-domain-default-channel.nvidia.com")},
    }
    assert claim_facts(claim) == ("gpu.nvidia.com", "mig.nvidia.com")
    assert claim_facts({"kind": "ResourceClaim", "spec": "x"}) == ()
    view = view_from_objects([{"kind": "List", "items": [claim, template]}])
    assert view.resource_claims == {("ml", "c"): ("gpu.nvidia.com", "mig.nvidia.com")}
    assert view.claim_templates == {("ml", "t"): ("compute-domain-default-channel.nvidia.com",)}


def test_an_empty_view_is_unsynced_and_its_cache_is_not_its_value() -> None:
    view = ClusterView()
    assert not view.synced
    view.cache["x"] = 1
    assert view == ClusterView()
