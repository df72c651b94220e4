"""Each platform's documented manifests through a real kube-apiserver, default policy.

Through the webhooks: what the apiserver would store (server-side dry run). Through the
CEL policies alone (rendered from the same policy, bound to the one namespace the
webhooks skip): the scheduler-bypass verdict per resource family agrees with the core.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from typing import Any, Final

import pytest
import yaml

from tests.core.test_platforms import env_of, pod_spec
from tests.e2e.rest import Api, Sent
from tests.e2e.test_celpolicy import vap_rules
from tests.paths import MANIFESTS
from webhook.core.review import review_object
from webhook.dev.cluster import DevCluster
from webhook.policies import DEFAULT_POLICY
from webhook.render.validating import BINDING_KIND, POLICY_KIND, validating_policies

pytestmark = pytest.mark.e2e

Obj = dict[str, Any]

# The webhooks skip it (the install's namespace); only the CEL policies judge there.
CEL_ONLY: Final = "gpushare-system"
SUFFIX: Final = "-platforms"


def manifest(name: str) -> Obj:
    data = yaml.safe_load((MANIFESTS / name).read_text("utf-8"))
    assert isinstance(data, dict)
    data["metadata"].pop("namespace", None)
    return data


def naming(name: str, scheduler: str) -> Obj:
    obj = manifest(name)
    pod_spec(obj)["schedulerName"] = scheduler
    return obj


@pytest.fixture(scope="module")
def api(cluster: DevCluster) -> Iterator[Api]:
    client = Api(cluster)
    yield client
    client.http.clear()


def admitted(sent: Sent) -> Obj:
    assert sent.status == 201, sent.body
    assert isinstance(sent.body, dict)
    return sent.body


# -- through the webhooks ------------------------------------------------------------------


def test_hami_vgpu_pod_is_stored_for_hami_scheduler(api: Api, namespace: str) -> None:
    stored = admitted(api.create("Pod", namespace, manifest("hami-vgpu-pod.yaml")))
    spec = pod_spec(stored)
    assert spec["schedulerName"] == "hami-scheduler"
    env = env_of(spec["containers"][0])
    assert env["LD_PRELOAD"].startswith("/usr/local/vgpu/libvgpu.so")
    assert env["CUDA_DEVICE_MEMORY_LIMIT_0"] == "3000m"


@pytest.mark.parametrize("name", ["ack-mps-job.yaml", "ack-mps-job-hostipc.yaml"])
def test_ack_mps_job_is_stored_for_the_clusters_scheduler(
    api: Api, namespace: str, name: str
) -> None:
    stored = admitted(api.create("Job", namespace, manifest(name)))
    spec = pod_spec(stored)
    assert spec["schedulerName"] == "default-scheduler"
    assert spec["hostIPC"] is True
    assert spec["nodeSelector"] == {"ack.node.gpu.schedule": "mps"}
    env = env_of(spec["containers"][0])
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=7168M"
    assert "LD_PRELOAD" not in env


def test_volcano_vgpu_pod_is_stored_for_volcano(api: Api, namespace: str) -> None:
    stored = admitted(api.create("Pod", namespace, manifest("volcano-vgpu-pod.yaml")))
    spec = pod_spec(stored)
    assert spec["schedulerName"] == "volcano"
    assert env_of(spec["containers"][0])["LD_PRELOAD"].startswith("/usr/local/vgpu/libvgpu.so")


def test_eks_mig_deployment_is_stored_as_written(api: Api, namespace: str) -> None:
    written = manifest("eks-mig-deployment.yaml")
    stored = admitted(api.create("Deployment", namespace, copy.deepcopy(written)))
    spec = pod_spec(stored)
    assert spec["schedulerName"] == "default-scheduler"
    assert "annotations" not in stored["spec"]["template"]["metadata"]
    container = spec["containers"][0]
    assert "env" not in container and "volumeMounts" not in container
    assert container["resources"]["limits"] == {"nvidia.com/mig-1g.5gb": "1"}


@pytest.mark.parametrize(
    ("kind", "name", "scheduler"),
    [
        ("Job", "ack-mps-job.yaml", "hami-scheduler"),
        ("Pod", "hami-vgpu-pod.yaml", "volcano"),
        ("Pod", "volcano-vgpu-pod.yaml", "hami-scheduler"),
    ],
)
def test_a_scheduler_that_does_not_count_the_resources_is_refused(
    api: Api, namespace: str, kind: str, name: str, scheduler: str
) -> None:
    refused = api.create(kind, namespace, naming(name, scheduler))
    assert refused.status == 403, refused.body
    assert "scheduler-bypass" in str(refused.body["message"])


# -- through the CEL policies alone --------------------------------------------------------


@pytest.fixture(scope="module")
def cel(cluster: DevCluster, api: Api) -> Iterator[Api]:
    """The default policy's CEL rules, bound to CEL_ONLY only, under names of their own."""
    from kubernetes import client

    admission: Any = client.AdmissionregistrationV1Api(cluster.api_client())
    cluster.create_namespace(CEL_ONLY)
    objects = validating_policies(DEFAULT_POLICY, namespace="e2e-platforms-none")
    for obj in objects:
        obj["metadata"]["name"] += SUFFIX
        if obj["kind"] == BINDING_KIND:
            obj["spec"]["policyName"] += SUFFIX
            selector = obj["spec"]["matchResources"]["namespaceSelector"]
            selector["matchExpressions"].append(
                {"key": "kubernetes.io/metadata.name", "operator": "In", "values": [CEL_ONLY]}
            )
            admission.create_validating_admission_policy_binding(obj)
        else:
            admission.create_validating_admission_policy(obj)
    try:
        # Loaded asynchronously: wait until the scheduler rule refuses.
        bypass = naming("hami-vgpu-pod.yaml", "volcano")
        deadline = time.monotonic() + 30
        while vap_rules(api.create("Pod", CEL_ONLY, bypass)) != {"scheduler-bypass"}:
            assert time.monotonic() < deadline, "the CEL policies never took effect"
            time.sleep(0.2)
        yield api
    finally:
        for obj in objects:
            name = obj["metadata"]["name"]
            if obj["kind"] == BINDING_KIND:
                admission.delete_validating_admission_policy_binding(name)
            elif obj["kind"] == POLICY_KIND:
                admission.delete_validating_admission_policy(name)
        admission.api_client.close()


CASES: Final = [
    ("Pod", "hami-vgpu-pod.yaml", None),
    ("Pod", "hami-vgpu-pod.yaml", "hami-scheduler"),
    ("Pod", "hami-vgpu-pod.yaml", "volcano"),
    ("Job", "ack-mps-job.yaml", None),
    ("Job", "ack-mps-job-hostipc.yaml", "default-scheduler"),
    ("Job", "ack-mps-job.yaml", "hami-scheduler"),
    ("Job", "ack-mps-job.yaml", "my-scheduler"),
    ("Pod", "volcano-vgpu-pod.yaml", None),
    ("Pod", "volcano-vgpu-pod.yaml", "hami-scheduler"),
    ("Deployment", "eks-mig-deployment.yaml", "my-scheduler"),
]


@pytest.mark.parametrize(("kind", "name", "scheduler"), CASES)
def test_cel_judges_the_scheduler_as_the_core_does(
    cel: Api, kind: str, name: str, scheduler: str | None
) -> None:
    obj = manifest(name) if scheduler is None else naming(name, scheduler)
    entry = review_object(obj, DEFAULT_POLICY, namespace=CEL_ONLY)
    core = {v["rule"] for v in entry["violations"] if v["action"] == "deny"}
    # What the mutation would have set, so only the scheduler rule is compared.
    sent = cel.create(kind, CEL_ONLY, entry["object"] if entry["allowed"] else obj)
    assert vap_rules(sent) == core & {"scheduler-bypass"}, sent.body
    assert (sent.status == 201) == entry["allowed"], sent.body
