"""The rows of docs/threat-model.md that say a node component honours an input, on a
real node: with the guarding rule at ``audit`` the attack pod is admitted and the node
shows what the row says (an extra device, env or file) where the row says the input is
honoured, and nothing extra where it is not; with the rule at ``deny`` it is refused."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from tests.nodeharness.conftest import on
from tests.nodeharness.pods import ALL_CARDS, NodeHarness, Report, cards, container, gpu_limits, pod
from webhook.dev.node import GPU_UUIDS


@dataclass(frozen=True)
class Attack:
    name: str
    rule: str
    manifest: Callable[[str], dict[str, Any]]
    # The node profiles that honour the input (docs/threat-model.md, the row's last columns).
    honoured_on: frozenset[str]
    # What the container shows when the input is honoured.
    shows: Callable[[Report], bool]
    container: str = "main"


def _env_visible_devices(name: str) -> dict[str, Any]:
    env = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    return pod(name, container("main", env=env))


def _privileged(name: str) -> dict[str, Any]:
    main = container("main", resources=gpu_limits(), securityContext={"privileged": True})
    return pod(name, main)


def _device_mount(name: str) -> dict[str, Any]:
    # The toolkit's volume-mount device request (cuda_image.go requestsFromMounts):
    # /dev/null at /var/run/nvidia-container-devices/<id>.
    mount = {"name": "request", "mountPath": f"/var/run/nvidia-container-devices/{GPU_UUIDS[3]}"}
    volume = {"name": "request", "hostPath": {"path": "/dev/null"}}
    return pod(name, container("main", volumeMounts=[mount]), volumes=[volume])


def _cdi_annotation(name: str) -> dict[str, Any]:
    return pod(name, container("main"), annotations={"cdi.k8s.io/gpushare": "nvidia.com/gpu=all"})


def _disable_control(name: str) -> dict[str, Any]:
    env = [{"name": "CUDA_DISABLE_CONTROL", "value": "true"}]
    return pod(name, container("main", resources=gpu_limits(), env=env))


ATTACKS = (
    # 2.1 NVIDIA_VISIBLE_DEVICES in a pod's env: every card, unless node setting 1.
    Attack(
        "env-visible-devices",
        "raw-visible-devices",
        _env_visible_devices,
        frozenset({"default"}),
        lambda r: cards(r) == list(ALL_CARDS),
    ),
    # 2.1 CAP_SYS_ADMIN: a privileged container gets every host device, whatever the
    # toolkit's settings.
    Attack(
        "privileged",
        "privileged-gpu",
        _privileged,
        frozenset({"default", "hardened"}),
        lambda r: cards(r) == list(ALL_CARDS),
    ),
    # 2.1 a device-request mount: honoured only with node setting 2.
    Attack(
        "device-request-mount",
        "host-device-access",
        _device_mount,
        frozenset({"hardened"}),
        lambda r: cards(r) == ["/dev/nvidia3"],
    ),
    # 2.1 a CDI annotation on the pod: containerd passes no pod annotation to the
    # container's OCI spec unless its runtime lists it in pod_annotations (node
    # setting 3): honoured on neither profile here.
    Attack(
        "cdi-annotation",
        "host-device-access",
        _cdi_annotation,
        frozenset(),
        lambda r: bool(cards(r)),
    ),
    # 2.2 CUDA_DISABLE_CONTROL=true in the pod spec: HAMi's device plugin leaves out
    # /etc/ld.so.preload (server.go:866-884).
    Attack(
        "disable-control",
        "limit-tampering",
        _disable_control,
        frozenset({"default", "hardened"}),
        lambda r: r["preload"] is None,
    ),
)


@pytest.mark.parametrize("attack", ATTACKS, ids=lambda a: a.name)
@on("default-audit", "hardened-audit")
def test_attack_is_real_where_the_row_says(node: NodeHarness, attack: Attack) -> None:
    namespace = node.namespace(attack.name)
    report = node.run(namespace, attack.manifest(attack.name), attack.container)
    honoured = node.profile in attack.honoured_on
    assert attack.shows(report) is honoured, report


@pytest.mark.parametrize("attack", ATTACKS, ids=lambda a: a.name)
@on("default")
def test_attack_is_refused_at_deny(node: NodeHarness, attack: Attack) -> None:
    namespace = node.namespace(attack.name)
    refusal = node.refusal(namespace, attack.manifest(attack.name))
    assert f"[{attack.rule}]" in refusal or attack.rule in refusal, refusal
