"""The cluster as the decisions see it: facts read from Nodes, Namespaces, quotas, ConfigMaps.

Plain data only. The watching edge (:mod:`webhook.cluster`) turns each watched object into
facts with the functions here and keeps them in per-kind dicts; ``review --cluster`` builds
a view from a snapshot file with :func:`view_from_objects`. Either way the core receives a
:class:`ClusterView` and never does I/O.

A view object is treated as a snapshot: aggregates the decisions need (largest card,
card sizes per nodeSelector) are computed once per view object and cached in it. Whoever
changes the dicts behind a view hands out a new :class:`ClusterView` over them (a cheap
wrapper) so that the next decision recomputes; facts that compare equal to the ones held
need no new view, which keeps node heartbeats from invalidating anything.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any, Final

from webhook.core import quantity
from webhook.core.objects import claim_classes
from webhook.core.workload import as_mapping

# HAMi's device plugin registers each node's cards here (pkg/device/nvidia RegisterAnnos).
HAMI_REGISTER: Final = "hami.io/node-nvidia-register"
# NVIDIA GPU Feature Discovery labels: memory is MiB per card.
GFD_MEMORY: Final = "nvidia.com/gpu.memory"
GFD_COUNT: Final = "nvidia.com/gpu.count"
GFD_PRODUCT: Final = "nvidia.com/gpu.product"
GFD_MIG_STRATEGY: Final = "nvidia.com/mig.strategy"
POD_SECURITY_ENFORCE: Final = "pod-security.kubernetes.io/enforce"
POD_SECURITY_WARN: Final = "pod-security.kubernetes.io/warn"
MIG_PREFIX: Final = "nvidia.com/mig-"

# Extended resources that carry GPU capacity or GPU quota; everything else on a node
# (cpu, memory, pods, hugepages) is of no interest to a GPU decision.
_GPU_RESOURCE: Final = re.compile(
    r"(?:nvidia\.com/(?:gpu|mig-|vgpu)|aliyun\.com/gpu|volcano\.sh/(?:vgpu|gpu-)|hami\.io/|"
    r"nvidia\.com/gpumem|nvidia\.com/gpucores|nvidia\.com/priority)"
)
_QUOTA_SCOPE: Final = re.compile(r"(?:limits\.|requests\.)?(?P<resource>.*)")
# A MIG profile name: "1g.10gb", "1c.3g.20gb", "2g.20gb+me".
_MIG_PROFILE: Final = re.compile(r"(?:[0-9]+c\.)?[0-9]+g\.(?P<gb>[0-9]+)gb(?:\+[a-z]+)?")
# MIG instances are smaller than their nominal size (1g.10gb is 9,728 MiB): 950 MiB per
# nominal GB stays under every measured profile, so a translated request never overflows.
_MIB_PER_NOMINAL_GB: Final = 950


@dataclass(frozen=True, slots=True)
class Card:
    """One physical GPU as the cluster reports it."""

    memory_mib: int
    cores: int = 100
    product: str = ""
    # How many vGPUs HAMi splits the card into (its device-split-count); 1 without HAMi.
    splits: int = 1
    healthy: bool = True
    # MIG profiles the card can be cut into, with their memory in MiB, when HAMi says.
    mig_profiles: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True, slots=True)
class NodeFacts:
    name: str
    labels: Mapping[str, str]
    cards: tuple[Card, ...]
    allocatable: Mapping[str, int]
    unschedulable: bool = False

    @property
    def mig_profiles(self) -> dict[str, int]:
        """MIG profiles the node exposes as resources, with each one's memory in MiB."""
        exposed: dict[str, int] = {}
        for resource, count in self.allocatable.items():
            if count > 0 and resource.startswith(MIG_PREFIX):
                profile = resource[len(MIG_PREFIX) :]
                memory = mig_memory_mib(profile, labels=self.labels, cards=self.cards)
                if memory is not None:
                    exposed[profile] = memory
        return exposed


@dataclass(frozen=True, slots=True)
class NamespaceFacts:
    name: str
    labels: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class QuotaFacts:
    namespace: str
    name: str
    hard: Mapping[str, str]
    used: Mapping[str, str]


@dataclass(frozen=True, slots=True)
class ClusterView:
    """What the decisions know of the cluster; ``synced`` False means "know nothing yet"."""

    nodes: Mapping[str, NodeFacts] = field(default_factory=dict)
    namespaces: Mapping[str, NamespaceFacts] = field(default_factory=dict)
    # By namespace.
    quotas: Mapping[str, tuple[QuotaFacts, ...]] = field(default_factory=dict)
    # (namespace, name) -> data
    config_maps: Mapping[tuple[str, str], Mapping[str, str]] = field(default_factory=dict)
    # (namespace, name) -> decoded data; filled only when the policy opts in.
    secrets: Mapping[tuple[str, str], Mapping[str, str]] = field(default_factory=dict)
    # (namespace, name) -> the device classes a ResourceClaim / ResourceClaimTemplate
    # asks for (claim_facts): what a pod naming one in spec.resourceClaims gets.
    resource_claims: Mapping[tuple[str, str], tuple[str, ...]] = field(default_factory=dict)
    claim_templates: Mapping[tuple[str, str], tuple[str, ...]] = field(default_factory=dict)
    synced: bool = False
    # Aggregates of ``nodes`` (webhook.core.pool), by the key of whoever computed them.
    # Not part of the view's value. A view built on the very same ``nodes`` mapping may
    # be handed its predecessor's cache: a quota or namespace change then costs no
    # recomputation over thousands of nodes.
    cache: dict[Any, Any] = field(default_factory=dict, repr=False, compare=False, hash=False)


def is_gpu_resource(name: str) -> bool:
    """An extended resource that carries GPU capacity (``nvidia.com/gpu``, ``nvidia.com/mig-*``...)."""
    return _GPU_RESOURCE.match(name) is not None


def _strings(raw: Any) -> dict[str, str]:
    return {str(k): v for k, v in as_mapping(raw).items() if isinstance(v, str)}


def _count(raw: Any) -> int | None:
    """A non-negative integer quantity, or None."""
    if type(raw) is int:
        return raw if raw >= 0 else None
    if not isinstance(raw, str):
        return None
    if raw.isascii() and raw.isdigit():
        return int(raw)
    parsed = quantity.parse(raw)
    if parsed is None or parsed.value < 0 or parsed.value != parsed.value.to_integral_value():
        return None
    # Bounded before int(): a huge exponent must not cost a request anything.
    return int(parsed.value) if parsed.value < Decimal(1 << 62) else None


def mig_memory_mib(
    profile: str, *, labels: Mapping[str, str] | None = None, cards: Iterable[Card] = ()
) -> int | None:
    """The memory of one MIG instance of ``profile`` (e.g. ``1g.10gb``) in MiB.

    Exact when HAMi's registration or GFD's mixed-strategy label
    (``nvidia.com/mig-1g.10gb.memory``) says; else a lower bound from the nominal size.
    None when ``profile`` is not a MIG profile name.
    """
    match = _MIG_PROFILE.fullmatch(profile)
    if match is None:
        return None
    for card in cards:
        for name, memory in card.mig_profiles:
            if name == profile and memory > 0:
                return memory
    labelled = _count((labels or {}).get(f"{MIG_PREFIX}{profile}.memory"))
    if labelled:
        return labelled
    return int(match.group("gb")) * _MIB_PER_NOMINAL_GB


def _hami_json_cards(text: str) -> tuple[Card, ...] | None:
    try:
        devices = json.loads(text)
    except ValueError:
        return None
    if not isinstance(devices, list):
        return None
    cards = []
    for device in devices:
        if not isinstance(device, dict):
            return None
        memory = device.get("devmem")
        if type(memory) is not int or memory <= 0:
            return None
        cores = device.get("devcore")
        splits = device.get("count")
        profiles = tuple(
            (p["name"], p["memoryMB"] if type(p.get("memoryMB")) is int else 0)
            for p in device.get("migProfiles") or ()
            if isinstance(p, dict) and isinstance(p.get("name"), str)
        )
        cards.append(
            Card(
                memory_mib=memory,
                cores=cores if type(cores) is int and cores > 0 else 100,
                product=str(device.get("type") or ""),
                splits=splits if type(splits) is int and splits > 0 else 1,
                # Go's omitempty drops a false health: absent means unhealthy.
                healthy=device.get("health") is True,
                mig_profiles=profiles,
            )
        )
    return tuple(cards)


def _hami_legacy_cards(text: str) -> tuple[Card, ...] | None:
    """HAMi's older encoding: ``id,count,devmem,devcore,type,numa,health[,index,mode]:`` per card."""
    cards = []
    for entry in text.split(":"):
        if not entry:
            continue
        items = entry.split(",")
        if len(items) not in (7, 9):
            return None
        splits, memory, cores = (_count(items[i]) for i in (1, 2, 3))
        if memory is None or memory <= 0:
            return None
        cards.append(
            Card(
                memory_mib=memory,
                cores=cores or 100,
                product=items[4],
                splits=splits or 1,
                healthy=items[6].strip().lower() in ("true", "1", "t"),
            )
        )
    return tuple(cards) or None


def hami_cards(text: str) -> tuple[Card, ...] | None:
    """Cards from HAMi's node registration annotation (JSON, or the older colon form)."""
    text = text.strip()
    if text.startswith("["):
        return _hami_json_cards(text)
    return _hami_legacy_cards(text)


def _gfd_cards(labels: Mapping[str, str]) -> tuple[Card, ...]:
    memory = _count(labels.get(GFD_MEMORY))
    count = _count(labels.get(GFD_COUNT))
    if not memory or not count:
        return ()
    product = labels.get(GFD_PRODUCT, "")
    return (Card(memory_mib=memory, product=product),) * min(count, 64)


def node_facts(obj: Mapping[str, Any]) -> NodeFacts | None:
    """The GPU facts of a Node object; None for a node with no GPU at all."""
    metadata = as_mapping(obj.get("metadata"))
    labels = _strings(metadata.get("labels"))
    annotations = as_mapping(metadata.get("annotations"))
    registered = annotations.get(HAMI_REGISTER)
    cards = hami_cards(registered) if isinstance(registered, str) else None
    if not cards:
        cards = _gfd_cards(labels)
    status = as_mapping(obj.get("status"))
    allocatable: dict[str, int] = {}
    for resource, raw in as_mapping(status.get("allocatable")).items():
        if isinstance(resource, str) and is_gpu_resource(resource):
            value = _count(raw)
            if value is not None:
                allocatable[resource] = value
    if not cards and not any(allocatable.values()):
        return None
    return NodeFacts(
        name=str(metadata.get("name") or ""),
        labels=labels,
        cards=cards,
        allocatable=allocatable,
        unschedulable=as_mapping(obj.get("spec")).get("unschedulable") is True,
    )


def namespace_facts(obj: Mapping[str, Any]) -> NamespaceFacts:
    metadata = as_mapping(obj.get("metadata"))
    return NamespaceFacts(
        name=str(metadata.get("name") or ""), labels=_strings(metadata.get("labels"))
    )


def quota_resource(key: str) -> str:
    """The resource a quota key limits: ``limits.nvidia.com/gpumem`` -> ``nvidia.com/gpumem``."""
    match = _QUOTA_SCOPE.fullmatch(key)
    return match.group("resource") if match is not None else key


def quota_facts(obj: Mapping[str, Any]) -> QuotaFacts | None:
    """The GPU part of a ResourceQuota; None when it limits no GPU resource."""
    spec_hard = as_mapping(as_mapping(obj.get("spec")).get("hard"))
    status = as_mapping(obj.get("status"))
    hard = {
        str(k): str(v)
        for k, v in spec_hard.items()
        if is_gpu_resource(quota_resource(str(k))) and isinstance(v, str | int)
    }
    if not hard:
        return None
    used = {
        str(k): str(v)
        for k, v in as_mapping(status.get("used")).items()
        if k in hard and isinstance(v, str | int)
    }
    metadata = as_mapping(obj.get("metadata"))
    return QuotaFacts(
        namespace=str(metadata.get("namespace") or "default"),
        name=str(metadata.get("name") or ""),
        hard=hard,
        used=used,
    )


def config_map_data(obj: Mapping[str, Any]) -> Mapping[str, str]:
    """The string data of a ConfigMap (``binaryData`` never reaches env vars)."""
    return _strings(obj.get("data"))


def secret_data(obj: Mapping[str, Any]) -> Mapping[str, str]:
    """A Secret's values, base64-decoded; ``stringData`` (as written in files) wins."""
    decoded: dict[str, str] = {}
    for key, raw in as_mapping(obj.get("data")).items():
        if not isinstance(raw, str):
            continue
        try:
            decoded[str(key)] = base64.b64decode(raw, validate=True).decode("utf-8", "replace")
        except (binascii.Error, ValueError):
            continue
    decoded.update(_strings(obj.get("stringData")))
    return decoded


def claim_facts(obj: Mapping[str, Any]) -> tuple[str, ...]:
    """The device classes a ResourceClaim or ResourceClaimTemplate asks for, sorted: all
    a pod decision needs of it (a pod may not mix a GPU claim with sharing resources)."""
    spec = as_mapping(obj.get("spec"))
    if obj.get("kind") == "ResourceClaimTemplate":
        spec = as_mapping(spec.get("spec"))
    return tuple(sorted(set(claim_classes(spec))))


def _flatten(objects: Iterable[Any]) -> Iterable[Mapping[str, Any]]:
    for obj in objects:
        if not isinstance(obj, Mapping):
            continue
        if str(obj.get("kind", "")).endswith("List") and isinstance(obj.get("items"), list):
            yield from _flatten(obj["items"])
        else:
            yield obj


def view_from_objects(
    objects: Iterable[Mapping[str, Any]], *, synced: bool = True, secrets: bool = False
) -> ClusterView:
    """A view of a snapshot: Nodes, Namespaces, ResourceQuotas, ConfigMaps, Secrets,
    ResourceClaims and ResourceClaimTemplates (a List too).

    Secrets are kept only with ``secrets=True``, as the policy must opt in to read them.
    """
    nodes: dict[str, NodeFacts] = {}
    namespaces: dict[str, NamespaceFacts] = {}
    quotas: dict[str, list[QuotaFacts]] = {}
    config_maps: dict[tuple[str, str], Mapping[str, str]] = {}
    secret_values: dict[tuple[str, str], Mapping[str, str]] = {}
    claims: dict[str, dict[tuple[str, str], tuple[str, ...]]] = {
        "ResourceClaim": {},
        "ResourceClaimTemplate": {},
    }
    for obj in _flatten(objects):
        kind = obj.get("kind")
        metadata = as_mapping(obj.get("metadata"))
        key = (str(metadata.get("namespace") or "default"), str(metadata.get("name") or ""))
        if kind == "Node":
            facts = node_facts(obj)
            if facts is not None:
                nodes[facts.name] = facts
        elif kind == "Namespace":
            namespace = namespace_facts(obj)
            namespaces[namespace.name] = namespace
        elif kind == "ResourceQuota":
            quota = quota_facts(obj)
            if quota is not None:
                quotas.setdefault(key[0], []).append(quota)
        elif kind == "ConfigMap":
            config_maps[key] = config_map_data(obj)
        elif kind == "Secret" and secrets:
            secret_values[key] = secret_data(obj)
        elif kind in claims:
            claims[str(kind)][key] = claim_facts(obj)
    return ClusterView(
        nodes=nodes,
        namespaces=namespaces,
        quotas={namespace: tuple(items) for namespace, items in quotas.items()},
        config_maps=config_maps,
        secrets=secret_values,
        resource_claims=claims["ResourceClaim"],
        claim_templates=claims["ResourceClaimTemplate"],
        synced=synced,
    )
