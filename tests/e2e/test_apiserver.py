"""Every promise of the product, through a real kube-apiserver: what it stored or refused."""

from __future__ import annotations

import base64
import contextlib
import copy
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest
import yaml

from tests.paths import MANIFESTS, ROOT
from webhook.certs.files import write_files
from webhook.certs.issue import generate_ca, generate_serving
from webhook.dev.cluster import DevCluster, free_port

pytestmark = pytest.mark.e2e


def _quantities_as_strings(node: Any) -> None:
    # The client validates quantities as strings; YAML reads `gpumem: 3000` as an int.
    if isinstance(node, dict):
        for key, value in node.items():
            if key in ("limits", "requests") and isinstance(value, dict):
                node[key] = {k: str(v) for k, v in value.items()}
            else:
                _quantities_as_strings(value)
    elif isinstance(node, list):
        for item in node:
            _quantities_as_strings(item)


def manifest(name: str, namespace: str) -> dict[str, Any]:
    data = yaml.safe_load((MANIFESTS / name).read_text())
    data["metadata"]["namespace"] = namespace
    _quantities_as_strings(data)
    return data  # type: ignore[no-any-return]


def gpu_pod(name: str, namespace: str, **spec: Any) -> dict[str, Any]:
    pod = manifest("hami-vgpu-pod.yaml", namespace)
    pod["metadata"]["name"] = name
    pod["spec"].update(spec)
    return pod


def env_names(container: Any) -> list[str]:
    return [e.name for e in container.env or []]


def audit(cluster: DevCluster, *, namespace: str, count: int) -> list[dict[str, Any]]:
    """The audit records of ``namespace`` once ``count`` have been written (a writer
    thread appends them just after each answer)."""
    assert cluster.webhook is not None
    deadline = time.monotonic() + 10
    while True:
        lines = cluster.webhook.audit_log.read_bytes().splitlines()
        records = [orjson.loads(line) for line in lines]
        mine = [r for r in records if r["objectRef"].get("namespace") == namespace]
        if len(mine) >= count or time.monotonic() > deadline:
            return mine
        time.sleep(0.05)


def refused(call: Any) -> Any:
    from kubernetes.client import ApiException

    with pytest.raises(ApiException) as caught:
        call()
    return caught.value


def test_vgpu_pod_is_mutated_once_despite_reinvocation(
    cluster: DevCluster, core: Any, namespace: str, tmp_path: Path
) -> None:
    with second_mutator(cluster, namespace, tmp_path):
        core.create_namespaced_pod(namespace, gpu_pod("vgpu", namespace))
    stored = core.read_namespaced_pod("vgpu", namespace)
    assert stored.metadata.annotations["e2e.gpushare.io/touched"] == "yes"
    assert stored.metadata.annotations["gpushare.io/mode"] == "vgpu"
    assert stored.spec.scheduler_name == "hami-scheduler"
    container = stored.spec.containers[0]
    names = env_names(container)
    assert sorted(names) == sorted(set(names))
    env = {e.name: e.value for e in container.env}
    assert env["LD_PRELOAD"] == "/usr/local/vgpu/libvgpu.so"
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m"
    assert env["CUDA_DEVICE_SM_LIMIT"] == "30"
    mounts = {m.mount_path: m for m in container.volume_mounts}
    assert mounts["/usr/local/vgpu/libvgpu.so"].read_only is True
    volumes = {v.name: v for v in stored.spec.volumes}
    assert volumes["gpushare-vgpu-lib"].host_path.path == "/usr/local/vgpu/libvgpu.so"
    calls = [
        r
        for r in audit(cluster, namespace=namespace, count=3)
        if r["endpoint"] == "mutate" and r["objectRef"].get("name") == "vgpu"
    ]
    # First call mutates; the reinvocation after the second mutator changes nothing.
    assert [c["patchOps"] > 0 for c in calls] == [True, False]


class _Mutator:
    """tests/e2e/mutator.py in its own process: a second mutating webhook."""

    def __init__(self, workdir: Path, *, sidecar: bool = False) -> None:
        self.sidecar = sidecar
        ca = generate_ca(common_name="e2e mutator CA", valid_for=timedelta(hours=2))
        serving = generate_serving(
            ca=ca, dns_names=["localhost"], ip_addresses=["127.0.0.1"], valid_for=timedelta(hours=2)
        )
        self.paths = write_files(workdir / "mutator", ca=ca, serving=serving)
        self.port = free_port()
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.process = subprocess.Popen(
            [
                sys.executable,
                str(Path(__file__).with_name("mutator.py")),
                str(self.port),
                str(self.paths.cert_file),
                str(self.paths.key_file),
                *(["sidecar"] if self.sidecar else []),
            ]
        )
        deadline = time.monotonic() + 30
        while True:
            assert self.process.poll() is None, "the test mutator exited"
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                assert time.monotonic() < deadline, "the test mutator did not listen"
                time.sleep(0.05)

    def stop(self) -> None:
        assert self.process is not None
        self.process.terminate()
        self.process.wait(15)


@contextlib.contextmanager
def second_mutator(
    cluster: DevCluster, namespace: str, workdir: Path, *, sidecar: bool = False
) -> Iterator[None]:
    """A second mutating webhook for pods in ``namespace``: it annotates them once
    and (``sidecar``) adds a container that asks for no GPU."""
    from kubernetes import client

    mutator = _Mutator(workdir, sidecar=sidecar)
    mutator.start()
    api: Any = client.AdmissionregistrationV1Api(cluster.api_client())
    name = "zz-e2e-second-mutator"  # sorts after gpushare-webhook, so it runs after ours
    api.create_mutating_webhook_configuration(
        {
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "MutatingWebhookConfiguration",
            "metadata": {"name": name},
            "webhooks": [
                {
                    "name": "touch.e2e.gpushare.io",
                    "admissionReviewVersions": ["v1"],
                    "sideEffects": "None",
                    "failurePolicy": "Fail",
                    "timeoutSeconds": 5,
                    "clientConfig": {
                        "url": f"https://127.0.0.1:{mutator.port}/mutate",
                        "caBundle": base64.b64encode(mutator.paths.ca_file.read_bytes()).decode(),
                    },
                    "namespaceSelector": {
                        "matchLabels": {"kubernetes.io/metadata.name": namespace}
                    },
                    "rules": [
                        {
                            "apiGroups": [""],
                            "apiVersions": ["v1"],
                            "operations": ["CREATE"],
                            "resources": ["pods"],
                        }
                    ],
                }
            ],
        }
    )
    try:
        time.sleep(1)  # webhook configurations reach the admission chain asynchronously
        yield
    finally:
        api.delete_mutating_webhook_configuration(name)
        mutator.stop()


def test_mps_pod_gets_host_ipc(core: Any, namespace: str) -> None:
    pod = gpu_pod("mps", namespace, nodeSelector={"ack.node.gpu.schedule": "mps"})
    core.create_namespaced_pod(namespace, pod)
    stored = core.read_namespaced_pod("mps", namespace)
    assert stored.spec.host_ipc is True
    env = {e.name: e.value for e in stored.spec.containers[0].env}
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=3000M"
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "30"
    assert "LD_PRELOAD" not in env


def test_mig_and_plain_pods_are_untouched(core: Any, apps: Any, namespace: str) -> None:
    pod = manifest("plain-pod.yaml", namespace)
    core.create_namespaced_pod(namespace, pod)
    stored = core.read_namespaced_pod("nginx", namespace)
    assert stored.metadata.annotations is None
    assert stored.spec.scheduler_name == "default-scheduler"
    assert stored.spec.containers[0].env is None
    mig = manifest("eks-mig-deployment.yaml", namespace)
    mig["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] = {
        "nvidia.com/mig-1g.5gb": "1"
    }
    apps.create_namespaced_deployment(namespace, mig)
    template = apps.read_namespaced_deployment("mig-inference", namespace).spec.template
    assert template.metadata.annotations is None
    assert template.spec.scheduler_name == "default-scheduler"
    assert template.spec.containers[0].env is None
    assert template.spec.volumes is None


DENIALS: list[tuple[str, Any]] = [
    (
        "privileged-gpu",
        lambda p: p["spec"]["containers"][0].update(securityContext={"privileged": True}),
    ),
    ("node-name-pinning", lambda p: p["spec"].update(nodeName="gpu-node-1")),
    (
        "raw-visible-devices",
        lambda p: p["spec"]["containers"][0].update(
            env=[{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}]
        ),
    ),
    (
        "host-device-access",
        lambda p: p["spec"].update(volumes=[{"name": "dev", "hostPath": {"path": "/dev/nvidia0"}}]),
    ),
    (
        "limit-tampering",
        lambda p: p["spec"]["containers"][0].update(
            env=[{"name": "CUDA_DISABLE_CONTROL", "value": "true"}]
        ),
    ),
    (
        "invalid-gpu-request",
        lambda p: p["spec"]["containers"][0]["resources"]["limits"].update(
            {"nvidia.com/gpumem": "3Gi"}
        ),
    ),
    ("mode-conflict", lambda p: p["metadata"].update(annotations={"gpushare.io/mode": "mig"})),
    ("scheduler-bypass", lambda p: p["spec"].update(schedulerName="my-scheduler")),
    ("forged-allocation", lambda p: p["metadata"].update(annotations={"hami.io/vgpu-node": "n1"})),
]


@pytest.mark.parametrize(("rule", "change"), DENIALS, ids=[d[0] for d in DENIALS])
def test_every_deny_rule_is_refused_with_its_message(
    core: Any, namespace: str, rule: str, change: Any
) -> None:
    pod = gpu_pod("denied", namespace)
    change(pod)
    error = refused(lambda: core.create_namespaced_pod(namespace, pod))
    assert error.status == 403
    body = orjson.loads(error.body)
    assert 'admission webhook "mutate.gpushare.io" denied the request' in body["message"]
    assert f"[{rule}]" in body["message"]


def test_warnings_reach_the_client(core: Any, namespace: str) -> None:
    pod = gpu_pod("warned", namespace)
    pod["spec"]["containers"][0]["env"] = [{"name": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": "99g"}]
    _, status, headers = core.create_namespaced_pod_with_http_info(namespace, pod)
    assert status == 201
    warning = headers.get("Warning", "")
    assert "limit-tampering" in warning
    assert "CUDA_DEVICE_MEMORY_LIMIT_0" in warning
    stored = core.read_namespaced_pod("warned", namespace)
    env = {e.name: e.value for e in stored.spec.containers[0].env}
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m"


def test_server_side_dry_run_is_answered_and_audited(
    cluster: DevCluster, core: Any, namespace: str
) -> None:
    created = core.create_namespaced_pod(namespace, gpu_pod("dry", namespace), dry_run="All")
    assert created.spec.scheduler_name == "hami-scheduler"
    assert refused(lambda: core.read_namespaced_pod("dry", namespace)).status == 404
    records = audit(cluster, namespace=namespace, count=2)
    assert {r["endpoint"] for r in records} == {"mutate", "validate"}
    assert all(r["dryRun"] is True for r in records)
    assert all(r["allowed"] for r in records)


def test_privileged_deployment_template_refused_at_create(apps: Any, namespace: str) -> None:
    deployment = manifest("eks-mig-deployment.yaml", namespace)
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["resources"]["limits"] = {"nvidia.com/gpumem": "2000"}
    container["securityContext"] = {"privileged": True}
    error = refused(lambda: apps.create_namespaced_deployment(namespace, deployment))
    assert "[privileged-gpu]" in orjson.loads(error.body)["message"]


def test_deployment_template_is_mutated(apps: Any, namespace: str) -> None:
    deployment = manifest("eks-mig-deployment.yaml", namespace)
    deployment["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"] = {
        "nvidia.com/gpumem": "2000"
    }
    apps.create_namespaced_deployment(namespace, deployment)
    template = apps.read_namespaced_deployment("mig-inference", namespace).spec.template
    assert template.spec.scheduler_name == "hami-scheduler"
    env = {e.name: e.value for e in template.spec.containers[0].env}
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "2000m"


def test_ephemeral_container_with_visible_devices_refused(core: Any, namespace: str) -> None:
    core.create_namespaced_pod(namespace, gpu_pod("target", namespace))
    patch = {
        "spec": {
            "ephemeralContainers": [
                {
                    "name": "debugger",
                    "image": "busybox",
                    "env": [{"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"}],
                }
            ]
        }
    }
    error = refused(
        lambda: core.patch_namespaced_pod_ephemeralcontainers("target", namespace, patch)
    )
    message = orjson.loads(error.body)["message"]
    assert 'admission webhook "validate.gpushare.io" denied the request' in message
    assert "[raw-visible-devices]" in message
    assert 'ephemeral container "debugger"' in message
    harmless = copy.deepcopy(patch)
    harmless["spec"]["ephemeralContainers"][0]["env"] = []
    core.patch_namespaced_pod_ephemeralcontainers("target", namespace, harmless)


def test_policy_change_on_disk_applies_without_failed_requests(
    cluster: DevCluster, core: Any, namespace: str
) -> None:
    from kubernetes.client import ApiException

    pod = gpu_pod("switch", namespace, nodeName="gpu-node-1")
    outcomes: list[str] = []
    stop = threading.Event()

    def traffic() -> None:
        while not stop.is_set():
            try:
                core.create_namespaced_pod(namespace, pod, dry_run="All")
                outcomes.append("allowed")
            except ApiException as exc:
                message = orjson.loads(exc.body or b"{}").get("message", "")
                outcomes.append(
                    "denied" if "[node-name-pinning]" in message else f"error: {message}"
                )

    worker = threading.Thread(target=traffic)
    worker.start()
    original = cluster.policy.read_text()
    try:
        time.sleep(1)
        cluster.policy.write_text(
            original.replace("node-name-pinning: deny", "node-name-pinning: warn")
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and (not outcomes or outcomes[-1] != "allowed"):
            time.sleep(0.1)
        time.sleep(0.5)
    finally:
        stop.set()
        worker.join()
        cluster.policy.write_text(original)
    time.sleep(2)  # the original policy back in force for later tests
    errors = [o for o in outcomes if o.startswith("error")]
    assert errors == []
    assert outcomes[0] == "denied"
    assert outcomes[-1] == "allowed"
    assert outcomes.count("denied") >= 1


def test_deploy_manifests_accepted_by_this_apiserver(
    cluster: DevCluster, bin_dir: Path, tmp_path: Path
) -> None:
    kubectl = bin_dir / "kubectl"
    if not kubectl.exists():
        pytest.fail(f"{kubectl} missing: hack/build-testbin builds it with the control plane")
    kubeconfig = tmp_path / "kubeconfig"
    cluster.write_kubeconfig(kubeconfig)
    cluster.create_namespace("gpushare-system")
    rendered = subprocess.run(
        [str(kubectl), "kustomize", str(ROOT / "deploy")],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    objects = [o for o in yaml.safe_load_all(rendered) if o]
    # The dev cluster already registered configurations of these names (with a URL).
    for obj in objects:
        if obj["kind"].endswith("WebhookConfiguration"):
            obj["metadata"]["name"] += "-dry-run"
    result = subprocess.run(
        [str(kubectl), "--kubeconfig", str(kubeconfig), "apply", "--dry-run=server", "-f", "-"],
        input=yaml.safe_dump_all(objects),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    for kind in (
        "deployment.apps/gpushare-webhook",
        "service/gpushare-webhook",
        "mutatingwebhookconfiguration.admissionregistration.k8s.io/gpushare-webhook-dry-run",
        "validatingwebhookconfiguration.admissionregistration.k8s.io/gpushare-webhook-dry-run",
        "poddisruptionbudget.policy/gpushare-webhook",
    ):
        assert kind in result.stdout


def test_webhook_down_fails_closed_for_gpu_pods_only_in_scope(
    cluster: DevCluster, core: Any, namespace: str
) -> None:
    from kubernetes.client import ApiException

    assert cluster.webhook is not None
    cluster.create_namespace("kube-system")
    cluster.webhook.stop()
    try:
        error = refused(lambda: core.create_namespaced_pod(namespace, gpu_pod("down", namespace)))
        assert "validate.gpushare.io" in orjson.loads(error.body)["message"]
        system_pod = gpu_pod("system", "kube-system")
        core.create_namespaced_pod("kube-system", system_pod, dry_run="All")
    finally:
        cluster.webhook.start()
    deadline = time.monotonic() + 20
    while True:
        try:
            core.create_namespaced_pod(namespace, gpu_pod("back", namespace), dry_run="All")
            break
        except ApiException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)
