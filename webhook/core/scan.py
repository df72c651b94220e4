"""The background scan: what the cluster runs now that the policy in force would refuse.

Admission judges an object once, when it is written. A pod created before the policy
tightened, or let in while the mutating webhook was down (it fails open), is never
judged again. The scan judges every running and pending pod as ``/validate`` would if
the pod were created now, with three differences, each because the input is not the
tenant's doing:

- ``spec.nodeName`` is the scheduler's binding, not a pin: ``node-name-pinning`` is
  skipped (and the field dropped before judging);
- the allocation annotations the policy reserves for the scheduler and device plugin
  (``hami.io/vgpu-devices-allocated``...) are theirs on a bound pod:
  ``forged-allocation`` is skipped (and those annotations dropped);
- update-only checks never run (the pod is judged as a create).

ResourceQuotas are left out of the view the scan judges with: a running pod is already
counted in its quota's ``status.used``, so judging it against what is left would
count it twice.

Exemptions by namespace hold. Exemptions by user, group or service account cannot:
a pod does not record who created it (Kyverno's background scans have the same limit).

Everything here is pure: the watching edge keeps pods as the compact bytes of
:func:`pod_facts` (read back with :func:`read_facts`), and the writing edge turns :class:`Result` lists into report
objects with :func:`report_body`.
"""

from __future__ import annotations

import zlib
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final, Literal, TypedDict

import orjson

from webhook.core.cluster import ClusterView
from webhook.core.decision import Request, decide
from webhook.core.objects import unadmitted_key
from webhook.core.policy import Action, Policy, match_any
from webhook.core.workload import as_mapping

SOURCE: Final = "gpushare-webhook"
CATEGORY: Final = "GPU sharing"
# Rules whose inputs the scheduler and device plugin write on a bound pod.
SKIPPED_RULES: Final = frozenset({"node-name-pinning", "forged-allocation"})
# The rule a ConfigMap or Secret holding a guarded name falls under.
GUARDED_DATA_RULE: Final = "raw-visible-devices"
# Names that must not reach a container from a ConfigMap or Secret: the device list the
# NVIDIA toolkit honours, and the switches that turn HAMi-core's enforcement off.

Status = Literal["fail", "warn", "skip"]
STATUSES: Final[tuple[Status, ...]] = ("fail", "warn", "skip")
# What a finding is in a report: a rule the policy enforces or audits is a failure
# (audit exists to be reported); a rule it only warns about is a warning; one an exception
# of the policy takes off is skipped, as Kyverno reports its PolicyExceptions.
_STATUS: Final[Mapping[str, Status]] = {"deny": "fail", "audit": "fail", "warn": "warn"}
_SEVERITY: Final[Mapping[str, str]] = {"deny": "high", "audit": "medium", "warn": "low"}
_RANK: Final[Mapping[str, int]] = {"deny": 0, "audit": 1, "warn": 2}

# --------------------------------------------------------------------------- pod facts

# What no rule reads, dropped from a watched pod so that 50,000 of them stay small
# (a list, not a list of what is kept: a field a rule starts to read is kept by
# default, and tests/core/test_scan.py holds the verdicts equal with and without).
_DROP_SPEC: Final = frozenset(
    {
        "nodeName",  # the scheduler's binding: node-name-pinning is skipped
        "tolerations",
        "affinity",
        "topologySpreadConstraints",
        "dnsPolicy",
        "dnsConfig",
        "terminationGracePeriodSeconds",
        "activeDeadlineSeconds",
        "restartPolicy",
        "serviceAccount",
        "serviceAccountName",
        "automountServiceAccountToken",
        "priority",
        "priorityClassName",
        "preemptionPolicy",
        "enableServiceLinks",
        "readinessGates",
        "imagePullSecrets",
        "hostname",
        "subdomain",
        "setHostnameAsFQDN",
        "schedulingGates",
        "overhead",
        "hostAliases",
    }
)
_DROP_CONTAINER: Final = frozenset(
    {
        "image",
        "command",
        "args",
        "ports",
        "livenessProbe",
        "readinessProbe",
        "startupProbe",
        "lifecycle",
        "terminationMessagePath",
        "terminationMessagePolicy",
        "imagePullPolicy",
        "workingDir",
        "stdin",
        "stdinOnce",
        "tty",
        "resizePolicy",
    }
)
# Volume sources no rule looks into (only hostPath and the injected emptyDir matter):
# the name and the kind of source are kept, the contents (a projected token's
# sources, a Secret's items) are not.
_OPAQUE_VOLUMES: Final = frozenset(
    {"projected", "secret", "configMap", "downwardAPI", "persistentVolumeClaim", "csi"}
)
_LAST_APPLIED: Final = "kubectl.kubernetes.io/last-applied-configuration"
# What pods share, for zlib to refer to (it matches from the end first: the commonest last).
_FACTS_DICTIONARY: Final = "".join(
    (
        '"securityContext":{"privileged":"capabilities":{"add":["SYS_ADMIN"]}}',
        '"hostPath":{"path":"/usr/local/vgpu/libvgpu.so","type":"File"}',
        '{"name":"gpushare-vgpu-lock","hostPath":{"path":"/tmp/vgpulock","type":"DirectoryOrCreate"}}',
        '{"name":"LD_PRELOAD","value":"/usr/local/vgpu/libvgpu.so"}',
        '{"name":"CUDA_DEVICE_MEMORY_LIMIT_0","value":"m"},{"name":"CUDA_DEVICE_SM_LIMIT","value":"',
        '{"name":"CUDA_TASK_PRIORITY","value":"1"}',
        '{"name":"GPU_CORE_UTILIZATION_POLICY","value":"default"},{"name":"CUDA_REDIRECT","value":""},',
        '{"name":"ACTIVE_OOM_KILLER","value":"true"},{"name":"NVIDIA_VISIBLE_DEVICES","value":"void"}',
        '"schedulerName":"hami-scheduler","nodeSelector":{',
        '"nvidia.com/gpu":"1","nvidia.com/gpumem":"","nvidia.com/gpucores":"',
        '"annotations":{"gpushare.io/mode":"vgpu","hami.io/vgpu-devices-allocated":"',
        '"valueFrom":{"fieldRef":{"fieldPath":"',
        '"resources":{"limits":{"cpu":"","memory":"Mi"},"requests":{"cpu":"m","memory":"Mi"}},',
        '"volumes":[{"name":"","configMap":{}},{"name":"kube-api-access-","projected":{}}]}}',
        '"readOnly":true,"mountPath":"/var/run/secrets/kubernetes.io/serviceaccount"}',
        '"volumeMounts":[{"name":"kube-api-access-","mountPath":"',
        '"spec":{"containers":[{"name":"","env":[{"name":"","value":"',
        '{"metadata":{"name":"","namespace":"","uid":"',
    )
).encode()


def _slim_containers(raw: Any) -> Any:
    if not isinstance(raw, list):
        return raw
    return [
        {k: v for k, v in c.items() if k not in _DROP_CONTAINER} if isinstance(c, dict) else c
        for c in raw
    ]


def _slim_volume(volume: Any) -> Any:
    if not isinstance(volume, dict):
        return volume
    return {k: ({} if k in _OPAQUE_VOLUMES else v) for k, v in volume.items()}


def pod_facts(obj: Mapping[str, Any]) -> bytes:
    """What the scan reads of a pod, as compact JSON: name, namespace, uid, annotations
    (bar kubectl's copy of the whole manifest) and the spec bar what no rule reads.

    Bytes rather than dicts: a parsed pod costs ~10x its JSON in Python objects; parsing
    it again at scan time costs a few microseconds.
    """
    metadata = as_mapping(obj.get("metadata"))
    slim_meta: dict[str, Any] = {
        "name": metadata.get("name"),
        "namespace": metadata.get("namespace"),
        "uid": metadata.get("uid"),
    }
    annotations = as_mapping(metadata.get("annotations"))
    if annotations:
        slim_meta["annotations"] = {k: v for k, v in annotations.items() if k != _LAST_APPLIED}
    spec: dict[str, Any] = {}
    for key, value in as_mapping(obj.get("spec")).items():
        if key in _DROP_SPEC:
            continue
        if key in ("containers", "initContainers", "ephemeralContainers"):
            value = _slim_containers(value)
        elif key == "volumes" and isinstance(value, list):
            value = [_slim_volume(v) for v in value]
        spec[key] = value
    dumped: bytes = orjson.dumps({"metadata": slim_meta, "spec": spec})
    # Compressed against a dictionary of what every pod spells the same way (keys, the
    # token mount, the mutation's names): ~1,090 -> ~300 bytes a pod, 2.5 us to read back.
    # (It also drops orjson's buffer, which keeps its capacity: 8 KB for 800 bytes.)
    packer = zlib.compressobj(6, zdict=_FACTS_DICTIONARY)
    return packer.compress(dumped) + packer.flush()


def read_facts(facts: bytes) -> dict[str, Any]:
    """The pod of :func:`pod_facts` bytes, as plain JSON data again."""
    pod: dict[str, Any] = orjson.loads(
        zlib.decompressobj(zdict=_FACTS_DICTIONARY).decompress(facts)
    )
    return pod


# --------------------------------------------------------------------------- judging


@dataclass(frozen=True, slots=True)
class Result:
    """One finding on one running object, as a report shows it."""

    kind: str
    namespace: str
    name: str
    uid: str
    rule: str
    action: Action
    # With user-supplied values redacted, as in the audit log.
    message: str
    # The exception of the policy that takes it off ("": none), or that took it off until
    # it expired (with ``expired``).
    exception: str = ""
    expired: str = ""

    @property
    def status(self) -> Status:
        return "skip" if self.exception and not self.expired else _STATUS[self.action]


def scan_view(cluster: ClusterView | None) -> ClusterView | None:
    """The view running pods are judged with: the same, without ResourceQuotas (a running
    pod is already counted in their ``used``). None when unsynced: the spec alone."""
    if cluster is None or not cluster.synced:
        return None
    return replace(cluster, quotas={}, cache=cluster.cache)


def exempt_namespace(namespace: str, policy: Policy) -> bool:
    return bool(policy.exempt_namespaces) and match_any(namespace, policy.exempt_namespaces)


def judge_pod(
    pod: Mapping[str, Any], policy: Policy, *, cluster: ClusterView | None, today: str = ""
) -> tuple[Result, ...]:
    """A running or pending pod's findings under ``policy``, as ``/validate`` would find
    them on its creation now, less what the scheduler and device plugin wrote; what an
    exception takes off (on ``today``) as skipped, and what an expired one no longer does
    with its name. Exceptions by requester cannot be told here (nothing records who
    created a pod): only those by namespace alone apply.

    ``cluster`` is a view from :func:`scan_view` (or None).
    """
    metadata = as_mapping(pod.get("metadata"))
    namespace = str(metadata.get("namespace") or "default")
    if exempt_namespace(namespace, policy):
        return ()
    spec = {k: v for k, v in as_mapping(pod.get("spec")).items() if k != "nodeName"}
    annotations = {
        k: v
        for k, v in as_mapping(metadata.get("annotations")).items()
        if not (isinstance(k, str) and policy.is_reserved_annotation(k))
    }
    obj = {"kind": "Pod", "metadata": {**metadata, "annotations": annotations}, "spec": spec}
    request = Request(kind="Pod", operation="CREATE", namespace=namespace, today=today)
    decision = decide(obj, request, policy, phase="validate", cluster=cluster)
    if not decision.violations and not decision.excepted:
        return ()
    name = str(metadata.get("name") or "")
    uid = str(metadata.get("uid") or "")
    results = [
        Result(
            "Pod",
            namespace,
            name,
            uid,
            violation["rule"],
            violation["action"],
            message,
            *_lapsed(policy, violation["rule"], namespace, today),
        )
        for violation, message in zip(decision.violations, decision.redacted, strict=True)
        if violation["rule"] not in SKIPPED_RULES
    ]
    results.extend(
        Result(
            "Pod",
            namespace,
            name,
            uid,
            e["rule"],
            policy.action(e["rule"]),
            e["message"],
            e["exception"],
        )
        for e in decision.excepted
        if e["rule"] not in SKIPPED_RULES and policy.action(e["rule"]) != "off"
    )
    return tuple(results)


def _lapsed(policy: Policy, rule: str, namespace: str, today: str) -> tuple[str, str]:
    """(name, last day) of an expired exception that would take ``rule`` off here, or
    ("", "")."""
    for exception in policy.exceptions:
        if (
            exception.expires is not None
            and exception.expired(today)
            and exception.scopes(rule, namespace=namespace, username="", groups=())
        ):
            return exception.name, exception.expires
    return "", ""


def guarded_keys(
    data: Mapping[str, str], policy: Policy, kind: Literal["ConfigMap", "Secret"] = "ConfigMap"
) -> list[str]:
    """The keys of a ConfigMap's or Secret's data that the write-time guard
    (:func:`webhook.core.objects.unadmitted_key`) refuses today."""
    return sorted(
        key
        for key, value in data.items()
        if isinstance(key, str) and unadmitted_key(key, value, kind, policy)
    )


def judge_data(
    kind: Literal["ConfigMap", "Secret"],
    namespace: str,
    name: str,
    data: Mapping[str, str],
    policy: Policy,
) -> tuple[Result, ...]:
    """A ConfigMap or Secret written before the write-time guard: a guarded name in its
    data reaches any container that takes it through ``envFrom``."""
    action = policy.action(GUARDED_DATA_RULE)
    if action == "off" or exempt_namespace(namespace, policy):
        return ()
    keys = guarded_keys(data, policy, kind)
    if not keys:
        return ()
    listed = ", ".join(keys)
    return (
        Result(
            kind,
            namespace,
            name,
            "",
            GUARDED_DATA_RULE,
            action,
            f"{kind} {namespace}/{name} holds {listed}: a pod taking it through envFrom "
            "would set what only the GPU stack may set; remove the key",
        ),
    )


def judge_view(cluster: ClusterView, policy: Policy) -> list[Result]:
    """Every ConfigMap and Secret of the view that holds a guarded name."""
    results: list[Result] = []
    for (namespace, name), data in cluster.config_maps.items():
        results.extend(judge_data("ConfigMap", namespace, name, data, policy))
    for (namespace, name), data in cluster.secrets.items():
        results.extend(judge_data("Secret", namespace, name, data, policy))
    return results


def scan(
    pods: Iterable[bytes], policy: Policy, *, cluster: ClusterView | None
) -> list[tuple[Result, ...]]:
    """Judge every pod of :func:`pod_facts` bytes (a full scan; the edge batches it)."""
    view = scan_view(cluster)
    return [judge_pod(read_facts(pod), policy, cluster=view) for pod in pods]


# --------------------------------------------------------------------------- reports

ReportKind = Literal["openreports", "wgpolicyk8s"]
API_VERSIONS: Final[Mapping[ReportKind, tuple[str, str]]] = {
    # (apiVersion, kind): the API Kyverno moved to, and the one Policy Reporter also reads.
    "openreports": ("openreports.io/v1alpha1", "Report"),
    "wgpolicyk8s": ("wgpolicyk8s.io/v1alpha2", "PolicyReport"),
}
REPORT_NAME: Final = "gpushare-webhook"
MANAGED_BY: Final = {"app.kubernetes.io/managed-by": "gpushare-webhook"}
OMITTED: Final = "gpushare.io/omitted-results"
DEFAULT_MAX_RESULTS: Final = 100


class Timestamp(TypedDict):
    seconds: int
    nanos: int


class ObjectReference(TypedDict, total=False):
    apiVersion: str
    kind: str
    namespace: str
    name: str
    uid: str


class ReportResult(TypedDict):
    source: str
    policy: str
    rule: str
    category: str
    severity: str
    result: Status
    scored: bool
    message: str
    timestamp: Timestamp
    resources: list[ObjectReference]
    properties: dict[str, str]


class ReportBody(TypedDict, total=False):
    apiVersion: str
    kind: str
    metadata: dict[str, Any]
    source: str
    configuration: dict[str, Any]
    summary: dict[str, int]
    results: list[ReportResult]


def _reference(result: Result) -> ObjectReference:
    ref: ObjectReference = {
        "apiVersion": "v1",
        "kind": result.kind,
        "namespace": result.namespace,
        "name": result.name,
    }
    if result.uid:
        ref["uid"] = result.uid
    return ref


def order(result: Result) -> tuple[int, str, str, str, str]:
    """Denials first, then by object and rule: what a capped report keeps, and a stable
    order, so an unchanged set of findings gives an unchanged report."""
    rank = _RANK[result.action] + (len(_RANK) if result.status == "skip" else 0)
    return (rank, result.kind, result.name, result.rule, result.message)


def report_body(
    namespace: str,
    results: Sequence[Result],
    *,
    policy: str,
    found: Callable[[Result], int],
    max_results: int = DEFAULT_MAX_RESULTS,
    statuses: Sequence[Status] = STATUSES,
    kind: ReportKind = "openreports",
) -> ReportBody:
    """One namespace's report: its results of ``statuses`` in :func:`order`, at most
    ``max_results`` of them, the summary counting every one (the overflow too).

    ``found`` gives a result's first-seen time (Unix seconds): a result's timestamp
    stays as it was while the finding lasts, so an unchanged scan writes nothing.
    """
    wanted = sorted((r for r in results if r.status in statuses), key=order)
    api_version, report_kind = API_VERSIONS[kind]
    summary = {"pass": 0, "fail": 0, "warn": 0, "error": 0, "skip": 0}
    for result in wanted:
        summary[result.status] += 1
    kept = wanted[:max_results]
    omitted = len(wanted) - len(kept)
    metadata: dict[str, Any] = {"name": REPORT_NAME, "namespace": namespace, "labels": MANAGED_BY}
    if omitted:
        metadata["annotations"] = {OMITTED: str(omitted)}
    body: ReportBody = {"apiVersion": api_version, "kind": report_kind, "metadata": metadata}
    if kind == "openreports":
        body["source"] = SOURCE
        body["configuration"] = {
            "limits": {"maxResults": max_results, "statusFilter": list(statuses)}
        }
    body["summary"] = summary
    body["results"] = [
        {
            "source": SOURCE,
            "policy": policy,
            "rule": result.rule,
            "category": CATEGORY,
            "severity": _SEVERITY[result.action],
            "result": result.status,
            "scored": True,
            "message": result.message,
            "timestamp": {"seconds": found(result), "nanos": 0},
            "resources": [_reference(result)],
            "properties": _properties(result),
        }
        for result in kept
    ]
    return body


def _properties(result: Result) -> dict[str, str]:
    properties: dict[str, str] = {"action": result.action}
    if result.exception and result.expired:
        properties["expiredException"] = f"{result.exception} (expired {result.expired})"
    elif result.exception:
        properties["exception"] = result.exception
    return properties


def same_report(held: Mapping[str, Any], wanted: ReportBody) -> bool:
    """Whether the report the API holds already says what ``wanted`` says (no write)."""
    held_meta = as_mapping(held.get("metadata"))
    wanted_meta = wanted.get("metadata", {})
    omitted = as_mapping(held_meta.get("annotations")).get(OMITTED)
    return (
        held.get("results", []) == wanted.get("results", [])
        and held.get("summary") == wanted.get("summary")
        and held.get("configuration") == wanted.get("configuration")
        and omitted == as_mapping(wanted_meta.get("annotations")).get(OMITTED)
    )
