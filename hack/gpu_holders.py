"""The holder side of hack/gpu_check.py: a child process that holds a known
amount of device memory through the first of torch, cupy, pycuda, numba that is
installed, else through ctypes calls to libcudart (cudaMalloc) or libcuda
(cuMemAlloc), until it is killed."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
from pathlib import Path
from typing import Any

HOLDERS = ("torch", "cupy", "pycuda", "numba", "ctypes")


def hold(method: str, device: int, size: int) -> None:
    """Allocate ``size`` bytes on CUDA device ``device``, say READY, wait for stdin to close."""
    keep = ALLOCATORS[method](device, size)
    print(f"READY {os.getpid()} {method}", flush=True)
    sys.stdin.read()
    del keep


def _torch(device: int, size: int) -> Any:
    import torch

    return torch.empty(size, dtype=torch.uint8, device=f"cuda:{device}")


def _cupy(device: int, size: int) -> Any:
    import cupy

    cupy.cuda.Device(device).use()
    return cupy.empty(size, dtype=cupy.uint8)


def _pycuda(device: int, size: int) -> Any:
    import pycuda.driver as cuda

    cuda.init()
    context = cuda.Device(device).make_context()
    return context, cuda.mem_alloc(size)


def _numba(device: int, size: int) -> Any:
    import numpy as np
    from numba import cuda

    cuda.select_device(device)
    return cuda.device_array(size, dtype=np.uint8)


def _load(names: list[str]) -> ctypes.CDLL | None:
    for name in names:
        try:
            return ctypes.CDLL(name)
        except OSError:
            continue
    return None


def _cudart_candidates() -> list[str]:
    """libcudart from the loader's path, then from pip's nvidia-cuda-runtime wheels."""
    names = [p for p in [ctypes.util.find_library("cudart")] if p]
    names += ["libcudart.so", "libcudart.so.12", "libcudart.so.11.0"]
    for entry in sys.path:
        names += sorted(str(p) for p in Path(entry).glob("nvidia/cuda_runtime/lib/libcudart.so*"))
    return names


def _ctypes(device: int, size: int) -> Any:
    """cudaMalloc through libcudart, else cuMemAlloc through the driver API (libcuda)."""
    pointer = ctypes.c_void_p()
    runtime = _load(_cudart_candidates())
    if runtime is not None:
        _cuda_check(runtime.cudaSetDevice(device), "cudaSetDevice")
        _cuda_check(runtime.cudaMalloc(ctypes.byref(pointer), ctypes.c_size_t(size)), "cudaMalloc")
        return runtime, pointer
    driver = _load([p for p in [ctypes.util.find_library("cuda")] if p] + ["libcuda.so.1", "libcuda.so"])
    if driver is None:
        raise RuntimeError("neither libcudart nor libcuda could be loaded")
    handle, context = ctypes.c_int(), ctypes.c_void_p()
    _cuda_check(driver.cuInit(0), "cuInit")
    _cuda_check(driver.cuDeviceGet(ctypes.byref(handle), device), "cuDeviceGet")
    _cuda_check(driver.cuCtxCreate_v2(ctypes.byref(context), 0, handle), "cuCtxCreate_v2")
    _cuda_check(driver.cuMemAlloc_v2(ctypes.byref(pointer), ctypes.c_size_t(size)), "cuMemAlloc_v2")
    return driver, context, pointer


def _cuda_check(code: int, call: str) -> None:
    if code != 0:
        raise RuntimeError(f"{call} failed with CUDA error {code}")


ALLOCATORS = {"torch": _torch, "cupy": _cupy, "pycuda": _pycuda, "numba": _numba, "ctypes": _ctypes}


def available_holder() -> str:
    """The first CUDA-capable package that imports, else ctypes."""
    for module in ("torch", "cupy", "pycuda.driver", "numba.cuda"):
        try:
            __import__(module)
        except Exception:  # noqa: BLE001 - any import failure means "not usable here"
            continue
        return module.split(".")[0]
    return "ctypes"
