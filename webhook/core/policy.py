"""GPUSharePolicy: schema validation with line numbers, and the compiled form.

The compiled :class:`Policy` is immutable and holds precomputed lookup sets so the
decision core never re-reads the YAML tree per request. This module takes text or a
mapping; reading policy files is :mod:`webhook.policies`' job.
"""

from __future__ import annotations

import copy
import datetime
import fnmatch
import hashlib
import json
import posixpath
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Final, Literal, cast

import jsonschema
import yaml

from webhook.core.env import CONTAINER_CLASSES, DEVICE_PINS, ContainerClass, channel_of

if TYPE_CHECKING:
    from webhook.core.resources import PodRequests

API_VERSION: Final = "gpushare.io/v1alpha1"
KIND: Final = "GPUSharePolicy"
# The extended resources DRA serves from a DeviceClass (DRAExtendedResource): a pod that
# asks for deviceclass.resource.kubernetes.io/gpu.nvidia.com gets a claim on that class.
DEVICE_CLASS_RESOURCE: Final = "deviceclass.resource.kubernetes.io/"

RULE_IDS: Final = (
    "privileged-gpu",
    "node-name-pinning",
    "raw-visible-devices",
    "host-device-access",
    "limit-tampering",
    "invalid-gpu-request",
    "mode-conflict",
    "gpu-quota",
    "scheduler-bypass",
    "forged-allocation",
    "gpu-claim",
    "unmutated-gpu-pod",
    "no-fitting-node",
)
# What an exception may take off. Not invalid-gpu-request, mode-conflict nor
# unmutated-gpu-pod: a request the core cannot read or a mode it cannot honour gets no
# limits from the mutation, and a pod without them runs uncapped; fix the workload.
EXCEPTABLE_RULES: Final = tuple(
    r for r in RULE_IDS if r not in ("invalid-gpu-request", "mode-conflict", "unmutated-gpu-pod")
)
MODES: Final = ("vgpu", "mps", "mig")
# The modes whose pods get a scheduler: MIG pods keep theirs (every scheduler counts
# MIG instances, plain extended resources).
SCHEDULED_MODES: Final = ("vgpu", "mps")
# The cluster's own scheduler: a pod without a schedulerName gets it.
DEFAULT_SCHEDULER: Final = "default-scheduler"
ACTIONS: Final = ("deny", "warn", "audit", "off")

Action = Literal["deny", "warn", "audit", "off"]
Mode = Literal["vgpu", "mps", "mig", "none"]

_STRINGS = {"type": "array", "items": {"type": "string", "minLength": 1}}
_ABS_PATH = {"type": "string", "pattern": "^/"}
_IDENTITY_PROPERTIES: dict[str, Any] = {
    "users": _STRINGS,
    "groups": _STRINGS,
    # namespace/name, globs allowed
    "serviceAccounts": {"type": "array", "items": {"type": "string", "pattern": "^[^/]+/[^/]+$"}},
}
_IDENTITIES = {"type": "object", "additionalProperties": False, "properties": _IDENTITY_PROPERTIES}
# One rule's exception, Kyverno's PolicyException: scoped by namespace and requester only,
# never by a label or annotation, which the pod's author writes.
_EXCEPTION = {
    "type": "object",
    "additionalProperties": False,
    "required": ["name", "rules", "reason", "owner"],
    "properties": {
        "name": {"type": "string", "pattern": "^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$"},
        "rules": {"type": "array", "minItems": 1, "items": {"enum": list(EXCEPTABLE_RULES)}},
        "namespaces": _STRINGS,
        **_IDENTITY_PROPERTIES,
        "reason": {"type": "string", "pattern": "\\S"},
        "owner": {"type": "string", "pattern": "\\S"},
        # The last day (UTC) it applies.
        "expires": {"type": "string", "pattern": "^[0-9]{4}-[0-9]{2}-[0-9]{2}$"},
    },
}
_MAXIMA = {
    "type": "object",
    "additionalProperties": False,
    "properties": {
        "gpus": {"type": "integer", "minimum": 1},
        "memoryMiB": {"type": "integer", "minimum": 1},
        "cores": {"type": "integer", "minimum": 1},
    },
}
# Node labels: key and value (a value of otherPools may be a glob).
_LABELS: Final = {
    "type": "array",
    "items": {
        "type": "object",
        "additionalProperties": False,
        "required": ["key", "value"],
        "properties": {"key": {"type": "string", "minLength": 1}, "value": {"type": "string"}},
    },
}

SCHEMA: Final[dict[str, Any]] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "additionalProperties": False,
    "required": ["apiVersion", "kind"],
    "properties": {
        "apiVersion": {"const": API_VERSION},
        "kind": {"const": KIND},
        "metadata": {"type": "object"},
        "spec": {
            "type": "object",
            "additionalProperties": False,
            "properties": {
                # One scheduler for every GPU-sharing pod, or
                # {default: ..., <mode>: ..., <resource>: ...}.
                "schedulerName": {
                    "type": ["string", "object"],
                    "minLength": 1,
                    "additionalProperties": {"type": "string", "minLength": 1},
                },
                "allowedSchedulers": _STRINGS,
                "onError": {"enum": ["deny", "allow"]},
                "resources": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": dict.fromkeys(
                        (
                            "count",
                            "memoryMiB",
                            "memoryGiB",
                            "memoryPercentage",
                            "cores",
                            "priority",
                            "migPrefixes",
                        ),
                        _STRINGS,
                    ),
                },
                "modes": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "default": {"enum": [*MODES, "none"]},
                        "annotations": _STRINGS,
                        "dynamicMigAnnotations": _STRINGS,
                        "nodeSelectors": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "additionalProperties": False,
                                "required": ["key", "value", "mode"],
                                "properties": {
                                    "key": {"type": "string", "minLength": 1},
                                    "value": {"type": "string"},
                                    "mode": {"enum": list(MODES)},
                                },
                            },
                        },
                        "namespaces": {
                            "type": "object",
                            "propertyNames": {"enum": list(MODES)},
                            "additionalProperties": _STRINGS,
                        },
                        "allowedNamespaces": {
                            "type": "object",
                            "propertyNames": {"enum": list(MODES)},
                            "additionalProperties": _STRINGS,
                        },
                    },
                },
                "vgpu": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "preload": {"enum": ["env", "file"]},
                        "libraryHostPath": _ABS_PATH,
                        "preloadHostPath": _ABS_PATH,
                        "lockHostPath": _ABS_PATH,
                        "coreUtilizationPolicy": {"enum": ["default", "force"]},
                        "allowDisableCoreUtilizationPolicy": {"type": "boolean"},
                        "withoutLibrary": _STRINGS,
                        # Accepted from older policies and ignored: every container that
                        # asks for no GPU now gets NVIDIA_VISIBLE_DEVICES=void.
                        "hideDevicesFromOtherContainers": {"type": "boolean"},
                    },
                },
                "wholeGpus": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "resources": _STRINGS,
                        "sharingPool": _LABELS,
                        "otherPools": _LABELS,
                        "draResources": _STRINGS,
                    },
                },
                "mps": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "pipeDirectory": _ABS_PATH,
                        "nodeSelector": {
                            "type": "object",
                            "additionalProperties": {"type": "string"},
                        },
                        "placedByAnnotations": _STRINGS,
                    },
                },
                "rules": {
                    "type": "object",
                    "propertyNames": {"enum": list(RULE_IDS)},
                    "additionalProperties": {"enum": list(ACTIONS)},
                },
                "cluster": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "configMapEnv": {"type": "boolean"},
                        "secretEnv": {"type": "boolean"},
                    },
                },
                # Node pools cut into MIG instances (with the cluster view).
                "mig": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "pools": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "additionalProperties": False,
                                "required": ["nodeSelector"],
                                "properties": {
                                    "nodeSelector": {
                                        "type": "object",
                                        "additionalProperties": {"type": "string"},
                                    },
                                    "translate": {"type": "boolean"},
                                },
                            },
                        },
                    },
                },
                "reservedAnnotations": _STRINGS,
                "reservedAnnotationWriters": _IDENTITIES,
                "ledgers": {
                    "type": "array",
                    "items": {
                        "type": "object",
                        "additionalProperties": False,
                        "required": ["name", "annotations", "writers"],
                        "properties": {
                            "name": {"type": "string", "minLength": 1},
                            "annotations": _STRINGS,
                            "configMaps": _STRINGS,
                            "visibleDevicesFrom": {
                                "type": "object",
                                "additionalProperties": False,
                                "required": [
                                    "schedulerName",
                                    "nameAnnotation",
                                    "requestAnnotations",
                                ],
                                "properties": {
                                    "schedulerName": {"type": "string", "minLength": 1},
                                    "nameAnnotation": {"type": "string", "minLength": 1},
                                    "requestAnnotations": _STRINGS,
                                    "containerAnnotation": {"type": "string", "minLength": 1},
                                },
                            },
                            "writers": _IDENTITIES,
                        },
                    },
                },
                # The env channel: what a container may set of the names the node's GPU
                # stack reads (webhook.core.env.channel_of); everything else is refused.
                "env": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "allowed": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "additionalProperties": False,
                                "required": ["name"],
                                "properties": {
                                    "name": {
                                        "type": "string",
                                        "pattern": "^[A-Za-z_][A-Za-z0-9_]*[*]?$",
                                    },
                                    "values": {"type": "array", "items": {"type": "string"}},
                                    "items": _STRINGS,
                                    "itemPattern": {"type": "string", "minLength": 1},
                                    "containers": {
                                        "type": "array",
                                        "minItems": 1,
                                        "items": {"enum": ["slice", "whole", "none"]},
                                    },
                                },
                            },
                        },
                    },
                },
                "runtimeClasses": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {"gpu": _STRINGS},
                },
                "dra": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "deviceClasses": _STRINGS,
                        "allowedNamespaces": _STRINGS,
                        # driver -> the opaque parameters a claim may give it, each exactly.
                        "claimConfigs": {
                            "type": "object",
                            "propertyNames": {"minLength": 1},
                            "additionalProperties": {"type": "array", "items": {"type": "object"}},
                        },
                    },
                },
                "containerPaths": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {"protected": {"type": "array", "items": _ABS_PATH}},
                },
                "runtimeAnnotations": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "allowedDevices": {"type": "array", "items": _ABS_PATH},
                        "refusedPrefixes": _STRINGS,
                    },
                },
                "hostPaths": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "mode": {"enum": ["denylist", "allowlist"]},
                        "allowed": {"type": "array", "items": _ABS_PATH},
                        "protected": {"type": "array", "items": _ABS_PATH},
                        "driverRoots": {"type": "array", "items": _ABS_PATH},
                    },
                },
                "exemptions": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {
                        "namespaces": _STRINGS,
                        **_IDENTITY_PROPERTIES,
                    },
                },
                "limits": {
                    "type": "object",
                    "additionalProperties": False,
                    "properties": {"perContainer": _MAXIMA, "perPod": _MAXIMA},
                },
                "exceptions": {"type": "array", "items": _EXCEPTION},
            },
        },
    },
}
_VALIDATOR = jsonschema.Draft202012Validator(SCHEMA)


class PolicyError(Exception):
    """A policy that cannot be used. ``errors`` holds one line per problem."""

    def __init__(self, source: str, errors: list[str]) -> None:
        self.source = source
        self.errors = errors
        super().__init__(f"{source}: invalid policy: " + "; ".join(errors))


@dataclass(frozen=True, slots=True)
class NodeSelectorMode:
    key: str
    value: str
    mode: Mode


@dataclass(frozen=True, slots=True)
class MigPool:
    """Nodes cut into MIG instances: those matching ``node_selector``.

    With ``translate`` a pod that selects them and asks for GPU memory gets the smallest
    MIG instance that holds it; without, it is told which one to ask for.
    """

    node_selector: Mapping[str, str]
    translate: bool = True

    def selected_by(self, node_selector: Mapping[str, Any]) -> bool:
        """A pod with ``node_selector`` can only land on this pool's nodes."""
        return all(node_selector.get(k) == v for k, v in self.node_selector.items())


@dataclass(frozen=True, slots=True)
class Maxima:
    gpus: int | None = None
    memory_mib: int | None = None
    cores: int | None = None


_SERVICE_ACCOUNT: Final = "system:serviceaccount:"


@dataclass(frozen=True, slots=True)
class DevicesFrom:
    """Pods whose NVIDIA_VISIBLE_DEVICES a ledger's writers put in a ConfigMap of theirs
    (KAI's fractional GPUs): scheduled by ``scheduler_name``, asking with one of
    ``request_annotations``, the ConfigMap named by ``name_annotation``."""

    scheduler_name: str
    name_annotation: str
    request_annotations: tuple[str, ...]
    # The annotation naming the one container the writers serve (KAI's
    # gpu-fraction-container-name); without it, or without this, the first container.
    container_annotation: str | None = None


@dataclass(frozen=True, slots=True)
class Ledger:
    """Annotations one scheduler and its device plugin keep (globs), the ConfigMaps its
    binder writes per pod (name globs), and who writes them."""

    name: str
    annotations: tuple[str, ...]
    writers: Identities
    config_maps: tuple[str, ...] = ()
    devices_from: DevicesFrom | None = None
    # annotations as one compiled pattern: a glob match per key and pattern (fnmatch)
    # costs microseconds on every request.
    pattern: re.Pattern[str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        globs = [fnmatch.translate(p) for p in self.annotations] or ["(?!)"]
        object.__setattr__(self, "pattern", re.compile("|".join(globs)))

    def reserves(self, key: str) -> bool:
        return self.pattern.match(key) is not None


@dataclass(frozen=True, slots=True)
class Identities:
    """Users, groups and service accounts (``namespace/name`` globs) a policy names."""

    users: frozenset[str] = frozenset()
    groups: frozenset[str] = frozenset()
    service_accounts: tuple[str, ...] = ()

    def match(self, username: str, groups: Iterable[str]) -> bool:
        if username in self.users or self.groups.intersection(groups):
            return True
        if self.service_accounts and username.startswith(_SERVICE_ACCOUNT):
            namespace, _, name = username[len(_SERVICE_ACCOUNT) :].partition(":")
            return match_any(f"{namespace}/{name}", self.service_accounts)
        return False


@dataclass(frozen=True, slots=True)
class PolicyException:
    """One rule (or a few) off for some namespaces or requesters, with why and whose.

    Namespaces and requesters both narrow it: in a namespace it names (any, when it
    names none) and from a requester it names (any, when it names none).
    """

    name: str
    rules: frozenset[str]
    namespaces: tuple[str, ...]
    requesters: Identities
    reason: str
    owner: str
    # The last day it applies, ISO (YYYY-MM-DD, UTC); None: no end.
    expires: str | None = None

    def expired(self, today: str) -> bool:
        """Past its last day. Without a date to compare (``today`` empty) an exception
        that has an end is taken as past it: an exception only ever loosens."""
        return self.expires is not None and (not today or today > self.expires)

    def covers(
        self, rule: str, *, namespace: str, username: str, groups: Iterable[str], today: str
    ) -> bool:
        """It takes ``rule`` off for this request on ``today``."""
        return not self.expired(today) and self.scopes(
            rule, namespace=namespace, username=username, groups=groups
        )

    def scopes(self, rule: str, *, namespace: str, username: str, groups: Iterable[str]) -> bool:
        """It names ``rule`` for this request, whatever the day."""
        if rule not in self.rules:
            return False
        if self.namespaces and not match_any(namespace, self.namespaces):
            return False
        who = self.requesters
        named = bool(who.users or who.groups or who.service_accounts)
        return not named or who.match(username, groups)


@dataclass(frozen=True, slots=True)
class EnvAllowance:
    """One entry of env.allowed: a name (``NAME`` or ``PREFIX*``), what values it may
    have, and in which containers."""

    name: str
    # Exact values admitted; None: any value, valueFrom included.
    values: tuple[str, ...] | None = None
    # Admitted items of a comma-separated list (the toolkit's NVIDIA_DRIVER_CAPABILITIES:
    # items are trimmed, empty ones skipped); None: values decides.
    items: frozenset[str] | None = None
    # Items of a comma-separated list that match this (a whole item, in the narrow
    # regular-expression subset item_pattern_problem admits, which no RE2 and Python
    # read differently and which cannot match a comma, blank or tab); None: items decides.
    item_pattern: str | None = None
    containers: frozenset[ContainerClass] = frozenset(CONTAINER_CLASSES)

    @property
    def prefix(self) -> bool:
        return self.name.endswith("*")

    def names(self, name: str) -> bool:
        return name.startswith(self.name[:-1]) if self.prefix else name == self.name

    def admits(self, value: str | None) -> bool:
        """``value`` (None: from valueFrom or with $(VAR) references) is admitted."""
        if self.values is None and self.items is None and self.item_pattern is None:
            return True
        if value is None:
            return False
        if self.values is not None:
            return value in self.values
        items = self.items or frozenset()
        pattern = self.item_pattern
        # Blanks and tabs only: the toolkit trims more, and an odd space refused is safe.
        return all(
            not (word := item.strip(" \t"))
            or word in items
            or (pattern is not None and re.fullmatch(pattern, word) is not None)
            for item in value.split(",")
        )


@dataclass(frozen=True, slots=True)
class Policy:
    """A validated policy, compiled for fast lookups."""

    name: str
    digest: str
    # The scheduler of GPU-sharing pods, the resources another scheduler accounts for
    # (the policy's sharing resources only, in policy order) and the modes whose pods
    # go to another scheduler: see scheduler_for.
    scheduler_name: str
    resource_schedulers: Mapping[str, str]
    mode_schedulers: Mapping[str, str]
    allowed_schedulers: frozenset[str]
    on_error: Literal["deny", "allow"]
    count_resources: frozenset[str]
    memory_mib_resources: frozenset[str]
    memory_gib_resources: frozenset[str]
    memory_percentage_resources: frozenset[str]
    cores_resources: frozenset[str]
    priority_resources: frozenset[str]
    mig_prefixes: tuple[str, ...]
    default_mode: Mode
    mode_annotations: tuple[str, ...]
    # Mode annotations whose value mig means the scheduler's dynamic MIG (HAMi, Volcano):
    # the pod asks for memory and the scheduler places it on a MIG instance it cuts.
    dynamic_mig_annotations: frozenset[str]
    node_selector_modes: tuple[NodeSelectorMode, ...]
    namespace_modes: Mapping[str, tuple[str, ...]]
    allowed_namespaces: Mapping[str, tuple[str, ...]]
    preload: Literal["env", "file"]
    library_host_path: str
    preload_host_path: str
    lock_host_path: str
    # Sharing resources whose nodes enforce a slice without HAMi-core (vgpu.withoutLibrary).
    without_library: frozenset[str]
    core_utilization_policy: Literal["default", "force"]
    allow_disable_core_utilization_policy: bool
    mps_pipe_directory: str
    mps_node_selector: Mapping[str, str]
    # Mode annotations whose scheduler places an mps pod by the card's mode itself
    # (HAMi's nvidia.com/vgpu-mode): a pod named mps by one gets no mps_node_selector.
    mps_placed_annotations: frozenset[str]
    # Count resources that ask for whole GPUs (wholeGpus.resources), and the node labels
    # (key, value) that mark the nodes sharing GPUs: a pod asking only for whole GPUs
    # that names a scheduler of its own keeps it, away from those nodes.
    whole_gpu_resources: frozenset[str]
    sharing_pool: tuple[tuple[str, str], ...]
    # Node labels (key, value glob) of pools whose whole GPUs another stack serves (MIG's
    # single strategy serves instances as nvidia.com/gpu), and the whole-GPU resources a
    # DeviceClass serves through DRA (extendedResourceName): a pod that asks only for
    # whole GPUs there keeps its scheduler, the default one too, away from the pool.
    other_pools: tuple[tuple[str, str], ...]
    dra_resources: frozenset[str]
    actions: Mapping[str, Action]
    # Every reserved annotation glob (each ledger's), and the ledgers that reserve them.
    reserved_annotations: tuple[str, ...]
    ledgers: tuple[Ledger, ...]
    exempt_namespaces: tuple[str, ...]
    exempt: Identities
    host_path_mode: Literal["denylist", "allowlist"]
    allowed_host_paths: tuple[str, ...]
    protected_host_paths: tuple[str, ...]
    # Where the node's NVIDIA driver is installed (normalised): written, in any pod, it
    # changes what every GPU container on the node runs (host-device-access).
    driver_roots: tuple[str, ...]
    container_maxima: Maxima
    pod_maxima: Maxima
    spec: Mapping[str, Any] = field(repr=False, compare=False)
    gpu_resources: frozenset[str] = field(init=False, repr=False, compare=False)
    # Resources that ask for memory in MiB or GiB: a container may name only one.
    memory_resources: frozenset[str] = field(init=False, repr=False, compare=False)
    # reserved_annotations as one compiled pattern: a glob match per key and pattern
    # (fnmatch) costs microseconds on every request.
    reserved_pattern: re.Pattern[str] = field(init=False, repr=False, compare=False)
    # What each of reserved_annotations starts with before its first wildcard.
    reserved_prefixes: tuple[str, ...] = field(init=False, repr=False, compare=False)
    # With a cluster view: judge env that pods take from ConfigMaps / Secrets.
    config_map_env: bool = False
    secret_env: bool = False
    exceptions: tuple[PolicyException, ...] = ()
    mig_pools: tuple[MigPool, ...] = ()
    # Dynamic Resource Allocation: the device classes that hand out whole GPUs, and the
    # namespaces that may claim them (gpu-claim).
    gpu_device_classes: tuple[str, ...] = ()
    claim_namespaces: tuple[str, ...] = ()
    # driver -> the opaque claim parameters it may be given (dra.claimConfigs); a driver
    # not listed is not judged.
    claim_configs: Mapping[str, tuple[Mapping[str, Any], ...]] = field(default_factory=dict)
    # Paths inside containers that the node's GPU stack reads, besides the built-in ones
    # (containerPaths.protected, normalised).
    container_paths: tuple[str, ...] = ()
    # Host devices CRI-O's devices annotation may name (runtimeAnnotations.allowedDevices),
    # and annotation key prefixes refused besides CDI's and CRI-O's (refusedPrefixes).
    annotation_devices: frozenset[str] = frozenset()
    refused_annotation_prefixes: tuple[str, ...] = ()
    # RuntimeClasses whose handler runs the NVIDIA runtime: a container under one that
    # asks for no GPU gets NVIDIA_VISIBLE_DEVICES=void (host-device-access without it).
    gpu_runtime_classes: frozenset[str] = frozenset()
    # (deviceclass.resource.kubernetes.io/<class>, class) of each GPU device class: the
    # extended resource DRA serves the class under (DRAExtendedResource).
    gpu_class_resources: tuple[tuple[str, str], ...] = field(init=False, repr=False, compare=False)
    # env.allowed: what the env channel admits (env_admits).
    env_allowances: tuple[EnvAllowance, ...] = ()
    # (name, value) of each env.DEVICE_PINS entry a slice container gets pinned: those the
    # policy does not admit in slices with any value.
    device_pins: tuple[tuple[str, str], ...] = field(init=False, repr=False, compare=False)
    # The host files every vGPU or MPS pod of a node shares (the library, the preload
    # file, the MPS pipe directory), normalised: no pod may mount one writable.
    shared_host_paths: frozenset[str] = field(init=False, repr=False, compare=False)
    # The count resource each slice resource implies when asked for alone (implied_count).
    implied_counts: Mapping[str, str] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(
            self,
            "gpu_resources",
            self.count_resources
            | self.memory_mib_resources
            | self.memory_gib_resources
            | self.memory_percentage_resources
            | self.cores_resources
            | self.priority_resources,
        )
        object.__setattr__(
            self, "memory_resources", self.memory_mib_resources | self.memory_gib_resources
        )
        globs = [fnmatch.translate(p) for p in self.reserved_annotations] or ["(?!)"]
        object.__setattr__(self, "reserved_pattern", re.compile("|".join(globs)))
        object.__setattr__(
            self,
            "reserved_prefixes",
            tuple(re.split(r"[*?\[]", p, maxsplit=1)[0] for p in self.reserved_annotations),
        )
        self._class_resources()
        object.__setattr__(self, "implied_counts", self._implied_counts())
        pins = tuple(
            (name, value)
            for name, value in DEVICE_PINS.items()
            if not self.env_admits(name, None, "slice")
        )
        object.__setattr__(self, "device_pins", pins)
        shared = (self.library_host_path, self.preload_host_path, self.mps_pipe_directory)
        object.__setattr__(self, "shared_host_paths", frozenset(map(normalised, shared)))

    def _class_resources(self) -> None:
        object.__setattr__(
            self,
            "gpu_class_resources",
            tuple((DEVICE_CLASS_RESOURCE + c, c) for c in self.gpu_device_classes),
        )

    def _implied_counts(self) -> dict[str, str]:
        """Each slice resource's count resource, as HAMi's webhook adds ``nvidia.com/gpu``
        to a container asking only for memory or cores: the first count (by name) of its
        vendor domain and family, the count's name up to its first ``-`` beginning the
        slice's (``nvidia.com/gpu``: ``gpumem``, ``gpucores``; ``volcano.sh/vgpu-number``:
        ``vgpu-memory``). Volcano's older ``volcano.sh/gpu-memory`` is of no family: its
        plugin counts memory, not cards, and its nodes lack ``vgpu-number``. A priority
        rides with the slices: its domain's count."""
        implied: dict[str, str] = {}
        slices = self.gpu_resources - self.count_resources
        for resource in sorted(r for r in slices if not r.startswith(self.mig_prefixes)):
            domain, _, name = resource.partition("/")
            for count in sorted(self.count_resources):
                count_domain, _, count_name = count.partition("/")
                if count_domain == domain and (
                    resource in self.priority_resources
                    or name.startswith(count_name.split("-", 1)[0])
                ):
                    implied[resource] = count
                    break
        return implied

    def action(self, rule: str) -> Action:
        return self.actions[rule]

    def library_for(self, requests: PodRequests) -> bool:
        """A vgpu pod of these requests gets HAMi-core: some sharing resource it asks for is
        served by nodes that have it (not all are in ``without_library``)."""
        if not self.without_library:
            return True
        for request in requests.containers:
            for resource in request.sharing_resources:
                if resource not in self.without_library:
                    return True
        return False

    def scheduler_for(self, requests: PodRequests, *, mode: Mode) -> str:
        """The scheduler that accounts for the shared GPUs of a pod in ``mode``.

        A resource's scheduler when every sharing resource the pod asks for is listed
        for that one scheduler; else the mode's, else ``scheduler_name``: also for a pod
        that mixes resources of two schedulers (neither accounts for the other's).
        """
        fallback = self.mode_schedulers.get(mode, self.scheduler_name)
        if not self.resource_schedulers:
            return fallback
        # A slice no scheduler is listed for settles it (it always says whose GPUs
        # it asks for): the common case, answered without the per-container sets.
        for request in requests.containers:
            for resource in request.sharing_resources:
                if (
                    resource not in self.resource_schedulers
                    and resource not in self.count_resources
                ):
                    return fallback
        found = {
            self.resource_schedulers.get(resource)
            for request in requests.containers
            for resource in self.scheduling_resources(request.sharing_resources)
        }
        listed = found.pop() if len(found) == 1 else None
        return listed if listed is not None else fallback

    def scheduling_resources(self, names: Iterable[str]) -> list[str]:
        """The sharing resources of one container that say whose GPUs it asks for.

        A count resource beside slices of its own vendor (``nvidia.com/gpu`` beside
        ``nvidia.com/gpucores``) only counts them, and the mutation adds it to slices
        asked alone: it goes with them, so the mutated pod keeps the scheduler it got.
        """
        names = list(names)
        domains = tuple(n.split("/", 1)[0] + "/" for n in names if n not in self.count_resources)
        return [n for n in names if n not in self.count_resources or not n.startswith(domains)]

    def env_allowances_for(self, name: str) -> tuple[EnvAllowance, ...]:
        """The entries of env.allowed that decide ``name``: those naming it exactly, else
        those of its longest matching prefix (a narrower entry closes what a wider one
        opens: NVIDIA_REQUIRE_* is open, NVIDIA_REQUIRE_JETPACK is not)."""
        exact = tuple(a for a in self.env_allowances if not a.prefix and a.name == name)
        if exact:
            return exact
        matching = [a for a in self.env_allowances if a.prefix and a.names(name)]
        if not matching:
            return ()
        longest = max(len(a.name) for a in matching)
        return tuple(a for a in matching if len(a.name) == longest)

    def env_admits(self, name: str, value: str | None, container: ContainerClass) -> bool:
        """env.allowed admits ``name`` = ``value`` in a ``container`` of that class."""
        return any(
            container in a.containers and a.admits(value) for a in self.env_allowances_for(name)
        )

    def env_admits_anywhere(self, name: str, value: str | None) -> bool:
        """Admitted in every class of container: what a ConfigMap or Secret may carry,
        not knowing which container envFrom hands it to."""
        return all(self.env_admits(name, value, c) for c in CONTAINER_CLASSES)

    def exception_for(
        self, rule: str, *, namespace: str, username: str, groups: Iterable[str], today: str
    ) -> PolicyException | None:
        """The first exception that takes ``rule`` off for this request, or None."""
        for exception in self.exceptions:
            if exception.covers(
                rule, namespace=namespace, username=username, groups=groups, today=today
            ):
                return exception
        return None

    def is_gpu_resource(self, name: str) -> bool:
        return name in self.gpu_resources or name.startswith(self.mig_prefixes)

    def mode_allowed(self, mode: str, namespace: str) -> bool:
        return match_any(namespace, self.allowed_namespaces.get(mode, ()))

    def forbidden_to(self, key: str, username: str, groups: Iterable[str]) -> Ledger | None:
        """The first ledger reserving ``key`` whose writers do not include the requester
        (a key several ledgers reserve needs a writer of each), or None."""
        for ledger in self.ledgers:
            if ledger.reserves(key) and not ledger.writers.match(username, groups):
                return ledger
        return None

    def is_reserved_annotation(self, key: str) -> bool:
        # The literal prefixes turn nearly every key away before the pattern runs.
        return (
            key.startswith(self.reserved_prefixes) and self.reserved_pattern.match(key) is not None
        )


def normalised(path: str) -> str:
    """An absolute path with ``//``, ``.``, ``..`` and trailing slashes resolved."""
    # Rooted before normalising: "." or "dev/.." would otherwise become "/.", not "/".
    return "/" + posixpath.normpath("/" + path).lstrip("/")


def match_any(value: str, patterns: Iterable[str]) -> bool:
    for pattern in patterns:
        if pattern == value or pattern == "*":
            return True
        if ("*" in pattern or "?" in pattern or "[" in pattern) and fnmatch.fnmatchcase(
            value, pattern
        ):
            return True
    return False


def _merge(base: dict[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Deep-merge ``override`` onto ``base``: maps merge, everything else replaces."""
    merged = dict(base)
    for key, value in override.items():
        old = merged.get(key)
        # A node selector is one unit: merging the default's labels into it would be a surprise.
        if isinstance(old, dict) and isinstance(value, Mapping) and key != "nodeSelector":
            merged[key] = _merge(old, value)
        else:
            merged[key] = value
    return merged


def _position_of(node: yaml.Node | None, path: Iterable[Any]) -> tuple[int, int]:
    """The 1-based line and column of the YAML node at ``path`` (or of its closest ancestor)."""
    mark = node.start_mark if node is not None else None
    for part in path:
        if isinstance(node, yaml.MappingNode):
            for key_node, value_node in node.value:
                if getattr(key_node, "value", None) == str(part):
                    node = value_node
                    mark = key_node.start_mark
                    break
            else:
                break
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int):
            if part >= len(node.value):
                break
            node = node.value[part]
            mark = node.start_mark
        else:
            break
    return (mark.line + 1, mark.column + 1) if mark is not None else (1, 1)


def describe_yaml_error(exc: yaml.YAMLError, *, text: str, what: str) -> str:
    """``line L, column C: <what>: <the parser's own reason>``, for a YAML error in ``text``.

    The reason is what to fix ("mapping values are not allowed here"); where the parser
    says what it was inside, that construct's first line follows. One line, always.
    """
    if isinstance(exc, yaml.reader.ReaderError):
        # Raised before parsing, with an offset into the text instead of a mark.
        before = text[: exc.position]
        line, column = before.count("\n") + 1, exc.position - before.rfind("\n")
        code = exc.character if isinstance(exc.character, int) else ord(exc.character)
        return f"line {line}, column {column}: {what}: character #x{code:04x}: {exc.reason}"
    if not isinstance(exc, yaml.MarkedYAMLError) or exc.problem is None:
        return f"{what}: {' '.join(str(exc).split())}"
    mark = exc.problem_mark
    where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""
    reason = exc.problem
    if exc.context:
        started = exc.context_mark
        reason += f" ({exc.context}" + (
            f" started at line {started.line + 1})" if started is not None else ")"
        )
    return f"{where}{what}: {reason}"


def _normalise_rule_actions(document: dict[str, Any]) -> None:
    # YAML 1.1 reads a bare `off` as false; accept it as the action users meant.
    spec = document.get("spec")
    rules = spec.get("rules") if isinstance(spec, dict) else None
    if isinstance(rules, dict):
        for rule, action in list(rules.items()):
            if action is False:
                rules[rule] = "off"


# YAML 1.1 as the safe loader reads it, but a bare date is text: the day users wrote (an
# exception's expires), checked like any other field; PyYAML's own conversion raised
# ValueError, no line, on a day that is none (2027-02-30). Made with type(): a class
# statement here would be compiled native (hack/build-native), and a native subclass of
# PyYAML's loader breaks its __init__.
_Loader: Final[type[yaml.SafeLoader]] = type("_Loader", (yaml.SafeLoader,), {})


def _as_text(loader: yaml.SafeLoader, node: yaml.Node) -> str:
    return str(loader.construct_scalar(cast(yaml.ScalarNode, node)))


_Loader.add_constructor("tag:yaml.org,2002:timestamp", _as_text)


def parse_policy(text: str, *, base: Policy | None, source: str = "<policy>") -> Policy:
    """Parse and validate policy YAML; raise :class:`PolicyError` naming each bad line.

    What the document leaves out comes from ``base`` (the bundled default, in practice);
    with no base the document must be complete.
    """
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        document = yaml.load(text, Loader=_Loader)  # noqa: S506  # a SafeLoader subclass
    except yaml.YAMLError as exc:
        reason = describe_yaml_error(exc, text=text, what="not valid YAML")
        raise PolicyError(source, [reason]) from None
    if not isinstance(document, dict):
        raise PolicyError(source, ["line 1: a policy is a YAML mapping with apiVersion and kind"])
    _normalise_rule_actions(document)
    # (line, column, field) first: errors are read top to bottom, next to the file.
    found: list[tuple[tuple[int, int], str, str]] = []
    refused: list[list[Any]] = []
    for error in _VALIDATOR.iter_errors(document):
        path = list(error.absolute_path)
        keys = _offending_keys(error, document)
        for key in keys:
            dotted = ".".join(str(p) for p in [*path, key])
            found.append((_position_of(node, [*path, key]), dotted, _describe(error)))
            refused.append([*path, key])
        if not keys:
            dotted = ".".join(str(p) for p in path) or "(top level)"
            found.append((_position_of(node, path), dotted, _describe(error)))
            refused.append(path)
    # The semantic checks need a compiled policy. With schema errors they run on the
    # document without the parts the schema refused, when that much is valid, so one
    # pass lists both kinds rather than the second only after the first is fixed.
    checked = document if not found else _without(document, refused)
    policy = None
    if checked is not None and (checked is document or not any(_VALIDATOR.iter_errors(checked))):
        policy = compile_policy(checked, base=base)
        # Checked on the compiled policy: whether a name is a GPU resource depends on the base.
        problems = _scheduler_problems(checked, policy) + _mig_problems(policy)
        problems += _exception_problems(checked)
        for path, why in problems + _env_problems(checked):
            found.append((_position_of(node, path), ".".join(map(str, path)), why))
    if found or policy is None:
        found.sort()
        errors = [f"line {line}: {dotted}: {what}" for (line, _), dotted, what in found]
        raise PolicyError(source, errors)
    return policy


def _without(document: dict[str, Any], paths: list[list[Any]]) -> dict[str, Any] | None:
    """A copy of ``document`` with the value at each path removed; None when a path is
    the whole document (nothing would be left to check)."""
    if any(not path for path in paths):
        return None
    pruned = copy.deepcopy(document)
    # Deepest first, list indices from the back, so a removal does not shift another path.
    for path in sorted(
        paths, key=lambda p: (len(p), p[-1] if isinstance(p[-1], int) else -1), reverse=True
    ):
        parent: Any = pruned
        for step in path[:-1]:
            try:
                parent = parent[step]
            except (KeyError, IndexError, TypeError):
                parent = None
                break
        if isinstance(parent, dict):
            parent.pop(path[-1], None)
        elif isinstance(parent, list) and isinstance(path[-1], int) and path[-1] < len(parent):
            del parent[path[-1]]
    return pruned


def _offending_keys(error: jsonschema.ValidationError, document: Any) -> list[str]:
    """The mapping keys an error is about, so its line is the key's, not the parent's."""
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        known = error.schema.get("properties", {}) if isinstance(error.schema, dict) else {}
        return [str(k) for k in error.instance if k not in known]
    # A propertyNames failure reports the key itself as the instance, at the parent's path.
    if isinstance(error.instance, str):
        parent = document
        for part in error.absolute_path:
            parent = parent[part]
        if isinstance(parent, dict) and error.instance in parent:
            return [error.instance]
    return []


def _describe(error: jsonschema.ValidationError) -> str:
    if error.validator == "additionalProperties":
        return "unknown field"
    if error.validator == "propertyNames":
        allowed = error.schema.get("enum") if isinstance(error.schema, dict) else None
        if allowed:
            return f"{error.instance!r} is not one of {', '.join(map(str, allowed))}"
    if error.validator == "enum":
        choices = cast(list[Any], error.validator_value)
        return f"{error.instance!r} is not one of {', '.join(map(str, choices))}"
    if error.validator == "const":
        return f"must be {error.validator_value!r}"
    return str(error.message)


def compile_policy(document: Mapping[str, Any], *, base: Policy | None) -> Policy:
    """Compile a schema-valid document, filling what it leaves out from ``base``."""
    base_spec = cast(dict[str, Any], copy.deepcopy(base.spec)) if base is not None else {}
    spec = _merge(base_spec, document.get("spec") or {})
    spec["schedulerName"] = _schedulers(spec["schedulerName"], spec["resources"])
    name = str((document.get("metadata") or {}).get("name", "unnamed"))
    canonical = json.dumps(spec, sort_keys=True, separators=(",", ":"))
    digest = hashlib.sha256(canonical.encode()).hexdigest()[:16]
    res = spec["resources"]
    scheduler_name, mode_schedulers, resource_schedulers = _scheduler_maps(spec["schedulerName"])
    modes = spec["modes"]
    vgpu = spec["vgpu"]
    limits = spec["limits"]
    exemptions = spec["exemptions"]
    return Policy(
        name=name,
        digest=digest,
        scheduler_name=scheduler_name,
        resource_schedulers=resource_schedulers,
        mode_schedulers=mode_schedulers,
        allowed_schedulers=frozenset(spec["allowedSchedulers"]),
        on_error=spec["onError"],
        count_resources=frozenset(res["count"]),
        memory_mib_resources=frozenset(res["memoryMiB"]),
        memory_gib_resources=frozenset(res["memoryGiB"]),
        memory_percentage_resources=frozenset(res["memoryPercentage"]),
        cores_resources=frozenset(res["cores"]),
        priority_resources=frozenset(res["priority"]),
        mig_prefixes=tuple(res["migPrefixes"]),
        default_mode=modes["default"],
        mode_annotations=tuple(modes["annotations"]),
        dynamic_mig_annotations=frozenset(modes["dynamicMigAnnotations"]),
        node_selector_modes=tuple(
            NodeSelectorMode(key=s["key"], value=s["value"], mode=s["mode"])
            for s in modes["nodeSelectors"]
        ),
        namespace_modes={m: tuple(ns) for m, ns in modes["namespaces"].items()},
        allowed_namespaces={m: tuple(ns) for m, ns in modes["allowedNamespaces"].items()},
        preload=vgpu["preload"],
        library_host_path=vgpu["libraryHostPath"],
        preload_host_path=vgpu["preloadHostPath"],
        lock_host_path=vgpu["lockHostPath"],
        without_library=frozenset(vgpu["withoutLibrary"]),
        core_utilization_policy=vgpu["coreUtilizationPolicy"],
        allow_disable_core_utilization_policy=vgpu["allowDisableCoreUtilizationPolicy"],
        mps_pipe_directory=spec["mps"]["pipeDirectory"],
        mps_node_selector=dict(spec["mps"]["nodeSelector"]),
        mps_placed_annotations=frozenset(spec["mps"]["placedByAnnotations"]),
        whole_gpu_resources=frozenset(spec["wholeGpus"]["resources"]) & frozenset(res["count"]),
        sharing_pool=tuple((p["key"], p["value"]) for p in spec["wholeGpus"]["sharingPool"]),
        other_pools=tuple((p["key"], p["value"]) for p in spec["wholeGpus"]["otherPools"]),
        dra_resources=frozenset(spec["wholeGpus"]["draResources"])
        & frozenset(spec["wholeGpus"]["resources"])
        & frozenset(res["count"]),
        actions={rule: spec["rules"].get(rule, "deny") for rule in RULE_IDS},
        reserved_annotations=tuple(
            dict.fromkeys(
                [
                    *spec["reservedAnnotations"],
                    *(g for ledger in spec["ledgers"] for g in ledger["annotations"]),
                ]
            )
        ),
        ledgers=_ledgers(spec),
        exempt_namespaces=tuple(exemptions["namespaces"]),
        exempt=_identities(exemptions),
        host_path_mode=spec["hostPaths"]["mode"],
        allowed_host_paths=tuple(spec["hostPaths"]["allowed"]),
        protected_host_paths=tuple(spec["hostPaths"]["protected"]),
        driver_roots=tuple(dict.fromkeys(normalised(p) for p in spec["hostPaths"]["driverRoots"])),
        container_maxima=_maxima(limits["perContainer"]),
        pod_maxima=_maxima(limits["perPod"]),
        spec=spec,
        config_map_env=bool(spec.get("cluster", {}).get("configMapEnv", False)),
        secret_env=bool(spec.get("cluster", {}).get("secretEnv", False)),
        exceptions=tuple(
            PolicyException(
                name=e["name"],
                rules=frozenset(e["rules"]),
                namespaces=tuple(e.get("namespaces", ())),
                requesters=_identities(e),
                reason=e["reason"],
                owner=e["owner"],
                expires=e.get("expires"),
            )
            for e in spec.get("exceptions", ())
        ),
        mig_pools=tuple(
            MigPool(node_selector=dict(pool["nodeSelector"]), translate=pool.get("translate", True))
            for pool in spec.get("mig", {}).get("pools", ())
        ),
        gpu_device_classes=tuple(spec["dra"]["deviceClasses"]),
        claim_namespaces=tuple(spec["dra"]["allowedNamespaces"]),
        claim_configs={
            driver: tuple(allowed) for driver, allowed in spec["dra"]["claimConfigs"].items()
        },
        container_paths=tuple(
            dict.fromkeys(normalised(p) for p in spec["containerPaths"]["protected"])
        ),
        annotation_devices=frozenset(spec["runtimeAnnotations"]["allowedDevices"]),
        refused_annotation_prefixes=tuple(spec["runtimeAnnotations"]["refusedPrefixes"]),
        env_allowances=tuple(_env_allowance(entry) for entry in spec["env"]["allowed"]),
        gpu_runtime_classes=frozenset(spec["runtimeClasses"]["gpu"]),
    )


def _env_allowance(entry: Mapping[str, Any]) -> EnvAllowance:
    values = entry.get("values")
    items = entry.get("items")
    return EnvAllowance(
        name=entry["name"],
        values=tuple(values) if values is not None else None,
        items=frozenset(items) if items is not None else None,
        item_pattern=entry.get("itemPattern"),
        containers=frozenset(entry.get("containers", CONTAINER_CLASSES)),
    )


def _env_problems(document: Mapping[str, Any]) -> list[tuple[list[Any], str]]:
    """env.allowed entries that name nothing the env channel guards (a typo would
    otherwise open nothing, silently), or give both values and items."""
    problems: list[tuple[list[Any], str]] = []
    entries = document.get("spec", {}).get("env", {}).get("allowed", [])
    for index, entry in enumerate(entries if isinstance(entries, list) else ()):
        if not isinstance(entry, Mapping) or not isinstance(entry.get("name"), str):
            continue
        name = entry["name"]
        probe = name[:-1] + "X" if name.endswith("*") else name
        path = ["spec", "env", "allowed", index, "name"]
        if channel_of(probe) is None:
            problems.append(
                (
                    path,
                    f"{name} is no name the node's GPU stack reads (NVIDIA_*, "
                    "DOCKER_RESOURCE_*, CUDA_VERSION, HAMi-core's and CUDA_MPS_*): it is "
                    "admitted already",
                )
            )
        if "values" in entry and ("items" in entry or "itemPattern" in entry):
            key = "items" if "items" in entry else "itemPattern"
            problems.append(([*path[:-1], key], f"give values or {key}, not both"))
        pattern = entry.get("itemPattern")
        if isinstance(pattern, str) and (problem := item_pattern_problem(pattern)):
            problems.append(([*path[:-1], "itemPattern"], problem))
    return problems


# Groups every requester of a kind is in: as a scope, the rule off for everyone.
_EVERYONE: Final = frozenset(
    {"system:authenticated", "system:unauthenticated", "system:serviceaccounts"}
)
# What a namespace's name may hold (a DNS label), and a glob's own characters.
_NAMESPACE_GLOB: Final = re.compile(r"[-a-z0-9*?\[\]!]+")


def _scope_problems(entry: Mapping[str, Any], path: list[Any]) -> list[tuple[list[Any], str]]:
    """Scopes that reach every tenant: a namespace glob every name matches, or none can;
    a group everyone is in; without namespaces, a service account glob across namespaces
    (a tenant with edit rights acts as its namespace's accounts) or the controller
    accounts that create pods in every namespace (kube-system's)."""
    problems: list[tuple[list[Any], str]] = []
    everywhere = "; to turn a rule off everywhere, set it to off under rules"
    for i, pattern in enumerate(entry.get("namespaces") or ()):
        where = [*path, "namespaces", i]
        if fnmatch.fnmatchcase("", pattern) or set(pattern) <= {"*"}:
            problems.append((where, f"{pattern!r} matches every namespace{everywhere}"))
        elif not _NAMESPACE_GLOB.fullmatch(pattern):
            problems.append((where, f"{pattern!r} matches no namespace (a DNS label)"))
    for i, group in enumerate(entry.get("groups") or ()):
        if group in _EVERYONE:
            where = [*path, "groups", i]
            problems.append((where, f"{group} holds every requester of its kind{everywhere}"))
    if not entry.get("namespaces"):
        for i, account in enumerate(entry.get("serviceAccounts") or ()):
            namespace = account.partition("/")[0]
            where = [*path, "serviceAccounts", i]
            if any(ch in namespace for ch in "*?["):
                problems.append(
                    (
                        where,
                        f"{account} names accounts of any namespace, which its tenants act "
                        "as; name the namespace, or add namespaces",
                    )
                )
            elif namespace == "kube-system":
                problems.append(
                    (
                        where,
                        f"{account} is a system account that may create pods for every "
                        "namespace (a Deployment's pods are the ReplicaSet controller's); "
                        "add namespaces",
                    )
                )
    return problems


def _exception_problems(document: Mapping[str, Any]) -> list[tuple[list[Any], str]]:
    """Exceptions that name no scope (a rule off everywhere is ``rules: {id: off}``) or
    one that reaches every tenant, a name twice, or a day that is none."""
    problems: list[tuple[list[Any], str]] = []
    seen: set[str] = set()
    entries = (document.get("spec") or {}).get("exceptions") or []
    for index, entry in enumerate(entries):
        path = ["spec", "exceptions", index]
        problems.extend(_scope_problems(entry, path))
        if not any(entry.get(k) for k in ("namespaces", "users", "groups", "serviceAccounts")):
            problems.append(
                (
                    [*path, "name"],
                    "names no namespaces, users, groups or serviceAccounts; to turn a rule "
                    "off everywhere, set it to off under rules",
                )
            )
        if entry["name"] in seen:
            problems.append(([*path, "name"], f"{entry['name']} is named twice"))
        seen.add(entry["name"])
        if "expires" in entry:
            try:
                datetime.date.fromisoformat(entry["expires"])
            except ValueError:
                problems.append(([*path, "expires"], f"{entry['expires']!r} is no date"))
    return problems


# A quantifier's {m}, {m,} or {m,n}: the one place a comma may stand in an item pattern.
_REPEAT = re.compile(r"\{[0-9]+(?:,[0-9]*)?\}")


def item_pattern_problem(pattern: str) -> str | None:
    """Why ``pattern`` is no env.allowed itemPattern, or None.

    The core matches it against each item of a split list; the in-apiserver policies
    match one regular expression against the whole value, in RE2. Both agree only for a
    pattern that reads the same in Python and RE2 and can never match a comma, a blank
    or a tab: letters, digits, ``_``, ``-``, ``\\.``, classes of those, groups, ``|``
    and quantifiers.
    """
    try:
        re.compile(pattern)
    except re.error as error:
        return f"not a regular expression: {error}"
    rest = _REPEAT.sub("", pattern)
    index = 0
    while index < len(rest):
        char = rest[index]
        if char == "\\":
            if rest[index + 1 : index + 2] not in (".", "-"):
                return "only \\. and \\- may be escaped (write classes such as [0-9])"
            index += 2
            continue
        if (
            char == "("
            and rest[index + 1 : index + 2] == "?"
            and rest[index + 2 : index + 3] != ":"
        ):
            return "only (?: groups: lookarounds, flags and named groups read differently in RE2"
        if not (char.isascii() and (char.isalnum() or char in "_-[]()|?*+:")):
            return (
                f"{char!r} is not allowed: a pattern matches one whole item, of letters, "
                "digits, _, - and \\."
            )
        index += 1
    return None


def _scheduler_maps(
    schedulers: str | Mapping[str, str],
) -> tuple[str, dict[str, str], dict[str, str]]:
    """``schedulerName`` as the default scheduler, the modes' and the resources'.

    Entries that always give what the next step would are left out: a mode's that names
    the default, and a resource's that names the default while no mode has another (with
    one, the resource's entry still wins over it).
    """
    if isinstance(schedulers, str):
        return schedulers, {}, {}
    # A map without a default (only over a single name) is refused by parse_policy.
    default = schedulers.get("default", DEFAULT_SCHEDULER)
    by_mode = {
        mode: s for mode, s in schedulers.items() if mode in SCHEDULED_MODES and s != default
    }
    by_resource = {
        name: s
        for name, s in schedulers.items()
        if name != "default" and name not in MODES and (by_mode or s != default)
    }
    return default, by_mode, by_resource


def _schedulers(
    raw: str | Mapping[str, str], resources: Mapping[str, list[str]]
) -> str | dict[str, str]:
    """``schedulerName`` without the entries a merge brought in for resources this
    policy does not have (moot, and a dumped policy must parse again)."""
    if isinstance(raw, str):
        return raw
    mig = tuple(resources["migPrefixes"])
    sharing = {
        name
        for kind, names in resources.items()
        if kind != "migPrefixes"
        for name in names
        if not name.startswith(mig)
    }
    kept = {"default", *SCHEDULED_MODES}
    return {name: s for name, s in raw.items() if name in sharing or name in kept}


def _scheduler_problems(document: Mapping[str, Any], policy: Policy) -> list[tuple[list[Any], str]]:
    """Per-mode and per-resource schedulers the document names that cannot take effect,
    by path. A key is a mode exactly when it is one of MODES; anything else is a resource."""
    written = (document.get("spec") or {}).get("schedulerName")
    if not isinstance(written, Mapping):
        return []
    path: list[Any] = ["spec", "schedulerName"]
    problems: list[tuple[list[Any], str]] = []
    if "default" not in policy.spec["schedulerName"]:
        problems.append(
            (
                path,
                "a per-mode or per-resource schedulerName needs default: "
                "the scheduler of other GPU pods",
            )
        )
    for name in written:
        if (
            name == "default"
            or name in SCHEDULED_MODES
            or (name in policy.gpu_resources and not name.startswith(policy.mig_prefixes))
        ):
            continue
        if name == "mig" or name.startswith(policy.mig_prefixes):
            why = "MIG instances are counted by any scheduler and MIG pods keep theirs; remove it"
        elif "/" in name:
            why = "not a GPU-sharing resource of the policy; list it in spec.resources or fix the name"
        else:
            # Resource names carry their vendor's domain: a bare word meant a mode.
            why = f"not a mode; modes are {', '.join(SCHEDULED_MODES)} (resource names have a '/')"
        problems.append(([*path, name], why))
    return problems


def _mig_problems(policy: Policy) -> list[tuple[list[Any], str]]:
    """MIG pools that could never take effect, by path."""
    problems: list[tuple[list[Any], str]] = []
    pools = policy.mig_pools
    if pools and not "nvidia.com/mig-".startswith(policy.mig_prefixes):
        problems.append(
            (["spec", "mig", "pools"], "MIG pools need nvidia.com/mig- in resources.migPrefixes")
        )
    for later, pool in enumerate(pools):
        for earlier in range(later):
            # The first pool a pod selects wins: one selected whenever this one is hides it.
            if pools[earlier].selected_by(pool.node_selector):
                problems.append(
                    (
                        ["spec", "mig", "pools", later, "nodeSelector"],
                        f"pool {earlier + 1} already takes every pod this one would; "
                        "list the narrower nodeSelector first or remove one",
                    )
                )
                break
    return problems


def _maxima(raw: Mapping[str, int]) -> Maxima:
    return Maxima(gpus=raw.get("gpus"), memory_mib=raw.get("memoryMiB"), cores=raw.get("cores"))


def _ledgers(spec: Mapping[str, Any]) -> tuple[Ledger, ...]:
    """The policy's ledgers, and one for reservedAnnotations with reservedAnnotationWriters."""
    ledgers = [
        Ledger(
            name=raw["name"],
            annotations=tuple(raw["annotations"]),
            writers=_identities(raw["writers"]),
            config_maps=tuple(raw.get("configMaps", ())),
            devices_from=_devices_from(raw.get("visibleDevicesFrom")),
        )
        for raw in spec["ledgers"]
    ]
    if spec["reservedAnnotations"]:
        ledgers.append(
            Ledger(
                name="reservedAnnotations",
                annotations=tuple(spec["reservedAnnotations"]),
                writers=_identities(spec["reservedAnnotationWriters"]),
            )
        )
    return tuple(ledgers)


def _devices_from(raw: Mapping[str, Any] | None) -> DevicesFrom | None:
    if raw is None:
        return None
    return DevicesFrom(
        scheduler_name=raw["schedulerName"],
        name_annotation=raw["nameAnnotation"],
        request_annotations=tuple(raw["requestAnnotations"]),
        container_annotation=raw.get("containerAnnotation"),
    )


def _identities(raw: Mapping[str, Any]) -> Identities:
    return Identities(
        users=frozenset(raw.get("users", ())),
        groups=frozenset(raw.get("groups", ())),
        service_accounts=tuple(raw.get("serviceAccounts", ())),
    )
