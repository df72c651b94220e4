"""Pods on the loopback node, and what the probe in them reports."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, NotRequired, TypedDict

from webhook.dev.node import GPU_UUIDS, Node

_RUN_TIMEOUT: Final = 90.0
PROBE: Final = "gpushare.test/probe:1"
CUDA: Final = "gpushare.test/cuda:1"
CUDA_LEGACY: Final = "gpushare.test/cuda-legacy:1"
GATES: Final = "gpushare.test/gates:1"
ALL_CARDS: Final = tuple(f"/dev/nvidia{i}" for i in range(len(GPU_UUIDS)))


class Report(TypedDict):
    """The probe's line (hack/nodebin/cmd/gpushare-probe); ``region`` only with the
    argument region."""

    env: dict[str, str]
    devices: list[str]
    # What opening each device node read-write gave: "ok", or an errno's name (the
    # fake cards give ENXIO where the device cgroup lets them through, EPERM where not).
    access: dict[str, str]
    preload: str | None
    mounts: list[str]
    readOnly: list[str]
    region: NotRequired[str]


def cards(report: Report) -> list[str]:
    """The GPU device nodes a container got (nvidiactl and nvidia-uvm left out)."""
    return [d for d in report["devices"] if d.removeprefix("/dev/nvidia").isdigit()]


def opens(report: Report, devices: Iterable[str]) -> bool:
    """Whether the device cgroup lets the container open each of ``devices``: the fake
    cards have no driver, so an open it lets through fails with ENXIO, not EPERM."""
    return all(report["access"].get(device) == "ENXIO" for device in devices)


def container(name: str, image: str = PROBE, **extra: Any) -> dict[str, Any]:
    return {"name": name, "image": image, "args": ["sleep"], **extra}


def gpu_limits(gpus: int = 1, memory: int = 1024) -> dict[str, Any]:
    return {"limits": {"nvidia.com/gpu": str(gpus), "nvidia.com/gpumem": str(memory)}}


def pod(name: str, *containers: dict[str, Any], **spec: Any) -> dict[str, Any]:
    annotations = spec.pop("annotations", None)
    metadata: dict[str, Any] = {"name": name}
    if annotations:
        metadata["annotations"] = annotations
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": metadata,
        # No controller-manager issues tokens here; the probe needs none.
        "spec": {"automountServiceAccountToken": False, "containers": list(containers), **spec},
    }


@dataclass
class NodeHarness:
    node: Node
    name: str
    _namespaces: int = field(default=0)

    @property
    def profile(self) -> str:
        return self.node.profile

    @property
    def core(self) -> Any:
        from kubernetes import client

        return client.CoreV1Api(self.node.cluster.api_client())

    def namespace(self, prefix: str) -> str:
        self._namespaces += 1
        name = f"{prefix}-{self._namespaces}"[:60]
        self.node.cluster.create_namespace(name)
        return name

    def wait_for_cards(self) -> None:
        """Wait until admission knows the node's cards: the webhook's cluster view reads
        them from the node after it is Ready, and until then refuses a GPU pod
        (no-fitting-node). A dry-run create asks it without making anything."""
        from kubernetes import client

        namespace = self.namespace("cards")
        manifest = pod("cards", container("main", resources=gpu_limits()))
        deadline = time.monotonic() + _RUN_TIMEOUT
        while True:
            try:
                self.core.create_namespaced_pod(namespace, manifest, dry_run="All")
                return
            except client.ApiException as exc:
                if "no-fitting-node" not in str(exc.body) or time.monotonic() > deadline:
                    raise
            time.sleep(0.2)

    def create(self, namespace: str, manifest: dict[str, Any]) -> dict[str, Any]:
        created: dict[str, Any] = self.core.api_client.sanitize_for_serialization(
            self.core.create_namespaced_pod(namespace, manifest)
        )
        return created

    def refusal(self, namespace: str, manifest: dict[str, Any]) -> str:
        """The apiserver's refusal of ``manifest``; fails if it is admitted."""
        from kubernetes import client

        try:
            self.core.create_namespaced_pod(namespace, manifest)
        except client.ApiException as exc:
            return str(exc.body)
        raise AssertionError(f"admitted: {manifest['metadata']['name']}")

    def wait_running(self, namespace: str, name: str) -> dict[str, Any]:
        deadline = time.monotonic() + _RUN_TIMEOUT
        last: Any = None
        while time.monotonic() < deadline:
            last = self.core.read_namespaced_pod(name, namespace)
            statuses = last.status.container_statuses or []
            if last.status.phase == "Running" and statuses and all(s.started for s in statuses):
                result: dict[str, Any] = self.core.api_client.sanitize_for_serialization(last)
                return result
            if last.status.phase in ("Failed", "Succeeded"):
                break
            time.sleep(0.2)
        events = self.core.list_namespaced_event(
            namespace, field_selector=f"involvedObject.name={name}"
        )
        raise AssertionError(
            f"{namespace}/{name} not running: {last.status if last else None}\n"
            + "\n".join(f"{e.reason}: {e.message}" for e in events.items)
        )

    def report(self, namespace: str, name: str, container: str = "main") -> Report:
        # A started container may not have written its line yet.
        deadline = time.monotonic() + 10
        logs = ""
        while not logs.strip() and time.monotonic() < deadline:
            logs = self.core.read_namespaced_pod_log(name, namespace, container=container)
            time.sleep(0.1)
        parsed: Report = json.loads(logs.strip().splitlines()[0])
        return parsed

    def debug(self, namespace: str, name: str, image: str) -> Report:
        """Add the ephemeral container ``debug`` running ``image`` to a running pod (as
        ``kubectl debug`` does, through ``pods/ephemeralcontainers``), wait until it runs
        and return what its probe reported. An admission refusal raises ApiException."""
        body = {"spec": {"ephemeralContainers": [container("debug", image)]}}
        self.core.patch_namespaced_pod_ephemeralcontainers(name, namespace, body)
        deadline = time.monotonic() + _RUN_TIMEOUT
        while time.monotonic() < deadline:
            statuses = self.core.read_namespaced_pod(name, namespace).status
            running = [s for s in statuses.ephemeral_container_statuses or () if s.state.running]
            if running:
                return self.report(namespace, name, "debug")
            time.sleep(0.2)
        raise AssertionError(f"{namespace}/{name}: the ephemeral container never ran")

    def annotations(self, namespace: str, name: str) -> dict[str, str]:
        found: dict[str, str] = self.core.read_namespaced_pod(name, namespace).metadata.annotations
        return found or {}

    def stored_spec(self, namespace: str, name: str) -> dict[str, Any]:
        """The pod spec as admitted (mutated) and stored."""
        found = self.core.read_namespaced_pod(name, namespace)
        spec: dict[str, Any] = self.core.api_client.sanitize_for_serialization(found)["spec"]
        return spec

    def runtime_spec(self, namespace: str, name: str, container: str = "main") -> dict[str, Any]:
        """The OCI spec containerd wrote for ``container`` (``crictl inspect``): what the
        NVIDIA runtime reads, before it edits it."""
        found = self.core.read_namespaced_pod(name, namespace)
        statuses = {s.name: s for s in found.status.container_statuses or []}
        container_id = statuses[container].container_id.split("://", 1)[1]
        result = self.node.crictl("inspect", container_id)
        assert result.returncode == 0, result.stderr
        spec: dict[str, Any] = json.loads(result.stdout)["info"]["runtimeSpec"]
        return spec

    def run(self, namespace: str, manifest: dict[str, Any], container: str = "main") -> Report:
        """Create ``manifest``, wait until every container runs, and return what the
        probe in ``container`` reported."""
        self.create(namespace, manifest)
        self.wait_running(namespace, manifest["metadata"]["name"])
        return self.report(namespace, manifest["metadata"]["name"], container)

    @contextlib.contextmanager
    def paused(self, process: str) -> Iterator[None]:
        """Stop the node's ``process`` (SIGSTOP) for the block: a slow device plugin or
        kubelet, so that a write can land where it would in a race."""
        (proc,) = [p for p in self.node.processes if p.name == process]
        # The node's processes run under nsenter, which forks to enter the PID namespace,
        # and stops itself when its child stops: both are continued.
        children = Path(f"/proc/{proc.popen.pid}/task/{proc.popen.pid}/children")
        (pid,) = (int(child) for child in children.read_text().split())
        os.kill(pid, signal.SIGSTOP)
        try:
            yield
        finally:
            os.kill(pid, signal.SIGCONT)
            os.kill(proc.popen.pid, signal.SIGCONT)
