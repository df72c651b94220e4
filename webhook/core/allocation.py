"""Who holds which GPU slice: per node and card, from Node and Pod objects as plain dicts.

The cards of a node come from what the device plugin publishes: HAMi's registration
annotation ``hami.io/node-nvidia-register`` (JSON, or the older ``id,count,devmem,...:``
form), else NVIDIA GPU feature discovery labels (``nvidia.com/gpu.count``, ``.memory``,
``.product``), else ACK's capacity (``aliyun.com/gpu-count``, ``aliyun.com/gpu-mem``).
What a pod holds comes from the scheduler's annotations: HAMi's per-container device
lists (``uuid,type,usedmem,usedcores:`` joined by ``;``) and MIG placements, or ACK's
card index ``ALIYUN_COM_GPU_MEM_IDX``. A pod bound to a node with GPU requests but no
such annotation holds its request on the node, unassigned to a card. Pods that
finished (Succeeded, Failed) hold nothing.

The JSON document ``gpushare-webhook inspect -o json`` prints is :class:`InventoryDoc`.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, Final, Literal, TypedDict

from webhook.core import cluster
from webhook.core.mode import choose_mode
from webhook.core.policy import Mode, Policy
from webhook.core.resources import ContainerRequest, read_pod
from webhook.core.workload import as_mapping

ALLOCATED_ANNOTATION: Final = "hami.io/vgpu-devices-allocated"
TO_ALLOCATE_ANNOTATION: Final = "hami.io/vgpu-devices-to-allocate"
ASSIGNED_NODE_ANNOTATION: Final = "hami.io/vgpu-node"
MIG_ALLOCATIONS_ANNOTATION: Final = "hami.io/vgpu-mig-allocations"
ACK_CARD_ANNOTATION: Final = "ALIYUN_COM_GPU_MEM_IDX"
ACK_MEMORY_RESOURCE: Final = "aliyun.com/gpu-mem"
ACK_COUNT_RESOURCE: Final = "aliyun.com/gpu-count"
ACK_MODEL_LABEL: Final = "aliyun.accelerator/nvidia_name"
TERMINATED_PHASES: Final = frozenset({"Succeeded", "Failed"})

# HAMi's device modes (the registration's "mode") in this project's words.
_DEVICE_MODES: Final[Mapping[str, Mode]] = {"hami-core": "vgpu", "mps": "mps", "mig": "mig"}
# Legacy HAMi MIG device ids carry the template and slot: "GPU-<uuid>[1-3]".
_LEGACY_MIG_SUFFIX: Final = re.compile(r"\[\d+-\d+\]$")

Source = Literal["hami", "gfd", "ack", "none"]


# -- the model --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class MigProfile:
    """A MIG profile a card or node exposes, and how many instances of it are held."""

    name: str
    memory_mib: int | None
    total: int
    used: int = 0


@dataclass(frozen=True, slots=True)
class Holder:
    """One pod's share of one card, or of its node when no card is assigned."""

    namespace: str
    name: str
    mode: Mode
    memory_mib: int | None  # None: a whole GPU of unknown memory
    cores: int
    gpus: int = 1
    mig_profiles: tuple[str, ...] = ()

    @property
    def pod(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class CardAllocation:
    """One physical GPU and what is held on it."""

    index: int
    uuid: str
    model: str
    mode: Mode | None  # None: the node does not say how it is shared
    memory_mib: int
    cores: int = 100
    slots: int = 0  # how many pods may share it (HAMi's split count); 0 when unknown
    healthy: bool = True
    registered: bool = True  # False: a pod names a card its node does not report
    mig: tuple[MigProfile, ...] = ()
    holders: tuple[Holder, ...] = ()

    @property
    def allocated_memory_mib(self) -> int:
        return sum(h.memory_mib or 0 for h in self.holders)

    @property
    def allocated_cores(self) -> int:
        return sum(h.cores for h in self.holders)


@dataclass(frozen=True, slots=True)
class NodeAllocation:
    name: str
    source: Source
    cards: tuple[CardAllocation, ...] = ()
    unassigned: tuple[Holder, ...] = ()
    mig: tuple[MigProfile, ...] = ()  # MIG resources the node advertises (device-plugin MIG)

    @property
    def memory_mib(self) -> int:
        return sum(c.memory_mib for c in self.cards)

    @property
    def allocated_memory_mib(self) -> int:
        on_cards = sum(c.allocated_memory_mib for c in self.cards)
        return on_cards + sum(h.memory_mib or 0 for h in self.unassigned)

    @property
    def cores(self) -> int:
        return sum(c.cores for c in self.cards)

    @property
    def allocated_cores(self) -> int:
        on_cards = sum(c.allocated_cores for c in self.cards)
        return on_cards + sum(h.cores for h in self.unassigned)

    @property
    def pods(self) -> int:
        names = {h.pod for c in self.cards for h in c.holders}
        return len(names | {h.pod for h in self.unassigned})


# -- the JSON document (-o json) ---------------------------------------------------------


class MigProfileDoc(TypedDict):
    profile: str
    memoryMiB: int | None
    total: int
    used: int


class HolderDoc(TypedDict):
    namespace: str
    name: str
    mode: str
    memoryMiB: int | None
    cores: int
    gpus: int
    migProfiles: list[str]


class CardDoc(TypedDict):
    index: int
    uuid: str
    model: str
    mode: str | None
    memoryMiB: int
    allocatedMemoryMiB: int
    cores: int
    allocatedCores: int
    slots: int
    healthy: bool
    registered: bool
    mig: list[MigProfileDoc]
    pods: list[HolderDoc]


class TotalsDoc(TypedDict):
    gpus: int
    memoryMiB: int
    allocatedMemoryMiB: int
    cores: int
    allocatedCores: int
    pods: int


class NodeDoc(TypedDict):
    name: str
    source: Source
    gpus: list[CardDoc]
    unassigned: list[HolderDoc]
    mig: list[MigProfileDoc]
    totals: TotalsDoc


class InventoryDoc(TypedDict):
    apiVersion: str
    kind: str
    nodes: list[NodeDoc]


INVENTORY_API_VERSION: Final = "gpushare.io/v1alpha1"
INVENTORY_KIND: Final = "GPUInventory"


def _mig_doc(profile: MigProfile) -> MigProfileDoc:
    return {
        "profile": profile.name,
        "memoryMiB": profile.memory_mib,
        "total": profile.total,
        "used": profile.used,
    }


def _holder_doc(holder: Holder) -> HolderDoc:
    return {
        "namespace": holder.namespace,
        "name": holder.name,
        "mode": holder.mode,
        "memoryMiB": holder.memory_mib,
        "cores": holder.cores,
        "gpus": holder.gpus,
        "migProfiles": list(holder.mig_profiles),
    }


def _card_doc(card: CardAllocation) -> CardDoc:
    return {
        "index": card.index,
        "uuid": card.uuid,
        "model": card.model,
        "mode": card.mode,
        "memoryMiB": card.memory_mib,
        "allocatedMemoryMiB": card.allocated_memory_mib,
        "cores": card.cores,
        "allocatedCores": card.allocated_cores,
        "slots": card.slots,
        "healthy": card.healthy,
        "registered": card.registered,
        "mig": [_mig_doc(p) for p in card.mig],
        "pods": [_holder_doc(h) for h in card.holders],
    }


def to_document(nodes: Iterable[NodeAllocation]) -> InventoryDoc:
    """The JSON document of an inventory: stable keys, nodes and cards in order."""
    return {
        "apiVersion": INVENTORY_API_VERSION,
        "kind": INVENTORY_KIND,
        "nodes": [
            {
                "name": node.name,
                "source": node.source,
                "gpus": [_card_doc(c) for c in node.cards],
                "unassigned": [_holder_doc(h) for h in node.unassigned],
                "mig": [_mig_doc(p) for p in node.mig],
                "totals": {
                    "gpus": len(node.cards),
                    "memoryMiB": node.memory_mib,
                    "allocatedMemoryMiB": node.allocated_memory_mib,
                    "cores": node.cores,
                    "allocatedCores": node.allocated_cores,
                    "pods": node.pods,
                },
            }
            for node in nodes
        ],
    }


# -- reading nodes -----------------------------------------------------------------------


def _int(raw: Any, default: int | None = None) -> int | None:
    """A non-negative integer from JSON or an annotation field; ``default`` otherwise."""
    if isinstance(raw, bool):
        return default
    if isinstance(raw, int):
        return raw if raw >= 0 else default
    if isinstance(raw, str) and raw.strip().isascii() and raw.strip().isdigit():
        return int(raw.strip())
    return default


@dataclass(frozen=True, slots=True)
class _Identity:
    """What names a registered card, beside the facts :func:`cluster.hami_cards` reads."""

    uuid: str
    index: int
    mode: Mode | None
    placements: Mapping[str, int]  # MIG profile -> how many positions it can take


def _identities(text: str) -> list[_Identity]:
    """Id, index, mode and MIG placements of each card of HAMi's registration, in the
    order :func:`cluster.hami_cards` returns the cards."""
    text = text.strip()
    found: list[_Identity] = []
    if text.startswith("["):
        for position, device in enumerate(json.loads(text)):
            profiles = device.get("migProfiles")
            found.append(
                _Identity(
                    uuid=str(device.get("id") or ""),
                    # HAMi omits a zero index (omitempty); older plugins wrote none.
                    index=_int(device.get("index"), position) or 0,
                    mode=_DEVICE_MODES.get(str(device.get("mode") or "hami-core")),
                    placements={
                        str(p.get("name")): len(p.get("placements") or ())
                        for p in (profiles if isinstance(profiles, list) else ())
                        if isinstance(p, dict)
                    },
                )
            )
        return found
    for position, entry in enumerate(e for e in text.split(":") if e):
        fields = entry.split(",")
        index = _int(fields[7], position) if len(fields) == 9 else position
        mode = fields[8] if len(fields) == 9 else "hami-core"
        found.append(_Identity(fields[0], index or 0, _DEVICE_MODES.get(mode), {}))
    return found


def _node_mode(labels: Mapping[str, Any], policy: Policy) -> Mode | None:
    """The mode the policy maps the node's labels to (e.g. ``ack.node.gpu.schedule: mps``)."""
    for selector in policy.node_selector_modes:
        if str(labels.get(selector.key, "\0")) == selector.value:
            return selector.mode
    return None


def _registered(
    facts: cluster.NodeFacts, annotations: Mapping[str, Any]
) -> list[CardAllocation] | None:
    """The node's cards as HAMi registered them; None when HAMi did not."""
    raw = annotations.get(cluster.HAMI_REGISTER)
    cards = cluster.hami_cards(raw) if isinstance(raw, str) else None
    if not cards or not isinstance(raw, str):
        return None
    result = []
    for card, identity in zip(cards, _identities(raw), strict=True):
        mig = tuple(
            MigProfile(name, memory or None, identity.placements.get(name, 0))
            for name, memory in card.mig_profiles
        )
        result.append(
            CardAllocation(
                index=identity.index,
                uuid=identity.uuid,
                model=card.product,
                mode=identity.mode,
                memory_mib=card.memory_mib,
                cores=card.cores,
                slots=card.splits,
                healthy=card.healthy,
                mig=mig,
            )
        )
    return sorted(result, key=lambda c: c.index)


def _ack_cards(facts: cluster.NodeFacts, mode: Mode | None) -> list[CardAllocation]:
    """Cards from ACK's shared-GPU capacity: card count and total memory in GiB."""
    count = facts.allocatable.get(ACK_COUNT_RESOURCE, 0)
    memory_gib = facts.allocatable.get(ACK_MEMORY_RESOURCE, 0)
    if not count or not memory_gib:
        return []
    model = facts.labels.get(ACK_MODEL_LABEL, "")
    per_card = memory_gib * 1024 // count
    return [CardAllocation(i, "", model, mode, memory_mib=per_card) for i in range(count)]


@dataclass(slots=True)
class _NodeDraft:
    name: str
    source: Source
    cards: list[CardAllocation]
    mig: list[MigProfile]
    holders: dict[int, list[Holder]] = field(default_factory=dict)
    unregistered: dict[str, tuple[str, list[Holder]]] = field(default_factory=dict)
    unassigned: list[Holder] = field(default_factory=list)


def _read_node(node: Mapping[str, Any], policy: Policy) -> _NodeDraft | None:
    """The cards and MIG resources of a node; None for a node with no GPU at all."""
    facts = cluster.node_facts(node)
    if facts is None or not facts.name:
        return None
    annotations = as_mapping(as_mapping(node.get("metadata")).get("annotations"))
    mode = _node_mode(facts.labels, policy)
    source: Source = "hami"
    cards = _registered(facts, annotations)
    if cards is None:
        source = "gfd"
        cards = [
            CardAllocation(i, "", card.product, mode, memory_mib=card.memory_mib)
            for i, card in enumerate(facts.cards)
        ]
    if not cards:
        cards = _ack_cards(facts, mode)
        source = "ack" if cards else "none"
    mig = [
        MigProfile(profile, memory, facts.allocatable[cluster.MIG_PREFIX + profile])
        for profile, memory in sorted(facts.mig_profiles.items())
    ]
    return _NodeDraft(facts.name, source, cards, mig)


# -- reading pods ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Device:
    uuid: str
    model: str
    memory_mib: int
    cores: int
    container: int
    position: int


def pod_devices(annotation: str) -> tuple[_Device, ...]:
    """HAMi's per-container device list: containers joined by ``;``, devices by ``:``,
    ``uuid,type,usedmem,usedcores`` each. Malformed entries are skipped."""
    devices: list[_Device] = []
    for container, entry in enumerate(annotation.split(";")):
        for position, item in enumerate(d for d in entry.split(":") if d):
            fields = item.split(",")
            if len(fields) < 4:
                continue
            memory, cores = _int(fields[2].strip()), _int(fields[3].strip())
            if memory is None or cores is None or not fields[0]:
                continue
            uuid = _LEGACY_MIG_SUFFIX.sub("", fields[0].strip())
            devices.append(_Device(uuid, fields[1], memory, cores, container, position))
    return tuple(devices)


def _mig_placements(annotation: Any) -> dict[tuple[int, int], str]:
    """HAMi's MIG reservations: (container index, device index) -> profile."""
    if not isinstance(annotation, str) or not annotation.strip():
        return {}
    try:
        entries = json.loads(annotation)
    except ValueError:
        return {}
    found: dict[tuple[int, int], str] = {}
    for entry in entries if isinstance(entries, list) else ():
        if not isinstance(entry, dict) or not isinstance(entry.get("profile"), str):
            continue
        container, device = _int(entry.get("containerIndex")), _int(entry.get("deviceIndex"))
        if container is not None and device is not None:
            found[container, device] = entry["profile"]
    return found


def _effective(
    requests: Sequence[ContainerRequest], *, card_mib: int | None
) -> tuple[int, int | None, int, list[str]]:
    """GPUs, memory (MiB, all GPUs together), cores (percent, summed over GPUs) and MIG
    instances a pod holds while it runs: its containers and sidecars together, or its
    largest init container if that asks for more (init containers run one at a time,
    before the others). ``card_mib`` is the memory of the node's cards when they are
    all alike: a whole GPU or a percentage of one is known in MiB only then."""
    running = [r for r in requests if r.kind == "containers" or r.sidecar]
    init = [r for r in requests if r.kind == "initContainers" and not r.sidecar]
    best = max(init, key=lambda r: r.gpus, default=None)
    chosen = running if best is None or sum(r.gpus for r in running) >= best.gpus else [best]
    gpus = sum(r.gpus for r in chosen)
    memory: int | None = 0
    cores = 0
    for r in chosen:
        if not r.gpus:
            continue
        whole = r.memory_mib is None and r.memory_percentage is None
        # A GPU asked for without memory or cores is the whole card (HAMi does the same).
        cores += (100 if whole and r.cores is None else r.cores or 0) * r.gpus
        if r.memory_mib is not None:
            per_gpu: int | None = r.memory_mib
        elif card_mib is None:
            per_gpu = None
        else:
            per_gpu = card_mib * (r.memory_percentage or 100) // 100
        memory = None if memory is None or per_gpu is None else memory + per_gpu * r.gpus
    mig = [
        name.removeprefix(cluster.MIG_PREFIX)
        for r in chosen
        for name, count in sorted(r.mig.items())
        for _ in range(count)
    ]
    return gpus, memory, cores, mig


def _pod_mode(pod: Mapping[str, Any], requests: Any, namespace: str, policy: Policy) -> Mode:
    metadata = as_mapping(pod.get("metadata"))
    spec = as_mapping(pod.get("spec"))
    choice = choose_mode(
        annotations=as_mapping(metadata.get("annotations")),
        node_selector=as_mapping(spec.get("nodeSelector")),
        namespace=namespace,
        requests=requests,
        policy=policy,
    )
    return choice.mode


def _place_pod(pod: Mapping[str, Any], nodes: dict[str, _NodeDraft], policy: Policy) -> None:
    metadata = as_mapping(pod.get("metadata"))
    spec = as_mapping(pod.get("spec"))
    status = as_mapping(pod.get("status"))
    if status.get("phase") in TERMINATED_PHASES:
        return
    annotations = as_mapping(metadata.get("annotations"))
    node_name = spec.get("nodeName") or annotations.get(ASSIGNED_NODE_ANNOTATION)
    if not isinstance(node_name, str) or not node_name:
        return  # pending: holds nothing yet
    namespace = str(metadata.get("namespace") or "default")
    name = str(metadata.get("name") or "")
    node = nodes.get(node_name)
    if node is None:
        node = nodes[node_name] = _NodeDraft(node_name, "none", [], [])
    requests = read_pod(spec, policy)
    raw = annotations.get(ALLOCATED_ANNOTATION) or annotations.get(TO_ALLOCATE_ANNOTATION)
    devices = pod_devices(raw) if isinstance(raw, str) else ()
    if devices:
        _place_devices(node, devices, annotations, namespace=namespace, name=name)
        return
    if not requests.gpu:
        return
    mode = _pod_mode(pod, requests, namespace, policy)
    sizes = {c.memory_mib for c in node.cards}
    card_mib = next(iter(sizes)) if len(sizes) == 1 else None
    gpus, memory, cores, mig = _effective(requests.containers, card_mib=card_mib)
    by_card = _ack_card(annotations, node)
    holder = Holder(
        namespace,
        name,
        "mig" if mig else mode,
        memory_mib=None if mig else memory,
        cores=0 if mig else cores,
        gpus=0 if mig else gpus,
        mig_profiles=tuple(mig),
    )
    if by_card is not None:
        node.holders.setdefault(by_card, []).append(holder)
    else:
        node.unassigned.append(holder)


def _ack_card(annotations: Mapping[str, Any], node: _NodeDraft) -> int | None:
    """The card ACK's GPU-share scheduler chose (one card per pod), if the node has it."""
    index = _int(annotations.get(ACK_CARD_ANNOTATION))
    if index is None or not any(c.index == index for c in node.cards):
        return None
    return index


def _place_devices(
    node: _NodeDraft,
    devices: Sequence[_Device],
    annotations: Mapping[str, Any],
    *,
    namespace: str,
    name: str,
) -> None:
    """One holder per card the pod's containers use, their shares summed."""
    placements = _mig_placements(annotations.get(MIG_ALLOCATIONS_ANNOTATION))
    by_uuid = {c.uuid: c for c in node.cards if c.uuid}
    shares: dict[str, list[_Device]] = {}
    for device in devices:
        shares.setdefault(device.uuid, []).append(device)
    for uuid, held in shares.items():
        card = by_uuid.get(uuid)
        mode: Mode = (card.mode if card else None) or "vgpu"
        profiles = tuple(
            placements[d.container, d.position]
            for d in held
            if (d.container, d.position) in placements
        )
        if profiles:
            mode = "mig"
        holder = Holder(
            namespace,
            name,
            mode,
            memory_mib=sum(d.memory_mib for d in held),
            cores=sum(d.cores for d in held),
            gpus=len(held),
            mig_profiles=profiles,
        )
        if card is not None:
            node.holders.setdefault(card.index, []).append(holder)
        else:
            _, holders = node.unregistered.setdefault(uuid, (held[0].model, []))
            holders.append(holder)


def _with_use(profiles: Iterable[MigProfile], held: Iterable[str]) -> tuple[MigProfile, ...]:
    counts: dict[str, int] = {}
    for profile in held:
        counts[profile] = counts.get(profile, 0) + 1
    known = [MigProfile(p.name, p.memory_mib, p.total, counts.pop(p.name, 0)) for p in profiles]
    # Held but not advertised (the node's status lags, or the layout changed): still shown.
    known += [MigProfile(n, None, 0, c) for n, c in sorted(counts.items())]
    return tuple(known)


def _finish(draft: _NodeDraft) -> NodeAllocation:
    cards = []
    for card in draft.cards:
        holders = tuple(draft.holders.get(card.index, ()))
        mig = card.mig
        if mig or card.mode == "mig":
            mig = _with_use(mig, (p for h in holders for p in h.mig_profiles))
        cards.append(replace(card, mig=mig, holders=holders))
    next_index = max((c.index for c in cards), default=-1) + 1
    for offset, (uuid, (model, held)) in enumerate(sorted(draft.unregistered.items())):
        cards.append(
            CardAllocation(
                index=next_index + offset,
                uuid=uuid,
                model=model,
                mode=None,
                memory_mib=0,
                cores=0,
                healthy=False,
                registered=False,
                holders=tuple(held),
            )
        )
    held_on_node = [p for h in draft.unassigned for p in h.mig_profiles]
    node_mig = _with_use(draft.mig, held_on_node) if draft.mig or held_on_node else ()
    return NodeAllocation(
        name=draft.name,
        source=draft.source,
        cards=tuple(cards),
        unassigned=tuple(draft.unassigned),
        mig=node_mig,
    )


def allocations(
    nodes: Iterable[Mapping[str, Any]],
    pods: Iterable[Mapping[str, Any]],
    policy: Policy,
    *,
    node_name: str | None = None,
) -> tuple[NodeAllocation, ...]:
    """Per node (by name) that has GPUs or GPU pods: its cards and who holds what.

    ``policy`` names the GPU resources and chooses the mode of pods the scheduler
    left no device annotation on. ``node_name`` keeps that node only.
    """
    drafts: dict[str, _NodeDraft] = {}
    for node in nodes:
        draft = _read_node(node, policy)
        if draft is not None:
            drafts[draft.name] = draft
    for pod in pods:
        _place_pod(pod, drafts, policy)
    kept = [
        _finish(d) for name, d in sorted(drafts.items()) if (node_name is None or name == node_name)
    ]
    return tuple(kept)
