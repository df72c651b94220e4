"""The threat model's families (docs/threat-model.md) through a real kube-apiserver.

The tenant is ``alice`` with edit rights in one namespace (pods, workloads, ConfigMaps,
Secrets, resource claims, ``pods/ephemeralcontainers``), reached by impersonation. The
webhook registrations come from ``deploy/``; the write-time guards on ConfigMaps, Secrets
and DRA objects are ValidatingAdmissionPolicies of their own (``gpushare-deny-sources``),
registered here for this module and removed after it. One case or more per family:
what the apiserver stored or refused is what is checked.
"""

from __future__ import annotations

import re
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Final

import orjson
import pytest

from tests.e2e.test_bypass import (
    GPU_LIMITS,
    TENANT,
    Kubectl,
    annotations_of,
    container,
    debug,
    ephemeral_names,
    grant,
    kubectl,  # noqa: F401  # a fixture this module uses
    pod,
    workload,
)
from webhook.dev.cluster import DevCluster
from webhook.policies import DEFAULT_POLICY
from webhook.render.validating import SOURCES_SUFFIX, validating_policies

pytestmark = pytest.mark.e2e

Obj = dict[str, Any]

# A webhook's denial or a ValidatingAdmissionPolicy's, with the rule id in brackets.
REFUSED: Final = re.compile(
    r'admission webhook "(?:mutate|validate)\.gpushare\.io" denied the request'
    r"|ValidatingAdmissionPolicy 'gpushare-deny[a-z-]*' with binding"
)
TENANT_RULES: Final[list[Obj]] = [
    {
        "apiGroups": [""],
        "resources": ["pods", "configmaps", "secrets"],
        "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
    },
    {
        "apiGroups": [""],
        "resources": ["pods/ephemeralcontainers"],
        "verbs": ["get", "update", "patch"],
    },
    {
        "apiGroups": ["apps", "batch"],
        "resources": ["deployments", "cronjobs"],
        "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
    },
    {
        "apiGroups": ["resource.k8s.io"],
        "resources": ["resourceclaims", "resourceclaimtemplates"],
        "verbs": ["get", "list", "watch", "create", "update", "patch", "delete"],
    },
]


@pytest.fixture(scope="module")
def source_guards(cluster: DevCluster, kubectl: Kubectl) -> Iterator[None]:  # noqa: F811
    """The install's write-time guards, for this module only: other modules write
    ConfigMaps that hold guarded names on purpose (the cluster view reads them)."""
    objects = [
        o
        for o in validating_policies(DEFAULT_POLICY)
        if o["metadata"]["name"].endswith(SOURCES_SUFFIX)
    ]
    cluster.register_cel_policies(objects)
    yield
    for obj in objects:
        kind = obj["kind"].lower()
        kubectl("delete", kind, obj["metadata"]["name"], "--ignore-not-found")


@pytest.fixture
def tenancy(cluster: DevCluster, kubectl: Kubectl) -> str:  # noqa: F811
    """A fresh namespace where alice has a tenant's edit rights."""
    namespace = f"threat-{uuid.uuid4().hex[:10]}"
    cluster.create_namespace(namespace)
    user = {"kind": "User", "apiGroup": "rbac.authorization.k8s.io", "name": TENANT}
    grant(kubectl, namespace, TENANT_RULES, [user])
    return namespace


def refused(result: subprocess.CompletedProcess[str], rule: str) -> None:
    assert result.returncode != 0, f"admitted: {result.stdout}"
    assert REFUSED.search(result.stderr), result.stderr
    assert f"[{rule}]" in result.stderr, result.stderr


def create(kubectl: Kubectl, obj: Obj) -> subprocess.CompletedProcess[str]:  # noqa: F811
    return kubectl("create", "-f", "-", user=TENANT, stdin=orjson.dumps(obj).decode())


def env_of(stored: Obj, index: int = 0) -> dict[str, Any]:
    entries = stored["spec"]["containers"][index].get("env", [])
    return {e["name"]: e.get("value") for e in entries}


CUDA: Final = [{"name": "CUDA_VERSION", "value": "9.0"}]


# -- F1 legacy CUDA images ----------------------------------------------------------------


def test_f1_legacy_cuda_containers_are_voided_and_debug_is_refused(
    kubectl: Kubectl,  # noqa: F811
    tenancy: str,
    tmp_path: Path,
) -> None:
    plain = pod("plain", tenancy, container("app", env=CUDA))
    assert create(kubectl, plain).returncode == 0
    assert env_of(kubectl.get("pod", "plain", tenancy))["NVIDIA_VISIBLE_DEVICES"] == "void"
    gpu = pod("victim", tenancy, container("main", GPU_LIMITS), container("helper", env=CUDA))
    assert create(kubectl, gpu).returncode == 0
    assert env_of(kubectl.get("pod", "victim", tenancy), 1)["NVIDIA_VISIBLE_DEVICES"] == "void"
    refused(
        debug(kubectl, tenancy, ["--env=CUDA_VERSION=9.0"], None, tmp_path), "raw-visible-devices"
    )
    assert ephemeral_names(kubectl, tenancy) == []
    allowed = debug(
        kubectl,
        tenancy,
        ["--env=CUDA_VERSION=9.0", "--env=NVIDIA_VISIBLE_DEVICES=void"],
        None,
        tmp_path,
    )
    assert allowed.returncode == 0, allowed.stderr


def test_f1_a_deployment_template_is_voided(kubectl: Kubectl, tenancy: str) -> None:  # noqa: F811
    template = pod("t", tenancy, container("main", GPU_LIMITS), container("helper", env=CUDA))
    result = create(kubectl, workload("Deployment", template, tenancy))
    assert result.returncode == 0, result.stderr
    stored = kubectl.get("deployment", "w", tenancy)["spec"]["template"]
    assert env_of(stored, 1)["NVIDIA_VISIBLE_DEVICES"] == "void"


# -- F2 CAP_SYS_ADMIN -------------------------------------------------------------------------


def test_f2_sys_admin_in_a_gpu_pod_is_refused(
    kubectl: Kubectl,  # noqa: F811
    tenancy: str,
    tmp_path: Path,
) -> None:
    caps: Obj = {"securityContext": {"capabilities": {"add": ["sys_admin"]}}}
    sneaky = pod(
        "sneaky", tenancy, container("main", GPU_LIMITS), container("helper", None, **caps)
    )
    refused(create(kubectl, sneaky), "privileged-gpu")
    assert create(kubectl, pod("victim", tenancy)).returncode == 0
    refused(debug(kubectl, tenancy, [], caps, tmp_path), "privileged-gpu")
    assert ephemeral_names(kubectl, tenancy) == []


# -- F3 host namespaces ----------------------------------------------------------------------


@pytest.mark.parametrize("field", ["hostPID", "hostIPC"])
def test_f3_host_namespaces_in_a_gpu_pod_are_refused(
    kubectl: Kubectl,  # noqa: F811
    tenancy: str,
    field: str,
) -> None:
    refused(create(kubectl, pod("p", tenancy, **{field: True})), "host-device-access")


# -- F4 the GPU stack, written ---------------------------------------------------------------


@pytest.mark.parametrize(
    "path", ["/sys/bus/pci", "/usr/lib/x86_64-linux-gnu", "/usr/bin/nvidia-smi"]
)
def test_f4_writable_host_paths_of_the_gpu_stack_are_refused(
    kubectl: Kubectl,  # noqa: F811
    tenancy: str,
    path: str,
) -> None:
    app = container("app", volumeMounts=[{"name": "stack", "mountPath": "/host"}])
    obj = pod("p", tenancy, app, volumes=[{"name": "stack", "hostPath": {"path": path}}])
    refused(create(kubectl, obj), "host-device-access")


# -- F5 the other schedulers' ledgers -------------------------------------------------------


def test_f5_tenant_cannot_write_ack_or_volcano_ledgers(kubectl: Kubectl, tenancy: str) -> None:  # noqa: F811
    ack = pod("ack", tenancy, container("main", {"aliyun.com/gpu-mem": "3"}))
    assert create(kubectl, ack).returncode == 0
    annotate = kubectl(
        "annotate", "pod", "ack", "-n", tenancy, "ALIYUN_COM_GPU_MEM_IDX=1", user=TENANT
    )
    refused(annotate, "forged-allocation")
    assert "ALIYUN_COM_GPU_MEM_IDX" not in annotations_of(kubectl, "ack", tenancy)
    volcano = pod(
        "volcano",
        tenancy,
        container("main", {"volcano.sh/vgpu-number": "1", "volcano.sh/vgpu-memory": "3000"}),
        annotations={"volcano.sh/vgpu-node": "gpu-node-1"},
    )
    refused(create(kubectl, volcano), "forged-allocation")


# -- F6 MPS with a memory percentage ---------------------------------------------------------


def test_f6_mps_with_a_percentage_is_refused(kubectl: Kubectl, tenancy: str) -> None:  # noqa: F811
    obj = pod(
        "mps",
        tenancy,
        container("main", {"nvidia.com/gpumem-percentage": "25"}),
        annotations={"gpushare.io/mode": "mps"},
    )
    refused(create(kubectl, obj), "mode-conflict")


# -- F7 env from ConfigMaps and Secrets ------------------------------------------------------


@pytest.mark.usefixtures("source_guards")
def test_f7_env_sources_with_guarded_names_are_refused_when_written(
    kubectl: Kubectl,  # noqa: F811
    tenancy: str,
) -> None:
    config: Obj = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "later", "namespace": tenancy},
        "data": {"NVIDIA_VISIBLE_DEVICES": "all"},
    }
    # The policies load asynchronously.
    deadline = time.monotonic() + 30
    while (result := create(kubectl, config)).returncode == 0 and time.monotonic() < deadline:
        kubectl("delete", "configmap", "later", "-n", tenancy)
        time.sleep(0.3)
    refused(result, "raw-visible-devices")
    secret: Obj = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "later", "namespace": tenancy},
        "stringData": {"CUDA_DISABLE_CONTROL": "true"},
    }
    refused(create(kubectl, secret), "raw-visible-devices")
    config["data"] = {"VISIBLE_DEVICES": "all"}
    assert create(kubectl, config).returncode == 0
    prefixed = container("app", envFrom=[{"prefix": "NVIDIA_", "configMapRef": {"name": "later"}}])
    refused(create(kubectl, pod("p", tenancy, prefixed)), "raw-visible-devices")


# -- F8 Dynamic Resource Allocation ----------------------------------------------------------


@pytest.mark.usefixtures("source_guards")
def test_f8_gpu_claims_are_refused(kubectl: Kubectl, tenancy: str) -> None:  # noqa: F811
    claim: Obj = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "gpu", "namespace": tenancy},
        "spec": {
            "devices": {
                "requests": [
                    {
                        "name": "gpu",
                        "exactly": {"deviceClassName": "gpu.nvidia.com", "allocationMode": "All"},
                    }
                ]
            }
        },
    }
    deadline = time.monotonic() + 30
    while (result := create(kubectl, claim)).returncode == 0 and time.monotonic() < deadline:
        kubectl("delete", "resourceclaim", "gpu", "-n", tenancy)
        time.sleep(0.3)
    refused(result, "gpu-claim")
    # A claim beside slices is judged by its device class, which only the cluster view
    # knows (tests/core/test_threats.py F8): here, without it, the pod is admitted, as
    # a ComputeDomain's pods (nvidia.com/gpu beside an IMEX channel claim) must be.
    imex = pod(
        "imex",
        tenancy,
        container("main", resources={"limits": dict(GPU_LIMITS), "claims": [{"name": "ch"}]}),
        resourceClaims=[{"name": "ch", "resourceClaimTemplateName": "imex-channel"}],
    )
    admitted = create(kubectl, imex)
    assert admitted.returncode == 0, admitted.stderr


@pytest.mark.usefixtures("source_guards")
def test_f8_a_claim_configuring_the_gpu_driver_is_refused(kubectl: Kubectl, tenancy: str) -> None:  # noqa: F811
    """Default-deny on DRA claim configuration: the NVIDIA DRA driver applies a claim's
    opaque config over its DeviceClass's, whatever the class the claim names."""

    def claim(name: str, driver: str, parameters: Obj) -> Obj:
        request = {"name": "r", "exactly": {"deviceClassName": "shared-gpu.example.com"}}
        config = {"opaque": {"driver": driver, "parameters": parameters}}
        return {
            "apiVersion": "resource.k8s.io/v1",
            "kind": "ResourceClaim",
            "metadata": {"name": name, "namespace": tenancy},
            "spec": {"devices": {"requests": [request], "config": [config]}},
        }

    mps = {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "GpuConfig",
        "sharing": {"strategy": "MPS", "mpsConfig": {"defaultActiveThreadPercentage": 100}},
    }
    deadline = time.monotonic() + 30
    while (result := create(kubectl, claim("mps", "gpu.nvidia.com", mps))).returncode == 0:
        kubectl("delete", "resourceclaim", "mps", "-n", tenancy)
        assert time.monotonic() < deadline, "the claim configuration was never refused"
        time.sleep(0.3)
    refused(result, "gpu-claim")
    # Another driver's configuration is that driver's.
    other = create(kubectl, claim("nic", "nic.example.com", {"mtu": 9000}))
    assert other.returncode == 0, other.stderr


# -- F9 updates ------------------------------------------------------------------------------


def test_f9_an_update_is_judged_by_what_it_adds(kubectl: Kubectl, tenancy: str) -> None:  # noqa: F811
    assert create(kubectl, pod("victim", tenancy)).returncode == 0
    kubectl.ok("label", "pod", "victim", "-n", tenancy, "team=ml", user=TENANT)
    result = kubectl(
        "annotate", "pod", "victim", "-n", tenancy, "volcano.sh/bind-phase=success", user=TENANT
    )
    refused(result, "forged-allocation")
