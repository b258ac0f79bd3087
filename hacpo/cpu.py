"""Process-level tuning for the CPU engine."""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

# glibc mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_THRESHOLD = -3


@functools.cache
def keep_freed_memory(mmap_threshold: int = 512 << 20, trim_threshold: int = 1 << 30) -> bool:
    """Let glibc's malloc keep freed tensor memory for reuse instead of handing it back to the kernel.

    By default glibc serves blocks above a (dynamic, ≤ 32 MiB) threshold with ``mmap`` and returns them
    with ``munmap`` when freed, so every training step's activations of a few MiB come back as fresh pages:
    a page fault and a zero-fill per 4 KiB, over and over. Raising the mmap and trim thresholds keeps them in
    the heap (measured 4% faster toy training; peak RSS unchanged). Returns False where there is no glibc
    (macOS, musl): nothing to tune there. Idempotent.
    """
    name = ctypes.util.find_library("c")
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError, TypeError):
        return False
    ok = mallopt(_M_MMAP_THRESHOLD, mmap_threshold) == 1
    ok &= mallopt(_M_TRIM_THRESHOLD, trim_threshold) == 1
    ok &= mallopt(_M_TOP_PAD, 64 << 20) == 1
    return bool(ok)
