"""A local control plane for development and end-to-end tests: etcd, kube-apiserver
and this webhook on loopback, with the webhook configurations of ``deploy/`` registered.

``hack/dev-cluster`` runs the install the apiserver's version gets
(:mod:`webhook.install.mode`): on 1.36+ the MutatingAdmissionPolicies and
ValidatingAdmissionPolicies, with the webhook (cluster view on) registered only for what
the view decides, failing open; before 1.36 the webhooks and the ValidatingAdmissionPolicies.

``hack/dev-cluster`` runs :func:`main`; the e2e suite uses :class:`DevCluster` directly.
Nothing listens beyond 127.0.0.1. Certificates and the service-account key come from
:mod:`webhook.certs`.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from types import FrameType
from typing import IO, Any, Final

import yaml
from cryptography.hazmat.primitives import serialization

from webhook.certs.files import write_files
from webhook.certs.issue import generate_ca, generate_serving
from webhook.core.record import PROBE_LABEL
from webhook.dev.namespaces import NamespaceFinalizer
from webhook.files import write_atomic
from webhook.install.manifests import deploy_root
from webhook.install.mode import WEBHOOKS, Mode, detect

REPO: Final = Path(__file__).resolve().parents[2]
_CONTROL_PLANE_TIMEOUT: Final = 120.0
_WEBHOOK_TIMEOUT: Final = 30.0
_PROBE_TIMEOUT: Final = 30.0
_STOP_TIMEOUT: Final = 15.0
_LOG_TAIL_LINES: Final = 30


# The audit policy an install on 1.36+ needs for `report --audit-log` (deploy/examples).
_AUDIT_POLICY: Final = deploy_root() / "examples" / "apiserver-audit-policy.yaml"


class ClusterError(Exception):
    """The dev cluster could not start; the message says which part and why."""


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def find_binaries(bin_dir: str | None = None) -> Path:
    """The directory holding kube-apiserver, etcd and kubectl (built from Go modules)."""
    candidate = bin_dir or os.environ.get("GPUSHARE_TESTBIN")
    if candidate:
        path = Path(candidate)
    else:
        script = REPO / "hack" / "build-testbin"
        if not script.exists():
            raise ClusterError(
                "no GPUSHARE_TESTBIN and no hack/build-testbin to build the binaries"
            )
        if shutil.which("go") is None:
            raise ClusterError("Go is not installed: cannot build kube-apiserver and etcd")
        result = subprocess.run(
            [str(script)], capture_output=True, text=True, check=False, cwd=REPO
        )
        if result.returncode != 0:
            raise ClusterError(f"hack/build-testbin failed:\n{result.stderr[-2000:]}")
        path = Path(result.stdout.strip().splitlines()[-1])
    for name in ("kube-apiserver", "etcd"):
        if not (path / name).is_file():
            raise ClusterError(f"{path / name} is missing")
    return path


@dataclass
class _Process:
    name: str
    popen: subprocess.Popen[bytes]
    log: Path
    handle: IO[bytes]

    def alive(self) -> bool:
        return self.popen.poll() is None

    def tail(self) -> str:
        with contextlib.suppress(OSError):
            lines = self.log.read_text(errors="replace").splitlines()
            return "\n".join(lines[-_LOG_TAIL_LINES:])
        return ""

    def stop(self) -> None:
        if self.alive():
            self.popen.send_signal(signal.SIGTERM)
            try:
                self.popen.wait(_STOP_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        self.handle.close()


@dataclass
class Webhook:
    """The webhook process of a dev cluster, restartable by tests."""

    workdir: Path
    policy: Path
    port: int = field(default_factory=free_port)
    health_port: int = field(default_factory=free_port)
    process: _Process | None = None
    # With a kubeconfig the webhook watches that cluster (serve --cluster).
    kubeconfig: Path | None = None

    @property
    def cert_dir(self) -> Path:
        return self.workdir / "webhook-certs"

    @property
    def audit_log(self) -> Path:
        return self.workdir / "audit.log"

    @property
    def url(self) -> str:
        return f"https://127.0.0.1:{self.port}"

    def start(self) -> None:
        log = self.workdir / "webhook.log"
        handle = log.open("ab")
        popen = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "webhook",
                "serve",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                "--health-port",
                str(self.health_port),
                "--cert-dir",
                str(self.cert_dir),
                "--policy",
                str(self.policy),
                "--audit-log",
                str(self.audit_log),
                *(["--cluster", "--kubeconfig", str(self.kubeconfig)] if self.kubeconfig else []),
                # Reports with the view, as the install has them; both kinds, and a short
                # interval so that a change shows within seconds.
                *(
                    ["--reports", "--reports-policyreport", "--reports-interval", "2"]
                    if self.kubeconfig
                    else []
                ),
            ],
            stdout=handle,
            stderr=handle,
            cwd=self.workdir,
        )
        self.process = _Process("webhook", popen, log, handle)
        _wait_for_port(self.process, self.health_port, timeout=_WEBHOOK_TIMEOUT)

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop()
            self.process = None

    def ca_bundle(self) -> bytes:
        return (self.cert_dir / "ca.crt").read_bytes()

    def readyz(self) -> dict[str, Any]:
        import json
        import urllib.request

        url = f"http://127.0.0.1:{self.health_port}/readyz"
        with urllib.request.urlopen(url, timeout=2) as response:  # our own loopback port
            body: dict[str, Any] = json.load(response)
        return body

    def wait_for_view(self, *, timeout: float = _WEBHOOK_TIMEOUT) -> None:
        """Wait until the webhook's cluster view is synced (its /readyz says so)."""
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError, ValueError):
                last = self.readyz().get("cluster")
                if last and last.get("synced"):
                    return
            time.sleep(0.1)
        raise ClusterError(f"the webhook's cluster view did not sync in {timeout:.0f}s: {last}")


def _wait_for_port(process: _Process, port: int, *, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not process.alive():
            raise ClusterError(f"{process.name} exited:\n{process.tail()}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.2):
                return
        except OSError:
            time.sleep(0.05)
    raise ClusterError(
        f"{process.name} did not listen on {port} in {timeout:.0f}s:\n{process.tail()}"
    )


@dataclass
class DevCluster:
    """etcd + kube-apiserver on loopback, token auth, RBAC; and the webhook."""

    workdir: Path
    bin_dir: Path
    policy: Path
    token: str = field(default_factory=lambda: secrets.token_hex(16))
    etcd_port: int = field(default_factory=free_port)
    peer_port: int = field(default_factory=free_port)
    api_port: int = field(default_factory=free_port)
    processes: list[_Process] = field(default_factory=list)
    webhook: Webhook | None = None
    # The install registered (register_webhooks, running): webhooks, or apiserver (1.36+).
    mode: Mode = WEBHOOKS
    # More kube-apiserver flags, e.g. a --runtime-config that switches an API off.
    apiserver_args: tuple[str, ...] = ()
    # The apiserver's serving certificate and key, once start_control_plane wrote them.
    apiserver_pair: tuple[Path, Path] = (Path(), Path())
    _finalizer: NamespaceFinalizer | None = None

    @property
    def server(self) -> str:
        return f"https://127.0.0.1:{self.api_port}"

    @property
    def _pki(self) -> Path:
        return self.workdir / "apiserver"

    @property
    def ca_file(self) -> Path:
        return self._pki / "ca.crt"

    @property
    def apiserver_audit_log(self) -> Path:
        """The apiserver's audit log (audit.k8s.io/v1 events, JSON lines), written under
        deploy/examples/apiserver-audit-policy.yaml: what the in-apiserver policies decide."""
        return self.workdir / "apiserver-audit.log"

    def finalize_namespaces(self) -> None:
        """Empty and finalize deleted Namespaces from now on, as the namespace controller
        would (no kube-controller-manager runs here): a Namespace left Terminating after an
        uninstall blocks installing into it again."""
        finalizer = NamespaceFinalizer(
            server=self.server, token=self.token, ca_file=str(self.ca_file)
        )
        finalizer.start()
        self._finalizer = finalizer

    def _spawn(self, name: str, argv: Sequence[str]) -> _Process:
        log = self.workdir / f"{name}.log"
        handle = log.open("ab")
        popen = subprocess.Popen(list(argv), stdout=handle, stderr=handle, cwd=self.workdir)
        process = _Process(name, popen, log, handle)
        self.processes.append(process)
        return process

    def start_control_plane(self) -> None:
        ca = generate_ca(common_name="gpushare dev-cluster CA", valid_for=timedelta(days=7))
        serving = generate_serving(
            ca=ca,
            dns_names=["localhost", "kubernetes", "kubernetes.default.svc"],
            ip_addresses=["127.0.0.1"],
            valid_for=timedelta(days=7),
        )
        paths = write_files(self._pki, ca=ca, serving=serving)
        self.apiserver_pair = (paths.cert_file, paths.key_file)
        self._write_service_account_keys()
        self._write_tokens()
        self._start_etcd()
        self._start_apiserver(cert_file=paths.cert_file, key_file=paths.key_file)

    # -- faults, for tests of what rides them out -------------------------------------

    def stop_component(self, name: str) -> None:
        """Stop ``etcd`` or ``kube-apiserver`` (SIGTERM, as a restart would)."""
        for process in [p for p in self.processes if p.name == name]:
            process.stop()
            self.processes.remove(process)

    def start_etcd(self) -> None:
        """Start etcd again on its port and data directory: the cluster's state is kept."""
        self._start_etcd()

    def restart_apiserver(self) -> None:
        """Stop kube-apiserver and start it again on the same port; returns when ready."""
        self.stop_component("kube-apiserver")
        cert_file, key_file = self.apiserver_pair
        self._start_apiserver(cert_file=cert_file, key_file=key_file)

    def _write_service_account_keys(self) -> None:
        # A CA key pair doubles as the service-account signing key (ECDSA P-256, ES256).
        signer = generate_ca(
            common_name="gpushare dev-cluster service accounts", valid_for=timedelta(days=7)
        )
        write_atomic(self._pki / "sa.key", signer.key_pem(), mode=0o600)
        (self._pki / "sa.pub").write_bytes(
            signer.key.public_key().public_bytes(
                serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
            )
        )

    def _write_tokens(self) -> None:
        tokens = f'{self.token},admin,admin-uid,"system:masters"\n'
        write_atomic(self._pki / "tokens.csv", tokens.encode(), mode=0o600)

    def _start_etcd(self) -> None:
        etcd = self._spawn(
            "etcd",
            [
                str(self.bin_dir / "etcd"),
                "--name=default",
                f"--data-dir={self.workdir / 'etcd'}",
                f"--listen-client-urls=http://127.0.0.1:{self.etcd_port}",
                f"--advertise-client-urls=http://127.0.0.1:{self.etcd_port}",
                f"--listen-peer-urls=http://127.0.0.1:{self.peer_port}",
                f"--initial-advertise-peer-urls=http://127.0.0.1:{self.peer_port}",
                f"--initial-cluster=default=http://127.0.0.1:{self.peer_port}",
                "--listen-metrics-urls=",
                "--unsafe-no-fsync",
                "--log-level=warn",
            ],
        )
        _wait_for_port(etcd, self.etcd_port, timeout=_CONTROL_PLANE_TIMEOUT)

    def _start_apiserver(self, *, cert_file: Path, key_file: Path) -> None:
        apiserver = self._spawn(
            "kube-apiserver",
            [
                str(self.bin_dir / "kube-apiserver"),
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                f"--secure-port={self.api_port}",
                f"--etcd-servers=http://127.0.0.1:{self.etcd_port}",
                "--service-cluster-ip-range=10.0.0.0/24",
                "--endpoint-reconciler-type=none",
                "--authorization-mode=RBAC",
                f"--token-auth-file={self._pki / 'tokens.csv'}",
                f"--tls-cert-file={cert_file}",
                f"--tls-private-key-file={key_file}",
                "--service-account-issuer=https://kubernetes.default.svc",
                f"--service-account-key-file={self._pki / 'sa.pub'}",
                f"--service-account-signing-key-file={self._pki / 'sa.key'}",
                # Privileged pods must reach our webhook to be refused by it, not by this flag.
                "--allow-privileged=true",
                "--profiling=false",
                # What the in-apiserver policies decide, for `report --audit-log`.
                f"--audit-policy-file={_AUDIT_POLICY}",
                f"--audit-log-path={self.apiserver_audit_log}",
                "--audit-log-format=json",
                *self.apiserver_args,
            ],
        )
        self._wait_ready(apiserver, timeout=_CONTROL_PLANE_TIMEOUT)

    def get(self, path: str, *, timeout: float) -> bytes:
        """The body of a GET of ``path`` from the apiserver, as the admin, over its CA (an
        error status raises, as urllib's HTTPError, an OSError)."""
        import ssl
        import urllib.request

        context = ssl.create_default_context(cafile=str(self.ca_file))
        request = urllib.request.Request(  # noqa: S310  # https to our own loopback apiserver
            f"{self.server}{path}", headers={"Authorization": f"Bearer {self.token}"}
        )
        with urllib.request.urlopen(request, context=context, timeout=timeout) as response:  # noqa: S310
            return bytes(response.read())

    def _wait_ready(self, apiserver: _Process, *, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not apiserver.alive():
                raise ClusterError(f"kube-apiserver exited:\n{apiserver.tail()}")
            try:
                self.get("/readyz", timeout=2)
                return
            except OSError:
                pass
            time.sleep(0.2)
        raise ClusterError(f"kube-apiserver not ready in {timeout:.0f}s:\n{apiserver.tail()}")

    def kubeconfig(self) -> dict[str, Any]:
        return {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [
                {
                    "name": "gpushare-dev",
                    "cluster": {
                        "server": self.server,
                        "certificate-authority-data": base64.b64encode(
                            self.ca_file.read_bytes()
                        ).decode(),
                    },
                }
            ],
            "users": [{"name": "admin", "user": {"token": self.token}}],
            "contexts": [
                {"name": "gpushare-dev", "context": {"cluster": "gpushare-dev", "user": "admin"}}
            ],
            "current-context": "gpushare-dev",
        }

    def write_kubeconfig(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_atomic(path, yaml.safe_dump(self.kubeconfig()).encode(), mode=0o600)

    def api_client(self) -> Any:
        from kubernetes import client

        configuration = client.Configuration()
        configuration.host = self.server
        configuration.ssl_ca_cert = str(self.ca_file)
        configuration.api_key = {"authorization": f"Bearer {self.token}"}
        return client.ApiClient(configuration)

    def start_webhook(self, *, cluster_view: bool = True) -> Webhook:
        """Start the webhook; with ``cluster_view`` it watches this cluster as admin."""
        kubeconfig = None
        if cluster_view:
            kubeconfig = self.workdir / "webhook.kubeconfig"
            self.write_kubeconfig(kubeconfig)
        self.webhook = Webhook(workdir=self.workdir, policy=self.policy, kubeconfig=kubeconfig)
        self.webhook.start()
        return self.webhook

    def detect_mode(self) -> Mode:
        """The install this apiserver gets, by what it serves."""
        api = self.api_client()
        try:
            return detect(api)
        finally:
            api.close()

    def register_webhooks(self, mode: Mode = WEBHOOKS) -> None:
        """Create (or replace) both webhook configurations from the deploy/ templates,
        their matchConditions from the policy file the webhook serves (:attr:`policy`);
        in the apiserver ``mode`` only for what the cluster view decides, failing open."""
        from kubernetes import client

        from webhook.install.manifests import webhook_configurations
        from webhook.policies import load_policy

        assert self.webhook is not None
        # The client takes plain dicts at run time; its stubs only know its models.
        api: Any = client.AdmissionregistrationV1Api(self.api_client())
        # Scoped to the policy the webhook runs with, as an install with that policy is.
        for config in webhook_configurations(
            ca_bundle=self.webhook.ca_bundle(),
            url=self.webhook.url,
            policy=load_policy(self.policy),
            mode=mode,
        ):
            name = config["metadata"]["name"]
            if config["kind"] == "MutatingWebhookConfiguration":
                with contextlib.suppress(client.ApiException):
                    api.delete_mutating_webhook_configuration(name)
                api.create_mutating_webhook_configuration(config)
            else:
                with contextlib.suppress(client.ApiException):
                    api.delete_validating_webhook_configuration(name)
                api.create_validating_webhook_configuration(config)

    def unregister_webhooks(self) -> None:
        from kubernetes import client

        from webhook.install.manifests import webhook_configurations

        # The client takes plain dicts at run time; its stubs only know its models.
        api: Any = client.AdmissionregistrationV1Api(self.api_client())
        for config in webhook_configurations(ca_bundle=b"", url="https://127.0.0.1:1"):
            name = config["metadata"]["name"]
            with contextlib.suppress(client.ApiException):
                if config["kind"] == "MutatingWebhookConfiguration":
                    api.delete_mutating_webhook_configuration(name)
                else:
                    api.delete_validating_webhook_configuration(name)

    def register_cel_policies(self, objects: Sequence[dict[str, Any]] | None = None) -> None:
        """Create the CEL rules' ValidatingAdmissionPolicies and bindings (``objects``,
        default: those of the policy file the webhook serves). They hold without the
        webhook; the apiserver loads them within a second or two."""
        from kubernetes import client

        from webhook.install.manifests import cel_policies
        from webhook.policies import load_policy

        if objects is None:
            objects = cel_policies(load_policy(self.policy))
        # The client takes plain dicts at run time; its stubs only know its models.
        api: Any = client.AdmissionregistrationV1Api(self.api_client())
        for obj in objects:
            if obj["kind"] == "ValidatingAdmissionPolicy":
                api.create_validating_admission_policy(obj)
            else:
                api.create_validating_admission_policy_binding(obj)

    def register_mutating_policies(self) -> None:
        """Create the MutatingAdmissionPolicies and bindings of the policy file the webhook
        serves (Kubernetes 1.36+): the mutation then holds without the webhook."""
        from kubernetes import client

        from webhook.install.manifests import mutating_policies
        from webhook.policies import load_policy

        # The client takes plain dicts at run time; its stubs only know its models.
        api: Any = client.AdmissionregistrationV1Api(self.api_client())
        for obj in mutating_policies(load_policy(self.policy)):
            if obj["kind"] == "MutatingAdmissionPolicy":
                api.create_mutating_admission_policy(obj)
            else:
                api.create_mutating_admission_policy_binding(obj)

    def install_report_crds(self, *, timeout: float = 30.0) -> None:
        """Create the report CRDs (deploy/reports) and wait until they are served."""
        from kubernetes import client

        from webhook.install.manifests import report_crds

        # The client takes plain dicts at run time; its stubs only know its models.
        api: Any = client.ApiextensionsV1Api(self.api_client())
        names = []
        for crd in report_crds():
            with contextlib.suppress(client.ApiException):  # already there: keep it
                api.create_custom_resource_definition(crd)
            names.append(crd["metadata"]["name"])
        deadline = time.monotonic() + timeout
        for name in names:
            while True:
                conditions = api.read_custom_resource_definition(name).status.conditions or []
                if any(c.type == "Established" and c.status == "True" for c in conditions):
                    break
                if time.monotonic() > deadline:
                    raise ClusterError(f"CRD {name} not established after {timeout:.0f}s")
                time.sleep(0.1)

    def create_namespace(self, name: str) -> None:
        """A namespace with its default ServiceAccount (no controller-manager runs here)."""
        from kubernetes import client

        core: Any = client.CoreV1Api(self.api_client())
        with contextlib.suppress(client.ApiException):
            core.create_namespace({"metadata": {"name": name}})
        with contextlib.suppress(client.ApiException):
            core.create_namespaced_service_account(name, {"metadata": {"name": "default"}})

    def probe(self, *, refusal: bool = True) -> None:
        """Prove both webhooks answer through the apiserver (server-side dry-run creates):
        a GPU pod is mutated and, with ``refusal``, a pinned one refused. Before any
        webhook is registered, this proves the in-apiserver policies do it."""
        from kubernetes import client

        core: Any = client.CoreV1Api(self.api_client())
        self.create_namespace("gpushare-probe")
        pod: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "probe",
                "namespace": "gpushare-probe",
                # Its dry-run refusals are the harness's, not a workload's: report skips them.
                "labels": {PROBE_LABEL: "true"},
            },
            "spec": {
                "containers": [
                    {
                        "name": "probe",
                        "image": "busybox",
                        "resources": {"limits": {"nvidia.com/gpumem": "1000"}},
                    }
                ]
            },
        }
        deadline = time.monotonic() + _PROBE_TIMEOUT
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                created = core.create_namespaced_pod("gpushare-probe", pod, dry_run="All")
                if created.spec.scheduler_name != "hami-scheduler":
                    raise ClusterError("the mutating webhook did not mutate the probe pod")
                if not refusal:
                    return
                bad = {**pod, "spec": {**pod["spec"], "nodeName": "somewhere"}}
                try:
                    core.create_namespaced_pod("gpushare-probe", bad, dry_run="All")
                except client.ApiException as exc:
                    if "node-name-pinning" in str(exc.body):
                        return
                    raise
                raise ClusterError("the webhooks did not refuse a pinned GPU pod")
            except (client.ApiException, ClusterError) as exc:
                last = exc
                time.sleep(0.3)
        raise ClusterError(f"webhooks not answering through the apiserver: {last}")

    def stop(self) -> None:
        if self._finalizer is not None:
            self._finalizer.stop()
            self._finalizer = None
        if self.webhook is not None:
            self.webhook.stop()
        for process in reversed(self.processes):
            process.stop()
        self.processes.clear()


@contextlib.contextmanager
def running(
    *,
    bin_dir: Path,
    policy: Path,
    workdir: Path,
    mode: Mode | None = WEBHOOKS,
    cel_policies: bool = False,
    apiserver_args: tuple[str, ...] = (),
) -> Iterator[DevCluster]:
    """A started dev cluster with the webhook registered and probed; stopped on exit.

    ``mode`` None: the install the apiserver gets (:mod:`webhook.install.mode`); in the
    apiserver mode the MutatingAdmissionPolicies are created before the probe.
    ``cel_policies``: the ValidatingAdmissionPolicies too (the install has them).
    ``apiserver_args`` go after kube-apiserver's own (a flag given twice: the last wins)."""
    cluster = DevCluster(
        workdir=workdir, bin_dir=bin_dir, policy=policy, apiserver_args=apiserver_args
    )
    try:
        cluster.start_control_plane()
        cluster.mode = cluster.detect_mode() if mode is None else mode
        cluster.install_report_crds()
        cluster.start_webhook()
        if cel_policies:
            cluster.register_cel_policies()
        if cluster.mode != WEBHOOKS:
            cluster.register_mutating_policies()
            # The apiserver loads policies within a second or two: wait until they hold
            # on their own, before a webhook could answer for them.
            cluster.probe(refusal=cel_policies)
        cluster.register_webhooks(cluster.mode)
        cluster.probe()
        assert cluster.webhook is not None
        cluster.webhook.wait_for_view()
        yield cluster
    finally:
        cluster.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="hack/dev-cluster",
        description="Run etcd, kube-apiserver and gpushare-webhook on loopback until Ctrl-C.",
    )
    parser.add_argument("--kubeconfig", required=True, help="where to write the kubeconfig")
    parser.add_argument("--policy", help="policy file (default: policies/default.yaml)")
    parser.add_argument("--bin-dir", help="kube-apiserver/etcd directory (default: build them)")
    parser.add_argument(
        "--bare",
        action="store_true",
        help="etcd and kube-apiserver only, nothing of the install registered: a cluster "
        "to helm install (or kubectl apply) the install into",
    )
    parser.add_argument(
        "--no-cel-policies",
        action="store_true",
        help="leave out the CEL rules' ValidatingAdmissionPolicies (the install has them)",
    )
    parser.add_argument(
        "--node",
        action="store_true",
        help="also run a kubelet node with fake GPUs, kube-scheduler and containerd (root)",
    )
    parser.add_argument(
        "--node-profile",
        choices=("default", "hardened"),
        default="default",
        help="the node's NVIDIA toolkit and device plugin settings (see docs/development.md)",
    )
    parser.add_argument("--node-bin-dir", help="the node's binaries (default: build them)")
    args = parser.parse_args(argv)
    policy_source = (
        Path(args.policy) if args.policy else REPO / "webhook" / "policies" / "default.yaml"
    )
    stop = threading.Event()

    def on_signal(_signum: int, _frame: FrameType | None) -> None:
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    workdir = Path(tempfile.mkdtemp(prefix="gpushare-dev-"))
    # The audit logs outlive the cluster: `gpushare-webhook report --audit-log` reads them
    # after (the webhook's, and the apiserver's with what the in-apiserver policies decided).
    kept_audit = workdir.with_name(workdir.name + "-audit.log")
    kept_apiserver_audit = workdir.with_name(workdir.name + "-apiserver-audit.log")
    # The webhook watches this copy: edit --policy's file and send SIGHUP, or edit this one.
    policy = workdir / "policy.yaml"
    try:
        policy.write_bytes(policy_source.read_bytes())
        bin_dir = find_binaries(args.bin_dir)
        if args.bare:
            return _run_bare(
                bin_dir=bin_dir,
                workdir=workdir,
                kubeconfig=Path(args.kubeconfig),
                audit=kept_apiserver_audit,
                stop=stop,
            )
        with (
            running(
                bin_dir=bin_dir,
                policy=policy,
                workdir=workdir,
                mode=None,
                cel_policies=not args.no_cel_policies,
            ) as cluster,
            contextlib.ExitStack() as stack,
        ):
            cluster.write_kubeconfig(Path(args.kubeconfig))
            cluster.finalize_namespaces()
            node = None
            if args.node:
                from webhook.dev.node import Node, find_node_binaries

                node = Node(
                    cluster=cluster,
                    bin_dir=find_node_binaries(args.node_bin_dir),
                    workdir=workdir,
                    profile=args.node_profile,
                )
                stack.callback(node.stop)
                node.start()
            print(
                f"ready: kube-apiserver {cluster.server}, webhook {cluster.webhook.url if cluster.webhook else ''}, "
                f"kubeconfig {args.kubeconfig}, policy {policy}, audit {kept_audit} and "
                f"apiserver audit {kept_apiserver_audit} (kept after exit), cluster view and "
                "policy reports on"
                + ("" if args.no_cel_policies else ", CEL policies on")
                + (
                    ""
                    if cluster.mode == WEBHOOKS
                    else ", MutatingAdmissionPolicies on (the webhook is registered only "
                    "for what the cluster view decides, failing open)"
                )
                + (
                    ""
                    if node is None
                    else f", node {node.name} ({node.profile} profile, 4 fake GPUs, "
                    f"started in {node.started_in:.1f}s)"
                ),
                flush=True,
            )
            while not stop.wait(0.5):
                for process in cluster.processes:
                    if not process.alive():
                        raise ClusterError(f"{process.name} exited:\n{process.tail()}")
                if node is not None and node.exited():
                    raise ClusterError(f"node: {', '.join(node.exited())} exited")
    except (ClusterError, OSError) as exc:
        print(f"dev-cluster: {exc}", file=sys.stderr)
        return 1
    finally:
        with contextlib.suppress(OSError):
            shutil.copyfile(workdir / "audit.log", kept_audit)
        with contextlib.suppress(OSError):
            shutil.copyfile(workdir / "apiserver-audit.log", kept_apiserver_audit)
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


def _run_bare(
    *, bin_dir: Path, workdir: Path, kubeconfig: Path, audit: Path, stop: threading.Event
) -> int:
    """etcd and kube-apiserver until ``stop``: the install is the user's to apply (a
    registration of the dev cluster's own would be one Helm refuses to adopt)."""
    cluster = DevCluster(workdir=workdir, bin_dir=bin_dir, policy=workdir / "unused.yaml")
    try:
        cluster.start_control_plane()
        cluster.write_kubeconfig(kubeconfig)
        cluster.finalize_namespaces()
        print(
            f"ready: kube-apiserver {cluster.server} ({cluster.detect_mode()} install), "
            f"kubeconfig {kubeconfig}, nothing installed, apiserver audit {audit} (kept "
            "after exit); no kubelet runs, so the Deployment's pods never start: "
            f"helm install gpushare-webhook charts/gpushare-webhook -n gpushare-system "
            f"--create-namespace --kubeconfig {kubeconfig}",
            flush=True,
        )
        while not stop.wait(0.5):
            for process in cluster.processes:
                if not process.alive():
                    raise ClusterError(f"{process.name} exited:\n{process.tail()}")
    finally:
        cluster.stop()
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
