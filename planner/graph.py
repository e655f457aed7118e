"""The graph model of a profiled model: units as nodes, tensors as edges (networkx).

A cut ``k`` lies between unit ``k`` and unit ``k + 1`` in execution order. What crosses it is
every distinct tensor produced at or before unit ``k`` (or by the model input, node ``-1``) and
consumed after it: a skip tensor crosses every cut between its producer and its last consumer and
is counted once per cut, however many units past the cut read it. Only floating tensors that
require grad send a gradient back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from profiles.format import Profile

if TYPE_CHECKING:
    import networkx as nx

__all__ = [
    "INPUT_NODE",
    "build_graph",
    "crossing_tensors",
    "cut_bytes",
    "cut_grad_bytes",
    "stage_sum",
]

INPUT_NODE = -1


def build_graph(profile: Profile) -> nx.DiGraph:
    """Nodes: ``-1`` (model input) and unit indices with their per-size measurements.

    Edges ``producer -> consumer`` carry ``tensors``: the indices into ``profile.tensors`` that flow
    along them.
    """
    import networkx as nx  # here, not at the top: commands that plan nothing start without it

    graph = nx.DiGraph()
    graph.add_node(INPUT_NODE, name="<input>")
    for index, unit in enumerate(profile.units):
        graph.add_node(
            index,
            name=unit.name,
            type=unit.type,
            forward_s=unit.forward_s,
            backward_s=unit.backward_s,
            flops=unit.flops,
            saved_bytes=unit.saved_bytes,
            param_bytes=unit.param_bytes,
        )
    for tensor_index, tensor in enumerate(profile.tensors):
        for consumer in tensor.consumers:
            if graph.has_edge(tensor.producer, consumer):
                graph.edges[tensor.producer, consumer]["tensors"].append(tensor_index)
            else:
                graph.add_edge(tensor.producer, consumer, tensors=[tensor_index])
    return graph


def crossing_tensors(graph: nx.DiGraph, cut: int) -> list[int]:
    """Distinct tensor indices crossing cut ``cut`` (between unit ``cut`` and ``cut + 1``)."""
    crossing: set[int] = set()
    for producer, consumer, data in graph.edges(data=True):
        if producer <= cut < consumer:
            crossing.update(data["tensors"])
    return sorted(crossing)


def _cut_sums(profile: Profile, graph: nx.DiGraph, size_index: int, *, grad_only: bool) -> list[int]:
    """Per cut, the bytes of the distinct tensors crossing it: what :func:`crossing_tensors` gives cut by cut.

    A tensor crosses the cuts ``max(producer, 0) .. last consumer - 1`` (every edge of a tensor leaves its
    one producer), so one pass over the edges and a running sum give every cut at once: linear in edges +
    cuts, where asking :func:`crossing_tensors` per cut would be edges x cuts (8M edge visits for 1,000
    units). The sums are of integers, so they are exactly the per-cut ones.
    """
    last_consumer: dict[int, tuple[int, int]] = {}
    for producer, consumer, data in graph.edges(data=True):
        for t in data["tensors"]:
            known = last_consumer.get(t)
            if known is None or consumer > known[1]:
                last_consumer[t] = (producer, consumer)
    cuts = profile.num_units - 1
    delta = [0] * (cuts + 1)
    for t, (producer, consumer) in last_consumer.items():
        first, last = max(producer, 0), min(consumer - 1, cuts - 1)
        tensor = profile.tensors[t]
        if first > last or not (tensor.needs_grad or not grad_only):
            continue
        delta[first] += tensor.bytes[size_index]
        delta[last + 1] -= tensor.bytes[size_index]
    sums, running = [], 0
    for k in range(cuts):
        running += delta[k]
        sums.append(running)
    return sums


def cut_bytes(profile: Profile, size_index: int, graph: nx.DiGraph | None = None) -> list[int]:
    """Per cut: bytes of activations sent forward across it for one micro-batch."""
    return _cut_sums(profile, graph if graph is not None else build_graph(profile), size_index, grad_only=False)


def cut_grad_bytes(profile: Profile, size_index: int, graph: nx.DiGraph | None = None) -> list[int]:
    """Per cut: bytes of gradients sent back across it (floating tensors that require grad only)."""
    return _cut_sums(profile, graph if graph is not None else build_graph(profile), size_index, grad_only=True)


def stage_sum(values: Sequence[float], first: int, last: int) -> float:
    """Sum of a per-unit quantity over units ``first..last`` (inclusive)."""
    return sum(values[first : last + 1])
