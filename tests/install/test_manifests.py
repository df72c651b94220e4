"""The install manifests: what deploy/ holds, what `manifests` prints, what kustomize renders.

The kustomize comparison needs kubectl: $GPUSHARE_KUBECTL, else the one
hack/build-testbin builds from the pinned Go module (when Go is installed), else one
on PATH. Without any, the comparison is skipped locally and fails under CI=true.
"""

from __future__ import annotations

import base64
import io
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from contextlib import redirect_stderr, redirect_stdout
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
import yaml

import webhook
from tests.paths import ROOT
from webhook.cli import build_parser, main
from webhook.core.workload import TEMPLATE_PATHS
from webhook.install import manifests
from webhook.install.manifests import ManifestError, Obj
from webhook.policies import load_policy
from webhook.render import validating
from webhook.render.validating import POLICY_NAMES

DEPLOY = ROOT / "deploy"
NS = "gpushare-system"
PEM = b"-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n"
SELF_MANAGED_ARGS = [
    "--self-managed",
    f"--namespace={NS}",
    "--service=gpushare-webhook",
    "--secret=gpushare-webhook-tls",
    "--webhook-config=gpushare-webhook",
]


def one(objects: list[Obj], kind: str, name: str | None = None) -> Obj:
    found = [o for o in objects if o["kind"] == kind and name in (None, o["metadata"].get("name"))]
    assert len(found) == 1, f"expected one {kind} {name or ''}, found {len(found)}"
    return found[0]


def pod_spec(objects: list[Obj]) -> Obj:
    spec: Obj = one(objects, "Deployment", "gpushare-webhook")["spec"]["template"]["spec"]
    return spec


def container(objects: list[Obj]) -> Obj:
    (webhook_container,) = pod_spec(objects)["containers"]
    return dict(webhook_container)


def hooks(objects: list[Obj]) -> tuple[Obj, Obj]:
    (mutating,) = one(objects, "MutatingWebhookConfiguration", "gpushare-webhook")["webhooks"]
    (validating,) = one(objects, "ValidatingWebhookConfiguration", "gpushare-webhook")["webhooks"]
    return mutating, validating


def strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield str(key)
            yield from strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from strings(item)


@pytest.fixture(params=manifests.OVERLAYS)
def overlay(request: pytest.FixtureRequest) -> str:
    return str(request.param)


# ------------------------------------------------------------------ what is installed


def test_default_install_objects() -> None:
    objects = manifests.render()
    assert [(o["kind"], o["metadata"]["name"]) for o in objects] == [
        ("Namespace", NS),
        ("ServiceAccount", "gpushare-webhook"),
        ("Role", "gpushare-webhook"),
        ("ClusterRole", "gpushare-webhook"),
        ("RoleBinding", "gpushare-webhook"),
        ("ClusterRoleBinding", "gpushare-webhook"),
        ("ConfigMap", "gpushare-policy"),
        ("Service", "gpushare-webhook"),
        ("Deployment", "gpushare-webhook"),
        ("PodDisruptionBudget", "gpushare-webhook"),
        *[
            (kind, name)
            for kind in validating.KINDS
            for name in ("gpushare-deny", "gpushare-deny-sources", "gpushare-overrides")
        ],
        ("MutatingWebhookConfiguration", "gpushare-webhook"),
        ("ValidatingWebhookConfiguration", "gpushare-webhook"),
    ]
    assert manifests.DEFAULT_OVERLAY == "self-managed"


def test_cert_manager_install_objects() -> None:
    objects = manifests.render(overlay="cert-manager")
    kinds = {(o["kind"], o["metadata"]["name"]) for o in objects}
    assert {
        ("Issuer", "gpushare-webhook-selfsigned"),
        ("Certificate", "gpushare-webhook-ca"),
        ("Issuer", "gpushare-webhook-ca"),
        ("Certificate", "gpushare-webhook-serving"),
    } <= kinds
    assert not {k for k, _ in kinds} & {"Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"}


def test_namespaced_objects_live_in_the_install_namespace(overlay: str) -> None:
    for obj in manifests.render(overlay=overlay):
        if obj["kind"] in {
            "Namespace",
            "ClusterRole",
            "ClusterRoleBinding",
            *manifests.WEBHOOK_KINDS,
            *validating.KINDS,
        }:
            assert "namespace" not in obj["metadata"], obj["kind"]
        else:
            assert obj["metadata"]["namespace"] == NS, obj["kind"]
    namespace = one(manifests.render(overlay=overlay), "Namespace")
    assert namespace["metadata"]["labels"]["pod-security.kubernetes.io/enforce"] == "restricted"


def test_deployment_availability(overlay: str) -> None:
    objects = manifests.render(overlay=overlay)
    deployment = one(objects, "Deployment")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert deployment["spec"]["replicas"] == 3
    assert deployment["spec"]["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()
    spec = pod_spec(objects)
    assert spec["priorityClassName"] == "system-cluster-critical"
    (term,) = spec["affinity"]["podAntiAffinity"]["preferredDuringSchedulingIgnoredDuringExecution"]
    assert term["podAffinityTerm"]["topologyKey"] == "kubernetes.io/hostname"
    assert term["podAffinityTerm"]["labelSelector"]["matchLabels"].items() <= labels.items()
    assert (
        "requiredDuringSchedulingIgnoredDuringExecution" not in spec["affinity"]["podAntiAffinity"]
    )

    pdb = one(objects, "PodDisruptionBudget")
    assert pdb["spec"]["minAvailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"].items() <= labels.items()

    service = one(objects, "Service")
    (port,) = service["spec"]["ports"]
    assert (port["name"], port["port"], port["targetPort"]) == ("https", 443, 8443)
    assert service["spec"]["selector"].items() <= labels.items()


def test_deployment_security_context(overlay: str) -> None:
    objects = manifests.render(overlay=overlay)
    spec = pod_spec(objects)
    pod = spec["securityContext"]
    assert pod["runAsNonRoot"] is True
    assert pod["runAsUser"] == 65532
    assert pod["seccompProfile"] == {"type": "RuntimeDefault"}
    context = container(objects)["securityContext"]
    assert context["runAsNonRoot"] is True
    assert context["runAsUser"] == 65532
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    assert not context.get("privileged")
    assert not any(spec.get(f) for f in ("hostNetwork", "hostPID", "hostIPC"))
    assert not any("hostPath" in volume for volume in spec["volumes"])


def test_deployment_probes_resources_and_shutdown(overlay: str) -> None:
    objects = manifests.render(overlay=overlay)
    spec = pod_spec(objects)
    webhook_container = container(objects)
    ports = {p["name"]: p["containerPort"] for p in webhook_container["ports"]}
    assert ports == {"https": 8443, "health": 8080}
    args = webhook_container["args"]
    assert args[0] == "serve"
    assert {"--port=8443", "--health-port=8080"} <= set(args)
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        get = webhook_container[probe]["httpGet"]
        assert get["path"] == path
        assert ports[get["port"]] == 8080
    requests = webhook_container["resources"]["requests"]
    limits = webhook_container["resources"]["limits"]
    assert requests == {"cpu": "100m", "memory": "128Mi"}
    assert limits == {"cpu": "1", "memory": "256Mi"}
    sleep = webhook_container["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert sleep >= 5
    # The server drains for up to 15 s after the preStop sleep.
    assert spec["terminationGracePeriodSeconds"] > sleep + 15


def test_deployment_mounts(overlay: str) -> None:
    objects = manifests.render(overlay=overlay)
    spec = pod_spec(objects)
    volumes = {v["name"]: v for v in spec["volumes"]}
    mounts = {m["mountPath"]: m for m in container(objects)["volumeMounts"]}
    assert "emptyDir" in volumes[mounts["/tmp"]["name"]]
    policy_mount = mounts["/etc/gpushare/policy"]
    assert policy_mount["readOnly"] is True
    assert "subPath" not in policy_mount  # a subPath mount never sees ConfigMap updates
    assert volumes[policy_mount["name"]]["configMap"]["name"] == "gpushare-policy"
    assert "--policy=/etc/gpushare/policy/policy.yaml" in container(objects)["args"]
    config_map = one(objects, "ConfigMap", "gpushare-policy")
    assert set(config_map["data"]) == {"policy.yaml"}


def test_container_args_are_serve_options(overlay: str) -> None:
    args = container(manifests.render(overlay=overlay))["args"]
    err = io.StringIO()
    try:
        with redirect_stderr(err):
            parsed = build_parser().parse_args(args)
    except SystemExit:
        help_text = io.StringIO()
        with pytest.raises(SystemExit), redirect_stdout(help_text):
            build_parser().parse_args(["serve", "--help"])
        if overlay == "self-managed" and "--self-managed" not in help_text.getvalue():
            pytest.skip("serve has no --self-managed yet (certificate lifecycle work)")
        pytest.fail(f"serve refuses the {overlay} Deployment's args: {err.getvalue()}")
    assert parsed.command == "serve"
    assert parsed.port == 8443
    assert parsed.health_port == 8080


def test_image_is_this_release() -> None:
    image = container(manifests.render())["image"]
    assert image.rsplit(":", 1)[1] == webhook.__version__
    assert container(manifests.render(image="registry.example/gw:dev"))["image"] == (
        "registry.example/gw:dev"
    )
    with pytest.raises(ManifestError):
        manifests.render(image="has space")


# --------------------------------------------------------------- webhook registration


def test_webhook_failure_behaviour_and_scope(overlay: str) -> None:
    mutating, validating = hooks(manifests.render(overlay=overlay))
    assert mutating["name"] == "mutate.gpushare.io"
    assert validating["name"] == "validate.gpushare.io"
    assert mutating["failurePolicy"] == "Ignore"
    assert validating["failurePolicy"] == "Fail"
    assert mutating["reinvocationPolicy"] == "IfNeeded"
    assert "reinvocationPolicy" not in validating
    for hook, path in ((mutating, "/mutate"), (validating, "/validate")):
        assert 1 <= hook["timeoutSeconds"] <= 5
        assert hook["sideEffects"] == "None"
        assert hook["admissionReviewVersions"] == ["v1"]
        assert hook["matchPolicy"] == "Equivalent"
        assert "objectSelector" not in hook
        assert hook["namespaceSelector"] == {
            "matchExpressions": [
                {
                    "key": "kubernetes.io/metadata.name",
                    "operator": "NotIn",
                    "values": ["kube-system", NS],
                }
            ]
        }
        assert hook["clientConfig"]["service"] == {
            "name": "gpushare-webhook",
            "namespace": NS,
            "path": path,
            "port": 443,
        }


def _rules(hook: Obj) -> set[tuple[str, str, str]]:
    return {
        (group, resource, operation)
        for rule in hook["rules"]
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for operation in rule["operations"]
        if rule["apiVersions"] == ["v1"] and rule["scope"] == "Namespaced"
    }


# The API group of every kind the decision core finds a pod template in.
_TEMPLATE_GROUPS = {
    "Deployment": "apps",
    "StatefulSet": "apps",
    "DaemonSet": "apps",
    "ReplicaSet": "apps",
    "ReplicationController": "",
    "Job": "batch",
    "CronJob": "batch",
}


def test_webhook_rules() -> None:
    mutating, validating = hooks(manifests.render())
    # Every kind the core handles is registered: a handled kind nobody sends us is a bypass.
    assert set(_TEMPLATE_GROUPS) == set(TEMPLATE_PATHS)
    workloads = {
        (group, kind.lower() + "s", operation)
        for kind, group in _TEMPLATE_GROUPS.items()
        for operation in ("CREATE", "UPDATE")
    }
    assert _rules(mutating) == {("", "pods", "CREATE"), *workloads}
    assert _rules(validating) == {
        ("", "pods", "CREATE"),
        # Reserved annotations forged on a pending pod, CDI annotations added to it.
        ("", "pods", "UPDATE"),
        ("", "pods/ephemeralcontainers", "UPDATE"),
        *workloads,
    }
    for hook in (mutating, validating):
        assert sum(len(r["resources"]) for r in hook["rules"]) == len(
            {(g, r) for g, r, _ in _rules(hook)}
        ), "every rule has apiVersions [v1] and scope Namespaced"


def test_service_reference_matches_the_service(overlay: str) -> None:
    objects = manifests.render(overlay=overlay)
    service = one(objects, "Service")
    for hook in hooks(objects):
        reference = hook["clientConfig"]["service"]
        assert reference["name"] == service["metadata"]["name"]
        assert reference["namespace"] == service["metadata"]["namespace"]
        assert reference["port"] in {p["port"] for p in service["spec"]["ports"]}


# ------------------------------------------------------------- certificate modes, RBAC


def test_self_managed_mode() -> None:
    objects = manifests.render(overlay="self-managed")
    args = container(objects)["args"]
    assert args[-len(SELF_MANAGED_ARGS) :] == SELF_MANAGED_ARGS
    assert any(a.startswith("--cert-dir=/tmp/") for a in args), "certificates go to the emptyDir"
    assert pod_spec(objects)["automountServiceAccountToken"] is True
    for hook in hooks(objects):
        assert "caBundle" not in hook["clientConfig"]  # written at run time by the leader


def test_self_managed_rbac_is_least_privilege() -> None:
    objects = manifests.render(overlay="self-managed")
    cel_names = set(POLICY_NAMES)
    cel_kinds = {"validatingadmissionpolicies", "validatingadmissionpolicybindings"}
    for obj in objects:
        for rule in obj.get("rules", []):
            for field in ("apiGroups", "resources", "verbs", "resourceNames"):
                assert "*" not in rule.get(field, []), (obj["kind"], rule)
            assert not {"deletecollection", "escalate", "bind", "impersonate"} & set(rule["verbs"])
            if "delete" in rule["verbs"]:
                # Only the CEL policies the webhook renders, when the policy turns one off.
                assert set(rule["resources"]) == cel_kinds, rule
                assert set(rule["resourceNames"]) == cel_names, rule
    webhook_rule, *cel_rules = one(objects, "ClusterRole")["rules"]
    assert set(webhook_rule["resources"]) == {
        "mutatingwebhookconfigurations",
        "validatingwebhookconfigurations",
    }
    assert webhook_rule["resourceNames"] == ["gpushare-webhook"]
    assert set(webhook_rule["verbs"]) <= {"get", "patch", "update"}
    for rule in cel_rules:
        assert set(rule["resources"]) == cel_kinds
        # list and create cannot be restricted by name; everything else is.
        assert set(rule.get("resourceNames", cel_names)) == cel_names
        assert "resourceNames" in rule or set(rule["verbs"]) <= {"list", "create"}
    secret_rules = [r for r in one(objects, "Role")["rules"] if "secrets" in r["resources"]]
    for rule in secret_rules:
        # create cannot be restricted by name; everything else is.
        assert rule.get("resourceNames") == ["gpushare-webhook-tls"] or rule["verbs"] == ["create"]
    for kind, role_kind in (("RoleBinding", "Role"), ("ClusterRoleBinding", "ClusterRole")):
        binding = one(objects, kind)
        assert binding["roleRef"]["kind"] == role_kind
        assert binding["roleRef"]["name"] == "gpushare-webhook"
        assert binding["subjects"] == [
            {"kind": "ServiceAccount", "name": "gpushare-webhook", "namespace": NS}
        ]


def test_cert_manager_mode() -> None:
    objects = manifests.render(overlay="cert-manager")
    spec = pod_spec(objects)
    args = container(objects)["args"]
    assert "--tls-cert=/etc/gpushare/tls/tls.crt" in args
    assert "--tls-key=/etc/gpushare/tls/tls.key" in args
    assert not any(a.startswith("--self-managed") for a in args)
    assert spec["automountServiceAccountToken"] is False  # no API access needed
    mount = next(m for m in container(objects)["volumeMounts"] if m["name"] == "tls")
    assert mount["mountPath"] == "/etc/gpushare/tls"
    assert mount["readOnly"] is True
    assert "subPath" not in mount  # renewals must reach the pod
    volume = next(v for v in spec["volumes"] if v["name"] == "tls")
    serving = one(objects, "Certificate", "gpushare-webhook-serving")
    assert volume["secret"]["secretName"] == serving["spec"]["secretName"]
    assert set(serving["spec"]["dnsNames"]) >= {
        f"gpushare-webhook.{NS}.svc",
        f"gpushare-webhook.{NS}.svc.cluster.local",
    }
    ca = one(objects, "Certificate", "gpushare-webhook-ca")
    assert ca["spec"]["isCA"] is True
    assert serving["spec"]["issuerRef"]["name"] == "gpushare-webhook-ca"
    assert (
        one(objects, "Issuer", "gpushare-webhook-ca")["spec"]["ca"]["secretName"]
        == (ca["spec"]["secretName"])
    )
    for kind in manifests.WEBHOOK_KINDS:
        annotations = one(objects, kind)["metadata"]["annotations"]
        assert annotations["cert-manager.io/inject-ca-from"] == f"{NS}/gpushare-webhook-serving"


# ------------------------------------------------------------ customisation, webhooks


def test_namespace_override_moves_every_reference(overlay: str) -> None:
    objects = manifests.render(overlay=overlay, namespace="gpu-admission")
    for obj in objects:
        if obj["kind"] == "ConfigMap":
            continue  # the policy text is the user's
        leftovers = [s for s in strings(obj) if NS in s]
        assert not leftovers, (obj["kind"], leftovers)
    assert one(objects, "Namespace")["metadata"]["name"] == "gpu-admission"
    assert one(objects, "Deployment")["metadata"]["namespace"] == "gpu-admission"
    for hook in hooks(objects):
        assert hook["clientConfig"]["service"]["namespace"] == "gpu-admission"
        assert hook["namespaceSelector"]["matchExpressions"][0]["values"] == [
            "kube-system",
            "gpu-admission",
        ]
    if overlay == "self-managed":
        assert "--namespace=gpu-admission" in container(objects)["args"]
        for kind in ("RoleBinding", "ClusterRoleBinding"):
            assert one(objects, kind)["subjects"][0]["namespace"] == "gpu-admission"
    else:
        serving = one(objects, "Certificate", "gpushare-webhook-serving")
        assert "gpushare-webhook.gpu-admission.svc" in serving["spec"]["dnsNames"]
    with pytest.raises(ManifestError):
        manifests.render(namespace="Not_A_Namespace")


def test_ca_bundle_fills_every_webhook(overlay: str) -> None:
    for hook in hooks(manifests.render(overlay=overlay, ca_bundle=PEM)):
        assert base64.b64decode(hook["clientConfig"]["caBundle"]) == PEM
    with pytest.raises(ManifestError, match="not PEM"):
        manifests.render(ca_bundle=base64.b64encode(PEM))


def test_webhook_configurations_for_a_url() -> None:
    configurations = manifests.webhook_configurations(ca_bundle=PEM, url="https://127.0.0.1:9443/")
    assert [c["kind"] for c in configurations] == list(manifests.WEBHOOK_KINDS)
    base = [o for o in manifests.render() if o["kind"] in manifests.WEBHOOK_KINDS]
    for configuration, installed, path in zip(
        configurations, base, ("/mutate", "/validate"), strict=True
    ):
        (hook,) = configuration["webhooks"]
        assert hook["clientConfig"] == {
            "url": f"https://127.0.0.1:9443{path}",
            "caBundle": base64.b64encode(PEM).decode(),
        }
        # Everything but clientConfig is the installed registration.
        (installed_hook,) = installed["webhooks"]
        assert {k: v for k, v in hook.items() if k != "clientConfig"} == {
            k: v for k, v in installed_hook.items() if k != "clientConfig"
        }
        assert configuration["metadata"] == installed["metadata"]


def test_webhook_configurations_for_a_service() -> None:
    mutating, validating = manifests.webhook_configurations(
        ca_bundle=PEM, service=("gw", "gpu-admission")
    )
    for configuration, path in ((mutating, "/mutate"), (validating, "/validate")):
        (hook,) = configuration["webhooks"]
        assert hook["clientConfig"]["service"] == {
            "name": "gw",
            "namespace": "gpu-admission",
            "path": path,
            "port": 443,
        }
        assert "gpu-admission" in hook["namespaceSelector"]["matchExpressions"][0]["values"]
    (hook,) = manifests.webhook_configurations(ca_bundle=b"")[0]["webhooks"]
    assert "caBundle" not in hook["clientConfig"]
    assert hook["clientConfig"]["service"]["namespace"] == NS
    with pytest.raises(ValueError, match="not both"):
        manifests.webhook_configurations(ca_bundle=PEM, url="https://x", service=("a", "b"))
    with pytest.raises(ValueError, match="https"):
        manifests.webhook_configurations(ca_bundle=PEM, url="http://127.0.0.1:8080")


# ---------------------------------------------------------------- policy single source


def test_policy_copy_is_the_bundled_default_policy() -> None:
    bundled = ROOT / "webhook" / "policies" / "default.yaml"
    copy = DEPLOY / "base" / "policy.yaml"
    assert not copy.is_symlink(), "kustomize refuses symlinks that leave deploy/base"
    assert copy.read_bytes() == bundled.read_bytes(), (
        "deploy/base/policy.yaml differs from the bundled default policy; run\n"
        "    cp webhook/policies/default.yaml deploy/base/policy.yaml"
    )
    shipped = resources.files("webhook").joinpath("policies/default.yaml").read_text("utf-8")
    data = one(manifests.render(), "ConfigMap", "gpushare-policy")["data"]["policy.yaml"]
    assert data == shipped
    assert load_policy(copy).digest == load_policy(None).digest


# ------------------------------------------------------------------- the CLI, YAML


def test_manifests_command_prints_the_install(tmp_path: Path) -> None:
    out = io.StringIO()
    sys_stdout = sys.stdout
    try:
        sys.stdout = out
        assert main(["manifests"]) == 0
    finally:
        sys.stdout = sys_stdout
    documents = [d for d in yaml.safe_load_all(out.getvalue()) if d is not None]
    assert documents == manifests.render()
    # The policy stays readable in the output.
    assert "policy.yaml: |" in out.getvalue()

    ca = tmp_path / "ca.crt"
    ca.write_bytes(PEM)
    out = io.StringIO()
    try:
        sys.stdout = out
        status = main(
            [
                "manifests",
                "--overlay=cert-manager",
                "--namespace=other",
                "--image=example/gw:1",
                f"--ca-bundle={ca}",
            ]
        )
    finally:
        sys.stdout = sys_stdout
    assert status == 0
    documents = [d for d in yaml.safe_load_all(out.getvalue()) if d is not None]
    assert documents == manifests.render(
        overlay="cert-manager", namespace="other", image="example/gw:1", ca_bundle=PEM
    )


def test_manifests_command_refuses_bad_input(tmp_path: Path) -> None:
    for argv, message in (
        (["manifests", f"--ca-bundle={tmp_path / 'missing.crt'}"], "cannot read"),
        (["manifests", "--namespace=Bad_Name"], "not a valid namespace"),
    ):
        # Without a kubeconfig a note says which install is printed: not the point here.
        argv = [*argv, "--kubernetes-version=1.35"]
        err = io.StringIO()
        with redirect_stderr(err):
            assert main(argv) == 2
        assert message in err.getvalue()
        assert err.getvalue().count("\n") == 1
    with pytest.raises(SystemExit) as exit_info, redirect_stderr(io.StringIO()):
        main(["manifests", "--overlay=helm"])
    assert exit_info.value.code == 2


# ---------------------------------------------------------------- the kustomize subset


def _kustomization(directory: Path, text: str, **files: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "kustomization.yaml").write_text(text)
    for name, content in files.items():
        (directory / name).write_text(content)
    return directory


CM = "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: a, namespace: n}\ndata: {k: v}\n"


@pytest.mark.parametrize(
    ("kustomization", "message"),
    [
        ("resources: [cm.yaml]\nnamespace: other\n", "not supported"),
        ("resources: [cm.yaml]\nimages: [{name: x, newTag: y}]\n", "not supported"),
        (
            "resources: [cm.yaml]\npatches:\n- target: {kind: ConfigMap}\n"
            "  patch: '{metadata: {labels: {a: b}}}'\n",
            "JSON 6902",
        ),
        (
            "resources: [cm.yaml]\npatches:\n- target: {kind: Secret}\n"
            "  patch: '[{op: add, path: /data/x, value: y}]'\n",
            "matches no object",
        ),
        (
            "resources: [cm.yaml]\npatches:\n- target: {kind: ConfigMap, labelSelector: a=b}\n"
            "  patch: '[{op: add, path: /data/x, value: y}]'\n",
            "not supported",
        ),
        ("resources: [../outside.yaml]\n", "not in or below"),
        ("configMapGenerator:\n- name: p\n  files: [cm.yaml]\n", "disableNameSuffixHash"),
        ("resources: [cm.yaml, cm.yaml]\n", "defined twice"),
    ],
)
def test_kustomize_subset_refuses_what_it_does_not_render(
    tmp_path: Path, kustomization: str, message: str
) -> None:
    (tmp_path / "outside.yaml").write_text(CM)
    directory = _kustomization(tmp_path / "k", kustomization, **{"cm.yaml": CM})
    with pytest.raises(ManifestError, match=message):
        manifests.build(directory)


def test_kustomize_subset_refuses_a_symlink_out_of_the_directory(tmp_path: Path) -> None:
    (tmp_path / "policy.yaml").write_text("a: 1\n")
    directory = _kustomization(
        tmp_path / "k",
        "configMapGenerator:\n- name: p\n  files: [policy.yaml]\n"
        "generatorOptions: {disableNameSuffixHash: true}\n",
    )
    (directory / "policy.yaml").symlink_to(tmp_path / "policy.yaml")
    with pytest.raises(ManifestError, match="not in or below"):
        manifests.build(directory)


# ------------------------------------------------------------------ real kustomize


@pytest.fixture(scope="session")
def kubectl() -> str:
    """A kubectl with kustomize built in; see the module docstring."""
    if explicit := os.environ.get("GPUSHARE_KUBECTL"):
        return explicit
    problems = []
    go = os.environ.get("GO", "go")
    if shutil.which(go):
        built = subprocess.run(
            [str(ROOT / "hack" / "build-testbin")],
            capture_output=True,
            text=True,
            check=False,
        )
        lines = built.stdout.strip().splitlines()
        if built.returncode == 0 and lines and (Path(lines[-1]) / "kubectl").is_file():
            return str(Path(lines[-1]) / "kubectl")
        problems.append(f"hack/build-testbin failed ({built.returncode}): {built.stderr[-2000:]}")
    else:
        problems.append(f"no Go toolchain ({go}) to build kubectl with hack/build-testbin")
    if on_path := shutil.which("kubectl"):
        return on_path
    problems.append("no kubectl on PATH and GPUSHARE_KUBECTL is not set")
    reason = "cannot compare with real kustomize: " + "; ".join(problems)
    if os.environ.get("CI") == "true":
        pytest.fail(reason)
    pytest.skip(reason)


def kustomize(kubectl: str, directory: Path) -> list[Obj]:
    result = subprocess.run(
        [kubectl, "kustomize", str(directory)], capture_output=True, text=True, check=False
    )
    assert result.returncode == 0, result.stderr
    return [d for d in yaml.safe_load_all(result.stdout) if d is not None]


@pytest.mark.parametrize(
    "directory",
    [
        ".",
        "base",
        "webhooks",
        "mutatingpolicies",
        "overlays/self-managed",
        "overlays/cert-manager",
        "overlays/apiserver",
        "overlays/apiserver-cluster-view",
    ],
)
def test_kustomize_renders_what_manifests_renders(kubectl: str, directory: str) -> None:
    path = DEPLOY / directory
    rendered = kustomize(kubectl, path)
    assert rendered, f"kubectl kustomize {path} rendered nothing"
    ours = manifests.build(path)
    assert [(o["kind"], o["metadata"]["name"]) for o in ours] == [
        (o["kind"], o["metadata"]["name"]) for o in rendered
    ]
    assert ours == rendered


def test_kustomize_default_is_the_manifests_default(kubectl: str) -> None:
    assert kustomize(kubectl, DEPLOY) == manifests.render()


# ------------------------------------------------------------------------ packaging


def test_wheel_carries_the_deploy_files(tmp_path: Path) -> None:
    """A wheel (not an editable install) renders from its own copy of deploy/."""
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert built.returncode == 0, built.stderr
    (wheel,) = tmp_path.glob("*.whl")
    site = tmp_path / "site"
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        archive.extractall(site)
    tracked = subprocess.run(
        ["git", "ls-files", "deploy"], cwd=ROOT, capture_output=True, text=True, check=False
    ).stdout.split()
    on_disk = tracked or [str(p.relative_to(ROOT)) for p in DEPLOY.rglob("*") if p.is_file()]
    for path in on_disk:
        assert "webhook/_deploy/" + path.removeprefix("deploy/") in names
    # The example policies the docs name, beside the default one.
    examples = sorted(p.name for p in (ROOT / "policies" / "examples").glob("*.yaml"))
    assert examples and all(f"webhook/policies/examples/{name}" in names for name in examples)
    probe = (
        "import json, webhook.install.manifests as m; "
        "print(json.dumps([str(m.deploy_root()), m.render(overlay='cert-manager')]))"
    )
    env = {**os.environ, "PYTHONPATH": str(site)}
    # PYTHONPATH puts the unpacked wheel ahead of the editable checkout.
    result = subprocess.run(
        [sys.executable, "-c", probe],
        capture_output=True,
        text=True,
        check=False,
        env=env,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    root, objects = yaml.safe_load(result.stdout)
    assert root == str(site / "webhook" / "_deploy")
    assert objects == manifests.render(overlay="cert-manager")
