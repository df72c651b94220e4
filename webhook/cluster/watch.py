"""The watched, read-only cluster view behind ``serve --cluster``.

One daemon thread per kind (Nodes, Namespaces, ResourceQuotas, ConfigMaps, and Secrets
when the policy opts in; ResourceClaims and ResourceClaimTemplates of resource.k8s.io/v1,
where the apiserver serves it) lists with pagination and then watches from the list's
resourceVersion with the ``kubernetes`` client, reading the raw JSON stream (the
client's model classes cost ~1 ms per Node; orjson and the core's facts functions a
few tens of us). A 410 Gone relists; any other failure retries after an exponential
backoff with full jitter; every ``resync`` seconds the kind is relisted anyway, which
also repairs anything a watch could have missed. A kind the apiserver does not serve
(resource.k8s.io/v1 before Kubernetes 1.34, or switched off) answers its list with 404: it
counts as listed and empty, and is listed again every ``resync`` seconds.

Each thread turns objects into the core's slim facts, compares them with what it
published last (its own ``shadow`` dict, touched by that thread only) and hands only
real changes to the event loop, which applies them to the per-kind dicts the
:class:`~webhook.core.cluster.ClusterView` wraps. So a Node heartbeat that changes no
fact costs the loop nothing, the dicts are only ever written on the loop thread
(between two decisions, never during one), and a new ``ClusterView`` over the same
dicts is published at most every ``publish_delay`` seconds, which is what lets the
core cache its aggregates per view object.

Reading the view costs a request one attribute read (:attr:`ClusterWatch.view`).
An unsynced view (a kind never listed, or nothing heard from the API for
``stale_after`` seconds) is published with ``synced=False``: the decisions then fall
back to the pod spec alone, and nothing ever waits for the API.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import partial
from types import MappingProxyType
from typing import Any, Final

import orjson
from urllib3.exceptions import ReadTimeoutError

from webhook.core.cluster import (
    ClusterView,
    QuotaFacts,
    claim_facts,
    config_map_data,
    namespace_facts,
    node_facts,
    quota_facts,
    secret_data,
)
from webhook.core.scan import pod_facts

log = logging.getLogger(__name__)

Key = Any  # a name, or (namespace, name)
Change = tuple[Key, Any]  # (key, facts); facts None: the object is gone or of no interest
Slim = Callable[[Mapping[str, Any]], Any]

# Environment variable names whose values a decision judges when they come from a
# ConfigMap or Secret (envFrom, configMapKeyRef, secretKeyRef). Data under any other
# key is dropped as it arrives, which is what bounds the view's memory: a cluster's
# ConfigMaps hold configuration files, certificates and scripts, not these.
ENV_NAMES: Final = (
    "NVIDIA_VISIBLE_DEVICES",
    "CUDA_DISABLE_CONTROL",
    "GPU_CORE_UTILIZATION_POLICY",
    "CUDA_REDIRECT",
    "ACTIVE_OOM_KILLER",
    "CUDA_DEVICE_MEMORY_LIMIT",
    "CUDA_DEVICE_SM_LIMIT",
    "CUDA_DEVICE_MEMORY_SHARED_CACHE",
    "CUDA_TASK_PRIORITY",
    "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
    "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
    "CUDA_MPS_PIPE_DIRECTORY",
    "LD_PRELOAD",
)
# Names that also come per device: CUDA_DEVICE_MEMORY_LIMIT_0, CUDA_DEVICE_SM_LIMIT_3.
_INDEXED: Final = ("CUDA_DEVICE_MEMORY_LIMIT_", "CUDA_DEVICE_SM_LIMIT_")


def env_key_filter(
    names: Iterable[str] = ENV_NAMES, indexed: Iterable[str] = _INDEXED
) -> Callable[[str], bool]:
    """Whether a ConfigMap or Secret key can end up as one of ``names``.

    ``envFrom`` may put a prefix before every key, so a key counts when it is the end
    of a watched name (``VISIBLE_DEVICES`` with prefix ``NVIDIA_``), or the end of an
    indexed name's prefix followed by digits (``LIMIT_0``, ``0``).
    """
    ends = {name[i:] for name in names for i in range(len(name))}
    heads = {prefix[i:] for prefix in indexed for i in range(len(prefix))}

    def keep(key: str) -> bool:
        if key in ends:
            return True
        stem = key.rstrip("0123456789")
        return stem != key and (not stem or stem in heads)

    return keep


def _name(obj: Mapping[str, Any]) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def _namespaced(obj: Mapping[str, Any]) -> tuple[str, str]:
    metadata = obj.get("metadata") or {}
    return (str(metadata.get("namespace") or ""), str(metadata.get("name") or ""))


def _pod_key(obj: Mapping[str, Any]) -> tuple[str, str]:
    # One string per namespace, however many pods it holds.
    namespace, name = _namespaced(obj)
    return (sys.intern(namespace), name)


# Pods that still run or wait to: a finished pod holds no GPU and is in no report. A
# watch with this selector reports a pod that finishes as DELETED.
ACTIVE_PODS: Final = "status.phase!=Succeeded,status.phase!=Failed"


def _filtered(
    data: Callable[[Mapping[str, Any]], Mapping[str, str]], keep: Callable[[str], bool]
) -> Slim:
    """The kept part of a ConfigMap's or Secret's data; None (not stored) when nothing is
    kept: a missing object and one without a watched key decide the same."""

    def slim(obj: Mapping[str, Any]) -> Mapping[str, str] | None:
        kept = {key: value for key, value in data(obj).items() if keep(key)}
        return kept or None

    return slim


def _claim_classes(kind: str) -> Slim:
    """The device classes of a ResourceClaim or ResourceClaimTemplate (the core's
    claim_facts); None (not stored) for one on no class, which decides as a missing one.
    A list's items carry no ``kind``, which claim_facts reads to find a template's spec."""

    def slim(obj: Mapping[str, Any]) -> tuple[str, ...] | None:
        classes = claim_facts({**obj, "kind": kind})
        return tuple(sys.intern(name) for name in classes) or None

    return slim


@dataclass(frozen=True, slots=True)
class Kind:
    """One watched resource: its API group's client (a ``kubernetes.client`` class name)
    and that client's list call, the key, the slim facts. ``optional``: a kind that some
    apiservers do not serve, whose 404 means "none here"."""

    name: str
    method: str
    key: Callable[[Mapping[str, Any]], Key]
    slim: Slim
    field_selector: str | None = None
    api: str = "CoreV1Api"
    optional: bool = False


def kinds(*, keep_key: Callable[[str], bool] | None = None) -> dict[str, Kind]:
    keep = keep_key or env_key_filter()
    return {
        kind.name: kind
        for kind in (
            Kind("nodes", "list_node", _name, node_facts),
            Kind("namespaces", "list_namespace", _name, namespace_facts),
            Kind(
                "resourcequotas", "list_resource_quota_for_all_namespaces", _namespaced, quota_facts
            ),
            Kind(
                "configmaps",
                "list_config_map_for_all_namespaces",
                _namespaced,
                _filtered(config_map_data, keep),
            ),
            Kind(
                "secrets",
                "list_secret_for_all_namespaces",
                _namespaced,
                _filtered(secret_data, keep),
            ),
            Kind("pods", "list_pod_for_all_namespaces", _pod_key, pod_facts, ACTIVE_PODS),
            Kind(
                "resourceclaims",
                "list_resource_claim_for_all_namespaces",
                _namespaced,
                _claim_classes("ResourceClaim"),
                api="ResourceV1Api",
                optional=True,
            ),
            Kind(
                "resourceclaimtemplates",
                "list_resource_claim_template_for_all_namespaces",
                _namespaced,
                _claim_classes("ResourceClaimTemplate"),
                api="ResourceV1Api",
                optional=True,
            ),
        )
    }


@dataclass(frozen=True, slots=True)
class Settings:
    """Timings of the watch; the defaults suit a cluster of thousands of nodes."""

    # A kind that has heard nothing from the API this long (no list page, no watch
    # event or bookmark, no watch (re)opened) makes the view unsynced.
    stale_after: float = 120.0
    # Relist every kind this often, even when its watch is healthy.
    resync: float = 1800.0
    page_size: int = 500
    connect_timeout: float = 5.0
    # A watch that receives nothing this long is reopened: a quiet kind proves it is
    # still connected, and a dead connection is noticed well before stale_after.
    read_timeout: float = 60.0
    # The apiserver ends each watch after a random 5 to 10 minutes (as client-go asks).
    watch_timeout: tuple[int, int] = (300, 600)
    backoff_base: float = 0.5
    backoff_max: float = 30.0
    # A change reaches decisions within this long; a burst of changes makes one new view.
    publish_delay: float = 0.2
    # Changes applied per loop callback, so a relist never holds a request up for long.
    apply_batch: int = 1000


class Gone(Exception):
    """The resourceVersion is too old (HTTP 410): relist."""


class Backoff:
    """Exponential backoff with jitter: a delay drawn between half and all of
    ``base * 2**failures`` (capped), so replicas that failed together retry apart but
    none retries at once."""

    def __init__(self, base: float, cap: float, *, rng: random.Random | None = None) -> None:
        self.base = base
        self.cap = cap
        self.failures = 0
        self._rng = rng or random.Random()  # noqa: S311  # jitter, not a secret

    def next(self) -> float:
        ceiling = min(self.cap, self.base * 2**self.failures)
        self.failures = min(self.failures + 1, 32)
        return self._rng.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        self.failures = 0


def _lines(response: Any) -> Iterator[bytes]:
    """The newline-delimited JSON events of a watch response, as they arrive."""
    buffer = b""
    for chunk in response.stream(amt=None, decode_content=False):
        buffer += chunk
        start = 0
        while (end := buffer.find(b"\n", start)) != -1:
            if end > start:
                yield buffer[start:end]
            start = end + 1
        buffer = buffer[start:]
    if buffer.strip():
        yield buffer


def describe(exc: BaseException) -> str:
    """One line for the log and /readyz: the API's own message when it sent one."""
    status = getattr(exc, "status", None)
    if isinstance(status, int) and status:
        message = ""
        with contextlib.suppress(orjson.JSONDecodeError, TypeError, AttributeError):
            message = orjson.loads(getattr(exc, "body", None) or b"").get("message", "")
        reason = getattr(exc, "reason", "") or ""
        return f"{status} {reason}".strip() + (f": {message}" if message else "")
    return f"{type(exc).__name__}: {exc}"


class Reflector:
    """List and watch one kind in a thread; hand real changes to ``publish``."""

    def __init__(
        self,
        kind: Kind,
        api: Any,
        publish: Callable[[str, list[Change], bool], None],
        settings: Settings,
        *,
        on_event: Callable[[str, str], None] | None = None,
    ) -> None:
        self.kind = kind
        self.settings = settings
        self._call: Callable[..., Any] = getattr(api, kind.method)
        if kind.field_selector:
            self._call = partial(self._call, field_selector=kind.field_selector)
        self._publish = publish
        self._on_event = on_event or (lambda _kind, _what: None)
        self._stop = threading.Event()
        self._response: Any = None
        self._thread: threading.Thread | None = None
        self._backoff = Backoff(settings.backoff_base, settings.backoff_max)
        self.shadow: dict[Key, Any] = {}
        self.resource_version: str | None = None
        # Read from the loop thread: plain attributes written whole by this thread.
        self.listed = False
        self.last_ok: float | None = None
        self.last_list: float | None = None
        self.error: str | None = None
        # An optional kind the apiserver answered 404 for: listed, empty, never stale.
        self.absent = False

    # ------------------------------------------------------------------ the thread

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self.run, name=f"cluster-watch-{self.kind.name}", daemon=True
        )
        self._thread.start()

    def stop(self, timeout: float = 2.0) -> None:
        self._stop.set()
        response = self._response
        if response is not None:
            # Unblocks a read in progress in the watch thread (urllib3 >= 2.3).
            with contextlib.suppress(Exception):
                response.shutdown()
        if self._thread is not None:
            self._thread.join(timeout)

    def run(self) -> None:
        while not self._stop.is_set():
            try:
                if self.resource_version is None or self._resync_due():
                    self._list()
                if self.absent:  # nothing to watch: look again at the next resync
                    self._stop.wait(self.settings.resync)
                    continue
                self._watch()
            except Gone:
                log.info("cluster view: %s: resourceVersion expired, relisting", self.kind.name)
                self._on_event(self.kind.name, "gone")
                self.resource_version = None
            except Exception as exc:  # every failure of one attempt: log, back off, retry
                if self._stop.is_set():
                    return
                self.error = describe(exc)
                self._on_event(self.kind.name, "error")
                if self.kind.optional and getattr(exc, "status", None) == 404:
                    self.resource_version = None  # served no more: the list says so
                delay = self._backoff.next()
                log.warning(
                    "cluster view: %s: %s; retrying in %.1fs", self.kind.name, self.error, delay
                )
                self._stop.wait(delay)

    def _resync_due(self) -> bool:
        return (
            self.last_list is not None and time.monotonic() - self.last_list >= self.settings.resync
        )

    def _ok(self) -> None:
        self.last_ok = time.monotonic()
        self.error = None

    def _timeouts(self, read: float) -> tuple[float, float]:
        return (self.settings.connect_timeout, read)

    def _list(self) -> None:
        fresh: dict[Key, Any] = {}
        cont: str | None = None
        version = ""
        while True:
            try:
                response = self._call(
                    limit=self.settings.page_size,
                    _continue=cont,
                    _preload_content=False,
                    _request_timeout=self._timeouts(self.settings.read_timeout),
                )
            except Exception as exc:
                if getattr(exc, "status", None) == 410:  # the continue token expired
                    raise Gone from None
                if getattr(exc, "status", None) == 404 and self.kind.optional and cont is None:
                    self._absent()
                    return
                raise
            body = orjson.loads(response.data)
            for obj in body.get("items") or ():
                facts = self.kind.slim(obj)
                if facts is not None:
                    fresh[self.kind.key(obj)] = facts
            self._ok()
            metadata = body.get("metadata") or {}
            version = str(metadata.get("resourceVersion") or "")
            cont = metadata.get("continue") or None
            if cont is None or self._stop.is_set():
                break
        changes: list[Change] = []
        for key, facts in fresh.items():
            held = self.shadow.get(key)
            if held == facts:
                fresh[key] = held  # keep the object already published; drop the copy
            else:
                changes.append((key, facts))
        changes.extend((key, None) for key in self.shadow.keys() - fresh.keys())
        self.shadow = fresh
        self._on_event(self.kind.name, "resync" if self.listed else "list")
        self._publish(self.kind.name, changes, True)
        self.resource_version = version or None
        self.last_list = time.monotonic()
        self.listed = True
        self._backoff.reset()
        if self.absent:
            self.absent = False
            log.info("cluster view: %s: now served, watching", self.kind.name)

    def _absent(self) -> None:
        """The apiserver does not serve the kind: it holds none, which is known, not
        stale (decisions then find no such object, as in a cluster that has none)."""
        if not self.absent:
            log.info(
                "cluster view: %s: not served by this apiserver (404), none held; "
                "listing again every %.0fs",
                self.kind.name,
                self.settings.resync,
            )
        changes: list[Change] = [(key, None) for key in self.shadow]
        self.shadow = {}
        self._ok()
        self._on_event(self.kind.name, "resync" if self.listed else "list")
        self._publish(self.kind.name, changes, True)
        self.resource_version = None
        self.last_list = time.monotonic()
        self.absent = True
        self.listed = True
        self._backoff.reset()

    def _watch(self) -> None:
        low, high = self.settings.watch_timeout
        response = self._call(
            watch=True,
            resource_version=self.resource_version,
            allow_watch_bookmarks=True,
            timeout_seconds=random.randint(low, high),  # noqa: S311  # spreads reconnects
            _preload_content=False,
            _request_timeout=self._timeouts(self.settings.read_timeout),
        )
        self._response = response
        try:
            self._ok()
            deadline = (self.last_list or 0.0) + self.settings.resync
            for line in _lines(response):
                self._event(orjson.loads(line))
                if self._stop.is_set() or time.monotonic() >= deadline:
                    return
            self._ok()  # the apiserver ended the watch after timeout_seconds
        except ReadTimeoutError:
            self._ok()  # a quiet kind: reopen the watch, which proves the API is there
        finally:
            self._response = None
            with contextlib.suppress(Exception):
                response.release_conn()

    def _event(self, event: Mapping[str, Any]) -> None:
        kind = event.get("type")
        obj = event.get("object") or {}
        if kind == "ERROR":
            if obj.get("code") == 410:
                raise Gone
            raise RuntimeError(f"watch error {obj.get('code')}: {obj.get('message')}")
        version = (obj.get("metadata") or {}).get("resourceVersion")
        self._ok()
        self._backoff.reset()
        if kind != "BOOKMARK":
            key = self.kind.key(obj)
            facts = None if kind == "DELETED" else self.kind.slim(obj)
            held = self.shadow.get(key)
            if facts is None:
                if key in self.shadow:
                    del self.shadow[key]
                    self._publish(self.kind.name, [(key, None)], False)
            elif held != facts:
                self.shadow[key] = facts
                self._publish(self.kind.name, [(key, facts)], False)
        if version:
            self.resource_version = str(version)


@dataclass(slots=True)
class _Pending:
    """Changes handed over by the watch threads, applied on the loop."""

    changes: deque[tuple[str, list[Change], bool]] = field(default_factory=deque)
    scheduled: bool = False


class ClusterWatch:
    """The per-kind dicts behind the published :attr:`view`, and the threads that fill them.

    ``api`` is a ``kubernetes`` ``CoreV1Api`` (or anything with its list methods); a kind
    of another API group is listed with that group's client over ``api.api_client``.
    """

    def __init__(
        self,
        api: Any,
        *,
        settings: Settings | None = None,
        config_maps: bool = True,
        secrets: bool = False,
        pods: bool = False,
        keep_key: Callable[[str], bool] | None = None,
        on_event: Callable[[str, str], None] | None = None,
    ) -> None:
        self.settings = settings or Settings()
        self._api = api
        # The ApiClient behind ``api``, for whoever writes what the view finds (reports).
        self.api_client: Any = None
        self._kinds = kinds(keep_key=keep_key)
        # Counts lists, relists and failures (metrics); called on the watch threads.
        self.on_event = on_event
        self.nodes: dict[str, Any] = {}
        self.namespaces: dict[str, Any] = {}
        self.quotas: dict[str, tuple[QuotaFacts, ...]] = {}
        self.config_maps: dict[tuple[str, str], Mapping[str, str]] = {}
        self.secrets: dict[tuple[str, str], Mapping[str, str]] = {}
        # Running and pending pods as the scan reads them (webhook.core.scan.pod_facts),
        # for reports only: no admission decision reads them.
        self.pods: dict[tuple[str, str], bytes] = {}
        # (namespace, name) -> device classes (claim_facts): what a pod naming the claim
        # or template in spec.resourceClaims gets.
        self.resource_claims: dict[tuple[str, str], tuple[str, ...]] = {}
        self.claim_templates: dict[tuple[str, str], tuple[str, ...]] = {}
        # Called on the loop with (kind, key) for every change applied.
        self.listeners: list[Callable[[str, Key], None]] = []
        self._quota_items: dict[str, dict[str, QuotaFacts]] = {}
        self._stores: dict[str, dict[Any, Any]] = {
            "nodes": self.nodes,
            "namespaces": self.namespaces,
            "configmaps": self.config_maps,
            "secrets": self.secrets,
            "pods": self.pods,
            "resourceclaims": self.resource_claims,
            "resourceclaimtemplates": self.claim_templates,
        }
        self._stores["resourcequotas"] = self.quotas
        # The read-only face of each dict in the published view: a new one only for a
        # kind that changed, so a cache keyed on it (say, of node aggregates) survives
        # changes of other kinds (a quota's use, a ConfigMap).
        self._faces: dict[str, Mapping[Any, Any]] = {
            kind: MappingProxyType(store) for kind, store in self._stores.items()
        }
        self._changed: set[str] = set()
        self._reflectors: dict[str, Reflector] = {}
        self._clients: dict[str, Any] = {"CoreV1Api": api}
        self._wanted = ["nodes", "namespaces", "resourcequotas"]
        self._wanted += ["resourceclaims", "resourceclaimtemplates"]
        self._wanted += ["configmaps"] * config_maps + ["secrets"] * secrets + ["pods"] * pods
        self._pending = _Pending()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._publish_handle: asyncio.TimerHandle | None = None
        self._synced = False
        self.started: float | None = None
        # What every decision reads: replaced whole, never changed in place.
        self.view = ClusterView()

    # ------------------------------------------------------------------ lifecycle

    async def run(self) -> None:
        """Watch until cancelled; re-checks staleness every second."""
        self._loop = asyncio.get_running_loop()
        self.started = time.monotonic()
        for name in self._wanted:
            self._start(name)
        try:
            while True:
                self._check_synced()
                await asyncio.sleep(1.0)
        finally:
            await asyncio.to_thread(self.stop)

    def stop(self) -> None:
        for reflector in list(self._reflectors.values()):
            reflector.stop()

    def _start(self, name: str) -> None:
        kind = self._kinds[name]
        reflector = Reflector(
            kind,
            self._client(kind.api),
            self._handover,
            self.settings,
            on_event=self._event,
        )
        self._reflectors[name] = reflector
        reflector.start()

    def _client(self, name: str) -> Any:
        """The API group client ``name`` over the same ApiClient as ``api``."""
        if name not in self._clients:
            from kubernetes import client

            self._clients[name] = getattr(client, name)(self._api.api_client)
        return self._clients[name]

    def want(self, kind: str, enabled: bool) -> None:
        """Watch ``configmaps`` or ``secrets`` (or stop, and forget them) as the policy
        in force says: they are read only when it judges env taken from them. Turning
        one on leaves the view unsynced until that kind is listed."""
        if enabled and kind not in self._wanted:
            self._wanted.append(kind)
            if self._loop is not None:
                self._start(kind)
                self._check_synced()
        elif not enabled and kind in self._wanted:
            self._wanted.remove(kind)
            reflector = self._reflectors.pop(kind, None)
            if reflector is not None:
                threading.Thread(target=reflector.stop, daemon=True).start()
            self._stores[kind].clear()
            self._changed.add(kind)
            self._publish_now()
            self._check_synced()

    def _event(self, kind: str, what: str) -> None:
        if self.on_event is not None:
            self.on_event(kind, what)

    @property
    def kind_names(self) -> tuple[str, ...]:
        return (
            "nodes",
            "namespaces",
            "resourcequotas",
            "configmaps",
            "secrets",
            "pods",
            "resourceclaims",
            "resourceclaimtemplates",
        )

    # ------------------------------------------------------------------ thread -> loop

    def _handover(self, kind: str, changes: list[Change], listed: bool) -> None:
        """Called on a watch thread: queue the changes, wake the loop once."""
        pending = self._pending
        pending.changes.append((kind, changes, listed))
        if not pending.scheduled and self._loop is not None:
            pending.scheduled = True
            with contextlib.suppress(RuntimeError):  # the loop is closing
                self._loop.call_soon_threadsafe(self._drain)

    def _drain(self) -> None:
        pending = self._pending
        pending.scheduled = False
        budget = self.settings.apply_batch
        listed = False
        while pending.changes and budget > 0:
            kind, changes, was_list = pending.changes[0]
            if kind not in self._wanted:  # turned off meanwhile
                pending.changes.popleft()
                continue
            head, rest = changes[:budget], changes[budget:]
            for key, facts in head:
                self._apply(kind, key, facts)
            budget -= len(head)
            if rest:
                pending.changes[0] = (kind, rest, was_list)
            else:
                pending.changes.popleft()
                listed = listed or was_list
        if pending.changes:
            pending.scheduled = True
            asyncio.get_running_loop().call_soon(self._drain)
        if listed and self._check_synced():
            return
        self._schedule_publish()

    def _apply(self, kind: str, key: Key, facts: Any) -> None:
        self._changed.add(kind)
        for listener in self.listeners:
            listener(kind, key)
        if kind == "resourcequotas":
            namespace, name = key
            items = self._quota_items.setdefault(namespace, {})
            if facts is None:
                items.pop(name, None)
            else:
                items[name] = facts
            if items:
                self.quotas[namespace] = tuple(items[n] for n in sorted(items))
            else:
                self._quota_items.pop(namespace, None)
                self.quotas.pop(namespace, None)
            return
        store = self._stores[kind]
        if facts is None:
            store.pop(key, None)
        else:
            store[key] = facts

    # ------------------------------------------------------------------ publishing

    def _schedule_publish(self) -> None:
        if self._publish_handle is None and self._loop is not None:
            self._publish_handle = self._loop.call_later(
                self.settings.publish_delay, self._publish_now
            )

    def _publish_now(self) -> None:
        if self._publish_handle is not None:
            self._publish_handle.cancel()
            self._publish_handle = None
        for kind in self._changed:
            # A copy: the stores change in place as events arrive, and a published view
            # must stay what it was (its node aggregates were computed from it) until the
            # next one replaces it.
            self._faces[kind] = MappingProxyType(dict(self._stores[kind]))
        self._changed.clear()
        faces = self._faces
        before = self.view
        self.view = ClusterView(
            # Node aggregates stay valid while no node's facts changed.
            cache=before.cache if before.nodes is faces["nodes"] else {},
            nodes=faces["nodes"],
            namespaces=faces["namespaces"],
            quotas=faces["resourcequotas"],
            config_maps=faces["configmaps"],
            secrets=faces["secrets"],
            resource_claims=faces["resourceclaims"],
            claim_templates=faces["resourceclaimtemplates"],
            synced=self._synced,
        )

    def _fresh(self, now: float) -> bool:
        for name in self._wanted:
            if name == "pods":  # no decision waits for the pods to be listed
                continue
            reflector = self._reflectors.get(name)
            if reflector is None or not reflector.listed or reflector.last_ok is None:
                return False
            if reflector.absent:
                continue
            if now - reflector.last_ok > self.settings.stale_after:
                return False
        return True

    def _check_synced(self) -> bool:
        """Publish at once when synced flips; True when it did."""
        synced = self._fresh(time.monotonic()) and not self._pending.changes
        if synced == self._synced:
            return False
        self._synced = synced
        if synced:
            log.info("cluster view synced: %s", self._counts())
        else:
            log.warning("cluster view not synced: %s", self.status()["kinds"])
        self._publish_now()
        return True

    # ------------------------------------------------------------------ reporting

    def _counts(self) -> dict[str, int]:
        return {
            "nodes": len(self.nodes),
            "namespaces": len(self.namespaces),
            "resourcequotas": sum(len(items) for items in self._quota_items.values()),
            "configmaps": len(self.config_maps),
            "secrets": len(self.secrets),
            "pods": len(self.pods),
            "resourceclaims": len(self.resource_claims),
            "resourceclaimtemplates": len(self.claim_templates),
        }

    def listed(self, kind: str) -> bool:
        """Whether ``kind`` has been listed and is still heard from (not stale)."""
        reflector = self._reflectors.get(kind)
        if reflector is None or not reflector.listed or reflector.last_ok is None:
            return False
        if reflector.absent:
            return True
        return time.monotonic() - reflector.last_ok <= self.settings.stale_after

    def age(self) -> float:
        """Seconds since the kind heard from longest ago last heard from the API
        (since the start while a kind never has)."""
        now = time.monotonic()
        oldest = now
        for name in self._wanted:
            reflector = self._reflectors.get(name)
            if reflector is not None and reflector.absent:
                continue  # not served: nothing to hear from
            last = reflector.last_ok if reflector is not None else None
            oldest = min(oldest, last if last is not None else (self.started or now))
        return now - oldest

    def status(self) -> dict[str, Any]:
        """For /readyz: whether decisions use the view, and per kind why not."""
        now = time.monotonic()
        counts = self._counts()
        kinds_status: dict[str, Any] = {}
        for name in self._wanted:
            reflector = self._reflectors.get(name)
            last = reflector.last_ok if reflector is not None else None
            entry: dict[str, Any] = {
                "listed": bool(reflector and reflector.listed),
                "objects": counts[name],
                "age_seconds": None if last is None else round(now - last, 1),
            }
            if reflector is not None and reflector.absent:
                entry["served"] = False
            if reflector is not None and reflector.error:
                entry["error"] = reflector.error
            kinds_status[name] = entry
        return {
            "synced": self.view.synced,
            "stale": not self.view.synced,
            "kinds": kinds_status,
        }

    def objects(self, kind: str) -> int:
        return self._counts().get(kind, 0)
