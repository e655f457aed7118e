"""What a gloo transfer costs the ranks' compute on CPU, beyond the link time the calibration models.

The calibration times a point-to-point message with nothing else running (``p2p_latency_s``, ``p2p_bytes_per_s``)
and the simulator lets a transfer overlap compute. On a machine with a core per rank, gloo's copies need a core
too: while both ranks compute, a transfer slows them. Here 2 gloo processes (1 thread each) repeat, per
iteration: post an isend and an irecv of X bytes to the other rank, compute a fixed chain of small matmuls
(about 15 ms), wait for both. The sizes are interleaved round by round in one launch; the report is each size's
median iteration per rank and its extra time over X = 0 per byte moved (sent plus received).

    python benchmarks/bench_transfer_cost.py [--rounds 40]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

from planner.runtime.launch import run_ranks  # noqa: E402

SIZES_BYTES = (0, 128 << 10, 512 << 10, 2 << 20)
ITERATIONS_PER_BLOCK = 10


def _rank_main(rank: int, world_size: int, rounds: int) -> dict[int, float]:
    torch.manual_seed(0)
    weight, start = torch.randn(256, 256), torch.randn(64, 256)
    peer = 1 - rank
    buffers = {s: (torch.zeros(max(s // 4, 1)), torch.zeros(max(s // 4, 1))) for s in SIZES_BYTES}
    times: dict[int, list[float]] = {s: [] for s in SIZES_BYTES}
    for index in range(rounds):
        k = index % len(SIZES_BYTES)
        for size in SIZES_BYTES[k:] + SIZES_BYTES[:k]:
            send, recv = buffers[size]
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(ITERATIONS_PER_BLOCK):
                requests = [dist.isend(send, peer), dist.irecv(recv, peer)]
                y = start
                for _ in range(60):
                    y = torch.tanh(y @ weight)
                for request in requests:
                    request.wait()
            times[size].append((time.perf_counter() - t0) / ITERATIONS_PER_BLOCK)
    return {s: statistics.median(v) for s, v in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=40)
    args = parser.parse_args()
    results = run_ranks(_rank_main, (args.rounds,), 2, timeout_s=600, backend="gloo", threads=1)
    print("| rank | bytes each way | iteration | extra per byte moved |")
    print("|---|---|---|---|")
    for rank, medians in enumerate(results):
        base = medians[0]
        for size, seconds in medians.items():
            extra = f"{(seconds - base) / (2 * size) * 1e9:.2f} ns" if size else "-"
            print(f"| {rank} | {size >> 10} KiB | {seconds * 1e3:.3f} ms | {extra} |")


if __name__ == "__main__":
    main()
