"""The CEL rules as ValidatingAdmissionPolicies (webhook/render/validating.py): rendering,
the generated deploy file, the manifests command. Their verdicts are proven against a real
kube-apiserver in tests/e2e/test_celpolicy.py."""

from __future__ import annotations

import fnmatch
import io
import re
from contextlib import redirect_stdout
from typing import Any

import pytest
import yaml
from hypothesis import given
from hypothesis import strategies as st

from tests.paths import DEFAULT_POLICY_FILE, ROOT
from webhook.cli import main
from webhook.core.policy import RULE_IDS, Policy
from webhook.install import manifests
from webhook.install.fingerprint import ANNOTATION, spec_fingerprint, stamp
from webhook.policies import DEFAULT_POLICY, parse_policy
from webhook.render import claims, messages, requests, validating, variables
from webhook.render.cel import glob_regex, printed
from webhook.render.scope import match_conditions
from webhook.render.validating import RULES, validating_policies

CUSTOM = parse_policy(
    """
apiVersion: gpushare.io/v1alpha1
kind: GPUSharePolicy
spec:
  rules:
    privileged-gpu: warn
    node-name-pinning: audit
    raw-visible-devices: off
  reservedAnnotations: [example.io/alloc-*, example.io/node, "example.io/[!x-z]zone[a-c]"]
  modes:
    nodeSelectors: [{key: gpu-type, value: shared, mode: mps}]
    namespaces: {mps: [mps-team]}
  reservedAnnotationWriters:
    serviceAccounts: [kube-system/alloc-*]
  exemptions:
    namespaces: [batch-*, ops]
    users: [root]
    groups: [admins]
    serviceAccounts: [tools/ci]
"""
)

# Per-mode schedulers beside per-resource ones, one naming the default (not moot with a
# mode entry), and a namespace that chooses a mode; mps and mig each allowed in some
# namespaces only, and maxima per container and pod.
MODE_SCHEDULERS = parse_policy(
    """
apiVersion: gpushare.io/v1alpha1
kind: GPUSharePolicy
spec:
  schedulerName:
    mps: default-scheduler
    vgpu: my-scheduler
    nvidia.com/gpucores: hami-scheduler
  modes:
    namespaces: {mps: [mps-team]}
    allowedNamespaces: {mps: [mps-*], mig: [cel-*]}
  rules:
    gpu-quota: deny
  # Whole GPUs through DRA: such a pod keeps the cluster's own scheduler.
  wholeGpus:
    draResources: [nvidia.com/gpu]
  limits:
    perContainer: {gpus: 2, memoryMiB: 6000, cores: 50}
    perPod: {gpus: 3, memoryMiB: 8000}
"""
)


def identity(obj: manifests.Obj) -> tuple[str, str]:
    return obj["kind"], obj["metadata"]["name"]


def by_kind(objects: list[manifests.Obj], kind: str) -> dict[str, manifests.Obj]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def test_base_file_is_what_the_generator_makes() -> None:
    """deploy/base/celpolicies.yaml is generated; fix with hack/update-match-conditions."""
    text = (ROOT / "deploy" / "base" / manifests.CEL_POLICIES_FILE).read_text("utf-8")
    fingerprint = spec_fingerprint(DEFAULT_POLICY_FILE.read_text("utf-8"))
    assert text == manifests.cel_policies_text(DEFAULT_POLICY, fingerprint=fingerprint), (
        "run hack/update-match-conditions"
    )
    wanted = validating_policies(DEFAULT_POLICY)
    stamp(wanted, fingerprint)
    assert [o for o in yaml.safe_load_all(text) if o] == wanted


def validations_by_rule(policy: manifests.Obj) -> dict[str, manifests.Obj]:
    """A ValidatingAdmissionPolicy's validations by the rule id their message starts with."""
    found = {}
    for validation in policy["spec"]["validations"]:
        rule = re.fullmatch(r"\[([a-z-]+)\] .+", validation["message"])
        assert rule is not None, validation["message"]
        found[rule.group(1)] = validation
    return found


def test_one_policy_and_binding_per_action_holding_its_rules() -> None:
    objects = pod_policies(validating_policies(DEFAULT_POLICY))
    policies = by_kind(objects, "ValidatingAdmissionPolicy")
    bindings = by_kind(objects, "ValidatingAdmissionPolicyBinding")
    # The default policy denies: one policy holds every rule, in RULES order.
    assert set(policies) == set(bindings) == {"gpushare-deny"}
    assert set(RULES) <= set(RULE_IDS)
    spec = policies["gpushare-deny"]["spec"]
    assert spec["failurePolicy"] == "Fail"
    # gpu-quota is off until a policy sets limits.
    rendered = [r for r in RULES if r != "gpu-quota"]
    assert list(validations_by_rule(policies["gpushare-deny"])) == rendered
    assert list(validating.rule_expressions(DEFAULT_POLICY)) == rendered
    expressions = validating.rule_expressions(DEFAULT_POLICY)
    for rule, validation in validations_by_rule(policies["gpushare-deny"]).items():
        # Printed for people to read: the same tokens, in lines.
        assert validation["expression"] == printed(expressions[rule])
        assert validation["message"] == f"[{rule}] {messages.MESSAGES[rule]}"
        assert validation["reason"] == "Forbidden"
    # The shared variables (the MutatingAdmissionPolicies read them too) first,
    # then what only the validations read.
    names = [v["name"] for v in spec["variables"]]
    assert names[: len(variables.variables(DEFAULT_POLICY))] == [
        v["name"] for v in variables.variables(DEFAULT_POLICY)
    ]
    # No rule is evaluated outside the webhooks' scope: their condition comes first.
    assert spec["matchConditions"][: len(match_conditions(DEFAULT_POLICY))] == list(
        match_conditions(DEFAULT_POLICY)
    )
    binding = bindings["gpushare-deny"]["spec"]
    assert binding["policyName"] == "gpushare-deny"
    assert binding["validationActions"] == ["Deny"]
    selector = binding["matchResources"]["namespaceSelector"]["matchExpressions"][0]
    assert selector["values"] == ["kube-system", "gpushare-system"]
    # The default policy exempts nobody: the scope is the only condition.
    assert all(
        p["spec"]["matchConditions"] == list(match_conditions(DEFAULT_POLICY))
        for p in policies.values()
    )


def pod_policies(objects: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The policies (and bindings) of pods and workloads' rules, not of their sources nor
    the mutation's warnings."""
    return [
        o
        for o in objects
        if not o["metadata"]["name"].endswith(validating.SOURCES_SUFFIX)
        and o["metadata"]["name"] != validating.OVERRIDES_POLICY
    ]


def test_sources_are_guarded_by_policies_of_their_own() -> None:
    objects = validating_policies(CUSTOM)
    sources = by_kind(
        [o for o in objects if o["metadata"]["name"].endswith(validating.SOURCES_SUFFIX)],
        "ValidatingAdmissionPolicy",
    )
    # raw-visible-devices is off in CUSTOM: only gpu-claim (deny) is left.
    assert list(sources) == ["gpushare-deny-sources"]
    spec = sources["gpushare-deny-sources"]["spec"]
    assert list(validations_by_rule(sources["gpushare-deny-sources"])) == ["gpu-claim"]
    # Only gpu-claim's own variables: a ConfigMap write reads none of the pod rules'.
    assert [v["name"] for v in spec["variables"]] == [
        v["name"] for v in claims.written_claim_variables(CUSTOM)
    ]
    assert spec["matchConditions"][0]["expression"].startswith("has(object.data)")
    resources = {r for rule in spec["matchConstraints"]["resourceRules"] for r in rule["resources"]}
    assert resources == {
        "configmaps",
        "secrets",
        "resourceclaims",
        "resourceclaimtemplates",
        "deviceclasses",
    }
    names = {o["metadata"]["name"] for o in validating_policies(DEFAULT_POLICY)}
    assert names == {"gpushare-deny", "gpushare-deny-sources", "gpushare-overrides"}
    assert names <= set(validating.POLICY_NAMES)


def test_actions_map_to_validation_actions_and_off_is_left_out() -> None:
    objects = pod_policies(validating_policies(CUSTOM))
    policies = by_kind(objects, "ValidatingAdmissionPolicy")
    bindings = by_kind(objects, "ValidatingAdmissionPolicyBinding")
    assert list(policies) == list(bindings) == ["gpushare-deny", "gpushare-warn", "gpushare-audit"]
    assert set(policies) <= set(validating.POLICY_NAMES)
    actions = {name: b["spec"]["validationActions"] for name, b in bindings.items()}
    assert actions == {
        "gpushare-deny": ["Deny"],
        # A warning is recorded in the apiserver's audit log too, as the webhook records it.
        "gpushare-warn": ["Warn", "Audit"],
        "gpushare-audit": ["Audit"],
    }
    rules = {name: list(validations_by_rule(p)) for name, p in policies.items()}
    assert rules["gpushare-warn"] == ["privileged-gpu"]
    assert rules["gpushare-audit"] == ["node-name-pinning"]
    assert rules["gpushare-deny"] == [
        r
        for r in RULES
        if r not in ("privileged-gpu", "node-name-pinning", "raw-visible-devices", "gpu-quota")
    ]
    # The shared parts are the same in every policy (the warn and audit policies add the
    # variables their per-rule audit annotations read).
    specs = [p["spec"] for p in policies.values()]
    for key in ("matchConstraints", "matchConditions", "failurePolicy"):
        assert all(spec[key] == specs[0][key] for spec in specs), key
    shared = [
        v["name"] for v in [*variables.variables(CUSTOM), *requests.request_variables(CUSTOM)]
    ]
    assert all(
        spec["variables"][: len(shared)] == specs[0]["variables"][: len(shared)] for spec in specs
    )
    own = validating.rule_variables(CUSTOM)
    for name, spec in zip(policies, specs, strict=True):
        names = [v["name"] for v in spec["variables"]]
        assert names[: len(shared)] == shared
        # A rule's own variables only where the rule is.
        assert {n for n in names[len(shared) :] if not n.startswith("holds_")} == {
            v["name"] for rule in rules[name] for v in own.get(rule, [])
        }, name


def test_exemptions_and_writers_are_rendered() -> None:
    policies = by_kind(validating_policies(CUSTOM), "ValidatingAdmissionPolicy")
    spec = policies["gpushare-deny"]["spec"]
    conditions = {c["name"]: c["expression"] for c in spec["matchConditions"]}
    namespace = conditions["gpushare.io/namespace-not-exempt"]
    assert '"ops"' in namespace and glob_regex("batch-*") in namespace.replace("\\\\", "\\")
    user = conditions["gpushare.io/user-not-exempt"]
    assert '"root"' in user and '"admins"' in user and "tools/ci" in user
    expression = validations_by_rule(policies["gpushare-deny"])["forged-allocation"]["expression"]
    assert "system:serviceaccount:" in expression and "alloc" in expression


@given(
    st.text(alphabet="ab*?[]!-/.\\", max_size=8),
    st.text(alphabet="ab-/.[]!\\\n", max_size=8),
)
def test_glob_regex_matches_what_fnmatch_matches(pattern: str, value: str) -> None:
    # RE2's "$" (no multi-line flag) is Python's "\Z".
    regex = glob_regex(pattern)
    assert regex.endswith("$")
    # RE2's \x{HH} is Python's \U000000HH.
    python = re.sub(r"\\x\{([0-9a-f]+)\}", lambda m: f"\\U{int(m[1], 16):08x}", regex[:-1])
    matched = re.search(python + r"\Z", value) is not None
    assert matched == fnmatch.fnmatchcase(value, pattern), regex


def test_render_with_a_policy_and_namespace_moves_the_cel_policies() -> None:
    objects = manifests.render(policy=CUSTOM, namespace="gpu-admission")
    rendered = [o for o in objects if o["kind"] in validating.KINDS]
    wanted = validating_policies(CUSTOM, namespace="gpu-admission")
    # Marked as rendered from the policy the ConfigMap holds.
    stamp(wanted, spec_fingerprint(manifests.policy_yaml(CUSTOM)))
    assert sorted(rendered, key=identity) == sorted(wanted, key=identity)
    default = [o for o in manifests.render() if o["kind"] in validating.KINDS]
    wanted = validating_policies(DEFAULT_POLICY)
    stamp(wanted, spec_fingerprint(DEFAULT_POLICY_FILE.read_text("utf-8")))
    assert sorted(default, key=identity) == sorted(wanted, key=identity)


def test_manifests_only_cel_prints_just_the_policies() -> None:
    out = io.StringIO()
    with redirect_stdout(out):
        code = main(["manifests", "--only", "cel", "--namespace", "gpu-admission"])
    assert code == 0
    objects = [o for o in yaml.safe_load_all(out.getvalue()) if o]
    wanted = validating_policies(DEFAULT_POLICY, namespace="gpu-admission")
    stamp(wanted, spec_fingerprint(DEFAULT_POLICY_FILE.read_text("utf-8")))
    assert objects == wanted
    assert {o["metadata"]["annotations"][ANNOTATION] for o in objects} == {
        spec_fingerprint(DEFAULT_POLICY_FILE.read_text("utf-8"))
    }


def test_the_scheduler_rule_asks_the_mode_only_after_the_resources() -> None:
    """As Policy.scheduler_for: the resource branches first, then each mode's scheduler on
    the mode the policy's variables choose, then the default."""
    expression = validating.rule_expressions(MODE_SCHEDULERS)["scheduler-bypass"]
    assert "variables.spec.schedulerName == (variables.scheduler)" in expression
    shared = {v["name"]: v["expression"] for v in variables.variables(MODE_SCHEDULERS)}
    wanted = shared["scheduler"]
    resource = wanted.index('? "hami-scheduler"')
    mps = wanted.index('variables.chosenMode == "mps" ? "default-scheduler"')
    vgpu = wanted.index('variables.chosenMode == "vgpu" ? "my-scheduler"')
    assert resource < mps and resource < vgpu
    assert wanted.rindex('"hami-scheduler"') > max(mps, vgpu)  # the default comes last
    # The mode variable covers what the core's choice reads: annotations, node
    # selectors, MIG resources, namespaces.
    mode = shared["chosenMode"]
    assert "variables.annotatedMode" in mode
    assert all(
        f'"{key}" in variables.annotations' in shared["annotatedMode"]
        for key in MODE_SCHEDULERS.mode_annotations
    )
    assert '"ack.node.gpu.schedule"' in mode and "variables.mig" in mode
    assert 'request.namespace in ["mps-team"]' in mode


def test_without_mode_entries_the_scheduler_rule_ignores_the_mode() -> None:
    wanted = {v["name"]: v["expression"] for v in variables.variables(DEFAULT_POLICY)}["scheduler"]
    assert "variables.mode" not in wanted
    plain = parse_policy(
        "apiVersion: gpushare.io/v1alpha1\nkind: GPUSharePolicy\nspec:\n  schedulerName: one\n"
    )
    assert "variables.mode ==" not in validating.rule_expressions(plain)["scheduler-bypass"]


# host-device-access under a policy whose paths are not the default's: an allow list with
# a trailing slash, protected paths spelled oddly, the preload as a file, other lock,
# library and pipe directories.
HOST_PATHS = parse_policy(
    """
apiVersion: gpushare.io/v1alpha1
kind: GPUSharePolicy
spec:
  vgpu:
    preload: file
    libraryHostPath: /opt/vgpu/lib/libvgpu.so
    preloadHostPath: /opt/vgpu/lib/ld.so.preload
    lockHostPath: /var/tmp/vgpulock
  mps:
    pipeDirectory: /run/mps-pipe
  hostPaths:
    mode: allowlist
    allowed: [/data/, /mnt/datasets, /srv]
    protected: [/srv/gpu//secrets/, /home/shared]
    driverRoots: [/opt/drv//nvidia/, /home/kubernetes/bin/nvidia]
"""
)


def rule_text(policy: Policy, rule: str, *, old: bool = True) -> str:
    """``rule``'s expression and those of the variables it alone reads (without ``old``,
    not the old pod's pieces)."""
    pieces = [
        v["expression"]
        for v in validating.rule_variables(policy).get(rule, [])
        if old or not re.fullmatch("old[A-Z].*", v["name"])
    ]
    return "\n".join([validating.rule_expressions(policy)[rule], *pieces])


def test_host_device_access_renders_the_policys_paths() -> None:
    expression = rule_text(HOST_PATHS, "host-device-access")
    # Protected roots normalised, with the directories above them.
    for text in ('"/srv/gpu/secrets"', 'startsWith("/srv/gpu/secrets/")', '"/srv/gpu"'):
        assert text in expression
    # The library's directory, the lock and pipe directories: not the default's.
    assert 'startsWith("/opt/vgpu/lib/")' in expression and '"/var/tmp/vgpulock"' in expression
    assert '"/run/mps-pipe"' in expression and '"/var/tmp/vgpulock/"' in expression
    # HAMi-core's own lock directory is read inside the container whatever the policy.
    assert 'q.startsWith("/tmp/vgpulock/")' in expression
    # The allow list as the core's _within reads it: "/data/" is matched as written.
    assert 'h.path in ["/data/", "/mnt/datasets", "/srv"]' in expression
    assert 'startsWith("/data/")' in expression and 'startsWith("/srv/")' in expression
    # The preload file is injected, so exempt when exact.
    assert '"/opt/vgpu/lib/ld.so.preload"' in expression
    # Driver roots normalised, with the directories above them.
    for text in ('startsWith("/opt/drv/nvidia/")', '"/opt/drv"', '"/home/kubernetes/bin"'):
        assert text in expression


def test_host_device_access_in_denylist_mode_has_no_allow_list() -> None:
    expression = rule_text(DEFAULT_POLICY, "host-device-access")
    # In denylist mode only the host namespaces ask whether the pod asks for a GPU.
    assert "variables.gpu" not in rule_text(
        DEFAULT_POLICY, "host-device-access", old=False
    ).replace("variables.gpu && ((has(variables.spec.hostPID)", "")
    # preload: env injects no file; HAMi's device plugin still mounts one in containers.
    assert '"/usr/local/vgpu/ld.so.preload"' not in expression
    assert 'q == "/etc/ld.so.preload"' in expression or '"/etc/ld.so.preload"' in expression
    # Mount and device paths with a ".." segment are refused where they name something
    # the GPU stack reads; hostPaths need no such guard (the apiserver refuses them).
    assert expression.count("s == '..'") == 4  # new and old pod, mountPath and devicePath


# The request rules under a policy with maxima, per-mode namespaces and the preload as a
# file (policies/examples/strict.yaml).
STRICT = parse_policy((ROOT / "policies" / "examples" / "strict.yaml").read_text("utf-8"))


def test_the_request_rules_are_rendered_where_the_core_reads_only_the_pod() -> None:
    """invalid-gpu-request, mode-conflict and unmutated-gpu-pod under every policy,
    gpu-quota only under a policy that sets maxima and does not turn it off."""
    default = validating.rule_expressions(DEFAULT_POLICY)
    for rule in ("invalid-gpu-request", "mode-conflict", "unmutated-gpu-pod"):
        assert rule in default, rule
        assert default[rule].startswith("!(variables.created && "), rule
    assert "gpu-quota" not in default
    strict = validating.rule_expressions(STRICT)
    assert list(strict) == list(RULES)
    quota = strict["gpu-quota"]
    for limit in (2, 40960, 100, 4, 81920):
        assert f"> {limit}" in quota, limit
    # Sidecars run beside the main containers, plain init containers before them.
    asks = {v["name"]: v["expression"] for v in requests.request_variables(STRICT)}
    assert "restartPolicy" in asks["initAsks"]
    off = parse_policy(
        "apiVersion: gpushare.io/v1alpha1\nkind: GPUSharePolicy\nspec:\n"
        "  rules: {gpu-quota: 'off'}\n  limits: {perPod: {gpus: 1}}\n"
    )
    policies = by_kind(validating_policies(off), "ValidatingAdmissionPolicy")
    assert "gpu-quota" not in validations_by_rule(policies["gpushare-deny"])


def test_invalid_gpu_request_holds_each_resource_to_its_unit() -> None:
    expression = rule_text(DEFAULT_POLICY, "invalid-gpu-request")
    # MiB up to 512 GiB, GiB as well (above 1024 read as MiB), percentages and counts;
    # binary suffixes out.
    for bound in ("? 524288", "? 100", "? 64", "<= high", "endsWith('i')"):
        assert bound in expression, bound
    assert "1024" not in expression
    assert "isQuantity(" in expression and "compareTo(" in expression
    # What the requests amount to: GiB times 1024 up to 1024, MiB from 1025.
    asks = {v["name"]: v["expression"] for v in requests.request_variables(DEFAULT_POLICY)}
    for bound in ("<= 1024 ? N[1] * 1024", "N[1] >= 1025"):
        assert bound in asks["mainAsks"], bound


def test_mode_conflict_renders_the_policys_namespaces_per_mode() -> None:
    strict = rule_text(STRICT, "mode-conflict")
    assert '"gpu-mps"' in strict
    assert glob_regex("gpu-mps-*") in strict.replace("\\\\", "\\")
    # Every namespace may use every mode under the default policy: nothing to test.
    default = rule_text(DEFAULT_POLICY, "mode-conflict")
    assert "request.namespace" not in default
    # The percentage an mps pod cannot be capped by without the cluster view.
    assert "variables.mode == 'mps' && variables.asks.exists(a, " in default
    assert "a['pct'] > 0 && a['m'] == 0" in default


def test_unmutated_gpu_pod_asks_for_what_the_policys_mutation_injects() -> None:
    default = rule_text(DEFAULT_POLICY, "unmutated-gpu-pod")
    strict = rule_text(STRICT, "unmutated-gpu-pod")
    for name in ("CUDA_DEVICE_MEMORY_LIMIT_", "CUDA_DEVICE_SM_LIMIT", "CUDA_MPS_PIPE_DIRECTORY"):
        assert name in default and name in strict, name
    # preload: env prepends the library; preload: file mounts ld.so.preload, and puts the
    # library first only in an LD_PRELOAD the container sets.
    assert "LD_PRELOAD" in default and "names.lastIndexOf('LD_PRELOAD') < 0 ||" not in default
    assert "names.lastIndexOf('LD_PRELOAD') < 0 ||" in strict
    assert "/etc/ld.so.preload" in strict and "/etc/ld.so.preload" not in default
    assert '"force"' in strict  # strict's coreUtilizationPolicy
    # No stricter than the webhook with its cluster view: the per-GPU memory limits of a
    # percentage, which only the view turns into MiB, are never stray.
    assert "a['pct'] > 0) && n.matches('^CUDA_DEVICE_MEMORY_LIMIT_" in default
    assert "variables.scheduler" in default and "hostIPC" in default


def test_warn_and_audit_rules_record_each_failure_in_the_apiservers_audit_log() -> None:
    """The apiserver keeps one validation_failure annotation per request, its first: the
    warn and audit policies also carry one auditAnnotation per rule, and a warn binding
    audits too, so an audit-first rollout reads every rule from the apiserver's log."""
    policy = parse_policy(
        "apiVersion: gpushare.io/v1alpha1\nkind: GPUSharePolicy\nspec:\n  rules:\n"
        "    privileged-gpu: audit\n    node-name-pinning: audit\n"
        "    host-device-access: warn\n    raw-visible-devices: audit\n",
        source="rollout",
    )
    objects = validating_policies(policy)
    policies = by_kind(objects, "ValidatingAdmissionPolicy")
    bindings = by_kind(objects, "ValidatingAdmissionPolicyBinding")
    assert bindings["gpushare-warn"]["spec"]["validationActions"] == ["Warn", "Audit"]
    assert bindings["gpushare-audit"]["spec"]["validationActions"] == ["Audit"]
    expressions = validating.rule_expressions(policy)
    for name, rules in (
        ("gpushare-audit", ["privileged-gpu", "node-name-pinning", "raw-visible-devices"]),
        ("gpushare-warn", ["host-device-access"]),
    ):
        annotations = policies[name]["spec"]["auditAnnotations"]
        assert [a["key"] for a in annotations] == [r for r in expressions if r in rules]
        held = {v["name"]: v["expression"] for v in policies[name]["spec"]["variables"]}
        for annotation in annotations:
            rule = annotation["key"]
            variable = validating.holds_variable(rule)
            # The rule's expression in a variable: a valueExpression holds 5120 bytes.
            assert held[variable] == printed(expressions[rule])
            value = " ".join(annotation["valueExpression"].split())
            assert value.startswith(f"!variables.{variable} ? ")
            assert value.endswith(" : ''")
            assert f"[{rule}] " in annotation["valueExpression"]
            assert len(annotation["valueExpression"]) <= 5120
    assert "auditAnnotations" not in policies["gpushare-deny"]["spec"]
    sources = policies["gpushare-audit-sources"]["spec"]["auditAnnotations"]
    assert [a["key"] for a in sources] == ["raw-visible-devices"]


@pytest.mark.parametrize(
    ("action", "actions"),
    [("deny", ["Warn"]), ("warn", ["Warn"]), ("audit", ["Audit"]), ("off", None)],
)
def test_what_the_mutation_replaced_is_warned_as_limit_tampering_acts(
    action: str, actions: list[str] | None
) -> None:
    """The core warns what its mutation replaced under limit-tampering, deny at most
    warning: so does the override policy, and it says nothing when the rule is off."""
    text = (ROOT / "policies" / "default.yaml").read_text()
    document = yaml.safe_load(text)
    document["spec"].setdefault("rules", {})["limit-tampering"] = action
    objects = validating_policies(parse_policy(yaml.safe_dump(document)))
    named = [o for o in objects if o["metadata"]["name"] == validating.OVERRIDES_POLICY]
    if actions is None:
        assert not named
        return
    binding = by_kind(named, "ValidatingAdmissionPolicyBinding")[validating.OVERRIDES_POLICY]
    assert binding["spec"]["validationActions"] == actions
    spec = by_kind(named, "ValidatingAdmissionPolicy")[validating.OVERRIDES_POLICY]["spec"]
    # A CEL error never blocks a pod for a warning.
    assert spec["failurePolicy"] == "Ignore"
    assert len(spec["validations"]) == validating.MAX_OVERRIDE_WARNINGS
