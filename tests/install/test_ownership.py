"""docs/upgrade.md's table of who creates and keeps each object, held to what the chart
and `manifests` render and to the RBAC that lets the leader do its part."""

from __future__ import annotations

import re
from typing import Final

import pytest

from tests.install.chart import Obj, find_helm, template
from tests.paths import ROOT
from webhook.certs.selfmanaged import CHECK_INTERVAL
from webhook.install import manifests
from webhook.install.uninstall import installed_names

DOC: Final = ROOT / "docs" / "upgrade.md"
# kind -> (API group, resource) in RBAC rules.
RESOURCES: Final = {
    "MutatingWebhookConfiguration": (
        "admissionregistration.k8s.io",
        "mutatingwebhookconfigurations",
    ),
    "ValidatingWebhookConfiguration": (
        "admissionregistration.k8s.io",
        "validatingwebhookconfigurations",
    ),
    "ValidatingAdmissionPolicy": ("admissionregistration.k8s.io", "validatingadmissionpolicies"),
    "ValidatingAdmissionPolicyBinding": (
        "admissionregistration.k8s.io",
        "validatingadmissionpolicybindings",
    ),
    "Secret": ("", "secrets"),
    "Lease": ("coordination.k8s.io", "leases"),
    "ConfigMap": ("", "configmaps"),
}


def rows() -> list[tuple[str, str, str, str, str]]:
    """(kind, name, created by, kept by self-managed, kept by cert-manager)."""
    found = []
    for line in DOC.read_text("utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and " " in cells[0] and cells[0] != "object":
            kind, name = cells[0].split(" ", 1)
            found.append((kind, name, cells[1], cells[2], cells[3]))
    return found


ROWS: Final = rows()


def test_the_table_is_there() -> None:
    assert len(ROWS) >= 10
    assert {kind for kind, *_ in ROWS} <= set(RESOURCES)


def names(objects: list[Obj]) -> set[tuple[str, str]]:
    return {(o["kind"], o["metadata"]["name"]) for o in objects}


def test_created_by_matches_what_manifests_renders() -> None:
    rendered = names(manifests.render())
    for kind, name, created, *_ in ROWS:
        assert ((kind, name) in rendered) == (created == "install"), (kind, name, created)


def test_created_by_matches_what_the_chart_renders() -> None:
    rendered = names(template(find_helm()))
    for kind, name, created, *_ in ROWS:
        assert ((kind, name) in rendered) == (created == "install"), (kind, name, created)


def test_uninstall_looks_for_every_object_of_the_table() -> None:
    looked_for = installed_names(manifests.BASE_NAMESPACE)
    for kind, name, *_ in ROWS:
        assert name in looked_for.get(kind, set()), (kind, name)


def grants(objects: list[Obj], kind: str, name: str) -> set[str]:
    """The verbs the chart's own Role and ClusterRole give on object KIND NAME."""
    group, resource = RESOURCES[kind]
    verbs: set[str] = set()
    for role in objects:
        if role["kind"] not in ("Role", "ClusterRole") or role["metadata"]["name"] != (
            "gpushare-webhook"
        ):
            continue
        for rule in role["rules"]:
            # A rule without resourceNames reaches every name.
            if (
                group in rule["apiGroups"]
                and resource in rule["resources"]
                and name in rule.get("resourceNames", [name])
            ):
                verbs |= set(rule["verbs"])
    return verbs


def test_what_the_leader_keeps_it_may_write() -> None:
    objects = template(find_helm())
    for kind, name, created, self_managed, _ in ROWS:
        verbs = grants(objects, kind, name)
        if self_managed == "leader":
            assert verbs & {"update", "patch"}, (kind, name, verbs)
        if created == "leader":
            assert "create" in verbs, (kind, name, verbs)
        if self_managed != "leader":
            assert not verbs & {"update", "patch", "delete"}, (kind, name, verbs)


def test_in_cert_manager_mode_no_leader_writes() -> None:
    objects = template(find_helm(), settings=["certificates.mode=cert-manager"])
    assert {kept for *_, kept in ROWS} <= {"you", "cert-manager", "nobody"}
    for kind, name, *_ in ROWS:
        assert not grants(objects, kind, name), (kind, name)
    (deployment,) = [o for o in objects if o["kind"] == "Deployment"]
    assert "--self-managed" not in deployment["spec"]["template"]["spec"]["containers"][0]["args"]


@pytest.mark.parametrize("claim", ["every 60 s"])
def test_the_check_interval_is_the_one_documented(claim: str) -> None:
    assert claim in DOC.read_text("utf-8")
    (seconds,) = re.findall(r"every (\d+) s", claim)
    assert float(seconds) == CHECK_INTERVAL
