"""The watched cluster view: through a real kube-apiserver, and a loopback fake only for
what the real one cannot be made to do on demand (a 410 Gone, going away mid-test)."""

from __future__ import annotations

import asyncio
import os
import random
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import orjson
import pytest
from aiohttp import web

from webhook.cluster.watch import (
    Backoff,
    Change,
    ClusterWatch,
    Reflector,
    Settings,
    env_key_filter,
    kinds,
)
from webhook.core.cluster import NodeFacts
from webhook.dev.cluster import DevCluster, free_port

FAST = Settings(publish_delay=0.05, backoff_base=0.05, backoff_max=0.2, read_timeout=5.0)
H100 = {
    "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
    "nvidia.com/gpu.memory": "81559",
    "nvidia.com/gpu.count": "8",
}


async def until(check: Callable[[], bool], *, within: float = 20.0) -> None:
    deadline = time.monotonic() + within
    while not check():
        assert time.monotonic() < deadline, "condition not reached in time"
        await asyncio.sleep(0.05)


# ------------------------------------------------------------------ pure parts


def test_backoff_grows_with_jitter_up_to_its_cap_and_resets() -> None:
    backoff = Backoff(0.5, 30.0, rng=random.Random(7))  # noqa: S311  # seeded jitter
    delays = [backoff.next() for _ in range(10)]
    assert 0.25 <= delays[0] <= 0.5
    assert 2.0 <= delays[3] <= 4.0
    assert all(15.0 <= d <= 30.0 for d in delays[7:])
    backoff.reset()
    assert backoff.next() <= 0.5


def test_config_map_keys_kept_are_those_env_can_turn_into_a_watched_name() -> None:
    keep = env_key_filter()
    for key in ("NVIDIA_VISIBLE_DEVICES", "VISIBLE_DEVICES", "DEVICES", "CUDA_DISABLE_CONTROL"):
        assert keep(key), key
    # envFrom with prefix "CUDA_DEVICE_MEMORY_LIMIT_" or "CUDA_DEVICE_MEMORY_" makes these
    # per-device limits.
    for key in ("CUDA_DEVICE_MEMORY_LIMIT_0", "LIMIT_3", "0", "12"):
        assert keep(key), key
    for key in ("config.yaml", "ca.crt", "DEVICES_X", "NVIDIA_VISIBLE_DEVICES2", "LOG_LEVEL"):
        assert not keep(key), key


def test_a_config_map_without_a_watched_key_is_not_held() -> None:
    slim = kinds()["configmaps"].slim
    big = {"app.yaml": "x" * 100_000, "NVIDIA_VISIBLE_DEVICES": "all"}
    assert slim({"metadata": {"name": "a"}, "data": big}) == {"NVIDIA_VISIBLE_DEVICES": "all"}
    assert slim({"metadata": {"name": "b"}, "data": {"app.yaml": "x"}}) is None


def _gpu_claim_spec() -> dict[str, Any]:
    return {
        "devices": {
            "requests": [
                {"name": "gpu", "exactly": {"deviceClassName": "gpu.nvidia.com"}},
                {
                    "name": "any",
                    "firstAvailable": [
                        {"name": "mig", "deviceClassName": "mig.nvidia.com"},
                        {"name": "gpu", "deviceClassName": "gpu.nvidia.com"},
                    ],
                },
            ]
        }
    }


def test_claims_and_templates_are_held_as_their_device_classes_alone() -> None:
    # As a list's items come: no kind, which the template's spec nesting depends on.
    claim = {"metadata": {"namespace": "a", "name": "c"}, "spec": _gpu_claim_spec()}
    template = {"metadata": {"namespace": "a", "name": "t"}, "spec": {"spec": _gpu_claim_spec()}}
    assert kinds()["resourceclaims"].slim(claim) == ("gpu.nvidia.com", "mig.nvidia.com")
    assert kinds()["resourceclaimtemplates"].slim(template) == ("gpu.nvidia.com", "mig.nvidia.com")
    assert kinds()["resourceclaimtemplates"].key(template) == ("a", "t")
    # A claim on no class decides as a missing one: nothing is held for it.
    assert kinds()["resourceclaims"].slim({"metadata": {"name": "e"}, "spec": {}}) is None


# ------------------------------------------------------------------ the real apiserver


def _node(name: str, labels: dict[str, str]) -> dict[str, Any]:
    return {"metadata": {"name": name, "labels": labels}}


@pytest.mark.e2e
async def test_view_follows_the_cluster_and_ignores_heartbeats(
    control_plane: DevCluster, core: Any
) -> None:
    core.create_namespace(
        {
            "metadata": {
                "name": "watch-a",
                "labels": {"pod-security.kubernetes.io/enforce": "baseline"},
            }
        }
    )
    core.create_node(_node("watch-gpu-a", H100))
    core.create_node(_node("watch-cpu", {"kubernetes.io/os": "linux"}))
    core.create_node(_node("watch-mig", {"nvidia.com/mig.strategy": "mixed"}))
    core.patch_node_status(
        "watch-mig",
        {
            "status": {
                "capacity": {"nvidia.com/mig-1g.10gb": "7"},
                "allocatable": {"nvidia.com/mig-1g.10gb": "7"},
            }
        },
    )
    core.create_namespaced_config_map(
        "watch-a",
        {
            "metadata": {"name": "env"},
            "data": {"NVIDIA_VISIBLE_DEVICES": "all", "app.yaml": "x" * 10_000},
        },
    )
    core.create_namespaced_resource_quota(
        "watch-a",
        {
            "metadata": {"name": "gpu"},
            "spec": {"hard": {"limits.nvidia.com/gpumem": "10000", "pods": "10"}},
        },
    )
    watch = ClusterWatch(core, settings=FAST)
    task = asyncio.create_task(watch.run())
    try:
        await until(lambda: watch.view.synced)
        view = watch.view
        assert set(view.nodes) >= {"watch-gpu-a", "watch-mig"}
        assert "watch-cpu" not in view.nodes  # no GPU: nothing a decision could use
        node = view.nodes["watch-gpu-a"]
        assert isinstance(node, NodeFacts)
        assert (len(node.cards), node.cards[0].memory_mib) == (8, 81559)
        assert view.nodes["watch-mig"].allocatable == {"nvidia.com/mig-1g.10gb": 7}
        assert view.namespaces["watch-a"].labels["pod-security.kubernetes.io/enforce"] == "baseline"
        (quota,) = view.quotas["watch-a"]
        assert quota.hard == {"limits.nvidia.com/gpumem": "10k"}  # as the apiserver writes it
        assert view.config_maps[("watch-a", "env")] == {"NVIDIA_VISIBLE_DEVICES": "all"}
        status = watch.status()
        assert status["synced"] and status["kinds"]["nodes"]["listed"]

        # A heartbeat-like update changes no fact: the held facts stay the same object,
        # and no new view is published for it (the fence after it is).
        core.patch_node("watch-gpu-a", {"metadata": {"annotations": {"node.alpha/heartbeat": "1"}}})
        core.create_namespaced_config_map(
            "watch-a", {"metadata": {"name": "fence"}, "data": {"CUDA_DISABLE_CONTROL": "true"}}
        )
        nodes, cache = watch.view.nodes, watch.view.cache
        cache["probe"] = True
        await until(lambda: ("watch-a", "fence") in watch.view.config_maps)
        assert watch.view.nodes["watch-gpu-a"] is node
        # Only the kind that changed gets a new face, and the node aggregates survive it.
        assert watch.view.nodes is nodes
        assert watch.view.cache is cache

        # Real changes arrive in a new view object.
        before = watch.view
        core.patch_node("watch-gpu-a", {"metadata": {"labels": {"nvidia.com/gpu.count": "4"}}})
        await until(lambda: len(watch.view.nodes["watch-gpu-a"].cards) == 4)
        assert watch.view is not before
        assert "probe" not in watch.view.cache, "node aggregates must be recomputed"
        core.delete_namespaced_config_map("env", "watch-a")
        core.delete_node("watch-mig")
        core.patch_namespaced_resource_quota_status(
            "gpu",
            "watch-a",
            {
                "status": {
                    "hard": {"limits.nvidia.com/gpumem": "10k"},
                    "used": {"limits.nvidia.com/gpumem": "4k"},
                }
            },
        )
        await until(
            lambda: (
                ("watch-a", "env") not in watch.view.config_maps
                and "watch-mig" not in watch.view.nodes
                and watch.view.quotas["watch-a"][0].used == {"limits.nvidia.com/gpumem": "4k"}
            )
        )
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


@pytest.mark.e2e
async def test_view_holds_claims_and_templates_by_their_classes(
    control_plane: DevCluster, core: Any
) -> None:
    from kubernetes import client

    resource: Any = client.ResourceV1Api(control_plane.api_client())
    core.create_namespace({"metadata": {"name": "watch-claims"}})
    resource.create_namespaced_resource_claim(
        "watch-claims", {"metadata": {"name": "gpu"}, "spec": _gpu_claim_spec()}
    )
    channel = {
        "devices": {
            "requests": [
                {
                    "name": "channel",
                    "exactly": {"deviceClassName": "compute-domain-default-channel.nvidia.com"},
                }
            ]
        }
    }
    resource.create_namespaced_resource_claim_template(
        "watch-claims", {"metadata": {"name": "imex"}, "spec": {"spec": channel}}
    )
    watch = ClusterWatch(core, settings=FAST)
    task = asyncio.create_task(watch.run())
    try:
        await until(lambda: watch.view.synced)
        assert watch.view.resource_claims[("watch-claims", "gpu")] == (
            "gpu.nvidia.com",
            "mig.nvidia.com",
        )
        assert watch.view.claim_templates[("watch-claims", "imex")] == (
            "compute-domain-default-channel.nvidia.com",
        )
        # Watched: a template written after the list arrives, one deleted goes.
        resource.create_namespaced_resource_claim_template(
            "watch-claims", {"metadata": {"name": "gpu"}, "spec": {"spec": _gpu_claim_spec()}}
        )
        resource.delete_namespaced_resource_claim("gpu", "watch-claims")
        await until(
            lambda: (
                ("watch-claims", "gpu") in watch.view.claim_templates
                and ("watch-claims", "gpu") not in watch.view.resource_claims
            )
        )
        assert watch.status()["kinds"]["resourceclaims"]["listed"]
        assert "served" not in watch.status()["kinds"]["resourceclaims"]
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


@pytest.mark.e2e
async def test_claims_of_an_apiserver_without_resource_v1_are_none(
    control_plane: DevCluster, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """kube-apiserver before 1.34 serves no resource.k8s.io/v1; so does one with it off."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    cluster = DevCluster(
        workdir=tmp_path,
        bin_dir=control_plane.bin_dir,
        policy=Path(os.devnull),
        apiserver_args=("--runtime-config=resource.k8s.io/v1=false",),
    )
    caplog.set_level("INFO", logger="webhook.cluster.watch")
    try:
        cluster.start_control_plane()
        core: Any = client.CoreV1Api(cluster.api_client())
        with pytest.raises(ApiException) as absent:
            client.ResourceV1Api(cluster.api_client()).list_resource_claim_for_all_namespaces()
        assert absent.value.status == 404  # the test means something
        watch = ClusterWatch(core, settings=FAST)
        task = asyncio.create_task(watch.run())
        try:
            await until(lambda: watch.view.synced)
            kinds_status = watch.status()["kinds"]
            for kind in ("resourceclaims", "resourceclaimtemplates"):
                assert kinds_status[kind]["served"] is False, kinds_status
                assert "error" not in kinds_status[kind]
            assert kinds_status["nodes"]["listed"]
            said = [r for r in caplog.records if "not served by this apiserver" in r.message]
            assert len(said) == 2, said
        finally:
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
    finally:
        cluster.stop()


async def test_unreachable_api_never_syncs_and_says_why() -> None:
    from kubernetes import client

    configuration = client.Configuration()
    configuration.host = f"https://127.0.0.1:{free_port()}"  # nothing listens there
    api = client.CoreV1Api(client.ApiClient(configuration))
    watch = ClusterWatch(api, settings=FAST)
    task = asyncio.create_task(watch.run())
    try:
        await until(lambda: all("error" in k for k in watch.status()["kinds"].values()))
        status = watch.status()
        assert status["synced"] is False and status["stale"] is True
        assert "Connection refused" in status["kinds"]["nodes"]["error"]
        assert watch.view.synced is False
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


# ------------------------------------------------------------------ a loopback fake API


class FakeApi:
    """Lists and watches of every kind, scripted by the test; empty by default."""

    def __init__(self) -> None:
        self.items: dict[str, list[dict[str, Any]]] = {}
        self.watch_events: dict[str, list[dict[str, Any]]] = {}
        self.lists: dict[str, int] = {}
        self.up = True
        self.resource_served = False

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/api/v1/{kind}", self.handle)
        app.router.add_get("/apis/resource.k8s.io/v1/{kind}", self.handle_resource)
        return app

    async def handle_resource(self, request: web.Request) -> web.StreamResponse:
        """resource.k8s.io/v1, where the test serves it; else a 404 with a Status, as a
        kube-apiserver that does not serve the group answers (the real one, with the group
        switched off, in test_claims_of_an_apiserver_without_resource_v1_are_none)."""
        if not self.resource_served:
            kind = request.match_info["kind"]
            self.lists[kind] = self.lists.get(kind, 0) + 1
            return web.json_response(
                {"kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404},
                status=404,
            )
        return await self.handle(request)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        kind = request.match_info["kind"]
        if not self.up:
            return web.Response(status=503, text="down")
        if request.query.get("watch") not in ("true", "1", "True"):
            self.lists[kind] = self.lists.get(kind, 0) + 1
            body = {
                "kind": "List",
                "metadata": {"resourceVersion": "10"},
                "items": self.items.get(kind, []),
            }
            return web.json_response(body)
        response = web.StreamResponse(headers={"Content-Type": "application/json"})
        await response.prepare(request)
        for event in self.watch_events.pop(kind, []):
            await response.write(orjson.dumps(event) + b"\n")
        if not self.watch_events.get(kind) and self.up:
            await asyncio.sleep(min(float(request.query.get("timeoutSeconds", "1")), 1.0))
        return response


@pytest.fixture
async def fake() -> AsyncIterator[tuple[FakeApi, Any]]:
    from kubernetes import client

    api = FakeApi()
    runner = web.AppRunner(api.app())
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    configuration = client.Configuration()
    configuration.host = f"http://127.0.0.1:{port}"
    try:
        yield api, client.CoreV1Api(client.ApiClient(configuration))
    finally:
        await runner.cleanup()


def _gpu_node(name: str) -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": "11", "labels": H100}}


async def test_gone_relists_and_forgets_what_the_new_list_lacks(fake: tuple[FakeApi, Any]) -> None:
    api, core = fake
    api.items["nodes"] = [_gpu_node("a")]
    api.watch_events["nodes"] = [
        {"type": "ERROR", "object": {"kind": "Status", "code": 410, "message": "too old"}}
    ]
    published: list[Change] = []

    def collect(_kind: str, changes: list[Change], _listed: bool) -> None:
        published.extend(changes)
        api.items["nodes"] = [_gpu_node("b")]  # what the relist will find

    reflector = Reflector(kinds()["nodes"], core, collect, FAST)
    await asyncio.to_thread(reflector.start)
    try:
        await until(lambda: api.lists.get("nodes", 0) >= 2 and len(published) >= 3)
    finally:
        await asyncio.to_thread(reflector.stop)
    first, *after = published
    assert first[0] == "a" and first[1] is not None
    assert ("a", None) in after and any(key == "b" and facts for key, facts in after)
    assert set(reflector.shadow) == {"b"}


async def test_view_goes_stale_when_the_api_goes_away_and_recovers(
    fake: tuple[FakeApi, Any],
) -> None:
    api, core = fake
    api.items["nodes"] = [_gpu_node("a")]
    settings = Settings(
        publish_delay=0.05, backoff_base=0.05, backoff_max=0.2, read_timeout=0.5, stale_after=1.5
    )
    watch = ClusterWatch(core, settings=settings)
    task = asyncio.create_task(watch.run())
    try:
        await until(lambda: watch.view.synced)
        api.up = False
        await until(lambda: not watch.view.synced, within=10)
        assert "a" in watch.view.nodes  # what it knew is kept, but not used while stale
        assert watch.age() > settings.stale_after
        api.up = True
        await until(lambda: watch.view.synced, within=10)
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task


async def test_claims_not_served_are_none_held_synced_and_looked_for_again(
    fake: tuple[FakeApi, Any], caplog: pytest.LogCaptureFixture
) -> None:
    api, core = fake
    api.items["nodes"] = [_gpu_node("a")]
    settings = Settings(publish_delay=0.05, backoff_base=0.05, read_timeout=0.5, resync=0.5)
    watch = ClusterWatch(core, settings=settings)
    task = asyncio.create_task(watch.run())
    caplog.set_level("INFO", logger="webhook.cluster.watch")
    try:
        await until(lambda: watch.view.synced)
        status = watch.status()["kinds"]
        for kind in ("resourceclaims", "resourceclaimtemplates"):
            assert status[kind]["listed"] and status[kind]["served"] is False
            assert "error" not in status[kind]
        # Looked for again at each resync, and said once.
        await until(lambda: api.lists.get("resourceclaimtemplates", 0) >= 3)
        said = [r for r in caplog.records if "resourceclaimtemplates: not served" in r.message]
        assert len(said) == 1, said
        assert watch.view.synced and watch.age() < 1.0

        # An apiserver upgraded to serve it: the next look finds the template.
        template = {
            "metadata": {"namespace": "t", "name": "gpu", "resourceVersion": "12"},
            "spec": {"spec": _gpu_claim_spec()},
        }
        api.items["resourceclaimtemplates"] = [template]
        api.resource_served = True
        await until(lambda: ("t", "gpu") in watch.view.claim_templates)
        assert watch.view.claim_templates[("t", "gpu")] == ("gpu.nvidia.com", "mig.nvidia.com")
        assert "served" not in watch.status()["kinds"]["resourceclaimtemplates"]
        assert watch.view.synced
    finally:
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
