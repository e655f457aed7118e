"""pipeplan's own speed: how long its commands take as a user runs them, each a fresh ``pipeplan`` process.

Timed, wall clock, in a scratch folder:

- start-up: ``pipeplan --version``, the median of 5;
- the README's five-minute block on gpt2-tiny: ``profile``, ``plan``, ``simulate --compare``, ``verify``;
- ``pipeplan calibrate`` (the machine's links, per-action overheads, optimizer, co-location);
- the cluster search: a synthetic 2,000-unit profile (bench_planner_scale's, seed 0) planned for 4,096 devices,
  8 a node, with the CLI's defaults;
- the README's cluster one does not have: Llama 3 70B (examples/llama-3-70b.json) profiled by the H100's device
  model, planned for 64 H100s with tensor parallelism searched, for Megatron (``--for megatron``) and exported to
  it, and planned with the defaults;
- with ``--main-job``: the README's main job after its install (gpt2-small's profile, plan, simulate, verify),
  and ``pipeplan plan`` of that profile alone; with the profile's unit sum against the whole model at each
  micro-batch size and verify's error at the machine's speed and as timed, as they printed them;
- with ``--suite``, alone: the test suite, ``python -m pytest -q``, in a record of its own
  (``benchmarks/results/suite/<date>.json``: seconds, passed, failed, skipped); with ``--suite --fresh``,
  ``.ci/run``'s whole command (the README's) in a new virtual environment on a clean clone of the commit, its
  install timed apart (``install_s``; ``total_s`` the two together);
- with ``--main-job --fresh``, alone: the README's main job as written, in a new virtual environment on a clean
  clone of the commit, each command of it timed, in the ``main_job`` record (``install_s``, ``profile_s``,
  ``plan_s``, ``simulate_s``, ``verify_s``, ``wall_s`` all of them, and the accuracy they printed).

Every step's command, exit code and seconds go to the record (``benchmarks/results/own_speed/<date>.json``);
the README's stated times are this record's. Each of the three records also holds its times beside the
benchmark's previous record (table ``against``; ``previous_record``, and ``slower_than_previous``: the steps 20 %
or more slower, printed as well; benchmarks/speed_history.py), which the page shows. Run it with nothing else on
the machine::

    python benchmarks/bench_own_speed.py [--main-job] [--quick]
    python benchmarks/bench_own_speed.py --main-job --fresh
    python benchmarks/bench_own_speed.py --suite [--fresh]
"""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench_planner_scale import synthetic_profile  # noqa: E402
from common import ROOT, RunStart, run_started, tables_in, tee_stdout, write_record  # noqa: E402
from speed_history import against_previous, previous_record  # noqa: E402

from profiles.format import save_profile  # noqa: E402


@dataclass(frozen=True)
class Step:
    name: str
    command: str
    exit_code: int
    wall_s: float
    output: str = ""
    """What the command printed (stdout)."""


UNIT_SUM = re.compile(r"^b=(\d+): unit sum [^:]*: ([+-]?[0-9.]+)%", re.MULTILINE)
STAGE_ERROR = re.compile(r"^\s+\d+\s+\d+\s.*\s([+-][0-9.]+)%$", re.MULTILINE)
"""A row of verify's per-stage tables: its last column, the stage's memory error."""
VERDICT = re.compile(r"^verdict: the error at the machine's speed, ([+-]?[0-9.]+)%.*?\(as timed ([+-]?[0-9.]+)%", re.M)


def _printed_accuracy(profile: str | None, verify: str | None) -> dict[str, object]:
    """What the main job's profile and verify printed of their accuracy: the unit sum against the whole model per
    micro-batch size, and verify's error at the machine's speed and as timed (empty where a step did not run)."""
    found: dict[str, object] = {}
    if profile is not None:
        found["unit_sum_error_pct"] = {int(b): float(e) for b, e in UNIT_SUM.findall(profile)}
    if verify is not None and (verdict := VERDICT.search(verify)):
        found["verify_error_at_speed_pct"] = float(verdict.group(1))
        found["verify_error_as_timed_pct"] = float(verdict.group(2))
    return found


def _accuracy(steps: list[Step]) -> dict[str, object]:
    """:func:`_printed_accuracy` of the main job's steps."""
    output = {step.name: step.output for step in steps}
    return _printed_accuracy(output.get("profile gpt2-small"), output.get("verify gpt2-small"))


def _own_speed_times(numbers: dict) -> dict[str, float]:
    return {"start-up": numbers["start_up_s"], **{s["name"]: s["wall_s"] for s in numbers.get("steps", [])}}


def _main_job_times(numbers: dict) -> dict[str, float]:
    named = {"all": "wall_s", **{k: f"{k}_s" for k in ("install", "profile", "plan", "simulate", "verify")}}
    return {step: numbers[key] for step, key in named.items() if key in numbers}


def _suite_times(numbers: dict) -> dict[str, float]:
    return {step: numbers[f"{step}_s"] for step in ("install", "pytest", "total") if f"{step}_s" in numbers}


TIMES = {"own_speed": _own_speed_times, "main_job": _main_job_times, "suite": _suite_times}
"""Per record written here, its times by step (from its numbers), to hold beside the previous record's."""


def beside_previous(benchmark: str, numbers: dict, date: str) -> tuple[dict, dict[str, dict[str, list]]]:
    """``numbers`` with the previous record's name and the steps 20 % slower than there, and the table of every
    time beside it (:mod:`speed_history`); unchanged, and no table, where the benchmark has no earlier record."""
    previous = previous_record(benchmark, date)
    if previous is None:
        return numbers, {}
    name, record = previous
    times = TIMES[benchmark]
    table, slower = against_previous(times(numbers), times(record["numbers"]), name)
    return {**numbers, "previous_record": name, "slower_than_previous": slower}, {"against": table}


def _with_previous(benchmark: str, numbers: dict, started: RunStart) -> tuple[dict, dict[str, dict[str, list]]]:
    numbers, table = beside_previous(benchmark, numbers, started.started_utc[:10])
    for step in numbers.get("slower_than_previous", []):
        print(f"{benchmark}: {step} is 20 % or more slower than in {numbers['previous_record']}")
    return numbers, table


def _pipeplan() -> str:
    found = shutil.which("pipeplan")
    if found is None:
        raise SystemExit("pipeplan is not installed: pip install -e . first")
    return found


def _timed(name: str, argv: list[str], folder: Path, steps: list[Step]) -> None:
    """Run ``argv`` in ``folder`` (its output kept, its errors shown if it fails) and append its step."""
    started = time.perf_counter()
    done = subprocess.run(argv, cwd=folder, capture_output=True)
    wall_s = time.perf_counter() - started
    output = done.stdout.decode(errors="replace")
    step = Step(name, shlex.join([Path(argv[0]).name, *argv[1:]]), done.returncode, wall_s, output)
    if done.returncode != 0:
        sys.stderr.write(done.stderr.decode(errors="replace")[-2000:])
    steps.append(step)
    print(f"| {name} | `{step.command}` | {step.exit_code} | {step.wall_s:.2f} s |", flush=True)


def _start_up_s(pipeplan: str, folder: Path, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        subprocess.run([pipeplan, "--version"], cwd=folder, check=True, stdout=subprocess.DEVNULL)
        times.append(time.perf_counter() - started)
    return statistics.median(times)


def _ci_command() -> tuple[str, str]:
    """``.ci/run``'s command (the README's test command), as its install and what follows it."""
    line = next(ln for ln in (ROOT / ".ci" / "run").read_text().splitlines() if ln.startswith("pip install"))
    install, sep, tests = line.partition(" && ruff ")
    if not sep:
        raise SystemExit(f".ci/run: no ' && ruff ' after the install in {line!r}")
    return install, "ruff " + tests


def _fresh_environment(scratch: Path) -> tuple[Path, dict[str, str]]:
    """A clean clone of this checkout's commit and the environment of a new virtual environment beside it."""
    folder, venv = scratch / "pipeplan", scratch / "venv"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(folder)], check=True)
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    env = {**os.environ, "VIRTUAL_ENV": str(venv), "PATH": f"{venv / 'bin'}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop("PYTHONHOME", None)
    return folder, env


def _readme_main_job() -> list[str]:
    """The README's main job, its commands in order (the install's two first)."""
    lines = (ROOT / "README.md").read_text().splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("**The main job**"))
    line = next(ln for ln in lines[start:] if ln.startswith("pip install"))
    return line.split(" && ")


def _main_job_fresh() -> None:
    """The README's main job as written, each command timed, in a new virtual environment on a clean clone: the
    ``main_job`` record."""
    started = run_started()
    commands = _readme_main_job()
    install, rest = " && ".join(commands[:2]), commands[2:]
    rows, numbers, outputs = [], {}, {}
    with tempfile.TemporaryDirectory(prefix="pipeplan-main-job-") as scratch:
        folder, env = _fresh_environment(Path(scratch))
        exit_code, total_s = 0, 0.0
        for name, command in [("install", install), *((c.split()[1], c) for c in rest)]:
            begun = time.perf_counter()
            done = subprocess.run(command, shell=True, cwd=folder, env=env, capture_output=True, text=True)
            seconds = time.perf_counter() - begun
            total_s += seconds
            numbers[f"{name}_s"] = round(seconds, 1)
            outputs[name] = done.stdout
            shown = f"install (`{install}`)" if name == "install" else f"`{command}`"
            rows.append([shown, f"{seconds:.0f} s"])
            print(f"{name}: {seconds:.0f} s, exit {done.returncode}", flush=True)
            if done.returncode != 0:
                sys.stderr.write(done.stderr[-2000:])
                exit_code = done.returncode
                break
    rows.append([f"all (exit {exit_code})", f"{total_s:.0f} s"])
    printed = {name: output.splitlines() for name, output in outputs.items()}
    errors = [abs(float(e)) for e in STAGE_ERROR.findall(outputs.get("verify", ""))]
    numbers = {
        "exit_code": exit_code,
        "wall_s": round(total_s, 1),
        **numbers,
        **_printed_accuracy(outputs.get("profile"), outputs.get("verify")),
        **({"stage_memory_within_pct": max(errors)} if errors else {}),
    }
    print(f"main job: exit {exit_code} in {total_s:.0f} s")
    numbers, against = _with_previous("main_job", numbers, started)
    write_record(
        "main_job",
        numbers,
        started=started,
        text={
            "main_job": " && ".join(commands),
            # The lines the numbers were read from: the unit sum check, verify's verdict.
            "profile_check": "\n".join(ln for ln in printed.get("profile", []) if " unit sum " in ln),
            "verify_verdict": "\n".join(ln for ln in printed.get("verify", []) if ln.startswith("verdict")),
            # What the README shows of the job: the plan as printed.
            "plan_output": "\n".join(printed.get("plan", [])),
        },
        tables={"steps": {"columns": ["step", "wall"], "rows": rows}, **against},
    )


def _suite(fresh: bool) -> None:
    """The test suite as CI runs it, timed, with its counts, in the ``suite`` record: after the install in this
    environment, or with ``fresh`` the whole of ``.ci/run``'s command, install included, in a new virtual
    environment on a clean clone of this checkout's commit."""
    started = run_started()
    with tempfile.TemporaryDirectory(prefix="pipeplan-suite-") as scratch:
        env = dict(os.environ)
        folder, install_s = ROOT, None
        if fresh:
            install, tests = _ci_command()
            folder, env = _fresh_environment(Path(scratch))
            begun = time.perf_counter()
            subprocess.run(install, shell=True, cwd=folder, env=env, check=True, capture_output=True)
            install_s = time.perf_counter() - begun
            command = tests
        else:
            env["PYTHONDONTWRITEBYTECODE"] = "1"  # leaves no bytecode in the checkout
            command = "python -m pytest -q -p no:cacheprovider"
        begun = time.perf_counter()
        done = subprocess.run(command, shell=True, cwd=folder, env=env, capture_output=True, text=True)
        seconds = time.perf_counter() - begun
    sys.stdout.write(done.stdout[-3000:])
    summary = done.stdout.strip().splitlines()[-1] if done.stdout.strip() else ""
    counts = {kind: int(n) for n, kind in re.findall(r"(\d+) (passed|failed|skipped|errors?)", summary)}
    numbers = {
        "pytest_s": round(seconds, 1),
        "exit_code": done.returncode,
        "passed": counts.get("passed", 0),
        "failed": counts.get("failed", 0),
        "skipped": counts.get("skipped", 0),
        "errors": counts.get("errors", counts.get("error", 0)),
    }
    if install_s is not None:
        numbers = {"install_s": round(install_s, 1), **numbers, "total_s": round(install_s + seconds, 1)}
    print(f"suite: {summary} ({seconds:.0f} s" + (f", after an install of {install_s:.0f} s)" if fresh else ")"))
    numbers, against = _with_previous("suite", numbers, started)
    write_record("suite", numbers, started=started, tables=against)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--main-job", action="store_true", help="also the README's main job on gpt2-small")
    parser.add_argument("--suite", action="store_true", help="the test suite alone (python -m pytest -q)")
    parser.add_argument(
        "--fresh",
        action="store_true",
        help="with --suite: .ci/run's whole command, with --main-job: the README's main job, install included, in "
        "a new virtual environment on a clean clone",
    )
    parser.add_argument("--quick", action="store_true", help="a trial: start-up and the cluster search only")
    args = parser.parse_args()
    if args.suite:
        _suite(args.fresh)
        return
    if args.main_job and args.fresh:
        _main_job_fresh()
        return
    started, printed = run_started(), tee_stdout()
    pipeplan = _pipeplan()
    steps: list[Step] = []
    with tempfile.TemporaryDirectory(prefix="pipeplan-speed-") as scratch:
        folder = Path(scratch)
        start_up_s = _start_up_s(pipeplan, folder, 5)
        print("| step | command | exit | wall |")
        print("|---|---|---|---|")
        print(f"| start-up | `pipeplan --version` (median of 5) | 0 | {start_up_s:.2f} s |", flush=True)
        if not args.quick:
            plan = ["plan", "tiny.profile.json", "--ranks", "2", "--global-batch", "8", "--out", "tiny.plan.json"]
            for name, argv in (
                ("profile gpt2-tiny", ["profile", "gpt2-tiny", "--out", "tiny.profile.json", "--no-progress"]),
                ("plan gpt2-tiny", plan),
                ("simulate --compare", ["simulate", "tiny.plan.json", "--compare", "gpipe,1f1b,zero-bubble"]),
                ("verify gpt2-tiny", ["verify", "tiny.plan.json", "--model", "gpt2-tiny"]),
                ("calibrate", ["calibrate", "--out", "machine.calibration.json"]),
            ):
                _timed(name, [pipeplan, *argv], folder, steps)
        save_profile(synthetic_profile(2000), folder / "syn2000.profile.json")
        cluster = ["plan", "syn2000.profile.json", "--devices", "4096", "--devices-per-node", "8"]
        _timed("cluster search", [pipeplan, *cluster, "--global-batch", "4096", "--out", "c.json"], folder, steps)
        # The README's cluster one does not have: Llama 3 70B modelled for H100s, planned for Megatron and exported.
        config = str(ROOT / "examples" / "llama-3-70b.json")
        modelled = ["profile", f"hf:{config}", "--device-model", "h100-80gb", "--micro-batch-sizes", "1,2"]
        _timed("device-model profile Llama 3 70B", [pipeplan, *modelled, "--out", "l70.json"], folder, steps)
        l70 = ["plan", "l70.json", "--devices", "64", "--global-batch", "128", "--tensor-parallel", "auto"]
        for_megatron = [pipeplan, *l70, "--for", "megatron", "--out", "l70.m.json"]
        _timed("plan Llama 3 70B --for megatron", for_megatron, folder, steps)
        export = [pipeplan, "export", "l70.m.json", "--to", "megatron", "--out", "l70.txt"]
        _timed("export --to megatron", export, folder, steps)
        _timed("plan Llama 3 70B", [pipeplan, *l70, "--out", "l70.plan.json"], folder, steps)
        if args.main_job:
            _timed("profile gpt2-small", [pipeplan, "profile", "gpt2-small", "--out", "s.profile.json"], folder, steps)
            plan = ["plan", "s.profile.json", "--ranks", "4", "--global-batch", "16", "--out", "s.plan.json"]
            _timed("plan gpt2-small", [pipeplan, *plan], folder, steps)
            _timed("simulate gpt2-small", [pipeplan, "simulate", "s.plan.json", "--out", "s.png"], folder, steps)
            verify = ["verify", "s.plan.json", "--model", "gpt2-small", "--steps", "3"]
            _timed("verify gpt2-small", [pipeplan, *verify], folder, steps)
    numbers = {
        "start_up_s": start_up_s,
        "steps": [{"name": s.name, "command": s.command, "exit_code": s.exit_code, "wall_s": s.wall_s} for s in steps],
        "all_exited_0": all(s.exit_code == 0 for s in steps),
        "cluster_search_s": next((round(s.wall_s, 1) for s in steps if s.name == "cluster search"), None),
        **_accuracy(steps),
    }
    numbers, against = _with_previous("own_speed", numbers, started)
    tables = {**tables_in(printed.getvalue(), ("step",)), **against}
    # What a step that ran a verdict printed of it, so that an exit 1 says by how much.
    verdicts = {
        s.name: "\n".join(ln for ln in s.output.splitlines() if ln.startswith(("iteration:", "verdict", "result:")))
        for s in steps
        if s.name.startswith("verify")
    }
    write_record("own_speed", numbers, started=started, tables=tables, text=verdicts or None, trial=args.quick)


if __name__ == "__main__":
    main()
