"""Attacks of a hostile tenant (edit rights in one namespace), offline, one family at a time.

Each family of the security hardening (F1..F8, held connections F7 excepted) gets the
shapes a tenant would try: through ``review_object`` (both webhooks on a CREATE, as the
apiserver runs them) and through the wire adapter ``answer`` for a pod UPDATE, which is
the only way ``oldObject`` reaches the decision. Every attack asserts the rule id and
the ``deny`` action; every control asserts the object is allowed with nothing flagged.
"""

from __future__ import annotations

import copy
import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final

import orjson
import pytest

from tests.paths import EXAMPLES
from webhook.core.admission import Answer, answer
from webhook.core.decision import Decision, Request, Violation, decide
from webhook.core.policy import Policy
from webhook.core.review import ReviewEntry, review_object
from webhook.core.wire import Endpoint
from webhook.dev.testing import admission_review
from webhook.policies import DEFAULT_POLICY, load_policy, parse_policy
from webhook.service.audit import build_record

Obj = dict[str, Any]

GPU_LIMITS: Final[Mapping[str, str]] = {
    "nvidia.com/gpu": "1",
    "nvidia.com/gpumem": "3000",
    "nvidia.com/gpucores": "30",
}
LIBRARY: Final = "/usr/local/vgpu/libvgpu.so"
VOLUME_LIBRARY: Final = "gpushare-vgpu-lib"
VOLUME_LOCK: Final = "gpushare-vgpu-lock"
VOLUME_PRELOAD: Final = "gpushare-vgpu-preload"
VOLUME_MPS_PIPE: Final = "gpushare-mps-pipe"
MPS: Final[Mapping[str, str]] = {"gpushare.io/mode": "mps"}

# -- identities ------------------------------------------------------------------------

User = tuple[str, tuple[str, ...]]


def service_account(namespace: str, name: str) -> User:
    """A service account's identity as the apiserver reports it (impersonated or not)."""
    return (
        f"system:serviceaccount:{namespace}:{name}",
        ("system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"),
    )


TENANT: Final[User] = ("alice", ("system:authenticated",))
SCHEDULER: Final = service_account("kube-system", "hami-scheduler")
DEVICE_PLUGIN: Final = service_account("kube-system", "hami-device-plugin")
VOLCANO_SCHEDULER: Final = service_account("volcano-system", "volcano-scheduler")
VOLCANO_DEVICE_PLUGIN: Final = service_account("kube-system", "volcano-device-plugin")
# Identities that look like the scheduler's and are not.
LOOKALIKES: Final[dict[str, User]] = {
    "same-name-own-namespace": service_account("ml", "hami-scheduler"),
    "name-with-suffix": service_account("kube-system", "hami-scheduler-debug"),
    "other-kube-system-account": service_account("kube-system", "default"),
    "user-named-like-the-account": ("hami-scheduler", ("system:authenticated",)),
    "user-named-namespace-slash-name": ("kube-system/hami-scheduler", ("system:authenticated",)),
    "extra-colon-segment": (
        "system:serviceaccount:kube-system:hami-scheduler:x",
        ("system:authenticated",),
    ),
    "group-only": ("mallory", ("system:serviceaccounts:kube-system", "system:authenticated")),
}

# -- policies --------------------------------------------------------------------------


def policy_with(text: str) -> Policy:
    return parse_policy(f"apiVersion: gpushare.io/v1alpha1\nkind: GPUSharePolicy\nspec:\n{text}")


# Parsed when a test runs, not at import: a field the schema does not know yet must fail
# the tests that use it, not the collection of this whole module.
@functools.cache
def strict() -> Policy:
    return load_policy(EXAMPLES / "strict.yaml")


@functools.cache
def volcano() -> Policy:
    return load_policy(EXAMPLES / "volcano.yaml")


@functools.cache
def file_preload() -> Policy:
    return policy_with("  vgpu: {preload: file}")


@functools.cache
def quota() -> Policy:
    return policy_with(
        "  rules: {gpu-quota: deny}\n"
        "  limits:\n"
        "    perContainer: {gpus: 2}\n"
        "    perPod: {gpus: 2, memoryMiB: 6000}"
    )


@functools.cache
def allowlist() -> Policy:
    return policy_with("  hostPaths: {mode: allowlist, allowed: [/data/models]}")


# -- objects ---------------------------------------------------------------------------


def container(
    name: str,
    *,
    limits: Mapping[str, Any] | None = None,
    env: Sequence[Obj] = (),
    mounts: Sequence[Obj] = (),
    **extra: Any,
) -> Obj:
    result: Obj = {"name": name, "image": "cuda:12" if limits else "busybox:1.36"}
    if limits:
        result["resources"] = {"limits": dict(limits)}
    if env:
        result["env"] = copy.deepcopy(list(env))
    if mounts:
        result["volumeMounts"] = copy.deepcopy(list(mounts))
    result.update(copy.deepcopy(extra))
    return result


def gpu(name: str = "main", limits: Mapping[str, Any] = GPU_LIMITS, **kw: Any) -> Obj:
    """A container that asks for a vGPU slice."""
    return container(name, limits=limits, **kw)


def first(gpu_pod: bool, **kw: Any) -> Obj:
    """The pod's first container: a vGPU slice, or an app that asks for no GPU."""
    return gpu(**kw) if gpu_pod else container("app", **kw)


def sidecar(name: str = "sidecar", **kw: Any) -> Obj:
    """A sidecar init container (restartPolicy Always): it runs beside the main ones."""
    return container(name, restartPolicy="Always", **kw)


def mount(volume: str, path: str, *, read_only: bool | None = None, **extra: Any) -> Obj:
    result: Obj = {"name": volume, "mountPath": path, **extra}
    if read_only is not None:
        result["readOnly"] = read_only
    return result


def host_volume(name: str, path: str) -> Obj:
    return {"name": name, "hostPath": {"path": path}}


def pod(
    *containers: Obj,
    init: Sequence[Obj] = (),
    ephemeral: Sequence[Obj] = (),
    volumes: Sequence[Obj] | None = None,
    annotations: Mapping[str, Any] | None = None,
    name: str = "victim",
    namespace: str = "ml",
    **spec: Any,
) -> Obj:
    pod_spec: Obj = {"containers": list(containers) or [gpu()]}
    if init:
        pod_spec["initContainers"] = list(init)
    if ephemeral:
        pod_spec["ephemeralContainers"] = list(ephemeral)
    if volumes is not None:
        pod_spec["volumes"] = copy.deepcopy(list(volumes))
    pod_spec.update(copy.deepcopy(spec))
    metadata: Obj = {"name": name, "namespace": namespace}
    if annotations is not None:
        metadata["annotations"] = dict(annotations)
    return {"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": pod_spec}


def workload(kind: str, template: Obj) -> Obj:
    """``template`` (a Pod) as the pod template of a workload of ``kind``."""
    inner: Obj = {"metadata": {"labels": {"app": "a"}}, "spec": copy.deepcopy(template["spec"])}
    annotations = template["metadata"].get("annotations")
    if annotations:
        inner["metadata"]["annotations"] = dict(annotations)
    if kind == "ReplicationController":
        return {
            "apiVersion": "v1",
            "kind": kind,
            "metadata": {"name": "w", "namespace": "ml"},
            "spec": {"replicas": 1, "selector": {"app": "a"}, "template": inner},
        }
    if kind == "CronJob":
        return {
            "apiVersion": "batch/v1",
            "kind": kind,
            "metadata": {"name": "w", "namespace": "ml"},
            "spec": {"schedule": "* * * * *", "jobTemplate": {"spec": {"template": inner}}},
        }
    group = "batch/v1" if kind == "Job" else "apps/v1"
    spec: Obj = {"template": inner}
    if kind != "Job":
        spec["selector"] = {"matchLabels": {"app": "a"}}
    return {
        "apiVersion": group,
        "kind": kind,
        "metadata": {"name": "w", "namespace": "ml"},
        "spec": spec,
    }


def env_of(obj: Mapping[str, Any], index: int = 0, kind: str = "containers") -> dict[str, Any]:
    entries = obj["spec"][kind][index].get("env", [])
    return {e["name"]: e.get("value") for e in entries}


# -- verdicts --------------------------------------------------------------------------

Verdict = ReviewEntry | Decision


def _parts(verdict: Verdict) -> tuple[bool, list[Violation]]:
    if isinstance(verdict, Decision):
        return verdict.allowed, verdict.violations
    return verdict["allowed"], verdict["violations"]


def assert_refused(verdict: Verdict, rule: str) -> None:
    """Refused, with ``rule`` among the denying violations."""
    allowed, violations = _parts(verdict)
    found = {(v["rule"], v["action"]) for v in violations}
    assert (rule, "deny") in found, f"want [{rule}] deny, got {violations}"
    assert not allowed


def assert_clean(verdict: Verdict) -> None:
    """Allowed, with nothing flagged (not even a warning or an audit record)."""
    allowed, violations = _parts(verdict)
    assert violations == []
    assert allowed


def review(obj: Obj, policy: Policy | None = None, *, user: User = TENANT) -> ReviewEntry:
    """A CREATE through both webhooks (``policy`` None: the default policy)."""
    username, groups = user
    return review_object(
        obj, policy or DEFAULT_POLICY, username=username, groups=groups, operation="CREATE"
    )


def stored(obj: Obj, policy: Policy | None = None) -> Obj:
    """``obj`` as the apiserver stores it after both webhooks admitted it."""
    entry = review(obj, policy)
    assert_clean(entry)
    result: Obj = copy.deepcopy(entry["object"])
    return result


def update(
    old: Obj,
    new: Obj,
    policy: Policy | None = None,
    *,
    user: User = TENANT,
    sub_resource: str | None = None,
) -> Decision:
    """A pod UPDATE as the apiserver sends it to the validating webhook (the mutating one
    is registered for CREATE only)."""
    username, groups = user
    wire = admission_review(
        new,
        operation="UPDATE",
        old=old,
        username=username,
        groups=groups,
        sub_resource=sub_resource,
    )
    result: Answer = answer(
        wire["apiVersion"], wire["request"], policy or DEFAULT_POLICY, endpoint="validate"
    )
    return result.decision


def annotated(obj: Obj, changes: Mapping[str, str | None]) -> Obj:
    """A copy of ``obj`` with annotations set (a value) or removed (None)."""
    result = copy.deepcopy(obj)
    annotations = result["metadata"].setdefault("annotations", {})
    for key, value in changes.items():
        if value is None:
            annotations.pop(key, None)
        else:
            annotations[key] = value
    return result


def with_ephemeral(obj: Obj, debugger: Obj) -> Obj:
    """A copy of ``obj`` with ``debugger`` added as an ephemeral container (kubectl debug)."""
    result = copy.deepcopy(obj)
    result["spec"].setdefault("ephemeralContainers", []).append(copy.deepcopy(debugger))
    return result


# ======================================================================================
# F1 forged annotations after create (pod UPDATE)
# ======================================================================================

GPU_UUID: Final = "GPU-5fd4c8a1-3f1e-9b2c-1d2e-aa33bb44cc55"
# What HAMi's scheduler and device plugin write on a pod they place (values as HAMi writes).
HAMI_ALLOCATION: Final[Mapping[str, str]] = {
    "hami.io/vgpu-node": "gpu-node-1",
    "hami.io/vgpu-time": "1732312345",
    "hami.io/vgpu-devices-to-allocate": f"{GPU_UUID},NVIDIA,3000,30:;",
    "hami.io/vgpu-devices-allocated": f"{GPU_UUID},NVIDIA,3000,30:;",
    "hami.io/bind-phase": "allocating",
    "hami.io/bind-time": "1732312345",
}
# A tenant's edit of each: the whole card instead of a 3000 MiB slice.
FORGED_VALUES: Final[Mapping[str, str]] = {
    "hami.io/vgpu-node": "gpu-node-2",
    "hami.io/vgpu-time": "1",
    "hami.io/vgpu-devices-to-allocate": f"{GPU_UUID},NVIDIA,81920,100:;",
    "hami.io/vgpu-devices-allocated": f"{GPU_UUID},NVIDIA,81920,100:;",
    "hami.io/bind-phase": "success",
    "hami.io/bind-time": "1",
}
# The default policy's globs reach the other device types' keys too.
GLOB_KEYS: Final = ("hami.io/mig-devices-allocated", "hami.io/mlu-devices-to-allocate")
VOLCANO_ALLOCATION: Final[Mapping[str, str]] = {
    "volcano.sh/vgpu-ids-new": f"{GPU_UUID},NVIDIA,3000,30:;",
    "volcano.sh/devices-to-allocate": f"{GPU_UUID},NVIDIA,3000,30:;",
    "volcano.sh/vgpu-node": "gpu-node-1",
    "volcano.sh/vgpu-time": "1732312345",
    "volcano.sh/bind-phase": "allocating",
    "volcano.sh/bind-time": "1732312345",
}


def pending() -> Obj:
    """A vGPU pod as stored after admission: mutated, not yet placed."""
    return stored(pod(gpu()))


def placed() -> Obj:
    """The pending pod after HAMi's scheduler wrote its allocation annotations."""
    return annotated(pending(), HAMI_ALLOCATION)


FORGERIES: Final = [
    *[pytest.param(key, "add", id=f"add-{key}") for key in HAMI_ALLOCATION],
    *[pytest.param(key, "change", id=f"change-{key}") for key in HAMI_ALLOCATION],
    *[pytest.param(key, "remove", id=f"remove-{key}") for key in HAMI_ALLOCATION],
    *[pytest.param(key, "add", id=f"add-{key}") for key in GLOB_KEYS],
]


def forge(key: str, how: str) -> tuple[Obj, Obj]:
    """(old, new) of an UPDATE that adds, changes or removes the reserved ``key``."""
    if how == "add":
        old = pending()
        return old, annotated(old, {key: FORGED_VALUES.get(key, f"{GPU_UUID},NVIDIA,1,1:;")})
    old = placed()
    return old, annotated(old, {key: FORGED_VALUES[key] if how == "change" else None})


@pytest.mark.parametrize(("key", "how"), FORGERIES)
def test_tenant_forging_allocation_annotations_on_update_is_refused(key: str, how: str) -> None:
    old, new = forge(key, how)
    assert_refused(update(old, new), "forged-allocation")


@pytest.mark.parametrize(("key", "how"), FORGERIES)
@pytest.mark.parametrize("writer", [SCHEDULER, DEVICE_PLUGIN], ids=["scheduler", "device-plugin"])
def test_scheduler_and_device_plugin_write_allocation_annotations(
    key: str, how: str, writer: User
) -> None:
    old, new = forge(key, how)
    assert_clean(update(old, new, user=writer))


@pytest.mark.parametrize("identity", sorted(LOOKALIKES))
def test_identities_that_look_like_the_scheduler_are_not_writers(identity: str) -> None:
    old, new = forge("hami.io/vgpu-devices-allocated", "change")
    assert_refused(update(old, new, user=LOOKALIKES[identity]), "forged-allocation")


def test_scheduler_may_create_a_pod_with_allocation_annotations() -> None:
    created = pod(gpu(), annotations=HAMI_ALLOCATION)
    entry = review(created, user=SCHEDULER)
    assert entry["allowed"]
    assert "forged-allocation" not in {v["rule"] for v in entry["violations"]}


@pytest.mark.parametrize("key", [*HAMI_ALLOCATION, *GLOB_KEYS])
def test_tenant_creating_a_pod_with_allocation_annotations_is_refused(key: str) -> None:
    assert_refused(review(pod(gpu(), annotations={key: "x"})), "forged-allocation")


def test_label_change_on_a_placed_pod_is_not_a_forgery() -> None:
    old = placed()
    new = copy.deepcopy(old)
    new["metadata"]["labels"] = {"team": "ml"}
    assert_clean(update(old, new))


def test_reserved_annotation_rewritten_to_the_same_value_is_not_a_forgery() -> None:
    old = placed()
    assert_clean(update(old, annotated(old, dict(HAMI_ALLOCATION))))


@pytest.mark.parametrize("key", sorted(VOLCANO_ALLOCATION))
def test_volcano_allocation_annotations_are_reserved_on_create(key: str) -> None:
    volcano_pod = pod(
        gpu(limits={"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-memory": "3000"}),
        annotations={key: VOLCANO_ALLOCATION[key]},
    )
    assert_refused(review(volcano_pod, volcano()), "forged-allocation")


@pytest.mark.parametrize("key", sorted(VOLCANO_ALLOCATION))
@pytest.mark.parametrize(
    ("user", "allowed"),
    [
        pytest.param(TENANT, False, id="tenant"),
        pytest.param(VOLCANO_SCHEDULER, True, id="volcano-scheduler"),
        pytest.param(VOLCANO_DEVICE_PLUGIN, True, id="volcano-device-plugin"),
    ],
)
def test_volcano_allocation_annotations_on_update(key: str, user: User, allowed: bool) -> None:
    volcano_pod = pod(gpu(limits={"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-memory": "3000"}))
    old = stored(volcano_pod, volcano())
    decision = update(old, annotated(old, {key: VOLCANO_ALLOCATION[key]}), volcano(), user=user)
    if allowed:
        assert_clean(decision)
    else:
        assert_refused(decision, "forged-allocation")


# A parameter for a test run in a pod that asks for a GPU and in one that does not.
GPU_OR_PLAIN: Final = [pytest.param(True, id="gpu-pod"), pytest.param(False, id="plain-pod")]


CDI_VALUES: Final = (
    "nvidia.com/gpu=all",
    "nvidia.com/gpu=0,nvidia.com/gpu=1",
    f"k8s.device-plugin.nvidia.com/gpu={GPU_UUID}",
    "management.nvidia.com/gpu=all",
    "runtime.nvidia.com/gpu=all",
)


@pytest.mark.parametrize("value", CDI_VALUES)
@pytest.mark.parametrize("base", GPU_OR_PLAIN)
@pytest.mark.parametrize("user", [TENANT, SCHEDULER], ids=["tenant", "scheduler"])
def test_cdi_annotation_added_by_update_is_refused(value: str, base: bool, user: User) -> None:
    # A pending pod that asked for no GPU (or a slice) gets whole cards from the runtime.
    old = pending() if base else stored(pod(container("app")))
    new = annotated(old, {"cdi.k8s.io/devices": value})
    assert_refused(update(old, new, user=user), "host-device-access")


# Keys a node component reads device requests from besides cdi.k8s.io/: the NVIDIA
# toolkit's NRI plugin reads its domain as a bare key too (containerd/nri
# GetEffectiveAnnotation falls back to the key itself; nvidia-container-toolkit
# cmd/nvidia-ctk-installer/container/runtime/nri/plugin.go:42,85,105 @ d34b3046) and the
# node-resource CDI keys (its nodeResourceCDIDeviceKey, containerd's device injector).
NRI_CDI_KEYS: Final = (
    "nvidia.cdi.k8s.io",
    "cdi.k8s.io",
    "cdi-devices.noderesource.dev/container.app",
    "cdi-devices.noderesource.dev/pod",
    "cdi-devices.nri.io",
)


@pytest.mark.parametrize("key", NRI_CDI_KEYS)
@pytest.mark.parametrize("base", GPU_OR_PLAIN)
def test_nri_device_annotations_are_refused(key: str, base: bool) -> None:
    obj = pod(gpu() if base else container("app"), annotations={key: "nvidia.com/gpu=all"})
    assert_refused(review(obj), "host-device-access")


def test_cdi_annotation_changed_to_nvidia_devices_is_refused() -> None:
    # Stored under a policy from before any CDI key was refused (an update is judged by
    # what it adds: the value it changes).
    old = annotated(stored(pod(gpu())), {"cdi.k8s.io/devices": "example.com/fpga=0"})
    new = annotated(old, {"cdi.k8s.io/devices": "nvidia.com/gpu=all"})
    assert_refused(update(old, new), "host-device-access")


def test_mode_annotation_switched_after_create_is_refused() -> None:
    # The mutation's own annotation: a pod mutated as vgpu must not be re-labelled so
    # that later checks (ephemeral containers) see another mode's injected volumes.
    old = pending()
    for mode in ("none", "mps", "mig"):
        decision = update(old, annotated(old, {"gpushare.io/mode": mode}))
        assert not decision.allowed, mode


def _tightened(change: Callable[[Obj], None]) -> Obj:
    """A pod stored under a looser policy than today's: it violates a rule now."""
    old = pod(gpu())
    change(old)
    return old


PRE_EXISTING: Final[dict[str, Callable[[Obj], None]]] = {
    "privileged": lambda p: p["spec"]["containers"][0].update(securityContext={"privileged": True}),
    "device-host-path": lambda p: p["spec"].update(volumes=[host_volume("dev", "/dev/nvidia0")]),
    "kubelet-host-path": lambda p: p["spec"].update(
        volumes=[host_volume("kubelet", "/var/lib/kubelet")]
    ),
    "visible-devices": lambda p: p["spec"]["containers"][0].update(
        env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    ),
    "disable-control": lambda p: p["spec"]["containers"][0].update(
        env=[{"name": "CUDA_DISABLE_CONTROL", "value": "true"}]
    ),
    "cdi-annotation": lambda p: p["metadata"].update(
        annotations={"cdi.k8s.io/devices": "nvidia.com/gpu=all"}
    ),
    "reserved-annotation": lambda p: p["metadata"].update(annotations=dict(HAMI_ALLOCATION)),
}


@pytest.mark.parametrize("violation", sorted(PRE_EXISTING))
def test_label_change_on_a_pod_from_before_a_tightened_policy_is_allowed(violation: str) -> None:
    old = _tightened(PRE_EXISTING[violation])
    new = copy.deepcopy(old)
    new["metadata"]["labels"] = {"team": "ml"}
    assert_clean(update(old, new))


# ======================================================================================
# F2 writable mounts of what the mutation injects
# ======================================================================================

LIBRARY_VOLUME: Final = {"name": VOLUME_LIBRARY, "hostPath": {"path": LIBRARY, "type": "File"}}


def _f2_attacks() -> dict[str, tuple[Callable[[], Obj], Callable[[], Policy] | None]]:
    default = None
    writable_lib = mount(VOLUME_LIBRARY, "/opt/hook/libvgpu.so")
    return {
        # The tenant names the volume the mutation adds; the sidecar asks for no GPU.
        "sidecar-library-at-library-path": (
            lambda: pod(gpu(), container("sidecar", mounts=[mount(VOLUME_LIBRARY, LIBRARY)])),
            default,
        ),
        "sidecar-library-readonly-false": (
            lambda: pod(
                gpu(),
                container("sidecar", mounts=[mount(VOLUME_LIBRARY, "/w", read_only=False)]),
            ),
            default,
        ),
        "gpu-container-second-library-mount": (
            lambda: pod(gpu(mounts=[writable_lib])),
            default,
        ),
        # Not matched by the mutation's mountPath, the same directory for the kubelet.
        "gpu-container-library-path-trailing-slash": (
            lambda: pod(gpu(mounts=[mount(VOLUME_LIBRARY, LIBRARY + "/")])),
            default,
        ),
        "init-container-library": (
            lambda: pod(gpu(), init=[container("setup", mounts=[writable_lib])]),
            default,
        ),
        "sidecar-init-container-library": (
            lambda: pod(gpu(), init=[sidecar(mounts=[writable_lib])]),
            default,
        ),
        "library-sub-path": (
            lambda: pod(gpu(), container("sidecar", mounts=[{**writable_lib, "subPath": "x"}])),
            default,
        ),
        "library-sub-path-expr": (
            lambda: pod(
                gpu(),
                container("sidecar", mounts=[{**writable_lib, "subPathExpr": "$(POD_NAME)"}]),
            ),
            default,
        ),
        # The tenant writes the exact injected volume itself, as the mutation would.
        "declared-library-volume-sidecar": (
            lambda: pod(
                gpu(), container("sidecar", mounts=[writable_lib]), volumes=[LIBRARY_VOLUME]
            ),
            default,
        ),
        "mps-pipe-sidecar": (
            lambda: pod(
                gpu(),
                container("sidecar", mounts=[mount(VOLUME_MPS_PIPE, "/tmp/nvidia-mps")]),
                annotations=MPS,
            ),
            default,
        ),
        "mps-pipe-gpu-container-elsewhere": (
            lambda: pod(gpu(mounts=[mount(VOLUME_MPS_PIPE, "/pipe")]), annotations=MPS),
            default,
        ),
        "mps-pipe-sub-path": (
            lambda: pod(
                gpu(),
                container("sidecar", mounts=[mount(VOLUME_MPS_PIPE, "/pipe", subPath="control")]),
                annotations=MPS,
            ),
            default,
        ),
        "mps-pipe-init-container": (
            lambda: pod(
                gpu(),
                init=[container("setup", mounts=[mount(VOLUME_MPS_PIPE, "/p")])],
                annotations=MPS,
            ),
            default,
        ),
        # preload: file mounts the host's ld.so.preload: writable, it preloads for every pod.
        "preload-file-sidecar": (
            lambda: pod(gpu(), container("sidecar", mounts=[mount(VOLUME_PRELOAD, "/preload")])),
            file_preload,
        ),
        "preload-file-gpu-container-elsewhere": (
            lambda: pod(gpu(mounts=[mount(VOLUME_PRELOAD, "/etc/other.preload")])),
            file_preload,
        ),
        "preload-file-sidecar-init": (
            lambda: pod(
                gpu(), init=[sidecar(mounts=[mount(VOLUME_PRELOAD, "/p", read_only=False)])]
            ),
            file_preload,
        ),
        # Already refused before F2 (another name, an injected host path or its parent).
        "other-name-library-host-path": (
            lambda: pod(
                gpu(mounts=[mount("mine", "/lib/x.so", read_only=True)]),
                volumes=[host_volume("mine", LIBRARY)],
            ),
            default,
        ),
        "other-name-library-parent": (
            lambda: pod(
                gpu(mounts=[mount("mine", "/v", read_only=True)]),
                volumes=[host_volume("mine", "/usr/local/vgpu")],
            ),
            default,
        ),
    }


F2_ATTACKS: Final = _f2_attacks()


@pytest.mark.parametrize("attack", sorted(F2_ATTACKS))
def test_writable_mount_of_an_injected_volume_is_refused(attack: str) -> None:
    build, policy = F2_ATTACKS[attack]
    assert_refused(review(build(), policy() if policy else None), "host-device-access")


@pytest.mark.parametrize("kind", ["Deployment", "ReplicationController", "CronJob"])
def test_writable_mount_of_an_injected_volume_in_a_template_is_refused(kind: str) -> None:
    template = pod(gpu(), container("sidecar", mounts=[mount(VOLUME_LIBRARY, "/w")]))
    assert_refused(review(workload(kind, template)), "host-device-access")


F2_CONTROLS: Final[dict[str, Callable[[], tuple[Obj, Policy | None]]]] = {
    # The lock directory is the one injected volume every process must write.
    "sidecar-lock-writable": lambda: (
        pod(gpu(), container("sidecar", mounts=[mount(VOLUME_LOCK, "/tmp/vgpulock")])),
        None,
    ),
    "sidecar-library-read-only": lambda: (
        pod(gpu(), container("sidecar", mounts=[mount(VOLUME_LIBRARY, LIBRARY, read_only=True)])),
        None,
    ),
    "mps-pod": lambda: (pod(gpu(), annotations=MPS), None),
    "preload-file-pod": lambda: (pod(gpu()), file_preload()),
}


@pytest.mark.parametrize("control", sorted(F2_CONTROLS))
def test_injected_volumes_used_as_intended_are_allowed(control: str) -> None:
    obj, policy = F2_CONTROLS[control]()
    assert_clean(review(obj, policy))


def test_mps_pipe_is_mounted_read_only_by_the_mutation() -> None:
    entry = review(pod(gpu(), annotations=MPS))
    assert_clean(entry)
    mounts = entry["object"]["spec"]["containers"][0]["volumeMounts"]
    pipe = [m for m in mounts if m["name"] == VOLUME_MPS_PIPE]
    assert [m.get("readOnly") for m in pipe] == [True]


def test_mps_pipe_mounted_writable_by_the_user_never_stays_writable() -> None:
    # At the pipe path itself: refused, or replaced by the read-only mount; never kept.
    entry = review(pod(gpu(mounts=[mount(VOLUME_MPS_PIPE, "/tmp/nvidia-mps")]), annotations=MPS))
    if not entry["allowed"]:
        assert_refused(entry, "host-device-access")
        return
    mounts = entry["object"]["spec"]["containers"][0]["volumeMounts"]
    assert [m.get("readOnly") for m in mounts if m["name"] == VOLUME_MPS_PIPE] == [True]


EPHEMERAL_MOUNTS: Final[dict[str, tuple[bool, Obj]]] = {
    # (mps pod?, the debugger's mount)
    "library-writable": (False, mount(VOLUME_LIBRARY, "/hook")),
    "library-at-library-path-readonly-false": (
        False,
        mount(VOLUME_LIBRARY, LIBRARY, read_only=False),
    ),
    "library-sub-path": (False, mount(VOLUME_LIBRARY, "/hook", subPath="x")),
    "mps-pipe-writable": (True, mount(VOLUME_MPS_PIPE, "/tmp/nvidia-mps")),
}


@pytest.mark.parametrize("shape", sorted(EPHEMERAL_MOUNTS))
def test_ephemeral_container_mounting_an_injected_volume_writable_is_refused(shape: str) -> None:
    mps, debugger_mount = EPHEMERAL_MOUNTS[shape]
    old = stored(pod(gpu(), annotations=MPS if mps else None))
    new = with_ephemeral(old, container("debugger", mounts=[debugger_mount]))
    assert_refused(update(old, new, sub_resource="ephemeralcontainers"), "host-device-access")


def test_ephemeral_container_mounting_the_library_read_only_is_allowed() -> None:
    old = pending()
    new = with_ephemeral(
        old, container("debugger", mounts=[mount(VOLUME_LIBRARY, "/hook", read_only=True)])
    )
    assert_clean(update(old, new, sub_resource="ephemeralcontainers"))


# ======================================================================================
# F3 host paths that reach the accounting from the side
# ======================================================================================

SIDE_PATHS: Final = (
    # kubelet state: device-plugin sockets, pod-resources API, other pods' volumes
    "/var/lib/kubelet",
    "/var/lib/kubelet/",
    "//var/lib/kubelet",
    "/var/lib/./kubelet",
    "var/lib/kubelet",
    "/var/lib/kubelet/device-plugins",
    "/var/lib/kubelet/device-plugins/kubelet.sock",
    "/var/lib/kubelet/pod-resources",
    "/var/lib/kubelet/pods",
    "/var/lib/kubelet/pods/../device-plugins",
    "/var/log/../lib/kubelet",
    "/var/lib",
    "/var/lib/",
    # /proc as a whole (/proc/<pid>/root is the host's root filesystem)
    "/proc",
    "/proc/",
    "//proc",
    "/proc/self",
    "/proc/1",
    "/proc/sys",
    "/proc/sys/kernel",
    "/proc/./1/ns",
    "/tmp/../proc",
    # container runtimes: sockets, their directories and state
    "/run/containerd",
    "/run/containerd/containerd.sock",
    "/run/containerd/",
    "/var/run/containerd/containerd.sock",
    "/var/lib/containerd",
    "/var/lib/containerd/io.containerd.grpc.v1.cri",
    "/run/crio",
    "/run/crio/crio.sock",
    "/var/run/crio/crio.sock",
    "/run/docker.sock",
    "/var/run/docker.sock",
    "//var/run//docker.sock",
    "/run/./docker.sock",
    "/var/lib/docker",
    "/var/lib/docker/containers",
    "/run/cri-dockerd.sock",
    "/var/run/cri-dockerd.sock",
    "/run/k3s",
    "/run/k3s/containerd/containerd.sock",
)


@pytest.mark.parametrize("path", SIDE_PATHS)
@pytest.mark.parametrize("gpu_pod", [True, False], ids=["gpu-pod", "plain-pod"])
def test_host_path_reaching_the_accounting_is_refused(path: str, gpu_pod: bool) -> None:
    # Read-only is no help: the kubelet's sockets and other pods' volumes are readable.
    main = first(gpu_pod, mounts=[mount("side", "/host", read_only=True)])
    obj = pod(main, volumes=[host_volume("side", path)])
    assert_refused(review(obj), "host-device-access")


@pytest.mark.parametrize("kind", ["Deployment", "ReplicationController", "Job"])
def test_host_path_reaching_the_accounting_in_a_template_is_refused(kind: str) -> None:
    template = pod(
        gpu(mounts=[mount("plugins", "/dp")]),
        volumes=[host_volume("plugins", "/var/lib/kubelet/device-plugins")],
    )
    assert_refused(review(workload(kind, template)), "host-device-access")


DEVICE_REQUEST_PATHS: Final = (
    "/var/run/nvidia-container-devices",
    "/var/run/nvidia-container-devices/all",
    f"/var/run/nvidia-container-devices/{GPU_UUID}",
    "/var/run/nvidia-container-devices/0",
    "/var/run/nvidia-container-devices/all/",
    "//var/run/nvidia-container-devices/all",
    "/var/run/./nvidia-container-devices/all",
    "/var/run/nvidia-container-devices/../nvidia-container-devices/all",
    "/var/run/../run/nvidia-container-devices/all",
    "/tmp/../var/run/nvidia-container-devices/all",
    "var/run/nvidia-container-devices/all",
    "/run/nvidia-container-devices/all",
    "/run/nvidia-container-devices",
)
VOLUME_KINDS: Final[dict[str, Obj]] = {
    "emptyDir": {"name": "req", "emptyDir": {}},
    "configMap": {"name": "req", "configMap": {"name": "cfg"}},
    "pvc": {"name": "req", "persistentVolumeClaim": {"claimName": "data"}},
    "harmless-hostPath": {"name": "req", "hostPath": {"path": "/data"}},
    "secret": {"name": "req", "secret": {"secretName": "s"}},
}


@pytest.mark.parametrize("path", DEVICE_REQUEST_PATHS)
@pytest.mark.parametrize("gpu_pod", [True, False], ids=["gpu-pod", "plain-pod"])
def test_mount_under_the_device_request_directory_is_refused(path: str, gpu_pod: bool) -> None:
    # accept-nvidia-visible-devices-as-volume-mounts: the runtime reads device requests
    # from mount destinations here, whatever is mounted.
    obj = pod(first(gpu_pod, mounts=[mount("req", path)]), volumes=[VOLUME_KINDS["emptyDir"]])
    assert_refused(review(obj), "host-device-access")


@pytest.mark.parametrize("volume", sorted(VOLUME_KINDS))
@pytest.mark.parametrize("where", ["containers", "initContainers", "sidecar", "second-container"])
def test_device_request_mount_of_any_volume_in_any_container_is_refused(
    volume: str, where: str
) -> None:
    request = mount("req", "/var/run/nvidia-container-devices/all", read_only=True)
    volumes = [VOLUME_KINDS[volume]]
    if where == "containers":
        obj = pod(container("app", mounts=[request]), volumes=volumes)
    elif where == "initContainers":
        obj = pod(container("app"), init=[container("setup", mounts=[request])], volumes=volumes)
    elif where == "sidecar":
        obj = pod(container("app"), init=[sidecar(mounts=[request])], volumes=volumes)
    else:
        obj = pod(gpu(), container("helper", mounts=[request]), volumes=volumes)
    assert_refused(review(obj), "host-device-access")


@pytest.mark.parametrize("gpu_pod", [True, False], ids=["gpu-pod", "plain-pod"])
def test_ephemeral_container_mounting_under_the_device_request_directory_is_refused(
    gpu_pod: bool,
) -> None:
    # kubectl debug --custom: the debugger mounts a volume the pod already has.
    main = gpu() if gpu_pod else container("app", mounts=[mount("scratch", "/scratch")])
    old = stored(pod(main, volumes=[{"name": "scratch", "emptyDir": {}}]))
    volume = VOLUME_LOCK if gpu_pod else "scratch"
    debugger = container(
        "debugger", mounts=[mount(volume, "/var/run/nvidia-container-devices/all")]
    )
    decision = update(old, with_ephemeral(old, debugger), sub_resource="ephemeralcontainers")
    assert_refused(decision, "host-device-access")


def test_host_paths_near_but_outside_the_protected_ones_are_allowed() -> None:
    near = (
        "/var/lib/kubelet-backup",
        "/run/containerd-x",
        "/procfs",
        "/data/proc",
        "/opt/docker.sock",
    )
    for path in near:
        obj = pod(gpu(mounts=[mount("near", "/near")]), volumes=[host_volume("near", path)])
        assert_clean(review(obj))


def test_mount_paths_near_the_device_request_directory_are_allowed() -> None:
    # (.../nvidia-container-devices-x is a request for "-x": the toolkit matches its root
    # as a string prefix; tests/core/test_default_deny.py.)
    near = (
        "/var/run",
        "/data/var/run/nvidia-container-devices",
    )
    for path in near:
        obj = pod(gpu(mounts=[mount("v", path)]), volumes=[{"name": "v", "emptyDir": {}}])
        assert_clean(review(obj))


ALLOWLIST_DENIED: Final = (
    "/data",
    "/data/models2",
    "/data/models/../secrets",
    "/etc",
    "/home/user",
    "/opt/models",
)


@pytest.mark.parametrize("path", ALLOWLIST_DENIED)
@pytest.mark.parametrize(
    "limits",
    [
        pytest.param(GPU_LIMITS, id="vgpu"),
        pytest.param({"nvidia.com/mig-1g.5gb": "1"}, id="mig"),
        pytest.param({"nvidia.com/gpu": "1"}, id="bare-gpu"),
    ],
)
def test_allowlist_refuses_host_paths_outside_it_in_gpu_pods(
    path: str, limits: Mapping[str, str]
) -> None:
    obj = pod(
        gpu(limits=limits, mounts=[mount("h", "/h", read_only=True)]),
        volumes=[host_volume("h", path)],
    )
    assert_refused(review(obj, allowlist()), "host-device-access")


@pytest.mark.parametrize("path", ["/data/models", "/data/models/", "/data/models/llama-3"])
def test_allowlist_admits_host_paths_inside_it(path: str) -> None:
    obj = pod(gpu(mounts=[mount("h", "/h", read_only=True)]), volumes=[host_volume("h", path)])
    assert_clean(review(obj, allowlist()))


def test_allowlist_binds_gpu_pods_only_and_the_deny_list_binds_every_pod() -> None:
    plain = pod(container("app", mounts=[mount("h", "/h")]), volumes=[host_volume("h", "/srv")])
    assert_clean(review(plain, allowlist()))
    kubelet = pod(
        container("app", mounts=[mount("h", "/h")]),
        volumes=[host_volume("h", "/var/lib/kubelet")],
    )
    assert_refused(review(kubelet, allowlist()), "host-device-access")


def test_allowlist_admits_what_the_mutation_injects() -> None:
    text = "  hostPaths: {mode: allowlist, allowed: []}\n  vgpu: {preload: file}"
    assert_clean(review(pod(gpu()), policy_with(text)))
    assert_clean(review(pod(gpu(), annotations=MPS), policy_with(text)))


def test_strict_example_uses_an_allowlist_and_preload_file() -> None:
    policy = strict()
    assert policy.preload == "file"
    assert policy.spec["hostPaths"]["mode"] == "allowlist"
    assert_clean(review(pod(gpu()), policy))
    foreign = pod(
        gpu(mounts=[mount("h", "/h", read_only=True)]), volumes=[host_volume("h", "/root")]
    )
    assert_refused(review(foreign, policy), "host-device-access")
    sidecar_writes_preload = pod(gpu(), container("sidecar", mounts=[mount(VOLUME_PRELOAD, "/p")]))
    assert_refused(review(sidecar_writes_preload, policy), "host-device-access")


# ======================================================================================
# F4 HAMi-core's own switches
# ======================================================================================

CONFIG_VALUE: Final = {"configMapKeyRef": {"name": "gpu-tuning", "key": "value"}}
ENV_ATTACKS: Final[dict[str, list[Obj]]] = {
    # CUDA_REDIRECT: HAMi-core dlopens this library for every cu* symbol: no hooks at all.
    "redirect-value": [
        {"name": "CUDA_REDIRECT", "value": "/usr/lib/x86_64-linux-gnu/libcuda.so.1"}
    ],
    "redirect-relative": [{"name": "CUDA_REDIRECT", "value": "libcuda.so.1"}],
    "redirect-space": [{"name": "CUDA_REDIRECT", "value": " "}],
    "redirect-config-map": [{"name": "CUDA_REDIRECT", "valueFrom": CONFIG_VALUE}],
    "redirect-field-ref": [
        {
            "name": "CUDA_REDIRECT",
            "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['lib']"}},
        }
    ],
    "redirect-reference": [
        {"name": "LIB", "value": "/usr/lib/x86_64-linux-gnu/libcuda.so.1"},
        {"name": "CUDA_REDIRECT", "value": "$(LIB)"},
    ],
    "redirect-reference-to-value-from": [
        {"name": "LIB", "valueFrom": CONFIG_VALUE},
        {"name": "CUDA_REDIRECT", "value": "$(LIB)"},
    ],
    "redirect-empty-then-set": [
        {"name": "CUDA_REDIRECT", "value": ""},
        {"name": "CUDA_REDIRECT", "value": "libcuda.so.1"},
    ],
    "redirect-set-then-empty": [
        {"name": "CUDA_REDIRECT", "value": "libcuda.so.1"},
        {"name": "CUDA_REDIRECT", "value": ""},
    ],
    # ACTIVE_OOM_KILLER: HAMi-core reads exactly "false" and "0" as off.
    "oom-killer-false": [{"name": "ACTIVE_OOM_KILLER", "value": "false"}],
    "oom-killer-zero": [{"name": "ACTIVE_OOM_KILLER", "value": "0"}],
    "oom-killer-config-map": [{"name": "ACTIVE_OOM_KILLER", "valueFrom": CONFIG_VALUE}],
    "oom-killer-reference": [
        {"name": "OFF", "value": "false"},
        {"name": "ACTIVE_OOM_KILLER", "value": "$(OFF)"},
    ],
    # GPU_CORE_UTILIZATION_POLICY=disable removes the SM throttle (measured, NOTES.md).
    "core-policy-disable": [{"name": "GPU_CORE_UTILIZATION_POLICY", "value": "disable"}],
    "core-policy-upper": [{"name": "GPU_CORE_UTILIZATION_POLICY", "value": "DISABLE"}],
    "core-policy-mixed-case": [{"name": "GPU_CORE_UTILIZATION_POLICY", "value": "Disable"}],
    "core-policy-config-map": [{"name": "GPU_CORE_UTILIZATION_POLICY", "valueFrom": CONFIG_VALUE}],
    "core-policy-reference": [
        {"name": "P", "value": "disable"},
        {"name": "GPU_CORE_UTILIZATION_POLICY", "value": "$(P)"},
    ],
    # CUDA_DISABLE_CONTROL: HAMi's device plugin drops the preload.
    "disable-control-true": [{"name": "CUDA_DISABLE_CONTROL", "value": "true"}],
    "disable-control-one": [{"name": "CUDA_DISABLE_CONTROL", "value": "1"}],
    "disable-control-upper": [{"name": "CUDA_DISABLE_CONTROL", "value": "TRUE"}],
    "disable-control-config-map": [{"name": "CUDA_DISABLE_CONTROL", "valueFrom": CONFIG_VALUE}],
    "disable-control-reference": [
        {"name": "OFF", "value": "true"},
        {"name": "CUDA_DISABLE_CONTROL", "value": "$(OFF)"},
    ],
}


def _placed_env(where: str, env: list[Obj]) -> Obj:
    """A GPU pod with ``env`` in the container at ``where``."""
    if where == "gpu-container":
        return pod(gpu(env=env))
    if where == "sidecar-container":
        return pod(gpu(), container("sidecar", env=env))
    if where == "init-container":
        return pod(gpu(), init=[container("setup", env=env)])
    if where == "sidecar-init-container":
        return pod(gpu(), init=[sidecar(env=env)])
    if where == "gpu-init-container":
        return pod(container("app"), init=[gpu("warmup", env=env)])
    assert where == "mig-container"
    return pod(gpu(limits={"nvidia.com/mig-1g.5gb": "1"}, env=env))


PLACES: Final = (
    "gpu-container",
    "sidecar-container",
    "init-container",
    "sidecar-init-container",
    "gpu-init-container",
    "mig-container",
)


@pytest.mark.parametrize("attack", sorted(ENV_ATTACKS))
@pytest.mark.parametrize("where", PLACES)
def test_hami_core_switch_in_any_container_of_a_gpu_pod_is_refused(attack: str, where: str) -> None:
    assert_refused(review(_placed_env(where, ENV_ATTACKS[attack])), "limit-tampering")


@pytest.mark.parametrize("attack", sorted(ENV_ATTACKS))
@pytest.mark.parametrize("kind", ["Deployment", "ReplicationController", "StatefulSet"])
def test_hami_core_switch_in_a_template_is_refused(attack: str, kind: str) -> None:
    template = pod(gpu(env=ENV_ATTACKS[attack]))
    assert_refused(review(workload(kind, template)), "limit-tampering")


@pytest.mark.parametrize("attack", sorted(ENV_ATTACKS))
def test_hami_core_switch_in_an_ephemeral_container_is_refused(attack: str) -> None:
    old = pending()
    new = with_ephemeral(old, container("debugger", env=ENV_ATTACKS[attack]))
    assert_refused(update(old, new, sub_resource="ephemeralcontainers"), "limit-tampering")


ENV_CONTROLS: Final[dict[str, list[Obj]]] = {
    "redirect-empty": [{"name": "CUDA_REDIRECT", "value": ""}],
    "oom-killer-true": [{"name": "ACTIVE_OOM_KILLER", "value": "true"}],
    "oom-killer-one": [{"name": "ACTIVE_OOM_KILLER", "value": "1"}],
    "core-policy-force": [{"name": "GPU_CORE_UTILIZATION_POLICY", "value": "force"}],
    "core-policy-default": [{"name": "GPU_CORE_UTILIZATION_POLICY", "value": "default"}],
    "disable-control-false": [{"name": "CUDA_DISABLE_CONTROL", "value": "false"}],
    "disable-control-zero": [{"name": "CUDA_DISABLE_CONTROL", "value": "0"}],
}


@pytest.mark.parametrize("control", sorted(ENV_CONTROLS))
def test_harmless_values_of_the_switches_are_allowed(control: str) -> None:
    assert_clean(review(pod(gpu(env=ENV_CONTROLS[control]))))


def test_switches_in_a_pod_without_gpus_are_not_tampering() -> None:
    assert_clean(review(pod(container("app", env=ENV_ATTACKS["redirect-value"]))))


ENV_FROM: Final = [{"configMapRef": {"name": "tenant-tuning"}}, {"secretRef": {"name": "t"}}]


@pytest.mark.parametrize("gpus", [1, 2, 4])
def test_mutation_pins_the_switches_against_env_from_and_image_env(gpus: int) -> None:
    limits = {**GPU_LIMITS, "nvidia.com/gpu": str(gpus)}
    entry = review(pod(gpu(limits=limits, envFrom=ENV_FROM)))
    assert_clean(entry)
    env = env_of(entry["object"])
    assert env["GPU_CORE_UTILIZATION_POLICY"] == "default"
    assert env["CUDA_REDIRECT"] == ""
    for index in range(gpus):
        assert env[f"CUDA_DEVICE_SM_LIMIT_{index}"] == "30"
    assert review(entry["object"])["patch"] == []


def test_mutation_pins_the_policy_core_utilization_and_keeps_a_users_force() -> None:
    assert env_of(review(pod(gpu()), strict())["object"])["GPU_CORE_UTILIZATION_POLICY"] == "force"
    forced = pod(gpu(env=[{"name": "GPU_CORE_UTILIZATION_POLICY", "value": "force"}]))
    entry = review(forced)
    assert_clean(entry)
    assert env_of(entry["object"])["GPU_CORE_UTILIZATION_POLICY"] == "force"


def test_mutation_pins_the_switches_in_sharing_init_containers() -> None:
    entry = review(pod(container("app"), init=[gpu("warmup")]))
    assert_clean(entry)
    env = env_of(entry["object"], kind="initContainers")
    assert env["CUDA_REDIRECT"] == ""
    assert env["GPU_CORE_UTILIZATION_POLICY"] == "default"
    assert env["CUDA_DEVICE_SM_LIMIT_0"] == "30"


def _validate(obj: Obj) -> Decision:
    request = Request(kind="Pod", operation="CREATE", namespace="ml", username="alice")
    return decide(obj, request, DEFAULT_POLICY, phase="validate")


@pytest.mark.parametrize(
    ("name", "value", "rule"),
    [
        ("CUDA_REDIRECT", "/usr/lib/libcuda.so.1", "limit-tampering"),
        ("ACTIVE_OOM_KILLER", "false", "limit-tampering"),
        ("GPU_CORE_UTILIZATION_POLICY", "disable", "limit-tampering"),
        ("CUDA_REDIRECT", None, "unmutated-gpu-pod"),
        ("GPU_CORE_UTILIZATION_POLICY", None, "unmutated-gpu-pod"),
        ("CUDA_DEVICE_SM_LIMIT_0", None, "unmutated-gpu-pod"),
    ],
)
def test_a_later_mutator_that_loosens_or_drops_a_pin_is_refused_at_validation(
    name: str, value: str | None, rule: str
) -> None:
    final = pending()
    env = final["spec"]["containers"][0]["env"]
    env[:] = [e for e in env if e["name"] != name]
    if value is not None:
        env.append({"name": name, "value": value})
    assert_refused(_validate(final), rule)


# ======================================================================================
# F5 quota arithmetic
# ======================================================================================


def slice_of(gpus: int, mib: int | None = None) -> dict[str, str]:
    limits = {"nvidia.com/gpu": str(gpus)}
    if mib is not None:
        limits["nvidia.com/gpumem"] = str(mib)
    return limits


QUOTA_ATTACKS: Final[dict[str, Callable[[], Obj]]] = {
    # perPod gpus 2: the sidecar's GPU runs beside main's two.
    "sidecar-adds-gpus": lambda: pod(gpu(limits=slice_of(2)), init=[sidecar(limits=slice_of(1))]),
    # perPod 6000 MiB: 4000 + 4000 run together.
    "sidecar-adds-memory": lambda: pod(
        gpu(limits=slice_of(1, 4000)), init=[sidecar(limits=slice_of(1, 4000))]
    ),
    "three-sidecars": lambda: pod(
        container("app"),
        init=[
            sidecar("a", limits=slice_of(1)),
            sidecar("b", limits=slice_of(1)),
            sidecar("c", limits=slice_of(1)),
        ],
    ),
    # A plain init container runs beside the sidecars declared before it: 1 + 2 > 2.
    "init-after-sidecar": lambda: pod(
        gpu(limits=slice_of(1)),
        init=[sidecar(limits=slice_of(1)), gpu("warmup", limits=slice_of(2))],
    ),
    "init-after-sidecar-memory": lambda: pod(
        container("app"),
        init=[sidecar(limits=slice_of(1, 3000)), gpu("warmup", limits=slice_of(1, 3500))],
    ),
    # Bare counts and percentage-only slices are GPUs too.
    "bare-gpu-containers": lambda: pod(
        gpu("a", limits={"nvidia.com/gpu": "1"}),
        gpu("b", limits={"nvidia.com/gpu": "1"}),
        gpu("c", limits={"nvidia.com/gpu": "1"}),
    ),
    "percentage-only-containers": lambda: pod(
        gpu("a", limits={"nvidia.com/gpumem-percentage": "10"}),
        gpu("b", limits={"nvidia.com/gpumem-percentage": "10"}),
        gpu("c", limits={"nvidia.com/gpumem-percentage": "10"}),
    ),
    "bare-volcano-count": lambda: pod(
        gpu("a", limits={"volcano.sh/vgpu-number": "2"}),
        gpu("b", limits={"volcano.sh/vgpu-number": "1"}),
    ),
    "bare-gpu-sidecar": lambda: pod(
        gpu(limits={"nvidia.com/gpu": "2"}), init=[sidecar(limits={"nvidia.com/gpu": "1"})]
    ),
    "percentage-only-sidecar": lambda: pod(
        gpu(limits=slice_of(2)),
        init=[sidecar(limits={"nvidia.com/gpumem-percentage": "50"})],
    ),
    # perContainer gpus 2.
    "bare-gpu-over-container-maximum": lambda: pod(gpu(limits={"nvidia.com/gpu": "3"})),
    "sidecar-over-container-maximum": lambda: pod(
        container("app"), init=[sidecar(limits={"nvidia.com/gpu": "3"})]
    ),
    # Memory counts per vGPU: 2 x 3500 MiB.
    "memory-per-vgpu": lambda: pod(gpu(limits=slice_of(2, 3500))),
}


@pytest.mark.parametrize("attack", sorted(QUOTA_ATTACKS))
def test_quota_counts_what_runs_together(attack: str) -> None:
    assert_refused(review(QUOTA_ATTACKS[attack](), quota()), "gpu-quota")


@pytest.mark.parametrize("kind", ["Deployment", "ReplicationController", "Job"])
def test_quota_counts_sidecars_in_templates(kind: str) -> None:
    assert_refused(
        review(workload(kind, QUOTA_ATTACKS["sidecar-adds-gpus"]()), quota()), "gpu-quota"
    )


QUOTA_CONTROLS: Final[dict[str, Callable[[], Obj]]] = {
    # Plain init containers run one at a time, before the main ones: max, not sum.
    "init-then-main": lambda: pod(
        gpu(limits=slice_of(2)), init=[gpu("warmup", limits=slice_of(2))]
    ),
    # A sidecar declared after a plain init container does not run beside it:
    # max(main 1 + sidecar 1, warmup 2 + 0) = 2.
    "init-before-sidecar": lambda: pod(
        gpu(limits=slice_of(1)),
        init=[gpu("warmup", limits=slice_of(2)), sidecar(limits=slice_of(1))],
    ),
    "sidecar-within-quota": lambda: pod(
        gpu(limits=slice_of(1, 3000)), init=[sidecar(limits=slice_of(1, 3000))]
    ),
    # A sidecar-looking field on a regular container means nothing to the quota.
    "one-container-at-maximum": lambda: pod(gpu(limits=slice_of(2, 3000))),
}


@pytest.mark.parametrize("control", sorted(QUOTA_CONTROLS))
def test_quota_admits_pods_within_it(control: str) -> None:
    assert_clean(review(QUOTA_CONTROLS[control](), quota()))


def test_strict_example_counts_sidecars() -> None:
    # strict.yaml: perPod gpus 4, perContainer gpus 2.
    obj = pod(
        gpu("a", limits=slice_of(2)),
        gpu("b", limits=slice_of(2)),
        init=[sidecar(limits=slice_of(1))],
    )
    assert_refused(review(obj, strict()), "gpu-quota")


# ======================================================================================
# F6 kinds with templates
# ======================================================================================

F6_SHAPES: Final[dict[str, tuple[Callable[[], Obj], str, Callable[[], Policy | None]]]] = {
    "privileged": (
        lambda: pod(gpu(securityContext={"privileged": True})),
        "privileged-gpu",
        lambda: None,
    ),
    "forged-annotation": (
        lambda: pod(gpu(), annotations={"hami.io/vgpu-devices-allocated": "x"}),
        "forged-allocation",
        lambda: None,
    ),
    "writable-injected-mount": (
        lambda: pod(gpu(), container("sidecar", mounts=[mount(VOLUME_LIBRARY, "/w")])),
        "host-device-access",
        lambda: None,
    ),
    "kubelet-host-path": (
        lambda: pod(gpu(), volumes=[host_volume("k", "/var/lib/kubelet/pod-resources")]),
        "host-device-access",
        lambda: None,
    ),
    "device-request-mount": (
        lambda: pod(
            container("app", mounts=[mount("v", "/var/run/nvidia-container-devices/all")]),
            volumes=[{"name": "v", "emptyDir": {}}],
        ),
        "host-device-access",
        lambda: None,
    ),
    "cuda-redirect": (
        lambda: pod(gpu(env=ENV_ATTACKS["redirect-value"])),
        "limit-tampering",
        lambda: None,
    ),
    "oom-killer-off": (
        lambda: pod(gpu(env=ENV_ATTACKS["oom-killer-false"])),
        "limit-tampering",
        lambda: None,
    ),
    "sidecar-quota": (QUOTA_ATTACKS["sidecar-adds-gpus"], "gpu-quota", quota),
}


@pytest.mark.parametrize("shape", sorted(F6_SHAPES))
def test_replication_controller_template_is_refused(shape: str) -> None:
    build, rule, policy = F6_SHAPES[shape]
    assert_refused(review(workload("ReplicationController", build()), policy()), rule)


def test_replication_controller_template_is_mutated() -> None:
    entry = review(workload("ReplicationController", pod(gpu())))
    assert_clean(entry)
    assert entry["patch"]
    assert all(op["path"].startswith("/spec/template/") for op in entry["patch"])
    template = entry["object"]["spec"]["template"]
    assert template["spec"]["schedulerName"] == "hami-scheduler"
    assert env_of(template)["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m"


# ======================================================================================
# F8 traceable denials
# ======================================================================================

SECRET: Final = "s3cr3t-Zq9w"
# (pod, the names its message must keep) per rule whose message quotes a user value.
F8_CASES: Final[dict[str, tuple[Callable[[], Obj], str, tuple[str, ...]]]] = {
    "visible-devices": (
        lambda: pod(gpu(env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": f"GPU-{SECRET}"}])),
        "raw-visible-devices",
        ("NVIDIA_VISIBLE_DEVICES", '"main"'),
    ),
    "core-policy-reference": (
        lambda: pod(gpu(env=[{"name": "GPU_CORE_UTILIZATION_POLICY", "value": f"$({SECRET})"}])),
        "limit-tampering",
        ("GPU_CORE_UTILIZATION_POLICY", '"main"'),
    ),
    "cuda-redirect": (
        lambda: pod(gpu(env=[{"name": "CUDA_REDIRECT", "value": f"/opt/{SECRET}.so"}])),
        "limit-tampering",
        ("CUDA_REDIRECT", '"main"'),
    ),
    "overwritten-limit": (
        lambda: pod(gpu(env=[{"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": f"{SECRET}g"}])),
        "limit-tampering",
        ("CUDA_DEVICE_MEMORY_LIMIT_0", '"main"'),
    ),
    "scheduler-name": (
        lambda: pod(gpu(), schedulerName=f"sched-{SECRET}"),
        "scheduler-bypass",
        ("schedulerName",),
    ),
    "node-name": (
        lambda: pod(gpu(), nodeName=f"node-{SECRET}"),
        "node-name-pinning",
        ("nodeName",),
    ),
    "quantity": (
        lambda: pod(gpu(limits={"nvidia.com/gpumem": f"{SECRET}"})),
        "invalid-gpu-request",
        ("nvidia.com/gpumem", '"main"'),
    ),
    "mode-annotation": (
        lambda: pod(gpu(), annotations={"gpushare.io/mode": f"{SECRET}"}),
        "mode-conflict",
        ("gpushare.io/mode",),
    ),
    "cdi-annotation": (
        lambda: pod(gpu(), annotations={"cdi.k8s.io/devices": f"nvidia.com/gpu={SECRET}"}),
        "host-device-access",
        ("cdi.k8s.io/devices",),
    ),
    "reserved-annotation": (
        lambda: pod(gpu(), annotations={"hami.io/vgpu-node": f"node-{SECRET}"}),
        "forged-allocation",
        ("hami.io/vgpu-node",),
    ),
    # Host paths and volume names stay: they are what an operator needs to find.
    "host-path": (
        lambda: pod(gpu(), volumes=[host_volume(f"vol-{SECRET[:4]}", "/dev/nvidia0")]),
        "host-device-access",
        ("/dev/nvidia0", f"vol-{SECRET[:4]}"),
    ),
}


@pytest.mark.parametrize("case", sorted(F8_CASES))
@pytest.mark.parametrize("endpoint", ["mutate", "validate"])
def test_audit_record_carries_rule_action_and_redacted_message(
    case: str, endpoint: Endpoint
) -> None:
    build, rule, names = F8_CASES[case]
    wire = admission_review(build(), namespace="ml", username="alice")
    answered = answer(wire["apiVersion"], wire["request"], DEFAULT_POLICY, endpoint=endpoint)
    violations = answered.decision.violations
    assert rule in {v["rule"] for v in violations}, violations
    record = build_record(answered, endpoint=endpoint, policy_hash="h", latency_s=0.001)
    assert [(v["rule"], v["action"]) for v in record["violations"]] == [
        (v["rule"], v["action"]) for v in violations
    ]
    audited = {v["rule"]: v for v in record["violations"]}[rule]
    message = audited.get("message", "")
    for name in names:
        assert name in message, message
    assert SECRET not in orjson.dumps(record).decode()
    # Where the user's message quotes the value, the audit copy says "…" in its place.
    shown = next(v["message"] for v in violations if v["rule"] == rule)
    if SECRET in shown:
        assert '"\u2026"' in message, message


# ======================================================================================
# Beyond the spec: bypasses of the same rules that F1..F8 do not name
# ======================================================================================

# The GPU Operator with CDI enabled configures the toolkit with annotation-prefixes
# nvidia.cdi.k8s.io/ (and its NRI plugin reads nvidia.cdi.k8s.io/container.<name>):
# management.nvidia.com/gpu=all there hands a pod every GPU of the node.
NVIDIA_CDI_KEYS: Final = ("nvidia.cdi.k8s.io/devices", "nvidia.cdi.k8s.io/container.app")


@pytest.mark.parametrize("key", NVIDIA_CDI_KEYS)
def test_nvidia_cdi_annotation_prefix_is_refused(key: str) -> None:
    obj = pod(container("app"), annotations={key: "management.nvidia.com/gpu=all"})
    assert_refused(review(obj), "host-device-access")


@pytest.mark.parametrize("key", NVIDIA_CDI_KEYS)
def test_nvidia_cdi_annotation_prefix_added_by_update_is_refused(key: str) -> None:
    old = stored(pod(container("app")))
    new = annotated(old, {key: "nvidia.com/gpu=all"})
    assert_refused(update(old, new), "host-device-access")


# Host files that decide which devices containers get: CDI specs (the device plugin's and
# the operator's, rewritten to list every device node), the NVIDIA toolkit's config
# (accept-nvidia-visible-devices-envvar-when-unprivileged, no-cgroups) and the
# operator-installed runtime binaries. Written from a pod, they change other pods' GPUs.
GPU_STACK_PATHS: Final = (
    "/etc/cdi",
    "/etc/cdi/nvidia.yaml",
    "/var/run/cdi",
    "/run/cdi",
    "/etc/nvidia-container-runtime",
    "/etc/nvidia-container-runtime/config.toml",
    "/usr/local/nvidia",
    "/usr/local/nvidia/toolkit",
)


@pytest.mark.parametrize("path", GPU_STACK_PATHS)
@pytest.mark.parametrize("gpu_pod", [True, False], ids=["gpu-pod", "plain-pod"])
def test_writable_host_path_to_the_gpu_stack_config_is_refused(path: str, gpu_pod: bool) -> None:
    obj = pod(
        first(gpu_pod, mounts=[mount("stack", "/stack")]), volumes=[host_volume("stack", path)]
    )
    assert_refused(review(obj), "host-device-access")


# HAMi-core reads CUDA_TASK_PRIORITY (0 high, default 1) and HAMi's monitor throttles
# low-priority neighbours for it; the mutation sets it only from nvidia.com/priority.
@pytest.mark.parametrize(
    "env",
    [
        pytest.param([{"name": "CUDA_TASK_PRIORITY", "value": "0"}], id="value"),
        pytest.param([{"name": "CUDA_TASK_PRIORITY", "valueFrom": CONFIG_VALUE}], id="value-from"),
        pytest.param(
            [{"name": "HIGH", "value": "0"}, {"name": "CUDA_TASK_PRIORITY", "value": "$(HIGH)"}],
            id="reference",
        ),
    ],
)
def test_task_priority_without_a_priority_request_is_not_kept(env: list[Obj]) -> None:
    entry = review(pod(gpu(env=env)))
    if entry["allowed"]:
        final = entry["object"]["spec"]["containers"][0]["env"]
        kept = [e for e in final if e["name"] == "CUDA_TASK_PRIORITY" and e.get("value") != "1"]
        assert kept == [], "a user's CUDA_TASK_PRIORITY survived the mutation"
    else:
        assert_refused(entry, "limit-tampering")


def test_task_priority_is_pinned_against_env_from() -> None:
    entry = review(pod(gpu(envFrom=ENV_FROM)))
    assert entry["allowed"]
    assert env_of(entry["object"]).get("CUDA_TASK_PRIORITY") not in (None, "0")
