"""The cores a machine shares out among its local ranks (no torch: the launcher and the CLI need it to start)."""

from __future__ import annotations

import os

__all__ = ["rank_threads"]


def rank_threads(world_size: int) -> int:
    """torch intra-op threads each of ``world_size`` local processes gets: the cores shared out, at least 1."""
    return max(1, (os.cpu_count() or 1) // world_size)
