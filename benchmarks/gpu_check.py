"""The device check, as one short command (meant for under 8 min on one H100 or H200).

On CUDA:  python benchmarks/gpu_check.py --device cuda --out benchmarks/results/gpu
On CPU (the path the test suite runs, gpt2-tiny):  python benchmarks/gpu_check.py --device cpu --quick --out DIR

1. ``calibrate`` on the device (2 ranks when there are 2 GPUs; with one GPU, one rank: optimizer and
   per-action overhead measured, the link left at the shipped values and said so); on CPU with ``--quick``,
   the shipped CPU calibration instead;
2. ``profile`` gpt2-small and a Llama 3.2 1B-shaped model (hidden 2048, 16 layers, 2,048 tokens) in bfloat16,
   at micro-batch 1, 2 and 4 (on CUDA the units are timed in context: profiles/in_context.py), or gpt2-tiny in
   float32 (CPU, ``--quick``); each size's unit sum against the whole model;
3. ``plan`` each for 2 and 4 stages with that calibration;
4. ``verify`` each plan in replay mode on the one device, and hold the allocator's peak
   (``torch.cuda.max_memory_allocated``) against the memory the plan predicts for the stages that replay
   keeps resident.

Writes ``check.json`` (every number) and ``check.md`` (a table for docs/BENCHMARKS.md) into ``--out``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import sys
import time
from dataclasses import replace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from common import run_started, table_from_markdown, write_record  # noqa: E402

from planner.calibration import save_calibration, shipped_calibration  # noqa: E402
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


MODELS = (
    # (MODEL spec, dtype, load options): gpt2-small, and a GPU-bound Llama of the size people train (Llama 3.2
    # 1B's shape, untied, built from its config: nothing downloaded) at 2,048 tokens.
    ("gpt2-small", "bfloat16", {}),
    ("hf:benchmarks/llama-3.2-1b.json", "bfloat16", {"seq_len": 2048}),
)
QUICK_MODELS = (("gpt2-tiny", "float32", {}),)


def _check_model(
    spec: str, dtype: str, options: dict, device: str, quick: bool, calibration, out: Path
) -> dict[str, object]:
    """One model: profiled at micro-batch 1, 2 and 4 (units in context on a GPU), planned for 2 and 4 stages
    (2 with ``quick``), each plan replayed on the one device against its prediction and the allocator's peak."""
    name = spec.rpartition("/")[2].removesuffix(".json")
    profile = profile_model(
        load_workload(spec, **options),
        MeasureSettings(
            micro_batch_sizes=(1, 2, 4),
            device=device,
            dtype=dtype,
            repeats=1 if quick else 3,
            progress=False,
            min_time_s=0.0 if quick else MIN_TIME_S,
        ),
    )
    save_profile(profile, out / f"{name}.profile.json")
    settings = default_settings(profile, calibration=calibration, calibration_label="gpu_check")
    entry: dict[str, object] = {
        "name": spec,
        "dtype": dtype,
        "unit_timing": profile.settings.get("unit_timing", {"units": "alone"}),
        "unit_sum_error_pct": [profile.unit_sum_error(k) * 100 for k in range(len(profile.micro_batch_sizes))],
        "plans": [],
        "replay_error_pct": [],
        "memory_error_pct": [],
    }
    for stages in (2,) if quick else (2, 4):
        request = PlanRequest(num_ranks=stages, global_batch_size=8, settings=settings)
        plan = make_plan(profile, request, sha256="0" * 64)
        save_plan(plan, out / f"{name}.p{stages}.plan.json")
        # Replay runs the model as profiled: same dtype, same device.
        replayed = load_workload(spec, **options)
        replayed = replace(replayed, model=replayed.model.to(dtype=DTYPES[dtype]))
        if device == "cuda":
            torch.cuda.reset_peak_memory_stats()
        report = verify_plan(
            plan,
            replayed,
            VerifyOptions(
                mode="replay", steps=2 if quick else 5, warmup=1, device=device, tolerance=0.25, timeout_s=300.0
            ),
        )
        predicted_bytes = _resident_prediction_bytes(plan)
        peak = int(torch.cuda.max_memory_allocated()) if device == "cuda" else None
        entry["plans"].append(  # type: ignore[union-attr]
            {
                "stages": stages,
                "schedule": plan.schedule.value,
                "micro_batch_size": plan.micro_batch_size,
                "split_points": list(plan.split_points),
                "predicted_iteration_s": report.predicted_iteration_s,
                "replayed_iteration_s": report.measured_iteration_s,
                "predicted_resident_bytes": predicted_bytes,
                "allocator_peak_bytes": peak,
            }
        )
        entry["replay_error_pct"].append(report.iteration_error_pct)  # type: ignore[union-attr]
        entry["memory_error_pct"].append(  # type: ignore[union-attr]
            None if peak is None else (peak - predicted_bytes) / predicted_bytes * 100
        )
    return entry


def run(device: str, quick: bool, out: Path) -> dict[str, object]:
    out.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    ranks = 2 if device == "cpu" or torch.cuda.device_count() >= 2 else 1
    if quick and device == "cpu":
        # The CPU path checks the script, not the machine: calibrating gloo ranks is tested on its own
        # (tests/planner/runtime/test_calibrate.py), and the shipped CPU calibration was measured that way.
        calibration = shipped_calibration("cpu")
    else:
        calibration = calibrate(
            ranks,
            device=device,
            repeats=5 if quick else 15,
            steps=3 if quick else 7,
            min_measure_s=0.0 if quick else MIN_MEASURE_S,
        )
    save_calibration(calibration, out / "calibration.json")
    models = QUICK_MODELS if quick else MODELS
    result: dict[str, object] = {
        "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
        "date": datetime.date.today().isoformat(),
        "torch": torch.__version__,
        "calibration": {k: v for k, v in calibration.to_dict().items() if k != "notes"},
        "models": [_check_model(*m, device, quick, calibration, out) for m in models],
    }
    result["wall_s"] = time.perf_counter() - started
    (out / "check.json").write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    (out / "check.md").write_text(_markdown(result))
    return result


def _pct(values: object) -> str:
    return ", ".join("n/a" if v is None else f"{v:+.1f}%" for v in values)  # type: ignore[union-attr]


def _markdown(r: dict[str, object]) -> str:
    cal = r["calibration"]
    assert isinstance(cal, dict)
    rows = [
        ("device", r["device"]),
        ("per-action overhead (ms)", ", ".join(f"{k} {v * 1e3:.3f}" for k, v in cal["action_overhead_s"].items())),
        ("Adam per parameter", f"{cal['optimizer']['adam']['per_param_s'] * 1e12:.2f} ps"),
    ]
    for m in r["models"]:  # type: ignore[union-attr]
        rows += [
            (f"{m['name']} ({m['dtype']}): units timed", m["unit_timing"]["units"]),
            ("unit sum vs whole model (b = 1, 2, 4)", _pct(m["unit_sum_error_pct"])),
            ("replayed vs predicted iteration (2, 4 stages)", _pct(m["replay_error_pct"])),
            ("allocator peak vs predicted (2, 4 stages)", _pct(m["memory_error_pct"])),
        ]
    rows.append(("wall time", f"{r['wall_s']:.0f} s"))
    return "| measure | value |\n|---|---|\n" + "".join(f"| {k} | {v} |\n" for k, v in rows)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cuda")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="gpt2-tiny, few repeats, on CPU the shipped calibration (the CPU path the tests run)",
    )
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
