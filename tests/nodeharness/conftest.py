"""A real node on loopback (webhook.dev.node) beside a dev cluster, one at a time.

The fixture ``node`` is parametrised by what runs: the node profile (default or
hardened) and the policy (the default policy, or the same with the rules under test at
``audit``, so that the attack pods reach the node). Tests name the ones they need with
:func:`on`. In CI (CI=true) a missing node binary or a machine that cannot run the node
is a failure; elsewhere the tests say they are skipped and why.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import pytest
import yaml

from tests.nodeharness.pods import NodeHarness
from tests.paths import ROOT
from webhook.dev.cluster import ClusterError, find_binaries, running
from webhook.dev.node import Node, find_node_binaries, node_unavailable

# The rules that guard the inputs the attack tests send to the node.
AUDITED_RULES: Final = (
    "raw-visible-devices",
    "host-device-access",
    "privileged-gpu",
    "limit-tampering",
    "forged-allocation",
)
# profile-variant: "audit" puts AUDITED_RULES at audit; "file" preloads libvgpu by
# mounting ld.so.preload (vgpu.preload: file) where HAMi's device plugin mounts its own.
NODES: Final = ("default", "hardened", "default-audit", "hardened-audit", "default-file")


def on(*names: str) -> pytest.MarkDecorator:
    """Run the test on each named node (see NODES), one node at a time."""
    return pytest.mark.parametrize("node", names, indirect=True)


def _unavailable(reason: str) -> None:
    if os.environ.get("CI") or shutil.which("go"):
        pytest.fail(f"cannot run the loopback node: {reason}")
    pytest.skip(f"the node tests need Go and root: {reason}")


@pytest.fixture(scope="session")
def node_binaries() -> tuple[Path, Path]:
    reason = node_unavailable()
    if reason is not None:
        _unavailable(reason)
    try:
        return find_binaries(), find_node_binaries()
    except ClusterError as exc:
        _unavailable(str(exc))
        raise  # pragma: no cover  # _unavailable raised


def _policy(variant: str) -> dict[str, Any]:
    policy: dict[str, Any] = yaml.safe_load((ROOT / "policies" / "default.yaml").read_text())
    if variant == "audit":
        for rule in AUDITED_RULES:
            policy["spec"]["rules"][rule] = "audit"
    elif variant == "file":
        policy["spec"]["vgpu"]["preload"] = "file"
    return policy


@pytest.fixture(scope="session")
def node(
    request: pytest.FixtureRequest,
    node_binaries: tuple[Path, Path],
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[NodeHarness]:
    name: str = request.param
    profile, _, variant = name.partition("-")
    bin_dir, node_bin_dir = node_binaries
    workdir = tmp_path_factory.mktemp(f"node-{name}")
    policy = workdir / "policy.yaml"
    policy.write_text(yaml.safe_dump(_policy(variant)))
    # What hack/dev-cluster --node runs: the install the apiserver's version gets.
    with running(
        bin_dir=bin_dir, policy=policy, workdir=workdir, mode=None, cel_policies=True
    ) as cluster:
        node = Node(
            cluster=cluster,
            bin_dir=node_bin_dir,
            workdir=workdir,
            profile="hardened" if profile == "hardened" else "default",
        )
        try:
            node.start()
            harness = NodeHarness(node=node, name=name)
            harness.wait_for_cards()
            yield harness
        finally:
            node.stop()
