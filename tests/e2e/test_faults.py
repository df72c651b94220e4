"""Faults through a real kube-apiserver: the apiserver restarted and etcd away while the
cluster view and the leader run, the certificate Secret deleted, the leader killed in
the middle of a CA roll, workers killed while their parent leads.

These tests restart the control plane, so they run their own (etcd + kube-apiserver),
not the session's that other tests share.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import json
import os
import signal
import socket
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, TypeVar

import orjson
import pytest
import yaml
from cryptography import x509
from cryptography.x509 import DNSName
from cryptography.x509.verification import PolicyBuilder, Store, VerificationError
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from tests.e2e import serving
from tests.e2e.rest import idle_webhook
from tests.paths import ROOT
from webhook.certs.issue import generate_ca, generate_serving, service_dns_names
from webhook.certs.lease import read_json
from webhook.certs.rotation import (
    CA_BUNDLE,
    CA_CERT,
    CA_KEY,
    SERVING_CERT,
    SERVING_KEY,
    parse_bundle,
)
from webhook.dev.cluster import DevCluster
from webhook.dev.testing import admission_review

pytestmark = pytest.mark.e2e

NAMESPACE = "e2e-faults"
CONFIG = "e2e-faults"
SERVICE = "gpushare-webhook"
HOST = f"{SERVICE}.{NAMESPACE}.svc"
# Short, so that a lapsed leadership comes back in seconds; the production lease is 30 s.
LEASE = ("--lease-duration=3", "--check-interval=1")
WAIT = 60.0
POD = yaml.safe_load((ROOT / "tests" / "manifests" / "hami-vgpu-pod.yaml").read_text())

T = TypeVar("T")


@pytest.fixture(scope="module")
def plane(bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    workdir = tmp_path_factory.mktemp("faults")
    policy = workdir / "policy.yaml"
    policy.write_text((ROOT / "policies" / "default.yaml").read_text())
    cluster = DevCluster(workdir=workdir, bin_dir=bin_dir, policy=policy)
    try:
        cluster.start_control_plane()
        cluster.create_namespace(NAMESPACE)
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(scope="module")
def kube(plane: DevCluster) -> Iterator[dict[str, Any]]:
    """The APIs the tests read through, and the webhook configurations the leaders
    write the caBundle into (webhooks the apiserver never calls)."""
    from kubernetes import client

    api = plane.api_client()
    apis: dict[str, Any] = {
        "core": client.CoreV1Api(api),
        "admission": client.AdmissionregistrationV1Api(api),
        "coordination": client.CoordinationV1Api(api),
    }
    hook = idle_webhook(
        "one.faults.e2e.gpushare.io", label="e2e.gpushare.io/faults", resource="configmaps"
    )
    apis["admission"].create_mutating_webhook_configuration(
        {
            "metadata": {"name": CONFIG},
            "webhooks": [{**hook, "reinvocationPolicy": "Never"}],
        }
    )
    apis["admission"].create_validating_webhook_configuration(
        {"metadata": {"name": CONFIG}, "webhooks": [{**hook, "name": "two.faults.e2e.gpushare.io"}]}
    )
    try:
        yield apis
    finally:
        api.close()


# -- what the tests look at ----------------------------------------------------------


def eventually(check: Callable[[], T | None], what: str, *, within: float = WAIT) -> T:
    """Poll ``check`` until it returns a value (bounded: a state, not a speed)."""
    deadline = time.monotonic() + within
    while True:
        # The API or a port may be away for a moment: that is what these tests do.
        with contextlib.suppress(OSError, ValueError, ApiException, HTTPError):
            result = check()
            if result is not None and result is not False:
                return result
        if time.monotonic() > deadline:
            pytest.fail(f"not within {within:g}s: {what}")
        time.sleep(0.1)


def readyz(served: serving.Served) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        f"http://127.0.0.1:{served.health_port}/readyz", headers={"Connection": "close"}
    )
    try:
        with urllib.request.urlopen(request, timeout=5) as response:  # noqa: S310  # loopback
            return response.status, json.load(response)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)


def leading(served: serving.Served) -> dict[str, Any] | None:
    """The /readyz body of a worker whose parent runs its duties and leads, else None."""
    status, body = readyz(served)
    duties = body.get("duties") or {}
    if status == 200 and duties.get("running") and duties["certificates"]["leader"]:
        return body
    return None


def process_tree(root: int) -> list[int]:
    """``root`` and every process below it."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError):
            # pid (comm) state ppid ...: comm may hold spaces, so split after its ")".
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, []))
    return tree


def ready(served: serving.Served) -> bool:
    return readyz(served)[0] == 200


def unready(served: serving.Served) -> dict[str, Any] | None:
    status, body = readyz(served)
    return body if status == 503 else None


def replaced(served: serving.Served, victim: int) -> bool:
    """``victim`` is gone (reaped) and a worker answers whose parent still leads."""
    body = leading(served)
    return body is not None and body["pid"] != victim and not Path(f"/proc/{victim}").exists()


def lease(kube: dict[str, Any], secret: str) -> dict[str, Any]:
    spec: dict[str, Any] = read_json(
        kube["coordination"].read_namespaced_lease(
            f"{secret}-leader", NAMESPACE, _preload_content=False
        )
    )["spec"]
    return spec


def renewed_after(kube: dict[str, Any], secret: str, moment: datetime, holder: str) -> bool:
    spec = lease(kube, secret)
    renew = datetime.strptime(spec["renewTime"], "%Y-%m-%dT%H:%M:%S.%fZ").replace(tzinfo=UTC)
    return bool(spec.get("holderIdentity") == holder and renew > moment)


def secret_data(kube: dict[str, Any], secret: str) -> dict[str, bytes] | None:
    try:
        body = read_json(
            kube["core"].read_namespaced_secret(secret, NAMESPACE, _preload_content=False)
        )
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return {k: base64.b64decode(v) for k, v in body["data"].items()}


def ca_bundles(kube: dict[str, Any]) -> list[bytes]:
    """The caBundle of every webhook of both configurations."""
    bundles = []
    for read in (
        kube["admission"].read_mutating_webhook_configuration,
        kube["admission"].read_validating_webhook_configuration,
    ):
        config = read_json(read(CONFIG, _preload_content=False))
        for hook in config["webhooks"]:
            bundles.append(base64.b64decode(hook["clientConfig"].get("caBundle", "")))
    return bundles


def presented(port: int) -> x509.Certificate:
    """The certificate the server on ``port`` presents (read, not yet trusted)."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    with (
        socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
        context.wrap_socket(raw, server_hostname=HOST) as tls,
    ):
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der)


def trusted(leaf: x509.Certificate, bundle: bytes) -> bool:
    """What the apiserver checks: a chain to a CA of the caBundle, for the Service name."""
    cas = parse_bundle(bundle)
    if not cas:
        return False
    verifier = (
        PolicyBuilder()
        .store(Store(cas))
        .time(datetime.now(UTC))
        .build_server_verifier(DNSName(HOST))
    )
    try:
        verifier.verify(leaf, [])
    except VerificationError:
        return False
    return True


def admit(served: serving.Served, bundle: bytes, uid: str) -> None:
    """A /mutate answered straight by the webhook (no apiserver on the way)."""
    context = ssl.create_default_context(cadata=bundle.decode())
    body = orjson.dumps(admission_review(POD, uid=uid, namespace="ml"))
    with (
        socket.create_connection(("127.0.0.1", served.port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname=HOST) as tls,
    ):
        tls.sendall(
            b"POST /mutate HTTP/1.1\r\nHost: webhook\r\nContent-Type: application/json\r\n"
            b"Connection: close\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        answer = b""
        while chunk := tls.recv(65536):
            answer += chunk
    head, _, payload = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200"), head
    assert orjson.loads(payload)["response"]["uid"] == uid


def view_counts(served: serving.Served, namespaces: int) -> bool:
    """Every worker asked (a few dozen new connections) sees ``namespaces``, synced."""
    seen: dict[int, int] = {}
    for _ in range(30):
        status, body = readyz(served)
        cluster = body.get("cluster") or {}
        if status != 200 or not cluster.get("synced"):
            return False
        seen[body["pid"]] = cluster["kinds"]["namespaces"]["objects"]
    return set(seen.values()) == {namespaces}


def run(
    plane: DevCluster, tmp_path: Path, secret: str, pod: str, *args: str
) -> contextlib.AbstractContextManager[serving.Served]:
    return serving.self_managed(
        plane,
        tmp_path,
        namespace=NAMESPACE,
        secret=secret,
        webhook_config=CONFIG,
        pod_name=pod,
        args=(*LEASE, *args),
    )


# -- the faults ----------------------------------------------------------------------


def test_apiserver_restart_view_resyncs_and_leader_reacquires(
    plane: DevCluster, kube: dict[str, Any], tmp_path: Path
) -> None:
    secret = "e2e-restart-tls"
    with run(plane, tmp_path, secret, "restart-pod", "--workers=2", "--cluster") as served:
        eventually(lambda: leading(served), "the parent leading")
        namespaces = len(kube["core"].list_namespace().items)
        eventually(lambda: view_counts(served, namespaces), "both workers' views synced")
        bundle = secret_data(kube, secret)
        assert bundle is not None

        plane.stop_component("kube-apiserver")
        # While the apiserver is away the webhook still answers (no API on that path).
        admit(served, bundle[CA_BUNDLE], "apiserver-away")
        plane.restart_apiserver()
        back = datetime.now(UTC)

        eventually(
            lambda: renewed_after(kube, secret, back, "restart-pod"),
            "the Lease renewed by its holder after the restart",
        )
        eventually(lambda: leading(served), "the parent leading after the restart")
        # The watches are open again: a Namespace created after the restart reaches
        # every worker's view.
        plane.create_namespace("after-apiserver-restart")
        eventually(lambda: view_counts(served, namespaces + 1), "the new Namespace in both views")
        admit(served, bundle[CA_BUNDLE], "apiserver-back")


def test_etcd_unavailable_for_30_seconds(
    plane: DevCluster, kube: dict[str, Any], tmp_path: Path
) -> None:
    secret = "e2e-etcd-tls"
    with run(plane, tmp_path, secret, "etcd-pod", "--workers=2", "--cluster") as served:
        eventually(lambda: leading(served), "the parent leading")
        namespaces = len(kube["core"].list_namespace().items)
        eventually(lambda: view_counts(served, namespaces), "both workers' views synced")
        bundle = secret_data(kube, secret)
        assert bundle is not None

        plane.stop_component("etcd")
        away = time.monotonic()
        answered = 0
        while time.monotonic() - away < 30:
            # Admission goes on, and so does readiness: the pair on disk is served.
            admit(served, bundle[CA_BUNDLE], f"etcd-away-{answered}")
            answered += 1
            status, body = readyz(served)
            assert status == 200, body
            assert body["duties"]["running"], body
            time.sleep(1)
        plane.start_etcd()
        back = datetime.now(UTC)

        eventually(
            lambda: renewed_after(kube, secret, back, "etcd-pod"),
            "the Lease renewed by its holder once etcd is back",
        )
        eventually(lambda: leading(served), "the parent leading again")
        plane.create_namespace("after-etcd-outage")
        eventually(lambda: view_counts(served, namespaces + 1), "the new Namespace in both views")
        assert answered >= 10
        # Leadership lapsed while no renewal could be written, and came back.
        assert "no longer leads" in served.output()


def test_deleted_secret_is_put_back_and_trust_holds(
    plane: DevCluster, kube: dict[str, Any], tmp_path: Path
) -> None:
    secret = "e2e-deleted-tls"
    with run(plane, tmp_path, secret, "deleted-pod", "--workers=2") as served:
        eventually(lambda: leading(served), "the parent leading")
        before = eventually(lambda: secret_data(kube, secret), "the Secret")
        eventually(lambda: ca_bundles(kube) == [before[CA_BUNDLE]] * 2, "the caBundle written")
        kube["core"].delete_namespaced_secret(secret, NAMESPACE)
        after = eventually(lambda: secret_data(kube, secret), "the Secret created again")
        # The same CA and pair, not new ones the served certificate does not chain to.
        for key in (CA_CERT, CA_KEY, SERVING_CERT, SERVING_KEY, CA_BUNDLE):
            assert after[key] == before[key], key
        assert ca_bundles(kube) == [before[CA_BUNDLE]] * 2
        leaf = presented(served.port)
        assert leaf == x509.load_pem_x509_certificate(before[SERVING_CERT])
        assert trusted(leaf, before[CA_BUNDLE])
        assert "was deleted: created it again" in served.output()


def _seed_due_ca(kube: dict[str, Any], secret: str) -> dict[str, bytes]:
    """A Secret whose CA has 30 days left (a roll is due: 60 days before expiry) and
    whose pair is otherwise fine; the configurations trust it."""
    now = datetime.now(UTC)
    ca = generate_ca(
        common_name="e2e CA about to roll",
        valid_for=timedelta(days=365),
        now=now - timedelta(days=335),
    )
    serving_pair = generate_serving(
        ca=ca,
        dns_names=service_dns_names(SERVICE, NAMESPACE),
        ip_addresses=[],
        valid_for=timedelta(days=25),
        now=now - timedelta(days=1),
    )
    data = {
        CA_CERT: ca.cert_pem(),
        CA_KEY: ca.key_pem(),
        SERVING_CERT: serving_pair.cert_pem(),
        SERVING_KEY: serving_pair.key_pem(),
        CA_BUNDLE: ca.cert_pem(),
    }
    kube["core"].create_namespaced_secret(
        NAMESPACE,
        {
            "metadata": {"name": secret},
            "type": "kubernetes.io/tls",
            "data": {k: base64.b64encode(v).decode() for k, v in data.items()},
        },
    )
    value = base64.b64encode(data[CA_BUNDLE]).decode()
    for patch in (
        kube["admission"].patch_mutating_webhook_configuration,
        kube["admission"].patch_validating_webhook_configuration,
    ):
        patch(CONFIG, [{"op": "add", "path": "/webhooks/0/clientConfig/caBundle", "value": value}])
    return data


def _hold_lease(kube: dict[str, Any], secret: str, *, seconds: int) -> None:
    """A Lease held by a replica that is gone: the live ones start as followers."""
    now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    kube["coordination"].create_namespaced_lease(
        NAMESPACE,
        {
            "metadata": {"name": f"{secret}-leader"},
            "spec": {
                "holderIdentity": "gone",
                "leaseDurationSeconds": seconds,
                "acquireTime": now,
                "renewTime": now,
            },
        },
    )


class Watchman:
    """Samples, until stopped, each replica's presented certificate and then the
    caBundle of every webhook (in that order: the bundle read later is never older),
    and records every sample where the bundle did not trust what was served."""

    def __init__(self, kube: dict[str, Any], ports: dict[str, int]) -> None:
        self.kube = kube
        self.ports = ports
        self.alive = dict.fromkeys(ports, True)
        self.samples = 0
        self.untrusted: list[str] = []
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def __enter__(self) -> Watchman:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(30)

    def _run(self) -> None:
        while not self._stop.is_set():
            for name, port in self.ports.items():
                if not self.alive[name]:
                    continue
                try:
                    leaf = presented(port)
                    bundles = ca_bundles(self.kube)
                except Exception as exc:  # a replica killed between the check and the dial
                    if self.alive[name]:
                        self.errors.append(f"{name}: {exc}")
                    continue
                self.samples += 1
                for bundle in bundles:
                    if not trusted(leaf, bundle):
                        self.untrusted.append(f"{name} served serial {leaf.serial_number:x}")
            time.sleep(0.02)


def test_leader_killed_mid_rotation(
    plane: DevCluster, kube: dict[str, Any], tmp_path: Path
) -> None:
    """Two replicas; the leader is SIGKILLed as soon as its CA roll reaches the Secret,
    before it can issue the new CA's serving certificate. The other takes over within
    the lease and finishes the roll, and no replica ever presents a certificate that
    the caBundle of any webhook does not trust."""
    secret = "e2e-midroll-tls"
    old = _seed_due_ca(kube, secret)
    _hold_lease(kube, secret, seconds=5)
    for name in ("replica-a", "replica-b"):
        (tmp_path / name).mkdir()
    with contextlib.ExitStack() as stack:
        replicas = {
            name: stack.enter_context(run(plane, tmp_path / name, secret, name, "--workers=2"))
            for name in ("replica-a", "replica-b")
        }
        for name, served in replicas.items():
            eventually(functools.partial(ready, served), f"{name} ready")
        watchman = stack.enter_context(
            Watchman(kube, {name: s.port for name, s in replicas.items()})
        )

        def rolled() -> dict[str, bytes] | None:
            data = secret_data(kube, secret)
            return data if data is not None and data[CA_CERT] != old[CA_CERT] else None

        during = eventually(rolled, "the CA rolled by the first leader")
        leader = lease(kube, secret)["holderIdentity"]
        killed = replicas[leader]
        watchman.alive[leader] = False
        tree = process_tree(killed.process.pid)
        for pid in tree:  # the whole pod at once: the parent, its fork server, its workers
            os.kill(pid, signal.SIGKILL)
        killed.process.wait()
        # The roll had not finished: the Secret still held the old CA's serving pair.
        assert (
            x509.load_pem_x509_certificate(during[SERVING_CERT]).issuer
            == x509.load_pem_x509_certificate(old[CA_CERT]).subject
        )
        (survivor,) = [name for name in replicas if name != leader]
        eventually(
            lambda: lease(kube, secret)["holderIdentity"] == survivor,
            f"{survivor} holding the Lease",
        )

        def finished() -> dict[str, bytes] | None:
            data = secret_data(kube, secret)
            if data is None:
                return None
            leaf = x509.load_pem_x509_certificate(data[SERVING_CERT])
            new_ca = x509.load_pem_x509_certificate(data[CA_CERT])
            if leaf.issuer != new_ca.subject:
                return None
            if presented(replicas[survivor].port) != leaf:
                return None
            return data

        done = eventually(finished, f"{survivor} serving the new CA's certificate")
        assert len(parse_bundle(done[CA_BUNDLE])) == 2  # the old CA stays trusted a week
        assert ca_bundles(kube) == [done[CA_BUNDLE]] * 2
        time.sleep(1)  # a few more samples of the finished state
        # The parent, its fork server and resource tracker, and both workers: all killed.
        assert len(tree) >= 4
    assert watchman.samples > 20, watchman.errors
    assert watchman.untrusted == [], watchman.untrusted[:5]


def test_killed_workers_leave_the_duties_running(
    plane: DevCluster, kube: dict[str, Any], tmp_path: Path
) -> None:
    secret = "e2e-workers-tls"
    with run(plane, tmp_path, secret, "workers-pod", "--workers=2") as served:
        first = eventually(lambda: leading(served), "the parent leading")
        parent = first["duties"]["pid"]
        assert parent == served.process.pid
        for _ in range(3):
            victim: int = readyz(served)[1]["pid"]
            os.kill(victim, signal.SIGKILL)
            eventually(
                functools.partial(replaced, served, victim),
                "a replacement whose parent still leads",
            )
        moment = datetime.now(UTC)
        eventually(
            lambda: renewed_after(kube, secret, moment, "workers-pod"),
            "the Lease still renewed by the parent",
        )
        # Only the parent ever took the Lease: no worker led, and leadership never lapsed.
        assert served.output().count("leads Lease") == 1, served.output()

        # A parent that hangs holds its duties no more: every worker says so.
        os.kill(parent, signal.SIGSTOP)
        try:
            stalled = eventually(
                functools.partial(unready, served), "workers unready while their parent is stopped"
            )
            assert stalled["duties"]["running"] is False
        finally:
            os.kill(parent, signal.SIGCONT)
        eventually(lambda: leading(served), "ready again once the parent runs")
