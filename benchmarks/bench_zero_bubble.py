"""Zero-bubble schedules (issue 11): the full plan, every torch schedule in its search, against the best peer.

For each profile and P: the peers (uniform, DeepSpeed 'parameters', torchgpipe balance_by_time, ...) cut
one stage per rank and keep their 1F1B, at b = 2 and M = 4P (``bench_quality.quality_rows``); pipeplan's
full plan searches micro-batch size, schedule (all eight, the split-backward ones with the profile's
measured I/W), virtual stages, recomputation and boundaries at the same global batch. Also the best plan
of each schedule alone, to say which schedule won and by how much. Simulated; no calibration (the
textbook model), so the comparison is the schedules' and partitions', not the runtime's.

Run: ``python benchmarks/bench_zero_bubble.py NAME=PROFILE.json ...`` (prints markdown tables).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_quality import _full_desc, quality_rows  # noqa: E402
from common import make_setting, run_started, score, tables_in, tee_stdout, write_record  # noqa: E402  # noqa: E402
from peers import peer_partitions  # noqa: E402

from planner.cost import default_settings  # noqa: E402
from planner.errors import PipeplanError  # noqa: E402
from planner.request import PlanRequest  # noqa: E402
from planner.schedule.orders import Schedule  # noqa: E402
from planner.search import make_plan  # noqa: E402
from profiles.format import Profile, load_profile  # noqa: E402

__all__ = ["zero_bubble_tables"]


def _per_schedule(profile: Profile, p: int, global_batch: int) -> dict[str, str]:
    out = {}
    for schedule in Schedule:
        if schedule is Schedule.NAIVE:
            continue
        try:
            request = PlanRequest(p, global_batch, schedule=schedule, settings=default_settings(profile))
            plan = make_plan(profile, request, sha256="benchmark")
        except PipeplanError as exc:
            out[schedule.value] = f"- ({type(exc).__name__})"
            continue
        v = f" v={plan.virtual_stages}" if plan.virtual_stages > 1 else ""
        out[schedule.value] = f"{plan.predicted.iteration_s:.3f}{v}"
    return out


def _best_peer_at(profile: Profile, p: int, b: int, m: int) -> float | None:
    """The best fitting peer (1F1B, one stage per rank) at the full plan's own micro-batch size and count."""
    setting = make_setting(profile, b, p, m)
    costs = setting.costs
    times = [f + bw for f, bw in zip(costs.forward_s, costs.backward_s, strict=True)]
    names = [u.name for u in profile.units]
    scores = [
        score(setting, r)
        for r in peer_partitions(names, times, list(costs.param_count), p).values()
        if not isinstance(r, str)
    ]
    fitting = [s.iteration_s for s in scores if s.fits]
    return min(fitting) if fitting else None


def zero_bubble_tables(profiles: dict[str, Profile], stages: tuple[int, ...] = (4, 8)) -> str:
    head = "| model | P | b x M | best peer (1F1B) | pipeplan full plan | best peer / full | "
    head += "best peer at the plan's b x M / full | 1F1B-only plan / full | spread |"
    lines = [head, "|---|---|---|---|---|---|---|---|---|"]
    per: list[str] = []
    names = [s.value for s in Schedule if s is not Schedule.NAIVE]
    per_head = "| model | P | " + " | ".join(names) + " |"
    per_lines = [per_head, "|---|---|" + "---|" * len(names)]
    for model, profile in profiles.items():
        for row in quality_rows(model, profile, stages):
            best = row.best_peer
            full = row.full
            busy = full.predicted.busy_s
            spread = 1 - min(busy) / max(busy) if busy and max(busy) > 0 else 0.0
            peer = f"{best[0]}: {best[1].iteration_s:.3f}" if best else "-"
            ratio = f"**{best[1].iteration_s / full.predicted.iteration_s:.3f}**" if best else "-"
            lines.append(
                f"| {model} | {row.num_stages} | {row.micro_batch_size} x {row.num_microbatches} | {peer} | "
                f"{full.predicted.iteration_s:.3f} ({_full_desc(full)}) | {ratio} | {spread:.0%} |"
            )
            cells = _per_schedule(profile, row.num_stages, row.micro_batch_size * row.num_microbatches)
            per_lines.append(f"| {model} | {row.num_stages} | " + " | ".join(cells[n] for n in names) + " |")
            same = _best_peer_at(profile, row.num_stages, full.micro_batch_size, full.num_microbatches)
            one_f_one_b = float(cells["1f1b"].split()[0]) if cells["1f1b"][0].isdigit() else None
            s_full = full.predicted.iteration_s
            lines[-1] = (
                lines[-1].removesuffix(f" {spread:.0%} |")
                + (f" {same / s_full:.3f} |" if same else " - |")
                + (f" {one_f_one_b / s_full:.3f} |" if one_f_one_b else " - |")
                + f" {spread:.0%} |"
            )
    per = per_lines
    return "\n".join(lines) + "\n\nbest plan of each schedule alone (simulated iteration, s):\n\n" + "\n".join(per)


def main(argv: list[str]) -> None:
    started, printed = run_started(), tee_stdout()
    profiles = {}
    for arg in argv:
        name, _, path = arg.partition("=")
        profiles[name] = load_profile(path)
    print(zero_bubble_tables(profiles))
    write_record("zero_bubble", {}, started=started, tables=tables_in(printed.getvalue(), ("cases",)))


if __name__ == "__main__":
    main(sys.argv[1:])
