"""``report --audit-log``: the real command on audit logs the service's audit sink wrote."""

from __future__ import annotations

import gzip
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any, get_type_hints

import orjson
import pytest

from tests.audit.rollout import LOG, write_log
from tests.paths import ROOT, documentation
from webhook.core.rollout import RolloutReport, RolloutRow


def run(*args: str, stdin: bytes | None = None) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run(
        [sys.executable, "-m", "webhook", *args],
        input=stdin,
        capture_output=True,
        timeout=60,
        check=False,
        cwd=ROOT,
    )


def report_json(*args: str, stdin: bytes | None = None) -> Any:
    result = run("report", *args, "-o", "json", stdin=stdin)
    assert result.returncode == 0, result.stderr
    return orjson.loads(result.stdout)


@pytest.fixture(scope="module")
def log(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("audit") / "audit.log"
    write_log(path)
    return path


def essence(path: Path) -> list[dict[str, Any]]:
    """Each record without what follows the policy's text and wording (its hash, the
    patch's length, the messages): those change the example's meaning in no way."""
    records = []
    for line in path.read_bytes().splitlines():
        record = orjson.loads(line)
        del record["policyHash"], record["patchOps"]
        record["violations"] = [(v["rule"], v["action"]) for v in record["violations"]]
        records.append(record)
    return records


def test_the_shipped_example_log_is_what_the_audit_sink_writes(log: Path) -> None:
    # Rewrite it with `python -m tests.audit.rollout` when this fails (the record
    # format or what the rules find changed), then the README's example.
    assert essence(LOG) == essence(log)


def test_what_enforcing_would_refuse_per_rule_namespace_and_workload(log: Path) -> None:
    report = report_json("--audit-log", str(log))
    assert report["records"] == 18
    assert report["skippedLines"] == 0
    rows = {(r["rule"], r["namespace"], r["workload"]): r for r in report["rows"]}
    assert set(rows) == {
        ("raw-visible-devices", "ml", "Deployment/trainer"),
        ("node-name-pinning", "research", "Job/nightly-eval"),
        ("scheduler-bypass", "vision", "Pod/labeler"),
        ("privileged-gpu", "research", "Pod/debug-shell"),
    }
    # The Deployment's apply and its three pods, each seen at /mutate and /validate.
    trainer = rows["raw-visible-devices", "ml", "Deployment/trainer"]
    assert (trainer["wouldRefuse"], trainer["refusedNow"]) == (4, 0)
    assert trainer["firstSeen"] == "2026-03-02T09:00:00.000+00:00"
    assert trainer["lastSeen"] == "2026-03-02T09:21:00.376+00:00"
    # Refused at /mutate (deny): counted apart, never as something enforcing would add.
    shell = rows["privileged-gpu", "research", "Pod/debug-shell"]
    assert (shell["wouldRefuse"], shell["refusedNow"]) == (0, 2)
    assert report["rows"][0]["workload"] == "Deployment/trainer"  # most refusals first


def test_examples_are_redacted_as_logged(log: Path) -> None:
    # The log holds the value nowhere, so neither can the report.
    assert b'"all"' not in log.read_bytes()
    report = report_json("--audit-log", str(log), "--rule", "raw-visible-devices")
    assert [r["example"] for r in report["rows"]] == [
        'container "train": NVIDIA_VISIBLE_DEVICES="\u2026"; remove it, request GPUs in limits'
    ]


def test_json_output_is_the_documented_schema(log: Path) -> None:
    report = report_json("--audit-log", str(log))
    assert set(report) == set(get_type_hints(RolloutReport))
    row_fields = get_type_hints(RolloutRow)
    for row in report["rows"]:
        assert {key: type(value) for key, value in row.items()} == row_fields


def test_rotated_gzip_files_and_stdin_read_as_one_log(log: Path, tmp_path: Path) -> None:
    lines = log.read_bytes().splitlines(keepends=True)
    # audit.log.2.gz is the oldest: the order of files changes nothing.
    (tmp_path / "audit.log.2.gz").write_bytes(gzip.compress(b"".join(lines[:5])))
    (tmp_path / "audit.log.1").write_bytes(b"".join(lines[5:12]))
    newest = gzip.compress(b"".join(lines[12:]))
    whole = report_json("--audit-log", str(log))
    pieces = report_json(
        "--audit-log",
        "-",
        "--audit-log",
        str(tmp_path / "audit.log.1"),
        "--audit-log",
        str(tmp_path / "audit.log.2.gz"),
        stdin=newest,
    )
    assert pieces == whole


def test_lines_that_are_not_records_are_skipped_and_counted_once(log: Path, tmp_path: Path) -> None:
    damaged = tmp_path / "audit.log"
    lines = log.read_bytes().splitlines(keepends=True)
    # A line cut by a crash, a stray line, a JSON value that is no record, a blank line.
    damaged.write_bytes(
        b"".join([*lines[:3], b"not json\n", *lines[3:], b"[1, 2]\n", b"\n", lines[0][:40]])
    )
    result = run("report", "--audit-log", str(damaged), "-o", "json")
    assert result.returncode == 0
    assert result.stderr.decode().splitlines() == [
        f"gpushare-webhook: skipped 3 line(s) that are not audit records (the first at {damaged}:4)"
    ]
    report = orjson.loads(result.stdout)
    assert report["skippedLines"] == 3
    assert report["rows"] == report_json("--audit-log", str(log))["rows"]


def test_filters_by_rule_and_namespace(log: Path) -> None:
    report = report_json(
        "--audit-log", str(log), "--namespace", "research", "--rule", "node-name-pinning"
    )
    assert [(r["rule"], r["namespace"]) for r in report["rows"]] == [
        ("node-name-pinning", "research")
    ]


def test_table_says_what_it_counts(log: Path) -> None:
    result = run("report", "--audit-log", str(log))
    assert result.returncode == 0
    text = result.stdout.decode()
    assert "enforcing the rule (deny) would refuse them" in text
    header = next(line for line in text.splitlines() if line.startswith("RULE"))
    assert re.split(r"\s{2,}", header) == [
        "RULE",
        "NAMESPACE",
        "WORKLOAD",
        "WOULD REFUSE",
        "REFUSED NOW",
        "FIRST SEEN",
        "LAST SEEN",
        "EXAMPLE",
    ]


def test_a_log_without_violations(tmp_path: Path) -> None:
    empty = tmp_path / "audit.log"
    empty.write_bytes(b"")
    result = run("report", "--audit-log", str(empty))
    assert result.returncode == 0
    assert "No violations recorded" in result.stdout.decode()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--audit-log", "/nonexistent/audit.log"], "/nonexistent/audit.log: cannot read"),
        (["--audit-log", "-", "--rule", "no-such-rule"], "--rule no-such-rule: no such rule"),
    ],
)
def test_bad_input_is_one_line_and_exit_two(args: list[str], message: str) -> None:
    result = run("report", *args, stdin=b"")
    assert result.returncode == 2
    lines = result.stderr.decode().splitlines()
    assert len(lines) == 1 and message in lines[0]


def test_a_corrupt_gzip_file_is_one_line_and_exit_two(log: Path, tmp_path: Path) -> None:
    cut = tmp_path / "audit.log.1.gz"
    cut.write_bytes(gzip.compress(log.read_bytes())[:200])
    result = run("report", "--audit-log", str(cut))
    assert result.returncode == 2
    assert result.stderr.decode().startswith(f"gpushare-webhook: {cut}: cannot read")


def test_the_readme_example_runs_as_written() -> None:
    readme = documentation()
    found = re.search(
        r"```console\n\$ (gpushare-webhook report [^\n]*)\n(.*?)```", readme, flags=re.DOTALL
    )
    assert found, "the documentation shows `gpushare-webhook report` in a console block"
    command, shown = found.groups()
    result = run(*shlex.split(command)[1:])
    assert result.returncode == 0, result.stderr
    assert result.stdout.decode() == shown
