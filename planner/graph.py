"""The graph model of a profiled model: units as nodes, tensors as edges (networkx).

A cut ``k`` lies between unit ``k`` and unit ``k + 1`` in execution order. What crosses it is
every distinct tensor produced at or before unit ``k`` (or by the model input, node ``-1``) and
consumed after it: a skip tensor crosses every cut between its producer and its last consumer and
is counted once per cut, however many units past the cut read it. Only floating tensors that
require grad send a gradient back.
"""

from __future__ import annotations

from collections.abc import Sequence

import networkx as nx

from profiles.format import Profile

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
    sums = []
    for cut in range(profile.num_units - 1):
        tensors = (profile.tensors[t] for t in crossing_tensors(graph, cut))
        sums.append(sum(t.bytes[size_index] for t in tensors if t.needs_grad or not grad_only))
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
