"""The example audit log of an audit-only rollout (``tests/audit/rollout.jsonl``).

Written by the service's own audit path: each admission is answered by the core at
``/mutate`` and, when allowed, its mutated object (named by the apiserver, as
validating webhooks see it) at ``/validate``; each answer becomes a record through
``build_record`` and the ``AuditSink`` writes the file. Only the clock and the
request uids are fixed, so the log is the same every time it is written:

    .venv/bin/python -m tests.audit.rollout   # rewrites tests/audit/rollout.jsonl
"""

from __future__ import annotations

import copy
import time
import uuid
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Final
from unittest import mock

import jsonpatch
import yaml

from tests.paths import EXAMPLES, ROOT
from webhook.core.admission import answer
from webhook.core.policy import Policy
from webhook.core.record import AuditRecord
from webhook.core.wire import Endpoint, parse_review
from webhook.dev.testing import admission_review
from webhook.policies import parse_policy
from webhook.service.audit import AuditSink, build_record

LOG: Final = ROOT / "tests" / "audit" / "rollout.jsonl"
_START_NS: Final = 1_772_442_000 * 10**9  # 2026-03-02T09:00:00Z
_STEP_NS: Final = 7 * 60 * 10**9 + 123_000_000


def rollout_policy() -> Policy:
    """``audit-only.yaml``, except that privileged GPU pods were refused before the rollout."""
    spec = yaml.safe_load((EXAMPLES / "audit-only.yaml").read_text())
    spec["spec"]["rules"]["privileged-gpu"] = "deny"
    return parse_policy(yaml.safe_dump(spec), source="audit-only + privileged-gpu: deny")


def _gpu(container: dict[str, Any], mib: int = 4000) -> dict[str, Any]:
    container["resources"] = {"limits": {"nvidia.com/gpumem": mib, "nvidia.com/gpucores": 50}}
    return container


def _trainer_template() -> dict[str, Any]:
    app = _gpu({"name": "train", "image": "pytorch/pytorch:2.3.0-cuda12.1-cudnn8-runtime"})
    app["env"] = [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
    return {"metadata": {"labels": {"app": "trainer"}}, "spec": {"containers": [app]}}


def _owned_pod(
    namespace: str,
    template: Mapping[str, Any],
    *,
    owner: tuple[str, str],
    labels: Mapping[str, str] | None = None,
) -> dict[str, Any]:
    """A pod as a controller creates it: generateName, owner reference, template labels."""
    kind, name = owner
    metadata = copy.deepcopy(dict(template.get("metadata") or {}))
    metadata["labels"] = {**metadata.get("labels", {}), **(labels or {})}
    metadata.update(
        generateName=f"{name}-",
        namespace=namespace,
        ownerReferences=[
            {
                "apiVersion": "batch/v1" if kind == "Job" else "apps/v1",
                "kind": kind,
                "name": name,
                "uid": str(uuid.UUID(int=7)),
                "controller": True,
            }
        ],
    )
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        "spec": copy.deepcopy(template["spec"]),
    }


def admissions() -> Iterator[dict[str, Any]]:
    """The objects created during the rollout, in order."""
    template = _trainer_template()
    yield {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "trainer", "namespace": "ml"},
        "spec": {
            "replicas": 3,
            "selector": {"matchLabels": {"app": "trainer"}},
            "template": template,
        },
    }
    for _ in range(3):
        yield _owned_pod(
            "ml",
            template,
            owner=("ReplicaSet", "trainer-5d8f7c9b4"),
            labels={"pod-template-hash": "5d8f7c9b4"},
        )
    inference = {
        "metadata": {"labels": {"app": "inference"}},
        "spec": {
            "containers": [
                _gpu({"name": "serve", "image": "nvcr.io/nvidia/tritonserver:24.05-py3"}, 2000)
            ]
        },
    }
    yield _owned_pod("ml", inference, owner=("StatefulSet", "inference"))
    pinned = {
        "metadata": {},
        "spec": {
            "nodeName": "gpu-node-3",
            "restartPolicy": "Never",
            "containers": [_gpu({"name": "eval", "image": "eval:1"})],
        },
    }
    for _ in range(2):
        yield _owned_pod("research", pinned, owner=("Job", "nightly-eval"))
    privileged = _gpu({"name": "shell", "image": "ubuntu:22.04"})
    privileged["securityContext"] = {"privileged": True}
    for _ in range(2):
        yield {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "debug-shell", "namespace": "research"},
            "spec": {"containers": [privileged]},
        }
    labeler = _gpu({"name": "label", "image": "labeler:0.4"}, 1000)
    yield {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "labeler", "namespace": "vision"},
        "spec": {"schedulerName": "volcano", "containers": [labeler]},
    }


def _generated_name(generate_name: str, serial: int) -> str:
    alphabet = "bcdfghjklmnpqrstvwxz2456789"
    suffix = "".join(alphabet[(serial * 7 + i * 11) % len(alphabet)] for i in range(5))
    return generate_name + suffix


def records(policy: Policy) -> Iterator[AuditRecord]:
    """The audit records the service writes for :func:`admissions`, stamped by a fixed clock."""
    now = _START_NS
    serial = 0

    def record(obj: Mapping[str, Any], endpoint: Endpoint) -> tuple[AuditRecord, Any]:
        nonlocal now, serial
        serial += 1
        review = admission_review(obj, uid=str(uuid.UUID(int=serial)))
        version, request = parse_review(review)
        answered = answer(version, request, policy, endpoint=endpoint)
        with mock.patch.object(time, "time_ns", return_value=now):
            built = build_record(
                answered, endpoint=endpoint, policy_hash=policy.digest, latency_s=0.000412
            )
        now += 1_000_000  # the apiserver calls /validate a millisecond later
        return built, answered

    for obj in admissions():
        built, answered = record(obj, "mutate")
        yield built
        if answered.decision.allowed:
            final = jsonpatch.apply_patch(obj, answered.decision.patch)
            metadata = final["metadata"]
            if not metadata.get("name"):  # the apiserver names it before validation
                metadata["name"] = _generated_name(metadata["generateName"], serial)
            yield record(final, "validate")[0]
        now += _STEP_NS


def write_log(path: Path, policy: Policy | None = None) -> None:
    """Write the rollout's audit log to ``path`` through the service's audit sink."""
    path.unlink(missing_ok=True)
    sink = AuditSink(str(path))
    try:
        for built in records(policy or rollout_policy()):
            sink.emit(built)
    finally:
        sink.close()


if __name__ == "__main__":
    write_log(LOG)
