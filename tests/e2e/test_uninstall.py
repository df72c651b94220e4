"""`gpushare-webhook uninstall` against a real kube-apiserver: the install applied as
`manifests` renders it, the self-managed leader run as the real command (its Secret,
Lease and a CEL policy the install did not have), then the uninstall, and nothing of
ours found afterwards, by the part-of label or by name. What is not the install's stays:
a CRD (even one labelled part-of=gpushare), a labelled object in another namespace, a
user's object in the install's namespace.

No controller-manager runs here: the Namespace is left Terminating (its finalizer is the
namespace controller's), which is what a real cluster shows until it has emptied it.
"""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pytest
import yaml

from tests.e2e import serving
from tests.e2e.conftest import own_control_plane
from tests.install.chart import CHART, find_helm, find_kubectl, run
from webhook.dev.cluster import DevCluster
from webhook.install import manifests
from webhook.render import mutating, validating

pytestmark = pytest.mark.e2e

NAMESPACE: Final = manifests.BASE_NAMESPACE
LABEL: Final = "app.kubernetes.io/part-of=gpushare"
WAIT: Final = 60.0
# The default policy with one rule softened: the leader adds gpushare-warn and its
# binding, which the applied install did not carry.
POLICY: Final = (
    (Path(__file__).parents[2] / "policies" / "default.yaml")
    .read_text()
    .replace("privileged-gpu: deny", "privileged-gpu: warn")
)
CLUSTER_KINDS: Final = (
    "mutatingwebhookconfigurations,validatingwebhookconfigurations,"
    "validatingadmissionpolicies,validatingadmissionpolicybindings,"
    "clusterroles,clusterrolebindings"
)
NAMESPACED_KINDS: Final = (
    "deployments,services,serviceaccounts,configmaps,secrets,leases,roles,rolebindings,"
    "poddisruptionbudgets,networkpolicies"
)
REPORT_CRD: Final = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    # Labelled as ours on purpose: a CRD is never the install's to delete.
    "metadata": {
        "name": "reports.openreports.io",
        "labels": {"app.kubernetes.io/part-of": "gpushare"},
    },
    "spec": {
        "group": "openreports.io",
        "scope": "Namespaced",
        "names": {"kind": "Report", "plural": "reports", "singular": "report"},
        "versions": [
            {
                "name": "v1alpha1",
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


@pytest.fixture(scope="module")
def kubectl() -> str:
    return find_kubectl()


@pytest.fixture(scope="module")
def bare(bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    """A control plane of its own: the session cluster registers configurations under the
    install's names, which an uninstall here would take away from the other tests."""
    with own_control_plane(bin_dir, tmp_path_factory.mktemp("uninstall-cluster")) as cluster:
        yield cluster


@pytest.fixture(scope="module")
def kubeconfig(bare: DevCluster) -> Path:
    return bare.workdir / "kubeconfig"


def kube(kubectl: str, kubeconfig: Path, *argv: str, stdin: str | None = None) -> str:
    result = run([kubectl, "--kubeconfig", str(kubeconfig), *argv], stdin=stdin)
    assert result.returncode == 0, result.stderr
    return result.stdout


def names(kubectl: str, kubeconfig: Path, *argv: str) -> set[str]:
    return set(kube(kubectl, kubeconfig, "get", *argv, "-o", "name").split())


def ours(kubectl: str, kubeconfig: Path) -> set[str]:
    """Everything of the install a user would look for: labelled cluster-wide, anything in
    the install's namespace, and every CEL policy or binding by the names it renders."""
    found = names(kubectl, kubeconfig, CLUSTER_KINDS, "-l", LABEL)
    found |= names(kubectl, kubeconfig, "-n", NAMESPACE, NAMESPACED_KINDS)
    for kind in ("validatingadmissionpolicies", "validatingadmissionpolicybindings"):
        found |= {
            name
            for name in names(kubectl, kubeconfig, kind)
            if name.split("/", 1)[1] in validating.POLICY_NAMES
        }
    return found


def short(name: str) -> str:
    """kubectl's ``deployment.apps/x`` as ``deployment/x``."""
    resource, _, rest = name.partition("/")
    return f"{resource.split('.', 1)[0]}/{rest}"


def uninstall(kubeconfig: Path, *argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "webhook", "uninstall", f"--kubeconfig={kubeconfig}", *argv],
        capture_output=True,
        text=True,
        check=False,
        timeout=180,
    )


def test_uninstall_leaves_nothing_of_the_install(
    bare: DevCluster, kubectl: str, kubeconfig: Path, tmp_path: Path
) -> None:
    kube(kubectl, kubeconfig, "apply", "-f", "-", stdin=yaml.safe_dump(REPORT_CRD))
    install = manifests.to_yaml(manifests.render())
    kube(kubectl, kubeconfig, "apply", "--server-side", "-f", "-", stdin=install)
    # A user's object in the install's namespace, and one labelled as ours elsewhere.
    kube(kubectl, kubeconfig, "-n", NAMESPACE, "create", "configmap", "tenant-notes")
    kube(kubectl, kubeconfig, "create", "namespace", "elsewhere")
    kube(kubectl, kubeconfig, "-n", "elsewhere", "create", "configmap", "shared")
    kube(kubectl, kubeconfig, "-n", "elsewhere", "label", "configmap", "shared", LABEL)
    # A policy report the leader wrote in a tenant's namespace (serve --reports).
    kube(kubectl, kubeconfig, "wait", "--for=condition=established", "crd/reports.openreports.io")
    report = {
        "apiVersion": "openreports.io/v1alpha1",
        "kind": "Report",
        "metadata": {
            "name": "gpushare-webhook",
            "namespace": "elsewhere",
            "labels": {"app.kubernetes.io/managed-by": "gpushare-webhook"},
        },
        "summary": {"fail": 1},
    }
    kube(kubectl, kubeconfig, "apply", "-f", "-", stdin=yaml.safe_dump(report))

    policy = tmp_path / "policy.yaml"
    policy.write_text(POLICY)
    deadline = time.monotonic() + WAIT
    with serving.self_managed(
        bare,
        tmp_path,
        namespace=NAMESPACE,
        secret="gpushare-webhook-tls",
        webhook_config="gpushare-webhook",
        pod_name="gpushare-webhook-0",
        args=(f"--policy={policy}",),
    ) as served:
        # The leader has written its Secret, taken its Lease and rendered gpushare-warn,
        # and the server is up (a SIGTERM before that is not a clean stop).
        warn = "validatingadmissionpolicybinding.admissionregistration.k8s.io/gpushare-warn"
        while "serving https://" not in served.output() or warn not in names(
            kubectl, kubeconfig, "validatingadmissionpolicybindings"
        ):
            assert served.process.poll() is None, served.output()
            assert time.monotonic() < deadline, served.output()
            time.sleep(0.1)
    before = ours(kubectl, kubeconfig)
    leader_made = {
        "secret/gpushare-webhook-tls",
        "lease.coordination.k8s.io/gpushare-webhook-tls-leader",
        "validatingadmissionpolicy.admissionregistration.k8s.io/gpushare-warn",
        "validatingadmissionpolicybinding.admissionregistration.k8s.io/gpushare-warn",
    }
    assert leader_made <= before, before
    # Every object the install applied is there to be removed (kubectl's resource.group/name
    # and kind/name, compared by lower-case kind and name).
    applied = {
        f"{obj['kind'].lower()}/{obj['metadata']['name']}"
        for obj in manifests.render()
        if obj["kind"] != "Namespace"
    }
    assert {short(name) for name in before} >= applied

    dry = uninstall(kubeconfig, "--dry-run")
    assert dry.returncode == 0, dry.stderr
    assert "would delete MutatingWebhookConfiguration gpushare-webhook" in dry.stdout
    assert "would delete Lease gpushare-system/gpushare-webhook-tls-leader" in dry.stdout
    assert "would delete Namespace gpushare-system" in dry.stdout
    assert "would delete Report elsewhere/gpushare-webhook" in dry.stdout
    assert "tenant-notes" not in dry.stdout, "a user's object is not the install's"
    assert ours(kubectl, kubeconfig) == before, "a dry run deleted something"

    done = uninstall(kubeconfig)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    # The webhooks go first, the Deployment next, then the CEL policies, bindings first.
    assert lines[:2] == [
        "deleted MutatingWebhookConfiguration gpushare-webhook",
        "deleted ValidatingWebhookConfiguration gpushare-webhook",
    ], done.stdout
    assert lines[2] == "deleted Deployment gpushare-system/gpushare-webhook", done.stdout
    assert lines.index("deleted ValidatingAdmissionPolicyBinding gpushare-warn") < lines.index(
        "deleted ValidatingAdmissionPolicy gpushare-warn"
    )
    assert ours(kubectl, kubeconfig) == {"configmap/tenant-notes"}
    namespace = yaml.safe_load(
        kube(kubectl, kubeconfig, "get", "namespace", NAMESPACE, "-o", "yaml")
    )
    assert namespace["metadata"].get("deletionTimestamp"), "the install's Namespace is deleted"
    # Not the install's: kept.
    assert names(kubectl, kubeconfig, "crd") >= {
        "customresourcedefinition.apiextensions.k8s.io/reports.openreports.io"
    }
    assert names(kubectl, kubeconfig, "-n", "elsewhere", "configmaps", "-l", LABEL) == {
        "configmap/shared"
    }
    assert names(kubectl, kubeconfig, "-n", "elsewhere", "reports.openreports.io") == set()

    again = uninstall(kubeconfig)
    assert again.returncode == 0, again.stderr
    assert "deleted" not in again.stdout.replace("already being deleted", ""), again.stdout


def test_uninstall_keeps_a_namespace_it_did_not_create(
    bare: DevCluster, kubectl: str, kubeconfig: Path
) -> None:
    """`helm install --create-namespace` (or a user) made the namespace: it stays."""
    objects = manifests.render(namespace="gpu-admission")
    kube(kubectl, kubeconfig, "create", "namespace", "gpu-admission")
    rest = [obj for obj in objects if obj["kind"] != "Namespace"]
    kube(kubectl, kubeconfig, "apply", "--server-side", "-f", "-", stdin=manifests.to_yaml(rest))
    done = uninstall(kubeconfig, "--namespace=gpu-admission")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "deleted Deployment gpu-admission/gpushare-webhook" in done.stdout
    assert "kept Namespace gpu-admission: not created by the install" in done.stdout
    namespace = yaml.safe_load(
        kube(kubectl, kubeconfig, "get", "namespace", "gpu-admission", "-o", "yaml")
    )
    assert not namespace["metadata"].get("deletionTimestamp")
    assert not names(kubectl, kubeconfig, "-n", "gpu-admission", NAMESPACED_KINDS)
    assert not names(kubectl, kubeconfig, CLUSTER_KINDS, "-l", LABEL)


def test_uninstall_removes_the_1_36_installs_mutating_policies(
    bare: DevCluster, kubectl: str, kubeconfig: Path
) -> None:
    """The 1.36+ install (deploy/overlays/apiserver): its MutatingAdmissionPolicies and
    bindings go with the rest, bindings first."""
    namespace = "gpu-in-apiserver"
    objects = manifests.render(overlay=manifests.APISERVER_OVERLAY, namespace=namespace)
    kube(kubectl, kubeconfig, "apply", "--server-side", "-f", "-", stdin=manifests.to_yaml(objects))
    kinds = "mutatingadmissionpolicies,mutatingadmissionpolicybindings"
    assert {name.split("/", 1)[1] for name in names(kubectl, kubeconfig, kinds)} == set(
        mutating.POLICY_NAMES
    )
    done = uninstall(kubeconfig, f"--namespace={namespace}")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    for name in mutating.POLICY_NAMES:
        assert lines.index(f"deleted MutatingAdmissionPolicyBinding {name}") < lines.index(
            f"deleted MutatingAdmissionPolicy {name}"
        ), done.stdout
    assert not names(kubectl, kubeconfig, kinds)
    assert not names(kubectl, kubeconfig, CLUSTER_KINDS, "-l", LABEL)


def test_without_rights_it_names_what_it_could_not_delete(
    bare: DevCluster, kubectl: str, kubeconfig: Path, tmp_path: Path
) -> None:
    """A user who may only read the namespace: exit 1, each refusal named on stderr,
    nothing deleted; the admin's uninstall then removes it all."""
    objects = manifests.render(namespace="gpu-readonly")
    kube(kubectl, kubeconfig, "apply", "--server-side", "-f", "-", stdin=manifests.to_yaml(objects))
    kube(kubectl, kubeconfig, "-n", "gpu-readonly", "create", "serviceaccount", "viewer")
    # A Role of its own: the built-in `view` is an aggregated role, filled by the
    # controller-manager, which does not run here.
    ns = ("-n", "gpu-readonly")
    kube(
        kubectl,
        kubeconfig,
        *ns,
        "create",
        "role",
        "viewer",
        "--verb=get,list",
        "--resource=deployments,services,configmaps",
    )
    kube(
        kubectl,
        kubeconfig,
        *ns,
        "create",
        "rolebinding",
        "viewer",
        "--role=viewer",
        "--serviceaccount=gpu-readonly:viewer",
    )
    token = kube(kubectl, kubeconfig, "-n", "gpu-readonly", "create", "token", "viewer").strip()
    config: dict[str, Any] = yaml.safe_load(kubeconfig.read_text())
    config["users"][0]["user"] = {"token": token}
    viewer = tmp_path / "viewer.kubeconfig"
    viewer.write_text(yaml.safe_dump(config))
    before = names(kubectl, kubeconfig, "-n", "gpu-readonly", NAMESPACED_KINDS)

    refused = uninstall(viewer, "--namespace=gpu-readonly", "--wait=0")
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "cannot delete Deployment gpu-readonly/gpushare-webhook: 403" in refused.stderr
    assert "cannot list mutatingwebhookconfigurations: 403" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert names(kubectl, kubeconfig, "-n", "gpu-readonly", NAMESPACED_KINDS) == before

    done = uninstall(kubeconfig, "--namespace=gpu-readonly")
    assert done.returncode == 0, done.stdout + done.stderr
    assert names(kubectl, kubeconfig, "-n", "gpu-readonly", NAMESPACED_KINDS) == {
        "serviceaccount/viewer",
        "role.rbac.authorization.k8s.io/viewer",
        "rolebinding.rbac.authorization.k8s.io/viewer",
    }


def test_a_helm_release_is_left_to_helm_first(
    bare: DevCluster, kubectl: str, kubeconfig: Path
) -> None:
    """uninstall names the release and the order, and deletes nothing; once helm
    uninstall removed the release, it removes what Helm left (the Namespace here)."""
    helm = find_helm(4)
    namespace = "gpu-helm"
    argv = [helm, "install", "gpushare-webhook", str(CHART), "-n", namespace, "--create-namespace"]
    installed = subprocess.run(
        [*argv, "--kubeconfig", str(kubeconfig), "--set", "admission.mode=webhooks"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert installed.returncode == 0, installed.stderr
    for argv in (["--dry-run"], []):
        refused = uninstall(kubeconfig, f"--namespace={namespace}", *argv)
        assert refused.returncode == 2, refused.stdout + refused.stderr
        assert f"helm uninstall gpushare-webhook --namespace {namespace}" in refused.stderr
        assert (
            "1. helm uninstall" in refused.stderr
            and "2. gpushare-webhook uninstall" in refused.stderr
        )
    # Nothing was deleted.
    kube(kubectl, kubeconfig, "-n", namespace, "get", "deployment/gpushare-webhook")
    removed = subprocess.run(
        [helm, "uninstall", "gpushare-webhook", "-n", namespace, "--kubeconfig", str(kubeconfig)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert removed.returncode == 0, removed.stderr
    done = uninstall(kubeconfig, f"--namespace={namespace}")
    assert done.returncode == 0, done.stderr
