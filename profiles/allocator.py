"""Keeping freed CPU memory in the process, so a large piece does not page-fault on every iteration.

glibc's malloc serves blocks above its mmap threshold by fresh ``mmap`` and gives them back on free,
and trims the heap top back to the OS; every iteration of a large model then touches new pages and
pays a page fault per 4 KiB. A small unit reuses its freed heap instead, so unit times would be faster
than the whole model they add up to, and a rank's stages slower than their profile. The profiler and every
runtime rank set the same, so the profile describes the process that runs the plan.

No block is mmap'd at all, not only those under glibc's largest threshold (32 MiB): an LM's embedding
gradient and its logits are larger, and faulting them in every step slows the backward and the optimizer
step of the ranks that hold them.

Nor is the heap ever trimmed (``M_TRIM_THRESHOLD`` -1). A positive threshold, even the largest (2 GiB), still
trims: the 1 GiB top pad plus a freed block at the top passes it, so the heap shrinks by a gigabyte at the
end of a step and page-faults it back in the next, in whichever pass first needs it again.

The one exception is :func:`return_freed_memory`, which a meta profile calls between units (profiles/meta.py).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import sys

__all__ = ["keep_freed_memory", "return_freed_memory"]

# glibc's mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_TOP_PAD = -2
_M_MMAP_MAX = -4
TOP_PAD_BYTES = 2**30
"""Extra heap the heap grows by at once: untouched virtual memory until used."""
_NEVER_TRIM = -1  # man mallopt: "Setting M_TRIM_THRESHOLD to -1 disables trimming completely"


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    except OSError:
        return None


def return_freed_memory() -> None:
    """Give the heap's free memory back to the OS now (glibc ``malloc_trim``; elsewhere nothing).

    A meta profile calls it between units: what one unit freed is kept for its own iterations (above),
    but must not add to the next unit's resident memory (one 3B Llama unit's activations: 1 GiB).
    """
    libc = _libc()
    trim = getattr(libc, "malloc_trim", None) if libc is not None else None
    if trim is not None:
        trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
        trim(0)


def keep_freed_memory() -> bool:
    """Serve every block from this process's heap and never trim it; False where there is no glibc mallopt.

    Process-wide like ``torch.set_num_threads``, and for the same reason: the measurement must run
    the way the ranks will.
    """
    libc = _libc()
    mallopt = getattr(libc, "mallopt", None) if libc is not None else None
    if mallopt is None:  # not Linux, or musl and others without mallopt
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    settings = (
        (_M_MMAP_MAX, 0),  # blocks of any size from the heap, reused after free
        (_M_TRIM_THRESHOLD, _NEVER_TRIM),
        (_M_TOP_PAD, TOP_PAD_BYTES),
    )
    return all(mallopt(param, value) == 1 for param, value in settings)
