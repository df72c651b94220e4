"""The CEL policies (webhook/render/validating.py) equal the decision core rule by rule,
in seconds and without Go: tests/e2e/test_celpolicy.py's differentials, on its own
shapes and generators, with the CEL evaluated here (tests/render/celeval.py) on each
object as the apiserver would hand it over (tests/render/admitted.py).

Each object is generated, sent as the e2e test sends it (``sendable``; every other one
with the mutation applied), decoded, defaulted and validated as kube-apiserver does before
admission, and then judged twice: every validation of the rendered pod policy evaluated
(a rule fails when its expression is false), and the core's verdict as the e2e test
takes it (``core_denials``, or ``decide`` on an UPDATE). The two sets of rule ids must be
equal, and no expression may err. Objects the apiserver refuses are left out, as the e2e
test leaves out its 400s and 422s; they are counted, and so are the objects and the
(object, rule) pairs compared.

Only the renderer's public functions and the objects they render are used here, so this
holds as the rendering changes.
"""

from __future__ import annotations

import copy
import itertools
import time
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.core.strategies import (
    IDENTITIES,
    apply_update,
    attacked_objects,
    objects,
    pod_updates,
    quota_pods,
)
from tests.core.test_decision import KAI_ATTACKS
from tests.e2e.rest import ALLOCATION, DIFFERENTIAL, pod_to_store, sendable
from tests.e2e.test_celpolicy import (
    ADMITTED,
    BYPASSES,
    HOST_POLICIES,
    POLICY,
    ZERO_AMOUNTS,
    _cronjob,
    _deployment,
    _kai_fraction,
    _mutated,
    _mutation_of,
    _scheduled,
    core_denials,
    host_access_objects,
    judged_by_cel,
    mutation_edits,
)
from tests.render import celeval, kubequantity
from tests.render.admitted import Refused, admitted, updated
from tests.render.test_validating import MODE_SCHEDULERS as MODES_POLICY
from webhook.core.decision import Request, decide
from webhook.core.policy import Policy
from webhook.policies import parse_policy
from webhook.render.validating import RULES, policy_name, validating_policies

Obj = dict[str, Any]

# As many examples as the e2e differentials draw (the same ones: derandomised).
EXAMPLES: Final = 1000
EDIT_EXAMPLES: Final = 300
MODES_EXAMPLES: Final = 500
HOST_EXAMPLES: Final = 400
UPDATE_EXAMPLES: Final = 300
NAMESPACE: Final = "cel-warn-only"
MODES_NAMESPACES: Final = ("cel-modes", "mps-team")
TENANT: Final = IDENTITIES["tenant"]


def _runtime_classes(policy: Policy) -> tuple[str, ...]:
    """The runtime classes the e2e cluster creates (a pod naming another is refused)."""
    return (*sorted(policy.gpu_runtime_classes), "kata")


def pod_policy(policy: Policy) -> celeval.Policy:
    """The rendered ValidatingAdmissionPolicy holding the pod rules that deny (every
    rendered rule of the policies compared here denies)."""
    name = policy_name("deny")
    (deny,) = [
        o
        for o in validating_policies(policy)
        if o["kind"] == "ValidatingAdmissionPolicy" and o["metadata"]["name"] == name
    ]
    return celeval.Policy(deny)


@dataclass
class Tally:
    """What one differential compared, refused and found."""

    objects: int = 0
    pairs: int = 0
    refused: Counter[str] = field(default_factory=Counter)
    denied: Counter[str] = field(default_factory=Counter)
    mismatches: list[tuple[str, list[str], list[str], Mapping[str, str], Any]] = field(
        default_factory=list
    )

    def compare(
        self, label: str, verdict: celeval.Outcome, rules: int, want: set[str], obj: Any
    ) -> None:
        self.objects += 1
        self.pairs += rules
        got = set(verdict.failed) if verdict.matched else set()
        self.denied.update(want)
        if got != want or verdict.errors:
            self.mismatches.append((label, sorted(got), sorted(want), dict(verdict.errors), obj))

    def refuse(self, error: Refused) -> None:
        reason = str(error)
        self.refused["unmodelled" if reason.startswith("unmodelled") else "refused"] += 1

    def report(self, name: str, started: float) -> str:
        return (
            f"{name}: {self.objects} objects x rules = {self.pairs} compared in"
            f" {time.monotonic() - started:.1f} s; left out: {dict(self.refused)};"
            f" denied by the core: {dict(sorted(self.denied.items()))}"
        )


def _created(
    tally: Tally,
    cel: celeval.Policy,
    policy: Policy,
    kind: str,
    obj: Obj,
    namespace: str,
    *,
    label: str,
    requester: tuple[str, tuple[str, ...]] = TENANT,
    today: str = "",
) -> None:
    """``obj`` created as a ``kind`` in ``namespace`` by ``requester`` (the tenant) on
    ``today``: both verdicts compared."""
    try:
        seen = admitted(kind, obj, namespace=namespace, runtime_classes=_runtime_classes(policy))
    except Refused as error:
        tally.refuse(error)
        return
    user, groups = requester
    request = celeval.admission_request(
        kind,
        namespace=namespace,
        name=seen["metadata"].get("name", ""),
        username=user,
        groups=groups,
    )
    verdict = cel.evaluate(seen, request)
    want = core_denials(seen, namespace, policy, username=user, groups=groups, today=today)
    tally.compare(label, verdict, len(cel.rules), want, seen)


def _assert_equal(tally: Tally) -> None:
    assert not tally.mismatches, (
        f"{len(tally.mismatches)} of {tally.objects} differ (label, CEL, core, errors, object);"
        f" first: {tally.mismatches[0]}"
    )


DEFAULT: Final = pod_policy(POLICY)


def test_the_evaluator_reads_what_the_renderer_writes() -> None:
    """Every expression of every rendered policy compiles here, and each pod validation
    names a rule the core has."""
    for policy in (POLICY, MODES_POLICY, *HOST_POLICIES.values()):
        for obj in validating_policies(policy):
            if obj["kind"] == "ValidatingAdmissionPolicy":
                assert set(celeval.Policy(obj).rules) <= set(RULES)
    assert set(DEFAULT.rules) == set(RULES) - {"gpu-quota"}


@pytest.mark.parametrize(
    ("text", "canonical", "integer"),
    [
        # quantity.go's own examples (its doc comment), and what the strategies write.
        ("1.5", "1500m", None),
        ("1.5Gi", "1536Mi", None),
        ("3000", "3k", 3000),
        ("0m", "0", None),
        ("-0", "0", 0),
        ("1000m", "1", None),
        ("3Gi", "3Gi", 3 << 30),
        ("1e3", "1e3", 1000),
        ("9" * 60, "9" * 60, None),
    ],
)
def test_quantities_are_read_as_go_reads_them(
    text: str, canonical: str, integer: int | None
) -> None:
    parsed = kubequantity.parse(text)
    assert parsed is not None
    assert parsed.text() == canonical
    assert parsed.as_int64() == integer
    again = kubequantity.parse(canonical)
    assert again is not None and again.cmp(parsed) == 0


@pytest.mark.parametrize("shape", sorted(BYPASSES))
def test_each_bypass_is_refused_by_its_rule(shape: str) -> None:
    pod, rule = BYPASSES[shape]
    tally = Tally()
    for kind, obj in (("Pod", pod), ("Deployment", _deployment(pod)), ("CronJob", _cronjob(pod))):
        _created(tally, DEFAULT, POLICY, kind, sendable(kind, obj, "p"), NAMESPACE, label=kind)
    assert tally.objects == 3, tally.refused
    _assert_equal(tally)
    assert tally.denied[rule] == 3, tally.denied


@pytest.mark.parametrize("shape", sorted(ADMITTED))
def test_well_shaped_pods_are_admitted_once_mutated(shape: str) -> None:
    pod = ADMITTED[shape]
    tally = Tally()
    mutated = _mutated(pod, namespace=NAMESPACE)
    for kind, obj in (("Pod", mutated), ("Deployment", _deployment(mutated)), ("Pod", pod)):
        _created(tally, DEFAULT, POLICY, kind, sendable(kind, obj, "p"), NAMESPACE, label=kind)
    assert tally.objects == 3, tally.refused
    _assert_equal(tally)
    assert set(tally.denied) <= {"unmutated-gpu-pod"}


@pytest.mark.parametrize("shape", sorted(ZERO_AMOUNTS))
def test_zero_amounts_are_judged_as_the_core_judges_them(shape: str) -> None:
    limits, refused = ZERO_AMOUNTS[shape]
    launcher = {
        "name": "launcher",
        "image": "busybox",
        "resources": {"limits": limits, "requests": limits},
    }
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}}
    pod["spec"] = {"containers": [launcher], "schedulerName": "volcano"}
    tally = Tally()
    for kind, obj in (("Pod", pod), ("Deployment", _deployment(pod))):
        _created(tally, DEFAULT, POLICY, kind, sendable(kind, obj, "p"), NAMESPACE, label=kind)
    assert tally.objects == 2, tally.refused
    _assert_equal(tally)
    assert ("invalid-gpu-request" in tally.denied) == refused


@pytest.mark.parametrize("attack", [None, *sorted(KAI_ATTACKS)])
def test_kai_fractions_take_devices_only_from_the_binders_config_map(attack: str | None) -> None:
    pod = _kai_fraction()
    if attack is not None:
        KAI_ATTACKS[attack](pod)
    tally = Tally()
    _created(tally, DEFAULT, POLICY, "Pod", sendable("Pod", pod, "p"), NAMESPACE, label="Pod")
    assert tally.objects == 1, tally.refused
    _assert_equal(tally)
    assert ("raw-visible-devices" in tally.denied) == (attack is not None)


def test_a_rule_rendered_wrong_is_told_apart() -> None:
    """The differential can fail: with one validation's expression replaced by what
    refuses nothing, or by what refuses everything, the bypasses disagree."""
    (rendered,) = [
        o
        for o in validating_policies(POLICY)
        if o["kind"] == "ValidatingAdmissionPolicy" and o["metadata"]["name"] == policy_name("deny")
    ]
    for rule, expression in (("privileged-gpu", "true"), ("node-name-pinning", "false")):
        wrong = copy.deepcopy(rendered)
        for validation in wrong["spec"]["validations"]:
            if celeval.rule_of(validation["message"]) == rule:
                validation["expression"] = expression
        compiled = celeval.Policy(wrong)
        tally = Tally()
        for name, (pod, _rule) in sorted(BYPASSES.items()):
            sent = sendable("Pod", pod, "p")
            _created(tally, compiled, POLICY, "Pod", sent, NAMESPACE, label=name)
        differ = {label for label, *_ in tally.mismatches}
        want = {n for n, (_p, r) in BYPASSES.items() if r == rule} if expression == "true" else None
        assert differ and (want is None or want <= differ), (rule, sorted(differ))


def _draw_all(strategy: st.SearchStrategy[Any], count: int) -> list[Any]:
    """``count`` examples of ``strategy``, the same every run."""
    drawn: list[Any] = []

    @settings(DIFFERENTIAL, max_examples=count)
    @given(strategy)
    def collect(example: Any) -> None:
        drawn.append(example)

    collect()
    return drawn


def _generated(
    tally: Tally,
    cel: celeval.Policy,
    policy: Policy,
    examples: Iterable[tuple[tuple[str, Obj], str]],
    *,
    mutate_every_other: bool,
) -> None:
    counter = itertools.count()
    for (kind, obj), namespace in examples:
        number = next(counter)
        sent = sendable(kind, obj, f"w{number}")
        if mutate_every_other and number % 2:
            sent = _mutation_of(sent, policy, namespace=namespace)
        _created(tally, cel, policy, kind, sent, namespace, label=f"{kind} #{number}")


def _coverage(tally: Tally, *, rules: Iterable[str], least: int) -> None:
    """Enough objects reached the policies, and each of ``rules`` was denied on some."""
    assert tally.objects >= least, (tally.objects, tally.refused)
    missing = [r for r in rules if not tally.denied[r]]
    assert not missing, (missing, tally.denied)


def test_generated_objects_rule_by_rule() -> None:
    """tests/e2e/test_celpolicy.py's rule-by-rule differential under the default policy:
    well-formed and attacked pods and workloads (every other one mutated), and mutated GPU
    pods with what the mutation set dropped or changed."""
    started = time.monotonic()
    tally = Tally()
    drawn = _draw_all(st.one_of(objects(), attacked_objects()), EXAMPLES)
    _generated(tally, DEFAULT, POLICY, ((e, NAMESPACE) for e in drawn), mutate_every_other=True)
    edits = _draw_all(mutation_edits(POLICY, NAMESPACE), EDIT_EXAMPLES)
    _generated(tally, DEFAULT, POLICY, ((e, NAMESPACE) for e in edits), mutate_every_other=False)
    print(tally.report("default policy", started))
    _assert_equal(tally)
    _coverage(tally, rules=DEFAULT.rules, least=(EXAMPLES + EDIT_EXAMPLES) // 5)


def test_generated_objects_under_per_mode_schedulers() -> None:
    """The per-mode schedulers' policy (schedulers per mode and resource, per-namespace
    modes, maxima: gpu-quota rendered), in a namespace that chooses mps and one that
    does not."""
    started = time.monotonic()
    cel = pod_policy(MODES_POLICY)
    tally = Tally()
    mixed = st.one_of(
        _scheduled(), quota_pods().map(lambda p: ("Pod", p)), objects(), attacked_objects()
    )
    drawn = _draw_all(st.tuples(mixed, st.sampled_from(MODES_NAMESPACES)), MODES_EXAMPLES)
    _generated(tally, cel, MODES_POLICY, drawn, mutate_every_other=True)
    print(tally.report("per-mode schedulers", started))
    _assert_equal(tally)
    rules = (
        "gpu-quota",
        "mode-conflict",
        "invalid-gpu-request",
        "unmutated-gpu-pod",
        "scheduler-bypass",
    )
    _coverage(tally, rules=rules, least=MODES_EXAMPLES // 5)


@pytest.mark.parametrize("key", sorted(HOST_POLICIES))
def test_generated_host_access_under_each_policy(key: str) -> None:
    """The host-device-access differential's objects (injected volumes made writable,
    retyped, respelled, renamed; host paths; CDI annotations; device-request mounts),
    compared on every rule, under the strict policy, odd host paths and the default."""
    started = time.monotonic()
    policy = HOST_POLICIES[key]
    cel = pod_policy(policy)
    namespace = f"cel-host-{key}"
    tally = Tally()
    drawn = _draw_all(host_access_objects(policy, namespace), HOST_EXAMPLES // len(HOST_POLICIES))
    _generated(tally, cel, policy, ((e, namespace) for e in drawn), mutate_every_other=False)
    print(tally.report(f"host access under {key}", started))
    _assert_equal(tally)
    _coverage(tally, rules=("host-device-access",), least=len(drawn) // 2)


def _stored(base: str, name: str) -> Obj:
    """The pod tests/e2e/test_celpolicy.py's update differential stores for ``base``."""
    pod = pod_to_store(name, "gpu" if base == "gpu" else "plain")
    if base == "gpu":
        pod = _mutated(pod, namespace=NAMESPACE)
    stored = admitted("Pod", pod, namespace=NAMESPACE)
    if base == "allocated":
        annotations = stored["metadata"].setdefault("annotations", {})
        annotations.update(ALLOCATION)
    return stored


def test_pod_updates_rule_by_rule() -> None:
    """Pod UPDATEs by the tenant, HAMi's scheduler and device plugin and look-alikes:
    annotations added, changed or removed, labels, `kubectl debug` containers."""
    started = time.monotonic()
    tally = Tally()
    bases = st.sampled_from(["plain", "allocated", "gpu"])
    drawn = _draw_all(
        st.tuples(bases, pod_updates(), st.sampled_from(sorted(IDENTITIES))), UPDATE_EXAMPLES
    )
    for number, (base, edits, identity) in enumerate(drawn):
        old = _stored(base, f"u{number}")
        debug = [e for e in edits if e[0] == "debug"]
        try:
            new = updated(old, apply_update(old, debug or edits), namespace=NAMESPACE)
        except Refused as error:
            tally.refuse(error)
            continue
        user, groups = IDENTITIES[identity]
        request = celeval.admission_request(
            "Pod",
            namespace=NAMESPACE,
            name=old["metadata"]["name"],
            operation="UPDATE",
            username=user,
            groups=groups,
            sub_resource="ephemeralcontainers" if debug else "",
        )
        verdict = DEFAULT.evaluate(new, request, old=old)
        facts = Request(
            kind="Pod", operation="UPDATE", namespace=NAMESPACE, username=user, groups=groups
        )
        decision = decide(
            judged_by_cel(new), facts, POLICY, phase="validate", old=judged_by_cel(old)
        )
        want = {v["rule"] for v in decision.denials} & set(RULES)
        tally.compare(f"{base} by {identity}", verdict, len(DEFAULT.rules), want, (old, new))
    print(tally.report("pod updates", started))
    _assert_equal(tally)
    _coverage(tally, rules=("forged-allocation", "privileged-gpu"), least=UPDATE_EXAMPLES // 2)


# Exceptions by namespace (a glob), by requester and past their last day, over rules
# of every family.
EXCEPTED: Final = parse_policy(
    f"""
apiVersion: gpushare.io/v1alpha1
kind: GPUSharePolicy
spec:
  exceptions:
    - name: warn-only-paths
      rules: [host-device-access, privileged-gpu]
      namespaces: ["cel-warn-*"]
      reason: r
      owner: o
      expires: 2027-06-30
    - name: tenant-env
      rules: [raw-visible-devices, limit-tampering]
      users: [{TENANT[0]}]
      reason: r
      owner: o
    - name: lapsed
      rules: [node-name-pinning, scheduler-bypass]
      namespaces: [{NAMESPACE}]
      reason: r
      owner: o
      expires: 2001-01-01
"""
)
EXCEPTED_EXAMPLES: Final = 1000


def test_generated_objects_under_exceptions() -> None:
    """The policy's exceptions rendered on a day equal the core's on that day: in and
    out of their namespaces, by and not by their requester, one of them past its end."""
    started = time.monotonic()
    today = "2027-01-01"
    (deny,) = [
        o
        for o in validating_policies(EXCEPTED, today=today)
        if o["kind"] == "ValidatingAdmissionPolicy" and o["metadata"]["name"] == policy_name("deny")
    ]
    cel = celeval.Policy(deny)
    tally = Tally()
    drawn = _draw_all(st.one_of(objects(), attacked_objects()), EXCEPTED_EXAMPLES)
    requesters = (TENANT, ("someone-else", ("system:authenticated",)))
    for number, (kind, obj) in enumerate(drawn):
        namespace = (NAMESPACE, "other")[number % 2]
        requester = requesters[(number // 2) % 2]
        sent = sendable(kind, obj, f"x{number}")
        if number % 3 == 0:
            sent = _mutation_of(sent, EXCEPTED, namespace=namespace)
        _created(
            tally,
            cel,
            EXCEPTED,
            kind,
            sent,
            namespace,
            label=f"{kind} #{number}",
            requester=requester,
            today=today,
        )
    print(tally.report("exceptions", started))
    _assert_equal(tally)
    _coverage(
        tally, rules=("host-device-access", "raw-visible-devices"), least=EXCEPTED_EXAMPLES // 10
    )
