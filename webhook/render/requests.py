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
from webhook.render.cel import NamedExpression, ints, literal, strings
from webhook.render.pod import gpu_resource, is_vacant, mig_test, shared_resources

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


def _whole(v: str, low: int, high: str) -> str:
    """``_integer`` accepts the quantity text ``v``: a whole number low..high, without a
    binary suffix (``3Gi`` of MiB is a unit mistake, never 3 GiB)."""
    return (
        f"isQuantity({v}) && !{v}.endsWith('i') && quantity({v}).isInteger() && "
        f"quantity({v}).asInteger() >= {low} && quantity({v}).asInteger() <= {high}"
    )


_ASKED: Final = "string(r in L ? L[r] : R[r])"


# The whole number resource ``r`` asks for, -1 where ``_integer`` refuses its text (a
# binary suffix, a fraction, no quantity).
_ASKED_INTEGER: Final = (
    f"[{_ASKED}].map(v, isQuantity(v) && !v.endsWith('i') && quantity(v).isInteger() ? "
    "quantity(v).asInteger() : -1)[0]"
)


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
    """The quantity text ``v`` of GPU resource ``r`` is what its unit allows: a whole number
    from 1 up to its unit's bound (``high``; 0 for a priority, which is read as one)."""
    units = _units(policy)
    if any(low != 1 for _, low, _ in units):
        raise ValueError("every unit's amounts start at 1")
    high = "0"
    for test, _, bound in reversed(units):
        high = f"({test}) ? {bound} : {high}"
    return f"[{high}].exists(high, high > 0 ? ({_whole(v, 1, 'high')}) : ({_priority_valid(v)}))"


def same_amount(a: str, b: str) -> str:
    """``resources._same_quantity``: the same text, or the same quantity."""
    return (
        f"string({a}) == string({b}) || (isQuantity(string({a})) && isQuantity(string({b})) && "
        f"quantity(string({a})).compareTo(quantity(string({b}))) == 0)"
    )


def _request_problems(policy: Policy) -> dict[str, str]:
    """``read_container``'s problems of container ``c`` by name: a GPU resource in requests
    but not limits or differing from its limit, a value its unit does not allow, memory
    asked twice."""
    gpu = gpu_resource(policy)
    terms = {
        "unequalRequest": f"R.exists(r, ({gpu}) && !(r in L && ({same_amount('R[r]', 'L[r]')})))",
        "invalidAmount": (
            f"L.exists(r, ({gpu}) && !([string(L[r])].exists(v, {valid_amount(policy, 'v')})))"
        ),
    }
    if len(policy.memory_resources) > 1:
        terms["memoryTwice"] = f"size({asked_names(policy.memory_resources)}) > 1"
    return terms


def _in_range(n: str, low: int, high: int, scale: int = 1) -> str:
    """The whole number ``n`` times ``scale`` where it lies in low..high, else -1."""
    times = f" * {scale}" if scale != 1 else ""
    return f"{n} >= {low} && {n} <= {high} ? {n}{times} : -1"


def _ask(policy: Policy, c: str, *, init: bool = False) -> str:
    """What container ``c`` asks for as ``read_container`` counts it, as a map of ints:
    ``g`` its (v)GPUs (the last count resource, 1 when invalid or absent), ``d`` the GPU
    devices it gets (``rules._gpus``), ``m`` its memory in MiB (the last valid one, else 0),
    ``k`` its cores (the last cores resource, -1 when invalid or absent), ``pct`` its memory
    percentage (likewise), ``p`` its priority (the last valid one, else HAMi-core's 1);
    with ``init``, ``side``: 1 for a sidecar (restartPolicy Always).

    ``N`` holds the whole number each resource of a unit holds, in name order (-1 where
    ``_integer`` refuses it, -2 where the container does not ask for it): each quantity is
    read once, and each unit picks its resources' places."""
    names = sorted(
        policy.count_resources
        | policy.memory_resources
        | policy.cores_resources
        | policy.memory_percentage_resources
    )
    numbers = f"{strings(names)}.map(r, r in L || r in R ? {_ASKED_INTEGER} : -2)"

    def n(resource: str) -> str:
        return f"N[{names.index(resource)}]"

    def asked(resources: Iterable[str], high: int) -> str:
        picked = ", ".join(n(r) for r in sorted(resources))
        return f"[{picked}].filter(n, n != -2).map(n, {_in_range('n', 1, high)})"

    counts = asked(policy.count_resources, MAX_COUNT)
    gpus = f"[{counts}].map(x, size(x) > 0 && x[size(x) - 1] > 0 ? x[size(x) - 1] : 1)[0]"
    # A GiB value above MAX_GIB is MiB (resources._read_sharing); one not asked (-2) is
    # out of every range, and dropped with the invalid ones.
    memory = ", ".join(
        _in_range(n(r), 1, MAX_MIB)
        if r in policy.memory_mib_resources
        else f"{n(r)} >= 1 && {n(r)} <= {MAX_GIB} ? {n(r)} * 1024 : "
        f"{_in_range(n(r), MAX_GIB + 1, MAX_MIB)}"
        for r in sorted(policy.memory_resources)
    )
    priority = (
        f"{asked_names(policy.priority_resources)}.map(r, [{_ASKED}].map(v, "
        f"{_priority_valid('v')} ? int(v) : {_NO_PRIORITY})[0]).filter(x, x != {_NO_PRIORITY})"
    )
    # Each MIG instance counts, 1 when its count is invalid (none: 0).
    devices = (
        f"(L.filter(r, {mig_test(policy)}) + R.filter(r, !(r in L) && ({mig_test(policy)})))"
        f".map(r, {_ASKED_INTEGER}).map(n, n >= 1 && n <= {MAX_COUNT} ? n : 1).sum()"
    )
    shared = sorted(shared_resources(policy))
    shares = f"{strings(shared)}.exists(r, r in L || r in R)"
    if set(names) <= set(shared):
        # The places of N are asked for where they are not -2.
        others = [r for r in shared if r not in names]
        shares = "N.exists(n, n != -2)" + (
            f" || {strings(others)}.exists(r, r in L || r in R)" if others else ""
        )
    fields = {
        "g": "g",
        "d": f"{shares} ? g : {devices}",
        "m": _last(f"[{memory}].filter(x, x > 0)", "0"),
        "k": _last(asked(policy.cores_resources, 100), "-1"),
        "pct": _last(asked(policy.memory_percentage_resources, 100), "-1"),
        "p": _last(priority, "1"),
    }
    if init:
        fields["side"] = f"has({c}.restartPolicy) && {c}.restartPolicy == 'Always' ? 1 : 0"
        # Its place among the init containers (their names are unique), for the sidecars
        # declared before it: Kubernetes 1.30's CEL has no lists.range to index by.
        fields["i"] = f"variables.initNames.indexOf({c}.name)"
    body = "{" + ", ".join(f"{literal(k)}: {v}" for k, v in fields.items()) + "}"
    return with_parts_value(c, f"[{numbers}].map(N, [{gpus}].map(g, {body})[0])[0]")


def request_variables(policy: Policy) -> list[NamedExpression]:
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
        {"name": "initNames", "expression": f"{spec}.initContainers.map(x, x.name)"},
        {
            "name": "initAsks",
            "expression": f"has({spec}.initContainers) ? {spec}.initContainers"
            f".filter(c, !({is_vacant(policy, 'c')})).map(c, {_ask(policy, 'c', init=True)}) : []",
        },
        # Both, in askNames' order.
        {"name": "asks", "expression": "variables.mainAsks + variables.initAsks"},
    ]


def request_problem_variables(policy: Policy) -> list[NamedExpression]:
    """Per problem of :func:`_request_problems`, whether a container that is not vacant
    has it (each a pass of its own: an admitted pod's containers are all read either
    way)."""
    return [
        {
            "name": name,
            "expression": f"variables.containers.exists(c, !({is_vacant(policy, 'c')}) && "
            f"{with_parts('c', test)})",
        }
        for name, test in _request_problems(policy).items()
    ]


def invalid_gpu_request(policy: Policy) -> str:
    problems = " || ".join(f"variables.{name}" for name in _request_problems(policy))
    return f"!(variables.created && variables.gpu && ({problems}))"


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
