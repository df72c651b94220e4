"""The self-managed certificate mode through a real kube-apiserver: one leader of two
replicas, the Secret, the caBundle of every webhook, a CA roll, a failover."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import socket
import ssl
import time
import urllib.request
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import orjson
import pytest
from cryptography import x509
from cryptography.x509 import DNSName
from cryptography.x509.verification import PolicyBuilder, Store, VerificationError

from tests.e2e import serving
from tests.e2e.rest import account_client, idle_webhook
from webhook.certs.lease import read_json
from webhook.certs.material import CertificateError
from webhook.certs.rotation import (
    CA_BUNDLE,
    CA_CERT,
    CA_KEY,
    SERVING_CERT,
    SERVING_KEY,
    parse_bundle,
)
from webhook.certs.selfmanaged import SelfManagedCertificates
from webhook.dev.cluster import DevCluster
from webhook.render.validating import POLICY_NAMES

pytestmark = pytest.mark.e2e

NAMESPACE = "e2e-rotation"
SECRET = "e2e-rotation-tls"
CONFIG = "e2e-rotation"
SERVICE = "gpushare-webhook"
LEASE = f"{SECRET}-leader"
# Short enough that a failover takes seconds; the production lease is 30 s.
LEASE_SECONDS = 2.0
WAIT = 20.0
# Spelled out here, not taken from the code under test, so a key it drops is noticed.
SECRET_KEYS = (CA_CERT, CA_KEY, SERVING_CERT, SERVING_KEY, CA_BUNDLE)

T = TypeVar("T")


class FakeClock:
    """The certificates' clock; the Lease keeps real (monotonic) time."""

    def __init__(self) -> None:
        self.now = datetime.now(UTC)

    def __call__(self) -> datetime:
        return self.now


def webhook(name: str) -> dict[str, Any]:
    return idle_webhook(name, label="e2e.gpushare.io/rotation", resource="configmaps")


@pytest.fixture
def admission(cluster: DevCluster) -> Iterator[Any]:
    """Mutating (two webhooks) and validating configurations of this test only."""
    from kubernetes import client

    api: Any = client.AdmissionregistrationV1Api(cluster.api_client())
    mutating = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": CONFIG},
        "webhooks": [
            {**webhook("one.rotation.e2e.gpushare.io"), "reinvocationPolicy": "Never"},
            {**webhook("two.rotation.e2e.gpushare.io"), "reinvocationPolicy": "Never"},
        ],
    }
    validating = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "ValidatingWebhookConfiguration",
        "metadata": {"name": CONFIG},
        "webhooks": [webhook("check.rotation.e2e.gpushare.io")],
    }
    api.create_mutating_webhook_configuration(mutating)
    api.create_validating_webhook_configuration(validating)
    cluster.create_namespace(NAMESPACE)
    try:
        yield api
    finally:
        api.delete_mutating_webhook_configuration(CONFIG)
        api.delete_validating_webhook_configuration(CONFIG)
        api.api_client.close()


def ca_bundles(admission: Any) -> list[bytes]:
    """The caBundle of every webhook of both configurations (empty when unset)."""
    bundles = []
    for read in (
        admission.read_mutating_webhook_configuration,
        admission.read_validating_webhook_configuration,
    ):
        config = read_json(read(CONFIG, _preload_content=False))
        for hook in config["webhooks"]:
            bundles.append(base64.b64decode(hook["clientConfig"].get("caBundle", "")))
    return bundles


def secret_of(core: Any) -> dict[str, Any]:
    secret: dict[str, Any] = read_json(
        core.read_namespaced_secret(SECRET, NAMESPACE, _preload_content=False)
    )
    secret["data"] = {k: base64.b64decode(v) for k, v in secret["data"].items()}
    return secret


def lease_of(cluster: DevCluster, name: str = LEASE) -> dict[str, Any]:
    from kubernetes import client

    api: Any = client.CoordinationV1Api(cluster.api_client())
    lease: dict[str, Any] = read_json(
        api.read_namespaced_lease(name, NAMESPACE, _preload_content=False)
    )
    api.api_client.close()
    return lease


def lease_holder(cluster: DevCluster, name: str = LEASE) -> str | None:
    holder: str | None = lease_of(cluster, name)["spec"].get("holderIdentity")
    return holder


def verifies(leaf_pem: bytes, bundle_pem: bytes, at: datetime) -> bool:
    verifier = (
        PolicyBuilder()
        .store(Store(parse_bundle(bundle_pem)))
        .time(at)
        .build_server_verifier(DNSName(f"{SERVICE}.{NAMESPACE}.svc"))
    )
    try:
        verifier.verify(x509.load_pem_x509_certificate(leaf_pem), [])
    except VerificationError:
        return False
    return True


async def eventually(check: Callable[[], T | None], what: str) -> T:
    """Wait (off the event loop, where the managers run) until ``check`` returns a value."""
    deadline = asyncio.get_running_loop().time() + WAIT
    while True:
        result = await asyncio.to_thread(check)
        if result is not None and result is not False:
            return result
        if asyncio.get_running_loop().time() > deadline:
            pytest.fail(f"not within {WAIT:g}s: {what}")
        await asyncio.sleep(0.05)


class Replicas:
    """Managers sharing one fake clock, each with its own client, directory and task."""

    def __init__(self, cluster: DevCluster, base: Path, clock: FakeClock) -> None:
        self.cluster = cluster
        self.base = base
        self.clock = clock
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.clients: list[Any] = []

    def new(self, identity: str) -> SelfManagedCertificates:
        api = self.cluster.api_client()
        self.clients.append(api)
        return SelfManagedCertificates(
            api,
            namespace=NAMESPACE,
            service=SERVICE,
            secret=SECRET,
            webhook_config=CONFIG,
            cert_dir=self.base / identity,
            identity=identity,
            clock=self.clock,
            interval=0.2,
            lease_duration=LEASE_SECONDS,
            renew_interval=0.2,
            request_timeout=5.0,
        )

    def start(self, manager: SelfManagedCertificates) -> None:
        self.tasks[manager.identity] = asyncio.create_task(manager.run())

    async def stop(self, manager: SelfManagedCertificates) -> None:
        task = self.tasks.pop(manager.identity)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task

    async def close(self) -> None:
        for task in self.tasks.values():
            task.cancel()
        for task in self.tasks.values():
            with contextlib.suppress(asyncio.CancelledError):
                await task
        for api in self.clients:
            api.close()


async def test_two_replicas_one_leader_roll_and_failover(
    cluster: DevCluster, admission: Any, tmp_path: Path
) -> None:
    from kubernetes import client

    core: Any = client.CoreV1Api(cluster.api_client())
    clock = FakeClock()
    replicas = Replicas(cluster, tmp_path, clock)
    try:
        a, b = replicas.new("replica-a"), replicas.new("replica-b")
        # Both start at once: one issues, the other waits for its Secret.
        await asyncio.gather(a.ensure_ready(WAIT, poll=0.1), b.ensure_ready(WAIT, poll=0.1))
        leaders = [m for m in (a, b) if m.is_leader]
        assert len(leaders) == 1
        (leader,) = leaders
        follower = b if leader is a else a
        for manager in (a, b):
            replicas.start(manager)
        assert await asyncio.to_thread(lease_holder, cluster) == leader.identity

        secret = await asyncio.to_thread(secret_of, core)
        assert secret["type"] == "kubernetes.io/tls"
        assert set(secret["data"]) == set(SECRET_KEYS)
        first = secret["data"]
        for manager in (a, b):
            assert manager.paths.cert_file.read_bytes() == first[SERVING_CERT]
            assert manager.paths.key_file.stat().st_mode & 0o777 == 0o600
        assert ca_bundles(admission) == [first[CA_BUNDLE]] * 3
        assert verifies(first[SERVING_CERT], first[CA_BUNDLE], clock.now)

        # 300 days on: the leaf was renewed (it had expired); both replicas get it.
        clock.now += timedelta(days=300)

        def renewed() -> dict[str, bytes] | None:
            data: dict[str, bytes] = secret_of(core)["data"]
            files = {m.paths.cert_file.read_bytes() for m in (a, b)}
            if data[SERVING_CERT] != first[SERVING_CERT] and files == {data[SERVING_CERT]}:
                return data
            return None

        before_roll = await eventually(renewed, "the renewed leaf in the Secret and both dirs")
        assert before_roll[CA_CERT] == first[CA_CERT]

        # Six more days: the CA has 59 left and rolls. The bundle then holds both CAs in
        # every webhook, and both replicas serve a leaf of the new CA.
        clock.now += timedelta(days=6)

        def rolled() -> dict[str, bytes] | None:
            data: dict[str, bytes] = secret_of(core)["data"]
            cas = parse_bundle(data[CA_BUNDLE])
            if len(cas) != 2 or cas[0] != x509.load_pem_x509_certificate(data[CA_CERT]):
                return None
            leaf = x509.load_pem_x509_certificate(data[SERVING_CERT])
            if leaf.issuer != cas[0].subject:
                return None
            if {m.paths.cert_file.read_bytes() for m in (a, b)} != {data[SERVING_CERT]}:
                return None
            if ca_bundles(admission) != [data[CA_BUNDLE]] * 3:
                return None
            return data

        after_roll = await eventually(rolled, "a CA roll published to the webhooks and dirs")
        assert parse_bundle(after_roll[CA_BUNDLE])[1] == x509.load_pem_x509_certificate(
            first[CA_CERT]
        )
        assert verifies(after_roll[SERVING_CERT], after_roll[CA_BUNDLE], clock.now)
        # A replica that has not switched yet still passes with the new bundle.
        assert verifies(before_roll[SERVING_CERT], after_roll[CA_BUNDLE], clock.now)

        # The leader dies without a word: the other takes over once the lease lapses.
        leader.release_on_stop = False
        await replicas.stop(leader)
        await eventually(lambda: follower.is_leader, f"{follower.identity} leading")
        assert await asyncio.to_thread(lease_holder, cluster) == follower.identity

        # The new leader works: a week after the roll the old CA leaves every bundle.
        clock.now += timedelta(days=7)

        def dropped() -> bool:
            data = secret_of(core)["data"]
            return data[CA_BUNDLE] == data[CA_CERT] and ca_bundles(admission) == [data[CA_CERT]] * 3

        await eventually(dropped, "the old CA dropped by the new leader")

        # A replica that stops cleanly hands the Lease over at once.
        again = replicas.new(leader.identity)
        await again.ensure_ready(WAIT, poll=0.1)
        assert not again.is_leader
        replicas.start(again)
        await replicas.stop(follower)
        assert await asyncio.to_thread(lease_holder, cluster) != follower.identity
        await eventually(lambda: again.is_leader, f"{again.identity} leading again")
    finally:
        await replicas.close()
        core.api_client.close()


async def test_a_follower_without_a_secret_gives_up_with_the_reason(
    cluster: DevCluster, admission: Any, tmp_path: Path
) -> None:
    from kubernetes import client

    coordination: Any = client.CoordinationV1Api(cluster.api_client())
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    lease = {
        "metadata": {"name": "e2e-orphan-tls-leader"},
        # A holder that renewed just now and holds for an hour, but writes nothing.
        "spec": {
            "holderIdentity": "silent-leader",
            "leaseDurationSeconds": 3600,
            "acquireTime": now,
            "renewTime": now,
        },
    }
    coordination.create_namespaced_lease(NAMESPACE, lease)
    api = cluster.api_client()
    manager = SelfManagedCertificates(
        api,
        namespace=NAMESPACE,
        service=SERVICE,
        secret="e2e-orphan-tls",
        webhook_config=CONFIG,
        cert_dir=tmp_path / "late",
        identity="replica-late",
    )
    try:
        with pytest.raises(CertificateError) as raised:
            await manager.ensure_ready(1.0, poll=0.2)
        message = str(raised.value)
        assert "Secret e2e-rotation/e2e-orphan-tls does not exist" in message
        assert "held by silent-leader" in message
        assert not manager.is_leader
        assert not manager.paths.cert_file.exists()
    finally:
        api.close()
        coordination.api_client.close()


def test_serve_self_managed_with_workers(
    cluster: DevCluster, admission: Any, tmp_path: Path
) -> None:
    """The real command: the supervising parent fetches the pair before forking and keeps
    it current, every worker serves it; the apiserver's view (the caBundle) verifies it."""
    from kubernetes import client

    core: Any = client.CoreV1Api(cluster.api_client())
    try:
        with serving.self_managed(
            cluster,
            tmp_path,
            namespace=NAMESPACE,
            secret="e2e-serve-tls",
            webhook_config=CONFIG,
            pod_name="e2e-serve-pod",
            args=("--workers=2",),
        ) as served:
            # Ready once both workers have answered (each reports its pid).
            ready = f"http://127.0.0.1:{served.health_port}/readyz"
            pids: set[int] = set()
            deadline = time.monotonic() + 60
            while len(pids) < 2:
                assert served.process.poll() is None, served.output()
                with (
                    contextlib.suppress(OSError),
                    urllib.request.urlopen(ready, timeout=1) as response,
                ):
                    pids.add(orjson.loads(response.read())["pid"])
                assert time.monotonic() < deadline, served.output()
                time.sleep(0.05)
            data = {
                k: base64.b64decode(v)
                for k, v in read_json(
                    core.read_namespaced_secret("e2e-serve-tls", NAMESPACE, _preload_content=False)
                )["data"].items()
            }
            assert ca_bundles(admission) == [data[CA_BUNDLE]] * 3
            # What the apiserver does: dial the Service name, trust the caBundle.
            context = ssl.create_default_context(cadata=data[CA_BUNDLE].decode())
            for _ in range(4):  # both workers accept on the shared port
                with (
                    socket.create_connection(("127.0.0.1", served.port), timeout=5) as raw,
                    context.wrap_socket(raw, server_hostname=f"{SERVICE}.{NAMESPACE}.svc") as tls,
                ):
                    presented = tls.getpeercert(binary_form=True)
                assert presented is not None
                assert x509.load_der_x509_certificate(presented) == x509.load_pem_x509_certificate(
                    data[SERVING_CERT]
                )
            assert lease_holder(cluster, "e2e-serve-tls-leader") == "e2e-serve-pod"
            # The parent, once; never a worker.
            assert served.output().count("leads Lease") == 1, served.output()
    finally:
        core.api_client.close()


def _arg(args: list[str], flag: str) -> str:
    (value,) = [a.split("=", 1)[1] for a in args if a.startswith(f"{flag}=")]
    return value


async def test_the_install_rbac_is_all_the_mode_needs(
    cluster: DevCluster, admission: Any, tmp_path: Path
) -> None:
    """The Role and ClusterRole of deploy/overlays/self-managed, bound to a service
    account whose token runs a manager: issue, renew, hand over, nothing refused.
    Only the object names differ from the install, to leave the real configurations
    of the other tests alone."""
    from kubernetes import client

    from webhook.install import manifests

    objects = manifests.render(overlay="self-managed", namespace=NAMESPACE)
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    secret, config = _arg(args, "--secret"), _arg(args, "--webhook-config")
    # Our names for the install's: the Secret, its Lease and the configurations.
    renames = {secret: "e2e-rbac-tls", f"{secret}-leader": "e2e-rbac-tls-leader", config: CONFIG}
    rbac = [
        o
        for o in objects
        if o["kind"] in ("Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding")
    ]
    assert {o["kind"] for o in rbac} == {"Role", "RoleBinding", "ClusterRole", "ClusterRoleBinding"}
    named = {n for o in rbac for r in o.get("rules", []) for n in r.get("resourceNames", [])}
    # The CEL policies the leader keeps in step (tests/e2e/test_reconcile.py): one per
    # action, whichever actions the policy's rules take.
    cel = set(POLICY_NAMES)
    assert named == set(renames) | cel, (
        "the Role must name the Secret, its Lease, the configurations and the CEL policies"
    )
    account = deployment["spec"]["template"]["spec"]["serviceAccountName"]
    for obj in rbac:
        obj["metadata"]["name"] = "e2e-rotation-rbac"
        obj.get("roleRef", {})["name"] = "e2e-rotation-rbac"
        for rule in obj.get("rules", []):
            if "resourceNames" in rule:
                rule["resourceNames"] = [renames.get(n, n) for n in rule["resourceNames"]]

    admin = cluster.api_client()
    core: Any = client.CoreV1Api(admin)
    rbac_api: Any = client.RbacAuthorizationV1Api(admin)
    with contextlib.suppress(client.ApiException):
        core.create_namespaced_service_account(NAMESPACE, {"metadata": {"name": account}})
    create = {
        "Role": lambda o: rbac_api.create_namespaced_role(NAMESPACE, o),
        "RoleBinding": lambda o: rbac_api.create_namespaced_role_binding(NAMESPACE, o),
        "ClusterRole": rbac_api.create_cluster_role,
        "ClusterRoleBinding": rbac_api.create_cluster_role_binding,
    }
    for obj in rbac:
        create[obj["kind"]](obj)
    as_account = account_client(cluster, core, account, NAMESPACE)
    clock = FakeClock()

    def manager(identity: str) -> SelfManagedCertificates:
        return SelfManagedCertificates(
            as_account,
            namespace=NAMESPACE,
            service=SERVICE,
            secret="e2e-rbac-tls",
            webhook_config=CONFIG,
            cert_dir=tmp_path / identity,
            identity=identity,
            clock=clock,
            lease_duration=LEASE_SECONDS,
            renew_interval=0.2,
        )

    try:
        first = manager("rbac-a")
        await first.ensure_ready(WAIT, poll=0.1)  # get + create: Lease, Secret; patch
        assert first.is_leader
        data = {
            k: base64.b64decode(v)
            for k, v in read_json(
                core.read_namespaced_secret("e2e-rbac-tls", NAMESPACE, _preload_content=False)
            )["data"].items()
        }
        assert ca_bundles(admission) == [data[CA_BUNDLE]] * 3
        lease = await asyncio.to_thread(lease_of, cluster, "e2e-rbac-tls-leader")
        clock.now += timedelta(days=61)  # the leaf is due
        await first.ensure_ready(WAIT, poll=0.1)  # update: the Lease (renew), the Secret
        renewed = await asyncio.to_thread(lease_of, cluster, "e2e-rbac-tls-leader")
        assert renewed["spec"]["renewTime"] != lease["spec"]["renewTime"]
        assert first.paths.cert_file.read_bytes() != data[SERVING_CERT]
        task = asyncio.create_task(first.run())
        await asyncio.sleep(0)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task  # releases the Lease: update
        released = await asyncio.to_thread(lease_of, cluster, "e2e-rbac-tls-leader")
        assert released["spec"]["holderIdentity"] == ""
        second = manager("rbac-b")
        await second.ensure_ready(WAIT, poll=0.1)
        assert second.is_leader
    finally:
        as_account.close()
        rbac_api.delete_cluster_role_binding("e2e-rotation-rbac")
        rbac_api.delete_cluster_role("e2e-rotation-rbac")
        admin.close()
