"""Policy reports through a real kube-apiserver, as a security team reads them.

The dev cluster's webhook runs with `--cluster --reports --reports-policyreport`
(interval 2 s) and the report CRDs of deploy/reports. Pods are stored for real; no
scheduler or kubelet runs, so they stay Pending, which the scan judges like Running.
Each test asks "which pods violate the policy now?" the way a security team does: from
the Reports in the namespace (and `report --cluster`), within the 60 s the issue allows.
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable, Iterator
from typing import Any, Final, TypeVar

import orjson
import pytest

from tests.e2e.rest import Api, gpu_pod
from tests.e2e.test_cluster_view import swapped_policy
from webhook.dev.cluster import DevCluster

pytestmark = pytest.mark.e2e

WITHIN: Final = 60.0
REPORT: Final = "gpushare-webhook"
KINDS: Final = {
    "openreports": ("openreports.io", "v1alpha1", "reports"),
    "wgpolicyk8s": ("wgpolicyk8s.io", "v1alpha2", "policyreports"),
}
T = TypeVar("T")


@pytest.fixture(scope="module")
def api(cluster: DevCluster) -> Api:
    return Api(cluster)


@pytest.fixture(scope="module")
def custom(cluster: DevCluster) -> Any:
    from kubernetes import client

    return client.CustomObjectsApi(cluster.api_client())


def report(custom: Any, namespace: str, kind: str = "openreports") -> dict[str, Any] | None:
    from kubernetes.client.exceptions import ApiException

    group, version, plural = KINDS[kind]
    try:
        found: dict[str, Any] = custom.get_namespaced_custom_object(
            group, version, namespace, plural, REPORT
        )
    except ApiException as exc:
        if exc.status == 404:
            return None
        raise
    return found


def failing(body: dict[str, Any] | None) -> set[tuple[str, str]]:
    """(pod name, rule) of every failed result."""
    if body is None:
        return set()
    return {
        (r["resources"][0]["name"], r["rule"]) for r in body["results"] if r["result"] == "fail"
    }


def waited(probe: Callable[[], T], done: Callable[[T], bool], *, within: float = WITHIN) -> T:
    """The first value of ``probe`` that ``done`` accepts, or the last one after ``within``."""
    deadline = time.monotonic() + within
    while True:
        value = probe()
        if done(value) or time.monotonic() > deadline:
            return value
        time.sleep(0.5)


def metric(cluster: DevCluster, series: str) -> float | None:
    """The value of one series of the webhook's /metrics, None when it has none."""
    assert cluster.webhook is not None
    url = f"http://127.0.0.1:{cluster.webhook.health_port}/metrics"
    with urllib.request.urlopen(url, timeout=10) as response:  # loopback
        text = response.read().decode()
    for line in text.splitlines():
        if line.startswith(series + " "):
            return float(line[len(series) + 1 :])
    return None


def violations_metric(cluster: DevCluster, namespace: str, rule: str) -> float | None:
    return metric(cluster, f'gpushare_running_violations{{namespace="{namespace}",rule="{rule}"}}')


def writes(cluster: DevCluster) -> float:
    return sum(
        metric(cluster, f'gpushare_report_writes_total{{kind="{kind}",verb="{verb}"}}') or 0.0
        for kind in KINDS
        for verb in ("apply", "delete")
    )


def cli_report(cluster: DevCluster, *args: str) -> Any:
    kubeconfig = cluster.workdir / "reports-cli.kubeconfig"
    cluster.write_kubeconfig(kubeconfig)
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "webhook",
            "report",
            "--cluster",
            "--kubeconfig",
            str(kubeconfig),
            *list(args),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def created(api: Api, namespace: str, obj: dict[str, Any]) -> dict[str, Any]:
    sent = api.create("Pod", namespace, obj, dry_run=False)
    assert sent.status == 201, sent.body
    body: dict[str, Any] = sent.body
    return body


def with_memory(name: str, mib: int) -> dict[str, Any]:
    pod = gpu_pod(name)
    pod["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpumem"] = str(mib)
    return pod


def tightened(document: dict[str, Any]) -> None:
    spec = document.setdefault("spec", {})
    spec.setdefault("rules", {})["gpu-quota"] = "deny"
    spec.setdefault("limits", {})["perContainer"] = {"memoryMiB": 4000}
    # ConfigMaps join the view (and the reports) when the policy judges env from them.
    spec.setdefault("cluster", {})["configMapEnv"] = True


@contextlib.contextmanager
def webhooks_down(cluster: DevCluster) -> Iterator[None]:
    """The registrations deleted inside the block: pods get in unmutated (fail open)."""
    cluster.unregister_webhooks()
    try:
        yield
    finally:
        cluster.register_webhooks()


def test_a_pod_over_a_tightened_maximum_is_reported_until_deleted(
    cluster: DevCluster, api: Api, custom: Any, core: Any, namespace: str
) -> None:
    big = created(api, namespace, with_memory("big", 6000))
    created(api, namespace, with_memory("small", 2000))
    # Written before any guard of ConfigMaps existed (none is registered here).
    with webhooks_down(cluster):
        core.create_namespaced_config_map(
            namespace, {"metadata": {"name": "devices"}, "data": {"NVIDIA_VISIBLE_DEVICES": "all"}}
        )
    # Admitted under the default policy (no maxima, ConfigMaps not read): nothing to report.
    time.sleep(3)
    assert report(custom, namespace) is None
    with swapped_policy(cluster, tightened):
        started = time.monotonic()
        body = waited(lambda: report(custom, namespace), lambda b: len(failing(b)) == 2)
        elapsed = time.monotonic() - started
        assert failing(body) == {("big", "gpu-quota"), ("devices", "raw-visible-devices")}, body
        assert elapsed <= WITHIN
        assert body is not None
        (result,) = [r for r in body["results"] if r["rule"] == "gpu-quota"]
        assert result["source"] == "gpushare-webhook"
        assert result["severity"] == "high" and result["category"] == "GPU sharing"
        assert result["resources"][0]["uid"] == big["metadata"]["uid"]
        assert "6000" in result["message"] and "4000" in result["message"]
        assert body["summary"]["fail"] == 2
        (data,) = [r for r in body["results"] if r["rule"] == "raw-visible-devices"]
        assert data["resources"][0]["kind"] == "ConfigMap" and "all" not in data["message"]
        # Nothing changes: nothing is written (three passes of the 2 s interval).
        written = writes(cluster)
        time.sleep(6)
        assert writes(cluster) == written
        # The same in the PolicyReport that Policy Reporter reads.
        policy_report = waited(
            lambda: report(custom, namespace, "wgpolicyk8s"), lambda b: len(failing(b)) == 2
        )
        assert failing(policy_report) == failing(body)
        assert violations_metric(cluster, namespace, "gpu-quota") == 1.0
        listed = orjson.loads(cli_report(cluster, "-o", "json", "--namespace", namespace))
        assert [(r["name"], r["rule"], r["result"]) for r in listed["results"]] == [
            ("devices", "raw-visible-devices", "fail"),
            ("big", "gpu-quota", "fail"),
        ]
        assert "big" in cli_report(cluster, "--namespace", namespace)
        # Deleting the pod removes the result; with the ConfigMap gone too, the report.
        core.delete_namespaced_pod("big", namespace, grace_period_seconds=0)
        left = waited(lambda: report(custom, namespace), lambda b: len(failing(b)) == 1)
        assert failing(left) == {("devices", "raw-visible-devices")}, left
        core.delete_namespaced_config_map("devices", namespace)
        gone = waited(lambda: report(custom, namespace), lambda b: b is None)
        assert gone is None, gone
        assert report(custom, namespace, "wgpolicyk8s") is None
        assert violations_metric(cluster, namespace, "gpu-quota") is None


def test_pods_let_in_without_the_webhooks_are_reported_and_the_cap_holds(
    cluster: DevCluster, api: Api, custom: Any, namespace: str
) -> None:
    crowded = namespace[:50] + "-many"
    cluster.create_namespace(crowded)
    cdi = {"cdi.k8s.io/gpu": "nvidia.com/gpu=all"}
    plain: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "cdi", "annotations": cdi},
        "spec": {"containers": [{"name": "app", "image": "busybox"}]},
    }
    with webhooks_down(cluster):
        created(api, namespace, gpu_pod("raw"))
        created(api, namespace, plain)
        for i in range(105):
            created(api, crowded, gpu_pod(f"raw-{i:03d}"))
    body = waited(lambda: report(custom, namespace), lambda b: len(failing(b)) == 2)
    assert failing(body) == {("raw", "unmutated-gpu-pod"), ("cdi", "host-device-access")}, body
    # The cap: 100 results (the default), all 105 failures counted in the summary.
    many = waited(
        lambda: report(custom, crowded), lambda b: b is not None and b["summary"]["fail"] == 105
    )
    assert many is not None
    assert many["summary"]["fail"] == 105
    assert len(many["results"]) == 100
    assert many["configuration"]["limits"]["maxResults"] == 100
    assert many["metadata"]["annotations"]["gpushare.io/omitted-results"] == "5"
    listed = orjson.loads(cli_report(cluster, "-o", "json", "--namespace", crowded))
    assert listed["namespaces"][crowded] == {"fail": 105, "warn": 0, "omitted": 5}
    # Fixing the pod (its CDI annotation removed: an update that adds nothing) removes
    # its result; the unmutated pod stays reported.
    fixed = api.patch_pod(namespace, "cdi", {"metadata": {"annotations": {"cdi.k8s.io/gpu": None}}})
    assert fixed.status == 200, fixed.body
    body = waited(lambda: report(custom, namespace), lambda b: len(failing(b)) == 1)
    assert failing(body) == {("raw", "unmutated-gpu-pod")}, body


def test_a_sharing_pod_whose_claim_template_turns_up_on_a_gpu_class_is_reported(
    cluster: DevCluster, api: Api, custom: Any, namespace: str
) -> None:
    """Admitted while its template did not exist (nothing to judge); the template then
    written while the webhooks were down: the running pod takes whole GPUs beside its
    slices, which only the view's templates show."""
    from kubernetes import client

    pod = with_memory("late-claim", 2000)
    pod["spec"]["resourceClaims"] = [{"name": "dev", "resourceClaimTemplateName": "late"}]
    created(api, namespace, pod)
    time.sleep(3)
    assert report(custom, namespace) is None
    resource: Any = client.ResourceV1Api(cluster.api_client())
    request = {"name": "dev", "exactly": {"deviceClassName": "gpu.nvidia.com"}}
    with webhooks_down(cluster):
        resource.create_namespaced_resource_claim_template(
            namespace,
            {"metadata": {"name": "late"}, "spec": {"spec": {"devices": {"requests": [request]}}}},
        )
    body = waited(lambda: report(custom, namespace), lambda b: bool(failing(b)))
    assert failing(body) == {("late-claim", "gpu-claim")}, body
