"""Eight facts about the machine and the runtime that the cost model rests on:

1. **Rendezvous** (2 local gloo ranks): a receive posted after its send still takes a whole link latency
   to complete (the transfer starts only when both ends are posted), while a receive posted first and
   waited after the data came returns at once. The simulator's rule for torch's single-stage schedules
   (docs/cost-model.md, "Communication") rests on the first number.
2. **Cold resume**: the same small forward+backward (two 256-wide ``Linear``, 4 rows, 1 thread) timed back
   to back, after the thread slept 0.2, 1 or 5 ms, and after a busy wait of as long. The profiler times a
   unit back to back; a pipeline rank runs each action after a wait or other work, so the profiler also
   times the whole model after 1, 3 and 10 ms idle and the simulator adds the difference
   (profiles/resume.py).
3. **Speed over time**: a fixed forward+backward (two 256-wide ``Linear``, 16 rows, 1 thread) run for
   ``--seconds`` seconds, its median and 10th percentile per second. How much the median moves from one
   second to the next sets how long the profiler's rounds and verify's timed steps must span
   (profiles/measure_settings.py and planner/runtime/run_options.py, ``MIN_TIME_S``).
4. **What comes before an action**, by its size: forward+backward steps of two ``Linear`` layers from 256
   wide (4 rows, 0.4 ms) to 2048 wide (64 rows, ~55 ms), each timed back to back, after a 1 ms or 5 ms
   sleep, and after a step of another small model, the four kinds interleaved; the ratio to back to back.
   A pipeline rank runs each action after a wait or after other work; the profiler's round-robin times
   each unit after the other units.
5. **The speed reference tracks a model**: gpt2-tiny's forward+backward (b = 4, 1 thread) and the speed
   reference (profiles/reference.py) called one after the other for ``--track-seconds``; per window of 2,
   10 and 30 s, the model's median over its typical value (the spread a profile and a run made at
   different moments inherit), and the model / reference ratio over its typical value (what is left once
   ``verify`` divides by the reference).

6. **Delivery beside compute** (2 local gloo ranks): a 32 KiB message (a gpt2-tiny activation) from a
   sender that waits on its send, and from one that computes 3 ms right after posting it, the receiver
   blocked in its wait; the time from posting to the receiver's return on the shared monotonic clock,
   the median of each block of 60 messages, with the ranks bound to a core each and unbound
   (``PIPEPLAN_PIN_CPUS=0``; planner/runtime/launch.py, ``pin_rank_cpus``).
7. **Bound ranks, the whole pipeline**: gpt2-tiny and the MLP profiled, planned as 1F1B (P = 2, global
   batch 8, the shipped calibration) and run by ``verify`` in processes mode, bound and unbound in
   alternation for ``--rounds`` rounds; each run's iteration and the unbound / bound ratio per round.

8. **A tied weight's gradient sum**, the two ranks arriving 2 ms apart (the last stage finishes before
   the first in 1F1B): gloo's ``all_reduce`` of a 256 KiB gradient (gpt2-tiny's embedding) against the
   two ranks swapping it (planner/runtime/apply.py, ``_sum_across``); the late rank's time in it, median
   and how many of the steps took over 1 ms, per block of 70.

    python benchmarks/bench_runtime_probes.py [--only track]

Prints one table per probe; medians over the repeats, microseconds.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from common import run_started, tables_in, tee_stdout, write_record  # noqa: E402
from torch import nn  # noqa: E402

from planner.runtime.launch import run_ranks  # noqa: E402

SIZES = (1 << 10, 48 << 10, 1 << 20)
GAPS_S = (0.0, 0.0002, 0.001, 0.005)


def _rendezvous(rank: int, world: int, repeats: int) -> dict[int, tuple[float, float]]:
    """Per size, rank 1's (receive posted 5 ms after the send, receive posted first): time to complete."""
    import torch.distributed as dist

    out = {}
    for size in SIZES:
        buf = torch.zeros(size // 4)
        late, early = [], []
        for _ in range(repeats):
            dist.barrier()
            if rank == 0:
                dist.isend(buf, 1).wait()
            else:
                time.sleep(0.005)
                t0 = time.perf_counter()
                dist.recv(buf, 0)
                late.append(time.perf_counter() - t0)
            dist.barrier()
            if rank == 1:
                work = dist.irecv(buf, 0)
                time.sleep(0.005)
                t0 = time.perf_counter()
                work.wait()
                early.append(time.perf_counter() - t0)
            else:
                time.sleep(0.002)
                dist.send(buf, 1)
        if rank == 1:
            out[size] = (statistics.median(late[2:]), statistics.median(early[2:]))
    return out


def _cold_resume(repeats: int) -> list[tuple[float, float, float]]:
    """Per gap: (gap, step after sleeping it, step after spinning it)."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256))
    x = torch.randn(4, 256, requires_grad=True)

    def step() -> float:
        t0 = time.perf_counter()
        model(x).sum().backward()
        return time.perf_counter() - t0

    for _ in range(50):
        step()
    rows = []
    for gap in GAPS_S:
        slept, spun = [], []
        for _ in range(repeats):
            if gap:
                time.sleep(gap)
            slept.append(step())
            end = time.perf_counter() + gap
            while time.perf_counter() < end:
                pass
            spun.append(step())
        rows.append((gap, statistics.median(slept), statistics.median(spun)))
    return rows


def _speed_over_time(seconds: int) -> list[tuple[float, float]]:
    """Per second: (median, 10th percentile) of the step."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 256))
    x = torch.randn(16, 256)
    out = []
    for _ in range(seconds):
        times: list[float] = []
        end = time.perf_counter() + 1.0
        while time.perf_counter() < end:
            t0 = time.perf_counter()
            model(x).sum().backward()
            times.append(time.perf_counter() - t0)
        times.sort()
        out.append((statistics.median(times), times[len(times) // 10]))
    return out


BEFORE_SIZES = ((256, 4), (512, 16), (1024, 32), (2048, 64))


def _what_comes_before(cycles: int) -> list[tuple[int, int, float, dict[str, float]]]:
    """Per (width, rows): back-to-back step and the ratio of each other kind to it."""
    torch.set_num_threads(1)
    torch.manual_seed(0)

    def model(width: int, rows: int, depth: int = 2) -> tuple[nn.Module, torch.Tensor]:
        layers: list[nn.Module] = []
        for _ in range(depth):
            layers += [nn.Linear(width, width), nn.ReLU()]
        return nn.Sequential(*layers), torch.randn(rows, width, requires_grad=True)

    def step(m: nn.Module, x: torch.Tensor) -> float:
        t0 = time.perf_counter()
        m(x).sum().backward()
        return time.perf_counter() - t0

    other = model(512, 16, 4)
    befores: dict[str, Callable[[], object]] = {
        "back to back": lambda: None,
        "after 1 ms asleep": lambda: time.sleep(0.001),
        "after 5 ms asleep": lambda: time.sleep(0.005),
        "after another model's step": lambda: step(*other),
    }
    rows_out = []
    for width, rows in BEFORE_SIZES:
        m, x = model(width, rows)
        for _ in range(10):
            step(m, x)
        times: dict[str, list[float]] = {k: [] for k in befores}
        for _ in range(cycles if width < 2048 else max(cycles // 4, 3)):
            for kind, before in befores.items():
                for _ in range(4):
                    before()
                    times[kind].append(step(m, x))
        base = statistics.median(times["back to back"])
        ratios = {k: statistics.median(v) / base for k, v in times.items() if k != "back to back"}
        rows_out.append((width, rows, base, ratios))
    return rows_out


TRACK_WINDOWS_S = (2, 10, 30)


def _reference_tracks_a_model(seconds: int) -> list[tuple[int, int, float, float, float, float]]:
    """Per window length: (windows, window, model low, model high, ratio low, ratio high), each over the
    median window."""
    from profiles.reference import SpeedReference
    from profiles.workload import as_tuple, load_workload

    torch.set_num_threads(1)
    workload = load_workload("gpt2-tiny")
    inputs, target = workload.make_batch(4)

    def model_step() -> float:
        t0 = time.perf_counter()
        workload.loss_fn(workload.model(*as_tuple(inputs)), target).backward()
        return time.perf_counter() - t0

    reference = SpeedReference(torch.device("cpu"))
    reference.warm_up()
    for _ in range(5):
        model_step()
    samples: list[tuple[float, float, float]] = []
    started = time.perf_counter()
    while (now := time.perf_counter()) - started < seconds:
        samples.append((now - started, model_step(), reference.time_once()))
    rows = []
    for window in TRACK_WINDOWS_S:
        spans = [
            [(m, r) for t, m, r in samples if k * window <= t < (k + 1) * window] for k in range(seconds // window)
        ]
        model = [statistics.median(m for m, _ in span) for span in spans if span]
        ratio = [
            statistics.median(m for m, _ in span) / statistics.median(r for _, r in span) for span in spans if span
        ]
        typical_m, typical_r = statistics.median(model), statistics.median(ratio)
        rows.append(
            (
                len(model),
                window,
                min(model) / typical_m,
                max(model) / typical_m,
                min(ratio) / typical_r,
                max(ratio) / typical_r,
            )
        )
    return rows


def _compute(seconds: float) -> None:
    """Small matmuls for ``seconds``: a rank busy with its next action."""
    a, end = torch.randn(128, 128), time.perf_counter() + seconds
    while time.perf_counter() < end:
        a = (a @ a).tanh_()


DELIVERY_BYTES = 32 << 10
DELIVERY_BLOCK = 60


def _delivery(rank: int, world: int, blocks: int) -> dict[str, list[float]]:
    """Rank 0's per-block medians of the delivery time, sender waiting vs sender computing."""
    import torch.distributed as dist

    payload = torch.randn(DELIVERY_BYTES // 4)
    out: dict[str, list[float]] = {"sender waits": [], "sender computes 3 ms": []}
    for _ in range(blocks):
        for kind, per_block in out.items():
            times = []
            for _ in range(DELIVERY_BLOCK):
                dist.barrier()
                if rank == 1:
                    time.sleep(0.002)  # the receiver is blocked in its wait by now
                    posted = torch.tensor([time.perf_counter()], dtype=torch.float64)
                    sent = dist.isend(payload, 0)
                    if kind != "sender waits":
                        _compute(0.003)
                    sent.wait()
                    dist.send(posted, 0)
                else:
                    buffer = torch.empty_like(payload)
                    dist.irecv(buffer, 1).wait()
                    arrived = time.perf_counter()
                    posted = torch.empty(1, dtype=torch.float64)
                    dist.recv(posted, 1)
                    times.append(arrived - posted.item())  # one machine: one monotonic clock
            if rank == 0:
                per_block.append(statistics.median(times))
    return out


def _with_binding(bound: bool, fn: Callable[[], object]) -> object:
    import os

    from planner.runtime.launch import PIN_ENV

    saved = os.environ.get(PIN_ENV)
    os.environ[PIN_ENV] = "1" if bound else "0"
    try:
        return fn()
    finally:
        if saved is None:
            del os.environ[PIN_ENV]
        else:
            os.environ[PIN_ENV] = saved


def _bound_vs_unbound(rounds: int) -> list[tuple[str, float, list[tuple[float, float]]]]:
    """Per model: (name, predicted, [(bound, unbound) iteration per round])."""
    from planner.calibration import shipped_calibration
    from planner.cost import default_settings
    from planner.plan import Plan
    from planner.request import PlanRequest
    from planner.runtime.launch import rank_threads
    from planner.runtime.run_options import VerifyOptions
    from planner.runtime.verify import verify_plan
    from planner.search import make_plan
    from profiles.measure_settings import MeasureSettings
    from profiles.profiler import profile_model
    from profiles.workload import load_workload

    def measured(plan: Plan, spec: str, bound: bool) -> float:
        report = _with_binding(
            bound,
            lambda: verify_plan(plan, spec, VerifyOptions(mode="processes", warmup=2, tolerance=0.25, timeout_s=300.0)),
        )
        return float(report.measured_iteration_s)  # type: ignore[attr-defined]

    rows = []
    for spec in ("gpt2-tiny", "mlp"):
        torch.set_num_threads(rank_threads(2))
        profile = profile_model(load_workload(spec), MeasureSettings(micro_batch_sizes=(1, 2, 4), progress=False))
        settings = default_settings(profile, calibration=shipped_calibration("cpu"), calibration_label="shipped")
        plan = make_plan(profile, PlanRequest(2, 8, schedule="1f1b", settings=settings), sha256="0" * 64)
        pairs = [(measured(plan, spec, True), measured(plan, spec, False)) for _ in range(rounds)]
        rows.append((spec, plan.predicted.iteration_s, pairs))
    return rows


TIED_BYTES = 256 << 10
TIED_BLOCK = 70


def _tied_sum(rank: int, world: int, blocks: int) -> dict[str, list[tuple[float, int]]]:
    """Rank 0's (median, steps over 1 ms) per block and way, rank 0 arriving 2 ms after rank 1."""
    import torch.distributed as dist

    from planner.runtime.apply import _sum_across

    grad = torch.randn(TIED_BYTES // 4)
    ways: dict[str, Callable[[torch.Tensor], None]] = {
        "all_reduce": lambda t: dist.all_reduce(t),
        "swap": lambda t: _sum_across(t, None),
    }
    out: dict[str, list[tuple[float, int]]] = {name: [] for name in ways}
    for _ in range(blocks):
        for name, way in ways.items():
            times = []
            for _ in range(TIED_BLOCK):
                dist.barrier()
                if rank == 0:
                    _compute(0.002)
                total = grad.clone()
                t0 = time.perf_counter()
                way(total)
                times.append(time.perf_counter() - t0)
            out[name].append((statistics.median(times), sum(t > 0.001 for t in times)))
    return out


PROBES = ("rendezvous", "resume", "before", "speed", "track", "delivery", "binding", "tied")


def _print_rendezvous(args: argparse.Namespace) -> None:
    ranks = run_ranks(_rendezvous, (30,), 2, timeout_s=300)
    print("| message | receive posted 5 ms after the send | receive posted first, waited after the data came |")
    print("|---|---|---|")
    for size, (late, early) in ranks[1].items():
        print(f"| {size // 1024} KiB | {late * 1e6:.0f} us | {early * 1e6:.0f} us |")


def _print_resume(args: argparse.Namespace) -> None:
    print("| idle before the step | step after sleeping | step after a busy wait |")
    print("|---|---|---|")
    for gap, slept, spun in _cold_resume(300):
        print(f"| {gap * 1e3:g} ms | {slept * 1e6:.0f} us | {spun * 1e6:.0f} us |")


def _print_before(args: argparse.Namespace) -> None:
    before = _what_comes_before(60)
    kinds = list(before[0][3])
    print("| step (width x rows) | back to back | " + " | ".join(kinds) + " |")
    print("|---|---|" + "---|" * len(kinds))
    for width, rows, base, ratios in before:
        cells = " | ".join(f"{ratios[k]:.2f}x" for k in kinds)
        print(f"| {width} x {rows} | {base * 1e6:.0f} us | {cells} |")


def _print_speed(args: argparse.Namespace) -> None:
    per_second = _speed_over_time(args.seconds)
    medians, lows = [m for m, _ in per_second], [p for _, p in per_second]
    print(f"| over {args.seconds} s, per second | lowest | median | highest |")
    print("|---|---|---|---|")
    for name, values in (("median step", medians), ("10th-percentile step", lows)):
        print(
            f"| {name} | {min(values) * 1e6:.0f} us | {statistics.median(values) * 1e6:.0f} us | "
            f"{max(values) * 1e6:.0f} us |"
        )


def _print_track(args: argparse.Namespace) -> None:
    print("| window | windows | gpt2-tiny alone, over its typical window | gpt2-tiny / speed reference, same |")
    print("|---|---|---|---|")
    for count, window, m_low, m_high, r_low, r_high in _reference_tracks_a_model(args.track_seconds):
        print(f"| {window} s | {count} | {m_low:.2f}-{m_high:.2f} | {r_low:.2f}-{r_high:.2f} |")


def _print_delivery(args: argparse.Namespace) -> None:
    print(f"| ranks | sender | delivery of {DELIVERY_BYTES // 1024} KiB, median of each block of {DELIVERY_BLOCK} |")
    print("|---|---|---|")
    for bound in (True, False):
        blocks = _with_binding(bound, lambda: run_ranks(_delivery, (args.blocks,), 2, timeout_s=600)[0])
        for kind, medians in blocks.items():  # type: ignore[attr-defined]
            cells = ", ".join(f"{m * 1e6:.0f}" for m in medians)
            print(f"| {'bound' if bound else 'unbound'} | {kind} | {cells} us |")


def _print_binding(args: argparse.Namespace) -> None:
    print(
        "| model (1F1B, P = 2, global batch 8) | predicted | bound, per round | unbound, per round "
        "| unbound / bound, median |"
    )
    print("|---|---|---|---|---|")
    for spec, predicted, pairs in _bound_vs_unbound(args.rounds):
        bound = ", ".join(f"{b * 1e3:.2f}" for b, _ in pairs)
        unbound = ", ".join(f"{u * 1e3:.2f}" for _, u in pairs)
        ratio = statistics.median(u / b for b, u in pairs)
        print(f"| {spec} | {predicted * 1e3:.2f} ms | {bound} ms | {unbound} ms | {ratio:.2f}x |")


def _print_tied(args: argparse.Namespace) -> None:
    print(f"| the late rank's sum of {TIED_BYTES // 1024} KiB | per block of {TIED_BLOCK}: median (steps over 1 ms) |")
    print("|---|---|")
    for name, blocks in run_ranks(_tied_sum, (args.blocks,), 2, timeout_s=600)[0].items():
        print(f"| {name} | " + ", ".join(f"{m * 1e6:.0f} us ({n})" for m, n in blocks) + " |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=int, default=40, help="length of the speed-over-time probe")
    parser.add_argument("--track-seconds", type=int, default=90, help="length of the speed-reference probe")
    parser.add_argument("--blocks", type=int, default=4, help="blocks of messages in the delivery probe")
    parser.add_argument("--rounds", type=int, default=4, help="bound/unbound rounds in the binding probe")
    parser.add_argument(
        "--only", choices=PROBES, action="append", help="run only this probe (repeatable; default: all, in order)"
    )
    args = parser.parse_args()
    started, printed = run_started(), tee_stdout()
    printers = {
        "rendezvous": _print_rendezvous,
        "resume": _print_resume,
        "before": _print_before,
        "speed": _print_speed,
        "track": _print_track,
        "delivery": _print_delivery,
        "binding": _print_binding,
        "tied": _print_tied,
    }
    for i, name in enumerate(args.only or PROBES):
        if i:
            print()
        printers[name](args)
    probes = list(args.only or PROBES)
    write_record("runtime_probes", {"probes": probes}, started=started, tables=tables_in(printed.getvalue()))


if __name__ == "__main__":
    main()
