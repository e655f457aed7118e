"""Train with a pipeplan plan: ``torchrun --nproc-per-node P examples/train.py --plan plan.json``.

Every rank builds the same seeded model, keeps its plan stage(s) and steps the torch schedule; the
rank holding the last stage prints the loss. gloo on CPU, nccl when CUDA is available.

A cluster plan (``pipeplan plan --devices N``) runs on pp x dp processes, across machines like any
torchrun job; on each of 2 nodes with 8 GPUs::

    torchrun --nnodes 2 --nproc-per-node 8 --rdzv-backend c10d --rdzv-endpoint HOST:29500 \
        examples/train.py --plan cluster.plan.json

Each process takes its (replica, pipeline rank) from the plan's mesh, and its replica's slice of the batch.
With tensor parallelism (``--tensor-parallel T``) the mesh has pp x dp x T processes: each stage runs on a
group of T consecutive ranks that share its attention heads and MLP features.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

import planner  # noqa: E402
from planner.runtime.launch import PIN_ENV, pin_rank_cpus, rank_threads  # noqa: E402
from planner.runtime.recorded_run import RecordedRun  # noqa: E402
from planner.runtime.run_record import record_report  # noqa: E402
from profiles.workload import as_tuple, load_workload  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--plan", required=True, help="plan JSON written by `pipeplan plan`")
    parser.add_argument("--model", default=None, help="MODEL spec (default: the plan's model name)")
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument(
        "--record",
        default=None,
        metavar="RUN.json",
        help="time every step's actions against the plan and write the run record here (docs/run-record.md); "
        "`pipeplan calibrate --from-run RUN.json` refits a calibration from it",
    )
    args = parser.parse_args()

    use_cuda = torch.cuda.is_available()
    if not use_cuda:
        local_rank, local_world = int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("LOCAL_WORLD_SIZE", 1))
        threads = rank_threads(local_world)
        torch.set_num_threads(threads)
        if os.environ.get(PIN_ENV) == "1":  # before gloo starts its threads (launch.pin_rank_cpus says when)
            pin_rank_cpus(local_rank, local_world, threads)
    dist.init_process_group("nccl" if use_cuda else "gloo")
    rank = dist.get_rank()
    device = torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', rank))}" if use_cuda else "cpu")

    plan = planner.load_plan(args.plan)
    workload = load_workload(args.model or plan.model_name)
    # A cluster plan's step is every replica's batch; run.step hands each replica its slice.
    inputs, target = workload.make_batch(plan.mesh.global_batch_size if plan.mesh else plan.global_batch_size)
    inputs = tuple(t.to(device) for t in as_tuple(inputs))
    target = target.to(device)

    # A plan with tensor parallelism shards each stage over its tp ranks: the model's built-in layout, or the
    # Workload's tp_plan hook for a model without one.
    run = planner.apply_plan(
        plan,
        workload.model,
        inputs,
        workload.loss_fn,
        device=device,
        tp_plan=workload.tp_plan,
        record=bool(args.record),
    )
    optimizer = torch.optim.AdamW(run.parameters(), lr=args.lr)
    for step in range(args.steps):
        optimizer.zero_grad(set_to_none=True)
        loss = run.step(inputs, target)  # schedule step, then tied-weight gradients summed across ranks
        optimizer.step()
        if loss is not None and run.tp_rank == 0:  # every rank of the last stage's tp group has it
            print(f"step {step} loss {loss.item():.6f}", flush=True)
    if args.record:
        _write_record(run, args.record)
    dist.destroy_process_group()


def _write_record(run: RecordedRun, path: str) -> None:
    """Every rank hands its samples to rank 0, which writes the record and prints the report verify would."""
    record = run.save_record(path)  # a collective: every rank calls it
    if record is None:
        return
    print(f"wrote {path}", flush=True)
    if min(len(r.steps) for r in record.ranks) >= 3:  # the first step warms up; a step's time runs to the next
        print(planner.format_report(record_report(record)), flush=True)


if __name__ == "__main__":
    main()
