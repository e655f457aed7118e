"""The parts of a verify report that only a job spread over nodes has: where each rank ran, each replica's
slowest rank, each node's links and the gradient all-reduce per mesh dimension (``pipeplan verify`` joined to a
``torchrun`` job, planner/runtime/torchrun.py), and their table.

No torch here: the report and its readers (planner/runtime/verify_report.py) import this.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from planner.formatting import human_bytes

__all__ = ["RankPlace", "ReplicaTime", "LinkTime", "NodeReport", "AllReduceTime", "JobReport", "format_job"]


@dataclass(frozen=True)
class RankPlace:
    """One rank of the job: where it ran, its place in the plan's mesh and its medians over the timed steps."""

    rank: int
    node: str
    """The host name of the node it ran on."""
    node_rank: int
    """Its node among the job's (torchrun's ``GROUP_RANK``): two nodes may share a host name."""
    local_rank: int
    """Its rank among the processes of its node (torchrun's ``LOCAL_RANK``)."""
    replica: int
    pp_rank: int
    tp_rank: int
    compute_s: float
    """Every stage's compute in one step (median)."""
    wait_s: float
    """Inside torch's waits on point-to-point transfers in one step (median): bubble and links."""
    own_s: float
    """From the step's opening barrier to the end of this rank's optimizer step (median)."""


@dataclass(frozen=True)
class ReplicaTime:
    """One data-parallel replica (a whole pipeline, with its tensor-parallel ranks)."""

    replica: int
    ranks: tuple[int, ...]
    slowest_rank: int
    """The rank that finished its step last (largest :attr:`RankPlace.own_s`): the one its replica waits for."""
    slowest_own_s: float
    slowest_compute_s: float
    forward_s: tuple[float, ...] = ()
    """Per stage of the plan (by index), this replica's median forward; the slowest of a tensor-parallel group."""
    backward_s: tuple[float, ...] = ()
    """Per stage, this replica's median backward (input and weight gradients together)."""
    memory_bytes: tuple[int | None, ...] = ()
    """Per stage, this replica's peak of live tensor bytes in one step (the largest of a tensor-parallel group);
    None where it was not measured."""


@dataclass(frozen=True)
class LinkTime:
    """One pipeline hop, timed alone after the timed steps: a stage's output sent to the next stage's rank."""

    src_rank: int
    dst_rank: int
    src_node: int
    """The node rank (``GROUP_RANK``) of the sending rank."""
    dst_node: int
    num_bytes: int
    """What the plan says one micro-batch's boundary weighs (the stage's ``send_bytes``)."""
    measured_s: float
    """The tensor sent and a one-element reply received (median of five, after one untimed)."""
    predicted_s: float | None
    """The same on the plan's hop link: two latencies plus the bytes over its bandwidth; None where the plan has
    no mesh."""


@dataclass(frozen=True)
class NodeReport:
    """One node: its ranks and the hops that leave from them."""

    node_rank: int
    host: str
    ranks: tuple[int, ...]
    links: tuple[LinkTime, ...]


@dataclass(frozen=True)
class AllReduceTime:
    """An all-reduce of a rank's gradient bytes over one group of a mesh dimension, every group at once."""

    dimension: str
    """``dp`` (the replicas of a position: DDP's gradient all-reduce) or ``tp`` (a tensor-parallel group)."""
    ranks: tuple[int, ...]
    num_bytes: int
    """The group's first rank's gradient bytes, at most :data:`planner.runtime.torchrun.PROBE_MAX_BYTES`."""
    measured_s: float
    """The slowest member's median."""
    predicted_s: float | None
    """dp: a ring over the plan's ring link (planner/cost.py, ``DataParallel.allreduce_s``); tp: None."""


@dataclass(frozen=True)
class JobReport:
    """Every section at once, as :func:`planner.runtime.torchrun.verify_in_job` builds them."""

    places: tuple[RankPlace, ...]
    replicas: tuple[ReplicaTime, ...]
    nodes: tuple[NodeReport, ...]
    allreduce: tuple[AllReduceTime, ...]

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> JobReport:
        """Read back from a report's JSON (``asdict``)."""
        nodes = tuple(
            NodeReport(n["node_rank"], n["host"], tuple(n["ranks"]), tuple(LinkTime(**link) for link in n["links"]))
            for n in data.get("nodes", ())
        )
        return cls(
            places=tuple(RankPlace(**p) for p in data.get("places", ())),
            replicas=tuple(
                ReplicaTime(**{**r, **{k: tuple(r.get(k, ())) for k in _REPLICA_TUPLES}})
                for r in data.get("replicas", ())
            ),
            nodes=nodes,
            allreduce=tuple(AllReduceTime(**{**a, "ranks": tuple(a["ranks"])}) for a in data.get("allreduce", ())),
        )


_REPLICA_TUPLES = ("ranks", "forward_s", "backward_s", "memory_bytes")


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1e3:.3f} ms"


def _link_line(link: LinkTime) -> str:
    where = "inside the node" if link.src_node == link.dst_node else f"to node {link.dst_node}"
    return (
        f"    rank {link.src_rank} -> {link.dst_rank} ({where}), {link.num_bytes} B: measured "
        f"{_ms(link.measured_s)}, predicted {_ms(link.predicted_s)}"
    )


def format_job(job: JobReport, world_size: int) -> list[str]:
    """The job's sections as lines: ranks by node, replicas and their slowest rank, links, all-reduces."""
    lines = [f"job: {world_size} ranks on {len(job.nodes)} nodes (torchrun)"]
    by_rank = {p.rank: p for p in job.places}
    for node in job.nodes:
        ranks = ", ".join(f"{r} (local {by_rank[r].local_rank})" for r in node.ranks if r in by_rank)
        lines.append(f"  node {node.node_rank} ({node.host}): ranks {ranks}")
        lines.extend(_link_line(link) for link in node.links)
    for r in job.replicas:
        lines.append(
            f"  replica {r.replica} (ranks {', '.join(map(str, r.ranks))}): slowest rank {r.slowest_rank}, "
            f"{_ms(r.slowest_own_s)} to its optimizer step's end ({_ms(r.slowest_compute_s)} compute)"
        )
        for stage, (fwd, bwd) in enumerate(zip(r.forward_s, r.backward_s, strict=True)):
            peak = r.memory_bytes[stage] if stage < len(r.memory_bytes) else None
            memory = "-" if peak is None else human_bytes(peak)
            lines.append(f"    stage {stage}: forward {_ms(fwd)}, backward {_ms(bwd)}, memory peak {memory}")
    for a in job.allreduce:
        lines.append(
            f"  gradient all-reduce over {a.dimension} (ranks {', '.join(map(str, a.ranks))}), {a.num_bytes} B: "
            f"measured {_ms(a.measured_s)}, predicted {_ms(a.predicted_s)}"
        )
    return lines
