"""A real kube-apiserver and etcd on loopback (no webhook), once per run, for the watch."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from webhook.dev.cluster import ClusterError, DevCluster, find_binaries


@pytest.fixture(scope="session")
def control_plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[DevCluster]:
    try:
        bin_dir = find_binaries()
    except ClusterError as exc:
        if os.environ.get("CI") or shutil.which("go"):
            pytest.fail(f"cannot get kube-apiserver and etcd: {exc}")
        pytest.skip(f"the watch tests need Go to build kube-apiserver and etcd: {exc}")
    workdir = tmp_path_factory.mktemp("watch")
    started = DevCluster(workdir=workdir, bin_dir=bin_dir, policy=Path(os.devnull))
    try:
        started.start_control_plane()
        yield started
    finally:
        started.stop()


@pytest.fixture(scope="session")
def core(control_plane: DevCluster) -> Any:
    from kubernetes import client

    return client.CoreV1Api(control_plane.api_client())
