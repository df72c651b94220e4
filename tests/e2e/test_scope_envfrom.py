"""``envFrom`` and the webhooks' scope through a real kube-apiserver.

With ``cluster.configMapEnv`` the webhook judges the variables a container takes from a
ConfigMap, so the generated matchConditions must send every pod with an ``envFrom`` of
a ConfigMap, GPU or not, and still skip a plain pod without one. Without it, such a
pod never waits on the webhook. Whether the webhook was called is read from its audit
log, as in test_scope.py; the pods are server-side dry-run creates.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any, Final

import pytest

from tests.e2e.rest import Api, Obj, gpu_pod, plain_container, sendable
from tests.e2e.test_cluster_view import eventually, message, swapped_policy
from tests.e2e.test_scope import admitted_names
from webhook.dev.cluster import DevCluster

pytestmark = pytest.mark.e2e

HARMLESS: Final = "app-env"
EXPOSING: Final = "cuda-env"


@pytest.fixture(scope="module")
def api(cluster: DevCluster) -> Iterator[Api]:
    client = Api(cluster)
    yield client
    client.http.clear()


def envfrom_pod(name: str, config_map: str | None, **extra: Any) -> Obj:
    container = plain_container(**extra)
    if config_map is not None:
        container["envFrom"] = [{"configMapRef": {"name": config_map}}]
    pod: Obj = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {},
        "spec": {"containers": [container]},
    }
    return sendable("Pod", pod, name)


def _judge_config_map_env(document: Obj) -> None:
    document["spec"].setdefault("cluster", {})["configMapEnv"] = True


def test_envfrom_reaches_the_webhook_exactly_when_the_policy_judges_it(
    cluster: DevCluster, api: Api, core: Any, namespace: str
) -> None:
    core.create_namespaced_config_map(
        namespace, {"metadata": {"name": HARMLESS}, "data": {"LOG_LEVEL": "debug"}}
    )
    core.create_namespaced_config_map(
        namespace, {"metadata": {"name": EXPOSING}, "data": {"NVIDIA_VISIBLE_DEVICES": "all"}}
    )
    # The default policy leaves envFrom alone: not even the exposing ConfigMap is judged.
    for name, source in (("off-harmless", HARMLESS), ("off-exposing", EXPOSING)):
        sent = api.create("Pod", namespace, envfrom_pod(name, source))
        assert sent.status == 201, sent.body
    with swapped_policy(cluster, _judge_config_map_env):
        plain = api.create("Pod", namespace, envfrom_pod("on-plain", None))
        assert plain.status == 201, plain.body
        harmless = api.create("Pod", namespace, envfrom_pod("on-harmless", HARMLESS))
        assert harmless.status == 201, harmless.body
        # The webhook reloads its policy within a second; the view has the ConfigMap.
        exposing = eventually(
            lambda: api.create("Pod", namespace, envfrom_pod("on-exposing", EXPOSING)),
            lambda sent: sent.status == 403,
        )
        assert exposing.status == 403, exposing.body
        assert "raw-visible-devices" in message(exposing)
        assert "from ConfigMap cuda-env" in message(exposing)
        sentinel = api.create("Pod", namespace, gpu_pod("sentinel"))
        assert sentinel.status == 201, sentinel.body
        called = admitted_names(cluster, namespace, sentinel="sentinel")
    assert {"on-harmless", "on-exposing"} <= called, sorted(called)
    assert not called & {"on-plain", "off-harmless", "off-exposing"}, sorted(called)
