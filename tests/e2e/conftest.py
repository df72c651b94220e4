"""A real kube-apiserver and etcd on loopback with the webhook registered, once per run.

In CI (CI=true) a missing control plane is a failure; a developer without Go gets a
skip that says how to get one.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.paths import ROOT
from webhook.dev.cluster import ClusterError, DevCluster, find_binaries, running


@pytest.fixture(scope="session")
def bin_dir() -> Path:
    try:
        return find_binaries()
    except ClusterError as exc:
        if os.environ.get("CI") or shutil.which("go"):
            pytest.fail(f"cannot get kube-apiserver and etcd: {exc}")
        pytest.skip(f"end-to-end tests need Go to build kube-apiserver and etcd: {exc}")


@pytest.fixture(scope="session")
def cluster(bin_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    workdir = tmp_path_factory.mktemp("cluster")
    policy = workdir / "policy.yaml"
    policy.write_text((ROOT / "policies" / "default.yaml").read_text())
    with running(bin_dir=bin_dir, policy=policy, workdir=workdir) as started:
        yield started


@pytest.fixture(scope="session")
def core(cluster: DevCluster) -> Any:
    from kubernetes import client

    return client.CoreV1Api(cluster.api_client())


@pytest.fixture(scope="session")
def apps(cluster: DevCluster) -> Any:
    from kubernetes import client

    return client.AppsV1Api(cluster.api_client())


@pytest.fixture
def namespace(cluster: DevCluster, request: pytest.FixtureRequest) -> str:
    name: str = "e2e-" + request.node.name.replace("_", "-").lower()[:40].strip("-")
    cluster.create_namespace(name)
    return name


@contextlib.contextmanager
def own_control_plane(bin_dir: Path, workdir: Path) -> Iterator[DevCluster]:
    """etcd and kube-apiserver of their own, nothing registered, with a kubeconfig at
    ``workdir/kubeconfig``: for tests that install or remove what the session cluster
    has registered under the install's names."""
    cluster = DevCluster(workdir=workdir, bin_dir=bin_dir, policy=workdir / "unused.yaml")
    try:
        cluster.start_control_plane()
        cluster.write_kubeconfig(workdir / "kubeconfig")
        yield cluster
    finally:
        cluster.stop()
