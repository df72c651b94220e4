"""The deny rules CEL can express, as ValidatingAdmissionPolicies: no webhook needed.

For clusters that want no webhook in the validation path at all (or a second line
behind it): the apiserver itself evaluates these policies, so they hold while the
webhook is down, unregistered or not installed. They are rendered from a compiled
:class:`~webhook.core.policy.Policy`, one ``ValidatingAdmissionPolicy`` and one
``ValidatingAdmissionPolicyBinding`` per action some rule takes (``gpushare-deny``,
``gpushare-warn``, ``gpushare-audit``): ``validationActions`` belong to a binding, so
the action maps to them (deny -> Deny, warn -> Warn, audit -> Audit; a rule that is
off is not rendered), and each rule of that action is one of the policy's
``validations``. Per action, not per rule, because the apiserver converts the whole
object to unstructured once per policy and filter (matchConditions, then validations):
seven policies converted every pod about fourteen times, which cost each pod create
~2 ms. Each validation's message starts with the rule id in brackets, as the webhook's
denials do (``[privileged-gpu] ...``); a container rule's ``messageExpression`` then names
the first container that breaks it and the field, in the core's redacted words
(:func:`message_expressions`). A Deny names only the first failing validation (in
:data:`RULES` order); Warn sends one warning per failing validation. ``gpushare-overrides``
warns what the MutatingAdmissionPolicy replaced (:func:`_override_policies`).

Rendered (each equals the decision core's verdict on the objects the apiserver admits;
tests/e2e/test_celpolicy.py compares the two on generated objects):

- privileged-gpu: a GPU pod (or template) with any privileged container, init or
  ephemeral container.
- node-name-pinning: a GPU pod created with spec.nodeName (or a template with one).
- raw-visible-devices: NVIDIA_VISIBLE_DEVICES from valueFrom, or a value other than
  void/none/empty (case and surrounding space ignored).
- limit-tampering (its env switches only): CUDA_DISABLE_CONTROL truthy,
  GPU_CORE_UTILIZATION_POLICY=disable (unless the policy allows it), CUDA_REDIRECT
  non-empty, ACTIVE_OOM_KILLER false/0, CGPU_DISABLE other than false/0, any of them
  from valueFrom or with $(VAR), in a GPU pod. Limits above the request stay the webhook's (they need the parsed request).
- scheduler-bypass: a GPU-sharing pod (or template) in mode vgpu or mps naming a
  scheduler other than the one that accounts for its resources (the policy's
  per-resource schedulerName, else its per-mode one, else its default),
  default-scheduler, empty or an allowed one; the mode is chosen as the core chooses
  it (mode annotations, node selectors, MIG resources, the namespace's mode, the
  default).
- forged-allocation: a reserved annotation on a created pod or template; on a pod
  UPDATE, a reserved annotation added, changed or removed. The policy's
  reservedAnnotationWriters are matched on ``request.userInfo``.
- host-device-access: hostPath volumes (any pod) that are protected (device nodes and
  their parents, the kubelet's state, /proc, runtime sockets, the libvgpu, lock and MPS
  pipe directories, the policy's protected paths, and the directories above them), that
  hold the GPU runtime's configuration or the GPU stack (the driver's libraries and tools,
  sysfs, the policy's hostPaths.driverRoots) and are mounted writable, or (allowlist mode, GPU
  pods) that lie outside the allowed paths, unless the volume is exactly one the
  mutation injects into this pod; mounts of the injected shared volumes without
  readOnly; mountPaths that /var/run/nvidia-container-devices (or /run/...) starts, raw
  or cleaned (the toolkit's string prefix), and mountPaths at or below a path the GPU
  stack reads inside the container (``rules.read_paths``: /etc/ld.so.preload,
  /overrideEnv, /usr/local/vgpu, the lock and MPS pipe directories, the policy's
  containerPaths.protected) that are not a mount the mutation injects into this pod, of
  the volume it injects; any ``cdi.k8s.io/`` annotation key, CRI-O's devices annotation
  naming a device off runtimeAnnotations.allowedDevices, and a key with one of its
  refusedPrefixes. Paths are compared after dropping ``//``, ``.``
  and trailing slashes (strings' split/join), as the core's normalisation does: the
  apiserver refuses a hostPath with a ``..`` segment. A mountPath may hold ``..``, which
  CEL cannot resolve (it takes a stack): a mountPath with a ``..`` segment is the
  webhook's alone. On a pod UPDATE the old pod is judged in the new
  pod's mode (see :func:`_host_device_access`).

- invalid-gpu-request: per container, as ``resources.read_container`` reads the
  quantities (CEL's ``isQuantity``/``quantity()`` on the canonical text the apiserver
  hands admission): a GPU resource in requests but not limits, or whose request is
  another quantity than its limit; a value outside its unit's range (counts and MIG
  instances 1..64, MiB 1..512 Gi, GiB 1..1024 and above that MiB up to 512 Gi,
  percentages 1..100), with a binary
  suffix or a fraction; a priority that is no integer; memory asked twice.
- mode-conflict: in the mode chosen as above, a mode annotation whose value is no mode
  (before the first that is one), MIG and shared-GPU resources in one container, MIG in
  a pod of another mode, slices in a MIG pod (or in mode none not by default), a node
  selector of another mode, an MPS node selector with another value, a mode the
  namespace may not use (the policy's globs), and an mps container asking for memory as
  a percentage only. The last is what the core decides without the cluster view (which
  alone knows the card to turn it into MiB): the policy refuses it even where the
  webhook's view would have resolved it.
- gpu-quota (only when the policy sets a maximum): per container its GPU devices,
  memory times its (v)GPUs and cores; per pod the peak of what runs together, main
  containers beside the sidecar init containers, or a plain init container beside the
  sidecars declared before it (``rules.pod_totals``). ResourceQuotas are the cluster
  view's.
- unmutated-gpu-pod: a created GPU-sharing pod or template lacking what
  ``mutation.first_missing`` asks for: in mode vgpu or mps the scheduler, the mode
  annotation, the injected volumes, hostIPC and the MPS node selector (mps), and in each
  sharing container and init container the last env entry of each wanted name with the
  wanted value (no valueFrom; LD_PRELOAD may keep the user's libraries after ours, a user's
  ``force`` or ``1`` stays), no stray vGPU limit variable, the injected mounts exactly,
  the count resource the slices imply; in every mode ``NVIDIA_VISIBLE_DEVICES`` in each
  container that asks for no GPU. A ValidatingAdmissionPolicy sees the object after every
  mutation, the webhook's (1.30-1.35) or the MutatingAdmissionPolicies' (1.36), so it
  refuses what another mutator changed afterwards as /validate does. One thing it reads
  more loosely than the core, so as never to be stricter than the webhook with its
  cluster view: a container asking for memory as a percentage gets no per-GPU memory
  limit without the view (CEL has none), and with it the limits of the MiB the view
  resolves; so ``CUDA_DEVICE_MEMORY_LIMIT_<i>`` (i below its GPU count) there is neither
  asked for nor refused as stray, whatever its value.

Quantities are read in name order over limits and requests where the core reads limits
in key order and then what is only in requests; the two differ only for a GPU resource in
requests alone, which the apiserver refuses.

Left to the webhook: what needs the cluster view (no-fitting-node, ResourceQuotas,
percentages resolved to MiB, MIG translation, ConfigMap env), limit-tampering's limits
above the request, and a mountPath with ``..``.

Scope as the webhooks': their matchCondition comes first (no validation runs on an
object outside it); pods (CREATE, UPDATE) and the workload kinds (CREATE, UPDATE),
namespaces other than kube-system and the install's; the policy's exemptions
(namespaces, users, groups, service accounts) are matchConditions. On a pod UPDATE a
rule refuses only what the old object did not already break, as the core judges an
update by what it adds.

Pure: a policy in, a list of objects out. CEL sees the objects without assuming any
optional field: each one is guarded by ``has()`` before it is read. Names and mountPaths
of containers, env entries, volumes and mounts are read as they are: the apiserver
validates the object before validating admission, and refuses one without them.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable, Iterable, Mapping
from functools import partial
from typing import Any, Final

from webhook.core.env import (
    CONTAINER_CLASSES,
    DEVICE_NAMES,
    DEVICE_PINS,
    DEVICE_PREFIXES,
    GUARDED_NAMES,
    GUARDED_PREFIXES,
    LIMIT_NAMES,
    LIMIT_PREFIXES,
    MANAGED_NAMES,
    MANAGED_PREFIXES,
    MPS_SETTINGS,
    SPELLED_NAMES,
    SPELLED_PREFIXES,
    Channel,
    ContainerClass,
    channel_of,
)
from webhook.core.injection import (
    LIBRARY_PATH,
    MODE_ANNOTATION,
    MPS_LIMIT_VARS,
    REGION_DIR,
    REGION_SUFFIX,
    REGION_VARIABLE,
    injection_for,
)
from webhook.core.objects import DEVICE_CLASS, ENV_SOURCES
from webhook.core.policy import (
    DEFAULT_SCHEDULER,
    DEVICE_CLASS_RESOURCE,
    MODES,
    Action,
    EnvAllowance,
    Identities,
    Ledger,
    Mode,
    Policy,
    normalised,
)
from webhook.core.resources import (
    CONTAINER_KINDS,
    KIND_LABELS,
    MAX_COUNT,
    MAX_GIB,
    MAX_MIB,
    PRIORITIES,
)
from webhook.core.rules import (
    _CONFIG_ROOTS,
    _DEVICE_PARENTS,
    _DEVICE_PREFIXES,
    _DEVICE_REQUEST_DIRS,
    _SIDE_ROOTS,
    CDI_MARK,
    CLASS_WORDS,
    CRIO_DEVICE_KEYS,
    DEVICE_REQUEST_MARK,
    LOOSENING,
    STACK_FILE_PREFIXES,
    STACK_ROOTS,
    SYS_ADMIN,
    read_paths,
)
from webhook.core.workload import KINDS_BY_PATH
from webhook.install.scope import literal
from webhook.install.scope import match_conditions as scope_conditions

Obj = dict[str, Any]

API_VERSION: Final = "admissionregistration.k8s.io/v1"
POLICY_KIND: Final = "ValidatingAdmissionPolicy"
BINDING_KIND: Final = "ValidatingAdmissionPolicyBinding"
KINDS: Final = (POLICY_KIND, BINDING_KIND)
NAME_PREFIX: Final = "gpushare-"
SYSTEM_NAMESPACES: Final = ("kube-system", "gpushare-system")
LABELS: Final = {
    "app.kubernetes.io/name": "gpushare-webhook",
    "app.kubernetes.io/part-of": "gpushare",
}
# Warn also records the failure in the apiserver's audit log, as the webhook records a warn
# violation in its own: an audit-first rollout reads either (`report --audit-log`).
VALIDATION_ACTIONS: Final[Mapping[Action, list[str]]] = {
    "deny": ["Deny"],
    "warn": ["Warn", "Audit"],
    "audit": ["Audit"],
}
# The actions whose failures an audit-first rollout counts: their policies also carry one
# auditAnnotation per rule (audit_annotations), because the apiserver's own
# validation_failure annotation keeps only the request's first failure.
RECORDED_ACTIONS: Final = ("warn", "audit")


def holds_variable(rule: str) -> str:
    """The variable that holds whether the object keeps ``rule`` (``holds_privileged_gpu``)."""
    return "holds_" + rule.replace("-", "_")


def audit_annotations(
    rules: Mapping[str, str], messages: Mapping[str, str]
) -> tuple[list[Obj], list[Obj]]:
    """One auditAnnotation per rule of ``rules`` (rule id -> its validation expression):
    the apiserver records ``<policy name>/<rule id>`` with the rule's message when the
    object breaks it (and nothing when not), whatever else it breaks. Returns the
    variables they read (a valueExpression may hold 5120 bytes, less than some rules
    take) and the annotations."""
    held = [{"name": holds_variable(rule), "expression": e} for rule, e in rules.items()]
    annotations = [
        {
            "key": rule,
            # An empty string is no annotation, as null is; the apiserver's type check
            # refuses a conditional of a string and null.
            "valueExpression": f"!variables.{holds_variable(rule)} ? "
            + literal(f"[{rule}] {messages[rule]}")
            + " : ''",
        }
        for rule in rules
    ]
    return held, annotations


_SERVICE_ACCOUNT: Final = "system:serviceaccount:"
_TRUTHY: Final = ("1", "true", "yes", "on", "y", "t")
_FALSY: Final = ("0", "false")
_HARMLESS_VISIBLE_DEVICES: Final = ("void", "none", "")
_VISIBLE: Final = "NVIDIA_VISIBLE_DEVICES"
_RESOURCE_RULES: Final = (
    ("", "replicationcontrollers"),
    ("apps", "deployments"),
    ("apps", "statefulsets"),
    ("apps", "daemonsets"),
    ("apps", "replicasets"),
    ("batch", "jobs"),
    ("batch", "cronjobs"),
)


# What Python's str.strip() drops (str.isspace()), which the core strips from env and
# annotation values. CEL's trim() keeps \x1c-\x1f, so values are matched with this class
# around the words instead of trimmed.
def _ranges(codes: Iterable[int]) -> str:
    """An RE2 class body of ``codes`` (ascending), runs as ranges."""
    runs: list[list[int]] = []
    for code in codes:
        if runs and runs[-1][1] == code - 1:
            runs[-1][1] = code
        else:
            runs.append([code, code])
    return "".join(
        f"\\x{{{low:x}}}" + (f"-\\x{{{high:x}}}" if high > low else "") for low, high in runs
    )


_SPACE: Final = "[" + _ranges(code for code in range(0x3001) if chr(code).isspace()) + "]"


def _stripped_in(value: str, words: Iterable[str]) -> str:
    """``value.strip().lower() in words`` (ASCII case: no other letter lowers to one of
    the words, all ASCII letters, digits and dashes)."""
    alternatives = "|".join("".join(c if c.isalnum() else "\\" + c for c in w) for w in words)
    regex = f"^{_SPACE}*(?:{alternatives}){_SPACE}*$"
    return f"{value}.lowerAscii().matches({literal(regex)})"


def _list(items: Iterable[str]) -> str:
    return "[" + ", ".join(literal(item) for item in items) + "]"


# --------------------------------------------------------------------------- globs


def glob_regex(pattern: str) -> str:
    """An RE2 regular expression (anchored) that matches what fnmatch's ``pattern`` matches.

    ``*`` any text, ``?`` one character, ``[...]`` a set (``[!...]`` negated); a ``[``
    without its ``]`` is literal, as in fnmatch.
    """
    out: list[str] = []
    i, n = 0, len(pattern)
    while i < n:
        c = pattern[i]
        i += 1
        if c == "*":
            out.append(".*")
        elif c == "?":
            out.append(".")
        elif c == "[":
            j = i
            if j < n and pattern[j] == "!":
                j += 1
            if j < n and pattern[j] == "]":
                j += 1
            while j < n and pattern[j] != "]":
                j += 1
            if j >= n:
                out.append(r"\[")
                continue
            body = pattern[i:j]
            i = j + 1
            negate = body.startswith("!")
            if negate:
                body = body[1:]
            out.append(_glob_set(body, negate=negate))
        else:
            out.append("\\" + c if not (c.isalnum() or c == "_") and c.isascii() else c)
    return "(?s)^" + "".join(out) + "$"


def _glob_set(body: str, *, negate: bool) -> str:
    """A fnmatch set ``[body]`` as an RE2 class: ``a-z`` ranges (a reversed one matches
    nothing, as fnmatch drops it), every other character literal."""
    items: list[str] = []
    k = 0
    while k < len(body):
        if k + 2 < len(body) and body[k + 1] == "-":
            low, high = ord(body[k]), ord(body[k + 2])
            if low <= high:
                items.append(f"\\x{{{low:x}}}-\\x{{{high:x}}}")
            k += 3
        else:
            items.append(f"\\x{{{ord(body[k]):x}}}")
            k += 1
    if not items:
        # Nothing in the set: a negated one matches any character, else none does.
        return "." if negate else "[^\\x{0}-\\x{10ffff}]"
    return ("[^" if negate else "[") + "".join(items) + "]"


def _glob_test(value: str, patterns: Iterable[str]) -> str:
    """``value`` (a CEL string) matches one of ``patterns`` as the core's match_any does."""
    exact = sorted({p for p in patterns if not any(ch in p for ch in "*?[")})
    globs = sorted({p for p in patterns if any(ch in p for ch in "*?[")})
    terms = []
    if exact:
        terms.append(f"{value} in {_list(exact)}")
    terms.extend(f"{value}.matches({literal(glob_regex(p))})" for p in globs)
    return " || ".join(terms) or "false"


def identity_test(identities: Identities) -> str:
    """The request comes from one of ``identities`` (as ``Identities.match``)."""
    user = "request.userInfo.username"
    terms = []
    if identities.users:
        terms.append(f"{user} in {_list(sorted(identities.users))}")
    if identities.groups:
        terms.append(
            "has(request.userInfo.groups) && request.userInfo.groups.exists(g, "
            f"g in {_list(sorted(identities.groups))})"
        )
    if identities.service_accounts:
        account = f"{user}.substring({len(_SERVICE_ACCOUNT)}).replace(':', '/', 1)"
        terms.append(
            f"{user}.startsWith({literal(_SERVICE_ACCOUNT)}) && "
            f"({_glob_test(account, identities.service_accounts)})"
        )
    return " || ".join(f"({t})" for t in terms) or "false"


# ------------------------------------------------------------------------ variables


def _get(root: str, path: Iterable[str]) -> str:
    """``root.<path>`` when every step exists, else an empty map."""
    guards = []
    node = root
    for part in path:
        node = f"{node}.{part}"
        guards.append(f"has({node})")
    return f"({' && '.join(guards)} ? {node} : {{}})"


def template(root: str, leaf: str) -> str:
    """``leaf`` (spec or metadata) of the pod or pod template in ``root`` by kind."""
    expression = "{}"
    for path, kinds in sorted(KINDS_BY_PATH.items(), key=lambda item: -len(item[0])):
        expression = (
            f"request.kind.kind in {_list(kinds)} ? {_get(root, (*path, leaf))} : {expression}"
        )
    return f"request.kind.kind == 'Pod' ? {_get(root, (leaf,))} : {expression}"


def container_list(spec: str) -> str:
    return " + ".join(f"(has({spec}.{kind}) ? {spec}.{kind} : [])" for kind in CONTAINER_KINDS)


def names_test(container: str, test: str, *, bind: bool = False) -> str:
    """``container`` names a resource ``r`` (in limits or requests) that passes ``test``,
    whatever its amount (with ``bind``, ``test`` reads it as ``X[r]``)."""
    c = container
    parts = [f"{c}.resources.{part}" for part in ("limits", "requests")]
    if bind:
        return (
            f"has({c}.resources) && ("
            + " || ".join(f"(has({p}) && [{p}].exists(X, X.exists(r, {test})))" for p in parts)
            + ")"
        )
    return (
        f"has({c}.resources) && ("
        + " || ".join(f"(has({p}) && {p}.exists(r, {test}))" for p in parts)
        + ")"
    )


def _zero(amount: str) -> str:
    """The quantity text ``amount`` is one the apiserver reads as zero (``is_zero``)."""
    return (
        f"isQuantity(string({amount})) && quantity(string({amount})).compareTo(quantity('0')) == 0"
    )


def vacant(policy: Policy, container: str) -> str:
    """``resources.vacant``: every GPU amount ``container`` names is zero (a quantity the
    apiserver stores as ``0``), a count or MIG instance among them, no priority."""
    c = container
    parts = (
        f"[has({c}.resources.limits) ? {c}.resources.limits : {{}}, "
        f"has({c}.resources.requests) ? {c}.resources.requests : {{}}]"
    )
    priorities = sorted(policy.priority_resources)
    other = f"r in {_list(priorities)} || " if priorities else ""
    zero = f"!({other}!({_zero('X[r]')}))"
    counts = sorted(policy.count_resources)
    counted = f"r in {_list(counts)} || " if counts else ""
    return (
        f"has({c}.resources) && {parts}.all(X, X.all(r, !({_gpu_resource(policy)}) || {zero})) "
        f"&& {parts}.exists(X, X.exists(r, {counted}{_mig_test(policy)}))"
    )


def vacates(policy: Policy) -> bool:
    """A container can be :func:`vacant` under ``policy``: it has a count or MIG resource."""
    return bool(policy.count_resources or policy.mig_prefixes)


def is_vacant(policy: Policy, container: str) -> str:
    """``container`` is one of ``variables.vacant`` (the object's containers of zero GPU
    amounts, by name: names are unique across a pod's containers, init and ephemeral
    containers, and a pod update cannot change a container's extended resources)."""
    return f"{container}.name in variables.vacant" if vacates(policy) else "false"


def asks_test(container: str, test: str, *, policy: Policy) -> str:
    """``container`` asks for a resource ``r`` (in limits or requests) that passes
    ``test``: it names one, and is not :func:`vacant` (``nvidia.com/gpu: 0`` asks for
    nothing)."""
    if not vacates(policy):
        return names_test(container, test)
    return f"!({is_vacant(policy, container)}) && {names_test(container, test)}"


def _requests(policy: Policy, containers: str, test: str) -> str:
    """A container asks for a resource ``r`` (in limits or requests) that passes ``test``."""
    return f"{containers}.exists(c, {asks_test('c', test, policy=policy)})"


def _mig_test(policy: Policy) -> str:
    prefixes = sorted(set(policy.mig_prefixes))
    return " || ".join(f"r.startsWith({literal(p)})" for p in prefixes) or "false"


def gpu_test(policy: Policy, containers: str, *, inline: bool = False) -> str:
    """Any GPU request (``PodRequests.gpu``): a resource of the policy or a MIG one, in a
    container that is not :func:`vacant`; ``inline`` tests that in place, where no
    variable is bound (a matchCondition)."""
    listed = f"r in {_list(sorted(policy.gpu_resources))}" if policy.gpu_resources else "false"
    test = f"{listed} || {_mig_test(policy)}"
    if inline and vacates(policy):
        return f"{containers}.exists(c, !({vacant(policy, 'c')}) && {names_test('c', test)})"
    return _requests(policy, containers, test)


def _sharing_test(policy: Policy) -> str:
    """``r`` is a shared GPU resource: one of the policy's that is not MIG."""
    listed = f"r in {_list(sorted(policy.gpu_resources))}" if policy.gpu_resources else "false"
    return f"({listed}) && !({_mig_test(policy)})"


def _mig(policy: Policy, containers: str) -> str:
    """A MIG instance (``PodRequests.mig``)."""
    return _requests(policy, containers, _mig_test(policy))


# Mode annotation values and the mode each means (webhook.core.mode).
MODE_ALIASES: Final[Mapping[str, str]] = {
    "vgpu": "vgpu",
    "hami-core": "vgpu",
    "mps": "mps",
    "mig": "mig",
    "none": "none",
}


_SELECTOR: Final = "(has(variables.spec.nodeSelector) ? variables.spec.nodeSelector : {})"


def _selects(key: str, value: str) -> str:
    """The pod's nodeSelector holds ``key`` as ``value`` (the core compares as text)."""
    return (
        f"{literal(key)} in {_SELECTOR} && string({_SELECTOR}[{literal(key)}]) == {literal(value)}"
    )


def _named_steps(policy: Policy) -> list[tuple[str, str]]:
    """(condition, mode) of the steps that name a mode (``ModeChoice.named``): each mode
    annotation with a mode as its value, each node selector of a mode."""
    words: dict[str, list[str]] = {}
    for word, meaning in MODE_ALIASES.items():
        words.setdefault(meaning, []).append(word)
    steps: list[tuple[str, str]] = []
    ann = "variables.annotations"
    for key in policy.mode_annotations:
        value = f"string({ann}[{literal(key)}])"
        for meaning, spelled in words.items():
            steps.append(
                (f"{literal(key)} in {ann} && {_stripped_in(value, spelled)}", literal(meaning))
            )
    for s in policy.node_selector_modes:
        steps.append((_selects(s.key, s.value), literal(s.mode)))
    return steps


def _mode_steps(policy: Policy) -> list[tuple[str, str]]:
    """(condition, mode) in the order :func:`webhook.core.mode.choose_mode` tries them: the
    :func:`_named_steps`, MIG resources, the namespace's mode."""
    steps = _named_steps(policy)
    steps.append(("variables.mig", "'mig'"))
    for mode, namespaces in policy.namespace_modes.items():
        steps.append((f"request.namespace in {_list(namespaces)}", literal(mode)))
    return steps


def _mode(policy: Policy) -> str:
    """The pod's mode as :func:`webhook.core.mode.choose_mode` picks it: the first of
    :func:`_mode_steps` that holds, else the policy's default."""
    expression = literal(policy.default_mode)
    for condition, mode in reversed(_mode_steps(policy)):
        expression = f"({condition}) ? {mode} : ({expression})"
    return expression


def _annotations(meta: str) -> str:
    return f"(has({meta}.annotations) ? {meta}.annotations : {{}})"


def variables(policy: Policy) -> list[Obj]:
    """The pod spec, metadata, containers and GPU request of the object and the old one."""
    pod_update = "request.kind.kind == 'Pod' && request.operation == 'UPDATE' && oldObject != null"
    return [
        {"name": "spec", "expression": template("object", "spec")},
        {"name": "meta", "expression": template("object", "metadata")},
        {"name": "containers", "expression": container_list("variables.spec")},
        {
            "name": "vacant",
            "expression": f"variables.containers.filter(c, {vacant(policy, 'c')}).map(c, c.name)",
        },
        {"name": "gpu", "expression": gpu_test(policy, "variables.containers")},
        # Each container's class, by name, read once (names are unique across a pod's
        # containers, and a pod update changes no container's name or resources, so the
        # old pod's containers are looked up here too, as in variables.vacant).
        {"name": "asking", "expression": _names_of(_asks_for_gpu(policy, "c"))},
        {"name": "slices", "expression": _names_of(_slice(policy, "c"))},
        {"name": "sharers", "expression": _names_of(_shares(policy, "c"))},
        {
            "name": "created",
            "expression": "request.kind.kind != 'Pod' || request.operation == 'CREATE'",
        },
        {"name": "podUpdate", "expression": pod_update},
        {"name": "oldSpec", "expression": f"{pod_update} ? {_get('oldObject', ('spec',))} : {{}}"},
        {
            "name": "oldMeta",
            "expression": f"{pod_update} ? {_get('oldObject', ('metadata',))} : {{}}",
        },
        {"name": "oldContainers", "expression": container_list("variables.oldSpec")},
        {"name": "oldGpu", "expression": gpu_test(policy, "variables.oldContainers")},
        {"name": "annotations", "expression": _annotations("variables.meta")},
        {"name": "oldAnnotations", "expression": _annotations("variables.oldMeta")},
        {"name": "sharing", "expression": "size(variables.sharers) > 0"},
        {"name": "mig", "expression": _mig(policy, "variables.containers")},
        {"name": "chosenMode", "expression": _mode(policy)},
        {"name": "scheduler", "expression": _wanted_scheduler(policy)},
        {"name": "dynamicMig", "expression": _dynamic_mig(policy)},
        {"name": "whole", "expression": _keeps_scheduler(policy)},
        # A pod that keeps its own scheduler for whole GPUs uses no mode.
        {"name": "mode", "expression": "variables.whole ? 'none' : variables.chosenMode"},
        {"name": "library", "expression": _library(policy)},
    ]


def _names_of(test: str) -> str:
    """The names of the object's containers ``c`` that pass ``test``."""
    return f"variables.containers.filter(c, {test}).map(c, c.name)"


def _library(policy: Policy) -> str:
    """``Policy.library_for`` of a vgpu pod (true in other modes): it asks for a sharing
    resource that vgpu.withoutLibrary does not list."""
    if not policy.without_library:
        return "true"
    served = asks_test(
        "c",
        f"({_sharing_test(policy)}) && !(r in {_list(sorted(policy.without_library))})",
        policy=policy,
    )
    return f"variables.mode != 'vgpu' || variables.containers.exists(c, {served})"


def placed_mps(policy: Policy) -> str:
    """``ModeChoice.placed``: an annotation of mps.placedByAnnotations says mps (its
    scheduler places the pod by the card's mode; no mps.nodeSelector)."""
    ann = "variables.annotations"
    words = [w for w, m in MODE_ALIASES.items() if m == "mps"]
    terms = [
        f"({literal(key)} in {ann} && {_stripped_in(f'string({ann}[{literal(key)}])', words)})"
        for key in sorted(policy.mps_placed_annotations)
    ]
    return f"({' || '.join(terms)})" if terms else "false"


def _dynamic_mig(policy: Policy) -> str:
    """``ModeChoice.dynamic``: the first mode annotation with a mode as its value is one of
    the policy's dynamicMigAnnotations and says mig, in a pod that asks for a slice."""
    ann = "variables.annotations"
    expression = "false"
    for key in reversed(policy.mode_annotations):
        value = f"string({ann}[{literal(key)}])"
        says = _stripped_in(value, [w for w, m in MODE_ALIASES.items() if m == "mig"])
        dynamic = says if key in policy.dynamic_mig_annotations else "false"
        expression = (
            f"({literal(key)} in {ann} && {_stripped_in(value, MODE_ALIASES)}) ? {dynamic} : "
            f"({expression})"
        )
    return f"variables.sharing && variables.chosenMode == 'mig' && ({expression})"


_SCHEDULER: Final = "variables.spec.schedulerName"


def _keeps_scheduler(policy: Policy) -> str:
    """``whole.keeps_scheduler``: only whole-GPU resources, no mode named, and a
    schedulerName that is not the cluster's own, the sharing one or an allowed one; under
    the cluster's own, whole GPUs another stack serves (:func:`_served_elsewhere`)."""
    if not policy.whole_gpu_resources:
        return "false"
    gpu = f"r in {_list(sorted(policy.gpu_resources))} || {_mig_test(policy)}"
    other = asks_test(
        "c", f"!(r in {_list(sorted(policy.whole_gpu_resources))}) && ({gpu})", policy=policy
    )
    named = " || ".join(f"({c})" for c, _ in _named_steps(policy)) or "false"
    default = f"!has({_SCHEDULER}) || {_SCHEDULER} in {_list(['', DEFAULT_SCHEDULER])}"
    own = (
        f"!({_SCHEDULER} in {_list(sorted(policy.allowed_schedulers))}) && "
        f"{_SCHEDULER} != ({wanted_scheduler(policy)})"
    )
    return (
        f"variables.sharing && !variables.containers.exists(c, {other}) && !({named}) && "
        f"(({default}) ? ({_served_elsewhere(policy)}) : ({own}))"
    )


def _served_elsewhere(policy: Policy) -> str:
    """``whole.served_elsewhere`` of a pod that asks only for whole GPUs: each is one of
    wholeGpus.draResources, or the pod selects a pool of wholeGpus.otherPools."""
    terms = []
    if policy.dra_resources:
        gpu = f"r in {_list(sorted(policy.gpu_resources))} || {_mig_test(policy)}"
        outside = f"({gpu}) && !(r in {_list(sorted(policy.dra_resources))})"
        terms.append(f"!variables.containers.exists(c, {asks_test('c', outside, policy=policy)})")
    for key, value in policy.other_pools:
        terms.append(
            f"{literal(key)} in {_SELECTOR} && "
            f"({_glob_test(f'string({_SELECTOR}[{literal(key)}])', [value])})"
        )
        terms.append(
            f"{NODE_TERMS}.exists(t, has(t.matchExpressions) && t.matchExpressions.exists(e, "
            f"e.key == {literal(key)} && e.operator == 'In' && has(e.values) && "
            f"e.values.exists(v, {_glob_test('v', [value])})))"
        )
    return " || ".join(f"({t})" for t in terms) or "false"


_REQUIRED: Final = "requiredDuringSchedulingIgnoredDuringExecution"
# The pod's required nodeSelectorTerms, [] where a level is missing.
NODE_TERMS: Final = (
    "(has(variables.spec.affinity) && has(variables.spec.affinity.nodeAffinity) && "
    f"has(variables.spec.affinity.nodeAffinity.{_REQUIRED}) && "
    f"has(variables.spec.affinity.nodeAffinity.{_REQUIRED}.nodeSelectorTerms) ? "
    f"variables.spec.affinity.nodeAffinity.{_REQUIRED}.nodeSelectorTerms : [])"
)


def holds_requirement(term: str, key: str, operator: str, value: str) -> str:
    """The nodeSelectorTerm ``term`` has the requirement ``key operator [value]`` (for In,
    among its values; for NotIn, exactly)."""
    values = (
        f"{literal(value)} in e.values" if operator == "In" else f"e.values == [{literal(value)}]"
    )
    return (
        f"has({term}.matchExpressions) && {term}.matchExpressions.exists(e, "
        f"e.key == {literal(key)} && e.operator == {literal(operator)} && has(e.values) && {values})"
    )


def _pool_selected(policy: Policy) -> str:
    """``whole.pool_selection`` finds something: the nodeSelector, or a required term
    ``In`` a pool label's value."""
    terms = [_selects(key, value) for key, value in policy.sharing_pool]
    terms.extend(
        f"{NODE_TERMS}.exists(t, {holds_requirement('t', key, 'In', value)})"
        for key, value in policy.sharing_pool
    )
    return " || ".join(f"({t})" for t in terms) or "false"


def _off_pool(policy: Policy) -> str:
    """The pod holds what ``mutation._pool_ops`` adds: every required term NotIn each pool
    label."""
    if not policy.sharing_pool:
        return "true"
    each = " && ".join(
        f"({holds_requirement('t', key, 'NotIn', value)})" for key, value in policy.sharing_pool
    )
    return f"size({NODE_TERMS}) > 0 && {NODE_TERMS}.all(t, {each})"


# ---------------------------------------------------------------------------- rules

# A rule's test of one pod: (containers, gpu, spec) CEL names in, "it breaks" out.
PodTest = Callable[[str, str, str], str]


def _value(entry: str) -> str:
    return f"(has({entry}.value) ? {entry}.value : '')"


def _opaque(entry: str) -> str:
    """From valueFrom or with $(VAR): the kubelet decides the value."""
    return f"has({entry}.valueFrom) || {_value(entry)}.contains('$(')"


def _env_exists(containers: str, test: str) -> str:
    return f"{containers}.exists(c, has(c.env) && c.env.exists(e, has(e.name) && ({test})))"


# Non-ASCII letters that upper-case to ASCII ones (Python's str.upper(), as Go's
# strings.ToUpper the runtimes use on capability names): CEL has only upperAscii().
_UPPER_TO_ASCII: Final = (("\u0131", "i"), ("\u017f", "s"))


def _upper(value: str) -> str:
    for letter, ascii_letter in _UPPER_TO_ASCII:
        value = f"{value}.replace({literal(letter)}, {literal(ascii_letter)})"
    return f"{value}.upperAscii()"


def _privileged(containers: str, gpu: str, spec: str) -> str:
    """A privileged container, or one adding CAP_SYS_ADMIN (the toolkit's isPrivileged)."""
    caps = "c.securityContext.capabilities"
    return (
        f"{gpu} && {containers}.exists(c, has(c.securityContext) && ("
        "(has(c.securityContext.privileged) && c.securityContext.privileged == true) || "
        f"(has({caps}) && has({caps}.add) && {caps}.add.exists(a, "
        f"{_upper('a')} in {_list(sorted(SYS_ADMIN))}))))"
    )


def _node_name(containers: str, gpu: str, spec: str) -> str:
    return f"variables.created && {gpu} && has({spec}.nodeName) && {spec}.nodeName != ''"


def asks_for_gpu(policy: Policy, c: str) -> str:
    """``resources.asks_for_gpu`` of container ``c`` (one of ``variables.asking``)."""
    return f"{c}.name in variables.asking"


def shares(policy: Policy, c: str) -> str:
    """Container ``c`` asks for a shared GPU resource (one of ``variables.sharers``)."""
    return f"{c}.name in variables.sharers"


def _shares(policy: Policy, c: str) -> str:
    return asks_test(c, _sharing_test(policy), policy=policy)


def _asks_for_gpu(policy: Policy, c: str) -> str:
    """``resources.asks_for_gpu`` of container ``c``: a claim, a resource of the policy or
    a MIG instance (unless it is :func:`vacant`), a resource whose name says gpu."""
    gpu = _gpu_resource(policy)
    other = f"!({gpu}) && r.lowerAscii().contains('gpu')"
    return (
        f"(has({c}.resources) && has({c}.resources.claims) && size({c}.resources.claims) > 0) "
        f"|| ({asks_test(c, gpu, policy=policy)}) || ({names_test(c, other)})"
    )


def _legacy(c: str) -> str:
    """``env.legacy_image`` of container ``c``: some CUDA_VERSION entry may be non-empty,
    not every NVIDIA_REQUIRE_CUDA entry is surely non-empty, no NVIDIA_VISIBLE_DEVICES."""
    named = f"has({c}.env) && {c}.env.exists(e, has(e.name) && e.name == "
    surely = f"!has(e.valueFrom) && {_value('e')} != '' && !{_value('e')}.contains('$(')"
    return (
        f"{named}'CUDA_VERSION' && ({_opaque('e')} || {_value('e')} != '')) && "
        f"!({named}'NVIDIA_REQUIRE_CUDA') && {c}.env.all(e, !has(e.name) || "
        f"e.name != 'NVIDIA_REQUIRE_CUDA' || ({surely}))) && "
        f"!({named}'NVIDIA_VISIBLE_DEVICES'))"
    )


def _spells(prefix: str) -> str:
    """``env.spells_guarded`` of the CEL string ``prefix``."""
    return (
        f"{_list(SPELLED_NAMES)}.exists(n, n.startsWith({prefix}) && n != {prefix}) || "
        f"{_list(SPELLED_PREFIXES)}.exists(n, n.startsWith({prefix}) || {prefix}.startsWith(n))"
    )


# ------------------------------------------------------------------ the env allowlist


def _starts(name: str, prefixes: Iterable[str]) -> list[str]:
    return [f"{name}.startsWith({literal(p)})" for p in prefixes]


def channel_test(name: str, channel: Channel) -> str:
    """``env.channel_of(name) == channel`` of the CEL string ``name``."""
    if channel == "devices":
        terms = [*_starts(name, DEVICE_PREFIXES), f"{name} in {_list(DEVICE_NAMES)}"]
    else:
        terms = [f"{name} in {_list(LIMIT_NAMES)}", *_starts(name, LIMIT_PREFIXES)]
    return " || ".join(terms)


def _managed(name: str, *, mps_client: str | None) -> str:
    """``env.managed`` of the CEL string ``name`` in a container that is a slice of an MPS
    pod where ``mps_client`` holds (None: never)."""
    terms = [f"{name} in {_list(sorted(MANAGED_NAMES))}", *_starts(name, MANAGED_PREFIXES)]
    if mps_client is not None:
        terms.append(f"({mps_client} && {name} in {_list(sorted(MPS_SETTINGS))})")
    return " || ".join(terms)


def slice_test(policy: Policy, c: str) -> str:
    """Container ``c`` asks for part of a GPU (one of ``variables.slices``)."""
    return f"{c}.name in variables.slices"


def _slice(policy: Policy, c: str) -> str:
    """Container ``c`` asks for part of a GPU (``rules.container_class`` 'slice')."""
    parts = sorted(policy.gpu_resources - policy.priority_resources - policy.whole_gpu_resources)
    listed = [f"r in {_list(parts)}"] if parts else []
    return asks_test(c, " || ".join([*listed, _mig_test(policy)]), policy=policy)


def _items_regex(items: Iterable[str], pattern: str | None) -> str:
    """``EnvAllowance.admits``' comma list: each item, blanks and tabs around it dropped,
    empty, among ``items`` or matching ``pattern`` (which cannot match a comma, a blank
    or a tab: policy.item_pattern_problem, so one expression over the whole value says
    what the core's split says)."""
    words = [re.escape(item) for item in sorted(items)]
    if pattern is not None:
        words.append(f"(?:{pattern})")
    item = f"[ \\t]*(?:{'|'.join(words)})?[ \\t]*"
    return f"^{item}(?:,{item})*$"


def _allowance_test(allowance: EnvAllowance, value: str, opaque: str) -> str:
    """``EnvAllowance.admits`` of the CEL string ``value`` (unknown where ``opaque`` holds)."""
    if allowance.values is not None:
        return f"!({opaque}) && {value} in {_list(allowance.values)}"
    if allowance.items is not None or allowance.item_pattern is not None:
        regex = _items_regex(allowance.items or (), allowance.item_pattern)
        return f"!({opaque}) && {value}.matches({literal(regex)})"
    return "true"


def env_admitted(
    policy: Policy,
    name: str,
    value: str,
    opaque: str,
    klass: ContainerClass | None,
    *,
    channel: Channel | None = None,
    bound: str = "k",
) -> str:
    """``Policy.env_admits`` of the CEL strings ``name`` = ``value`` (unknown where
    ``opaque`` holds) in a container of class ``klass`` (None: the class is the CEL string
    ``bound``): the entries naming it exactly decide, else those of its longest prefix; an
    entry for other classes admits nothing. With ``channel``, ``name`` is one of its names,
    so an entry naming another channel's name decides nothing."""
    exact: dict[str, list[EnvAllowance]] = {}
    prefixed: dict[str, list[EnvAllowance]] = {}
    for allowance in policy.env_allowances:
        bare = allowance.name.rstrip("*")
        if allowance.prefix:
            prefixed.setdefault(bare, []).append(allowance)
        elif channel is None or channel_of(bare) == channel:
            exact.setdefault(bare, []).append(allowance)

    def admits(allowance: EnvAllowance) -> str:
        test = _allowance_test(allowance, value, opaque)
        if klass is not None or set(allowance.containers) >= set(CONTAINER_CLASSES):
            return f"({test})"
        classes = [k for k in CONTAINER_CLASSES if k in allowance.containers]
        held = f"{bound} in {_list(classes)}"
        return f"({held} && {test})" if test != "true" else held

    def any_of(allowances: list[EnvAllowance]) -> str:
        tests = [admits(a) for a in allowances if klass is None or klass in a.containers]
        return " || ".join(tests) or "false"

    branches = [f"{name} == {literal(n)} ? ({any_of(a)})" for n, a in sorted(exact.items())]
    branches += [
        f"{name}.startsWith({literal(p)}) ? ({any_of(prefixed[p])})"
        for p in sorted(prefixed, key=lambda p: (-len(p), p))
    ]
    return " : ".join([*branches, "false"])


def _judged_entry(policy: Policy, channel: Channel, c: str) -> str:
    """The env entry ``e`` of container ``c`` sets a name of ``channel`` that no rule of
    its own judges and that is no device pin (a pin's value grants nothing:
    rules._allowlist_finding)."""
    pinned = " || ".join(
        f"(e.name == {literal(name)} && !has(e.valueFrom) && {_value('e')} == {literal(value)})"
        for name, value in DEVICE_PINS.items()
    )
    # The containers the mutation gives the MPS client's settings (mutation.wanted_env).
    mps_client = f"variables.mode == 'mps' && {shares(policy, c)}"
    managed = _managed("e.name", mps_client=mps_client)
    return f"has(e.name) && ({channel_test('e.name', channel)}) && !({managed}) && !({pinned})"


def unadmitted_entry(policy: Policy, channel: Channel, klass: ContainerClass | None, c: str) -> str:
    """The env entry ``e`` of container ``c`` sets a name of ``channel`` that no rule of
    its own judges and that the policy's env.allowed does not admit in a container of
    class ``klass`` (None: the class bound as ``k``)."""
    admitted = env_admitted(policy, "e.name", _value("e"), _opaque("e"), klass, channel=channel)
    return f"{_judged_entry(policy, channel, c)} && !({admitted})"


def _unadmitted_env(policy: Policy, containers: str, channel: Channel) -> str:
    """Some container sets a name of ``channel`` that no rule of its own judges and that
    the policy's env.allowed does not admit in a container of its class (the class
    decided once per container, each branch with the allowlist of its class)."""

    entry = unadmitted_entry(policy, channel, None, "c")
    return (
        f"{containers}.exists(c, has(c.env) && [{container_class('c')}].exists(k, "
        f"c.env.exists(e, {entry})))"
    )


def container_class(c: str) -> str:
    """``rules.container_class`` of container ``c``: 'slice', 'whole' or 'none'."""
    return (
        f"{c}.name in variables.slices ? 'slice' : {c}.name in variables.asking ? 'whole' : 'none'"
    )


# The annotations of the pod spec a PodTest reads.
_ANNOTATIONS_OF: Final = {
    "variables.spec": "variables.annotations",
    "variables.oldSpec": "variables.oldAnnotations",
}


def _devices_from_ledger(policy: Policy, spec: str) -> str:
    """``rules.devices_from_ledger`` of entry ``e`` of container ``c``: from the ConfigMap
    a ledger's writers keep for this container, in a pod of that ledger's scheduler."""
    annotations = _ANNOTATIONS_OF[spec]
    ref = "e.valueFrom.configMapKeyRef"
    # The container's place: <index> among the containers, i<index> among the init
    # containers (names are unique across both); an ephemeral one has none ("/").
    suffix = (
        f"(has({spec}.containers) && {spec}.containers.exists(x, x.name == c.name) ? "
        f"string({spec}.containers.map(x, x.name).indexOf(c.name)) : "
        f"has({spec}.initContainers) && {spec}.initContainers.exists(x, x.name == c.name) ? "
        f"'i' + string({spec}.initContainers.map(x, x.name).indexOf(c.name)) : '/')"
    )
    terms = []
    for ledger in policy.ledgers:
        wanted = ledger.devices_from
        if wanted is None or not ledger.config_maps:
            continue
        key = literal(wanted.name_annotation)
        asked = " || ".join(f"{literal(a)} in {annotations}" for a in wanted.request_annotations)
        terms.append(
            f"has({spec}.schedulerName) && {spec}.schedulerName == "
            f"{literal(wanted.scheduler_name)} && ({asked or 'false'}) && {key} in {annotations} "
            f"&& {ref}.name == {annotations}[{key}] + '-' + {suffix} && "
            f"({_glob_test(f'{ref}.name', ledger.config_maps)})"
        )
    if not terms:
        return "false"
    return (
        f"has(e.valueFrom.configMapKeyRef) && {ref}.key == {literal(_VISIBLE)} && "
        f"!(has({ref}.optional) && {ref}.optional) && "
        f"!(has({spec}.nodeName) && {spec}.nodeName != '') && "
        f"!({asks_for_gpu(policy, 'c')}) && (" + " || ".join(f"({t})" for t in terms) + ")"
    )


def _visible_devices(policy: Policy) -> PodTest:
    def test(containers: str, gpu: str, spec: str) -> str:
        harmless = _stripped_in(_value("e"), _HARMLESS_VISIBLE_DEVICES)
        from_ledger = _devices_from_ledger(policy, spec)
        raw = _env_exists(
            containers,
            f"e.name == 'NVIDIA_VISIBLE_DEVICES' && (has(e.valueFrom) ? !({from_ledger}) : "
            f"!({harmless}))",
        )
        # A legacy container that asks for no GPU gets every GPU; a slice, every capability.
        legacy = (
            f"{containers}.exists(c, ({_legacy('c')}) && (!({asks_for_gpu(policy, 'c')}) || "
            f"({gpu} && has(c.env) && c.env.exists(e, has(e.name) && "
            f"e.name == 'NVIDIA_REQUIRE_CUDA') && ({slice_test(policy, 'c')}))))"
        )
        prefixes = (
            f"{containers}.exists(c, has(c.envFrom) && c.envFrom.exists(s, has(s.prefix) && "
            f"s.prefix != '' && ({_spells('s.prefix')})))"
        )
        unadmitted = _unadmitted_env(policy, containers, "devices")
        return f"({raw}) || ({legacy}) || ({prefixes}) || ({unadmitted})"

    return test


def loosening(policy: Policy, entry: str) -> str:
    """``rules._loosening``: the env entry ``entry`` switches HAMi-core's enforcement
    off or loosens it."""
    value = _value(entry)
    opaque = _opaque(entry)
    name = f"{entry}.name"
    terms = [
        f"{name} == 'CUDA_DISABLE_CONTROL' && ({opaque} || {_stripped_in(value, _TRUTHY)})",
        f"{name} == 'CUDA_REDIRECT' && ({opaque} || {value} != '')",
        f"{name} == 'ACTIVE_OOM_KILLER' && ({opaque} || {_stripped_in(value, _FALSY)})",
        f"{name} == 'CGPU_DISABLE' && ({opaque} || !({_stripped_in(value, _FALSY)}))",
        f"{name} == {literal(REGION_VARIABLE)} && ({opaque} || !({region_readable(value)}))",
        f"{name} == 'CUDA_TASK_PRIORITY' && ({opaque} || "
        f"!({_stripped_in(value, [str(p) for p in PRIORITIES])}))",
    ]
    if not policy.allow_disable_core_utilization_policy:
        disable = _stripped_in(value, ("disable",))
        terms.insert(1, f"{name} == 'GPU_CORE_UTILIZATION_POLICY' && ({opaque} || {disable})")
    return " || ".join(f"({t})" for t in terms)


def region_readable(value: str) -> str:
    """``injection.region_readable`` of the CEL string ``value``: its segments, without
    empty ones and ``.``, are those of REGION_DIR and one ``.cache`` name."""
    wanted = REGION_DIR.strip("/").split("/")
    parts = " && ".join(f"g[{i}] == {literal(part)}" for i, part in enumerate(wanted))
    name = f"g[{len(wanted)}]"
    return (
        f"{value}.startsWith('/') && [{value}.split('/').filter(s, s != '' && s != '.')]"
        f".exists(g, size(g) == {len(wanted) + 1} && {parts} && "
        f"{name}.endsWith({literal(REGION_SUFFIX)}) && !{name}.contains('libvgpu.so'))"
    )


def _switches(policy: Policy) -> PodTest:
    def test(containers: str, gpu: str, spec: str) -> str:
        switched = _env_exists(containers, loosening(policy, "e"))
        return f"{gpu} && (({switched}) || ({_unadmitted_env(policy, containers, 'limits')}))"

    return test


# ------------------------------------------------------------------ host-device-access


def _normalised(path: str) -> str:
    """``rules.normalised`` of the CEL string ``path`` when it has no ``..`` segment:
    ``//``, ``.`` and a trailing slash dropped, rooted."""
    return f"('/' + {path}.split('/').filter(s, s != '' && s != '.').join('/'))"


def _reaching(path: str, roots: Iterable[str], *, parents: bool) -> str:
    """The normalised CEL string ``path`` is one of ``roots`` (normalised), lies below
    one, or (``parents``) is a directory above one, as the core's ``_contains``."""
    exact: set[str] = set()
    prefixes: set[str] = set()
    for root in roots:
        exact.add(root)
        prefixes.add(root.rstrip("/") + "/" if not parents else root + "/")
        if parents:
            # root.startswith(path + "/"): every directory above the root but "/".
            exact.update(root[:i] for i in range(1, len(root)) if root[i] == "/")
    terms = [f"{path} in {_list(sorted(exact))}"] if exact else []
    terms.extend(f"{path}.startsWith({literal(p)})" for p in sorted(prefixes))
    return " || ".join(terms) or "false"


def _protected(policy: Policy, path: str) -> str:
    """``rules._protected`` of the normalised CEL string ``path``."""
    roots = (
        *_SIDE_ROOTS,
        posixpath.dirname(policy.library_host_path),
        policy.lock_host_path,
        policy.mps_pipe_directory,
        *policy.protected_host_paths,
    )
    devices = [f"{path} in {_list(sorted(_DEVICE_PARENTS))}"]
    devices.extend(f"{path}.startsWith({literal(p)})" for p in _DEVICE_PREFIXES)
    reaching = _reaching(path, sorted({normalised(r) for r in roots}), parents=True)
    return " || ".join(devices) + " || " + reaching


def _same_volume(volume: str, injected: Mapping[str, Any]) -> str:
    """``volume`` is ``injected`` (``injection.same_volume``): the apiserver allows one
    source per volume, so the injected source's fields say it all; it has defaulted
    ``hostPath.type``, so every field is compared."""
    name = f"{volume}.name == {literal(injected['name'])}"
    if "hostPath" in injected:
        host = injected["hostPath"]
        return (
            f"{name} && has({volume}.hostPath) && "
            f"{volume}.hostPath.path == {literal(host['path'])} && "
            f"has({volume}.hostPath.type) && {volume}.hostPath.type == {literal(host['type'])}"
        )
    return (
        f"{name} && has({volume}.emptyDir) && !has({volume}.emptyDir.medium) && "
        f"!has({volume}.emptyDir.sizeLimit)"
    )


def injects(mode: Mode) -> str:
    """The pod is in ``mode`` (vgpu or mps) and gets what ``injection_for`` gives it: a vgpu
    pod only with HAMi-core (``variables.library``)."""
    test = f"variables.mode == {literal(mode)}"
    return f"{test} && variables.library" if mode == "vgpu" else test


def _injected(policy: Policy, volume: str) -> str:
    """``volume`` is exactly one the mutation injects into this pod (a sharing pod in
    mode vgpu or mps)."""
    by_mode = []
    for mode in ("vgpu", "mps"):
        exact = [
            f"({_same_volume(volume, v)})"
            for v in injection_for(mode, policy).volumes
            if "hostPath" in v
        ]
        if exact:
            by_mode.append(f"({injects(mode)} && ({' || '.join(exact)}))")
    return f"variables.sharing && ({' || '.join(by_mode) or 'false'})"


def _read_only_volume(policy: Policy, mount: str) -> str:
    """``mount`` names a volume the mutation injects as shared, and is not read-only."""
    by_mode = []
    for mode in ("vgpu", "mps"):
        names = sorted(injection_for(mode, policy).read_only_volumes)
        if names:
            by_mode.append(f"({injects(mode)} && {mount}.name in {_list(names)})")
    return (
        f"variables.sharing && has({mount}.name) && ({' || '.join(by_mode) or 'false'}) && "
        f"!(has({mount}.readOnly) && {mount}.readOnly == true)"
    )


def _writes(containers: str, name: str) -> str:
    """Some container mounts the volume ``name`` without readOnly (``rules._written``)."""
    return (
        f"{containers}.exists(c, has(c.volumeMounts) && c.volumeMounts.exists(m, "
        f"has(m.name) && m.name == {name} && !(has(m.readOnly) && m.readOnly == true)))"
    )


def _host_paths(policy: Policy, containers: str, gpu: str, spec: str) -> str:
    """``rules._host_path_findings``: a hostPath volume, not one the mutation injects,
    that is protected, holds the GPU runtime's configuration and is written, or (allowlist
    mode, in a GPU pod) lies outside the allowed paths. The apiserver refuses a hostPath
    with a ``..`` segment, so the CEL normalisation is the core's."""
    checks = [
        _protected(policy, "p"),
        f"({_reaching('p', _CONFIG_ROOTS, parents=True)}) && {_writes(containers, 'v.name')}",
        f"({_reaching('p', (*STACK_ROOTS, *policy.driver_roots), parents=True)} || "
        f"{_list(STACK_FILE_PREFIXES)}.exists(f, p.substring(p.lastIndexOf('/') + 1)"
        f".startsWith(f))) && {_writes(containers, 'v.name')}",
    ]
    if policy.host_path_mode == "allowlist":
        allowed = _reaching("p", policy.allowed_host_paths, parents=False)
        checks.append(f"{gpu} && !({allowed})")
    path = "v.hostPath.path"
    return (
        f"has({spec}.volumes) && {spec}.volumes.exists(v, has(v.hostPath) && "
        f"has(v.hostPath.path) && !({_injected(policy, 'v')}) && "
        f"[{_normalised(path)}].exists(p, {' || '.join(f'({c})' for c in checks)}))"
    )


def _path_tests(policy: Policy, target: str) -> tuple[str, str, str]:
    """For the CEL string path ``target`` (``q``: it normalised): it asks the NVIDIA
    runtime for devices (its root a string prefix, raw or cleaned); it lies at or below a
    path the GPU stack reads; it names the device-request mark or a read path's name (what
    a path with ``..``, which CEL cannot resolve, is refused for)."""
    requests = " || ".join(
        f"{v}.startsWith({literal(d)})" for v in (target, "q") for d in _DEVICE_REQUEST_DIRS
    )
    paths = read_paths(policy)
    reads = _reaching("q", paths.roots, parents=False)
    named = (
        f"{target}.contains({literal(DEVICE_REQUEST_MARK)}) || "
        f"{target}.split('/').exists(s, s in {_list(sorted(paths.names))})"
    )
    return requests, reads, named


def _device_shadow(policy: Policy, device: str) -> str:
    """``rules._device_findings``: a block device at (or, by ``..``, beside) a path the GPU
    stack reads, or at a device request; none is ever injected."""
    target = f"{device}.devicePath"
    requests, reads, named = _path_tests(policy, target)
    return (
        f"has({target}) && ({named}) && ({target}.split('/').exists(s, s == '..') || "
        f"[{_normalised(target)}].exists(q, {requests} || {reads}))"
    )


def _shadow(policy: Policy, mount: str) -> str:
    """``rules._mount_findings``' paths: ``mount`` asks the NVIDIA runtime for devices, or
    lies at or below a path the GPU stack reads inside the container and is not a mount
    the mutation injects. A mountPath may hold ``..`` (the apiserver allows it there),
    which CEL cannot resolve: one beside the device-request mark or a read path's name is
    refused wherever it leads."""
    target = f"{mount}.mountPath"
    requests, reads, named = _path_tests(policy, target)
    return (
        f"has({target}) && ({target}.split('/').exists(s, s == '..') ? ({named}) : "
        f"[{_normalised(target)}].exists(q, {requests} || "
        f"(({reads}) && !({_injected_mount(policy, mount)}))))"
    )


def _injected_mount(policy: Policy, mount: str) -> str:
    """``rules._injected_mount`` at validation: ``mount`` is one the mutation injects into
    a pod of this mode, of the volume it injects under that name."""
    by_mode = []
    for mode in ("vgpu", "mps"):
        injection = injection_for(mode, policy)
        exact = []
        for injected in injection.mounts:
            volume = next(v for v in injection.volumes if v["name"] == injected["name"])
            exact.append(
                f"({mount}.mountPath == {literal(injected['mountPath'])} && "
                f"{_same_mount(mount, injected)} && variables.spec.volumes.exists(v, "
                f"{_same_volume('v', volume)}))"
            )
        if exact:
            by_mode.append(f"({injects(mode)} && ({' || '.join(exact)}))")
    return (
        f"variables.sharing && has(variables.spec.volumes) && ({' || '.join(by_mode) or 'false'})"
    )


def _host_access(policy: Policy, containers: str, gpu: str, spec: str, annotations: str) -> str:
    """host-device-access of one pod: its hostPath volumes, its containers' mounts and
    its CDI annotations."""
    mounts = (
        f"{containers}.exists(c, (has(c.volumeMounts) && c.volumeMounts.exists(m, "
        f"({_shadow(policy, 'm')}) || ({_read_only_volume(policy, 'm')}))) || "
        f"(has(c.volumeDevices) && c.volumeDevices.exists(d, {_device_shadow(policy, 'd')})))"
    )
    cdi = _runtime_annotations(policy, annotations)
    namespaces = (
        f"{gpu} && ((has({spec}.hostPID) && {spec}.hostPID == true) || "
        f"(has({spec}.hostIPC) && {spec}.hostIPC == true && "
        "!(variables.mode == 'mps' && variables.sharing)))"
    )
    terms = [_host_paths(policy, containers, gpu, spec), mounts, cdi, namespaces]
    if policy.gpu_runtime_classes:
        # A container under a GPU runtime class that asks for no GPU and lacks the void
        # (rules._container_findings; the mutation voids containers and init containers).
        classes = _list(sorted(policy.gpu_runtime_classes))
        terms.append(
            f"has({spec}.runtimeClassName) && {spec}.runtimeClassName in {classes} && "
            f"{containers}.exists(c, !({asks_for_gpu(policy, 'c')}) && "
            f"!(has(c.env) && c.env.exists(e, e.name == {literal(_VISIBLE)})))"
        )
    return " || ".join(f"({t})" for t in terms)


def _runtime_annotations(policy: Policy, annotations: str) -> str:
    """``rules._cdi_findings``: any ``cdi.k8s.io/`` key, CRI-O's devices annotation naming
    a device off the policy's list (entries as ``rules.unlisted_devices`` splits them),
    a key with one of the policy's refused prefixes."""
    allowed = _list(sorted(policy.annotation_devices))
    crio = f"k in {_list(CRIO_DEVICE_KEYS)}"
    terms = [
        f"k.contains({literal(CDI_MARK)})",
        f"({crio}) && string({annotations}[k]).split(',').exists(e, e != '' && "
        f"(e.split(':').size() > 3 || !(e.split(':')[0] in {allowed})))",
    ]
    terms.extend(f"k.startsWith({literal(p)})" for p in policy.refused_annotation_prefixes)
    return f"{annotations}.exists(k, {' || '.join(f'({t})' for t in terms)})"


def _host_device_access(policy: Policy) -> str:
    """host-device-access of the object; on a pod UPDATE only when the old pod passed it.

    The old pod is judged in the new one's mode (only an annotation can change it; there
    is no variable for the old mode). That never refuses what the core admits: each
    finding the new pod shares with the old one (a volume, a container's mount, a CDI
    key), the old pod also has in the new mode, since volumes and containers' mounts do
    not change on an update.
    """
    new = _host_access(
        policy, "variables.containers", "variables.gpu", "variables.spec", "variables.annotations"
    )
    old = _host_access(
        policy,
        "variables.oldContainers",
        "variables.oldGpu",
        "variables.oldSpec",
        "variables.oldAnnotations",
    )
    return f"!(({new}) && !(variables.podUpdate && ({old})))"


# ------------------------------------------------------------------- GPU requests

# ``resources.read_container`` in CEL. Its expressions read one container through ``L``
# and ``R``, its limits and requests (bound by :func:`_parts`), and a resource name
# through ``r``. The apiserver hands admission each quantity in its canonical spelling
# (``1e3`` as ``1k``, ``3Gi`` kept): the core parses that same text. Where the core keeps
# the last value of several resources of one kind, it reads limits in key order (the
# order the apiserver serialises a map in) and then what is only in requests; here they
# are read in name order over both, which differs only for a GPU resource in requests
# alone, which the apiserver refuses (an extended resource cannot be overcommitted).

_LIMITS: Final = "(has({c}.resources) && has({c}.resources.limits) ? {c}.resources.limits : {{}})"
_REQUESTS: Final = (
    "(has({c}.resources) && has({c}.resources.requests) ? {c}.resources.requests : {{}})"
)
# ``_integer``'s priority: ASCII digits, as text (a quantity holds no space to strip).
_PRIORITY: Final = "^-?[0-9]{1,9}$"
# Below every priority the text can hold: "none found".
_NO_PRIORITY: Final = -(10**10)


def _priority_valid(v: str) -> str:
    """``_read_sharing`` takes the quantity text ``v`` as a priority: an integer HAMi
    documents (resources.PRIORITIES)."""
    return f"{v}.matches({literal(_PRIORITY)}) && int({v}) in {_list_ints(PRIORITIES)}"


def _parts(c: str, body: str) -> str:
    """``body`` (a boolean) with ``L`` and ``R`` bound to container ``c``'s limits and
    requests (a one-element list binds a name: the apiserver's CEL has no cel.bind)."""
    return f"[{_LIMITS.format(c=c)}].exists(L, [{_REQUESTS.format(c=c)}].exists(R, {body}))"


def _parts_value(c: str, body: str) -> str:
    """``body`` (any value) with ``L`` and ``R`` bound as in :func:`_parts`."""
    return f"[{_LIMITS.format(c=c)}].map(L, [{_REQUESTS.format(c=c)}].map(R, {body})[0])[0]"


def _whole(v: str, low: int, high: int) -> str:
    """``_integer`` accepts the quantity text ``v``: a whole number low..high, without a
    binary suffix (``3Gi`` of MiB is a unit mistake, never 3 GiB)."""
    return (
        f"isQuantity({v}) && !{v}.endsWith('i') && quantity({v}).isInteger() && "
        f"quantity({v}).asInteger() >= {low} && quantity({v}).asInteger() <= {high}"
    )


def _amount(value: str, low: int, high: int, scale: int = 1) -> str:
    """The whole number ``value`` (a quantity as CEL) holds within low..high, times
    ``scale``; -1 when ``_integer`` refuses it."""
    times = f" * {scale}" if scale != 1 else ""
    whole = _whole("v", low, high)
    return f"[string({value})].map(v, {whole} ? quantity(v).asInteger(){times} : -1)[0]"


_ASKED: Final = "string(r in L ? L[r] : R[r])"


def _asked(names: Iterable[str]) -> str:
    """The resources of ``names`` the container asks for, in name order."""
    return f"{_list(sorted(names))}.filter(r, r in L || r in R)"


def _last(values: str, default: str) -> str:
    return f"[{values}].map(x, size(x) > 0 ? x[size(x) - 1] : {default})[0]"


def _units(policy: Policy) -> list[tuple[str, int, int]]:
    """(test of ``r``, low, high) of each unit, in the order ``read_container`` tries them."""
    units = [(_mig_test(policy), 1, MAX_COUNT)]
    for names, high in (
        (policy.count_resources, MAX_COUNT),
        (policy.memory_mib_resources, MAX_MIB),
        # Above MAX_GIB, up to MAX_MIB, a GiB value is read as MiB (resources._RANGES).
        (policy.memory_gib_resources, MAX_MIB),
        (policy.memory_percentage_resources | policy.cores_resources, 100),
    ):
        if names:
            units.append((f"r in {_list(sorted(names))}", 1, high))
    return units


def _valid(policy: Policy, v: str) -> str:
    """The quantity text ``v`` of GPU resource ``r`` is what its unit allows."""
    expression = _priority_valid(v)
    for test, low, high in reversed(_units(policy)):
        expression = f"({test}) ? ({_whole(v, low, high)}) : ({expression})"
    return expression


def _gpu_resource(policy: Policy) -> str:
    """``r`` is a GPU resource of the policy (``Policy.is_gpu_resource``)."""
    listed = f"r in {_list(sorted(policy.gpu_resources))} || " if policy.gpu_resources else ""
    return f"{listed}{_mig_test(policy)}"


def _same_amount(a: str, b: str) -> str:
    """``resources._same_quantity``: the same text, or the same quantity."""
    return (
        f"string({a}) == string({b}) || (isQuantity(string({a})) && isQuantity(string({b})) && "
        f"quantity(string({a})).compareTo(quantity(string({b}))) == 0)"
    )


def _invalid_request(policy: Policy) -> str:
    """``read_container``'s problems of container ``c``: a GPU resource in requests but not
    limits or differing from its limit, a value its unit does not allow, memory asked
    twice."""
    gpu = _gpu_resource(policy)
    terms = [
        f"R.exists(r, ({gpu}) && !(r in L && ({_same_amount('R[r]', 'L[r]')})))",
        f"L.exists(r, ({gpu}) && !([string(L[r])].exists(v, {_valid(policy, 'v')})))",
    ]
    if len(policy.memory_resources) > 1:
        terms.append(f"size({_asked(policy.memory_resources)}) > 1")
    return _parts("c", " || ".join(f"({t})" for t in terms))


def _ask(policy: Policy, c: str, *, init: bool = False) -> str:
    """What container ``c`` asks for as ``read_container`` counts it, as a map of ints:
    ``g`` its (v)GPUs (the last count resource, 1 when invalid or absent), ``d`` the GPU
    devices it gets (``rules._gpus``), ``m`` its memory in MiB (the last valid one, else 0),
    ``k`` its cores (the last cores resource, -1 when invalid or absent), ``pct`` its memory
    percentage (likewise), ``p`` its priority (the last valid one, else HAMi-core's 1);
    with ``init``, ``side``: 1 for a sidecar (restartPolicy Always)."""
    counts = f"{_asked(policy.count_resources)}.map(r, {_amount(_ASKED, 1, MAX_COUNT)})"
    gpus = f"[{counts}].map(x, size(x) > 0 && x[size(x) - 1] > 0 ? x[size(x) - 1] : 1)[0]"
    mib = sorted(policy.memory_mib_resources)
    # A GiB value above MAX_GIB is MiB (resources._read_sharing).
    gib = f"[{_amount(_ASKED, 1, MAX_GIB, 1024)}].map(x, x > 0 ? x : {_amount(_ASKED, MAX_GIB + 1, MAX_MIB)})[0]"
    memory = (
        f"{_asked(policy.memory_resources)}.map(r, r in {_list(mib)} ? "
        f"{_amount(_ASKED, 1, MAX_MIB)} : {gib}).filter(x, x > 0)"
    )
    cores = f"{_asked(policy.cores_resources)}.map(r, {_amount(_ASKED, 1, 100)})"
    percentage = f"{_asked(policy.memory_percentage_resources)}.map(r, {_amount(_ASKED, 1, 100)})"
    priority = (
        f"{_asked(policy.priority_resources)}.map(r, {_priority_valid(_ASKED)} ? "
        f"int({_ASKED}) : {_NO_PRIORITY}).filter(x, x != {_NO_PRIORITY})"
    )
    mig = f"L.exists(r, {_mig_test(policy)}) || R.exists(r, {_mig_test(policy)})"
    # Each MIG instance counts, 1 when its count is invalid.
    devices = (
        f"(L.filter(r, {_mig_test(policy)}).map(r, {_amount(_ASKED, 1, MAX_COUNT)}) + "
        f"R.filter(r, !(r in L) && ({_mig_test(policy)})).map(r, {_amount(_ASKED, 1, MAX_COUNT)})"
        ").map(n, n > 0 ? n : 1).sum()"
    )
    shares = f"{_list(sorted(_slices(policy)))}.exists(r, r in L || r in R)"
    fields = {
        "g": gpus,
        "d": f"{shares} ? {gpus} : ({mig} ? {devices} : 0)",
        "m": _last(memory, "0"),
        "k": _last(cores, "-1"),
        "pct": _last(percentage, "-1"),
        "p": _last(priority, "1"),
    }
    if init:
        fields["side"] = f"has({c}.restartPolicy) && {c}.restartPolicy == 'Always' ? 1 : 0"
        # Its place among the init containers (their names are unique), for the sidecars
        # declared before it: Kubernetes 1.30's CEL has no lists.range to index by.
        fields["i"] = f"variables.spec.initContainers.map(x, x.name).indexOf({c}.name)"
    body = "{" + ", ".join(f"{literal(k)}: {v}" for k, v in fields.items()) + "}"
    return _parts_value(c, body)


def _slices(policy: Policy) -> list[str]:
    """The policy's shared (non-MIG) GPU resources."""
    return [r for r in policy.gpu_resources if not r.startswith(policy.mig_prefixes)]


def request_variables(policy: Policy) -> list[Obj]:
    """What the validations of GPU requests read, per container as :func:`_ask` counts it:
    ``mainAsks`` of the containers, ``initAsks`` of the init containers (ephemeral
    containers may not ask for resources)."""
    spec = "variables.spec"
    named = " + ".join(
        f"(has({spec}.{kind}) ? {spec}.{kind}.filter(c, !({is_vacant(policy, 'c')}))"
        ".map(c, c.name) : [])"
        for kind in ("containers", "initContainers")
    )
    return [
        # The names of mainAsks' and initAsks' containers, in their order.
        {"name": "askNames", "expression": named},
        {
            "name": "mainAsks",
            "expression": f"has({spec}.containers) ? {spec}.containers"
            f".filter(c, !({is_vacant(policy, 'c')})).map(c, {_ask(policy, 'c')}) : []",
        },
        {
            "name": "initAsks",
            "expression": f"has({spec}.initContainers) ? {spec}.initContainers"
            f".filter(c, !({is_vacant(policy, 'c')})).map(c, {_ask(policy, 'c', init=True)}) : []",
        },
    ]


def _invalid_gpu_request(policy: Policy) -> str:
    return (
        "!(variables.created && variables.gpu && variables.containers.exists(c, "
        f"!({is_vacant(policy, 'c')}) && {_invalid_request(policy)}))"
    )


# ------------------------------------------------------------------- mode-conflict


def _allowed_in_namespace(patterns: Iterable[str]) -> str:
    """``Policy.mode_allowed`` for the request's namespace (``match_any``)."""
    patterns = list(patterns)
    return "true" if "*" in patterns else _glob_test("request.namespace", patterns)


def _mode_conflict(policy: Policy) -> str:
    """``mode.choose_mode``'s findings and ``rules.mps_percentage``: a mode annotation
    whose value is no mode (before the first that is one), containers the mode cannot
    satisfy, node selectors of another mode, an MPS node selector with another value, a
    mode the namespace may not use, and an mps container asking for memory as a
    percentage (only the cluster view turns it into MiB; without it, refused)."""
    mode, ann = "variables.mode", "variables.annotations"
    misspelt = "false"
    for key in reversed(policy.mode_annotations):
        value = _stripped_in(f"string({ann}[{literal(key)}])", MODE_ALIASES)
        misspelt = f"({literal(key)} in {ann} ? !({value}) : ({misspelt}))"
    named = f"!({' || '.join(f'({c})' for c, _ in _mode_steps(policy))})"
    unnamed = f" && {named}" if policy.default_mode == "none" else ""
    mig, sharer = asks_test("c", _mig_test(policy), policy=policy), shares(policy, "c")
    containers = (
        f"variables.containers.exists(c, [{mig}].exists(mig, [{sharer}].exists(shares, "
        f"(mig && (shares || {mode} != 'mig')) || "
        f"(shares && (({mode} == 'mig' && !variables.dynamicMig) || ({mode} == 'none'{unnamed}))))))"
    )
    terms = [misspelt, containers]
    terms.extend(
        f"{_selects(s.key, s.value)} && {mode} != {literal(s.mode)}"
        for s in policy.node_selector_modes
    )
    for key, wanted in policy.mps_node_selector.items():
        terms.append(
            f"{mode} == 'mps' && !{placed_mps(policy)} && {literal(key)} in {_SELECTOR} && "
            f"string({_SELECTOR}[{literal(key)}]) != {literal(wanted)}"
        )
    allowed = " || ".join(
        f"({mode} == {literal(m)} && "
        f"({_allowed_in_namespace(policy.allowed_namespaces.get(m, ()))}))"
        for m in MODES
    )
    terms.append(f"{mode} != 'none' && !({allowed})")
    if policy.memory_percentage_resources:
        terms.append(
            f"{mode} == 'mps' && (variables.mainAsks + variables.initAsks)"
            ".exists(a, a['pct'] > 0 && a['m'] == 0)"
        )
    # A pod that keeps its scheduler for whole GPUs uses no mode (the core drops the
    # choice's findings).
    return (
        "!(variables.created && variables.gpu && !variables.whole && ("
        + " || ".join(f"({t})" for t in terms)
        + "))"
    )


# ----------------------------------------------------------------------- gpu-quota


def _gpu_quota(policy: Policy) -> str | None:
    """``rules.gpu_quota`` against the policy's maxima, or None when it sets none: per
    container its devices, memory times its (v)GPUs and cores; per pod what runs at its
    peak (``rules.pod_totals``: main containers beside the sidecars, or a plain init
    container beside the sidecars declared before it)."""
    each, pod = policy.container_maxima, policy.pod_maxima
    terms = []
    asks = "(variables.mainAsks + variables.initAsks)"
    per_container = []
    if each.gpus is not None:
        per_container.append(f"a['d'] > {each.gpus}")
    if each.memory_mib is not None:
        per_container.append(f"a['m'] * a['g'] > {each.memory_mib}")
    if each.cores is not None:
        per_container.append(f"a['k'] > {each.cores}")
    if per_container:
        terms.append(f"{asks}.exists(a, {' || '.join(per_container)})")
    init = "variables.initAsks"
    for limit, amount in ((pod.gpus, "a['d']"), (pod.memory_mib, "a['m'] * a['g']")):
        if limit is None:
            continue
        total = (
            f"(variables.mainAsks.map(a, {amount}) + {init}.filter(a, a['side'] == 1)"
            f".map(a, {amount}) + [0]).sum()"
        )
        before = (
            f"({init}.filter(b, b['side'] == 1 && b['i'] < x['i']).map(a, {amount}) + [0]).sum()"
        )
        alone = f"{init}.exists(x, x['side'] == 0 && [x].map(a, {amount})[0] + {before} > {limit})"
        terms.append(f"{total} > {limit} || {alone}")
    if not terms:
        return None
    return "!(variables.created && variables.gpu && (" + " || ".join(f"({t})" for t in terms) + "))"


# --------------------------------------------------------------- unmutated-gpu-pod


# What an env entry from valueFrom reads as in ``values``: no wanted value, nor any value
# a test admits (a literal NUL fails them all too, as the core replaces it).
_FROM_ELSEWHERE: Final = "'\\x00'"
# ``names`` and ``values`` of container ``c``'s env entries, one pass each.
_ENV_BINDINGS: Final = (
    "[has(c.env) ? c.env : []].exists(env, [env.map(e, e.name)].exists(names, "
    f"[env.map(e, has(e.valueFrom) ? {_FROM_ELSEWHERE} : (has(e.value) ? e.value : ''))]"
    ".exists(values, {body})))"
)


def _env_holds(name: str, test: str) -> str:
    """The last env entry of container ``c`` named ``name`` (a CEL string) takes no
    valueFrom and its value ``v`` passes ``test`` (``names`` and ``values`` bound by
    :data:`_ENV_BINDINGS`)."""
    return f"[names.lastIndexOf({name})].exists(j, j >= 0 && [values[j]].exists(v, {test}))"


def _env_is(name: str, value: str) -> str:
    """:func:`_env_holds` of an equality: two native look-ups, no comprehension."""
    return f"names.lastIndexOf({name}) >= 0 && values[names.lastIndexOf({name})] == {value}"


def _indices(count: str) -> str:
    """``lists.range(count)`` for a count of GPUs (1..MAX_COUNT): the lists library that
    has it is Kubernetes 1.35's, and these policies load on 1.30."""
    return f"{_list_ints(range(MAX_COUNT))}.filter(i, i < {count})"


def _list_ints(values: Iterable[int]) -> str:
    return "[" + ", ".join(str(v) for v in values) + "]"


def _wanted_env(policy: Policy, mode: Mode) -> list[str]:
    """``mutation.wanted_env`` of a sharing container ``c`` in ``mode``, as tests of its
    env; ``a`` is bound to what it asks (:func:`_ask`)."""
    g, m, k = "a['g']", "a['m']", "a['k']"
    if mode == "mps":
        pinned = f"{_indices(g)}.map(i, string(i) + '=' + string({m}) + 'M').join(',')"
        return [
            f"{m} <= 0 || ({_env_is(literal(MPS_LIMIT_VARS[0]), pinned)})",
            f"{k} < 0 || ({_env_is(literal(MPS_LIMIT_VARS[1]), f'string({k})')})",
            _env_is("'CUDA_MPS_PIPE_DIRECTORY'", literal(policy.mps_pipe_directory)),
        ]
    tests = []
    # _merged: ours first, then the user's libraries, split on ':' and ' ', without
    # empty ones or ours again.
    lib = literal(LIBRARY_PATH)
    merged = (
        f"v == {lib} || (v.startsWith({lib} + ':') && !v.contains(' ') && "
        f"v.substring({len(LIBRARY_PATH) + 1}).split(':').all(p, p != '' && p != {lib}))"
    )
    if policy.preload == "env":
        tests.append(_env_holds("'LD_PRELOAD'", merged))
    else:
        # mutation._PRELOAD_BEFORE_USERS: only where the container sets one.
        absent = "names.lastIndexOf('LD_PRELOAD') < 0"
        holds = _env_holds("'LD_PRELOAD'", merged)
        tests.append(f"{absent} || {holds}")
    memory = "'CUDA_DEVICE_MEMORY_LIMIT_' + string(i)"
    mib = f"string({m}) + 'm'"
    tests.append(f"{m} <= 0 || {_indices(g)}.all(i, {_env_is(memory, mib)})")
    sm = "'CUDA_DEVICE_SM_LIMIT_' + string(i)"
    tests.append(
        f"{k} < 0 || ({_env_is(literal('CUDA_DEVICE_SM_LIMIT'), f'string({k})')} && "
        f"{_indices(g)}.all(i, {_env_is(sm, f'string({k})')}))"
    )
    utilization = literal(policy.core_utilization_policy)
    tests.append(
        _env_holds(
            "'GPU_CORE_UTILIZATION_POLICY'", f"v in ['force', 'FORCE'] || v == {utilization}"
        )
    )
    tests.append(_env_is("'CUDA_REDIRECT'", "''"))
    tests.append(_env_holds("'ACTIVE_OOM_KILLER'", "v in ['true', '1']"))
    tests.append(_env_is("'CUDA_TASK_PRIORITY'", "string(a['p'])"))
    # mutation.stray_env: a vGPU limit variable the wanted set does not own. A memory
    # percentage's per-GPU limits are owned too: the webhook's cluster view turns the
    # percentage into MiB and sets them, with values only the view knows.
    wanted_memory = (
        f"({m} > 0 || a['pct'] > 0) && n.matches('^CUDA_DEVICE_MEMORY_LIMIT_(0|[1-9][0-9]?)$') && "
        f"int(n.substring({len('CUDA_DEVICE_MEMORY_LIMIT_')})) < {g}"
    )
    wanted_sm = (
        f"{k} > 0 && n.matches('^CUDA_DEVICE_SM_LIMIT_(0|[1-9][0-9]?)$') && "
        f"int(n.substring({len('CUDA_DEVICE_SM_LIMIT_')})) < {g}"
    )
    tests.append(
        "!names.exists(n, (n.startsWith('CUDA_DEVICE_MEMORY_LIMIT') && !(" + wanted_memory + ")) "
        "|| (n.startsWith('CUDA_DEVICE_SM_LIMIT_') && !(" + wanted_sm + ")))"
    )
    return tests


def _same_mount(mount: str, injected: Mapping[str, Any]) -> str:
    """``mutation._same_mount``: the injected volume, read-only as injected, no subPath."""
    read_only = "true" if injected.get("readOnly") else "false"
    return (
        f"{mount}.name == {literal(injected['name'])} && "
        f"(has({mount}.readOnly) ? {mount}.readOnly : false) == {read_only} && "
        f"(!has({mount}.subPath) || {mount}.subPath == '') && "
        f"(!has({mount}.subPathExpr) || {mount}.subPathExpr == '')"
    )


def _implied(policy: Policy) -> str:
    """Container ``c`` asks for slices only, of a vendor with a count resource: the
    mutation adds the count (``implied_count_resource``) where it is missing, and no count
    is anywhere, so something is missing."""
    counts = sorted(policy.count_resources)
    sources = sorted(policy.implied_counts)
    if not sources:
        return "false"
    asked = "exists(r, r in L || r in R)"
    return _parts("c", f"!{_list(counts)}.{asked} && {_list(sources)}.{asked}")


def _container_mutated(policy: Policy, mode: Mode) -> str:
    """Sharing container ``c`` holds what the mutation sets in ``mode``: its env, the
    injected mounts, its count resource."""
    injection = injection_for(mode, policy)
    mounts = [
        f"has(c.volumeMounts) && c.volumeMounts.exists(m, m.mountPath == "
        f"{literal(mount['mountPath'])} && {_same_mount('m', mount)})"
        for mount in injection.mounts
    ]
    wanted = _wanted_env(policy, mode)
    if policy.device_pins:
        # The device pins: present in a slice container (env.allowed judges the value).
        names = _list(name for name, _ in policy.device_pins)
        wanted.append(f"!({slice_test(policy, 'c')}) || {names}.all(n, n in names)")
    env = " && ".join(f"({t})" for t in wanted)
    # A sharing container is not vacant: request_variables counted what it asks.
    ask = "(variables.mainAsks + variables.initAsks)[variables.askNames.indexOf(c.name)]"
    return (
        _ENV_BINDINGS.format(body=f"[{ask}].exists(a, {env})")
        + f" && {' && '.join(f'({t})' for t in mounts) or 'true'} && !({_implied(policy)})"
    )


def _mode_mutated(policy: Policy, mode: Mode) -> str:
    """A sharing pod in ``mode`` (vgpu or mps) holds what the mutation sets: its scheduler,
    the mode annotation, the injected volumes, hostIPC and the MPS node selector (mps),
    and each sharing container's settings (not ephemeral ones: the mutation leaves them)."""
    spec = "variables.spec"
    injection = injection_for(mode, policy)
    terms = [
        _scheduled(policy),
        f"{literal(MODE_ANNOTATION)} in variables.annotations && "
        f"variables.annotations[{literal(MODE_ANNOTATION)}] == {literal(mode)}",
    ]
    terms.extend(
        f"has({spec}.volumes) && {spec}.volumes.exists(v, {_same_volume('v', volume)})"
        for volume in injection.volumes
    )
    if mode == "mps":
        terms.append(f"has({spec}.hostIPC) && {spec}.hostIPC == true")
        terms.extend(
            f"{placed_mps(policy)} || (has({spec}.nodeSelector) && "
            f"{literal(key)} in {spec}.nodeSelector)"
            for key in policy.mps_node_selector
        )
    containers = (
        f"(has({spec}.containers) ? {spec}.containers : []) + "
        f"(has({spec}.initContainers) ? {spec}.initContainers : [])"
    )
    terms.append(
        f"({containers}).all(c, !({shares(policy, 'c')}) || ({_container_mutated(policy, mode)}))"
    )
    return " && ".join(f"({t})" for t in terms)


def _unmutated(policy: Policy) -> str:
    """``mutation.first_missing`` of a created sharing pod or template finds nothing: in
    mode vgpu or mps all :func:`_mode_mutated` asks, in every mode the void in each
    container and init container that asks for no GPU."""
    spec = "variables.spec"
    voided = (
        f"((has({spec}.containers) ? {spec}.containers : []) + "
        f"(has({spec}.initContainers) ? {spec}.initContainers : [])).all(c, "
        f"({asks_for_gpu(policy, 'c')}) || "
        f"(has(c.env) && c.env.exists(e, e.name == {literal(_VISIBLE)})))"
    )
    modes: tuple[Mode, ...] = ("vgpu", "mps")
    moded = " || ".join(f"({injects(mode)} && !({_mode_mutated(policy, mode)}))" for mode in modes)
    # A vgpu pod without HAMi-core: its scheduler, mode annotation and counts.
    plain = (
        f"variables.mode == 'vgpu' && !variables.library && !(({_dynamic_mutated(policy)}) && "
        f"{literal(MODE_ANNOTATION)} in variables.annotations && "
        f"variables.annotations[{literal(MODE_ANNOTATION)}] == 'vgpu')"
    )
    moded = f"{moded} || ({plain})"
    whole = f"variables.whole && !({_off_pool(policy)})"
    dynamic = f"variables.dynamicMig && !({_dynamic_mutated(policy)})"
    return (
        f"!(variables.created && variables.sharing && "
        f"(({moded}) || ({whole}) || ({dynamic}) || !({voided})))"
    )


def _scheduled(policy: Policy) -> str:
    """The pod has the scheduler the mutation sets (``mutation._scheduler_ops``): the
    apiserver defaults a missing schedulerName to default-scheduler, which the mutation
    replaces unless it is the one wanted."""
    spec = "variables.spec"
    return (
        f"(has({spec}.schedulerName) && !({spec}.schedulerName in ['', "
        f"{literal(DEFAULT_SCHEDULER)}])) || ({wanted_scheduler(policy)}) == "
        f"{literal(DEFAULT_SCHEDULER)}"
    )


def _dynamic_mutated(policy: Policy) -> str:
    """A pod of the scheduler's dynamic MIG (and, with its mode annotation, a vgpu pod
    without HAMi-core) holds its scheduler and each sharing container its count resource
    (nothing else is injected)."""
    spec = "variables.spec"
    containers = (
        f"(has({spec}.containers) ? {spec}.containers : []) + "
        f"(has({spec}.initContainers) ? {spec}.initContainers : [])"
    )
    implied = f"({containers}).all(c, !({shares(policy, 'c')}) || !({_implied(policy)}))"
    return f"({_scheduled(policy)}) && ({implied})"


# The message of each rule after its bracketed id (what to change, as the webhook says).
MESSAGES: Final[Mapping[str, str]] = {
    "privileged-gpu": "a privileged container, or one adding CAP_SYS_ADMIN, in a GPU pod sees "
    "every GPU; remove securityContext.privileged and SYS_ADMIN from capabilities.add",
    "node-name-pinning": "spec.nodeName skips GPU scheduling; use nodeSelector or affinity instead",
    "raw-visible-devices": "NVIDIA_VISIBLE_DEVICES set by hand (or from valueFrom), CUDA_VERSION "
    "without NVIDIA_REQUIRE_CUDA in a container that asks for no GPU (set "
    "NVIDIA_VISIBLE_DEVICES=void), or an envFrom prefix that spells a guarded name; remove it, "
    "request GPUs in resources.limits",
    "host-device-access": "a hostPath volume, a mount (where the GPU stack reads inside the "
    "container, too), a host namespace or an annotation the container runtime reads (CDI, "
    "CRI-O's devices) reaches GPU devices, their limits, the node's GPU stack or its "
    "accounting; remove it (mount injected volumes and the GPU stack readOnly), request GPUs "
    "in resources.limits",
    "limit-tampering": "an env switch (CUDA_DISABLE_CONTROL, GPU_CORE_UTILIZATION_POLICY, "
    "CUDA_REDIRECT, ACTIVE_OOM_KILLER, CGPU_DISABLE) turns GPU limits off or loosens them; "
    "remove it",
    "invalid-gpu-request": "a GPU resource is malformed, out of range or in the wrong unit "
    "(memory in MiB or GiB as a plain integer, cores and percentages 1..100, counts 1..64), "
    "asked for twice, or its request differs from its limit; write plain integers in "
    "resources.limits",
    "mode-conflict": "the pod's sharing mode cannot be honoured: a mode annotation that is no "
    "mode, resources of two modes in one container or of another mode than the pod's, a node "
    "selector of another mode, a mode this namespace may not use, or mps memory as a "
    "percentage; ask for one mode's resources (mps memory in MiB)",
    "gpu-quota": "a container or the pod asks for more GPUs, GPU memory or cores than the "
    "policy allows; ask for less",
    "scheduler-bypass": "a GPU-sharing pod names a scheduler that skips GPU accounting; "
    "remove spec.schedulerName",
    "forged-allocation": "annotations reserved to the GPU scheduler and device plugin were "
    "written, changed or removed; remove them",
    "gpu-claim": "a pod asks DRA for a GPU device class (deviceclass.resource.kubernetes.io/) in a "
    "namespace that is not in the policy's dra.allowedNamespaces; claim GPUs in a namespace "
    "listed there",
    "unmutated-gpu-pod": "a GPU-sharing pod lacks the settings the gpushare mutation gives it "
    "(its limits, preload, mounts, scheduler, void for GPU-less containers) or they were "
    "changed after it; is the gpushare mutation (webhook or MutatingAdmissionPolicy) in place?",
}


# ------------------------------------------------------------------- messages

# A refusal's messageExpression names the first container that breaks the rule and the
# field, as the core's finding does (rules._container_findings), in the core's redacted
# form: the apiserver writes a refusal's message to its audit log (responseStatus), where
# the webhook's log holds only Finding.redacted, so a user's value is "…" here too. The
# container names and mountPaths the core shows, this shows. Evaluated only when the
# validation fails, so an admitted pod pays nothing for it; the static message stays as
# the apiserver's fallback when the expression fails. No cel.bind or lists.range: the
# apiserver's CEL on 1.30 has neither (a one-element list binds a name, as _parts does).
_HIDDEN: Final = "\u2026"


def _label(x: str) -> str:
    """``resources.describe`` of container ``x`` (names are unique across the kinds)."""
    spec = "variables.spec"
    kinds = [
        f"has({spec}.{kind}) && {spec}.{kind}.exists(i, i.name == {x}.name) ? "
        f"{literal(KIND_LABELS[kind] + ' ')} : "
        for kind in CONTAINER_KINDS[1:]
    ]
    return f"({''.join(kinds)}{literal(KIND_LABELS[CONTAINER_KINDS[0]] + ' ')}) + '\"' + {x}.name + '\"'"


def _first_offender(rule: str, texts: Callable[[str], str]) -> str:
    """``[rule] <label>: <text>`` of the first finding (``texts``: a container's, as a CEL
    list) of the first container that has one, else the static message."""
    static = literal(f"[{rule}] {MESSAGES[rule]}")
    prefix = literal(f"[{rule}] ")
    found = (
        f"variables.containers.map(x, ({texts('x')}).map(t, {_label('x')} + ': ' + t))"
        ".filter(f, size(f) > 0)"
    )
    return f"[{found}].map(found, size(found) > 0 ? {prefix} + found[0][0] : {static})[0]"


def _shown(entry: str) -> str:
    """The core's ``="…"`` of an inline value, `` from valueFrom`` of a reference."""
    return f"(has({entry}.valueFrom) ? ' from valueFrom' : '=\"{_HIDDEN}\"')"


def _privileged_texts(x: str) -> str:
    context = f"{x}.securityContext"
    caps = f"{context}.capabilities"
    privileged = f"has({context}.privileged) && {context}.privileged == true"
    added = f"has({caps}) && has({caps}.add) && {caps}.add.exists(a, {_upper('a')} in {_list(sorted(SYS_ADMIN))})"
    return (
        f"!has({context}) ? [] : (({privileged}) ? ['privileged in a GPU pod sees every GPU; "
        "remove securityContext.privileged'] : []) + "
        f"(({added}) ? ['CAP_SYS_ADMIN in a GPU pod makes the NVIDIA runtime honour any device "
        "list it asks for; remove it from securityContext.capabilities.add'] : [])"
    )


def _unadmitted_text(policy: Policy, channel: Channel, reader: str) -> str:
    """``rules._allowlist_finding`` of entry ``e`` in a container of class ``k``: its
    text, or '' where env.allowed admits it there (``e`` then is of ``channel`` and judged
    by no rule of its own)."""
    exact = sorted({a.name for a in policy.env_allowances if not a.prefix})
    prefixes = sorted({a.name.rstrip("*") for a in policy.env_allowances if a.prefix})
    listed = f"e.name in {_list(exact)} || {_list(prefixes)}.exists(p, e.name.startsWith(p))"
    admits = CONTAINER_CLASSES
    by_class = env_admitted(
        policy, "e.name", _value("e"), _opaque("e"), None, channel=channel, bound="a"
    )
    words = "{" + ", ".join(f"{literal(k)}: {literal(CLASS_WORDS[k])}" for k in admits) + "}"
    hint = (
        f"size(w) > 0 ? '; the policy\\'s env.allowed admits it only in ' + "
        f"w.map(a, {words}[a]).join(' and ') : ({listed}) ? "
        "'; that value is not one the policy\\'s env.allowed admits' : "
        "'; no entry of the policy\\'s env.allowed admits it'"
    )
    return (
        f"[{_list(admits)}.filter(a, {by_class})].map(w, k in w ? '' : e.name + {_shown('e')} "
        f"+ {literal(f' is read by {reader}')} + ({hint}) + '; remove it')[0]"
    )


_LEGACY_TEXTS: Final = (
    "CUDA_VERSION without NVIDIA_REQUIRE_CUDA makes the NVIDIA runtime hand it every GPU; "
    "set NVIDIA_VISIBLE_DEVICES=void or request GPUs in limits",
    "CUDA_VERSION without NVIDIA_REQUIRE_CUDA makes the NVIDIA runtime give a GPU slice "
    "every driver capability (graphics, display); set NVIDIA_REQUIRE_CUDA or remove "
    "CUDA_VERSION",
)


def _env_texts(x: str, text: str) -> str:
    """``text`` (a string, '' for none) of each env entry ``e`` of ``x``, in a container
    of class ``k``."""
    return f"(has({x}.env) ? {x}.env.map(e, has(e.name) ? ({text}) : '').filter(t, t != '') : [])"


def _visible_texts(policy: Policy, x: str) -> str:
    """raw-visible-devices of container ``x``, in the core's order: a legacy image, an
    envFrom prefix, then each env entry (a raw NVIDIA_VISIBLE_DEVICES, a device name
    env.allowed does not admit)."""
    harmless = _stripped_in(_value("e"), _HARMLESS_VISIBLE_DEVICES)
    visible = (
        f"has(e.valueFrom) ? '{_VISIBLE} from valueFrom; request GPUs in resources.limits' : "
        f"!({harmless}) ? '{_VISIBLE}=\"{_HIDDEN}\"; remove it, request GPUs in limits' : ''"
    )
    unadmitted = _unadmitted_text(policy, "devices", "the NVIDIA container runtime")
    entry = (
        f"e.name == {literal(_VISIBLE)} ? ({visible}) : "
        f"({_judged_entry(policy, 'devices', x)}) ? ({unadmitted}) : ''"
    )
    legacy = (
        f"({_legacy(x)}) ? (!({asks_for_gpu(policy, x)}) ? [{literal(_LEGACY_TEXTS[0])}] : "
        f"variables.gpu && {x}.env.exists(e, has(e.name) && e.name == 'NVIDIA_REQUIRE_CUDA') && "
        f"k == 'slice' ? [{literal(_LEGACY_TEXTS[1])}] : []) : []"
    )
    spelled = (
        f"has({x}.envFrom) ? {x}.envFrom.filter(s, has(s.prefix) && s.prefix != '' && "
        f'({_spells("s.prefix")})).map(s, \'envFrom prefix "{_HIDDEN}" can spell '
        "NVIDIA_VISIBLE_DEVICES or a HAMi-core switch from a key; remove the prefix') : []"
    )
    return f"[{container_class(x)}].map(k, ({legacy}) + ({spelled}) + {_env_texts(x, entry)})[0]"


def _tampering_texts(policy: Policy, x: str) -> str:
    """limit-tampering of container ``x``: each switch that loosens, and why, and each
    limit name env.allowed does not admit."""
    why = "{" + ", ".join(f"{literal(k)}: {literal(v)}" for k, v in LOOSENING.items()) + "}"
    unadmitted = _unadmitted_text(policy, "limits", "HAMi-core or the MPS client")
    entry = (
        f"({loosening(policy, 'e')}) ? e.name + {_shown('e')} + ' ' + {why}[e.name] + "
        f"'; remove it' : ({_judged_entry(policy, 'limits', x)}) ? ({unadmitted}) : ''"
    )
    return f"[{container_class(x)}].map(k, {_env_texts(x, entry)})[0]"


def _mount_texts(policy: Policy, x: str) -> str:
    """host-device-access of container ``x``: its GPU runtime class, then each mount that
    reaches the GPU stack (what it shadows, as ``rules._shadowed`` says) or writes a
    shared volume."""
    requests = " || ".join(
        f"{v}.startsWith({literal(d)})" for v in ("m.mountPath", "q") for d in _DEVICE_REQUEST_DIRS
    )
    roots = _list(read_paths(policy).roots)
    shadowed = (
        f"{roots}.filter(r, q == r || q.startsWith(r + '/')).map(r, 'a mount at ' + m.mountPath"
        " + ' shadows ' + r + ', which the GPU stack reads inside the container; mount it "
        "elsewhere')"
    )
    backstep = (
        "['a mount at ' + m.mountPath + ' names a path the GPU stack reads with \\'..\\'; "
        "write the path without \\'..\\'']"
    )
    shadow = (
        f"!({_shadow(policy, 'm')}) ? [] : m.mountPath.split('/').exists(s, s == '..') ? "
        f"{backstep} : [{_normalised('m.mountPath')}].map(q, ({requests}) ? "
        "['a mount at ' + m.mountPath + ' asks the NVIDIA runtime for devices; request GPUs "
        f"in limits'] : {shadowed})[0]"
    )
    shared = (
        f"({_read_only_volume(policy, 'm')}) ? ['volume \"' + m.name + '\" is shared with "
        "every GPU pod on the node; mount it readOnly'] : []"
    )
    mounts = f"(has({x}.volumeMounts) ? {x}.volumeMounts.map(m, ({shadow}) + ({shared})) : [])"
    devices = (
        f"(has({x}.volumeDevices) ? {x}.volumeDevices.filter(d, {_device_shadow(policy, 'd')})"
        ".map(d, 'a block device at ' + d.devicePath + ' replaces what the GPU stack reads "
        "there; put it elsewhere') : [])"
    )
    texts = f"{mounts}.filter(t, size(t) > 0).map(t, t[0]) + {devices}"
    if not policy.gpu_runtime_classes:
        return texts
    # A container under a GPU runtime class that asks for no GPU and lacks the void.
    spec = "variables.spec"
    runtime = (
        f"has({spec}.runtimeClassName) && {spec}.runtimeClassName in "
        f"{_list(sorted(policy.gpu_runtime_classes))} && !({asks_for_gpu(policy, x)}) && "
        f"!(has({x}.env) && {x}.env.exists(e, e.name == {literal(_VISIBLE)}))"
    )
    text = (
        "'runtimeClassName ' + variables.spec.runtimeClassName + ' hands every GPU to a "
        "container that asks for none; set NVIDIA_VISIBLE_DEVICES=void or request GPUs in limits'"
    )
    return f"(({runtime}) ? [{text}] : []) + {texts}"


def _request_texts(policy: Policy, x: str) -> str:
    """invalid-gpu-request of container ``x``: each GPU resource it gets wrong, its
    memory asked for twice."""
    gpu = _gpu_resource(policy)
    wrong = (
        f"R.filter(r, ({gpu}) && !(r in L && ({_same_amount('R[r]', 'L[r]')}))) + "
        f"L.filter(r, ({gpu}) && !([string(L[r])].exists(v, {_valid(policy, 'v')})))"
    )
    twice = _asked(policy.memory_resources)
    texts = (
        f'({wrong}).map(r, r + \' "{_HIDDEN}" is malformed, out of range, in the wrong unit '
        "or differs from its request; write plain integers in resources.limits, equal in "
        f"requests') + (size({twice}) > 1 ? ['asks for memory twice (' + {twice}.join(', ') "
        "+ '); keep one'] : [])"
    )
    return _parts_value(x, texts)


def message_expressions(policy: Policy) -> dict[str, str]:
    """Each container rule's messageExpression (the others' static messages name their
    field: spec.nodeName, spec.schedulerName, the annotations)."""
    texts: dict[str, Callable[[str], str]] = {
        "privileged-gpu": _privileged_texts,
        "raw-visible-devices": partial(_visible_texts, policy),
        "host-device-access": partial(_mount_texts, policy),
        "limit-tampering": partial(_tampering_texts, policy),
        "invalid-gpu-request": partial(_request_texts, policy),
    }
    return {rule: _first_offender(rule, text) for rule, text in texts.items()}


def _pod_rule(test: PodTest) -> str:
    """``test`` of the object; on a pod UPDATE only when the old pod passed it."""
    new = test("variables.containers", "variables.gpu", "variables.spec")
    old = test("variables.oldContainers", "variables.oldGpu", "variables.oldSpec")
    return f"!(({new}) && !(variables.podUpdate && ({old})))"


def wanted_scheduler(policy: Policy) -> str:
    """``Policy.scheduler_for`` of a sharing pod (``variables.scheduler``)."""
    return "variables.scheduler"


def _wanted_scheduler(policy: Policy) -> str:
    """``Policy.scheduler_for`` of a sharing pod: a resource's scheduler when every
    sharing resource the pod asks for is listed for that scheduler, else its mode's
    (``variables.chosenMode``, chosen as the core chooses it), else the policy's."""
    by_scheduler: dict[str, list[str]] = {}
    for resource, scheduler in policy.resource_schedulers.items():
        by_scheduler.setdefault(scheduler, []).append(resource)
    expression = literal(policy.scheduler_name)
    for mode, scheduler in sorted(policy.mode_schedulers.items(), reverse=True):
        expression = (
            f"variables.chosenMode == {literal(mode)} ? {literal(scheduler)} : ({expression})"
        )
    sharing = sorted(r for r in policy.gpu_resources if not r.startswith(policy.mig_prefixes))
    slices = [r for r in sharing if r not in policy.count_resources]
    for scheduler, resources in sorted(by_scheduler.items(), reverse=True):
        # A container asks for GPUs this scheduler does not account for: a slice not
        # listed for it, or a count resource not listed for it without slices of its
        # own vendor beside it (Policy.scheduling_resources).
        terms = []
        other_slices = [r for r in slices if r not in resources]
        if other_slices:
            terms.append(asks_test("c", f"r in {_list(other_slices)}", policy=policy))
        for count in sharing:
            if count not in policy.count_resources or count in resources:
                continue
            term = asks_test("c", f"r == {literal(count)}", policy=policy)
            own = [r for r in slices if count.startswith(r.split("/", 1)[0] + "/")]
            if own:
                term += f" && !({asks_test('c', f'r in {_list(own)}', policy=policy)})"
            terms.append(term)
        other = " || ".join(f"({t})" for t in terms) or "false"
        expression = (
            f"!(variables.containers.exists(c, {other})) ? {literal(scheduler)} : ({expression})"
        )
    return expression


def _scheduler(policy: Policy) -> str:
    name = "variables.spec.schedulerName"
    if policy.resource_schedulers or policy.mode_schedulers:
        static = {"", DEFAULT_SCHEDULER, *policy.allowed_schedulers}
        allowed = f"{name} in {_list(sorted(static))} || {name} == ({wanted_scheduler(policy)})"
    else:
        static = {"", DEFAULT_SCHEDULER, policy.scheduler_name, *policy.allowed_schedulers}
        allowed = f"{name} in {_list(sorted(static))}"
    kept = f"!(variables.created && variables.whole && ({_pool_selected(policy)}))"
    return (
        "!(variables.created && (variables.mode in ['vgpu', 'mps'] || variables.dynamicMig) && "
        f"variables.sharing && has({name}) && !({allowed})) && {kept}"
    )


def _claims(policy: Policy) -> str:
    """gpu-claim of a pod (or template): a GPU device class asked for by its extended
    resource outside the namespaces that may claim GPUs. A claim beside sharing resources
    is the webhook's with the cluster view (``context.claimed_gpus``): only the view knows
    the claim's device class."""
    if not policy.gpu_device_classes:
        return "true"
    classes = sorted(DEVICE_CLASS_RESOURCE + c for c in policy.gpu_device_classes)
    allowed = _glob_test("request.namespace", policy.claim_namespaces)
    # By the amount of the class resource alone (rules._class_resources): a zero of
    # another GPU resource beside it leaves it asked.
    asked = (
        "variables.containers.exists(c, "
        + names_test("c", f"r in {_list(classes)} && !({_zero('X[r]')})", bind=True)
        + ")"
    )
    return f"!(variables.created && !({allowed}) && {asked})"


def _forged_in(ledger: Ledger) -> str:
    """A reserved annotation of ``ledger`` set at create, or added, changed or removed by a
    pod update, by an identity that is not one of its writers."""
    reserved = _glob_test("k", ledger.annotations) if ledger.annotations else "false"
    created = f"variables.created && variables.annotations.exists(k, {reserved})"
    new, old = "variables.annotations", "variables.oldAnnotations"
    updated = (
        "variables.podUpdate && ("
        f"{new}.exists(k, ({reserved}) && !(k in {old} && {old}[k] == {new}[k])) || "
        f"{old}.exists(k, ({reserved}) && !(k in {new})))"
    )
    return f"!({identity_test(ledger.writers)}) && (({created}) || ({updated}))"


def _forged(policy: Policy) -> str:
    """forged-allocation: no ledger's annotations touched by anyone but its writers (a key
    several ledgers reserve needs a writer of each, as ``Policy.forbidden_to``)."""
    terms = [_forged_in(ledger) for ledger in policy.ledgers]
    return "!(" + (" || ".join(f"({t})" for t in terms) or "false") + ")"


def rule_expressions(policy: Policy) -> dict[str, str]:
    """Each rendered rule's validation expression (true: admitted), in RULE_IDS order;
    gpu-quota only when the policy sets a maximum."""
    expressions = {
        "privileged-gpu": _pod_rule(_privileged),
        "node-name-pinning": _pod_rule(_node_name),
        "raw-visible-devices": _pod_rule(_visible_devices(policy)),
        "host-device-access": _host_device_access(policy),
        "limit-tampering": _pod_rule(_switches(policy)),
        "invalid-gpu-request": _invalid_gpu_request(policy),
        "mode-conflict": _mode_conflict(policy),
    }
    quota = _gpu_quota(policy)
    if quota is not None:
        expressions["gpu-quota"] = quota
    expressions.update(
        {
            "scheduler-bypass": _scheduler(policy),
            "forged-allocation": _forged(policy),
            "gpu-claim": _claims(policy),
            "unmutated-gpu-pod": _unmutated(policy),
        }
    )
    return expressions


RULES: Final = tuple(MESSAGES)


# ---------------------------------------------------------------------------- objects


def match_conditions(policy: Policy) -> list[Obj]:
    """The policy's exemptions: an exempt namespace or identity is not judged."""
    conditions = []
    if policy.exempt_namespaces:
        conditions.append(
            {
                "name": "gpushare.io/namespace-not-exempt",
                "expression": f"!({_glob_test('request.namespace', policy.exempt_namespaces)})",
            }
        )
    exempt = policy.exempt
    if exempt.users or exempt.groups or exempt.service_accounts:
        conditions.append(
            {"name": "gpushare.io/user-not-exempt", "expression": f"!({identity_test(exempt)})"}
        )
    return conditions


def match_constraints(namespace: str = SYSTEM_NAMESPACES[1]) -> Obj:
    rules: list[Obj] = [
        {
            "apiGroups": [""],
            "apiVersions": ["v1"],
            # kubectl debug adds ephemeral containers through the subresource.
            "resources": ["pods", "pods/ephemeralcontainers"],
            "operations": ["CREATE", "UPDATE"],
            "scope": "Namespaced",
        }
    ]
    for group, resource in _RESOURCE_RULES:
        rules.append(
            {
                "apiGroups": [group],
                "apiVersions": ["v1"],
                "resources": [resource],
                "operations": ["CREATE", "UPDATE"],
                "scope": "Namespaced",
            }
        )
    return {
        "matchPolicy": "Equivalent",
        "namespaceSelector": {
            "matchExpressions": [
                {
                    "key": "kubernetes.io/metadata.name",
                    "operator": "NotIn",
                    "values": [SYSTEM_NAMESPACES[0], namespace],
                }
            ]
        },
        "resourceRules": rules,
    }


def policy_name(action: Action, *, sources: bool = False) -> str:
    """The ValidatingAdmissionPolicy (and binding) holding the rules of ``action`` on pods
    and workloads, or (``sources``) on what pods take env and devices from."""
    return NAME_PREFIX + action + (SOURCES_SUFFIX if sources else "")


SOURCES_SUFFIX: Final = "-sources"
# Every name validating_policies can render, whatever the policy: the install's RBAC
# lets the webhook update and delete these and no other.
POLICY_NAMES: Final = (
    *(
        policy_name(action, sources=sources)
        for sources in (False, True)
        for action in VALIDATION_ACTIONS
    ),
    f"{NAME_PREFIX}overrides",
)
# The policy that warns what the MutatingAdmissionPolicy replaced (_override_policies).
OVERRIDES_POLICY: Final = POLICY_NAMES[-1]


# ------------------------------------------------------------------- written sources


def _env_source_expression(policy: Policy) -> str:
    """raw-visible-devices of a ConfigMap or Secret (``objects.unadmitted_key``): no key is
    a guarded name, or a name of a guarded channel that env.allowed does not admit in every
    class of container (a Secret's values unread). The apiserver folds a Secret's
    stringData into data first."""
    guarded = f"k in {_list(GUARDED_NAMES)} || " + " || ".join(
        f"k.startsWith({literal(p)})" for p in GUARDED_PREFIXES
    )
    channels = f"({channel_test('k', 'devices')}) || ({channel_test('k', 'limits')})"
    unread = "request.kind.kind == 'Secret'"
    anywhere = " && ".join(
        f"({env_admitted(policy, 'k', 'object.data[k]', unread, klass)})"
        for klass in CONTAINER_CLASSES
    )
    test = f"({guarded}) || (({channels}) && !({anywhere}))"
    kinds = _list(sorted(ENV_SOURCES))
    return (
        f"!(request.kind.kind in {kinds} && has(object.data) && !({_kept_by_writer(policy)}) "
        f"&& object.data.exists(k, {test}))"
    )


def _kept_by_writer(policy: Policy) -> str:
    """``objects.kept_by_writer``: a ConfigMap of a ledger's ``configMaps``, written by one
    of the ledger's writers."""
    name = "object.metadata.name"
    terms = [
        f"({_glob_test(name, ledger.config_maps)}) && ({identity_test(ledger.writers)})"
        for ledger in policy.ledgers
        if ledger.config_maps
    ]
    if not terms:
        return "false"
    kept = " || ".join(f"({t})" for t in terms)
    return f"request.kind.kind == 'ConfigMap' && has(object.metadata.name) && ({kept})"


def _claim_expression(policy: Policy) -> str:
    """gpu-claim of a ResourceClaim, ResourceClaimTemplate or DeviceClass
    (``objects.object_findings``)."""
    classes = _list(sorted(policy.gpu_device_classes))
    request = (
        f"(has(r.deviceClassName) && r.deviceClassName in {classes}) || "
        f"(has(r.exactly) && has(r.exactly.deviceClassName) && "
        f"r.exactly.deviceClassName in {classes}) || (has(r.firstAvailable) && "
        f"r.firstAvailable.exists(x, has(x.deviceClassName) && x.deviceClassName in {classes}))"
    )
    claims = " || ".join(
        f"(request.kind.kind == {literal(kind)} && "
        f"{_get('object', (*path, 'devices', 'requests'))}.exists(r, {request}))"
        for kind, path in (
            ("ResourceClaim", ("spec",)),
            ("ResourceClaimTemplate", ("spec", "spec")),
        )
    )
    if not policy.gpu_device_classes:
        claims = "false"
    allowed = _glob_test("request.namespace", policy.claim_namespaces)
    configs = " || ".join(
        f"(request.kind.kind == {literal(kind)} && "
        f"{_get('object', (*path, 'devices', 'config'))}.exists(c, {_unlisted_config(policy)}))"
        for kind, path in (
            ("ResourceClaim", ("spec",)),
            ("ResourceClaimTemplate", ("spec", "spec")),
        )
    )
    if not policy.claim_configs:
        configs = "false"
    # The sharing resources only: a MIG resource served by DRA is no slice.
    name = "object.spec.extendedResourceName"
    served = f"{name} in {_list(sorted(policy.gpu_resources))}" if policy.gpu_resources else "false"
    if policy.dra_resources:
        # wholeGpus.draResources: the policy says DRA serves these whole GPUs here.
        served += f" && !({name} in {_list(sorted(policy.dra_resources))})"
    device_class = (
        f"request.kind.kind == {literal(DEVICE_CLASS)} && has(object.spec) && "
        f"has({name}) && {served}"
    )
    return f"!((!({allowed}) && ({claims})) || ({configs}) || ({device_class}))"


def cel_value(value: Any) -> str:
    """A CEL literal of the JSON value ``value`` (maps, lists, strings, numbers, booleans,
    null): what the apiserver's view of an object holds, for ``==`` and ``in``."""
    if isinstance(value, Mapping):
        return "{" + ", ".join(f"{literal(str(k))}: {cel_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, list):
        return "[" + ", ".join(cel_value(v) for v in value) + "]"
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, int | float):
        return repr(value)
    return literal(str(value))


def _unlisted_config(policy: Policy) -> str:
    """Config ``c`` of a claim gives a driver of ``dra.claimConfigs`` parameters its list
    does not hold (``objects._config_findings``)."""
    drivers = []
    for driver, allowed in sorted(policy.claim_configs.items()):
        listed = (
            f"has(c.opaque.parameters) && c.opaque.parameters in {cel_value(list(allowed))}"
            if allowed
            else "false"
        )
        drivers.append(f"(c.opaque.driver == {literal(driver)} && !({listed}))")
    return f"has(c.opaque) && has(c.opaque.driver) && ({' || '.join(drivers)})"


def excepted(policy: Policy, rule: str, *, today: str) -> str | None:
    """The request is one an exception of the policy takes ``rule`` off for
    (``Policy.exception_for``), or None where none could: the apiserver's CEL has no
    clock, so an exception past its last day on ``today`` (the day this is rendered) is
    left out, and one with a last day stays until the policies are rendered again."""
    terms = []
    for exception in policy.exceptions:
        if rule not in exception.rules or exception.expired(today):
            continue
        scope = []
        if exception.namespaces:
            scope.append(_glob_test("request.namespace", exception.namespaces))
        who = exception.requesters
        if who.users or who.groups or who.service_accounts:
            scope.append(identity_test(who))
        terms.append(" && ".join(f"({t})" for t in scope))
    return " || ".join(f"({t})" for t in terms) or None


def _unless_excepted(policy: Policy, rule: str, expression: str, *, today: str) -> str:
    """``expression`` (true: admitted), or true where an exception takes ``rule`` off."""
    exception = excepted(policy, rule, today=today)
    return expression if exception is None else f"({exception}) || ({expression})"


def validating_policies(
    policy: Policy, *, namespace: str = SYSTEM_NAMESPACES[1], today: str = ""
) -> list[Obj]:
    """Per action some rendered rule takes (deny, warn, audit; off is left out): one
    ValidatingAdmissionPolicy holding each such rule as a validation, and its binding;
    the policy's exceptions as they stand on ``today`` (:func:`excepted`)."""
    by_action: dict[Action, list[Obj]] = {}
    expressions: dict[Action, dict[str, str]] = {}
    messages = message_expressions(policy)
    for rule, expression in rule_expressions(policy).items():
        action = policy.action(rule)
        if action == "off":
            continue
        expression = _unless_excepted(policy, rule, expression, today=today)
        expressions.setdefault(action, {})[rule] = expression
        validation = {
            "expression": expression,
            "message": f"[{rule}] {MESSAGES[rule]}",
            "reason": "Forbidden",
        }
        if rule in messages:
            validation["messageExpression"] = messages[rule]
        by_action.setdefault(action, []).append(validation)
    objects: list[Obj] = []
    shared = [*variables(policy), *request_variables(policy)]
    # The webhooks' scope first: a pod or workload outside it breaks no rule (scope is a
    # superset of what the core judges), and the apiserver then evaluates no validation.
    # On a plain pod create the policy's cost fell from 0.57 ms (no scope) and 0.42 ms
    # (scope as a variable each validation checks first) to 0.18 ms, measured side by
    # side: the apiserver pays per expression evaluated. A GPU pod pays the condition's
    # conversion more: +0.04 and +0.16 ms (of ~1 ms) in two side-by-side runs.
    conditions = [*scope_conditions(policy), *match_conditions(policy)]
    for action, validation_actions in VALIDATION_ACTIONS.items():
        validations = by_action.get(action)
        if not validations:
            continue
        name = policy_name(action)
        spec: Obj = {
            "failurePolicy": "Fail",
            "matchConstraints": match_constraints(namespace),
        }
        if conditions:
            spec["matchConditions"] = [dict(c) for c in conditions]
        spec["variables"] = [dict(v) for v in shared]
        spec["validations"] = validations
        if action in RECORDED_ACTIONS:
            held, spec["auditAnnotations"] = audit_annotations(expressions[action], MESSAGES)
            spec["variables"].extend(held)
        objects.append(
            {
                "apiVersion": API_VERSION,
                "kind": POLICY_KIND,
                "metadata": {"name": name, "labels": dict(LABELS)},
                "spec": spec,
            }
        )
        objects.append(
            {
                "apiVersion": API_VERSION,
                "kind": BINDING_KIND,
                "metadata": {"name": name, "labels": dict(LABELS)},
                "spec": {
                    "policyName": name,
                    "validationActions": list(validation_actions),
                    "matchResources": match_constraints(namespace),
                },
            }
        )
    objects.extend(_source_policies(policy, namespace, today=today))
    objects.extend(_override_policies(policy, namespace, today=today))
    return objects


# ------------------------------------------------------------------- overrides

# Where the MutatingAdmissionPolicy records what it replaced (a memory limit, an SM limit,
# a switch, an MPS value the pod set): one line each, in the core's redacted words. On
# 1.36 the apiserver runs the MutatingAdmissionPolicies before the
# ValidatingAdmissionPolicies (kubernetes/kubernetes pkg/kubeapiserver/options/plugins.go
# AllOrderedPlugins, lines 114-117 @ 008b3652), and a validation sees only the object
# after every mutation: ``oldObject`` is null on a create and ``request`` carries no object
# (k8s.io/apiserver admission/plugin/cel CreateAdmissionRequest). A MutatingAdmissionPolicy
# has no warnings, but it evaluates its mutations in order on the object as each leaves it
# (staging/src/k8s.io/apiserver/pkg/admission/plugin/policy/mutating/dispatcher.go:181-193
# @ 072a6776, each through dispatchOne, which ends in versionedAttributes.UpdateObject):
# its first mutation reads the object as it came and writes this annotation, which the
# gpushare-overrides policy turns into warnings.
OVERRIDES_ANNOTATION: Final = "gpushare.io/overridden"
# ... and a label of the same key: the policy's objectSelector, which the apiserver
# matches before any CEL (admission/plugin/policy/generic/policy_dispatcher.go @ 072a6776,
# Dispatch: DefinitionMatches and BindingMatches, then the evaluator), so a pod without it
# pays nothing for the policy.
OVERRIDES_LABEL_VALUE: Final = "true"
# One warning per line, as the webhook's; past this many the last names the annotation.
MAX_OVERRIDE_WARNINGS: Final = 8
_OVERRIDE_ACTIONS: Final[Mapping[Action, list[str]]] = {
    "deny": ["Warn"],
    "warn": ["Warn"],
    "audit": ["Audit"],
}


def _override_policies(policy: Policy, namespace: str, *, today: str) -> list[Obj]:
    """The warnings of what the MutatingAdmissionPolicy replaced, as the webhook's (the
    core warns under limit-tampering, at most: deny and warn warn, audit records, off is
    silent). Only an object whose annotation this request wrote or changed is evaluated:
    a pod is mutated when created, a workload again when updated."""
    action = policy.action("limit-tampering")
    if action == "off":
        return []
    key = literal(OVERRIDES_ANNOTATION)
    new = "object.metadata"
    old = "oldObject.metadata"
    written = (
        f"has({new}.annotations) && {key} in {new}.annotations && (oldObject == null || "
        f"!(has({old}.annotations) && {key} in {old}.annotations && "
        f"{old}.annotations[{key}] == {new}.annotations[{key}]))"
    )
    last = MAX_OVERRIDE_WARNINGS - 1
    more = (
        f"(size(variables.overrides) > {MAX_OVERRIDE_WARNINGS} ? ' (and ' + "
        f"string(size(variables.overrides) - {MAX_OVERRIDE_WARNINGS}) + "
        f"{literal(f' more in annotation {OVERRIDES_ANNOTATION})')} : '')"
    )
    validations = [
        {
            "expression": f"size(variables.overrides) <= {i}",
            "messageExpression": f"'[limit-tampering] ' + variables.overrides[{i}]"
            + (f" + {more}" if i == last else ""),
            "message": "[limit-tampering] the gpushare mutation replaced a value the pod set; "
            f"see annotation {OVERRIDES_ANNOTATION}",
        }
        for i in range(MAX_OVERRIDE_WARNINGS)
    ]
    name = OVERRIDES_POLICY
    conditions = [
        *match_conditions(policy),
        {"name": "gpushare.io/overridden", "expression": written},
    ]
    exception = excepted(policy, "limit-tampering", today=today)
    if exception is not None:
        # The core warns an override as a limit-tampering finding, which an exception
        # takes off.
        conditions.append({"name": "gpushare.io/not-excepted", "expression": f"!({exception})"})
    constraints = match_constraints(namespace)
    constraints["objectSelector"] = {"matchLabels": {OVERRIDES_ANNOTATION: OVERRIDES_LABEL_VALUE}}
    spec: Obj = {
        "failurePolicy": "Ignore",
        "matchConstraints": constraints,
        "matchConditions": conditions,
        "variables": [
            {
                "name": "overrides",
                "expression": f"object.metadata.annotations[{key}].split('\\n')",
            }
        ],
        "validations": validations,
    }
    binding = {
        "policyName": name,
        "validationActions": _OVERRIDE_ACTIONS[action],
        "matchResources": constraints,
    }
    return [
        {
            "apiVersion": API_VERSION,
            "kind": kind,
            "metadata": {"name": name, "labels": dict(LABELS)},
            "spec": body,
        }
        for kind, body in ((POLICY_KIND, spec), (BINDING_KIND, binding))
    ]


# The written objects pods take env and devices from (objects.JUDGED_KINDS).
_SOURCE_RULES: Final = (
    ("", ("configmaps", "secrets"), "Namespaced"),
    ("resource.k8s.io", ("resourceclaims", "resourceclaimtemplates"), "Namespaced"),
    ("resource.k8s.io", ("deviceclasses",), "Cluster"),
)
SOURCE_MESSAGES: Final[Mapping[str, str]] = {
    "raw-visible-devices": "a ConfigMap or Secret may not hold NVIDIA_VISIBLE_DEVICES, "
    "CUDA_VERSION, a HAMi-core switch or limit as a key: envFrom would hand it to containers "
    "unjudged; remove the key and set what a pod needs in its own env",
    "gpu-claim": "a claim on a GPU device class in a namespace that is not in the policy's "
    "dra.allowedNamespaces, a claim configuring a GPU driver as dra.claimConfigs does not "
    "allow (it applies over its DeviceClass's), or a DeviceClass serving a GPU-sharing "
    "resource, hands out GPUs the sharing scheduler never counts; claim GPUs in a namespace "
    "listed there without a configuration the policy does not list, and serve no sharing "
    "resource from a DeviceClass",
}


def _source_constraints(namespace: str) -> Obj:
    constraints = match_constraints(namespace)
    constraints["resourceRules"] = [
        {
            "apiGroups": [group],
            "apiVersions": ["v1"],
            "resources": list(resources),
            "operations": ["CREATE", "UPDATE"],
            "scope": scope,
        }
        for group, resources, scope in _SOURCE_RULES
    ]
    return constraints


def _source_policies(policy: Policy, namespace: str, *, today: str) -> list[Obj]:
    """Per action: the write-time guards on ConfigMaps, Secrets and DRA objects, in a
    policy of their own so that a ConfigMap write evaluates two expressions, not the pod
    rules' variables."""
    expressions = {
        "raw-visible-devices": _env_source_expression(policy),
        "gpu-claim": _claim_expression(policy),
    }
    by_action: dict[Action, list[Obj]] = {}
    recorded: dict[Action, dict[str, str]] = {}
    for rule, unexcepted in expressions.items():
        action = policy.action(rule)
        expression = _unless_excepted(policy, rule, unexcepted, today=today)
        if action != "off":
            recorded.setdefault(action, {})[rule] = expression
            by_action.setdefault(action, []).append(
                {
                    "expression": expression,
                    "message": f"[{rule}] {SOURCE_MESSAGES[rule]}",
                    "reason": "Forbidden",
                }
            )
    # Only what could break a rule is evaluated: data to judge, or a DRA object.
    relevant: Obj = {
        "name": "gpushare.io/source-relevant",
        "expression": "has(object.data) || request.resource.group == 'resource.k8s.io'",
    }
    conditions = [relevant, *match_conditions(policy)]
    objects: list[Obj] = []
    for action, validation_actions in VALIDATION_ACTIONS.items():
        validations = by_action.get(action)
        if not validations:
            continue
        name = policy_name(action, sources=True)
        spec: Obj = {
            "failurePolicy": "Fail",
            "matchConstraints": _source_constraints(namespace),
            "matchConditions": [dict(c) for c in conditions],
            "validations": validations,
        }
        if action in RECORDED_ACTIONS:
            spec["variables"], spec["auditAnnotations"] = audit_annotations(
                recorded[action], SOURCE_MESSAGES
            )
        objects.append(
            {
                "apiVersion": API_VERSION,
                "kind": POLICY_KIND,
                "metadata": {"name": name, "labels": dict(LABELS)},
                "spec": spec,
            }
        )
        objects.append(
            {
                "apiVersion": API_VERSION,
                "kind": BINDING_KIND,
                "metadata": {"name": name, "labels": dict(LABELS)},
                "spec": {
                    "policyName": name,
                    "validationActions": list(validation_actions),
                    "matchResources": _source_constraints(namespace),
                },
            }
        )
    return objects
