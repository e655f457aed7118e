"""``pipeplan verify`` as one rank of a ``torchrun`` job: the plan runs on the job's processes, over its nodes.

Started by torchrun (``TORCHELASTIC_RUN_ID``, ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``,
``GROUP_RANK``, ``MASTER_ADDR``, ``MASTER_PORT`` in the environment), verify starts no processes of its own:

1. every rank checks the job against the plan from the environment alone (:func:`check_job`: the world size is
   the plan's mesh, ``pp x dp x tp``, and no tensor-parallel group the plan keeps inside a node spans two of the
   job's), before the process group opens, so that every rank refuses with the same line and waits on no one;
2. the rank opens the process group (``env://``, ``--timeout``), starts its heartbeat (planner/runtime/
   job_watch.py) and runs what a rank of the processes mode runs (:func:`planner.runtime.rank_timing.rank_main`;
   the global rank is its place in the plan's mesh, as there), then times its pipeline hops and the gradient
   all-reduce of each mesh dimension (planner/runtime/job_probes.py);
3. rank 0 gathers every rank's results with its host name and local rank, builds the report as the processes mode
   does (:func:`planner.runtime.verify.judge_ranks`, :func:`~planner.runtime.verify.build_report`) with the
   job's sections (planner/runtime/job_report.py), and hands it to every rank; the command line prints and writes
   it on rank 0 only.

A rank that fails names itself in the store; one that dies or stalls is named by the others' watchers
(planner/runtime/job_watch.py). Either way every rank stops with one line, exit code 2.
"""

from __future__ import annotations

import os
import socket
import statistics
import traceback
import warnings
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from planner.errors import ExecutionError, PipeplanWarning, TensorParallelError, UsageError
from planner.plan import Plan
from planner.runtime.job_report import AllReduceTime, JobReport, LinkTime, NodeReport, RankPlace, ReplicaTime
from planner.runtime.job_watch import JobWatch, is_peer_reaction
from planner.runtime.progress import ProgressBar, report_to
from planner.runtime.run_options import VerifyOptions
from planner.runtime.verify_report import VerifyReport

__all__ = ["TorchrunJob", "RankRecord", "torchrun_job", "check_job", "run_in_job", "job_sections", "is_reporting_rank"]

_REQUIRED = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


@dataclass(frozen=True)
class TorchrunJob:
    """What torchrun told this process about the job, from its environment."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    """Processes on this node (``--nproc-per-node``)."""
    group_rank: int
    """This node's rank among the nodes (``--node-rank``, or as the rendezvous ordered them)."""
    group_world_size: int
    """Nodes in the job (``--nnodes``)."""
    master_addr: str
    master_port: int
    run_id: str
    restart_count: int


def _int(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    text = env.get(name)
    if text is None and default is not None:
        return default
    try:
        return int(text or "")
    except ValueError:
        raise UsageError(f"started by torchrun, but {name} is {text!r}, not a whole number") from None


def torchrun_job(environ: Mapping[str, str] | None = None) -> TorchrunJob | None:
    """The job this process was started in by torchrun (``TORCHELASTIC_RUN_ID`` set), or None.

    Raises:
        UsageError: torchrun's run id is set but one of its variables is missing or not a number.
    """
    env = os.environ if environ is None else environ
    if "TORCHELASTIC_RUN_ID" not in env:
        return None
    missing = [name for name in _REQUIRED if name not in env]
    if missing:
        raise UsageError(f"started by torchrun (TORCHELASTIC_RUN_ID is set), but {', '.join(missing)} is not set")
    world_size, local_world_size = _int(env, "WORLD_SIZE"), _int(env, "LOCAL_WORLD_SIZE")
    return TorchrunJob(
        rank=_int(env, "RANK"),
        world_size=world_size,
        local_rank=_int(env, "LOCAL_RANK"),
        local_world_size=local_world_size,
        group_rank=_int(env, "GROUP_RANK", 0),
        group_world_size=_int(env, "GROUP_WORLD_SIZE", max(1, world_size // max(1, local_world_size))),
        master_addr=env["MASTER_ADDR"],
        master_port=_int(env, "MASTER_PORT"),
        run_id=env["TORCHELASTIC_RUN_ID"],
        restart_count=_int(env, "TORCHELASTIC_RESTART_COUNT", 0),
    )


def is_reporting_rank(job: TorchrunJob | None = None) -> bool:
    """Whether this process prints and writes verify's report: outside torchrun, or as the job's rank 0."""
    job = job if job is not None else torchrun_job()
    return job is None or job.rank == 0


def _plan_processes(plan: Plan) -> tuple[int, str]:
    mesh = plan.mesh
    if mesh is None:
        return plan.num_ranks, f"{plan.num_ranks} pipeline ranks"
    return mesh.used_devices, f"pp {mesh.pp} x dp {mesh.dp} x tp {mesh.tp} = {mesh.used_devices} processes"


def check_job(plan: Plan, job: TorchrunJob, options: VerifyOptions) -> None:
    """Refuse a job the plan cannot run on, from what every rank knows alone (its environment): the same line on
    every rank, before any of them waits on another.

    Raises:
        UsageError: ``--mode replay``; a world size that is not the plan's; a tensor-parallel group the plan keeps
            inside a node that would span two of the job's nodes (or nodes of unequal sizes under tensor
            parallelism, where no rank can tell where its group ends).
    """
    if options.mode == "replay":
        raise UsageError("verify runs as a rank of this torchrun job: --mode replay runs one process; run it alone")
    needed, what = _plan_processes(plan)
    if job.world_size != needed:
        raise UsageError(
            f"the plan runs on {what}, but this torchrun job has {job.world_size} (WORLD_SIZE): start torchrun "
            f"with {needed} processes in all (--nnodes x --nproc-per-node)"
        )
    mesh = plan.mesh
    if mesh is None or mesh.tp == 1:
        return
    per_node = job.local_world_size
    if per_node * job.group_world_size != job.world_size:
        raise TensorParallelError(
            f"the job's {job.group_world_size} nodes hold {job.world_size} processes, not the same number each: the "
            f"plan's tensor-parallel groups of {mesh.tp} need to know where a node ends; give every node the same "
            "--nproc-per-node"
        )
    for replica in range(mesh.dp):
        for p in range(mesh.pp):
            ranks = mesh.tp_group(replica, p)
            planned = {r // mesh.devices_per_node for r in ranks}
            nodes = sorted({r // per_node for r in ranks})
            if len(planned) == 1 and len(nodes) > 1:
                raise TensorParallelError(
                    f"the tensor-parallel group of ranks {ranks[0]}-{ranks[-1]} would span nodes "
                    f"{', '.join(map(str, nodes))} of this job ({per_node} processes per node); the plan keeps each "
                    f"group inside a node: give torchrun --nproc-per-node a multiple of {mesh.tp}"
                )


@dataclass(frozen=True)
class RankRecord:
    """What one rank sends rank 0: its measurements, where it ran, and its probes."""

    result: Any  # RankResult (planner/runtime/rank_timing.py)
    host: str
    node_rank: int
    local_rank: int
    links: tuple[tuple[int, int, int, float], ...]
    allreduce: tuple[tuple[str, tuple[int, ...], int, float], ...]


def _threads(plan: Plan, job: TorchrunJob, device: str) -> int:
    """The plan's threads per rank where this node has the cores for its ranks; else the cores shared out."""
    from profiles.cores import rank_threads

    threads, cores = plan.profile_threads, os.cpu_count() or 1
    if device != "cpu" or threads is None:
        return rank_threads(job.local_world_size)
    if threads * job.local_world_size <= cores:
        return threads
    if job.rank == 0:  # one warning for the job: every node is taken to be alike
        warnings.warn(
            f"the plan's stages were timed on {threads} threads per rank, but {job.local_world_size} ranks on a node "
            f"of {cores} cores get {rank_threads(job.local_world_size)} each: their times will not be the plan's "
            f"(profile with --ranks {job.local_world_size} for this layout)",
            PipeplanWarning,
            stacklevel=3,
        )
    return rank_threads(job.local_world_size)


def run_in_job(
    plan: Plan,
    spec: str,
    options: VerifyOptions,
    job: TorchrunJob,
    report: Callable[[Sequence[RankRecord]], VerifyReport],
) -> VerifyReport:
    """Run ``plan`` as this rank of ``job`` (checked already: :func:`check_job`) and return the job's report, which
    rank 0 makes with ``report`` from every rank's :class:`RankRecord` and hands to every rank (see the module's
    docstring).

    Raises:
        ExecutionError: a rank failed (``rank 3 failed (node h, local rank 1): RuntimeError: boom``), stopped
            responding or stalled; or the process group did not open within ``--timeout``.
    """
    from planner.runtime.launch import PIN_ENV, pin_rank_cpus, prepare_rank

    threads = _threads(plan, job, options.device)
    if os.environ.get(PIN_ENV) == "1":
        pin_rank_cpus(job.local_rank, job.local_world_size, threads)
    prepare_rank(threads)
    import torch.distributed as dist

    host = socket.gethostname()
    watch = JobWatch(
        rank=job.rank,
        world_size=job.world_size,
        local_rank=job.local_rank,
        host=host,
        store_address=(job.master_addr, job.master_port),
        prefix=f"pipeplan/{job.run_id}/{job.restart_count}/",
        timeout_s=options.timeout_s,
    )
    _open_group(job, options, watch)
    # The job's rank 0 shows its own progress, as a local launch's does (on a terminal only: torchrun's logs
    # redirected to files show none).
    bar = ProgressBar() if job.rank == 0 else None
    report_to(bar)
    try:
        with watch.counting_barriers():
            made = _guarded(watch, job, host, lambda: _run_rank(plan, spec, options, job, host, report))
    finally:
        report_to(None)
        if bar is not None:
            bar.close()
        watch.stop()
    dist.destroy_process_group()
    return made


def _open_group(job: TorchrunJob, options: VerifyOptions, watch: JobWatch) -> None:
    """The job's process group (env://), and this rank's heartbeat."""
    import torch.distributed as dist

    backend = "nccl" if options.device.startswith("cuda") else "gloo"
    if backend == "nccl":
        import torch

        torch.cuda.set_device(job.local_rank)  # NCCL's collectives use the current device: this rank's on its node
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        watch.start()  # torchrun's agent holds the store already: watch the others join too
    try:
        dist.init_process_group(backend, timeout=timedelta(seconds=options.timeout_s))
    except Exception as exc:
        line = watch.culprit() if watch.started else None
        watch.stop()
        raise ExecutionError(
            line
            or f"rank {job.rank} could not open the job's process group at {job.master_addr}:{job.master_port}: "
            f"{type(exc).__name__}: {exc}"
        ) from None
    if not watch.started:
        watch.start()


def _guarded(watch: JobWatch, job: TorchrunJob, host: str, work: Callable[[], VerifyReport]) -> VerifyReport:
    """``work()``, with a failure turned into the one line that names the rank where it began."""
    from planner.runtime.failure import where

    try:
        return work()
    except BaseException as exc:
        if is_peer_reaction(exc):
            line = watch.name_failure(exc)
            if line is None and isinstance(exc, KeyboardInterrupt):
                raise
            error = ExecutionError(line or f"rank {job.rank} failed: {type(exc).__name__}: {exc}")
        else:
            try:
                place = where(exc)
            except Exception:  # naming the place must never hide the error itself
                place = ""
            place = f" {place}" if place else ""
            who = f"rank {job.rank} failed (node {host}, local rank {job.local_rank})"
            line = f"{who}{place}: {type(exc).__name__}: {exc}"
            watch.record_failure(line)
            error = ExecutionError(line)
        error.remote_traceback = "".join(traceback.format_exception(exc))  # type: ignore[attr-defined]
        raise error from None


def _run_rank(
    plan: Plan,
    spec: str,
    options: VerifyOptions,
    job: TorchrunJob,
    host: str,
    report: Callable[[Sequence[RankRecord]], VerifyReport],
) -> VerifyReport:
    """This rank's run, its probes, and the report rank 0 builds from every rank's."""
    import torch
    import torch.distributed as dist

    from planner.runtime.job_probes import probe_allreduce, probe_links
    from planner.runtime.launch import inject_fault
    from planner.runtime.rank_timing import rank_main

    o = options
    inject_fault(job.rank)
    result = rank_main(
        job.rank,
        job.world_size,
        spec,
        plan,
        o.steps,
        o.warmup,
        o.min_warmup_s,
        o.min_time_s,
        o.check_numerics,
        o.device,
        local_rank=job.local_rank,
    )
    dev = torch.device(f"cuda:{job.local_rank}") if o.device.startswith("cuda") else torch.device("cpu")
    grad_bytes = result.rank_memory.grads_bytes if result.rank_memory is not None else 0
    links = probe_links(plan, job.rank, dev)
    allreduce = probe_allreduce(plan, job.rank, grad_bytes, dev)
    record = RankRecord(result, host, job.group_rank, job.local_rank, tuple(links), tuple(allreduce))
    gathered: list[Any] | None = [None] * job.world_size if job.rank == 0 else None
    dist.gather_object(record, gathered, dst=0)
    box: list[Any] = [None]
    if job.rank == 0:
        assert gathered is not None
        box[0] = report(gathered)
    dist.broadcast_object_list(box, src=0)
    return box[0]


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else 0.0


def _places(plan: Plan, records: Sequence[RankRecord]) -> tuple[RankPlace, ...]:
    places = []
    for rank, record in enumerate(records):
        replica, pp_rank, tp_rank = 0, rank, 0
        if plan.mesh is not None:
            (replica, pp_rank), tp_rank = plan.mesh.coordinates(rank), plan.mesh.tp_rank(rank)
        r = record.result
        places.append(
            RankPlace(
                rank,
                record.host,
                record.node_rank,
                record.local_rank,
                replica,
                pp_rank,
                tp_rank,
                _median(r.busy_s),
                _median(r.wait_s),
                _median(r.own_s),
            )
        )
    return tuple(places)


def job_sections(plan: Plan, records: Sequence[RankRecord]) -> JobReport:
    """Where each rank ran, each replica's slowest rank, each node's hops and each mesh dimension's all-reduce."""
    places = _places(plan, records)
    replicas = []
    for replica in sorted({p.replica for p in places}):
        mine = [p for p in places if p.replica == replica]
        slowest = max(mine, key=lambda p: p.own_s)
        fwd, bwd, memory = _replica_stages(plan, [records[p.rank].result for p in mine])
        ranks = tuple(p.rank for p in mine)
        replicas.append(ReplicaTime(replica, ranks, slowest.rank, slowest.own_s, slowest.compute_s, fwd, bwd, memory))
    mesh = plan.mesh
    links = []
    for record in records:
        for src, dst, size, seconds in record.links:
            predicted = mesh.hop_latency_s * 2 + size / mesh.hop_bytes_per_s if mesh is not None else None
            links.append(LinkTime(src, dst, records[src].node_rank, records[dst].node_rank, size, seconds, predicted))
    nodes = []
    for node in sorted({r.node_rank for r in records}):
        ranks = tuple(p.rank for p in places if p.node_rank == node)
        mine = tuple(link for link in links if link.src_node == node)
        nodes.append(NodeReport(node, records[ranks[0]].host, ranks, mine))
    return JobReport(places, tuple(replicas), tuple(nodes), _allreduce(plan, records))


def _replica_stages(
    plan: Plan, results: Sequence[Any]
) -> tuple[tuple[float, ...], tuple[float, ...], tuple[int | None, ...]]:
    """Per stage, one replica's median forward and backward and its memory peak: the slowest and the largest of the
    ranks that hold the stage (a tensor-parallel group)."""
    n = plan.num_stages
    fwd, bwd = [0.0] * n, [0.0] * n
    memory: list[int | None] = [None] * n
    for result in results:
        for k, stage in enumerate(result.stage_indices):
            records = result.stage_records[k]
            f = _median([d for kind, d in records if kind == "F"])
            # A split backward's input (B) and weight (W) gradients together are the backward.
            b = _median([d for kind, d in records if kind == "B"]) + _median([d for kind, d in records if kind == "W"])
            fwd[stage], bwd[stage] = max(fwd[stage], f), max(bwd[stage], b)
            if result.stage_memory:
                memory[stage] = max(memory[stage] or 0, result.stage_memory[k].total_bytes)
    return tuple(fwd), tuple(bwd), tuple(memory)


def _allreduce(plan: Plan, records: Sequence[RankRecord]) -> tuple[AllReduceTime, ...]:
    """Per group, the slowest member's time (an all-reduce ends for all when the last one is done)."""
    from planner.cost import DataParallel

    by_group: dict[tuple[str, tuple[int, ...]], tuple[int, float]] = {}
    for record in records:
        for dimension, ranks, size, seconds in record.allreduce:
            known = by_group.get((dimension, tuple(ranks)), (size, 0.0))
            by_group[(dimension, tuple(ranks))] = (size, max(known[1], seconds))
    out = []
    mesh = plan.mesh
    for (dimension, ranks), (size, seconds) in by_group.items():
        predicted = None
        if dimension == "dp" and mesh is not None:
            predicted = DataParallel(len(ranks), mesh.ring_bytes_per_s, mesh.ring_latency_s).allreduce_s(size)
        out.append(AllReduceTime(dimension, ranks, size, seconds, predicted))
    return tuple(out)
