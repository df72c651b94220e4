"""``report``: what an audit-only rollout found, read from the service's audit log."""

from __future__ import annotations

import argparse
import contextlib
import gzip
import sys
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any, Final, TextIO

import orjson

from webhook.cli.common import EXIT_OK, Commands, UsageError
from webhook.core.auditevent import is_event, record_of_event
from webhook.core.policy import RULE_IDS
from webhook.core.rollout import RolloutReport, RolloutRow, summarise

_GZIP_MAGIC: Final = b"\x1f\x8b"
_COLUMNS: Final = (
    "RULE",
    "NAMESPACE",
    "WORKLOAD",
    "WOULD REFUSE",
    "REFUSED NOW",
    "FIRST SEEN",
    "LAST SEEN",
    "EXAMPLE",
)

REPORT_HELP: Final = (
    "what enforcing the rules would refuse: in an audit log (--audit-log), or running in "
    "the cluster now (--cluster)"
)
REPORT_DESCRIPTION: Final = """\
Read the service's audit log (--audit-log, JSON lines; gzip'd files too; repeat it
for rotated files, - for stdin) and print, per rule, namespace and workload, how
many requests enforcing the rule would refuse: violations recorded with action
audit or warn (WOULD REFUSE). Violations already denied are counted apart (REFUSED
NOW). A request reaches both /mutate and /validate; it counts once.

The apiserver's audit log (audit.k8s.io/v1 events, as --audit-log-path writes them)
is read the same way: on Kubernetes 1.36+ the in-apiserver policies decide, and a
rule of a warn or audit ValidatingAdmissionPolicy records itself there as the audit
annotation gpushare-audit/<rule> (or gpushare-warn/<rule>); a refusal names its
first rule in the response status. Each event is one request. The apiserver needs an
audit policy that records the admitted kinds at level Metadata (docs/policy.md).

A pod made by a controller is grouped under it (a Deployment's pods under the
Deployment). The example is one message as logged, user-supplied values redacted.
Lines that are not audit records are skipped and counted on stderr.

With --cluster instead, print what the cluster runs now that the policy in force
would refuse: the results of the policy reports `serve --cluster --reports` keeps
(openreports.io Reports), one line per finding, user-supplied values redacted. A
report holds at most its cap of results; the rest are counted (OMITTED).
"""

_CLUSTER_COLUMNS: Final = ("NAMESPACE", "KIND", "NAME", "RULE", "RESULT", "SEVERITY", "MESSAGE")


@dataclass(slots=True)
class _Skipped:
    """Lines that were not audit records: how many, and where the first was."""

    count: int = 0
    first: str = ""

    def note(self, path: str, number: int) -> None:
        self.count += 1
        if not self.first:
            self.first = f"{path}:{number}"


@contextlib.contextmanager
def _opened(path: str, stdin: TextIO) -> Iterator[Iterable[bytes]]:
    """``path`` (``-``: stdin) as bytes, decompressed when it is gzip'd."""
    try:
        with contextlib.ExitStack() as stack:
            raw = stdin.buffer if path == "-" else stack.enter_context(open(path, "rb"))
            # peek() does not consume, so a plain log is read from its first byte.
            peek = getattr(raw, "peek", None)
            head = peek(2)[:2] if peek is not None else b""
            if head == _GZIP_MAGIC:
                yield stack.enter_context(gzip.GzipFile(fileobj=raw, mode="rb"))
            else:
                yield raw
    except (OSError, EOFError) as exc:
        raise UsageError(f"{path}: cannot read: {exc}") from None


def read_records(
    paths: Sequence[str], stdin: TextIO, skipped: _Skipped
) -> Iterator[dict[str, object]]:
    """The audit records of ``paths`` in order, one line at a time (no file is held whole)."""
    for path in paths:
        with _opened(path, stdin) as lines:
            for number, line in enumerate(lines, 1):
                try:
                    record = orjson.loads(line)
                except orjson.JSONDecodeError:
                    if line.strip():  # a blank line is no record, and no damage either
                        skipped.note(path, number)
                    continue
                if type(record) is not dict:
                    skipped.note(path, number)
                    continue
                if is_event(record):
                    # The apiserver's audit log: the in-apiserver policies' decisions.
                    converted = record_of_event(record)
                    if converted is not None:
                        yield dict(converted)
                    continue
                yield record


def _seen(stamp: str) -> str:
    # To the second: the table is for reading; -o json keeps the milliseconds.
    return f"{stamp[:19]}Z" if len(stamp) >= 19 else stamp or "-"


def _table(report: RolloutReport) -> str:
    lines = [
        f"Audit log: {report['records']} records, "
        f"{_seen(report['firstSeen'])} .. {_seen(report['lastSeen'])}",
        "WOULD REFUSE: requests admitted with the violation recorded (action audit or warn);",
        "enforcing the rule (deny) would refuse them. REFUSED NOW: requests it refuses (deny).",
        "",
    ]
    if not report["rows"]:
        lines.append("No violations recorded: enforcing would refuse nothing seen in this log.")
        return "\n".join(lines) + "\n"
    cells = [_COLUMNS, *(_cells(row) for row in report["rows"])]
    # The example is last and left unpadded: it is as long as it is.
    widths = [max(len(cell[i]) for cell in cells) for i in range(len(_COLUMNS) - 1)]
    for cell in cells:
        padded = [value.ljust(width) for value, width in zip(cell, widths, strict=False)]
        lines.append("  ".join([*padded, cell[-1]]).rstrip())
    return "\n".join(lines) + "\n"


def _cells(row: RolloutRow) -> tuple[str, ...]:
    return (
        row["rule"],
        row["namespace"] or "-",
        row["workload"],
        str(row["wouldRefuse"]),
        str(row["refusedNow"]),
        _seen(row["firstSeen"]),
        _seen(row["lastSeen"]),
        row["example"],
    )


def cluster_rows(reports: Iterable[dict[str, Any]]) -> dict[str, Any]:
    """The findings of the webhook's reports, flattened, with each namespace's counts."""
    rows: list[dict[str, Any]] = []
    namespaces: dict[str, dict[str, Any]] = {}
    for report in sorted(reports, key=lambda r: str((r.get("metadata") or {}).get("namespace"))):
        metadata = report.get("metadata") or {}
        namespace = str(metadata.get("namespace") or "")
        results = report.get("results") or []
        summary = report.get("summary") or {}
        counted = int(summary.get("fail") or 0) + int(summary.get("warn") or 0)
        namespaces[namespace] = {
            "fail": int(summary.get("fail") or 0),
            "warn": int(summary.get("warn") or 0),
            "omitted": max(0, counted - len(results)),
        }
        for result in results:
            (resource,) = result.get("resources") or [{}]
            rows.append(
                {
                    "namespace": namespace,
                    "kind": resource.get("kind", ""),
                    "name": resource.get("name", ""),
                    "rule": result.get("rule", ""),
                    "result": result.get("result", ""),
                    "severity": result.get("severity", ""),
                    "message": result.get("message", ""),
                }
            )
    return {"results": rows, "namespaces": namespaces}


def _cluster_table(found: dict[str, Any]) -> str:
    rows = [tuple(str(row[c.lower()]) for c in _CLUSTER_COLUMNS) for row in found["results"]]
    if not rows:
        return "no findings: the cluster runs nothing the policy in force would refuse\n"
    widths = [max(len(c), *(len(r[i]) for r in rows)) for i, c in enumerate(_CLUSTER_COLUMNS)]
    lines = [
        "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
        for row in [_CLUSTER_COLUMNS, *rows]
    ]
    for namespace, counts in found["namespaces"].items():
        if counts["omitted"]:
            lines.append(f"OMITTED {namespace}: {counts['omitted']} more (over the report's cap)")
    return "\n".join(lines) + "\n"


def command_cluster_report(args: argparse.Namespace, stdout: TextIO) -> int:
    from webhook.cluster.client import ClusterAccessError, api_client
    from webhook.cluster.reports import list_reports

    try:
        client = api_client(args.kubeconfig, context=args.context)
    except ClusterAccessError as exc:
        raise UsageError(str(exc)) from None
    try:
        namespaces = args.namespace or [None]
        reports = [r for ns in namespaces for r in list_reports(client, namespace=ns)]
    except Exception as exc:
        status = getattr(exc, "status", None)
        if status == 404:
            raise UsageError(
                "openreports.io/v1alpha1 is not served: are the report CRDs installed "
                "(deploy/reports) and the webhook running with --reports?"
            ) from None
        if status is not None:
            raise UsageError(
                f"cannot list reports: {status} {getattr(exc, 'reason', '')}"
            ) from None
        raise
    found = cluster_rows(reports)
    if args.rule:
        found["results"] = [row for row in found["results"] if row["rule"] in args.rule]
    if args.output == "json":
        stdout.write(orjson.dumps(found, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        stdout.write(_cluster_table(found))
    return EXIT_OK


def command_report(args: argparse.Namespace, stdin: TextIO, stdout: TextIO) -> int:
    unknown = sorted(set(args.rule) - set(RULE_IDS))
    if unknown:
        raise UsageError(
            f"--rule {', '.join(unknown)}: no such rule; the rules are {', '.join(RULE_IDS)}"
        )
    if args.cluster == bool(args.audit_log):
        raise UsageError("report needs --audit-log FILE or --cluster (one of them)")
    if not args.cluster and (args.kubeconfig or args.context):
        raise UsageError("--kubeconfig, --context: only with --cluster")
    if args.cluster:
        return command_cluster_report(args, stdout)
    skipped = _Skipped()
    report = summarise(
        read_records(args.audit_log, stdin, skipped),
        rules=args.rule,
        namespaces=args.namespace,
    )
    report["skippedLines"] = skipped.count
    if skipped.count:
        sys.stderr.write(
            f"gpushare-webhook: skipped {skipped.count} line(s) that are not audit records "
            f"(the first at {skipped.first})\n"
        )
    if args.output == "json":
        stdout.write(orjson.dumps(report, option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        stdout.write(_table(report))
    return EXIT_OK


def register(commands: Commands) -> None:
    parser = commands.add_parser(
        "report",
        help=REPORT_HELP,
        description=REPORT_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--audit-log",
        action="append",
        metavar="FILE",
        help="the service's audit log, or the apiserver's (JSON lines, gzip'd or not; "
        "- for stdin); repeatable",
    )
    parser.add_argument(
        "--cluster",
        action="store_true",
        help="read the policy reports of what runs in the cluster now (serve --reports)",
    )
    parser.add_argument(
        "--kubeconfig", metavar="FILE", help="with --cluster (default: $KUBECONFIG, ~/.kube/config)"
    )
    parser.add_argument("--context", metavar="NAME", help="with --cluster: kubeconfig context")
    parser.add_argument("-o", "--output", choices=["table", "json"], default="table")
    parser.add_argument(
        "--rule", action="append", default=[], metavar="ID", help="only this rule; repeatable"
    )
    parser.add_argument(
        "--namespace",
        action="append",
        default=[],
        metavar="NAME",
        help="only this namespace; repeatable",
    )
    parser.set_defaults(handler=command_report)
