"""``gpushare-webhook report`` over big audit logs: throughput, and memory that does not grow.

Builds audit logs of the given sizes from the lines of ``tests/audit/rollout.jsonl``
(records with violations, and as many clean records as ``--clean`` says, each clean
one repeated with a new uid so no line is a copy), then runs the real command on
each, plain and gzip'd, in a child process, and prints wall time, MB/s, records/s
and the child's peak RSS. Streaming shows as a peak RSS that stays flat while the
log grows.

    .venv/bin/python bench/report.py [--sizes 50,200] [--clean 0.9] [--gzip]
"""

from __future__ import annotations

import argparse
import gzip
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import orjson

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "tests" / "audit" / "rollout.jsonl"


def build_log(path: Path, *, megabytes: int, clean_share: float) -> int:
    records = [orjson.loads(line) for line in EXAMPLE.read_bytes().splitlines()]
    found = [r for r in records if r["violations"]]
    clean = [r for r in records if not r["violations"]]
    target = megabytes << 20
    written = count = 0
    with path.open("wb") as out:
        while written < target:
            lines = []
            for _ in range(1000):
                clean_one = (count % 100) < clean_share * 100
                pool = clean if clean_one else found
                record = dict(pool[count % len(pool)])
                record["auditID"] = f"{count:036d}"
                lines.append(orjson.dumps(record, option=orjson.OPT_APPEND_NEWLINE))
                count += 1
            chunk = b"".join(lines)
            out.write(chunk)
            written += len(chunk)
    return count


def run_report(path: Path) -> tuple[float, float, int]:
    """Wall seconds, CPU seconds and peak RSS (KiB) of one report run in a child."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    subprocess.run(
        [sys.executable, "-m", "webhook", "report", "--audit-log", str(path), "-o", "json"],
        check=True,
        stdout=subprocess.DEVNULL,
        cwd=ROOT,
    )
    wall = time.perf_counter() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    # ru_maxrss of children is the largest of any child so far: runs go smallest first.
    return wall, cpu, after.ru_maxrss


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="50,200", help="log sizes in MB, comma-separated")
    parser.add_argument(
        "--clean", type=float, default=0.9, help="share of records without violations"
    )
    parser.add_argument("--gzip", action="store_true", help="also run on the gzip'd logs")
    args = parser.parse_args()
    sizes = sorted(int(size) for size in args.sizes.split(","))
    print(
        f"{'log':>14} {'MB':>7} {'records':>10} {'wall s':>7} {'cpu s':>7} {'MB/s':>6} {'krec/s':>7} {'peak RSS MB':>11}"
    )
    with tempfile.TemporaryDirectory() as directory:
        for size in sizes:
            path = Path(directory) / f"audit-{size}.log"
            count = build_log(path, megabytes=size, clean_share=args.clean)
            variants = [("plain", path)]
            if args.gzip:
                packed = path.with_suffix(".log.gz")
                with path.open("rb") as source, gzip.open(packed, "wb", compresslevel=6) as sink:
                    while chunk := source.read(1 << 20):
                        sink.write(chunk)
                variants.append(("gzip", packed))
            megabytes = os.path.getsize(path) / (1 << 20)
            for label, file in variants:
                wall, cpu, peak = run_report(file)
                print(
                    f"{label + ' ' + str(size) + ' MB':>14} {megabytes:7.0f} {count:10d} {wall:7.2f} "
                    f"{cpu:7.2f} {megabytes / wall:6.0f} {count / wall / 1000:7.0f} {peak / 1024:11.1f}"
                )
            path.unlink()
    return 0


if __name__ == "__main__":
    sys.exit(main())
