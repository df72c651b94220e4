"""The self-managed leader keeps the install's scope in step with the policy in force,
through a real kube-apiserver: the webhooks' matchConditions and the CEL policies follow
a new policy, with no more rights than the install's RBAC grants."""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e import serving
from tests.e2e.rest import account_client, idle_webhook
from webhook.certs.lease import read_json
from webhook.core.policy import Policy
from webhook.dev.cluster import DevCluster
from webhook.install import manifests
from webhook.install.fingerprint import ANNOTATION, spec_fingerprint
from webhook.install.reconcile import ScopeKeeper
from webhook.policies import DEFAULT_POLICY, parse_policy
from webhook.render import mutating
from webhook.render.admission import LABELS
from webhook.render.scope import match_conditions, view_conditions
from webhook.render.validating import BINDING_KIND, POLICY_KIND, RULES, validating_policies

pytestmark = pytest.mark.e2e

NAMESPACE = "e2e-scope"
CONFIG = "e2e-scope"
ACCOUNT = "e2e-scope-keeper"
SELECTOR = ",".join(f"{k}={v}" for k, v in sorted(LABELS.items()))
WAIT = 30.0

# The default policy with a resource name added, one rule softened and one turned off.
DEFAULT_FILE = Path(__file__).parents[2] / "policies" / "default.yaml"
CHANGED = (
    DEFAULT_FILE.read_text()
    .replace("count: [nvidia.com/gpu,", "count: [example.com/gpu, nvidia.com/gpu,")
    .replace("privileged-gpu: deny", "privileged-gpu: warn")
    .replace("node-name-pinning: deny", 'node-name-pinning: "off"')
)


def changed_policy() -> Policy:
    policy = parse_policy(CHANGED, source="changed.yaml")
    assert policy.action("node-name-pinning") == "off"
    return policy


def hook(name: str) -> dict[str, Any]:
    return idle_webhook(
        name,
        label="e2e.gpushare.io/scope",
        resource="pods",
        matchConditions=[dict(c) for c in match_conditions(DEFAULT_POLICY)],
    )


@pytest.fixture
def admission(cluster: DevCluster) -> Iterator[Any]:
    """Configurations of this test only, and the default policy's CEL policies (by the
    admin, as `kubectl apply` of the install would)."""
    from kubernetes import client

    api: Any = client.AdmissionregistrationV1Api(cluster.api_client())
    api.create_mutating_webhook_configuration(
        {
            "metadata": {"name": CONFIG},
            "webhooks": [{**hook("mutate.scope.e2e.gpushare.io"), "reinvocationPolicy": "Never"}],
        }
    )
    api.create_validating_webhook_configuration(
        {"metadata": {"name": CONFIG}, "webhooks": [hook("validate.scope.e2e.gpushare.io")]}
    )
    cluster.create_namespace(NAMESPACE)
    try:
        yield api
    finally:
        api.delete_mutating_webhook_configuration(CONFIG)
        api.delete_validating_webhook_configuration(CONFIG)
        remove_cel_policies(api)
        api.api_client.close()


def install_cel_policies(api: Any, policy: Policy) -> None:
    for obj in validating_policies(policy, namespace=NAMESPACE):
        if obj["kind"] == POLICY_KIND:
            api.create_validating_admission_policy(obj)
        else:
            api.create_validating_admission_policy_binding(obj)


def remove_cel_policies(api: Any) -> None:
    for name in cel_objects(api)[BINDING_KIND]:
        api.delete_validating_admission_policy_binding(name)
    for name in cel_objects(api)[POLICY_KIND]:
        api.delete_validating_admission_policy(name)


def cel_objects(api: Any) -> dict[str, dict[str, dict[str, Any]]]:
    listed = {
        POLICY_KIND: api.list_validating_admission_policy,
        BINDING_KIND: api.list_validating_admission_policy_binding,
    }
    return {
        kind: {
            o["metadata"]["name"]: o
            for o in read_json(list_(label_selector=SELECTOR, _preload_content=False))["items"]
        }
        for kind, list_ in listed.items()
    }


def rules_of(policy: dict[str, Any]) -> list[str]:
    """The rule ids of a stored ValidatingAdmissionPolicy's validations, in order."""
    return [v["message"].split("]", 1)[0].removeprefix("[") for v in policy["spec"]["validations"]]


def conditions_of(api: Any) -> list[list[dict[str, str]]]:
    found: list[list[dict[str, str]]] = []
    for read in (
        api.read_mutating_webhook_configuration,
        api.read_validating_webhook_configuration,
    ):
        config = read_json(read(CONFIG, _preload_content=False))
        found.extend(h.get("matchConditions", []) for h in config["webhooks"])
    return found


@pytest.fixture
def as_keeper(cluster: DevCluster) -> Iterator[Any]:
    """An ApiClient with the token of a service account bound to the self-managed install's
    ClusterRole (its webhook configuration name swapped for this test's)."""
    with keeper_account(cluster, "self-managed") as account:
        yield account


@contextlib.contextmanager
def keeper_account(cluster: DevCluster, overlay: str) -> Iterator[Any]:
    from kubernetes import client

    (role,) = [o for o in manifests.render(overlay=overlay) if o["kind"] == "ClusterRole"]
    for rule in role["rules"]:
        if "resourceNames" in rule:
            rule["resourceNames"] = [
                CONFIG if name == "gpushare-webhook" else name for name in rule["resourceNames"]
            ]
    role["metadata"] = {"name": ACCOUNT}
    admin = cluster.api_client()
    core: Any = client.CoreV1Api(admin)
    rbac: Any = client.RbacAuthorizationV1Api(admin)
    cluster.create_namespace(NAMESPACE)
    with contextlib.suppress(client.ApiException):
        core.create_namespaced_service_account(NAMESPACE, {"metadata": {"name": ACCOUNT}})
    rbac.create_cluster_role(role)
    rbac.create_cluster_role_binding(
        {
            "metadata": {"name": ACCOUNT},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": ACCOUNT,
            },
            "subjects": [{"kind": "ServiceAccount", "name": ACCOUNT, "namespace": NAMESPACE}],
        }
    )
    account = account_client(cluster, core, ACCOUNT, NAMESPACE)
    try:
        yield account
    finally:
        account.close()
        rbac.delete_cluster_role_binding(ACCOUNT)
        rbac.delete_cluster_role(ACCOUNT)
        admin.close()


def test_a_new_policy_rewrites_conditions_and_cel_policies(admission: Any, as_keeper: Any) -> None:
    install_cel_policies(admission, DEFAULT_POLICY)
    keeper = ScopeKeeper(as_keeper, webhook_config=CONFIG, namespace=NAMESPACE)
    # What the install applied is already in step: nothing to write.
    assert keeper.reconcile(DEFAULT_POLICY) == [
        f"{kind} {name} updated"
        for obj in validating_policies(DEFAULT_POLICY, namespace=NAMESPACE)
        for kind, name in [(obj["kind"], obj["metadata"]["name"])]
    ], "the first pass stamps what kubectl applied"
    assert keeper.reconcile(DEFAULT_POLICY) == []

    changed = changed_policy()
    changes = keeper.reconcile(changed)
    wanted = [{"name": c["name"], "expression": c["expression"]} for c in match_conditions(changed)]
    assert wanted != [dict(c) for c in match_conditions(DEFAULT_POLICY)]
    assert conditions_of(admission) == [wanted, wanted]
    assert any("example.com/gpu" in c["expression"] for c in wanted)
    objects = cel_objects(admission)
    # node-name-pinning turned off leaves gpushare-deny; privileged-gpu: warn moves to a
    # new gpushare-warn, bound with [Warn, Audit] (the apiserver's audit log keeps it).
    assert (
        set(objects[POLICY_KIND])
        == set(objects[BINDING_KIND])
        == {
            "gpushare-deny",
            "gpushare-warn",
            "gpushare-deny-sources",
            "gpushare-overrides",
        }
    )
    denied = rules_of(objects[POLICY_KIND]["gpushare-deny"])
    assert "node-name-pinning" not in denied and "privileged-gpu" not in denied
    assert "forged-allocation" in denied
    assert rules_of(objects[POLICY_KIND]["gpushare-warn"]) == ["privileged-gpu"]
    assert objects[BINDING_KIND]["gpushare-warn"]["spec"]["validationActions"] == ["Warn", "Audit"]
    assert objects[BINDING_KIND]["gpushare-deny"]["spec"]["validationActions"] == ["Deny"]
    # The deny bindings are unchanged: only what differs is written (the sources policy
    # carries the policy's exemptions as matchConditions too).
    assert changes[-4:] == [
        f"{POLICY_KIND} gpushare-deny updated",
        f"{POLICY_KIND} gpushare-warn created",
        f"{BINDING_KIND} gpushare-warn created",
        f"{POLICY_KIND} gpushare-deny-sources updated",
    ], changes
    # A quiet check writes nothing: the apiserver's defaults are no difference.
    assert keeper.reconcile(changed) == []

    # Back: the rules return to gpushare-deny and gpushare-warn is deleted, binding first.
    changes = keeper.reconcile(DEFAULT_POLICY)
    assert changes[-2:] == [
        f"{BINDING_KIND} gpushare-warn deleted: the policy no longer renders it",
        f"{POLICY_KIND} gpushare-warn deleted: the policy no longer renders it",
    ], changes
    objects = cel_objects(admission)
    assert (
        set(objects[POLICY_KIND])
        == set(objects[BINDING_KIND])
        == {"gpushare-deny", "gpushare-deny-sources", "gpushare-overrides"}
    )
    # Every CEL rule the default policy denies with (gpu-quota is off there).
    assert rules_of(objects[POLICY_KIND]["gpushare-deny"]) == [
        rule for rule in RULES if DEFAULT_POLICY.action(rule) == "deny"
    ]
    assert conditions_of(admission) == [[dict(c) for c in match_conditions(DEFAULT_POLICY)]] * 2


def mutating_objects(api: Any) -> dict[str, dict[str, dict[str, Any]]]:
    listed = {
        mutating.POLICY_KIND: api.list_mutating_admission_policy,
        mutating.BINDING_KIND: api.list_mutating_admission_policy_binding,
    }
    return {
        kind: {
            o["metadata"]["name"]: o
            for o in read_json(list_(label_selector=SELECTOR, _preload_content=False))["items"]
        }
        for kind, list_ in listed.items()
    }


def test_the_1_36_install_keeps_its_mutating_policies(cluster: DevCluster, admission: Any) -> None:
    """The 1.36+ install carries MutatingAdmissionPolicies: the leader, with that install's
    RBAC, keeps them in step as it does the CEL policies, and scopes the webhooks (there
    only with the cluster view) to what the view decides."""
    rendered = mutating.mutating_policies(DEFAULT_POLICY, namespace=NAMESPACE)
    with keeper_account(cluster, manifests.APISERVER_OVERLAY) as account:
        keeper = ScopeKeeper(account, webhook_config=CONFIG, namespace=NAMESPACE)
        # An install that carries none gets none, and its webhooks keep their full scope.
        keeper.reconcile(changed_policy())
        assert mutating_objects(admission) == {
            mutating.POLICY_KIND: {},
            mutating.BINDING_KIND: {},
        }
        assert (
            conditions_of(admission) == [[dict(c) for c in match_conditions(changed_policy())]] * 2
        )
        try:
            for obj in rendered:
                if obj["kind"] == mutating.POLICY_KIND:
                    admission.create_mutating_admission_policy(obj)
                else:
                    admission.create_mutating_admission_policy_binding(obj)
            first = keeper.reconcile(DEFAULT_POLICY)
            assert {f"{o['kind']} {o['metadata']['name']} updated" for o in rendered} <= set(
                first
            ), "the first pass stamps what kubectl applied"
            assert keeper.reconcile(DEFAULT_POLICY) == []
            view = [dict(c) for c in view_conditions(DEFAULT_POLICY)]
            assert conditions_of(admission) == [view, view]

            changes = keeper.reconcile(changed_policy())
            assert f"{mutating.POLICY_KIND} {mutating.MUTATE} updated" in changes, changes
            stored = mutating_objects(admission)[mutating.POLICY_KIND][mutating.MUTATE]
            assert "example.com/gpu" in str(stored["spec"])
            assert (
                conditions_of(admission)
                == [[dict(c) for c in view_conditions(changed_policy())]] * 2
            )
            assert keeper.reconcile(changed_policy()) == []
        finally:
            objects = mutating_objects(admission)
            for name in objects[mutating.BINDING_KIND]:
                admission.delete_mutating_admission_policy_binding(name)
            for name in objects[mutating.POLICY_KIND]:
                admission.delete_mutating_admission_policy(name)


def test_an_older_installs_policies_are_reported_not_deleted(
    admission: Any, as_keeper: Any, caplog: pytest.LogCaptureFixture
) -> None:
    """One policy per rule (an older install) carries the labels but not a rendered name:
    the RBAC does not let the keeper delete it, so it says what to delete and goes on."""
    install_cel_policies(admission, DEFAULT_POLICY)
    older = {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": POLICY_KIND,
        "metadata": {"name": "gpushare-privileged-gpu", "labels": dict(LABELS)},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [
                    {
                        "apiGroups": [""],
                        "apiVersions": ["v1"],
                        "resources": ["pods"],
                        "operations": ["CREATE"],
                    }
                ]
            },
            "validations": [{"expression": "true"}],
        },
    }
    admission.create_validating_admission_policy(older)
    keeper = ScopeKeeper(as_keeper, webhook_config=CONFIG, namespace=NAMESPACE)
    with caplog.at_level("WARNING", logger="webhook.install.reconcile"):
        keeper.reconcile(DEFAULT_POLICY)
        keeper.reconcile(DEFAULT_POLICY)
    assert "gpushare-privileged-gpu" in cel_objects(admission)[POLICY_KIND]
    reports = [
        r.getMessage() for r in caplog.records if "gpushare-privileged-gpu" in r.getMessage()
    ]
    assert len(reports) == 1, "reported once, not at every check"
    assert "kubectl delete validatingadmissionpolicy gpushare-privileged-gpu" in reports[0]


def test_an_install_without_cel_policies_gets_none(admission: Any, as_keeper: Any) -> None:
    keeper = ScopeKeeper(as_keeper, webhook_config=CONFIG, namespace=NAMESPACE)
    changes = keeper.reconcile(changed_policy())
    assert changes == [
        f"{kind} {CONFIG}: matchConditions of 1 webhooks rewritten"
        for kind in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration")
    ]
    assert cel_objects(admission) == {POLICY_KIND: {}, BINDING_KIND: {}}


class _Leader:
    """``serve --self-managed`` leading the Lease, and its policy file to edit."""

    def __init__(self, served: serving.Served, policy: Path) -> None:
        self.served = served
        self.policy = policy
        self.deadline = time.monotonic() + WAIT

    def wait(self, done: Callable[[], bool]) -> None:
        while not done():
            assert self.served.process.poll() is None, self.served.output()
            assert time.monotonic() < self.deadline, self.served.output()
            time.sleep(0.05)

    def edit_policy(self, text: str) -> None:
        # A ConfigMap volume swaps a symlink; a rename is the same for the poll.
        edited = self.policy.with_name(self.policy.name + ".new")
        edited.write_text(text)
        edited.replace(self.policy)


@contextlib.contextmanager
def leading(cluster: DevCluster, tmp_path: Path) -> Iterator[_Leader]:
    """The real command on the default policy file, once it leads the Lease."""
    policy = tmp_path / "policy.yaml"
    policy.write_text(DEFAULT_FILE.read_text())
    with serving.self_managed(
        cluster,
        tmp_path,
        namespace=NAMESPACE,
        secret="e2e-scope-tls",
        webhook_config=CONFIG,
        pod_name="e2e-scope-pod",
        args=(f"--policy={policy}",),
    ) as served:
        leader = _Leader(served, policy)
        leader.wait(lambda: "leads Lease" in served.output())
        yield leader


def test_serve_follows_an_edited_policy_file(
    cluster: DevCluster, admission: Any, tmp_path: Path
) -> None:
    """The real command: the policy file changes (as a ConfigMap update does), the leader
    re-renders the configurations' matchConditions without a restart."""
    default = [dict(c) for c in match_conditions(DEFAULT_POLICY)]
    wanted = [dict(c) for c in match_conditions(changed_policy())]
    with leading(cluster, tmp_path) as leader:
        assert conditions_of(admission) == [default, default]
        leader.edit_policy(CHANGED)
        leader.wait(lambda: conditions_of(admission) == [wanted, wanted])
    assert "matchConditions of 1 webhooks rewritten" in leader.served.output()


def test_serve_keeps_the_1_36_installs_mutating_policies(
    cluster: DevCluster, admission: Any, tmp_path: Path
) -> None:
    """The real command on the 1.36+ install: an edited policy file reaches the
    MutatingAdmissionPolicies, and the webhooks keep the view's scope."""
    wanted = [dict(c) for c in view_conditions(changed_policy())]
    try:
        for obj in mutating.mutating_policies(DEFAULT_POLICY, namespace=NAMESPACE):
            if obj["kind"] == mutating.POLICY_KIND:
                admission.create_mutating_admission_policy(obj)
            else:
                admission.create_mutating_admission_policy_binding(obj)
        with leading(cluster, tmp_path) as leader:
            leader.edit_policy(CHANGED)

            def followed() -> bool:
                policies = mutating_objects(admission)[mutating.POLICY_KIND]
                mutate = policies[mutating.MUTATE]
                # Marked with the fingerprint of the file it was rendered from, as the
                # install's own objects are (the chart checks it).
                marked = mutate["metadata"].get("annotations", {}).get(ANNOTATION)
                return (
                    "example.com/gpu" in str(mutate["spec"])
                    and marked == spec_fingerprint(CHANGED)
                    and conditions_of(admission) == [wanted, wanted]
                )

            leader.wait(followed)
        output = leader.served.output()
        assert f"{mutating.POLICY_KIND} {mutating.MUTATE} updated" in output
    finally:
        objects = mutating_objects(admission)
        for name in objects[mutating.BINDING_KIND]:
            admission.delete_mutating_admission_policy_binding(name)
        for name in objects[mutating.POLICY_KIND]:
            admission.delete_mutating_admission_policy(name)
