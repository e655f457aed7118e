"""Options that would do nothing in the command given: refused in one line, never silently ignored."""

from __future__ import annotations

import dataclasses

from planner.commands.command_options import PlanCommand
from planner.errors import UsageError
from planner.options import flag_of
from planner.simulate_options import SimulateOptions

__all__ = ["refuse_idle_plan_options", "refuse_idle_simulate_options", "TENSOR_PARALLEL_ONLY", "WHAT_IF"]

TENSOR_PARALLEL_ONLY = ("tp_layout", "sequence_parallel", "attention_heads")
"""``plan`` options that shape tensor parallelism: without ``--tensor-parallel`` there is none."""
WHAT_IF = ("ranks", "micro_batches", "schedule", "virtual_stages", "stage_times", "backward_times", "weight_times")
"""``simulate`` options that describe a pipeline by hand: a plan brings its own."""


def _flags(options: object, names: tuple[str, ...], idle: tuple[object, ...] = (None,)) -> list[str]:
    fields = {field.name: field for field in dataclasses.fields(options)}  # type: ignore[arg-type]
    return [flag_of(fields[name]) for name in names if getattr(options, name) not in idle]


def refuse_idle_plan_options(options: PlanCommand) -> None:
    """Raise UsageError naming the cluster options ``plan`` is given without ``--devices`` (every field of
    :class:`~planner.request.ClusterOptions` but ``--devices`` itself), or the tensor-parallel ones without
    ``--tensor-parallel``."""
    cluster = options.cluster
    if cluster.devices is None:
        names = tuple(field.name for field in dataclasses.fields(cluster) if field.name != "devices")
        given = _flags(cluster, names, (None, "none"))
        if given:
            raise UsageError(f"{', '.join(given)}: options of a cluster plan, which --devices N asks for")
    elif cluster.tensor_parallel in (None, 1):
        given = _flags(cluster, TENSOR_PARALLEL_ONLY)
        if given:
            raise UsageError(
                f"{', '.join(given)}: options of tensor parallelism, which --tensor-parallel T|auto asks for"
            )


def refuse_idle_simulate_options(options: SimulateOptions) -> None:
    """Raise UsageError on ``--compare-out`` without ``--compare``, and on what-if options beside a plan."""
    if options.compare_out and not options.compare:
        raise UsageError("--compare-out draws the schedules of --compare: give --compare gpipe,1f1b,... too")
    given = _flags(options, WHAT_IF) + (["--backward-ratio"] if options.backward_ratio != 1.0 else [])
    if options.plan and given:
        raise UsageError(
            f"{', '.join(given)}: what-if options, for a pipeline given by hand; a plan is simulated as planned "
            "(to see it under other schedules: --compare gpipe,1f1b,...)"
        )
