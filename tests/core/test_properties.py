"""Properties of the decision core over generated pods, workloads and junk.

What must hold for every input: the patch is valid RFC 6902 against the object it was
computed for and gives what the review reports; the mutation is idempotent and keeps
the user's data; both endpoints agree on a mutated object; nothing raises; results are
well formed; and a rule the policy sets to warn, audit or off never denies.
"""

from __future__ import annotations

import copy
import json
import re
from collections.abc import Mapping, Sequence
from typing import Any, Final

import jsonpatch
import yaml
from hypothesis import example, given
from hypothesis import strategies as st

from tests.core.strategies import (
    ALL_KINDS,
    CONTAINER_KINDS,
    COUNT_RESOURCES,
    INJECTED_NAMES,
    MIB_RESOURCES,
    PROPERTY_SETTINGS,
    Obj,
    objects,
    template_of,
    wild_objects,
)
from tests.paths import ROOT
from webhook.core.cluster import ClusterView
from webhook.core.decision import MAX_WARNING, Decision, Request, decide
from webhook.core.policy import RULE_IDS, Policy
from webhook.core.review import review_object
from webhook.policies import DEFAULT_POLICY, load_policy, parse_policy

POLICY_FILES: Final = [
    ROOT / "policies" / "default.yaml",
    *sorted((ROOT / "policies" / "examples").glob("*.yaml")),
]
# Every bundled policy, plus the file-preload variant no example uses.
POLICIES: Final[dict[str, Policy]] = {
    **{path.stem: load_policy(path) for path in POLICY_FILES},
    "preload-file": parse_policy(
        "apiVersion: gpushare.io/v1alpha1\nkind: GPUSharePolicy\nspec:\n  vgpu: {preload: file}\n"
    ),
}
policies: Final = st.sampled_from(sorted(POLICIES)).map(lambda name: POLICIES[name])

LIBRARY: Final = "/usr/local/vgpu/libvgpu.so"
INJECTED_MOUNT_PATHS: Final = frozenset(
    {LIBRARY, "/tmp/vgpulock", "/etc/ld.so.preload", "/tmp/nvidia-mps", "/overrideEnv"}
)
# Env vars the mutation owns (sets, replaces or removes); everything else is the user's.
OWNED_ENV: Final = re.compile(
    r"LD_PRELOAD|NVIDIA_VISIBLE_DEVICES|GPU_CORE_UTILIZATION_POLICY|CUDA_DEVICE_\w*"
    r"|CUDA_MPS_\w*|CUDA_TASK_PRIORITY|CUDA_REDIRECT|ACTIVE_OOM_KILLER"
    # The device pins (env.DEVICE_PINS), set only where the user set none.
    r"|NVIDIA_GDS|NVIDIA_MOFED|NVIDIA_GDRCOPY|NVIDIA_NVSWITCH|NVIDIA_IMEX_CHANNELS"
)
# Stray limit variables the mutation removes by design.
STRAY_ENV: Final = re.compile(r"CUDA_DEVICE_MEMORY_LIMIT\w*|CUDA_DEVICE_SM_LIMIT_\w*")
OPS: Final = frozenset({"add", "remove", "replace"})


def test_every_bundled_policy_is_exercised() -> None:
    examples = ROOT / "policies" / "examples"
    stems = {path.stem for path in examples.glob("*.yaml")}
    assert {"default", *stems} <= set(POLICIES)
    # policies/default.yaml is the policy the package ships and uses without --policy.
    assert POLICIES["default"].digest == DEFAULT_POLICY.digest


def namespace_of(obj: Mapping[str, Any]) -> str:
    metadata = obj.get("metadata")
    namespace = metadata.get("namespace") if isinstance(metadata, Mapping) else None
    return str(namespace or "default")


def request_for(kind: str, obj: Mapping[str, Any], operation: str = "CREATE") -> Request:
    return Request(kind=kind, operation=operation, namespace=namespace_of(obj))


def as_json(value: Any) -> Any:
    """``value`` after a JSON round trip: what the apiserver sends and jsonpatch expects."""
    return json.loads(json.dumps(value))


def check_ops(patch: Sequence[Mapping[str, Any]]) -> None:
    json.dumps(patch)  # serialisable as the AdmissionResponse carries it
    for op in patch:
        assert op["op"] in OPS, op
        assert isinstance(op["path"], str), op
        assert op["path"].startswith("/"), op
        assert ("value" in op) == (op["op"] != "remove"), op


def check_well_formed(decision: Decision) -> None:
    assert isinstance(decision.allowed, bool)
    assert decision.mode in ("vgpu", "mps", "mig", "none")
    for violation in decision.violations:
        assert violation["rule"] in RULE_IDS, violation
        assert violation["action"] in ("deny", "warn", "audit"), violation
        assert isinstance(violation["message"], str), violation
        assert violation["message"], violation
    assert decision.allowed == (not decision.denials)
    for warning in decision.warnings:
        assert isinstance(warning, str), warning
        assert len(warning) <= MAX_WARNING, warning
    check_ops(decision.patch)
    if not decision.allowed:
        assert decision.patch == []


def mutate_once(
    kind: str, obj: Obj, policy: Policy, *, cluster: ClusterView | None = None
) -> tuple[Decision, Obj]:
    """The mutate decision on ``obj`` and the object its patch gives (``obj`` untouched)."""
    before = copy.deepcopy(obj)
    decision = decide(obj, request_for(kind, obj), policy, phase="mutate", cluster=cluster)
    assert obj == before, "decide() changed its input"
    check_well_formed(decision)
    mutated = jsonpatch.apply_patch(as_json(obj), decision.patch)
    assert isinstance(mutated, dict)
    return decision, mutated


# -- the patch -------------------------------------------------------------------------


@PROPERTY_SETTINGS
@given(objects(), policies)
def test_patch_applies_and_gives_the_reviewed_object(
    kind_obj: tuple[str, Obj], policy: Policy
) -> None:
    kind, obj = kind_obj
    decision, mutated = mutate_once(kind, obj, policy)
    entry = review_object(obj, policy, namespace=namespace_of(obj))
    assert entry["patch"] == decision.patch
    assert entry["mode"] == decision.mode
    assert entry["object"] == (mutated if decision.allowed else obj)
    if not decision.allowed:
        assert not entry["allowed"]


def _as_stored(obj: Any) -> Any:
    """``obj`` as the apiserver stores it: an env var's empty value is omitted."""
    if isinstance(obj, list):
        return [_as_stored(item) for item in obj]
    if not isinstance(obj, dict):
        return obj
    stored = {key: _as_stored(value) for key, value in obj.items()}
    if stored.get("value") == "" and isinstance(stored.get("name"), str):
        del stored["value"]
    return stored


@PROPERTY_SETTINGS
@given(objects(hostile=False))
def test_mutation_is_idempotent(kind_obj: tuple[str, Obj]) -> None:
    kind, obj = kind_obj
    for policy in POLICIES.values():
        decision, mutated = mutate_once(kind, obj, policy)
        if not decision.allowed:
            continue
        # The apiserver reinvokes the webhook with the object as it stores it.
        mutated = _as_stored(mutated)
        again = decide(mutated, request_for(kind, mutated), policy, phase="mutate")
        assert again.patch == [], (policy.name, again.patch)
        assert again.allowed, (policy.name, again.violations)
        validated = decide(mutated, request_for(kind, mutated), policy, phase="validate")
        assert "unmutated-gpu-pod" not in {v["rule"] for v in validated.violations}, policy.name


# Found by fuzzing: /validate judged a valueFrom MPS variable that no request limits.
MPS_THREADS_FROM_FIELD: Final = {
    "apiVersion": "v1",
    "kind": "Pod",
    "spec": {
        "containers": [
            {
                "name": "trainer",
                "env": [
                    {
                        "name": "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE",
                        "valueFrom": {"fieldRef": {"fieldPath": "metadata.annotations['t']"}},
                    }
                ],
                "resources": {"limits": {"aliyun.com/gpu-mem": 1}},
            }
        ],
        "nodeSelector": {"ack.node.gpu.schedule": "mps"},
    },
}


@PROPERTY_SETTINGS
@given(objects(hostile=False))
@example(("Pod", MPS_THREADS_FROM_FIELD))
def test_endpoints_agree_on_the_mutated_object(kind_obj: tuple[str, Obj]) -> None:
    kind, obj = kind_obj
    for policy in POLICIES.values():
        decision, mutated = mutate_once(kind, obj, policy)
        if not decision.allowed:
            continue
        request = request_for(kind, mutated)
        at_mutate = decide(mutated, request, policy, phase="mutate")
        at_validate = decide(mutated, request, policy, phase="validate")
        assert at_mutate.allowed == at_validate.allowed, (
            policy.name,
            at_mutate.violations,
            at_validate.violations,
        )


# -- the mutation keeps the user's data ------------------------------------------------


def _named(entries: Any) -> list[Mapping[str, Any]]:
    if not isinstance(entries, list):
        return []
    return [e for e in entries if isinstance(e, Mapping) and isinstance(e.get("name"), str)]


def _preload_tokens(env: Any) -> list[str] | None:
    """Libraries of the effective (last) LD_PRELOAD, or None when unset or not a literal."""
    entries = [e for e in _named(env) if e["name"] == "LD_PRELOAD"]
    if not entries or "valueFrom" in entries[-1]:
        return None
    value = entries[-1].get("value", "")
    return [t for t in re.split(r"[:\s]+", str(value)) if t]


def _check_env(before: Any, after: Any) -> None:
    if not isinstance(before, list):
        return
    names_after = {e["name"] for e in _named(after)}
    for entry in _named(before):
        if not STRAY_ENV.fullmatch(entry["name"]):
            assert entry["name"] in names_after, f"env {entry['name']} lost"

    def users(env: Any) -> list[Any]:
        return [
            e
            for e in (env if isinstance(env, list) else [])
            if not (
                isinstance(e, Mapping)
                and isinstance(e.get("name"), str)
                and OWNED_ENV.fullmatch(e["name"])
            )
        ]

    assert users(before) == users(after), "env vars the mutation does not own changed"
    libraries = _preload_tokens(before)
    if libraries is not None:
        now = _preload_tokens(after)
        assert now is not None
        assert set(libraries) <= set(now), (libraries, now)
        if now != libraries:
            assert now[0] == LIBRARY, now


def _check_container(before: Mapping[str, Any], after: Any) -> None:
    assert isinstance(after, Mapping)
    for key, value in before.items():
        if key == "env":
            _check_env(value, after.get("env"))
        elif key == "volumeMounts" and isinstance(value, list):

            def users(mounts: Any) -> list[Any]:
                return [
                    m
                    for m in (mounts if isinstance(mounts, list) else [])
                    if not (isinstance(m, Mapping) and m.get("mountPath") in INJECTED_MOUNT_PATHS)
                ]

            assert users(value) == users(after.get(key)), "user mounts changed"
        elif key == "resources" and isinstance(value, Mapping):
            now = after.get(key)
            assert isinstance(now, Mapping)
            for part, amounts in value.items():
                if isinstance(amounts, Mapping) and isinstance(now.get(part), Mapping):
                    for name, amount in amounts.items():
                        assert now[part].get(name) == amount, (part, name)
                else:
                    assert now.get(part) == amounts
        else:
            assert after.get(key) == value, key


def _check_pod(before: Mapping[str, Any], after: Mapping[str, Any], mode: str) -> None:
    meta_before, meta_after = before.get("metadata"), after.get("metadata")
    if isinstance(meta_before, Mapping):
        assert isinstance(meta_after, Mapping)
        for key, value in meta_before.items():
            if key != "annotations" or not isinstance(value, Mapping):
                assert meta_after.get(key) == value, key
                continue
            for name, text in value.items():
                assert name in meta_after["annotations"], name
                if name != "gpushare.io/mode":
                    assert meta_after["annotations"][name] == text, name
    spec_before, spec_after = before["spec"], after["spec"]
    for key, value in spec_before.items():
        now = spec_after.get(key)
        if key in CONTAINER_KINDS and isinstance(value, list):
            assert isinstance(now, list)
            assert len(now) == len(value)
            for old, new in zip(value, now, strict=True):
                if isinstance(old, Mapping):
                    _check_container(old, new)
        elif key == "volumes" and isinstance(value, list):
            names_now = {v.get("name") for v in now if isinstance(v, Mapping)}
            for volume in _named(value):
                assert volume["name"] in names_now, f"volume {volume['name']} lost"

            def users(volumes: list[Any]) -> list[Any]:
                return [
                    v
                    for v in volumes
                    if not (isinstance(v, Mapping) and v.get("name") in INJECTED_NAMES)
                ]

            assert users(value) == users(now), "user volumes changed"
        elif key == "nodeSelector" and isinstance(value, Mapping):
            assert isinstance(now, Mapping)
            assert {k: now.get(k) for k in value} == value
        elif key == "schedulerName" and value in (None, "", "default-scheduler"):
            continue
        elif key == "hostIPC" and mode == "mps":
            assert now is True
        else:
            assert now == value, key


def _outside(obj: Obj, kind: str) -> Obj:
    """``obj`` without its pod template (for a Pod: without spec and metadata)."""
    stripped = copy.deepcopy(obj)
    if kind == "Pod":
        stripped.pop("spec", None)
        stripped.pop("metadata", None)
        return stripped
    template = template_of(stripped, kind)
    if isinstance(template, dict):
        template.clear()
    return stripped


@PROPERTY_SETTINGS
@given(objects(hostile=False))
def test_mutation_keeps_user_data(kind_obj: tuple[str, Obj]) -> None:
    kind, obj = kind_obj
    for policy in POLICIES.values():
        decision, mutated = mutate_once(kind, obj, policy)
        if not decision.patch:
            continue
        assert _outside(obj, kind) == _outside(mutated, kind)
        before, after = template_of(obj, kind), template_of(mutated, kind)
        assert isinstance(before, Mapping)
        assert isinstance(after, Mapping)
        _check_pod(before, after, decision.mode)


# -- the mutation gives the slice DESIGN describes -------------------------------------


def _plain_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and re.fullmatch(r"[0-9]+", value):
        return int(value)
    return None


def _env(container: Mapping[str, Any]) -> dict[str, Any]:
    return {e["name"]: e.get("value") for e in _named(container.get("env"))}


def _check_vgpu_container(spec: Mapping[str, Any], container: Mapping[str, Any]) -> None:
    limits = container["resources"]["limits"]
    env = _env(container)
    assert str(env.get("LD_PRELOAD", "")).split(":")[0] == LIBRARY
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    library = mounts[LIBRARY]
    assert library.get("readOnly") is True
    assert volumes[library["name"]]["hostPath"]["path"] == LIBRARY
    assert volumes[mounts["/tmp/vgpulock"]["name"]]["hostPath"]["path"] == "/tmp/vgpulock"
    counts = [_plain_int(limits[n]) for n in COUNT_RESOURCES if n in limits]
    gpus = counts[0] if counts and counts[0] is not None else 1
    memory = [_plain_int(limits[n]) for n in MIB_RESOURCES if n in limits]
    if memory and memory[0] is not None:
        for index in range(gpus):
            assert env[f"CUDA_DEVICE_MEMORY_LIMIT_{index}"] == f"{memory[0]}m"
    if "aliyun.com/gpu-mem" in limits and (gib := _plain_int(limits["aliyun.com/gpu-mem"])):
        assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == f"{gib * 1024}m"
    cores = _plain_int(limits.get("nvidia.com/gpucores"))
    if cores is not None:
        assert env["CUDA_DEVICE_SM_LIMIT"] == str(cores)


@PROPERTY_SETTINGS
@given(objects(hostile=False))
def test_mutated_pod_carries_its_slice(kind_obj: tuple[str, Obj]) -> None:
    kind, obj = kind_obj
    decision, mutated = mutate_once(kind, obj, DEFAULT_POLICY)
    if not decision.allowed or decision.mode not in ("vgpu", "mps"):
        return
    pod = template_of(mutated, kind)
    spec = pod["spec"]
    assert pod["metadata"]["annotations"]["gpushare.io/mode"] == decision.mode
    if decision.mode == "mps":
        assert LIBRARY not in json.dumps(decision.patch), "MPS pods get no libvgpu"
    # Each vendor's slices go to the scheduler that accounts for them (ACK's extender
    # lives in the cluster's own scheduler); a pod mixing vendors gets HAMi's.
    vendors = {
        name.split("/", 1)[0]
        for kind_ in ("containers", "initContainers", "ephemeralContainers")
        for container in spec.get(kind_, [])
        for part in ("limits", "requests")
        for name in container.get("resources", {}).get(part, {})
        if name.startswith(("nvidia.com/", "volcano.sh/", "aliyun.com/"))
        and not name.startswith("nvidia.com/mig-")
    }
    if vendors == {"aliyun.com"}:
        assert spec.get("schedulerName") in (None, "", "default-scheduler")
    else:
        wanted = "volcano" if vendors == {"volcano.sh"} else "hami-scheduler"
        assert spec["schedulerName"] == wanted
    if decision.mode == "mps":
        assert spec["hostIPC"] is True
        annotations = pod.get("metadata", {}).get("annotations") or {}
        # HAMi's scheduler places a pod its own annotation names mps: no ACK label.
        if str(annotations.get("nvidia.com/vgpu-mode", "")).strip().lower() != "mps":
            assert spec["nodeSelector"]["ack.node.gpu.schedule"] == "mps"
    for kind_ in ("containers", "initContainers"):
        for container in spec.get(kind_, []):
            limits = container.get("resources", {}).get("limits", {})
            if not any(
                n.startswith(("nvidia.com/g", "volcano.sh/", "aliyun.com/")) for n in limits
            ):
                continue
            env = _env(container)
            if decision.mode == "vgpu" and vendors == {"aliyun.com"}:
                # ACK's nodes isolate with cGPU: nothing of HAMi-core (vgpu.withoutLibrary).
                # What the mutation added, not what the pod's author wrote.
                assert LIBRARY not in json.dumps(decision.patch), "ACK pods get no libvgpu"
            elif decision.mode == "vgpu":
                _check_vgpu_container(spec, container)
            else:
                assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/tmp/nvidia-mps"
                gib = _plain_int(limits.get("aliyun.com/gpu-mem"))
                if gib is not None:
                    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"].startswith(f"0={gib * 1024}M")


# -- robustness ------------------------------------------------------------------------

operations: Final = st.sampled_from(["CREATE", "UPDATE", "DELETE", "CONNECT"])
request_kinds: Final = st.one_of(st.sampled_from(ALL_KINDS), st.sampled_from(["Service", ""]))


def _exercise(kind: str, obj: Any, policy: Policy, operation: str) -> None:
    request = Request(kind=kind, operation=operation, namespace="default")
    for phase in ("mutate", "validate"):
        decision = decide(obj, request, policy, phase=phase)
        check_well_formed(decision)
        if decision.patch:
            jsonpatch.apply_patch(copy.deepcopy(obj), decision.patch)
    entry = review_object(obj, policy, operation=operation)
    assert isinstance(entry["allowed"], bool)


@PROPERTY_SETTINGS
@given(wild_objects(), policies, operations, st.booleans(), request_kinds)
def test_junk_never_raises(
    kind_obj: tuple[str, Any], policy: Policy, operation: str, same_kind: bool, other: str
) -> None:
    kind, obj = kind_obj
    _exercise(kind if same_kind else other, obj, policy, operation)


@PROPERTY_SETTINGS
@given(objects(hostile=True), policies, operations)
def test_hostile_pods_never_raise(
    kind_obj: tuple[str, Obj], policy: Policy, operation: str
) -> None:
    kind, obj = kind_obj
    _exercise(kind, obj, policy, operation)


# -- policy actions --------------------------------------------------------------------

_DOCUMENTS: Final = {path.stem: yaml.safe_load(path.read_text("utf-8")) for path in POLICY_FILES}


@st.composite
def relaxed_policies(draw: st.DrawFn) -> tuple[Policy, dict[str, str]]:
    """A bundled policy with some rules set to warn, audit or off (through the YAML path)."""
    document = copy.deepcopy(_DOCUMENTS[draw(st.sampled_from(sorted(_DOCUMENTS)))])
    relaxed = draw(st.lists(st.sampled_from(RULE_IDS), min_size=1, unique=True))
    actions = {rule: draw(st.sampled_from(["warn", "audit", "off"])) for rule in relaxed}
    spec = document.setdefault("spec", {})
    spec["rules"] = {**(spec.get("rules") or {}), **actions}
    policy = parse_policy(yaml.safe_dump(document), source="relaxed")
    return policy, actions


@PROPERTY_SETTINGS
@given(relaxed_policies(), objects(hostile=True), st.sampled_from(["CREATE", "UPDATE"]))
def test_relaxed_rules_never_deny(
    relaxed: tuple[Policy, dict[str, str]], kind_obj: tuple[str, Obj], operation: str
) -> None:
    policy, actions = relaxed
    kind, obj = kind_obj
    for rule, action in actions.items():
        assert policy.action(rule) == action
    request = request_for(kind, obj, operation)
    for phase in ("mutate", "validate"):
        decision = decide(obj, request, policy, phase=phase)
        check_well_formed(decision)
        for violation in decision.violations:
            if violation["rule"] in actions:
                assert violation["action"] == actions[violation["rule"]], violation
            if violation["action"] == "warn":
                assert any(w.startswith(violation["rule"] + ":") for w in decision.warnings)
        if len(actions) == len(RULE_IDS):
            assert decision.allowed
    entry = review_object(obj, policy, namespace=namespace_of(obj), operation=operation)
    denied = {v["rule"] for v in entry["violations"] if v["action"] == "deny"}
    assert not denied & set(actions)
    assert entry["allowed"] == (not denied)
