"""``inspect``: per node and GPU, what is allocated and which pods hold it.

The same command is the kubectl plugin ``kubectl-gpushare`` (:func:`plugin`), so
``kubectl gpushare inspect`` prints what ``gpushare-webhook inspect`` prints.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Sequence
from typing import Final, TextIO, cast

import orjson

from webhook.cli.common import EXIT_OK, EXIT_USAGE, Commands, Parser
from webhook.cli.report import register as register_report
from webhook.cluster.client import ClusterAccessError, api_client
from webhook.cluster.inventory import InventoryError, list_cluster
from webhook.core.allocation import (
    CardAllocation,
    Holder,
    MigProfile,
    NodeAllocation,
    allocations,
    to_document,
)
from webhook.policies import load_policy

HELP: Final = "show per node and GPU what is allocated and which pods hold it"
DESCRIPTION: Final = """\
Print, for each node with GPUs, every card (model, memory, cores, MIG layout) with
what is allocated on it and the pods that hold it: vGPU memory and cores from HAMi's
allocation annotations, ACK's card index, MPS and MIG users. Pods bound to a node
with GPU requests but no card named by the scheduler are listed as unassigned to a
card. Finished pods hold nothing.

Cards come from HAMi's node registration (hami.io/node-nvidia-register), else GPU
feature discovery labels (nvidia.com/gpu.count, .memory, .product), else ACK's
aliyun.com/gpu-count and aliyun.com/gpu-mem. MIG instances the NVIDIA device plugin
advertises (nvidia.com/mig-<profile>) are listed per node.

Needs get/list on nodes and on pods in all namespaces. Exit status: 0, or 2 when the
cluster cannot be read."""
PLUGIN_PROG: Final = "kubectl gpushare"
# The widest model name shown in the table; -o json carries it whole.
MODEL_WIDTH: Final = 28


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = DESCRIPTION
    parser.formatter_class = argparse.RawDescriptionHelpFormatter
    parser.add_argument(
        "--kubeconfig", metavar="FILE", help="kubeconfig (default: $KUBECONFIG, ~/.kube/config)"
    )
    parser.add_argument("--context", metavar="NAME", help="kubeconfig context to use")
    parser.add_argument(
        "-o", "--output", choices=("table", "json"), default="table", help="output format"
    )
    parser.add_argument("--node", metavar="NAME", help="this node only")
    parser.add_argument(
        "--policy",
        metavar="FILE",
        help="policy whose resource names and modes apply (default: the bundled one)",
    )
    parser.set_defaults(handler=command_inspect)


def register(commands: Commands) -> None:
    add_arguments(commands.add_parser("inspect", help=HELP))


def command_inspect(args: argparse.Namespace, stdin: TextIO, stdout: TextIO) -> int:
    policy = load_policy(args.policy)
    try:
        listing = list_cluster(api_client(args.kubeconfig, context=args.context), node=args.node)
    except (ClusterAccessError, InventoryError) as exc:
        # One line: the loaders' messages can span several.
        sys.stderr.write(f"{_prog(args)}: {' '.join(str(exc).split())}\n")
        return EXIT_USAGE
    nodes = allocations(listing.nodes, listing.pods, policy, node_name=args.node)
    if args.output == "json":
        stdout.write(orjson.dumps(to_document(nodes), option=orjson.OPT_INDENT_2).decode())
        stdout.write("\n")
    else:
        stdout.write(render_table(nodes))
    return EXIT_OK


def _prog(args: argparse.Namespace) -> str:
    return str(getattr(args, "prog", None) or "gpushare-webhook")


# -- the table ---------------------------------------------------------------------------


def _columns(rows: Sequence[Sequence[str]], *, right: Iterable[int] = ()) -> list[str]:
    """Rows padded to aligned columns, two spaces apart; ``right`` columns flush right."""
    flush_right = set(right)
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    lines = []
    for row in rows:
        cells = [
            cell.rjust(width) if i in flush_right else cell.ljust(width)
            for i, (cell, width) in enumerate(zip(row, widths, strict=True))
        ]
        lines.append("  ".join(cells).rstrip())
    return lines


def _percent(part: int, whole: int) -> str:
    return f"{part * 100 // whole}%" if whole else "-"


def _model(card: CardAllocation) -> str:
    model = card.model or "?"
    if not card.registered:
        model = "(not registered)"
    elif not card.healthy:
        model = f"{model} (unhealthy)"
    return model if len(model) <= MODEL_WIDTH else model[: MODEL_WIDTH - 2] + ".."


def _mig(profiles: Sequence[MigProfile]) -> str:
    return ", ".join(f"{p.name} {p.used}/{p.total}" for p in profiles)


def _memory(holder: Holder) -> str:
    return "-" if holder.memory_mib is None else str(holder.memory_mib)


def _gpu_rows(node: NodeAllocation) -> list[str]:
    header = ("GPU", "MODEL", "MODE", "MEMORY MiB", "USED", "CORES", "PODS")
    rows: list[tuple[str, ...]] = [header]
    mig_lines: dict[int, str] = {}
    # Under the MODEL column: past the widest first cell ("TOTAL") and the gap.
    indent = " " * (max([len("TOTAL"), *(len(str(c.index)) for c in node.cards)]) + 2)
    for card in node.cards:
        if card.mig:
            mig_lines[len(rows)] = f"{indent}MIG {_mig(card.mig)}"
        rows.append(
            (
                str(card.index),
                _model(card),
                card.mode or "-",
                f"{card.allocated_memory_mib}/{card.memory_mib}",
                _percent(card.allocated_memory_mib, card.memory_mib),
                f"{card.allocated_cores}/{card.cores}",
                str(len(card.holders)),
            )
        )
    if node.unassigned:
        memory = sum(h.memory_mib or 0 for h in node.unassigned)
        modes = sorted({h.mode for h in node.unassigned})
        rows.append(
            (
                "-",
                "unassigned to a card",
                ",".join(modes),
                str(memory),
                "",
                str(sum(h.cores for h in node.unassigned)),
                str(len(node.unassigned)),
            )
        )
    rows.append(
        (
            "TOTAL",
            "",
            "",
            f"{node.allocated_memory_mib}/{node.memory_mib}",
            _percent(node.allocated_memory_mib, node.memory_mib),
            f"{node.allocated_cores}/{node.cores}",
            str(node.pods),
        )
    )
    lines = _columns(rows, right=(3, 4, 5, 6))
    # A card's MIG layout goes on the line after the card.
    for offset, row in enumerate(sorted(mig_lines)):
        lines.insert(row + 1 + offset, mig_lines[row])
    return lines


def _pod_rows(node: NodeAllocation) -> list[str]:
    rows: list[tuple[str, ...]] = [("POD", "GPU", "MODE", "MEMORY MiB", "CORES", "MIG")]
    for card in node.cards:
        for holder in card.holders:
            rows.append(
                (
                    holder.pod,
                    str(card.index),
                    holder.mode,
                    _memory(holder),
                    str(holder.cores),
                    ",".join(holder.mig_profiles),
                )
            )
    for holder in node.unassigned:
        rows.append(
            (
                holder.pod,
                "-",
                holder.mode,
                _memory(holder),
                str(holder.cores),
                ",".join(holder.mig_profiles),
            )
        )
    return _columns(rows, right=(3, 4)) if len(rows) > 1 else []


def render_table(nodes: Sequence[NodeAllocation]) -> str:
    """The ``-o table`` view: one block per node, a GPU table with totals, then its pods."""
    if not nodes:
        return "No nodes with GPUs found.\n"
    blocks = []
    for node in nodes:
        source = {"hami": "HAMi", "gfd": "GPU feature discovery", "ack": "ACK", "none": "-"}
        gpus = f"{len(node.cards)} GPU{'' if len(node.cards) == 1 else 's'}"
        lines = [f"NODE {node.name}  ({gpus}, cards from {source[node.source]})"]
        if node.cards or node.unassigned:
            lines += _gpu_rows(node)
        if node.mig:
            lines.append(f"MIG on the node: {_mig(node.mig)}")
        pods = _pod_rows(node)
        if pods:
            lines += ["", *pods]
        blocks.append("\n".join(lines))
    legend = "GPU -: unassigned to a card (bound to the node; no card named by the scheduler)"
    unassigned = any(n.unassigned for n in nodes)
    return "\n\n".join(blocks) + "\n" + (f"\n{legend}\n" if unassigned else "")


# -- the kubectl plugin ------------------------------------------------------------------


def plugin_parser() -> argparse.ArgumentParser:
    parser = Parser(prog=PLUGIN_PROG, description="GPU sharing on Kubernetes: gpushare-webhook.")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=Parser)
    register(cast("Commands", commands))
    # `kubectl gpushare report --cluster`: the policy reports, as `report --cluster`.
    register_report(cast("Commands", commands))
    parser.set_defaults(prog=PLUGIN_PROG)
    return parser


def plugin(argv: Sequence[str] | None = None) -> int:
    """``kubectl-gpushare``: kubectl runs it as ``kubectl gpushare inspect ...``."""
    from webhook.cli import main

    return main(argv, parser=plugin_parser())


if __name__ == "__main__":  # pragma: no cover
    sys.exit(plugin())
