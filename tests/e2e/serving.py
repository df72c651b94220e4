"""`gpushare-webhook serve --self-managed` as a real process against the test cluster."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from webhook.dev.cluster import DevCluster, free_port


@dataclass(frozen=True, slots=True)
class Served:
    process: subprocess.Popen[bytes]
    port: int
    health_port: int
    log: Path

    def output(self) -> str:
        return self.log.read_text()


@contextmanager
def self_managed(
    cluster: DevCluster,
    workdir: Path,
    *,
    namespace: str,
    secret: str,
    webhook_config: str,
    pod_name: str,
    args: tuple[str, ...] = (),
) -> Iterator[Served]:
    """Run the command until the block ends, then SIGTERM it; it must exit 0 (unless
    the test killed it already)."""
    kubeconfig = workdir / "kubeconfig"
    cluster.write_kubeconfig(kubeconfig)
    port, health_port = free_port(), free_port()
    log = workdir / "serve.log"
    with log.open("wb") as output:
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "webhook",
                "serve",
                "--host=127.0.0.1",
                f"--port={port}",
                f"--health-port={health_port}",
                f"--cert-dir={workdir / 'certs'}",
                "--audit-log=/dev/null",
                *args,
                "--self-managed",
                f"--namespace={namespace}",
                f"--secret={secret}",
                f"--webhook-config={webhook_config}",
                f"--kubeconfig={kubeconfig}",
            ],
            stdout=output,
            stderr=subprocess.STDOUT,
            env={**os.environ, "POD_NAME": pod_name},
        )
    served = Served(process=process, port=port, health_port=health_port, log=log)
    try:
        yield served
    finally:
        killed = process.poll() is not None
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
    assert killed or process.returncode == 0, served.output()
