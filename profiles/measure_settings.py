"""How :func:`profiles.profiler.profile_model` measures: the sizes, the device and dtype, the rounds, the units.

One frozen value, checked on construction, so that a bad setting is refused in one line before a model is
built. These are the measurement's settings, not the ``profile`` command's options
(:class:`profiles.profile_options.ProfileOptions`, whose defaults are the command line's):
:func:`profiles.from_spec.profile_spec` makes one from the other. No torch here.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from planner.errors import UsageError

__all__ = ["MeasureSettings", "DTYPE_NAMES", "CAPTURES", "MIN_TIME_S"]

DTYPE_NAMES = ("float32", "bfloat16", "float16")
"""The dtypes a profile is measured in (torch's names)."""
CAPTURES = ("export", "hooks")
"""How the units are cut out of the model: torch.export's graph, or eager modules with hooks."""

MIN_TIME_S = 2.0
"""The time the rounds of one micro-batch size span by default. A machine shared with other tenants changes
speed from one second to the next (``python benchmarks/bench_runtime_probes.py --only speed`` measures a fixed
step's median per second), so a small model whose rounds take a fraction of a second would see one moment of the
machine per size, and the ratio between sizes would be that moment's; over two seconds the median sees several."""


@dataclass(frozen=True, kw_only=True)
class MeasureSettings:
    """What :func:`~profiles.profiler.profile_model` measures and how long (see its docstring for the rounds)."""

    micro_batch_sizes: tuple[int, ...] = (1, 2, 4)
    """The micro-batch sizes to measure, each a positive integer, no duplicates (measured in ascending order);
    any sequence is kept as a tuple."""
    device: str = "cpu"
    """Where to measure: ``cpu`` or ``cuda`` (checked against the machine when measuring)."""
    dtype: str = "float32"
    """The weights' and activations' dtype, one of :data:`DTYPE_NAMES`."""
    repeats: int = 5
    """Timed round-robin rounds at least (each times every unit once); the median is kept."""
    max_repeats: int | None = None
    """Timed rounds at most, while the unit sum's ratio to the whole model is not yet known to ``stable_within``;
    None: ``repeats``."""
    stable_within: float = 0.02
    """The unit sum's ratio to the whole model counts as known once its median's standard error is at most this
    fraction of it (0 < x < 1)."""
    warmup: int = 2
    """Untimed runs of each unit before its first timed one."""
    units: Sequence[str] | int | None = None
    """Unit FQNs in execution order, or a module depth; None: the workload's, else the default choice."""
    progress: bool = True
    """Show a progress bar while measuring."""
    capture: str | None = None
    """Force one of :data:`CAPTURES`; None: export, hooks where the model cannot be exported."""
    sample_blocks: bool = False
    """A meta model only: measure one unit of each run of identical consecutive units, copy it to the others."""
    min_time_s: float = MIN_TIME_S
    """Rounds also go on until they span this many seconds of wall time per size (:data:`MIN_TIME_S`)."""

    def __post_init__(self) -> None:
        """:class:`UsageError` for a value out of range (what depends on the model is checked when measuring)."""
        sizes = tuple(self.micro_batch_sizes)
        object.__setattr__(self, "micro_batch_sizes", sizes)  # frozen: a list given would stay mutable
        if not sizes or any(not isinstance(b, int) or b <= 0 for b in sizes):
            raise UsageError(f"micro-batch sizes must be positive integers, got {list(sizes)}")
        if len(set(sizes)) != len(sizes):
            raise UsageError(f"micro-batch sizes have duplicates: {list(sizes)}")
        if self.repeats < 1 or self.warmup < 0:
            raise UsageError(f"repeats must be >= 1 and warmup >= 0, got repeats={self.repeats}, warmup={self.warmup}")
        if self.max_repeats is not None and self.max_repeats < self.repeats:
            raise UsageError(
                f"max repeats must be >= repeats, got max_repeats={self.max_repeats}, repeats={self.repeats}"
            )
        if not (math.isfinite(self.min_time_s) and self.min_time_s >= 0):
            raise UsageError(f"min_time_s must be a finite number of seconds >= 0, got {self.min_time_s}")
        if not 0 < self.stable_within < 1:
            raise UsageError(f"stable_within must be between 0 and 1 (a fraction), got {self.stable_within}")
        if self.dtype not in DTYPE_NAMES:
            raise UsageError(f"unknown dtype {self.dtype!r}: use one of {', '.join(DTYPE_NAMES)}")
        if self.capture not in (None, *CAPTURES):
            raise UsageError(f"unknown capture {self.capture!r}: use export or hooks")
