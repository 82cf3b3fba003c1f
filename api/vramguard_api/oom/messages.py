"""The frameworks' out-of-memory messages: one table, each row cited to its source.

A row says which memory a message means (``VRAM``, ``HostRAM``, or ``OnChip``:
a kernel's shared memory or registers, not device memory), how sure a match
makes us (``High``: the allocator's own sentence; ``Medium``: a status or class
name that other failures can share), and where the exact string comes from.
Rows are tried in order; the first match wins, so the more specific rows (a
TensorFlow OOM on a CPU device) come before the general ones.

``match_message(text)`` -> ``MessageMatch | None``. Sizes the message states
(PyTorch's "Tried to allocate 2.00 GiB", XLA's "allocate 8000000000 bytes") are
read into bytes where the format is known.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

Memory = Literal["VRAM", "HostRAM", "OnChip"]
Confidence = Literal["High", "Medium", "Low"]


@dataclass(frozen=True, slots=True)
class MessagePattern:
    """One framework message: ``name`` (stable id), ``framework``, ``memory``,
    ``confidence``, ``pattern`` (a regular expression; a group named
    ``requested`` captures the size asked for) and ``source`` (repository, file
    and the exact string there)."""

    name: str
    framework: str
    memory: Memory
    confidence: Confidence
    pattern: re.Pattern[str]
    source: str


def _row(name: str, framework: str, memory: Memory, confidence: Confidence, pattern: str, source: str) -> MessagePattern:
    return MessagePattern(name, framework, memory, confidence, re.compile(pattern), source)


_SIZE = r"(?P<requested>\d+(?:\.\d+)? ?(?:[KMGTP]i?B|bytes?))"

MESSAGE_PATTERNS: tuple[MessagePattern, ...] = (
    _row("pytorch-caching-allocator", "PyTorch", "VRAM", "High", r"CUDA out of memory\. Tried to allocate " + _SIZE,
         'pytorch/pytorch c10/cuda/CUDACachingAllocator.cpp: TORCH_CHECK_WITH(OutOfMemoryError, false, '
         '"CUDA out of memory. Tried to allocate ", format_size(alloc_size), ". GPU ", ...)'),
    _row("pytorch-oom-class", "PyTorch", "VRAM", "High", r"torch\.(?:cuda\.)?OutOfMemoryError",
         'pytorch/pytorch torch/csrc/Exceptions.cpp registers "torch.OutOfMemoryError" '
         '(torch.cuda.OutOfMemoryError before 2.5); the caching allocator raises it'),
    _row("pytorch-cpu-allocator", "PyTorch", "HostRAM", "High", r"DefaultCPUAllocator: (?:can't allocate memory|not enough memory)",
         'pytorch/pytorch c10/core/impl/alloc_cpu.cpp: "DefaultCPUAllocator: can\'t allocate memory: '
         'you tried to allocate ", nbytes, " bytes."'),
    _row("tensorflow-oom-cpu", "TensorFlow", "HostRAM", "High", r"OOM when allocating tensor[^\n]*device:CPU",
         'tensorflow/tensorflow tensorflow/core/framework/op_kernel.cc: errors::ResourceExhausted('
         '"OOM when allocating tensor with shape", ..., " on ", params_->device->name(), ...) on a CPU device'),
    _row("tensorflow-oom", "TensorFlow", "VRAM", "High", r"OOM when allocating tensor (?:with|of) shape",
         'tensorflow/tensorflow tensorflow/core/framework/op_kernel.cc: errors::ResourceExhausted('
         '"OOM when allocating tensor with shape", shape.DebugString(), ...)'),
    _row("xla-allocator", "JAX/XLA", "VRAM", "High",
         r"RESOURCE_EXHAUSTED: Out of memory (?:while trying to allocate|allocating) (?P<requested>\d+) bytes",
         'openxla/xla xla/stream_executor/integrations/tf_allocator_adapter.cc: absl::ResourceExhaustedError('
         '"Out of memory while trying to allocate ", size, " bytes.") (RESOURCE_EXHAUSTED is its status code)'),
    _row("xla-device-buffer", "JAX/XLA", "VRAM", "High", r"RESOURCE_EXHAUSTED: (?:Failed to allocate request for|"
         r"Error allocating device buffer)",
         'openxla/xla docs/errors/error_0100.md: "RESOURCE_EXHAUSTED: Error allocating device buffer: '
         'Attempting to allocate ..."; the BFC allocator\'s "Failed to allocate request for"'),
    _row("cuda-runtime-error", "CUDA", "VRAM", "High", r"CUDA error: out of memory",
         'pytorch/pytorch c10/cuda/CUDAException.cpp: "CUDA error: " + cudaGetErrorString(err), and '
         'cudaGetErrorString(cudaErrorMemoryAllocation) is "out of memory" (CUDA runtime API)'),
    _row("cuda-runtime-enum", "CUDA", "VRAM", "High", r"\bcudaErrorMemoryAllocation\b",
         "CUDA runtime API driver_types.h: cudaErrorMemoryAllocation = 2"),
    _row("cuda-driver-enum", "CUDA", "VRAM", "High", r"\bCUDA_ERROR_OUT_OF_MEMORY\b",
         'CUDA driver API cuda.h: CUDA_ERROR_OUT_OF_MEMORY = 2; tensorflow/tensorflow stream_executor/cuda/'
         'cuda_driver.cc: "failed to allocate ... from device: " + ToString(res)'),
    _row("cudnn-alloc", "cuDNN", "VRAM", "Medium", r"\bCUDNN_STATUS_ALLOC_FAILED\b",
         'cuDNN cudnn_ops.h: CUDNN_STATUS_ALLOC_FAILED; pytorch/pytorch aten/src/ATen/cudnn/Exceptions.h: '
         '"cuDNN error: " + cudnnGetErrorString(status)'),
    _row("cublas-alloc", "cuBLAS", "VRAM", "Medium", r"\bCUBLAS_STATUS_ALLOC_FAILED\b",
         'cuBLAS cublas_api.h: CUBLAS_STATUS_ALLOC_FAILED; pytorch/pytorch aten/src/ATen/cuda/CublasHandlePool.cpp '
         '(cublasCreate(handle))'),
    _row("vllm-kv-cache", "vLLM", "VRAM", "High", r"No available memory for the cache blocks",
         'vllm-project/vllm vllm/v1/core/kv_cache_utils.py: raise ValueError("No available memory for the '
         'cache blocks. Try increasing `gpu_memory_utilization` ...")'),
    _row("vllm-startup-free", "vLLM", "VRAM", "High",
         r"Free memory on device[^\n]*on startup is less than desired GPU memory utilization",
         'vllm-project/vllm vllm/v1/worker/gpu_worker.py: raise ValueError(f"Free memory on device ... on startup '
         'is less than desired GPU memory utilization ...")'),
    _row("triton-out-of-resource", "Triton", "OnChip", "High", r"out of resource: (?:shared memory|registers)",
         'triton-lang/triton python/triton/runtime/errors.py: class OutOfResources: f"out of resource: {name}, '
         'Required: {required}, Hardware limit: {limit}" (shared memory per block, not device memory)'),
    _row("tensorflow-resource-exhausted", "TensorFlow", "VRAM", "Medium", r"\bResourceExhaustedError\b",
         "tensorflow/tensorflow tensorflow/python/framework/errors_impl.py: class ResourceExhaustedError "
         "(also raised for host memory and quotas)"),
    _row("python-memory-error", "Python", "HostRAM", "Medium", r"(?m)^MemoryError\b",
         "python/cpython Objects/exceptions.c: MemoryError, raised when malloc fails"),
)


@dataclass(frozen=True, slots=True)
class MessageMatch:
    """The row that matched, the matched text, and the size asked for in bytes
    (None where the message gives none or in a format we do not read)."""

    pattern: MessagePattern
    text: str
    requested_bytes: int | None


_UNITS = {"B": 1, "KiB": 1 << 10, "MiB": 1 << 20, "GiB": 1 << 30, "TiB": 1 << 40, "PiB": 1 << 50,
          "KB": 1000, "MB": 10**6, "GB": 10**9, "TB": 10**12, "PB": 10**15, "byte": 1, "bytes": 1}


def size_bytes(text: str) -> int | None:
    """Bytes of a size as frameworks print it: ``"2.00 GiB"``, ``"8000000000"``,
    ``"512 bytes"``; None when the unit is unknown. PyTorch's ``format_size``
    prints binary units (KiB/MiB/GiB) with two decimals."""
    m = re.fullmatch(r"(\d+(?:\.\d+)?) ?([A-Za-z]*)", text.strip())
    if m is None:
        return None
    unit = m.group(2) or "B"
    if unit not in _UNITS:
        return None
    return int(float(m.group(1)) * _UNITS[unit])


def match_message(text: str | None) -> MessageMatch | None:
    """The first row of ``MESSAGE_PATTERNS`` that ``text`` matches, or None."""
    if not text:
        return None
    for row in MESSAGE_PATTERNS:
        m = row.pattern.search(text)
        if m is not None:
            requested = m.groupdict().get("requested")
            return MessageMatch(row, m.group(0), size_bytes(requested) if requested else None)
    return None
