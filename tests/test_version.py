"""The running version, as ``--version``, ``/healthz`` and ``gpushare_build_info`` report it."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import tomllib
from pathlib import Path

from pytest_aiohttp import AiohttpClient

import webhook
from tests.paths import ROOT
from webhook.service.metrics import Metrics
from webhook.service.server import ServiceState, create_health_app
from webhook.service.store import PolicyStore
from webhook.version import UNKNOWN, source_version, version

PYPROJECT = ROOT / "pyproject.toml"


def pyproject_version() -> str:
    return str(tomllib.loads(PYPROJECT.read_text())["project"]["version"])


def test_version_is_the_installed_distributions_and_the_sources() -> None:
    assert version() == importlib.metadata.version("gpushare-webhook")
    assert version() == pyproject_version() == webhook.__version__


def test_from_source_the_version_is_read_from_pyproject(tmp_path: Path) -> None:
    assert source_version(PYPROJECT) == pyproject_version()
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\nversion = "9.8.7"\n')
    assert source_version(tmp_path / "pyproject.toml") == "9.8.7"
    (tmp_path / "broken.toml").write_text("[project\n")
    for missing in ("absent.toml", "broken.toml"):
        assert source_version(tmp_path / missing) == UNKNOWN


def test_cli_version() -> None:
    result = subprocess.run(
        [sys.executable, "-m", "webhook", "--version"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"gpushare-webhook {pyproject_version()}\n"


async def test_healthz_and_metrics_name_the_version(aiohttp_client: AiohttpClient) -> None:
    app = create_health_app(
        state=ServiceState(ready=True), metrics=Metrics(), store=PolicyStore(None)
    )
    client = await aiohttp_client(app)
    health = await client.get("/healthz")
    assert health.status == 200
    assert await health.json() == {"status": "ok", "version": pyproject_version()}
    metrics = await (await client.get("/metrics")).text()
    assert f'gpushare_build_info{{version="{pyproject_version()}"}} 1.0' in metrics.splitlines()
