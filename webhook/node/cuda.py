"""The few CUDA driver API calls ``verify`` makes, through ctypes.

Only the driver library (``libcuda.so.1``) is needed: no toolkit, no PyTorch. The
symbols are the versioned names the driver exports (``cuMemAlloc_v2`` and so on),
which are also the names HAMi-core's interposer hooks. HAMi-core replaces ``dlsym``
itself, and ctypes resolves every function through ``dlsym``, so a preloaded
``libvgpu.so`` sees these calls exactly as it sees a CUDA runtime's.

The primary context is used rather than ``cuCtxCreate``: its entry points have kept
their names and signatures from CUDA 11 to 13, while ``cuCtxCreate`` changed in 13.
"""

from __future__ import annotations

import ctypes
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Final

DEFAULT_LIBRARY: Final = "libcuda.so.1"
LIBRARY_ENV: Final = "GPUSHARE_VERIFY_LIBCUDA"

CUDA_SUCCESS: Final = 0
CUDA_ERROR_OUT_OF_MEMORY: Final = 2
CUDA_ERROR_NO_DEVICE: Final = 100

_CUresult = ctypes.c_int
_CUdevice = ctypes.c_int
_CUcontext = ctypes.c_void_p
_CUdeviceptr = ctypes.c_ulonglong  # CUdeviceptr_v2: unsigned long long on every 64-bit target

# name -> argument types; every function returns a CUresult.
_SIGNATURES: Final[Mapping[str, tuple[Any, ...]]] = {
    "cuInit": (ctypes.c_uint,),
    "cuDriverGetVersion": (ctypes.POINTER(ctypes.c_int),),
    "cuDeviceGetCount": (ctypes.POINTER(ctypes.c_int),),
    "cuDeviceGet": (ctypes.POINTER(_CUdevice), ctypes.c_int),
    "cuDeviceGetName": (ctypes.c_char_p, ctypes.c_int, _CUdevice),
    "cuDevicePrimaryCtxRetain": (ctypes.POINTER(_CUcontext), _CUdevice),
    "cuDevicePrimaryCtxRelease_v2": (_CUdevice,),
    "cuCtxSetCurrent": (_CUcontext,),
    "cuMemGetInfo_v2": (ctypes.POINTER(ctypes.c_size_t), ctypes.POINTER(ctypes.c_size_t)),
    "cuMemAlloc_v2": (ctypes.POINTER(_CUdeviceptr), ctypes.c_size_t),
    "cuMemFree_v2": (_CUdeviceptr,),
}


class LibraryError(Exception):
    """The driver library cannot be loaded or lacks a function ``verify`` needs."""


class CudaError(Exception):
    """A driver call returned something other than ``CUDA_SUCCESS``."""

    def __init__(self, function: str, code: int, name: str) -> None:
        super().__init__(f"{function} failed: {name} ({code})")
        self.function = function
        self.code = code
        self.name = name


@dataclass(frozen=True, slots=True)
class MemInfo:
    """``cuMemGetInfo`` of the current context, in bytes."""

    free: int
    total: int


def library_path(explicit: str | None, environ: Mapping[str, str]) -> str:
    """The library to load: ``--library``, else ``$GPUSHARE_VERIFY_LIBCUDA``, else ``libcuda.so.1``."""
    return explicit or environ.get(LIBRARY_ENV) or DEFAULT_LIBRARY


class Driver:
    """A loaded CUDA driver library with the functions ``verify`` calls bound and typed."""

    def __init__(self, path: str = DEFAULT_LIBRARY) -> None:
        self.path = path
        try:
            library = ctypes.CDLL(path)
        except OSError as exc:
            raise LibraryError(f"cannot load {path}: {exc}") from None
        self._functions: dict[str, Any] = {}
        for name, argtypes in _SIGNATURES.items():
            try:
                function = getattr(library, name)
            except AttributeError:
                raise LibraryError(f"{path} does not export {name}") from None
            function.argtypes = argtypes
            function.restype = _CUresult
            self._functions[name] = function
        # Only for messages: a library without it still runs, with numeric codes.
        self._error_name: Any = getattr(library, "cuGetErrorName", None)
        if self._error_name is not None:
            self._error_name.argtypes = (_CUresult, ctypes.POINTER(ctypes.c_char_p))
            self._error_name.restype = _CUresult

    def error_name(self, code: int) -> str:
        """``CUDA_ERROR_OUT_OF_MEMORY`` for 2, as the driver spells it."""
        if self._error_name is not None:
            text = ctypes.c_char_p()
            if self._error_name(code, ctypes.byref(text)) == CUDA_SUCCESS and text.value:
                return text.value.decode("ascii", "replace")
        return f"CUresult {code}"

    def _call(self, name: str, *args: Any) -> None:
        code = int(self._functions[name](*args))
        if code != CUDA_SUCCESS:
            raise CudaError(name, code, self.error_name(code))

    def init(self) -> None:
        self._call("cuInit", 0)

    def driver_version(self) -> int:
        """The CUDA version the driver supports, encoded as 1000 * major + 10 * minor."""
        version = ctypes.c_int()
        self._call("cuDriverGetVersion", ctypes.byref(version))
        return version.value

    def device_count(self) -> int:
        count = ctypes.c_int()
        self._call("cuDeviceGetCount", ctypes.byref(count))
        return count.value

    def device(self, ordinal: int) -> int:
        device = _CUdevice()
        self._call("cuDeviceGet", ctypes.byref(device), ordinal)
        return device.value

    def device_name(self, device: int) -> str:
        buffer = ctypes.create_string_buffer(256)
        self._call("cuDeviceGetName", buffer, len(buffer), device)
        return buffer.value.decode("utf-8", "replace")

    @contextmanager
    def primary_context(self, device: int) -> Iterator[None]:
        """``device``'s primary context, current on this thread while the block runs."""
        context = _CUcontext()
        self._call("cuDevicePrimaryCtxRetain", ctypes.byref(context), device)
        try:
            self._call("cuCtxSetCurrent", context)
            yield
        finally:
            # Best effort: the block's own error is the one worth reporting.
            self._functions["cuCtxSetCurrent"](None)
            self._functions["cuDevicePrimaryCtxRelease_v2"](device)

    def mem_info(self) -> MemInfo:
        free = ctypes.c_size_t()
        total = ctypes.c_size_t()
        self._call("cuMemGetInfo_v2", ctypes.byref(free), ctypes.byref(total))
        return MemInfo(free=free.value, total=total.value)

    def alloc(self, size: int) -> int:
        """A device pointer to ``size`` bytes in the current context."""
        pointer = _CUdeviceptr()
        self._call("cuMemAlloc_v2", ctypes.byref(pointer), size)
        return pointer.value

    def free(self, pointer: int) -> None:
        self._call("cuMemFree_v2", pointer)
