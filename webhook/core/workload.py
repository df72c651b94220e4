"""Where the pod spec lives in each kind of object the webhook admits."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

# JSON Pointer segments from the object root to its pod template, per kind.
TEMPLATE_PATHS: Final[Mapping[str, tuple[str, ...]]] = {
    "Deployment": ("spec", "template"),
    "StatefulSet": ("spec", "template"),
    "DaemonSet": ("spec", "template"),
    "ReplicaSet": ("spec", "template"),
    "ReplicationController": ("spec", "template"),
    "Job": ("spec", "template"),
    "CronJob": ("spec", "jobTemplate", "spec", "template"),
}


def as_mapping(value: Any) -> Mapping[str, Any]:
    """``value`` when it is a mapping, else an empty one: admitted objects can hold anything."""
    # (dict, Mapping): isinstance tries dict first, in C; Mapping alone goes through
    # ABCMeta.__instancecheck__, six times slower, and this runs for every env entry.
    return value if isinstance(value, (dict, Mapping)) else {}


@dataclass(frozen=True, slots=True)
class PodView:
    """A pod spec and its metadata inside an admitted object, with their JSON Pointers."""

    spec: Mapping[str, Any]
    metadata: Mapping[str, Any] | None
    spec_pointer: str
    metadata_pointer: str
    template: bool


def find_pod(obj: Mapping[str, Any], kind: str) -> PodView | None:
    """The pod (or pod template) of ``obj``, or None for kinds without one."""
    if kind == "Pod":
        spec = obj.get("spec")
        metadata = obj.get("metadata")
        if not isinstance(spec, (dict, Mapping)):
            return None
        return PodView(
            spec=spec,
            metadata=metadata if isinstance(metadata, (dict, Mapping)) else None,
            spec_pointer="/spec",
            metadata_pointer="/metadata",
            template=False,
        )
    path = TEMPLATE_PATHS.get(kind)
    if path is None:
        return None
    node: Any = obj
    for part in path:
        node = node.get(part) if isinstance(node, (dict, Mapping)) else None
    if not isinstance(node, (dict, Mapping)):
        return None
    spec = node.get("spec")
    if not isinstance(spec, (dict, Mapping)):
        return None
    metadata = node.get("metadata")
    base = "/" + "/".join(path)
    return PodView(
        spec=spec,
        metadata=metadata if isinstance(metadata, (dict, Mapping)) else None,
        spec_pointer=base + "/spec",
        metadata_pointer=base + "/metadata",
        template=True,
    )
