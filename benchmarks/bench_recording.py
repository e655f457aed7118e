"""What recording a training loop's actions costs a step (``planner.apply_plan(..., record=True)``).

gpt2-small cut in two at ``transformer.h.6``, 1F1B, 2 gloo processes of 1 thread, Adam stepped after each step,
as a user's loop runs it (docs/run-record.md). One run steps in rounds: in each, a block of steps with recording
off and a block with it on (``start_recording`` / ``stop_recording``), their order alternating from round to
round, each step timed on every rank from a barrier to its optimizer's end. The report: the median step with
recording on and off, the median over rounds of the two blocks' ratio (which holds while the machine's speed
moves) with its 95 % bootstrap interval (how finely this machine's swings let the rounds resolve the overhead),
and the recorder's own cost per action, timed on its own (a wrapped no-op, the pair of clock readings and the
append) times the actions a rank records per step, over the step.

    python benchmarks/bench_recording.py [--rounds 10] [--block 2] [--microbatches 4] [--seq-len 128] [--quick]
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import run_started, tables_in, tee_stdout, write_record  # noqa: E402

from planner.cost import MemoryBreakdown  # noqa: E402
from planner.plan import Plan, Prediction, SolverInfo, StagePlan  # noqa: E402
from planner.runtime.launch import run_ranks  # noqa: E402
from planner.schedule.orders import Schedule  # noqa: E402
from profiles.fingerprint import model_fingerprint  # noqa: E402
from profiles.models import BUILTIN_MODELS  # noqa: E402

MODEL = "gpt2-small"
SPLIT = "transformer.h.6"


def _plan(microbatches: int, seq_len: int) -> Plan:
    """gpt2-small in two stages under 1F1B, micro-batches of 1: the stages and schedule a plan would give (its
    prediction is not used here)."""
    workload = BUILTIN_MODELS[MODEL](seq_len=seq_len)
    units = list(workload.units or ())
    cut = units.index(SPLIT)
    memory = MemoryBreakdown(params=0, grads=0, optimizer=0, activations=0, transient=0, peak=0)
    stages = tuple(
        StagePlan(s, s, tuple(part), False, 0.1, 0.2, 0, 1, memory) for s, part in enumerate((units[:cut], units[cut:]))
    )
    return Plan(
        model_name=f"{MODEL}:seq_len={seq_len}" if seq_len != 128 else MODEL,
        model_fingerprint=model_fingerprint(workload.model),
        profile_sha256="0" * 64,
        device={"kind": "cpu"},
        num_stages=2,
        num_ranks=2,
        schedule=Schedule.ONE_F_ONE_B,
        virtual_stages=1,
        micro_batch_size=1,
        num_microbatches=microbatches,
        global_batch_size=microbatches,
        stages=stages,
        split_points=(SPLIT,),
        predicted=Prediction(1.0, 1.0, 0.0, microbatches, 0),
        solver=SolverInfo(name="hand", objective="none", optimal=False),
    )


def _recorder_cost_s(repeats: int = 200_000) -> float:
    """The recorder's own cost per action: a wrapped no-op less the bare no-op, per call."""
    from planner.runtime.recording import ActionRecorder, StepSample, _OpenStep

    recorder = ActionRecorder([], None, __import__("torch").device("cpu"), [], None)
    recorder._open = _OpenStep(StepSample(0.0), 0.0, actions=[[]])

    def bare() -> None:
        return None

    wrapped = recorder._timed(bare, "F", 0)
    t0 = time.perf_counter()
    for _ in range(repeats):
        bare()
    t1 = time.perf_counter()
    for _ in range(repeats):
        wrapped()
    t2 = time.perf_counter()
    return max(0.0, (t2 - t1) - (t1 - t0)) / repeats


def _rank_main(rank: int, world_size: int, plan: Plan, seq_len: int, rounds: int, block: int) -> dict:
    import torch
    import torch.distributed as dist

    from planner.runtime.recorded_run import apply_plan

    workload = BUILTIN_MODELS[MODEL](seq_len=seq_len)
    x, y = workload.make_batch(plan.global_batch_size)
    run = apply_plan(plan, workload.model, x, workload.loss_fn, device="cpu")
    optimizer = torch.optim.Adam(run.parameters(), lr=1e-5)

    def step() -> float:
        dist.barrier()
        t0 = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        run.step(x, y)
        optimizer.step()
        return time.perf_counter() - t0

    for _ in range(2):  # warm-up: the first steps run slow
        step()
    on: list[list[float]] = []
    off: list[list[float]] = []
    for r in range(rounds):
        for recording in (r % 2 == 0, r % 2 == 1):
            if recording:
                run.start_recording()
            (on if recording else off).append([step() for _ in range(block)])
            if recording:
                run.stop_recording()
    actions = max(len(s.actions[0]) + len(s.waits) for s in run.recorder.samples()) if run.recorder else 0
    return {"on": on, "off": off, "actions_per_step": actions, "cost_per_action_s": _recorder_cost_s()}


def _median_interval(values: list[float], draws: int = 2000) -> tuple[float, float]:
    """The 95 % bootstrap interval of the median of ``values`` (seeded: the same rounds give the same interval)."""
    rng = random.Random(0)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(draws))
    return medians[int(0.025 * draws)], medians[int(0.975 * draws) - 1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--block", type=int, default=2, help="steps per block (default 2)")
    parser.add_argument("--microbatches", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument(
        "--quick", action="store_true", help="a trial: 2 rounds of 1 step, 2 micro-batches of 32 tokens"
    )
    args = parser.parse_args()
    if args.quick:
        args.rounds, args.block, args.microbatches, args.seq_len = 2, 1, 2, 32
    started, printed = run_started(), tee_stdout()
    plan = _plan(args.microbatches, args.seq_len)
    results = run_ranks(
        _rank_main, (plan, args.seq_len, args.rounds, args.block), 2, timeout_s=3600, backend="gloo", threads=1
    )
    # The step is the slower rank's (both ranks time from the same barrier).
    on = [
        max(a, b)
        for r0, r1 in zip(results[0]["on"], results[1]["on"], strict=True)
        for a, b in zip(r0, r1, strict=True)
    ]
    off = [
        max(a, b)
        for r0, r1 in zip(results[0]["off"], results[1]["off"], strict=True)
        for a, b in zip(r0, r1, strict=True)
    ]
    ratios = [
        statistics.median(max(a, b) for a, b in zip(n0, n1, strict=True))
        / statistics.median(max(a, b) for a, b in zip(f0, f1, strict=True))
        for n0, n1, f0, f1 in zip(results[0]["on"], results[1]["on"], results[0]["off"], results[1]["off"], strict=True)
    ]
    step_s = statistics.median(off)
    low, high = _median_interval(ratios)
    actions = max(r["actions_per_step"] for r in results)
    per_action = statistics.median(r["cost_per_action_s"] for r in results)
    numbers = {
        "model": MODEL,
        "ranks": 2,
        "microbatches": args.microbatches,
        "seq_len": args.seq_len,
        "rounds": args.rounds,
        "block": args.block,
        "step_off_median_s": step_s,
        "step_on_median_s": statistics.median(on),
        "overhead_of_medians_pct": (statistics.median(on) / step_s - 1) * 100,
        "overhead_median_ratio_pct": (statistics.median(ratios) - 1) * 100,
        "overhead_interval_95_pct": [(low - 1) * 100, (high - 1) * 100],
        "rounds_slower_with_recording": sum(r > 1 for r in ratios),
        "round_ratios": ratios,
        "actions_per_step": actions,
        "cost_per_action_us": per_action * 1e6,
        "recorder_cost_pct": per_action * actions / step_s * 100,
        "steps_on_s": on,
        "steps_off_s": off,
    }
    print("| recording | step (median) | against off | rounds |")
    print("|---|---|---|---|")
    print(f"| off | {step_s:.3f} s | - | {args.rounds} |")
    print(
        f"| on | {statistics.median(on):.3f} s | {numbers['overhead_of_medians_pct']:+.2f} % of medians, "
        f"{numbers['overhead_median_ratio_pct']:+.2f} % median of rounds' ratios (95 % interval {(low - 1) * 100:+.1f} "
        f"to {(high - 1) * 100:+.1f} %; slower in {numbers['rounds_slower_with_recording']} of {args.rounds}) | "
        f"{args.rounds} |"
    )
    print(
        f"| the recorder alone | {per_action * 1e6:.2f} us x {actions} actions and waits a step | "
        f"{numbers['recorder_cost_pct']:.4f} % | - |"
    )
    tables = tables_in(printed.getvalue(), ("overhead",))
    write_record("recording", numbers, started=started, tables=tables, trial=args.quick)


if __name__ == "__main__":
    main()
