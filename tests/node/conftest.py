"""A stand-in ``libcuda.so.1`` (cuda_stub.c), built with the machine's C compiler.

In CI (CI=true) a missing compiler is a failure; a developer without one gets a skip.
"""

from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

SOURCE = Path(__file__).with_name("cuda_stub.c")

# Everything the stub or ``verify`` reads from the environment: a test sets what it needs.
_ENV_PREFIXES = ("STUB_CUDA_", "CUDA_DEVICE_MEMORY_LIMIT", "CUDA_MPS_", "GPUSHARE_VERIFY_")

Build = Callable[..., Path]


@pytest.fixture(scope="session")
def build_stub(tmp_path_factory: pytest.TempPathFactory) -> Build:
    """``build_stub("-DSTUB_WITHOUT_ERROR_NAME")``: the path of the stub built with those flags."""
    compiler = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        if os.environ.get("CI"):
            pytest.fail("no C compiler (cc or gcc) to build the CUDA driver stub")
        pytest.skip("no C compiler (cc or gcc) to build the CUDA driver stub")
    directory = tmp_path_factory.mktemp("cuda-stub")
    built: dict[tuple[str, ...], Path] = {}

    def build(*flags: str) -> Path:
        if flags not in built:
            # One file per flag set: ctypes never unloads a library, so a path is one build.
            output = directory / f"libcuda-stub-{len(built)}.so"
            result = subprocess.run(
                [
                    compiler,
                    "-shared",
                    "-fPIC",
                    "-O1",
                    "-Wall",
                    "-Wextra",
                    "-Werror",
                    *flags,
                    "-o",
                    str(output),
                    str(SOURCE),
                ],
                check=False,
                capture_output=True,
                text=True,
            )
            if result.returncode != 0:
                pytest.fail(f"building {SOURCE.name} failed:\n{result.stderr}")
            built[flags] = output
        return built[flags]

    return build


class Stub:
    """The default stub build, its configuration (env) and its bookkeeping."""

    def __init__(self, path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        self.path = path
        self._monkeypatch = monkeypatch
        # The same handle the code under test gets: dlopen of one path is one library.
        self._library = ctypes.CDLL(str(path))
        self._library.stub_alloc_calls.restype = ctypes.c_long
        self._library.stub_init_calls.restype = ctypes.c_long
        # The library outlives each test; its counters should not.
        self._library.stub_reset_counters()

    def set(self, **env: str | int) -> None:
        """``set(STUB_CUDA_CAP_MIB=1024, CUDA_DEVICE_MEMORY_LIMIT_0="1024m")``."""
        for name, value in env.items():
            self._monkeypatch.setenv(name, str(value))

    def live_allocations(self) -> int:
        return int(self._library.stub_live_allocations())

    def retained(self) -> int:
        return int(self._library.stub_retained())

    def current(self) -> int:
        return int(self._library.stub_current())

    def alloc_calls(self) -> int:
        return int(self._library.stub_alloc_calls())

    def init_calls(self) -> int:
        return int(self._library.stub_init_calls())

    def assert_clean(self) -> None:
        """Everything allocated was freed, every context released, none left current."""
        assert (self.live_allocations(), self.retained(), self.current()) == (0, 0, -1)


@pytest.fixture
def stub(build_stub: Build, monkeypatch: pytest.MonkeyPatch) -> Stub:
    for name in list(os.environ):
        if name.startswith(_ENV_PREFIXES):
            monkeypatch.delenv(name)
    return Stub(build_stub(), monkeypatch)
