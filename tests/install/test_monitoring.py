"""The chart's PrometheusRule and Grafana dashboard: off by default, valid to promtool,
alerts that fire on the series they are meant for (promtool test rules), thresholds that
follow webhook.timeoutSeconds, and queries only of metrics the webhook exports
(tests/e2e/test_monitoring.py scrapes a running serve for that)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any, Final

import pytest
import yaml

from tests.install.chart import (
    HELM_MAJORS,
    NAMESPACE,
    Obj,
    find_helm,
    find_promtool,
    helm_major,
    run,
    template,
)
from webhook.service.metrics import _BUCKETS

RULES: Final = "metrics.prometheusRule.enabled=true"
DASHBOARD: Final = "metrics.grafanaDashboard.enabled=true"
ALERTS: Final = {
    "GPUShareWebhookErrors",
    "GPUShareWebhookTimeouts",
    "GPUShareWebhookSlow",
    "GPUShareWebhookCertificateExpiring",
    "GPUShareWebhookClusterViewUnsynced",
    "GPUShareWebhookPolicyReloadFailed",
}
METRIC: Final = re.compile(r"\bgpushare_[a-z0-9_]+\b")


@pytest.fixture(scope="module", params=HELM_MAJORS, ids=lambda major: f"helm{major}")
def helm(request: pytest.FixtureRequest) -> str:
    path = find_helm(request.param)
    assert helm_major(path) == request.param
    return path


def one(objects: list[Obj], kind: str) -> Obj:
    (found,) = [o for o in objects if o["kind"] == kind]
    return found


def rules_of(objects: list[Obj]) -> list[Obj]:
    spec: Obj = one(objects, "PrometheusRule")["spec"]
    return [rule for group in spec["groups"] for rule in group["rules"]]


def dashboard_of(objects: list[Obj]) -> Obj:
    maps = [o for o in objects if o["metadata"]["name"] == "gpushare-webhook-dashboard"]
    (config_map,) = maps
    board: Obj = json.loads(config_map["data"]["gpushare-webhook.json"])
    return board


def dashboard_queries(board: Obj) -> list[str]:
    queries = [t["expr"] for panel in board["panels"] for t in panel["targets"]]
    for variable in board["templating"]["list"]:
        query = variable.get("query")
        if isinstance(query, dict):
            queries.append(query["query"])
    return queries


def metric_names(queries: list[str]) -> set[str]:
    return {name for query in queries for name in METRIC.findall(query)}


def used_metric_names(helm: str) -> set[str]:
    """Every metric name the rendered rules and dashboard query."""
    objects = template(helm, settings=[RULES, DASHBOARD])
    queries = [rule["expr"] for rule in rules_of(objects)]
    queries += dashboard_queries(dashboard_of(objects))
    return metric_names(queries)


# ------------------------------------------------------------------------ rendering


def test_off_by_default(helm: str) -> None:
    objects = template(helm)
    assert "PrometheusRule" not in {o["kind"] for o in objects}
    assert "gpushare-webhook-dashboard" not in {o["metadata"]["name"] for o in objects}


def test_the_rules_are_the_alerts_asked_for(helm: str) -> None:
    rules = rules_of(template(helm, settings=[RULES, "metrics.prometheusRule.labels.release=x"]))
    assert {rule["alert"] for rule in rules} == ALERTS
    for rule in rules:
        assert f'namespace="{NAMESPACE}"' in rule["expr"], rule["alert"]
        assert rule["labels"]["severity"] in {"warning", "critical"}
        assert rule["annotations"]["summary"] and rule["annotations"]["description"]
    labels = one(
        template(helm, settings=[RULES, "metrics.prometheusRule.labels.release=x"]),
        "PrometheusRule",
    )["metadata"]["labels"]
    assert labels["release"] == "x" and labels["app.kubernetes.io/part-of"] == "gpushare"


@pytest.mark.parametrize(("timeout", "bucket"), [(1, "1.0"), (2, "1.0"), (3, "2.5"), (10, "5.0")])
def test_latency_alerts_follow_the_registration_timeout(
    helm: str, timeout: int, bucket: str
) -> None:
    objects = template(helm, settings=[RULES, f"webhook.timeoutSeconds={timeout}"])
    rules = {rule["alert"]: rule["expr"] for rule in rules_of(objects)}
    assert rules["GPUShareWebhookSlow"].rstrip().endswith(f"> {timeout / 2:g}")
    assert f'le="{bucket}"' in rules["GPUShareWebhookTimeouts"]
    # The bucket is one the histogram has, and the last one within the timeout.
    bounds = [b for b in _BUCKETS if b <= timeout]
    assert float(bucket) == max(bounds)
    hooks = [o for o in objects if o["kind"].endswith("WebhookConfiguration")]
    assert {hook["timeoutSeconds"] for o in hooks for hook in o["webhooks"]} == {timeout}


def test_the_dashboard_draws_the_registration_timeout(helm: str) -> None:
    board = dashboard_of(template(helm, settings=[DASHBOARD, "webhook.timeoutSeconds=7"]))
    variables = {v["name"]: v for v in board["templating"]["list"]}
    assert variables["timeout"]["query"] == "7"
    assert variables["namespace"]["current"]["value"] == NAMESPACE
    titles = {panel["title"] for panel in board["panels"]}
    assert titles >= {
        "Answers by decision and mode",
        "Answer time against the timeout",
        "Violations by rule",
        "Connection limits hit",
        "Certificate expiry",
        "Cluster view synced",
        "Cluster view age",
    }
    assert len({panel["id"] for panel in board["panels"]}) == len(board["panels"])
    latency = next(p for p in board["panels"] if p["title"] == "Answer time against the timeout")
    assert "vector($timeout)" in [t["expr"] for t in latency["targets"]]


def test_the_dashboard_configmap_is_for_the_sidecar(helm: str) -> None:
    objects = template(helm, settings=[DASHBOARD, "metrics.grafanaDashboard.annotations.a=b"])
    config_map = next(o for o in objects if o["metadata"]["name"] == "gpushare-webhook-dashboard")
    assert config_map["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert config_map["metadata"]["annotations"] == {"a": "b"}


def test_queries_use_only_the_webhooks_metrics(helm: str) -> None:
    names = used_metric_names(helm)
    assert len(names) >= 10, names
    # Every identifier in a query that is not PromQL is one of ours.
    objects = template(helm, settings=[RULES, DASHBOARD])
    queries = [r["expr"] for r in rules_of(objects)]
    queries += dashboard_queries(dashboard_of(objects))
    words = {w for q in queries for w in re.findall(r"\b[a-z_][a-z0-9_]*\b(?=\s*[{\[(])", q)}
    promql = {
        "sum",
        "rate",
        "increase",
        "histogram_quantile",
        "min",
        "max",
        "count",
        "vector",
        "label_values",
        "by",
    }
    assert words - promql <= names, words - promql


# --------------------------------------------------------------------------- promtool


@pytest.fixture(scope="module")
def promtool() -> str:
    return find_promtool()


def write_rules(helm: str, directory: Path, *settings: str) -> Path:
    spec = one(template(helm, settings=[RULES, *settings]), "PrometheusRule")["spec"]
    path = directory / "rules.yaml"
    path.write_text(yaml.safe_dump(spec))
    return path


def test_promtool_checks_the_rules(helm: str, promtool: str, tmp_path: Path) -> None:
    result = run([promtool, "check", "rules", str(write_rules(helm, tmp_path))])
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in result.stdout


def test_promtool_refuses_a_broken_rule(promtool: str, tmp_path: Path) -> None:
    """The check is not a formality."""
    path = tmp_path / "broken.yaml"
    rule = {"alert": "Broken", "expr": "sum(rate(gpushare_admission_requests_total[5m])"}
    path.write_text(yaml.safe_dump({"groups": [{"name": "g", "rules": [rule]}]}))
    assert run([promtool, "check", "rules", str(path)]).returncode != 0


def series(name: str, values: str, **labels: str) -> dict[str, str]:
    selector = ",".join(f'{k}="{v}"' for k, v in {"namespace": NAMESPACE, **labels}.items())
    return {"series": f"{name}{{{selector}}}", "values": values}


def latency_series(per_minute: dict[str, int], minutes: int) -> list[dict[str, str]]:
    """Histogram buckets that grow by ``per_minute[le]`` answers a minute (cumulative)."""
    out = []
    for bound in [*_BUCKETS, float("inf")]:
        le = "+Inf" if bound == float("inf") else f"{bound:.1f}" if bound >= 1 else str(bound)
        step = max((n for b, n in per_minute.items() if float(b) <= bound), default=0)
        out.append(
            series(
                "gpushare_admission_review_duration_seconds_bucket",
                f"0+{step}x{minutes}",
                le=le,
                endpoint="/validate",
            )
        )
    total = max(per_minute.values())
    out.append(
        series(
            "gpushare_admission_review_duration_seconds_count",
            f"0+{total}x{minutes}",
            endpoint="/validate",
        )
    )
    return out


def alert_test(
    name: str,
    input_series: list[dict[str, str]],
    at: str,
    firing: bool,
    description: str = "",
    **labels: str,
) -> dict[str, Any]:
    """One promtool unit test; a firing alert's description is checked as rendered with
    the alert's value ({{ $value }}), its summary filled in from the rule below."""
    expected = (
        [{"exp_labels": labels, "exp_annotations": {"description": description}}] if firing else []
    )
    return {
        "interval": "1m",
        "input_series": input_series,
        "alert_rule_test": [{"eval_time": at, "alertname": name, "exp_alerts": expected}],
    }


def test_the_alerts_fire_on_what_they_are_for(helm: str, promtool: str, tmp_path: Path) -> None:
    """promtool test rules: synthetic series, the alert at a time, firing or not, with
    the labels it keeps (severity, and what its expression does not aggregate away)."""
    rules = write_rules(helm, tmp_path)
    day = 86400
    tests = [
        # A certificate with 10 days left fires after the rule's hour; 30 days does not.
        alert_test(
            "GPUShareWebhookCertificateExpiring",
            [series("gpushare_certificate_expiry_seconds", f"{10 * day}x120", pod="a")],
            "90m",
            True,
            "A replica in gpushare-system serves a certificate that expires in 10d 0h 0m 0s; "
            "renewal has not happened. Once it expires the apiserver refuses GPU pods.",
            severity="critical",
        ),
        alert_test(
            "GPUShareWebhookCertificateExpiring",
            [series("gpushare_certificate_expiry_seconds", f"{30 * day}x120", pod="a")],
            "90m",
            False,
        ),
        # Every answer in the 2.5 s bucket: p99 over 1.5 s (half of 3) and none timing out.
        alert_test(
            "GPUShareWebhookSlow",
            latency_series({"2.5": 60}, 60),
            "40m",
            True,
            "The 99th percentile answer time in gpushare-system is 2.485s, over 1.5s "
            "(webhook.timeoutSeconds is 3).",
            severity="warning",
        ),
        alert_test("GPUShareWebhookTimeouts", latency_series({"2.5": 60}, 60), "40m", False),
        # Answers in the 5 s bucket: past the 3 s timeout.
        alert_test(
            "GPUShareWebhookTimeouts",
            latency_series({"5.0": 60}, 60),
            "40m",
            True,
            "100% of the answers in gpushare-system took longer than 2.5s; with "
            "timeoutSeconds 3 the apiserver refuses GPU pods it could not get an answer for.",
            severity="critical",
        ),
        # Fast answers: neither.
        alert_test("GPUShareWebhookSlow", latency_series({"0.001": 60}, 60), "40m", False),
        alert_test(
            "GPUShareWebhookClusterViewUnsynced",
            [series("gpushare_cluster_view_synced", "0x30", pod="a")],
            "20m",
            True,
            "Replica a in gpushare-system has not synced its cluster view for 10 minutes: "
            "cluster-aware rules are skipped there.",
            severity="warning",
            pod="a",
        ),
        alert_test(
            "GPUShareWebhookErrors",
            [
                series(
                    "gpushare_admission_errors_total",
                    "0+5x60",
                    endpoint="/validate",
                    kind="evaluation",
                ),
                series(
                    "gpushare_admission_requests_total",
                    "0+100x60",
                    endpoint="/validate",
                    decision="error",
                    mode="vgpu",
                    dry_run="false",
                ),
            ],
            "30m",
            True,
            "5% of the reviews in gpushare-system could not be evaluated or were malformed; "
            "the policy's onError decided them. See the webhook's log.",
            severity="warning",
        ),
        alert_test(
            "GPUShareWebhookPolicyReloadFailed",
            [series("gpushare_policy_reloads_total", "0 0 1 1 1", result="failed", pod="a")],
            "4m",
            True,
            "Replica a in gpushare-system refused the new policy and keeps the previous one; "
            "see its log for the errors.",
            severity="warning",
            pod="a",
            result="failed",
            namespace=NAMESPACE,
        ),
    ]
    summaries = {
        rule["alert"]: rule["annotations"]["summary"]
        for group in yaml.safe_load(rules.read_text())["groups"]
        for rule in group["rules"]
    }
    for test in tests:
        for alert in test["alert_rule_test"]:
            for expected in alert["exp_alerts"]:
                expected["exp_annotations"]["summary"] = summaries[alert["alertname"]]
    unit = tmp_path / "unit.yaml"
    unit.write_text(
        yaml.safe_dump({"rule_files": [str(rules)], "evaluation_interval": "1m", "tests": tests})
    )
    result = run([promtool, "test", "rules", str(unit)])
    assert result.returncode == 0, result.stdout + result.stderr
    assert "SUCCESS" in result.stdout
