"""The devices of a cluster plan and the ``pp x tp x dp`` layouts a search places on them: which device each
(replica, pipeline rank) group starts at, and the slowest link its pipeline hops and its replicas' rings cross.

Tensor parallelism is innermost (a position's ``tp`` devices are consecutive, inside a node); ``placement`` puts
either a replica's pipeline (``pipeline-in-node``) or a stage's replicas (``replicas-in-node``) next to each other.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, replace

from planner.cost import SHARDING
from planner.errors import UsageError
from planner.limits import MAX_DEVICES, MAX_RANKS, check_at_most
from planner.plan import PLACEMENTS

__all__ = ["Cluster", "Layout", "layouts", "default_cluster", "DEFAULT_CLUSTER_LINKS", "nearest_divisors"]

# (intra-node bytes/s, inter-node bytes/s, latency s) per device kind, one direction per device.
# cuda: NVLink 4 (H100/H200: 450 GB/s each way) inside a node, one 400 Gb/s NIC per GPU (50 GB/s) between
#       nodes, 10 us a message. cpu: gloo over localhost (measured, planner/cost.py DEFAULT_LINKS) for both.
DEFAULT_CLUSTER_LINKS: dict[str, tuple[float, float, float]] = {
    "cuda": (450e9, 50e9, 1e-5),
    "cpu": (1.1e9, 1.1e9, 1.3e-4),
}


@dataclass(frozen=True)
class Cluster:
    """The devices a cluster plan may use."""

    num_devices: int
    devices_per_node: int
    intra_node_bytes_per_s: float
    inter_node_bytes_per_s: float
    latency_s: float
    shard: str = "none"
    """One of :data:`planner.plan.SHARDING`."""
    group_link_shares: tuple[tuple[int, float], ...] = ()
    """Per size of a group of consecutive devices in a node, the share of ``intra_node_bytes_per_s`` a ring of them
    gets where the node has no switch (:attr:`profiles.device_model.DeviceModel.group_link_shares`)."""

    def __post_init__(self) -> None:
        if self.num_devices < 1 or self.devices_per_node < 1:
            raise UsageError(
                f"--devices and --devices-per-node must be >= 1, got {self.num_devices}, {self.devices_per_node}"
            )
        check_at_most("--devices", self.num_devices, MAX_DEVICES)
        if self.intra_node_bytes_per_s <= 0 or self.inter_node_bytes_per_s <= 0 or self.latency_s < 0:
            raise UsageError("bandwidths must be positive and latency >= 0")
        if self.shard not in SHARDING:
            raise UsageError(f"--shard must be one of {', '.join(SHARDING)}, got {self.shard!r}")

    def group_bytes_per_s(self, size: int) -> float:
        """A ring of ``size`` consecutive devices of one node: each device's bandwidth to the next, one way."""
        return self.intra_node_bytes_per_s * dict(self.group_link_shares).get(size, 1.0)

    def link(self, a: int, b: int) -> float:
        """Bandwidth between devices ``a`` and ``b`` (global ranks, ``devices_per_node`` to a node)."""
        same = a // self.devices_per_node == b // self.devices_per_node
        return self.intra_node_bytes_per_s if same else self.inter_node_bytes_per_s


@dataclass(frozen=True)
class Layout:
    """``pp`` pipeline ranks x ``dp`` replicas placed on the cluster's devices, each position a group of ``tp``
    consecutive devices (tensor parallelism innermost: its collectives, every block, stay inside a node)."""

    pp: int
    dp: int
    placement: str
    tp: int = 1
    shard: str = "none"
    """What the replicas split (one of :data:`SHARDING`); with one replica there is nothing to split."""

    @property
    def used_devices(self) -> int:
        return self.pp * self.dp * self.tp

    @property
    def degrees(self) -> str:
        """``pp x dp``, or ``pp x tp x dp`` with tensor parallelism, as the reports print it."""
        return f"{self.pp} x {self.dp}" if self.tp == 1 else f"{self.pp} x {self.tp} x {self.dp}"

    def device(self, replica: int, rank: int) -> int:
        """The first device of the position's tensor-parallel group."""
        if self.placement == "pipeline-in-node":
            return (replica * self.pp + rank) * self.tp
        return (rank * self.dp + replica) * self.tp

    def devices(self) -> tuple[tuple[int, ...], ...]:
        return tuple(tuple(self.device(r, s) for s in range(self.pp)) for r in range(self.dp))

    def hop_bytes_per_s(self, cluster: Cluster) -> float:
        """The slowest hop between consecutive pipeline ranks of any replica (inf without hops)."""
        pairs = ((self.device(r, s), self.device(r, s + 1)) for r in range(self.dp) for s in range(self.pp - 1))
        return _slowest(cluster, pairs)

    def ring_bytes_per_s(self, cluster: Cluster) -> float:
        """The slowest link in any pipeline rank's ring of replicas (inf with one replica)."""
        if self.dp == 1:
            return math.inf
        pairs = ((self.device(r, s), self.device((r + 1) % self.dp, s)) for s in range(self.pp) for r in range(self.dp))
        return _slowest(cluster, pairs)


def nearest_divisors(wanted: int, devices: int) -> str:
    """The divisors of ``devices`` just below and above ``wanted``: what a user who asked for ``wanted`` means."""
    divisors = [d for d in range(1, devices + 1) if devices % d == 0]
    below = max(d for d in divisors if d < wanted)
    above = [d for d in divisors if d > wanted]
    return f"{below} or {above[0]}" if above else str(below)


def default_cluster(
    device_kind: str,
    num_devices: int,
    *,
    devices_per_node: int | None = None,
    intra_node_bytes_per_s: float | None = None,
    inter_node_bytes_per_s: float | None = None,
    latency_s: float | None = None,
    shard: str = "none",
    group_link_shares: tuple[tuple[int, float], ...] = (),
) -> Cluster:
    """A cluster of ``num_devices`` with the links of :data:`DEFAULT_CLUSTER_LINKS` for ``device_kind`` where
    none is given (all devices on one node unless ``devices_per_node``)."""
    intra, inter, latency = DEFAULT_CLUSTER_LINKS.get(device_kind, DEFAULT_CLUSTER_LINKS["cpu"])
    return Cluster(
        num_devices=num_devices,
        devices_per_node=devices_per_node or num_devices,
        intra_node_bytes_per_s=intra_node_bytes_per_s or intra,
        inter_node_bytes_per_s=inter_node_bytes_per_s or inter,
        latency_s=latency_s if latency_s is not None else latency,
        shard=shard,
        group_link_shares=group_link_shares,
    )


def _slowest(cluster: Cluster, pairs: Iterator[tuple[int, int]]) -> float:
    """The slowest link among ``pairs`` of devices (inf for none), stopping at the first of the slower kind:
    a 4,096-device search asks for 717 layouts, and most have thousands of pairs."""
    slower, faster = sorted((cluster.intra_node_bytes_per_s, cluster.inter_node_bytes_per_s))
    found = math.inf
    for a, b in pairs:
        link = cluster.link(a, b)
        if link == slower:
            return slower
        found = faster
    return found


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def layouts(
    cluster: Cluster,
    num_units: int,
    global_batch: int,
    pipeline_degree: int | None = None,
    tp: int = 1,
    shards: tuple[str, ...] = (),
) -> list[Layout]:
    """Every layout the search considers with tensor-parallel degree ``tp``, in a fixed order.

    ``p`` runs over 1..min(N / tp, units, the pipeline limit) (or is ``pipeline_degree``), ``d`` over the
    divisors of the global batch with ``p * d * tp <= N``; a placement whose links equal the other's on this
    cluster is kept once (e.g. one node). Each replicated layout once per mode of ``shards`` (none given: the
    cluster's); a layout of one replica once, with the first (it has nothing to split).
    """
    if pipeline_degree is not None:
        degrees = [pipeline_degree]
    else:
        degrees = list(range(1, min(cluster.num_devices // tp, num_units, MAX_RANKS) + 1))
    modes = shards or (cluster.shard,)
    found: list[Layout] = []
    for p in degrees:
        for d in _divisors(global_batch):
            if p * d * tp > cluster.num_devices:
                break
            seen: set[tuple[float, float]] = set()
            for placement in PLACEMENTS:
                layout = Layout(p, d, placement, tp)
                links = (layout.hop_bytes_per_s(cluster), layout.ring_bytes_per_s(cluster))
                if links not in seen:
                    seen.add(links)
                    found.extend(replace(layout, shard=shard) for shard in (modes if d > 1 else modes[:1]))
    return found
