"""Which admission requests reach the webhook at all: ``matchConditions`` (CEL) from a policy.

Both webhook registrations carry these conditions, so the apiserver calls the webhook
only for an object the decision core could act on: a pod (or a workload's pod template)
that names a GPU resource of the policy or touches something GPU-related. A plain pod
never waits on the webhook, and a webhook outage refuses only GPU-relevant objects.

The conditions are a *superset* of what the core acts on (:mod:`webhook.core.rules`,
:mod:`webhook.core.decision`): an object the core would mutate or judge must never be
skipped, so every test here errs towards sending. What the core acts on, and the
condition that catches it:

- GPU requests (every rule that needs one, the mutation, the mode): a resource name of
  the policy, or one with a MIG prefix, in the limits or requests of any container,
  init container or ephemeral container, whatever its amount (a container of zero
  amounts, ``resources.vacant``, is sent and judged as one without a GPU: its other
  containers may still need the void).
- raw-visible-devices and the void (any pod): an env entry named ``CUDA_VERSION`` or
  ``NVIDIA_*`` (``NVIDIA_VISIBLE_DEVICES`` is judged, the others get the containers that
  ask for no GPU ``NVIDIA_VISIBLE_DEVICES=void``); an ``envFrom`` with a prefix; with the
  policy's ``cluster.configMapEnv`` / ``secretEnv``, any ``envFrom`` of a ConfigMap /
  Secret (its keys are known only to the cluster view).
- gpu-claim: a resource ``deviceclass.resource.kubernetes.io/<class>`` of the policy's
  GPU device classes (counted as a GPU request above). ConfigMaps, Secrets and DRA
  objects are judged by the ValidatingAdmissionPolicies (:mod:`webhook.render.validating`),
  not sent to the webhooks.
- the void and host-device-access under a GPU runtime class (any pod): a
  ``runtimeClassName`` of the policy's ``runtimeClasses.gpu``.
- host namespaces, CAP_SYS_ADMIN, claims beside sharing resources (judged by the claim's
  device class, with the cluster view): only in GPU pods, which are sent already.
- host-device-access (any pod): any hostPath volume (the protected paths are compared
  after normalisation, which CEL cannot do; a hostPath is rare enough to send them all);
  a mount whose path contains the last component of a path the GPU stack reads inside
  the container (``rules.read_paths``: ``ld.so.preload``, ``overrideEnv``, ``vgpu``,
  ``nvidia-container-devices``, ...); a mount or volume with a name the mutation
  injects; an annotation key containing ``cdi.k8s.io`` or starting with an NRI plugin's CDI key, or starting with CRI-O's
  devices keys or one of the policy's ``runtimeAnnotations.refusedPrefixes``.
- forged-allocation: an annotation key that may match a reserved glob of the policy
  (each glob cut at its first wildcard: a key prefix), on the object and, for a pod
  UPDATE, on the old object (removing what the scheduler wrote is forging too).

One condition, ``gpushare.io/gpu-relevant``: a kind other than a Pod and the workloads
with a pod template is sent; otherwise the pod spec and metadata (the Pod's, or the
template's, read once by kind) are tested once. One rather than one per kind because the apiserver
pays per condition: on a plain pod create, three conditions cost 0.58 ms of admission
time across both webhooks and the same tests as one condition 0.42 ms (measured side by
side, alternating rounds). CEL sees admitted objects without a schema (dynamic
types), so every field is guarded by ``has()`` before it is read; an evaluation error
would make the request follow the webhook's failurePolicy.

Pure: a :class:`~webhook.core.policy.Policy` in, a list of conditions out.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final, TypeAlias

from webhook.core.env import DEVICE_PREFIXES
from webhook.core.policy import DEVICE_CLASS_RESOURCE, Policy
from webhook.core.rules import CDI_MARK, CDI_PREFIXES, CRIO_DEVICE_KEYS, mount_marks
from webhook.core.workload import KINDS_BY_PATH
from webhook.render.cel import NamedExpression, any_of, literal, printed, strings
from webhook.render.pod import (
    CUDA_VERSION,
    INJECTED_VOLUMES,
    container_list,
    names_test,
    template,
)

CONDITION_NAME: Final = "gpushare.io/gpu-relevant"


_GLOB_CHARS: Final = "*?["


# A matchCondition is a named expression on the wire.
MatchCondition: TypeAlias = NamedExpression


# Top-level alternatives one a line: the conditions are read in deploy/base too.
_LINES: Final = "\n  || "


def annotation_prefixes(patterns: Iterable[str]) -> tuple[list[str], list[str]]:
    """``(prefixes, exact)``: keys that start with a prefix or equal an exact key cover
    every key the glob ``patterns`` match (fnmatch: ``*``, ``?``, ``[...]``, case-sensitive).

    A glob is cut at its first wildcard; a key the shorter prefix covers is dropped.
    """
    prefixes: set[str] = set()
    exact: set[str] = set()
    for pattern in patterns:
        cut = min((pattern.index(c) for c in _GLOB_CHARS if c in pattern), default=None)
        if cut is None:
            exact.add(pattern)
        else:
            prefixes.add(pattern[:cut])
    kept = sorted(p for p in prefixes if not any(p != q and p.startswith(q) for q in prefixes))
    exact_kept = sorted(k for k in exact if not any(k.startswith(p) for p in kept))
    return kept, exact_kept


def _resource_test(policy: Policy, var: str) -> str:
    """``var`` (a resource name) is one the policy reads as a GPU request."""
    terms = []
    if policy.gpu_resources:
        terms.append(f"{var} in {strings(sorted(policy.gpu_resources))}")
    terms.extend(f"{var}.startsWith({literal(p)})" for p in sorted(set(policy.mig_prefixes)))
    if policy.gpu_device_classes:
        # DRA's extended resources for the GPU device classes (gpu-claim).
        classes = sorted(DEVICE_CLASS_RESOURCE + c for c in policy.gpu_device_classes)
        terms.append(f"{var} in {strings(classes)}")
    return " || ".join(terms) or "false"


def _container_test(policy: Policy, c: str) -> str:
    """Container ``c`` asks for a GPU, sets NVIDIA_VISIBLE_DEVICES, or mounts the
    device-request directory or a volume the mutation injects."""
    gpu = _resource_test(policy, "r")
    # Env taken from ConfigMaps / Secrets is judged only where the policy opts in.
    sources = [
        ref
        for ref, judged in (
            ("configMapRef", policy.config_map_env),
            ("secretRef", policy.secret_env),
        )
        if judged
    ]
    env_from = (
        [f"has({c}.envFrom) && {c}.envFrom.exists(s, {any_of([f'has(s.{r})' for r in sources])})"]
        if sources
        else []
    )
    return any_of(
        [
            *env_from,
            names_test(c, gpu),
            # The toolkit's names (env.DEVICE_PREFIXES) are judged in any pod; CUDA_VERSION
            # and the NVIDIA_* names get the containers that ask for no GPU their void.
            f"has({c}.env) && {c}.env.exists(e, has(e.name) && "
            f"(e.name == {literal(CUDA_VERSION)} || "
            + " || ".join(f"e.name.startsWith({literal(p)})" for p in DEVICE_PREFIXES)
            + "))",
            # A prefix can spell a guarded name from a key the write-time guard allowed.
            f"has({c}.envFrom) && {c}.envFrom.exists(s, has(s.prefix) && s.prefix != '')",
            # A path the GPU stack reads cleans to its root or below only if the mountPath
            # holds the root's last component (rules.read_paths).
            f"has({c}.volumeMounts) && {c}.volumeMounts.exists(m, "
            f"(has(m.mountPath) && {strings(mount_marks(policy))}"
            ".exists(w, m.mountPath.contains(w))) || "
            f"(has(m.name) && m.name in {strings(INJECTED_VOLUMES)}))",
            # The same for a block device's path (rules._device_findings).
            f"has({c}.volumeDevices) && {c}.volumeDevices.exists(d, has(d.devicePath) && "
            f"{strings(mount_marks(policy))}.exists(w, d.devicePath.contains(w)))",
        ]
    )


def _spec_test(policy: Policy, spec: str) -> str:
    """Pod spec ``spec`` has a relevant container of any kind or a relevant volume, or
    runs under one of the policy's GPU runtime classes."""
    terms = [
        f"({container_list(spec)}).exists(c, {_container_test(policy, 'c')})",
        f"has({spec}.volumes) && {spec}.volumes.exists(v, has(v.hostPath) || "
        f"(has(v.name) && v.name in {strings(INJECTED_VOLUMES)}))",
    ]
    if policy.gpu_runtime_classes:
        terms.append(
            f"has({spec}.runtimeClassName) && "
            f"{spec}.runtimeClassName in {strings(sorted(policy.gpu_runtime_classes))}"
        )
    return any_of(terms)


def _annotation_test(policy: Policy, metadata: str) -> str:
    """Metadata ``metadata`` has a CDI annotation or one a reserved glob may match."""
    prefixes, exact = annotation_prefixes(policy.reserved_annotations)
    if "" in prefixes:
        # A glob that starts with a wildcard can match any key.
        return f"has({metadata}.annotations) && size({metadata}.annotations) > 0"
    terms = [f"k.contains({literal(CDI_MARK)})"]
    keys = sorted(
        {*CRIO_DEVICE_KEYS, *CDI_PREFIXES, *policy.refused_annotation_prefixes, *prefixes}
    )
    terms.extend(f"k.startsWith({literal(p)})" for p in keys)
    if exact:
        terms.append(f"k in {strings(exact)}")
    return f"has({metadata}.annotations) && {metadata}.annotations.exists(k, {' || '.join(terms)})"


# Every kind whose pod spec the conditions read: Pods, and the workloads' templates.
_KINDS: Final = ("Pod", *sorted(kind for kinds in KINDS_BY_PATH.values() for kind in kinds))


def _other_kind() -> str:
    """A kind with no pod spec the conditions read: its request is sent."""
    return f"!(request.kind.kind in {strings(_KINDS)})"


def match_conditions(policy: Policy) -> list[MatchCondition]:
    """The matchConditions of both webhooks under ``policy`` (all must hold to call it)."""
    expression = any_of(
        [
            _other_kind(),
            f"[{template('object', 'spec')}].exists(spec, {_spec_test(policy, 'spec')})",
            f"[{template('object', 'metadata')}].exists(meta, {_annotation_test(policy, 'meta')})",
            # A pod UPDATE may remove what the scheduler wrote: judge it by the old object too.
            "request.kind.kind == 'Pod' && oldObject != null && has(oldObject.metadata) && "
            f"({_annotation_test(policy, 'oldObject.metadata')})",
        ],
        joiner=_LINES,
    )
    return [MatchCondition(name=CONDITION_NAME, expression=printed(expression))]


VIEW_CONDITION_NAME: Final = "gpushare.io/cluster-view"


def view_conditions(policy: Policy) -> list[MatchCondition]:
    """The matchConditions of the webhooks where MutatingAdmissionPolicies hold the
    mutation (:mod:`webhook.install.mode`): only what the cluster view decides reaches
    them. Every such decision is about an object that asks for a GPU of the policy
    (no-fitting-node, gpu-quota, the Pod Security level of an mps pod, the memory
    percentage in MiB, the MIG translation, the class of a claim beside sharing resources); the rules that need no view hold in the
    apiserver, and the cross-object ones (env from ConfigMaps and Secrets, DRA claims) at
    write time, so none of them rests on a registration that fails open."""
    gpu = _resource_test(policy, "r")
    asks = f"({container_list('spec')}).exists(c, {names_test('c', gpu)})"
    expression = f"{_other_kind()}{_LINES}[{template('object', 'spec')}].exists(spec, {asks})"
    return [MatchCondition(name=VIEW_CONDITION_NAME, expression=printed(expression))]
