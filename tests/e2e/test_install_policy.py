"""A policy of your own, installed by each install path onto kube-apiserver 1.36 with no
webhook process and no leader running (no kubelet, no controller-manager: the Deployment
never gets a pod), mutates and refuses exactly as `gpushare-webhook review --policy` says.

The policy is policies/examples/strict.yaml: its mutation differs from the default's (the
preload as a file, GPU_CORE_UTILIZATION_POLICY=force, mps only in its namespaces), so the
default policy's MutatingAdmissionPolicies, which the chart used to install beside it,
give another pod (the test checks that the default's answer differs).
"""

from __future__ import annotations

import copy
import io
import json
import time
from collections.abc import Callable, Iterator
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import jsonpatch
import pytest
import yaml

from tests.e2e.conftest import own_control_plane
from tests.e2e.rest import Api
from tests.e2e.test_mutatingpolicy import touched
from tests.install.chart import CHART, find_helm, find_kubectl, run
from tests.paths import EXAMPLES, MANIFESTS
from webhook.cli import main
from webhook.dev.cluster import DevCluster

POLICY = EXAMPLES / "strict.yaml"
INSTALL_NAMESPACE = "gpushare-system"
TENANT = "ml"
Obj = dict[str, Any]


def cli(*argv: str) -> str:
    out = io.StringIO()
    with redirect_stdout(out):
        assert main(list(argv)) in (0, 1)
    return out.getvalue()


def hami_pod() -> Obj:
    pod: Obj = yaml.safe_load((MANIFESTS / "hami-vgpu-pod.yaml").read_text())
    pod["metadata"].pop("namespace")
    return pod


def mps_pod() -> Obj:
    """An mps pod in a namespace the strict policy does not give mps."""
    pod = hami_pod()
    pod["metadata"] = {"name": "mps-pod", "annotations": {"gpushare.io/mode": "mps"}}
    return pod


def privileged_pod() -> Obj:
    pod = hami_pod()
    pod["metadata"]["name"] = "privileged-pod"
    pod["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    return pod


def reviewed(pod: Obj, policy: Path | None, tmp_path: Path) -> tuple[bool, list[str], Obj]:
    """`review --policy` on ``pod`` as admission sees it: allowed, rules, mutated pod."""
    path = tmp_path / "pod.json"
    path.write_text(json.dumps(pod))
    argv = ["review", "-f", str(path), "--namespace", TENANT, "-o", "json"]
    if policy is not None:
        argv += ["--policy", str(policy)]
    (result,) = json.loads(cli(*argv))
    rules = [v["rule"] for v in result["violations"]]
    mutated = jsonpatch.apply_patch(pod, result["patch"]) if result.get("patch") else pod
    return bool(result["allowed"]), rules, mutated


def install_helm(cluster: DevCluster, kubeconfig: Path, tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(cli("manifests", "--helm-values", "--policy", str(POLICY)))
    argv = [find_helm(4), "install", "gpushare-webhook", str(CHART), "-n", INSTALL_NAMESPACE]
    result = run([*argv, "--kubeconfig", str(kubeconfig), "--values", str(values)])
    assert result.returncode == 0, result.stderr
    # Helm asked the apiserver, which serves MutatingAdmissionPolicy v1: the 1.36+ install.
    assert "The install for Kubernetes 1.36+" in result.stdout, result.stdout


def install_manifests(cluster: DevCluster, kubeconfig: Path, tmp_path: Path) -> None:
    text = cli("manifests", "--kubeconfig", str(kubeconfig), "--policy", str(POLICY))
    applied = run(
        [find_kubectl(), "--kubeconfig", str(kubeconfig), "apply", "--server-side", "-f", "-"],
        stdin=text,
    )
    assert applied.returncode == 0, applied.stderr


def install_kustomize(cluster: DevCluster, kubeconfig: Path, tmp_path: Path) -> None:
    """deploy/README.md's way: the rendered install committed as a kustomize resource."""
    directory = tmp_path / "install"
    directory.mkdir()
    (directory / "install.yaml").write_text(
        cli("manifests", "--kubernetes-version", "1.36", "--policy", str(POLICY))
    )
    (directory / "kustomization.yaml").write_text("resources: [install.yaml]\n")
    applied = run(
        [
            find_kubectl(),
            "--kubeconfig",
            str(kubeconfig),
            "apply",
            "--server-side",
            "-k",
            str(directory),
        ]
    )
    assert applied.returncode == 0, applied.stderr


INSTALLS: dict[str, Callable[[DevCluster, Path, Path], None]] = {
    "helm": install_helm,
    "manifests": install_manifests,
    "kustomize": install_kustomize,
}


@pytest.fixture
def bare(bin_dir: Path, tmp_path: Path) -> Iterator[DevCluster]:
    with own_control_plane(bin_dir, tmp_path / "cluster") as cluster:
        yield cluster


@pytest.mark.parametrize("path", sorted(INSTALLS))
def test_a_policy_of_your_own_holds_without_any_webhook_process(
    bare: DevCluster, tmp_path: Path, path: str
) -> None:
    kubeconfig = bare.workdir / "kubeconfig"
    for name in (INSTALL_NAMESPACE, TENANT, "kube-system"):
        bare.create_namespace(name)
    INSTALLS[path](bare, kubeconfig, tmp_path)
    api = Api(bare)

    def as_admitted(pod: Obj) -> Obj:
        # kube-system is excluded: there the apiserver only defaults the pod.
        plain = api.create("Pod", "kube-system", pod)
        assert plain.status == 201, plain.body
        body: Obj = copy.deepcopy(plain.body)
        body["metadata"]["namespace"] = TENANT
        return body

    vgpu = hami_pod()
    allowed, rules, wanted = reviewed(as_admitted(vgpu), POLICY, tmp_path)
    assert allowed and not rules
    _, _, default = reviewed(as_admitted(vgpu), None, tmp_path)
    # The test can fail: the default policy mutates this pod otherwise.
    assert touched("Pod", default) != touched("Pod", wanted)
    deadline = time.monotonic() + 60
    while True:
        got = api.create("Pod", TENANT, vgpu)
        if got.status == 201 and touched("Pod", got.body) == touched("Pod", wanted):
            break
        # The apiserver loads new admission policies within a few seconds.
        assert time.monotonic() < deadline, f"{got.status}: {touched('Pod', got.body)}"
        time.sleep(1)
    for pod in (mps_pod(), privileged_pod()):
        allowed, rules, _ = reviewed(as_admitted(pod), POLICY, tmp_path)
        assert not allowed and rules
        while True:
            got = api.create("Pod", TENANT, pod)
            if got.status != 201:
                break
            # The ValidatingAdmissionPolicies load on their own time, too.
            assert time.monotonic() < deadline, f"{rules}: admitted"
            time.sleep(1)
        assert got.status in (400, 403, 422), got.body
        assert any(f"[{rule}]" in got.body["message"] for rule in rules), (rules, got.body)
    # Nothing ran: no pod exists to be a leader or answer a webhook call.
    pods = run([find_kubectl(), "--kubeconfig", str(kubeconfig), "get", "pods", "-A", "-o", "name"])
    assert pods.returncode == 0 and not pods.stdout.strip(), pods.stdout
