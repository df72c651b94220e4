"""`review` says when the install excludes the namespace it reviews in: objects there
never reach the webhook or the CEL policies, whatever the verdict printed."""

from __future__ import annotations

import io
from contextlib import redirect_stderr, redirect_stdout

import pytest

from tests.paths import ROOT
from webhook.cli import main
from webhook.cli.review import excluded_namespaces
from webhook.install import manifests
from webhook.render import validating


def cli(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with redirect_stdout(out), redirect_stderr(err):
        status = main(list(argv))
    return status, out.getvalue(), err.getvalue()


@pytest.mark.parametrize(
    ("argv", "excluded"),
    [
        (["--namespace", "kube-system"], "kube-system"),
        (["--namespace", "gpushare-system"], "gpushare-system"),
        (["--namespace", "gpu-admission", "--install-namespace", "gpu-admission"], "gpu-admission"),
    ],
)
def test_review_in_an_excluded_namespace_says_so(argv: list[str], excluded: str) -> None:
    pod = str(ROOT / "tests" / "manifests" / "hami-vgpu-pod.yaml")
    status, out, err = cli("review", "-f", pod, "-o", "json", *argv)
    assert status == 0, err
    assert f"the install excludes namespace {excluded}" in err
    assert out.startswith("["), "the JSON on stdout is unchanged"


def test_review_elsewhere_says_nothing_of_exclusion() -> None:
    pod = str(ROOT / "tests" / "manifests" / "hami-vgpu-pod.yaml")
    status, _, err = cli("review", "-f", pod, "--namespace", "team-a")
    assert status == 0
    assert "excludes" not in err
    # The install's namespace moved: gpushare-system is an ordinary namespace then.
    _, _, moved = cli(
        "review", "-f", pod, "--namespace", "gpushare-system", "--install-namespace", "gpu"
    )
    assert "excludes" not in moved


@pytest.mark.parametrize("install", ["gpushare-system", "gpu-admission"])
def test_the_excluded_namespaces_are_the_installs(install: str) -> None:
    """What review calls excluded is what the rendered install excludes."""
    objects = manifests.render(namespace=install)
    for obj in objects:
        if obj["kind"] in manifests.WEBHOOK_KINDS:
            for hook in obj["webhooks"]:
                (expression,) = hook["namespaceSelector"]["matchExpressions"]
                assert expression["operator"] == "NotIn"
                assert set(expression["values"]) == set(excluded_namespaces(install))
        if obj["kind"] == validating.POLICY_KIND:
            selector = obj["spec"]["matchConstraints"]["namespaceSelector"]
            assert set(selector["matchExpressions"][0]["values"]) == set(
                excluded_namespaces(install)
            )
