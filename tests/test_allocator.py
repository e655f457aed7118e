"""Keeping freed memory: glibc's mallopt is found and accepts every setting on Linux."""

from __future__ import annotations

import platform
import sys

import pytest

from profiles.allocator import keep_freed_memory


@pytest.mark.skipif(
    not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc", reason="needs glibc's mallopt"
)
def test_glibc_accepts_every_setting() -> None:
    assert keep_freed_memory() is True
