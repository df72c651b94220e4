"""The Helm chart: one source of truth with deploy/, strict lint, every example, bad values.

The chart's defaults must render exactly what `kubectl kustomize deploy/` renders (the
Namespace aside: `helm install --create-namespace` makes it), and its cert-manager mode
what deploy/overlays/cert-manager renders: no label or field is normalised away.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tomllib
from collections.abc import Sequence
from contextlib import redirect_stdout
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.install.chart import (
    CHART,
    EXAMPLES,
    HELM_MAJORS,
    NAMESPACE,
    Obj,
    by_identity,
    documents,
    find_helm,
    find_kubectl,
    helm_major,
    kustomize,
    run,
    template,
    template_text,
)
from tests.install.test_manifests import strings
from tests.paths import DEFAULT_POLICY_FILE, ROOT, documentation
from tests.paths import EXAMPLES as POLICY_EXAMPLES
from webhook.cli import main
from webhook.install.fingerprint import ANNOTATION, spec_fingerprint, stamp
from webhook.install.manifests import (
    cel_policies_text,
    helm_values_text,
    webhook_configurations,
)
from webhook.policies import DEFAULT_POLICY, parse_policy
from webhook.render import mutating, validating
from webhook.render.scope import match_conditions, view_conditions

DEPLOY = ROOT / "deploy"
WEBHOOK_KINDS = ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")


@pytest.fixture(scope="module", params=HELM_MAJORS, ids=lambda major: f"helm{major}")
def helm(request: pytest.FixtureRequest) -> str:
    """Each test that renders the chart runs with Helm 4 and with Helm 3."""
    path = find_helm(request.param)
    assert helm_major(path) == request.param, f"{path} is not Helm {request.param}"
    return path


@pytest.fixture(scope="module")
def kubectl() -> str:
    return find_kubectl()


def cli(*argv: str) -> str:
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(list(argv)) == 0
    return out.getvalue()


def kinds(objects: list[Obj]) -> list[str]:
    return [o["kind"] for o in objects]


def one(objects: list[Obj], kind: str, name: str | None = None) -> Obj:
    found = [o for o in objects if o["kind"] == kind and name in (None, o["metadata"]["name"])]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def pod_spec(objects: list[Obj]) -> Obj:
    spec: Obj = one(objects, "Deployment")["spec"]["template"]["spec"]
    return spec


def conditions(objects: list[Obj]) -> list[Any]:
    return [o["webhooks"][0]["matchConditions"] for o in objects if o["kind"] in WEBHOOK_KINDS]


# ------------------------------------------------------------------ chart metadata


def test_chart_version_follows_the_project() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text("utf-8"))["project"]["version"]
    chart = yaml.safe_load((CHART / "Chart.yaml").read_text("utf-8"))
    assert (chart["version"], chart["appVersion"]) == (project, project), (
        "set version and appVersion in charts/gpushare-webhook/Chart.yaml to pyproject's version"
    )


STALE = "the chart's generated files are stale; run hack/update-match-conditions"


def test_chart_policy_is_the_bundled_default() -> None:
    bundled = (ROOT / "webhook" / "policies" / "default.yaml").read_text("utf-8")
    assert (CHART / "files" / "policy.yaml").read_text("utf-8") == bundled, STALE


def test_chart_cel_policies_are_the_generated_ones() -> None:
    text = (CHART / "files" / "celpolicies.yaml").read_text("utf-8")
    fingerprint = spec_fingerprint(DEFAULT_POLICY_FILE.read_text("utf-8"))
    assert text == cel_policies_text(DEFAULT_POLICY, fingerprint=fingerprint), STALE


@pytest.mark.parametrize(
    ("example", "policy_file", "options"),
    [
        ("strict-policy-values.yaml", POLICY_EXAMPLES / "strict.yaml", {"as_spec": True}),
        (
            "existing-policy-configmap-values.yaml",
            DEFAULT_POLICY_FILE,
            {"existing_config_map": "gpushare-policy-custom"},
        ),
    ],
)
def test_policy_examples_are_generated_with_their_admission_objects(
    example: str, policy_file: Path, options: dict[str, Any]
) -> None:
    text = policy_file.read_text("utf-8")
    policy = parse_policy(text, source=str(policy_file))
    source = str(policy_file.relative_to(ROOT))
    wanted = helm_values_text(policy, text, source=source, **options)
    assert (CHART / "ci" / example).read_text("utf-8") == wanted, STALE


def test_chart_match_conditions_are_what_the_cli_prints() -> None:
    """The same format policy.matchConditions takes from users."""
    text = (CHART / "files" / "match-conditions.yaml").read_text("utf-8")
    assert text.startswith("# GENERATED"), STALE
    assert text.endswith(cli("manifests", "--print-match-conditions")), STALE


# ------------------------------------------------------------- one source of truth


def assert_same_install(helm: str, kubectl: str, *, directory: Path, settings: list[str]) -> None:
    """The chart with SETTINGS renders, object for object, what kustomize renders from
    DIRECTORY, its Namespace aside."""
    expected = [o for o in kustomize(kubectl, directory) if o["kind"] != "Namespace"]
    assert expected, f"kubectl kustomize {directory} rendered nothing"
    rendered = by_identity(template(helm, settings=settings))
    expected_by_identity = by_identity(expected)
    assert sorted(rendered) == sorted(expected_by_identity)
    for key, obj in expected_by_identity.items():
        assert rendered[key] == obj, f"{key} differs between the chart and {directory}"


def test_defaults_render_what_kustomize_renders(helm: str, kubectl: str) -> None:
    assert_same_install(helm, kubectl, directory=DEPLOY, settings=[])


def test_cert_manager_mode_renders_the_cert_manager_overlay(helm: str, kubectl: str) -> None:
    directory = DEPLOY / "overlays" / "cert-manager"
    assert_same_install(
        helm, kubectl, directory=directory, settings=["certificates.mode=cert-manager"]
    )


def test_cluster_view_renders_the_cluster_view_install(helm: str, kubectl: str) -> None:
    directory = DEPLOY / "cluster-view"
    assert_same_install(helm, kubectl, directory=directory, settings=["clusterView.enabled=true"])


SERVED = ["--api-versions", mutating.SERVED_AS]


@pytest.mark.parametrize(
    ("settings", "extra"),
    [([], SERVED), (["admission.mode=apiserver"], [])],
    ids=["served", "forced"],
)
def test_where_mutating_policies_are_served_it_renders_the_apiserver_overlay(
    helm: str, kubectl: str, settings: list[str], extra: list[str]
) -> None:
    """Kubernetes 1.36+ (or admission.mode=apiserver): deploy/overlays/apiserver, object
    for object: the MutatingAdmissionPolicies and no webhook registration."""
    expected = [
        o for o in kustomize(kubectl, DEPLOY / "overlays" / "apiserver") if o["kind"] != "Namespace"
    ]
    rendered = by_identity(template(helm, settings=settings, extra=extra))
    assert sorted(rendered) == sorted(by_identity(expected))
    for key, obj in by_identity(expected).items():
        assert rendered[key] == obj, f"{key} differs between the chart and overlays/apiserver"
    assert not {kind for kind, *_ in rendered} & set(WEBHOOK_KINDS)


def test_admission_mode_webhooks_keeps_the_webhooks_where_policies_are_served(
    helm: str, kubectl: str
) -> None:
    rendered = by_identity(template(helm, settings=["admission.mode=webhooks"], extra=SERVED))
    expected = by_identity([o for o in kustomize(kubectl, DEPLOY) if o["kind"] != "Namespace"])
    assert rendered == expected


def test_with_the_view_where_policies_are_served_it_renders_the_view_overlay(
    helm: str, kubectl: str
) -> None:
    expected = by_identity(
        [
            o
            for o in kustomize(kubectl, DEPLOY / "overlays" / "apiserver-cluster-view")
            if o["kind"] != "Namespace"
        ]
    )
    rendered = by_identity(template(helm, settings=["clusterView.enabled=true"], extra=SERVED))
    assert sorted(rendered) == sorted(expected)
    for key, obj in expected.items():
        assert rendered[key] == obj, (
            f"{key} differs between the chart and overlays/apiserver-cluster-view"
        )


def test_with_the_view_the_apiserver_install_registers_what_the_view_decides(helm: str) -> None:
    objects = template(helm, settings=["clusterView.enabled=true"], extra=SERVED)
    kinds = {o["kind"] for o in objects}
    assert set(mutating.KINDS) | set(WEBHOOK_KINDS) <= kinds
    view = [dict(c) for c in view_conditions(DEFAULT_POLICY)]
    hooks = [o["webhooks"][0] for o in objects if o["kind"] in WEBHOOK_KINDS]
    assert [h["matchConditions"] for h in hooks] == [view, view]
    assert [h["failurePolicy"] for h in hooks] == ["Ignore", "Ignore"]
    assert "--cluster" in pod_spec(objects)["containers"][0]["args"]
    # The same registrations the dev cluster makes (webhook.install.manifests).
    configured = webhook_configurations(ca_bundle=b"", policy=DEFAULT_POLICY, mode="apiserver")
    assert [o["webhooks"][0] for o in configured] == hooks


def test_the_apiserver_install_follows_the_release_namespace(helm: str) -> None:
    objects = template(helm, namespace="gpu-admission", extra=SERVED)
    assert NAMESPACE not in "\n".join(strings(objects))
    for policy in (o for o in objects if o["kind"] in mutating.KINDS):
        field = "matchConstraints" if policy["kind"] == mutating.POLICY_KIND else "matchResources"
        selector = policy["spec"][field]["namespaceSelector"]
        assert selector["matchExpressions"][0]["values"] == ["kube-system", "gpu-admission"]


def test_cluster_view_secrets_grant_is_the_opt_in_file(helm: str) -> None:
    expected = by_identity(documents((DEPLOY / "cluster-view" / "secrets-rbac.yaml").read_text()))
    objects = template(helm, settings=["clusterView.enabled=true", "clusterView.secrets=true"])
    rendered = by_identity(objects)
    for key, obj in expected.items():
        assert rendered[key] == obj
    plain = by_identity(template(helm, settings=["clusterView.enabled=true"]))
    assert not set(expected) & set(plain), "Secrets are readable without clusterView.secrets"


def test_release_namespace_moves_every_reference(helm: str) -> None:
    objects = template(helm, namespace="gpu-admission")
    assert NAMESPACE not in "\n".join(strings(objects))
    for hook in (o["webhooks"][0] for o in objects if o["kind"] in WEBHOOK_KINDS):
        assert hook["clientConfig"]["service"]["namespace"] == "gpu-admission"
        (exclusion,) = hook["namespaceSelector"]["matchExpressions"]
        assert exclusion["values"] == ["kube-system", "gpu-admission"]
    for policy in (o for o in objects if o["kind"] == "ValidatingAdmissionPolicy"):
        selector = policy["spec"]["matchConstraints"]["namespaceSelector"]
        assert selector["matchExpressions"][0]["values"] == ["kube-system", "gpu-admission"]
    assert "--namespace=gpu-admission" in pod_spec(objects)["containers"][0]["args"]


# ----------------------------------------------------------------- lint, examples


def test_lint_is_clean_in_strict_mode(helm: str) -> None:
    argv = [helm, "lint", "--strict", str(CHART), "--namespace", NAMESPACE]
    for path in EXAMPLES:
        result = run([*argv, "--values", str(path)])
        assert result.returncode == 0, f"{path.name}: {result.stdout}{result.stderr}"
    result = run(argv)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 chart(s) failed" in result.stdout


def test_there_are_examples() -> None:
    assert {p.name for p in EXAMPLES} >= {
        "cert-manager-values.yaml",
        "existing-policy-configmap-values.yaml",
        "strict-policy-values.yaml",
        "ha-values.yaml",
        "no-cel-values.yaml",
    }


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_every_example_renders_valid_objects(helm: str, example: Path) -> None:
    objects = template(helm, values=[example])
    assert "Deployment" in kinds(objects)
    for obj in objects:
        assert obj.get("apiVersion") and obj["metadata"].get("name"), obj
    # Every rendering keeps both webhooks scoped.
    assert all(conditions(objects)) and len(conditions(objects)) == 2


def test_cert_manager_with_an_issuer_of_your_own(helm: str) -> None:
    objects = template(helm, values=[CHART / "ci" / "cert-manager-cluster-issuer-values.yaml"])
    assert "Issuer" not in kinds(objects)
    serving = one(objects, "Certificate", "gpushare-webhook-serving")
    assert serving["spec"]["issuerRef"] == {"kind": "ClusterIssuer", "name": "internal-ca"}
    assert "--tls-cert=/etc/gpushare/tls/tls.crt" in pod_spec(objects)["containers"][0]["args"]
    assert "Role" not in kinds(objects) and not pod_spec(objects)["automountServiceAccountToken"]


def test_policy_as_a_values_block_is_the_policy_it_spells(helm: str) -> None:
    objects = template(helm, values=[CHART / "ci" / "strict-policy-values.yaml"])
    data = one(objects, "ConfigMap", "gpushare-policy")["data"]["policy.yaml"]
    strict = (POLICY_EXAMPLES / "strict.yaml").read_text("utf-8")
    # The same policy in force (every field, defaults filled in), under its own name.
    ours = parse_policy(data, source="chart")
    assert ours.name == "gpushare-webhook"
    assert replace(ours, name="strict") == parse_policy(strict, source="strict.yaml")
    assert ours != replace(DEFAULT_POLICY, name=ours.name)


def helm_values(tmp_path: Path, policy_file: Path) -> Path:
    """`gpushare-webhook manifests --helm-values --policy POLICY_FILE`, as a file."""
    values = tmp_path / f"{policy_file.stem}-values.yaml"
    values.write_text(cli("manifests", "--helm-values", "--policy", str(policy_file)))
    return values


def test_policy_as_a_file(helm: str, tmp_path: Path) -> None:
    strict = (POLICY_EXAMPLES / "strict.yaml").read_text("utf-8")
    objects = template(helm, values=[helm_values(tmp_path, POLICY_EXAMPLES / "strict.yaml")])
    assert one(objects, "ConfigMap", "gpushare-policy")["data"]["policy.yaml"] == strict


def refusal(helm: str, *, values: Sequence[Path] = (), settings: Sequence[str] = ()) -> str:
    argv = [helm, "template", "gpushare-webhook", str(CHART), "--namespace", NAMESPACE]
    for path in values:
        argv += ["--values", str(path)]
    for setting in settings:
        argv += ["--set", setting]
    result = run(argv)
    assert result.returncode != 0, f"rendered: {result.stdout[:500]}"
    return result.stderr


MODES = [["admission.mode=webhooks"], ["admission.mode=apiserver"]]
MODE_IDS = ["webhooks", "apiserver"]


@pytest.mark.parametrize("mode", MODES, ids=MODE_IDS)
@pytest.mark.parametrize(
    "policy",
    [
        ["policy.spec.vgpu.preload=file"],
        ["policy.existingConfigMap=mine"],
        ["policy.spec.vgpu.preload=file", "celPolicies.enabled=false"],
        ["policy.spec.vgpu.preload=file", "clusterView.enabled=true"],
    ],
    ids=["spec", "existing-configmap", "spec-without-cel", "spec-with-view"],
)
def test_a_policy_of_your_own_with_the_default_admission_objects_is_refused(
    helm: str, policy: list[str], mode: list[str]
) -> None:
    """The issue this guards: a custom policy installed with the default policy's
    MutatingAdmissionPolicies stored GPU pods with the default's settings and refused them
    as unmutated-gpu-pod."""
    complaint = refusal(helm, settings=[*policy, *mode])
    assert "the chart's default-policy copy" in complaint, complaint
    assert "gpushare-webhook manifests --helm-values" in complaint


def test_a_policy_file_with_the_default_admission_objects_is_refused(helm: str) -> None:
    argv = [helm, "template", "gpushare-webhook", str(CHART), "--namespace", NAMESPACE]
    argv += ["--set-file", f"policy.file={POLICY_EXAMPLES / 'strict.yaml'}"]
    for mode in ("webhooks", "apiserver"):
        result = run([*argv, "--set", f"admission.mode={mode}"])
        assert result.returncode != 0
        assert "rendered from another policy" in result.stderr, result.stderr


@pytest.mark.parametrize("piece", ["matchConditions", "cel", "mutating", "view"])
def test_one_admission_object_of_another_policy_is_refused(
    helm: str, tmp_path: Path, piece: str
) -> None:
    """The strict policy with one text of the volcano policy's in its values file."""
    strict = yaml.safe_load(helm_values(tmp_path, POLICY_EXAMPLES / "strict.yaml").read_text())
    volcano = yaml.safe_load(helm_values(tmp_path, POLICY_EXAMPLES / "volcano.yaml").read_text())
    path = {
        "matchConditions": ("policy", "matchConditions"),
        "cel": ("celPolicies", "manifests"),
        "mutating": ("mutatingPolicies", "manifests"),
        "view": ("policy", "viewMatchConditions"),
    }[piece]
    strict[path[0]][path[1]] = volcano[path[0]][path[1]]
    mixed = tmp_path / "mixed.yaml"
    mixed.write_text(yaml.safe_dump(strict))
    mode = "webhooks" if piece == "matchConditions" else "apiserver"
    complaint = refusal(
        helm, values=[mixed], settings=[f"admission.mode={mode}", "clusterView.enabled=true"]
    )
    assert f"{path[0]}.{path[1]} was rendered from another policy" in complaint, complaint
    # The values file itself renders in both modes.
    good = helm_values(tmp_path, POLICY_EXAMPLES / "strict.yaml")
    for mode in ("webhooks", "apiserver"):
        template(helm, values=[good], settings=[f"admission.mode={mode}"])


def test_admission_objects_without_their_policy_are_refused(helm: str, tmp_path: Path) -> None:
    """The volcano policy's objects with the default policy in the ConfigMap."""
    values = yaml.safe_load(helm_values(tmp_path, POLICY_EXAMPLES / "volcano.yaml").read_text())
    del values["policy"]["file"]
    pieces = tmp_path / "pieces.yaml"
    pieces.write_text(yaml.safe_dump(values))
    assert "rendered from another policy" in refusal(helm, values=[pieces])


def test_an_unmarked_admission_object_is_refused(helm: str, tmp_path: Path) -> None:
    """The output of an older `manifests --only cel` carries no fingerprint."""
    values = yaml.safe_load(helm_values(tmp_path, POLICY_EXAMPLES / "volcano.yaml").read_text())
    values["celPolicies"]["manifests"] = values["celPolicies"]["manifests"].replace(
        ANNOTATION, "example.com/other"
    )
    unmarked = tmp_path / "unmarked.yaml"
    unmarked.write_text(yaml.safe_dump(values))
    assert "carries no policy fingerprint" in refusal(helm, values=[unmarked])


def test_existing_policy_config_map_is_mounted_not_created(helm: str) -> None:
    objects = template(helm, values=[CHART / "ci" / "existing-policy-configmap-values.yaml"])
    assert "ConfigMap" not in kinds(objects)
    volumes = {v["name"]: v for v in pod_spec(objects)["volumes"]}
    assert volumes["policy"]["configMap"]["name"] == "gpushare-policy-custom"


@pytest.mark.parametrize("view", [False, True], ids=["no-view", "view"])
def test_a_policy_of_your_own_brings_every_admission_object(
    helm: str, tmp_path: Path, view: bool
) -> None:
    policy_file = POLICY_EXAMPLES / "volcano.yaml"
    text = policy_file.read_text("utf-8")
    policy = parse_policy(text, source=str(policy_file))
    fingerprint = spec_fingerprint(text)
    values = helm_values(tmp_path, policy_file)
    namespace = "gpu-admission"
    view_settings = [f"clusterView.enabled={str(view).lower()}"]
    webhooks = template(
        helm, values=[values], namespace=namespace, settings=["admission.mode=webhooks"]
    )
    apiserver = template(
        helm,
        values=[values],
        namespace=namespace,
        settings=["admission.mode=apiserver", *view_settings],
    )
    expected = [dict(c) for c in match_conditions(policy)]
    assert conditions(webhooks) == [expected, expected]
    assert expected != [dict(c) for c in match_conditions(DEFAULT_POLICY)]
    if view:
        scoped = [dict(c) for c in view_conditions(policy)]
        assert conditions(apiserver) == [scoped, scoped]
    else:
        assert not conditions(apiserver)
    for objects in (webhooks, apiserver):
        assert one(objects, "ConfigMap", "gpushare-policy")["data"]["policy.yaml"] == text
        # Helm orders objects by kind; compared object by object, in the release namespace.
        cel = validating.validating_policies(policy, namespace=namespace)
        stamp(cel, fingerprint)
        assert by_identity([o for o in objects if o["kind"] in validating.KINDS]) == by_identity(
            cel
        )
    mutating_objects = mutating.mutating_policies(policy, namespace=namespace)
    stamp(mutating_objects, fingerprint)
    rendered = [o for o in apiserver if o["kind"] in mutating.KINDS]
    assert by_identity(rendered) == by_identity(mutating_objects)
    assert not [o for o in webhooks if o["kind"] in mutating.KINDS]


def test_no_cel_example_renders_no_admission_policies(helm: str) -> None:
    objects = template(helm, values=[CHART / "ci" / "no-cel-values.yaml"])
    assert not set(kinds(objects)) & set(validating.KINDS)
    assert "PodDisruptionBudget" not in kinds(objects)
    assert "priorityClassName" not in pod_spec(objects)


def test_ha_example_adds_monitoring_and_a_network_policy(helm: str) -> None:
    objects = template(helm, values=[CHART / "ci" / "ha-values.yaml"])
    assert one(objects, "Deployment")["spec"]["replicas"] == 5
    assert one(objects, "PodDisruptionBudget")["spec"]["minAvailable"] == 3
    assert one(objects, "PrometheusRule")["metadata"]["labels"]["release"] == "prometheus"
    assert one(objects, "ConfigMap", "gpushare-webhook-dashboard")
    monitor = one(objects, "ServiceMonitor")
    assert monitor["metadata"]["labels"]["release"] == "prometheus"
    selects = monitor["spec"]["selector"]["matchLabels"].items()
    # The ServiceMonitor selects the metrics Service, and not the webhook's.
    assert (
        selects <= one(objects, "Service", "gpushare-webhook-metrics")["metadata"]["labels"].items()
    )
    assert not selects <= one(objects, "Service", "gpushare-webhook")["metadata"]["labels"].items()
    policy = one(objects, "NetworkPolicy")
    ports = [p["port"] for rule in policy["spec"]["ingress"] for p in rule["ports"]]
    assert ports == [8443, 8080]
    container = pod_spec(objects)["containers"][0]
    assert container["image"].endswith("@sha256:" + "0" * 64)
    assert container["args"][-3:] == ["--cluster", "--reports", "--log-level=WARNING"]
    view = one(objects, "ClusterRole", "gpushare-webhook-cluster-view")
    assert {verb for rule in view["rules"] for verb in rule["verbs"]} == {"list", "watch"}


def test_cluster_view_mounts_the_token_also_with_cert_manager(helm: str) -> None:
    plain = template(helm, settings=["certificates.mode=cert-manager"])
    assert pod_spec(plain)["automountServiceAccountToken"] is False
    objects = template(
        helm, settings=["certificates.mode=cert-manager", "clusterView.enabled=true"]
    )
    assert pod_spec(objects)["automountServiceAccountToken"] is True
    binding = one(objects, "ClusterRoleBinding", "gpushare-webhook-cluster-view")
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": "gpushare-webhook", "namespace": NAMESPACE}
    ]


def client_side_install(helm: str) -> None:
    """Skip where only a cluster renders NOTES."""
    if helm_major(helm) == 3:
        pytest.skip(
            "Helm 3 reaches for a cluster even with --dry-run=client; "
            "tests/e2e/test_chart.py checks its NOTES against an apiserver"
        )


def notes(helm: str, *settings: str) -> str:
    client_side_install(helm)
    argv = [helm, "install", "gpushare-webhook", str(CHART), "--dry-run=client"]
    argv += ["--namespace", NAMESPACE]
    for setting in settings:
        argv += ["--set", setting]
    result = run([*argv, "--values", str(CHART / "ci" / "strict-policy-values.yaml")])
    assert result.returncode == 0, result.stderr
    return result.stdout.split("NOTES:", 1)[1]


def test_notes_for_a_policy_of_your_own_say_how_to_render_it_again(helm: str) -> None:
    strict = yaml.safe_load((CHART / "ci" / "strict-policy-values.yaml").read_text())
    fingerprint = yaml.safe_load(strict["policy"]["matchConditions"])["policySpec"]
    for mode, says in (
        ("self-managed", "the elected replica re-renders them"),
        ("cert-manager", "no replica re-renders them"),
    ):
        text = notes(helm, f"certificates.mode={mode}")
        assert "gpushare-webhook manifests --helm-values" in text
        assert fingerprint in text
        assert says in text, text
    default = run([helm, "install", "gpushare-webhook", str(CHART), "--dry-run=client"])
    assert default.returncode == 0, default.stderr
    assert "rollout status" in default.stdout
    assert "--helm-values" not in default.stdout


def test_notes_point_at_the_uninstall(helm: str) -> None:
    for settings in ((), ("certificates.mode=cert-manager",)):
        assert f"gpushare-webhook uninstall --namespace {NAMESPACE}" in notes(helm, *settings)


# ---------------------------------------------------------------------- bad values


@pytest.mark.parametrize(
    ("settings", "complaint"),
    [
        (["replicas=0"], "replicas"),
        (["certificates.mode=vault"], "mode"),
        (["replica=3"], "replica"),
        (["image.digest=latest"], "digest"),
        (["extraArgs[0]=serve"], "extraArgs"),
        (["networkPolicy.apiServerPorts[0]=70000"], "apiServerPorts"),
        (["certificates.certManager.issuerRef.kind=Vault"], "kind"),
        (["policy.matchConditions=not-a-list"], "policy.matchConditions"),
        (["policy.file=x", "policy.spec.onError=allow"], "one way"),
        (["policy.existingConfigMap=mine", "policy.file=x"], "one way"),
        (["clusterView.secrets=true"], "clusterView.enabled"),
    ],
)
def test_bad_values_are_refused(helm: str, settings: list[str], complaint: str) -> None:
    argv = [helm, "template", "gpushare-webhook", str(CHART), "--namespace", NAMESPACE]
    for setting in settings:
        argv += ["--set", setting]
    result = run(argv)
    assert result.returncode != 0, f"{settings} rendered:\n{result.stdout[:500]}"
    assert complaint in result.stderr, result.stderr


# ---------------------------------------------------------------------- the README


def readme_helm_commands() -> list[str]:
    """The documentation's `helm install` examples, continuation lines joined."""
    commands: list[str] = []
    lines = iter(documentation().splitlines())
    for line in lines:
        if line.startswith("    helm install "):
            command = line.strip()
            while command.endswith("\\"):
                command = command[:-1] + next(lines).strip()
            commands.append(command)
    return commands


def test_readme_has_helm_examples() -> None:
    assert len(readme_helm_commands()) >= 3


@pytest.mark.parametrize("command", readme_helm_commands())
def test_readme_helm_example_renders_as_written(helm: str, command: str) -> None:
    """Run from the repository root, as the README's reader does; template for install
    (same flags, no cluster)."""
    script = command.replace("helm install ", f"{helm} template ", 1)
    path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"
    result = subprocess.run(
        ["bash", "-c", script],
        cwd=ROOT,
        env={**os.environ, "PATH": path},
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert "kind: Deployment" in result.stdout


def test_the_rendered_install_says_which_it_is_and_why(helm: str) -> None:
    """`helm template` without a cluster sees no MutatingAdmissionPolicy v1: the webhook
    install, said on the Deployment where a reader of the output looks."""
    plain = template_text(helm)
    assert "# gpushare-webhook renders the webhook install" in plain
    assert "--api-versions admissionregistration.k8s.io/v1/MutatingAdmissionPolicy" in plain
    served = template_text(
        helm, extra=["--api-versions", "admissionregistration.k8s.io/v1/MutatingAdmissionPolicy"]
    )
    assert "# gpushare-webhook renders the 1.36+ install" in served
    assert "serves admissionregistration.k8s.io/v1 MutatingAdmissionPolicy" in served
    forced = template_text(helm, settings=["admission.mode=webhooks"])
    assert (
        "renders the webhook install (both webhooks registered): admission.mode=webhooks" in forced
    )
