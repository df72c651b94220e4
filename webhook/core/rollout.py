"""What an audit-only rollout found: the audit log's violations per rule, namespace and workload.

A violation recorded with action ``audit`` or ``warn`` was let through; enforcing its
rule (``deny``) would refuse that request. Those are counted as *would refuse*; the
ones already refused (``deny``) are counted apart as *refused now*.

Each admission request can reach both endpoints: ``/mutate`` and then ``/validate``
find the same violation on the same object, and a request refused at ``/mutate``
never reaches ``/validate``. The endpoints' requests are not linked in the log (each
call has a uid of its own), so a group's count is the larger of its two endpoints'
counts: the number of requests when both endpoints are registered, without counting
a request twice.

Records are plain parsed JSON; this module reads no file (the CLI streams them in).
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final, TypedDict

from webhook.core.workload import as_mapping

WOULD_REFUSE: Final = frozenset({"audit", "warn"})
REFUSED_NOW: Final = "deny"

# The kinds of the resources the webhook admits, by the plural the record names.
_KINDS: Final[Mapping[str, str]] = {
    "pods": "Pod",
    "deployments": "Deployment",
    "statefulsets": "StatefulSet",
    "daemonsets": "DaemonSet",
    "replicasets": "ReplicaSet",
    "replicationcontrollers": "ReplicationController",
    "jobs": "Job",
    "cronjobs": "CronJob",
    # Judged when written, by the in-apiserver policies (their audit events name them).
    "configmaps": "ConfigMap",
    "secrets": "Secret",
    "resourceclaims": "ResourceClaim",
    "resourceclaimtemplates": "ResourceClaimTemplate",
    "deviceclasses": "DeviceClass",
}
# A Deployment's pod, for records that carry no owner: ``<deployment>-<pod-template-hash>-``
# plus, once the apiserver has generated the name, five characters. The hash is a 32-bit
# number whose digits are written with the ten characters below (Kubernetes'
# rand.SafeEncodeString); the suffix comes from its 27-character alphabet.
_DEPLOYMENT_POD: Final = re.compile(
    r"(?P<deployment>.+)-[4-9bcdf]{6,10}-(?:[bcdfghjklmnpqrstvwxz2456789]{5})?"
)


class RolloutRow(TypedDict):
    """One rule in one workload: what enforcing it would refuse, and what it refuses now."""

    rule: str
    namespace: str  # "" for cluster-scoped objects
    workload: str  # "<Kind>/<name>"; "<name>*" for objects named by generateName alone
    wouldRefuse: int  # requests admitted with the violation recorded as audit or warn
    refusedNow: int  # requests refused by the rule (action deny)
    firstSeen: str  # record timestamps, ISO 8601 UTC
    lastSeen: str
    example: str  # one message as logged: user-supplied values redacted


class RolloutReport(TypedDict):
    """``gpushare-webhook report --audit-log FILE -o json``."""

    records: int  # audit records read
    skippedLines: int  # lines that were not an audit record (set by the reader)
    firstSeen: str  # the earliest and latest record timestamps ("" when none)
    lastSeen: str
    rows: list[RolloutRow]  # most requests that enforcing would refuse first


def workload_of(record: Mapping[str, Any]) -> str:
    """``<Kind>/<name>`` of the workload a record's object belongs to."""
    owner = as_mapping(record.get("owner"))
    if owner.get("kind") and owner.get("name"):
        return f"{owner['kind']}/{owner['name']}"
    ref = as_mapping(record.get("objectRef"))
    resource = str(ref.get("resource") or "")
    kind = _KINDS.get(resource, resource or "unknown")
    generated = str(ref.get("generateName") or "")
    name = str(ref.get("name") or "")
    if kind == "Pod":
        found = _DEPLOYMENT_POD.fullmatch(generated or name)
        if found:
            return f"Deployment/{found['deployment']}"
    if generated:
        return f"{kind}/{generated}*"
    return f"{kind}/{name}"


@dataclass(slots=True)
class _Group:
    first: str
    last: str
    example: str = ""
    example_refusable: bool = False
    # Requests per endpoint: [would refuse, refused now].
    counts: dict[str, list[int]] = field(default_factory=dict)

    def row(self, rule: str, namespace: str, workload: str) -> RolloutRow:
        would = max((c[0] for c in self.counts.values()), default=0)
        refused = max((c[1] for c in self.counts.values()), default=0)
        return {
            "rule": rule,
            "namespace": namespace,
            "workload": workload,
            "wouldRefuse": would,
            "refusedNow": refused,
            "firstSeen": self.first,
            "lastSeen": self.last,
            "example": self.example,
        }


class Rollout:
    """The report, built one record at a time so a log of any size streams through."""

    def __init__(self, *, rules: Collection[str] = (), namespaces: Collection[str] = ()) -> None:
        self._rules = frozenset(rules)
        self._namespaces = frozenset(namespaces)
        self._groups: dict[tuple[str, str, str], _Group] = {}
        self.records = 0
        self._first = ""
        self._last = ""

    def add(self, record: Mapping[str, Any]) -> None:
        if record.get("probe") is True:
            return  # a harness proving the webhooks answer, not a workload
        self.records += 1
        stamp = record.get("timestamp")
        stamp = stamp if type(stamp) is str else ""
        # The sink writes one timestamp format (UTC, milliseconds): strings order as times.
        if stamp and (not self._first or stamp < self._first):
            self._first = stamp
        if stamp > self._last:
            self._last = stamp
        violations = record.get("violations")
        if not violations or type(violations) is not list:
            return
        namespace = str(as_mapping(record.get("objectRef")).get("namespace") or "")
        if self._namespaces and namespace not in self._namespaces:
            return
        endpoint = str(record.get("endpoint") or "")
        workload = ""
        # A rule found twice in one object (two containers) is still one request.
        counted: set[str] = set()
        for violation in violations:
            violation = as_mapping(violation)
            action = violation.get("action")
            refusable = action in WOULD_REFUSE
            if not refusable and action != REFUSED_NOW:
                continue
            rule = violation.get("rule")
            if not rule or type(rule) is not str or rule in counted:
                continue
            if self._rules and rule not in self._rules:
                continue
            counted.add(rule)
            workload = workload or workload_of(record)
            key = (rule, namespace, workload)
            group = self._groups.get(key)
            if group is None:
                group = self._groups[key] = _Group(first=stamp, last=stamp)
            elif stamp:
                group.first = min(group.first, stamp) if group.first else stamp
                group.last = max(group.last, stamp)
            # An example of what would be refused, else of what is refused now.
            if not group.example or (refusable and not group.example_refusable):
                group.example = str(violation.get("message") or "")
                group.example_refusable = refusable
            counts = group.counts.get(endpoint)
            if counts is None:
                counts = group.counts[endpoint] = [0, 0]
            counts[0 if refusable else 1] += 1

    def report(self) -> RolloutReport:
        rows = [group.row(*key) for key, group in self._groups.items()]
        rows.sort(
            key=lambda r: (
                -r["wouldRefuse"],
                -r["refusedNow"],
                r["rule"],
                r["namespace"],
                r["workload"],
            )
        )
        return {
            "records": self.records,
            "skippedLines": 0,
            "firstSeen": self._first,
            "lastSeen": self._last,
            "rows": rows,
        }


def summarise(
    records: Iterable[Mapping[str, Any]],
    *,
    rules: Collection[str] = (),
    namespaces: Collection[str] = (),
) -> RolloutReport:
    """The rollout report of ``records``, only ``rules`` and ``namespaces`` when given."""
    rollout = Rollout(rules=rules, namespaces=namespaces)
    for record in records:
        rollout.add(record)
    return rollout.report()
