"""Instructions the server executes per request, counted by callgrind: a figure that
does not move with what else runs on the machine.

Starts ``python -m webhook serve`` (development certificates, audit log to a file, as
``bench/server.py`` runs it) under ``valgrind --tool=callgrind``, sends ``--warmup``
reviews, zeroes the counters, sends ``--requests`` more one after another on one
HTTPS keep-alive connection, dumps the counters and prints their total over the
requests: every thread of the server (the audit writer included), the kernel's work
excluded. With ``--compiled`` the image's wheel (the core compiled by mypyc, built by
hack/build-native) is counted beside the source. With ``--bare`` the bare aiohttp handler of ``bench/server.py`` is counted
the same way; with ``--baseline-python`` a server started by that interpreter (the
``webhook`` it has installed, e.g. an older checkout's venv) is counted too.

    .venv/bin/python bench/instructions.py                       # (b) 5 KB GPU pod /mutate
    .venv/bin/python bench/instructions.py --bare --compiled
    .venv/bin/python bench/instructions.py --bare --baseline-python /tmp/before/.venv/bin/python

One run takes about a minute per server (valgrind runs it ~50x slower). Repeated runs
of one tree agree within ~0.7%: the counts move with the audit writer's batches (one
per ~10 ms of wall time), not with the machine's load. ``--keep DIR`` keeps each
server's counts for ``callgrind_annotate``.
"""

from __future__ import annotations

import argparse
import http.client
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.server import (  # noqa: E402
    HOST,
    BareServer,
    Server,
    describe,
    gpu_pod,
    manifest,
    native_site,
    review,
    stop_all,
    webhook_origin,
)
from webhook.certs.files import ensure_dev_certificates  # noqa: E402

PATHS = {"mutate": "/mutate", "validate": "/validate"}


def callgrind(out: Path) -> list[str]:
    """The valgrind prefix: instruction counts only, every thread into one file."""
    return [
        "valgrind",
        "--tool=callgrind",
        f"--callgrind-out-file={out}",
        "--dump-instr=no",
        "--collect-systime=no",
    ]


class CountedServer(Server):
    """The webhook's server under callgrind."""

    def argv(self) -> list[str]:
        return [*callgrind(self.workdir / f"callgrind-{self.audit.stem}.out"), *super().argv()]


class CountedBare(BareServer):
    """The bare aiohttp handler under callgrind."""

    def argv(self) -> list[str]:
        return [*callgrind(self.workdir / "callgrind-bare.out"), *super().argv()]


def send(server: Server, path: str, body: bytes, count: int) -> None:
    """``count`` reviews, one after another, on one keep-alive connection."""
    connection = http.client.HTTPSConnection(
        HOST, server.port, context=server.context(), timeout=60
    )
    try:
        for _ in range(count):
            connection.request("POST", path, body, {"Content-Type": "application/json"})
            response = connection.getresponse()
            data = response.read()
            if response.status != 200:
                raise SystemExit(f"POST {path}: HTTP {response.status}: {data[:300]!r}")
    finally:
        connection.close()


def control(*args: str) -> None:
    subprocess.run(["callgrind_control", *args], check=True, capture_output=True, timeout=120)


def total_instructions(dump: Path) -> int:
    for line in dump.read_text().splitlines():
        if line.startswith(("summary:", "totals:")):
            return int(line.split()[1])
    raise SystemExit(f"{dump} holds no instruction total")


def count(
    server: Server, path: str, body: bytes, *, warmup: int, requests: int, keep: Path | None
) -> float:
    """Instructions per request of one server, started here and stopped before returning."""
    try:
        server.wait_ready(timeout=300)
        send(server, path, body, warmup)
        time.sleep(0.5)  # the audit writer's last batch of the warm-up
        pid = str(server.process.pid)
        control("-z", pid)
        send(server, path, body, requests)
        time.sleep(0.5)  # ... and of the counted requests, so that it is counted
        control("-d", pid)
        dumps = sorted(server.workdir.glob("callgrind-*.out.*"), key=lambda p: p.stat().st_mtime)
        if not dumps:
            raise SystemExit(f"callgrind wrote no dump:\n{server.log()}")
        instructions = total_instructions(dumps[-1])
        if keep is None:
            dumps[-1].unlink()
        else:
            keep.mkdir(parents=True, exist_ok=True)
            shutil.move(dumps[-1], keep / f"{server.audit.stem}.callgrind")
        return instructions / requests
    finally:
        server.stop()


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench/instructions.py", description=__doc__)
    parser.add_argument("--path", choices=sorted(PATHS), default="mutate")
    parser.add_argument("--requests", type=int, default=300, help="counted requests (300)")
    parser.add_argument("--warmup", type=int, default=100, help="requests before counting (100)")
    parser.add_argument("--bare", action="store_true", help="count the bare aiohttp handler too")
    parser.add_argument(
        "--compiled",
        action="store_true",
        help="count the image's wheel (the core compiled, hack/build-native) too",
    )
    parser.add_argument("--baseline-python", metavar="PYTHON", help="count its server too")
    parser.add_argument(
        "--keep",
        metavar="DIR",
        type=Path,
        help="keep each server's counts there (callgrind_annotate --inclusive=yes FILE)",
    )
    args = parser.parse_args(argv)
    if shutil.which("valgrind") is None or shutil.which("callgrind_control") is None:
        raise SystemExit("valgrind is not installed (apt-get install valgrind)")
    if not (1 <= args.requests <= 100_000 and 0 <= args.warmup <= 100_000):
        raise SystemExit("--requests must be in [1, 100000] and --warmup in [0, 100000]")
    path = PATHS[args.path]
    body = (
        review(gpu_pod(), "bench-gpu")
        if args.path == "mutate"
        else review(manifest("plain-pod.yaml"), "bench-plain")
    )
    # One string hash for every run: dict and set layouts, and so the work of lookups
    # that collide, would otherwise change from one server start to the next.
    os.environ["PYTHONHASHSEED"] = "0"
    rows: list[tuple[str, float]] = []
    try:
        with tempfile.TemporaryDirectory(prefix="gpushare-icount-") as tmp:
            workdir = Path(tmp)
            ensure_dev_certificates(workdir / "certs")
            print(
                f"{path}: {len(body):,} bytes a review, {args.requests} counted after {args.warmup}"
            )
            # Started one at a time: two under valgrind would share the cores.
            counted: list[tuple[str, Callable[[], Server]]] = []
            origin = describe(webhook_origin(None, workdir))
            if args.compiled:
                site = native_site()
                counted.append(
                    (
                        f"this checkout, compiled core (the image's wheel): {origin}",
                        lambda: CountedServer(workdir, name="compiled", cpus=None, site=site),
                    )
                )
            counted.append(
                (
                    f"this checkout, source: {origin}",
                    lambda: CountedServer(workdir, name="after", cpus=None),
                )
            )
            if args.baseline_python:
                origin = describe(webhook_origin(args.baseline_python, workdir))
                python = args.baseline_python
                counted.append(
                    (
                        f"baseline: {origin}",
                        lambda: CountedServer(workdir, name="before", cpus=None, python=python),
                    )
                )
            for label, start in counted:
                per_request = count(
                    start(), path, body, warmup=args.warmup, requests=args.requests, keep=args.keep
                )
                rows.append((label, per_request))
            if args.bare:
                # The bare handler answers the bytes of our real answer for that path.
                answer = workdir / "answer.json"
                probe = Server(workdir, name="probe", cpus=None)
                try:
                    probe.wait_ready()
                    answer.write_bytes(orjson.dumps(probe.post(path, body)))
                finally:
                    probe.stop()
                bare = CountedBare(workdir, cpus=None, responses={path: answer})
                rows.append(
                    (
                        "bare aiohttp handler",
                        count(
                            bare,
                            path,
                            body,
                            warmup=args.warmup,
                            requests=args.requests,
                            keep=args.keep,
                        ),
                    )
                )
    finally:
        stop_all()
    for label, per_request in rows:
        print(f"{per_request:12,.0f} instructions/request  {label}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
