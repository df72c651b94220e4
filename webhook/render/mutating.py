"""The policy's mutation as MutatingAdmissionPolicies: no webhook in the pod path.

Kubernetes 1.36 serves MutatingAdmissionPolicy as admissionregistration.k8s.io/v1
(on by default). There the apiserver itself gives a GPU-sharing pod its slice, so
a pod is capped while no replica of the service answers. Rendered from a compiled
:class:`~webhook.core.policy.Policy`, beside the ValidatingAdmissionPolicies of
:mod:`webhook.render.validating` (whose variables, :mod:`webhook.render.variables`, and mode choice it shares); held
equal to :mod:`webhook.core.mutation` by tests/e2e/test_mutatingpolicy.py.

Two policies, each for pods and the workload kinds' pod templates:

- ``gpushare-mutate`` (failurePolicy Fail), for objects that ask for a GPU resource
  of the policy: in mode vgpu or mps the scheduler, the mode annotation, the
  volumes, and per sharing container (and init container) its env and mounts and the
  implied count resource; in every mode the void for the containers that ask for no
  GPU.
- ``gpushare-void`` (failurePolicy Ignore), for objects that ask for no GPU but name
  ``CUDA_VERSION`` or an ``NVIDIA_*`` variable or run under one of the policy's GPU
  runtime classes: the void, and nothing else. Ignore, so
  that a CEL error never blocks a pod that shares no GPU; the raw-visible-devices
  validation still refuses a legacy container left without it.

Each policy has one mutation, a JSONPatch: the apiserver converts the object, encodes,
patches, decodes and defaults it for every mutation, with ops to make or not (a merge
of an ApplyConfiguration costs as much again, and gpushare-mutate runs twice a create:
the apiserver reinvokes it on its own output). Every op is computed on the object as
it came, and applied in this order:

- the mode annotation, then the record of what the mutation replaces (a user's limit,
  switch, MPS value, mount or volume) in the annotation and label
  ``gpushare.io/overridden``, for the ``gpushare-overrides`` ValidatingAdmissionPolicy
  to warn (:func:`_record`; a MutatingAdmissionPolicy has no warnings of its own);
- in each sharing container, the env entry of a wanted name that the kubelet reads (the
  last of that name) made the wanted one in place, by its index as given, where it
  takes ``valueFrom`` or holds another value (an earlier entry of the name stays, as in
  the core);
- the removals, each list's by index from the last: a stray vGPU limit variable, a
  mount at one of the injected mountPaths that differs from the injected one, a volume
  of an injected name that differs;
- what is then missing, appended (a list the object lacks is added whole): the wanted
  env entries, the injected mounts and volumes, the implied count resource, the void
  in each container that asks for no GPU, the scheduler, ``hostIPC``, the MPS node
  selector's missing keys and the pool affinity.

Entries are matched as the kubelet and server-side apply key them (env and volumes by
name, mounts by mountPath), and each op is made only where the object differs, so a
rerun on the mutation's own output, or on what another mutating webhook made of it
(reinvocationPolicy IfNeeded), finds only what is still to do. No op carries an
``Object{}`` initializer, which kube-apiserver 1.36 panics on inside a list
(kubernetes#142181): values are plain maps and lists.

What the ops say is computed in named variables (a variable can make no JSONPatch, so
each add is a ``{'path', 'value'}`` map): what is injected as data
(``injectionMounts``, ``injectionVolumes``), so that reading and writing it is
rendered once for every mode; a first scan (``suspect``) that most pods end at;
``removed``, ``replacedInContainers`` and ``overridden``; the wanted env by parts
(``sliceAmounts``, ``loosened``, ``vgpuSwitches``, ``vgpuWants``, ``mpsWants``,
``wants``); and the ops' parts (``modeAnnotation``, ``setValues``, ``envAdds``,
``mountAdds``, ``impliedAdds``, ``voidAdds``, ``specAdds``, ``mpsNodeSelector``,
``poolAffinity``). The apiserver evaluates a mutation's variables for that mutation
alone.

CEL cannot read the cluster, so what the cluster view decides stays the webhook's:
a memory percentage stays a percentage here (HAMi's device plugin turns it into the
limit when it allocates), and with the view on, the webhook registered beside these
policies turns it into MiB first.

Pure: a policy in, a list of objects out.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, Final

from webhook.core.env import VISIBLE_DEVICES
from webhook.core.finding import HIDDEN
from webhook.core.injection import LIBRARY_PATH, MODE_ANNOTATION, injection_for
from webhook.core.mutation import UNREPORTED, VOID
from webhook.core.policy import DEFAULT_SCHEDULER, Mode, Policy
from webhook.core.resources import KIND_LABELS, MAX_COUNT, MAX_GIB, MAX_MIB, PRIORITIES
from webhook.core.whole import REQUIRED
from webhook.render.admission import (
    API_VERSION,
    LABELS,
    OVERRIDES_ANNOTATION,
    OVERRIDES_LABEL_VALUE,
    MutatingSpec,
    exemption_conditions,
    match_constraints,
    readable,
)
from webhook.render.cel import NamedExpression, literal, strings, unbind
from webhook.render.env import loosening
from webhook.render.modes import placed_mps
from webhook.render.pod import (
    MUTATED_CONTAINERS,
    MUTATED_KINDS,
    Obj,
    Shape,
    asks_for_gpu,
    container_list,
    empty_dir_is,
    gpu_test,
    host_volume_is,
    mount_is,
    pod_shapes,
    shares,
    slice_test,
    template,
)
from webhook.render.scheduling import wanted_scheduler
from webhook.render.variables import variables

# The core's mark of a hidden value, as an escape inside a CEL string literal.
_HIDDEN: Final = literal(HIDDEN)[1:-1]

POLICY_KIND: Final = "MutatingAdmissionPolicy"


BINDING_KIND: Final = "MutatingAdmissionPolicyBinding"


KINDS: Final = (POLICY_KIND, BINDING_KIND)


# What the apiserver serves the kind as, for discovery (Helm's .Capabilities too).
SERVED_AS: Final = f"{API_VERSION}/{POLICY_KIND}"


MUTATE: Final = "gpushare-mutate"


VOID_POLICY: Final = "gpushare-void"


# Every name this module may render (policies and bindings share them), for RBAC and
# uninstall.
POLICY_NAMES: Final = (MUTATE, VOID_POLICY)


# In the expressions below a container is ``c``, its limits ``L`` and requests ``R``.
_BIND_PARTS: Final = (
    "cel.bind(L, has(c.resources) && has(c.resources.limits) ? c.resources.limits : {}, "
    "cel.bind(R, has(c.resources) && has(c.resources.requests) ? c.resources.requests : {}, "
)


def _values(resources: Iterable[str]) -> str:
    """The values ``c`` asks of ``resources`` (its limit, else its request), in name order."""
    return f"{strings(sorted(resources))}.filter(r, r in L || r in R).map(r, r in L ? L[r] : R[r])"


def _amount(
    resources: Iterable[str], *, high: int, scale: int = 1, unscaled_above: int | None = None
) -> str:
    """The first of ``resources`` that ``c`` asks for as an integer 1..high times
    ``scale`` (not scaled above ``unscaled_above``: a GiB value read as MiB), or -1:
    anything else is the invalid-gpu-request validation's to refuse."""
    if not resources:
        return "-1"
    scaled = "q.asInteger()" + (f" * {scale}" if scale != 1 else "")
    if unscaled_above is not None:
        scaled = f"q.asInteger() > {unscaled_above} ? q.asInteger() : {scaled}"
    return (
        f"cel.bind(v, {_values(resources)}, size(v) > 0 && cel.bind(q, quantity(string(v[0])), "
        f"q.isInteger() && q.asInteger() >= 1 && q.asInteger() <= {high}) ? "
        f"cel.bind(q, quantity(string(v[0])), {scaled}) : -1)"
    )


def _current(name: str) -> str:
    """The value of ``c``'s last env entry named ``name``; empty when there is none or
    it takes ``valueFrom`` (the mutation then sets ours)."""
    return (
        f"cel.bind(es, has(c.env) ? c.env.filter(e, e.name == {literal(name)}) : [], "
        "size(es) > 0 && !has(es[size(es) - 1].valueFrom) && has(es[size(es) - 1].value) "
        "? es[size(es) - 1].value : '')"
    )


def _entry(name: str, value: str) -> str:
    # string(): a value computed through a binding is dyn, and a list's maps must agree.
    return f"{{'name': {literal(name)}, 'value': string({value})}}"


def _priority(policy: Policy) -> str:
    """The priority resource's value as text, or HAMi-core's default 1."""
    if not policy.priority_resources:
        return "'1'"
    documented = ", ".join(str(p) for p in PRIORITIES)
    return (
        f"cel.bind(v, {_values(policy.priority_resources)}, size(v) > 0 && "
        "string(v[0]).matches('^-?[0-9]{1,9}$') && "
        f"int(string(v[0])) in [{documented}] ? string(int(string(v[0]))) : '1')"
    )


def _vgpu_wants(policy: Policy) -> str:
    """``mutation.wanted_env`` of a vGPU container; ``a`` bound to its GPU count, MiB and
    cores (``sliceAmounts``)."""
    parts = []
    lib = literal(LIBRARY_PATH)
    merged = (
        f"cel.bind(p, {_current('LD_PRELOAD')}, p == '' ? {lib} : "
        f"([{lib}] + p.replace(' ', ':').split(':').filter(x, x != '' && x != {lib}))"
        ".join(':'))"
    )
    if policy.preload == "env":
        parts.append(f"[{_entry('LD_PRELOAD', merged)}]")
    else:
        # mutation._PRELOAD_BEFORE_USERS: ours first only where the container sets one.
        sets = "has(c.env) && c.env.exists(e, e.name == 'LD_PRELOAD')"
        parts.append(f"({sets} ? [{_entry('LD_PRELOAD', merged)}] : [])")
    parts.append(
        "(a[1] > 0 ? lists.range(a[0]).map(i, {'name': 'CUDA_DEVICE_MEMORY_LIMIT_' + "
        "string(i), 'value': string(a[1]) + 'm'}) : [])"
    )
    parts.append(
        "(a[2] > 0 ? [{'name': 'CUDA_DEVICE_SM_LIMIT', 'value': string(a[2])}] + "
        "lists.range(a[0]).map(i, {'name': 'CUDA_DEVICE_SM_LIMIT_' + string(i), "
        "'value': string(a[2])}) : [])"
    )
    parts.append("variables.vgpuSwitches[c.name]")
    return " + ".join(parts)


def _vgpu_switches(policy: Policy) -> str:
    """The last of ``mutation.wanted_env`` of a vGPU container ``c``: its switches,
    pinned unless it already loosens one (the mutating webhook refuses that before it
    mutates, so here the user's value stays for the limit-tampering validation to
    refuse: pinned over, the pod would be admitted), and its priority."""
    switches = (
        _entry(
            "GPU_CORE_UTILIZATION_POLICY",
            f"cel.bind(u, {_current('GPU_CORE_UTILIZATION_POLICY')}, "
            f"u in ['force', 'FORCE'] ? u : {literal(policy.core_utilization_policy)})",
        ),
        _entry("CUDA_REDIRECT", "''"),
        _entry(
            "ACTIVE_OOM_KILLER",
            f"cel.bind(o, {_current('ACTIVE_OOM_KILLER')}, o in ['true', '1'] ? o : 'true')",
        ),
    )
    # No CUDA_DEVICE_MEMORY_SHARED_CACHE: the device plugin's own value stands.
    return (
        f"(c.name in variables.loosened ? [] : [{', '.join(switches)}]) + "
        f"{_BIND_PARTS}[{_entry('CUDA_TASK_PRIORITY', _priority(policy))}]))"
    )


def _mps_wants(policy: Policy) -> str:
    return (
        "(a[1] > 0 ? [{'name': 'CUDA_MPS_PINNED_DEVICE_MEM_LIMIT', 'value': "
        "lists.range(a[0]).map(i, string(i) + '=' + string(a[1]) + 'M').join(',')}] : []) + "
        "(a[2] > 0 ? [{'name': 'CUDA_MPS_ACTIVE_THREAD_PERCENTAGE', 'value': "
        "string(a[2])}] : []) + "
        f"[{_entry('CUDA_MPS_PIPE_DIRECTORY', literal(policy.mps_pipe_directory))}]"
    )


def _pin_wants(policy: Policy) -> str:
    """``mutation._PINS`` of a slice container ``c``: each device pin it does not set."""
    if not policy.device_pins:
        return "[]"
    pins = ", ".join(_entry(name, literal(value)) for name, value in policy.device_pins)
    return (
        f"(({slice_test(policy, 'c')}) ? [{pins}].filter(w, "
        "!(has(c.env) && c.env.exists(e, e.name == w['name']))) : [])"
    )


def _slice_amounts(policy: Policy) -> str:
    """A sharing container ``c``'s ``[g, m, k]``: its GPU count (at least 1), MiB and
    cores, each -1 where it asks for none that is valid."""
    counts = _amount(policy.count_resources, high=MAX_COUNT)
    mib = _amount(policy.memory_mib_resources, high=MAX_MIB)
    # Above MAX_GIB a GiB value is MiB (resources._read_sharing).
    gib = _amount(policy.memory_gib_resources, high=MAX_MIB, scale=1024, unscaled_above=MAX_GIB)
    cores = _amount(policy.cores_resources, high=100)
    return (
        f"{_BIND_PARTS}[cel.bind(n, {counts}, n > 0 ? n : 1), "
        f"cel.bind(x, {mib}, x > 0 ? x : {gib}), {cores}]))"
    )


def container_wants(policy: Policy, mode: Mode) -> str:
    """The env a sharing container ``c`` must carry in ``mode`` (vgpu or mps;
    ``mutation.wanted_env``), as a CEL list of ``{'name', 'value'}`` maps."""
    wants = _vgpu_wants(policy) if mode == "vgpu" else _mps_wants(policy)
    return (
        # a[0], a[1], a[2] read in place: each binding is a list and a comprehension more.
        f"cel.bind(a, variables.sliceAmounts[c.name], {_pin_wants(policy)} + {wants})"
    )


def _implied(policy: Policy) -> str:
    """The count resource that ``c``, asking only for memory or cores, implies
    (``ContainerRequest.implied_count_resource``), or ''."""
    implied = dict(sorted(policy.implied_counts.items()))
    if not implied:
        return "''"
    table = "{" + ", ".join(f"{literal(k)}: {literal(v)}" for k, v in implied.items()) + "}"
    return (
        f"{_BIND_PARTS}cel.bind(ic, {strings(implied)}.filter(r, r in L || r in R), "
        f"size(ic) > 0 && !{strings(sorted(policy.count_resources))}.exists(r, r in L || r in R)"
        f" ? {table}[ic[0]] : '')))"
    )


def _pointer() -> str:
    """The JSON Pointer of the object's pod spec, by kind."""
    return _by_kind(
        {shape: literal("/" + "/".join((*shape.path, "spec"))) for shape in pod_shapes()}, "''"
    )


def mutation_variables(policy: Policy) -> list[NamedExpression]:
    """The shared variables (:mod:`webhook.render.variables`), and per container name what
    the mutation sets in it."""
    void = (
        f"({MUTATED_CONTAINERS}).filter(c, !({asks_for_gpu(policy, 'c')}) && "
        f"!(has(c.env) && c.env.exists(e, e.name == {literal(VISIBLE_DEVICES)}))).map(c, c.name)"
    )
    sharing = f"({MUTATED_CONTAINERS}).filter(c, {shares(policy, 'c')})"
    return [
        *variables(policy),
        {"name": "pointer", "expression": _pointer()},
        {
            "name": "sliceAmounts",
            "expression": unbind(
                f"variables.mode == 'mps' || (variables.mode == 'vgpu' && variables.library) ? "
                f"{sharing}.transformMapEntry(i, c, {{c.name: {_slice_amounts(policy)}}}) : {{}}"
            ),
        },
        {
            # The sharing containers that loosen a switch, which keep their value there
            # (see _vgpu_wants).
            "name": "loosened",
            "expression": f"variables.mode == 'vgpu' && variables.library ? {sharing}.filter(c, "
            f"has(c.env) && c.env.exists(e, {loosening(policy, 'e')})).map(c, c.name) : []",
        },
        {
            "name": "vgpuSwitches",
            "expression": unbind(
                f"variables.mode == 'vgpu' && variables.library ? {sharing}.transformMapEntry("
                f"i, c, {{c.name: {_vgpu_switches(policy)}}}) : {{}}"
            ),
        },
        *(
            NamedExpression(
                name=f"{mode}Wants",
                expression=unbind(
                    f"variables.mode == {literal(mode)} ? {sharing}.transformMapEntry("
                    f"i, c, {{c.name: {container_wants(policy, mode)}}}) : {{}}"
                ),
            )
            for mode in ("vgpu", "mps")
        ),
        {
            "name": "wants",
            # A dynamic-MIG pod's sharing containers want no env, only their count.
            "expression": "variables.mode == 'mps' ? variables.mpsWants : "
            "variables.mode == 'vgpu' && variables.library ? variables.vgpuWants : "
            "variables.dynamicMig || variables.mode == 'vgpu' ? "
            f"{sharing}.transformMapEntry(i, c, {{c.name: []}}) : {{}}",
        },
        {
            "name": "implied",
            "expression": unbind(
                f"variables.mode in ['vgpu', 'mps'] || variables.dynamicMig ? "
                f"{sharing}.transformMapEntry(i, c, {{c.name: {_implied(policy)}}}) : {{}}"
            ),
        },
        {"name": "voided", "expression": void},
        *_injection_data(policy),
        {"name": "suspect", "expression": unbind(_suspect())},
        {
            "name": "mpsNodeSelector",
            "expression": unbind(f"variables.mode == 'mps' ? {_node_selector(policy)} : []"),
        },
        {
            "name": "poolAffinity",
            "expression": unbind(f"variables.mode in ['vgpu', 'mps'] ? [] : {_pool_ops(policy)}"),
        },
        *(
            NamedExpression(name=name, expression=unbind(expression))
            for name, expression in zip(
                ("replacedInContainers", "overridden"), _replaced(policy), strict=True
            )
        ),
        {"name": "removed", "expression": unbind(_removed())},
        {"name": "modeAnnotation", "expression": unbind(_mode_annotation())},
        {"name": "setValues", "expression": unbind(_set_values())},
        *(
            NamedExpression(name=name, expression=unbind(expression))
            for name, expression in zip(
                ("envAdds", "mountAdds", "impliedAdds"), _container_adds(), strict=True
            )
        ),
        {"name": "voidAdds", "expression": unbind(_void_adds())},
        {"name": "specAdds", "expression": unbind(_spec_adds(policy))},
    ]


def _by_mode(values: Mapping[str, str], otherwise: str) -> str:
    expression = otherwise
    for mode, value in reversed(list(values.items())):
        expression = f"variables.mode == {literal(mode)} ? {value} : ({expression})"
    return expression


def _step(key: str) -> str:
    """``key`` as one step of a JSON Pointer (RFC 6901's escapes), at render time."""
    return key.replace("~", "~0").replace("/", "~1")


def _appended(at: str, present: str, items: str) -> str:
    """The adds (:func:`_added`) that put ``items`` (a CEL list) at the end of the list at
    the pointer ``at``, whose entries are ``present``: the whole list where it has none
    (an absent or empty list has no end to add to)."""
    return (
        f"(size({items}) == 0 ? [] : size({present}) == 0 ? [{_added(at, items)}] : "
        f"{items}.map(x, {_added(at + ' + ' + literal('/-'), 'x')}))"
    )


# The index of the env entry of ``env`` (whose names are ``ns``) named as the wanted ``w``
# that the kubelet reads, the last of that name, or -1. lastIndexOf, not a scan per name:
# a container may hold hundreds of entries, and the apiserver holds each mutation to a
# cost budget.
_LAST_ENTRY: Final = "ns.lastIndexOf(w['name'])"
# A container's env and its names, as _LAST_ENTRY reads them, around ``{body}``.
_ENV_BOUND: Final = (
    "cel.bind(env, has(c.env) ? c.env : [], cel.bind(ns, env.map(e, e.name), {body}))"
)
# The container ``c`` at index ``i`` of kind ``k``, as a JSON Pointer.
_CONTAINER_AT: Final = "variables.pointer + '/' + k + '/' + string(i)"


def _each_container(test: str, body: str) -> str:
    """``body`` of each container ``c`` of the pod that passes ``test`` (on ``cs[i]``),
    of kind ``k`` at index ``i``, in order, as one list (``body`` gives a list each)."""
    return (
        "['containers', 'initContainers'].map(k, cel.bind(cs, k == 'containers' ? "
        "(has(variables.spec.containers) ? variables.spec.containers : []) : "
        "(has(variables.spec.initContainers) ? variables.spec.initContainers : []), "
        f"lists.range(size(cs)).filter(i, {test}).map(i, "
        f"cel.bind(c, cs[i], {body})))).flatten().flatten()"
    )


def _each_sharing(body: str) -> str:
    """``body`` of each sharing container (:func:`_each_container`)."""
    return _each_container("cs[i].name in variables.wants", body)


def _set_values() -> str:
    """The replaces (:func:`_added`'s data, made ``replace`` ops) of each env entry that
    the kubelet reads of a wanted name, the last of that name, that takes valueFrom or
    holds another value: the entry made the wanted one in place, by its index as given
    (read before the removals), as ``mutation._env_ops`` does; an earlier entry of that
    name stays, as the kubelet reads the last."""
    entry = f"{_CONTAINER_AT} + {literal('/env/')} + string(j)"
    body = _ENV_BOUND.format(
        body=f"variables.wants[c.name].map(w, cel.bind(j, {_LAST_ENTRY}, j >= 0 && "
        "(has(env[j].valueFrom) || (has(env[j].value) ? env[j].value : '') != w['value']) ? "
        f"[{_added(entry, 'w')}] : [])).flatten()"
    )
    return _each_sharing(body)


def _injected_mount(item: str) -> str:
    """The injected mount ``item`` of ``variables.injectionMounts`` as a volumeMount."""
    base = f"'name': dyn({item}.name), 'mountPath': dyn({item}.mountPath)"
    return f"({item}.readOnly == 'true' ? {{{base}, 'readOnly': dyn(true)}} : {{{base}}})"


def _injected_volume(item: str) -> str:
    """The injected volume ``item`` of ``variables.injectionVolumes`` as a volume."""
    host = f"{{'path': {item}.path, 'type': {item}.type}}"
    return (
        f"({item}.path == '' ? {{'name': dyn({item}.name), 'emptyDir': dyn({{}})}} : "
        f"{{'name': dyn({item}.name), 'hostPath': dyn({host})}})"
    )


def _container_adds() -> tuple[str, str, str]:
    """The variables ``envAdds``, ``mountAdds`` and ``impliedAdds``: per sharing
    container, appended after the removals, each wanted env entry of a name it lacks,
    each injected mount not already there as injected, and the implied count resource
    (in requests too where the container has requests)."""
    at = _CONTAINER_AT
    env = _appended(
        f"{at} + '/env'",
        "env",
        f"variables.wants[c.name].filter(w, {_LAST_ENTRY} < 0).map(w, dyn(w))",
    )
    mounts = _appended(
        f"{at} + '/volumeMounts'",
        "ms",
        "variables.injectionMounts.filter(i, !ms.exists(m, m.mountPath == i.mountPath && "
        f"{_IS_INJECTED_MOUNT})).map(i, {_injected_mount('i')})",
    )
    one = literal("1")
    limits, requests = (
        f"{at} + {literal('/resources/' + part)}" for part in ("limits", "requests")
    )
    key = " + '/' + x"
    implied = (
        "cel.bind(r, variables.implied[c.name], r == '' ? [] : "
        f"cel.bind(x, {_step_of('r')}, "
        f"(has(c.resources.limits) ? [{_added(limits + key, one)}] : "
        f"[{_added(limits, '{r: ' + one + '}')}]) + "
        f"(has(c.resources.requests) ? [{_added(requests + key, one)}] : [])))"
    )
    bodies = (
        _ENV_BOUND.format(body=env),
        f"cel.bind(ms, has(c.volumeMounts) ? c.volumeMounts : [], {mounts})",
        implied,
    )
    env_adds, mount_adds, implied_adds = (_each_sharing(body) for body in bodies)
    return env_adds, mount_adds, implied_adds


def _void_adds() -> str:
    """The void appended to the env of each container that asks for no GPU and sets no
    NVIDIA_VISIBLE_DEVICES (``variables.voided``)."""
    void = f"[{{'name': {literal(VISIBLE_DEVICES)}, 'value': {literal(VOID)}}}]"
    body = (
        "cel.bind(env, has(c.env) ? c.env : [], "
        f"{_appended(_CONTAINER_AT + ' + ' + literal('/env'), 'env', void)})"
    )
    return _each_container("cs[i].name in variables.voided", body)


def _spec_adds(policy: Policy) -> str:
    """The pod spec's adds: the scheduler where it has the default one, hostIPC in mode
    mps, and each injected volume not already there as injected."""
    spec = "variables.spec"
    scheduled = "(variables.mode in ['vgpu', 'mps'] || variables.dynamicMig)"
    scheduler = (
        f"({scheduled} && (!has({spec}.schedulerName) || "
        f"{spec}.schedulerName in ['', {literal(DEFAULT_SCHEDULER)}]) && "
        f"{wanted_scheduler(policy)} != {literal(DEFAULT_SCHEDULER)} ? "
        f"[{_added('variables.pointer + ' + literal('/schedulerName'), wanted_scheduler(policy))}] : [])"
    )
    ipc = (
        f"(variables.mode == 'mps' && !(has({spec}.hostIPC) && {spec}.hostIPC) ? "
        f"[{_added('variables.pointer + ' + literal('/hostIPC'), 'true')}] : [])"
    )
    volumes = _appended(
        "variables.pointer + '/volumes'",
        "vs",
        "variables.injectionVolumes.filter(i, !vs.exists(v, v.name == i.name && "
        f"{_IS_INJECTED_VOLUME}))"
        f".map(i, {_injected_volume('i')})",
    )
    return (
        f"{scheduler} + {ipc} + cel.bind(vs, has({spec}.volumes) ? {spec}.volumes : [], {volumes})"
    )


_ANNOTATIONS: Final = "annotations"


def _mode_annotation() -> str:
    """The add of the mode annotation on the pod's (or template's) metadata, by kind,
    unless it is there. The object's own annotations are read as they came: on a pod,
    the record (:func:`_record`) adds to the map this may have made."""
    key, value = literal(MODE_ANNOTATION), "variables.mode"

    def one(shape: Shape) -> str:
        meta = ".".join(("object", *shape.path, "metadata"))
        at = "/" + "/".join((*shape.path, "metadata"))
        annotations = f"{{{key}: {value}}}"
        wrapped = f"{{{literal(_ANNOTATIONS)}: {annotations}}}"
        pointer = literal(f"{at}/{_ANNOTATIONS}/{_step(MODE_ANNOTATION)}")
        return (
            f"!has({meta}) ? [{_added(literal(at), wrapped)}] : "
            f"!has({meta}.annotations) ? [{_added(literal(at + '/' + _ANNOTATIONS), annotations)}] : "
            f"{key} in {meta}.annotations && {meta}.annotations[{key}] == {value} ? [] : "
            f"[{_added(pointer, value)}]"
        )

    return (
        "variables.mode in ['vgpu', 'mps'] ? "
        f"({_by_kind({shape: one(shape) for shape in pod_shapes()}, '[]')}) : []"
    )


_NODE_AFFINITY: Final = "nodeAffinity"


def _pool_ops(policy: Policy) -> str:
    """The adds (:func:`_added`) of ``mutation._pool_ops``: the required node affinity
    away from the sharing pool, added at the level that is missing, else each pool
    requirement a nodeSelectorTerm lacks appended to it. The values are plain maps and
    lists, never Object{} initializers (kubernetes#142181)."""
    if not policy.sharing_pool:
        return "[]"
    wanted = (
        "["
        + ", ".join(
            # dyn: a map literal's values are of one type, and these are a string and a list.
            f"{{'key': dyn({literal(k)}), 'operator': dyn('NotIn'), 'values': dyn([{literal(v)}])}}"
            for k, v in policy.sharing_pool
        )
        + "]"
    )
    spec = "variables.spec"
    affinity, node = f"{spec}.affinity", f"{spec}.affinity.nodeAffinity"
    required = f"{node}.{REQUIRED}"
    at = f"variables.pointer + '/affinity/nodeAffinity/{REQUIRED}'"
    terms = "[{'matchExpressions': w}]"
    with_terms = f"{{'nodeSelectorTerms': {terms}}}"
    with_required = f"{{'{REQUIRED}': {with_terms}}}"

    def add(path: str, value: str) -> str:
        return f"[{_added(path, value)}]"

    per_term = (
        f"lists.range(size({required}.nodeSelectorTerms)).map(i, "
        f"cel.bind(t, {required}.nodeSelectorTerms[i], cel.bind(p, {at} + "
        "'/nodeSelectorTerms/' + string(i) + '/matchExpressions', "
        f"!has(t.matchExpressions) ? {add('p', 'w')} : w.filter(x, !t.matchExpressions.exists("
        "e, e.key == x['key'] && e.operator == 'NotIn' && has(e.values) && "
        f"e.values == x['values'])).map(x, {_added('p + ' + literal('/-'), 'x')}))))"
        ".flatten()"
    )
    pod_at = "variables.pointer + '/affinity'"
    body = (
        f"!has({affinity}) ? {add(pod_at, f'{{{literal(_NODE_AFFINITY)}: {with_required}}}')} : "
        f"!has({node}) ? {add(pod_at + ' + ' + literal('/' + _NODE_AFFINITY), with_required)} : "
        f"!has({required}) ? {add(at, with_terms)} : "
        f"!has({required}.nodeSelectorTerms) || size({required}.nodeSelectorTerms) == 0 ? "
        f"{add(at + ' + ' + literal('/nodeSelectorTerms'), terms)} : {per_term}"
    )
    return f"(variables.whole ? cel.bind(w, {wanted}, {body}) : [])"


def _remove(pointer: str) -> str:
    """The JSON pointers of the filtered indices, from the last, under ``pointer``."""
    return f".reverse().map(j, {pointer} + string(j))"


def _injection_data(policy: Policy) -> list[NamedExpression]:
    """The variables ``injectionMounts`` and ``injectionVolumes``: what the object's mode
    injects (``injection_for``), as data, so that what reads or writes it is rendered
    once for every mode. Every value a string, so each list is of one type: a mount's
    ``readOnly`` is ``'true'`` where it is set, a volume's ``path`` is ``''`` for an
    emptyDir (the injection holds hostPath and emptyDir volumes only)."""

    def mount(m: Mapping[str, Any]) -> str:
        read_only = "true" if m.get("readOnly") else ""
        return (
            f"{{'name': {literal(m['name'])}, 'mountPath': {literal(m['mountPath'])}, "
            f"'readOnly': {literal(read_only)}}}"
        )

    def volume(v: Mapping[str, Any]) -> str:
        if set(v) - {"name", "hostPath", "emptyDir"} or v.get("emptyDir"):
            raise ValueError(f"an injected volume of a kind not rendered: {v}")
        host = v.get("hostPath", {"path": "", "type": ""})
        return (
            f"{{'name': {literal(v['name'])}, 'path': {literal(host['path'])}, "
            f"'type': {literal(host['type'])}}}"
        )

    by_mode: dict[str, tuple[str, str]] = {}
    for mode in ("vgpu", "mps"):
        injection = injection_for(mode, policy)
        by_mode[mode] = (
            "[" + ", ".join(map(mount, injection.mounts)) + "]",
            "[" + ", ".join(map(volume, injection.volumes)) + "]",
        )
    return [
        {
            "name": name,
            "expression": _by_mode(
                {
                    "vgpu": f"(variables.library ? {by_mode['vgpu'][i]} : [])",
                    "mps": by_mode["mps"][i],
                },
                "[]",
            ),
        }
        for i, name in enumerate(("injectionMounts", "injectionVolumes"))
    ]


# A mount ``m`` at an injected path, and one that is the injected mount there
# (``mutation._same_mount``: its volume, read-only as injected, no subPath).
_AT_INJECTED: Final = "variables.injectionMounts.exists(i, i.mountPath == m.mountPath)"
# The mount ``m`` is the injected mount ``i``, the volume ``v`` the injected volume ``i``.
_IS_INJECTED_MOUNT: Final = mount_is("m", "i.name", "(i.readOnly == " + literal("true") + ")")
_IS_INJECTED_VOLUME: Final = (
    f"(i.path != '' ? {host_volume_is('v', 'i.path', 'i.type')} : {empty_dir_is('v')})"
)
_KEPT_MOUNT: Final = (
    f"variables.injectionMounts.exists(i, i.mountPath == m.mountPath && {_IS_INJECTED_MOUNT})"
)
# A volume ``v`` of an injected name, and one that is the injected volume
# (``injection.same_volume``: one source per volume, hostPath.type defaulted).
_OF_INJECTED: Final = "variables.injectionVolumes.exists(i, i.name == v.name)"
_KEPT_VOLUME: Final = (
    f"variables.injectionVolumes.exists(i, i.name == v.name && {_IS_INJECTED_VOLUME})"
)


def _stray(wanted: str) -> str:
    """A stray vGPU limit variable ``n``, where ``wanted`` (a CEL list) are the names
    wanted (vgpu mode only)."""
    return (
        "variables.mode == 'vgpu' && (n.startsWith('CUDA_DEVICE_MEMORY_LIMIT') || "
        f"n.startsWith('CUDA_DEVICE_SM_LIMIT_')) && !(n in {wanted})"
    )


def _suspect() -> str:
    """Some sharing container holds what the mutation removes or reports replaced (the
    last entry of a wanted name taking valueFrom or holding another value; a stray vGPU
    limit; a mount at an injected path that is not the injected one), or the pod a
    volume of an injected name that is not the injected one: else ``removed`` and
    ``overridden`` are empty, and their scans are skipped. A pod the mutation made holds
    its names (the apiserver reinvokes gpushare-mutate on it): each wanted name is
    looked up by lastIndexOf, not scanned for."""
    spec = "variables.spec"
    entry = (
        "w.all(x, cel.bind(j, ns.lastIndexOf(x.name), j < 0 || "
        "(!has(env[j].valueFrom) && (has(env[j].value) ? env[j].value : '') == x.value)))"
    )
    stray = f"ns.exists(n, {_stray('w.map(x, x.name)')})"
    clean = _ENV_BOUND.format(body=f"cel.bind(w, variables.wants[c.name], {entry} && !{stray})")
    mounts = f"has(c.volumeMounts) && c.volumeMounts.exists(m, {_AT_INJECTED} && !{_KEPT_MOUNT})"
    return (
        "size(variables.injectionMounts) > 0 && "
        f"(({MUTATED_CONTAINERS}).exists(c, c.name in variables.wants && (!({clean}) || "
        f"({mounts}))) || "
        f"(has({spec}.volumes) && {spec}.volumes.exists(v, {_OF_INJECTED} && !{_KEPT_VOLUME})))"
    )


def _removed() -> str:
    """The JSON pointers to remove, each list's from its last index, of what is not set
    in place (see the module's docstring): in each sharing container a stray vGPU
    limit, a mount at an injected path that is not the injected one; a volume of an
    injected name that is not the injected one."""
    spec = "variables.spec"
    at = _CONTAINER_AT
    env = (
        "cel.bind(env, has(c.env) ? c.env : [], lists.range(size(env)).filter(j, "
        f"cel.bind(n, env[j].name, {_stray('w')})){_remove(at + ' + ' + literal('/env/'))})"
    )
    mounts = (
        "cel.bind(ms, has(c.volumeMounts) ? c.volumeMounts : [], "
        "lists.range(size(ms)).filter(j, cel.bind(m, ms[j], "
        f"{_AT_INJECTED} && !{_KEPT_MOUNT}))"
        f"{_remove(at + ' + ' + literal('/volumeMounts/'))})"
    )
    containers = _each_sharing(
        f"cel.bind(w, variables.wants[c.name].map(e, e['name']), {env} + {mounts})"
    )
    volumes = (
        f"cel.bind(vs, has({spec}.volumes) ? {spec}.volumes : [], "
        f"lists.range(size(vs)).filter(j, cel.bind(v, vs[j], {_OF_INJECTED} && !{_KEPT_VOLUME}))"
        f"{_remove('variables.pointer + ' + literal('/volumes/'))})"
    )
    return f"variables.suspect ? {containers} + {volumes} : []"


def _replaced(policy: Policy) -> tuple[str, str]:
    """The variables ``replacedInContainers`` and ``overridden``: what the mutation
    replaces in the sharing containers, and in the object, in the core's redacted words
    and order (``mutation.Patch.overwritten``): the injected volumes of another source, then per
    sharing container the last entry of each wanted name with another value (or
    valueFrom), the stray vGPU limits (from the last), the mounts at the injected paths
    that differ. Read on the object as it came in: the JSONPatch that records it is the
    first mutation."""
    spec = "variables.spec"
    volumes = (
        f"(has({spec}.volumes) ? {spec}.volumes : []).filter(v, {_OF_INJECTED} && "
        f"!{_KEPT_VOLUME}).map(v, 'pod: volume ' + v.name + ' replaced by the injected one')"
    )
    unreported = strings(sorted(UNREPORTED))
    replaced = (
        f"variables.wants[c.name].filter(w, !(w['name'] in {unreported})).map(w, "
        "cel.bind(es, env.filter(e, e.name == w['name']), size(es) == 0 ? '' : "
        "cel.bind(e, es[size(es) - 1], cel.bind(by, ' replaced by \\\"' + w['value'] + '\\\"', "
        "has(e.valueFrom) ? label + w['name'] + ' valueFrom' + by : "
        f"(has(e.value) ? e.value : '') != w['value'] ? label + w['name'] + ' \\\"{_HIDDEN}\\\"' + by "
        ": '')))).filter(t, t != '')"
    )
    stray = (
        "cel.bind(w, variables.wants[c.name].map(x, x['name']), env.filter(e, "
        f"cel.bind(n, e.name, {_stray('w')})).reverse().map(e, label + e.name + "
        "' removed (limits come from resources)'))"
    )
    mounts = (
        f"(has(c.volumeMounts) ? c.volumeMounts : []).filter(m, {_AT_INJECTED} && "
        f"!{_KEPT_MOUNT}).map(m, label + 'mount ' + m.mountPath + "
        "' replaced by the injected one')"
    )
    labels = (
        "{"
        + ", ".join(f"{literal(k)}: {literal(KIND_LABELS[k] + ' ')}" for k in MUTATED_KINDS)
        + "}"
    )
    containers = _each_sharing(
        f"cel.bind(label, {labels}[k] + '\"' + c.name + '\": ', "
        f"cel.bind(env, has(c.env) ? c.env : [], {replaced} + {stray} + {mounts}))"
    )
    found = f"variables.suspect ? {volumes} + variables.replacedInContainers : []"
    # Once each, as the core reports a finding (a name repeated is removed twice).
    once = "lists.range(size(all)).filter(i, !lists.range(i).exists(j, all[j] == all[i]))"
    return containers, f"cel.bind(all, {found}, {once}.map(i, all[i]))"


def _set(field: str, key: str, value: str, *, made: str = "false") -> str:
    """A JSONPatch op that sets ``key`` of the object's ``metadata.<field>`` to ``value``
    (a map of strings where it has none and ``made``, a CEL bool, says no earlier op of
    the patch made one: no Object{} initializer, kubernetes#142181)."""
    return (
        f"has(object.metadata.{field}) || {made} ? JSONPatch{{op: 'add', "
        f"path: '/metadata/{field}/' + jsonpatch.escapeKey({key}), value: {value}}} : "
        f"JSONPatch{{op: 'add', path: '/metadata/{field}', value: {{{key}: {value}}}}}"
    )


def _record() -> str:
    """JSONPatch ops that write ``variables.overridden`` into the object's own annotation
    ``OVERRIDES_ANNOTATION`` (one line each), for the warning ValidatingAdmissionPolicy
    to read, and the label of the same key, which that policy's objectSelector asks for:
    an object without it costs no CEL there. A MutatingAdmissionPolicy has no warnings
    of its own, and a validation sees only the mutated object. Nothing replaced,
    nothing written: what a first pass wrote stays on a reinvocation."""
    key = literal(OVERRIDES_ANNOTATION)
    # A pod's annotations may be new: the mode annotation's add comes first.
    made = "request.kind.kind == 'Pod' && variables.mode in ['vgpu', 'mps']"
    annotation = _set("annotations", key, "variables.overridden.join('\\n')", made=made)
    label = _set("labels", key, literal(OVERRIDES_LABEL_VALUE))
    return f"size(variables.overridden) == 0 ? [] : [{annotation}, {label}]"


def _step_of(key: str) -> str:
    """The CEL string ``key`` as one step of a JSON Pointer (:func:`_step` in CEL):
    jsonpatch.escapeKey is a mutation's alone, not a variable's."""
    return f"{key}.replace('~', '~0').replace('/', '~1')"


def _added(path: str, value: str) -> str:
    """A JSONPatch op's path and value as data, for a variable (where no JSONPatch can be
    made), each ``dyn`` so that ops of maps, lists and strings are of one type."""
    return f"{{'path': dyn({path}), 'value': dyn({value})}}"


def _node_selector(policy: Policy) -> str:
    """The adds (:func:`_added`) of the MPS node selector's missing keys
    (``mutation._mps_ops``). Each adds what is absent, so a rerun finds nothing to add."""
    if not policy.mps_node_selector:
        return "[]"
    spec = "variables.spec"
    table = (
        "{"
        + ", ".join(f"{literal(k)}: {literal(v)}" for k, v in policy.mps_node_selector.items())
        + "}"
    )
    keys = strings(policy.mps_node_selector)
    at = "variables.pointer + '/nodeSelector'"
    # A pod its scheduler places by the card's mode gets none (ModeChoice.placed).
    return (
        f"({placed_mps(policy)} ? [] : "
        f"(has({spec}.nodeSelector) ? {keys}.filter(k, !(k in {spec}.nodeSelector)).map(k, "
        f"{_added(at + ' + ' + literal('/') + ' + ' + _step_of('k'), f'{table}[k]')}) : "
        f"[{_added(at, table)}]))"
    )


def _by_kind(expressions: Mapping[Shape, str], otherwise: str) -> str:
    expression = otherwise
    for shape, value in reversed(list(expressions.items())):
        expression = f"request.kind.kind in {strings(shape.kinds)} ? ({value}) : ({expression})"
    return expression


def _ops(op: str, items: str) -> str:
    """The CEL list ``items`` of paths and values (:func:`_added`) as JSONPatch ops ``op``."""
    return f"{items}.map(a, JSONPatch{{op: '{op}', path: a.path, value: a.value}})"


def mutating_policies(policy: Policy, *, namespace: str = "gpushare-system") -> list[Obj]:
    """The MutatingAdmissionPolicies and their bindings that apply ``policy``'s mutation."""
    constraints = match_constraints(namespace)
    # The core mutates pods when they are created, workloads also when updated.
    for rule in constraints["resourceRules"]:
        if "pods" in rule["resources"]:
            rule["resources"] = ["pods"]
            rule["operations"] = ["CREATE"]
    shared = mutation_variables(policy)
    exemptions = exemption_conditions(policy)
    # A matchCondition binds no variables: the pod spec (or template's) is bound once
    # here, by a one-element list, instead of dispatched on the kind per container list.
    spec_of = template("object", "spec")
    containers = f"({container_list('s')})"
    gpu = gpu_test(policy, containers, inline=True)
    # The env scan first: most GPU pods name no NVIDIA env, and then the GPU test (the
    # longer one) is never evaluated.
    nvidia = (
        f"{containers}.exists(c, has(c.env) && "
        "c.env.exists(e, e.name == 'CUDA_VERSION' || e.name.startsWith('NVIDIA_')))"
    )
    if policy.gpu_runtime_classes:
        # mutation.needs_void: under a GPU runtime class every container without a GPU.
        runtime = "has(s.runtimeClassName) && " + (
            f"s.runtimeClassName in {strings(sorted(policy.gpu_runtime_classes))}"
        )
        nvidia = f"({runtime}) || {nvidia}"
    nvidia = f"[{spec_of}].exists(s, ({nvidia}) && !({gpu}))"
    gpu = f"[{spec_of}].exists(s, {gpu})"
    # Read on the object as it came, applied in this order: the adds that make the mode
    # annotation and the record, the values set in place (by their indices as given), the
    # removals (each list's from its last index), then what is appended or added.
    appended = (
        "variables.envAdds + variables.mountAdds + variables.impliedAdds + "
        "variables.voidAdds + variables.specAdds + variables.mpsNodeSelector + "
        "variables.poolAffinity"
    )
    patch = (
        f"{_ops('add', 'variables.modeAnnotation')} + ({_record()}) + "
        f"{_ops('replace', 'variables.setValues')} + "
        "variables.removed.map(p, JSONPatch{op: 'remove', path: p}) + "
        f"{_ops('add', f'({appended})')}"
    )
    mutate: MutatingSpec = {
        "failurePolicy": "Fail",
        "matchConstraints": constraints,
        "matchConditions": [*exemptions, {"name": "gpushare.io/gpu", "expression": gpu}],
        "reinvocationPolicy": "IfNeeded",
        "variables": shared,
        "mutations": [
            # One mutation: the apiserver converts the object, and encodes, patches and
            # decodes it (or merges into it), for each mutation, with ops to make or not.
            {
                "patchType": "JSONPatch",
                "jsonPatch": {"expression": unbind(patch)},
            },
        ],
    }
    void: MutatingSpec = {
        "failurePolicy": "Ignore",
        "matchConstraints": constraints,
        "matchConditions": [
            *exemptions,
            {"name": "gpushare.io/needs-void", "expression": nvidia},
        ],
        "reinvocationPolicy": "IfNeeded",
        "variables": [
            v
            for v in shared
            if v["name"]
            in ("spec", "containers", "vacant", "asking", "voided", "pointer", "voidAdds")
        ],
        "mutations": [
            {
                "patchType": "JSONPatch",
                "jsonPatch": {"expression": _ops("add", "variables.voidAdds")},
            }
        ],
    }
    objects: list[Obj] = []
    for name, spec in ((MUTATE, mutate), (VOID_POLICY, void)):
        metadata = {"name": name, "labels": dict(LABELS)}
        objects.append(
            {"apiVersion": API_VERSION, "kind": POLICY_KIND, "metadata": metadata, "spec": spec}
        )
        objects.append(
            {
                "apiVersion": API_VERSION,
                "kind": BINDING_KIND,
                "metadata": {"name": name, "labels": dict(LABELS)},
                "spec": {"policyName": name, "matchResources": constraints},
            }
        )
    return readable(objects)
