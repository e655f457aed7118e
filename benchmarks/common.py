"""What every benchmark shares: one profile -> one partition problem, scoring any boundaries, the bound.

All partitions, pipeplan's and the peers', are judged here by the same cost model
(``planner.cost.build_problem``) and the same event simulator (``planner.schedule.simulate.simulate``), so a
ratio between two rows is a ratio of two simulations of the same profile.
"""

from __future__ import annotations

import datetime
import io
import json
import os
import platform
import shlex
import subprocess
import sys
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path
from typing import TextIO

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from planner.cost import CostSettings, UnitCosts, build_problem, default_settings, unit_costs  # noqa: E402
from planner.schedule.orders import Schedule, stage_to_rank  # noqa: E402
from planner.schedule.pipeline import Pipeline  # noqa: E402
from planner.schedule.simulate import in_flight_per_stage, simulate  # noqa: E402
from profiles.format import Profile  # noqa: E402
from solvers.problem import PartitionProblem, evaluate, stage_cost  # noqa: E402

__all__ = [
    "Setting",
    "Score",
    "make_setting",
    "score",
    "lower_bound_s",
    "stage_sizes",
    "RunStart",
    "run_started",
    "write_record",
    "table_from_markdown",
    "tables_in",
    "tee_stdout",
    "RESULTS",
    "RECORD_FORMAT",
]

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
"""Where records go: ``RESULTS/<benchmark>/<date>.json`` (docs/benchmark-records.md)."""
RECORD_FORMAT = "pipeplan.benchmark-record"
RECORD_VERSION = 1


@dataclass(frozen=True)
class Setting:
    """One (profile, micro-batch size, P, M, schedule) on which partitions are compared."""

    profile: Profile
    costs: UnitCosts
    problem: PartitionProblem
    schedule: Schedule
    micro_batch_size: int
    num_stages: int
    num_microbatches: int


@dataclass(frozen=True)
class Score:
    boundaries: tuple[int, ...]
    iteration_s: float
    """Simulated iteration of the schedule, communication included."""
    formula_s: float
    """The solvers' declared objective for the same partition (inf: does not fit in memory)."""
    peak_memory_bytes: float
    fits: bool


def make_setting(
    profile: Profile,
    micro_batch_size: int,
    num_stages: int,
    num_microbatches: int,
    *,
    schedule: Schedule = Schedule.ONE_F_ONE_B,
    settings: CostSettings | None = None,
    recompute_choices: tuple[bool, ...] = (False,),
) -> Setting:
    """The partition problem of one stage per rank under ``schedule`` (in-flight counts from the simulator)."""
    costs = unit_costs(profile, micro_batch_size)
    problem = build_problem(
        profile,
        costs,
        settings or default_settings(profile),
        num_stages=num_stages,
        num_microbatches=num_microbatches,
        in_flight=in_flight_per_stage(schedule, num_stages, num_microbatches, num_stages),
        stage_rank=stage_to_rank(schedule, num_stages, num_stages),
        recompute_choices=recompute_choices,
        schedule=schedule,
    )
    return Setting(profile, costs, problem, schedule, micro_batch_size, num_stages, num_microbatches)


def score(setting: Setting, boundaries: tuple[int, ...], recompute: tuple[bool, ...] | None = None) -> Score:
    """Simulate ``boundaries`` (first unit of every stage) in ``setting``; memory checked against its cap."""
    p = setting.problem
    recompute = recompute or (False,) * p.num_stages
    n = p.num_units
    ends = [*boundaries[1:], n]
    forward, backward = [], []
    for s, (i, j) in enumerate(zip(boundaries, ends, strict=True)):
        f = sum(p.forward_s[i:j])
        forward.append(f)
        backward.append(sum(p.backward_s[i:j]) + (f if recompute[s] else 0.0))
    cuts = [b - 1 for b in boundaries[1:]]
    sim = simulate(
        Pipeline(
            schedule=setting.schedule,
            num_ranks=p.num_stages,
            num_microbatches=p.num_microbatches,
            forward_s=forward,
            backward_s=backward,
            comm_forward_s=[p.cut_forward_s[c] for c in cuts] if p.cut_forward_s else (),
            comm_backward_s=[p.cut_backward_s[c] for c in cuts] if p.cut_backward_s else (),
        )
    )
    objective, _ = evaluate(p, tuple(boundaries), tuple(recompute))
    peak = max(
        stage_cost(p, s, i, j - 1, recompute[s]).memory_bytes
        for s, (i, j) in enumerate(zip(boundaries, ends, strict=True))
    )
    return Score(tuple(boundaries), sim.iteration_s, objective, peak, objective != float("inf"))


def lower_bound_s(costs: UnitCosts, num_stages: int, num_microbatches: int) -> float:
    """``W + (M - 1) * max(W / P, largest unit)``, W the forward+backward work of one micro-batch.

    No communication: one micro-batch must cross all the work (W), and the M - 1 others leave at
    least at the rate of the busiest stage, which holds at least W / P and at least the largest unit.
    """
    per_unit = [f + b for f, b in zip(costs.forward_s, costs.backward_s, strict=True)]
    work = sum(per_unit)
    return work + (num_microbatches - 1) * max(work / num_stages, max(per_unit))


def stage_sizes(boundaries: tuple[int, ...], num_units: int) -> tuple[int, ...]:
    """Units per stage, e.g. (0, 5, 9) of 12 units -> (5, 4, 3)."""
    ends = [*boundaries[1:], num_units]
    return tuple(j - i for i, j in zip(boundaries, ends, strict=True))


# Records: every benchmark run ends by writing one (docs/benchmark-records.md); benchmarks/render.py makes
# docs/BENCHMARKS.md from the latest record of each benchmark.


@dataclass(frozen=True)
class RunStart:
    """What a run knows when it starts: the time, the command line, the load average before it."""

    started_utc: str
    argv: tuple[str, ...]
    load_before: tuple[float, float, float] | None


def run_started(argv: list[str] | None = None) -> RunStart:
    """Call first in a benchmark's ``main``: its start time, command line and load average before it."""
    now = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    return RunStart(now.isoformat().replace("+00:00", "Z"), tuple(sys.argv if argv is None else argv), _load())


def _load() -> tuple[float, float, float] | None:
    try:
        return os.getloadavg()
    except OSError:
        return None


def _command(argv: tuple[str, ...]) -> str:
    if not argv:
        return ""
    script = Path(argv[0])
    try:
        script = script.resolve().relative_to(ROOT)
    except ValueError:
        pass
    return " ".join(shlex.quote(part) for part in ("python", str(script), *argv[1:]))


def _machine() -> dict[str, object]:
    cpu = platform.processor() or None
    memory_gib = None
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            cpu = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), cpu)
        with open("/proc/meminfo", encoding="utf-8") as f:
            kib = int(next(line for line in f if line.startswith("MemTotal")).split()[1])
        memory_gib = round(kib / 2**20, 1)
    except (OSError, StopIteration, ValueError):
        pass
    gpu = None
    torch = sys.modules.get("torch")
    if torch is not None and torch.cuda.is_available():
        gpu = f"{torch.cuda.get_device_name()} x {torch.cuda.device_count()}"
    return {"cpu": cpu, "cores": os.cpu_count(), "memory_gib": memory_gib, "gpu": gpu, "os": platform.platform()}


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _commit() -> str | None:
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, check=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+dirty" if dirty else "")


def _versions() -> dict[str, object]:
    return {
        "python": platform.python_version(),
        "torch": _version("torch"),
        "transformers": _version("transformers"),
        "pipeplan": _commit(),
        "solvers": {"pulp": _version("pulp"), "highspy": _version("highspy")},
        "peers": {"deepspeed": _version("deepspeed"), "torchgpipe": _version("torchgpipe")},
    }


def table_from_markdown(text: str) -> dict[str, list]:
    """The first markdown table in ``text`` as ``{"columns": [...], "rows": [[...], ...]}`` (cells as printed)."""
    lines = [line.strip() for line in text.splitlines() if line.strip().startswith("|")]
    if len(lines) < 2:
        raise ValueError(f"no markdown table in {text[:80]!r}")

    def cells(line: str) -> list[str]:
        return [c.strip() for c in line[1:-1].split("|")]

    return {"columns": cells(lines[0]), "rows": [cells(line) for line in lines[2:]]}


def tables_in(text: str, names: tuple[str, ...] = ()) -> dict[str, dict[str, list]]:
    """Every markdown table printed in ``text``, in order: named by ``names``, then ``table_<n>``."""
    found, block = [], []
    for line in [*text.splitlines(), ""]:
        if line.strip().startswith("|"):
            block.append(line.strip())
        elif block:
            if len(block) >= 2 and set(block[1]) <= set("|-: "):
                found.append(table_from_markdown("\n".join(block)))
            block = []
    return {names[i] if i < len(names) else f"table_{i + 1}": t for i, t in enumerate(found)}


class _Tee(io.TextIOBase):
    def __init__(self, stream: TextIO) -> None:
        self.stream, self.buffer_ = stream, io.StringIO()

    def write(self, text: str) -> int:
        self.buffer_.write(text)
        return self.stream.write(text)

    def flush(self) -> None:
        self.stream.flush()

    def getvalue(self) -> str:
        return self.buffer_.getvalue()


def tee_stdout() -> _Tee:
    """From now on, keep a copy of what the run prints (``.getvalue()``), for its record's tables."""
    tee = _Tee(sys.stdout)
    sys.stdout = tee
    return tee


def write_record(
    benchmark: str,
    numbers: dict[str, object],
    *,
    started: RunStart,
    tables: dict[str, dict[str, list]] | None = None,
    text: dict[str, str] | None = None,
    plots: tuple[str | Path, ...] = (),
    conditions: str | None = None,
    results_dir: Path | None = None,
    trial: bool = False,
) -> Path:
    """Write this run's record to ``<results_dir>/<benchmark>/<date>.json`` and return its path.

    ``numbers`` is the run's results as JSON (raw, units in the keys); ``tables`` the tables it printed
    (``table_from_markdown``), ``text`` any sentence it wrote from its numbers; ``plots`` the pictures it
    drew; ``conditions`` what else shared the machine, when known. ``results_dir`` defaults to
    ``benchmarks/results`` (or ``$PIPEPLAN_RESULTS_DIR``). A trial run (``--quick``, ``--smoke``, the CPU
    path of a device check) passes ``trial=True``: its record goes under ``.trial/`` there, which git ignores
    and the page does not read. A second record of the same benchmark on the same date replaces the first.
    """
    finished = datetime.datetime.now(datetime.timezone.utc).replace(microsecond=0)
    load_after = _load()
    record = {
        "format": RECORD_FORMAT,
        "version": RECORD_VERSION,
        "benchmark": benchmark,
        "date": started.started_utc[:10],
        "started": started.started_utc,
        "finished": finished.isoformat().replace("+00:00", "Z"),
        "command": _command(started.argv),
        "machine": _machine(),
        "versions": _versions(),
        "load": {
            "before": None if started.load_before is None else round(started.load_before[0], 2),
            "after": None if load_after is None else round(load_after[0], 2),
            "conditions": conditions,
        },
        "numbers": numbers,
        "tables": tables or {},
        "text": text or {},
        "findings": [],  # what the run shows, in words: added by whoever reads the run
        "plots": [_relative(p) for p in plots],
    }
    base = results_dir or Path(os.environ.get("PIPEPLAN_RESULTS_DIR", RESULTS))
    if trial:
        base = base / ".trial"
    path = base / benchmark / f"{record['date']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(record, indent=1, default=str, ensure_ascii=False) + "\n", encoding="utf-8")
    tmp.replace(path)
    print(f"record: {path}", file=sys.stderr)
    return path


def _relative(path: str | Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(ROOT))
    except ValueError:
        return str(path)
