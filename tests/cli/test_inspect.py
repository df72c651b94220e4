"""``inspect`` and the ``kubectl gpushare`` plugin: the table, the plugin's parser, and a
cluster that cannot be read (the listing itself is tested through a real apiserver in
tests/e2e/test_inspect.py)."""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

import pytest

from tests.core.test_allocation import allocated, hami_device, hami_node, node, pod
from tests.paths import ROOT
from webhook.cli import main
from webhook.cli.inspect import plugin, plugin_parser, render_table
from webhook.core.allocation import NodeAllocation, allocations
from webhook.policies import DEFAULT_POLICY

MIG_PROFILES = [
    {"name": "1g.10gb", "memoryMB": 9856, "placements": [{"start": i, "size": 1} for i in range(7)]}
]


def inventory() -> tuple[NodeAllocation, ...]:
    hami = hami_node(
        "gpu-node-1",
        hami_device("GPU-a", 0),
        hami_device("GPU-m", 1, mode="mig", migProfiles=MIG_PROFILES, type="NVIDIA-" * 8),
    )
    reservation = json.dumps([{"containerIndex": 0, "deviceIndex": 0, "profile": "1g.10gb"}])
    pods = [
        pod("train", node_name="gpu-node-1", annotations=allocated("GPU-a,NVIDIA,20000,30:;")),
        pod(
            "mig-job",
            node_name="gpu-node-1",
            annotations=allocated(
                "GPU-m,NVIDIA,9856,14:;", **{"hami.io/vgpu-mig-allocations": reservation}
            ),
        ),
        pod("notebook", node_name="gpu-node-1", limits={"nvidia.com/gpumem": "4000"}),
    ]
    return allocations([hami, node("cpu", {"cpu": "4"})], pods, DEFAULT_POLICY)


def test_table_has_a_card_row_each_the_mig_layout_unassigned_pods_and_totals() -> None:
    text = render_table(inventory())
    lines = text.splitlines()
    assert lines[0] == "NODE gpu-node-1  (2 GPUs, cards from HAMi)"
    assert re.search(r"^0 +NVIDIA-H100-80GB-HBM3 +vgpu +20000/81559 +24% +30/100 +1$", text, re.M)
    assert re.search(r"^ +MIG 1g\.10gb 1/7$", text, re.M)
    assert re.search(r"^- +unassigned to a card +vgpu +4000 +0 +1$", text, re.M)
    assert re.search(r"^TOTAL +33856/163118 +20% +44/200 +3$", text, re.M)
    assert re.search(r"^ml/mig-job +1 +mig +9856 +14 +1g\.10gb$", text, re.M)
    assert re.search(r"^ml/notebook +- +vgpu +4000 +0$", text, re.M)
    assert "GPU -: unassigned to a card" in text
    assert "cpu" not in text.split("\n\n")[-1]


def test_table_columns_align_and_fit_80_columns_with_long_model_names() -> None:
    lines = render_table(inventory()).splitlines()
    assert max(len(line) for line in lines) <= 80
    header = next(line for line in lines if line.startswith("GPU "))
    total = next(line for line in lines if line.startswith("TOTAL"))
    # Right-aligned numbers end where their header ends.
    assert header.index("PODS") + len("PODS") == len(total)
    assert header.index("MODEL") == next(line for line in lines if "MIG 1g" in line).index("MIG")
    long_model = next(line for line in lines if line.startswith("1 "))
    assert "NVIDIA-NVIDIA-NVIDIA-NVIDI.." in long_model


def test_a_node_with_no_cards_shows_its_mig_resources_and_unassigned_pods() -> None:
    mig_node = node("mig", {"nvidia.com/mig-1g.5gb": "7"})
    user = pod("user", node_name="mig", limits={"nvidia.com/mig-1g.5gb": "1"})
    text = render_table(allocations([mig_node], [user], DEFAULT_POLICY))
    assert text.startswith("NODE mig  (0 GPUs, cards from -)\n")
    assert re.search(r"^- +unassigned to a card +mig +0 +0 +1$", text, re.M)
    assert "MIG on the node: 1g.5gb 1/7" in text
    assert re.search(r"^ml/user +- +mig +- +0 +1g\.5gb$", text, re.M)


def test_an_empty_cluster_says_so() -> None:
    assert render_table(()) == "No nodes with GPUs found.\n"


def test_the_plugin_parses_what_kubectl_passes_through() -> None:
    args = plugin_parser().parse_args(["inspect", "-o", "json", "--node", "n1", "--context", "c"])
    assert (args.output, args.node, args.context, args.kubeconfig) == ("json", "n1", "c", None)
    assert args.prog == "kubectl gpushare"


def test_the_plugin_is_a_console_script_of_the_package() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["kubectl-gpushare"] == "webhook.cli.inspect:plugin"


@pytest.fixture
def unreachable(tmp_path: Path) -> Path:
    """A kubeconfig for an apiserver nobody listens on."""
    path = tmp_path / "kubeconfig"
    path.write_text(
        "apiVersion: v1\nkind: Config\ncurrent-context: c\n"
        "clusters: [{name: c, cluster: {server: 'https://127.0.0.1:9'}}]\n"
        "users: [{name: u, user: {token: t}}]\n"
        "contexts: [{name: c, context: {cluster: c, user: u}}]\n"
    )
    return path


def test_an_unreachable_cluster_exits_2_with_one_line(
    unreachable: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["inspect", "--kubeconfig", str(unreachable)]) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert captured.err.count("\n") == 1 and "Traceback" not in captured.err
    assert captured.err.startswith(
        "gpushare-webhook: cannot reach the Kubernetes API at https://127.0.0.1:9"
    )


def test_the_plugin_names_itself_in_errors(
    unreachable: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert plugin(["inspect", "--kubeconfig", str(unreachable), "-o", "json"]) == 2
    assert capsys.readouterr().err.startswith("kubectl gpushare: cannot reach")


def test_a_missing_kubeconfig_or_context_exits_2_saying_what_to_pass(
    tmp_path: Path, unreachable: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["inspect", "--kubeconfig", str(tmp_path / "absent")]) == 2
    assert main(["inspect", "--kubeconfig", str(unreachable), "--context", "nope"]) == 2
    errors = capsys.readouterr().err.splitlines()
    assert len(errors) == 2
    assert all("no Kubernetes API access" in e and "--kubeconfig" in e for e in errors)
    assert str(tmp_path / "absent") in errors[0] and "nope" in errors[1]
