"""The nodes a pod could land on, summarised once per cluster view and nodeSelector.

A decision asks "does some node have n cards of m MiB?", "do all candidate cards have
the same memory?", "which MIG profiles exist?". Answering from the nodes costs
O(nodes) (milliseconds on 5,000 nodes); a :class:`Pool` answers in O(1) and is
computed once per view object and selector, then kept in the view's cache.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Final

from webhook.core.cluster import ClusterView

# Distinct selectors are few in a real cluster; the bound keeps a flood of made-up
# ones from growing the cache without end.
_MAX_CACHED: Final = 512


@dataclass(frozen=True, slots=True)
class Pool:
    """What the GPU nodes matching one nodeSelector offer."""

    nodes: int = 0
    # depth[k]: the most memory (MiB) per card any one node offers on k+1 cards at once
    # (the (k+1)-th largest card of the best node); len(depth) is the most cards a node has.
    depth: tuple[int, ...] = ()
    cores: int = 0
    sizes: frozenset[int] = frozenset()
    # MIG profile -> (memory MiB of one instance, most instances one node exposes).
    mig: Mapping[str, tuple[int, int]] = field(default_factory=dict)

    @property
    def largest(self) -> int:
        return self.depth[0] if self.depth else 0

    def fits(self, *, gpus: int, memory_mib: int | None, cores: int | None) -> bool:
        if gpus > len(self.depth):
            return False
        if memory_mib is not None and memory_mib > self.depth[gpus - 1]:
            return False
        return cores is None or cores <= self.cores


def _summarise(view: ClusterView, selector: tuple[tuple[str, str], ...]) -> Pool:
    depth: list[int] = []
    sizes: set[int] = set()
    cores = 0
    nodes = 0
    mig: dict[str, tuple[int, int]] = {}
    for node in view.nodes.values():
        labels = node.labels
        if any(labels.get(key) != value for key, value in selector):
            continue
        nodes += 1
        memories = sorted((card.memory_mib for card in node.cards), reverse=True)
        for k, memory in enumerate(memories):
            if k == len(depth):
                depth.append(memory)
            elif memory > depth[k]:
                depth[k] = memory
        sizes.update(memories)
        for card in node.cards:
            cores = max(cores, card.cores)
        for profile, memory in node.mig_profiles.items():
            count = node.allocatable.get(f"nvidia.com/mig-{profile}", 0)
            known = mig.get(profile)
            mig[profile] = (
                memory if known is None else min(known[0], memory),
                count if known is None else max(known[1], count),
            )
    return Pool(nodes=nodes, depth=tuple(depth), cores=cores, sizes=frozenset(sizes), mig=mig)


def pool_of(view: ClusterView, node_selector: Mapping[str, str]) -> Pool:
    """The pool of GPU nodes matching ``node_selector`` in ``view`` (cached in the view)."""
    selector = tuple(sorted(node_selector.items()))
    key = ("pool", selector)
    cache = view.cache
    pool: Pool | None = cache.get(key)
    if pool is None:
        if len(cache) >= _MAX_CACHED:
            cache.clear()
        pool = cache[key] = _summarise(view, selector)
    return pool
