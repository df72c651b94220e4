"""``gpushare-webhook verify``: does this GPU container get the memory cap it was given?

The webhook can inject every variable and mount right and still leave a node where
nothing is enforced: a HAMi-core build or driver version that hooks nothing, a
container command that drops ``LD_PRELOAD``, an MPS daemon without limits. Run inside a
container that went through the webhook, this reads the limits the mutation set,
asks the driver what it reports, then allocates until the driver refuses.

Limits, as the enforcers read them:

- vGPU (HAMi-core): ``CUDA_DEVICE_MEMORY_LIMIT_<i>``, else ``CUDA_DEVICE_MEMORY_LIMIT``;
  a number with suffix ``g``/``m``/``k`` (either case), bytes without one.
- MPS: ``CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=3000M,1=3000M`` (suffix ``M`` or ``G``).

A device is ``enforced`` when the driver refused an allocation before the process
held more than ``cap + max(5 %, 64 MiB)``. A working cap lets nothing through beyond
it: HAMi-core and MPS count the context against the cap, so a process gets a little
*less* than its cap (on an H100, 2,905 MiB of a 3,072 MiB MPS limit). A broken cap
lets through the whole card. So the margin only has to absorb what legitimately
differs between enforcers and their versions (rounding to 2 MiB pages, a limit rounded
up to an enforcer's own granularity, usage accounting that trails a burst of
allocations), which grows with the cap, hence a percentage with a floor. It stays far
below what a broken cap lets through: an unenforced 1 GiB slice is caught after
1,088 MiB, so the probe never fills an 80 GB card to say ``not enforced``.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, Literal, Protocol, TextIO

import orjson

from webhook.node.cuda import (
    CUDA_ERROR_NO_DEVICE,
    CUDA_ERROR_OUT_OF_MEMORY,
    DEFAULT_LIBRARY,
    LIBRARY_ENV,
    CudaError,
    Driver,
    LibraryError,
    MemInfo,
    library_path,
)

EXIT_ENFORCED: Final = 0
EXIT_NOT_ENFORCED: Final = 1
EXIT_CANNOT_RUN: Final = 2

MIB: Final = 1 << 20
TOLERANCE_PERCENT: Final = 5
TOLERANCE_MIN: Final = 64 * MIB
# The driver hands out device memory in 2 MiB pages: no finer step tells us anything.
GRANULE: Final = 2 * MIB
# Big enough that a 40 GiB cap takes ~160 calls, small enough to overshoot a 1 GiB cap
# by one step at most before halving.
FIRST_CHUNK: Final = 256 * MIB

VGPU_VARIABLE: Final = "CUDA_DEVICE_MEMORY_LIMIT"
VGPU_LIBRARY: Final = "libvgpu.so"
PRELOAD_FILE: Final = Path("/etc/ld.so.preload")
MPS_VARIABLE: Final = "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"

Verdict = Literal["enforced", "not enforced", "no limit set", "no GPU"]
ENFORCED: Final = "enforced"
NOT_ENFORCED: Final = "not enforced"
NO_LIMIT: Final = "no limit set"
NO_GPU: Final = "no GPU"

HELP: Final = "check, inside a GPU pod, that the memory cap the webhook set is enforced"
DESCRIPTION: Final = (
    "Run inside a container that went through the webhook. Reads the memory limits the "
    "mutation set (vGPU CUDA_DEVICE_MEMORY_LIMIT_<i>, MPS CUDA_MPS_PINNED_DEVICE_MEM_LIMIT), "
    "then allocates device memory through the CUDA driver until it is refused, and frees it. "
    f"Exit {EXIT_ENFORCED}: every device with a limit is enforced (refused by cap + "
    f"max({TOLERANCE_PERCENT}%, {TOLERANCE_MIN // MIB} MiB)); {EXIT_NOT_ENFORCED}: a limit is "
    f"not enforced, no limit is set or no GPU is visible; {EXIT_CANNOT_RUN}: cannot run "
    "(no driver library, CUDA initialisation failed, malformed limit)."
)


class VerifyError(Exception):
    """The check cannot run: one line for stderr, exit 2."""


# --- the limits the mutation set -------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Limit:
    """The cap one device is expected to have, and where it came from."""

    size: int  # bytes
    mode: Literal["vgpu", "mps"]
    variable: str
    value: str

    @property
    def mib(self) -> int:
        return self.size // MIB

    @property
    def tolerance(self) -> int:
        return tolerance(self.size)


def tolerance(cap: int) -> int:
    """How far past ``cap`` (bytes) a process may allocate and still count as capped."""
    return max(cap * TOLERANCE_PERCENT // 100, TOLERANCE_MIN)


# HAMi-core reads the number with strtoul(base 0): a leading 0 means octal, 0x hex. We
# accept decimal and hex, and refuse what HAMi-core would read differently from a person
# (octal, trailing text it silently drops, whitespace that hides the suffix).
_HAMI_VALUE: Final = re.compile(r"(?P<number>0[xX][0-9a-fA-F]+|0|[1-9][0-9]*)(?P<suffix>[gGmMkK]?)")
_HAMI_SCALE: Final = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
_ULONG_MAX: Final = (1 << 64) - 1

_MPS_ENTRY: Final = re.compile(r"(?P<index>[0-9]+)=(?P<number>[0-9]+)(?P<suffix>[MG])")
_MPS_SCALE: Final = {"M": 1 << 20, "G": 1 << 30}
_VGPU_INDEXED: Final = re.compile(re.escape(VGPU_VARIABLE) + r"_(?P<index>[0-9]+)")


@dataclass(frozen=True, slots=True)
class _HamiValue:
    size: int | None  # bytes; None: no cap (HAMi-core's "-1")


def _parse_hami(variable: str, value: str) -> _HamiValue | None:
    """What HAMi-core makes of ``variable=value``; None when it falls back to the next one."""
    if value == "":
        return None
    if value == "-1":
        # strtoul turns -1 into ULONG_MAX: a cap no card reaches.
        return _HamiValue(None)
    match = _HAMI_VALUE.fullmatch(value)
    if match is None:
        hint = " (HAMi-core reads a leading 0 as octal)" if value[:1] == "0" else ""
        raise VerifyError(
            f"{variable}={value!r} is not a memory limit HAMi-core reads as meant: "
            f"write <digits> with an optional g, m or k suffix (no suffix: bytes){hint}"
        )
    number = int(match["number"], 0)
    scaled = number * _HAMI_SCALE[match["suffix"].lower()]
    if scaled > _ULONG_MAX:
        raise VerifyError(f"{variable}={value!r} overflows 64 bits: HAMi-core ignores it")
    if scaled == 0:
        # HAMi-core logs "invalid device memory limit" and tries the next variable.
        return None
    return _HamiValue(scaled)


def _parse_mps(value: str) -> dict[int, Limit]:
    limits: dict[int, Limit] = {}
    if value == "":
        return limits
    for entry in value.split(","):
        match = _MPS_ENTRY.fullmatch(entry)
        if match is None:
            raise VerifyError(
                f"{MPS_VARIABLE}={value!r}: {entry!r} is not <device>=<number>M or "
                "<device>=<number>G (e.g. 0=3000M,1=3000M)"
            )
        index = int(match["index"])
        size = int(match["number"]) * _MPS_SCALE[match["suffix"]]
        if index in limits:
            raise VerifyError(f"{MPS_VARIABLE}={value!r} names device {index} twice")
        if size == 0:
            raise VerifyError(f"{MPS_VARIABLE}={value!r} gives device {index} no memory")
        limits[index] = Limit(size, "mps", MPS_VARIABLE, entry)
    return limits


@dataclass(frozen=True, slots=True)
class Limits:
    """Every memory limit of this container's environment, validated."""

    vgpu_default: Limit | None = None
    # An index mapped to None has an explicit "-1": no cap, no fallback.
    vgpu: Mapping[int, Limit | None] = field(default_factory=dict)
    mps: Mapping[int, Limit] = field(default_factory=dict)

    @property
    def named(self) -> frozenset[int]:
        """Device indexes a variable names explicitly."""
        return frozenset(self.vgpu) | frozenset(self.mps)

    def for_device(self, index: int) -> Limit | None:
        """The cap device ``index`` should have: the tighter one if both modes set one."""
        vgpu = self.vgpu.get(index, self.vgpu_default)  # an explicit None ("-1") stays None
        mps = self.mps.get(index)
        candidates = [limit for limit in (vgpu, mps) if limit is not None]
        return min(candidates, key=lambda limit: limit.size, default=None)


def parse_limits(environ: Mapping[str, str]) -> Limits:
    """The memory limits in ``environ``; :class:`VerifyError` names a malformed one."""
    default = None
    if VGPU_VARIABLE in environ:
        parsed = _parse_hami(VGPU_VARIABLE, environ[VGPU_VARIABLE])
        if parsed is not None and parsed.size is not None:
            default = Limit(parsed.size, "vgpu", VGPU_VARIABLE, environ[VGPU_VARIABLE])
    vgpu: dict[int, Limit | None] = {}
    for variable, value in environ.items():
        match = _VGPU_INDEXED.fullmatch(variable)
        if match is None:
            continue
        parsed = _parse_hami(variable, value)
        if parsed is None:
            continue  # HAMi-core falls back to CUDA_DEVICE_MEMORY_LIMIT
        index = int(match["index"])
        vgpu[index] = None if parsed.size is None else Limit(parsed.size, "vgpu", variable, value)
    return Limits(default, vgpu, _parse_mps(environ.get(MPS_VARIABLE, "")))


# --- the probe -------------------------------------------------------------------------


class Memory(Protocol):
    def alloc(self, size: int) -> int: ...
    def free(self, pointer: int) -> None: ...


@dataclass(frozen=True, slots=True)
class Probe:
    """How much one context could allocate, and why it stopped."""

    allocated: int
    refused: bool  # False: it stopped on its own, past the ceiling


def probe(memory: Memory, ceiling: int) -> Probe:
    """Allocate until the driver refuses or the total passes ``ceiling``; free it all.

    Chunks start large and halve on each refusal down to one page, so the total is
    within a page of what the driver allows, in a few hundred calls at most.
    """
    pointers: list[int] = []
    allocated = 0
    chunk = FIRST_CHUNK
    refused = False
    try:
        while allocated <= ceiling:
            # Never step further past the ceiling than one page: that is proof enough.
            size = min(chunk, ceiling + GRANULE - allocated)
            try:
                pointers.append(memory.alloc(size))
            except CudaError as exc:
                if exc.code != CUDA_ERROR_OUT_OF_MEMORY:
                    raise
                if chunk <= GRANULE:
                    refused = True
                    break
                chunk //= 2
                continue
            allocated += size
    finally:
        failure: CudaError | None = None
        for pointer in reversed(pointers):
            try:
                memory.free(pointer)
            except CudaError as exc:
                failure = failure or exc
        if failure is not None:
            raise failure
    return Probe(allocated, refused)


# --- verdicts --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DeviceReport:
    index: int
    name: str | None
    limit: Limit | None
    memory: MemInfo | None
    probe: Probe | None
    verdict: Verdict
    notes: tuple[str, ...] = ()


def preload_sources(
    environ: Mapping[str, str], preload_file: Path = PRELOAD_FILE
) -> tuple[str, ...]:
    """Where this process preloads HAMi-core from: ``LD_PRELOAD``, the preload file, both or neither."""
    sources = []
    if VGPU_LIBRARY in environ.get("LD_PRELOAD", ""):
        sources.append("LD_PRELOAD")
    try:
        if VGPU_LIBRARY in preload_file.read_text("utf-8", "replace"):
            sources.append(str(preload_file))
    except OSError:
        pass  # no preload file: the common case with `preload: env`
    return tuple(sources)


def _why_not(limit: Limit, memory: MemInfo, preloaded: Sequence[str]) -> str:
    if limit.mode == "mps":
        return (
            "the MPS server did not stop the allocation: either this process is not an MPS "
            "client (no daemon behind CUDA_MPS_PIPE_DIRECTORY, or no hostIPC) or the daemon "
            "sets no limit; client env can only lower a limit the daemon enforces"
        )
    if not preloaded:
        return (
            f"nothing preloads HAMi-core in this process (LD_PRELOAD does not name "
            f"{VGPU_LIBRARY} and {PRELOAD_FILE} is absent): the container's command or image "
            "dropped LD_PRELOAD; the policy's `preload: file` survives that"
        )
    how = " and ".join(preloaded)
    if memory.total > limit.size + limit.tolerance:
        return (
            f"HAMi-core is preloaded ({how}) but hooks nothing: the driver reports the whole "
            f"card ({memory.total // MIB:,} MiB) where HAMi-core reports the cap; a HAMi-core "
            "build or version that does not hook this driver's CUDA version"
        )
    return (
        f"HAMi-core is preloaded ({how}) and reports the cap, but its allocation hooks are "
        "not in effect: a HAMi-core version that does not hook this driver's allocation calls"
    )


def judge(
    limit: Limit, memory: MemInfo, result: Probe, preloaded: Sequence[str] = ()
) -> tuple[Verdict, tuple[str, ...]]:
    """The verdict on one device whose cap is ``limit``, with what it means."""
    ceiling = limit.size + limit.tolerance
    if result.allocated > ceiling:
        return NOT_ENFORCED, (
            f"got past the cap and its margin ({ceiling // MIB:,} MiB); the probe stopped "
            "there rather than fill the card",
            _why_not(limit, memory, preloaded),
        )
    if memory.total > ceiling:
        if limit.mode == "vgpu":
            # Active HAMi-core reports min(cap, card) as the total. A whole-card total
            # with an early refusal is a card that other processes filled.
            return NOT_ENFORCED, (
                "the driver refused before the cap only because the card is full: other "
                "processes hold its memory",
                _why_not(limit, memory, preloaded),
            )
        return ENFORCED, (
            f"the driver reports {memory.total // MIB:,} MiB total, not the cap: a GPU that "
            "other processes filled would stop the probe too; run again on an idle GPU "
            "to be sure",
        )
    if memory.total + limit.tolerance < limit.size:
        return ENFORCED, (
            f"the driver reports {memory.total // MIB:,} MiB total, less than the cap: a "
            "smaller limit is in force (HAMi-core keeps the limits of the container's first "
            "CUDA process in its shared cache file) or the card is smaller than the cap",
        )
    return ENFORCED, ()


@dataclass(frozen=True, slots=True)
class Report:
    library: str
    driver_version: int | None
    devices: tuple[DeviceReport, ...]
    preloaded: tuple[str, ...] = ()

    @property
    def result(self) -> Verdict:
        limited = [d for d in self.devices if d.limit is not None]
        if not any(d.memory is not None for d in self.devices):
            return NO_GPU
        if not limited:
            return NO_LIMIT
        if all(d.verdict == ENFORCED for d in limited):
            return ENFORCED
        return NOT_ENFORCED

    @property
    def exit_code(self) -> int:
        # A container with no limit at all proves nothing: it did not go through the
        # vGPU or MPS mutation, so the check fails rather than passing vacuously.
        return EXIT_ENFORCED if self.result == ENFORCED else EXIT_NOT_ENFORCED


def _device_report(
    driver: Driver, index: int, limit: Limit | None, preloaded: Sequence[str]
) -> DeviceReport:
    device = driver.device(index)
    name = driver.device_name(device)
    with driver.primary_context(device):
        memory = driver.mem_info()
        if limit is None:
            # Nothing to compare with: filling the card would prove nothing.
            return DeviceReport(index, name, None, memory, None, NO_LIMIT)
        result = probe(driver, limit.size + limit.tolerance)
    verdict, notes = judge(limit, memory, result, preloaded)
    return DeviceReport(index, name, limit, memory, result, verdict, notes)


def check(driver: Driver, limits: Limits, preloaded: Sequence[str] = ()) -> Report:
    """Probe every visible device of ``driver`` against ``limits``.

    ``preloaded`` (from :func:`preload_sources`) only explains a verdict, never decides it.
    """
    try:
        driver.init()
    except CudaError as exc:
        if exc.code != CUDA_ERROR_NO_DEVICE:
            raise VerifyError(f"cannot initialise CUDA through {driver.path}: {exc}") from None
        count, version = 0, None
    else:
        try:
            version = driver.driver_version()
            count = driver.device_count()
        except CudaError as exc:
            raise VerifyError(f"{driver.path}: {exc}") from None
    devices: list[DeviceReport] = []
    for index in range(count):
        try:
            devices.append(_device_report(driver, index, limits.for_device(index), preloaded))
        except CudaError as exc:
            raise VerifyError(f"GPU {index}: {exc}") from None
    # A limit for a device the container cannot see: it asked for more GPUs than it got.
    missing = sorted(i for i in limits.named if i >= count) or ([0] if count == 0 else [])
    for index in missing:
        devices.append(DeviceReport(index, None, limits.for_device(index), None, None, NO_GPU))
    return Report(driver.path, version, tuple(devices), tuple(preloaded))


# --- output ----------------------------------------------------------------------------


def to_json(report: Report) -> dict[str, Any]:
    """The ``-o json`` document; every size is in MiB, rounded down."""
    version = report.driver_version
    return {
        "library": report.library,
        "driverCudaVersion": None
        if version is None
        else f"{version // 1000}.{version % 1000 // 10}",
        "tolerance": {"percent": TOLERANCE_PERCENT, "minimumMiB": TOLERANCE_MIN // MIB},
        "vgpuPreload": list(report.preloaded),
        "result": report.result,
        "exitCode": report.exit_code,
        "devices": [
            {
                "index": d.index,
                "name": d.name,
                "expectedMiB": None if d.limit is None else d.limit.mib,
                "limit": None
                if d.limit is None
                else {"mode": d.limit.mode, "variable": d.limit.variable, "value": d.limit.value},
                "toleranceMiB": None if d.limit is None else d.limit.tolerance // MIB,
                "totalMiB": None if d.memory is None else d.memory.total // MIB,
                "freeMiB": None if d.memory is None else d.memory.free // MIB,
                "allocatedMiB": None if d.probe is None else d.probe.allocated // MIB,
                "stopped": None
                if d.probe is None
                else ("refused" if d.probe.refused else "past the cap"),
                "verdict": d.verdict,
                "notes": list(d.notes),
            }
            for d in report.devices
        ],
    }


_SUMMARY: Final[Mapping[Verdict, str]] = {
    ENFORCED: "every device with a limit refused memory past its cap",
    NOT_ENFORCED: "a memory cap is NOT enforced in this container (see the notes, and "
    "docs/verify.md in the project)",
    NO_LIMIT: "no memory limit in this container's environment: it did not go through the "
    "webhook's vGPU or MPS mutation (MIG and plain pods have none)",
    NO_GPU: "no GPU is visible in this container",
}


def render_text(report: Report) -> str:
    document = to_json(report)
    version = document["driverCudaVersion"]
    lines = [
        f"library   {report.library}" + (f" (CUDA {version})" if version else ""),
        f"tolerance cap + max({TOLERANCE_PERCENT}%, {TOLERANCE_MIN // MIB} MiB)",
    ]
    for device, d in zip(report.devices, document["devices"], strict=True):
        lines.append("")
        lines.append(f"GPU {d['index']}" + (f"  {d['name']}" if d["name"] else ""))
        if device.limit is not None:
            lines.append(
                f"  expected   {d['expectedMiB']:,} MiB"
                f"  ({device.limit.variable}: {device.limit.value}, {device.limit.mode})"
            )
        if device.memory is not None:
            lines.append(f"  driver     {d['totalMiB']:,} MiB total, {d['freeMiB']:,} MiB free")
        if device.probe is not None:
            how = (
                "then the driver refused"
                if device.probe.refused
                else "and still going: stopped past the cap"
            )
            lines.append(f"  allocated  {d['allocatedMiB']:,} MiB, {how}")
        lines.append(f"  verdict    {device.verdict}")
        lines.extend(f"  note       {note}" for note in device.notes)
    lines.append("")
    lines.append(f"result: {report.result} (exit {report.exit_code}): {_SUMMARY[report.result]}")
    return "\n".join(lines) + "\n"


# --- command line ----------------------------------------------------------------------


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Add the ``verify`` arguments to ``parser`` (a subcommand of the CLI)."""
    parser.description = DESCRIPTION
    parser.add_argument("-o", "--output", choices=["text", "json"], default="text")
    parser.add_argument(
        "--library",
        help=f"CUDA driver library to load (default: ${LIBRARY_ENV}, else {DEFAULT_LIBRARY})",
    )
    # The CLI calls handler(args, stdin, stdout), as for its other subcommands.
    parser.set_defaults(handler=lambda args, _stdin, stdout: run(args, stdout=stdout))


def run(
    args: argparse.Namespace, *, stdout: TextIO | None = None, stderr: TextIO | None = None
) -> int:
    """Run the check for parsed ``args``; the exit status."""
    out = sys.stdout if stdout is None else stdout
    err = sys.stderr if stderr is None else stderr
    try:
        limits = parse_limits(os.environ)
        try:
            driver = Driver(library_path(args.library, os.environ))
        except LibraryError as exc:
            raise VerifyError(
                f"{exc} (is this a GPU container? it needs the NVIDIA driver library, "
                "which the NVIDIA container runtime mounts for pods that request a GPU)"
            ) from None
        report = check(driver, limits, preload_sources(os.environ))
    except VerifyError as exc:
        err.write(f"gpushare-webhook verify: {exc}\n")
        return EXIT_CANNOT_RUN
    if args.output == "json":
        out.write(orjson.dumps(to_json(report), option=orjson.OPT_INDENT_2).decode() + "\n")
    else:
        out.write(render_text(report))
    return report.exit_code


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="gpushare-webhook verify")
    add_arguments(parser)
    return run(parser.parse_args(argv))


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
