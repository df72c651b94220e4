"""Soak: ``gpushare-webhook serve --workers N`` for a long while under open-loop load,
with churn and faults, printing per interval what failed, the latency and the memory.

- Load: an open-loop rate (``--rate``) of mixed reviews over HTTPS keep-alive from a
  generator process: 60% a ~5 KB GPU pod on /mutate, 30% a plain pod on /validate, 10%
  a denial (privileged sidecar) on /validate. Latency counts from each request's
  scheduled send time (no coordinated omission).
- Churn: the policy file rewritten every ``--policy-every`` seconds (the default and the
  strict example in turn, so each write is a real reload); a new serving certificate
  from the same CA every ``--cert-every`` seconds (written into the Secret with
  ``--self-managed``, which every process picks up, else into the --tls-cert files).
- Faults: a worker SIGKILLed every ``--kill-every`` seconds (workers in turn); with a
  control plane (``GPUSHARE_TESTBIN``: etcd and kube-apiserver built by
  hack/build-testbin), the server runs ``--self-managed --cluster`` against it and the
  apiserver is restarted every ``--apiserver-every`` seconds.
- Per interval (``--report-every``, 60 s): requests sent, answered, failed, p50/p99,
  the RSS of the server's whole process tree (parent, fork server, workers), and the
  events of the interval. At each kill: the generator's requests in flight at that
  moment (the most a kill may fail) and how long until a replacement answered.

The issue's target run (1 h, a worker killed every 10 min)::

    GPUSHARE_TESTBIN=$(hack/build-testbin | tail -1) .venv/bin/python bench/soak.py \\
        --minutes 60 --workers 2 --rate 1000 --kill-every 600 --apiserver-every 900

Every process it starts is stopped on exit, Ctrl-C included.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import queue
import signal
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any

import orjson
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.fixtures import gpu_pod_5k, plain_pod_2k  # noqa: E402
from webhook.dev.testing import admission_review  # noqa: E402

HOST = "127.0.0.1"  # the only address this harness ever connects to
NAMESPACE = "gpushare-soak"
SERVICE = "gpushare-webhook"
CONFIG = "gpushare-soak"
SECRET = "gpushare-soak-tls"  # noqa: S105  # the Secret's name
# The mix of the load: (share of requests out of 10, path, body file).
MIX = (("gpu", "/mutate", 6), ("plain", "/validate", 3), ("denied", "/validate", 1))


# -- the load generator (its own process: `soak.py load ...`) --------------------------


def percentile(values: Sequence[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


async def _generate(args: argparse.Namespace, bodies: dict[str, tuple[str, bytes]]) -> None:
    import aiohttp  # the generator's process only

    schedule = [name for name, _, share in MIX for _ in range(share)]
    context = ssl.create_default_context(cafile=args.cafile)
    # The Service name the certificate carries is not what we dial: trust is what counts.
    context.check_hostname = False
    loop = asyncio.get_running_loop()
    in_flight = 0
    window: dict[str, Any] = {
        "sent": 0,
        "ok": 0,
        "failed": 0,
        "after_kill": 0,
        "errors": {},
        "lat": [],
    }
    late = 0.0

    def report(now: float) -> None:
        nonlocal window, late
        lat = window["lat"]
        line = {
            "t": round(now - start, 1),
            "sent": window["sent"],
            "ok": window["ok"],
            "failed": window["failed"],
            "after_kill": window["after_kill"],
            "errors": window["errors"],
            "p50_ms": round(percentile(lat, 0.50) * 1000, 2),
            "p99_ms": round(percentile(lat, 0.99) * 1000, 2),
            "late_ms": round(late * 1000, 1),
            "cpu_s": round(time.process_time(), 1),
        }
        print(json.dumps(line), flush=True)
        window = {"sent": 0, "ok": 0, "failed": 0, "after_kill": 0, "errors": {}, "lat": []}
        late = 0.0

    # The moments the harness signalled a kill (SIGUSR1, sent right after it): a failed
    # request sent before one was in flight at that kill; one sent after it is a
    # failure a kill must not cause.
    kills: list[float] = []

    def snapshot() -> None:
        kills.append(loop.time())
        print(json.dumps({"event": "in_flight", "n": in_flight}), flush=True)

    loop.add_signal_handler(signal.SIGUSR1, snapshot)
    connector = aiohttp.TCPConnector(ssl=context, limit=args.connections)
    timeout = aiohttp.ClientTimeout(total=10)
    headers = {"Content-Type": "application/json"}
    async with aiohttp.ClientSession(connector=connector, timeout=timeout) as session:

        async def one(scheduled: float, name: str) -> None:
            nonlocal in_flight
            path, body = bodies[name]
            sent_at = loop.time()
            in_flight += 1
            try:
                async with session.post(args.url + path, data=body, headers=headers) as response:
                    await response.read()
                    error = None if response.status == 200 else f"http {response.status}"
            except (aiohttp.ClientError, TimeoutError, OSError) as exc:
                error = type(exc).__name__
            finally:
                in_flight -= 1
            if error is None:
                window["ok"] += 1
                window["lat"].append(loop.time() - scheduled)
            else:
                window["failed"] += 1
                window["errors"][error] = window["errors"].get(error, 0) + 1
                if not kills or sent_at > kills[-1]:
                    window["after_kill"] += 1

        tasks: set[asyncio.Task[None]] = set()
        start = loop.time() + 0.05
        total = round(args.seconds * args.rate)
        next_report = start + args.report_every
        sent = 0
        while sent < total:
            now = loop.time()
            while sent < total and start + sent / args.rate <= now:
                scheduled = start + sent / args.rate
                late = max(late, now - scheduled)
                task = asyncio.create_task(one(scheduled, schedule[sent % len(schedule)]))
                tasks.add(task)
                task.add_done_callback(tasks.discard)
                sent += 1
                window["sent"] += 1
            if now >= next_report:
                report(now)
                next_report += args.report_every
            delay = min(start + sent / args.rate, next_report) - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
        if tasks:
            await asyncio.wait(tasks, timeout=15)
        report(loop.time())


def command_load(args: argparse.Namespace) -> int:
    bodies = {name: (path, Path(args.bodies, f"{name}.json").read_bytes()) for name, path, _ in MIX}
    try:
        import uvloop
    except ImportError:  # the same load on asyncio's loop, with less headroom
        asyncio.run(_generate(args, bodies))
    else:
        uvloop.run(_generate(args, bodies))
    return 0


# -- the server and its process tree ---------------------------------------------------


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return int(sock.getsockname()[1])


def process_tree(root: int) -> list[int]:
    """``root`` and every process below it."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        with contextlib.suppress(OSError, IndexError, ValueError):
            # pid (comm) state ppid ...: comm may hold spaces, so split after its ")".
            fields = stat.read_text().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    tree, todo = [], [root]
    while todo:
        pid = todo.pop()
        tree.append(pid)
        todo.extend(children.get(pid, []))
    return tree


def rss_mib(pids: Sequence[int]) -> float:
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
    return total / 1024


def readyz(health_port: int) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        f"http://{HOST}:{health_port}/readyz", headers={"Connection": "close"}
    )
    try:
        with urllib.request.urlopen(request, timeout=2) as response:  # noqa: S310  # loopback
            return response.status, json.load(response)
    except urllib.error.HTTPError as exc:
        return exc.code, json.load(exc)


def worker_pids(health_port: int, *, asks: int = 30) -> set[int]:
    """The workers answering: new connections spread over them by the kernel."""
    found: set[int] = set()
    for _ in range(asks):
        with contextlib.suppress(OSError, ValueError):
            status, body = readyz(health_port)
            if status == 200:
                found.add(body["pid"])
    return found


@dataclass
class Events:
    """What happened in the current interval, and every kill of the run."""

    current: list[str] = field(default_factory=list)
    kills: list[dict[str, Any]] = field(default_factory=list)
    restarts: list[float] = field(default_factory=list)

    def take(self) -> list[str]:
        taken, self.current = self.current, []
        return taken


class Soak:
    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        self.args = args
        self.workdir = workdir
        self.port = free_port()
        self.health_port = free_port()
        self.plane: Any = None
        self.kube: Any = None
        self.server: subprocess.Popen[bytes] | None = None
        self.generator: subprocess.Popen[bytes] | None = None
        self.events = Events()
        self.policy = workdir / "policy.yaml"
        self.policies = [
            (ROOT / "policies" / "default.yaml").read_text(),
            (ROOT / "policies" / "examples" / "strict.yaml").read_text(),
        ]
        self.certs = workdir / "certs"
        self._ca: Any = None

    # -- setup ---------------------------------------------------------------------

    def write_bodies(self) -> Path:
        bodies = self.workdir / "bodies"
        bodies.mkdir()
        denied = yaml.safe_load(
            (ROOT / "tests" / "manifests" / "privileged-sidecar.yaml").read_text()
        )
        for name, obj in (("gpu", gpu_pod_5k()), ("plain", plain_pod_2k()), ("denied", denied)):
            review = admission_review(obj, namespace="ml")
            (bodies / f"{name}.json").write_bytes(orjson.dumps(review))
        return bodies

    def start_control_plane(self) -> None:
        from kubernetes import client

        from webhook.dev.cluster import DevCluster, find_binaries

        self.workdir.joinpath("plane").mkdir()
        self.plane = DevCluster(
            workdir=self.workdir / "plane", bin_dir=find_binaries(), policy=self.policy
        )
        self.plane.start_control_plane()
        self.plane.create_namespace(NAMESPACE)
        api = self.plane.api_client()
        self.kube = {
            "core": client.CoreV1Api(api),
            "admission": client.AdmissionregistrationV1Api(api),
        }
        # Configurations the leader keeps (caBundle, scope); the apiserver never calls them.
        hook = {
            "name": "soak.gpushare.io",
            "admissionReviewVersions": ["v1"],
            "sideEffects": "None",
            "failurePolicy": "Ignore",
            "namespaceSelector": {"matchLabels": {"soak.gpushare.io/never": "never"}},
            "clientConfig": {"url": "https://127.0.0.1:9/never"},
            "rules": [
                {
                    "apiGroups": [""],
                    "apiVersions": ["v1"],
                    "resources": ["pods"],
                    "operations": ["CREATE"],
                }
            ],
        }
        self.kube["admission"].create_mutating_webhook_configuration(
            {"metadata": {"name": CONFIG}, "webhooks": [{**hook, "reinvocationPolicy": "Never"}]}
        )
        self.kube["admission"].create_validating_webhook_configuration(
            {"metadata": {"name": CONFIG}, "webhooks": [hook]}
        )

    def start_server(self) -> None:
        self.policy.write_text(self.policies[0])
        argv = [
            sys.executable,
            "-m",
            "webhook",
            "serve",
            f"--host={HOST}",
            f"--port={self.port}",
            f"--health-port={self.health_port}",
            f"--workers={self.args.workers}",
            f"--policy={self.policy}",
            f"--cert-dir={self.certs}",
            f"--audit-log={self.workdir / 'audit.log'}",
            # INFO when the log is kept: it then shows each worker starting to serve.
            f"--log-level={'INFO' if self.args.server_log else 'WARNING'}",
        ]
        if self.plane is not None:
            kubeconfig = self.workdir / "kubeconfig"
            self.plane.write_kubeconfig(kubeconfig)
            argv += [
                "--self-managed",
                f"--namespace={NAMESPACE}",
                f"--secret={SECRET}",
                f"--webhook-config={CONFIG}",
                f"--kubeconfig={kubeconfig}",
                "--check-interval=5",
                "--cluster",
            ]
        else:
            from webhook.certs.files import write_files
            from webhook.certs.issue import generate_ca

            self._ca = generate_ca(common_name="soak CA", valid_for=timedelta(days=7))
            write_files(self.certs, ca=self._ca, serving=self._leaf())
            argv += [f"--tls-cert={self.certs / 'tls.crt'}", f"--tls-key={self.certs / 'tls.key'}"]
        with Path(self.args.server_log or self.workdir / "serve.log").open("wb") as log:
            self.server = subprocess.Popen(
                argv,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
                env={**os.environ, "POD_NAME": "soak-pod", "PYTHONPATH": str(ROOT)},
                start_new_session=True,
            )
        deadline = time.monotonic() + 120
        while len(worker_pids(self.health_port, asks=10)) < self.args.workers:
            if self.server.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"server did not start:\n{self.log_tail()}")
            time.sleep(0.2)

    def _leaf(self) -> Any:
        from webhook.certs.issue import generate_serving

        return generate_serving(
            ca=self._ca,
            dns_names=[f"{SERVICE}.{NAMESPACE}.svc"],
            ip_addresses=[HOST],
            valid_for=timedelta(days=1),
        )

    def log_tail(self) -> str:
        log = Path(self.args.server_log or self.workdir / "serve.log")
        return "\n".join(log.read_text(errors="replace").splitlines()[-30:])

    def start_generator(self, bodies: Path) -> queue.Queue[dict[str, Any]]:
        argv = [
            sys.executable,
            __file__,
            "load",
            f"--url=https://{HOST}:{self.port}",
            f"--cafile={self.certs / 'ca.crt'}",
            f"--bodies={bodies}",
            f"--rate={self.args.rate}",
            f"--seconds={self.args.minutes * 60}",
            f"--report-every={self.args.report_every}",
            f"--connections={self.args.connections}",
        ]
        self.generator = subprocess.Popen(argv, stdout=subprocess.PIPE, start_new_session=True)
        lines: queue.Queue[dict[str, Any]] = queue.Queue()
        stdout = self.generator.stdout
        assert stdout is not None

        def read() -> None:
            for raw in stdout:
                with contextlib.suppress(ValueError):
                    lines.put(json.loads(raw))

        threading.Thread(target=read, daemon=True).start()
        return lines

    # -- churn and faults ----------------------------------------------------------

    def rewrite_policy(self, turn: int) -> None:
        self.policy.write_text(self.policies[turn % 2])

    def swap_certificate(self) -> None:
        if self.kube is None:
            from webhook.certs.files import write_files

            write_files(self.certs, ca=self._ca, serving=self._leaf())
            self.events.current.append("cert")
            return
        from webhook.certs.issue import generate_serving, service_dns_names
        from webhook.certs.rotation import SERVING_CERT, SERVING_KEY, Material

        secret = self.kube["core"].read_namespaced_secret(SECRET, NAMESPACE)
        data = {k: base64.b64decode(v) for k, v in secret.data.items()}
        ca = Material.from_secret(data, {}).ca
        assert ca is not None, "the Secret holds no usable CA"
        leaf = generate_serving(
            ca=ca,
            dns_names=service_dns_names(SERVICE, NAMESPACE),
            ip_addresses=[],
            valid_for=timedelta(days=90),
        )
        secret.data[SERVING_CERT] = base64.b64encode(leaf.cert_pem()).decode()
        secret.data[SERVING_KEY] = base64.b64encode(leaf.key_pem()).decode()
        self.kube["core"].replace_namespaced_secret(SECRET, NAMESPACE, secret)
        self.events.current.append("cert")

    def kill_worker(self, turn: int) -> None:
        assert self.generator is not None
        before = sorted(worker_pids(self.health_port))
        if not before:
            self.events.current.append("kill: no worker answered")
            return
        victim = before[turn % len(before)]
        os.kill(victim, signal.SIGKILL)
        killed = time.monotonic()
        self.generator.send_signal(signal.SIGUSR1)  # marks the kill, prints its in flight
        replaced = None
        while time.monotonic() - killed < 30:
            # A worker that was not there before answers: the replacement listens.
            if worker_pids(self.health_port, asks=1) - set(before):
                replaced = time.monotonic() - killed
                break
            time.sleep(0.01)
        self.events.kills.append({"pid": victim, "replaced_s": replaced, "in_flight": None})
        shown = f"{replaced * 1000:.0f} ms" if replaced is not None else "not in 30 s"
        self.events.current.append(f"kill {victim} (replacement answering after {shown})")

    def restart_apiserver(self) -> None:
        started = time.monotonic()
        self.plane.restart_apiserver()
        took = time.monotonic() - started
        self.events.restarts.append(took)
        self.events.current.append(f"apiserver restarted ({took:.1f} s)")

    # -- the run -------------------------------------------------------------------

    def run(self) -> int:
        args = self.args
        bodies = self.write_bodies()
        if not args.no_apiserver:
            self.start_control_plane()
        self.start_server()
        assert self.server is not None
        lines = self.start_generator(bodies)
        began = time.monotonic()
        due = {
            "policy": args.policy_every,
            "cert": args.cert_every,
            "kill": args.kill_every,
            "apiserver": args.apiserver_every if self.plane is not None else float("inf"),
        }
        turns = dict.fromkeys(due, 0)
        rows: list[dict[str, Any]] = []
        print(
            f"soak: {args.minutes} min, --workers {args.workers}, {args.rate} req/s open loop "
            f"(60% GPU /mutate, 30% plain, 10% denied), policy every {args.policy_every:g} s, "
            f"certificate every {args.cert_every:g} s, a worker killed every "
            f"{args.kill_every:g} s"
            + (f", apiserver restarted every {args.apiserver_every:g} s" if self.plane else "")
            + f"; {os.cpu_count()} cores",
            flush=True,
        )
        print(
            f"{'t (s)':>7} {'sent':>7} {'ok':>7} {'failed':>6} {'after':>5} {'p50 ms':>7} {'p99 ms':>7} "
            f"{'late ms':>7} {'RSS MiB':>8} {'procs':>5}  events",
            flush=True,
        )
        assert self.generator is not None
        while True:
            elapsed = time.monotonic() - began
            for name, at in due.items():
                if elapsed >= at:
                    turns[name] += 1
                    if name == "policy":
                        self.rewrite_policy(turns[name])
                    elif name == "cert":
                        self.swap_certificate()
                    elif name == "kill":
                        self.kill_worker(turns[name])
                    else:
                        self.restart_apiserver()
                    every = {
                        "policy": args.policy_every,
                        "cert": args.cert_every,
                        "kill": args.kill_every,
                        "apiserver": args.apiserver_every,
                    }[name]
                    due[name] = at + every
            with contextlib.suppress(queue.Empty):
                while True:
                    line = lines.get_nowait()
                    if line.get("event") == "in_flight":
                        pending = [k for k in self.events.kills if k["in_flight"] is None]
                        if pending:
                            pending[-1]["in_flight"] = line["n"]
                        continue
                    tree = process_tree(self.server.pid)
                    line["rss_mib"] = round(rss_mib(tree), 1)
                    line["procs"] = len(tree)
                    line["events"] = self.events.take()
                    rows.append(line)
                    print(
                        f"{line['t']:>7} {line['sent']:>7} {line['ok']:>7} {line['failed']:>6} "
                        f"{line['after_kill']:>5} "
                        f"{line['p50_ms']:>7} {line['p99_ms']:>7} {line['late_ms']:>7} "
                        f"{line['rss_mib']:>8} {line['procs']:>5}  "
                        + "; ".join(line["events"])
                        + (f" errors {line['errors']}" if line["errors"] else ""),
                        flush=True,
                    )
            if self.generator.poll() is not None and lines.empty():
                break
            time.sleep(0.1)
        return self.summary(rows)

    def summary(self, rows: list[dict[str, Any]]) -> int:
        assert self.server is not None
        if not rows:
            print("no report from the generator", file=sys.stderr)
            return 1
        failed = sum(r["failed"] for r in rows)
        answered = sum(r["ok"] for r in rows)
        in_flight = sum(k["in_flight"] or 0 for k in self.events.kills)
        replaced = [k["replaced_s"] for k in self.events.kills if k["replaced_s"] is not None]
        # Warm-up: the first interval; flat means the last interval within 10% of the second.
        rss = [r["rss_mib"] for r in rows[1:-1]] or [rows[0]["rss_mib"]]
        print()
        print(f"answered {answered}, failed {failed} ({failed / max(1, answered + failed):.4%})")
        after = sum(r.get("after_kill", 0) for r in rows)
        print(
            f"kills: {len(self.events.kills)}; requests in flight at the kills: {in_flight}; "
            f"failed: {failed - after} sent before a kill (in flight on the killed worker's "
            f"connections), {after} sent after one"
        )
        if replaced:
            print(
                "replacement answering after a kill: median "
                f"{statistics.median(replaced) * 1000:.0f} ms, max {max(replaced) * 1000:.0f} ms"
            )
        if self.events.restarts:
            print(f"apiserver restarts: {len(self.events.restarts)}")
        print(
            "p99 per interval: median "
            f"{statistics.median(r['p99_ms'] for r in rows):.2f} ms, max "
            f"{max(r['p99_ms'] for r in rows):.2f} ms; p50 median "
            f"{statistics.median(r['p50_ms'] for r in rows):.2f} ms"
        )
        print(
            f"RSS of the server's tree after warm-up: first {rss[0]:.1f} MiB, last "
            f"{rss[-1]:.1f} MiB, min {min(rss):.1f}, max {max(rss):.1f}"
        )
        print(f"generator CPU: {rows[-1]['cpu_s']:.0f} s over {rows[-1]['t']:.0f} s")
        self.server.send_signal(signal.SIGTERM)
        code = self.server.wait(60)
        print(f"server exit status after SIGTERM: {code}")
        return 0 if code == 0 and after == 0 else 1

    def close(self) -> None:
        for process in (self.generator, self.server):
            if process is not None and process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGTERM)
                with contextlib.suppress(subprocess.TimeoutExpired):
                    process.wait(30)
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
        if self.plane is not None:
            self.plane.stop()


@contextlib.contextmanager
def interruptible() -> Iterator[None]:
    """Ctrl-C and SIGTERM end the run through the cleanup below."""

    def stop(_signum: int, _frame: object) -> None:
        raise KeyboardInterrupt

    previous = signal.signal(signal.SIGTERM, stop)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def command_soak(args: argparse.Namespace) -> int:
    if not args.no_apiserver and not os.environ.get("GPUSHARE_TESTBIN"):
        print(
            "no GPUSHARE_TESTBIN: running without a control plane (no apiserver faults); "
            "GPUSHARE_TESTBIN=$(hack/build-testbin | tail -1) adds them",
            file=sys.stderr,
        )
        args.no_apiserver = True
    with tempfile.TemporaryDirectory(prefix="gpushare-soak-") as tmp, interruptible():
        soak = Soak(args, Path(tmp))
        try:
            return soak.run()
        except KeyboardInterrupt:
            return 130
        finally:
            soak.close()


def command_replace(args: argparse.Namespace) -> int:
    """No load: SIGKILL a worker ``--kills`` times, each once the last replacement answers,
    and print how long each took until a new worker answered /readyz."""
    args.no_apiserver = True
    with tempfile.TemporaryDirectory(prefix="gpushare-soak-") as tmp, interruptible():
        soak = Soak(args, Path(tmp))
        try:
            soak.start_server()
            assert soak.server is not None
            # Takes the kill marks the load generator would.
            soak.generator = subprocess.Popen(["sleep", "3600"], start_new_session=True)
            for turn in range(args.kills):
                soak.kill_worker(turn)
                time.sleep(args.pause)
            taken = [k["replaced_s"] for k in soak.events.kills if k["replaced_s"] is not None]
            print(
                f"{len(taken)}/{args.kills} kills replaced; kill -> a new worker answering: "
                f"median {statistics.median(taken) * 1000:.0f} ms, min {min(taken) * 1000:.0f}, "
                f"max {max(taken) * 1000:.0f} ms"
            )
            return 0 if len(taken) == args.kills else 1
        except KeyboardInterrupt:
            return 130
        finally:
            soak.close()


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="bench/soak.py", description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command")
    soak = parser
    soak.add_argument("--minutes", type=float, default=60.0)
    soak.add_argument("--workers", type=int, default=2)
    soak.add_argument("--rate", type=float, default=1000.0, help="requests per second")
    soak.add_argument("--connections", type=int, default=32)
    soak.add_argument("--report-every", type=float, default=60.0, metavar="SECONDS")
    soak.add_argument("--policy-every", type=float, default=10.0, metavar="SECONDS")
    soak.add_argument("--cert-every", type=float, default=60.0, metavar="SECONDS")
    soak.add_argument("--kill-every", type=float, default=600.0, metavar="SECONDS")
    soak.add_argument("--apiserver-every", type=float, default=900.0, metavar="SECONDS")
    soak.add_argument(
        "--no-apiserver", action="store_true", help="no control plane: plain serve, no API faults"
    )
    soak.add_argument(
        "--server-log", metavar="FILE", help="keep the server's log (at INFO) in FILE"
    )
    replace = commands.add_parser(
        "replace", help="no load, no control plane: time worker replacements only"
    )
    replace.add_argument("--workers", type=int, default=2)
    replace.add_argument("--kills", type=int, default=10)
    replace.add_argument("--pause", type=float, default=6.0, help="seconds between kills")
    replace.add_argument("--server-log", metavar="FILE", help="keep the server's log in FILE")
    load = commands.add_parser("load", help="(internal) the open-loop load generator")
    load.add_argument("--url", required=True)
    load.add_argument("--cafile", required=True)
    load.add_argument("--bodies", required=True)
    load.add_argument("--rate", type=float, required=True)
    load.add_argument("--seconds", type=float, required=True)
    load.add_argument("--report-every", type=float, default=60.0)
    load.add_argument("--connections", type=int, default=32)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "load":
        return command_load(args)
    if args.command == "replace":
        return command_replace(args)
    return command_soak(args)


if __name__ == "__main__":
    sys.exit(main())
