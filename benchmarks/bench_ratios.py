"""Fidelity as ratios: does the planner order candidate plans as they measure? The default path, no flags.

    python benchmarks/bench_ratios.py --out benchmarks/results/ratios [--models gpt2-tiny,mlp] [--rounds 15]

A machine whose speed moves by 1.5x within a minute cannot check an absolute prediction to 10 %, but it
can check a ratio measured in one run: for each model (P = 2 gloo processes, global batch 8):

1. ``pipeplan profile MODEL`` with default flags (a 2-rank pipeline's threads, the scaling to the others,
   and the model's own cost in a pipeline learned from short runs: 1F1B's, and every schedule's for a model
   whose 1F1B plan steps in under half a second; planner/runtime/model_cost.py);
2. ``pipeplan plan`` with default flags (the calibration the profile learned): its choice, the next distinct candidates
   it ranked, and the best plan under each of gpipe, 1f1b and interleaved-1f1b;
3. every distinct plan run for real in one launch (``planner.runtime.interleave.verify_plans``: 2 processes,
   optimizer step included), interleaved: in each round every plan runs a block of steps of at least 0.5 s;
4. for every pair of plans (a, b): the predicted ratio ``pred(a) / pred(b)`` against the measured one,
   ``median over rounds of meas(a) / meas(b)`` (a and b timed within seconds of each other); and
   whether ``plan``'s choice measured within 5 % of the fastest plan;
5. the absolute error as timed and at the machine's measured speed (the speed reference, timed in the rank
   processes at the threads each rank has), side by side.

Writes ``ratios.json`` and ``ratios.md`` into ``--out``; prints the table.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_fidelity import MODELS, SCHEDULES  # noqa: E402  (the same models and fixed schedules)

from planner.cost import default_settings  # noqa: E402
from planner.plan import Plan  # noqa: E402
from planner.request import PlanRequest, calibration_settings  # noqa: E402
from planner.runtime.interleave import InterleavedRun, verify_plans  # noqa: E402
from planner.runtime.model_cost import learn_after_profile  # noqa: E402
from planner.search import make_plan, make_plans, plan_key  # noqa: E402
from profiles.format import Profile, save_profile  # noqa: E402
from profiles.from_spec import profile_spec  # noqa: E402


def candidates(profile: Profile, ranks: int, batch: int, count: int) -> dict[str, Plan]:
    """``plan``'s choice and runners-up, and the best plan of each fixed schedule (distinct plans only)."""
    settings = default_settings(profile, **calibration_settings("auto", profile.device.kind, profile))
    ranked = make_plans(profile, PlanRequest(ranks, batch, settings=settings), sha256="0" * 64, count=count)
    named = {"plan's choice": ranked[0], **{f"runner-up {i}": p for i, p in enumerate(ranked[1:], 1)}}
    for schedule in SCHEDULES:
        try:
            request = PlanRequest(ranks, batch, schedule=schedule, settings=settings)
            named[schedule] = make_plan(profile, request, sha256="0" * 64)
        except Exception as exc:  # a schedule this model cannot take (too few units): say so, go on
            print(f"  {schedule}: not planned ({exc})", file=sys.stderr)
    distinct: dict[tuple[object, ...], str] = {}
    return {name: plan for name, plan in named.items() if distinct.setdefault(plan_key(plan), name) == name}


def measure(spec: str, plans: list[Plan], rounds: int) -> InterleavedRun:
    """Every plan in one launch, interleaved round by round (:func:`planner.runtime.interleave.verify_plans`)."""
    return verify_plans(plans, spec, rounds=rounds, timeout_s=1800)


def bench_model(spec: str, *, ranks: int, batch: int, rounds: int, count: int, out: Path) -> dict:
    started = time.perf_counter()
    profile, _ = learn_after_profile(profile_spec(spec, progress=False), spec)  # as `pipeplan profile` does
    save_profile(profile, out / f"{Path(spec).name.replace(':', '_')}.profile.json")
    named = candidates(profile, ranks, batch, count)
    names, plans = list(named), list(named.values())
    run = measure(spec, plans, rounds)
    predicted = [p.predicted.iteration_s for p in plans]
    measured = [r.measured_iteration_s for r in run.reports]
    at_speed = [r.at_profile_speed().measured_iteration_s for r in run.reports]
    pairs = []
    for a, b in itertools.combinations(range(len(plans)), 2):
        ratio_measured = run.ratio(a, b)
        ratio_predicted = predicted[a] / predicted[b]
        pairs.append(
            {
                "a": names[a],
                "b": names[b],
                "predicted_ratio": ratio_predicted,
                "measured_ratio": ratio_measured,
                "error_pct": (ratio_predicted / ratio_measured - 1) * 100,
            }
        )
    fastest = min(measured)
    return {
        "model": spec,
        "plans": [
            {
                "name": n,
                "schedule": p.schedule.value,
                "micro_batch_size": p.micro_batch_size,
                "split_points": list(p.split_points),
                "predicted_s": pr,
                "measured_s": m,
                "at_speed_s": s,
                "error_pct": (m / pr - 1) * 100,
                "error_at_speed_pct": (s / pr - 1) * 100,
            }
            for n, p, pr, m, s in zip(names, plans, predicted, measured, at_speed, strict=True)
        ],
        "pairs": pairs,
        "round_iteration_s": [list(r) for r in run.round_iteration_s],
        "learned_from": list(profile.pipeline_calibration["notes"]["model"]["schedules"])
        if profile.pipeline_calibration
        else [],
        "choice_vs_fastest_pct": (measured[0] / fastest - 1) * 100,
        "wall_s": time.perf_counter() - started,
    }


def table(results: list[dict]) -> str:
    lines = [
        "| model | plans | pairs: ratio error median / worst | plan's choice vs fastest "
        "| abs. error as timed / at speed (median) |",
        "|---|---|---|---|---|",
    ]
    for r in results:
        errors = sorted(abs(p["error_pct"]) for p in r["pairs"])
        timed = statistics.median(abs(p["error_pct"]) for p in r["plans"])
        speed = statistics.median(abs(p["error_at_speed_pct"]) for p in r["plans"])
        worst = f"{errors[-1]:.1f} %" if errors else "-"
        median = f"{statistics.median(errors):.1f} %" if errors else "-"
        lines.append(
            f"| {r['model']} | {len(r['plans'])} | {median} / {worst} | {r['choice_vs_fastest_pct']:+.1f} % "
            f"| {timed:.1f} % / {speed:.1f} % |"
        )
    every = [abs(p["error_pct"]) for r in results for p in r["pairs"]]
    if every:
        lines.append(
            f"| all | {sum(len(r['plans']) for r in results)} | {statistics.median(every):.1f} % / "
            f"{max(every):.1f} % | {sum(r['choice_vs_fastest_pct'] <= 5 for r in results)} of {len(results)} "
            "within 5 % | |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--rounds", type=int, default=15, help="rounds in which every plan runs a block of steps")
    parser.add_argument("--candidates", type=int, default=3, help="plan's choice and its runners-up")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    load = os.getloadavg()[0]
    results = []
    for spec in args.models.split(","):
        print(f"{spec} ...", file=sys.stderr)
        results.append(bench_model(spec, ranks=2, batch=8, rounds=args.rounds, count=args.candidates, out=args.out))
        (args.out / "ratios.json").write_text(json.dumps(results, indent=2))
    text = table(results)
    after = os.getloadavg()[0]
    header = f"load average {load:.2f} before, {after:.2f} after; {args.rounds} interleaved rounds"
    (args.out / "ratios.md").write_text(header + "\n\n" + text + "\n")
    print(header)
    print(text)


if __name__ == "__main__":
    main()
