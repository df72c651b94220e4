"""Where the pod spec lives in each kind of object the webhook admits."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
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

# The same, grouped: the kinds that keep their pod template at each path, in the order
# TEMPLATE_PATHS first names them (renderers write one branch per path, not per kind).
KINDS_BY_PATH: Final[Mapping[tuple[str, ...], tuple[str, ...]]] = {
    path: tuple(kind for kind, at in TEMPLATE_PATHS.items() if at == path)
    for path in dict.fromkeys(TEMPLATE_PATHS.values())
}

_EMPTY: Final[Mapping[str, Any]] = MappingProxyType({})
# For isinstance checks of admitted values: one tuple, not one built per check.
MAPPINGS: Final = (dict, Mapping)


def is_inspected(kind: str) -> bool:
    """Whether the webhook finds a pod in objects of ``kind``: pods and the built-in
    workloads; other kinds' pods (operators' custom resources) are judged as pods."""
    return kind == "Pod" or kind in TEMPLATE_PATHS


def as_mapping(value: Any) -> Mapping[str, Any]:
    """``value`` when it is a mapping, else an empty one: admitted objects can hold anything."""
    # JSON gives dicts, and a missing field None: both answered without
    # ABCMeta.__instancecheck__, which costs six times an isinstance of dict.
    if type(value) is dict:
        return value
    if value is None:
        return _EMPTY
    return value if isinstance(value, Mapping) else _EMPTY


# Not frozen: built per request, and a frozen field costs an object.__setattr__.
@dataclass(slots=True)
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
        if not isinstance(spec, MAPPINGS):
            return None
        return PodView(
            spec=spec,
            metadata=metadata if isinstance(metadata, MAPPINGS) else None,
            spec_pointer="/spec",
            metadata_pointer="/metadata",
            template=False,
        )
    path = TEMPLATE_PATHS.get(kind)
    if path is None:
        return None
    node: Any = obj
    for part in path:
        node = node.get(part) if isinstance(node, MAPPINGS) else None
    if not isinstance(node, MAPPINGS):
        return None
    spec = node.get("spec")
    if not isinstance(spec, MAPPINGS):
        return None
    metadata = node.get("metadata")
    base = "/" + "/".join(path)
    return PodView(
        spec=spec,
        metadata=metadata if isinstance(metadata, MAPPINGS) else None,
        spec_pointer=base + "/spec",
        metadata_pointer=base + "/metadata",
        template=True,
    )
