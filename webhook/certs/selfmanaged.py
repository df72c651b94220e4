"""The self-managed certificate mode: a Secret holds the CA and the serving
certificate, one replica at a time keeps it current, every replica serves from files.

Each check (every ``interval`` seconds, and at once on becoming leader):

- the holder of the Lease ``<secret>-leader`` (:mod:`webhook.lease`) first makes the
  webhook configurations trust the Secret's ``ca-bundle.crt``, then applies
  :func:`webhook.certs.rotation.decide` and writes the Secret back (create, or replace with
  the ``resourceVersion`` read), then writes the new bundle into the configurations.
  Because a serving certificate from a new CA only enters the Secret one check after
  that CA entered the bundle, the apiserver already trusts it by the time any replica
  presents it;
- every replica writes the Secret's serving pair into ``cert_dir`` (each file replaced
  atomically, the key mode 0600), where the running
  :class:`~webhook.certs.contexts.CertificateReloader` picks it up without dropping connections.

At start, :meth:`SelfManagedCertificates.ensure_ready` blocks until the Secret's pair is
on disk: the leader issues it, the others wait for the leader's Secret.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import logging
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Final

import orjson
from kubernetes.client.exceptions import ApiException
from urllib3.exceptions import HTTPError

from webhook.certs.files import write_files
from webhook.certs.issue import service_dns_names
from webhook.certs.lease import (
    LABELS,
    LEASE_DURATION,
    RENEW_INTERVAL,
    LeaseElector,
    default_identity,
    read_json,
)
from webhook.certs.material import CertificateError, CertPaths
from webhook.certs.rotation import (
    CA_BUNDLE,
    ROLLED_AT,
    Decision,
    Material,
    decide,
    parse_bundle,
)

log = logging.getLogger(__name__)

CHECK_INTERVAL: Final = 60.0
READY_TIMEOUT: Final = 120.0
_NOT_FOUND: Final = 404


_ConfigurationApi = tuple[str, Callable[..., Any], Callable[..., Any]]


class SelfManagedError(CertificateError):
    """The self-managed mode cannot provide a serving certificate, and why."""


@dataclass(frozen=True, slots=True)
class SelfManagedConfig:
    """``serve --self-managed``: where the certificates live in the cluster."""

    namespace: str
    service: str = "gpushare-webhook"
    secret: str = "gpushare-webhook-tls"  # noqa: S105  # the Secret's name
    webhook_config: str = "gpushare-webhook"
    kubeconfig: str | None = None
    # Resolved once, in the first process: the workers of one pod are one candidate.
    identity: str = field(default_factory=default_identity)
    interval: float = CHECK_INTERVAL
    ready_timeout: float = READY_TIMEOUT
    # The Lease's duration; the holder renews three times within it, as client-go does.
    lease_duration: float = LEASE_DURATION
    # The leader also keeps the webhooks' matchConditions and the CEL policies in step
    # with the policy in force (webhook.install.reconcile).
    keep_scope: bool = True


def api_client(kubeconfig: str | None = None) -> Any:
    """A ``kubernetes`` ApiClient: ``kubeconfig`` when given, the Pod's service account
    in a cluster, else ``$KUBECONFIG`` or ``~/.kube/config``."""
    from kubernetes import client
    from kubernetes import config as kube_config

    # The loaders carry no annotations.
    config: Any = kube_config
    try:
        if kubeconfig:
            return config.new_client_from_config(config_file=kubeconfig)
        if os.environ.get("KUBERNETES_SERVICE_HOST"):
            configuration = client.Configuration()
            config.load_incluster_config(client_configuration=configuration)
            return client.ApiClient(configuration)
        return config.new_client_from_config()
    except (config.ConfigException, OSError, ValueError) as exc:
        where = kubeconfig or os.environ.get("KUBECONFIG") or "~/.kube/config"
        raise SelfManagedError(
            where,
            f"no Kubernetes API access: {exc} (in a Pod the service account is used; "
            "elsewhere --kubeconfig, $KUBECONFIG or ~/.kube/config)",
        ) from None


def _utcnow() -> datetime:
    return datetime.now(UTC)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, ApiException):
        message = ""
        with contextlib.suppress(orjson.JSONDecodeError, TypeError, AttributeError):
            message = orjson.loads(exc.body or b"").get("message", "")
        return f"{exc.status} {exc.reason}" + (f": {message}" if message else "")
    return f"{type(exc).__name__}: {exc}"


class SelfManagedCertificates:
    """Keeps the Secret, the webhook configurations' caBundle and ``cert_dir`` current."""

    def __init__(
        self,
        api_client: Any,
        *,
        namespace: str,
        service: str,
        secret: str,
        webhook_config: str,
        cert_dir: str | os.PathLike[str],
        identity: str | None = None,
        clock: Callable[[], datetime] = _utcnow,
        interval: float = CHECK_INTERVAL,
        lease_duration: float = LEASE_DURATION,
        renew_interval: float = RENEW_INTERVAL,
        request_timeout: float = 10.0,
    ) -> None:
        from kubernetes import client

        service_dns_names(service, namespace)  # refuses names no certificate can carry
        if interval <= 0:
            raise ValueError(f"interval must be positive, got {interval}")
        if not 0 < renew_interval < lease_duration:
            raise ValueError("renew_interval must be positive and shorter than lease_duration")
        self.api_client = api_client
        self._core: Any = client.CoreV1Api(api_client)
        self._admission: Any = client.AdmissionregistrationV1Api(api_client)
        self.namespace = namespace
        self.service = service
        self.secret = secret
        self.webhook_config = webhook_config
        self.paths = CertPaths.in_directory(cert_dir)
        self._clock = clock
        self._interval = interval
        self._renew_interval = renew_interval
        self._timeout = request_timeout
        # A leader that stops gives its Lease up, so that another takes over at once.
        self.release_on_stop = True
        self._elector = LeaseElector(
            client.CoordinationV1Api(api_client),
            namespace=namespace,
            name=f"{secret}-leader",
            identity=identity or default_identity(),
            lease_duration=lease_duration,
            request_timeout=request_timeout,
        )
        self._leading = False
        self._in_sync = False
        self._secret_found: bool | None = None
        self._missing_configs: set[str] = set()
        # The Secret as last read or written, to put back if it is deleted.
        self._last_secret: dict[str, Any] | None = None
        # time.monotonic() at the end of the last check that raised nothing (0: none yet).
        self.last_check = 0.0
        # More that only the leader does, after each check (blocking; in the check's thread).
        self.duties: list[Callable[[], object]] = []
        self._wake = asyncio.Event()

    @classmethod
    def from_config(
        cls, config: SelfManagedConfig, *, cert_dir: str | os.PathLike[str]
    ) -> SelfManagedCertificates:
        return cls(
            api_client(config.kubeconfig),
            namespace=config.namespace,
            service=config.service,
            secret=config.secret,
            webhook_config=config.webhook_config,
            cert_dir=cert_dir,
            identity=config.identity,
            interval=config.interval,
            lease_duration=config.lease_duration,
            renew_interval=min(RENEW_INTERVAL, config.lease_duration / 3),
        )

    @property
    def identity(self) -> str:
        return self._elector.identity

    @property
    def lease(self) -> str:
        return self._elector.name

    @property
    def is_leader(self) -> bool:
        return self._elector.is_leader

    def wake(self) -> None:
        """Check now rather than at the next interval (e.g. the policy changed)."""
        self._wake.set()

    # -- the loop --------------------------------------------------------------------

    async def ensure_ready(self, within: float = READY_TIMEOUT, *, poll: float = 1.0) -> CertPaths:
        """Return once ``cert_dir`` holds the Secret's serving pair.

        Raises :class:`SelfManagedError` after ``within`` seconds, saying what is missing.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + within
        last_error: str | None = None
        while True:
            try:
                await self._elect()
                await asyncio.to_thread(self.check)
            except Exception as exc:  # reported in the timeout message and logged
                last_error = _describe(exc)
                log.warning("self-managed certificates not ready yet: %s", last_error)
            if self._in_sync:
                return self.paths
            remaining = deadline - loop.time()
            if remaining <= 0:
                raise SelfManagedError(
                    self.paths.cert_file.parent, self._not_ready(within, last_error)
                )
            await asyncio.sleep(min(poll, remaining))

    def _not_ready(self, waited: float, last_error: str | None) -> str:
        holder = self._elector.holder or "nobody"
        state = {None: "could not be read", False: "does not exist"}.get(
            self._secret_found, "has no usable serving pair"
        )
        message = (
            f"no serving certificate after {waited:g}s: Secret {self.namespace}/{self.secret} "
            f"{state} (Lease {self.namespace}/{self.lease}: held by {holder}; "
            "only its holder issues certificates)"
        )
        if last_error:
            message += f"; last error: {last_error}"
        return message

    async def run(self) -> None:
        """Elect and check until cancelled; a leader gives up its Lease on the way out."""
        wake = self._wake
        try:
            async with asyncio.TaskGroup() as group:
                group.create_task(self._elect_forever(wake))
                group.create_task(self._check_forever(wake))
        finally:
            if self.release_on_stop and self._leading:
                self._leading = False
                try:
                    await asyncio.to_thread(self._elector.release)
                except Exception as exc:  # shutting down: the Lease then simply expires
                    log.warning("could not release Lease %s: %s", self.lease, _describe(exc))

    async def _elect(self) -> None:
        was = self._leading
        try:
            await asyncio.to_thread(self._elector.try_acquire_or_renew)
        finally:
            self._leading = self._elector.is_leader
            if self._leading and not was:
                log.info(
                    "%s leads Lease %s/%s: managing Secret %s",
                    self.identity,
                    self.namespace,
                    self.lease,
                    self.secret,
                )
            elif was and not self._leading:
                log.warning(
                    "%s no longer leads Lease %s/%s", self.identity, self.namespace, self.lease
                )

    async def _elect_forever(self, wake: asyncio.Event) -> None:
        while True:
            was = self._leading
            try:
                await self._elect()
            except Exception as exc:  # the API may be briefly away; leadership lapses on its own
                log.warning("Lease %s/%s: %s", self.namespace, self.lease, _describe(exc))
            if self._leading and not was:
                wake.set()
            await asyncio.sleep(self._renew_interval)

    async def _check_forever(self, wake: asyncio.Event) -> None:
        while True:
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._interval):
                    await wake.wait()
            wake.clear()
            try:
                await asyncio.to_thread(self.check)
            except Exception as exc:  # retried at the next check
                log.error(
                    "certificate check failed: %s",
                    _describe(exc),
                    # A traceback only for what is not the API answering or being away.
                    exc_info=not isinstance(exc, ApiException | HTTPError | OSError),
                )

    # -- one check (blocking) --------------------------------------------------------

    def check(self) -> bool:
        """One check: as leader, renew what is due and publish the bundle; always,
        bring ``cert_dir`` in line with the Secret. True when the files changed."""
        self._secret_found = None
        secret = self._read_secret()
        if secret is None and self.is_leader and self._last_secret is not None:
            secret = self._restore(self._last_secret)
        self._secret_found = secret is not None
        data = _decoded(secret)
        if secret is not None:
            self._last_secret = secret
        failure: Exception | None = None
        if self.is_leader:
            try:
                data = self._lead(secret, data)
            # What the Secret holds is served all the same; the failure is reported after.
            except Exception as exc:
                failure = exc
        changed = self._write_files(data)
        if failure is not None:
            raise failure
        self.last_check = time.monotonic()
        return changed

    def _restore(self, last: dict[str, Any]) -> dict[str, Any]:
        """Create the deleted Secret again as this leader last saw it (CA, key, serving
        pair, bundle, annotations): the certificates every replica serves stay trusted,
        where a new CA would leave them untrusted until each picked up its new pair."""
        metadata = last.get("metadata") or {}
        body = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {
                "name": self.secret,
                "namespace": self.namespace,
                "labels": metadata.get("labels") or dict(LABELS),
                "annotations": metadata.get("annotations") or {},
            },
            "type": last.get("type") or "kubernetes.io/tls",
            "data": last.get("data") or {},
        }
        created: dict[str, Any] = read_json(
            self._core.create_namespaced_secret(
                self.namespace, body, _preload_content=False, _request_timeout=self._timeout
            )
        )
        log.warning(
            "Secret %s/%s was deleted: created it again with the certificates it held",
            self.namespace,
            self.secret,
        )
        return created

    def _lead(self, secret: dict[str, Any] | None, data: dict[str, bytes]) -> dict[str, bytes]:
        # First make the apiserver trust what the Secret holds, so that a serving
        # certificate issued below from a CA of the last check is trusted before use.
        if parse_bundle(data.get(CA_BUNDLE, b"")):
            self.publish_bundle(data[CA_BUNDLE])
        annotations = ((secret or {}).get("metadata") or {}).get("annotations") or {}
        decision = decide(
            data,
            annotations,
            service=self.service,
            namespace=self.namespace,
            now=self._clock(),
        )
        if decision.changed:
            if not self.is_leader:
                return data
            self._write_secret(secret, decision)
            log.info(
                "Secret %s/%s updated: %s",
                self.namespace,
                self.secret,
                "; ".join(decision.reasons) or "normalised",
            )
            data = decision.data
        self.publish_bundle(data[CA_BUNDLE])
        self._do_duties()
        return data

    def _do_duties(self) -> None:
        for duty in self.duties:
            try:
                duty()
            # Certificates come first: a duty that fails is reported and retried at the
            # next check, and never keeps a serving pair from being written.
            except Exception as exc:
                log.error("leader duty failed: %s", _describe(exc))

    def _read_secret(self) -> dict[str, Any] | None:
        try:
            secret: dict[str, Any] = read_json(
                self._core.read_namespaced_secret(
                    self.secret,
                    self.namespace,
                    _preload_content=False,
                    _request_timeout=self._timeout,
                )
            )
        except ApiException as exc:
            if exc.status == _NOT_FOUND:
                return None
            raise
        return secret

    def _write_secret(self, secret: dict[str, Any] | None, decision: Decision) -> None:
        encoded = {
            key: base64.b64encode(value).decode("ascii") for key, value in decision.data.items()
        }
        if secret is None:
            body: dict[str, Any] = {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {
                    "name": self.secret,
                    "namespace": self.namespace,
                    "labels": dict(LABELS),
                    "annotations": decision.annotations,
                },
                # kubernetes.io/tls: tls.crt and tls.key, mountable like any TLS Secret.
                "type": "kubernetes.io/tls",
                "data": encoded,
            }
            self._last_secret = read_json(
                self._core.create_namespaced_secret(
                    self.namespace, body, _preload_content=False, _request_timeout=self._timeout
                )
            )
            return
        metadata = secret.setdefault("metadata", {})
        annotations = {
            k: v for k, v in (metadata.get("annotations") or {}).items() if k != ROLLED_AT
        }
        metadata["annotations"] = annotations | decision.annotations
        # Keys of others stay; the resourceVersion read makes a concurrent write fail.
        secret["data"] = {**(secret.get("data") or {}), **encoded}
        self._last_secret = read_json(
            self._core.replace_namespaced_secret(
                self.secret,
                self.namespace,
                secret,
                _preload_content=False,
                _request_timeout=self._timeout,
            )
        )

    def publish_bundle(self, bundle: bytes) -> bool:
        """Write ``bundle`` as the caBundle of every webhook of both configurations named
        ``webhook_config`` where it differs; True when something was written."""
        value = base64.b64encode(bundle).decode("ascii")
        written = False
        for kind, read, patch in self._webhook_configuration_apis():
            config = self._read_webhook_configuration(kind, read)
            if config is None:
                continue
            operations = _ca_bundle_patch(config, value)
            if operations:
                self._patch_webhook_configuration(kind, patch, operations, bundle=bundle)
                written = True
        return written

    def _webhook_configuration_apis(self) -> list[_ConfigurationApi]:
        """Each configuration kind with the calls that read and patch it."""
        return [
            (
                "MutatingWebhookConfiguration",
                self._admission.read_mutating_webhook_configuration,
                self._admission.patch_mutating_webhook_configuration,
            ),
            (
                "ValidatingWebhookConfiguration",
                self._admission.read_validating_webhook_configuration,
                self._admission.patch_validating_webhook_configuration,
            ),
        ]

    def _read_webhook_configuration(
        self, kind: str, read: Callable[..., Any]
    ) -> dict[str, Any] | None:
        """The configuration, or None (warned about once until it appears) when missing."""
        try:
            config: dict[str, Any] = read_json(
                read(self.webhook_config, _preload_content=False, _request_timeout=self._timeout)
            )
        except ApiException as exc:
            if exc.status != _NOT_FOUND:
                raise
            if kind not in self._missing_configs:
                self._missing_configs.add(kind)
                # The 1.36+ install registers none without the cluster view: say so, as
                # the same line must stay a warning where a webhook install lost one.
                log.warning(
                    "%s %s does not exist: no caBundle written (expected in the Kubernetes "
                    "1.36+ install without the cluster view, which registers no webhook)",
                    kind,
                    self.webhook_config,
                )
            return None
        self._missing_configs.discard(kind)
        return config

    def _patch_webhook_configuration(
        self,
        kind: str,
        patch: Callable[..., Any],
        operations: list[dict[str, Any]],
        *,
        bundle: bytes,
    ) -> None:
        patch(
            self.webhook_config,
            operations,
            _content_type="application/json-patch+json",
            _preload_content=False,
            _request_timeout=self._timeout,
        )
        log.info(
            "%s %s: caBundle of %d webhooks now holds %d CAs",
            kind,
            self.webhook_config,
            len(operations) // 2,
            len(parse_bundle(bundle)),
        )

    def _write_files(self, data: Mapping[str, bytes]) -> bool:
        material = Material.from_secret(data, {})
        ca, serving = material.ca, material.serving
        if ca is None or serving is None:
            self._in_sync = False
            if data:
                log.warning(
                    "Secret %s/%s lacks a usable CA or serving pair: files in %s left as they are",
                    self.namespace,
                    self.secret,
                    self.paths.cert_file.parent,
                )
            return False
        wanted = {
            self.paths.ca_file: ca.cert_pem(),
            self.paths.key_file: serving.key_pem(),
            self.paths.cert_file: serving.cert_pem(),
        }
        if all(_read_or_none(path) == content for path, content in wanted.items()):
            self._in_sync = True
            return False
        write_files(self.paths.cert_file.parent, ca=ca, serving=serving)
        self._in_sync = True
        log.info(
            "%s now holds the Secret's serving certificate (serial %x, expires %s) and CA",
            self.paths.cert_file.parent,
            serving.cert.serial_number,
            serving.not_after.isoformat(),
        )
        return True


def _ca_bundle_patch(config: Mapping[str, Any], value: str) -> list[dict[str, Any]]:
    """The JSON patch that sets the base64 caBundle ``value`` in each webhook of ``config``
    that holds another."""
    operations: list[dict[str, Any]] = []
    for index, hook in enumerate(config.get("webhooks") or []):
        if (hook.get("clientConfig") or {}).get("caBundle") == value:
            continue
        # The test makes the patch fail rather than land on a reordered list.
        operations.append({"op": "test", "path": f"/webhooks/{index}/name", "value": hook["name"]})
        operations.append(
            {"op": "add", "path": f"/webhooks/{index}/clientConfig/caBundle", "value": value}
        )
    return operations


def _decoded(secret: dict[str, Any] | None) -> dict[str, bytes]:
    if secret is None:
        return {}
    data: dict[str, str] = secret.get("data") or {}
    decoded: dict[str, bytes] = {}
    for key, value in data.items():
        with contextlib.suppress(ValueError):
            decoded[key] = base64.b64decode(value, validate=True)
    return decoded


def _read_or_none(path: Path) -> bytes | None:
    try:
        return path.read_bytes()
    except OSError:
        return None
