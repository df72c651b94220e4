"""Policy reports: the scan's findings written as one report per namespace.

The pods come from the cluster view (:class:`~webhook.cluster.watch.ClusterWatch` with
``pods=True``), judged by :func:`webhook.core.scan.judge_pod`. A pod's change rejudges
that pod; a new policy, or a change of the facts every pod is judged with (Nodes,
Namespaces), rejudges them all, in batches between which requests are served. At most
one pass every ``interval`` seconds writes, and only the namespaces whose report
changed: a report is written at most once per interval whatever the churn, and never
when it says what the API already holds.

One report per namespace, not Kyverno's one per resource: under pod churn a
per-resource design writes once for every failing pod created (and its garbage
collection once more for every one deleted), while a namespace's report absorbs any
number of changes into one write per interval (measured in ``bench/cluster.py``).

Writes use server-side apply (one call whether the report exists or not, no conflict
to retry) and happen only while this replica leads (``leading``): the replicas keep
their findings current, so a new leader writes at once what changed. A new leader
first lists the reports the API holds, so that a restart rewrites nothing unchanged.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Final

import orjson

from webhook.cluster.watch import ClusterWatch, describe
from webhook.core.policy import Policy
from webhook.core.scan import (
    API_VERSIONS,
    DEFAULT_MAX_RESULTS,
    MANAGED_BY,
    REPORT_NAME,
    STATUSES,
    ReportBody,
    ReportKind,
    Result,
    Status,
    judge_pod,
    judge_view,
    read_facts,
    report_body,
    same_report,
    scan_view,
)

log = logging.getLogger(__name__)

FIELD_MANAGER: Final = "gpushare-webhook"
_PLURALS: Final[dict[ReportKind, str]] = {"openreports": "reports", "wgpolicyk8s": "policyreports"}
_SELECTOR: Final = ",".join(f"{k}={v}" for k, v in MANAGED_BY.items())
_NOT_FOUND: Final = 404
_RELIST_MISSING: Final = 60.0


@dataclass(frozen=True, slots=True)
class ReportSettings:
    kinds: tuple[ReportKind, ...] = ("openreports",)
    max_results: int = DEFAULT_MAX_RESULTS
    statuses: tuple[Status, ...] = STATUSES
    # The rate limit: one pass (and so at most one write of each report) this often.
    interval: float = 10.0
    # Pods judged between two turns of the event loop in a full scan (~10 ms).
    batch: int = 300
    # A change of Node, Namespace or claim facts (a ResourceClaim or template's device
    # classes) rejudges every pod at most this often (a full scan of 50,000 pods is
    # ~1.4 s of CPU; an autoscaling cluster changes nodes often, a DRA one claims).
    # A new policy rejudges them at the next pass.
    rescan: float = 60.0
    request_timeout: float = 10.0


def _group_version(kind: ReportKind) -> tuple[str, str]:
    group, _, version = API_VERSIONS[kind][0].partition("/")
    return group, version


class ReportKeeper:
    """Keeps every namespace's report equal to what the scan finds."""

    def __init__(
        self,
        api_client: Any,
        watch: ClusterWatch,
        policy: Callable[[], Policy],
        *,
        settings: ReportSettings | None = None,
        leading: Callable[[], bool] = lambda: True,
        metrics: Any = None,
        clock: Callable[[], float] = time.time,
    ) -> None:
        from kubernetes import client

        self.settings = settings or ReportSettings()
        self._api: Any = client.CustomObjectsApi(api_client)
        self._watch = watch
        self._policy = policy
        self._leading = leading
        self._metrics = metrics
        self._clock = clock
        # namespace -> pod name -> its findings (only pods that have some).
        self._pods: dict[str, dict[str, tuple[Result, ...]]] = {}
        self._data: dict[str, list[Result]] = {}
        self._dirty: set[tuple[str, str]] = set()
        self._full = True
        self._stale_view = False
        self._last_full = -float("inf")
        self._data_dirty = True
        self._digest: str | None = None
        self._dirty_namespaces: set[str] = set()
        self._first_seen: dict[Result, int] = {}
        # (kind, namespace) -> the report the API holds; None until listed as leader.
        self._held: dict[tuple[ReportKind, str], dict[str, Any]] | None = None
        self._missing: set[ReportKind] = set()
        self._listed_at = 0.0
        self.passes = 0
        watch.listeners.append(self._changed)

    # ------------------------------------------------------------------ changes

    def _changed(self, kind: str, key: Any) -> None:
        if kind == "pods":
            self._dirty.add(key)
        elif kind in ("configmaps", "secrets"):
            self._data_dirty = True
        elif kind in ("nodes", "namespaces", "resourceclaims", "resourceclaimtemplates"):
            # Every pod is judged with them (node fit, Pod Security of mps, gpu-claim of a
            # pod that names a claim or template by name).
            self._stale_view = True

    def results(self, namespace: str) -> list[Result]:
        found = [r for rs in self._pods.get(namespace, {}).values() for r in rs]
        return found + self._data.get(namespace, [])

    def namespaces(self) -> set[str]:
        return set(self._pods) | set(self._data)

    # ------------------------------------------------------------------ the loop

    async def run(self) -> None:
        while True:
            try:
                await self.step()
            except Exception as exc:  # one failed pass: the next one retries
                log.warning("policy reports: %s", describe(exc))
            await asyncio.sleep(self.settings.interval)

    async def step(self) -> None:
        """One pass: judge what changed, then write the reports that changed (leader)."""
        watch = self._watch
        if not (watch.view.synced and watch.listed("pods")):
            return  # partial knowledge would delete reports of pods not listed yet
        policy = self._policy()
        if policy.digest != self._digest:
            self._digest = policy.digest
            self._full = self._data_dirty = True
        if self._stale_view and time.monotonic() - self._last_full >= self.settings.rescan:
            self._full = True
        if self._full:
            await self._scan_all(policy)
        else:
            self._judge_dirty(policy)
        if self._data_dirty:
            self._data_dirty = False
            self._judge_data(policy)
        self.passes += 1
        if self._metrics is not None:
            self._metrics.set_violations(self._counts())
        if not self._leading():
            self._held = None  # whoever leads next reads the API's reports first
            return
        if self._missing and time.monotonic() - self._listed_at > _RELIST_MISSING:
            self._held = None  # a CRD installed since is used without a restart
        if self._held is None:
            self._listed_at = time.monotonic()
            self._held = await asyncio.to_thread(self._list_held)
            # Every report is compared again (one written while a CRD was missing, or by
            # another leader); those the API already holds as wanted are not written.
            self._dirty_namespaces |= {ns for _, ns in self._held} | self.namespaces()
        namespaces, self._dirty_namespaces = self._dirty_namespaces, set()
        plans = self._plans(namespaces, policy)
        if plans:
            failed = await asyncio.to_thread(self._write, plans)
            self._dirty_namespaces |= failed

    async def _scan_all(self, policy: Policy) -> None:
        self._full = self._stale_view = False
        self._last_full = time.monotonic()
        self._dirty.clear()
        view = scan_view(self._watch.view)
        before = set(self._pods)
        self._pods = {}
        keys = list(self._watch.pods)
        started = time.thread_time()
        batch = self.settings.batch
        for start in range(0, len(keys), batch):
            for key in keys[start : start + batch]:
                self._judge(key, policy, view)
            await asyncio.sleep(0)  # serve requests between batches
        if self._metrics is not None:
            self._metrics.scan_seconds.set(time.thread_time() - started)
            self._metrics.scanned.set(len(keys))
        self._dirty_namespaces |= before | set(self._pods)

    def _judge_dirty(self, policy: Policy) -> None:
        if not self._dirty:
            return
        view = scan_view(self._watch.view)
        dirty, self._dirty = self._dirty, set()
        for key in dirty:
            self._judge(key, policy, view)
            self._dirty_namespaces.add(key[0])

    def _judge(self, key: tuple[str, str], policy: Policy, view: Any) -> None:
        namespace, name = key
        facts = self._watch.pods.get(key)
        # The day exceptions' expiry is read against: a pod judged again after its
        # exception's last day is reported as failing, naming the expired exception.
        today = time.strftime("%Y-%m-%d", time.gmtime()) if policy.exceptions else ""
        found = judge_pod(read_facts(facts), policy, cluster=view, today=today) if facts else ()
        held = self._pods.get(namespace)
        if found:
            if held is None:
                held = self._pods[namespace] = {}
            held[name] = found
        elif held is not None:
            held.pop(name, None)
            if not held:
                del self._pods[namespace]

    def _judge_data(self, policy: Policy) -> None:
        before = set(self._data)
        self._data = {}
        for result in judge_view(self._watch.view, policy):
            self._data.setdefault(result.namespace, []).append(result)
        self._dirty_namespaces |= before | set(self._data)

    def _counts(self) -> dict[tuple[str, str], int]:
        counts: dict[tuple[str, str], int] = {}
        for namespace in self.namespaces():
            for result in self.results(namespace):
                key = (namespace, result.rule)
                counts[key] = counts.get(key, 0) + 1
        return counts

    # ------------------------------------------------------------------ reports

    def _found(self, result: Result) -> int:
        seen = self._first_seen.get(result)
        if seen is None:
            seen = self._first_seen[result] = int(self._clock())
        return seen

    def _plans(
        self, namespaces: Iterable[str], policy: Policy
    ) -> list[tuple[ReportKind, str, ReportBody | None]]:
        """What to write: a body to apply, or None to delete; nothing when the API holds it."""
        assert self._held is not None
        current: set[Result] = set()
        plans: list[tuple[ReportKind, str, ReportBody | None]] = []
        for namespace in sorted(namespaces):
            results = self.results(namespace)
            current.update(results)
            for kind in self.settings.kinds:
                held = self._held.get((kind, namespace))
                if not results:
                    if held is not None:
                        plans.append((kind, namespace, None))
                    continue
                body = report_body(
                    namespace,
                    results,
                    policy=policy.name,
                    found=self._found,
                    max_results=self.settings.max_results,
                    statuses=self.settings.statuses,
                    kind=kind,
                )
                if held is None or not same_report(held, body):
                    plans.append((kind, namespace, body))
        # First-seen times of findings gone from the namespaces just looked at.
        looked = set(namespaces)
        for result in [r for r in self._first_seen if r.namespace in looked and r not in current]:
            del self._first_seen[result]
        return plans

    def _list_held(self) -> dict[tuple[ReportKind, str], dict[str, Any]]:
        held: dict[tuple[ReportKind, str], dict[str, Any]] = {}
        for kind in self.settings.kinds:
            group, version = _group_version(kind)
            try:
                response = self._api.list_cluster_custom_object(
                    group,
                    version,
                    _PLURALS[kind],
                    label_selector=_SELECTOR,
                    _preload_content=False,
                    _request_timeout=self.settings.request_timeout,
                )
            except Exception as exc:
                if getattr(exc, "status", None) == _NOT_FOUND:
                    self._warn_missing(kind)
                    continue
                raise
            self._missing.discard(kind)
            for item in orjson.loads(response.data).get("items") or ():
                metadata = item.get("metadata") or {}
                if metadata.get("name") == REPORT_NAME:
                    held[(kind, str(metadata.get("namespace")))] = item
        return held

    def _warn_missing(self, kind: ReportKind) -> None:
        if kind not in self._missing:
            self._missing.add(kind)
            log.warning(
                "policy reports: %s is not served (CRD not installed?): not written",
                API_VERSIONS[kind][0],
            )

    def _write(self, plans: list[tuple[ReportKind, str, ReportBody | None]]) -> set[str]:
        """Apply or delete each planned report; the namespaces whose write failed."""
        assert self._held is not None
        failed: set[str] = set()
        relist = False
        for kind, namespace, body in plans:
            if kind in self._missing:
                continue
            group, version = _group_version(kind)
            plural = _PLURALS[kind]
            try:
                if body is None:
                    self._api.delete_namespaced_custom_object(
                        group,
                        version,
                        namespace,
                        plural,
                        REPORT_NAME,
                        _request_timeout=self.settings.request_timeout,
                    )
                    self._held.pop((kind, namespace), None)
                    verb = "delete"
                else:
                    response = self._api.patch_namespaced_custom_object(
                        group,
                        version,
                        namespace,
                        plural,
                        REPORT_NAME,
                        body,
                        field_manager=FIELD_MANAGER,
                        force=True,
                        _content_type="application/apply-patch+yaml",
                        _preload_content=False,
                        _request_timeout=self.settings.request_timeout,
                    )
                    self._held[(kind, namespace)] = orjson.loads(response.data)
                    verb = "apply"
            except Exception as exc:
                status = getattr(exc, "status", None)
                if body is None and status == _NOT_FOUND:
                    self._held.pop((kind, namespace), None)
                    continue
                if status == _NOT_FOUND:
                    relist = True  # the namespace is gone, or the CRD is: a listing tells
                log.warning(
                    "policy reports: %s %s/%s: %s", plural, namespace, REPORT_NAME, describe(exc)
                )
                failed.add(namespace)
                continue
            if self._metrics is not None:
                self._metrics.written(kind, verb)
        if relist:
            self._held = None
        return failed


def list_reports(
    api_client: Any, *, namespace: str | None = None, kind: ReportKind = "openreports"
) -> list[dict[str, Any]]:
    """The reports this webhook wrote (``report --cluster``), of one namespace or all."""
    from kubernetes import client

    api: Any = client.CustomObjectsApi(api_client)
    group, version = _group_version(kind)
    common: dict[str, Any] = {"label_selector": _SELECTOR, "_preload_content": False}
    if namespace:
        response = api.list_namespaced_custom_object(
            group, version, namespace, _PLURALS[kind], **common
        )
    else:
        response = api.list_cluster_custom_object(group, version, _PLURALS[kind], **common)
    items: list[dict[str, Any]] = orjson.loads(response.data).get("items") or []
    return [item for item in items if (item.get("metadata") or {}).get("name") == REPORT_NAME]
