"""The ctypes binding, against a real shared library that exports the driver's symbols."""

from __future__ import annotations

import pytest

from tests.node.conftest import Build, Stub
from webhook.node.cuda import (
    CUDA_ERROR_OUT_OF_MEMORY,
    DEFAULT_LIBRARY,
    LIBRARY_ENV,
    CudaError,
    Driver,
    LibraryError,
    library_path,
)

MIB = 1 << 20
CUDA_ERROR_INVALID_CONTEXT = 201


def test_library_path_prefers_the_flag_then_the_environment() -> None:
    assert library_path("/flag/libcuda.so", {LIBRARY_ENV: "/env/libcuda.so"}) == "/flag/libcuda.so"
    assert library_path(None, {LIBRARY_ENV: "/env/libcuda.so"}) == "/env/libcuda.so"
    assert library_path(None, {LIBRARY_ENV: ""}) == DEFAULT_LIBRARY
    assert library_path(None, {}) == "libcuda.so.1"


def test_driver_calls_reach_the_library(stub: Stub) -> None:
    stub.set(STUB_CUDA_DEVICES=2, STUB_CUDA_TOTAL_MIB=4096, STUB_CUDA_USED_MIB=96)
    driver = Driver(str(stub.path))
    driver.init()
    assert driver.driver_version() == 13000
    assert driver.device_count() == 2
    device = driver.device(1)
    assert driver.device_name(device) == "Stub GPU 1"
    with driver.primary_context(device):
        assert stub.current() == 1
        info = driver.mem_info()
        assert (info.total, info.free) == (4096 * MIB, 4000 * MIB)
        pointer = driver.alloc(100 * MIB)
        assert pointer != 0
        # The stub rounds to 2 MiB pages, as the driver does.
        assert driver.mem_info().free == 4000 * MIB - 100 * MIB
        driver.free(pointer)
    stub.assert_clean()


def test_out_of_memory_is_a_typed_error_with_the_drivers_name(stub: Stub) -> None:
    stub.set(STUB_CUDA_CAP_MIB=64)
    driver = Driver(str(stub.path))
    driver.init()
    with driver.primary_context(driver.device(0)), pytest.raises(CudaError) as caught:
        driver.alloc(128 * MIB)
    error = caught.value
    assert (error.function, error.code, error.name) == (
        "cuMemAlloc_v2",
        CUDA_ERROR_OUT_OF_MEMORY,
        "CUDA_ERROR_OUT_OF_MEMORY",
    )
    assert str(error) == "cuMemAlloc_v2 failed: CUDA_ERROR_OUT_OF_MEMORY (2)"
    stub.assert_clean()


def test_memory_calls_need_the_primary_context(stub: Stub) -> None:
    driver = Driver(str(stub.path))
    driver.init()
    with pytest.raises(CudaError) as caught:
        driver.mem_info()
    assert caught.value.code == CUDA_ERROR_INVALID_CONTEXT


def _fail_in_context(driver: Driver, stub: Stub) -> None:
    with driver.primary_context(driver.device(0)):
        assert stub.retained() == 1
        raise RuntimeError("boom")


def test_primary_context_is_released_when_the_block_fails(stub: Stub) -> None:
    driver = Driver(str(stub.path))
    driver.init()
    with pytest.raises(RuntimeError, match="boom"):
        _fail_in_context(driver, stub)
    stub.assert_clean()


def test_init_failure_names_the_result(stub: Stub) -> None:
    stub.set(STUB_CUDA_INIT_ERROR=35)
    driver = Driver(str(stub.path))
    with pytest.raises(CudaError, match=r"^cuInit failed: CUDA_ERROR_INSUFFICIENT_DRIVER \(35\)$"):
        driver.init()


def test_a_driver_without_cu_get_error_name_still_reports_codes(
    build_stub: Build, stub: Stub
) -> None:
    stub.set(STUB_CUDA_CAP_MIB=64)
    driver = Driver(str(build_stub("-DSTUB_WITHOUT_ERROR_NAME")))
    driver.init()
    with driver.primary_context(driver.device(0)), pytest.raises(CudaError) as caught:
        driver.alloc(128 * MIB)
    assert (caught.value.code, caught.value.name) == (2, "CUresult 2")


def test_a_library_without_a_needed_function_is_refused(build_stub: Build) -> None:
    path = build_stub("-DSTUB_WITHOUT_MEM_GET_INFO")
    with pytest.raises(LibraryError, match=r"does not export cuMemGetInfo_v2$"):
        Driver(str(path))


def test_a_missing_library_is_refused() -> None:
    with pytest.raises(LibraryError, match=r"^cannot load /nonexistent/libcuda\.so\.1: "):
        Driver("/nonexistent/libcuda.so.1")
