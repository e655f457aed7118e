"""Profiling cost and noise (issue 6, item 5), and the cached profiles every other benchmark reads.

Each profile is made by the CLI in a fresh process (``python cli.py profile MODEL ...``, what
``pipeplan profile`` runs) and timed from outside, so the time includes imports and model building.
Profiles and their wall times are cached under ``benchmarks/.cache/`` (``--fresh`` remakes them).
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from profiles.format import Profile, load_profile  # noqa: E402

__all__ = ["ProfileRun", "CACHE", "profile_cached", "UnitSpread", "unit_spread", "spread_table", "block_spread"]

CACHE = ROOT / "benchmarks" / ".cache"


@dataclass(frozen=True)
class ProfileRun:
    model: str
    path: Path
    wall_s: float
    """Whole-process time of the CLI run that made the profile."""
    cached: bool


def _key(model: str, sizes: tuple[int, ...], repeats: int, run: int, threads: int | None) -> str:
    name = model.rsplit(":", 1)[-1].replace("_", "-")
    suffix = f"_t{threads}" if threads else ""
    return f"{name}_b{'-'.join(map(str, sizes))}_r{repeats}{suffix}_{run}"


def profile_cached(
    model: str,
    sizes: tuple[int, ...],
    *,
    repeats: int = 3,
    run: int = 0,
    threads: int | None = None,
    fresh: bool = False,
) -> ProfileRun:
    """The ``run``-th cached profile of ``model`` (made by the CLI in a fresh process when missing).

    ``threads`` sets OMP_NUM_THREADS for the profiling process (None: torch's default, one per core).
    """
    CACHE.mkdir(parents=True, exist_ok=True)
    key = _key(model, sizes, repeats, run, threads)
    path, meta = CACHE / f"{key}.profile.json", CACHE / f"{key}.meta.json"
    if path.exists() and meta.exists() and not fresh:
        return ProfileRun(model, path, json.loads(meta.read_text())["wall_s"], cached=True)
    cmd = [sys.executable, "cli.py", "profile", model, "--micro-batch-sizes", ",".join(map(str, sizes))]
    cmd += ["--repeats", str(repeats), "--no-progress", "--out", str(path)]
    print(f"  profiling: {' '.join(cmd[1:])}", flush=True)
    start = time.perf_counter()
    env = os.environ.copy()
    if threads:
        env["OMP_NUM_THREADS"] = str(threads)
    done = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    wall_s = time.perf_counter() - start
    if done.returncode != 0:
        raise RuntimeError(f"profiling {model} failed (exit {done.returncode}): {done.stderr.strip()[-2000:]}")
    load_avg = os.getloadavg()[0]
    meta.write_text(json.dumps({"wall_s": wall_s, "load_avg_1m_after": load_avg, "cmd": cmd[1:]}))
    print(f"  ... {wall_s:.1f} s (load {load_avg:.2f})", flush=True)
    return ProfileRun(model, path, wall_s, cached=False)


@dataclass(frozen=True)
class UnitSpread:
    micro_batch_size: int
    median_spread_pct: float
    """Median over units of (max - min) / median of forward+backward across runs."""
    max_spread_pct: float
    max_unit: str
    total_spread_pct: float
    """(max - min) / median of the summed unit time across runs."""


def unit_spread(profiles: list[Profile]) -> list[UnitSpread]:
    """Run-to-run spread of unit times over several profiles of one model."""
    rows = []
    first = profiles[0]
    for k, b in enumerate(first.micro_batch_sizes):
        spreads: list[tuple[float, str]] = []
        for u, unit in enumerate(first.units):
            times = [p.units[u].forward_s[k] + p.units[u].backward_s[k] for p in profiles]
            spreads.append(((max(times) - min(times)) / statistics.median(times) * 100, unit.name))
        totals = [p.unit_sum_s(k) for p in profiles]
        worst = max(spreads)
        rows.append(
            UnitSpread(
                b,
                statistics.median(s for s, _ in spreads),
                worst[0],
                worst[1],
                (max(totals) - min(totals)) / statistics.median(totals) * 100,
            )
        )
    return rows


def spread_table(rows: list[UnitSpread], runs: int) -> str:
    lines = [
        f"| micro-batch | median unit spread ({runs} runs) | largest unit spread | that unit "
        "| spread of the unit sum |",
        "|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r.micro_batch_size} | {r.median_spread_pct:.1f} % | {r.max_spread_pct:.1f} % | `{r.max_unit}` "
            f"| {r.total_spread_pct:.1f} % |"
        )
    return "\n".join(lines)


def load(run: ProfileRun) -> Profile:
    return load_profile(run.path)


def block_spread(profile: Profile) -> list[float] | None:
    """Per micro-batch size: (max - min) / median of forward+backward over the identical transformer blocks.

    The blocks of one model do the same work, so their spread within one profile measures the noise
    of that profile alone. None when the model has no repeated block list.
    """
    from peers import block_units

    blocks = block_units([u.name for u in profile.units])
    if blocks is None:
        return None
    first, last = blocks
    out = []
    for k in range(len(profile.micro_batch_sizes)):
        times = [u.forward_s[k] + u.backward_s[k] for u in profile.units[first : last + 1]]
        out.append((max(times) - min(times)) / statistics.median(times) * 100)
    return out
