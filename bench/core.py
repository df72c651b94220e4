"""Decisions per second of the pure decision core, and what diffing would cost instead.

Times ``decide(obj, Request(kind="Pod", operation="CREATE", namespace="default"),
DEFAULT_POLICY, phase=...)`` call by call (time.perf_counter_ns) after a warm-up, for a
~5 KB vGPU pod, a ~20 KB vGPU pod, a ~2 KB pod without GPUs, and /validate on the
mutated 5 KB pod, and the 5 KB pod again with a synced 5,000-node cluster view (the
cost the view adds; its per-selector summary is built once per view, in the warm-up).
Side by side, on the same 5 KB pod: jsonpatch.make_patch (diffing a
mutated copy against the original) against our directly built ops.

    .venv/bin/python bench/core.py [--iterations 20000] [--cpu 0]
    .venv/bin/python -m bench.core

Targets on one core: median <= 50 us (5 KB GPU pod), <= 200 us (20 KB), <= 10 us (no GPU),
and the view adding <= 20 us to the 5 KB pod's median.
Exit status 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import copy
import gc
import os
import statistics
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonpatch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.fixtures import gpu_pod_5k, gpu_pod_20k, json_size, plain_pod_2k  # noqa: E402
from webhook.core.cluster import ClusterView, view_from_objects  # noqa: E402
from webhook.core.decision import Request, decide  # noqa: E402
from webhook.policies import DEFAULT_POLICY  # noqa: E402

REQUEST = Request(kind="Pod", operation="CREATE", namespace="default")
VIEW_NODES = 5_000
VIEW_TARGET_US = 20.0


def cluster_view(nodes: int) -> ClusterView:
    """A synced view of ``nodes`` GPU nodes in two pools, with a namespace and a quota."""
    objects: list[dict[str, Any]] = [
        {
            "kind": "Node",
            "metadata": {
                "name": f"gpu-{i:05}",
                "labels": {
                    "pool": "h100" if i % 2 else "a100",
                    "kubernetes.io/hostname": f"gpu-{i:05}",
                    "nvidia.com/gpu.memory": "81559" if i % 2 else "40960",
                    "nvidia.com/gpu.count": "8",
                    "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3" if i % 2 else "A100",
                },
            },
            "status": {"allocatable": {"cpu": "64", "nvidia.com/gpu": "80"}},
        }
        for i in range(nodes)
    ]
    objects.append({"kind": "Namespace", "metadata": {"name": "default"}})
    objects.append(
        {
            "kind": "ResourceQuota",
            "metadata": {"name": "gpu", "namespace": "default"},
            "spec": {"hard": {"limits.nvidia.com/gpumem": "10000000"}},
        }
    )
    return view_from_objects(objects)


@dataclass(frozen=True, slots=True)
class Timing:
    label: str
    size: int
    median_us: float
    p99_us: float
    per_second: float
    target_us: float | None

    @property
    def met(self) -> bool:
        return self.target_us is None or self.median_us <= self.target_us


def measure(
    label: str, size: int, call: Callable[[], Any], iterations: int, target_us: float | None
) -> Timing:
    """Per-call wall times of ``call`` after a warm-up of a tenth as many calls."""
    for _ in range(max(iterations // 10, 100)):
        call()
    samples = [0] * iterations
    clock = time.perf_counter_ns
    gc.collect()
    started = clock()
    for index in range(iterations):
        before = clock()
        call()
        samples[index] = clock() - before
    elapsed = clock() - started
    samples.sort()
    return Timing(
        label=label,
        size=size,
        median_us=statistics.median(samples) / 1000,
        p99_us=samples[min(len(samples) - 1, int(len(samples) * 0.99))] / 1000,
        per_second=iterations / (elapsed / 1e9),
        target_us=target_us,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Time the decision core (decide) per call.")
    parser.add_argument("--iterations", type=int, default=20_000)
    parser.add_argument("--cpu", type=int, help="pin this process to one CPU (sched_setaffinity)")
    args = parser.parse_args(argv)
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    iterations: int = args.iterations

    small, large, plain = gpu_pod_5k(), gpu_pod_20k(), plain_pod_2k()
    mutation = decide(small, REQUEST, DEFAULT_POLICY, phase="mutate")
    assert mutation.allowed, mutation.violations
    assert mutation.patch, "the 5 KB pod must be mutated"
    mutated = jsonpatch.apply_patch(copy.deepcopy(small), mutation.patch)
    assert not decide(mutated, REQUEST, DEFAULT_POLICY, phase="validate").violations
    # The same patch obtained by diffing: what the direct ops avoid.
    diffed = jsonpatch.make_patch(small, mutated).patch
    assert jsonpatch.apply_patch(copy.deepcopy(small), diffed) == mutated

    def mutate(obj: Any) -> Callable[[], Any]:
        return lambda: decide(obj, REQUEST, DEFAULT_POLICY, phase="mutate")

    view = cluster_view(VIEW_NODES)
    assert decide(small, REQUEST, DEFAULT_POLICY, phase="mutate", cluster=view).allowed
    timings = [
        measure("(a) 5 KB GPU pod, mutate", json_size(small), mutate(small), iterations, 50),
        measure("(b) 20 KB GPU pod, mutate", json_size(large), mutate(large), iterations, 200),
        measure("(c) 2 KB non-GPU pod, mutate", json_size(plain), mutate(plain), iterations, 10),
        measure(
            "(d) 5 KB GPU pod, validate (mutated)",
            json_size(mutated),
            lambda: decide(mutated, REQUEST, DEFAULT_POLICY, phase="validate"),
            iterations,
            None,
        ),
        measure(
            f"(e) 5 KB GPU pod, mutate, {VIEW_NODES:,} nodes",
            json_size(small),
            lambda: decide(small, REQUEST, DEFAULT_POLICY, phase="mutate", cluster=view),
            iterations,
            None,
        ),
    ]
    added = timings[4].median_us - timings[0].median_us
    diff_iterations = max(iterations // 10, 200)
    diff_only = measure(
        "jsonpatch.make_patch(pod, mutated)",
        json_size(small),
        lambda: jsonpatch.make_patch(small, mutated),
        diff_iterations,
        None,
    )
    copy_and_diff = measure(
        "deepcopy + make_patch",
        json_size(small),
        lambda: jsonpatch.make_patch(small, copy.deepcopy(mutated)),
        diff_iterations,
        None,
    )

    print(f"decide() on one core, {iterations} calls each after warm-up (pid {os.getpid()})")
    print(f"{'input':40} {'JSON':>8} {'median':>10} {'p99':>10} {'calls/s':>10}  target")
    for t in [*timings, diff_only, copy_and_diff]:
        target = (
            "" if t.target_us is None else f"<= {t.target_us:g} us " + ("ok" if t.met else "MISSED")
        )
        print(
            f"{t.label:40} {t.size:>6} B {t.median_us:>7.1f} us {t.p99_us:>7.1f} us "
            f"{t.per_second:>10,.0f}  {target}"
        )
    direct = timings[0]
    print(
        f"\n5 KB pod: {len(mutation.patch)} direct ops from decide() vs {len(diffed)} diffed ops; "
        f"make_patch alone costs {diff_only.median_us / direct.median_us:.1f}x a whole "
        f"decide() (median {diff_only.median_us:.1f} us vs {direct.median_us:.1f} us), "
        f"deepcopy + make_patch {copy_and_diff.median_us / direct.median_us:.1f}x"
    )
    print(
        f"the {VIEW_NODES:,}-node cluster view adds {added:.1f} us to the 5 KB pod's median "
        f"(<= {VIEW_TARGET_US:g} us " + ("ok)" if added <= VIEW_TARGET_US else "MISSED)")
    )
    return 0 if all(t.met for t in timings) and added <= VIEW_TARGET_US else 1


if __name__ == "__main__":
    sys.exit(main())
