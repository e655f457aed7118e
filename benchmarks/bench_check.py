"""``pipeplan check`` of the trainers' default layouts, held against measurement: is the speed-up it prints real?

    python benchmarks/bench_check.py [--models gpt2-small,llama-small] [--ranks 2] [--rounds 10]

For each model, with default flags as a user runs them:

1. ``pipeplan profile MODEL --ranks P`` (the threads each of P ranks has, the model's cost learned in a pipeline);
2. ``check --from megatron`` of Megatron-Core's default layout (``--pipeline-model-parallel-size P``: layers split
   evenly) and ``check --from torchtitan`` of torchtitan's (``pipeline_parallel_degree P``, its default
   first/last-stage weights), micro-batch 1, global batch ``--batch``: each prints the configuration's predicted
   step and pipeplan's best plan under the same trainer's rules, with the predicted speed-up;
3. every distinct plan (the two configurations, the two best plans) run for real in one launch on P gloo
   processes, interleaved round by round (``planner.runtime.interleave.verify_plans``), so that each ratio is
   measured within seconds on the same machine;
4. per trainer: the predicted speed-up against the measured one (the median over rounds of the configuration's
   step over the best plan's), and the error of the prediction.

P is at most the machine's cores: 4 ranks on 2 cores share them, so every plan's step is the whole model's
compute over 2 cores whatever its balance (gpt2-small at P = 4 on this machine: 1.365x predicted, 0.983x
measured), and a run says nothing of the boundaries.

Writes a dated record (benchmarks/results/check/) and prints the table.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import run_started, table_from_markdown, write_record  # noqa: E402

from planner.check import CheckOptions, check_config  # noqa: E402
from planner.errors import PipeplanError  # noqa: E402
from planner.plan import Plan  # noqa: E402
from planner.runtime.interleave import verify_plans  # noqa: E402
from planner.runtime.model_cost import learn_after_profile  # noqa: E402
from planner.search import plan_key  # noqa: E402
from profiles.format import Profile, load_profile, save_profile  # noqa: E402
from profiles.from_spec import profile_spec  # noqa: E402
from profiles.profile_options import ProfileOptions  # noqa: E402

# transformers' Llama names onto torchtitan's, as examples/torchtitan/train.sh maps them.
RENAMES = {
    "llama-small": (("model.embed_tokens", "tok_embeddings"), ("model.layers", "layers"), ("model.norm", "norm"))
}
DEFAULT_LAYOUTS = {
    "megatron": "--pipeline-model-parallel-size {p} --micro-batch-size 1 --global-batch-size {b}",
    "torchtitan": "--parallelism.pipeline_parallel_degree {p} --training.local_batch_size {b} "
    "--training.disable_cuda_graphs",
}


def profile_once(spec: str, ranks: int, folder: Path, profiles: Path | None) -> Profile:
    """``pipeplan profile SPEC --ranks P`` with default flags, or an earlier run's (``--profiles``)."""
    name = f"{spec.replace(':', '_').replace('/', '_')}.p{ranks}.profile.json"
    if profiles is not None:
        return load_profile(profiles / name)
    options = ProfileOptions(model=spec, ranks=ranks, no_progress=True)
    profile, _ = learn_after_profile(profile_spec(options), spec)  # as `pipeplan profile` does
    save_profile(profile, folder / name)
    return profile


def bench_model(spec: str, profile: Profile, *, ranks: int, batch: int, rounds: int) -> dict:
    started = time.perf_counter()
    checks: dict[str, dict] = {}
    plans: list[Plan] = []
    index: dict[tuple[object, ...], int] = {}

    for trainer, template in DEFAULT_LAYOUTS.items():
        text = template.format(p=ranks, b=batch)
        try:
            renames = RENAMES.get(spec, ()) if trainer == "torchtitan" else ()
            result = check_config(profile, trainer, text, CheckOptions(renames=renames))
        except PipeplanError as exc:
            checks[trainer] = {"config": text, "error": str(exc)}
            continue
        entry: dict = {
            "config": text,
            "predicted_s": result.plan.predicted.iteration_s,
            "fits": result.fits,
            "best_error": result.best_error,
        }
        if result.best is not None:
            entry["best_predicted_s"] = result.best.predicted.iteration_s
            entry["predicted_speedup"] = result.speedup
            entry["best"] = {
                "schedule": result.best.schedule.value,
                "micro_batch_size": result.best.micro_batch_size,
                "split_points": list(result.best.split_points),
            }
            entry["plans"] = (_index(plans, index, result.plan), _index(plans, index, result.best))
        checks[trainer] = entry
    run = verify_plans(plans, spec, rounds=rounds, timeout_s=3600)
    for entry in checks.values():
        if "plans" not in entry:
            continue
        mine, best = entry.pop("plans")
        entry["measured_speedup"] = run.ratio(mine, best)
        entry["error_pct"] = (entry["predicted_speedup"] / entry["measured_speedup"] - 1) * 100
    return {
        "model": spec,
        "ranks": ranks,
        "global_batch": batch,
        "rounds": rounds,
        "checks": checks,
        "measured_s": [r.measured_iteration_s for r in run.reports],
        "wall_s": time.perf_counter() - started,
    }


def _index(plans: list[Plan], index: dict[tuple[object, ...], int], plan: Plan) -> int:
    """The plan's place in the launch (each distinct plan once)."""
    key = plan_key(plan)
    if key not in index:
        index[key] = len(plans)
        plans.append(plan)
    return index[key]


def table(results: list[dict]) -> str:
    rows = [
        "| model | trainer | configuration predicted | best predicted | speed-up predicted | speed-up measured "
        "| error |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        for trainer, c in r["checks"].items():
            if "measured_speedup" not in c:
                why = c.get("error") or c.get("best_error") or "no best plan"
                rows.append(f"| {r['model']} | {trainer} | - | - | - | - | {why[:80]} |")
                continue
            rows.append(
                f"| {r['model']} | {trainer} | {c['predicted_s']:.3f} s | {c['best_predicted_s']:.3f} s | "
                f"{c['predicted_speedup']:.3f}x | {c['measured_speedup']:.3f}x | {c['error_pct']:+.1f} % |"
            )
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="gpt2-small,llama-small")
    parser.add_argument("--ranks", type=int, default=2, help="pipeline ranks, at most the machine's cores")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--out", type=Path, default=Path("/tmp/pipeplan-bench-check"), help="where profiles go")
    parser.add_argument("--profiles", type=Path, default=None, help="an earlier run's --out, in place of profiling")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    started = run_started()
    results = []
    for spec in args.models.split(","):
        print(f"{spec}: profiling ...", file=sys.stderr)
        profile = profile_once(spec, args.ranks, args.out, args.profiles)
        print(f"{spec}: checking and measuring ...", file=sys.stderr)
        results.append(bench_model(spec, profile, ranks=args.ranks, batch=args.batch, rounds=args.rounds))
    text = table(results)
    print(text)
    write_record("check", {"results": results}, started=started, tables={"speedups": table_from_markdown(text)})


if __name__ == "__main__":
    main()
