"""Fidelity as ratios: does the planner order candidate plans as they measure? The default path, no flags.

    python benchmarks/bench_ratios.py --out benchmarks/results/ratios [--models gpt2-tiny,mlp] [--budget-s 60]

A machine whose speed moves by 1.5x within a minute cannot check an absolute prediction to 10 %, but it
can check a ratio measured in one run: for each model, and each global batch (``--batches``, 8 and 16), on
P = 2 gloo processes:

1. ``pipeplan profile MODEL`` with default flags (a 2-rank pipeline's threads, the scaling to the others,
   and the model's own cost in a pipeline learned from short runs: 1F1B's, and every schedule's for a model
   whose 1F1B plan steps in under half a second; planner/runtime/model_cost.py);
2. ``pipeplan plan`` with default flags (the calibration the profile learned): its choice, the next distinct candidates
   it ranked, and the best plan under each of gpipe, 1f1b and interleaved-1f1b;
3. every distinct plan run for real in one launch (``planner.runtime.interleave.verify_plans``: 2 processes,
   optimizer step included), as two copies each on models of their own, interleaved: in each round every copy
   runs a block of steps of at least 0.1 s, for about ``--budget-s`` of rounds (at least :data:`MIN_ROUNDS`),
   split over ``--launches`` launches (with 2, a launch that favours one plan weighs half);
4. for every pair of plans (a, b): the predicted ratio ``pred(a) / pred(b)`` against the measured one,
   ``median over rounds of meas(a) / meas(b)`` (a and b timed within a second or two of each other, each the
   geometric mean of its copies), the geometric mean of the launches'; and whether ``plan``'s choice measured
   within 5 % of the fastest plan (by the same ratios);
5. the absolute error as timed and at the machine's measured speed (the speed reference, timed in the rank
   processes at the threads each rank has), side by side;
6. the floors under all of it: each plan's first copy against its second, whose predicted ratio is exactly 1;
   each pair's ratio in the first launch against the second.

Writes ``ratios.json`` and ``ratios.md`` into ``--out``; prints the table. ``--repredict DIR`` runs nothing: it
holds an earlier run's measurements (``DIR``'s ratios.json and profiles) against the planner as it stands, so a
change to the model of cost is judged on the same measurements.
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
from common import run_started, table_from_markdown, write_record  # noqa: E402

from planner.cost import default_settings  # noqa: E402
from planner.plan import Plan  # noqa: E402
from planner.request import PlanRequest, calibration_settings  # noqa: E402
from planner.runtime.interleave import InterleavedRun, rounds_within, verify_plans  # noqa: E402
from planner.runtime.model_cost import learn_after_profile  # noqa: E402
from planner.search import make_plan, make_plans, plan_key  # noqa: E402
from profiles.format import Profile, load_profile, save_profile  # noqa: E402
from profiles.from_spec import profile_spec  # noqa: E402
from profiles.profile_options import ProfileOptions  # noqa: E402

MIN_ROUNDS = 16
"""The fewest interleaved rounds, however long the plans: llama-small's 2.6 s plans in 8 rounds measured two copies
of one plan 15 % apart and put ``plan``'s choice 6.6 % behind the fastest; in 17 rounds from the same profile,
4.1 % and 0.0 % (``--models llama-small --profiles DIR --budget-s 600``, 2026-12-02)."""


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


def measure(
    spec: str, plans: list[Plan], copies: int, budget_s: float, rounds: int | None, launches: int
) -> list[InterleavedRun]:
    """Every plan as ``copies`` copies, interleaved round by round, in each of ``launches`` launches that share the
    rounds (:func:`planner.runtime.interleave.verify_plans`); copy ``c`` of plan ``k`` is at ``c * len(plans) + k``."""
    launch = plans * copies
    rounds = rounds or rounds_within(launch, budget_s / launches, at_least=MIN_ROUNDS // launches, at_most=75)
    return [verify_plans(launch, spec, rounds=rounds, timeout_s=1800) for _ in range(launches)]


def profile_once(spec: str, out: Path, profiles: Path | None) -> Profile:
    """``pipeplan profile SPEC`` with default flags (or what an earlier run's ``--out`` saved), saved into ``out``."""
    name = f"{Path(spec).name.replace(':', '_')}.profile.json"
    if profiles is not None:  # measure again what an earlier run profiled and learned
        profile = load_profile(profiles / name)
    else:
        options = ProfileOptions(model=spec, no_progress=True)
        profile, _ = learn_after_profile(profile_spec(options), spec)  # as `pipeplan profile` does
    save_profile(profile, out / name)
    return profile


def bench_case(
    spec: str,
    profile: Profile,
    *,
    ranks: int,
    batch: int,
    copies: int,
    budget_s: float,
    rounds: int | None,
    count: int,
    launches: int,
) -> dict:
    """One case: ``plan``'s candidates for ``ranks`` and global batch ``batch``, measured against each other."""
    started = time.perf_counter()
    named = candidates(profile, ranks, batch, count)
    names, plans = list(named), list(named.values())
    runs = measure(spec, plans, copies, budget_s, rounds, launches)
    n = len(plans)
    of = [[c * n + k for c in range(copies)] for k in range(n)]  # each plan's copies in a launch

    def ratio(a: int, b: int) -> float:  # the geometric mean of the launches' ratios
        return statistics.geometric_mean(run.ratio(of[a], of[b]) for run in runs)

    predicted = [p.predicted.iteration_s for p in plans]
    reports = [[run.reports[i] for run in runs for i in of[k]] for k in range(n)]
    measured = [statistics.fmean(r.measured_iteration_s for r in reports[k]) for k in range(n)]
    at_speed = [statistics.fmean(r.at_profile_speed().measured_iteration_s for r in reports[k]) for k in range(n)]
    copy_errors = (
        [(1 / statistics.geometric_mean(run.ratio(of[k][0], of[k][1]) for run in runs) - 1) * 100 for k in range(n)]
        if copies > 1
        else []
    )
    pairs, launch_errors = [], []
    for a, b in itertools.combinations(range(n), 2):
        ratio_measured = ratio(a, b)
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
        if launches > 1:  # the same pair measured in the first launch against the second
            launch_errors.append((runs[0].ratio(of[a], of[b]) / runs[1].ratio(of[a], of[b]) - 1) * 100)
    fastest = min(range(n), key=lambda k: ratio(k, 0))
    return {
        "model": spec,
        "global_batch": batch,
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
        "copy_error_pct": copy_errors,
        "launch_error_pct": launch_errors,
        "rounds": len(runs[0].round_iteration_s[0]),
        "launches": launches,
        "round_iteration_s": [[list(r) for r in run.round_iteration_s] for run in runs],
        "learned_from": list(profile.pipeline_calibration["notes"]["model"]["schedules"])
        if profile.pipeline_calibration
        else [],
        "choice_vs_fastest_pct": (ratio(0, fastest) - 1) * 100,
        "wall_s": time.perf_counter() - started,
    }


def _plan_id(schedule: str, micro_batch_size: int, split_points: object) -> tuple[object, ...]:
    return (schedule, micro_batch_size, tuple(split_points))  # type: ignore[arg-type]


def repredicted(case: dict, profile: Profile, count: int) -> dict:
    """``case`` (an earlier run's, measured) with every plan predicted again by the planner as it stands: its
    candidates are planned again and matched by schedule, micro-batch size and boundaries (a plan the planner no
    longer proposes raises), and ``plan``'s choice is the new first if it was measured."""
    named = candidates(profile, 2, case["global_batch"], count)
    fresh = {_plan_id(p.schedule.value, p.micro_batch_size, p.split_points): p for p in named.values()}
    plans = []
    for p in case["plans"]:
        plan = fresh.get(_plan_id(p["schedule"], p["micro_batch_size"], p["split_points"]))
        if plan is None:  # no longer among the candidates: the same plan, its boundaries pinned
            plan = pinned_plan(profile, case["global_batch"], p)
        pr = plan.predicted.iteration_s
        plans.append(
            {**p, "predicted_s": pr, "error_pct": (p["measured_s"] / pr - 1) * 100,
             "error_at_speed_pct": (p["at_speed_s"] / pr - 1) * 100}
        )  # fmt: skip
    predicted = {p["name"]: p["predicted_s"] for p in plans}
    pairs = [
        {**q, "predicted_ratio": predicted[q["a"]] / predicted[q["b"]],
         "error_pct": (predicted[q["a"]] / predicted[q["b"]] / q["measured_ratio"] - 1) * 100}
        for q in case["pairs"]
    ]  # fmt: skip
    # each plan's measured time relative to the first plan's, from the pairs (the first is every pair's a)
    relative = {plans[0]["name"]: 1.0, **{q["b"]: 1 / q["measured_ratio"] for q in pairs if q["a"] == plans[0]["name"]}}
    first = next(iter(named.values()))
    first_id = _plan_id(first.schedule.value, first.micro_batch_size, first.split_points)
    measured_ids = {_plan_id(p["schedule"], p["micro_batch_size"], p["split_points"]): p["name"] for p in plans}
    if first_id not in measured_ids:
        raise SystemExit(f"{case['model']}: plan's choice is now a plan that was not measured")
    choice = measured_ids[first_id]
    return {
        **case,
        "plans": plans,
        "pairs": pairs,
        "choice_vs_fastest_pct": (relative[choice] / min(relative.values()) - 1) * 100,
        "repredicted_choice": choice,
    }


def pinned_plan(profile: Profile, batch: int, measured: dict) -> Plan:
    """The plan ``measured`` names (schedule, micro-batch size, boundaries), planned again with its boundaries
    pinned: each stage's first and last unit on that stage."""
    names = [u.name for u in profile.units]
    starts = [0, *(names.index(u) for u in measured["split_points"])]
    pins = [(names[i], s) for s, i in enumerate(starts)] + [(names[i - 1], s) for s, i in enumerate(starts[1:])]
    settings = default_settings(profile, **calibration_settings("auto", profile.device.kind, profile))
    request = PlanRequest(
        2, batch, schedule=measured["schedule"], micro_batch_size=measured["micro_batch_size"],
        pinned=tuple(pins), settings=settings,
    )  # fmt: skip
    plan = make_plan(profile, request, sha256="0" * 64)
    if list(plan.split_points) != list(measured["split_points"]):
        raise SystemExit(f"{measured['name']}: pinned, planned {plan.split_points}, not {measured['split_points']}")
    return plan


def _median_worst(errors: list[float]) -> str:
    return f"{statistics.median(errors):.1f} % / {max(errors):.1f} %" if errors else "-"


def table(results: list[dict]) -> str:
    lines = [
        "| model | global batch | plans | pairs: ratio error median / worst | plan's choice vs fastest "
        "| abs. error as timed / at speed (median) | copy vs copy: worst | launch vs launch: median / worst |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        errors = sorted(abs(p["error_pct"]) for p in r["pairs"])
        timed = statistics.median(abs(p["error_pct"]) for p in r["plans"])
        speed = statistics.median(abs(p["error_at_speed_pct"]) for p in r["plans"])
        worst = f"{errors[-1]:.1f} %" if errors else "-"
        median = f"{statistics.median(errors):.1f} %" if errors else "-"
        copies = f"{max(abs(e) for e in r['copy_error_pct']):.1f} %" if r["copy_error_pct"] else "-"
        launches = _median_worst([abs(e) for e in r.get("launch_error_pct", [])])
        lines.append(
            f"| {r['model']} | {r['global_batch']} | {len(r['plans'])} | {median} / {worst} "
            f"| {r['choice_vs_fastest_pct']:+.1f} % "
            f"| {timed:.1f} % / {speed:.1f} % | {copies} | {launches} |"
        )
    every = [abs(p["error_pct"]) for r in results for p in r["pairs"]]
    copies = [abs(e) for r in results for e in r["copy_error_pct"]]
    launches = [abs(e) for r in results for e in r.get("launch_error_pct", [])]
    if every:
        floor = f"{max(copies):.1f} %" if copies else "-"
        lines.append(
            f"| all | | {sum(len(r['plans']) for r in results)} | {statistics.median(every):.1f} % / "
            f"{max(every):.1f} % | {sum(r['choice_vs_fastest_pct'] <= 5 for r in results)} of {len(results)} "
            f"within 5 % | | {floor} | {_median_worst(launches)} |"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--batches", default="8,16", help="global batches: one case per model and batch")
    parser.add_argument("--copies", type=int, default=2, help="copies of each plan in the launch (>= 1)")
    parser.add_argument("--budget-s", type=float, default=60.0, help="about how long each model's rounds take")
    parser.add_argument("--rounds", type=int, default=None, help="rounds, in place of what the budget fits")
    parser.add_argument("--candidates", type=int, default=3, help="plan's choice and its runners-up")
    parser.add_argument("--launches", type=int, default=1, help="launches that share the rounds (>= 1)")
    parser.add_argument(
        "--profiles", type=Path, default=None, help="an earlier run's --out: its profiles, in place of profiling again"
    )
    parser.add_argument(
        "--repredict",
        type=Path,
        default=None,
        help="an earlier run's --out: its measurements held against the planner as it stands (nothing is run)",
    )
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.repredict is not None:
        results = []
        for case in json.loads((args.repredict / "ratios.json").read_text()):
            name = f"{Path(case['model']).name.replace(':', '_')}.profile.json"
            results.append(repredicted(case, load_profile(args.repredict / name), args.candidates))
        (args.out / "ratios.json").write_text(json.dumps(results, indent=2))
        text = table(results)
        (args.out / "ratios.md").write_text(f"re-predicted from {args.repredict}\n\n{text}\n")
        print(text)
        return
    started = run_started()
    load = os.getloadavg()[0]
    results = []
    for spec in args.models.split(","):
        print(f"{spec} ...", file=sys.stderr)
        profile = profile_once(spec, args.out, args.profiles)
        for batch in (int(b) for b in args.batches.split(",")):
            print(f"{spec}, global batch {batch} ...", file=sys.stderr)
            results.append(
                bench_case(
                    spec,
                    profile,
                    ranks=2,
                    batch=batch,
                    copies=args.copies,
                    budget_s=args.budget_s,
                    rounds=args.rounds,
                    count=args.candidates,
                    launches=args.launches,
                )
            )
            (args.out / "ratios.json").write_text(json.dumps(results, indent=2))
    text = table(results)
    after = os.getloadavg()[0]
    rounds = ", ".join(f"{r['model']} x{r['global_batch']} {r['launches']} x {r['rounds']}" for r in results)
    header = (
        f"load average {load:.2f} before, {after:.2f} after; {args.copies} copies of each plan; "
        f"interleaved rounds: {rounds}"
    )
    (args.out / "ratios.md").write_text(header + "\n\n" + text + "\n")
    print(header)
    print(text)
    write_record("ratios", {"cases": results}, started=started, tables={"cases": table_from_markdown(text)})


if __name__ == "__main__":
    from planner.runtime.launch import signals_interrupt

    with signals_interrupt():  # a SIGTERM stops the ranks too, as it does the CLI's
        main()
