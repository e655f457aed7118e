"""The device check of the fidelity issue, as one short command (< 8 min on one H200).

On CUDA:  python benchmarks/gpu_check.py --device cuda --out benchmarks/results/gpu
On CPU (the path the test suite runs, gpt2-tiny):  python benchmarks/gpu_check.py --device cpu --quick --out DIR

1. ``calibrate`` on the device (2 ranks when there are 2 GPUs; with one GPU, one rank: optimizer and
   per-action overhead measured, the link left at the shipped values and said so);
2. ``profile`` gpt2-small in bfloat16 (CUDA) or gpt2-tiny in float32 (CPU, ``--quick``);
3. ``plan`` it for 2 stages with that calibration;
4. ``verify`` it in replay mode on the one device, and hold the allocator's peak
   (``torch.cuda.max_memory_allocated``) against the memory the plan predicts for the stages that replay
   keeps resident (weights, gradients, activations in flight; replay runs no optimizer).

Writes ``check.json`` (every number) and ``check.md`` (a table for docs/BENCHMARKS.md) into ``--out``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from common import run_started, table_from_markdown, write_record  # noqa: E402

from planner.calibration import save_calibration  # noqa: E402
from planner.cost import default_settings  # noqa: E402
from planner.plan import save_plan  # noqa: E402
from planner.request import PlanRequest  # noqa: E402
from planner.runtime.calibrate import MIN_MEASURE_S, calibrate  # noqa: E402
from planner.runtime.run_options import VerifyOptions  # noqa: E402
from planner.runtime.verify import verify_plan  # noqa: E402
from planner.search import make_plan  # noqa: E402
from profiles.format import save_profile  # noqa: E402
from profiles.measure_settings import MIN_TIME_S, MeasureSettings  # noqa: E402
from profiles.profiler import DTYPES, profile_model  # noqa: E402
from profiles.workload import load_workload  # noqa: E402


def _resident_prediction_bytes(plan) -> int:
    """What replay holds at its peak: every stage's weights, gradients, optimizer state (replay steps the
    optimizer), activations and receive buffers, one transient."""
    stages = plan.stages
    parts = ("params", "grads", "optimizer", "activations", "buffers")
    held = sum(getattr(s.memory_bytes, part) for s in stages for part in parts)
    return held + max(s.memory_bytes.transient for s in stages)


def run(device: str, quick: bool, out: Path) -> dict[str, object]:
    out.mkdir(parents=True, exist_ok=True)
    model, dtype = ("gpt2-tiny", "float32") if quick else ("gpt2-small", "bfloat16" if device == "cuda" else "float32")
    started = time.perf_counter()
    ranks = 2 if device == "cpu" or torch.cuda.device_count() >= 2 else 1
    calibration = calibrate(
        ranks,
        device=device,
        repeats=5 if quick else 15,
        steps=3 if quick else 7,
        min_measure_s=0.0 if quick else MIN_MEASURE_S,
    )
    save_calibration(calibration, out / "calibration.json")
    workload = load_workload(model)
    profile = profile_model(
        workload,
        MeasureSettings(
            micro_batch_sizes=(1, 2, 4),
            device=device,
            dtype=dtype,
            repeats=1 if quick else 5,
            progress=False,
            min_time_s=0.0 if quick else MIN_TIME_S,
        ),
    )
    save_profile(profile, out / "profile.json")
    settings = default_settings(profile, calibration=calibration, calibration_label="gpu_check")
    plan = make_plan(profile, PlanRequest(num_ranks=2, global_batch_size=8, settings=settings), sha256="0" * 64)
    save_plan(plan, out / "plan.json")
    # Replay runs the model as profiled: same dtype, same device.
    replayed = load_workload(model)
    replayed = replace(replayed, model=replayed.model.to(dtype=DTYPES[dtype]))
    if device == "cuda":
        torch.cuda.reset_peak_memory_stats()
    report = verify_plan(
        plan,
        replayed,
        VerifyOptions(mode="replay", steps=2 if quick else 5, warmup=1, device=device, tolerance=0.25, timeout_s=300.0),
    )
    allocator_peak = int(torch.cuda.max_memory_allocated()) if device == "cuda" else None
    result: dict[str, object] = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "model": model,
        "dtype": dtype,
        "torch": torch.__version__,
        "calibration": {k: v for k, v in calibration.to_dict().items() if k != "notes"},
        "unit_sum_vs_whole_pct": [
            (profile.unit_sum_s(k) - profile.whole_s(k)) / profile.whole_s(k) * 100
            for k in range(len(profile.micro_batch_sizes))
        ],
        "plan": {
            "schedule": plan.schedule.value,
            "micro_batch_size": plan.micro_batch_size,
            "split_points": list(plan.split_points),
        },
        "predicted_iteration_s": report.predicted_iteration_s,
        "replayed_iteration_s": report.measured_iteration_s,
        "iteration_error_pct": report.iteration_error_pct,
        "predicted_resident_bytes": _resident_prediction_bytes(plan),
        "allocator_peak_bytes": allocator_peak,
        "wall_s": time.perf_counter() - started,
    }
    (out / "check.json").write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    (out / "check.md").write_text(_markdown(result))
    return result


def _markdown(r: dict[str, object]) -> str:
    cal = r["calibration"]
    assert isinstance(cal, dict)
    peak = r["allocator_peak_bytes"]
    memory = (
        f"{peak / 2**20:.0f} MiB allocator peak vs {int(r['predicted_resident_bytes']) / 2**20:.0f} MiB predicted"
        if isinstance(peak, int)
        else "n/a (CPU)"
    )
    rows = [
        ("device", r["device"]),
        ("model, dtype", f"{r['model']}, {r['dtype']}"),
        ("per-action overhead (ms)", ", ".join(f"{k} {v * 1e3:.3f}" for k, v in cal["action_overhead_s"].items())),
        ("link", f"{cal['p2p_latency_s'] * 1e6:.1f} us + bytes / {cal['p2p_bytes_per_s'] / 1e9:.1f} GB/s"),
        ("Adam per parameter", f"{cal['optimizer']['adam']['per_param_s'] * 1e12:.2f} ps"),
        ("unit sum vs whole model", ", ".join(f"{x:+.1f}%" for x in r["unit_sum_vs_whole_pct"])),  # type: ignore[union-attr]
        ("replayed vs predicted iteration", f"{r['iteration_error_pct']:+.1f}%"),
        ("memory (replay, all stages resident)", memory),
        ("wall time", f"{r['wall_s']:.0f} s"),
    ]
    return "| measure | value |\n|---|---|\n" + "".join(f"| {k} | {v} |\n" for k, v in rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    parser.add_argument("--quick", action="store_true", help="gpt2-tiny, few repeats (the CPU path the tests run)")
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/gpu"))
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu_check: no CUDA device here; run with --device cpu --quick for the CPU path", file=sys.stderr)
        return 2
    started = run_started()
    result = run(args.device, args.quick, args.out)
    print((args.out / "check.md").read_text())
    print(f"wrote {args.out / 'check.json'} in {result['wall_s']:.0f} s")
    tables = {"check": table_from_markdown((args.out / "check.md").read_text())}
    trial = args.device != "cuda" or args.quick  # the CPU path is the script's own check, not a result
    write_record("gpu_check", result, started=started, tables=tables, trial=trial)
    return 0


if __name__ == "__main__":
    sys.exit(main())
