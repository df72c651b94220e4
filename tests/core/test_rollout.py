"""The rollout report over parsed audit records: counts per request, workloads, filters."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pytest

from webhook.core.rollout import RolloutReport, summarise, workload_of


def rec(
    *,
    endpoint: str = "validate",
    at: str = "2026-03-02T09:00:00.000+00:00",
    violations: Sequence[tuple[str, str]] = (),
    namespace: str = "ml",
    resource: str = "pods",
    name: str = "",
    generate_name: str = "",
    owner: tuple[str, str] | None = None,
    message: str = "",
) -> dict[str, Any]:
    ref: dict[str, str] = {"resource": resource, "namespace": namespace}
    if name:
        ref["name"] = name
    if generate_name:
        ref["generateName"] = generate_name
    record: dict[str, Any] = {
        "timestamp": at,
        "endpoint": endpoint,
        "objectRef": ref,
        "violations": [
            {"rule": rule, "action": action, "message": message or f"{rule} at {at}"}
            for rule, action in violations
        ],
    }
    if owner:
        record["owner"] = {"kind": owner[0], "name": owner[1]}
    return record


def only_row(report: RolloutReport) -> dict[str, Any]:
    assert len(report["rows"]) == 1, report["rows"]
    return dict(report["rows"][0])


def test_a_request_seen_at_both_endpoints_counts_once() -> None:
    found = [("raw-visible-devices", "audit")]
    records = []
    for n in range(3):
        at = f"2026-03-02T09:0{n}:00.000+00:00"
        records.append(rec(endpoint="mutate", at=at, violations=found, name="p"))
        records.append(rec(endpoint="validate", at=at, violations=found, name="p"))
    row = only_row(summarise(records))
    assert (row["wouldRefuse"], row["refusedNow"]) == (3, 0)
    assert row["firstSeen"] == "2026-03-02T09:00:00.000+00:00"
    assert row["lastSeen"] == "2026-03-02T09:02:00.000+00:00"


def test_refused_at_mutate_never_reaches_validate_and_is_counted_apart() -> None:
    records = [
        rec(endpoint="mutate", violations=[("privileged-gpu", "deny")], name="p"),
        rec(endpoint="mutate", violations=[("privileged-gpu", "deny")], name="p"),
        # A validate-only rule is counted from the endpoint that finds it.
        rec(endpoint="validate", violations=[("privileged-gpu", "warn")], name="p"),
    ]
    row = only_row(summarise(records))
    assert (row["wouldRefuse"], row["refusedNow"]) == (1, 2)


def test_a_rule_found_twice_in_one_object_is_one_request() -> None:
    record = rec(violations=[("limit-tampering", "audit"), ("limit-tampering", "audit")], name="p")
    assert only_row(summarise([record]))["wouldRefuse"] == 1


def test_records_without_violations_count_as_records_only() -> None:
    report = summarise([rec(name="a"), rec(name="b", violations=[("gpu-quota", "off")])])
    assert report["records"] == 2
    assert report["rows"] == []


def test_the_example_is_of_what_would_be_refused_when_there_is_one() -> None:
    records = [
        rec(violations=[("gpu-quota", "deny")], name="p", message="refused: over quota"),
        rec(violations=[("gpu-quota", "audit")], name="p", message="audited: over quota"),
        rec(violations=[("gpu-quota", "audit")], name="p", message="audited again"),
    ]
    assert only_row(summarise(records))["example"] == "audited: over quota"


def test_times_are_the_earliest_and_latest_whatever_the_order_of_files() -> None:
    late = rec(at="2026-03-02T10:00:00.000+00:00", violations=[("gpu-quota", "audit")], name="p")
    early = rec(at="2026-03-01T10:00:00.000+00:00", violations=[("gpu-quota", "audit")], name="p")
    clean = rec(at="2026-02-28T10:00:00.000+00:00")
    report = summarise([late, early, clean])
    row = only_row(report)
    assert (row["firstSeen"], row["lastSeen"]) == (early["timestamp"], late["timestamp"])
    assert (report["firstSeen"], report["lastSeen"]) == (clean["timestamp"], late["timestamp"])


def test_rows_by_rule_namespace_and_workload_most_refusals_first() -> None:
    records = [
        rec(violations=[("gpu-quota", "audit")], namespace="a", name="x"),
        rec(violations=[("gpu-quota", "audit")], namespace="b", name="x"),
        rec(violations=[("gpu-quota", "audit")], namespace="b", name="x"),
        rec(
            violations=[("gpu-quota", "audit"), ("mode-conflict", "warn")], namespace="b", name="y"
        ),
        rec(violations=[("privileged-gpu", "deny")], namespace="a", name="z"),
    ]
    keyed = [
        (r["rule"], r["namespace"], r["workload"], r["wouldRefuse"])
        for r in summarise(records)["rows"]
    ]
    assert keyed == [
        ("gpu-quota", "b", "Pod/x", 2),
        ("gpu-quota", "a", "Pod/x", 1),
        ("gpu-quota", "b", "Pod/y", 1),
        ("mode-conflict", "b", "Pod/y", 1),
        ("privileged-gpu", "a", "Pod/z", 0),
    ]


def test_filters_by_rule_and_namespace() -> None:
    records = [
        rec(
            violations=[("gpu-quota", "audit"), ("mode-conflict", "audit")], namespace="a", name="x"
        ),
        rec(violations=[("gpu-quota", "audit")], namespace="b", name="x"),
    ]
    report = summarise(records, rules=["gpu-quota"], namespaces=["a"])
    assert [(r["rule"], r["namespace"]) for r in report["rows"]] == [("gpu-quota", "a")]
    assert report["records"] == 2  # filters choose rows, every record is still read


@pytest.mark.parametrize(
    ("fields", "workload"),
    [
        ({"owner": ("Deployment", "web"), "generate_name": "web-5d8f7c9b4-"}, "Deployment/web"),
        ({"owner": ("Job", "nightly"), "name": "nightly-x2x9z"}, "Job/nightly"),
        # Records written before owners were recorded: a Deployment's pods by their names.
        ({"generate_name": "web-5d8f7c9b4-"}, "Deployment/web"),
        ({"name": "web-api-7c9f4d6b58-x2x9z"}, "Deployment/web-api"),
        # Not a pod-template-hash: a vowel, too short, or the name of a bare pod.
        ({"name": "web-release-x2x9z"}, "Pod/web-release-x2x9z"),
        ({"name": "web-45b-x2x9z"}, "Pod/web-45b-x2x9z"),
        ({"name": "debug-shell"}, "Pod/debug-shell"),
        ({"generate_name": "batch-"}, "Pod/batch-*"),
        ({"resource": "deployments", "name": "web"}, "Deployment/web"),
        ({"resource": "cronjobs", "name": "nightly"}, "CronJob/nightly"),
        ({"resource": "widgets.example.com", "name": "w"}, "widgets.example.com/w"),
    ],
)
def test_workload_of(fields: dict[str, Any], workload: str) -> None:
    assert workload_of(rec(**fields)) == workload


@pytest.mark.parametrize(
    "record",
    [
        {"violations": "audit"},
        {"violations": [None, "x", {"rule": "gpu-quota"}]},
        {"timestamp": 7, "objectRef": [], "owner": "x", "violations": [{"action": "audit"}]},
        {},
    ],
)
def test_records_of_the_wrong_shape_are_read_without_error(record: dict[str, Any]) -> None:
    report = summarise([record])
    assert report["records"] == 1
    assert report["rows"] == []


def test_a_harness_probe_is_left_out_but_only_when_it_was_a_dry_run() -> None:
    denied = [("node-name-pinning", "deny")]
    probe = {**rec(violations=denied, name="probe"), "probe": True}
    report = summarise([probe])
    assert report["rows"] == [] and report["records"] == 0
    # A record is marked a probe only for a dry run (webhook.core.record.record_of): a
    # created pod carrying the label is counted like any other.
    assert len(summarise([rec(violations=denied, name="p")])["rows"]) == 1
