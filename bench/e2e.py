"""What the webhook adds to a pod create through a real kube-apiserver.

Starts the dev cluster (etcd, kube-apiserver, the webhook), then times server-side
dry-run creates of a vGPU pod and of a plain pod, alternating rounds with the webhook
configurations registered and unregistered so both see the same machine noise.

    .venv/bin/python bench/e2e.py [--creates 240] [--round 40]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from webhook.dev.cluster import DevCluster, find_binaries, running  # noqa: E402


def _pod(name: str) -> dict[str, Any]:
    pod: dict[str, Any] = yaml.safe_load((ROOT / "tests" / "manifests" / name).read_text())
    pod["metadata"]["namespace"] = "bench"
    for container in pod["spec"]["containers"]:
        limits = container.get("resources", {}).get("limits")
        if limits:
            container["resources"]["limits"] = {k: str(v) for k, v in limits.items()}
    return pod


def _time_creates(core: Any, pod: dict[str, Any], count: int) -> list[float]:
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        core.create_namespaced_pod("bench", pod, dry_run="All")
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def _p99(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


def measure(cluster: DevCluster, *, creates: int, round_size: int) -> None:
    from kubernetes import client

    core: Any = client.CoreV1Api(cluster.api_client())
    cluster.create_namespace("bench")
    pods = {"vGPU pod": _pod("hami-vgpu-pod.yaml"), "plain pod": _pod("plain-pod.yaml")}
    results: dict[tuple[str, bool], list[float]] = {(n, w): [] for n in pods for w in (False, True)}
    for pod in pods.values():  # warm both paths up
        _time_creates(core, pod, 20)
    rounds = max(1, creates // round_size)
    for _ in range(rounds):
        for registered in (False, True):
            if registered:
                cluster.register_webhooks()
            else:
                cluster.unregister_webhooks()
            time.sleep(1.0)  # configuration changes reach the admission chain asynchronously
            for name, pod in pods.items():
                results[(name, registered)].extend(_time_creates(core, pod, round_size))
    cluster.register_webhooks()
    print(f"{'pod':<10} {'webhooks':<9} {'n':>5} {'median ms':>10} {'p99 ms':>8}")
    for name in pods:
        for registered in (False, True):
            samples = results[(name, registered)]
            print(
                f"{name:<10} {'on' if registered else 'off':<9} {len(samples):>5} "
                f"{statistics.median(samples):>10.2f} {_p99(samples):>8.2f}"
            )
        off = statistics.median(results[(name, False)])
        on = statistics.median(results[(name, True)])
        print(f"{name:<10} median overhead {on - off:+.2f} ms per create (target <= 3 ms)")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--creates", type=int, default=240, help="creates per pod kind and setting")
    parser.add_argument("--round", type=int, default=40, help="creates per alternating round")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpushare-bench-") as tmp:
        workdir = Path(tmp)
        policy = workdir / "policy.yaml"
        policy.write_text((ROOT / "policies" / "default.yaml").read_text())
        with running(bin_dir=find_binaries(), policy=policy, workdir=workdir) as cluster:
            measure(cluster, creates=args.creates, round_size=args.round)
    return 0


if __name__ == "__main__":
    sys.exit(main())
