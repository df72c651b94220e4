"""The cluster-aware decisions through a real kube-apiserver, with `serve --cluster` on.

Nodes are plain API objects (no kubelet): GFD labels, HAMi's registration annotation,
MIG capacities written through the status subresource. Namespaces carry Pod Security
labels; ResourceQuotas get their status.used through the status subresource (no
controller-manager runs here). Each decision is read from what the apiserver answers
to a server-side dry-run create, as kubectl would show it. The webhook's view catches
up with a change within a second or so, so each assertion polls the answer.

The nodes live in a pool of their own (label ``gpushare-e2e/pool``) and are deleted
afterwards, so the rest of the suite sees a cluster without GPU nodes again.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Final

import orjson
import pytest
import yaml

from tests.e2e.rest import Api, Obj, Sent
from webhook.dev.cluster import DevCluster, Webhook, free_port

pytestmark = pytest.mark.e2e

POOL: Final = {"gpushare-e2e/pool": "h100"}
H100_MIB: Final = 81559
GFD: Final = {
    **POOL,
    "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
    "nvidia.com/gpu.memory": str(H100_MIB),
    "nvidia.com/gpu.count": "8",
}
HAMI_REGISTER: Final = orjson.dumps(
    [
        {
            "id": f"GPU-{i}",
            "count": 10,
            "devmem": H100_MIB,
            "devcore": 100,
            "type": "NVIDIA-H100-80GB-HBM3",
            "numa": 0,
            "health": True,
        }
        for i in range(8)
    ]
).decode()
MIG_POOL: Final = {"gpushare-e2e/pool": "a100-mig", "nvidia.com/mig.strategy": "mixed"}
BASELINE: Final = "e2e-cluster-baseline"
TEAM: Final = "e2e-cluster-team"


def _pod(name: str, limits: dict[str, str], **spec: Any) -> Obj:
    container: Obj = {"name": "cuda", "image": "cuda:12", "resources": {"limits": limits}}
    container.update(spec.pop("container", {}))
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, **spec.pop("metadata", {})},
        "spec": {"nodeSelector": dict(POOL), "containers": [container], **spec},
    }


def eventually(
    send: Callable[[], Sent], done: Callable[[Sent], bool], *, within: float = 20
) -> Sent:
    """The first answer that ``done`` accepts: the view catches up within a second or so."""
    deadline = time.monotonic() + within
    while True:
        sent = send()
        if done(sent) or time.monotonic() > deadline:
            return sent
        time.sleep(0.2)


def message(sent: Sent) -> str:
    return str(sent.body.get("message", "")) if isinstance(sent.body, dict) else str(sent.body)


def env_of(sent: Sent) -> dict[str, str]:
    (container,) = sent.body["spec"]["containers"]
    return {e["name"]: e.get("value", "") for e in container.get("env", [])}


@contextlib.contextmanager
def swapped_policy(cluster: DevCluster, change: Callable[[Obj], None]) -> Iterator[None]:
    """The webhook serves a changed policy (and its matchConditions) inside the block."""
    original = cluster.policy.read_text()
    document = yaml.safe_load(original)
    change(document)
    cluster.policy.write_text(yaml.safe_dump(document))
    try:
        cluster.register_webhooks()
        yield
    finally:
        cluster.policy.write_text(original)
        cluster.register_webhooks()
        time.sleep(2)  # the original policy back in force (polled every second)


@pytest.fixture(scope="module")
def pool(cluster: DevCluster, core: Any) -> Iterator[None]:
    """Two H100 nodes (one by GFD labels, one by HAMi's registration), a MIG node, a
    baseline namespace and a team namespace with a GPU quota nearly used up."""
    nodes: list[tuple[str, Obj, Obj | None]] = [
        ("e2e-h100-gfd", {"labels": GFD}, None),
        (
            "e2e-h100-hami",
            {"labels": POOL, "annotations": {"hami.io/node-nvidia-register": HAMI_REGISTER}},
            None,
        ),
        (
            "e2e-a100-mig",
            {"labels": MIG_POOL},
            {"nvidia.com/mig-1g.10gb": "7", "nvidia.com/mig-3g.40gb": "2"},
        ),
    ]
    for name, metadata, capacity in nodes:
        core.create_node({"metadata": {"name": name, **metadata}})
        if capacity:
            core.patch_node_status(
                name, {"status": {"capacity": capacity, "allocatable": capacity}}
            )
    for name, labels in (
        (BASELINE, {"pod-security.kubernetes.io/enforce": "baseline"}),
        (TEAM, {}),
    ):
        core.create_namespace({"metadata": {"name": name, "labels": labels}})
        core.create_namespaced_service_account(name, {"metadata": {"name": "default"}})
    core.create_namespaced_resource_quota(
        TEAM, {"metadata": {"name": "gpu"}, "spec": {"hard": {"limits.nvidia.com/gpumem": "10000"}}}
    )
    core.patch_namespaced_resource_quota_status(
        "gpu",
        TEAM,
        {
            "status": {
                "hard": {"limits.nvidia.com/gpumem": "10000"},
                "used": {"limits.nvidia.com/gpumem": "8000"},
            }
        },
    )
    core.create_namespaced_config_map(
        TEAM,
        {
            "metadata": {"name": "devices"},
            "data": {"NVIDIA_VISIBLE_DEVICES": "all", "app.yaml": "a: 1"},
        },
    )
    core.create_namespaced_config_map(
        TEAM, {"metadata": {"name": "prefixed"}, "data": {"VISIBLE_DEVICES": "all"}}
    )
    try:
        yield
    finally:
        for name, _, _ in nodes:
            core.delete_node(name)
        for name in (BASELINE, TEAM):
            core.delete_namespace(name)
        assert cluster.webhook is not None
        # The rest of the suite sees no GPU node again.
        deadline = time.monotonic() + 20
        while cluster.webhook.readyz()["cluster"]["kinds"]["nodes"]["objects"]:
            assert time.monotonic() < deadline
            time.sleep(0.2)


@pytest.fixture(scope="module")
def api(cluster: DevCluster) -> Api:
    return Api(cluster)


def test_view_is_synced_and_reported(cluster: DevCluster, pool: None) -> None:
    assert cluster.webhook is not None
    status = cluster.webhook.readyz()["cluster"]
    assert status["synced"] is True and status["stale"] is False
    assert {"nodes", "namespaces", "resourcequotas"} <= set(status["kinds"])


def test_more_memory_than_any_card_is_refused_naming_the_largest(api: Api, pool: None) -> None:
    send = lambda: api.create("Pod", TEAM, _pod("huge", {"nvidia.com/gpumem": "90000"}))  # noqa: E731
    sent = eventually(send, lambda s: s.status == 403)
    assert sent.status == 403, sent.body
    assert "no-fitting-node" in message(sent)
    assert "81,559 MiB" in message(sent)
    fits = api.create("Pod", TEAM, _pod("fits", {"nvidia.com/gpumem": "1000"}))
    assert fits.status == 201, fits.body


def test_percentage_becomes_a_memory_cap(api: Api, pool: None) -> None:
    send = lambda: api.create("Pod", TEAM, _pod("half", {"nvidia.com/gpumem-percentage": "50"}))  # noqa: E731
    sent = eventually(send, lambda s: "CUDA_DEVICE_MEMORY_LIMIT_0" in env_of(s))
    assert sent.status == 201, sent.body
    assert env_of(sent)["CUDA_DEVICE_MEMORY_LIMIT_0"] == f"{H100_MIB // 2}m"


def test_mps_in_a_baseline_namespace_is_refused_naming_pod_security(api: Api, pool: None) -> None:
    pod = _pod(
        "mps", {"nvidia.com/gpumem": "4000"}, metadata={"annotations": {"gpushare.io/mode": "mps"}}
    )
    sent = eventually(
        lambda: api.create("Pod", BASELINE, pod), lambda s: "Pod Security" in message(s)
    )
    assert sent.status == 403, sent.body
    assert "mode-conflict" in message(sent)
    assert "Pod Security baseline" in message(sent) and "hostIPC" in message(sent)


def test_gpu_quota_exceeded_is_refused(cluster: DevCluster, api: Api, pool: None) -> None:
    def quota_on(document: Obj) -> None:
        document["spec"]["rules"]["gpu-quota"] = "deny"

    with swapped_policy(cluster, quota_on):
        sent = eventually(
            lambda: api.create("Pod", TEAM, _pod("over", {"nvidia.com/gpumem": "3000"})),
            lambda s: "gpu-quota" in message(s),
        )
        assert sent.status == 403, sent.body
        assert "ResourceQuota" in message(sent) and f"{TEAM}/gpu" in message(sent)
        within = api.create("Pod", TEAM, _pod("within", {"nvidia.com/gpumem": "2000"}))
        assert within.status == 201, within.body


def test_visible_devices_from_a_config_map_is_refused(
    cluster: DevCluster, api: Api, pool: None
) -> None:
    def config_maps_on(document: Obj) -> None:
        document["spec"].setdefault("cluster", {})["configMapEnv"] = True

    whole = _pod(
        "from-cm",
        {"nvidia.com/gpumem": "1000"},
        container={"envFrom": [{"configMapRef": {"name": "devices"}}]},
    )
    # The hole: without the view's ConfigMaps the pod spec shows nothing wrong.
    assert api.create("Pod", TEAM, whole).status == 201
    with swapped_policy(cluster, config_maps_on):
        sent = eventually(lambda: api.create("Pod", TEAM, whole), lambda s: s.status == 403)
        assert sent.status == 403, sent.body
        assert "raw-visible-devices" in message(sent) and "ConfigMap devices" in message(sent)
        prefixed = _pod(
            "prefixed",
            {"nvidia.com/gpumem": "1000"},
            container={"envFrom": [{"prefix": "NVIDIA_", "configMapRef": {"name": "prefixed"}}]},
        )
        sent = api.create("Pod", TEAM, prefixed)
        assert sent.status == 403 and "raw-visible-devices" in message(sent), sent.body
        key_ref = _pod(
            "key-ref",
            {"nvidia.com/gpumem": "1000"},
            container={
                "env": [
                    {
                        "name": "NVIDIA_VISIBLE_DEVICES",
                        "valueFrom": {
                            "configMapKeyRef": {"name": "devices", "key": "NVIDIA_VISIBLE_DEVICES"}
                        },
                    }
                ]
            },
        )
        sent = api.create("Pod", TEAM, key_ref)
        assert sent.status == 403 and "raw-visible-devices" in message(sent), sent.body


def test_gpumem_on_a_mig_pool_becomes_a_mig_profile(
    cluster: DevCluster, api: Api, pool: None
) -> None:
    def mig_pool(document: Obj) -> None:
        document["spec"]["mig"] = {"pools": [{"nodeSelector": dict(MIG_POOL), "translate": True}]}

    pod = _pod("mig", {"nvidia.com/gpumem": "9000"}, nodeSelector=dict(MIG_POOL))
    with swapped_policy(cluster, mig_pool):
        sent = eventually(
            lambda: api.create("Pod", TEAM, pod),
            lambda s: s.status == 201 and "nvidia.com/mig-1g.10gb" in str(s.body),
        )
    assert sent.status == 201, sent.body
    (container,) = sent.body["spec"]["containers"]
    limits = container["resources"]["limits"]
    assert limits.get("nvidia.com/mig-1g.10gb") == "1", limits
    assert "nvidia.com/gpumem" not in limits
    # The hardware isolates: no libvgpu preload, no limit variables.
    assert "CUDA_DEVICE_MEMORY_LIMIT_0" not in env_of(sent)


def _claim_template(name: str, device_class: str) -> Obj:
    request = {"name": "dev", "exactly": {"deviceClassName": device_class}}
    return {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaimTemplate",
        "metadata": {"name": name},
        "spec": {"spec": {"devices": {"requests": [request]}}},
    }


def test_a_sharing_pod_naming_a_gpu_claim_template_is_refused_once_the_view_has_it(
    cluster: DevCluster, api: Api, pool: None
) -> None:
    """The template is admitted where dra.allowedNamespaces lets GPU claims be written;
    a pod there with GPU-sharing resources that takes it would hold whole GPUs beside
    its slices, which only the view's templates show."""

    def claims_allowed(document: Obj) -> None:
        document["spec"]["dra"]["allowedNamespaces"] = [TEAM]

    def taking(name: str, template: str) -> Obj:
        claims = [{"name": "dev", "resourceClaimTemplateName": template}]
        return _pod(name, {"nvidia.com/gpumem": "1000"}, resourceClaims=claims)

    with swapped_policy(cluster, claims_allowed):
        for name, device_class in (
            ("whole-gpu", "gpu.nvidia.com"),
            ("imex", "compute-domain-default-channel.nvidia.com"),
        ):
            template = _claim_template(name, device_class)

            def write(template: Obj = template) -> Sent:
                return api.create("ResourceClaimTemplate", TEAM, template, dry_run=False)

            sent = eventually(write, lambda s: s.status == 201)
            assert sent.status == 201, sent.body
        sent = eventually(
            lambda: api.create("Pod", TEAM, taking("gpu-claim", "whole-gpu")),
            lambda s: s.status == 403,
        )
        assert sent.status == 403, sent.body
        assert "gpu-claim" in message(sent), message(sent)
        assert 'ResourceClaimTemplate "whole-gpu"' in message(sent)
        assert 'device class "gpu.nvidia.com"' in message(sent)
        # The view has both templates now: the IMEX channel is no GPU claim.
        imex = api.create("Pod", TEAM, taking("imex-claim", "imex"))
        assert imex.status == 201, imex.body
    assert cluster.webhook is not None
    kinds = cluster.webhook.readyz()["cluster"]["kinds"]
    assert kinds["resourceclaimtemplates"]["objects"] >= 2, kinds


# ---------------------------------------------------------------- the view unsynced


@pytest.fixture
def unsynced(cluster: DevCluster, tmp_path: Path) -> Iterator[Webhook]:
    """A second webhook whose view points at a port where no apiserver listens."""
    config = cluster.kubeconfig()
    config["clusters"][0]["cluster"]["server"] = f"https://127.0.0.1:{free_port()}"
    kubeconfig = tmp_path / "unreachable.kubeconfig"
    kubeconfig.write_text(yaml.safe_dump(config))
    webhook = Webhook(workdir=tmp_path, policy=cluster.policy, kubeconfig=kubeconfig)
    webhook.start()
    try:
        yield webhook
    finally:
        webhook.stop()


def test_an_unsynced_view_falls_back_to_the_pod_spec_and_says_so(
    unsynced: Webhook, pool: None
) -> None:
    import ssl
    import urllib.request

    from webhook.dev.testing import admission_review

    review = admission_review(_pod("huge", {"nvidia.com/gpumem": "90000"}), namespace=TEAM)
    context = ssl.create_default_context(cafile=str(unsynced.cert_dir / "ca.crt"))
    latencies = []
    for _ in range(20):
        request = urllib.request.Request(  # noqa: S310  # https to our own loopback webhook
            unsynced.url + "/validate",
            data=orjson.dumps(review),
            headers={"Content-Type": "application/json"},
        )
        started = time.perf_counter()
        with urllib.request.urlopen(request, context=context, timeout=5) as response:  # noqa: S310
            answer = orjson.loads(response.read())
        latencies.append(time.perf_counter() - started)
        # Not refused as no-fitting-node: with no view the pod spec alone decides.
        assert "no-fitting-node" not in str(answer["response"]), answer
    assert sorted(latencies)[10] < 0.1, latencies
    status = unsynced.readyz()
    assert status["status"] == "ready"
    assert status["cluster"]["synced"] is False and status["cluster"]["stale"] is True
    assert "error" in status["cluster"]["kinds"]["nodes"]
    with urllib.request.urlopen(f"http://127.0.0.1:{unsynced.health_port}/metrics") as response:
        metrics = response.read().decode()
    assert "gpushare_cluster_view_synced 0.0" in metrics
