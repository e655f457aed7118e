"""Measured P = 2 (BENCHMARKS section 7): pipeplan's full plan (every schedule) vs the peers' 1F1B on llama-small.

    pipeplan profile llama-small --ranks 2 --micro-batch-sizes 1,2 --out llama.profile.json
    python benchmarks/bench_zero_bubble_measured.py llama.profile.json

Each plan runs on 2 gloo processes (section 2's bench_measured: rounds in rotating order, median), global
batch 8 (b = 2, M = 4), Adam inside the timed step.
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_measured as bm  # noqa: E402
from bench_quality import pipeplan_full  # noqa: E402
from common import run_started, tables_in, tee_stdout, write_record  # noqa: E402

from planner.calibration import shipped_calibration  # noqa: E402
from planner.cost import default_settings  # noqa: E402
from profiles.format import load_profile  # noqa: E402

if __name__ == "__main__":
    started, printed = run_started(), tee_stdout()
    prof = load_profile(sys.argv[1])
    plans = bm.choose_plans(prof, 2, 4)
    cal = default_settings(prof, calibration=shipped_calibration("cpu"), calibration_label="shipped")
    plans.insert(1, bm.MeasuredPlan("pipeplan (full plan, shipped calibration)", pipeplan_full(prof, 2, 8, cal)))
    for mp in plans:
        p = mp.plan
        print(
            mp.name,
            p.schedule.value,
            p.virtual_stages,
            p.micro_batch_size,
            p.num_microbatches,
            p.split_points,
            f"{p.predicted.iteration_s:.3f}",
        )
    bm.measure(plans, "llama-small", rounds=3, steps=2, warmup=1)
    print(bm.measured_table(plans, prof))
    write_record("zero_bubble_measured", {}, started=started, tables=tables_in(printed.getvalue(), ("plans",)))
