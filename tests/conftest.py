"""Shared fixtures: manifests as users write them, and the bundled policies."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path

import pytest

from webhook.certs.files import write_files
from webhook.certs.issue import generate_ca, generate_serving


@pytest.fixture(scope="session")
def tls_files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A CA and a serving certificate for localhost/127.0.0.1, written once per run."""
    directory = tmp_path_factory.mktemp("tls")
    ca = generate_ca(common_name="test CA", valid_for=timedelta(days=1))
    serving = generate_serving(
        ca=ca, dns_names=["localhost"], ip_addresses=["127.0.0.1"], valid_for=timedelta(days=1)
    )
    paths = write_files(directory, ca=ca, serving=serving)
    return {"ca": paths.ca_file, "cert": paths.cert_file, "key": paths.key_file}
