"""What the webhook adds to a pod create through a real kube-apiserver.

Starts the dev cluster (etcd, kube-apiserver, the webhook), then times server-side
dry-run creates of a vGPU pod and of a plain pod, alternating rounds with the webhook
configurations registered and unregistered so both see the same machine noise.

    .venv/bin/python bench/e2e.py [--creates 240] [--round 40] [--settings webhooks,mutating+cel]
                                  [--baseline REV] [--metrics]

A setting ``NAME@REV`` registers what deploy/ held at git revision REV (rendered from
the default policy then): the webhooks' matchConditions, the CEL policies and, for
``map+cel@REV``, the MutatingAdmissionPolicies, so a change is measured side by side
with what it replaces; ``--baseline REV`` adds ``webhooks+cel@REV``. A ConfigMap create
is timed beside the pods: the CEL policies judge ConfigMaps and Secrets when they are
written.

With ``--metrics`` each setting's rounds of vGPU pod creates are also read from the
apiserver's side: the admission plugins' time per create, from kube-apiserver's own
``apiserver_admission_controller_admission_duration_seconds``, and the CPU time per
create of kube-apiserver, etcd and the webhook (``/proc/<pid>/stat``). Where the client's
median says how much, these say where.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Final, NamedTuple

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


CONFIG_MAP: dict[str, Any] = {
    "apiVersion": "v1",
    "kind": "ConfigMap",
    "metadata": {"name": "settings", "namespace": "bench"},
    "data": {"LANG": "C.UTF-8", "NCCL_DEBUG": "INFO", "MODEL": "resnet50"},
}


def _time_creates(core: Any, pod: dict[str, Any], count: int) -> list[float]:
    create = (
        core.create_namespaced_config_map
        if pod.get("kind") == "ConfigMap"
        else core.create_namespaced_pod
    )
    samples = []
    for _ in range(count):
        started = time.perf_counter()
        # The raw answer: the client's model deserialisation (milliseconds for a mutated
        # pod, which has more fields) is not the apiserver's or the webhook's time.
        answer = create("bench", pod, dry_run="All", _preload_content=False)
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
SETTINGS: dict[str, tuple[bool, bool, bool, bool]] = {
    # name: (mutating webhook, validating webhook, CEL policies, MutatingAdmissionPolicies)
    "none": (False, False, False, False),
    "webhooks": (True, True, False, False),
    "webhooks+cel": (True, True, True, False),
    "mutating+cel": (True, False, True, False),
    # The 1.36+ install: the mutation and the rules inside the apiserver, no webhook.
    "map+cel": (False, False, True, True),
    # ... plus a fail-open MutatingAdmissionPolicy that voids every container of every
    # pod that asks for no GPU (for nodes whose default runtime is the NVIDIA runtime).
    "map+cel+void-all": (False, False, True, True),
}
VOID_ALL: Final = "gpushare-void-all"


def void_all_policies(policy_file: Path) -> list[dict[str, Any]]:
    """The install's gpushare-void policy and binding, sent every pod that asks for no
    GPU (the gpushare-mutate policy's GPU condition negated) instead of those naming
    NVIDIA env or a GPU runtime class."""
    from webhook.install.manifests import mutating_policies
    from webhook.policies import load_policy
    from webhook.render.mutating import MUTATE, VOID_POLICY

    objects = mutating_policies(load_policy(policy_file))
    (mutate,) = [o for o in objects if o["metadata"]["name"] == MUTATE and "mutations" in o["spec"]]
    (gpu,) = [c for c in mutate["spec"]["matchConditions"] if c["name"] == "gpushare.io/gpu"]
    chosen = []
    for obj in objects:
        if obj["metadata"]["name"] != VOID_POLICY:
            continue
        obj = copy.deepcopy(obj)
        obj["metadata"]["name"] = VOID_ALL
        if "policyName" in obj["spec"]:
            obj["spec"]["policyName"] = VOID_ALL
        else:
            conditions = obj["spec"]["matchConditions"]
            conditions[-1] = {"name": "gpushare.io/no-gpu", "expression": f"!({gpu['expression']})"}
        chosen.append(obj)
    return chosen


def _set_mutating_policies(
    cluster: DevCluster, api: Any, wanted: bool, *, void_all: bool = False
) -> None:
    """Delete every MutatingAdmissionPolicy (bindings first), then create those of the
    policy file the dev cluster serves (the default one) when ``wanted``, and with
    ``void_all`` :func:`void_all_policies` beside them."""
    for list_, delete in (
        (api.list_mutating_admission_policy_binding, api.delete_mutating_admission_policy_binding),
        (api.list_mutating_admission_policy, api.delete_mutating_admission_policy),
    ):
        for item in read_json(list_(_preload_content=False))["items"]:
            delete(item["metadata"]["name"])
    if wanted:
        cluster.register_mutating_policies()
    if void_all:
        for obj in void_all_policies(cluster.policy):
            if obj["kind"] == "MutatingAdmissionPolicy":
                api.create_mutating_admission_policy(obj)
            else:
                api.create_mutating_admission_policy_binding(obj)


def _at(revision: str, path: str) -> list[dict[str, Any]]:
    """The YAML documents of ``path`` at git ``revision``."""
    text = subprocess.run(
        ["git", "-C", str(ROOT), "show", f"{revision}:{path}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return [doc for doc in yaml.safe_load_all(text) if doc]


class Baseline(NamedTuple):
    """What deploy/ held at a git revision."""

    conditions: dict[str, list[Any]]  # the webhooks' matchConditions, by webhook name
    cel: list[dict[str, Any]]  # the ValidatingAdmissionPolicies and their bindings
    maps: list[dict[str, Any]]  # the MutatingAdmissionPolicies and their bindings, or none


def baseline(revision: str) -> Baseline:
    """What deploy/ held at ``revision``."""
    # The registrations moved from deploy/base to deploy/webhooks with the 1.36+ install.
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-tree", "--name-only", revision, "deploy/webhooks/"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    where = "deploy/webhooks" if listed.strip() else "deploy/base"
    conditions = {
        hook["name"]: hook.get("matchConditions", [])
        for config in _at(revision, f"{where}/webhookconfigurations.yaml")
        for hook in config["webhooks"]
    }
    maps = "deploy/mutatingpolicies/mutatingpolicies.yaml"
    held = subprocess.run(
        ["git", "-C", str(ROOT), "ls-tree", "--name-only", revision, maps],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    return Baseline(
        conditions,
        _at(revision, "deploy/base/celpolicies.yaml"),
        _at(revision, maps) if held else [],
    )


def _apply(cluster: DevCluster, setting: str, baselines: dict[str, Baseline]) -> None:
    """Register what ``setting`` names, then wait until the apiserver answers by it."""
    from kubernetes import client

    name, _, revision = setting.partition("@")
    mutating, validating, cel, in_apiserver = SETTINGS[name]
    past = baselines[revision] if revision else None
    api: Any = client.AdmissionregistrationV1Api(cluster.api_client())
    if past is not None and in_apiserver:
        _set_mutating_policies(cluster, api, False)
        for obj in copy.deepcopy(past.maps):
            if obj["kind"] == "MutatingAdmissionPolicy":
                api.create_mutating_admission_policy(obj)
            else:
                api.create_mutating_admission_policy_binding(obj)
    else:
        _set_mutating_policies(cluster, api, in_apiserver, void_all=name == "map+cel+void-all")
    cluster.unregister_webhooks()
    if mutating:
        cluster.register_webhooks()
        if not validating:
            api.delete_validating_webhook_configuration("gpushare-webhook")
        if past is not None:
            _use_conditions(api, past.conditions)
    present = read_json(api.list_validating_admission_policy_binding(_preload_content=False))
    for item in present["items"]:
        api.delete_validating_admission_policy_binding(item["metadata"]["name"])
        api.delete_validating_admission_policy(item["spec"]["policyName"])
    if cel:
        cluster.register_cel_policies(copy.deepcopy(past.cel) if past is not None else None)
    api.api_client.close()
    _settle(cluster, mutated=mutating or in_apiserver)


def _settle(cluster: DevCluster, *, mutated: bool, timeout: float = 60.0) -> None:
    """Wait until a vGPU pod's create is admitted, mutated or not as ``mutated`` says,
    three times running, and then a little: configuration changes reach the admission
    chain asynchronously, each kind by its own informer, and a round timed across a
    change measures neither setting (or fails, where the policies of one meet the
    mutation of none)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core: Any = client.CoreV1Api(cluster.api_client())
    pod = _pod("hami-vgpu-pod.yaml")
    deadline = time.monotonic() + timeout
    running = 0
    last = ""
    try:
        while running < 3:
            try:
                answer = json.loads(
                    core.create_namespaced_pod(
                        "bench", pod, dry_run="All", _preload_content=False
                    ).data
                )
                env = answer["spec"]["containers"][0].get("env", [])
                got = any(e["name"].startswith("CUDA_DEVICE_MEMORY_LIMIT") for e in env)
                running = running + 1 if got == mutated else 0
                last = f"mutated: {got}"
            except ApiException as error:
                last = f"{error.status} {error.body}"
                running = 0
            if time.monotonic() > deadline:
                raise RuntimeError(f"the apiserver did not settle in {timeout:.0f} s: {last}")
            time.sleep(0.1)
    finally:
        core.api_client.close()
    time.sleep(0.5)


def _use_conditions(api: Any, conditions: dict[str, list[Any]]) -> None:
    """Replace the registered webhooks' matchConditions with ``conditions``."""
    for read, replace in (
        (api.read_mutating_webhook_configuration, api.replace_mutating_webhook_configuration),
        (api.read_validating_webhook_configuration, api.replace_validating_webhook_configuration),
    ):
        config = read_json(read("gpushare-webhook", _preload_content=False))
        for hook in config["webhooks"]:
            hook["matchConditions"] = conditions[hook["name"]]
        replace("gpushare-webhook", config)


# The admission plugins whose time --metrics reports: what gpushare registers runs there.
PLUGINS: Final = (
    "MutatingAdmissionPolicy",
    "MutatingAdmissionWebhook",
    "ValidatingAdmissionPolicy",
    "ValidatingAdmissionWebhook",
)
_PLUGIN_SUM: Final = re.compile(
    r'^apiserver_admission_controller_admission_duration_seconds_sum\{(?=.*name="(\w+)")'
    r'(?=.*operation="CREATE")[^}]*\}\s+(\S+)$'
)


class Metrics:
    """The apiserver's side of a setting's vGPU pod creates, summed over its rounds."""

    def __init__(self, cluster: DevCluster) -> None:
        self._cluster = cluster
        self.creates = 0
        self.plugins: dict[str, float] = dict.fromkeys(PLUGINS, 0.0)
        self.cpu: dict[str, float] = {}

    def _pids(self) -> dict[str, int]:
        found = {p.name: p.popen.pid for p in self._cluster.processes}
        webhook = self._cluster.webhook
        if webhook is not None and webhook.process is not None:
            found["webhook"] = webhook.process.popen.pid
        return found

    def _plugins(self) -> dict[str, float]:
        text = self._cluster.get("/metrics", timeout=30).decode()
        seconds: dict[str, float] = dict.fromkeys(PLUGINS, 0.0)
        for line in text.splitlines():
            match = _PLUGIN_SUM.match(line)
            if match and match.group(1) in seconds:
                seconds[match.group(1)] += float(match.group(2))
        return seconds

    def time(self, core: Any, pod: dict[str, Any], count: int) -> list[float]:
        """:func:`_time_creates`, with what the apiserver and the processes spent."""
        pids = self._pids()
        cpu = {name: _cpu_seconds(pid) for name, pid in pids.items()}
        plugins = self._plugins()
        samples = _time_creates(core, pod, count)
        for name, seconds in self._plugins().items():
            self.plugins[name] += seconds - plugins[name]
        for name, pid in pids.items():
            self.cpu[name] = self.cpu.get(name, 0.0) + _cpu_seconds(pid) - cpu[name]
        self.creates += count
        return samples


def _cpu_seconds(pid: int) -> float:
    """User and system time of a process and its waited-for children."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return sum(int(x) for x in fields[11:15]) / os.sysconf("SC_CLK_TCK")


def measure(
    cluster: DevCluster,
    *,
    creates: int,
    round_size: int,
    settings: list[str],
    baselines: dict[str, Baseline],
    metrics: bool = False,
) -> None:
    from kubernetes import client

    core: Any = client.CoreV1Api(cluster.api_client())
    cluster.create_namespace("bench")
    pods = {
        "vGPU pod": _pod("hami-vgpu-pod.yaml"),
        "plain pod": _pod("plain-pod.yaml"),
        "ConfigMap": CONFIG_MAP,
    }
    settings = ["none", *[s for s in settings if s != "none"]]
    results: dict[tuple[str, str], list[float]] = {(n, s): [] for n in pods for s in settings}
    seen = {setting: Metrics(cluster) for setting in settings} if metrics else {}
    for pod in pods.values():  # warm both paths up
        _time_creates(core, pod, 20)
    rounds = max(1, creates // round_size)
    for _ in range(rounds):
        for setting in settings:
            _apply(cluster, setting, baselines)
            for name, pod in pods.items():
                timing = seen[setting].time if seen and name == "vGPU pod" else _time_creates
                results[(name, setting)].extend(timing(core, pod, round_size))
    _apply(cluster, "webhooks", baselines)
    width = max(13, *map(len, settings))
    print(
        f"{'object':<10} {'registered':<{width}} {'n':>5} {'median ms':>10} {'p99 ms':>8} "
        f"{'overhead':>9}"
    )
    for name in pods:
        base = statistics.median(results[(name, "none")])
        for setting in settings:
            samples = results[(name, setting)]
            median = statistics.median(samples)
            print(
                f"{name:<10} {setting:<{width}} {len(samples):>5} {median:>10.2f} "
                f"{_p99(samples):>8.2f} {median - base:>+8.2f}"
            )
    print("overhead: the median minus the median with nothing registered, same run")
    if seen:
        _print_metrics(seen, width=width)


def profile(
    cluster: DevCluster, setting: str, baselines: dict[str, Baseline], *, seconds: int, out: Path
) -> None:
    """A CPU profile of kube-apiserver (its /debug/pprof/profile, for ``go tool pprof``)
    while ``setting``'s vGPU pods are created one after another, written to ``out``."""
    from kubernetes import client

    core: Any = client.CoreV1Api(cluster.api_client())
    pod = _pod("hami-vgpu-pod.yaml")
    _apply(cluster, setting, baselines)
    _time_creates(core, pod, 20)
    taken: list[bytes] = []

    def take() -> None:
        path = f"/debug/pprof/profile?seconds={seconds}"
        taken.append(cluster.get(path, timeout=seconds + 60))

    thread = threading.Thread(target=take)
    thread.start()
    made = 0
    while thread.is_alive():
        _time_creates(core, pod, 10)
        made += 10
    thread.join()
    out.write_bytes(taken[0])
    print(f"\nprofile of {setting}: {made} vGPU pod creates in {seconds} s, {out}")


def _print_metrics(seen: dict[str, Metrics], *, width: int) -> None:
    short = {"MutatingAdmissionPolicy": "MAP", "MutatingAdmissionWebhook": "mut. webhook"}
    short |= {"ValidatingAdmissionPolicy": "VAP", "ValidatingAdmissionWebhook": "val. webhook"}
    processes = sorted({name for m in seen.values() for name in m.cpu})
    print("\nvGPU pod, per create: admission plugins' time (ms), CPU time (ms)")
    columns = [short[p] for p in PLUGINS] + [f"CPU {p}" for p in processes]
    print(f"{'registered':<{width}} " + " ".join(f"{c:>14}" for c in columns))
    for setting, m in seen.items():
        n = max(1, m.creates)
        values = [1000 * m.plugins[p] / n for p in PLUGINS]
        values += [1000 * m.cpu.get(p, 0.0) / n for p in processes]
        print(f"{setting:<{width}} " + " ".join(f"{v:>14.2f}" for v in values))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--creates", type=int, default=240, help="creates per pod kind and setting")
    parser.add_argument("--round", type=int, default=40, help="creates per alternating round")
    parser.add_argument(
        "--settings",
        default="webhooks",
        help=f"comma-separated, compared with none: {', '.join(SETTINGS)}, each also as "
        "NAME@REV for what deploy/ held at git revision REV (default: webhooks)",
    )
    parser.add_argument(
        "--baseline",
        metavar="REV",
        help="also time webhooks+cel with the scope and CEL policies of git revision REV",
    )
    parser.add_argument(
        "--metrics",
        action="store_true",
        help="also print the admission plugins' time and the processes' CPU per vGPU create",
    )
    parser.add_argument(
        "--profile",
        metavar="SETTING",
        help="after the rounds, take a CPU profile of kube-apiserver while SETTING's vGPU pods "
        "are created (one of --settings)",
    )
    parser.add_argument("--profile-seconds", type=int, default=20, metavar="N")
    parser.add_argument("--profile-out", type=Path, default=Path("apiserver.pprof"), metavar="FILE")
    args = parser.parse_args()
    settings = [s.strip() for s in args.settings.split(",") if s.strip()]
    if args.baseline:
        settings.append(f"webhooks+cel@{args.baseline}")
    unknown = sorted({s.partition("@")[0] for s in settings} - set(SETTINGS))
    if unknown:
        parser.error(f"unknown settings: {', '.join(unknown)}")
    if args.profile and args.profile not in settings:
        parser.error(f"--profile {args.profile}: not one of --settings")
    baselines = {rev: baseline(rev) for rev in {s.partition("@")[2] for s in settings} - {""}}
    for setting in settings:
        name, _, rev = setting.partition("@")
        if rev and SETTINGS[name][3] and not baselines[rev].maps:
            parser.error(f"{setting}: revision {rev} has no MutatingAdmissionPolicies")
    with tempfile.TemporaryDirectory(prefix="gpushare-bench-") as tmp:
        workdir = Path(tmp)
        policy = workdir / "policy.yaml"
        policy.write_text((ROOT / "policies" / "default.yaml").read_text())
        # The dev cluster turns kube-apiserver's profiling off; a later flag wins.
        extra = ("--profiling=true",) if args.profile else ()
        with running(
            bin_dir=find_binaries(), policy=policy, workdir=workdir, apiserver_args=extra
        ) as cluster:
            measure(
                cluster,
                creates=args.creates,
                round_size=args.round,
                settings=settings,
                baselines=baselines,
                metrics=args.metrics,
            )
            if args.profile:
                profile(
                    cluster,
                    args.profile,
                    baselines,
                    seconds=args.profile_seconds,
                    out=args.profile_out,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
