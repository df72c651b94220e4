"""``verify`` end to end on a stand-in driver library, and its pure parts on their own."""

from __future__ import annotations

import io
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.node.conftest import Stub
from webhook.cli import build_parser
from webhook.node.cuda import MemInfo
from webhook.node.verify import (
    ENFORCED,
    NO_GPU,
    NO_LIMIT,
    NOT_ENFORCED,
    Limit,
    Probe,
    VerifyError,
    judge,
    main,
    parse_limits,
    preload_sources,
    tolerance,
)

ROOT = Path(__file__).resolve().parent.parent.parent
MIB = 1 << 20
GIB = 1 << 30


def verify(
    capsys: pytest.CaptureFixture[str], stub: Stub, *args: str
) -> tuple[int, dict[str, Any]]:
    """Exit status and JSON document of ``verify -o json`` on the stub."""
    code = main(["-o", "json", "--library", str(stub.path), *args])
    out, err = capsys.readouterr()
    assert err == ""
    document: dict[str, Any] = orjson.loads(out)
    stub.assert_clean()
    return code, document


def failure(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """The one stderr line of a run that cannot run (exit 2, nothing on stdout)."""
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == ""
    assert err.endswith("\n")
    assert err.count("\n") == 1
    assert "Traceback" not in err
    return err.rstrip("\n")


# --- limits as HAMi-core and MPS read them ---------------------------------------------


@pytest.mark.parametrize(
    ("value", "size"),
    [
        ("1024m", 1024 * MIB),
        ("1024M", 1024 * MIB),
        ("3g", 3 * GIB),
        ("3G", 3 * GIB),
        ("2048k", 2 * MIB),
        ("1073741824", GIB),  # no suffix: bytes
        ("0x40000000", GIB),  # strtoul base 0 reads hex
        ("0x400m", 1024 * MIB),
    ],
)
def test_vgpu_limit_values(value: str, size: int) -> None:
    limit = parse_limits({"CUDA_DEVICE_MEMORY_LIMIT_0": value}).for_device(0)
    assert limit == Limit(size, "vgpu", "CUDA_DEVICE_MEMORY_LIMIT_0", value)


def test_indexed_vgpu_limit_beats_the_default_which_covers_the_rest() -> None:
    limits = parse_limits(
        {"CUDA_DEVICE_MEMORY_LIMIT_0": "3000m", "CUDA_DEVICE_MEMORY_LIMIT": "80g"}
    )
    first, second = limits.for_device(0), limits.for_device(1)
    assert first is not None and (first.mib, first.variable) == (3000, "CUDA_DEVICE_MEMORY_LIMIT_0")
    assert second is not None and (second.mib, second.variable) == (
        81920,
        "CUDA_DEVICE_MEMORY_LIMIT",
    )
    assert limits.named == {0}


@pytest.mark.parametrize("value", ["", "0", "0m"])
def test_a_zero_or_empty_indexed_limit_falls_back_like_hami_core(value: str) -> None:
    limits = parse_limits({"CUDA_DEVICE_MEMORY_LIMIT_0": value, "CUDA_DEVICE_MEMORY_LIMIT": "2g"})
    limit = limits.for_device(0)
    assert limit is not None and limit.variable == "CUDA_DEVICE_MEMORY_LIMIT"


def test_minus_one_means_no_limit_and_no_fallback() -> None:
    limits = parse_limits({"CUDA_DEVICE_MEMORY_LIMIT_0": "-1", "CUDA_DEVICE_MEMORY_LIMIT": "2g"})
    assert limits.for_device(0) is None
    assert limits.for_device(1) is not None


def test_no_limit_variables_means_no_limit() -> None:
    limits = parse_limits({"PATH": "/usr/bin", "CUDA_DEVICE_MEMORY_LIMIT_X": "1g"})
    assert limits.for_device(0) is None
    assert limits.named == frozenset()


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("abc", "optional g, m or k suffix"),
        ("3000xyz", "optional g, m or k suffix"),  # HAMi-core would read 3000 bytes
        ("3000m ", "optional g, m or k suffix"),  # the space hides the suffix from HAMi-core
        ("3,000m", "optional g, m or k suffix"),
        ("1.5g", "optional g, m or k suffix"),
        ("-5m", "optional g, m or k suffix"),
        ("0100m", "leading 0 as octal"),
        ("99999999999999999999g", "overflows 64 bits"),
    ],
)
def test_malformed_vgpu_limits_are_refused(value: str, reason: str) -> None:
    with pytest.raises(VerifyError) as caught:
        parse_limits({"CUDA_DEVICE_MEMORY_LIMIT_1": value})
    assert str(caught.value).startswith(f"CUDA_DEVICE_MEMORY_LIMIT_1={value!r} ")
    assert reason in str(caught.value)


def test_malformed_default_vgpu_limit_is_refused() -> None:
    with pytest.raises(VerifyError, match=r"^CUDA_DEVICE_MEMORY_LIMIT='3 GiB' "):
        parse_limits({"CUDA_DEVICE_MEMORY_LIMIT": "3 GiB"})


def test_mps_limits_per_device() -> None:
    limits = parse_limits({"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=3000M,1=3G"})
    first, second = limits.for_device(0), limits.for_device(1)
    assert first == Limit(3000 * MIB, "mps", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=3000M")
    assert second is not None and second.mib == 3072
    assert limits.for_device(2) is None
    assert limits.named == {0, 1}


@pytest.mark.parametrize(
    ("value", "reason"),
    [
        ("3000M", "is not <device>=<number>M"),
        ("0=3000", "is not <device>=<number>M"),
        ("0=3000m", "is not <device>=<number>M"),
        ("0=3000MB", "is not <device>=<number>M"),
        ("0=3000M,", "is not <device>=<number>M"),
        ("0=3000M,0=1000M", "names device 0 twice"),
        ("0=0M", "gives device 0 no memory"),
    ],
)
def test_malformed_mps_limits_are_refused(value: str, reason: str) -> None:
    with pytest.raises(VerifyError) as caught:
        parse_limits({"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": value})
    assert str(caught.value).startswith(f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT={value!r}")
    assert reason in str(caught.value)


def test_the_tighter_limit_wins_when_both_modes_set_one() -> None:
    limits = parse_limits(
        {"CUDA_DEVICE_MEMORY_LIMIT_0": "2048m", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT": "0=1024M"}
    )
    limit = limits.for_device(0)
    assert limit is not None and (limit.mode, limit.mib) == ("mps", 1024)


@pytest.mark.parametrize(
    ("cap_mib", "tolerance_mib"),
    [(256, 64), (1024, 64), (1280, 64), (1300, 65), (3000, 150), (81920, 4096)],
)
def test_tolerance_is_five_percent_but_at_least_64_mib(cap_mib: int, tolerance_mib: int) -> None:
    assert tolerance(cap_mib * MIB) == tolerance_mib * MIB


# --- verdicts --------------------------------------------------------------------------

VGPU_1G = Limit(1024 * MIB, "vgpu", "CUDA_DEVICE_MEMORY_LIMIT_0", "1024m")
MPS_1G = Limit(1024 * MIB, "mps", "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT", "0=1024M")
CEILING = (1024 + 64) * MIB
CAPPED = MemInfo(free=900 * MIB, total=1024 * MIB)
WHOLE_CARD = MemInfo(free=900 * MIB, total=81079 * MIB)


def test_allocating_up_to_cap_plus_margin_is_enforced_one_byte_more_is_not() -> None:
    assert judge(VGPU_1G, CAPPED, Probe(CEILING, refused=True)) == (ENFORCED, ())
    verdict, notes = judge(VGPU_1G, CAPPED, Probe(CEILING + 1, refused=False))
    assert verdict == NOT_ENFORCED
    assert "got past the cap and its margin (1,088 MiB)" in notes[0]


def test_vgpu_whole_card_total_with_an_early_refusal_is_a_full_card_not_a_cap() -> None:
    verdict, notes = judge(VGPU_1G, WHOLE_CARD, Probe(900 * MIB, refused=True), ("LD_PRELOAD",))
    assert verdict == NOT_ENFORCED
    assert "card is full" in notes[0]
    assert "HAMi-core is preloaded (LD_PRELOAD) but hooks nothing" in notes[1]
    assert "81,079 MiB" in notes[1]


def test_mps_whole_card_total_with_a_refusal_is_enforced_with_a_caveat() -> None:
    verdict, notes = judge(MPS_1G, WHOLE_CARD, Probe(900 * MIB, refused=True))
    assert verdict == ENFORCED
    assert "run again on an idle GPU" in notes[0]


def test_a_smaller_limit_in_force_is_enforced_and_said() -> None:
    smaller = MemInfo(free=400 * MIB, total=512 * MIB)
    verdict, notes = judge(VGPU_1G, smaller, Probe(400 * MIB, refused=True))
    assert verdict == ENFORCED
    assert "less than the cap" in notes[0]


@pytest.mark.parametrize(
    ("limit", "memory", "preloaded", "reason"),
    [
        (VGPU_1G, WHOLE_CARD, (), "nothing preloads HAMi-core in this process"),
        (VGPU_1G, WHOLE_CARD, ("/etc/ld.so.preload",), "hooks nothing"),
        (VGPU_1G, CAPPED, ("LD_PRELOAD",), "its allocation hooks are not in effect"),
        (MPS_1G, WHOLE_CARD, (), "client env can only lower a limit the daemon enforces"),
    ],
)
def test_not_enforced_says_why(
    limit: Limit, memory: MemInfo, preloaded: tuple[str, ...], reason: str
) -> None:
    verdict, notes = judge(limit, memory, Probe(CEILING + 2 * MIB, refused=False), preloaded)
    assert verdict == NOT_ENFORCED
    assert reason in notes[1]


def test_preload_sources(tmp_path: Path) -> None:
    preload = tmp_path / "ld.so.preload"
    assert preload_sources({}, preload) == ()
    assert preload_sources({"LD_PRELOAD": "/opt/other.so"}, preload) == ()
    env = {"LD_PRELOAD": "/usr/local/vgpu/libvgpu.so:/opt/other.so"}
    assert preload_sources(env, preload) == ("LD_PRELOAD",)
    preload.write_text("/usr/local/vgpu/libvgpu.so\n")
    assert preload_sources(env, preload) == ("LD_PRELOAD", str(preload))
    assert preload_sources({}, preload) == (str(preload),)


# --- the whole check on the stand-in driver ---------------------------------------------


def test_enforced_vgpu_cap(capsys: pytest.CaptureFixture[str], stub: Stub) -> None:
    # HAMi-core counts the context against the cap: the process gets a bit less.
    stub.set(CUDA_DEVICE_MEMORY_LIMIT_0="1024m", STUB_CUDA_CAP_MIB=1024, STUB_CUDA_CONTEXT_MIB=187)
    code, document = verify(capsys, stub)
    assert code == 0
    assert (document["result"], document["exitCode"]) == (ENFORCED, 0)
    [device] = document["devices"]
    assert device["verdict"] == ENFORCED
    assert (device["expectedMiB"], device["totalMiB"], device["freeMiB"]) == (1024, 1024, 837)
    # Within one 2 MiB page of what the cap leaves.
    assert (device["allocatedMiB"], device["stopped"]) == (836, "refused")
    assert device["notes"] == []


def test_unenforced_cap_is_caught_without_filling_the_card(
    capsys: pytest.CaptureFixture[str], stub: Stub
) -> None:
    # No cap in the library: what a HAMi-core build that hooks nothing looks like.
    stub.set(CUDA_DEVICE_MEMORY_LIMIT_0="1024m")
    code, document = verify(capsys, stub)
    assert code == 1
    assert document["result"] == NOT_ENFORCED
    [device] = document["devices"]
    assert device["verdict"] == NOT_ENFORCED
    assert device["totalMiB"] == 81079
    assert device["stopped"] == "past the cap"
    assert 1088 < device["allocatedMiB"] <= 1090
    assert stub.alloc_calls() <= 6


def test_no_limit_set_probes_nothing(capsys: pytest.CaptureFixture[str], stub: Stub) -> None:
    code, document = verify(capsys, stub)
    assert code == 1
    assert document["result"] == NO_LIMIT
    [device] = document["devices"]
    assert (device["verdict"], device["expectedMiB"], device["limit"]) == (NO_LIMIT, None, None)
    assert (device["totalMiB"], device["allocatedMiB"], device["stopped"]) == (81079, None, None)
    assert stub.alloc_calls() == 0


@pytest.mark.parametrize(("cap_mib", "allocated_mib"), [(1000, 1000), (1023, 1022), (2, 2)])
def test_probe_finds_the_cap_to_one_page(
    capsys: pytest.CaptureFixture[str], stub: Stub, cap_mib: int, allocated_mib: int
) -> None:
    stub.set(CUDA_DEVICE_MEMORY_LIMIT_0=f"{cap_mib}m", STUB_CUDA_CAP_MIB=cap_mib)
    code, document = verify(capsys, stub)
    assert code == 0
    assert document["devices"][0]["allocatedMiB"] == allocated_mib


def test_a_large_cap_takes_a_bounded_number_of_calls(
    capsys: pytest.CaptureFixture[str], stub: Stub
) -> None:
    stub.set(CUDA_DEVICE_MEMORY_LIMIT_0="40000m", STUB_CUDA_CAP_MIB=40000)
    code, document = verify(capsys, stub)
    assert code == 0
    assert document["devices"][0]["allocatedMiB"] == 40000
    assert stub.alloc_calls() < 40000 // 256 + 16


def test_malformed_limit_env_cannot_run(capsys: pytest.CaptureFixture[str], stub: Stub) -> None:
    stub.set(CUDA_DEVICE_MEMORY_LIMIT_0="3000xyz", STUB_CUDA_CAP_MIB=3000)
    line = failure(capsys, ["--library", str(stub.path)])
    assert line.startswith("gpushare-webhook verify: CUDA_DEVICE_MEMORY_LIMIT_0='3000xyz' ")
    # Refused before the driver is touched.
    assert stub.init_calls() == 0


def test_malformed_mps_env_cannot_run(capsys: pytest.CaptureFixture[str], stub: Stub) -> None:
    stub.set(CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="0=3000MiB")
    line = failure(capsys, ["-o", "json", "--library", str(stub.path)])
    assert "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT='0=3000MiB'" in line


def test_init_failure_cannot_run(capsys: pytest.CaptureFixture[str], stub: Stub) -> None:
    stub.set(CUDA_DEVICE_MEMORY_LIMIT_0="1024m", STUB_CUDA_INIT_ERROR=35)
    line = failure(capsys, ["--library", str(stub.path)])
    assert line == (
        f"gpushare-webhook verify: cannot initialise CUDA through {stub.path}: "
        "cuInit failed: CUDA_ERROR_INSUFFICIENT_DRIVER (35)"
    )


def test_missing_library_cannot_run(capsys: pytest.CaptureFixture[str], stub: Stub) -> None:
    line = failure(capsys, ["--library", "/nonexistent/libcuda.so.1"])
    assert line.startswith("gpushare-webhook verify: cannot load /nonexistent/libcuda.so.1: ")
    assert "is this a GPU container?" in line


def test_a_failing_allocation_other_than_oom_cannot_run_and_frees_nothing_twice(
    capsys: pytest.CaptureFixture[str], stub: Stub
) -> None:
    stub.set(CUDA_DEVICE_MEMORY_LIMIT_0="1024m", STUB_CUDA_ALLOC_ERROR=1)
    line = failure(capsys, ["--library", str(stub.path)])
    assert line == (
        "gpushare-webhook verify: GPU 0: cuMemAlloc_v2 failed: CUDA_ERROR_INVALID_VALUE (1)"
    )
    stub.assert_clean()


def test_library_from_the_environment(capsys: pytest.CaptureFixture[str], stub: Stub) -> None:
    stub.set(GPUSHARE_VERIFY_LIBCUDA=str(stub.path), CUDA_DEVICE_MEMORY_LIMIT_0="512m")
    stub.set(STUB_CUDA_CAP_MIB=512)
    assert main(["-o", "json"]) == 0
    assert orjson.loads(capsys.readouterr().out)["library"] == str(stub.path)


def test_no_device_is_no_gpu(capsys: pytest.CaptureFixture[str], stub: Stub) -> None:
    stub.set(CUDA_DEVICE_MEMORY_LIMIT_0="1024m", STUB_CUDA_DEVICES=0)
    code, document = verify(capsys, stub)
    assert (code, document["result"]) == (1, NO_GPU)
    assert document["devices"] == [
        {
            "index": 0,
            "name": None,
            "expectedMiB": 1024,
            "limit": {"mode": "vgpu", "variable": "CUDA_DEVICE_MEMORY_LIMIT_0", "value": "1024m"},
            "toleranceMiB": 64,
            "totalMiB": None,
            "freeMiB": None,
            "allocatedMiB": None,
            "stopped": None,
            "verdict": NO_GPU,
            "notes": [],
        }
    ]


def test_cuda_error_no_device_is_no_gpu(capsys: pytest.CaptureFixture[str], stub: Stub) -> None:
    # What the driver says when the container has the library but no device node.
    stub.set(STUB_CUDA_INIT_ERROR=100)
    code, document = verify(capsys, stub)
    assert (code, document["result"], document["driverCudaVersion"]) == (1, NO_GPU, None)
    assert [d["verdict"] for d in document["devices"]] == [NO_GPU]


def test_every_device_is_checked_against_its_own_cap(
    capsys: pytest.CaptureFixture[str], stub: Stub
) -> None:
    stub.set(
        STUB_CUDA_DEVICES=3,
        CUDA_DEVICE_MEMORY_LIMIT_0="1024m",
        CUDA_DEVICE_MEMORY_LIMIT_1="2048m",
        STUB_CUDA_CAP_MIB_0=1024,
        STUB_CUDA_CAP_MIB_1=2048,
    )
    code, document = verify(capsys, stub)
    assert code == 0
    summary = [
        (d["index"], d["expectedMiB"], d["allocatedMiB"], d["verdict"]) for d in document["devices"]
    ]
    # Device 2 has no limit: it neither passes nor fails the check.
    assert summary == [
        (0, 1024, 1024, ENFORCED),
        (1, 2048, 2048, ENFORCED),
        (2, None, None, NO_LIMIT),
    ]


def test_one_unenforced_device_fails_the_check(
    capsys: pytest.CaptureFixture[str], stub: Stub
) -> None:
    stub.set(
        STUB_CUDA_DEVICES=2,
        CUDA_DEVICE_MEMORY_LIMIT="1024m",
        STUB_CUDA_CAP_MIB_0=1024,
    )
    code, document = verify(capsys, stub)
    assert (code, document["result"]) == (1, NOT_ENFORCED)
    assert [d["verdict"] for d in document["devices"]] == [ENFORCED, NOT_ENFORCED]
    assert {d["limit"]["variable"] for d in document["devices"]} == {"CUDA_DEVICE_MEMORY_LIMIT"}


def test_a_limited_device_the_container_cannot_see_fails_the_check(
    capsys: pytest.CaptureFixture[str], stub: Stub
) -> None:
    stub.set(
        CUDA_DEVICE_MEMORY_LIMIT_0="1024m",
        CUDA_DEVICE_MEMORY_LIMIT_1="1024m",
        STUB_CUDA_CAP_MIB=1024,
    )
    code, document = verify(capsys, stub)
    assert (code, document["result"]) == (1, NOT_ENFORCED)
    assert [(d["index"], d["verdict"]) for d in document["devices"]] == [
        (0, ENFORCED),
        (1, NO_GPU),
    ]


def test_mps_limit_enforced(capsys: pytest.CaptureFixture[str], stub: Stub) -> None:
    # The H100 figures: 2,905 MiB free of a 3,072 MiB daemon limit.
    stub.set(
        CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="0=3072M",
        STUB_CUDA_CAP_MIB=3072,
        STUB_CUDA_CONTEXT_MIB=167,
    )
    code, document = verify(capsys, stub)
    assert code == 0
    [device] = document["devices"]
    assert device["limit"] == {
        "mode": "mps",
        "variable": "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT",
        "value": "0=3072M",
    }
    assert (device["freeMiB"], device["allocatedMiB"], device["verdict"]) == (2905, 2904, ENFORCED)
    assert device["toleranceMiB"] == 153


def test_mps_limit_not_enforced_names_the_daemon(
    capsys: pytest.CaptureFixture[str], stub: Stub
) -> None:
    stub.set(CUDA_MPS_PINNED_DEVICE_MEM_LIMIT="0=3072M,1=3072M", STUB_CUDA_DEVICES=2)
    code, document = verify(capsys, stub)
    assert code == 1
    for device in document["devices"]:
        assert device["verdict"] == NOT_ENFORCED
        assert "daemon" in device["notes"][1]


def test_vgpu_on_a_full_card_without_hami_core_is_not_enforced(
    capsys: pytest.CaptureFixture[str], stub: Stub
) -> None:
    # Other tenants hold all but 579 MiB, so even an uncapped process is refused early.
    stub.set(CUDA_DEVICE_MEMORY_LIMIT_0="1024m", STUB_CUDA_USED_MIB=80500)
    code, document = verify(capsys, stub)
    assert code == 1
    [device] = document["devices"]
    assert (device["allocatedMiB"], device["stopped"], device["verdict"]) == (
        578,
        "refused",
        NOT_ENFORCED,
    )


def test_json_document_shape(capsys: pytest.CaptureFixture[str], stub: Stub) -> None:
    stub.set(CUDA_DEVICE_MEMORY_LIMIT_0="1024m", STUB_CUDA_CAP_MIB=1024)
    _, document = verify(capsys, stub)
    assert document == {
        "library": str(stub.path),
        "driverCudaVersion": "13.0",
        "tolerance": {"percent": 5, "minimumMiB": 64},
        "vgpuPreload": document["vgpuPreload"],  # depends on the machine running the tests
        "result": ENFORCED,
        "exitCode": 0,
        "devices": [
            {
                "index": 0,
                "name": "Stub GPU 0",
                "expectedMiB": 1024,
                "limit": {
                    "mode": "vgpu",
                    "variable": "CUDA_DEVICE_MEMORY_LIMIT_0",
                    "value": "1024m",
                },
                "toleranceMiB": 64,
                "totalMiB": 1024,
                "freeMiB": 1024,
                "allocatedMiB": 1024,
                "stopped": "refused",
                "verdict": ENFORCED,
                "notes": [],
            }
        ],
    }
    assert isinstance(document["vgpuPreload"], list)


def test_text_output(capsys: pytest.CaptureFixture[str], stub: Stub) -> None:
    stub.set(CUDA_DEVICE_MEMORY_LIMIT_0="1024m", STUB_CUDA_DEVICES=2, STUB_CUDA_CAP_MIB_0=1024)
    stub.set(STUB_CUDA_CONTEXT_MIB=187)
    assert main(["--library", str(stub.path)]) == 0
    out = capsys.readouterr().out
    assert f"library   {stub.path} (CUDA 13.0)\n" in out
    assert "tolerance cap + max(5%, 64 MiB)\n" in out
    assert "GPU 0  Stub GPU 0\n" in out
    assert "  expected   1,024 MiB  (CUDA_DEVICE_MEMORY_LIMIT_0: 1024m, vgpu)\n" in out
    assert "  driver     1,024 MiB total, 837 MiB free\n" in out
    assert "  allocated  836 MiB, then the driver refused\n" in out
    assert "GPU 1  Stub GPU 1\n  driver     81,079 MiB total, 80,892 MiB free\n" in out
    assert "  verdict    no limit set\n" in out
    assert out.endswith(
        "result: enforced (exit 0): every device with a limit refused memory past its cap\n"
    )


def test_text_output_not_enforced(capsys: pytest.CaptureFixture[str], stub: Stub) -> None:
    stub.set(CUDA_DEVICE_MEMORY_LIMIT_0="1024m")
    assert main(["--library", str(stub.path)]) == 1
    out = capsys.readouterr().out
    assert "  allocated  1,090 MiB, and still going: stopped past the cap\n" in out
    assert "  verdict    not enforced\n" in out
    assert "  note       got past the cap and its margin (1,088 MiB)" in out
    assert "result: not enforced (exit 1): a memory cap is NOT enforced" in out


def test_is_a_subcommand_of_the_cli(stub: Stub) -> None:
    stub.set(CUDA_DEVICE_MEMORY_LIMIT_0="1024m", STUB_CUDA_CAP_MIB=1024)
    args = build_parser().parse_args(["verify", "-o", "json", "--library", str(stub.path)])
    stdout = io.StringIO()
    assert args.handler(args, io.StringIO(), stdout) == 0
    assert orjson.loads(stdout.getvalue())["result"] == ENFORCED


@pytest.mark.parametrize(
    ("env", "code", "stream", "expected"),
    [
        (
            {"CUDA_DEVICE_MEMORY_LIMIT_0": "1024m", "STUB_CUDA_CAP_MIB": "1024"},
            0,
            "stdout",
            "result: enforced",
        ),
        ({"CUDA_DEVICE_MEMORY_LIMIT_0": "1024m"}, 1, "stdout", "result: not enforced"),
        ({"STUB_CUDA_INIT_ERROR": "35"}, 2, "stderr", "CUDA_ERROR_INSUFFICIENT_DRIVER (35)"),
    ],
)
def test_as_its_own_process(
    stub: Stub, env: dict[str, str], code: int, stream: str, expected: str
) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "webhook", "verify", "--library", str(stub.path)],
        env={**os.environ, **env},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == code
    assert expected in getattr(result, stream)
    assert "Traceback" not in result.stderr
