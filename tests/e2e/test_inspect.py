"""``inspect`` against a real kube-apiserver: Nodes as plain API objects (status through
the status subresource), pods placed by the binding subresource with HAMi's allocation
annotations written as its scheduler writes them, and ``kubectl gpushare inspect`` found
on PATH by a real kubectl."""

from __future__ import annotations

import json
import os
import re
import stat
import subprocess
import sys
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import orjson
import pytest

from tests.e2e.rest import SCHEDULER, Api, Obj
from tests.paths import ROOT
from webhook.cli import main
from webhook.cluster import inventory
from webhook.dev.cluster import DevCluster

pytestmark = pytest.mark.e2e

NAMESPACE: Final = "e2e-inspect"
HAMI_NODE: Final = "inspect-hami"
MIG_NODE: Final = "inspect-mig"
CPU_NODE: Final = "inspect-cpu"
H100: Final = "NVIDIA-H100-80GB-HBM3"
PROFILES: Final = [
    {
        "name": "1g.10gb",
        "memoryMB": 9856,
        "core": 14,
        "sliceCount": 1,
        "placements": [{"start": i, "size": 1} for i in range(7)],
    }
]
# What HAMi's device plugin registers: a vGPU card and a MIG card.
REGISTER: Final = json.dumps(
    [
        {"id": "GPU-a", "count": 10, "devmem": 81559, "devcore": 100, "type": H100,
         "mode": "hami-core", "health": True},
        {"id": "GPU-m", "index": 1, "count": 7, "devmem": 81559, "devcore": 100, "type": H100,
         "mode": "mig", "health": True, "migProfiles": PROFILES},
    ]
)  # fmt: skip


def call(api: Api, method: str, path: str, body: Any, *, merge: bool = False) -> Obj:
    headers = dict(api.headers)
    if merge:
        headers["Content-Type"] = "application/merge-patch+json"
    response = api.http.request(
        method, api.server + path, body=orjson.dumps(body), headers=headers, timeout=30
    )
    assert response.status in (200, 201), response.data
    result: Obj = orjson.loads(response.data)
    return result


def add_node(
    api: Api, name: str, *, status: Obj, labels: Obj | None = None, annotations: Obj | None = None
) -> None:
    metadata = {"name": name, "labels": labels or {}, "annotations": annotations or {}}
    call(api, "POST", "/api/v1/nodes", {"apiVersion": "v1", "kind": "Node", "metadata": metadata})
    # No kubelet: the capacity a device plugin would report, written to the status.
    call(
        api,
        "PATCH",
        f"/api/v1/nodes/{name}/status",
        {"status": {"capacity": status, "allocatable": status}},
        merge=True,
    )


def place(
    api: Api,
    name: str,
    limits: Obj,
    *,
    node: str | None,
    annotations: Obj | None = None,
    phase: str | None = None,
) -> None:
    """A pod created through the webhooks, then allocated and bound as the scheduler does."""
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "containers": [{"name": "main", "image": "cuda", "resources": {"limits": limits}}]
        },
    }
    created = api.create("Pod", NAMESPACE, pod, dry_run=False)
    assert created.status == 201, created.body
    if annotations:
        written = api.patch_pod(
            NAMESPACE, name, {"metadata": {"annotations": annotations}}, user=SCHEDULER
        )
        assert written.status == 200, written.body
    if node:
        binding = {
            "apiVersion": "v1",
            "kind": "Binding",
            "metadata": {"name": name},
            "target": {"apiVersion": "v1", "kind": "Node", "name": node},
        }
        call(api, "POST", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}/binding", binding)
    if phase:
        status = {"status": {"phase": phase}}
        call(api, "PATCH", f"/api/v1/namespaces/{NAMESPACE}/pods/{name}/status", status, merge=True)


@pytest.fixture(scope="module")
def kubeconfig(cluster: DevCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The placed nodes and pods; the kubeconfig to read them with. Nodes are removed
    afterwards, so other tests sharing the apiserver never see them."""
    api = Api(cluster)
    cluster.create_namespace(NAMESPACE)
    api.grant_pod_patch(NAMESPACE, SCHEDULER)
    add_node(
        api,
        HAMI_NODE,
        status={"nvidia.com/gpu": "17", "cpu": "64"},
        annotations={"hami.io/node-nvidia-register": REGISTER},
    )
    add_node(
        api,
        MIG_NODE,
        labels={"nvidia.com/mig.strategy": "mixed", "nvidia.com/mig-1g.5gb.memory": "4864"},
        status={"nvidia.com/mig-1g.5gb": "7", "cpu": "64"},
    )
    add_node(api, CPU_NODE, status={"cpu": "8"})
    allocation = {"hami.io/vgpu-node": HAMI_NODE, "hami.io/bind-phase": "allocating"}
    mig = [{"containerIndex": 0, "deviceIndex": 0, "gpuUUID": "GPU-m", "profile": "1g.10gb"}]
    place(
        api,
        "train",
        {"nvidia.com/gpumem": "20000", "nvidia.com/gpucores": "30"},
        node=HAMI_NODE,
        annotations={**allocation, "hami.io/vgpu-devices-allocated": "GPU-a,NVIDIA,20000,30:;"},
    )
    place(
        api,
        "mig-job",
        {"nvidia.com/gpumem": "9000"},
        node=HAMI_NODE,
        annotations={
            **allocation,
            "hami.io/vgpu-devices-allocated": "GPU-m,NVIDIA,9856,14:;",
            "hami.io/vgpu-mig-allocations": json.dumps(mig),
        },
    )
    place(api, "notebook", {"nvidia.com/gpumem": "4000"}, node=HAMI_NODE)
    place(
        api,
        "finished",
        {"nvidia.com/gpumem": "1000"},
        node=HAMI_NODE,
        annotations={**allocation, "hami.io/vgpu-devices-allocated": "GPU-a,NVIDIA,1000,10:;"},
        phase="Succeeded",
    )
    place(api, "pending", {"nvidia.com/gpumem": "1000"}, node=None)
    place(api, "mig-user", {"nvidia.com/mig-1g.5gb": "2"}, node=MIG_NODE)
    path = tmp_path_factory.mktemp("inspect") / "kubeconfig"
    cluster.write_kubeconfig(path)
    yield path
    for name in (HAMI_NODE, MIG_NODE, CPU_NODE):
        api.http.request("DELETE", f"{api.server}/api/v1/nodes/{name}", headers=api.headers)


def inspect_json(kubeconfig: Path, capsys: pytest.CaptureFixture[str]) -> dict[str, Obj]:
    assert main(["inspect", "--kubeconfig", str(kubeconfig), "-o", "json"]) == 0
    document = json.loads(capsys.readouterr().out)
    assert document["kind"] == "GPUInventory"
    return {n["name"]: n for n in document["nodes"]}


def test_json_shows_each_card_its_holders_and_what_is_unassigned(
    kubeconfig: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    nodes = inspect_json(kubeconfig, capsys)
    assert CPU_NODE not in nodes
    hami = nodes[HAMI_NODE]
    vgpu, mig = hami["gpus"]
    assert (vgpu["uuid"], vgpu["model"], vgpu["mode"], vgpu["memoryMiB"]) == (
        "GPU-a",
        H100,
        "vgpu",
        81559,
    )
    # "finished" (Succeeded) holds nothing; "pending" is on no node.
    assert [(p["name"], p["memoryMiB"], p["cores"]) for p in vgpu["pods"]] == [("train", 20000, 30)]
    assert (vgpu["allocatedMemoryMiB"], vgpu["allocatedCores"]) == (20000, 30)
    assert [(p["name"], p["mode"], p["migProfiles"]) for p in mig["pods"]] == [
        ("mig-job", "mig", ["1g.10gb"])
    ]
    assert mig["mig"] == [{"profile": "1g.10gb", "memoryMiB": 9856, "total": 7, "used": 1}]
    assert [(p["namespace"], p["name"], p["memoryMiB"]) for p in hami["unassigned"]] == [
        (NAMESPACE, "notebook", 4000)
    ]
    assert hami["totals"] == {
        "gpus": 2,
        "memoryMiB": 2 * 81559,
        "allocatedMemoryMiB": 20000 + 9856 + 4000,
        "cores": 200,
        "allocatedCores": 44,
        "pods": 3,
    }
    assert nodes[MIG_NODE]["mig"] == [
        {"profile": "1g.5gb", "memoryMiB": 4864, "total": 7, "used": 2}
    ]


def test_table_for_one_node(kubeconfig: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["inspect", "--kubeconfig", str(kubeconfig), "--node", HAMI_NODE]) == 0
    text = capsys.readouterr().out
    assert text.startswith(f"NODE {HAMI_NODE}  (2 GPUs, cards from HAMi)\n")
    assert MIG_NODE not in text
    for pattern in (
        rf"0 +{H100} +vgpu +20000/81559 +24% +30/100 +1",
        r"1 +NVIDIA-H100-80GB-HBM3 +mig +9856/81559 +12% +14/100 +1",
        r" +MIG 1g\.10gb 1/7",
        r"- +unassigned to a card +vgpu +4000 +0 +1",
        r"TOTAL +33856/163118 +20% +44/200 +3",
        rf"{NAMESPACE}/notebook +- +vgpu +4000 +0",
    ):
        assert re.search(f"^{pattern}$", text, re.MULTILINE), (pattern, text)
    assert "finished" not in text and "pending" not in text


@pytest.fixture(scope="module")
def plugin_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory holding ``kubectl-gpushare`` as pip installs it: a script calling the
    entry point pyproject.toml declares."""
    target = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"][
        "kubectl-gpushare"
    ]
    module, function = target.split(":")
    directory = tmp_path_factory.mktemp("plugin")
    script = directory / "kubectl-gpushare"
    script.write_text(
        f"#!{sys.executable}\nimport sys\nfrom {module} import {function}\nsys.exit({function}())\n"
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return directory


def kubectl(
    bin_dir: Path, plugins: Path, *args: str, **env: str
) -> subprocess.CompletedProcess[str]:
    path = os.pathsep.join([str(plugins), str(bin_dir), os.environ.get("PATH", "")])
    return subprocess.run(
        [str(bin_dir / "kubectl"), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=ROOT,
        env={**os.environ, "PATH": path, **env},
    )


def test_kubectl_runs_the_plugin_from_path(
    kubeconfig: Path, bin_dir: Path, plugin_path: Path
) -> None:
    table = kubectl(bin_dir, plugin_path, "gpushare", "inspect", "--kubeconfig", str(kubeconfig))
    assert table.returncode == 0, table.stderr
    assert f"NODE {HAMI_NODE}  (2 GPUs, cards from HAMi)" in table.stdout
    assert "unassigned to a card" in table.stdout
    # kubectl passes no global flags to plugins: $KUBECONFIG is how its own config reaches one.
    found = kubectl(
        bin_dir, plugin_path, "gpushare", "inspect", "-o", "json", "--node", MIG_NODE,
        KUBECONFIG=str(kubeconfig),
    )  # fmt: skip
    assert found.returncode == 0, found.stderr
    assert [n["name"] for n in json.loads(found.stdout)["nodes"]] == [MIG_NODE]


def test_kubectl_plugin_reports_an_unreachable_cluster_in_one_line(
    bin_dir: Path, plugin_path: Path, tmp_path: Path
) -> None:
    config = tmp_path / "kubeconfig"
    config.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:9'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    result = kubectl(bin_dir, plugin_path, "gpushare", "inspect", KUBECONFIG=str(config))
    assert result.returncode == 2
    assert result.stdout == ""
    assert result.stderr.startswith("kubectl gpushare: cannot reach the Kubernetes API")
    assert result.stderr.count("\n") == 1


def test_listing_follows_continue_tokens_page_by_page(
    kubeconfig: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    whole = inspect_json(kubeconfig, capsys)
    # One object a page: every node and pod comes through a continue token.
    monkeypatch.setattr(inventory, "PAGE_SIZE", 1)
    assert inspect_json(kubeconfig, capsys) == whole
    assert {HAMI_NODE, MIG_NODE} <= set(whole)
