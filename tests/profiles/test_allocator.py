"""Keeping freed memory: glibc's mallopt accepts every setting, and a freed large block is reused, not re-faulted."""

from __future__ import annotations

import platform
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from profiles.allocator import keep_freed_memory

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


def _faults_of_last_iteration(keep: bool) -> int:
    code = _FAULTS_OF_LAST_ITERATION.format(root=str(Path(__file__).resolve().parents[2]), keep=keep)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return int(out.stdout.strip().splitlines()[-1])


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
