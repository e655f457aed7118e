"""verify under SIGTERM / SIGHUP (a real subprocess and os.kill): ranks and their process groups stop, no
orphans; and --timeout holds in replay mode."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from conftest import make_plan

from planner.errors import ExecutionError
from planner.plan import save_plan
from planner.runtime.launch import FAULT_ENV
from planner.runtime.run_options import VerifyOptions
from planner.runtime.verify import verify_plan
from profiles.models import BUILTIN_MODELS

ROOT = Path(__file__).resolve().parents[3]


def _descendants(pid: int) -> set[int]:
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _two_ranks_hung(proc: subprocess.Popen[str] | subprocess.Popen[bytes]) -> set[int]:
    """The two ranks ``proc`` started (each leading its own process group), once they hang in the fault hook."""
    deadline = time.monotonic() + 120
    ranks: set[int] = set()
    while time.monotonic() < deadline and len(ranks) < 2:
        time.sleep(0.5)
        ranks = {p for p in _descendants(proc.pid) if os.getpgid(p) == p} if proc.poll() is None else set()
    assert len(ranks) == 2, "the two ranks (each leading its own process group) did not start"
    time.sleep(2)  # past the process group's start: the ranks are in the fault hook now
    return ranks


@pytest.fixture(scope="module")
def mlp_plan(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("signals") / "mlp.plan.json"
    save_plan(make_plan(BUILTIN_MODELS["mlp"](), ["layers.2"], "gpipe"), path)
    return path


def test_sigterm_stops_every_rank_and_its_group(mlp_plan: Path) -> None:
    sig = signal.SIGTERM
    env = {**os.environ, FAULT_ENV: "0:hang", "PYTHONPATH": str(ROOT)}
    argv = [sys.executable, "-c", "import sys; from cli import main; sys.exit(main())"]
    argv += ["verify", str(mlp_plan), "--model", "mlp", "--mode", "processes", "--timeout", "300"]
    proc = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _two_ranks_hung(proc)
        seen = _descendants(proc.pid)
        os.kill(proc.pid, sig)
        _, err = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 128 + sig, err
    assert err.strip().splitlines()[-1] == f"pipeplan verify: stopped by {sig.name}", err
    time.sleep(1)
    assert [p for p in seen if _alive(p)] == []


def test_replay_honours_the_timeout() -> None:
    workload = BUILTIN_MODELS["mlp"]()
    plan = make_plan(workload, ["layers.2"], "gpipe")

    def hung_loss(output, target):  # noqa: ANN001 - user code that hangs, after the model was split
        time.sleep(60)

    hung = dataclasses.replace(workload, loss_fn=hung_loss)
    started = time.monotonic()
    with pytest.raises(ExecutionError, match=r"the replay did not finish within 5 s \(--timeout\)"):
        verify_plan(plan, hung, VerifyOptions(mode="replay", steps=1, warmup=0, timeout_s=5))
    assert time.monotonic() - started < 30


def test_sighup_is_handled_like_sigterm() -> None:
    # The subprocess test above covers the path from the signal to stopped ranks; SIGHUP takes the same one.
    from planner.commands.terminal import Signalled, signals_interrupt

    # Whatever was in place before (SIG_DFL, or SIG_IGN under nohup) is what verify leaves behind.
    before = {sig: signal.getsignal(sig) for sig in (signal.SIGHUP, signal.SIGTERM)}
    with pytest.raises(Signalled) as caught, signals_interrupt():
        os.kill(os.getpid(), signal.SIGHUP)
        time.sleep(5)
    assert caught.value.signum == signal.SIGHUP and str(caught.value) == "SIGHUP"
    assert {sig: signal.getsignal(sig) for sig in before} == before  # restored after verify


def test_ranks_stop_when_a_library_caller_is_killed(mlp_plan: Path) -> None:
    """A script calling verify_plan has no handler of pipeplan's: SIGKILL leaves it no ``finally``, and its ranks,
    hung here as a rank in a collective would be, must still go (the fork server they came from outlives it)."""
    env = {**os.environ, FAULT_ENV: "0:hang", "PYTHONPATH": str(ROOT)}
    script = (
        "import sys; from planner.plan import load_plan; from planner.runtime.verify import verify_plan; "
        "from planner.runtime.run_options import VerifyOptions; "
        "verify_plan(load_plan(sys.argv[1]), 'mlp', VerifyOptions(mode='processes', timeout_s=300))"
    )
    proc = subprocess.Popen([sys.executable, "-c", script, str(mlp_plan)], cwd=ROOT, env=env)
    seen: set[int] = set()
    try:
        ranks = _two_ranks_hung(proc)
        seen = ranks | {p for r in ranks for p in _descendants(r)}
        proc.kill()
        proc.wait(timeout=30)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and any(_alive(p) for p in seen):
            time.sleep(0.25)
        assert [p for p in seen if _alive(p)] == []
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in seen:  # nothing left behind by the test, whatever it found
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
