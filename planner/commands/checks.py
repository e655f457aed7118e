"""Options that would do nothing in the command given: refused in one line, never silently ignored."""

from __future__ import annotations

import argparse

from planner.errors import UsageError

__all__ = ["refuse_idle_options", "CLUSTER_ONLY", "TENSOR_PARALLEL_ONLY", "WHAT_IF"]

CLUSTER_ONLY = (
    "devices_per_node",
    "intra_node_bandwidth",
    "inter_node_bandwidth",
    "shard",
    "tensor_parallel",
    "tp_layout",
    "sequence_parallel",
    "attention_heads",
    "jobs",
)
"""``plan`` options that shape a cluster plan: without ``--devices`` there is none."""
TENSOR_PARALLEL_ONLY = ("tp_layout", "sequence_parallel", "attention_heads")
"""``plan`` options that shape tensor parallelism: without ``--tensor-parallel`` there is none."""
WHAT_IF = ("ranks", "micro_batches", "schedule", "virtual_stages", "stage_times", "backward_times", "weight_times")
"""``simulate`` options that describe a pipeline by hand: a plan brings its own."""


def _flags(args: argparse.Namespace, names: tuple[str, ...], idle: tuple[object, ...] = (None,)) -> list[str]:
    return [f"--{name.replace('_', '-')}" for name in names if getattr(args, name, None) not in idle]


def refuse_idle_options(args: argparse.Namespace) -> None:
    """Raise UsageError naming the options ``args`` gives that its command would not use."""
    if args.command == "plan" and args.devices is None:
        given = _flags(args, CLUSTER_ONLY, (None, "none"))
        if given:
            raise UsageError(f"{', '.join(given)}: options of a cluster plan, which --devices N asks for")
    if args.command == "plan" and args.devices is not None and getattr(args, "tensor_parallel", None) in (None, 1):
        given = _flags(args, TENSOR_PARALLEL_ONLY)
        if given:
            raise UsageError(
                f"{', '.join(given)}: options of tensor parallelism, which --tensor-parallel T|auto asks for"
            )
    if args.command == "simulate":
        if args.compare_out and not args.compare:
            raise UsageError("--compare-out draws the schedules of --compare: give --compare gpipe,1f1b,... too")
        given = _flags(args, WHAT_IF) + (["--backward-ratio"] if args.backward_ratio != 1.0 else [])
        if args.plan and given:
            raise UsageError(
                f"{', '.join(given)}: what-if options, for a pipeline given by hand; a plan is simulated as planned "
                "(to see it under other schedules: --compare gpipe,1f1b,...)"
            )
