"""Every metric the chart's alerting rules and dashboard query is exported by a running
`serve` (the test cluster's webhook, with the cluster view on), once it has answered a
review: a renamed metric fails here, not silently in someone's Prometheus."""

from __future__ import annotations

import ssl
import urllib.request

import orjson
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.install.chart import HELM_MAJORS, find_helm
from tests.install.test_monitoring import used_metric_names
from webhook.dev.cluster import DevCluster
from webhook.dev.testing import admission_review

pytestmark = pytest.mark.e2e

# The sample names each family type is exposed with.
SUFFIXES = {
    "counter": ("_total",),
    "histogram": ("_bucket", "_sum", "_count"),
    "gauge": ("",),
    "info": ("_info",),
}


def exported(text: str) -> set[str]:
    """Sample names in an exposition, and the names a declared family would expose."""
    names = set()
    for family in text_string_to_metric_families(text):
        names |= {sample.name for sample in family.samples}
        names |= {family.name + suffix for suffix in SUFFIXES.get(family.type, ("",))}
    return names


def scrape(cluster: DevCluster) -> str:
    webhook = cluster.webhook
    assert webhook is not None
    # A denied GPU pod: requests, violations and the latency histogram get samples.
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "metrics", "namespace": "default"},
        "spec": {
            "containers": [
                {
                    "name": "c",
                    "image": "cuda",
                    "securityContext": {"privileged": True},
                    "resources": {"limits": {"nvidia.com/gpumem": "1000"}},
                }
            ]
        },
    }
    context = ssl.create_default_context(cafile=str(webhook.cert_dir / "ca.crt"))
    request = urllib.request.Request(  # noqa: S310  # https to our own loopback webhook
        webhook.url + "/validate",
        data=orjson.dumps(admission_review(pod, namespace="default")),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, context=context, timeout=10) as response:  # noqa: S310
        answer = orjson.loads(response.read())
    assert answer["response"]["allowed"] is False, answer
    url = f"http://127.0.0.1:{webhook.health_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:  # our own loopback health port
        text: str = response.read().decode()
    return text


@pytest.mark.parametrize("major", HELM_MAJORS, ids=lambda major: f"helm{major}")
def test_every_queried_metric_is_exported(cluster: DevCluster, major: int) -> None:
    text = scrape(cluster)
    names = exported(text)
    used = used_metric_names(find_helm(major))
    assert used, "the rules and the dashboard query nothing"
    assert used <= names, f"queried but not exported: {sorted(used - names)}"
    # Not vacuous: what the latency panels read has samples.
    assert "gpushare_admission_review_duration_seconds_bucket{" in text
    assert "gpushare_admission_violations_total{" in text


def test_a_renamed_metric_would_be_caught() -> None:
    assert "gpushare_admission_requests_total" in exported(
        "# TYPE gpushare_admission_requests counter\n"
    )
    assert "gpushare_admission_request_total" not in exported(
        "# TYPE gpushare_admission_requests counter\n"
    )
