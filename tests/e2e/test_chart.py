"""The Helm chart against a real kube-apiserver: `helm install --dry-run=server`, and every
rendering applied with a server-side dry run, defaults and each ci/ example.

A bare apiserver has no prometheus-operator or cert-manager CRDs. The test creates
minimal ones (the real group, version, kind, plural and scope; a schema that keeps
every field): the apiserver then knows the kinds and checks their apiVersion, kind and
metadata, but not their spec. Everything else (Deployment, RBAC, webhook
configurations with their CEL matchConditions, ValidatingAdmissionPolicies with
their CEL, NetworkPolicy, PodDisruptionBudget) is validated in full, CEL compiled.
"""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.conftest import own_control_plane
from tests.install.chart import (
    CHART,
    EXAMPLES,
    HELM_MAJORS,
    NAMESPACE,
    documents,
    find_helm,
    find_kubectl,
    helm_major,
    run,
    template_text,
)
from webhook.dev.cluster import DevCluster

# (group, kind, plural, scope): what the chart creates beyond Kubernetes' own kinds.
FOREIGN_KINDS = (
    ("monitoring.coreos.com", "ServiceMonitor", "servicemonitors", "Namespaced"),
    ("monitoring.coreos.com", "PrometheusRule", "prometheusrules", "Namespaced"),
    ("cert-manager.io", "Issuer", "issuers", "Namespaced"),
    ("cert-manager.io", "ClusterIssuer", "clusterissuers", "Cluster"),
    ("cert-manager.io", "Certificate", "certificates", "Namespaced"),
)


def minimal_crd(group: str, kind: str, plural: str, scope: str) -> dict[str, Any]:
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{plural}.{group}"},
        "spec": {
            "group": group,
            "scope": scope,
            "names": {"kind": kind, "plural": plural, "singular": kind.lower()},
            "versions": [
                {
                    "name": "v1",
                    "served": True,
                    "storage": True,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "x-kubernetes-preserve-unknown-fields": True,
                        }
                    },
                }
            ],
        },
    }


@pytest.fixture(scope="module", params=HELM_MAJORS, ids=lambda major: f"helm{major}")
def helm(request: pytest.FixtureRequest) -> str:
    """Each test that renders the chart runs with Helm 4 and with Helm 3."""
    path = find_helm(request.param)
    assert helm_major(path) == request.param, f"{path} is not Helm {request.param}"
    return path


@pytest.fixture(scope="module")
def kubectl() -> str:
    return find_kubectl()


@pytest.fixture(scope="module")
def bare(bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    """A control plane of its own with nothing installed, as a cluster is before
    `helm install`: the session cluster registers gpushare-webhook configurations that
    no Helm release owns, which helm rightly refuses to adopt."""
    with own_control_plane(bin_dir, tmp_path_factory.mktemp("chart-cluster")) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def kubeconfig(bare: DevCluster) -> Path:
    return bare.workdir / "kubeconfig"


@pytest.fixture(scope="module")
def prepared(bare: DevCluster, kubectl: str, kubeconfig: Path) -> None:
    """The release namespace and the foreign kinds' CRDs, established."""
    bare.create_namespace(NAMESPACE)
    crds = [minimal_crd(*kind) for kind in FOREIGN_KINDS]
    text = yaml.safe_dump_all(crds)
    applied = run([kubectl, "--kubeconfig", str(kubeconfig), "apply", "-f", "-"], stdin=text)
    assert applied.returncode == 0, applied.stderr
    names = [f"crd/{crd['metadata']['name']}" for crd in crds]
    established = run(
        [
            kubectl,
            "--kubeconfig",
            str(kubeconfig),
            "wait",
            "--for=condition=Established",
            "--timeout=60s",
            *names,
        ]
    )
    assert established.returncode == 0, established.stderr


CASES = [None, *EXAMPLES]


def case_id(example: Path | None) -> str:
    return "defaults" if example is None else example.name


def dry_run_apply(kubectl: str, kubeconfig: Path, text: str) -> subprocess.CompletedProcess[str]:
    """`kubectl apply --server-side --dry-run=server` of TEXT, one name printed per object."""
    argv = [kubectl, "--kubeconfig", str(kubeconfig), "apply", "--server-side"]
    argv += ["--dry-run=server", "--field-manager=helm", "--output=name", "-f", "-"]
    return run(argv, stdin=text)


@pytest.mark.usefixtures("prepared")
@pytest.mark.parametrize("example", CASES, ids=case_id)
def test_render_passes_a_server_side_dry_run(
    helm: str, kubectl: str, kubeconfig: Path, example: Path | None
) -> None:
    text = template_text(helm, values=[example] if example else [])
    result = dry_run_apply(kubectl, kubeconfig, text)
    assert result.returncode == 0, result.stderr
    # One line per object: nothing was skipped.
    assert len(result.stdout.split()) == len(documents(text)), result.stdout


@pytest.mark.usefixtures("prepared")
def test_the_dry_run_compiles_the_cel(
    helm: str, kubectl: str, kubeconfig: Path, tmp_path: Path
) -> None:
    """The dry run is not a formality: a matchCondition that does not compile is refused."""
    broken = tmp_path / "mc.yaml"
    # Marked as the default policy's, which the chart installs: the apiserver judges it.
    default = yaml.safe_load((CHART / "files" / "match-conditions.yaml").read_text())
    broken.write_text(
        yaml.safe_dump(
            {
                "policySpec": default["policySpec"],
                "matchConditions": [{"name": "broken", "expression": "object.spec.("}],
            }
        )
    )
    text = template_text(helm, extra=["--set-file", f"policy.matchConditions={broken}"])
    result = dry_run_apply(kubectl, kubeconfig, text)
    assert result.returncode != 0
    assert "matchConditions[0].expression" in result.stderr, result.stderr


@pytest.mark.usefixtures("prepared")
@pytest.mark.parametrize("example", CASES, ids=case_id)
def test_helm_install_dry_run_server(helm: str, kubeconfig: Path, example: Path | None) -> None:
    argv = [
        helm,
        "install",
        "gpushare-webhook",
        str(CHART),
        "--namespace",
        NAMESPACE,
        "--kubeconfig",
        str(kubeconfig),
        "--dry-run=server",
    ]
    if example:
        argv += ["--values", str(example)]
    result = run(argv)
    assert result.returncode == 0, result.stderr
    assert "STATUS: pending-install" in result.stdout, result.stdout[:2000]


@pytest.mark.usefixtures("prepared")
@pytest.mark.parametrize("mode", ["self-managed", "cert-manager"])
def test_notes_for_a_policy_of_your_own(helm: str, kubeconfig: Path, mode: str) -> None:
    """Both: how to render every admission object again with the policy. Self-managed:
    the leader also follows an edit of the ConfigMap alone; cert-manager: nobody does."""
    argv = [helm, "install", "gpushare-webhook", str(CHART), "--namespace", NAMESPACE]
    argv += ["--kubeconfig", str(kubeconfig), "--dry-run=server"]
    argv += ["--values", str(CHART / "ci" / "strict-policy-values.yaml")]
    result = run([*argv, "--set", f"certificates.mode={mode}"])
    assert result.returncode == 0, result.stderr
    notes = result.stdout.split("NOTES:", 1)[1]
    assert "gpushare-webhook manifests --helm-values" in notes
    leader = "the elected replica re-renders them" in notes
    assert leader == (mode == "self-managed"), notes
    assert f"gpushare-webhook uninstall --namespace {NAMESPACE}" in notes
