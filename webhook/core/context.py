"""Rules and settings that need the cluster: node fit, referenced env, Pod Security, quotas,
the device classes of the claims a pod takes.

Each reads the :class:`~webhook.core.cluster.ClusterView` the caller hands in and does no
I/O. The caller consults this module only with a synced view: without one the decision
is the pod spec's alone, exactly as if there were no cluster.
"""

from __future__ import annotations

from collections.abc import Collection, Iterator, Mapping
from decimal import Decimal
from typing import Any, Final

from webhook.core import quantity
from webhook.core.cluster import (
    POD_SECURITY_ENFORCE,
    POD_SECURITY_WARN,
    ClusterView,
    quota_resource,
)
from webhook.core.finding import Finding, quoted
from webhook.core.policy import Mode, Policy
from webhook.core.pool import Pool, pool_of
from webhook.core.resources import CONTAINER_KINDS, ContainerRequest, PodRequests, describe
from webhook.core.rules import Subject, Totals, pod_totals, variable_findings
from webhook.core.workload import MAPPINGS, as_mapping

# Pod Security levels that forbid hostIPC (which the mps mutation adds).
_NO_HOST_IPC: Final = frozenset({"baseline", "restricted"})


def candidate_selector(
    spec: Mapping[str, Any], mode: Mode, policy: Policy, *, placed: bool = False
) -> dict[str, str]:
    """The nodeSelector the pod will have once mutated (mps adds the policy's, unless its
    scheduler places it: ``ModeChoice.placed``)."""
    selector = {
        str(k): v for k, v in as_mapping(spec.get("nodeSelector")).items() if isinstance(v, str)
    }
    if mode == "mps" and not placed:
        selector.update(policy.mps_node_selector)
    return selector


def where(selector: Mapping[str, str]) -> str:
    """How a message names the nodes ``selector`` picks."""
    if not selector:
        return "in the cluster"
    shown = ", ".join(f"{k}={v}" for k, v in sorted(selector.items()))
    return f"on nodes matching nodeSelector {shown}"


def resolve_percentages(requests: PodRequests, pool: Pool, *, where: str) -> None:
    """Turn ``gpumem-percentage`` into MiB where every candidate card has one size."""
    if len(pool.sizes) != 1:
        return
    (size,) = pool.sizes
    for request in requests.containers:
        if request.memory_percentage is not None and request.memory_mib is None:
            request.memory_mib = size * request.memory_percentage // 100
            request.notes.append(
                f"{request.label}: {request.memory_percentage}% of memory is "
                f"{request.memory_mib} MiB: every card {where} has {size:,} MiB"
            )


def _fit_findings(request: ContainerRequest, pool: Pool, where: str) -> Iterator[Finding]:
    label = request.label
    if request.shares:
        gpus, memory = request.gpus, request.memory_mib
        if pool.fits(gpus=gpus, memory_mib=memory, cores=request.cores):
            return
        if gpus > len(pool.depth):
            yield Finding(
                "no-fitting-node",
                f"{label}: {gpus} GPUs on one node, but no node {where} has more than "
                f"{len(pool.depth)} cards; ask for at most {len(pool.depth)}",
            )
        elif memory is not None and memory > pool.depth[gpus - 1]:
            most = pool.depth[gpus - 1]
            which = (
                f"the largest card {where} has {most:,} MiB"
                if gpus == 1
                else f"nodes {where} with {gpus} cards have at most {most:,} MiB on each"
            )
            yield Finding(
                "no-fitting-node",
                f"{label}: {memory:,} MiB per GPU fits no card: {which}; ask for at most {most}",
            )
        else:
            yield Finding(
                "no-fitting-node",
                f"{label}: {request.cores}% cores, but cards {where} offer at most {pool.cores}%",
            )
        return
    for resource, count in request.mig.items():
        profile = resource.rpartition("mig-")[2]
        known = pool.mig.get(profile)
        if known is not None and count <= known[1]:
            continue
        if known is not None:
            yield Finding(
                "no-fitting-node",
                f"{label}: {count} x {resource}, but no node {where} exposes more than "
                f"{known[1]}; ask for at most {known[1]}",
            )
            continue
        exists = sorted(pool.mig.items(), key=lambda item: item[1][0])
        largest = f"the largest that exists is {exists[-1][0]}" if exists else "none exist"
        yield Finding(
            "no-fitting-node",
            f"{label}: no node {where} exposes MIG profile {profile}; {largest}",
        )


def no_fitting_node(
    subject: Subject, pool: Pool, where: str, *, judged: Collection[tuple[str, int]] = ()
) -> Iterator[Finding]:
    """GPU requests no candidate node can hold; unjudged when no GPU node is a candidate
    (a pool that scales from zero has none until a pod waits for it). Containers in
    ``judged`` (kind, index) were already judged against a MIG pool's profiles."""
    if pool.nodes == 0:
        return
    for request in subject.requests.containers:
        if (request.kind, request.index) not in judged:
            yield from _fit_findings(request, pool, where)


def pod_security(
    subject: Subject, cluster: ClusterView, namespace: str, notes: list[str]
) -> Iterator[Finding]:
    """An mps pod (the mutation adds hostIPC) where Pod Security would refuse hostIPC.

    ``enforce`` refuses the pod later with a reason that never names GPUs, so it is a
    ``mode-conflict`` now; ``warn`` only warns, so it becomes a warning here too.
    """
    if subject.mode != "mps" or not subject.requests.sharing:
        return
    facts = cluster.namespaces.get(namespace)
    if facts is None:
        return
    enforce = facts.labels.get(POD_SECURITY_ENFORCE, "")
    if enforce in _NO_HOST_IPC:
        yield Finding(
            "mode-conflict",
            f"namespace {namespace} enforces Pod Security {enforce}, which forbids hostIPC; "
            "use a namespace the policy allows for mps",
        )
    elif facts.labels.get(POD_SECURITY_WARN, "") in _NO_HOST_IPC:
        notes.append(
            f"namespace {namespace} warns on Pod Security "
            f"{facts.labels[POD_SECURITY_WARN]}, which forbids the hostIPC mps needs"
        )


def _amount(text: str | None) -> Decimal | None:
    parsed = quantity.parse(text.strip()) if text is not None else None
    return parsed.value if parsed is not None else None


def _pod_need(resource: str, totals: Totals, policy: Policy) -> int | None:
    """What the pod holds of ``resource`` at its peak, in the resource's own unit."""
    if resource in policy.count_resources:
        return totals.gpus
    if resource in policy.memory_mib_resources:
        return totals.memory_mib
    if resource in policy.memory_gib_resources:
        return -(-totals.memory_mib // 1024)
    if resource in policy.cores_resources:
        return totals.cores
    return None


def resource_quotas(
    subject: Subject, policy: Policy, cluster: ClusterView, namespace: str
) -> Iterator[Finding]:
    """``limits.<gpu resource>`` quotas counted as HAMi does (memory and cores per vGPU times
    the vGPU count): Kubernetes counts only ``requests.`` keys of extended resources itself."""
    totals: Totals | None = None
    for quota in cluster.quotas.get(namespace, ()):
        for key, hard_text in quota.hard.items():
            if not key.startswith("limits."):
                continue
            resource = quota_resource(key)
            totals = totals or pod_totals(subject.requests)
            need = _pod_need(resource, totals, policy)
            hard = _amount(hard_text)
            if not need or hard is None:
                continue
            used = _amount(quota.used.get(key)) or Decimal(0)
            left = max(hard - used, Decimal(0))
            if need > left:
                yield Finding(
                    "gpu-quota",
                    f"pod: {need} of {resource} in all, but ResourceQuota {namespace}/{quota.name} "
                    f"leaves {left} of {hard} ({key}); ask for less or raise the quota",
                )


def _referenced(
    container: Mapping[str, Any],
    ref_key: str,
    store: Mapping[tuple[str, str], Mapping[str, str]],
    namespace: str,
) -> Iterator[tuple[str, str, str]]:
    """(variable, value, source) of every variable an ``envFrom`` entry of kind
    ``ref_key`` brings in, the prefix applied. A missing object brings nothing: the
    kubelet refuses to start the container (or skips an optional one)."""
    sources = container.get("envFrom")
    for source in sources if isinstance(sources, list) else ():
        source = as_mapping(source)
        ref = as_mapping(source.get(ref_key))
        name = ref.get("name")
        if not isinstance(name, str):
            continue
        data = store.get((namespace, name))
        if data is None:
            continue
        prefix = source.get("prefix")
        prefix = prefix if isinstance(prefix, str) else ""
        kind = "ConfigMap" if ref_key == "configMapRef" else "Secret"
        for key, value in data.items():
            yield prefix + key, value, f" (from {kind} {name})"


def referenced_env(
    subject: Subject, policy: Policy, cluster: ClusterView, namespace: str
) -> Iterator[Finding]:
    """``envFrom`` values judged by the inline env rules. A ``valueFrom`` reference is
    refused as it stands, whatever it holds today: the kubelet reads it again at every
    container start, after the ConfigMap may have changed."""
    gpu = subject.requests.gpu
    stores: list[tuple[str, Mapping[tuple[str, str], Mapping[str, str]]]] = []
    if policy.config_map_env:
        stores.append(("configMapRef", cluster.config_maps))
    if policy.secret_env:
        stores.append(("secretRef", cluster.secrets))
    spec = subject.view.spec
    for kind in CONTAINER_KINDS:
        containers = spec.get(kind)
        for container in containers if isinstance(containers, list) else ():
            container = as_mapping(container)
            if not isinstance(container.get("envFrom"), list):
                continue
            name = container.get("name")
            label = describe(kind, name if isinstance(name, str) else "")
            for ref_key, store in stores:
                for variable, value, source in _referenced(container, ref_key, store, namespace):
                    yield from variable_findings(
                        label, variable, value, gpu=gpu, policy=policy, source=source
                    )


def _claim_sources(entry: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """(kind, name) of what a pod's ``resourceClaims`` entry names: v1's fields, or the
    ``source`` object they sat in before Kubernetes 1.31."""
    for where in (entry, as_mapping(entry.get("source"))):
        for field, kind in (
            ("resourceClaimName", "ResourceClaim"),
            ("resourceClaimTemplateName", "ResourceClaimTemplate"),
        ):
            name = where.get(field)
            if isinstance(name, str) and name:
                yield kind, name


def claimed_gpus(
    subject: Subject, policy: Policy, cluster: ClusterView, namespace: str
) -> Iterator[Finding]:
    """gpu-claim: a pod with GPU-sharing resources that also takes a claim the view shows
    on one of the policy's GPU device classes: whole GPUs beside the slices, outside the
    sharing ledger. A claim the view does not hold (or one on another class: the NVIDIA
    DRA driver's IMEX channel of a ComputeDomain, a NIC) is no GPU claim for all the
    decision knows; the claim or template itself was judged when it was written."""
    if not subject.requests.sharing or not policy.gpu_device_classes:
        return
    entries = subject.view.spec.get("resourceClaims")
    stores = {
        "ResourceClaim": cluster.resource_claims,
        "ResourceClaimTemplate": cluster.claim_templates,
    }
    for entry in entries if isinstance(entries, list) else ():
        if not isinstance(entry, MAPPINGS):
            continue
        for kind, name in _claim_sources(entry):
            classes = stores[kind].get((namespace, name), ())
            for device_class in classes:
                if device_class in policy.gpu_device_classes:
                    yield Finding(
                        "gpu-claim",
                        f"a pod with GPU-sharing resources also takes {kind} {quoted(name)} on "
                        f"device class {quoted(device_class)}: whole GPUs the sharing "
                        "scheduler never counts; ask for GPUs one way: the sharing resources "
                        "or a claim",
                    )


def judge(
    subject: Subject,
    policy: Policy,
    cluster: ClusterView,
    *,
    namespace: str,
    notes: list[str],
    judged: Collection[tuple[str, int]] = (),
) -> list[Finding]:
    """Every cluster-aware finding about a new pod or template (a synced ``cluster``);
    ``judged`` as for :func:`no_fitting_node`."""
    if not subject.created:
        return []
    findings: list[Finding] = []
    if policy.config_map_env or policy.secret_env:
        findings.extend(referenced_env(subject, policy, cluster, namespace))
    if not subject.requests.gpu:
        return findings
    findings.extend(claimed_gpus(subject, policy, cluster, namespace))
    findings.extend(pod_security(subject, cluster, namespace, notes))
    findings.extend(resource_quotas(subject, policy, cluster, namespace))
    selector = candidate_selector(subject.view.spec, subject.mode, policy)
    pool = pool_of(cluster, selector)
    findings.extend(no_fitting_node(subject, pool, where(selector), judged=judged))
    return findings
