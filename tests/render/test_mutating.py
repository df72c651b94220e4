"""The MutatingAdmissionPolicies against their core twins, without Go.

Which pod or template each policy is sent is decided by its matchConditions alone: the
GPU test of ``gpushare-mutate`` is the core's ``PodRequests.gpu``, and the condition of
``gpushare-void`` is ``mutation.needs_void`` of a pod that asks for no GPU. What the
policies then write is their JSONPatch ops, applied as the apiserver applies them, held
equal to the core's mutation on every field it touches. Both are evaluated here by
tests/render/celeval.py on objects as kube-apiserver hands them to admission;
tests/e2e/test_mutatingpolicy.py holds the same through a real kube-apiserver.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator
from typing import Any, Final

import pytest
from hypothesis import strategies as st

from tests.core.strategies import attacked_objects, objects
from tests.e2e.rest import sendable
from tests.e2e.test_celpolicy import POLICY
from tests.e2e.test_mutatingpolicy import (
    MUTATED,
    POLICY_FILES,
    attacked_sharing_objects,
    chained,
    core_mutated,
    difference,
    entries,
    exempting_untouched,
    recorded,
    sharing_objects,
    touched,
)
from tests.paths import ROOT
from tests.render import celeval
from tests.render.admitted import Refused, admitted
from tests.render.test_cel_equality import _draw_all, _runtime_classes
from webhook.core.mutation import needs_void
from webhook.core.policy import Policy
from webhook.core.resources import read_pod
from webhook.core.workload import find_pod
from webhook.policies import parse_policy
from webhook.render.admission import OVERRIDES_ANNOTATION
from webhook.render.mutating import MUTATE, VOID_POLICY, mutating_policies

Obj = dict[str, Any]

EXAMPLES: Final = 600
# Each is up to three passes of the policies and two of the core.
MUTATION_EXAMPLES: Final = 600
NAMESPACE: Final = "ml"


def _condition(policy_name: str, condition: str) -> celeval.Policy:
    """The one matchCondition ``condition`` of the rendered ``policy_name``, as a policy
    of that condition alone (an exemption condition beside it is the scope's, tested in
    tests/render/test_scope.py)."""
    (rendered,) = [
        o
        for o in mutating_policies(POLICY)
        if o["kind"] == "MutatingAdmissionPolicy" and o["metadata"]["name"] == policy_name
    ]
    (chosen,) = [c for c in rendered["spec"]["matchConditions"] if c["name"] == condition]
    return celeval.Policy(
        {"metadata": {"name": policy_name}, "spec": {"matchConditions": [chosen]}}
    )


GPU: Final = _condition(MUTATE, "gpushare.io/gpu")
NEEDS_VOID: Final = _condition(VOID_POLICY, "gpushare.io/needs-void")


def _pod(*containers: Obj, **spec: Any) -> tuple[str, Obj]:
    return "Pod", {
        "apiVersion": "v1",
        "kind": "Pod",
        "spec": {"containers": list(containers), **spec},
    }


def _container(name: str, *, env: tuple[str, ...] = (), limits: Obj | None = None) -> Obj:
    container: Obj = {"name": name, "image": "cuda"}
    if env:
        container["env"] = [{"name": e, "value": "all"} for e in env]
    if limits:
        container["resources"] = {"limits": limits}
    return container


# The void's reasons one by one, and a zero count (asks for nothing) beside each.
VOID_CASES: Final = (
    _pod(_container("a", env=("NVIDIA_VISIBLE_DEVICES",))),
    _pod(_container("a", env=("CUDA_VERSION",))),
    _pod(_container("a"), _container("b", env=("NVIDIA_DRIVER_CAPABILITIES",))),
    _pod(_container("a"), runtimeClassName="nvidia"),
    _pod(_container("a", limits={"nvidia.com/gpu": "0"}), runtimeClassName="nvidia-cdi"),
    _pod(_container("a", env=("NVIDIA_VISIBLE_DEVICES",), limits={"nvidia.com/gpu": "0"})),
    _pod(_container("a", limits={"nvidia.com/gpu": "0", "nvidia.com/gpumem": "3000"})),
    _pod(_container("a", env=("NVIDIA_VISIBLE_DEVICES",), limits={"nvidia.com/gpu": "1"})),
    _pod(_container("a"), runtimeClassName="kata"),
)


def _admitted_each(
    drawn: list[tuple[str, Obj]], policy: Policy, namespace: str
) -> Iterator[tuple[str, Obj, Obj]]:
    """Each of ``drawn`` that the apiserver would take in ``namespace``, as admission sees
    it, with the request the policies read: ``(kind, object, request)``."""
    for number, (kind, obj) in enumerate(drawn):
        try:
            stored = admitted(
                kind,
                sendable(kind, obj, f"m{number}"),
                namespace=namespace,
                runtime_classes=_runtime_classes(policy),
            )
        except Refused:
            continue
        request = celeval.admission_request(
            kind, namespace=namespace, name=stored["metadata"].get("name", "")
        )
        yield kind, stored, request


def test_the_policies_are_sent_what_the_core_mutates() -> None:
    """Generated pods and workloads, careful and attacked (zero counts beside amounts,
    MIG, DRA, NVIDIA env, GPU runtime classes): each condition holds exactly where its
    core twin does, without an error."""
    drawn = [*VOID_CASES, *_draw_all(st.one_of(objects(), attacked_objects()), EXAMPLES)]
    seen: Counter[str] = Counter()
    mismatches: list[tuple[str, bool, bool, Obj]] = []
    for kind, stored, request in _admitted_each(drawn, POLICY, NAMESPACE):
        view = find_pod(stored, kind)
        assert view is not None
        requests = read_pod(view.spec, POLICY)
        for name, cel, want in (
            ("gpu", GPU, requests.gpu),
            (
                "needs-void",
                NEEDS_VOID,
                not requests.gpu and needs_void(view.spec, requests, POLICY),
            ),
        ):
            outcome = cel.evaluate(stored, request)
            if outcome.errors or outcome.matched != want:
                mismatches.append((name, outcome.matched, want, stored))
            seen[f"{name}={want}"] += 1
    assert not mismatches, (len(mismatches), mismatches[0])
    # Each side of each condition was reached.
    assert all(seen[f"{n}={w}"] >= 5 for n in ("gpu", "needs-void") for w in (True, False)), seen


def _sharing(*env: Obj) -> tuple[str, Obj]:
    limits = {"nvidia.com/gpu": "1", "nvidia.com/gpumem": "3000", "nvidia.com/gpucores": "30"}
    return _pod({"name": "c0", "image": "cuda", "env": list(env), "resources": {"limits": limits}})


# What each part of the mutation's guard (``suspect``) and in-place set must see alone:
# a stray limit, an entry taken from elsewhere (twice), a name repeated with the value
# the mutation sets, an earlier entry of a name the mutation sets.
MUTATION_CASES: Final = (
    _sharing({"name": "CUDA_DEVICE_MEMORY_LIMIT_7", "value": "1m"}),
    _sharing(
        {"name": "LD_PRELOAD", "valueFrom": {"configMapKeyRef": {"name": "l", "key": "p"}}},
        {"name": "MODEL", "value": "m"},
        {"name": "LD_PRELOAD", "valueFrom": {"configMapKeyRef": {"name": "l", "key": "p"}}},
    ),
    _sharing(
        {"name": "CUDA_DEVICE_SM_LIMIT", "value": "30"},
        {"name": "CUDA_DEVICE_SM_LIMIT", "value": "30"},
    ),
    _sharing(
        {"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": "9m"},
        {"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": "3000m"},
    ),
)


def _policies(policy: Policy) -> list[celeval.MutatingPolicy]:
    """The rendered MutatingAdmissionPolicies of ``policy``, compiled."""
    return [
        celeval.MutatingPolicy(o)
        for o in mutating_policies(policy)
        if o["kind"] == "MutatingAdmissionPolicy"
    ]


def _run(policies: list[celeval.MutatingPolicy], obj: Obj, request: Obj) -> tuple[Obj, list[Obj]]:
    """``obj`` after one pass of ``policies``, and the ops they made."""
    made: list[Obj] = []
    for each in policies:
        obj, ops = each.mutate(obj, request)
        made += ops
    return obj, made


@pytest.mark.parametrize("policy_file", POLICY_FILES)
def test_the_mutations_write_what_the_core_does(policy_file: str) -> None:
    """The MutatingAdmissionPolicies' JSONPatch ops, evaluated here on generated objects
    as admission sees them (careful users' sharing objects mostly, attacks too): where
    the core admits, the object they leave equals the core's mutation on every field it
    touches, with the same record of what was replaced; a second pass on their own
    output (the apiserver reinvokes gpushare-mutate) makes no op; and a pod that another
    mutating webhook gave a sidecar after the first pass ends as the core mutates the
    pod with the sidecar. Every mode and kind is reached."""
    policy = parse_policy(exempting_untouched(ROOT / "policies" / policy_file))
    policies = _policies(policy)
    generated = st.one_of(
        *[sharing_objects()] * 3, *[attacked_sharing_objects()] * 2, objects(), attacked_objects()
    )
    drawn = [*MUTATION_CASES, *_draw_all(generated, MUTATION_EXAMPLES)]
    compared: Counter[str] = Counter()
    mismatches: list[tuple[str, Obj]] = []
    for kind, stored, request in _admitted_each(drawn, policy, MUTATED):
        mutated, made = _run(policies, stored, request)
        _, again = _run(policies, mutated, request)
        if again:
            mismatches.append((f"a second pass made {again}", stored))
        compared["mutated" if made else "untouched"] += 1
        core = core_mutated(kind, stored, policy)
        if core.denied:
            continue  # refused after the mutation, by the validating policies
        starts = [(stored, mutated)]
        if kind == "Pod":
            sidecar = chained(mutated)
            starts.append((chained(stored), _run(policies, sidecar, request)[0]))
        for start, got in starts:
            want = core_mutated(kind, start, policy)
            compared[want.mode] += 1
            compared[kind] += 1
            stored_fields = touched(kind, got)
            stored_fields["annotations"].pop(OVERRIDES_ANNOTATION, None)
            if stored_fields != touched(kind, want.mutated):
                mismatches.append((difference(stored_fields, touched(kind, want.mutated)), start))
            have, wanted = entries(kind, got), entries(kind, want.mutated)
            if have != wanted:
                mismatches.append((f"entries +{have - wanted} -{wanted - have}", start))
            if recorded(got) != want.overrides:
                mismatches.append((f"recorded {recorded(got)} not {want.overrides}", start))
            if want.overrides:
                compared["overrides recorded"] += 1
    assert not mismatches, f"{len(mismatches)} differ; first: {mismatches[0]}"
    for mode in ("vgpu", "mps", "mig", "none"):
        assert compared[mode] >= 10, compared
    assert compared["overrides recorded"] >= 5 and compared["mutated"] >= 100, compared
    assert sum(compared[k] for k in celeval.RESOURCES if k != "Pod") >= 20, compared
