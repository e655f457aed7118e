"""Fidelity: is the prediction what happens? Predicted (textbook, calibrated, refit) vs measured iterations.

    python benchmarks/bench_fidelity.py --out benchmarks/results/fidelity

For each model (P = 2, global batch 8, gloo processes on this machine, 1 torch thread per rank):

1. profile it with the threads each rank will have (``--threads 1`` on 2 cores);
2. plan it under each schedule (gpipe, 1f1b, interleaved-1f1b) with the calibration, and with the
   schedule left to the planner (``auto``) with and without the calibration;
3. run every distinct plan for real (``verify`` in processes mode, optimizer step included), the plans of
   one model interleaved round by round, and keep the median iteration;
4. hold each measured plan against four predictions of the *same* plan: the textbook model
   (``--calibration none``), the calibration measured at the start of this run, that calibration as
   ``pipeplan calibrate --model`` refits it from the model's 1F1B run alone (judged on the model's other
   plans: out of sample), and the calibration ``tune`` refits from all of this model's measurements
   (in-sample, as ``tune`` uses it);
5. plan the model once more with the ``calibrate --model`` calibration and, if that plan is new, run it
   too (after the others, not interleaved with them): how close ``plan`` then comes to the fastest.

Writes ``fidelity.json`` (with every measured run and its plan), ``fidelity.md`` and the calibration used
into ``--out``; ``--reuse DIR`` holds a finished run's measurements against the cost model as the code now
stands, running nothing (to try a change of the model against measurements already paid for). Machines
are shared and noisy: the load average before and after is recorded, and every number is a median.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from common import run_started, tables_in, write_record  # noqa: E402

from planner.calibration import Calibration, load_calibration, save_calibration  # noqa: E402
from planner.cost import default_settings  # noqa: E402
from planner.plan import Plan, _known, plan_from_dict  # noqa: E402
from planner.prediction import predict_plan, repredicted_plan  # noqa: E402
from planner.request import PlanRequest  # noqa: E402
from planner.runtime.calibrate import calibrate  # noqa: E402
from planner.runtime.launch import rank_threads  # noqa: E402
from planner.runtime.model_cost import learn_from_run  # noqa: E402
from planner.runtime.run_options import VerifyOptions  # noqa: E402
from planner.runtime.tune import refit_calibration  # noqa: E402
from planner.runtime.verify import verify_plan  # noqa: E402
from planner.runtime.verify_report import RankTime, StageReport, VerifyReport  # noqa: E402
from planner.search import make_plan, plan_key  # noqa: E402
from profiles.format import Profile, load_profile, save_profile  # noqa: E402
from profiles.measure_settings import MeasureSettings  # noqa: E402
from profiles.profiler import profile_model  # noqa: E402
from profiles.workload import load_workload  # noqa: E402

MODELS = (
    "gpt2-tiny",
    "mlp",
    "llama-small",
    "unet-small",
    "examples/custom_model.py:workload",
    "benchmarks/models.py:cnn13",
)
SCHEDULES = ("gpipe", "1f1b", "interleaved-1f1b")


def _profile(spec: str, sizes: tuple[int, ...], repeats: int) -> Profile:
    torch.set_num_threads(rank_threads(2))  # what each of 2 ranks gets (`--ranks 2`)
    workload = load_workload(spec)
    return profile_model(
        workload, MeasureSettings(micro_batch_sizes=sizes, repeats=repeats, max_repeats=3 * repeats, progress=False)
    )


def _plans(profile: Profile, calibration: Calibration, ranks: int, batch: int) -> dict[str, Plan]:
    cal = default_settings(profile, calibration=calibration, calibration_label="calibrate")
    none = default_settings(profile)
    plans: dict[str, Plan] = {}
    for name in SCHEDULES:
        request = PlanRequest(num_ranks=ranks, global_batch_size=batch, schedule=name, settings=cal)
        try:
            plans[name] = make_plan(profile, request, sha256="0" * 64)
        except Exception as exc:  # a schedule the model cannot take (too few units): say so, go on
            print(f"  {name}: not planned ({exc})", file=sys.stderr)
    plans["auto (calibrated)"] = make_plan(profile, PlanRequest(ranks, batch, settings=cal), sha256="0" * 64)
    plans["auto (textbook)"] = make_plan(profile, PlanRequest(ranks, batch, settings=none), sha256="0" * 64)
    return plans


@dataclass(frozen=True)
class Measured:
    as_timed_s: float
    """Median iteration over the rounds, as timed."""
    at_profile_speed_s: float
    """Median over the rounds of the iteration at the profile's machine speed (VerifyReport.at_profile_speed)."""
    speed_factor: float | None
    """Median over the rounds of how much slower the speed reference ran than while profiling."""
    report: VerifyReport
    """The round nearest the median, as timed (what ``tune`` refits from)."""


def _measure(spec: str, plans: list[Plan], rounds: int, steps: int) -> list[Measured]:
    per_plan: list[list[VerifyReport]] = [[] for _ in plans]
    for _ in range(rounds):
        for i, plan in enumerate(plans):
            per_plan[i].append(
                verify_plan(
                    plan, spec, VerifyOptions(steps=steps, warmup=1, mode="processes", timeout_s=900, tolerance=0.25)
                )
            )
    out = []
    for reports in per_plan:
        median = statistics.median(r.measured_iteration_s for r in reports)
        factors = [r.speed_factor for r in reports if r.speed_factor is not None]
        out.append(
            Measured(
                as_timed_s=median,
                at_profile_speed_s=statistics.median(r.at_profile_speed().measured_iteration_s for r in reports),
                speed_factor=statistics.median(factors) if factors else None,
                report=min(reports, key=lambda r: abs(r.measured_iteration_s - median)),
            )
        )
    return out


MODEL_PICK = "auto (calibrate --model)"
ONE_RUN = "calibrate --model"


def _one_run(
    profile: Profile, runs: list[tuple[Plan, VerifyReport]], calibration: Calibration
) -> tuple[Plan, Calibration] | None:
    """This model's 1F1B plan and what ``pipeplan calibrate --model`` makes of ``calibration`` from its run
    (None: no 1F1B plan ran)."""
    for plan, report in runs:
        if plan.schedule.value == "1f1b":
            return plan, learn_from_run(calibration, profile, plan, report)
    return None


def _error(measured: float, predicted: float) -> float:
    return (measured - predicted) / predicted * 100.0


def bench_model(
    spec: str, calibration: Calibration, *, ranks: int, batch: int, rounds: int, steps: int, out: Path
) -> dict[str, object]:
    started = time.perf_counter()
    profile = _profile(spec, (1, 2, 4), repeats=3)
    save_profile(profile, out / f"{profile.model.name}.profile.json")
    named = _plans(profile, calibration, ranks, batch)
    distinct: dict[tuple[object, ...], Plan] = {}
    for plan in named.values():
        distinct.setdefault(plan_key(plan), plan)
    plans = list(distinct.values())
    measured = _measure(spec, plans, rounds, steps)
    one = _one_run(profile, [(p, m.report) for p, m in zip(plans, measured, strict=True)], calibration)
    if one is not None:
        settings = default_settings(profile, calibration=one[1], calibration_label=ONE_RUN)
        pick = make_plan(profile, PlanRequest(ranks, batch, settings=settings), sha256="0" * 64)
        named[MODEL_PICK] = pick
        if plan_key(pick) not in distinct:
            distinct[plan_key(pick)] = pick
            plans.append(pick)
            measured += _measure(spec, [pick], rounds, steps)
    result = evaluate(profile, named, plans, measured, calibration)
    keys = [plan_key(p) for p in plans]
    # Everything a later model of cost needs to be held against these runs again (``--reuse``).
    result["measurements"] = [
        {
            "plan": plan.to_dict(),
            "as_timed_s": m.as_timed_s,
            "at_profile_speed_s": m.at_profile_speed_s,
            "speed_factor": m.speed_factor,
            "report": m.report.to_dict(),
        }
        for plan, m in zip(plans, measured, strict=True)
    ]
    result["named"] = {label: keys.index(plan_key(plan)) for label, plan in named.items()}
    result["spec"] = spec
    result["wall_s"] = time.perf_counter() - started
    return result


def _report_from_dict(data: dict[str, Any]) -> VerifyReport:
    """A measured run as ``VerifyReport.to_dict`` wrote it (numerics dropped: timing only)."""
    values = _known(VerifyReport, data)  # to_dict adds derived keys (error_pct, ok, ...): dropped
    values.update(
        stages=tuple(StageReport(**_known(StageReport, s)) for s in data["stages"]),
        ranks=tuple(RankTime(**_known(RankTime, r)) for r in data["ranks"]),
        busy_s=tuple(data["busy_s"]),
        numerics=None,
    )
    return VerifyReport(**values)


def reevaluate(run: Path, calibration: Calibration) -> list[dict[str, object]]:
    """A finished run's measurements held against the cost model as the code now stands: nothing is run."""
    results = []
    for old in json.loads((run / "fidelity.json").read_text()):
        if "measurements" not in old:
            raise SystemExit(f"{run}: made before runs were kept (no 'measurements'); measure again")
        profile = load_profile(run / f"{old['model']}.profile.json")
        plans = [plan_from_dict(m["plan"]) for m in old["measurements"]]
        measured = [
            Measured(m["as_timed_s"], m["at_profile_speed_s"], m["speed_factor"], _report_from_dict(m["report"]))
            for m in old["measurements"]
        ]
        named = {label: plans[i] for label, i in old["named"].items()}
        new = evaluate(profile, named, plans, measured, calibration)
        new.update(spec=old["spec"], measurements=old["measurements"], named=old["named"], wall_s=old["wall_s"])
        results.append(new)
    return results


def evaluate(
    profile: Profile, named: dict[str, Plan], plans: list[Plan], measured: list[Measured], calibration: Calibration
) -> dict[str, object]:
    """Each plan's measured iteration against its predictions: textbook, calibrated, the calibration refit
    from all of this model's runs (in-sample, as ``tune`` uses it) and the one refit from its 1F1B run alone
    (out of sample for the other plans: what one measured run teaches about the rest)."""
    by_key = {plan_key(p): m for p, m in zip(plans, measured, strict=True)}
    calibrated = default_settings(profile, calibration=calibration, calibration_label="calibrate")
    # Refit from each plan as predicted now (the runs may have been planned under other code or calibration).
    runs = [
        (repredicted_plan(profile, replace(p, measured=None), calibrated), m.report)
        for p, m in zip(plans, measured, strict=True)
    ]
    refit = refit_calibration(calibration, runs)
    one = _one_run(profile, runs, calibration)
    settings = {
        "textbook": default_settings(profile),
        "calibrated": calibrated,
        "refit": default_settings(profile, calibration=refit, calibration_label="refit"),
    }
    if one is not None:
        settings[ONE_RUN] = default_settings(profile, calibration=one[1], calibration_label=ONE_RUN)
    rows = []
    for label, plan in named.items():
        m = by_key[plan_key(plan)]
        predicted = {k: predict_plan(profile, plan, s).iteration_s for k, s in settings.items()}
        rows.append(
            {
                "plan": label,
                "schedule": plan.schedule.value,
                "virtual_stages": plan.virtual_stages,
                "micro_batch_size": plan.micro_batch_size,
                "split_points": list(plan.split_points),
                "measured_s": m.as_timed_s,
                "measured_at_profile_speed_s": m.at_profile_speed_s,
                "speed_factor": m.speed_factor,
                "predicted_s": predicted,
                "error_pct": {k: _error(m.as_timed_s, v) for k, v in predicted.items()},
                "error_at_profile_speed_pct": {k: _error(m.at_profile_speed_s, v) for k, v in predicted.items()},
                "in_sample_one_run": one is not None and plan_key(plan) == plan_key(one[0]),
                "breakdown": [vars(r) for r in m.report.ranks],
            }
        )

    def pick_vs_fastest(label: str, key: str) -> float | None:
        if label not in named or plan_key(named[label]) not in by_key:
            return None  # not planned (no 1F1B run) or, re-evaluated, a plan that was never measured
        fastest = min(getattr(m, key) for m in measured)
        return (getattr(by_key[plan_key(named[label])], key) - fastest) / fastest * 100

    return {
        "model": profile.model.name,
        "units": profile.num_units,
        "rows": rows,
        "fastest_measured_s": min(m.as_timed_s for m in measured),
        "calibrated_pick_vs_fastest_pct": pick_vs_fastest("auto (calibrated)", "as_timed_s"),
        "textbook_pick_vs_fastest_pct": pick_vs_fastest("auto (textbook)", "as_timed_s"),
        "calibrated_pick_vs_fastest_at_profile_speed_pct": pick_vs_fastest("auto (calibrated)", "at_profile_speed_s"),
        "textbook_pick_vs_fastest_at_profile_speed_pct": pick_vs_fastest("auto (textbook)", "at_profile_speed_s"),
        "model_pick_vs_fastest_pct": pick_vs_fastest(MODEL_PICK, "as_timed_s"),
        "refit": {"colocation_factor": refit.colocation_factor, "action_overhead_s": refit.action_overhead_s},
    }


def _distinct_errors(results: list[dict[str, object]], key: str, model_of_cost: str) -> dict[tuple[object, ...], float]:
    """Absolute errors per distinct plan (``auto`` rows repeat a schedule's plan: counted once)."""
    out: dict[tuple[object, ...], float] = {}
    for res in results:
        for r in res["rows"]:  # type: ignore[attr-defined]
            if model_of_cost not in r[key] or (model_of_cost == ONE_RUN and r["in_sample_one_run"]):
                continue  # calibrate --model is judged on the plans it did not see
            plan = (res["model"], r["schedule"], r["virtual_stages"], r["micro_batch_size"], tuple(r["split_points"]))
            out.setdefault(plan, abs(r[key][model_of_cost]))
    return out


def markdown(results: list[dict[str, object]], calibration: Calibration, load: tuple[float, float]) -> str:
    c = calibration
    overheads = ", ".join(f"{k} {v * 1e3:.2f} ms" for k, v in sorted(c.action_overhead_s.items()))
    lines = [
        f"Calibration: {overheads} per action; link {c.p2p_latency_s * 1e6:.0f} us + bytes / "
        f"{c.p2p_bytes_per_s / 1e9:.2f} GB/s; Adam {c.optimizer['adam'].per_param_s * 1e9:.2f} ns/param; "
        f"co-location {c.colocation_factor:.2f}. Load average {load[0]:.2f} before, {load[1]:.2f} after.",
        "",
        "Errors as timed; beside them the calibrated error at the profile's machine speed (each run's times "
        "divided by its speed factor, the speed reference's ratio: `verify`'s diagnostic).",
        "",
        "| model | plan | schedule | measured | speed | textbook | calibrated | calibrate --model | refit (tune) "
        "| calibrated, at speed |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for res in results:
        for row in res["rows"]:  # type: ignore[attr-defined]
            sched = row["schedule"] + (f" v={row['virtual_stages']}" if row["virtual_stages"] > 1 else "")
            sched += f", b={row['micro_batch_size']}"
            err, at_speed = row["error_pct"], row["error_at_profile_speed_pct"]
            speed = "-" if row["speed_factor"] is None else f"x{row['speed_factor']:.2f}"
            one = err.get(ONE_RUN)
            one_cell = "-" if one is None else f"{one:+.1f}%" + (" (its run)" if row["in_sample_one_run"] else "")
            lines.append(
                f"| {res['model']} | {row['plan']} | {sched} | {row['measured_s'] * 1e3:.1f} ms | {speed} | "
                f"{err['textbook']:+.1f}% | {err['calibrated']:+.1f}% | {one_cell} | {err['refit']:+.1f}% | "
                f"{at_speed['calibrated']:+.1f}% |"
            )
    lines += [
        "",
        "| model | `plan` (calibrated) vs fastest measured | `plan` (calibrate --model) vs fastest "
        "| `plan` (textbook) vs fastest | calibrated and textbook, at speed |",
        "|---|---|---|---|---|",
    ]
    for res in results:
        model_pick = res.get("model_pick_vs_fastest_pct")
        lines.append(
            f"| {res['model']} | {res['calibrated_pick_vs_fastest_pct']:+.1f}% | "
            + ("-" if model_pick is None else f"{model_pick:+.1f}%")
            + " | "
            f"{res['textbook_pick_vs_fastest_pct']:+.1f}% | "
            f"{res['calibrated_pick_vs_fastest_at_profile_speed_pct']:+.1f}%, "
            f"{res['textbook_pick_vs_fastest_at_profile_speed_pct']:+.1f}% |"
        )
    lines += [
        "",
        "| model of cost (distinct plans; calibrate --model on the plans it did not see) | errors | median abs "
        "error | worst | above 20 % |",
        "|---|---|---|---|---|",
    ]
    for key, how in (("error_pct", "as timed"), ("error_at_profile_speed_pct", "at the profile's speed")):
        for k in ("textbook", "calibrated", ONE_RUN, "refit"):
            v = list(_distinct_errors(results, key, k).values())
            if not v:
                continue
            over = sum(e > 20 for e in v)
            lines.append(f"| {k} | {how} | {statistics.median(v):.1f}% | {max(v):.1f}% | {over} of {len(v)} |")
    return "\n".join(lines) + "\n"


def bench_gpt2_small(calibration: Calibration, out: Path, steps: int) -> dict[str, object]:
    """gpt2-small: the calibrated plan for P = 2 run on 2 gloo processes, and for P = 4 replayed in one."""
    profile = _profile("gpt2-small", (1, 2, 4), repeats=3)
    save_profile(profile, out / "gpt2-small.profile.json")
    settings = default_settings(profile, calibration=calibration, calibration_label="calibrate")
    rows = []
    for ranks, batch, mode in ((2, 8, "processes"), (4, 16, "replay")):
        plan = make_plan(profile, PlanRequest(ranks, batch, settings=settings), sha256="0" * 64)
        report = verify_plan(
            plan, "gpt2-small", VerifyOptions(steps=steps, warmup=1, mode=mode, timeout_s=1800, tolerance=0.25)
        )
        rows.append(
            {
                "ranks": ranks,
                "mode": mode,
                "schedule": plan.schedule.value,
                "micro_batch_size": plan.micro_batch_size,
                "predicted_s": plan.predicted.iteration_s,
                "measured_s": report.measured_iteration_s,
                "error_pct": report.iteration_error_pct,
                "speed_factor": report.speed_factor,
                "error_at_profile_speed_pct": report.speed_adjusted_error_pct,
            }
        )
    unit_sum = [profile.unit_sum_error(k) * 100 for k in range(len(profile.micro_batch_sizes))]
    return {"rows": rows, "unit_sum_vs_whole_pct": unit_sum}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/fidelity"))
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--calibration", type=Path, default=None, help="use this file instead of calibrating first")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--gpt2-small", action="store_true", help="also gpt2-small: P = 2 processes, P = 4 replay")
    parser.add_argument(
        "--reuse",
        type=Path,
        default=None,
        help="a finished run's --out: hold its measurements against the code as it now stands, running nothing",
    )
    args = parser.parse_args()
    if args.reuse:
        calibration = load_calibration(args.calibration or args.reuse / "calibration.json")
        results = reevaluate(args.reuse, calibration)
        print(markdown(results, calibration, (float("nan"), float("nan"))))
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    started = run_started()
    load_before = os.getloadavg()[0]
    if args.calibration:
        calibration = load_calibration(args.calibration)
    else:
        calibration = calibrate(2)
    save_calibration(calibration, args.out / "calibration.json")  # what --reuse holds the runs against
    results = []
    for spec in args.models.split(","):
        print(f"{spec} ...", file=sys.stderr)
        results.append(
            bench_model(spec, calibration, ranks=2, batch=8, rounds=args.rounds, steps=args.steps, out=args.out)
        )
        (args.out / "fidelity.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    text = markdown(results, calibration, (load_before, os.getloadavg()[0]))
    if args.gpt2_small:
        big = bench_gpt2_small(calibration, args.out, args.steps)
        (args.out / "gpt2-small.json").write_text(json.dumps(big, indent=2) + "\n")
        text += (
            "\n| gpt2-small | plan | predicted | measured | error as timed | speed | error at the profile's speed |"
            "\n|---|---|---|---|---|---|---|\n"
        )
        for row in big["rows"]:  # type: ignore[attr-defined]
            speed = "-" if row["speed_factor"] is None else f"x{row['speed_factor']:.2f}"
            at_speed = row["error_at_profile_speed_pct"]
            text += (
                f"| P = {row['ranks']}, {row['mode']} | {row['schedule']}, b={row['micro_batch_size']} | "
                f"{row['predicted_s']:.2f} s | {row['measured_s']:.2f} s | {row['error_pct']:+.1f}% | {speed} | "
                f"{'-' if at_speed is None else f'{at_speed:+.1f}%'} |\n"
            )
    (args.out / "fidelity.md").write_text(text)
    print(text)
    name = "fidelity_gpt2_small" if args.gpt2_small else "fidelity_shipped" if args.calibration else "fidelity"
    write_record(name, {"results": results}, started=started, tables=tables_in(text))
    return 0


if __name__ == "__main__":
    from planner.runtime.launch import signals_interrupt

    with signals_interrupt():  # a SIGTERM stops the ranks too, as it does the CLI's
        sys.exit(main())
