"""The install chooses by what the apiserver serves: MutatingAdmissionPolicies and no
webhook in the pod path where MutatingAdmissionPolicy v1 is served (1.36+), the webhooks
elsewhere. Detection against a real apiserver: tests/e2e/test_modes.py."""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.paths import DEFAULT_POLICY_FILE, ROOT, documentation
from webhook.cli import main
from webhook.cli import manifests as cli_manifests
from webhook.install import manifests
from webhook.install.fingerprint import spec_fingerprint, stamp
from webhook.install.mode import (
    APISERVER,
    WEBHOOKS,
    ModeError,
    install_mode,
    parse_version,
)
from webhook.policies import DEFAULT_POLICY, parse_policy
from webhook.render import mutating, validating
from webhook.render.scope import match_conditions, view_conditions

Obj = dict[str, Any]
CUSTOM = parse_policy(
    """
apiVersion: gpushare.io/v1alpha1
kind: GPUSharePolicy
spec:
  resources:
    count: [example.com/vgpu]
"""
)


def kinds(objects: list[Obj]) -> set[str]:
    return {o["kind"] for o in objects}


def run(argv: list[str]) -> tuple[int, list[Obj], str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        status = main(argv)
    return status, [d for d in yaml.safe_load_all(out.getvalue()) if d], err.getvalue()


# ------------------------------------------------------------------- the decision


@pytest.mark.parametrize(
    ("version", "mode"),
    [
        ("1.30", WEBHOOKS),
        ("v1.35.4", WEBHOOKS),
        ("1.36", APISERVER),
        ("v1.36.3", APISERVER),
        ("1.37.0-rc.1", APISERVER),
        ("2.0", APISERVER),
    ],
)
def test_the_version_decides_without_a_cluster(version: str, mode: str) -> None:
    assert install_mode(kubernetes_version=version) == mode


def test_what_is_served_decides_over_the_version() -> None:
    assert install_mode({mutating.SERVED_AS, "v1/Pod"}) == APISERVER
    # A 1.36 apiserver with the API switched off, or one serving only the beta.
    assert install_mode(set()) == WEBHOOKS
    assert (
        install_mode({"admissionregistration.k8s.io/v1beta1/MutatingAdmissionPolicy"}) == WEBHOOKS
    )
    with pytest.raises(ValueError, match="Kubernetes version"):
        install_mode()


@pytest.mark.parametrize("text", ["1.29", "one.36", "1", ""])
def test_unsupported_or_unreadable_versions_are_refused(text: str) -> None:
    with pytest.raises(ModeError):
        parse_version(text)


# ------------------------------------------------------------ generated files


def test_generated_mutating_policies_are_the_renderers() -> None:
    """deploy/mutatingpolicies/mutatingpolicies.yaml and the chart's copy are generated;
    fix with hack/update-match-conditions."""
    fingerprint = spec_fingerprint(DEFAULT_POLICY_FILE.read_text("utf-8"))
    wanted = manifests.mutating_policies_text(DEFAULT_POLICY, fingerprint=fingerprint)
    for path in (
        ROOT / "deploy" / "mutatingpolicies" / manifests.MUTATING_POLICIES_FILE,
        ROOT / "charts" / "gpushare-webhook" / "files" / manifests.MUTATING_POLICIES_FILE,
    ):
        assert path.read_text("utf-8") == wanted, (
            f"{path.relative_to(ROOT)} is stale; run hack/update-match-conditions"
        )


def test_generated_view_scope_patch_is_the_generators() -> None:
    path = ROOT / "deploy" / "overlays" / "apiserver-cluster-view" / manifests.VIEW_PATCH_FILE
    assert path.read_text("utf-8") == manifests.view_patch_text(DEFAULT_POLICY), (
        f"{path.relative_to(ROOT)} is stale; run hack/update-match-conditions"
    )


def test_the_kustomize_view_install_registers_what_set_view_scope_does() -> None:
    objects = manifests.build(ROOT / "deploy" / "overlays" / "apiserver-cluster-view")
    hooks = [h for o in objects if o["kind"] in manifests.WEBHOOK_KINDS for h in o["webhooks"]]
    configured = manifests.webhook_configurations(
        ca_bundle=b"", policy=DEFAULT_POLICY, mode=APISERVER
    )
    assert hooks == [h for o in configured for h in o["webhooks"]]
    assert set(mutating.KINDS) <= kinds(objects)


def test_generated_view_conditions_are_the_generators() -> None:
    path = ROOT / "charts" / "gpushare-webhook" / "files" / "view-match-conditions.yaml"
    document = yaml.safe_load(path.read_text("utf-8"))
    assert document["matchConditions"] == [dict(c) for c in view_conditions(DEFAULT_POLICY)], (
        f"{path.relative_to(ROOT)} is stale; run hack/update-match-conditions"
    )


# ------------------------------------------------------------------ the install


def test_the_apiserver_install_registers_no_webhook() -> None:
    objects = manifests.render(overlay=manifests.APISERVER_OVERLAY)
    assert not kinds(objects) & set(manifests.WEBHOOK_KINDS)
    assert set(validating.KINDS) | set(mutating.KINDS) <= kinds(objects)
    names = {o["metadata"]["name"] for o in objects if o["kind"] in mutating.KINDS}
    assert names == set(mutating.POLICY_NAMES)
    # The Deployment is the policy controller: the leader keeps the policies in step.
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--self-managed" in args
    # ... with RBAC for the mutating policies, by name.
    (role,) = [o for o in objects if o["kind"] == "ClusterRole"]
    by_resource = {
        (resource, verb): rule.get("resourceNames")
        for rule in role["rules"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }
    for resource in ("mutatingadmissionpolicies", "mutatingadmissionpolicybindings"):
        assert by_resource[(resource, "list")] is None
        assert set(by_resource[(resource, "update")]) == set(mutating.POLICY_NAMES)


def test_the_apiserver_install_takes_the_policy_and_namespace() -> None:
    objects = manifests.render(
        overlay=manifests.APISERVER_OVERLAY, policy=CUSTOM, namespace="gpu-admission"
    )
    rendered = mutating.mutating_policies(CUSTOM, namespace="gpu-admission")
    stamp(rendered, spec_fingerprint(manifests.policy_yaml(CUSTOM)))
    assert [o for o in objects if o["kind"] in mutating.KINDS] == sorted(
        rendered, key=manifests._sort_key
    )
    assert "gpushare-system" not in yaml.safe_dump(
        [o for o in objects if o["kind"] in mutating.KINDS]
    )


def test_the_webhook_install_has_no_mutating_policies() -> None:
    for overlay in manifests.OVERLAYS:
        assert not kinds(manifests.render(overlay=overlay, policy=CUSTOM)) & set(mutating.KINDS)


def test_with_the_view_the_webhooks_hold_only_what_the_view_decides() -> None:
    configured = manifests.webhook_configurations(
        ca_bundle=b"", url="https://127.0.0.1:8443", policy=CUSTOM, mode=APISERVER
    )
    hooks = [h for o in configured for h in o["webhooks"]]
    assert len(hooks) == 2
    assert all(h["failurePolicy"] == "Ignore" for h in hooks)
    assert all(h["matchConditions"] == [dict(c) for c in view_conditions(CUSTOM)] for h in hooks)
    assert view_conditions(CUSTOM) != match_conditions(CUSTOM)
    expression = view_conditions(CUSTOM)[0]["expression"]
    # Only GPU requests: what no view decides (env, hostPath, annotations) is not sent.
    assert "example.com/vgpu" in expression
    assert "hostPath" not in expression
    assert "annotations" not in expression
    with pytest.raises(ValueError, match="policy"):
        manifests.webhook_configurations(ca_bundle=b"", mode=APISERVER)


# ------------------------------------------------------------------ the command


def test_manifests_renders_for_a_kubernetes_version() -> None:
    status, objects, err = run(["manifests", "--kubernetes-version", "1.36"])
    assert status == 0, err
    assert objects == manifests.render(overlay=manifests.APISERVER_OVERLAY)
    status, objects, err = run(["manifests", "--kubernetes-version", "1.35"])
    assert status == 0, err
    assert objects == manifests.render()
    status, _, err = run(["manifests", "--kubernetes-version", "1.36", "--overlay=cert-manager"])
    assert status == 2
    assert "registers no webhook" in err
    status, _, err = run(["manifests", "--kubernetes-version", "1.29"])
    assert status == 2
    assert "older than 1.30" in err


class _Client:
    def close(self) -> None:
        pass


@pytest.mark.parametrize("mode", [APISERVER, WEBHOOKS])
def test_manifests_renders_what_the_cluster_serves(
    monkeypatch: pytest.MonkeyPatch, mode: str
) -> None:
    monkeypatch.setattr(cli_manifests, "api_client", lambda kubeconfig: _Client())
    monkeypatch.setattr(cli_manifests, "detect", lambda client: mode)
    status, objects, err = run(["manifests"])
    assert status == 0, err
    overlay = manifests.APISERVER_OVERLAY if mode == APISERVER else manifests.DEFAULT_OVERLAY
    assert objects == manifests.render(overlay=overlay)


def test_manifests_without_a_cluster_says_which_install_it_prints(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    monkeypatch.setenv("KUBECONFIG", "/nonexistent/kubeconfig")
    status, objects, err = run(["manifests"])
    assert status == 0
    assert objects == manifests.render()
    assert "no cluster to ask" in err
    assert "--kubernetes-version 1.36" in err


def test_manifests_fails_when_the_cluster_cannot_be_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    def unreachable(client: Any) -> str:
        raise OSError("connection refused")

    monkeypatch.setattr(cli_manifests, "api_client", lambda kubeconfig: _Client())
    monkeypatch.setattr(cli_manifests, "detect", unreachable)
    status, objects, err = run(["manifests"])
    assert status == 2
    assert not objects
    assert "--kubernetes-version" in err
    assert err.count("\n") == 1


def docs_manifests_commands() -> list[str]:
    """The documentation's `gpushare-webhook manifests --kubernetes-version` examples."""
    prefix = "    gpushare-webhook manifests --kubernetes-version "
    return [line.strip() for line in documentation().splitlines() if line.startswith(prefix)]


def test_the_docs_render_for_a_version_as_written(tmp_path: Path) -> None:
    """Run as the reader does (a shell, the CLI on PATH, its output redirected), without
    any cluster: the version decides."""
    commands = docs_manifests_commands()
    assert len(commands) >= 2
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    env = {**os.environ, "PATH": path, "KUBECONFIG": str(tmp_path / "none")}
    for command in commands:
        done = subprocess.run(
            ["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True
        )
        assert done.returncode == 0, (command, done.stderr)
        assert not done.stderr, command
        (written,) = re.findall(r"> (\S+)", command)
        objects = [d for d in yaml.safe_load_all((tmp_path / written).read_text()) if d]
        version = command.split("--kubernetes-version ")[1].split()[0]
        has_policies = bool(kinds(objects) & set(mutating.KINDS))
        assert has_policies == (install_mode(kubernetes_version=version) == APISERVER)


def test_the_upgrade_table_of_the_apiserver_install_is_what_it_renders() -> None:
    """docs/upgrade.md's 1.36+ table: created by the install, kept by the leader, whose
    RBAC reaches them."""
    rows = []
    for line in (ROOT / "docs" / "upgrade.md").read_text("utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 3 and cells[0].startswith("Mutating"):
            rows.append((*cells[0].split(" ", 1), cells[1], cells[2]))
    objects = manifests.render(overlay=manifests.APISERVER_OVERLAY)
    rendered = {(o["kind"], o["metadata"]["name"]) for o in objects}
    assert {(kind, name) for kind, name, *_ in rows} == {
        (kind, name) for kind, name in rendered if kind in mutating.KINDS
    }
    (role,) = [o for o in objects if o["kind"] == "ClusterRole"]
    for _kind, name, created, kept in rows:
        assert (created, kept) == ("install", "leader")
        assert any(
            "update" in rule["verbs"] and name in rule.get("resourceNames", [])
            for rule in role["rules"]
        )


# ------------------------------------------------- one policy in every admission object


def manifests_output(*argv: str) -> str:
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(["manifests", *argv]) == 0
    return out.getvalue()


def test_manifests_only_mutating_prints_just_the_mutating_policies(tmp_path: Path) -> None:
    policy_file = ROOT / "policies" / "examples" / "strict.yaml"
    text = policy_file.read_text("utf-8")
    printed = manifests_output(
        "--only", "mutating", "--policy", str(policy_file), "--namespace", "gpu-admission"
    )
    wanted = mutating.mutating_policies(
        parse_policy(text, source="strict"), namespace="gpu-admission"
    )
    stamp(wanted, spec_fingerprint(text))
    assert [o for o in yaml.safe_load_all(printed) if o] == wanted


def test_manifests_with_a_policy_marks_every_admission_object_with_it() -> None:
    policy_file = ROOT / "policies" / "examples" / "volcano.yaml"
    text = policy_file.read_text("utf-8")
    for version in ("1.35", "1.36"):
        printed = manifests_output("--kubernetes-version", version, "--policy", str(policy_file))
        objects = [o for o in yaml.safe_load_all(printed) if o]
        admission = [o for o in objects if o["kind"] in (*validating.KINDS, *mutating.KINDS)]
        assert len(admission) >= 4
        marks = {o["metadata"]["annotations"]["gpushare.io/policy-spec"] for o in admission}
        assert marks == {spec_fingerprint(text)}
        assert set(mutating.KINDS) <= kinds(objects) or version == "1.35"


def test_manifests_helm_values_hold_the_policy_and_all_its_objects() -> None:
    policy_file = ROOT / "policies" / "examples" / "volcano.yaml"
    text = policy_file.read_text("utf-8")
    values = yaml.safe_load(manifests_output("--helm-values", "--policy", str(policy_file)))
    fingerprint = spec_fingerprint(text)
    assert values["policy"]["file"] == text
    for key in ("matchConditions", "viewMatchConditions"):
        assert yaml.safe_load(values["policy"][key])["policySpec"] == fingerprint
    for texts in (values["celPolicies"]["manifests"], values["mutatingPolicies"]["manifests"]):
        objects = [o for o in yaml.safe_load_all(texts) if o]
        assert objects
        assert {o["metadata"]["annotations"]["gpushare.io/policy-spec"] for o in objects} == {
            fingerprint
        }


def test_manifests_help_names_what_it_renders() -> None:
    """It listed five rules and "one policy per deny rule" long after neither was true."""
    text = cli_manifests.MANIFESTS_DESCRIPTION
    assert "per deny rule" not in text
    assert "--only mutating" in text and "gpushare-deny-sources" in text


@pytest.mark.parametrize(
    ("version", "directory"),
    [("1.35", "cluster-view"), ("1.36", "overlays/apiserver-cluster-view")],
)
def test_manifests_render_the_cluster_view_install(version: str, directory: str) -> None:
    printed = manifests_output("--kubernetes-version", version, "--cluster-view")
    objects = [o for o in yaml.safe_load_all(printed) if o]
    assert objects == manifests.build(ROOT / "deploy" / directory)
    policy_file = ROOT / "policies" / "examples" / "volcano.yaml"
    policy = parse_policy(policy_file.read_text("utf-8"), source="volcano")
    printed = manifests_output(
        "--kubernetes-version", version, "--cluster-view", "--policy", str(policy_file)
    )
    objects = [o for o in yaml.safe_load_all(printed) if o]
    scope = view_conditions(policy) if version == "1.36" else match_conditions(policy)
    hooks = [h for o in objects if o["kind"] in manifests.WEBHOOK_KINDS for h in o["webhooks"]]
    assert len(hooks) == 2
    assert all(h["matchConditions"] == [dict(c) for c in scope] for h in hooks)


def test_manifests_cluster_view_keeps_its_own_certificates() -> None:
    err = io.StringIO()
    with redirect_stderr(err):
        code = main(
            [
                "manifests",
                "--kubernetes-version",
                "1.35",
                "--cluster-view",
                "--overlay",
                "cert-manager",
            ]
        )
    assert code == 2 and "--cluster-view" in err.getvalue()
