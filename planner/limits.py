"""The largest inputs pipeplan accepts, and the checks that refuse more, at the edges.

Each bound keeps a command within seconds on a 2-core CPU: ``plan`` and ``simulate`` at the largest
inputs accepted finish in seconds, as ``python benchmarks/bench_planner_scale.py`` measures (docs/BENCHMARKS.md,
"Planner scale"). Past a bound a command refuses at once, naming the bound, instead of running for minutes or exhausting
memory. The checks live where input enters (the CLI, the file readers, ``PlanRequest``), not inside the
solvers or the simulator. README, "Limits", lists them.
"""

from __future__ import annotations

from collections.abc import Sequence

from planner.errors import UsageError

__all__ = [
    "MAX_FILE_BYTES",
    "MAX_JSON_DEPTH",
    "MAX_JSON_INT",
    "MAX_SECONDS",
    "MAX_UNITS",
    "MAX_TENSORS",
    "MAX_PROFILED_SIZES",
    "MAX_RANKS",
    "MAX_MICROBATCHES",
    "MAX_GLOBAL_BATCH",
    "MAX_PLAN_WORK",
    "MAX_SIMULATED",
    "MAX_REPEATS",
    "MAX_STEPS",
    "check_at_most",
    "check_plan_work",
    "check_simulation",
]

MAX_FILE_BYTES = 32 * 2**20
"""A profile or plan file: 32 MiB (a 1,024-unit profile is about 1 MiB)."""
MAX_JSON_DEPTH = 32
"""Nesting of JSON objects and arrays; the formats need 5."""
MAX_JSON_INT = 2**53
"""Largest integer magnitude in a file: counts and bytes stay exact as a float (8 PiB)."""
MAX_SECONDS = 1e9
"""Largest time in a file or argument (31 years): sums over stages and micro-batches stay finite."""
MAX_UNITS = 2048
"""Units in a profile (and so in a plan). 2,000 units plan in under 10 s at every rank count (section 8 of
docs/BENCHMARKS.md); the slowest is 2 ranks, where the DP's stages are widest."""
MAX_TENSORS = 16 * MAX_UNITS
"""Tensor flows between units in a profile."""
MAX_PROFILED_SIZES = 64
"""Micro-batch sizes in a profile."""
MAX_RANKS = 64
"""Pipeline ranks (devices): ``--ranks``, ``--device-memory`` / ``--device-speeds`` entries."""
MAX_DEVICES = 65536
"""Devices of a cluster plan (``--devices``): pipeline ranks x data-parallel replicas."""
MAX_MICROBATCHES = 1024
"""Micro-batches per iteration (``simulate --micro-batches``, a plan's ``num_microbatches``)."""
MAX_GLOBAL_BATCH = 65536
"""Samples per iteration (``plan --global-batch``), and the largest micro-batch size."""
MAX_PLAN_WORK = 4096
"""``plan``: ranks x the most micro-batches a searched micro-batch size gives."""
MAX_SIMULATED = 131072
"""``simulate``: stages x micro-batches (each is a forward and a backward action)."""
MAX_REPEATS = 1000
"""``profile --repeats`` / ``--warmup``."""
MAX_STEPS = 10000
"""``verify --steps`` / ``--warmup``."""


def check_at_most(what: str, value: int | float, limit: int | float, fix: str = "") -> None:
    """Raise :class:`UsageError` naming ``what`` and the limit when ``value`` exceeds it."""
    if value > limit:
        shown = f"{value:,}" if isinstance(value, int) and value < 10**30 else f"{value:.3g}"
        raise UsageError(f"{what} is {shown}, over pipeplan's limit of {limit:,}" + (f": {fix}" if fix else ""))


def check_plan_work(num_ranks: int, global_batch_size: int, micro_batch_sizes: Sequence[int]) -> None:
    """Refuse a plan search whose largest micro-batch count (smallest dividing size) is too much work.

    The search simulates every dividing micro-batch size; its cost grows with ranks x micro-batches.
    """
    dividing = [b for b in micro_batch_sizes if b > 0 and global_batch_size % b == 0]
    if not dividing:
        return  # the search says which sizes would divide
    b = min(dividing)
    m = global_batch_size // b
    check_at_most(
        f"micro-batches (global batch {global_batch_size} / micro-batch size {b})",
        m,
        MAX_MICROBATCHES,
        "pass a larger --micro-batch-size, or profile larger sizes",
    )
    check_at_most(
        f"ranks x micro-batches ({num_ranks} x {m})",
        num_ranks * m,
        MAX_PLAN_WORK,
        "pass a larger --micro-batch-size or use fewer --ranks",
    )


def check_simulation(num_stages: int, num_microbatches: int) -> None:
    """Refuse a simulation of more stage x micro-batch pairs than :data:`MAX_SIMULATED`."""
    check_at_most("micro-batches", num_microbatches, MAX_MICROBATCHES)
    check_at_most(
        f"stages x micro-batches ({num_stages} x {num_microbatches})",
        num_stages * num_microbatches,
        MAX_SIMULATED,
        "simulate fewer micro-batches or stages",
    )
