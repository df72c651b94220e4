"""What `uninstall` looks for covers every object the install, the chart and the leader
create, and never a CRD (tests/e2e/test_uninstall.py runs it against an apiserver)."""

from __future__ import annotations

import io
from contextlib import redirect_stderr
from pathlib import Path

import pytest

from tests.install.chart import CHART, EXAMPLES, Obj, find_helm, template
from webhook.certs.selfmanaged import SelfManagedCertificates, SelfManagedConfig
from webhook.cli import main
from webhook.install import manifests
from webhook.install.uninstall import (
    KINDS,
    LABEL_SELECTOR,
    LEADER_LEASE,
    LEADER_SECRET,
    PART_OF,
    installed_names,
)
from webhook.render import admission
from webhook.render.targets import TARGETS

NAMESPACE = "gpu-admission"


def test_the_leaders_names_are_the_serve_defaults(tmp_path: Path) -> None:
    assert SelfManagedConfig(namespace=NAMESPACE).secret == LEADER_SECRET
    keeper = SelfManagedCertificates(
        object(),
        namespace=NAMESPACE,
        service="gpushare-webhook",
        secret=LEADER_SECRET,
        webhook_config="gpushare-webhook",
        cert_dir=tmp_path,
    )
    assert keeper._elector.name == LEADER_LEASE


def test_no_crd_is_ever_deleted() -> None:
    assert "CustomResourceDefinition" not in {kind.kind for kind in KINDS}
    assert len({kind.kind for kind in KINDS}) == len(KINDS)


def test_the_label_is_the_installs() -> None:
    key, _, value = LABEL_SELECTOR.partition("=")
    assert key == PART_OF and admission.LABELS[key] == value


def test_every_cel_policy_name_is_looked_for() -> None:
    names = installed_names(NAMESPACE)
    for target in TARGETS:
        for kind in target.kinds:
            assert names[kind] >= set(target.names)


def found(obj: Obj, names: dict[str, set[str]]) -> bool:
    """Whether the uninstall finds OBJ: a kind it deletes, by name or by label."""
    if obj["kind"] not in {kind.kind for kind in KINDS}:
        return False
    labels = obj["metadata"].get("labels") or {}
    return obj["metadata"]["name"] in names.get(obj["kind"], set()) or (
        labels.get(PART_OF) == "gpushare"
    )


@pytest.mark.parametrize("overlay", [*manifests.OVERLAYS, manifests.APISERVER_OVERLAY])
def test_every_object_manifests_renders_is_found(overlay: str) -> None:
    names = installed_names(NAMESPACE)
    objects = manifests.render(overlay=overlay, namespace=NAMESPACE)
    missed = [
        manifests.to_yaml([o]).splitlines()[:3]
        for o in objects
        if o["kind"] != "Namespace" and not found(o, names)
    ]
    assert not missed


CHART_SETTINGS = [
    [],
    ["certificates.mode=cert-manager"],
    ["clusterView.enabled=true", "clusterView.secrets=true"],
    ["admission.mode=apiserver"],
    ["admission.mode=apiserver", "clusterView.enabled=true"],
    [
        "metrics.serviceMonitor.enabled=true",
        "metrics.prometheusRule.enabled=true",
        "metrics.grafanaDashboard.enabled=true",
        "networkPolicy.enabled=true",
    ],
]


@pytest.mark.parametrize("settings", CHART_SETTINGS, ids=lambda s: ",".join(s) or "defaults")
def test_every_object_the_chart_renders_is_found(settings: list[str]) -> None:
    helm = find_helm()
    names = installed_names(NAMESPACE)
    for values in [[], *([example] for example in EXAMPLES)]:
        objects = template(helm, values=values, settings=settings, namespace=NAMESPACE)
        # CRDs are shared with other tools (Kyverno, Policy Reporter use the report APIs):
        # the chart may install them, the uninstall never deletes them.
        missed = [
            (o["kind"], o["metadata"]["name"])
            for o in objects
            if o["kind"] != "CustomResourceDefinition" and not found(o, names)
        ]
        assert not missed, f"{CHART.name} {values} {settings}: uninstall misses {missed}"


def run(*argv: str) -> tuple[int, str]:
    err = io.StringIO()
    with redirect_stderr(err):
        status = main(["uninstall", *argv])
    return status, err.getvalue()


def test_no_api_access_is_one_line_and_exit_2(tmp_path: Path) -> None:
    status, err = run(f"--kubeconfig={tmp_path / 'missing'}")
    assert status == 2
    assert err.count("\n") == 1 and "no Kubernetes API access" in err


def test_a_negative_wait_is_refused() -> None:
    status, err = run("--wait=-1")
    assert status == 2 and "--wait" in err
