"""`manifests` asks the cluster which install it gets, through a real kube-apiserver:
the 1.36+ install where MutatingAdmissionPolicy v1 is served, the webhooks where it is
switched off; both are accepted by the apiserver as rendered (server-side dry run)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from webhook.dev.cluster import DevCluster
from webhook.install import manifests
from webhook.install.mode import APISERVER, WEBHOOKS
from webhook.render import mutating

pytestmark = pytest.mark.e2e


def manifests_of(kubeconfig: Path) -> list[manifests.Obj]:
    done = subprocess.run(
        [sys.executable, "-m", "webhook", "manifests", f"--kubeconfig={kubeconfig}"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert not done.stderr, "asked the cluster: nothing to note"
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def dry_run_apply(bin_dir: Path, kubeconfig: Path, objects: list[manifests.Obj]) -> None:
    done = subprocess.run(
        [
            str(bin_dir / "kubectl"),
            f"--kubeconfig={kubeconfig}",
            "apply",
            "--server-side",
            "--dry-run=server",
            "-f",
            "-",
        ],
        input=manifests.to_yaml(objects),
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_a_1_36_apiserver_gets_the_apiserver_install(
    cluster: DevCluster, bin_dir: Path, tmp_path: Path
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    cluster.write_kubeconfig(kubeconfig)
    assert cluster.detect_mode() == APISERVER
    objects = manifests_of(kubeconfig)
    assert objects == manifests.render(overlay=manifests.APISERVER_OVERLAY)
    assert {o["kind"] for o in objects} >= set(mutating.KINDS)
    # The Namespace first, so that the dry run can place what lives in it.
    dry_run_apply(bin_dir, kubeconfig, [o for o in objects if o["kind"] in mutating.KINDS])


def test_an_apiserver_without_mutating_policies_gets_the_webhooks(
    bin_dir: Path, tmp_path: Path
) -> None:
    """A 1.36 apiserver with the API switched off has nothing to hold the mutation: the
    version alone would have chosen wrong."""
    cluster = DevCluster(
        workdir=tmp_path,
        bin_dir=bin_dir,
        policy=tmp_path / "unused.yaml",
        apiserver_args=(
            "--runtime-config=admissionregistration.k8s.io/v1/mutatingadmissionpolicies=false,"
            "admissionregistration.k8s.io/v1/mutatingadmissionpolicybindings=false",
            # Its admission plugin would wait for the API forever and fail the start.
            "--disable-admission-plugins=MutatingAdmissionPolicy",
        ),
    )
    try:
        cluster.start_control_plane()
        kubeconfig = tmp_path / "kubeconfig"
        cluster.write_kubeconfig(kubeconfig)
        assert cluster.detect_mode() == WEBHOOKS
        objects = manifests_of(kubeconfig)
        assert objects == manifests.render()
        dry_run_apply(
            bin_dir, kubeconfig, [o for o in objects if o["kind"] in manifests.WEBHOOK_KINDS]
        )
    finally:
        cluster.stop()
