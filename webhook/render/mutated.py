"""unmutated-gpu-pod in CEL: a created sharing pod or template lacking what the mutation
gives it (``mutation.first_missing``), after every mutating plugin has run.

Held equal to its core twins (:data:`CORE_TWINS`) by the differential tests.
"""

from __future__ import annotations

from typing import Final

from webhook.core import mutation as core_mutation
from webhook.core.env import VISIBLE_DEVICES
from webhook.core.injection import LIBRARY_PATH, MODE_ANNOTATION, MPS_LIMIT_VARS, injection_for
from webhook.core.policy import DEFAULT_SCHEDULER, Mode, Policy
from webhook.core.resources import MAX_COUNT
from webhook.render.cel import NamedExpression, ints, literal, strings
from webhook.render.modes import placed_mps
from webhook.render.pod import (
    MUTATED_CONTAINERS,
    asks_for_gpu,
    injects,
    same_mount,
    same_volume,
    shares,
    slice_test,
)
from webhook.render.requests import with_parts
from webhook.render.scheduling import off_pool, wanted_scheduler

# The core functions this family renders: a rename there breaks the import here.
CORE_TWINS: Final = (core_mutation.first_missing, core_mutation.wanted_env, core_mutation.stray_env)

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
    has it is Kubernetes 1.35's, and these policies load on 1.30 (``variables.gpuIndices``
    holds 0..MAX_COUNT - 1)."""
    return f"variables.gpuIndices.filter(i, i < {count})"


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
    return tests


def _stray_env(policy: Policy) -> str:
    """``mutation.stray_env`` of a vgpu sharing container ``c``: a vGPU limit variable the
    wanted set does not own. A memory percentage's per-GPU limits are owned too: the
    webhook's cluster view turns the percentage into MiB and sets them, with values only
    the view knows."""
    g, m, k = "a['g']", "a['m']", "a['k']"
    wanted_memory = (
        f"({m} > 0 || a['pct'] > 0) && n.matches('^CUDA_DEVICE_MEMORY_LIMIT_(0|[1-9][0-9]?)$') && "
        f"int(n.substring({len('CUDA_DEVICE_MEMORY_LIMIT_')})) < {g}"
    )
    wanted_sm = (
        f"{k} > 0 && n.matches('^CUDA_DEVICE_SM_LIMIT_(0|[1-9][0-9]?)$') && "
        f"int(n.substring({len('CUDA_DEVICE_SM_LIMIT_')})) < {g}"
    )
    stray = (
        "names.exists(n, (n.startsWith('CUDA_DEVICE_MEMORY_LIMIT') && !(" + wanted_memory + ")) "
        "|| (n.startsWith('CUDA_DEVICE_SM_LIMIT_') && !(" + wanted_sm + ")))"
    )
    return _containers_hold(
        policy,
        f"[has(c.env) ? c.env.map(e, e.name) : []].exists(names, [{_ASK}].exists(a, !({stray})))",
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
    return with_parts("c", f"!{strings(counts)}.{asked} && {strings(sources)}.{asked}")


def _containers_hold(policy: Policy, test: str) -> str:
    """Every sharing container and init container passes ``test`` (of ``c``; not ephemeral
    ones: the mutation leaves them)."""
    return f"({MUTATED_CONTAINERS}).all(c, !({shares(policy, 'c')}) || ({test}))"


def _env_set(policy: Policy, mode: Mode) -> str:
    """Each sharing container holds the env the mutation sets in ``mode``."""
    wanted = _wanted_env(policy, mode)
    if policy.device_pins:
        # The device pins: present in a slice container (env.allowed judges the value).
        names = strings(name for name, _ in policy.device_pins)
        wanted.append(f"!({slice_test(policy, 'c')}) || {names}.all(n, n in names)")
    env = " && ".join(f"({t})" for t in wanted)
    return _containers_hold(policy, _ENV_BINDINGS.format(body=f"[{_ASK}].exists(a, {env})"))


# What sharing container ``c`` asks for (:func:`webhook.render.requests._ask`): a sharing
# container is not vacant, so request_variables counted it.
_ASK: Final = "variables.asks[variables.askNames.indexOf(c.name)]"


def _mounts_set(policy: Policy, mode: Mode) -> str:
    """Each sharing container holds the mounts the mutation injects in ``mode``."""
    mounts = [
        f"has(c.volumeMounts) && c.volumeMounts.exists(m, m.mountPath == "
        f"{literal(mount['mountPath'])} && {same_mount('m', mount)})"
        for mount in injection_for(mode, policy).mounts
    ]
    return _containers_hold(policy, " && ".join(f"({t})" for t in mounts) or "true")


def _pod_set(policy: Policy, mode: Mode) -> str:
    """A sharing pod in ``mode`` (vgpu or mps) holds what the mutation sets on the pod: its
    scheduler, the mode annotation, the injected volumes, hostIPC and the MPS node selector
    (mps)."""
    spec = "variables.spec"
    injection = injection_for(mode, policy)
    terms = [
        "variables.scheduled",
        f"{literal(MODE_ANNOTATION)} in variables.annotations && "
        f"variables.annotations[{literal(MODE_ANNOTATION)}] == {literal(mode)}",
    ]
    terms.extend(
        f"has({spec}.volumes) && {spec}.volumes.exists(v, {same_volume('v', volume)})"
        for volume in injection.volumes
    )
    if mode == "mps":
        terms.append(f"has({spec}.hostIPC) && {spec}.hostIPC == true")
        terms.extend(
            f"{placed_mps(policy)} || (has({spec}.nodeSelector) && "
            f"{literal(key)} in {spec}.nodeSelector)"
            for key in policy.mps_node_selector
        )
    return " && ".join(f"({t})" for t in terms)


_MODES: Final[tuple[Mode, ...]] = ("vgpu", "mps")


def unmutated_variables(policy: Policy) -> list[NamedExpression]:
    """What unmutated-gpu-pod reads, each evaluated once when first read: the GPU indices,
    the scheduler, the count resources and no stray limit variable (vgpu) as mutated, then
    per mode (vgpu, mps) whether the pod, the
    containers' env and their mounts hold what the mutation sets, the void in each
    container that asks for no GPU, and a whole-GPU pod kept off the sharing pool."""
    found: list[NamedExpression] = [
        {"name": "gpuIndices", "expression": ints(range(MAX_COUNT))},
        {"name": "scheduled", "expression": _scheduled(policy)},
        {
            "name": "countsSet",
            "expression": _containers_hold(policy, f"!({_implied(policy)})"),
        },
        {"name": "strayFree", "expression": _stray_env(policy)},
    ]
    for mode in _MODES:
        found += [
            {"name": f"{mode}PodSet", "expression": _pod_set(policy, mode)},
            {"name": f"{mode}EnvSet", "expression": _env_set(policy, mode)},
            {"name": f"{mode}MountsSet", "expression": _mounts_set(policy, mode)},
        ]
    voided = (
        f"({MUTATED_CONTAINERS}).all(c, "
        f"({asks_for_gpu(policy, 'c')}) || "
        f"(has(c.env) && c.env.exists(e, e.name == {literal(VISIBLE_DEVICES)})))"
    )
    found.append({"name": "voided", "expression": voided})
    found.append({"name": "offPool", "expression": off_pool(policy)})
    return found


def unmutated(policy: Policy) -> str:
    """``mutation.first_missing`` of a created sharing pod or template finds nothing: in
    mode vgpu or mps all the mutation sets (:func:`unmutated_variables`), in every mode the
    void in each container and init container that asks for no GPU."""
    moded = " || ".join(
        f"({injects(mode)} && !(variables.{mode}PodSet && variables.{mode}EnvSet && "
        f"{'variables.strayFree && ' if mode == 'vgpu' else ''}"
        f"variables.{mode}MountsSet && variables.countsSet))"
        for mode in _MODES
    )
    # A vgpu pod without HAMi-core: its scheduler, mode annotation and counts.
    plain = (
        f"variables.mode == 'vgpu' && !variables.library && !(({_dynamic_mutated(policy)}) && "
        f"{literal(MODE_ANNOTATION)} in variables.annotations && "
        f"variables.annotations[{literal(MODE_ANNOTATION)}] == 'vgpu')"
    )
    moded = f"{moded} || ({plain})"
    whole = "variables.whole && !variables.offPool"
    dynamic = f"variables.dynamicMig && !({_dynamic_mutated(policy)})"
    return (
        f"!(variables.created && variables.sharing && "
        f"(({moded}) || ({whole}) || ({dynamic}) || !variables.voided))"
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
    return "variables.scheduled && variables.countsSet"
