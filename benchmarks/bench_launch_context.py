"""Does a plan's measured ratio to another depend on what else runs in the launch?

``pipeplan profile`` learns a short model's schedule ratios in launches of every learning plan (17 on mlp, 18 with
the 1F1B plan's second copy); ``bench_ratios.py`` measures its candidates as two copies each (8 on mlp); a user's
run has one plan. This measures plan A's ratio to plan B (the median over rounds, as
:meth:`planner.runtime.interleave.InterleavedRun.ratio`) in the three kinds of launch, one after another, ``--reps``
times, with the machine's speed factor of each launch (the model's units, against the profile):

- ``pair``: A and B alone, 100 rounds;
- ``candidates``: the plans given with ``--with`` plus A and B, two copies each, 40 rounds;
- ``learning``: the profile's learning plans (:func:`planner.runtime.model_cost.learning_plans`), which must
  include A and B, 20 rounds.

    python benchmarks/bench_launch_context.py --model mlp --profile P --a INTERLEAVED.plan.json \\
        --b 1F1B.plan.json --with GPIPE.plan.json,ZB.plan.json [--reps 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import run_started, tables_in, tee_stdout, write_record  # noqa: E402

from planner.calibration import shipped_calibration  # noqa: E402
from planner.plan import Plan, load_plan  # noqa: E402
from planner.runtime.interleave import verify_plans  # noqa: E402
from planner.runtime.model_cost import default_global_batch, learning_plans  # noqa: E402
from planner.search import plan_key  # noqa: E402
from profiles.format import load_profile  # noqa: E402


def _key(plan: Plan) -> tuple[object, ...]:
    # plan_key, and the micro-batch count: the learning launch runs each schedule's plan at two counts.
    return (*plan_key(plan), plan.num_microbatches)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--profile", required=True)
    parser.add_argument("--a", required=True, help="plan JSON whose ratio is measured")
    parser.add_argument("--b", required=True, help="plan JSON it is measured against")
    parser.add_argument("--with", dest="others", default="", help="comma-separated plan JSONs of the candidates")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    started, printed = run_started(), tee_stdout()
    a, b = load_plan(args.a), load_plan(args.b)
    others = [load_plan(p) for p in args.others.split(",") if p]
    profile = load_profile(args.profile)
    shipped = shipped_calibration(profile.device.kind)
    learning = learning_plans(profile, shipped, default_global_batch(profile, a.num_ranks), sha256="0" * 64)
    keys = [_key(p) for p in learning]
    if _key(a) not in keys or _key(b) not in keys:
        raise SystemExit("bench_launch_context: --a and --b must be among the profile's learning plans")
    candidates = [a, b, *others]
    n = len(candidates)
    launches = {
        "pair": ([a, b], 0, 1, 100),
        "candidates": (candidates * 2, [0, n], [1, n + 1], 40),
        "learning": ([*learning, learning[0]], keys.index(_key(a)), keys.index(_key(b)), 20),
    }
    print("| rep | launch | plans | rounds | ratio A / B | speed factor |")
    print("|---|---|---|---|---|---|")
    for rep in range(args.reps):
        for name, (plans, index_a, index_b, rounds) in launches.items():
            run = verify_plans(plans, args.model, rounds=rounds, warmup=1, timeout_s=900)
            speed = statistics.fmean(r.speed_factor or 0.0 for r in run.reports)
            ratio = run.ratio(index_a, index_b)
            print(f"| {rep} | {name} | {len(plans)} | {rounds} | {ratio:.3f} | {speed:.2f} |", flush=True)
    write_record("launch_context", {}, started=started, tables=tables_in(printed.getvalue(), ("launches",)))


if __name__ == "__main__":
    main()
