"""host-device-access in CEL: hostPath volumes, mounts and block devices where the GPU stack
reads, the injected shared volumes mounted writable, CDI and CRI-O annotations, host
namespaces and a GPU runtime class without the void.

Held equal to its core twins (:data:`CORE_TWINS`) by the differential tests.
"""

from __future__ import annotations

import posixpath
from collections.abc import Callable, Iterable
from typing import Final

from webhook.core import rules as core_rules
from webhook.core.env import VISIBLE_DEVICES
from webhook.core.injection import injection_for
from webhook.core.policy import Policy, normalised
from webhook.core.rules import (
    CDI_MARK,
    CDI_PREFIXES,
    CONFIG_ROOTS,
    CRIO_DEVICE_KEYS,
    DEVICE_PARENTS,
    DEVICE_PATH_PREFIXES,
    DEVICE_REQUEST_DIRS,
    DEVICE_REQUEST_MARK,
    SIDE_ROOTS,
    STACK_FILE_PREFIXES,
    STACK_ROOTS,
    read_paths,
)
from webhook.render.cel import NamedExpression, literal, strings
from webhook.render.pod import (
    ANNOTATIONS_OF,
    PodTest,
    asks_for_gpu,
    injects,
    piece,
    pieces_test,
    pod_pieces,
    same_volume,
)

# The core functions this family renders: a rename there breaks the import here.
CORE_TWINS: Final = (
    core_rules.evaluate,
    core_rules.read_paths,
    core_rules.mount_marks,
    core_rules.unlisted_devices,
)


def normalised_path(path: str) -> str:
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
    terms = [f"{path} in {strings(sorted(exact))}"] if exact else []
    terms.extend(f"{path}.startsWith({literal(p)})" for p in sorted(prefixes))
    return " || ".join(terms) or "false"


def _protected(policy: Policy, path: str) -> str:
    """``rules._protected`` of the normalised CEL string ``path``."""
    roots = (
        *SIDE_ROOTS,
        posixpath.dirname(policy.library_host_path),
        policy.lock_host_path,
        policy.mps_pipe_directory,
        *policy.protected_host_paths,
    )
    devices = [f"{path} in {strings(sorted(DEVICE_PARENTS))}"]
    devices.extend(f"{path}.startsWith({literal(p)})" for p in DEVICE_PATH_PREFIXES)
    reaching = _reaching(path, sorted({normalised(r) for r in roots}), parents=True)
    return " || ".join(devices) + " || " + reaching


def _injected(policy: Policy, volume: str) -> str:
    """``volume`` is exactly one the mutation injects into this pod (a sharing pod in
    mode vgpu or mps)."""
    by_mode = []
    for mode in ("vgpu", "mps"):
        exact = [
            f"({same_volume(volume, v)})"
            for v in injection_for(mode, policy).volumes
            if "hostPath" in v
        ]
        if exact:
            by_mode.append(f"({injects(mode)} && ({' || '.join(exact)}))")
    return f"variables.sharing && ({' || '.join(by_mode) or 'false'})"


def read_only_volume(policy: Policy, mount: str) -> str:
    """``mount`` names a volume the mutation injects as shared, and is not read-only."""
    by_mode = []
    for mode in ("vgpu", "mps"):
        names = sorted(injection_for(mode, policy).read_only_volumes)
        if names:
            by_mode.append(f"({injects(mode)} && {mount}.name in {strings(names)})")
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


def _host_path_list(policy: Policy, spec: str) -> str:
    """The pod's hostPath volumes that are not one the mutation injects, each as its
    ``name`` and its normalised ``path``: the apiserver refuses a hostPath with a ``..``
    segment, so the CEL normalisation is the core's."""
    return (
        f"has({spec}.volumes) ? {spec}.volumes.filter(v, has(v.hostPath) && "
        f"has(v.hostPath.path) && !({_injected(policy, 'v')}))"
        f".map(v, {{'name': string(v.name), 'path': {normalised_path('v.hostPath.path')}}}) : []"
    )


def _host_path_pieces(policy: Policy) -> dict[str, PodTest]:
    """``rules._host_path_findings`` of the pod's hostPath volumes (``hostPaths``): one
    that is protected or holds the GPU runtime's configuration and is written, one that
    holds the GPU stack and is written, or (allowlist mode, in a GPU pod) one outside the
    allowed paths."""

    def host_paths(containers: str, gpu: str, spec: str) -> str:
        return _host_path_list(policy, spec)

    def each(check: Callable[[str, str], str]) -> PodTest:
        def test(containers: str, gpu: str, spec: str) -> str:
            paths = piece("hostPaths", containers)
            return f"{paths}.exists(h, {check(containers, gpu)})"

        return test

    stack = (
        f"{_reaching('h.path', (*STACK_ROOTS, *policy.driver_roots), parents=True)} || "
        f"{strings(STACK_FILE_PREFIXES)}.exists(f, "
        "h.path.substring(h.path.lastIndexOf('/') + 1).startsWith(f))"
    )
    pieces: dict[str, PodTest] = {
        "hostPaths": host_paths,
        "protectedHostPath": each(
            lambda containers, gpu: (
                f"{_protected(policy, 'h.path')} || "
                f"(({_reaching('h.path', CONFIG_ROOTS, parents=True)}) && "
                f"{_writes(containers, 'h.name')})"
            )
        ),
        "writtenStackPath": each(
            lambda containers, gpu: f"({stack}) && {_writes(containers, 'h.name')}"
        ),
    }
    if policy.host_path_mode == "allowlist":
        allowed = _reaching("h.path", policy.allowed_host_paths, parents=False)

        def outside(containers: str, gpu: str, spec: str) -> str:
            paths = piece("hostPaths", containers)
            return f"{gpu} && {paths}.exists(h, !({allowed}))"

        pieces["unallowedHostPath"] = outside
    return pieces


def _path_tests(policy: Policy, target: str) -> tuple[str, str, str]:
    """For the CEL string path ``target`` (``q``: it normalised): it asks the NVIDIA
    runtime for devices (its root a string prefix, raw or cleaned); it lies at or below a
    path the GPU stack reads; it names the device-request mark or a read path's name (what
    a path with ``..``, which CEL cannot resolve, is refused for)."""
    requests = " || ".join(
        f"{v}.startsWith({literal(d)})" for v in (target, "q") for d in DEVICE_REQUEST_DIRS
    )
    paths = read_paths(policy)
    reads = _reaching("q", paths.roots, parents=False)
    named = (
        f"{target}.contains({literal(DEVICE_REQUEST_MARK)}) || "
        f"{target}.split('/').exists(s, s in {strings(sorted(paths.names))})"
    )
    return requests, reads, named


def device_shadow(policy: Policy, device: str) -> str:
    """``rules._device_findings``: a block device at (or, by ``..``, beside) a path the GPU
    stack reads, or at a device request; none is ever injected."""
    target = f"{device}.devicePath"
    requests, reads, named = _path_tests(policy, target)
    return (
        f"has({target}) && ({named}) && ({target}.split('/').exists(s, s == '..') || "
        f"[{normalised_path(target)}].exists(q, {requests} || {reads}))"
    )


def mount_shadow(policy: Policy, mount: str) -> str:
    """``rules._mount_findings``' paths: ``mount`` asks the NVIDIA runtime for devices, or
    lies at or below a path the GPU stack reads inside the container and is not a mount
    the mutation injects. A mountPath may hold ``..`` (the apiserver allows it there),
    which CEL cannot resolve: one beside the device-request mark or a read path's name is
    refused wherever it leads."""
    target = f"{mount}.mountPath"
    requests, reads, named = _path_tests(policy, target)
    return (
        f"has({target}) && ({target}.split('/').exists(s, s == '..') ? ({named}) : "
        f"[{normalised_path(target)}].exists(q, {requests} || "
        f"(({reads}) && !({_injected_mount(policy, mount)}))))"
    )


def _injected_mount(policy: Policy, mount: str) -> str:
    """``rules._injected_mount`` at validation: ``mount`` is one the mutation injects into
    a pod of this mode (``variables.injectedMounts``), of the volume it injects under that
    name."""
    m = mount
    return (
        f"variables.injectedMounts.exists(i, {m}.mountPath == i.path && {m}.name == i.name && "
        f"string(has({m}.readOnly) ? {m}.readOnly : false) == i.readOnly && "
        f"(!has({m}.subPath) || {m}.subPath == '') && "
        f"(!has({m}.subPathExpr) || {m}.subPathExpr == ''))"
    )


def injected_mounts(policy: Policy) -> str:
    """The mounts the mutation injects into this pod (a sharing pod in mode vgpu or mps)
    whose volume the pod holds as injected, each as its ``path``, ``name`` and
    ``readOnly`` ('true' or 'false': a map literal's values are of one type)."""
    spec = "variables.spec"
    by_mode = []
    for mode in ("vgpu", "mps"):
        injection = injection_for(mode, policy)
        held = []
        for injected in injection.mounts:
            volume = next(v for v in injection.volumes if v["name"] == injected["name"])
            entry = (
                f"{{'path': {literal(injected['mountPath'])}, "
                f"'name': {literal(injected['name'])}, "
                f"'readOnly': {literal('true' if injected.get('readOnly') else 'false')}}}"
            )
            held.append(f"({spec}.volumes.exists(v, {same_volume('v', volume)}) ? [{entry}] : [])")
        if held:
            by_mode.append(f"{injects(mode)} ? {' + '.join(held)}")
    return f"!variables.sharing || !has({spec}.volumes) ? [] : " + " : ".join([*by_mode, "[]"])


def host_access_pieces(policy: Policy) -> dict[str, PodTest]:
    """host-device-access of one pod, piece by piece (:func:`~webhook.render.pod.pod_pieces`):
    its hostPath volumes, its containers' mounts and block devices, its CDI annotations,
    its host namespaces and a GPU runtime class without the void."""
    pieces = _host_path_pieces(policy)

    def mounts(test: Callable[[str], str]) -> PodTest:
        def each(containers: str, gpu: str, spec: str) -> str:
            return (
                f"{containers}.exists(c, has(c.volumeMounts) && "
                f"c.volumeMounts.exists(m, {test('m')}))"
            )

        return each

    def devices(containers: str, gpu: str, spec: str) -> str:
        return (
            f"{containers}.exists(c, has(c.volumeDevices) && "
            f"c.volumeDevices.exists(d, {device_shadow(policy, 'd')}))"
        )

    def cdi(containers: str, gpu: str, spec: str) -> str:
        return _runtime_annotations(policy, ANNOTATIONS_OF[spec])

    def namespaces(containers: str, gpu: str, spec: str) -> str:
        return (
            f"{gpu} && ((has({spec}.hostPID) && {spec}.hostPID == true) || "
            f"(has({spec}.hostIPC) && {spec}.hostIPC == true && "
            "!(variables.mode == 'mps' && variables.sharing)))"
        )

    def runtime(containers: str, gpu: str, spec: str) -> str:
        terms = [cdi(containers, gpu, spec), namespaces(containers, gpu, spec)]
        if policy.gpu_runtime_classes:
            # A container under a GPU runtime class that asks for no GPU and lacks the
            # void (rules._container_findings; the mutation voids containers and init
            # containers).
            classes = strings(sorted(policy.gpu_runtime_classes))
            terms.append(
                f"has({spec}.runtimeClassName) && {spec}.runtimeClassName in {classes} && "
                f"{containers}.exists(c, !({asks_for_gpu(policy, 'c')}) && "
                f"!(has(c.env) && c.env.exists(e, e.name == {literal(VISIBLE_DEVICES)})))"
            )
        return " || ".join(f"({t})" for t in terms)

    pieces.update(
        {
            "shadowingMount": mounts(
                lambda m: f"({mount_shadow(policy, m)}) || ({read_only_volume(policy, m)})"
            ),
            "shadowingDevice": devices,
            # The CDI and CRI-O annotations, the host namespaces, a GPU runtime class
            # without the void.
            "runtimeAccess": runtime,
        }
    )
    return pieces


def _runtime_annotations(policy: Policy, annotations: str) -> str:
    """``rules._cdi_findings``: any CDI key, CRI-O's devices annotation naming
    a device off the policy's list (entries as ``rules.unlisted_devices`` splits them),
    a key with one of the policy's refused prefixes."""
    allowed = strings(sorted(policy.annotation_devices))
    crio = f"k in {strings(CRIO_DEVICE_KEYS)}"
    terms = [
        f"k.contains({literal(CDI_MARK)})",
        *(f"k.startsWith({literal(p)})" for p in CDI_PREFIXES),
        f"({crio}) && string({annotations}[k]).split(',').exists(e, e != '' && "
        f"(e.split(':').size() > 3 || !(e.split(':')[0] in {allowed})))",
    ]
    terms.extend(f"k.startsWith({literal(p)})" for p in policy.refused_annotation_prefixes)
    return f"{annotations}.exists(k, {' || '.join(f'({t})' for t in terms)})"


def host_access_variables(policy: Policy) -> list[NamedExpression]:
    """What host-device-access reads: the injected mounts, then its pieces of each pod."""
    return [
        {"name": "injectedMounts", "expression": injected_mounts(policy)},
        *pod_pieces(host_access_pieces(policy)),
    ]


def host_device_access(policy: Policy) -> PodTest:
    """host-device-access of one pod: one of its pieces (:func:`host_access_pieces`) holds.

    On a pod UPDATE the old pod is judged in the new one's mode (only an annotation can
    change it; there is no variable for the old mode). That never refuses what the core
    admits: each finding the new pod shares with the old one (a volume, a container's
    mount, a CDI key), the old pod also has in the new mode, since volumes and containers'
    mounts do not change on an update.
    """
    pieces = host_access_pieces(policy)
    return pieces_test([name for name in pieces if name != "hostPaths"])
