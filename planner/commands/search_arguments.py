"""The plan search's options, shared by ``plan`` and ``tune``, and the cluster options of ``plan``."""

from __future__ import annotations

import argparse

from planner.commands.options import (
    auto_or_positive_int,
    bandwidth,
    heads_pair,
    int_range,
    memory,
    memory_list,
    nonneg_float,
    pin,
    positive_float,
    speed_list,
    tensor_parallel_degree,
)
from planner.limits import MAX_DEVICES, MAX_GLOBAL_BATCH, MAX_RANKS, MAX_UNITS
from planner.schedule.orders import Schedule

__all__ = ["add_cluster_arguments", "add_search_arguments"]


def add_cluster_arguments(p: argparse.ArgumentParser) -> None:
    g = p.add_argument_group(
        "cluster plans",
        "With --devices N the plan is a pp x dp mesh: pp pipeline ranks (--ranks fixes it) times dp replicas of\n"
        "the pipeline, each stage's gradients reduced over its replicas; --global-batch is the whole step's.\n"
        "--tensor-parallel makes it pp x tp x dp: each pipeline rank a group of tp devices inside a node.",
    )
    g.add_argument(
        "--devices",
        type=int_range(1, MAX_DEVICES),
        default=None,
        metavar="N",
        help="devices to plan for: a pp x dp cluster plan (default: one pipeline of --ranks devices)",
    )
    g.add_argument(
        "--devices-per-node",
        type=int_range(1, MAX_DEVICES),
        default=None,
        metavar="G",
        help="devices per node (default: all on one node)",
    )
    g.add_argument(
        "--intra-node-bandwidth",
        type=bandwidth,
        default=None,
        metavar="450GB/s",
        help="per device, each way, inside a node (default: cuda 450GB/s, cpu 1.1GB/s)",
    )
    g.add_argument(
        "--inter-node-bandwidth",
        type=bandwidth,
        default=None,
        metavar="50GB/s",
        help="per device, each way, between nodes (default: cuda 50GB/s, cpu 1.1GB/s)",
    )
    g.add_argument(
        "--shard",
        choices=("none", "optimizer", "full"),
        default="none",
        help="what the replicas split: none = nothing (DDP), optimizer = optimizer state (ZeRO-1), full = "
        "weights, gradients and optimizer state (FSDP)",
    )
    g.add_argument(
        "--tensor-parallel",
        type=tensor_parallel_degree,
        default=None,
        metavar="auto|T",
        help="tensor-parallel degree tp: each pipeline rank of each replica is a group of T devices in one node "
        "whose transformer blocks are split T ways (--tp-layout says what else); auto searches every T that divides "
        "--devices-per-node and the attention heads (default 1: no tensor parallelism)",
    )
    g.add_argument(
        "--tp-layout",
        choices=("blocks", "megatron"),
        default=None,
        help="with --tensor-parallel: what the runtime that runs the plan splits. blocks = pipeplan's runtime "
        "(apply_plan, verify): the blocks only, embeddings, head and sequence whole; megatron = Megatron-Core and "
        "torchtitan (for export): the embedding and head by vocabulary too, sequence parallelism on unless "
        "--sequence-parallel off; verify refuses it (default megatron with --for megatron|torchtitan, else blocks)",
    )
    g.add_argument(
        "--sequence-parallel",
        choices=("on", "off"),
        default=None,
        help="with --tp-layout megatron: split the activations outside the matrices too (Megatron's "
        "--sequence-parallel; default on)",
    )
    g.add_argument(
        "--attention-heads",
        type=heads_pair,
        default=None,
        metavar="H[,KV]",
        help="with --tensor-parallel: the model's attention heads (and key-value heads), which tp must divide "
        "(default: what the profile records)",
    )
    g.add_argument(
        "--jobs",
        type=int_range(1, 256),
        default=None,
        metavar="J",
        help="layouts searched at once, in worker processes (default: the CPUs; the plan is the same)",
    )


def add_search_arguments(p: argparse.ArgumentParser, *, cluster: bool) -> None:
    """The plan search's options, shared by ``plan`` and ``tune`` (``cluster``: ``plan``'s --devices exists)."""
    p.add_argument(
        "--ranks",
        "--stages",
        dest="ranks",
        type=int_range(1, MAX_RANKS),
        default=None,
        metavar="P",
        help="pipeline ranks (devices), P; each holds one stage, or several under an interleaved schedule"
        + ("; with --devices: the pipeline degree pp, fixed (default: searched)" if cluster else ""),
    )
    p.add_argument(
        "--global-batch",
        type=int_range(1, MAX_GLOBAL_BATCH),
        required=True,
        metavar="B",
        help="samples per iteration, B = micro-batch size b x micro-batch count M",
    )
    p.add_argument(
        "--memory",
        type=memory,
        default=None,
        metavar="80GiB",
        help="memory of every device (default: the profiled device's; on CPU, shared by the ranks of one "
        "machine), less 10%% headroom",
    )
    p.add_argument(
        "--device-memory",
        type=memory_list,
        default=None,
        metavar="80GiB,40GiB,...",
        help="memory per rank, one value each (heterogeneous devices; default: --memory)",
    )
    p.add_argument(
        "--device-speeds",
        type=speed_list,
        default=None,
        metavar="1,1,0.5,...",
        help="speed per rank relative to the profiled device, one value each (uses the ILP; default: all 1)",
    )
    p.add_argument(
        "--bandwidth",
        type=bandwidth,
        default=None,
        metavar="25GB/s",
        help="link bandwidth per pipeline hop, bytes or bits per second: 25GB/s, 100Gbps (default: the "
        "calibration's measured link; without one, cpu 1.1GB/s, cuda 25GB/s)",
    )
    p.add_argument(
        "--latency",
        type=nonneg_float,
        default=None,
        metavar="SECONDS",
        help="link latency per message, in seconds (default: the calibration's; without one, cpu 130e-6, cuda 10e-6)",
    )
    p.add_argument(
        "--optimizer",
        choices=("sgd", "adam"),
        default="adam",
        help="the optimizer: decides the state kept per parameter and the step time (default adam)",
    )
    p.add_argument(
        "--schedule",
        choices=("auto", *(x.value for x in Schedule if x is not Schedule.NAIVE)),
        default="auto",
        help="the pipeline schedule (torch.distributed.pipelining's): auto searches every one (the split-backward "
        "zero-bubble, zbv and dualpipev when the profile measured the split); gpipe: all forwards, then all "
        "backwards; 1f1b: one forward, one backward; interleaved-1f1b and looped-bfs: several stages per rank; "
        "zero-bubble, zbv, dualpipev: the weight gradient apart, filling the bubble (default auto)",
    )
    p.add_argument(
        "--micro-batch-size",
        type=auto_or_positive_int,
        default=None,
        metavar="auto|N",
        help="samples per micro-batch b; auto searches every profiled size that divides --global-batch (default auto)",
    )
    p.add_argument(
        "--recompute",
        choices=("auto", "on", "off"),
        default="auto",
        help="activation recomputation: chosen per stage (auto), on or off",
    )
    p.add_argument(
        "--solver",
        choices=("auto", "dp", "ilp"),
        default="auto",
        help="the exact solver of the boundaries: dp (fast), ilp (pulp; needed for --pin, --device-speeds, "
        "--max-units-per-stage); auto picks (default auto)",
    )
    p.add_argument(
        "--calibration",
        default="auto",
        metavar="auto|none|CALIBRATION.json",
        help="runtime terms (overhead per action, optimizer, tied-gradient sum, co-location): auto = the one the "
        "profile learned from a short pipeline run of its model (`pipeplan profile` on a CPU), else the one shipped "
        "for the profile's device (cpu: measured on gloo; cuda: estimated), none = compute and links only, "
        "or a file from `pipeplan calibrate` / `pipeplan tune` (default auto)",
    )
    p.add_argument(
        "--pin",
        type=pin,
        action="append",
        metavar="UNIT=STAGE",
        help="keep a unit on a stage, e.g. transformer.ln_f=3 (repeatable; uses the ILP; default: none)",
    )
    p.add_argument(
        "--max-units-per-stage",
        type=int_range(1, MAX_UNITS),
        default=None,
        help="at most this many units per stage (uses the ILP; default: no cap)",
    )
    p.add_argument("--time-limit", type=positive_float, default=60.0, help="ILP time limit in seconds (default 60)")
    p.add_argument(
        "--for",
        dest="trainer",
        choices=("torchtitan", "megatron", "deepspeed", "accelerate"),
        default=None,
        help="plan only what this trainer can run (its layout rules: e.g. Megatron keeps the embedding on the "
        "first stage and the final norm and head on the last), so `pipeplan export --to` it takes the plan "
        "(default: any plan torch runs)",
    )
