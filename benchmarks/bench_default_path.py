"""The default path as a user runs it: ``profile``, ``plan``, ``verify`` with no flags beyond model, ranks, batch.

    python benchmarks/bench_default_path.py --out benchmarks/results/default-path [--tries 3] [--models gpt2-tiny,mlp]

For each model and each try, through the installed ``pipeplan`` command (a fresh profile every try):

    pipeplan profile MODEL --out P
    pipeplan plan P --ranks 2 --global-batch 8 --out PLAN
    pipeplan verify PLAN --model MODEL --out REPORT

and records verify's exit status, its error as timed and at the machine's measured speed (the model's units
timed in the ranks, alone and together; the verdict's), the same at the speed of the units alone (without the
change of co-location), the units' ratio together / alone in verify's run and while profiling, the schedule
chosen and the worst stage's memory error. A model
passes when verify exits 0 in at least 2 of 3 tries. The load average before and after is recorded.
Writes ``default-path.json`` and ``default-path.md`` into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from common import run_started, table_from_markdown, write_record

ROOT = Path(__file__).resolve().parents[1]
MODELS = ("gpt2-tiny", "mlp", "llama-small", "unet-small", "benchmarks/models.py:cnn13")


def _run(args: list[str], cwd: Path) -> int:
    done = subprocess.run(["pipeplan", *args], cwd=cwd, capture_output=True, text=True)
    # verify's exit 1 is its verdict, a mismatch; any other failure says why here, not only "failed" in the table
    if done.returncode != 0 and not (args[0] == "verify" and done.returncode == 1):
        print(f"  pipeplan {' '.join(args)}: exit {done.returncode}: {done.stderr.strip()[-300:]}", file=sys.stderr)
    return done.returncode


def one_try(model: str, work: Path, ranks: int, batch: int) -> dict[str, Any]:
    """One profile -> plan -> verify, each as the CLI runs it; what verify said."""
    spec = str(ROOT / model) if model.startswith("benchmarks/") else model
    work.mkdir(parents=True, exist_ok=True)
    profile, plan, report = work / "p.json", work / "plan.json", work / "report.json"
    started = time.perf_counter()
    if _run(["profile", spec, "--out", str(profile)], work) != 0:
        return {"model": model, "exit": "profile failed"}
    if _run(["plan", str(profile), "--ranks", str(ranks), "--global-batch", str(batch), "--out", str(plan)], work):
        return {"model": model, "exit": "plan failed"}
    code = _run(["verify", str(plan), "--model", spec, "--out", str(report)], work)
    if not report.exists():
        return {"model": model, "exit": f"verify exit {code}, no report"}
    data = json.loads(report.read_text())
    return {
        **_colocation(plan, data),
        "model": model,
        "exit": code,
        "schedule": data["schedule"],
        "predicted_ms": data["predicted_iteration_s"] * 1e3,
        "measured_ms": data["measured_iteration_s"] * 1e3,
        "error_pct": data["iteration_error_pct"],
        "at_speed_error_pct": data["speed_adjusted_error_pct"],
        "speed_factor": data["speed_factor"],
        "memory_error_pct": max(
            (abs(s["memory_error_pct"]) for s in data["stages"] if s["memory_error_pct"] is not None), default=None
        ),
        "wall_s": time.perf_counter() - started,
    }


def _colocation(plan_path: Path, data: dict[str, Any]) -> dict[str, Any]:
    """The ranks' units together over alone in verify's run and while profiling, and the error at the speed of
    the units alone (the prediction without the change of co-location), to set beside the verdict's."""
    from planner.plan import load_plan

    alone = None
    if data["speed_factor"] and data.get("colocation_change"):
        plan, f = load_plan(plan_path), data["speed_factor"]
        predicted = plan.simulation(plan.predicted.runtime.at_speed(f), speed=f).iteration_s
        alone = (data["measured_iteration_s"] / predicted - 1.0) * 100.0
    return {
        "units_together_ratio": data.get("units_together_ratio"),
        "learned_together_ratio": data.get("learned_together_ratio"),
        "at_units_speed_alone_error_pct": alone,
    }


def _fmt(value: float | None, spec: str = "+.1f") -> str:
    return "-" if value is None else format(value, spec)


def table(runs: list[dict[str, Any]], tries: int) -> str:
    lines = [
        "| model | exit 0 | schedule | error as timed (each try) | at the machine's speed | at the units' speed "
        "alone | units together / alone, verify (profile) | worst memory error |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for model in dict.fromkeys(r["model"] for r in runs):
        mine = [r for r in runs if r["model"] == model]
        passed = sum(r["exit"] == 0 for r in mine)
        timed = ", ".join(_fmt(r.get("error_pct")) + " %" for r in mine)
        speed = ", ".join(_fmt(r.get("at_speed_error_pct")) + " %" for r in mine)
        alone = ", ".join(_fmt(r.get("at_units_speed_alone_error_pct")) + " %" for r in mine)
        ratios = [(r.get("units_together_ratio"), r.get("learned_together_ratio")) for r in mine]
        together = ", ".join(f"{_fmt(now, '.2f')} ({_fmt(then, '.2f')})" for now, then in ratios)
        memory = _fmt(max((r["memory_error_pct"] for r in mine if r.get("memory_error_pct") is not None), default=None))
        schedules = "/".join(sorted({str(r.get("schedule", "-")) for r in mine}))
        lines.append(
            f"| {model} | {passed} of {tries} | {schedules} | {timed} | {speed} | {alone} | {together} | {memory} % |"
        )
    timed_all = [abs(r["error_pct"]) for r in runs if "error_pct" in r]
    speed_all = [abs(r["at_speed_error_pct"]) for r in runs if r.get("at_speed_error_pct") is not None]
    if timed_all:
        lines.append("")
        lines.append(
            f"median |error| as timed {statistics.median(timed_all):.1f} %, at the machine's speed "
            f"{statistics.median(speed_all) if speed_all else float('nan'):.1f} % ({len(timed_all)} runs)"
        )
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--models", default=",".join(MODELS))
    parser.add_argument("--tries", type=int, default=3)
    parser.add_argument("--ranks", type=int, default=2)
    parser.add_argument("--global-batch", type=int, default=8)
    args = parser.parse_args()
    started = run_started()
    args.out.mkdir(parents=True, exist_ok=True)
    load_before = os.getloadavg()
    runs: list[dict[str, Any]] = []
    models = args.models.split(",")
    for attempt in range(args.tries):  # tries round-robin over the models: a slow minute hits one try of each
        for model in models:
            name = Path(model).name.split(":")[-1]
            run = one_try(model, args.out / "work" / f"{name}-{attempt}", args.ranks, args.global_batch)
            print(
                f"  {model} try {attempt + 1}: exit {run['exit']}, error {_fmt(run.get('error_pct'))} % as timed, "
                f"{_fmt(run.get('at_speed_error_pct'))} % at speed",
                flush=True,
            )
            runs.append(run)
    result = {
        "load_before": load_before,
        "load_after": os.getloadavg(),
        "runs": runs,
        "date": time.strftime("%Y-%m-%d"),
        "ranks": args.ranks,
        "global_batch": args.global_batch,
    }
    (args.out / "default-path.json").write_text(json.dumps(result, indent=2))
    text = table(runs, args.tries)
    (args.out / "default-path.md").write_text(text + "\n")
    print(text)
    print(f"load average before {load_before[0]:.2f}, after {os.getloadavg()[0]:.2f}")
    write_record("default_path", result, started=started, tables={"tries": table_from_markdown(text)})


if __name__ == "__main__":
    main()
