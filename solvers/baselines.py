"""The partitioners people use today, reproduced to compare pipeplan against (not used to plan).

Each returns ``boundaries``: the first unit of every stage, ``boundaries[0] == 0``.

- :func:`uniform_by_count`: equal unit counts (Megatron-LM / torchtitan / DeepSpeed ``'uniform'``).
- :func:`balanced_by_params`: DeepSpeed ``partition_method='parameters'``
  (``deepspeed.runtime.utils.partition_balanced``, DeepSpeed 0.19).
- :func:`balanced_by_time`: torchgpipe ``balance_by_time``
  (``torchgpipe.balance.blockpartition.solve``; Bárány and Grinberg, "Block partitions of
  sequences", Israel J. Math. 206, 2015, arXiv:1308.2452).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from planner.errors import SolverError, UsageError

__all__ = ["uniform_by_count", "balanced_by_params", "balanced_by_time"]


def _check(num_units: int, num_stages: int) -> None:
    if num_stages < 1 or num_units < num_stages:
        raise UsageError(f"cannot cut {num_units} units into {num_stages} non-empty stages")


def uniform_by_count(num_units: int, num_stages: int) -> tuple[int, ...]:
    """Equal unit counts; the ``num_units % num_stages`` leftover units go one each to the first stages.

    This is DeepSpeed's ``partition_uniform`` convention (and torchtitan's manual split); e.g. 10
    units on 4 stages -> sizes 3, 3, 2, 2 -> boundaries ``(0, 3, 6, 8)``.
    """
    _check(num_units, num_stages)
    size, extra = divmod(num_units, num_stages)
    boundaries, start = [], 0
    for s in range(num_stages):
        boundaries.append(start)
        start += size + (1 if s < extra else 0)
    return tuple(boundaries)


def balanced_by_params(param_counts: Sequence[float], num_stages: int) -> tuple[int, ...]:
    """DeepSpeed's ``partition_balanced(weights=param_counts, num_parts=num_stages)`` (DeepSpeed 0.19).

    Despite the usual description ("minimise the heaviest stage"), DeepSpeed 0.19's version is a
    dynamic program over (units, stages) that keeps, per state, the one predecessor minimising the
    spread ``max stage sum - min stage sum`` of the stages so far (ties: the latest start wins).
    The kept (max, min) pair makes it a heuristic for that spread; this function reproduces it,
    including the tie rule. With ``num_units == num_stages`` every stage holds one unit.
    """
    n = len(param_counts)
    _check(n, num_stages)
    if n == num_stages:
        return tuple(range(n))
    m = num_stages
    prefix = np.zeros(n + 1)
    prefix[1:] = np.cumsum(np.asarray(param_counts, dtype=np.float64))
    # dp_*[k, j]: the state "first k units in j stages"; only dp_max/dp_cost[0, 0] start at 0.
    dp_max = np.full((n + 1, m + 1), np.inf)
    dp_min = np.full((n + 1, m + 1), np.inf)
    dp_cost = np.full((n + 1, m + 1), np.inf)
    position = np.zeros((n + 1, m + 1), dtype=np.int64)
    dp_max[0, 0] = 0.0
    dp_cost[0, 0] = 0.0
    for i in range(1, n + 1):
        stages = np.arange(1, min(i, m) + 1)
        last = (prefix[i] - prefix[:i])[:, None]  # the new stage holds units k..i-1, one row per k
        high = np.maximum(dp_max[:i, stages - 1], last)
        low = np.minimum(dp_min[:i, stages - 1], last)
        cost = high - low
        # DeepSpeed scans k upward and replaces on ">=": the last k reaching the minimum wins.
        k = i - 1 - np.argmin(cost[::-1], axis=0)
        cols = np.arange(len(stages))
        dp_cost[i, stages] = cost[k, cols]
        dp_max[i, stages] = high[k, cols]
        dp_min[i, stages] = low[k, cols]
        position[i, stages] = k
    parts = [n]
    for j in range(m, 0, -1):
        parts.append(int(position[parts[-1], j]))
    return tuple(reversed(parts[1:]))


def balanced_by_time(times: Sequence[float], num_stages: int) -> tuple[int, ...]:
    """torchgpipe's ``balance_by_time``: ``blockpartition.solve(times, num_stages)`` (torchgpipe 0.0.7).

    The Bárány-Grinberg local search: start from equal counts (``n // P`` units per stage, the rest
    in the last stage), with the times normalised to [0, 1] by ``(x - min) / (max - min)``. Then
    repeat: take a heaviest block ``p`` (the last one on ties); while the lightest block ``q`` (the
    first one on ties) is lighter than ``M(P) - 1``, move one unit into ``q`` from its neighbour on
    ``p``'s side; start over when that neighbour was ``p``. It stops when heaviest <= lightest + 1 in
    normalised units, i.e. within one largest unit: a rough balance, not an optimum. torchgpipe
    picks the first minimal block where the paper asks for the one closest to ``p``; reproduced.

    Raises:
        SolverError: where torchgpipe would return a balance with an empty stage or never stop.
    """
    n = len(times)
    if num_stages < 1:
        raise UsageError(f"num_stages must be >= 1, got {num_stages}")
    _check(n, num_stages)
    low = min(times)
    spread = max(times) - low
    normal = [0 for _ in times] if spread == 0 else [(x - low) / spread for x in times]
    splits = [n // num_stages * (x + 1) for x in range(num_stages - 1)] + [n]

    def block(i: int) -> float:
        # Summed left to right over the block, as torchgpipe does, so ties compare the same way.
        return sum(normal[(splits[i - 1] if i > 0 else 0) : splits[i]])

    sizes = [block(i) for i in range(num_stages)]
    # torchgpipe can move a split past its neighbour and then loop forever; terminating runs take
    # well under n * P moves (at most 0.3 n P in 1,500 random cases), so stop long after that.
    moves_left = n * num_stages + 1000
    while True:
        max_size, p = max((size, i) for i, size in enumerate(sizes))
        while True:
            min_size, q = min((size, i) for i, size in enumerate(sizes))
            if max_size <= min_size + 1:
                return _valid_blocks(splits, times)
            if moves_left == 0:
                raise SolverError(
                    f"torchgpipe's block partition does not terminate on these {n} times for "
                    f"{num_stages} stages (torchgpipe itself would hang)"
                )
            moves_left -= 1
            if p < q:
                h = q - 1
                splits[h] -= 1
            else:
                h = q + 1
                splits[q] += 1
            sizes[h], sizes[q] = block(h), block(q)
            if p == h:
                break


def _valid_blocks(splits: list[int], times: Sequence[float]) -> tuple[int, ...]:
    starts = [0, *splits[:-1]]
    if any(b <= a for a, b in zip(starts, splits, strict=True)):
        # torchgpipe returns the slice lengths, with a 0 (or a short total) here, which GPipe rejects.
        lengths = [max(0, b - a) for a, b in zip(starts, splits, strict=True)]
        raise SolverError(
            f"torchgpipe's block partition of {len(times)} times leaves an empty stage (balance {lengths})"
        )
    return tuple(starts)
