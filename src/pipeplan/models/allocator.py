"""A steady CPU allocator for measurement and training: large tensors come from the heap, not fresh mappings.

Note:
    PyTorch's CPU tensors come from glibc's malloc. Above a threshold that
    glibc moves at run time, each allocation is a fresh mmap whose pages fault
    in on first touch and are unmapped on free; an optimizer step on a 4 MB
    weight then pays a few milliseconds of page faults, or not, depending on
    the process's history. On this kind of machine the same Adam step timed in
    six fresh processes took 1.4 ms in two and 4.5-4.9 ms in four. Fixing the
    thresholds (mallopt) makes every process take the heap path: a profile and
    the training run it predicts then see the same allocator. It only applies
    to glibc; elsewhere it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools

M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
HEAP_BYTES = 1 << 30
"""Allocations below this come from the heap, and the heap keeps up to this much free memory."""


@functools.cache
def steady_cpu_allocator() -> bool:
    """Fix glibc's mmap and trim thresholds for this process; True when applied (once per process)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    try:
        libc = ctypes.CDLL(name)
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return all(mallopt(option, HEAP_BYTES) == 1 for option in (M_MMAP_THRESHOLD, M_TRIM_THRESHOLD, M_TOP_PAD))


def set_cpu_threads(threads: int) -> None:
    """Let torch use `threads` CPU threads in this process (profile, probe and train's workers alike)."""
    import torch

    torch.set_num_threads(threads)
