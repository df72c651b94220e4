"""The CEL rules as ValidatingAdmissionPolicies (webhook/install/celpolicy.py): rendering,
the generated deploy file, the manifests command. Their verdicts are proven against a real
kube-apiserver in tests/e2e/test_celpolicy.py."""

from __future__ import annotations

import fnmatch
import io
import re
from contextlib import redirect_stdout

import yaml
from hypothesis import given
from hypothesis import strategies as st

from tests.paths import ROOT
from webhook.cli import main
from webhook.core.policy import RULE_IDS
from webhook.install import celpolicy, manifests
from webhook.install.celpolicy import RULES, glob_regex, validating_policies
from webhook.policies import DEFAULT_POLICY, parse_policy

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


def identity(obj: manifests.Obj) -> tuple[str, str]:
    return obj["kind"], obj["metadata"]["name"]


def by_kind(objects: list[manifests.Obj], kind: str) -> dict[str, manifests.Obj]:
    return {o["metadata"]["name"]: o for o in objects if o["kind"] == kind}


def test_base_file_is_what_the_generator_makes() -> None:
    """deploy/base/celpolicies.yaml is generated; fix with hack/update-match-conditions."""
    text = (ROOT / "deploy" / "base" / manifests.CEL_POLICIES_FILE).read_text("utf-8")
    assert text == manifests.cel_policies_text(DEFAULT_POLICY), "run hack/update-match-conditions"
    assert [o for o in yaml.safe_load_all(text) if o] == validating_policies(DEFAULT_POLICY)


def test_one_policy_and_binding_per_rendered_rule_with_its_action() -> None:
    objects = validating_policies(DEFAULT_POLICY)
    policies = by_kind(objects, "ValidatingAdmissionPolicy")
    bindings = by_kind(objects, "ValidatingAdmissionPolicyBinding")
    assert set(policies) == set(bindings) == {f"gpushare-{rule}" for rule in RULES}
    assert set(RULES) <= set(RULE_IDS)
    for rule in RULES:
        spec = policies[f"gpushare-{rule}"]["spec"]
        assert spec["failurePolicy"] == "Fail"
        (validation,) = spec["validations"]
        assert validation["message"].startswith(f"[{rule}] ")
        binding = bindings[f"gpushare-{rule}"]["spec"]
        assert binding["policyName"] == f"gpushare-{rule}"
        assert binding["validationActions"] == ["Deny"]
        selector = binding["matchResources"]["namespaceSelector"]["matchExpressions"][0]
        assert selector["values"] == ["kube-system", "gpushare-system"]
    # The default policy exempts nobody.
    assert all("matchConditions" not in p["spec"] for p in policies.values())


def test_actions_map_to_validation_actions_and_off_is_left_out() -> None:
    bindings = by_kind(validating_policies(CUSTOM), "ValidatingAdmissionPolicyBinding")
    assert bindings["gpushare-privileged-gpu"]["spec"]["validationActions"] == ["Warn"]
    assert bindings["gpushare-node-name-pinning"]["spec"]["validationActions"] == ["Audit"]
    assert "gpushare-raw-visible-devices" not in bindings
    assert bindings["gpushare-forged-allocation"]["spec"]["validationActions"] == ["Deny"]


def test_exemptions_and_writers_are_rendered() -> None:
    policies = by_kind(validating_policies(CUSTOM), "ValidatingAdmissionPolicy")
    spec = policies["gpushare-forged-allocation"]["spec"]
    conditions = {c["name"]: c["expression"] for c in spec["matchConditions"]}
    namespace = conditions["gpushare.io/namespace-not-exempt"]
    assert '"ops"' in namespace and glob_regex("batch-*") in namespace.replace("\\\\", "\\")
    user = conditions["gpushare.io/user-not-exempt"]
    assert '"root"' in user and '"admins"' in user and "tools/ci" in user
    expression = spec["validations"][0]["expression"]
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
    rendered = [o for o in objects if o["kind"] in celpolicy.KINDS]
    assert sorted(rendered, key=identity) == sorted(
        validating_policies(CUSTOM, namespace="gpu-admission"), key=identity
    )
    default = [o for o in manifests.render() if o["kind"] in celpolicy.KINDS]
    assert sorted(default, key=identity) == sorted(
        validating_policies(DEFAULT_POLICY), key=identity
    )


def test_manifests_only_cel_prints_just_the_policies() -> None:
    out = io.StringIO()
    with redirect_stdout(out):
        code = main(["manifests", "--only", "cel", "--namespace", "gpu-admission"])
    assert code == 0
    objects = [o for o in yaml.safe_load_all(out.getvalue()) if o]
    assert objects == validating_policies(DEFAULT_POLICY, namespace="gpu-admission")
