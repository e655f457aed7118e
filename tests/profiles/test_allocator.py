"""Keeping freed memory: glibc's mallopt accepts every setting, and a freed large block is reused, not re-faulted."""

from __future__ import annotations

import platform
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from profiles.allocator import TOP_PAD_BYTES, keep_freed_memory

needs_glibc = pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc", reason="needs glibc's mallopt"
)

# 64 MiB: above glibc's largest mmap threshold (32 MiB), like GPT-2's 154 MB embedding gradient.
_FAULTS_OF_LAST_ITERATION = textwrap.dedent(
    """
    import resource, sys
    sys.path.insert(0, {root!r})
    if {keep}:
        from profiles.allocator import keep_freed_memory
        assert keep_freed_memory()
    import torch
    for _ in range(12):  # iterations: each allocates, touches and frees the block
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        torch.empty(16 * 2**20).fill_(1.0)
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    """
)


_ROOT = str(Path(__file__).resolve().parents[2])


def _faults_printed_by(code: str) -> int:
    """Runs ``code`` in a fresh interpreter (the allocator's settings are process-wide) and reads the fault
    count it prints last."""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(out.stdout.strip().splitlines()[-1])


def _faults_of_last_iteration(keep: bool) -> int:
    return _faults_printed_by(_FAULTS_OF_LAST_ITERATION.format(root=_ROOT, keep=keep))


@needs_glibc
def test_glibc_accepts_every_setting() -> None:
    assert keep_freed_memory() is True


@needs_glibc
def test_a_freed_large_block_is_reused_without_page_faults() -> None:
    # The first iterations fault while the heap grows: torch aligns its blocks (posix_memalign), which
    # asks for a little more than a freed hole of the same size; within a few iterations freed holes
    # coalesce and are reused.
    pages = 64 * 2**20 // 4096
    assert _faults_of_last_iteration(keep=False) > pages // 2  # glibc's default: a fresh mmap, every page faults
    assert _faults_of_last_iteration(keep=True) < pages // 50


# malloc itself, not torch: torch's aligned allocations leave holes (above) that would blur the count.
_FAULTS_AFTER_FREEING_AT_THE_TOP = textwrap.dedent(
    """
    import ctypes, resource, sys
    sys.path.insert(0, {root!r})
    from profiles.allocator import keep_freed_memory
    assert keep_freed_memory()
    libc = ctypes.CDLL("libc.so.6")
    if {trim_at} is not None:  # a trim threshold in place of keep_freed_memory's
        assert libc.mallopt(-1, {trim_at}) == 1  # M_TRIM_THRESHOLD
    libc.malloc.restype, libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    libc.free.argtypes = [ctypes.c_void_p]
    size = {mib} * 2**20
    for _ in range(3):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        block = libc.malloc(size)
        ctypes.memset(block, 1, size)
        libc.free(block)
    print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
    """
)


@needs_glibc
def test_the_heap_top_is_never_trimmed() -> None:
    # 1.25 GiB freed into the 1 GiB top pad leaves 2.25 GiB free at the heap's top: a trim threshold of
    # 2 GiB (the largest positive int mallopt takes) gives all but the pad back to the OS, and the next
    # iteration faults the last 0.25 GiB in again; with trimming off, nothing faults.
    mib = 1280
    refaulted_pages = (mib * 2**20 - TOP_PAD_BYTES) // 4096

    def faults(trim_at: int | None) -> int:
        return _faults_printed_by(_FAULTS_AFTER_FREEING_AT_THE_TOP.format(root=_ROOT, mib=mib, trim_at=trim_at))

    assert faults(trim_at=2**31 - 1) > refaulted_pages * 9 // 10
    assert faults(trim_at=None) < refaulted_pages // 50
