"""raw-visible-devices and limit-tampering's env switches in CEL: the device list, a legacy
image, envFrom prefixes, the policy's env allowlist per channel and container class, and
the same guard on what ConfigMaps and Secrets hold (written sources).

Held equal to its core twins (:data:`CORE_TWINS`) by the differential tests.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Final

from webhook.core import env as core_env
from webhook.core import objects as core_objects
from webhook.core import rules as core_rules
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
    VISIBLE_DEVICES,
    Channel,
    ContainerClass,
    channel_of,
)
from webhook.core.injection import REGION_DIR, REGION_SUFFIX, REGION_VARIABLE
from webhook.core.objects import ENV_SOURCES
from webhook.core.policy import EnvAllowance, Policy
from webhook.core.resources import PRIORITIES
from webhook.core.rules import FALSY, HARMLESS_VISIBLE_DEVICES, TRUTHY
from webhook.render.cel import NamedExpression, cel_value, glob_test, literal, strings, stripped_in
from webhook.render.pod import (
    ANNOTATIONS_OF,
    PodTest,
    asks_for_gpu,
    container_class,
    env_exists,
    identity_test,
    is_opaque,
    piece,
    pieces_test,
    shares,
    slice_test,
    value_of,
)

# The core functions this family renders: a rename there breaks the import here.
CORE_TWINS: Final = (
    core_rules.variable_findings,
    core_rules.devices_from_ledger,
    core_rules.limit_tampering,
    core_env.channel_of,
    core_env.legacy_image,
    core_objects.unadmitted_key,
    core_objects.kept_by_writer,
)


def legacy_image(c: str) -> str:
    """``env.legacy_image`` of container ``c``: some CUDA_VERSION entry may be non-empty,
    not every NVIDIA_REQUIRE_CUDA entry is surely non-empty, no NVIDIA_VISIBLE_DEVICES."""
    named = f"has({c}.env) && {c}.env.exists(e, has(e.name) && e.name == "
    surely = f"!has(e.valueFrom) && {value_of('e')} != '' && !{value_of('e')}.contains('$(')"
    return (
        f"{named}'CUDA_VERSION' && ({is_opaque('e')} || {value_of('e')} != '')) && "
        f"!({named}'NVIDIA_REQUIRE_CUDA') && {c}.env.all(e, !has(e.name) || "
        f"e.name != 'NVIDIA_REQUIRE_CUDA' || ({surely}))) && "
        f"!({named}'NVIDIA_VISIBLE_DEVICES'))"
    )


def spells(prefix: str) -> str:
    """``env.spells_guarded`` of the CEL string ``prefix``."""
    return (
        f"{strings(SPELLED_NAMES)}.exists(n, n.startsWith({prefix}) && n != {prefix}) || "
        f"{strings(SPELLED_PREFIXES)}.exists(n, n.startsWith({prefix}) || {prefix}.startsWith(n))"
    )


def _starts(name: str, prefixes: Iterable[str]) -> list[str]:
    return [f"{name}.startsWith({literal(p)})" for p in prefixes]


def channel_test(name: str, channel: Channel) -> str:
    """``env.channel_of(name) == channel`` of the CEL string ``name``."""
    if channel == "devices":
        terms = [*_starts(name, DEVICE_PREFIXES), f"{name} in {strings(DEVICE_NAMES)}"]
    else:
        terms = [f"{name} in {strings(LIMIT_NAMES)}", *_starts(name, LIMIT_PREFIXES)]
    return " || ".join(terms)


def _managed(name: str, *, mps_client: str | None) -> str:
    """``env.managed`` of the CEL string ``name`` in a container that is a slice of an MPS
    pod where ``mps_client`` holds (None: never)."""
    terms = [f"{name} in variables.managedNames", *_starts(name, MANAGED_PREFIXES)]
    if mps_client is not None:
        terms.append(f"({mps_client} && {name} in variables.mpsSettings)")
    return " || ".join(terms)


def env_tables() -> list[NamedExpression]:
    """The env names the allowlist leaves to rules of their own (``env.managed``), as
    variables: the names, the MPS client's settings, the device pins and their values."""
    return [
        {"name": "managedNames", "expression": strings(sorted(MANAGED_NAMES))},
        {"name": "mpsSettings", "expression": strings(sorted(MPS_SETTINGS))},
        {"name": "devicePins", "expression": cel_value(dict(DEVICE_PINS))},
    ]


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
        return f"!({opaque}) && {value} in {strings(allowance.values)}"
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
        held = f"{bound} in {strings(classes)}"
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


def judged_entry(policy: Policy, channel: Channel, c: str) -> str:
    """The env entry ``e`` of container ``c`` sets a name of ``channel`` that no rule of
    its own judges and that is no device pin (a pin's value grants nothing:
    rules._allowlist_finding)."""
    pinned = (
        "e.name in variables.devicePins && !has(e.valueFrom) && "
        f"{value_of('e')} == variables.devicePins[e.name]"
    )
    # The containers the mutation gives the MPS client's settings (mutation.wanted_env).
    mps_client = f"variables.mode == 'mps' && {shares(policy, c)}"
    managed = _managed("e.name", mps_client=mps_client)
    return f"has(e.name) && ({channel_test('e.name', channel)}) && !({managed}) && !({pinned})"


def unadmitted_entry(policy: Policy, channel: Channel, klass: ContainerClass | None, c: str) -> str:
    """The env entry ``e`` of container ``c`` sets a name of ``channel`` that no rule of
    its own judges and that the policy's env.allowed does not admit in a container of
    class ``klass`` (None: the class bound as ``k``)."""
    admitted = env_admitted(policy, "e.name", value_of("e"), is_opaque("e"), klass, channel=channel)
    return f"{judged_entry(policy, channel, c)} && !({admitted})"


def _judged_env(policy: Policy, containers: str, channel: Channel) -> str:
    """The containers that set a name of ``channel`` that no rule of its own judges."""
    judged = judged_entry(policy, channel, "c")
    return f"{containers}.filter(c, has(c.env) && c.env.exists(e, {judged}))"


def _unadmitted_env(policy: Policy, judged: str, channel: Channel) -> str:
    """Some container of ``judged`` (:func:`_judged_env`) sets a name of ``channel`` that
    the policy's env.allowed does not admit in a container of its class (the class
    decided once per container, each branch with the allowlist of its class)."""
    entry = unadmitted_entry(policy, channel, None, "c")
    return f"{judged}.exists(c, [{container_class('c')}].exists(k, c.env.exists(e, {entry})))"


def _allowlist_pieces(policy: Policy, channel: Channel, name: str) -> dict[str, PodTest]:
    """The pieces ``judged<Name>`` (:func:`_judged_env`) and ``unadmitted<Name>``
    (:func:`_unadmitted_env`) of ``channel``."""
    judged = "judged" + name

    def containers(containers: str, gpu: str, spec: str) -> str:
        return _judged_env(policy, containers, channel)

    def unadmitted(containers: str, gpu: str, spec: str) -> str:
        return _unadmitted_env(policy, piece(judged, containers), channel)

    return {judged: containers, "unadmitted" + name: unadmitted}


def _devices_from_ledger(policy: Policy, spec: str) -> str:
    """``rules.devices_from_ledger`` of entry ``e`` of container ``c``: from the ConfigMap
    a ledger's writers keep for this container, in a pod of that ledger's scheduler."""
    annotations = ANNOTATIONS_OF[spec]
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
        # rules._served: the container the annotation names, else the first one.
        first = f"has({spec}.containers) && {spec}.containers[0].name == c.name"
        served = first
        if wanted.container_annotation:
            named = literal(wanted.container_annotation)
            served = f"({named} in {annotations} ? c.name == {annotations}[{named}] : {first})"
        terms.append(
            f"has({spec}.schedulerName) && {spec}.schedulerName == "
            f"{literal(wanted.scheduler_name)} && ({asked or 'false'}) && {key} in {annotations} "
            f"&& {ref}.name == {annotations}[{key}] + '-' + {suffix} && "
            f"({glob_test(f'{ref}.name', ledger.config_maps)}) && {served}"
        )
    if not terms:
        return "false"
    return (
        f"has(e.valueFrom.configMapKeyRef) && {ref}.key == {literal(VISIBLE_DEVICES)} && "
        f"!(has({ref}.optional) && {ref}.optional) && "
        f"!(has({spec}.nodeName) && {spec}.nodeName != '') && "
        f"!({asks_for_gpu(policy, 'c')}) && (" + " || ".join(f"({t})" for t in terms) + ")"
    )


def visible_pieces(policy: Policy) -> dict[str, PodTest]:
    """raw-visible-devices of one pod, piece by piece (:func:`~webhook.render.pod.pod_pieces`):
    a raw device list, a legacy image, an envFrom prefix that spells a guarded name, a
    device name env.allowed does not admit."""

    def raw(containers: str, gpu: str, spec: str) -> str:
        harmless = stripped_in(value_of("e"), HARMLESS_VISIBLE_DEVICES)
        from_ledger = _devices_from_ledger(policy, spec)
        return env_exists(
            containers,
            f"e.name == 'NVIDIA_VISIBLE_DEVICES' && (has(e.valueFrom) ? !({from_ledger}) : "
            f"!({harmless}))",
        )

    def legacy(containers: str, gpu: str, spec: str) -> str:
        # A legacy container that asks for no GPU gets every GPU; a slice, every capability.
        return (
            f"{containers}.exists(c, ({legacy_image('c')}) && (!({asks_for_gpu(policy, 'c')}) || "
            f"({gpu} && has(c.env) && c.env.exists(e, has(e.name) && "
            f"e.name == 'NVIDIA_REQUIRE_CUDA') && ({slice_test(policy, 'c')}))))"
        )

    def prefixes(containers: str, gpu: str, spec: str) -> str:
        return (
            f"{containers}.exists(c, has(c.envFrom) && c.envFrom.exists(s, has(s.prefix) && "
            f"s.prefix != '' && ({spells('s.prefix')})))"
        )

    return {
        "rawVisibleDevices": raw,
        "legacyImage": legacy,
        "spellingPrefix": prefixes,
        **_allowlist_pieces(policy, "devices", "Devices"),
    }


def raw_visible_devices(policy: Policy) -> PodTest:
    return pieces_test([n for n in visible_pieces(policy) if not n.startswith("judged")])


def loosening(policy: Policy, entry: str) -> str:
    """``rules._loosening``: the env entry ``entry`` switches HAMi-core's enforcement
    off or loosens it."""
    value = value_of(entry)
    opaque = is_opaque(entry)
    name = f"{entry}.name"
    terms = [
        f"{name} == 'CUDA_DISABLE_CONTROL' && ({opaque} || {stripped_in(value, TRUTHY)})",
        f"{name} == 'CUDA_REDIRECT' && ({opaque} || {value} != '')",
        f"{name} == 'ACTIVE_OOM_KILLER' && ({opaque} || {stripped_in(value, FALSY)})",
        f"{name} == 'CGPU_DISABLE' && ({opaque} || !({stripped_in(value, FALSY)}))",
        f"{name} == {literal(REGION_VARIABLE)} && ({opaque} || !({region_readable(value)}))",
        f"{name} == 'CUDA_TASK_PRIORITY' && ({opaque} || "
        f"!({stripped_in(value, [str(p) for p in PRIORITIES])}))",
    ]
    if not policy.allow_disable_core_utilization_policy:
        disable = stripped_in(value, ("disable",))
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


def tampering_pieces(policy: Policy) -> dict[str, PodTest]:
    """limit-tampering's env of one pod (:func:`~webhook.render.pod.pod_pieces`): a switch
    that loosens the limits, a limit name env.allowed does not admit."""

    def switched(containers: str, gpu: str, spec: str) -> str:
        return env_exists(containers, loosening(policy, "e"))

    return {"looseningEnv": switched, **_allowlist_pieces(policy, "limits", "Limits")}


def limit_tampering(policy: Policy) -> PodTest:
    names = [n for n in tampering_pieces(policy) if not n.startswith("judged")]

    def test(containers: str, gpu: str, spec: str) -> str:
        return f"{gpu} && ({pieces_test(names)(containers, gpu, spec)})"

    return test


def _guarded_key(key: str) -> str:
    """The CEL string ``key`` is a guarded name."""
    return f"{key} in {strings(GUARDED_NAMES)} || " + " || ".join(
        f"{key}.startsWith({literal(p)})" for p in GUARDED_PREFIXES
    )


def written_env_variables(policy: Policy) -> list[NamedExpression]:
    """What raw-visible-devices reads of a written ConfigMap or Secret: its keys that are a
    guarded name or of a guarded channel (most objects have none, and read nothing
    else), whether a ledger's writer keeps it, and per class of container whether a key
    of a guarded channel is a name env.allowed does not admit there (a Secret's values
    unread)."""
    channels = f"({channel_test('k', 'devices')}) || ({channel_test('k', 'limits')})"
    unread = "request.kind.kind == 'Secret'"
    found: list[NamedExpression] = [
        {
            "name": "judgedKeys",
            "expression": f"object.data.filter(k, {_guarded_key('k')} || {channels})",
        },
        {"name": "keptByWriter", "expression": _kept_by_writer(policy)},
    ]
    found += [
        {
            "name": f"unadmittedIn{klass.capitalize()}",
            "expression": "variables.judgedKeys.exists(k, !("
            f"{env_admitted(policy, 'k', 'object.data[k]', unread, klass)}))",
        }
        for klass in CONTAINER_CLASSES
    ]
    return found


def written_env(policy: Policy) -> str:
    """raw-visible-devices of a ConfigMap or Secret (``objects.unadmitted_key``): no key is
    a guarded name, or a name of a guarded channel that env.allowed does not admit in every
    class of container (:func:`written_env_variables`). The apiserver folds a Secret's
    stringData into data first."""
    kinds = strings(sorted(ENV_SOURCES))
    unadmitted = " || ".join(f"variables.unadmittedIn{k.capitalize()}" for k in CONTAINER_CLASSES)
    return (
        f"!(request.kind.kind in {kinds} && has(object.data) && size(variables.judgedKeys) > 0 "
        f"&& !variables.keptByWriter && (variables.judgedKeys.exists(k, {_guarded_key('k')}) "
        f"|| {unadmitted}))"
    )


def _kept_by_writer(policy: Policy) -> str:
    """``objects.kept_by_writer``: a ConfigMap of a ledger's ``configMaps``, written by one
    of the ledger's writers."""
    name = "object.metadata.name"
    terms = [
        f"({glob_test(name, ledger.config_maps)}) && ({identity_test(ledger.writers)})"
        for ledger in policy.ledgers
        if ledger.config_maps
    ]
    if not terms:
        return "false"
    kept = " || ".join(f"({t})" for t in terms)
    return f"request.kind.kind == 'ConfigMap' && has(object.metadata.name) && ({kept})"
