"""The cluster search as a user runs it, against another checkout of pipeplan, interleaved.

Two plans are timed, wall clock, each a fresh ``python -m cli plan`` process:

- ``syn2000``: a synthetic 2,000-unit profile (bench_planner_scale's, seed 0) for 4,096 devices, 8 a node, with
  tensor parallelism searched (``--tensor-parallel auto``; the profile records no heads, so tp 1);
- ``llama-3-70b``: Llama 3 70B (examples/llama-3-70b.json) profiled by the H100's device model, for 64 devices
  with tensor parallelism searched.

Each with the CLI's defaults (a worker a CPU) and in one process (``--jobs 1``), ``--pairs`` times, this checkout
and ``--against`` (another checkout's root, e.g. ``git worktree add /tmp/before HEAD~3``) one after the other
so that both see the same stretch of the machine (its speed moves by half within a minute): the record holds
every wall time, the median ratio of the pairs, and whether the two wrote the same plan byte for byte.

    python benchmarks/bench_cluster_cli.py --against /tmp/before [--pairs 3]
"""

from __future__ import annotations

import argparse
import hashlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_planner_scale import synthetic_profile  # noqa: E402
from common import ROOT, run_started, write_record  # noqa: E402

from profiles.format import save_profile  # noqa: E402

CASES = {
    "syn2000": ["--devices", "4096", "--devices-per-node", "8", "--global-batch", "4096", "--tensor-parallel", "auto"],
    "llama-3-70b": ["--devices", "64", "--global-batch", "128", "--tensor-parallel", "auto"],
}


def _plan(root: Path, profile: Path, args: list[str], out: Path) -> tuple[float, str]:
    """One ``plan`` of the checkout at ``root``: its wall seconds and the plan's md5."""
    env = {**os.environ, "PYTHONPATH": str(root)}
    command = [sys.executable, "-m", "cli", "plan", str(profile), *args, "--out", str(out)]
    started = time.perf_counter()
    done = subprocess.run(command, cwd=out.parent, env=env, capture_output=True, text=True)
    wall_s = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{root}: plan exited {done.returncode}: {done.stderr.strip().splitlines()[-1:]}")
    return wall_s, hashlib.md5(out.read_bytes()).hexdigest()[:8]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", type=Path, required=True, help="another checkout's root, timed in turn")
    parser.add_argument("--pairs", type=int, default=3)
    options = parser.parse_args(argv)
    started = run_started(argv)
    numbers: dict[str, object] = {}
    rows = []
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        profiles = {"syn2000": folder / "syn2000.profile.json", "llama-3-70b": folder / "l70.json"}
        save_profile(synthetic_profile(2000), profiles["syn2000"])
        config = ROOT / "examples" / "llama-3-70b.json"
        modelled = ["profile", f"hf:{config}", "--device-model", "h100-80gb", "--micro-batch-sizes", "1,2"]
        subprocess.run(
            [sys.executable, "-m", "cli", *modelled, "--out", str(profiles["llama-3-70b"])],
            check=True,
            cwd=ROOT,
            capture_output=True,
        )
        for case, args in CASES.items():
            for jobs, extra in (("defaults", []), ("1 process", ["--jobs", "1"])):
                walls: dict[str, list[float]] = {"this": [], "against": []}
                md5s: dict[str, set[str]] = {"this": set(), "against": set()}
                for _ in range(options.pairs):
                    for side, root in (("against", options.against.resolve()), ("this", ROOT)):
                        wall_s, md5 = _plan(root, profiles[case], [*args, *extra], folder / f"{side}.plan.json")
                        walls[side].append(round(wall_s, 2))
                        md5s[side].add(md5)
                ratio = statistics.median(a / b for a, b in zip(walls["this"], walls["against"], strict=True))
                same = md5s["this"] == md5s["against"] and len(md5s["this"]) == 1
                key = f"{case}, {jobs}"
                numbers[key] = {
                    "wall_s": walls["this"],
                    "wall_s_against": walls["against"],
                    "ratio_median": round(ratio, 3),
                    "plan_md5": sorted(md5s["this"]),
                    "same_plan": same,
                }
                rows.append(
                    [key, _span(walls["this"]), _span(walls["against"]), f"{ratio:.2f}", "yes" if same else "NO"]
                )
                print(
                    f"{key}: {_span(walls['this'])} against {_span(walls['against'])}, ratio {ratio:.2f}, "
                    f"same plan: {same}",
                    flush=True,
                )
    table = {"columns": ["plan", "this", "against", "ratio (median of pairs)", "same plan"], "rows": rows}
    write_record("cluster_cli", {"against": str(options.against), **numbers}, started=started, tables={"pairs": table})
    return 0


def _span(values: list[float]) -> str:
    return f"{min(values):.1f}-{max(values):.1f} s"


if __name__ == "__main__":
    raise SystemExit(main())
