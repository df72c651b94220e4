"""invalid-gpu-request and gpu-quota in CEL: each container's GPU quantities read as
``resources.read_container`` reads them (``variables.mainAsks``, ``variables.initAsks``),
their ranges and units, and the pod's peak against the policy's maxima.

Held equal to its core twins (:data:`CORE_TWINS`) by the differential tests.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Final

from webhook.core import resources as core_resources
from webhook.core import rules as core_rules
from webhook.core.policy import Policy
from webhook.core.resources import MAX_COUNT, MAX_GIB, MAX_MIB, PRIORITIES
from webhook.render.cel import ints, literal, strings
from webhook.render.pod import Obj, gpu_resource, is_vacant, mig_test, shared_resources

# The core functions this family renders: a rename there breaks the import here.
CORE_TWINS: Final = (
    core_resources.read_container,
    core_resources.vacant,
    core_rules.invalid_gpu_request,
    core_rules.gpu_quota,
    core_rules.pod_totals,
)

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
    return f"{v}.matches({literal(_PRIORITY)}) && int({v}) in {ints(PRIORITIES)}"


def with_parts(c: str, body: str) -> str:
    """``body`` (a boolean) with ``L`` and ``R`` bound to container ``c``'s limits and
    requests (a one-element list binds a name: the apiserver's CEL has no cel.bind)."""
    return f"[{_LIMITS.format(c=c)}].exists(L, [{_REQUESTS.format(c=c)}].exists(R, {body}))"


def with_parts_value(c: str, body: str) -> str:
    """``body`` (any value) with ``L`` and ``R`` bound as in :func:`with_parts`."""
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


def asked_names(names: Iterable[str]) -> str:
    """The resources of ``names`` the container asks for, in name order."""
    return f"{strings(sorted(names))}.filter(r, r in L || r in R)"


def _last(values: str, default: str) -> str:
    return f"[{values}].map(x, size(x) > 0 ? x[size(x) - 1] : {default})[0]"


def _units(policy: Policy) -> list[tuple[str, int, int]]:
    """(test of ``r``, low, high) of each unit, in the order ``read_container`` tries them."""
    units = [(mig_test(policy), 1, MAX_COUNT)]
    for names, high in (
        (policy.count_resources, MAX_COUNT),
        (policy.memory_mib_resources, MAX_MIB),
        # Above MAX_GIB, up to MAX_MIB, a GiB value is read as MiB (resources._RANGES).
        (policy.memory_gib_resources, MAX_MIB),
        (policy.memory_percentage_resources | policy.cores_resources, 100),
    ):
        if names:
            units.append((f"r in {strings(sorted(names))}", 1, high))
    return units


def valid_amount(policy: Policy, v: str) -> str:
    """The quantity text ``v`` of GPU resource ``r`` is what its unit allows."""
    expression = _priority_valid(v)
    for test, low, high in reversed(_units(policy)):
        expression = f"({test}) ? ({_whole(v, low, high)}) : ({expression})"
    return expression


def same_amount(a: str, b: str) -> str:
    """``resources._same_quantity``: the same text, or the same quantity."""
    return (
        f"string({a}) == string({b}) || (isQuantity(string({a})) && isQuantity(string({b})) && "
        f"quantity(string({a})).compareTo(quantity(string({b}))) == 0)"
    )


def _invalid_request(policy: Policy) -> str:
    """``read_container``'s problems of container ``c``: a GPU resource in requests but not
    limits or differing from its limit, a value its unit does not allow, memory asked
    twice."""
    gpu = gpu_resource(policy)
    terms = [
        f"R.exists(r, ({gpu}) && !(r in L && ({same_amount('R[r]', 'L[r]')})))",
        f"L.exists(r, ({gpu}) && !([string(L[r])].exists(v, {valid_amount(policy, 'v')})))",
    ]
    if len(policy.memory_resources) > 1:
        terms.append(f"size({asked_names(policy.memory_resources)}) > 1")
    return with_parts("c", " || ".join(f"({t})" for t in terms))


def _ask(policy: Policy, c: str, *, init: bool = False) -> str:
    """What container ``c`` asks for as ``read_container`` counts it, as a map of ints:
    ``g`` its (v)GPUs (the last count resource, 1 when invalid or absent), ``d`` the GPU
    devices it gets (``rules._gpus``), ``m`` its memory in MiB (the last valid one, else 0),
    ``k`` its cores (the last cores resource, -1 when invalid or absent), ``pct`` its memory
    percentage (likewise), ``p`` its priority (the last valid one, else HAMi-core's 1);
    with ``init``, ``side``: 1 for a sidecar (restartPolicy Always)."""
    counts = f"{asked_names(policy.count_resources)}.map(r, {_amount(_ASKED, 1, MAX_COUNT)})"
    gpus = f"[{counts}].map(x, size(x) > 0 && x[size(x) - 1] > 0 ? x[size(x) - 1] : 1)[0]"
    mib = sorted(policy.memory_mib_resources)
    # A GiB value above MAX_GIB is MiB (resources._read_sharing).
    gib = f"[{_amount(_ASKED, 1, MAX_GIB, 1024)}].map(x, x > 0 ? x : {_amount(_ASKED, MAX_GIB + 1, MAX_MIB)})[0]"
    memory = (
        f"{asked_names(policy.memory_resources)}.map(r, r in {strings(mib)} ? "
        f"{_amount(_ASKED, 1, MAX_MIB)} : {gib}).filter(x, x > 0)"
    )
    cores = f"{asked_names(policy.cores_resources)}.map(r, {_amount(_ASKED, 1, 100)})"
    percentage = (
        f"{asked_names(policy.memory_percentage_resources)}.map(r, {_amount(_ASKED, 1, 100)})"
    )
    priority = (
        f"{asked_names(policy.priority_resources)}.map(r, {_priority_valid(_ASKED)} ? "
        f"int({_ASKED}) : {_NO_PRIORITY}).filter(x, x != {_NO_PRIORITY})"
    )
    mig = f"L.exists(r, {mig_test(policy)}) || R.exists(r, {mig_test(policy)})"
    # Each MIG instance counts, 1 when its count is invalid.
    devices = (
        f"(L.filter(r, {mig_test(policy)}).map(r, {_amount(_ASKED, 1, MAX_COUNT)}) + "
        f"R.filter(r, !(r in L) && ({mig_test(policy)})).map(r, {_amount(_ASKED, 1, MAX_COUNT)})"
        ").map(n, n > 0 ? n : 1).sum()"
    )
    shares = f"{strings(sorted(shared_resources(policy)))}.exists(r, r in L || r in R)"
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
    return with_parts_value(c, body)


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
        # Both, in askNames' order.
        {"name": "asks", "expression": "variables.mainAsks + variables.initAsks"},
    ]


def invalid_gpu_request(policy: Policy) -> str:
    return (
        "!(variables.created && variables.gpu && variables.containers.exists(c, "
        f"!({is_vacant(policy, 'c')}) && {_invalid_request(policy)}))"
    )


def gpu_quota(policy: Policy) -> str | None:
    """``rules.gpu_quota`` against the policy's maxima, or None when it sets none: per
    container its devices, memory times its (v)GPUs and cores; per pod what runs at its
    peak (``rules.pod_totals``: main containers beside the sidecars, or a plain init
    container beside the sidecars declared before it)."""
    each, pod = policy.container_maxima, policy.pod_maxima
    terms = []
    asks = "variables.asks"
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
