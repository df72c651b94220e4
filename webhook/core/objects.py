"""Objects other than pods that the rules judge when they are written.

A pod reaches GPUs through more than its own spec: envFrom hands it the keys of a
ConfigMap or Secret, whose values the kubelet reads when the container starts (a
ConfigMap created after the pod is still read: the kubelet starts a pod without an
optional one and retries a required one until it exists), and a Dynamic Resource
Allocation claim hands it devices the sharing ledger never counts. Judging the pod
cannot see either, so they are judged where they are written:

- raw-visible-devices: a ConfigMap or Secret holding as a key a guarded env name
  (:func:`~webhook.core.env.guarded`), whatever its value, or a name of a guarded channel
  that the policy's env.allowed does not admit in every container (:func:`unadmitted_key`),
  unless a ledger's writer writes one of the ledger's ConfigMaps (:func:`kept_by_writer`);
- gpu-claim: a ResourceClaim or ResourceClaimTemplate with a request on one of the
  policy's GPU device classes outside the namespaces the policy allows
  (``dra.allowedNamespaces``), or, in any namespace, with an opaque configuration for a
  driver of ``dra.claimConfigs`` that its list does not hold; and a DeviceClass that serves one of the policy's sharing
  resources (``extendedResourceName``; a MIG resource is no slice, and a whole-GPU
  resource of ``wholeGpus.draResources`` is DRA's by the policy).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any, Final

from webhook.core.env import channel_of, guarded
from webhook.core.finding import Finding, quoted
from webhook.core.policy import Policy, match_any
from webhook.core.workload import MAPPINGS, as_mapping

# The keys envFrom reads of each kind (stringData only in manifests: the apiserver
# folds it into data before admission).
ENV_SOURCES: Final[Mapping[str, tuple[str, ...]]] = {
    "ConfigMap": ("data",),
    "Secret": ("data", "stringData"),
}
CLAIM_KINDS: Final = ("ResourceClaim", "ResourceClaimTemplate")
DEVICE_CLASS: Final = "DeviceClass"
JUDGED_KINDS: Final = frozenset({*ENV_SOURCES, *CLAIM_KINDS, DEVICE_CLASS})


def unadmitted_key(key: str, value: Any, kind: str, policy: Policy) -> bool:
    """A ConfigMap's or Secret's ``key`` would hand a container a name the env channel
    refuses: a guarded name whatever its value, or one of a guarded channel that the
    policy's env.allowed does not admit in every container (envFrom may hand it to any).
    A Secret's values are never read: there only a name admitted with any value passes."""
    if guarded(key):
        return True
    if channel_of(key) is None:
        return False
    shown = value if kind == "ConfigMap" and isinstance(value, str) else None
    return not policy.env_admits_anywhere(key, shown)


def kept_by_writer(
    obj: Mapping[str, Any], kind: str, policy: Policy, *, username: str, groups: Iterable[str]
) -> bool:
    """A ConfigMap a ledger's writers keep per pod (its ``configMaps`` names), written by
    one of them: KAI's binder writes the GPUs it picked for a fractional pod into
    ``<pod's runai/shared-gpu-configmap>-<n>``, NVIDIA_VISIBLE_DEVICES among its keys
    (NVIDIA/KAI-Scheduler pkg/binder/common/gpu_access.go:63-101, gpusharingconfigmap/
    config_map.go:114-167 @ 72de64fc). Anyone else writing one is judged as any."""
    name = as_mapping(obj.get("metadata")).get("name")
    if kind != "ConfigMap" or not isinstance(name, str):
        return False
    return any(
        match_any(name, ledger.config_maps) and ledger.writers.match(username, groups)
        for ledger in policy.ledgers
        if ledger.config_maps
    )


def _env_source_findings(obj: Mapping[str, Any], kind: str, policy: Policy) -> Iterator[Finding]:
    for field in ENV_SOURCES[kind]:
        data = as_mapping(obj.get(field))
        for key, value in data.items():
            if isinstance(key, str) and unadmitted_key(key, value, kind, policy):
                yield Finding(
                    "raw-visible-devices",
                    f"{kind} key {key} would reach containers through envFrom, where the "
                    "policy's env.allowed does not admit it in every container; remove it "
                    "and set what a pod needs in its own env",
                )


def claim_classes(spec: Mapping[str, Any]) -> Iterator[str]:
    """The device classes a claim's ``spec`` asks for: each request's (v1 ``exactly`` and
    ``firstAvailable``, and v1beta1's ``deviceClassName`` on the request itself)."""
    requests = as_mapping(spec.get("devices")).get("requests")
    for request in requests if isinstance(requests, list) else ():
        if not isinstance(request, MAPPINGS):
            continue
        for candidate in (request, as_mapping(request.get("exactly"))):
            name = candidate.get("deviceClassName")
            if isinstance(name, str):
                yield name
        alternatives = request.get("firstAvailable")
        for alternative in alternatives if isinstance(alternatives, list) else ():
            name = as_mapping(alternative).get("deviceClassName")
            if isinstance(name, str):
                yield name


def _config_findings(spec: Mapping[str, Any], kind: str, policy: Policy) -> Iterator[Finding]:
    """Each opaque configuration for a driver of ``dra.claimConfigs`` whose parameters
    are none its list allows: the driver applies a claim's config over its DeviceClass's
    (kubernetes-sigs/dra-driver-nvidia-gpu GetOpaqueDeviceConfigs), whatever the class."""
    configs = as_mapping(spec.get("devices")).get("config")
    for index, config in enumerate(configs if isinstance(configs, list) else ()):
        opaque = as_mapping(as_mapping(config).get("opaque"))
        driver = opaque.get("driver")
        if not isinstance(driver, str) or driver not in policy.claim_configs:
            continue
        if opaque.get("parameters") in policy.claim_configs[driver]:
            continue
        yield Finding(
            "gpu-claim",
            f"{kind} spec.devices.config[{index}] configures driver {quoted(driver)} as the "
            "policy's dra.claimConfigs does not allow: the driver applies it over the "
            "DeviceClass's (sharing, MPS limits); remove it, or list it there",
        )


def _claim_findings(
    obj: Mapping[str, Any], kind: str, policy: Policy, namespace: str
) -> Iterator[Finding]:
    spec = as_mapping(obj.get("spec"))
    if kind == "ResourceClaimTemplate":
        spec = as_mapping(spec.get("spec"))
    if policy.claim_configs:
        yield from _config_findings(spec, kind, policy)
    if match_any(namespace, policy.claim_namespaces):
        return
    for name in sorted(set(claim_classes(spec))):
        if name in policy.gpu_device_classes:
            yield Finding(
                "gpu-claim",
                f"{kind} asks for device class {quoted(name)}: whole GPUs the sharing "
                f"scheduler never counts, and namespace {quoted(namespace)} is not in the "
                "policy's dra.allowedNamespaces; claim GPUs in a namespace listed there",
            )


def _device_class_findings(obj: Mapping[str, Any], policy: Policy) -> Iterator[Finding]:
    """A DeviceClass that serves one of the sharing resources: DRA would hand pods that
    ask for GPU slices whole devices, unmutated and outside the sharing ledger. A MIG
    resource served by DRA (the NVIDIA DRA driver's ``nvidia.com/mig-1g.12gb`` example)
    is a hardware partition either way, isolated and counted as a whole instance."""
    name = as_mapping(obj.get("spec")).get("extendedResourceName")
    # wholeGpus.draResources: the policy says DRA serves these whole GPUs here.
    if isinstance(name, str) and name in policy.gpu_resources and name not in policy.dra_resources:
        yield Finding(
            "gpu-claim",
            f"DeviceClass serves {name} through DRA, outside the sharing scheduler's "
            "accounting; remove spec.extendedResourceName",
        )


def object_findings(
    obj: Mapping[str, Any],
    kind: str,
    policy: Policy,
    *,
    namespace: str,
    username: str = "",
    groups: Iterable[str] = (),
) -> list[Finding]:
    """The findings on a written object of one of :data:`JUDGED_KINDS`, written by
    ``username`` in ``groups``."""
    if kind in ENV_SOURCES:
        if kept_by_writer(obj, kind, policy, username=username, groups=groups):
            return []
        return list(_env_source_findings(obj, kind, policy))
    if kind in CLAIM_KINDS:
        return list(_claim_findings(obj, kind, policy, namespace))
    if kind == DEVICE_CLASS:
        return list(_device_class_findings(obj, policy))
    return []
