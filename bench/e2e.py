"""What the webhook adds to a pod create through a real kube-apiserver.

Starts the dev cluster (etcd, kube-apiserver, the webhook), then times server-side
dry-run creates of a vGPU pod and of a plain pod, alternating rounds with the webhook
configurations registered and unregistered so both see the same machine noise.

    .venv/bin/python bench/e2e.py [--creates 240] [--round 40] [--settings webhooks,mutating+cel]
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

from webhook.certs.lease import read_json  # noqa: E402
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
        # The raw answer: the client's model deserialisation (milliseconds for a mutated
        # pod, which has more fields) is not the apiserver's or the webhook's time.
        answer = core.create_namespaced_pod("bench", pod, dry_run="All", _preload_content=False)
        if not answer.data:
            raise RuntimeError("the apiserver answered a create with no body")
        samples.append((time.perf_counter() - started) * 1000)
    return samples


def _p99(samples: list[float]) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]


# What is registered while a round runs: the webhooks, the CEL policies (the
# ValidatingAdmissionPolicies), or a mix. "none" is the baseline every other is
# compared with, alternating rounds so that all see the same machine noise.
SETTINGS: dict[str, tuple[bool, bool, bool]] = {
    # name: (mutating webhook, validating webhook, CEL policies)
    "none": (False, False, False),
    "webhooks": (True, True, False),
    "webhooks+cel": (True, True, True),
    "mutating+cel": (True, False, True),
}


def _apply(cluster: DevCluster, setting: str) -> None:
    from kubernetes import client

    mutating, validating, cel = SETTINGS[setting]
    api: Any = client.AdmissionregistrationV1Api(cluster.api_client())
    cluster.unregister_webhooks()
    if mutating:
        cluster.register_webhooks()
        if not validating:
            api.delete_validating_webhook_configuration("gpushare-webhook")
    present = read_json(api.list_validating_admission_policy_binding(_preload_content=False))
    if cel and not present["items"]:
        cluster.register_cel_policies()
    elif not cel:
        for item in present["items"]:
            api.delete_validating_admission_policy_binding(item["metadata"]["name"])
            api.delete_validating_admission_policy(item["spec"]["policyName"])
    api.api_client.close()
    time.sleep(1.5)  # configuration changes reach the admission chain asynchronously


def measure(cluster: DevCluster, *, creates: int, round_size: int, settings: list[str]) -> None:
    from kubernetes import client

    core: Any = client.CoreV1Api(cluster.api_client())
    cluster.create_namespace("bench")
    pods = {"vGPU pod": _pod("hami-vgpu-pod.yaml"), "plain pod": _pod("plain-pod.yaml")}
    settings = ["none", *[s for s in settings if s != "none"]]
    results: dict[tuple[str, str], list[float]] = {(n, s): [] for n in pods for s in settings}
    for pod in pods.values():  # warm both paths up
        _time_creates(core, pod, 20)
    rounds = max(1, creates // round_size)
    for _ in range(rounds):
        for setting in settings:
            _apply(cluster, setting)
            for name, pod in pods.items():
                results[(name, setting)].extend(_time_creates(core, pod, round_size))
    _apply(cluster, "webhooks")
    print(
        f"{'pod':<10} {'registered':<13} {'n':>5} {'median ms':>10} {'p99 ms':>8} {'overhead':>9}"
    )
    for name in pods:
        base = statistics.median(results[(name, "none")])
        for setting in settings:
            samples = results[(name, setting)]
            median = statistics.median(samples)
            print(
                f"{name:<10} {setting:<13} {len(samples):>5} {median:>10.2f} "
                f"{_p99(samples):>8.2f} {median - base:>+8.2f}"
            )
    print("overhead: the median minus the median with nothing registered, same run")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--creates", type=int, default=240, help="creates per pod kind and setting")
    parser.add_argument("--round", type=int, default=40, help="creates per alternating round")
    parser.add_argument(
        "--settings",
        default="webhooks",
        help=f"comma-separated, compared with none: {', '.join(SETTINGS)} (default: webhooks)",
    )
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gpushare-bench-") as tmp:
        workdir = Path(tmp)
        policy = workdir / "policy.yaml"
        policy.write_text((ROOT / "policies" / "default.yaml").read_text())
        with running(bin_dir=find_binaries(), policy=policy, workdir=workdir) as cluster:
            settings = [s.strip() for s in args.settings.split(",") if s.strip()]
            unknown = sorted(set(settings) - set(SETTINGS))
            if unknown:
                parser.error(f"unknown settings: {', '.join(unknown)}")
            measure(cluster, creates=args.creates, round_size=args.round, settings=settings)
    return 0


if __name__ == "__main__":
    sys.exit(main())
