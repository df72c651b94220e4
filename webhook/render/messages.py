"""The refusals' words: each rule's static message, and for the container rules a
messageExpression naming the first container that breaks the rule and the field, in the
core's redacted words.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from functools import partial
from typing import Final

from webhook.core.env import CONTAINER_CLASSES, VISIBLE_DEVICES, Channel
from webhook.core.finding import HIDDEN
from webhook.core.policy import Policy
from webhook.core.resources import CONTAINER_KINDS, KIND_LABELS
from webhook.core.rules import (
    CLASS_WORDS,
    DEVICE_REQUEST_DIRS,
    HARMLESS_VISIBLE_DEVICES,
    LOOSENING,
    SYS_ADMIN,
    read_paths,
)
from webhook.render.cel import literal, strings, stripped_in, text, upper
from webhook.render.env import env_admitted, judged_entry, legacy_image, loosening, spells
from webhook.render.paths import device_shadow, mount_shadow, normalised_path, read_only_volume
from webhook.render.pod import asks_for_gpu, container_class, gpu_resource, is_opaque, value_of
from webhook.render.requests import asked_names, same_amount, valid_amount, with_parts_value

# The core's mark of a hidden value, as an escape inside a CEL string literal.
_HIDDEN: Final = literal(HIDDEN)[1:-1]

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
    static = text(f"[{rule}] {MESSAGES[rule]}")
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
    added = f"has({caps}) && has({caps}.add) && {caps}.add.exists(a, {upper('a')} in {strings(sorted(SYS_ADMIN))})"
    return (
        f"!has({context}) ? [] : (({privileged}) ? ['privileged in a GPU pod sees every GPU; "
        "remove securityContext.privileged'] : []) + "
        f"(({added}) ? [{text(_SYS_ADMIN_TEXT)}] : [])"
    )


def _unadmitted_text(policy: Policy, channel: Channel, reader: str) -> str:
    """``rules._allowlist_finding`` of entry ``e`` in a container of class ``k``: its
    text, or '' where env.allowed admits it there (``e`` then is of ``channel`` and judged
    by no rule of its own)."""
    exact = sorted({a.name for a in policy.env_allowances if not a.prefix})
    prefixes = sorted({a.name.rstrip("*") for a in policy.env_allowances if a.prefix})
    listed = f"e.name in {strings(exact)} || {strings(prefixes)}.exists(p, e.name.startsWith(p))"
    admits = CONTAINER_CLASSES
    by_class = env_admitted(
        policy, "e.name", value_of("e"), is_opaque("e"), None, channel=channel, bound="a"
    )
    words = "{" + ", ".join(f"{literal(k)}: {text(CLASS_WORDS[k])}" for k in admits) + "}"
    hint = (
        f"size(w) > 0 ? '; the policy\\'s env.allowed admits it only in ' + "
        f"w.map(a, {words}[a]).join(' and ') : ({listed}) ? "
        "'; that value is not one the policy\\'s env.allowed admits' : "
        "'; no entry of the policy\\'s env.allowed admits it'"
    )
    return (
        f"[{strings(admits)}.filter(a, {by_class})].map(w, k in w ? '' : e.name + {_shown('e')} "
        f"+ {literal(f' is read by {reader}')} + ({hint}) + '; remove it')[0]"
    )


_SYS_ADMIN_TEXT: Final = (
    "CAP_SYS_ADMIN in a GPU pod makes the NVIDIA runtime honour any device list it asks for; "
    "remove it from securityContext.capabilities.add"
)


_PREFIX_TEXT: Final = (
    f'envFrom prefix "{HIDDEN}" can spell NVIDIA_VISIBLE_DEVICES or a HAMi-core switch from '
    "a key; remove the prefix"
)


_RUNTIME_TEXT: Final = (
    " hands every GPU to a container that asks for none; set NVIDIA_VISIBLE_DEVICES=void or "
    "request GPUs in limits"
)


_MALFORMED_TEXT: Final = (
    f' "{HIDDEN}" is malformed, out of range, in the wrong unit or differs from its request; '
    "write plain integers in resources.limits, equal in requests"
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
    harmless = stripped_in(value_of("e"), HARMLESS_VISIBLE_DEVICES)
    visible = (
        f"has(e.valueFrom) ? '{VISIBLE_DEVICES} from valueFrom; request GPUs in resources.limits' : "
        f"!({harmless}) ? '{VISIBLE_DEVICES}=\"{_HIDDEN}\"; remove it, request GPUs in limits' : ''"
    )
    unadmitted = _unadmitted_text(policy, "devices", "the NVIDIA container runtime")
    entry = (
        f"e.name == {literal(VISIBLE_DEVICES)} ? ({visible}) : "
        f"({judged_entry(policy, 'devices', x)}) ? ({unadmitted}) : ''"
    )
    legacy = (
        f"({legacy_image(x)}) ? (!({asks_for_gpu(policy, x)}) ? [{text(_LEGACY_TEXTS[0])}] : "
        f"variables.gpu && {x}.env.exists(e, has(e.name) && e.name == 'NVIDIA_REQUIRE_CUDA') && "
        f"k == 'slice' ? [{text(_LEGACY_TEXTS[1])}] : []) : []"
    )
    spelled = (
        f"has({x}.envFrom) ? {x}.envFrom.filter(s, has(s.prefix) && s.prefix != '' && "
        f"({spells('s.prefix')})).map(s, {text(_PREFIX_TEXT)}) : []"
    )
    return f"[{container_class(x)}].map(k, ({legacy}) + ({spelled}) + {_env_texts(x, entry)})[0]"


def _tampering_texts(policy: Policy, x: str) -> str:
    """limit-tampering of container ``x``: each switch that loosens, and why, and each
    limit name env.allowed does not admit."""
    why = "{" + ", ".join(f"{literal(k)}: {text(v)}" for k, v in LOOSENING.items()) + "}"
    unadmitted = _unadmitted_text(policy, "limits", "HAMi-core or the MPS client")
    entry = (
        f"({loosening(policy, 'e')}) ? e.name + {_shown('e')} + ' ' + {why}[e.name] + "
        f"'; remove it' : ({judged_entry(policy, 'limits', x)}) ? ({unadmitted}) : ''"
    )
    return f"[{container_class(x)}].map(k, {_env_texts(x, entry)})[0]"


def _mount_texts(policy: Policy, x: str) -> str:
    """host-device-access of container ``x``: its GPU runtime class, then each mount that
    reaches the GPU stack (what it shadows, as ``rules._shadowed`` says) or writes a
    shared volume."""
    requests = " || ".join(
        f"{v}.startsWith({literal(d)})" for v in ("m.mountPath", "q") for d in DEVICE_REQUEST_DIRS
    )
    roots = strings(read_paths(policy).roots)
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
        f"!({mount_shadow(policy, 'm')}) ? [] : m.mountPath.split('/').exists(s, s == '..') ? "
        f"{backstep} : [{normalised_path('m.mountPath')}].map(q, ({requests}) ? "
        "['a mount at ' + m.mountPath + ' asks the NVIDIA runtime for devices; request GPUs "
        f"in limits'] : {shadowed})[0]"
    )
    shared = (
        f"({read_only_volume(policy, 'm')}) ? ['volume \"' + m.name + '\" is shared with "
        "every GPU pod on the node; mount it readOnly'] : []"
    )
    mounts = f"(has({x}.volumeMounts) ? {x}.volumeMounts.map(m, ({shadow}) + ({shared})) : [])"
    devices = (
        f"(has({x}.volumeDevices) ? {x}.volumeDevices.filter(d, {device_shadow(policy, 'd')})"
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
        f"{strings(sorted(policy.gpu_runtime_classes))} && !({asks_for_gpu(policy, x)}) && "
        f"!(has({x}.env) && {x}.env.exists(e, e.name == {literal(VISIBLE_DEVICES)}))"
    )
    hands = f"'runtimeClassName ' + variables.spec.runtimeClassName + {text(_RUNTIME_TEXT)}"
    return f"(({runtime}) ? [{hands}] : []) + {texts}"


def _request_texts(policy: Policy, x: str) -> str:
    """invalid-gpu-request of container ``x``: each GPU resource it gets wrong, its
    memory asked for twice."""
    gpu = gpu_resource(policy)
    wrong = (
        f"R.filter(r, ({gpu}) && !(r in L && ({same_amount('R[r]', 'L[r]')}))) + "
        f"L.filter(r, ({gpu}) && !([string(L[r])].exists(v, {valid_amount(policy, 'v')})))"
    )
    twice = asked_names(policy.memory_resources)
    texts = (
        f"({wrong}).map(r, r + {text(_MALFORMED_TEXT)}) "
        f"+ (size({twice}) > 1 ? ['asks for memory twice (' + {twice}.join(', ') "
        "+ '); keep one'] : [])"
    )
    return with_parts_value(x, texts)


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
