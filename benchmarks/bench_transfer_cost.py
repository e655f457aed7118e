"""What a gloo transfer costs the ranks' compute on CPU, beyond the link time the calibration models.

The calibration times a point-to-point message with nothing else running (``p2p_latency_s``, ``p2p_bytes_per_s``)
and the simulator lets a transfer overlap compute. On a machine with a core per rank, gloo's copies need a core
too: while the ranks compute, a transfer slows them (``transfer_compute_s_per_byte``). Here ``pipeplan
calibrate``'s own probe runs at several sizes (:func:`planner.runtime.calibrate.transfer_run_times`: torch's 1F1B
on 2 gloo processes of 1 thread, each stage an MLP block that also passes on a tensor of X bytes and its gradient),
interleaved round by round in one launch. The report is each size's median step, its median ratio to the step at
X = 0, and the compute per byte sent or received at which the simulator predicts that ratio with the shipped
link (:func:`~planner.runtime.calibrate.fit_transfer_cost`).

    python benchmarks/bench_transfer_cost.py [--rounds 12]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from common import run_started, tables_in, tee_stdout, write_record  # noqa: E402

from planner.calibration import shipped_calibration  # noqa: E402
from planner.runtime.calibrate import fit_transfer_cost, transfer_run_times  # noqa: E402
from planner.runtime.launch import run_ranks  # noqa: E402

SIZES_BYTES = (0, 1 << 20, 4 << 20, 8 << 20)


def _rank_main(rank: int, world_size: int, rounds: int) -> dict[int, list[float]]:
    return transfer_run_times(rank, world_size, rounds, SIZES_BYTES)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=12)
    args = parser.parse_args()
    started, printed = run_started(), tee_stdout()
    times = run_ranks(_rank_main, (args.rounds,), 2, timeout_s=1200, backend="gloo", threads=1)[0]
    link = shipped_calibration("cpu")
    print("| bytes each way | step (median) | ratio to 0 bytes | compute per byte sent or received |")
    print("|---|---|---|---|")
    for size, values in times.items():
        ratio = statistics.median(t / t0 for t, t0 in zip(values, times[0], strict=True))
        fitted = fit_transfer_cost({0: times[0], size: values}, 2, link.p2p_latency_s, link.p2p_bytes_per_s)
        per_byte = f"{fitted * 1e9:.2f} ns" if size else "-"
        print(f"| {size >> 10} KiB | {statistics.median(values) * 1e3:.1f} ms | {ratio:.3f} | {per_byte} |")
    raw = {str(size): values for size, values in times.items()}
    write_record("transfer_cost", {"step_s": raw}, started=started, tables=tables_in(printed.getvalue(), ("sizes",)))


if __name__ == "__main__":
    main()
