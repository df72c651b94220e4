"""The background scan: running pods judged as /validate would judge them created now."""

from __future__ import annotations

import copy
from typing import Any

import orjson
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.core import strategies
from tests.core.test_context import SNAPSHOT
from tests.core.test_decision import gpu_pod, policy_with
from webhook.core.cluster import view_from_objects
from webhook.core.review import review_object
from webhook.core.scan import (
    OMITTED,
    Result,
    judge_data,
    judge_pod,
    judge_view,
    pod_facts,
    read_facts,
    report_body,
    same_report,
    scan,
    scan_view,
)
from webhook.policies import DEFAULT_POLICY

QUOTA = policy_with("  rules: {gpu-quota: deny}\n  limits: {perContainer: {memoryMiB: 4000}}")


def admitted(pod: dict[str, Any]) -> dict[str, Any]:
    """``pod`` as the apiserver stores it after both webhooks, bound by the scheduler."""
    entry = review_object(pod, DEFAULT_POLICY)
    assert entry["allowed"], entry["violations"]
    stored: dict[str, Any] = copy.deepcopy(entry["object"])
    stored["metadata"]["uid"] = "0b9f-uid"
    stored["spec"]["nodeName"] = "gpu-1"
    stored["metadata"]["annotations"].update(
        {"hami.io/vgpu-devices-allocated": "GPU-0,NVIDIA,3000,0:;", "hami.io/vgpu-node": "gpu-1"}
    )
    stored["status"] = {"phase": "Running"}
    return stored


def rules(results: tuple[Result, ...]) -> list[str]:
    return [r.rule for r in results]


def test_an_admitted_bound_pod_has_no_finding() -> None:
    # nodeName and the allocation annotations are the scheduler's and device plugin's.
    assert judge_pod(admitted(gpu_pod()), DEFAULT_POLICY, cluster=None) == ()


def test_a_pod_over_a_tightened_maximum_fails_its_rule() -> None:
    big = admitted(gpu_pod({"nvidia.com/gpumem": "6000"}))
    small = admitted(gpu_pod({"nvidia.com/gpumem": "3000"}))
    (result,) = judge_pod(big, QUOTA, cluster=None)
    assert (result.rule, result.action, result.status) == ("gpu-quota", "deny", "fail")
    assert (result.kind, result.namespace, result.name, result.uid) == (
        "Pod",
        "ml",
        "p",
        "0b9f-uid",
    )
    assert "6000" in result.message and "4000" in result.message
    assert judge_pod(small, QUOTA, cluster=None) == ()


def test_an_unmutated_gpu_pod_is_reported() -> None:
    raw = gpu_pod()
    raw["metadata"]["uid"] = "u"
    assert rules(judge_pod(raw, DEFAULT_POLICY, cluster=None)) == ["unmutated-gpu-pod"]


def test_pinning_and_forged_annotations_are_not_judged_on_a_running_pod() -> None:
    pod = gpu_pod(nodeName="gpu-1")
    pod["metadata"]["annotations"] = {"hami.io/vgpu-devices-allocated": "x"}
    found = rules(
        judge_pod(admitted(gpu_pod()) | {"spec": pod["spec"]}, DEFAULT_POLICY, cluster=None)
    )
    assert "node-name-pinning" not in found and "forged-allocation" not in found


def test_user_values_are_redacted() -> None:
    pod = gpu_pod(schedulerName="my-secret-scheduler")
    results = judge_pod(admitted(gpu_pod()) | {"spec": pod["spec"]}, DEFAULT_POLICY, cluster=None)
    assert "scheduler-bypass" in rules(results)
    assert not any("my-secret-scheduler" in r.message for r in results)


def test_exempt_namespaces_are_not_judged() -> None:
    policy = policy_with("  exemptions: {namespaces: [ml]}")
    assert judge_pod(gpu_pod(), policy, cluster=None) == ()


def test_a_running_pod_is_not_counted_twice_against_its_quota() -> None:
    view = view_from_objects(yaml.safe_load_all(SNAPSHOT.read_text()))
    policy = policy_with("  rules: {gpu-quota: deny}")
    # 60,000 MiB against the 50,000 the quota leaves: refused at admission...
    pod = gpu_pod({"nvidia.com/gpu": "2", "nvidia.com/gpumem": "30000"})
    assert not review_object(pod, policy, cluster=view)["allowed"]
    # ... but once running, it is part of the quota's `used`: no finding.
    stored = admitted(pod)
    assert judge_pod(stored, policy, cluster=scan_view(view)) == ()


def test_config_maps_and_secrets_holding_guarded_names() -> None:
    (result,) = judge_data(
        "ConfigMap", "ml", "env", {"NVIDIA_VISIBLE_DEVICES": "all"}, DEFAULT_POLICY
    )
    assert (result.rule, result.kind, result.name) == ("raw-visible-devices", "ConfigMap", "env")
    assert "all" not in result.message.split("holds")[1]
    assert judge_data("Secret", "ml", "s", {"CUDA_DISABLE_CONTROL": "1"}, DEFAULT_POLICY)
    # A suffix the view keeps for envFrom prefixes is no guarded name by itself.
    assert judge_data("ConfigMap", "ml", "p", {"VISIBLE_DEVICES": "all"}, DEFAULT_POLICY) == ()
    off = policy_with("  rules: {raw-visible-devices: 'off'}")
    assert judge_data("ConfigMap", "ml", "env", {"NVIDIA_VISIBLE_DEVICES": "0"}, off) == ()
    view = view_from_objects(
        [
            {
                "kind": "ConfigMap",
                "metadata": {"namespace": "ml", "name": "c"},
                "data": {"CUDA_REDIRECT": "x"},
            }
        ]
    )
    assert [r.name for r in judge_view(view, DEFAULT_POLICY)] == ["c"]


# What a cluster's pods carry that no rule reads, so that slimming has work to do.
_NOISE: dict[str, Any] = {
    "image": "registry.example/app:1",
    "command": ["python"],
    "args": ["-m", "app"],
    "ports": [{"containerPort": 8080}],
    "readinessProbe": {"httpGet": {"path": "/", "port": 8080}},
    "terminationMessagePath": "/dev/termination-log",
}


def _noisy(pod: dict[str, Any]) -> dict[str, Any]:
    pod = copy.deepcopy(pod)
    metadata = pod.setdefault("metadata", {}) or {}
    pod["metadata"] = metadata
    if isinstance(metadata, dict):
        metadata.setdefault("labels", {"app": "x"})
    spec = pod.get("spec")
    if isinstance(spec, dict):
        spec.update({"tolerations": [{"operator": "Exists"}], "dnsPolicy": "ClusterFirst"})
        spec.setdefault("volumes", []).append(
            {
                "name": "kube-api-access-x7k2p",
                "projected": {"sources": [{"serviceAccountToken": {}}]},
            }
        )
        for container in spec.get("containers") or []:
            if isinstance(container, dict):
                container.update(_NOISE)
    return pod


@settings(max_examples=300, deadline=None)
@given(pod=strategies.pods(), policy=st.sampled_from([DEFAULT_POLICY, QUOTA]))
def test_slim_facts_give_the_same_verdicts(pod: dict[str, Any], policy: Any) -> None:
    pod = _noisy(pod)
    slim = read_facts(pod_facts(pod))
    assert judge_pod(slim, policy, cluster=None) == judge_pod(pod, policy, cluster=None)


def test_slim_facts_drop_what_no_rule_reads() -> None:
    pod = _noisy(admitted(gpu_pod()))
    pod["metadata"]["annotations"]["kubectl.kubernetes.io/last-applied-configuration"] = "{...}"
    slim = read_facts(pod_facts(pod))
    assert "status" not in slim and "labels" not in slim["metadata"]
    assert "kubectl.kubernetes.io/last-applied-configuration" not in slim["metadata"]["annotations"]
    assert "image" not in slim["spec"]["containers"][0]
    assert {"name": "kube-api-access-x7k2p", "projected": {}} in slim["spec"]["volumes"]
    pod["metadata"]["managedFields"] = [{"manager": "kubectl", "fieldsV1": {"f:spec": {}}}]
    assert "managedFields" not in read_facts(pod_facts(pod))["metadata"]
    assert scan([pod_facts(pod)], DEFAULT_POLICY, cluster=None) == [()]


def _result(name: str, action: Any = "deny", rule: str = "gpu-quota") -> Result:
    return Result("Pod", "ml", name, f"uid-{name}", rule, action, f"{name} is over")


def test_a_report_holds_failures_and_warnings_capped_with_the_overflow_counted() -> None:
    results = [_result(f"p{i}") for i in range(5)] + [_result("w", "warn"), _result("a", "audit")]
    body = report_body("ml", results, policy="strict", found=lambda _r: 1700000000, max_results=3)
    assert body["summary"] == {"pass": 0, "fail": 6, "warn": 1, "error": 0, "skip": 0}
    assert [r["resources"][0]["name"] for r in body["results"]] == ["p0", "p1", "p2"]
    assert body["metadata"]["annotations"] == {OMITTED: "4"}
    assert body["configuration"] == {
        "limits": {"maxResults": 3, "statusFilter": ["fail", "warn", "skip"]}
    }
    first = body["results"][0]
    assert first == {
        "source": "gpushare-webhook",
        "policy": "strict",
        "rule": "gpu-quota",
        "category": "GPU sharing",
        "severity": "high",
        "result": "fail",
        "scored": True,
        "message": "p0 is over",
        "timestamp": {"seconds": 1700000000, "nanos": 0},
        "resources": [
            {"apiVersion": "v1", "kind": "Pod", "namespace": "ml", "name": "p0", "uid": "uid-p0"}
        ],
        "properties": {"action": "deny"},
    }


def test_a_status_filter_and_the_policy_report_shape() -> None:
    results = [_result("p"), _result("w", "warn")]
    body = report_body(
        "ml", results, policy="x", found=lambda _r: 1, statuses=("warn",), kind="wgpolicyk8s"
    )
    assert (body["apiVersion"], body["kind"]) == ("wgpolicyk8s.io/v1alpha2", "PolicyReport")
    assert "source" not in body and "configuration" not in body
    assert [r["result"] for r in body["results"]] == ["warn"]
    assert body["summary"]["fail"] == 0


def test_an_unchanged_scan_gives_the_same_report() -> None:
    results = [_result("b"), _result("a")]
    body = report_body("ml", results, policy="x", found=lambda _r: 5)
    again = report_body("ml", list(reversed(results)), policy="x", found=lambda _r: 5)
    held = orjson.loads(orjson.dumps(body)) | {"metadata": {"resourceVersion": "7"}}
    assert same_report(held, again)
    assert not same_report(held, report_body("ml", results[:1], policy="x", found=lambda _r: 5))


def test_what_an_exception_takes_off_is_reported_skipped_and_once_expired_failing() -> None:
    policy = policy_with(
        "  exceptions:\n"
        "    - {name: legacy, rules: [scheduler-bypass], namespaces: [ml], reason: r,\n"
        "       owner: team-a, expires: 2027-06-30}\n"
        "    - {name: bot, rules: [scheduler-bypass], users: [ci], reason: r, owner: o}"
    )
    pod = admitted(gpu_pod()) | {"spec": gpu_pod(schedulerName="mine")["spec"]}

    def bypass(pod: dict[str, Any], today: str) -> Result:
        (found,) = [
            r
            for r in judge_pod(pod, policy, cluster=None, today=today)
            if r.rule != "unmutated-gpu-pod"
        ]
        return found

    skipped = bypass(pod, "2027-06-30")
    assert (skipped.rule, skipped.status, skipped.exception) == (
        "scheduler-bypass",
        "skip",
        "legacy",
    )
    failing = bypass(pod, "2027-07-01")
    assert (failing.status, failing.exception, failing.expired) == ("fail", "legacy", "2027-06-30")
    body = report_body("ml", [skipped, failing], policy="p", found=lambda _: 0)
    assert body["summary"]["skip"] == 1 and body["summary"]["fail"] == 1
    # The failure first; the skipped one last, with its exception.
    assert [r["result"] for r in body["results"]] == ["fail", "skip"]
    assert body["results"][0]["properties"]["expiredException"] == "legacy (expired 2027-06-30)"
    assert body["results"][1]["properties"]["exception"] == "legacy"
    # An exception by requester cannot be told on a running pod: it takes nothing off.
    elsewhere = pod | {"metadata": {**pod["metadata"], "namespace": "other"}}
    other = bypass(elsewhere, "2027-01-01")
    assert other.status == "fail" and other.exception == ""
