"""Benchmark of the HTTPS admission service as operators run it (``gpushare-webhook serve``).

Starts ``python -m webhook serve`` in a temporary directory (development certificates
are generated there, the audit log goes to a file there), one worker pinned to core 0
and a ``--workers 2`` server on cores 0 and 1, and drives them over HTTPS keep-alive
from a second process on core 1: ``wrk`` with ``bench/load.lua`` when it is installed,
an aiohttp load generator otherwise.

- Closed loop, 16 connections: (a) a non-GPU pod on /validate, (b) a ~5 KB GPU pod
  mutation on /mutate, (c) a denial on /validate, and (b) against two workers. The
  runs alternate in rounds so that other work on the machine hits all of them alike;
  medians of the rounds are printed, with the server's CPU time per request, which
  noise on a shared machine moves far less than req/s.
- Ours is what the image runs: the wheel with the decision core compiled by mypyc
  (hack/build-native builds and caches it, about a minute after an edit); the same
  scenarios run against this checkout's source (``make run``) in the same rounds, with
  compiled / source ratios. ``--source`` skips the build and measures the source as ours.
- (a) and (b) against a bare aiohttp HTTPS handler on core 0 in the same rounds (this
  script's ``bare`` command: same certificates and TLS settings, reads the body,
  answers fixed bytes), and the ratios ours / bare.
- With ``--baseline-python PYTHON``: every closed-loop scenario also against a server
  started with that interpreter (the webhook it has installed, e.g. an older
  checkout's venv), in the same rounds, with before/after ratios. ``--only closed``
  skips the parts below.
- (b) open loop at a fixed rate (1,000 req/s): latency counts from each request's
  scheduled send time, so a stalled server cannot hide its queueing (no coordinated
  omission); the audit log must then hold exactly one line per answered request.
- Peak RSS (VmHWM) of every server process.

Targets (one worker on one core): issue 3's >= 3,000 req/s for (b), p99 <= 5 ms at a
fixed 1,000 req/s, peak RSS <= 80 MB; the CPU budget's <= 150 us of server CPU per (b)
request with the audit log on and, per core, >= 0.5x the bare handler's req/s. Run
``.venv/bin/python bench/server.py`` (about 90 s). Every process it starts is stopped
on exit, Ctrl-C included.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import http.client
import json
import os
import shutil
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import FrameType
from typing import Any

import orjson
import yaml

ROOT = Path(__file__).resolve().parent.parent
MANIFESTS = ROOT / "tests" / "manifests"
LUA = Path(__file__).resolve().parent / "load.lua"
HOST = "127.0.0.1"  # the only address this benchmark ever sends to

TARGET_RPS = 3000.0
TARGET_P99_MS = 5.0
TARGET_RSS_MB = 80.0
# The CPU budget: (b) with the audit log on, and its share of a bare aiohttp TLS handler.
TARGET_CPU_US = 150.0
TARGET_BARE_RATIO = 0.5

# Every process this script starts, so that any exit (Ctrl-C included) stops them.
_CHILDREN: list[subprocess.Popen[bytes]] = []


# -- workload ---------------------------------------------------------------------------


def manifest(name: str) -> dict[str, Any]:
    data = yaml.safe_load((MANIFESTS / name).read_text())
    assert isinstance(data, dict)
    return data


def _env(name: str, value: str) -> dict[str, str]:
    return {"name": name, "value": value}


def gpu_pod() -> dict[str, Any]:
    """A HAMi vGPU training pod as a PyTorchJob operator creates it (~5 KB of JSON)."""
    labels = {
        "app.kubernetes.io/name": "llm-finetune",
        "app.kubernetes.io/component": "worker",
        "app.kubernetes.io/part-of": "ml-platform",
        "app.kubernetes.io/managed-by": "training-operator",
        "training.kubeflow.org/job-name": "llm-finetune",
        "training.kubeflow.org/operator-name": "pytorchjob-controller",
        "training.kubeflow.org/replica-type": "worker",
        "training.kubeflow.org/replica-index": "0",
        "team": "nlp-research",
        "cost-center": "cc-4711",
    }
    annotations = {
        "nvidia.com/use-gputype": "A100,A30",
        "hami.io/gpu-scheduler-policy": "binpack",
        "hami.io/node-scheduler-policy": "spread",
        "prometheus.io/scrape": "true",
        "prometheus.io/port": "9400",
        "kubectl.kubernetes.io/default-container": "trainer",
        "sidecar.istio.io/inject": "false",
        "ml-platform.example.com/experiment": "exp-2024-06-llama-lora-r16-lr2e-4-bs32",
        "ml-platform.example.com/owner": "alice@example.com",
    }
    trainer = {
        "name": "trainer",
        "image": "registry.example.com/ml/pytorch-trainer:2.3.1-cuda12.1-cudnn8-runtime",
        "imagePullPolicy": "IfNotPresent",
        "command": ["torchrun"],
        "args": [
            "--nnodes=1",
            "--nproc-per-node=1",
            "/workspace/train.py",
            "--model=meta-llama/Llama-2-7b-hf",
            "--dataset=/data/instructions",
            "--output-dir=/checkpoints/llm-finetune",
            "--lora-rank=16",
            "--learning-rate=2e-4",
            "--per-device-batch-size=4",
            "--gradient-accumulation-steps=8",
            "--bf16",
        ],
        "workingDir": "/workspace",
        "env": [
            _env("PYTHONUNBUFFERED", "1"),
            _env("OMP_NUM_THREADS", "8"),
            _env("NCCL_DEBUG", "WARN"),
            _env("NCCL_IB_DISABLE", "1"),
            _env("TORCH_DISTRIBUTED_DEBUG", "OFF"),
            _env("HF_HOME", "/cache/huggingface"),
            _env("HF_DATASETS_OFFLINE", "1"),
            _env("WANDB_PROJECT", "llm-finetune"),
            _env("WANDB_MODE", "offline"),
            _env("MASTER_ADDR", "llm-finetune-master-0"),
            _env("MASTER_PORT", "23456"),
            {
                "name": "POD_NAME",
                "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.name"}},
            },
            {
                "name": "NODE_NAME",
                "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "spec.nodeName"}},
            },
            {
                "name": "HF_TOKEN",
                "valueFrom": {"secretKeyRef": {"name": "hf-token", "key": "token"}},
            },
        ],
        "ports": [
            {"name": "c10d", "containerPort": 23456, "protocol": "TCP"},
            {"name": "metrics", "containerPort": 9400, "protocol": "TCP"},
        ],
        "resources": {
            "requests": {"cpu": "8", "memory": "32Gi", "ephemeral-storage": "20Gi"},
            "limits": {
                "cpu": "8",
                "memory": "32Gi",
                "nvidia.com/gpu": 1,
                "nvidia.com/gpumem": 16000,
                "nvidia.com/gpucores": 50,
            },
        },
        "volumeMounts": [
            {"name": "dataset", "mountPath": "/data", "readOnly": True},
            {"name": "checkpoints", "mountPath": "/checkpoints"},
            {"name": "hf-cache", "mountPath": "/cache/huggingface"},
            {"name": "dshm", "mountPath": "/dev/shm"},  # noqa: S108  # a pod spec here
            {"name": "train-config", "mountPath": "/workspace/config", "readOnly": True},
            {"name": "logs", "mountPath": "/var/log/trainer"},
        ],
        "readinessProbe": {
            "httpGet": {"path": "/healthz", "port": "metrics"},
            "initialDelaySeconds": 30,
            "periodSeconds": 15,
        },
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
        },
        "terminationMessagePolicy": "FallbackToLogsOnError",
    }
    sidecar = {
        "name": "log-shipper",
        "image": "cr.fluentbit.io/fluent/fluent-bit:3.0.7",
        "args": ["--config=/fluent-bit/etc/fluent-bit.yaml"],
        "env": [
            _env("FLUENT_ELASTICSEARCH_HOST", "logs.observability.svc.cluster.local"),
            _env("FLUENT_ELASTICSEARCH_PORT", "9200"),
            {
                "name": "POD_NAMESPACE",
                "valueFrom": {"fieldRef": {"apiVersion": "v1", "fieldPath": "metadata.namespace"}},
            },
        ],
        "resources": {
            "requests": {"cpu": "50m", "memory": "64Mi"},
            "limits": {"cpu": "200m", "memory": "128Mi"},
        },
        "volumeMounts": [
            {"name": "logs", "mountPath": "/var/log/trainer", "readOnly": True},
            {"name": "fluent-bit-config", "mountPath": "/fluent-bit/etc"},
        ],
        "securityContext": {
            "allowPrivilegeEscalation": False,
            "readOnlyRootFilesystem": True,
            "capabilities": {"drop": ["ALL"]},
        },
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "llm-finetune-worker-0",
            "namespace": "ml",
            "labels": labels,
            "annotations": annotations,
            "ownerReferences": [
                {
                    "apiVersion": "kubeflow.org/v1",
                    "kind": "PyTorchJob",
                    "name": "llm-finetune",
                    "uid": "6f1b7c2e-3d4a-4b8e-9f0a-1c2d3e4f5a6b",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "serviceAccountName": "trainer",
            "priorityClassName": "batch-high",
            "restartPolicy": "OnFailure",
            "terminationGracePeriodSeconds": 60,
            "securityContext": {
                "runAsUser": 1000,
                "runAsGroup": 1000,
                "fsGroup": 1000,
                "runAsNonRoot": True,
                "seccompProfile": {"type": "RuntimeDefault"},
            },
            "containers": [trainer, sidecar],
            "volumes": [
                {"name": "dataset", "persistentVolumeClaim": {"claimName": "instructions-v3"}},
                {"name": "checkpoints", "persistentVolumeClaim": {"claimName": "llm-ckpt"}},
                {"name": "hf-cache", "persistentVolumeClaim": {"claimName": "hf-cache"}},
                {"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": "8Gi"}},
                {"name": "train-config", "configMap": {"name": "llm-finetune-config"}},
                {"name": "fluent-bit-config", "configMap": {"name": "fluent-bit-trainer"}},
                {"name": "logs", "emptyDir": {}},
            ],
            "tolerations": [
                {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"},
                {
                    "key": "node.kubernetes.io/not-ready",
                    "operator": "Exists",
                    "effect": "NoExecute",
                    "tolerationSeconds": 300,
                },
            ],
            "affinity": {
                "nodeAffinity": {
                    "requiredDuringSchedulingIgnoredDuringExecution": {
                        "nodeSelectorTerms": [
                            {
                                "matchExpressions": [
                                    {
                                        "key": "gpu.example.com/family",
                                        "operator": "In",
                                        "values": ["ampere", "hopper"],
                                    }
                                ]
                            }
                        ]
                    }
                }
            },
        },
    }


def review(obj: dict[str, Any], uid: str) -> bytes:
    """The AdmissionReview the apiserver sends for creating ``obj``."""
    request = {
        "uid": uid,
        "kind": {"group": "", "version": "v1", "kind": "Pod"},
        "resource": {"group": "", "version": "v1", "resource": "pods"},
        "requestKind": {"group": "", "version": "v1", "kind": "Pod"},
        "requestResource": {"group": "", "version": "v1", "resource": "pods"},
        "name": obj["metadata"]["name"],
        "namespace": obj["metadata"]["namespace"],
        "operation": "CREATE",
        "userInfo": {
            "username": "system:serviceaccount:kubeflow:training-operator",
            "uid": "0b7c9a61-2f3e-4d5c-8b9a-7e6f5d4c3b2a",
            "groups": ["system:serviceaccounts", "system:serviceaccounts:kubeflow"],
        },
        "object": obj,
        "oldObject": None,
        "dryRun": False,
        "options": {"apiVersion": "meta.k8s.io/v1", "kind": "CreateOptions"},
    }
    return orjson.dumps(
        {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "request": request}
    )


@dataclass(frozen=True, slots=True)
class Scenario:
    key: str
    title: str
    path: str
    body: Path
    expect_allowed: bool
    expect_patch: bool


# -- processes --------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def pinning() -> bool:
    return shutil.which("taskset") is not None and len(os.sched_getaffinity(0)) >= 2


def pinned(cpus: str | None) -> list[str]:
    """The command prefix that runs a process on ``cpus`` (nothing when pinning is off)."""
    return ["taskset", "-c", cpus] if cpus and pinning() else []


def spawn(
    argv: Sequence[str], *, cwd: Path | None = None, env: dict[str, str] | None = None, **kw: Any
) -> subprocess.Popen[bytes]:
    # A session of its own: a Ctrl-C reaches this script only, which then stops the
    # child (and, for the server, its workers) itself.
    process = subprocess.Popen(list(argv), cwd=cwd, env=env, start_new_session=True, **kw)
    _CHILDREN.append(process)
    return process


def stop(process: subprocess.Popen[bytes], *, grace: float = 15.0) -> None:
    """SIGTERM the process group, wait ``grace`` seconds, then SIGKILL it."""
    if process.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(grace)
    # Workers of a stopped server could outlive it; the group goes in any case.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(process.pid, signal.SIGKILL)
    if process.poll() is None:
        process.wait(5)
    if process in _CHILDREN:
        _CHILDREN.remove(process)


def stop_all() -> None:
    for process in list(_CHILDREN):
        stop(process, grace=5.0)


def proc_status(pid: int) -> dict[str, str]:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return {}
    return dict(line.split(":\t", 1) for line in text.splitlines() if ":\t" in line)


def vm_kib(pid: int, field: str) -> int:
    value = proc_status(pid).get(field, "0 kB").split()[0]
    return int(value)


def server_env(python: str | None, site: Path | None = None) -> dict[str, str]:
    """The environment of a server: for this interpreter (``python`` None) ``site`` first
    on the path (the compiled build, :func:`native_site`), else this checkout's source;
    none of ours for another interpreter, which imports what it has installed."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    if python is None:
        env["PYTHONPATH"] = str(site or ROOT)
    return env


def native_site() -> Path:
    """The wheel the image installs (the core compiled with mypyc), built and unpacked by
    hack/build-native (cached; about a minute when the sources changed)."""
    print("compiled core: hack/build-native", flush=True)
    result = subprocess.run(
        [str(ROOT / "hack" / "build-native")],
        env={**os.environ, "PYTHON": sys.executable},
        stdout=subprocess.PIPE,
        text=True,
        timeout=900,
        check=False,
    )
    if result.returncode != 0 or not result.stdout.strip():
        raise SystemExit("hack/build-native failed (see above); --source measures the source only")
    return Path(result.stdout.strip().splitlines()[-1])


def webhook_origin(python: str | None, cwd: Path, site: Path | None = None) -> Path:
    """The directory of the ``webhook`` package that ``python`` imports, started in ``cwd``
    with :func:`server_env` as a server is."""
    result = subprocess.run(
        [python or sys.executable, "-c", "import webhook; print(webhook.__file__)"],
        cwd=cwd,
        env=server_env(python, site),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if result.returncode != 0:
        raise SystemExit(f"{python or sys.executable} cannot import webhook:\n{result.stderr}")
    return Path(result.stdout.strip()).resolve().parent


def describe(package: Path) -> str:
    """``package`` with the commit of its checkout (``-dirty`` when it has changes)."""
    result = subprocess.run(
        ["git", "--no-optional-locks", "describe", "--always", "--dirty"],
        cwd=package.parent,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    commit = result.stdout.strip() if result.returncode == 0 else "not a git checkout"
    return f"{package} ({commit})"


class Server:
    """``python -m webhook serve`` in ``workdir`` with a file audit log, as operators run
    it, optionally pinned with taskset. ``python`` None runs this checkout's code with
    this interpreter; another interpreter runs the package it has installed."""

    def __init__(
        self,
        workdir: Path,
        *,
        name: str,
        cpus: str | None,
        workers: int = 1,
        python: str | None = None,
        site: Path | None = None,
    ) -> None:
        self.workdir = workdir
        self.workers = workers
        self.python = python
        self.port = free_port()
        self.health_port = free_port()
        self.audit = workdir / f"audit-{name}.log"
        self.err_path = workdir / f"server-{name}.err"
        with self.err_path.open("wb") as err:
            self.process = spawn(
                [*pinned(cpus), *self.argv()],
                cwd=workdir,
                env=server_env(python, site),
                stdout=subprocess.DEVNULL,
                stderr=err,
            )
        self.pids: set[int] = set()

    def argv(self) -> list[str]:
        argv = [
            self.python or sys.executable,
            "-m",
            "webhook",
            "serve",
            "--host",
            HOST,
            "--port",
            str(self.port),
            "--health-port",
            str(self.health_port),
            "--audit-log",
            str(self.audit),
            "--log-level",
            "WARNING",
        ]
        if self.workers > 1:
            argv += ["--workers", str(self.workers)]
        return argv

    def log(self) -> str:
        return self.err_path.read_text(errors="replace")[-2000:]

    def wait_ready(self, timeout: float = 30.0) -> None:
        """Until /readyz answers from every worker (each answer names its pid)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise SystemExit(f"server exited with {self.process.returncode}:\n{self.log()}")
            url = f"http://{HOST}:{self.health_port}/readyz"
            try:
                with urllib.request.urlopen(url, timeout=1) as response:
                    self.pids.add(int(json.load(response)["pid"]))
            except (OSError, ValueError, KeyError):
                time.sleep(0.1)
                continue
            if len(self.pids) >= self.workers:
                return
        raise SystemExit(f"server not ready after {timeout:.0f} s:\n{self.log()}")

    def context(self) -> ssl.SSLContext:
        return ssl.create_default_context(cafile=str(self.workdir / "certs" / "ca.crt"))

    def url(self, path: str) -> str:
        return f"https://{HOST}:{self.port}{path}"

    def post(self, path: str, body: bytes) -> dict[str, Any]:
        connection = http.client.HTTPSConnection(
            HOST, self.port, context=self.context(), timeout=10
        )
        try:
            connection.request("POST", path, body, {"Content-Type": "application/json"})
            response = connection.getresponse()
            data = response.read()
        finally:
            connection.close()
        if response.status != 200:
            raise SystemExit(f"POST {path}: HTTP {response.status}: {data[:300]!r}")
        answer = orjson.loads(data)
        assert isinstance(answer, dict)
        return answer

    def peak_rss_kib(self) -> dict[int, int]:
        """VmHWM of the serving process and of each worker."""
        pids = {self.process.pid, *self.pids}
        return {pid: vm_kib(pid, "VmHWM") for pid in sorted(pids)}

    def stop(self) -> None:
        stop(self.process)


class BareServer(Server):
    """This script's ``bare`` command: the baseline that the webhook's cost is measured
    against (see :func:`command_bare`), on the webhook's development certificates."""

    def __init__(self, workdir: Path, *, cpus: str | None, responses: dict[str, Path]) -> None:
        self.responses = responses
        super().__init__(workdir, name="bare", cpus=cpus)

    def argv(self) -> list[str]:
        certs = self.workdir / "certs"
        argv = [
            sys.executable,
            str(Path(__file__).resolve()),
            "bare",
            "--port",
            str(self.port),
            "--health-port",
            str(self.health_port),
            "--cert",
            str(certs / "tls.crt"),
            "--key",
            str(certs / "tls.key"),
        ]
        for path, file in self.responses.items():
            argv += ["--response", f"{path}={file}"]
        return argv


def audit_tail(path: Path, count: int) -> list[bytes]:
    """The last ``count`` audit records (the current file and the one rotated before it)."""
    lines: list[bytes] = []
    for part in (path.with_name(path.name + ".1"), path):
        if part.exists():
            lines.extend(part.read_bytes().splitlines())
    return lines[-count:] if count else []


def audit_lines(path: Path) -> int:
    """Lines in the audit log and its rotated files."""
    total = 0
    for part in path.parent.glob(path.name + "*"):
        with part.open("rb") as file:
            while chunk := file.read(1 << 20):
                total += chunk.count(b"\n")
    return total


# -- load generation ----------------------------------------------------------------------


@dataclass(slots=True)
class Result:
    requests: int  # answered inside the measured window
    seconds: float
    errors: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    answered: int  # every 200 answer, warm-up included (for the audit check)
    late_ms: float = 0.0  # open loop: how far the sender fell behind its schedule at worst
    cpu_s: float = 0.0  # CPU time the server spent meanwhile (set by the caller)
    wait_s: float = 0.0  # time the server's threads were runnable but not running (idem)
    sender_wait_s: float = 0.0  # the same for the aiohttp sender itself

    @property
    def rps(self) -> float:
        return self.requests / self.seconds if self.seconds else 0.0


def wrk_version() -> str:
    result = subprocess.run(["wrk", "-v"], capture_output=True, text=True, check=False, timeout=10)
    words = (result.stdout + result.stderr).split()
    return " ".join(words[:2]) if words else "wrk"


def run_wrk(url: str, body: Path, *, connections: int, seconds: float, cpus: str | None) -> Result:
    argv = [
        *pinned(cpus),
        "wrk",
        "-t1",
        f"-c{connections}",
        f"-d{max(1, round(seconds))}s",
        "--timeout",
        "10s",
        "-s",
        str(LUA),
        url,
    ]
    env = {**os.environ, "BENCH_BODY": str(body)}
    process = spawn(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = process.communicate(timeout=seconds + 30)
    finally:
        stop(process, grace=1.0)
    lines = [line for line in out.decode().splitlines() if line.startswith("BENCH ")]
    if process.returncode != 0 or not lines:
        raise SystemExit(f"wrk failed ({process.returncode}): {err.decode()[-1000:]}")
    data = json.loads(lines[-1][len("BENCH ") :])
    kinds = ("connect_errors", "read_errors", "write_errors", "status_errors", "timeouts")
    return Result(
        requests=data["requests"],
        seconds=data["duration_us"] / 1e6,
        errors=sum(data[k] for k in kinds),
        p50_ms=data["p50_us"] / 1000,
        p99_ms=data["p99_us"] / 1000,
        max_ms=data["max_us"] / 1000,
        answered=data["requests"],
    )


def run_aiohttp(
    url: str,
    body: Path,
    cafile: Path,
    *,
    mode: str,
    connections: int,
    seconds: float,
    warmup: float,
    rate: float,
    cpus: str | None,
) -> Result:
    """This script's ``load`` command in a process of its own (pinned to ``cpus``)."""
    argv = [
        *pinned(cpus),
        sys.executable,
        str(Path(__file__).resolve()),
        "load",
        "--url",
        url,
        "--body",
        str(body),
        "--cafile",
        str(cafile),
        "--mode",
        mode,
        "--connections",
        str(connections),
        "--duration",
        str(seconds),
        "--warmup",
        str(warmup),
        "--rate",
        str(rate),
    ]
    process = spawn(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = process.communicate(timeout=warmup + seconds + 60)
    finally:
        stop(process, grace=1.0)
    if process.returncode != 0:
        raise SystemExit(f"load generator failed ({process.returncode}): {err.decode()[-1500:]}")
    data = json.loads(out.decode().strip().splitlines()[-1])
    return Result(**data)


def percentile(sorted_values: Sequence[float], q: float) -> float:
    if not sorted_values:
        return float("nan")
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


async def _load(args: argparse.Namespace, body: bytes) -> Result:
    import aiohttp  # the load generator's process only

    context = ssl.create_default_context(cafile=args.cafile)
    headers = {"Content-Type": "application/json"}
    loop = asyncio.get_running_loop()
    latencies: list[float] = []
    answered = errors = 0
    late = 0.0
    measuring_from = float("inf")
    connector = aiohttp.TCPConnector(ssl=context, limit=args.connections)
    timeout = aiohttp.ClientTimeout(total=10)
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def one(scheduled: float) -> None:
            nonlocal answered, errors, late
            late = max(late, loop.time() - scheduled)
            try:
                async with session.post(args.url, data=body, headers=headers) as response:
                    await response.read()
                    ok = response.status == 200
            except (aiohttp.ClientError, TimeoutError):
                ok = False
            if not ok:
                errors += 1
                return
            answered += 1
            if scheduled >= measuring_from:
                latencies.append(loop.time() - scheduled)

        # Open every connection (TLS handshakes) before anything is measured.
        await asyncio.gather(*(one(loop.time()) for _ in range(args.connections)))
        late = 0.0
        start = loop.time() + 0.01
        measuring_from = start + args.warmup
        end = measuring_from + args.duration
        if args.mode == "open":
            # Open loop: request i is due at start + i/rate whether or not earlier ones
            # have been answered, and its latency counts from that due time, so a
            # server stall shows in full instead of pausing the sender.
            tasks: set[asyncio.Task[None]] = set()
            total = round((args.warmup + args.duration) * args.rate)
            sent = 0
            while sent < total:
                now = loop.time()
                while sent < total and start + sent / args.rate <= now:
                    task = asyncio.create_task(one(start + sent / args.rate))
                    tasks.add(task)
                    task.add_done_callback(tasks.discard)
                    sent += 1
                delay = start + sent / args.rate - loop.time()
                if delay > 0:
                    await asyncio.sleep(delay)
            if tasks:
                await asyncio.wait(tasks, timeout=15)
        else:

            async def worker() -> None:
                while loop.time() < end:
                    await one(loop.time())

            await asyncio.gather(*(worker() for _ in range(args.connections)))
    latencies.sort()
    return Result(
        requests=len(latencies),
        seconds=args.duration,
        errors=errors,
        p50_ms=percentile(latencies, 0.50) * 1000,
        p99_ms=percentile(latencies, 0.99) * 1000,
        max_ms=(latencies[-1] if latencies else float("nan")) * 1000,
        answered=answered,
        late_ms=late * 1000 if args.mode == "open" else 0.0,
    )


def command_load(args: argparse.Namespace) -> int:
    waited = run_queue_seconds([os.getpid()])
    result = asyncio.run(_load(args, Path(args.body).read_bytes()))
    result.sender_wait_s = run_queue_seconds([os.getpid()]) - waited
    print(json.dumps(asdict(result)))
    return 0


# -- the bare aiohttp handler -----------------------------------------------------------


def bare_context(cert: Path, key: Path) -> ssl.SSLContext:
    """The webhook's TLS settings (its certificate reloader's context): TLS 1.2+, the pair
    loaded, and an ``sni_callback`` moving each handshake to a second such context."""

    def context() -> ssl.SSLContext:
        made = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        made.minimum_version = ssl.TLSVersion.TLSv1_2
        made.load_cert_chain(cert, key)
        return made

    current, outer = context(), context()

    def select(ssl_object: ssl.SSLObject, _name: str | None, _context: ssl.SSLContext) -> None:
        ssl_object.context = current

    outer.sni_callback = select
    return outer


def listen(port: int) -> socket.socket:
    """A listening socket as the webhook opens it (backlog 1024, non-blocking)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((HOST, port))
    sock.listen(1024)
    sock.setblocking(False)
    return sock


async def _bare(args: argparse.Namespace, responses: dict[str, bytes]) -> None:
    from aiohttp import web  # the bare server's process only

    def fixed(body: bytes) -> Callable[[web.Request], Awaitable[web.Response]]:
        async def handler(request: web.Request) -> web.Response:
            await request.read()
            return web.Response(body=body, content_type="application/json")

        return handler

    async def readyz(_: web.Request) -> web.Response:
        return web.json_response({"status": "ready", "pid": os.getpid()})

    app = web.Application(client_max_size=4 << 20)  # the webhook's MAX_BODY
    for path, body in responses.items():
        app.router.add_post(path, fixed(body))
    health = web.Application()
    health.router.add_get("/readyz", readyz)
    sites = (
        (app, args.port, bare_context(Path(args.cert), Path(args.key))),
        (health, args.health_port, None),
    )
    runners: list[web.AppRunner] = []
    for application, port, context in sites:
        runner = web.AppRunner(application, access_log=None, handle_signals=False)
        await runner.setup()
        await web.SockSite(runner, listen(port), ssl_context=context).start()
        runners.append(runner)
    stopping = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    await stopping.wait()
    for runner in runners:
        await runner.cleanup()


def command_bare(args: argparse.Namespace) -> int:
    """A bare aiohttp HTTPS server: what any aiohttp TLS service costs, the floor the
    webhook is measured against. Same certificates, TLS settings, keep-alive, access
    log off and body limit as the webhook; each handler reads the body and answers the
    fixed bytes of a real AdmissionReview response for its path, parsing nothing."""
    responses = {}
    for item in args.response:
        path, _, file = item.partition("=")
        responses[path] = Path(file).read_bytes()
    asyncio.run(_bare(args, responses))
    return 0


# -- the benchmark ------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Summary:
    """Rounds of one scenario: medians, with the req/s range to show the noise."""

    rps: float
    rps_low: float
    rps_high: float
    p50_ms: float
    p99_ms: float
    cpu_us: float  # server CPU per request
    cpu_share: float  # server CPU time / wall time (1.0 = one core busy)
    wait_share: float  # server run-queue wait / wall time: other processes had its core
    errors: int

    @classmethod
    def of(cls, results: Sequence[Result]) -> Summary:
        rates = [r.rps for r in results]
        return cls(
            rps=statistics.median(rates),
            rps_low=min(rates),
            rps_high=max(rates),
            p50_ms=statistics.median(r.p50_ms for r in results),
            p99_ms=statistics.median(r.p99_ms for r in results),
            cpu_us=statistics.median(per_request_us(r) for r in results),
            cpu_share=statistics.median(r.cpu_s / r.seconds for r in results if r.seconds),
            wait_share=statistics.median(r.wait_s / r.seconds for r in results if r.seconds),
            errors=sum(r.errors for r in results),
        )


def check_answer(scenario: Scenario, answer: dict[str, Any]) -> str:
    response = answer.get("response") or {}
    allowed = response.get("allowed")
    patch = response.get("patch")
    if allowed is not scenario.expect_allowed or bool(patch) != scenario.expect_patch:
        raise SystemExit(f"({scenario.key}) unexpected answer: {json.dumps(response)[:600]}")
    if patch:
        ops = orjson.loads(base64.b64decode(patch))
        return f"allowed, {len(ops)} patch ops"
    if not allowed:
        return f"denied {response['status']['code']}: {response['status']['message'][:60]}..."
    return "allowed, no patch"


HEADER = (
    f"  {'scenario':<31} {'req/s':>7} {'(min-max)':>15} {'p50 ms':>7} {'p99 ms':>7}"
    f" {'CPU/req':>8} {'CPU':>5} {'wait':>5} {'errors':>6}"
)


def fmt_row(label: str, s: Summary) -> str:
    spread = f"({s.rps_low:,.0f}-{s.rps_high:,.0f})"
    return (
        f"  {label:<31} {s.rps:>7,.0f} {spread:>15} {s.p50_ms:>7.2f} {s.p99_ms:>7.2f}"
        f" {s.cpu_us:>6.0f}us {s.cpu_share:>5.0%} {s.wait_share:>5.0%} {s.errors:>6}"
    )


def run_queue_seconds(pids: Iterable[int]) -> float:
    """Time the main threads of ``pids`` (the event loops) spent runnable but waiting
    for a CPU, from schedstat: the share of a run that other processes took."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError, IndexError, ValueError):
            total += int(Path(f"/proc/{pid}/task/{pid}/schedstat").read_text().split()[1])
    return total / 1e9


def cpu_seconds(pids: Iterable[int]) -> float:
    """utime + stime of ``pids`` (every thread), from /proc."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += int(fields[11]) + int(fields[12])
    return total / ticks


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """Ctrl-C, SIGTERM and SIGHUP end the run through every ``finally``; then every
    process started here is stopped, with further signals held off until that is done."""

    def interrupt(signum: int, _frame: FrameType | None) -> None:
        raise KeyboardInterrupt(signal.Signals(signum).name)

    signals = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    # SIGINT too: a shell starting this in the background leaves it ignored.
    previous = {sig: signal.signal(sig, interrupt) for sig in signals}
    try:
        yield
    finally:
        for sig in signals:
            signal.signal(sig, signal.SIG_IGN)
        try:
            stop_all()
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


@dataclass(frozen=True, slots=True)
class Entry:
    """One closed-loop run of every round: ``server`` under ``scenario``."""

    variant: str  # "ours", "source" (not compiled), "baseline", "bare" or "x2" (--workers 2)
    label: str
    server: Server
    scenario: Scenario
    cpus: str | None  # the load generator's


def per_request_us(result: Result) -> float:
    """Server CPU time per answered request, in microseconds."""
    return result.cpu_s / max(1, result.requests) * 1e6


def requests_per_s(result: Result) -> float:
    return result.rps


Ratio = tuple[float, float, float]


def paired(
    ours: Sequence[Result], other: Sequence[Result], value: Callable[[Result], float]
) -> Ratio:
    """Median, min and max over the rounds of ``value(ours) / value(other)``: the two
    ran back to back in each round, so other work on the machine hit both alike."""
    ratios = [value(a) / value(b) for a, b in zip(ours, other, strict=True) if value(b)]
    if not ratios:
        return float("nan"), float("nan"), float("nan")
    return statistics.median(ratios), min(ratios), max(ratios)


def fmt_ratio(ratio: Ratio) -> str:
    middle, low, high = ratio
    return f"{middle:.2f}x ({low:.2f}-{high:.2f})"


def command_bench(args: argparse.Namespace) -> int:
    if args.loadgen == "wrk" and not shutil.which("wrk"):
        raise SystemExit("wrk is not installed (apt-get install wrk)")
    use_wrk = args.loadgen == "wrk" or (args.loadgen == "auto" and shutil.which("wrk") is not None)
    pin = pinning()
    server_cpus, client_cpus = ("0", "1") if pin else (None, None)
    round_s = max(1, round(args.duration / args.rounds))
    closed_only = args.only == "closed"
    with tempfile.TemporaryDirectory(prefix="gpushare-bench-") as tmp:
        workdir = Path(tmp)
        cafile = workdir / "certs" / "ca.crt"
        pod = gpu_pod()
        bodies = {
            "a": review(manifest("plain-pod.yaml"), "bench-plain"),
            "b": review(pod, "bench-gpu"),
            "c": review(manifest("privileged-sidecar.yaml"), "bench-deny"),
        }
        for key, data in bodies.items():
            (workdir / f"body-{key}.json").write_bytes(data)
        a, b, c = (
            Scenario("a", "(a) non-GPU pod  /validate", "/validate", workdir / "body-a.json", True, False),
            Scenario("b", "(b) 5 KB GPU pod /mutate", "/mutate", workdir / "body-b.json", True, True),
            Scenario("c", "(c) denial       /validate", "/validate", workdir / "body-c.json", False, False),
        )  # fmt: skip
        chosen = [s for s in (a, b, c) if s.key in args.scenarios]
        if use_wrk:
            generator = f"{wrk_version()} + bench/load.lua, 1 thread"
        else:
            missing = "" if shutil.which("wrk") else " (wrk not installed)"
            generator = f"aiohttp load generator{missing}"
        print(f"load generator: {generator}, {args.connections} keep-alive HTTPS connections")
        if not closed_only:
            print(f"fixed-rate sender: aiohttp, open loop, {args.connections} connections")
        if pin:
            workers = "" if closed_only else "; --workers 2 on cores 0,1"
            print(f"pinning: servers core 0, load generator core 1{workers}")
        else:
            print("pinning: off (taskset or a second core is missing)")
        print(f"machine load average at start: {os.getloadavg()[0]:.2f} ({os.cpu_count()} cores)")
        print(
            f"GPU pod: {len(orjson.dumps(pod)):,} bytes of JSON, trainer + log-shipper sidecar"
            f" (AdmissionReview {len(bodies['b']):,} bytes)"
        )

        def drive(server: Server, scenario: Scenario, seconds: float, cpus: str | None) -> Result:
            url = server.url(scenario.path)
            pids = {server.process.pid, *server.pids}
            before, waited = cpu_seconds(pids), run_queue_seconds(pids)
            if use_wrk:
                result = run_wrk(
                    url, scenario.body, connections=args.connections, seconds=seconds, cpus=cpus
                )
            else:
                result = run_aiohttp(
                    url,
                    scenario.body,
                    cafile,
                    mode="closed",
                    connections=args.connections,
                    seconds=seconds,
                    warmup=0,
                    rate=0,
                    cpus=cpus,
                )
            result.cpu_s = cpu_seconds(pids) - before
            result.wait_s = run_queue_seconds(pids) - waited
            return result

        # "ours" is what the image runs: the wheel with the compiled core. The source, as
        # `make run` serves it, runs beside it unless --source makes it "ours".
        site = None if args.source else native_site()
        one = Server(workdir, name="w1", cpus=server_cpus, site=site)
        one.wait_ready()
        checkout = describe(webhook_origin(None, workdir))
        if site is None:
            print(f"this checkout, source: {checkout}, {sys.executable}")
        else:
            print(f"this checkout, compiled core (the image's wheel): {site}, {sys.executable}")
        answers = {s.key: one.post(s.path, bodies[s.key]) for s in (a, b, c)}
        for scenario in (a, b, c):
            print(f"  {scenario.title}: {check_answer(scenario, answers[scenario.key])}")
        source: Server | None = None
        if site is not None:
            source = Server(workdir, name="src", cpus=server_cpus)
            source.wait_ready()
            print(f"this checkout, source: {checkout}")
            for scenario in (a, b, c):
                verdict = check_answer(scenario, source.post(scenario.path, bodies[scenario.key]))
                print(f"  {scenario.title}: {verdict}")
        base: Server | None = None
        if args.baseline_python:
            origin = webhook_origin(args.baseline_python, workdir)
            if origin == ROOT / "webhook":
                raise SystemExit(
                    f"{args.baseline_python} imports this checkout's webhook ({origin}):"
                    " nothing to compare; install the baseline in a venv of its own"
                )
            print(f"baseline: {describe(origin)}, {args.baseline_python}")
            base = Server(workdir, name="base", cpus=server_cpus, python=args.baseline_python)
            base.wait_ready()
            for scenario in (a, b, c):
                verdict = check_answer(scenario, base.post(scenario.path, bodies[scenario.key]))
                print(f"  {scenario.title}: {verdict}")
        # The bare handler answers each path with the bytes of our real answer.
        responses: dict[str, Path] = {}
        for scenario in (a, b):
            responses[scenario.path] = workdir / f"response-{scenario.key}.json"
            responses[scenario.path].write_bytes(orjson.dumps(answers[scenario.key]))
        bare = BareServer(workdir, cpus=server_cpus, responses=responses)
        bare.wait_ready()
        sizes = ", ".join(f"{p} {f.stat().st_size:,} bytes" for p, f in responses.items())
        print(f"bare aiohttp handler: reads the body, answers fixed bytes ({sizes})")
        two: Server | None = None
        if not closed_only:
            two = Server(workdir, name="w2", workers=2, cpus="0,1" if pin else None, site=site)
            two.wait_ready()

        # Rounds alternate between every variant of every scenario, compared variants
        # back to back, so a burst of other work on the machine hits them all alike;
        # medians are quoted.
        plan: list[Entry] = []
        for scenario in chosen:
            plan.append(Entry("ours", scenario.title, one, scenario, client_cpus))
            if source is not None:
                label = f"({scenario.key})   source, not compiled"
                plan.append(Entry("source", label, source, scenario, client_cpus))
            if base is not None:
                label = f"({scenario.key})   baseline"
                plan.append(Entry("baseline", label, base, scenario, client_cpus))
            if scenario in (a, b):
                label = f"({scenario.key})   bare aiohttp handler"
                plan.append(Entry("bare", label, bare, scenario, client_cpus))
        if two is not None:
            plan.append(Entry("x2", b.title + " x2", two, b, None))
        for entry in plan:
            drive(entry.server, entry.scenario, max(1.0, args.warmup), entry.cpus)
        runs: dict[tuple[str, str], list[Result]] = {
            (entry.variant, entry.scenario.key): [] for entry in plan
        }
        for number in range(args.rounds):
            print(f"  round {number + 1}/{args.rounds}", end="\r", file=sys.stderr, flush=True)
            for entry in plan:
                result = drive(entry.server, entry.scenario, round_s, entry.cpus)
                runs[entry.variant, entry.scenario.key].append(result)
        print(" " * 20, end="\r", file=sys.stderr, flush=True)
        summaries = {key: Summary.of(results) for key, results in runs.items()}
        print(
            f"\nclosed loop, one worker{' pinned to core 0' if pin else ''},"
            f" {args.rounds} rounds x {round_s} s, medians; CPU = server CPU time / wall time,"
            " wait = time it was runnable but another process had the core:"
        )
        print(HEADER)
        for entry in plan:
            if entry.variant != "x2":
                print(fmt_row(entry.label, summaries[entry.variant, entry.scenario.key]))

        print(
            "\nthis checkout against the bare aiohttp handler (ours / bare), medians of the"
            " rounds' ratios (min-max); per core = bare CPU/req / ours, the share of the bare"
            " handler's req/s that ours answers on a core of its own:"
        )
        for scenario in chosen:
            if scenario in (a, b):
                ours, other = runs["ours", scenario.key], runs["bare", scenario.key]
                mine, floor = summaries["ours", scenario.key], summaries["bare", scenario.key]
                print(
                    f"  {scenario.title:<27} per core {fmt_ratio(paired(other, ours, per_request_us))}"
                    f" (CPU/req {mine.cpu_us:.0f} vs {floor.cpu_us:.0f} us);"
                    f" req/s {fmt_ratio(paired(ours, other, requests_per_s))}"
                )
        if summaries["bare", "b"].cpu_share < 0.9:
            print(
                f"  (the bare handler had {summaries['bare', 'b'].cpu_share:.0%} of core 0: the"
                " load generator, not its core, bounded it, so req/s ratios flatter ours)"
            )

        def compare(heading: str, variant: str) -> None:
            """Ours after ``variant`` (after / before), per scenario, from the same rounds."""
            print(f"\n{heading}, medians of the rounds' ratios (min-max):")
            for scenario in chosen:
                after, before = runs["ours", scenario.key], runs[variant, scenario.key]
                new, old = summaries["ours", scenario.key], summaries[variant, scenario.key]
                print(
                    f"  {scenario.title:<27} req/s {old.rps:,.0f} -> {new.rps:,.0f} ="
                    f" {fmt_ratio(paired(after, before, requests_per_s))};"
                    f" CPU/req {old.cpu_us:.0f} -> {new.cpu_us:.0f} us ="
                    f" {fmt_ratio(paired(after, before, per_request_us))}"
                )

        if source is not None:
            compare("source -> compiled core (compiled / source)", "source")
        if base is not None:
            compare("baseline -> this checkout (after / before)", "baseline")

        gpu = summaries["ours", "b"]
        bare_ratio = paired(runs["bare", "b"], runs["ours", "b"], per_request_us)[0]
        checks = [
            (f"(b) >= {TARGET_RPS:,.0f} req/s (issue 3)", gpu.rps >= TARGET_RPS, f"{gpu.rps:,.0f}"),
            (f"(b) CPU/req <= {TARGET_CPU_US:g} us, audit log on", gpu.cpu_us <= TARGET_CPU_US,
             f"{gpu.cpu_us:.0f} us"),
            (f"(b) per core >= {TARGET_BARE_RATIO:g}x the bare aiohttp handler's req/s",
             bare_ratio >= TARGET_BARE_RATIO, f"{bare_ratio:.2f}x"),
        ]  # fmt: skip
        errors = sum(s.errors for s in summaries.values())
        if two is not None:
            fixed_ok, fixed_errors = open_loop_and_rss(args, one, two, b, summaries, client_cpus)
            checks += fixed_ok
            errors += fixed_errors
        for server in (one, source, base, bare, two):
            if server is not None:
                server.stop()
        print(f"machine load average at end: {os.getloadavg()[0]:.2f}")

        print("\ntargets (one worker on one core):")
        for label, ok, value in checks:
            print(f"  {'PASS' if ok else 'MISS'}  {label}: {value}")
        if gpu.cpu_us:
            print(
                f"  (b) used {gpu.cpu_us:.0f} us of server CPU per request: a core of its own"
                f" would answer ~{1e6 / gpu.cpu_us:,.0f} req/s; in this run it had"
                f" {gpu.cpu_share:.0%} of core 0 and waited {gpu.wait_share:.0%} of the time"
            )
        if errors:
            print(f"  note: {errors} requests failed")
        return 0 if all(ok for _, ok, _ in checks) and not errors else 1


Check = tuple[str, bool, str]


def open_loop_and_rss(
    args: argparse.Namespace,
    one: Server,
    two: Server,
    b: Scenario,
    summaries: dict[tuple[str, str], Summary],
    client_cpus: str | None,
) -> tuple[list[Check], int]:
    """(b) at a fixed rate with the audit check, peak RSS, and --workers 2 against one:
    their targets and the requests that failed."""
    cafile = one.workdir / "certs" / "ca.crt"
    before = audit_lines(one.audit)
    pids = [one.process.pid]
    cpu_before, waited = cpu_seconds(pids), run_queue_seconds(pids)
    fixed = run_aiohttp(
        one.url(b.path),
        b.body,
        cafile,
        mode="open",
        connections=args.connections,
        seconds=args.duration,
        warmup=args.warmup,
        rate=args.rate,
        cpus=client_cpus,
    )
    fixed.cpu_s = cpu_seconds(pids) - cpu_before
    fixed.wait_s = run_queue_seconds(pids) - waited
    wall = args.duration + args.warmup
    print(
        f"\n(b) open loop at a fixed {args.rate:,.0f} req/s for {args.duration:g} s,"
        " latency from each request's scheduled send time:"
    )
    print(
        f"  {fixed.requests:,} measured: p50 {fixed.p50_ms:.2f} ms, p99 {fixed.p99_ms:.2f} ms,"
        f" max {fixed.max_ms:.2f} ms, errors {fixed.errors};"
        f" sender at worst {fixed.late_ms:.1f} ms behind schedule"
    )
    print(
        f"  server CPU {fixed.cpu_s / wall:.0%} of a core, waited for it"
        f" {fixed.wait_s / wall:.0%} of the time; sender waited {fixed.sender_wait_s / wall:.0%}"
    )
    # The writer thread writes a batch every few ms; give it a moment to finish.
    deadline = time.monotonic() + 10
    lines = audit_lines(one.audit) - before
    while lines < fixed.answered and time.monotonic() < deadline:
        time.sleep(0.1)
        lines = audit_lines(one.audit) - before
    print(
        f"  audit log: {lines:,} lines for {fixed.answered:,} requests answered in this"
        f" scenario (warm-up included): {'OK' if lines == fixed.answered else 'MISMATCH'}"
    )
    handler = sorted(orjson.loads(line)["latencyMs"] for line in audit_tail(one.audit, lines))
    if handler:
        print(
            f"  inside the handler (audit latencyMs, body read to answer): p50"
            f" {percentile(handler, 0.5):.2f} ms, p99 {percentile(handler, 0.99):.2f} ms"
        )

    rss = {pid: kib / 1024 for pid, kib in one.peak_rss_kib().items()}
    rss_mb = max(rss.values())
    rss_two = ", ".join(
        f"{'parent' if pid == two.process.pid else 'worker'} {kib / 1024:.1f} MB"
        for pid, kib in two.peak_rss_kib().items()
    )
    print(f"\npeak RSS (VmHWM): one worker {rss_mb:.1f} MB; --workers 2: {rss_two}")

    x1, x2 = summaries["ours", "b"], summaries["x2", "b"]
    ratio = x2.rps / x1.rps if x1.rps else float("nan")
    print(
        f"\n--workers 2{' on cores 0,1' if pinning() else ''}, load generator unpinned,"
        " same rounds (CPU 200% = both cores):"
    )
    print(HEADER)
    print(fmt_row(b.title + " x1", x1))
    print(fmt_row(b.title + " x2", x2))
    print(f"  scaling: {x2.rps:,.0f} / {x1.rps:,.0f} req/s = {ratio:.2f}x")
    checks = [
        (f"p99 <= {TARGET_P99_MS:g} ms at {args.rate:,.0f} req/s (issue 3)",
         fixed.p99_ms <= TARGET_P99_MS, f"{fixed.p99_ms:.2f} ms"),
        (f"peak RSS <= {TARGET_RSS_MB:g} MB (issue 3)", rss_mb <= TARGET_RSS_MB, f"{rss_mb:.1f} MB"),
        ("audit lines == answers", lines == fixed.answered, f"{lines:,}/{fixed.answered:,}"),
    ]  # fmt: skip
    return checks, fixed.errors


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="bench/server.py", description="Benchmark of the HTTPS admission service."
    )
    parser.add_argument("--duration", type=float, default=10.0, help="seconds per scenario (10)")
    parser.add_argument("--rounds", type=int, default=5, help="rounds the duration is split in (5)")
    parser.add_argument("--warmup", type=float, default=2.0, help="warm-up seconds (2)")
    parser.add_argument("--connections", type=int, default=16, help="keep-alive connections (16)")
    parser.add_argument("--rate", type=float, default=1000.0, help="fixed rate, req/s (1000)")
    parser.add_argument("--loadgen", choices=["auto", "wrk", "aiohttp"], default="auto")
    parser.add_argument(
        "--only",
        choices=["all", "closed"],
        default="all",
        help="closed: the closed-loop comparisons only, no --workers 2, open loop or RSS (all)",
    )
    parser.add_argument(
        "--scenarios",
        default="abc",
        help="closed-loop scenarios, of a, b, c; b is always needed (abc)",
    )
    parser.add_argument(
        "--source",
        action="store_true",
        help="measure this checkout's source as ours, without building the compiled core"
        " (hack/build-native) the image runs",
    )
    parser.add_argument(
        "--baseline-python",
        metavar="PYTHON",
        help="also run the closed-loop scenarios against a server started with this"
        " interpreter, importing the webhook it has installed (an older checkout's venv),"
        " in the same rounds, and print before/after ratios",
    )
    parser.set_defaults(handler=command_bench, command=None)
    commands = parser.add_subparsers(dest="command")
    load = commands.add_parser("load", help="(internal) the aiohttp load generator process")
    load.add_argument("--url", required=True)
    load.add_argument("--body", required=True)
    load.add_argument("--cafile", required=True)
    load.add_argument("--mode", choices=["open", "closed"], required=True)
    load.add_argument("--connections", type=int, default=16)
    load.add_argument("--duration", type=float, default=10.0)
    load.add_argument("--warmup", type=float, default=2.0)
    load.add_argument("--rate", type=float, default=1000.0)
    bare = commands.add_parser("bare", help="(internal) the bare aiohttp HTTPS server")
    bare.add_argument("--port", type=int, required=True)
    bare.add_argument("--health-port", type=int, required=True)
    bare.add_argument("--cert", required=True)
    bare.add_argument("--key", required=True)
    bare.add_argument("--response", action="append", default=[], metavar="PATH=FILE")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "load":
        if not args.url.startswith(f"https://{HOST}:"):
            raise SystemExit(f"only {HOST} may be a target")
        return command_load(args)
    if args.command == "bare":
        return command_bare(args)
    if not (0 < args.duration <= 60 and 0 <= args.warmup <= 30 and 1 <= args.rounds <= 20):
        raise SystemExit("--duration must be in (0, 60], --warmup in [0, 30], --rounds in [1, 20]")
    if not (0 < args.rate <= 20000 and 1 <= args.connections <= 512):
        raise SystemExit("--rate must be in (0, 20000] and --connections in [1, 512]")
    if not (set(args.scenarios) <= set("abc") and "b" in args.scenarios):
        raise SystemExit("--scenarios takes letters of a, b, c, b among them")
    try:
        with interruptible():
            return command_bench(args)
    except KeyboardInterrupt:
        print("\ninterrupted; every process started here is stopped", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
