"""How far a short model's learned schedule ratios move from one learning launch to the next.

``pipeplan profile`` learns what each schedule costs a short model from its plan's ratio to the 1F1B plan,
measured in interleaved launches (planner/runtime/model_cost.py: every plan at the largest profiled micro-batch
size, at two micro-batch counts, the 1F1B plan's second copy last). This runs those same launches several times
on one profile, alternating the round budgets given (``--budgets``, each as ``LEARNING_BUDGET_S`` would be: split
over ``LEARNING_LAUNCHES`` launches), and reports per budget:

- launch to launch: the standard deviation of each plan's log ratio to 1F1B over the launches (median and worst
  over the plans), the spread a profile's learned ratio carries from one launch;
- within a launch: the same from resampling one launch's rounds (bootstrap, 200 draws), averaged over the
  launches: where it is as large as the launch-to-launch spread, more rounds are what narrows it;
- the 1F1B plan's two copies: the spread of their ratio round by round (one round's noise), and the ratio itself
  (exactly 1 if nothing but the plan mattered).

    python benchmarks/bench_learning.py --model mlp --budgets 45,90 --launches 4 --out DIR [--profile P]
"""

from __future__ import annotations

import argparse
import json
import math
import random
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import run_started, table_from_markdown, write_record  # noqa: E402

from planner.calibration import shipped_calibration  # noqa: E402
from planner.runtime.interleave import InterleavedRun, rounds_within, verify_plans  # noqa: E402
from planner.runtime.model_cost import (  # noqa: E402
    LEARNING_LAUNCHES,
    LEARNING_MAX_ROUNDS,
    LEARNING_ROUNDS,
    default_global_batch,
    learning_plans,
)
from profiles.format import Profile, load_profile, save_profile  # noqa: E402
from profiles.from_spec import profile_spec  # noqa: E402
from profiles.profile_options import ProfileOptions  # noqa: E402

BOOTSTRAP_DRAWS = 200


def log_ratios(round_s: list[list[float]], anchor: tuple[int, int]) -> list[list[float]]:
    """Per plan, per round: its log time over the anchor copies' (geometric mean), as ``InterleavedRun.ratio``."""
    a, b = anchor
    return [
        [math.log(t) - (math.log(round_s[a][r]) + math.log(round_s[b][r])) / 2 for r, t in enumerate(times)]
        for times in round_s
    ]


def bootstrap_sd(xs: list[float], rng: random.Random) -> float:
    """The standard deviation of the median of ``xs`` over resamplings of ``xs``."""
    draws = [statistics.median(rng.choices(xs, k=len(xs))) for _ in range(BOOTSTRAP_DRAWS)]
    return statistics.pstdev(draws)


def summary(launches: list[list[list[float]]]) -> dict:
    """The spreads (in %) of one budget's launches (each: per plan, per round, iteration seconds)."""
    n = len(launches[0])
    anchor = (0, n - 1)
    per_launch = [log_ratios(run, anchor) for run in launches]
    plans = range(1, n - 1)
    between = [statistics.pstdev([statistics.median(lr[k]) for lr in per_launch]) * 100 for k in plans]
    rng = random.Random(0)
    within = [statistics.fmean(bootstrap_sd(lr[k], rng) for lr in per_launch) * 100 for k in plans]
    copies = [[math.log(run[0][r] / run[n - 1][r]) for r in range(len(run[0]))] for run in launches]
    return {
        "launches": len(launches),
        "rounds": len(launches[0][0]),
        "between_launches_sd_pct": {"median": statistics.median(between), "worst": max(between)},
        "within_launch_sd_pct": {"median": statistics.median(within), "worst": max(within)},
        "copies_round_sd_pct": statistics.median(statistics.pstdev(c) * 100 for c in copies),
        "copies_ratio_pct": [(math.exp(statistics.median(c)) - 1) * 100 for c in copies],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="mlp", help="a MODEL spec, as for pipeplan profile")
    parser.add_argument("--profile", type=Path, default=None, help="its profile (default: profile it, no learning)")
    parser.add_argument("--budgets", default="45,90", help="round budgets in seconds, alternated launch by launch")
    parser.add_argument("--launches", type=int, default=4, help="launches per budget")
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()
    started = run_started()
    args.out.mkdir(parents=True, exist_ok=True)
    options = ProfileOptions(model=args.model, no_progress=True)
    profile: Profile = load_profile(args.profile) if args.profile else profile_spec(options)
    if args.profile is None:
        save_profile(profile, args.out / "profile.json")
    shipped = shipped_calibration(profile.device.kind)
    batch = default_global_batch(profile, shipped.num_ranks)
    plans = learning_plans(profile, shipped, batch, sha256="0" * 64, every_schedule=True)
    launch = [*plans, plans[0]]  # as model_cost.learn_model_cost: the 1F1B plan's second copy last
    budgets = [float(b) for b in args.budgets.split(",")]
    rounds = {
        b: rounds_within(launch, b / LEARNING_LAUNCHES, at_least=LEARNING_ROUNDS, at_most=LEARNING_MAX_ROUNDS)
        for b in budgets
    }
    raw: dict[float, list[list[list[float]]]] = {b: [] for b in budgets}
    for index in range(args.launches):
        for budget in budgets:  # alternated, so a slow stretch of the machine weighs on every budget alike
            started = time.perf_counter()
            run: InterleavedRun = verify_plans(launch, args.model, rounds=rounds[budget], timeout_s=1800)
            raw[budget].append([list(times) for times in run.round_iteration_s])
            print(
                f"budget {budget:g} s, launch {index + 1}: {rounds[budget]} rounds, "
                f"{time.perf_counter() - started:.0f} s",
                file=sys.stderr,
            )
    result = {
        "model": args.model,
        "plans": [
            f"{p.schedule.value} v={p.virtual_stages} b={p.micro_batch_size} x{p.num_microbatches}" for p in launch
        ],
        "budgets": {f"{b:g}": {**summary(raw[b]), "round_iteration_s": raw[b]} for b in budgets},
    }
    (args.out / "learning.json").write_text(json.dumps(result, indent=2))
    lines = [
        "| budget | launches x rounds | plan vs 1F1B, launch to launch: sd median / worst | within a launch "
        "(bootstrap): median / worst | 1F1B copies: one round's sd | 1F1B copies: ratio - 1 |",
        "|---|---|---|---|---|---|",
    ]
    for b in budgets:
        s = result["budgets"][f"{b:g}"]
        copies = ", ".join(f"{c:+.1f}" for c in s["copies_ratio_pct"])
        lines.append(
            f"| {b:g} s | {s['launches']} x {s['rounds']} | {s['between_launches_sd_pct']['median']:.1f} % / "
            f"{s['between_launches_sd_pct']['worst']:.1f} % | {s['within_launch_sd_pct']['median']:.1f} % / "
            f"{s['within_launch_sd_pct']['worst']:.1f} % | {s['copies_round_sd_pct']:.1f} % | {copies} % |"
        )
    text = "\n".join(lines)
    (args.out / "learning.md").write_text(text + "\n")
    print(text)
    write_record("learning", result, started=started, tables={"budgets": table_from_markdown(text)})


if __name__ == "__main__":
    from planner.runtime.launch import signals_interrupt

    with signals_interrupt():  # a SIGTERM stops the ranks too
        main()
