"""Policy loading: the bundled default, the examples, and errors that name their line."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.paths import ROOT
from webhook.core.policy import API_VERSION, KIND, RULE_IDS, Mode, Policy, PolicyError
from webhook.core.policy import parse_policy as parse_core_policy
from webhook.core.resources import PodRequests, read_pod
from webhook.policies import DEFAULT_POLICY, load_policy, parse_policy

EXAMPLES = sorted((ROOT / "policies" / "examples").glob("*.yaml"))


def test_repository_default_is_the_bundled_default() -> None:
    assert (ROOT / "policies" / "default.yaml").read_text() == (
        ROOT / "webhook" / "policies" / "default.yaml"
    ).read_text()
    assert load_policy(ROOT / "policies" / "default.yaml").digest == DEFAULT_POLICY.digest


def test_default_actions() -> None:
    assert {rule: DEFAULT_POLICY.action(rule) for rule in RULE_IDS} == {
        rule: "off" if rule == "gpu-quota" else "deny" for rule in RULE_IDS
    }
    assert DEFAULT_POLICY.scheduler_name == "hami-scheduler"
    assert DEFAULT_POLICY.default_mode == "vgpu"


@pytest.mark.parametrize("path", EXAMPLES, ids=lambda p: p.name)
def test_examples_are_valid_and_differ_from_default(path: Path) -> None:
    policy = load_policy(path)
    assert policy.digest != DEFAULT_POLICY.digest


def test_expected_examples_exist() -> None:
    assert {p.name for p in EXAMPLES} >= {
        "audit-only.yaml",
        "strict.yaml",
        "ack-mps.yaml",
        "volcano.yaml",
    }


def test_partial_policy_keeps_defaults() -> None:
    policy = parse_policy(
        "apiVersion: gpushare.io/v1alpha1\nkind: GPUSharePolicy\nspec:\n  rules:\n    gpu-quota: off\n"
    )
    assert policy.action("gpu-quota") == "off"  # a bare YAML `off` reads as false
    assert policy.action("privileged-gpu") == "deny"
    assert policy.scheduler_name == DEFAULT_POLICY.scheduler_name


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("kind: GPUSharePolicy\n", ["line 1: (top level): 'apiVersion' is a required property"]),
        (
            "apiVersion: gpushare.io/v1alpha1\nkind: GPUSharePolicy\nspec:\n  schedulr: x\n",
            ["line 4: spec.schedulr: unknown field"],
        ),
        (
            "apiVersion: gpushare.io/v1alpha1\nkind: GPUSharePolicy\nspec:\n  rules:\n"
            "    privileged-gpu: deny\n    no-such-rule: deny\n",
            ["line 6: spec.rules.no-such-rule: 'no-such-rule' is not one of"],
        ),
        (
            "apiVersion: gpushare.io/v1alpha1\nkind: GPUSharePolicy\nspec:\n  vgpu:\n"
            "    preload: envv\n  limits:\n    perPod: {gpus: 0}\n",
            [
                "line 5: spec.vgpu.preload: 'envv' is not one of env, file",
                "line 7: spec.limits.perPod.gpus: 0 is less than the minimum of 1",
            ],
        ),
        ("apiVersion: [unclosed\n", ["line 2, column 1: not valid YAML: expected ',' or ']'"]),
        ("- a list\n", ["line 1: a policy is a YAML mapping"]),
    ],
)
def test_invalid_policies_name_each_line(text: str, expected: list[str]) -> None:
    with pytest.raises(PolicyError) as caught:
        parse_policy(text, source="p.yaml")
    assert len(caught.value.errors) == len(expected)
    for error, prefix in zip(caught.value.errors, expected, strict=True):
        assert error.startswith(prefix), error


def test_unreadable_file() -> None:
    with pytest.raises(PolicyError, match="cannot read"):
        load_policy("/nonexistent/policy.yaml")


def test_digest_changes_with_content() -> None:
    head = "apiVersion: gpushare.io/v1alpha1\nkind: GPUSharePolicy\nspec:\n"
    a = parse_policy(head + "  schedulerName: a\n")
    b = parse_policy(head + "  schedulerName: b\n")
    assert a.digest != b.digest
    assert parse_policy(head + "  schedulerName: a\n").digest == a.digest


# -- the scheduler of each resource family ---------------------------------------------

_HEAD = "apiVersion: gpushare.io/v1alpha1\nkind: GPUSharePolicy\nspec:\n"


def _asks(policy: Policy, *names: str) -> PodRequests:
    """The requests of a pod with one container per resource name."""
    containers = [
        {"name": f"c{i}", "resources": {"limits": {name: "1"}}} for i, name in enumerate(names)
    ]
    return read_pod({"containers": containers}, policy)


def _scheduler(policy: Policy, *names: str, mode: Mode = "vgpu") -> str:
    """The scheduler of a pod in ``mode`` with one container per resource name."""
    return policy.scheduler_for(_asks(policy, *names), mode=mode)


def test_default_keeps_each_vendor_on_the_scheduler_that_accounts_for_it() -> None:
    def scheduler(*names: str) -> str:
        return _scheduler(DEFAULT_POLICY, *names)

    assert scheduler("nvidia.com/gpu", "nvidia.com/gpumem") == "hami-scheduler"
    assert scheduler("aliyun.com/gpu-mem") == "default-scheduler"
    assert scheduler("aliyun.com/gpu-mem", "aliyun.com/gpu-core.percentage") == (
        "default-scheduler"
    )
    assert scheduler("volcano.sh/vgpu-number", "volcano.sh/vgpu-memory") == "volcano"
    # Neither vendor's scheduler accounts for the other's slices: the policy's own.
    assert scheduler("aliyun.com/gpu-mem", "nvidia.com/gpumem") == "hami-scheduler"
    assert scheduler("aliyun.com/gpu-mem", "volcano.sh/vgpu-memory") == "hami-scheduler"


def test_old_single_scheduler_still_means_every_gpu_sharing_pod() -> None:
    policy = parse_policy(_HEAD + "  schedulerName: my-scheduler\n")
    assert policy.scheduler_name == "my-scheduler"
    assert policy.resource_schedulers == {}
    for names in (["nvidia.com/gpumem"], ["aliyun.com/gpu-mem"], ["volcano.sh/vgpu-memory"]):
        assert _scheduler(policy, *names) == "my-scheduler"
    ack = load_policy(ROOT / "policies" / "examples" / "ack-mps.yaml")
    assert _scheduler(ack, "aliyun.com/gpu-mem") == "default-scheduler"


def test_per_resource_schedulers_merge_onto_the_default() -> None:
    policy = parse_policy(_HEAD + "  schedulerName:\n    default: my-hami\n")
    assert _scheduler(policy, "nvidia.com/gpumem") == "my-hami"
    assert _scheduler(policy, "aliyun.com/gpu-mem") == "default-scheduler"
    # An entry that names the default scheduler is the same as none.
    moved = parse_policy(_HEAD + "  schedulerName:\n    aliyun.com/gpu-mem: hami-scheduler\n")
    assert "aliyun.com/gpu-mem" not in moved.resource_schedulers
    assert _scheduler(moved, "aliyun.com/gpu-mem") == "hami-scheduler"
    assert _scheduler(moved, "aliyun.com/gpu-core.percentage") == "default-scheduler"


def test_inherited_entries_for_resources_a_policy_drops_are_moot() -> None:
    policy = parse_policy(
        _HEAD + "  resources:\n    memoryGiB: []\n    cores: [nvidia.com/gpucores]\n"
    )
    assert set(policy.resource_schedulers) == {
        "volcano.sh/vgpu-number",
        "volcano.sh/vgpu-memory",
        "volcano.sh/vgpu-memory-percentage",
        "volcano.sh/gpu-memory",
    }


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        ('  schedulerName: ""\n', ["line 4: spec.schedulerName: '' should be non-empty"]),
        ("  schedulerName: [a]\n", ["line 4: spec.schedulerName: ['a'] is not of type"]),
        (
            "  schedulerName:\n    default: 4\n",
            ["line 5: spec.schedulerName.default: 4 is not of type 'string'"],
        ),
        (
            '  allowedSchedulers: []\n  schedulerName:\n    default: x\n    aliyun.com/gpu-mem: ""\n',
            ["line 7: spec.schedulerName.aliyun.com/gpu-mem: '' should be non-empty"],
        ),
        (
            "  schedulerName:\n    aliyun.com/gpumem: default-scheduler\n"
            "    nvidia.com/mig-1g.5gb: default-scheduler\n",
            [
                "line 5: spec.schedulerName.aliyun.com/gpumem: not a GPU-sharing resource "
                "of the policy; list it in spec.resources",
                "line 6: spec.schedulerName.nvidia.com/mig-1g.5gb: MIG instances are counted "
                "by any scheduler",
            ],
        ),
        (
            # Bare words are modes or typos, never resources; names with a '/' are resources.
            "  schedulerName:\n    mps: default-scheduler\n    MPS: a\n    hami-core: b\n"
            "    mig: c\n    nvidia.com/mps: d\n",
            [
                "line 6: spec.schedulerName.MPS: not a mode; modes are vgpu, mps "
                "(resource names have a '/')",
                "line 7: spec.schedulerName.hami-core: not a mode; modes are vgpu, mps",
                "line 8: spec.schedulerName.mig: MIG instances are counted by any scheduler "
                "and MIG pods keep theirs",
                "line 9: spec.schedulerName.nvidia.com/mps: not a GPU-sharing resource",
            ],
        ),
        (
            '  schedulerName:\n    default: x\n    vgpu: ""\n',
            ["line 6: spec.schedulerName.vgpu: '' should be non-empty"],
        ),
    ],
)
def test_bad_schedulers_name_their_line(body: str, expected: list[str]) -> None:
    with pytest.raises(PolicyError) as caught:
        parse_policy(_HEAD + body, source="p.yaml")
    assert len(caught.value.errors) == len(expected), caught.value.errors
    for error, prefix in zip(caught.value.errors, expected, strict=True):
        assert error.startswith(prefix), error


def test_a_per_resource_map_over_a_single_scheduler_needs_its_default() -> None:
    base = load_policy(ROOT / "policies" / "examples" / "ack-mps.yaml")
    text = _HEAD + "  schedulerName:\n    aliyun.com/gpu-mem: ack-scheduler\n"
    with pytest.raises(PolicyError) as caught:
        parse_core_policy(text, base=base, source="p.yaml")
    assert caught.value.errors == [
        "line 4: spec.schedulerName: a per-mode or per-resource schedulerName needs default: "
        "the scheduler of other GPU pods"
    ]
    fixed = parse_core_policy(text + "    default: default-scheduler\n", base=base)
    assert _scheduler(fixed, "aliyun.com/gpu-mem") == "ack-scheduler"
    per_mode = _HEAD + "  schedulerName:\n    mps: ack-scheduler\n"
    with pytest.raises(PolicyError) as caught:
        parse_core_policy(per_mode, base=base, source="p.yaml")
    assert caught.value.errors[0].startswith("line 4: spec.schedulerName: a per-mode or")


# -- the scheduler of each mode ----------------------------------------------------------


def test_a_mode_entry_sits_between_the_resource_entries_and_the_default() -> None:
    policy = parse_policy(_HEAD + "  schedulerName:\n    mps: default-scheduler\n")
    assert policy.scheduler_name == "hami-scheduler"
    assert policy.mode_schedulers == {"mps": "default-scheduler"}
    # The mode's scheduler over the default: HAMi's resources on MPS pools.
    assert _scheduler(policy, "nvidia.com/gpumem", mode="mps") == "default-scheduler"
    assert _scheduler(policy, "nvidia.com/gpumem", mode="vgpu") == "hami-scheduler"
    # A resource's scheduler over the mode's: only Volcano counts Volcano's slices.
    assert _scheduler(policy, "volcano.sh/vgpu-memory", mode="mps") == "volcano"
    # Vendors mixed: no resource's scheduler counts all, so the mode's, else the default.
    mixed = ("aliyun.com/gpu-mem", "volcano.sh/vgpu-memory")
    assert _scheduler(policy, *mixed, mode="mps") == "default-scheduler"
    assert _scheduler(policy, *mixed, mode="vgpu") == "hami-scheduler"


def test_a_resource_entry_naming_the_default_still_wins_over_a_mode_entry() -> None:
    policy = parse_policy(
        _HEAD + "  schedulerName:\n    mps: my-mps\n    nvidia.com/gpumem: hami-scheduler\n"
    )
    assert policy.resource_schedulers["nvidia.com/gpumem"] == "hami-scheduler"
    assert _scheduler(policy, "nvidia.com/gpumem", mode="mps") == "hami-scheduler"
    assert _scheduler(policy, "nvidia.com/gpucores", mode="mps") == "my-mps"
    # Not every resource listed for hami-scheduler: the mode's.
    assert _scheduler(policy, "nvidia.com/gpumem", "nvidia.com/gpucores", mode="mps") == "my-mps"
    # Without another mode entry the same resource entry is moot and left out.
    plain = parse_policy(_HEAD + "  schedulerName:\n    nvidia.com/gpumem: hami-scheduler\n")
    assert "nvidia.com/gpumem" not in plain.resource_schedulers


def test_a_mode_entry_naming_the_default_is_moot() -> None:
    policy = parse_policy(_HEAD + "  schedulerName:\n    vgpu: hami-scheduler\n")
    assert policy.mode_schedulers == {}
    assert policy.resource_schedulers == DEFAULT_POLICY.resource_schedulers


def test_a_plain_scheduler_name_still_means_every_mode() -> None:
    policy = parse_policy(_HEAD + "  schedulerName: my-scheduler\n")
    assert policy.mode_schedulers == {}
    for mode in ("vgpu", "mps"):
        assert _scheduler(policy, "aliyun.com/gpu-mem", mode=mode) == "my-scheduler"


def test_mode_entries_merge_and_survive_a_dump() -> None:
    """A policy written back out (its spec, merged onto the default) parses to the same."""
    policy = parse_policy(
        _HEAD + "  schedulerName:\n    vgpu: my-vgpu\n    mps: default-scheduler\n"
    )
    assert policy.mode_schedulers == {"vgpu": "my-vgpu", "mps": "default-scheduler"}
    assert policy.resource_schedulers == DEFAULT_POLICY.resource_schedulers
    dumped = yaml.safe_dump({"apiVersion": API_VERSION, "kind": KIND, "spec": dict(policy.spec)})
    again = parse_core_policy(dumped, base=None)
    assert again.digest == policy.digest
    assert again.mode_schedulers == policy.mode_schedulers


def test_a_count_resource_goes_with_its_vendors_slices() -> None:
    """The mutation adds nvidia.com/gpu to gpucores asked alone: the pod it made must keep
    the scheduler it was given, or /validate refuses the mutation's own output."""
    policy = parse_policy(
        _HEAD + "  schedulerName:\n    mps: my-mps\n    nvidia.com/gpucores: hami-scheduler\n"
    )

    def one_container(**limits: str) -> str:
        container = {"name": "c", "resources": {"limits": limits}}
        return policy.scheduler_for(read_pod({"containers": [container]}, policy), mode="mps")

    assert one_container(**{"nvidia.com/gpucores": "30"}) == "hami-scheduler"
    assert one_container(**{"nvidia.com/gpucores": "30", "nvidia.com/gpu": "1"}) == (
        "hami-scheduler"
    )
    # Alone, or beside another vendor's slices, a count resource is asked for in its own right.
    assert one_container(**{"nvidia.com/gpu": "1"}) == "my-mps"
    assert one_container(**{"nvidia.com/gpu": "1", "aliyun.com/gpu-mem": "1"}) == "my-mps"
    assert policy.scheduling_resources(["nvidia.com/gpu", "aliyun.com/gpu-mem"]) == [
        "nvidia.com/gpu",
        "aliyun.com/gpu-mem",
    ]


@pytest.mark.parametrize(
    ("patterns", "key", "reserved"),
    [
        (["hami.io/*-devices-allocated"], "hami.io/vgpu-devices-allocated", True),
        (["hami.io/*-devices-allocated"], "hami.io/vgpu-node", False),
        # A leading wildcard leaves no literal prefix: every key goes to the pattern.
        (["*/bind-phase"], "example.com/bind-phase", True),
        (["*/bind-phase"], "example.com/bind-time", False),
        (["[ab].io/x"], "b.io/x", True),
        (["[ab].io/x"], "c.io/x", False),
        (["?.io/x", "hami.io/vgpu-node"], "a.io/x", True),
        (["hami.io/vgpu-node"], "hami.io/vgpu-node-extra", False),
        ([], "hami.io/vgpu-node", False),
    ],
)
def test_reserved_annotations_match_as_globs(patterns: list[str], key: str, reserved: bool) -> None:
    text = yaml.safe_dump(
        {
            "apiVersion": API_VERSION,
            "kind": KIND,
            "spec": {"reservedAnnotations": patterns, "ledgers": []},
        }
    )
    assert parse_policy(text).is_reserved_annotation(key) is reserved


def test_a_slice_implies_the_count_of_its_own_family() -> None:
    policy = load_policy(None)
    assert policy.implied_counts == {
        "nvidia.com/gpucores": "nvidia.com/gpu",
        "nvidia.com/gpumem": "nvidia.com/gpu",
        "nvidia.com/gpumem-percentage": "nvidia.com/gpu",
        "nvidia.com/priority": "nvidia.com/gpu",
        "volcano.sh/vgpu-cores": "volcano.sh/vgpu-number",
        "volcano.sh/vgpu-memory": "volcano.sh/vgpu-number",
        "volcano.sh/vgpu-memory-percentage": "volcano.sh/vgpu-number",
    }


# ------------------------------------------------------------------ exceptions

EXCEPTIONS = """\
apiVersion: gpushare.io/v1alpha1
kind: GPUSharePolicy
metadata: {name: with-exceptions}
spec:
  exceptions:
    - name: legacy-training
      rules: [host-device-access, privileged-gpu]
      namespaces: [ml-legacy, "research-*"]
      reason: the old trainer mounts /dev/nvidia-caps until its rewrite
      owner: ml-platform@example.com
      expires: 2027-03-31
    - name: gpu-operator-validator
      rules: [raw-visible-devices]
      serviceAccounts: [gpu-operator/nvidia-operator-validator]
      reason: the operator's validator sets NVIDIA_VISIBLE_DEVICES=all
      owner: platform
"""


def test_exceptions_compile_with_their_scope_reason_owner_and_last_day() -> None:
    policy = parse_policy(EXCEPTIONS)
    first, second = policy.exceptions
    assert first.name == "legacy-training"
    assert first.rules == {"host-device-access", "privileged-gpu"}
    assert first.namespaces == ("ml-legacy", "research-*")
    # A bare YAML date is the day written, as text.
    assert first.expires == "2027-03-31" and second.expires is None
    assert second.requesters.service_accounts == ("gpu-operator/nvidia-operator-validator",)
    assert first.owner == "ml-platform@example.com" and "nvidia-caps" in first.reason


def test_an_exception_applies_in_its_scope_until_its_last_day() -> None:
    policy = parse_policy(EXCEPTIONS)
    first, second = policy.exceptions

    def trainer(rule: str, *, namespace: str = "research-7", today: str) -> bool:
        return first.covers(rule, namespace=namespace, username="alice", groups=(), today=today)

    assert trainer("privileged-gpu", today="2027-03-31")
    assert not trainer("privileged-gpu", today="2027-04-01")
    assert not trainer("limit-tampering", today="2027-01-01")
    assert not trainer("privileged-gpu", namespace="ml", today="2027-01-01")
    # Without a clock an exception with an end is taken as past it: it only loosens.
    assert not trainer("privileged-gpu", today="")

    def validator(username: str) -> bool:
        return second.covers(
            "raw-visible-devices", namespace="gpu-operator", username=username, groups=(), today=""
        )

    account = "system:serviceaccount:gpu-operator:nvidia-operator-validator"
    assert validator(account) and not validator("alice")
    found = policy.exception_for(
        "raw-visible-devices", namespace="x", username=account, groups=(), today=""
    )
    assert found is second


@pytest.mark.parametrize(
    ("entry", "problem"),
    [
        ("rules: [privileged-gpu]\n      reason: r\n      owner: o", "names no namespaces"),
        (
            "rules: [no-such-rule]\n      namespaces: [a]\n      reason: r\n      owner: o",
            "'no-such-rule' is not one of",
        ),
        (
            "rules: [privileged-gpu]\n      namespaces: [a]\n      owner: o",
            "'reason' is a required",
        ),
        (
            "rules: [privileged-gpu]\n      namespaces: [a]\n      reason: r\n      owner: o\n"
            "      expires: 2027-02-30",
            "'2027-02-30' is no date",
        ),
        (
            "rules: [privileged-gpu]\n      namespaces: [a]\n      reason: r\n      owner: o\n"
            "      podSelector: {app: x}",
            "unknown field",
        ),
    ],
)
def test_a_bad_exception_is_refused_with_its_line(entry: str, problem: str) -> None:
    text = (
        "apiVersion: gpushare.io/v1alpha1\nkind: GPUSharePolicy\nspec:\n  exceptions:\n"
        f"    - name: e\n      {entry}\n"
    )
    with pytest.raises(PolicyError) as raised:
        parse_policy(text)
    assert any(problem in error and error.startswith("line ") for error in raised.value.errors), (
        raised.value.errors
    )


def test_an_exception_named_twice_is_refused() -> None:
    entry = "    - name: e\n      rules: [privileged-gpu]\n      namespaces: [a]\n"
    entry += "      reason: r\n      owner: o\n"
    text = "apiVersion: gpushare.io/v1alpha1\nkind: GPUSharePolicy\nspec:\n  exceptions:\n"
    with pytest.raises(PolicyError) as raised:
        parse_policy(text + entry + entry)
    assert any("e is named twice" in error for error in raised.value.errors)


@pytest.mark.parametrize(
    ("scope", "problem"),
    [
        ('namespaces: ["*"]', "'*' matches every namespace"),
        ('namespaces: ["ML"]', "'ML' matches no namespace"),
        ("groups: [system:authenticated]", "holds every requester of its kind"),
        ('serviceAccounts: ["*/default"]', "names accounts of any namespace"),
        ("serviceAccounts: [kube-system/replicaset-controller]", "add namespaces"),
    ],
)
def test_an_exception_that_reaches_every_tenant_is_refused(scope: str, problem: str) -> None:
    text = (
        "apiVersion: gpushare.io/v1alpha1\nkind: GPUSharePolicy\nspec:\n  exceptions:\n"
        f"    - name: e\n      rules: [privileged-gpu]\n      {scope}\n"
        "      reason: r\n      owner: o\n"
    )
    with pytest.raises(PolicyError) as raised:
        parse_policy(text)
    assert any(problem in error and error.startswith("line 7:") for error in raised.value.errors), (
        raised.value.errors
    )


def test_a_controller_account_within_namespaces_is_a_scope() -> None:
    policy = parse_policy(
        "apiVersion: gpushare.io/v1alpha1\nkind: GPUSharePolicy\nspec:\n  exceptions:\n"
        "    - name: e\n      rules: [privileged-gpu]\n      namespaces: [ml]\n"
        "      serviceAccounts: [kube-system/replicaset-controller]\n"
        "      reason: r\n      owner: o\n"
    )
    assert policy.exceptions[0].namespaces == ("ml",)


@pytest.mark.parametrize("rule", ["invalid-gpu-request", "mode-conflict", "unmutated-gpu-pod"])
def test_no_exception_takes_off_what_the_limits_depend_on(rule: str) -> None:
    # A request the core cannot read, or a mode it cannot honour, gets no limits.
    text = (
        "apiVersion: gpushare.io/v1alpha1\nkind: GPUSharePolicy\nspec:\n  exceptions:\n"
        f"    - name: e\n      rules: [{rule}]\n      namespaces: [ml]\n"
        "      reason: r\n      owner: o\n"
    )
    with pytest.raises(PolicyError) as raised:
        parse_policy(text)
    assert any(f"'{rule}' is not one of" in error for error in raised.value.errors)


def test_a_blank_reason_is_none() -> None:
    text = (
        "apiVersion: gpushare.io/v1alpha1\nkind: GPUSharePolicy\nspec:\n  exceptions:\n"
        "    - name: e\n      rules: [privileged-gpu]\n      namespaces: [ml]\n"
        "      reason: '  '\n      owner: o\n"
    )
    with pytest.raises(PolicyError):
        parse_policy(text)
