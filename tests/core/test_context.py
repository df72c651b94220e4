"""Decisions with a cluster view: node fit, gpumem-percentage, Pod Security, quotas, envFrom."""

from __future__ import annotations

import copy
from typing import Any

import jsonpatch
import pytest
import yaml

from tests.core.test_decision import env_of, gpu_pod, policy_with
from tests.paths import ROOT
from webhook.core.cluster import ClusterView, view_from_objects
from webhook.core.decision import Request, decide
from webhook.core.review import review_object
from webhook.policies import DEFAULT_POLICY

SNAPSHOT = ROOT / "tests" / "clusters" / "h100-pool.yaml"


@pytest.fixture(scope="module")
def cluster() -> ClusterView:
    return view_from_objects(yaml.safe_load_all(SNAPSHOT.read_text()), secrets=True)


def messages(entry: Any, rule: str) -> list[str]:
    return [v["message"] for v in entry["violations"] if v["rule"] == rule]


def test_a_request_larger_than_any_card_is_refused_naming_the_largest(
    cluster: ClusterView,
) -> None:
    pod = gpu_pod({"nvidia.com/gpumem": "90000"})
    assert review_object(pod, DEFAULT_POLICY)["allowed"]
    entry = review_object(pod, DEFAULT_POLICY, cluster=cluster)
    assert not entry["allowed"]
    (message,) = messages(entry, "no-fitting-node")
    assert "the largest card in the cluster has 81,559 MiB" in message
    assert "ask for at most 81559" in message


def test_a_request_that_fits_is_admitted(cluster: ClusterView) -> None:
    entry = review_object(gpu_pod({"nvidia.com/gpumem": "80000"}), DEFAULT_POLICY, cluster=cluster)
    assert entry["allowed"], entry["violations"]


def test_more_cards_than_a_selected_node_has(cluster: ClusterView) -> None:
    # Both H100 nodes have 2 and 8 cards: 9 fit on none.
    pod = gpu_pod(
        {"nvidia.com/gpu": "9", "nvidia.com/gpumem": "1000"}, nodeSelector={"pool": "h100"}
    )
    entry = review_object(pod, DEFAULT_POLICY, cluster=cluster)
    (message,) = messages(entry, "no-fitting-node")
    assert "no node on nodes matching nodeSelector pool=h100 has more than 8 cards" in message
    eight = gpu_pod(
        {"nvidia.com/gpu": "8", "nvidia.com/gpumem": "1000"}, nodeSelector={"pool": "h100"}
    )
    assert review_object(eight, DEFAULT_POLICY, cluster=cluster)["allowed"]


def test_a_selector_no_gpu_node_matches_is_not_judged(cluster: ClusterView) -> None:
    # A node pool that scales from zero has no node until a pod waits for it.
    pod = gpu_pod({"nvidia.com/gpumem": "90000"}, nodeSelector={"pool": "b200"})
    assert not messages(review_object(pod, DEFAULT_POLICY, cluster=cluster), "no-fitting-node")


def test_a_mig_profile_no_node_exposes(cluster: ClusterView) -> None:
    pod = gpu_pod({"nvidia.com/mig-7g.80gb": "1"})
    entry = review_object(pod, DEFAULT_POLICY, cluster=cluster)
    (message,) = messages(entry, "no-fitting-node")
    assert "MIG profile 7g.80gb" in message and "the largest that exists is 3g.40gb" in message
    assert review_object(gpu_pod({"nvidia.com/mig-3g.40gb": "1"}), DEFAULT_POLICY, cluster=cluster)[
        "allowed"
    ]


def test_an_unsynced_view_changes_nothing(cluster: ClusterView) -> None:
    unsynced = ClusterView(nodes=cluster.nodes, namespaces=cluster.namespaces, synced=False)
    pod = gpu_pod({"nvidia.com/gpumem": "90000"})
    assert review_object(pod, DEFAULT_POLICY, cluster=unsynced) == review_object(
        pod, DEFAULT_POLICY
    )


def test_percentage_resolves_to_mib_where_every_card_is_the_same(cluster: ClusterView) -> None:
    pod = gpu_pod({"nvidia.com/gpumem-percentage": "50"}, nodeSelector={"pool": "h100"})
    assert "CUDA_DEVICE_MEMORY_LIMIT_0" not in env_of(review_object(pod, DEFAULT_POLICY)["object"])
    entry = review_object(pod, DEFAULT_POLICY, cluster=cluster)
    assert entry["allowed"], entry["violations"]
    assert env_of(entry["object"])["CUDA_DEVICE_MEMORY_LIMIT_0"] == "40779m"
    assert any(
        "every card on nodes matching nodeSelector pool=h100 has 81,559 MiB" in w
        for w in entry["warnings"]
    )
    # Idempotent: the mutated pod needs nothing more with the same view.
    request = Request(kind="Pod", namespace="ml")
    again = decide(entry["object"], request, DEFAULT_POLICY, phase="mutate", cluster=cluster)
    assert again.patch == []


def test_percentage_stays_unresolved_over_mixed_card_sizes() -> None:
    nodes = [
        {
            "kind": "Node",
            "metadata": {
                "name": name,
                "labels": {"nvidia.com/gpu.memory": memory, "nvidia.com/gpu.count": "1"},
            },
        }
        for name, memory in (("small", "24576"), ("big", "81559"))
    ]
    entry = review_object(
        gpu_pod({"nvidia.com/gpumem-percentage": "50"}),
        DEFAULT_POLICY,
        cluster=view_from_objects(nodes),
    )
    assert entry["allowed"]
    assert "CUDA_DEVICE_MEMORY_LIMIT_0" not in env_of(entry["object"])


MPS = {"gpushare.io/mode": "mps"}


def mps_pod(namespace: str) -> dict[str, Any]:
    pod = gpu_pod({"nvidia.com/gpumem": "4000"}, namespace=namespace)
    pod["metadata"]["annotations"] = dict(MPS)
    return pod


def test_mps_in_a_baseline_namespace_is_a_mode_conflict(cluster: ClusterView) -> None:
    assert review_object(mps_pod("team-a"), DEFAULT_POLICY)["allowed"]
    entry = review_object(mps_pod("team-a"), DEFAULT_POLICY, cluster=cluster)
    assert messages(entry, "mode-conflict") == [
        "namespace team-a enforces Pod Security baseline, which forbids hostIPC; "
        "use a namespace the policy allows for mps"
    ]
    assert review_object(mps_pod("ml"), DEFAULT_POLICY, cluster=cluster)["allowed"]


def test_mps_in_a_namespace_that_only_warns_gets_a_warning() -> None:
    view = view_from_objects(
        [
            {
                "kind": "Namespace",
                "metadata": {
                    "name": "lab",
                    "labels": {"pod-security.kubernetes.io/warn": "restricted"},
                },
            }
        ]
    )
    entry = review_object(mps_pod("lab"), DEFAULT_POLICY, cluster=view)
    assert entry["allowed"]
    assert any("warns on Pod Security restricted" in w for w in entry["warnings"])


def test_a_resource_quota_counts_memory_per_vgpu_times_gpus(cluster: ClusterView) -> None:
    policy = policy_with("  rules: {gpu-quota: deny}")
    # 2 x 30,000 MiB = 60,000 against the 50,000 the quota leaves.
    pod = gpu_pod({"nvidia.com/gpu": "2", "nvidia.com/gpumem": "30000"})
    entry = review_object(pod, policy, cluster=cluster)
    (message,) = messages(entry, "gpu-quota")
    assert (
        "60000 of nvidia.com/gpumem" in message and "ResourceQuota ml/gpu leaves 50000" in message
    )
    fits = gpu_pod({"nvidia.com/gpu": "2", "nvidia.com/gpumem": "25000"})
    assert review_object(fits, policy, cluster=cluster)["allowed"]


ENV_POLICY = policy_with("  cluster: {configMapEnv: true, secretEnv: true}")


def env_from_pod(*sources: dict[str, Any], limits: dict[str, Any] | None = None) -> dict[str, Any]:
    pod = gpu_pod(limits if limits is not None else {})
    if limits is None:
        del pod["spec"]["containers"][0]["resources"]
    pod["spec"]["containers"][0]["envFrom"] = list(sources)
    return pod


def test_visible_devices_from_a_config_map_is_judged_like_inline_env(cluster: ClusterView) -> None:
    pod = env_from_pod({"configMapRef": {"name": "cuda-env"}})
    # The attack: no GPU asked, every GPU seen. Without the opt-in it gets through.
    assert review_object(pod, DEFAULT_POLICY, cluster=cluster)["allowed"]
    entry = review_object(pod, ENV_POLICY, cluster=cluster)
    (message,) = messages(entry, "raw-visible-devices")
    assert 'NVIDIA_VISIBLE_DEVICES="all" (from ConfigMap cuda-env)' in message


def test_an_env_from_prefix_renames_the_variable(cluster: ClusterView) -> None:
    pod = env_from_pod({"configMapRef": {"name": "cuda-env"}, "prefix": "SAFE_"})
    assert review_object(pod, ENV_POLICY, cluster=cluster)["allowed"]


def test_a_missing_config_map_is_not_a_violation(cluster: ClusterView) -> None:
    pod = env_from_pod({"configMapRef": {"name": "absent"}})
    assert review_object(pod, ENV_POLICY, cluster=cluster)["allowed"]


def test_secret_values_are_judged_only_when_the_policy_opts_in() -> None:
    objects = [
        {
            "kind": "Secret",
            "metadata": {"name": "s", "namespace": "ml"},
            "stringData": {"CUDA_DISABLE_CONTROL": "true"},
        }
    ]
    pod = env_from_pod({"secretRef": {"name": "s"}}, limits={"nvidia.com/gpumem": "1000"})
    opted_out = policy_with("  cluster: {secretEnv: false}")
    assert review_object(pod, opted_out, cluster=view_from_objects(objects))["allowed"]
    entry = review_object(pod, ENV_POLICY, cluster=view_from_objects(objects, secrets=True))
    assert messages(entry, "limit-tampering")


def test_validate_agrees_with_mutate_on_the_mutated_pod(cluster: ClusterView) -> None:
    pod = gpu_pod({"nvidia.com/gpumem-percentage": "25"}, nodeSelector={"pool": "h100"})
    request = Request(kind="Pod", namespace="ml")
    mutated = decide(pod, request, DEFAULT_POLICY, phase="mutate", cluster=cluster)
    final = jsonpatch.apply_patch(copy.deepcopy(pod), mutated.patch)
    validated = decide(final, request, DEFAULT_POLICY, phase="validate", cluster=cluster)
    assert validated.allowed and validated.violations == []
    unmutated = decide(pod, request, DEFAULT_POLICY, phase="validate", cluster=cluster)
    assert rules_of_decision(unmutated) == {"unmutated-gpu-pod"}


def rules_of_decision(decision: Any) -> set[str]:
    return {v["rule"] for v in decision.violations if v["action"] == "deny"}
