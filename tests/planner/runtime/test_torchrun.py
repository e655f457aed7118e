"""``pipeplan verify`` as a rank of a torchrun job: the job read from the environment and checked against the plan
on every rank alone; two torchrun "nodes" on this machine (gloo) running gpt2-tiny's pp 2 x dp 2 and pp 2 x tp 2
plans with one report from rank 0; a job of the wrong size and a killed rank ending every rank with one line."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

import pytest

from cli import main
from planner.errors import TensorParallelError, UsageError
from planner.plan import Plan, load_plan
from planner.runtime.job_report import JobReport, format_job
from planner.runtime.job_watch import Beat, JobWatch
from planner.runtime.launch import FAULT_ENV, free_port
from planner.runtime.run_options import VerifyOptions
from planner.runtime.run_record import load_run_record
from planner.runtime.torchrun import TorchrunJob, check_job, torchrun_job

MODEL = "gpt2-tiny"
TRAIN = Path(__file__).parents[3] / "examples" / "train.py"


def _env(rank: int = 1, world: int = 4, local_world: int = 2, **more: str) -> dict[str, str]:
    env = {
        "TORCHELASTIC_RUN_ID": "job",
        "RANK": str(rank),
        "WORLD_SIZE": str(world),
        "LOCAL_RANK": str(rank % local_world),
        "LOCAL_WORLD_SIZE": str(local_world),
        "GROUP_RANK": str(rank // local_world),
        "GROUP_WORLD_SIZE": str(world // local_world),
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": "29500",
    }
    return {**env, **more}


def _job(rank: int = 0, world: int = 4, local_world: int = 2) -> TorchrunJob:
    job = torchrun_job(_env(rank, world, local_world))
    assert job is not None
    return job


# -- plans: gpt2-tiny profiled small, planned for 4 devices ---------------------------------------------------------


@pytest.fixture(scope="module")
def plans(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("torchrun")
    profile = folder / "gpt2-tiny.profile.json"
    # One round, timed as each of 4 ranks on this machine computes (one thread each), as the jobs below run: the
    # tests hold what the report holds, not how close the prediction comes.
    args = ["--no-pipeline-run", "--repeats", "1", "--max-repeats", "1", "--warmup", "0", "--min-time", "0"]
    args += ["--micro-batch-sizes", "2", "--ranks", "4", "--no-progress"]
    assert main(["profile", MODEL, *args, "--out", str(profile)]) == 0
    out = {"profile": profile}
    cluster = ["--devices", "4", "--ranks", "2"]
    for name, extra in (
        ("pp2", ["--ranks", "2"]),
        ("pp2xdp2", cluster),
        ("pp2xtp2", [*cluster, "--tensor-parallel", "2"]),
    ):
        out[name] = folder / f"{name}.plan.json"
        assert main(["plan", str(profile), "--global-batch", "8", *extra, "--out", str(out[name])]) == 0
    return out


# -- the job, from the environment alone -----------------------------------------------------------------------------


def test_a_job_is_read_from_torchruns_environment() -> None:
    assert torchrun_job({"RANK": "0", "WORLD_SIZE": "2"}) is None  # not torchrun: verify starts its own processes
    job = _job(rank=3)
    assert (job.rank, job.world_size, job.local_rank, job.local_world_size, job.group_rank) == (3, 4, 1, 2, 1)
    env = _env()
    del env["LOCAL_RANK"]
    with pytest.raises(UsageError, match="LOCAL_RANK is not set"):
        torchrun_job(env)
    with pytest.raises(UsageError, match="WORLD_SIZE is 'four'"):
        torchrun_job(_env(WORLD_SIZE="four"))


def test_a_job_of_another_size_is_refused_alike_on_every_rank(plans: dict[str, Path]) -> None:
    plan = load_plan(plans["pp2xdp2"])
    assert plan.mesh is not None and (plan.mesh.pp, plan.mesh.dp, plan.mesh.tp) == (2, 2, 1)
    lines = set()
    for rank in range(3):
        with pytest.raises(UsageError) as caught:
            check_job(plan, _job(rank, world=3, local_world=3), VerifyOptions())
        lines.add(str(caught.value))
    assert lines == {
        "the plan runs on pp 2 x dp 2 x tp 1 = 4 processes, but this torchrun job has 3 (WORLD_SIZE): start "
        "torchrun with 4 processes in all (--nnodes x --nproc-per-node)"
    }
    with pytest.raises(UsageError, match="--mode replay runs one process"):
        check_job(plan, _job(), VerifyOptions(mode="replay"))


def test_a_tensor_parallel_group_may_not_span_the_jobs_nodes(plans: dict[str, Path]) -> None:
    plan = load_plan(plans["pp2xtp2"])
    assert plan.mesh is not None and (plan.mesh.pp, plan.mesh.tp) == (2, 2)
    check_job(plan, _job(local_world=2), VerifyOptions())  # ranks 0-1 and 2-3: each group inside a node
    with pytest.raises(TensorParallelError, match="ranks 0-1 would span nodes 0, 1 of this job"):
        check_job(plan, _job(local_world=1), VerifyOptions())
    uneven = replace(_job(local_world=2), group_world_size=3)
    with pytest.raises(TensorParallelError, match="not the same number each"):
        check_job(plan, uneven, VerifyOptions())


def test_a_lagging_rank_is_named_as_stalled() -> None:
    watch = JobWatch(
        rank=0, world_size=3, local_rank=0, host="h", store_address=("127.0.0.1", 1), prefix="p/", timeout_s=60
    )
    now = time.monotonic()
    watch._beats = {r: Beat(5, barriers, r, f"host{r}", False, True) for r, barriers in ((0, 7), (1, 7), (2, 4))}
    watch._changed = dict.fromkeys(range(3), now)
    assert watch.culprit() is None
    assert watch.stalled() == (
        "rank 2 stalled (node host2, local rank 2): alive, but it has not reached the barrier the others wait in "
        "(barrier 5)"
    )
    watch._beats[1] = replace(watch._beats[1], waiting=False)  # the others wait in a collective, rank 1 not
    assert watch.stalled() == (
        "rank 1 stalled (node host1, local rank 1): alive, but outside any collective while the others wait in one"
    )
    watch._changed[1] = now - 60
    assert watch.culprit() == "rank 1 stopped responding (node host1, local rank 1): no heartbeat for 10 s"
    assert Beat.parse(Beat(3, 2, 1, "a b", True, True).text()) == Beat(3, 2, 1, "a b", True, True)


# -- two torchrun nodes on this machine --------------------------------------------------------------------------


def _torchrun(nodes: int, per_node: int, argv: list[str], *, fault: str = "", timeout_s: float = 150) -> list:
    """Start ``nodes`` torchrun agents together (c10d rendezvous on localhost); each one's (exit code, stdout,
    stderr, seconds). The first agent holds the rendezvous store, as the endpoint's node does on a cluster (on one
    host every agent would claim it, and the job would end with whichever won); agents join in start order, so the
    last node holds the highest ranks."""
    port = free_port()
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    env.pop(FAULT_ENV, None)
    if fault:
        env[FAULT_ENV] = fault
    command = [sys.executable, "-m", "torch.distributed.run", "--nnodes", str(nodes), "--nproc-per-node"]
    rdzv = ["--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{port}", "--no-python", "pipeplan", "verify"]
    started = time.monotonic()
    procs = [
        subprocess.Popen(
            [*command, str(per_node), "--node-rank", str(n), "--rdzv-conf", f"is_host={int(n == 0)}", *rdzv, *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=env,
            start_new_session=True,  # the agent and its ranks in one group: stopped together if the test times out
        )
        for n in range(nodes)
    ]
    out = []
    for p in procs:
        try:
            stdout, stderr = p.communicate(timeout=max(1.0, timeout_s - (time.monotonic() - started)))
        except subprocess.TimeoutExpired:
            for q in procs:
                os.killpg(q.pid, signal.SIGKILL)
            raise
        out.append((p.returncode, stdout, stderr, time.monotonic() - started))
    return out


def _told(runs: list) -> str:
    """Each agent's exit code and the end of its stderr, for a failed assertion (pytest cuts a long repr short)."""
    return "\n".join(
        f"agent {n}: exit {code}\n" + "\n".join(err.splitlines()[-25:]) for n, (code, _, err, _) in enumerate(runs)
    )


def _errors(runs: list) -> list[str]:
    """The ranks' one-line errors (torchrun's own report of the failed ranks around them is not ours)."""
    return [line for _, _, err, _ in runs for line in err.splitlines() if line.startswith("pipeplan verify:")]


def _check_report(report: dict, plan: Plan) -> None:
    assert report["mode"] == "torchrun" and report["world_size"] == 4
    places = report["job"]["places"]
    assert [p["rank"] for p in places] == [0, 1, 2, 3]
    assert sorted((p["node_rank"], p["local_rank"]) for p in places) == [(0, 0), (0, 1), (1, 0), (1, 1)]
    assert len(report["job"]["nodes"]) == 2
    assert report["numerics"]["ok"], report["numerics"]
    replicas = report["job"]["replicas"]
    for stage in report["stages"]:
        assert stage["measured_forward_s"] > 0 and stage["measured_backward_s"] > 0
        assert stage["measured_memory_bytes"] > 0
    for replica in replicas:
        assert replica["slowest_rank"] in replica["ranks"]
        assert all(t > 0 for t in replica["forward_s"] + replica["backward_s"]) and all(replica["memory_bytes"])
        assert len(replica["forward_s"]) == plan.num_stages
    assert JobReport.from_dict(report["job"]) is not None
    assert any(link for node in report["job"]["nodes"] for link in node["links"])
    _check_documented(report["job"])


def _check_documented(job: dict) -> None:
    """docs/verify-format.md lists every field of the job's sections, and no other."""
    doc = (Path(__file__).parents[3] / "docs" / "verify-format.md").read_text().split("## Under `torchrun`")[1]
    sections = {
        m.group(1): m.group(2) for m in re.finditer(r"### `job\.([a-z]+)\[\]`[^\n]*\n(.*?)(?=\n### |\Z)", doc, re.S)
    }
    assert set(sections) == set(job)
    for name, table in sections.items():
        rows = [line.split(" | ")[0] for line in table.splitlines() if line.startswith("| `")]
        documented = {field for row in rows for field in re.findall(r"`([a-z_]+)(?:\[\])?`", row)}
        assert documented == set(job[name][0]), name
    link_row = next(line for line in sections["nodes"].splitlines() if line.startswith("| `links[]`"))
    assert set(re.findall(r"`([a-z_]+)`", link_row.split(" | ", 1)[1])) >= set(job["nodes"][0]["links"][0])


@pytest.mark.parametrize(("name", "dimension", "replicas"), [("pp2xdp2", "dp", 2), ("pp2xtp2", "tp", 1)])
def test_two_nodes_run_the_plan_with_one_report(plans: dict[str, Path], tmp_path: Path, name, dimension, replicas):
    out = tmp_path / "report.json"
    argv = [
        str(plans[name]),
        "--model",
        MODEL,
        "--steps",
        "2",
        "--check-numerics",
        "--timeout",
        "120",
        "--out",
        str(out),
    ]
    runs = _torchrun(2, 2, argv)
    assert [code for code, *_ in runs] == [0, 0] or [code for code, *_ in runs] == [1, 1], _told(runs)
    printed = [stdout for _, stdout, _, _ in runs if "verify:" in stdout]
    assert len(printed) == 1 and "job: 4 ranks on 2 nodes (torchrun)" in printed[0], _told(runs)
    assert f"wrote {out}" in printed[0] and _errors(runs) == []
    report = json.loads(out.read_text())
    _check_report(report, load_plan(plans[name]))
    assert len(report["job"]["replicas"]) == replicas
    assert {a["dimension"] for a in report["job"]["allreduce"]} == {dimension}


def test_a_job_of_three_for_a_plan_of_four_stops_every_rank(plans: dict[str, Path]) -> None:
    runs = _torchrun(1, 3, [str(plans["pp2xdp2"]), "--model", MODEL], timeout_s=60)
    assert runs[0][0] != 0 and runs[0][3] < 60
    # Every rank refuses with the same line, unless torchrun's agent stopped it first: it stops a node's ranks
    # as soon as one exits with an error (on a loaded machine some may not have reached the check yet).
    lines = _errors(runs)
    refused = [line for line in lines if line != "pipeplan verify: stopped by SIGTERM"]
    assert refused and len(set(refused)) == 1 and len(lines) <= 3, runs
    assert "this torchrun job has 3 (WORLD_SIZE)" in refused[0]


def test_a_killed_rank_stops_the_others_naming_it(plans: dict[str, Path]) -> None:
    argv = [str(plans["pp2xdp2"]), "--model", MODEL, "--steps", "2", "--timeout", "120"]
    # Killed as it enters its 4th barrier, in the warm-up's second step (each step opens and closes with one).
    runs = _torchrun(2, 2, argv, fault="3:kill@barrier4", timeout_s=90)
    assert all(code != 0 for code, *_ in runs) and max(seconds for *_, seconds in runs) < 60, runs
    # The first node's ranks name rank 3 (the first to exit may have its agent stop the other before it prints).
    # Rank 3's own agent stops its node's other rank (SIGTERM) and names the dead rank as torchrun's root cause.
    named = [ln for ln in _errors(runs) if re.search(r"rank 3 stopped responding \(node .+, local rank 1\)", ln)]
    stopped = [ln for ln in _errors(runs) if ln == "pipeplan verify: stopped by SIGTERM"]
    assert named and len(named) + len(stopped) == len(_errors(runs)) <= 3, runs
    assert any(re.search(r"rank\s*: 3 \(local_rank: 1\)", err.partition("Root Cause")[2]) for *_, err, _ in runs)


@pytest.mark.parametrize(("name", "processes"), [("pp2", 2), ("pp2xdp2", 4)])
def test_a_recorded_training_run_under_torchrun_teaches_the_plan(
    plans: dict[str, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str, processes: int
) -> None:
    """examples/train.py --record under torchrun writes the job's run record; calibrate --from-run refits from it,
    the plan predicted with the refit is within 10 % of the run (at the machine's speed), and plan takes it."""
    run = tmp_path / "run.json"
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(processes)]
    command += [str(TRAIN), "--plan", str(plans[name]), "--steps", "10", "--record", str(run)]
    env = {k: v for k, v in os.environ.items() if k != FAULT_ENV}
    done = subprocess.run(command, capture_output=True, text=True, timeout=240, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"wrote {run}" in done.stdout and "verify:" in done.stdout, done.stdout
    record = load_run_record(run)
    assert [r.rank for r in record.ranks] == list(range(processes))
    assert all(len(r.steps) == 10 for r in record.ranks)

    calibration = tmp_path / "cal.json"
    assert main(["calibrate", "--from-run", str(run), "--out", str(calibration)]) == 0
    text = capsys.readouterr().out
    refit = re.search(r"predicted with the refit calibration: [^:]+: ([+-][0-9.]+)%", text)
    assert refit is not None and abs(float(refit.group(1))) < 10.0, text
    replanned = tmp_path / "plan.json"
    argv = ["plan", str(plans["profile"]), "--ranks", "2", "--global-batch", "8", "--calibration", str(calibration)]
    assert main([*argv, "--out", str(replanned)]) == 0
    assert load_plan(replanned).num_stages >= 1


def test_job_sections_read_back_from_json() -> None:
    job = JobReport((), (), (), ())
    assert JobReport.from_dict(asdict(job)) == job
    assert format_job(job, 4)[0] == "job: 4 ranks on 0 nodes (torchrun)"
