"""The pod vocabulary, written once: kinds and their template paths, container lists,
resource asks, env reads, volumes and mounts, and who sent the request.

Every rule family reads a pod through these. A container's class (``variables.asking``,
``variables.slices``, ``variables.sharers``) is computed once per object by
:mod:`webhook.render.variables`; the tests here read it by the container's name.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Final

from webhook.core.injection import VOLUME_LIBRARY, VOLUME_LOCK, VOLUME_MPS_PIPE, VOLUME_PRELOAD
from webhook.core.policy import Identities, Mode, Policy
from webhook.core.resources import CONTAINER_KINDS
from webhook.core.workload import KINDS_BY_PATH
from webhook.render.cel import NamedExpression, glob_test, guarded, literal, strings

Obj = dict[str, Any]


_SERVICE_ACCOUNT: Final = "system:serviceaccount:"


def identity_test(identities: Identities) -> str:
    """The request comes from one of ``identities`` (as ``Identities.match``)."""
    user = "request.userInfo.username"
    terms = []
    if identities.users:
        terms.append(f"{user} in {strings(sorted(identities.users))}")
    if identities.groups:
        terms.append(
            "has(request.userInfo.groups) && request.userInfo.groups.exists(g, "
            f"g in {strings(sorted(identities.groups))})"
        )
    if identities.service_accounts:
        account = f"{user}.substring({len(_SERVICE_ACCOUNT)}).replace(':', '/', 1)"
        terms.append(
            f"{user}.startsWith({literal(_SERVICE_ACCOUNT)}) && "
            f"({glob_test(account, identities.service_accounts)})"
        )
    return " || ".join(f"({t})" for t in terms) or "false"


def template(root: str, leaf: str) -> str:
    """``leaf`` (spec or metadata) of the pod or pod template in ``root`` by kind."""
    expression = "{}"
    for path, kinds in sorted(KINDS_BY_PATH.items(), key=lambda item: -len(item[0])):
        expression = (
            f"request.kind.kind in {strings(kinds)} ? {guarded(root, (*path, leaf))} : {expression}"
        )
    return f"request.kind.kind == 'Pod' ? {guarded(root, (leaf,))} : {expression}"


def container_list(spec: str, kinds: Iterable[str] = CONTAINER_KINDS) -> str:
    """One list of the containers of ``kinds`` (every kind) of the pod spec ``spec``, so a
    container test is written once."""
    return " + ".join(f"(has({spec}.{kind}) ? {spec}.{kind} : [])" for kind in kinds)


# The containers the mutation reaches (it leaves ephemeral ones alone), and the list of
# the object's.
MUTATED_KINDS: Final = ("containers", "initContainers")
MUTATED_CONTAINERS: Final = container_list("variables.spec", MUTATED_KINDS)


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


def zero(amount: str) -> str:
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
    return f"has({c}.resources) && {_vacant_parts(policy, parts)}"


def _vacant_parts(policy: Policy, parts: str) -> str:
    """:func:`vacant` of a container's ``[limits, requests]`` list ``parts``."""
    priorities = sorted(policy.priority_resources)
    other = f"r in {strings(priorities)} || " if priorities else ""
    zeroed = f"!({other}!({zero('X[r]')}))"
    counts = sorted(policy.count_resources)
    counted = f"r in {strings(counts)} || " if counts else ""
    return (
        f"{parts}.all(X, X.all(r, !({gpu_resource(policy)}) || {zeroed})) "
        f"&& {parts}.exists(X, X.exists(r, {counted}{mig_test(policy)}))"
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


def requests_test(policy: Policy, containers: str, test: str) -> str:
    """A container asks for a resource ``r`` (in limits or requests) that passes ``test``."""
    return f"{containers}.exists(c, {asks_test('c', test, policy=policy)})"


def mig_test(policy: Policy) -> str:
    prefixes = sorted(set(policy.mig_prefixes))
    return " || ".join(f"r.startsWith({literal(p)})" for p in prefixes) or "false"


def gpu_test(policy: Policy, containers: str, *, inline: bool = False) -> str:
    """Any GPU request (``PodRequests.gpu``): a resource of the policy or a MIG one, in a
    container that is not :func:`vacant`; ``inline`` tests that in place, where no
    variable is bound (a matchCondition)."""
    listed = f"r in {strings(sorted(policy.gpu_resources))}" if policy.gpu_resources else "false"
    test = f"{listed} || {mig_test(policy)}"
    if inline and vacates(policy):
        # A container's limits and requests bound once, as ``P``; the names first: they
        # settle a pod that asks for no GPU, the amounts do not.
        parts = (
            "[[has(c.resources.limits) ? c.resources.limits : {}, "
            "has(c.resources.requests) ? c.resources.requests : {}]]"
        )
        return (
            f"{containers}.exists(c, has(c.resources) && {parts}.exists(P, "
            f"P.exists(X, X.exists(r, {test})) && !({_vacant_parts(policy, 'P')})))"
        )
    return requests_test(policy, containers, test)


def sharing_test(policy: Policy) -> str:
    """``r`` is a shared GPU resource: one of the policy's that is not MIG."""
    listed = f"r in {strings(sorted(policy.gpu_resources))}" if policy.gpu_resources else "false"
    return f"({listed}) && !({mig_test(policy)})"


# A rule's test of one pod: (containers, gpu, spec) CEL names in, "it breaks" out.
PodTest = Callable[[str, str, str], str]


# The annotations of the pod spec a PodTest reads.
ANNOTATIONS_OF: Final = {
    "variables.spec": "variables.annotations",
    "variables.oldSpec": "variables.oldAnnotations",
}


# The containers of the old pod, as a PodTest is handed them.
OLD_CONTAINERS: Final = "variables.oldContainers"


def old_name(name: str) -> str:
    """The variable holding for the old pod what ``name`` holds for the object."""
    return "old" + name[0].upper() + name[1:]


def piece(name: str, containers: str) -> str:
    """The variable ``name`` (a :func:`pod_pieces` piece) of the pod whose containers a
    PodTest was handed as ``containers``: the object's, or the old pod's."""
    return f"variables.{old_name(name) if containers == OLD_CONTAINERS else name}"


def pieces_test(names: Sequence[str]) -> PodTest:
    """The pod breaks a rule when one of the pieces ``names`` holds, in that order."""

    def test(containers: str, gpu: str, spec: str) -> str:
        return " || ".join(piece(n, containers) for n in names)

    return test


def pod_pieces(pieces: Mapping[str, PodTest]) -> list[NamedExpression]:
    """Each of ``pieces`` (name -> test of one pod) as a variable of the object and one of
    the old pod (:func:`old_name`, ``{}``'s when no pod is updated): a rule reads a pod as a
    short composition of them, and the apiserver evaluates each once, when first read."""
    sides = (
        ("variables.containers", "variables.gpu", "variables.spec"),
        (OLD_CONTAINERS, "variables.oldGpu", "variables.oldSpec"),
    )
    return [
        {"name": name if side is sides[0] else old_name(name), "expression": test(*side)}
        for name, test in pieces.items()
        for side in sides
    ]


def value_of(entry: str) -> str:
    return f"(has({entry}.value) ? {entry}.value : '')"


def is_opaque(entry: str) -> str:
    """From valueFrom or with $(VAR): the kubelet decides the value."""
    return f"has({entry}.valueFrom) || {value_of(entry)}.contains('$(')"


def env_exists(containers: str, test: str) -> str:
    return f"{containers}.exists(c, has(c.env) && c.env.exists(e, has(e.name) && ({test})))"


def asks_for_gpu(policy: Policy, c: str) -> str:
    """``resources.asks_for_gpu`` of container ``c`` (one of ``variables.asking``)."""
    return f"{c}.name in variables.asking"


def shares(policy: Policy, c: str) -> str:
    """Container ``c`` asks for a shared GPU resource (one of ``variables.sharers``)."""
    return f"{c}.name in variables.sharers"


def slice_test(policy: Policy, c: str) -> str:
    """Container ``c`` asks for part of a GPU (one of ``variables.slices``)."""
    return f"{c}.name in variables.slices"


def container_class(c: str) -> str:
    """``rules.container_class`` of container ``c``: 'slice', 'whole' or 'none'."""
    return (
        f"{c}.name in variables.slices ? 'slice' : {c}.name in variables.asking ? 'whole' : 'none'"
    )


def same_volume(volume: str, injected: Mapping[str, Any]) -> str:
    """``volume`` is ``injected`` (``injection.same_volume``): the apiserver allows one
    source per volume, so the injected source's fields say it all; it has defaulted
    ``hostPath.type``, so every field is compared."""
    name = f"{volume}.name == {literal(injected['name'])}"
    if "hostPath" in injected:
        host = injected["hostPath"]
        return f"{name} && {host_volume_is(volume, literal(host['path']), literal(host['type']))}"
    return f"{name} && {empty_dir_is(volume)}"


def host_volume_is(volume: str, path: str, type_: str) -> str:
    """``volume``'s source is the hostPath at ``path`` of ``type_`` (CEL strings)."""
    return (
        f"has({volume}.hostPath) && {volume}.hostPath.path == {path} && "
        f"has({volume}.hostPath.type) && {volume}.hostPath.type == {type_}"
    )


def empty_dir_is(volume: str) -> str:
    """``volume``'s source is an emptyDir as injected: no medium, no size limit."""
    return (
        f"has({volume}.emptyDir) && !has({volume}.emptyDir.medium) && "
        f"!has({volume}.emptyDir.sizeLimit)"
    )


def injects(mode: Mode) -> str:
    """The pod is in ``mode`` (vgpu or mps) and gets what ``injection_for`` gives it: a vgpu
    pod only with HAMi-core (``variables.library``)."""
    test = f"variables.mode == {literal(mode)}"
    return f"{test} && variables.library" if mode == "vgpu" else test


def gpu_resource(policy: Policy) -> str:
    """``r`` is a GPU resource of the policy (``Policy.is_gpu_resource``)."""
    listed = f"r in {strings(sorted(policy.gpu_resources))} || " if policy.gpu_resources else ""
    return f"{listed}{mig_test(policy)}"


def shared_resources(policy: Policy) -> list[str]:
    """The policy's shared (non-MIG) GPU resources."""
    return [r for r in policy.gpu_resources if not r.startswith(policy.mig_prefixes)]


def same_mount(mount: str, injected: Mapping[str, Any]) -> str:
    """``mutation._same_mount``: the injected volume, read-only as injected, no subPath."""
    read_only = "true" if injected.get("readOnly") else "false"
    return mount_is(mount, literal(injected["name"]), read_only)


def mount_is(mount: str, name: str, read_only: str) -> str:
    """:func:`same_mount` of an injected mount whose volume ``name`` (a CEL string) and
    ``read_only`` (a CEL bool) are expressions."""
    return (
        f"{mount}.name == {name} && "
        f"(has({mount}.readOnly) ? {mount}.readOnly : false) == {read_only} && "
        f"(!has({mount}.subPath) || {mount}.subPath == '') && "
        f"(!has({mount}.subPathExpr) || {mount}.subPathExpr == '')"
    )


class Shape:
    """Where objects of some kinds keep a pod spec and metadata: the path from the object
    (for CEL to read, and for a JSON Pointer to write)."""

    def __init__(self, kinds: Sequence[str], path: Sequence[str]) -> None:
        self.kinds = tuple(kinds)
        self.path = tuple(path)


def pod_shapes() -> list[Shape]:
    return [Shape(["Pod"], ()), *(Shape(kinds, path) for path, kinds in KINDS_BY_PATH.items())]


CUDA_VERSION: Final = "CUDA_VERSION"


INJECTED_VOLUMES: Final = (
    VOLUME_LIBRARY,
    VOLUME_LOCK,
    VOLUME_PRELOAD,
    VOLUME_MPS_PIPE,
)
