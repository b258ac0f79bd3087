"""The machine a process runs on: glibc's allocator tuned for training loops, the CPU's feature flags, and
``precision: auto`` made concrete for CPU or CUDA (:func:`resolve_precision`). Both engines use it; there is
no separate CPU engine (the local engine runs on CPU or one GPU)."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import sys

# glibc mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3


@functools.cache
def _libc():
    try:
        return ctypes.CDLL(ctypes.util.find_library("c"))
    except (OSError, TypeError):
        return None


def return_freed_memory() -> bool:
    """Hand the heap's free pages back to the kernel (glibc ``malloc_trim``), once an update is over.

    Within a step :func:`keep_freed_memory` keeps freed tensor memory for reuse; across steps glibc's free
    lists fragment, and on the real pair (docs/performance.md) the process's RSS between steps crept up by
    ≈ 0.5 GB a step with the live tensors unchanged. Trimming after each update keeps it at the live set.
    Returns False where there is no glibc."""
    trim = getattr(_libc(), "malloc_trim", None)
    if trim is None:
        return False
    trim(0)
    return True


@functools.cache
def keep_freed_memory(mmap_threshold: int = 512 << 20, trim_threshold: int = 1 << 30) -> bool:
    """Let glibc's malloc keep freed tensor memory for reuse instead of handing it back to the kernel.

    By default glibc serves blocks above a (dynamic, ≤ 32 MiB) threshold with ``mmap`` and returns them
    with ``munmap`` when freed, so every training step's activations of a few MiB come back as fresh pages:
    a page fault and a zero-fill per 4 KiB, over and over. Raising the mmap and trim thresholds keeps them in
    the heap (measured 4% faster toy training; peak RSS unchanged). Returns False where there is no glibc
    (macOS, musl): nothing to tune there. Idempotent.
    """
    mallopt = getattr(_libc(), "mallopt", None)
    if mallopt is None:
        return False
    ok = mallopt(_M_MMAP_THRESHOLD, mmap_threshold) == 1
    ok &= mallopt(_M_TRIM_THRESHOLD, trim_threshold) == 1
    ok &= mallopt(_M_TOP_PAD, 64 << 20) == 1
    return bool(ok)


def peak_rss_mb(usage=None) -> float:
    """Peak resident set size in MiB: this process's so far, or that of ``usage`` (a
    ``resource.struct_rusage``, such as ``os.wait4`` returns for one child). ``ru_maxrss`` is in KiB on Linux
    but in bytes on macOS; read it only through here."""
    import resource

    peak = (usage or resource.getrusage(resource.RUSAGE_SELF)).ru_maxrss
    return peak / 2**20 if sys.platform == "darwin" else peak / 2**10


def cpu_fields(cpuinfo: str = "/proc/cpuinfo") -> dict[str, str]:
    """The first processor's fields as the kernel reports them (``model name``, ``flags``, …); empty where
    there is no /proc/cpuinfo."""
    try:
        text = open(cpuinfo).read()
    except OSError:
        return {}
    fields: dict[str, str] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep:
            fields.setdefault(key.strip(), value.strip())
    return fields


def cpu_flags(cpuinfo: str = "/proc/cpuinfo") -> frozenset[str]:
    """The processor's feature flags as the kernel reports them (empty where there is no /proc/cpuinfo)."""
    return frozenset(cpu_fields(cpuinfo).get("flags", "").split())


# Flags of CPUs that compute bf16 matmuls in hardware; on others (AVX-512 alone) oneDNN emulates bf16 and a
# bf16-autocast forward of SmolLM2 ran 4.0× slower than fp32.
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def resolve_precision(requested: str, device_type: str, flags: frozenset[str] | None = None) -> str:
    """``precision: auto`` made concrete for this machine: bf16 on CUDA devices that support it and on CPUs
    with :data:`NATIVE_BF16_FLAGS`, else fp32. ``fp32`` and ``bf16`` are returned as given."""
    if requested != "auto":
        return requested
    if device_type == "cuda":
        import torch

        return "bf16" if torch.cuda.is_bf16_supported() else "fp32"
    flags = cpu_flags() if flags is None else flags
    return "bf16" if any(f in flags for f in NATIVE_BF16_FLAGS) else "fp32"
