"""The self-managed mode without a cluster: its flags, its arguments, an API that is
not there. Against a real kube-apiserver: tests/e2e/test_rotation.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from webhook.certs.selfmanaged import SelfManagedCertificates, SelfManagedConfig, SelfManagedError
from webhook.cli import main
from webhook.dev.cluster import free_port


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--secret=x", "--kubeconfig=k"], "--secret, --kubeconfig: only with --self-managed"),
        (["--self-managed"], "--self-managed needs --namespace"),
        (
            ["--self-managed", "--namespace=ns", "--tls-cert=a", "--tls-key=b"],
            "drop --tls-cert/--tls-key",
        ),
        (["--self-managed", "--namespace=Bad_NS"], "'Bad_NS' is not a DNS-1123 label"),
        (["--self-managed", "--namespace=ns", "--service=9svc"], "'9svc' is not a DNS-1035"),
        (["--check-interval=5"], "--check-interval: only with --self-managed"),
        (
            ["--self-managed", "--namespace=ns", "--lease-duration=0.5"],
            "--lease-duration must be at least 1 second",
        ),
        (
            ["--self-managed", "--namespace=ns", "--check-interval=0"],
            "--check-interval must be at least 1 second",
        ),
    ],
)
def test_serve_refuses_inconsistent_flags(
    argv: list[str], message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["serve", *argv]) == 2
    assert message in capsys.readouterr().err


def test_serve_without_api_access_says_so(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    missing = tmp_path / "no-such-kubeconfig"
    argv = ["serve", "--self-managed", "--namespace=ns", f"--kubeconfig={missing}"]
    assert main([*argv, f"--cert-dir={tmp_path / 'certs'}", "--log-level=ERROR"]) == 2
    err = capsys.readouterr().err
    assert f"{missing}: no Kubernetes API access" in err
    assert not (tmp_path / "certs").exists()


def test_config_defaults_are_the_install_names() -> None:
    config = SelfManagedConfig(namespace="gpushare-system")
    assert (config.service, config.secret, config.webhook_config) == (
        "gpushare-webhook",
        "gpushare-webhook-tls",
        "gpushare-webhook",
    )
    assert config.identity  # POD_NAME, or host name and pid
    assert config.interval == 60


def _client(port: int) -> object:
    from kubernetes import client

    configuration = client.Configuration()
    configuration.host = f"https://127.0.0.1:{port}"
    configuration.retries = False
    return client.ApiClient(configuration)


async def test_an_unreachable_api_ends_the_wait_with_the_reason(tmp_path: Path) -> None:
    api = _client(free_port())  # nothing listens there
    manager = SelfManagedCertificates(
        api,
        namespace="ns",
        service="svc",
        secret="tls",
        webhook_config="hooks",
        cert_dir=tmp_path,
        identity="me",
    )
    with pytest.raises(SelfManagedError) as raised:
        await manager.ensure_ready(0.3, poll=0.1)
    message = str(raised.value)
    assert "no serving certificate after 0.3s: Secret ns/tls could not be read" in message
    assert "held by nobody" in message
    assert "last error: " in message
    assert not manager.is_leader
    assert not manager.paths.cert_file.exists()


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"service": "Not A Name"}, "DNS-1035"),
        ({"interval": 0}, "interval"),
        ({"renew_interval": 30.0}, "renew_interval"),
    ],
)
def test_arguments_are_checked(tmp_path: Path, changes: dict[str, object], message: str) -> None:
    arguments: dict[str, object] = {
        "namespace": "ns",
        "service": "svc",
        "secret": "tls",
        "webhook_config": "hooks",
        "cert_dir": tmp_path,
    } | changes
    with pytest.raises(ValueError, match=message):
        SelfManagedCertificates(_client(1), **arguments)  # type: ignore[arg-type]
