"""The install on each Kubernetes minor it claims, on real kube-apiservers built from
their Go modules (hack/build-testbin <minor>; the default build for 1.36).

Per version, on a control plane of its own (one at a time): the webhook registered
beside the install's admission policies admits a vGPU pod with its memory limit and
the ValidatingAdmissionPolicies refuse a privileged GPU pod; where the apiserver serves
MutatingAdmissionPolicy v1, those policies alone (no webhook registered) give the pod
its limit; where it does not, discovery says so, which is what the install's choice
rests on. VERSIONS is the one place that says what differs between versions.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

import pytest

from tests.e2e.rest import Api, gpu_pod
from tests.paths import ROOT
from webhook.core.policy import Policy
from webhook.dev.cluster import DevCluster, running
from webhook.install.mode import APISERVER, WEBHOOKS, detect, install_mode
from webhook.policies import load_policy
from webhook.render import mutating
from webhook.render.validating import validating_policies

pytestmark = pytest.mark.e2e

Obj = dict[str, Any]

POLICY: Final = load_policy(None)
NAMESPACE: Final = "versions"
# The apiserver loads admission policies asynchronously, within a second or two.
LOAD_TIMEOUT: Final = 30.0
GROUP_VERSION: Final = "admissionregistration.k8s.io/v1"


@dataclass(frozen=True)
class Version:
    minor: str
    # Where make unit puts the build's directory; unset, the test builds it (cached).
    env: str
    # Served by default as admissionregistration.k8s.io/v1: GA in 1.36 (KEP-3962).
    mutating_policies: bool
    # resource.k8s.io/v1 (ResourceClaims, templates): GA in 1.34 (KEP-4381).
    resource_claims: bool

    @property
    def build_args(self) -> list[str]:
        return [] if self.env == "GPUSHARE_TESTBIN" else [self.minor]


VERSIONS: Final = (
    Version("1.30", "GPUSHARE_TESTBIN_1_30", mutating_policies=False, resource_claims=False),
    Version("1.34", "GPUSHARE_TESTBIN_1_34", mutating_policies=False, resource_claims=True),
    Version("1.36", "GPUSHARE_TESTBIN", mutating_policies=True, resource_claims=True),
    Version("1.37", "GPUSHARE_TESTBIN_1_37", mutating_policies=True, resource_claims=True),
)


def served_kinds(api: Api) -> set[str]:
    """What discovery lists under admissionregistration.k8s.io/v1, as ``group/version/Kind``."""
    response = api.http.request("GET", f"{api.server}/apis/{GROUP_VERSION}", headers=api.headers)
    assert response.status == 200, response.data[-2000:]
    return {
        f"{GROUP_VERSION}/{resource['kind']}"
        for resource in response.json()["resources"]
        if "/" not in resource["name"]  # status subresources
    }


def install_objects(policy: Policy, served: set[str]) -> list[Obj]:
    """The admission policies an install creates on an apiserver that serves ``served``:
    the mutation in the apiserver where the install's choice says so."""
    objects = validating_policies(policy)
    if install_mode(served) == APISERVER:
        objects += mutating.mutating_policies(policy)
    return objects


_PLURALS: Final = {
    "ValidatingAdmissionPolicy": "validatingadmissionpolicies",
    "ValidatingAdmissionPolicyBinding": "validatingadmissionpolicybindings",
    mutating.POLICY_KIND: "mutatingadmissionpolicies",
    mutating.BINDING_KIND: "mutatingadmissionpolicybindings",
}


def create_all(api: Api, objects: list[Obj]) -> None:
    """Create ``objects``; one already there from an earlier test of this version stays."""
    for obj in objects:
        url = f"{api.server}/apis/{obj['apiVersion']}/{_PLURALS[obj['kind']]}"
        response = api.http.request("POST", url, json=obj, headers=api.headers)
        assert response.status in (201, 409), response.data[-2000:]


def apiserver_dir(version: Version, default: Path) -> Path:
    """The directory of the version's kube-apiserver: from make unit, else built here."""
    if version.env == "GPUSHARE_TESTBIN":
        return default
    where = os.environ.get(version.env)
    problem = ""
    if where is None and shutil.which("go"):
        result = subprocess.run(
            [str(ROOT / "hack" / "build-testbin"), *version.build_args],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode == 0:
            where = result.stdout.splitlines()[-1]
        else:
            problem = f"hack/build-testbin {version.minor} failed:\n{result.stderr[-2000:]}"
    if where and (Path(where) / "kube-apiserver").is_file():
        return Path(where)
    problem = problem or f"{version.env}={where or ''}: no kube-apiserver there"
    if os.environ.get("CI") or shutil.which("go"):
        pytest.fail(f"kube-apiserver {version.minor}: {problem}")
    pytest.skip(f"kube-apiserver {version.minor} needs Go to build it: {problem}")


@pytest.fixture(scope="module", params=VERSIONS, ids=[v.minor for v in VERSIONS])
def version(request: pytest.FixtureRequest) -> Version:
    param: Version = request.param
    return param


@pytest.fixture(scope="module")
def versioned(
    version: Version, bin_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[DevCluster]:
    """The dev cluster (webhook registered) on this version's kube-apiserver, with etcd
    from the default build: etcd 3.6.8 serves every version here."""
    apiserver = apiserver_dir(version, bin_dir)
    workdir = tmp_path_factory.mktemp(f"k8s-{version.minor}")
    binaries = workdir / "bin"
    binaries.mkdir()
    (binaries / "kube-apiserver").symlink_to(apiserver / "kube-apiserver")
    (binaries / "etcd").symlink_to(bin_dir / "etcd")
    policy = workdir / "policy.yaml"
    policy.write_text((ROOT / "policies" / "default.yaml").read_text())
    with running(bin_dir=binaries, policy=policy, workdir=workdir) as cluster:
        cluster.create_namespace(NAMESPACE)
        yield cluster


@pytest.fixture(scope="module")
def api(versioned: DevCluster) -> Iterator[Api]:
    client = Api(versioned)
    yield client
    client.http.clear()


def privileged_gpu_pod() -> Obj:
    pod = gpu_pod("privileged")
    pod["spec"]["containers"][0]["securityContext"] = {"privileged": True}
    return pod


def limit_env(sent_body: Any) -> dict[str, str]:
    env = sent_body["spec"]["containers"][0].get("env") or []
    return {e["name"]: e.get("value", "") for e in env}


def wait_for(check: Callable[[], None]) -> None:
    """Retry ``check`` (assertions) until it holds: admission objects load asynchronously."""
    deadline = time.monotonic() + LOAD_TIMEOUT
    while True:
        try:
            check()
            return
        except AssertionError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def admits_with_limit(api: Api) -> None:
    sent = api.create("Pod", NAMESPACE, gpu_pod("vgpu"))
    assert sent.status == 201, sent.body
    assert limit_env(sent.body).get("CUDA_DEVICE_MEMORY_LIMIT_0") == "3000m", sent.body


def refuses_privileged(api: Api) -> None:
    sent = api.create("Pod", NAMESPACE, privileged_gpu_pod())
    assert sent.status == 403, sent.body
    message = str(sent.body.get("message", ""))
    assert "ValidatingAdmissionPolicy" in message, message
    assert "[privileged-gpu]" in message, message


def test_the_apiserver_is_the_version_it_stands_for(version: Version, api: Api) -> None:
    response = api.http.request("GET", f"{api.server}/version", headers=api.headers)
    served = response.json()
    assert f"{served['major']}.{served['minor']}" == version.minor, served


def test_the_cluster_view_syncs_with_claims_where_served(
    version: Version, versioned: DevCluster
) -> None:
    """``serve --cluster`` watches ResourceClaims and templates where the apiserver serves
    resource.k8s.io/v1; where it does not, the 404 leaves the view synced, none held."""
    webhook = versioned.webhook
    assert webhook is not None
    deadline = time.monotonic() + LOAD_TIMEOUT
    while not (status := webhook.readyz()["cluster"])["synced"]:
        assert time.monotonic() < deadline, status
        time.sleep(0.2)
    for kind in ("resourceclaims", "resourceclaimtemplates"):
        entry = status["kinds"][kind]
        assert entry["listed"] and "error" not in entry, status
        assert entry.get("served", True) is version.resource_claims, status


def without_webhook(cluster: DevCluster) -> None:
    """The webhook's registrations deleted and the webhook stopped: a registration the
    apiserver still holds can then only fail a request (which the waits retry), never
    answer for the policies."""
    cluster.unregister_webhooks()
    if cluster.webhook is not None:
        cluster.webhook.stop()


def test_the_webhook_beside_the_policies_admits_a_vgpu_pod_with_its_limit(api: Api) -> None:
    create_all(api, install_objects(POLICY, served_kinds(api)))

    wait_for(lambda: admits_with_limit(api))


def test_the_validating_policies_refuse_a_privileged_gpu_pod(
    versioned: DevCluster, api: Api
) -> None:
    # The mutating webhook refuses it before they run: without it they answer.
    without_webhook(versioned)
    create_all(api, install_objects(POLICY, served_kinds(api)))

    wait_for(lambda: refuses_privileged(api))


def test_mutating_policies_where_served_alone_give_the_slice(
    version: Version, versioned: DevCluster, api: Api
) -> None:
    served = served_kinds(api)
    assert (mutating.SERVED_AS in served) == version.mutating_policies, sorted(served)
    client = versioned.api_client()
    try:
        # What the install's own discovery makes of it: the same fact, the same choice.
        assert detect(client) == (APISERVER if version.mutating_policies else WEBHOOKS)
    finally:
        client.close()
    if not version.mutating_policies:
        return
    without_webhook(versioned)
    create_all(api, install_objects(POLICY, served))

    wait_for(lambda: admits_with_limit(api))
    refuses_privileged(api)


@pytest.mark.parametrize(
    "policy_file", sorted(p.name for p in (ROOT / "policies" / "examples").glob("*.yaml"))
)
def test_every_example_policy_compiles(api: Api, policy_file: str) -> None:
    """The admission policies of each example policy (some render rules the default does
    not: gpu-quota under strict.yaml) are accepted, CEL type checks and cost estimates
    included, by this version's apiserver: a dry-run create compiles them."""
    policy = load_policy(ROOT / "policies" / "examples" / policy_file)
    for obj in install_objects(policy, served_kinds(api)):
        url = f"{api.server}/apis/{obj['apiVersion']}/{_PLURALS[obj['kind']]}?dryRun=All"
        response = api.http.request("POST", url, json=obj, headers=api.headers)
        assert response.status in (201, 409), (obj["metadata"]["name"], response.data[-2000:])
