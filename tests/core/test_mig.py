"""GPU memory translated to a MIG instance where the policy says a pool is MIG."""

from __future__ import annotations

import copy
from typing import Any, Final

import pytest
import yaml

from tests.core.test_context import messages
from tests.core.test_decision import gpu_pod, policy_with
from tests.paths import ROOT
from webhook.core.cluster import ClusterView, view_from_objects
from webhook.core.decision import Request, decide
from webhook.core.mig import smallest_profile
from webhook.core.policy import PolicyError
from webhook.core.pool import Pool
from webhook.core.review import review_object
from webhook.policies import DEFAULT_POLICY, load_policy

SNAPSHOT: Final = ROOT / "tests" / "clusters" / "h100-pool.yaml"
# The snapshot's MIG node: 1g.10gb (9,728 MiB) x 14 and 3g.40gb (40,192 MiB) x 4.
MIG_NODE: Final = {"pool": "a100-mig"}
POLICY: Final = policy_with("  mig:\n    pools:\n      - nodeSelector: {pool: a100-mig}\n")
LIMITS: Final = "/spec/containers/0/resources/limits"


@pytest.fixture(scope="module")
def cluster() -> ClusterView:
    return view_from_objects(yaml.safe_load_all(SNAPSHOT.read_text()))


def mig_pod(limits: dict[str, Any], **spec: Any) -> dict[str, Any]:
    spec.setdefault("nodeSelector", dict(MIG_NODE))
    return gpu_pod(limits, **spec)


def decide_on(obj: Any, cluster: ClusterView, phase: str = "mutate") -> Any:
    request = Request(kind=str(obj["kind"]), namespace="ml")
    return decide(obj, request, POLICY, phase=phase, cluster=cluster)  # type: ignore[arg-type]


def test_gpumem_becomes_the_smallest_profile_that_holds_it(cluster: ClusterView) -> None:
    pod = mig_pod({"nvidia.com/gpumem": "9000"})
    # Without the pool in the policy the request fits no card of the MIG node.
    assert messages(review_object(pod, DEFAULT_POLICY, cluster=cluster), "no-fitting-node")
    entry = review_object(pod, POLICY, cluster=cluster)
    assert entry["allowed"], entry["violations"]
    assert entry["mode"] == "mig"
    assert entry["patch"] == [
        {"op": "remove", "path": f"{LIMITS}/nvidia.com~1gpumem"},
        {"op": "add", "path": f"{LIMITS}/nvidia.com~1mig-1g.10gb", "value": "1"},
    ]
    container = entry["object"]["spec"]["containers"][0]
    assert container["resources"] == {"limits": {"nvidia.com/mig-1g.10gb": "1"}}
    # A MIG pod: nothing preloaded, no scheduler change.
    assert "env" not in container and "schedulerName" not in entry["object"]["spec"]
    assert entry["warnings"] == ['container "main": 9000 MiB becomes MIG 1g.10gb (9728 MiB)']


@pytest.mark.parametrize(
    ("memory", "profile"), [("1", "1g.10gb"), ("9728", "1g.10gb"), ("9729", "3g.40gb")]
)
def test_the_profile_is_the_first_large_enough(
    cluster: ClusterView, memory: str, profile: str
) -> None:
    entry = review_object(mig_pod({"nvidia.com/gpumem": memory}), POLICY, cluster=cluster)
    limits = entry["object"]["spec"]["containers"][0]["resources"]["limits"]
    assert limits == {f"nvidia.com/mig-{profile}": "1"}


def test_every_vgpu_resource_goes_from_limits_and_requests(cluster: ClusterView) -> None:
    resources = {
        "nvidia.com/gpu": "1",
        "nvidia.com/gpumem": "20000",
        "nvidia.com/gpucores": "30",
        "nvidia.com/priority": "0",
        "cpu": "2",
    }
    pod = mig_pod(dict(resources))
    pod["spec"]["containers"][0]["resources"]["requests"] = {
        "nvidia.com/gpumem": "20000",
        "memory": "1Gi",
    }
    entry = review_object(pod, POLICY, cluster=cluster)
    assert entry["allowed"], entry["violations"]
    assert entry["object"]["spec"]["containers"][0]["resources"] == {
        "limits": {"cpu": "2", "nvidia.com/mig-3g.40gb": "1"},
        "requests": {"memory": "1Gi", "nvidia.com/mig-3g.40gb": "1"},
    }
    assert 'container "main": 30% cores dropped: MIG 3g.40gb has its own' in entry["warnings"]


def test_each_container_gets_its_own_instance(cluster: ClusterView) -> None:
    pod = mig_pod(
        {"nvidia.com/gpumem": "30000"},
        initContainers=[
            {
                "name": "warmup",
                "image": "cuda:12",
                "resources": {"limits": {"nvidia.com/gpumem": "2000"}},
            }
        ],
    )
    entry = review_object(pod, POLICY, cluster=cluster)
    assert entry["allowed"], entry["violations"]
    spec = entry["object"]["spec"]
    assert spec["containers"][0]["resources"]["limits"] == {"nvidia.com/mig-3g.40gb": "1"}
    assert spec["initContainers"][0]["resources"]["limits"] == {"nvidia.com/mig-1g.10gb": "1"}


def test_translation_is_idempotent_and_validates_clean(cluster: ClusterView) -> None:
    pod = mig_pod({"nvidia.com/gpumem": "9000", "nvidia.com/gpucores": "50"})
    entry = review_object(pod, POLICY, cluster=cluster)
    translated = entry["object"]
    again = decide_on(translated, cluster)
    assert again.allowed and again.patch == [] and again.warnings == []
    validated = decide_on(translated, cluster, phase="validate")
    assert validated.allowed and validated.violations == []
    assert validated.mode == "mig"


def test_an_untranslated_pod_reaching_validation_is_unmutated(cluster: ClusterView) -> None:
    pod = mig_pod({"nvidia.com/gpumem": "9000"})
    at_mutate = decide_on(pod, cluster)
    assert at_mutate.allowed and at_mutate.patch
    at_validate = decide_on(pod, cluster, phase="validate")
    assert not at_validate.allowed
    ((rule, message),) = {(v["rule"], v["message"]) for v in at_validate.violations}
    assert rule == "unmutated-gpu-pod"
    assert f"remove {LIMITS}/nvidia.com~1gpumem" in message
    # Applying the mutation is what /validate wanted.
    assert review_object(pod, POLICY, cluster=cluster)["allowed"]


def test_more_than_the_largest_profile_names_it(cluster: ClusterView) -> None:
    entry = review_object(mig_pod({"nvidia.com/gpumem": "50000"}), POLICY, cluster=cluster)
    assert not entry["allowed"]
    # One finding: the cards of a MIG node are not judged on top of its profiles.
    (violation,) = entry["violations"]
    assert violation["rule"] == "no-fitting-node"
    assert (
        "the largest MIG profile is 3g.40gb (40,192 MiB); ask for at most 40192"
        in (violation["message"])
    )
    assert entry["patch"] == []


@pytest.mark.parametrize(
    ("limits", "says"),
    [
        (
            {"nvidia.com/gpu": "2", "nvidia.com/gpumem": "5000"},
            "2 GPUs of GPU memory on nodes matching nodeSelector pool=a100-mig, a MIG pool",
        ),
        (
            {"nvidia.com/gpumem-percentage": "50"},
            "ask for nvidia.com/gpumem in MiB or for nvidia.com/mig-*",
        ),
    ],
)
def test_what_cannot_be_one_instance_is_refused_saying_what_to_ask(
    cluster: ClusterView, limits: dict[str, str], says: str
) -> None:
    entry = review_object(mig_pod(limits), POLICY, cluster=cluster)
    assert not entry["allowed"]
    (message,) = messages(entry, "mode-conflict")
    assert says in message
    assert not messages(entry, "no-fitting-node")


def test_an_unsynced_view_translates_nothing(cluster: ClusterView) -> None:
    unsynced = ClusterView(nodes=cluster.nodes, synced=False)
    pod = mig_pod({"nvidia.com/gpumem": "9000"})
    assert review_object(pod, POLICY, cluster=unsynced) == review_object(pod, POLICY)
    assert review_object(pod, POLICY)["mode"] == "vgpu"


@pytest.mark.parametrize(
    ("annotation", "mode"), [("vgpu", "vgpu"), ("hami-core", "vgpu"), ("mig", "mig")]
)
def test_a_mode_annotation_other_than_mig_keeps_vgpu(
    cluster: ClusterView, annotation: str, mode: str
) -> None:
    pod = mig_pod({"nvidia.com/gpumem": "9000"})
    pod["metadata"]["annotations"] = {"gpushare.io/mode": annotation}
    entry = review_object(pod, POLICY, cluster=cluster)
    assert entry["mode"] == mode
    translated = (
        "nvidia.com/mig-1g.10gb" in entry["object"]["spec"]["containers"][0]["resources"]["limits"]
    )
    assert translated == (mode == "mig")


def test_a_pod_that_does_not_pick_the_pool_is_left_alone(cluster: ClusterView) -> None:
    entry = review_object(gpu_pod({"nvidia.com/gpumem": "9000"}), POLICY, cluster=cluster)
    assert entry["allowed"] and entry["mode"] == "vgpu"
    # A selector narrower than the pool's still picks it; with none of its nodes up
    # (scaling from zero), the profiles of the pool's other nodes count.
    narrower = mig_pod({"nvidia.com/gpumem": "9000"}, nodeSelector={**MIG_NODE, "zone": "a"})
    assert review_object(narrower, POLICY, cluster=cluster)["mode"] == "mig"


def test_a_pool_without_translation_says_which_profile_to_ask_for(cluster: ClusterView) -> None:
    policy = policy_with(
        "  mig:\n    pools:\n      - {nodeSelector: {pool: a100-mig}, translate: false}\n"
    )
    entry = review_object(mig_pod({"nvidia.com/gpumem": "9000"}), policy, cluster=cluster)
    assert not entry["allowed"]
    (message,) = messages(entry, "mode-conflict")
    assert "ask for nvidia.com/mig-1g.10gb: 1, the smallest that holds 9000 MiB" in message


def test_a_pool_with_no_node_up_cannot_pick_a_profile() -> None:
    entry = review_object(
        mig_pod({"nvidia.com/gpumem": "9000"}), POLICY, cluster=view_from_objects([])
    )
    (message,) = messages(entry, "mode-conflict")
    assert "no node on nodes matching nodeSelector pool=a100-mig is up" in message


def test_a_workload_template_is_translated(cluster: ClusterView) -> None:
    pod = mig_pod({"nvidia.com/gpumem": "9000"})
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "d", "namespace": "ml"},
        "spec": {"template": {"metadata": {}, "spec": copy.deepcopy(pod["spec"])}},
    }
    entry = review_object(deployment, POLICY, cluster=cluster)
    assert entry["allowed"] and entry["mode"] == "mig"
    assert entry["patch"][0]["path"] == (
        "/spec/template/spec/containers/0/resources/limits/nvidia.com~1gpumem"
    )


def test_a_pod_update_is_not_translated(cluster: ClusterView) -> None:
    pod = mig_pod({"nvidia.com/gpumem": "9000"})
    request = Request(kind="Pod", operation="UPDATE", namespace="ml")
    decision = decide(pod, request, POLICY, phase="mutate", old=pod, cluster=cluster)
    assert decision.patch == []


def test_the_plain_profile_wins_over_its_media_variant() -> None:
    pool = Pool(nodes=1, mig={"1g.10gb+me": (9728, 1), "1g.10gb": (9728, 7), "2g.20gb": (19968, 3)})
    assert smallest_profile(pool, 9000) == ("1g.10gb", 9728)
    assert smallest_profile(pool, 9729) == ("2g.20gb", 19968)
    assert smallest_profile(pool, 20000) is None


def test_the_example_policy_translates_and_keeps_its_reserved_pool(cluster: ClusterView) -> None:
    policy = load_policy(ROOT / "policies" / "examples" / "mig-pool.yaml")
    mixed = {"nvidia.com/mig.strategy": "mixed"}
    entry = review_object(
        mig_pod({"nvidia.com/gpumem": "9000"}, nodeSelector=mixed), policy, cluster=cluster
    )
    assert entry["allowed"] and entry["mode"] == "mig", entry["violations"]
    reserved = mig_pod(
        {"nvidia.com/gpumem": "9000"}, nodeSelector={**mixed, "gpu-pool": "reserved"}
    )
    assert messages(review_object(reserved, policy, cluster=cluster), "mode-conflict")


@pytest.mark.parametrize(
    ("text", "error"),
    [
        (
            "  mig:\n    pools:\n      - nodeSelector: {a: b}\n        profiles: [1g.10gb]\n",
            "line 7: spec.mig.pools.0.profiles: unknown field",
        ),
        ("  mig:\n    pools:\n      - translate: true\n", "line 6: spec.mig.pools.0:"),
        (
            "  mig:\n    pools:\n      - nodeSelector: {a: b}\n      - nodeSelector: {a: b, c: d}\n",
            "line 7: spec.mig.pools.1.nodeSelector: pool 1 already takes every pod this one would",
        ),
        (
            "  resources: {migPrefixes: [example.com/mig-]}\n"
            "  mig:\n    pools:\n      - nodeSelector: {a: b}\n",
            "line 6: spec.mig.pools: MIG pools need nvidia.com/mig- in resources.migPrefixes",
        ),
    ],
)
def test_a_bad_pool_is_refused_naming_its_line(text: str, error: str) -> None:
    with pytest.raises(PolicyError) as raised:
        policy_with(text)
    assert any(error in line for line in raised.value.errors), raised.value.errors


def test_a_percentage_translates_where_the_pool_has_one_card_size() -> None:
    node = {
        "kind": "Node",
        "metadata": {
            "name": "a100-40",
            "labels": {
                **MIG_NODE,
                "nvidia.com/gpu.memory": "40960",
                "nvidia.com/gpu.count": "1",
                "nvidia.com/mig-2g.10gb.memory": "9984",
                "nvidia.com/mig-3g.20gb.memory": "20096",
            },
        },
        "status": {"allocatable": {"nvidia.com/mig-2g.10gb": "3", "nvidia.com/mig-3g.20gb": "2"}},
    }
    pod = mig_pod({"nvidia.com/gpumem-percentage": "25"})
    entry = review_object(pod, POLICY, cluster=view_from_objects([node]))
    assert entry["allowed"], entry["violations"]
    limits = entry["object"]["spec"]["containers"][0]["resources"]["limits"]
    # 25% of 40,960 MiB is 10,240 MiB: more than 2g.10gb holds.
    assert limits == {"nvidia.com/mig-3g.20gb": "1"}
