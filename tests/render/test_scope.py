"""The webhooks' matchConditions: generated from the policy, written into deploy/base,
rendered by `manifests`. What they let through is proven against a real apiserver in
tests/e2e/test_scope.py; here is what can be checked without one."""

from __future__ import annotations

import io
import re
from contextlib import redirect_stdout
from pathlib import Path

import pytest
import yaml

from tests.paths import DEFAULT_POLICY_FILE, ROOT
from webhook.cli import main
from webhook.core.workload import TEMPLATE_PATHS
from webhook.install import manifests
from webhook.install.fingerprint import spec_fingerprint
from webhook.install.manifests import ManifestError, with_match_conditions
from webhook.policies import DEFAULT_POLICY, parse_policy
from webhook.render.cel import literal
from webhook.render.scope import annotation_prefixes, match_conditions

BASE = ROOT / "deploy" / "webhooks" / "webhookconfigurations.yaml"
# A qualified name, as the apiserver validates matchCondition names.
QUALIFIED = re.compile(
    r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?"
    r"[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
)
CUSTOM = parse_policy(
    """
apiVersion: gpushare.io/v1alpha1
kind: GPUSharePolicy
spec:
  resources:
    count: [example.com/vgpu]
    migPrefixes: [example.com/mig-, nvidia.com/mig-]
  reservedAnnotations: [example.io/alloc-*, example.io/node, hami.io/vgpu-node]
"""
)


def hooks_of(objects: list[manifests.Obj]) -> list[manifests.Obj]:
    return [h for o in objects if o["kind"] in manifests.WEBHOOK_KINDS for h in o["webhooks"]]


def test_base_file_holds_the_default_policys_conditions() -> None:
    hooks = hooks_of([d for d in yaml.safe_load_all(BASE.read_text()) if d])
    assert [h["name"] for h in hooks] == ["mutate.gpushare.io", "validate.gpushare.io"]
    expected = [dict(c) for c in match_conditions(DEFAULT_POLICY)]
    for hook in hooks:
        assert hook["matchConditions"] == expected, (
            "deploy/webhooks/webhookconfigurations.yaml is not what the generator makes for the "
            "default policy; run\n    hack/update-match-conditions"
        )
    # Byte for byte what the script writes: it leaves the file alone.
    text = BASE.read_text()
    assert with_match_conditions(text, match_conditions(DEFAULT_POLICY)) == text


def test_conditions_fit_the_apiserver() -> None:
    for policy in (DEFAULT_POLICY, CUSTOM):
        conditions = match_conditions(policy)
        # One condition: the apiserver's cost is per condition (64 at most).
        assert [c["name"] for c in conditions] == ["gpushare.io/gpu-relevant"]
        assert QUALIFIED.match(conditions[0]["name"])
        for condition in conditions:
            # Parentheses balance outside string literals (a cheap syntax check; the
            # apiserver compiles them in tests/e2e).
            code = re.sub(r'"(?:[^"\\]|\\.)*"', '""', condition["expression"])
            assert code.count("(") == code.count(")")
            assert "object." in code


def test_every_kind_the_core_reads_is_scoped() -> None:
    """A kind the conditions read is "relevant by its pod spec or metadata", any other is
    sent: a kind the core reads without its path would be sent always (safe), one with a
    wrong path never (a bypass)."""
    expressions = " ".join(c["expression"] for c in match_conditions(DEFAULT_POLICY))
    assert "request.kind.kind == 'Pod'" in expressions
    assert "!(request.kind.kind in [" in expressions
    for kind, path in TEMPLATE_PATHS.items():
        assert f'"{kind}"' in expressions
        assert "has(object." + ".".join(path) + ".spec)" in expressions
        assert "has(object." + ".".join(path) + ".metadata)" in expressions


def test_policy_vocabulary_is_in_the_conditions() -> None:
    expression = " ".join(c["expression"] for c in match_conditions(CUSTOM))
    for resource in CUSTOM.gpu_resources:
        assert literal(resource) in expression
    assert 'startsWith("example.com/mig-")' in expression
    assert 'startsWith("nvidia.com/mig-")' in expression
    assert 'startsWith("example.io/alloc-")' in expression
    # Exact reserved keys the default's hami.io/ prefix does not cover.
    assert '"example.io/node"' in expression
    assert "oldObject.metadata.annotations" in expression
    for fixed in (
        "CUDA_VERSION",
        "NVIDIA_",
        "nvidia-container-devices",
        "cdi.k8s.io",
        "cdi-devices.",
    ):
        assert fixed in expression


def test_gpu_runtime_classes_are_in_the_conditions() -> None:
    """A pod under a GPU runtime class is voided or refused whatever else it holds, so
    the class alone sends it; a policy without classes sends nothing for it."""
    expression = " ".join(c["expression"] for c in match_conditions(DEFAULT_POLICY))
    assert "spec.runtimeClassName in " in expression
    for name in DEFAULT_POLICY.gpu_runtime_classes:
        assert literal(name) in expression
    none = parse_policy(
        "apiVersion: gpushare.io/v1alpha1\nkind: GPUSharePolicy\n"
        "spec:\n  runtimeClasses: {gpu: []}\n"
    )
    assert "runtimeClassName" not in " ".join(c["expression"] for c in match_conditions(none))


@pytest.mark.parametrize(
    ("patterns", "prefixes", "exact"),
    [
        ([], [], []),
        (["hami.io/vgpu-node"], [], ["hami.io/vgpu-node"]),
        (["hami.io/*-allocated", "hami.io/vgpu-node"], ["hami.io/"], []),
        (["a/b?c", "a/[xy]z", "a/bc*"], ["a/"], []),
        (["x/*", "x/y/*", "z"], ["x/"], ["z"]),
        (["*suffix"], [""], []),
    ],
)
def test_annotation_globs_become_key_prefixes(
    patterns: list[str], prefixes: list[str], exact: list[str]
) -> None:
    assert annotation_prefixes(patterns) == (prefixes, exact)


def test_a_glob_that_starts_with_a_wildcard_sends_every_annotated_object() -> None:
    policy = parse_policy(
        "apiVersion: gpushare.io/v1alpha1\nkind: GPUSharePolicy\n"
        "spec: {reservedAnnotations: ['*-devices-allocated']}\n"
    )
    expression = " ".join(c["expression"] for c in match_conditions(policy))
    assert "size(meta.annotations) > 0" in expression
    assert "size(oldObject.metadata.annotations) > 0" in expression


def test_literals_escape_what_a_policy_may_hold() -> None:
    assert literal('a"b\\c') == '"a\\"b\\\\c"'
    assert literal("tab\there") == '"tab\\there"'
    # Past ASCII, CEL's escapes: \\U for what \\u would need a surrogate pair for.
    assert literal("gpu\U0001f600\u0131\x7f") == '"gpu\\U0001f600\\u0131\\u007f"'


def test_render_and_webhook_configurations_take_the_policy() -> None:
    default = hooks_of(manifests.render())
    assert all(
        h["matchConditions"] == [dict(c) for c in match_conditions(DEFAULT_POLICY)] for h in default
    )
    expected = [dict(c) for c in match_conditions(CUSTOM)]
    for overlay in manifests.OVERLAYS:
        objects = manifests.render(overlay=overlay, policy=CUSTOM)
        custom = hooks_of(objects)
        assert len(custom) == 2
        assert all(h["matchConditions"] == expected for h in custom)
        # The webhook serves the policy the conditions come from.
        (config_map,) = [o for o in objects if o["kind"] == "ConfigMap"]
        assert parse_policy(config_map["data"]["policy.yaml"]).digest == CUSTOM.digest
    with pytest.raises(ValueError, match="policy_text"):
        manifests.render(policy_text="x")
    configured = manifests.webhook_configurations(
        ca_bundle=b"", url="https://127.0.0.1:8443", policy=CUSTOM
    )
    assert all(h["matchConditions"] == expected for h in hooks_of(configured))


def test_generated_region_markers_are_checked() -> None:
    conditions = match_conditions(DEFAULT_POLICY)
    with pytest.raises(ManifestError):
        with_match_conditions("kind: X\n", conditions)
    with pytest.raises(ManifestError):
        with_match_conditions("# BEGIN generated matchConditions\n", conditions)
    with pytest.raises(ManifestError):
        with_match_conditions("# END generated matchConditions\n", conditions)
    text = (
        "a:\n  # BEGIN generated matchConditions\n  stale: 1\n  # END generated matchConditions\n"
    )
    updated = yaml.safe_load(with_match_conditions(text, conditions))
    assert updated == {"a": {"matchConditions": [dict(c) for c in conditions]}}


def test_manifests_command_prints_and_scopes(tmp_path: Path) -> None:
    policy = tmp_path / "policy.yaml"
    policy.write_text(
        "apiVersion: gpushare.io/v1alpha1\nkind: GPUSharePolicy\n"
        "spec: {resources: {count: [example.com/vgpu]}}\n"
    )
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["manifests", "--print-match-conditions"]) == 0
    printed = yaml.safe_load(out.getvalue())
    assert printed == {
        # The fingerprint of the policy the conditions were rendered from.
        "policySpec": spec_fingerprint(DEFAULT_POLICY_FILE.read_text("utf-8")),
        "matchConditions": [dict(c) for c in match_conditions(DEFAULT_POLICY)],
    }
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["manifests", "--policy", str(policy)]) == 0
    rendered = [d for d in yaml.safe_load_all(out.getvalue()) if d]
    for hook in hooks_of(rendered):
        assert '"example.com/vgpu"' in hook["matchConditions"][0]["expression"]
    # The webhook serves the policy the conditions were made from.
    (config_map,) = [o for o in rendered if o["kind"] == "ConfigMap"]
    assert config_map["data"]["policy.yaml"] == policy.read_text()
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["manifests", "--print-match-conditions", "--policy", str(policy)]) == 0
    assert '"example.com/vgpu"' in out.getvalue()
    assert main(["manifests", "--policy", str(tmp_path / "missing.yaml")]) == 2
    policy.write_text("spec: {resources: {count: 1}}\n")
    assert main(["manifests", "--policy", str(policy)]) == 2


def test_set_policy_needs_the_policy_config_map() -> None:
    objects = [o for o in manifests.render() if o["kind"] != "ConfigMap"]
    with pytest.raises(ManifestError):
        manifests.set_policy(objects, CUSTOM, "x")
