"""The apiserver's audit events read as the webhook's audit records.

The events are written as kube-apiserver writes them with --audit-log-format=json
(kubernetes staging/src/k8s.io/apiserver/pkg/apis/audit/v1/types.go, Event), the failure
annotation and the refusal message as the ValidatingAdmissionPolicy dispatcher writes them
(staging/src/k8s.io/apiserver/pkg/admission/plugin/policy/validating/dispatcher.go:
publishValidationFailureAnnotation, and "ValidatingAdmissionPolicy '%s' with binding '%s'
denied request: %s"); tests/e2e/test_audit_rollout.py reads a real apiserver's log.
"""

from __future__ import annotations

import json
from typing import Any

from webhook.core.auditevent import ENDPOINT, is_event, record_of_event
from webhook.core.rollout import summarise


def event(**extra: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "kind": "Event",
        "apiVersion": "audit.k8s.io/v1",
        "level": "Metadata",
        "auditID": "5f1c",
        "stage": "ResponseComplete",
        "requestURI": "/api/v1/namespaces/ml/pods?dryRun=All",
        "verb": "create",
        "user": {"username": "alice", "groups": ["dev", "system:authenticated"]},
        "objectRef": {"resource": "pods", "namespace": "ml", "name": "gpu", "apiVersion": "v1"},
        "responseStatus": {"metadata": {}, "code": 201},
        "requestReceivedTimestamp": "2026-11-26T23:40:00.100000Z",
        "stageTimestamp": "2026-11-26T23:40:00.123456Z",
    }
    base.update(extra)
    return base


def test_an_audit_annotation_per_rule_is_a_violation_of_its_policys_action() -> None:
    record = record_of_event(
        event(
            annotations={
                "gpushare-audit/privileged-gpu": "[privileged-gpu] no privileged container",
                "gpushare-warn/node-name-pinning": "[node-name-pinning] no nodeName",
                "gpushare-audit-sources/raw-visible-devices": "[raw-visible-devices] no key",
                "other-policy/privileged-gpu": "not ours",
                "gpushare-audit/not-a-rule": "ignored",
            }
        )
    )
    assert record is not None
    assert sorted((v["rule"], v["action"]) for v in record["violations"]) == [
        ("node-name-pinning", "warn"),
        ("privileged-gpu", "audit"),
        ("raw-visible-devices", "audit"),
    ]
    assert record["endpoint"] == ENDPOINT and record["allowed"] and record["dryRun"]
    assert record["timestamp"] == "2026-11-26T23:40:00.123+00:00"
    assert record["objectRef"] == {
        "resource": "pods",
        "namespace": "ml",
        "name": "gpu",
        "apiVersion": "v1",
    }


def test_the_apiservers_failure_annotation_counts_where_no_rule_annotation_does() -> None:
    failures = [
        {
            "message": "[host-device-access] no device paths",
            "policy": "gpushare-warn",
            "binding": "gpushare-warn",
            "expressionIndex": 3,
            "validationActions": ["Warn", "Audit"],
        }
    ]
    record = record_of_event(
        event(
            annotations={
                "validation.policy.admission.k8s.io/validation_failure": json.dumps(failures)
            }
        )
    )
    assert record is not None
    assert record["violations"] == [
        {"rule": "host-device-access", "action": "warn", "message": failures[0]["message"]}
    ]


def test_a_refusal_names_its_first_rule_as_deny() -> None:
    status = {
        "code": 403,
        "status": "Failure",
        "reason": "Forbidden",
        "message": "pods \"gpu\" is forbidden: ValidatingAdmissionPolicy 'gpushare-deny' with "
        "binding 'gpushare-deny' denied request: [privileged-gpu] a GPU pod may not run a "
        "privileged container",
    }
    record = record_of_event(event(responseStatus=status))
    assert record is not None and not record["allowed"]
    assert record["violations"] == [
        {
            "rule": "privileged-gpu",
            "action": "deny",
            "message": "[privileged-gpu] a GPU pod may not run a privileged container",
        }
    ]


def test_only_the_outcome_is_a_record() -> None:
    assert record_of_event(event(stage="RequestReceived")) is None
    assert is_event(event()) and not is_event({"endpoint": "/validate", "violations": []})


def test_junk_in_an_event_is_no_crash() -> None:
    for junk in (
        {"annotations": "x"},
        {"annotations": {"validation.policy.admission.k8s.io/validation_failure": "{no"}},
        {"annotations": {"validation.policy.admission.k8s.io/validation_failure": "[1, {}]"}},
        {"responseStatus": {"code": "x", "message": 7}},
        {"objectRef": None, "user": None},
    ):
        record = record_of_event(event(**junk))
        assert record is not None
        assert record["violations"] == []


def test_the_rollout_report_reads_events_as_records() -> None:
    audited = record_of_event(
        event(annotations={"gpushare-audit/privileged-gpu": "[privileged-gpu] x"})
    )
    assert audited is not None
    (row,) = summarise([dict(audited), dict(audited)])["rows"]
    assert (row["rule"], row["workload"], row["wouldRefuse"], row["refusedNow"]) == (
        "privileged-gpu",
        "Pod/gpu",
        2,
        0,
    )
