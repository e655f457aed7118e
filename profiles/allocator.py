"""Keeping freed CPU memory in the process, so a large piece does not page-fault on every iteration.

glibc's malloc serves blocks above its mmap threshold by fresh ``mmap`` and gives them back on free,
and trims the heap top back to the OS; every iteration of a large model then touches new pages and
pays a page fault per 4 KiB. A small unit reuses its freed heap instead, so unit times were faster
than the whole model they add up to. Measured on gpt2-small, b = 1, 1 thread, paired rounds: unit sum
-11.6 % against the whole model (exported as one piece) with glibc's defaults, -2.5 % with freed
memory kept (the whole model 2.10 s -> 1.69 s). The profiler and every runtime rank set the same,
so the profile describes the process that runs the plan.

No block is mmap'd at all, not only those under glibc's largest threshold (32 MiB): GPT-2's embedding
gradient (154 MB) and its logits (51 MB at b = 2) are larger, and on 2 gloo ranks their page faults
doubled rank 0's optimizer step and slowed its backward by a third (gpt2-small zbv P = 2, three runs
each, alternating: +44 to +54 % over the prediction with the threshold alone, +14 to +19 % with no
mmap; docs/BENCHMARKS.md section 6).

Nor is the heap ever trimmed. A trim threshold of 2 GiB (the largest positive ``int``) still trimmed:
the 1 GiB top pad plus a freed block at the top passed it, so the heap shrank by a gigabyte at the end
of a step and page-faulted it back in the next. In the README's main job (gpt2-small zero-bubble,
b = 4, replay) that made 2 or 3 of the LM head's 4 weight-gradient passes fault a fresh 154 MB
(37,693 minor faults, 950 ms instead of 450 ms) in every step, and its stage ran +33 % over its
profile while the others ran 14-17 % under; with trimming off the faults stop after the second step
and the stage ran like the others (-12.6 % against -15.8..-19.9 %, 2026-12-04). On gpt2-tiny's ranks,
too, the model's units timed between steps read the machine steadier: 1.02x its profiling speed
(0.99-1.21x) against 1.12x (0.98-1.46x), 9 verify runs each way, alternating (docs/BENCHMARKS.md 6.1).
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
