"""The owner an audit record names: a pod's controller, or the Deployment behind its ReplicaSet."""

from __future__ import annotations

from typing import Any

import pytest

from webhook.core.admission import answer
from webhook.core.record import PROBE_LABEL, owner_of, record_of
from webhook.core.wire import parse_review
from webhook.dev.testing import admission_review
from webhook.policies import DEFAULT_POLICY


def ref(kind: str, name: str, *, controller: Any = True) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": kind,
        "name": name,
        "uid": "u",
        "controller": controller,
    }


@pytest.mark.parametrize(
    ("metadata", "owner"),
    [
        (
            {
                "ownerReferences": [ref("ReplicaSet", "web-5d8f7c9b4")],
                "labels": {"pod-template-hash": "5d8f7c9b4"},
            },
            {"kind": "Deployment", "name": "web"},
        ),
        # A ReplicaSet of its own (no pod-template-hash, or one its name does not end with).
        ({"ownerReferences": [ref("ReplicaSet", "web")]}, {"kind": "ReplicaSet", "name": "web"}),
        (
            {
                "ownerReferences": [ref("ReplicaSet", "web")],
                "labels": {"pod-template-hash": "5d8f7c9b4"},
            },
            {"kind": "ReplicaSet", "name": "web"},
        ),
        ({"ownerReferences": [ref("Job", "nightly")]}, {"kind": "Job", "name": "nightly"}),
        # The controller among other owners; owners that do not control are not the workload.
        (
            {
                "ownerReferences": [
                    ref("ConfigMap", "c", controller=False),
                    ref("StatefulSet", "db"),
                ]
            },
            {"kind": "StatefulSet", "name": "db"},
        ),
        ({"ownerReferences": [ref("StatefulSet", "db", controller="true")]}, None),
        ({"ownerReferences": [ref("StatefulSet", "db", controller=None)]}, None),
        ({"ownerReferences": "StatefulSet/db"}, None),
        ({"ownerReferences": [None, 3]}, None),
        ({}, None),
    ],
)
def test_owner_of(metadata: dict[str, Any], owner: dict[str, str] | None) -> None:
    assert owner_of(metadata) == owner


def test_record_of_an_answer_carries_the_given_time_and_the_decision() -> None:
    pod = {
        "metadata": {"name": "p", "namespace": "ml"},
        "spec": {
            "containers": [
                {
                    "name": "c",
                    "securityContext": {"privileged": True},
                    "resources": {"limits": {"nvidia.com/gpu": "1"}},
                }
            ]
        },
    }
    version, request = parse_review(admission_review(pod))
    answered = answer(version, request, DEFAULT_POLICY, endpoint="validate")
    record = record_of(
        answered, endpoint="validate", policy_hash="h", latency_s=0.0012345, stamped="T"
    )
    assert record["timestamp"] == "T"
    assert record["latencyMs"] == 1.234 or record["latencyMs"] == 1.235
    assert record["allowed"] is False
    assert "privileged-gpu" in [v["rule"] for v in record["violations"]]
    assert record["objectRef"] == {
        "resource": "pods",
        "apiVersion": "v1",
        "namespace": "ml",
        "name": "p",
    }
    assert "error" not in record


@pytest.mark.parametrize(("dry_run", "probe"), [(True, True), (False, False)])
def test_a_labelled_probe_is_marked_only_when_it_is_a_dry_run(dry_run: bool, probe: bool) -> None:
    pod = {
        "metadata": {"name": "probe", "namespace": "p", "labels": {PROBE_LABEL: "true"}},
        "spec": {"containers": [{"name": "c", "resources": {"limits": {"nvidia.com/gpu": "1"}}}]},
    }
    version, request = parse_review(admission_review(pod, dry_run=dry_run))
    answered = answer(version, request, DEFAULT_POLICY, endpoint="validate")
    record = record_of(answered, endpoint="validate", policy_hash="h", latency_s=0.0, stamped="T")
    assert record.get("probe", False) is probe
