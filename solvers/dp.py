"""Exact dynamic program for the pipeline partition problem (homogeneous stages, pinned units allowed).

Method: Alpa (Zheng et al., "Alpa: Automating Inter- and Intra-Operator Parallelism for Distributed
Deep Learning", OSDI 2022), Sec. 5.2, Eq. 2-3. The objective of :func:`solvers.problem.evaluate` ::

    T* = min over t_max of { min over partitions with every c_s <= t_max of sum_s (c_s + k_s) }
         + (M - 1) * t_max

is exact when ``t_max`` ranges over the candidate bottlenecks (every stage compute time that can
occur). For a fixed ``t_max`` the inner minimum ``g(t_max)`` is a DP over (stage index, last unit),
where stage ``s`` may hold units ``i..j`` only if its compute is ``<= t_max`` and it fits in memory
*as stage s* (memory depends on ``s`` through its moments, ``in_flight[s]``, and ``capacity_bytes[s]``).
A pinned unit ``u`` in stage ``s`` bounds the rows: stage ``s`` ends at ``u`` or later, stage ``s - 1`` before
``u`` (the pins only remove partitions, so every bound of the search below stays a bound).

Speed (1,000 units x 64 stages well under a second):

- the inner DP is vectorised with numpy: for a bound ``t_max`` the starts ``i`` allowed for an end
  ``j`` form a band (prefix sums of compute are monotone), so each stage is one ``n x W`` array;
- memory feasibility is precomputed once per kind of stage (its moments and capacity) as a mask over the
  stage shapes, with :func:`solvers.problem.stage_memory_peak`'s formula on arrays; a stage then costs one
  lookup per shape;
- instead of scanning every candidate bound in ascending order with Alpa's early stop
  ``(M-1) * t_max + LB >= best``, the candidates are searched by branch and bound: ``g`` is a
  non-increasing step function of ``t_max``, so an interval of candidates whose ends have equal
  ``g`` holds nothing better than its left end, and an interval ``(a, b]`` cannot beat the incumbent
  when ``g(b) + (M-1) * t_a+1 >= best`` (Alpa's stop rule applied per interval). The smallest
  feasible bound is found first by galloping + binary search (a small problem is first solved once at the
  loosest bound memory leaves, which says whether any partition fits at all). The result equals the full scan.

``top_k``: the candidates are the inner-DP optima at the bounds examined (each is the best partition
whose bottleneck is at most that bound), distinct by boundaries and recompute flags, sorted by
objective, best first. Bounds pruned against the k-th best are not examined, so this is "the best
solutions across ``t_max`` values", not the k best partitions overall. With ``M = 1`` the bound does
not enter the objective and one solution is returned.

Ties are broken deterministically (smallest candidate bound first; within the DP ``argmin`` keeps
the earliest start).
"""

from __future__ import annotations

import heapq
import math
import time
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from planner.errors import PlanInfeasibleError, UsageError
from solvers.problem import (
    Moment,
    PartitionProblem,
    PartitionSolution,
    acting_kind,
    check_pins,
    evaluate,
    local_cuts,
    stage_cost,
    stage_moments,
    transient_arrays,
)

__all__ = ["solve_dp", "smallest_plan_bytes"]

PROBE_CELLS = 65_536
"""Units times band width under which one solve of the DP costs little beyond its Python (:func:`_search`)."""

_Kind = tuple[tuple[Moment, ...], float, bool, bool]
"""What a stage's memory depends on besides its units: its moments, its capacity, and whether its input and its
output are handed over in memory (no receive buffers there)."""


@dataclass(frozen=True)
class _MomentTerms:
    """A stage kind's moments as columns along a first axis (shape ``(K, 1, 1)``), for :meth:`_Band._fits`."""

    waiting: np.ndarray
    split: np.ndarray
    done: np.ndarray
    sent_grads: np.ndarray
    sent_outputs: np.ndarray
    grads: np.ndarray
    acting: np.ndarray
    by_kind: tuple[tuple[str, np.ndarray], ...]
    """Per acting kind (whose working memory, :func:`acting_kind`), the moments' rows."""


@lru_cache(maxsize=4096)
def _moment_terms(moments: tuple[Moment, ...], recompute: bool) -> _MomentTerms:
    def column(values: list[float] | list[bool]) -> np.ndarray:
        return np.asarray(values)[:, None, None]

    kinds = [acting_kind(m, recompute) for m in moments]
    return _MomentTerms(
        waiting=column([float(m.waiting) for m in moments]),
        split=column([float(m.split) for m in moments]),
        done=column([float(m.done) for m in moments]),
        sent_grads=column([float(m.sent_grads) for m in moments]),
        sent_outputs=column([float(m.sent_outputs) for m in moments]),
        grads=column([bool(m.grads) for m in moments]),
        acting=column([bool(m.acting) for m in moments]),
        by_kind=tuple((k, np.asarray([r for r, kk in enumerate(kinds) if kk == k])) for k in dict.fromkeys(kinds)),
    )


@dataclass(frozen=True)
class _Found:
    """One inner-DP optimum for a bound ``t_max``."""

    sum_s: float
    bottleneck_s: float
    boundaries: tuple[int, ...]
    recompute: tuple[bool, ...]

    def objective_s(self, num_microbatches: int) -> float:
        return self.sum_s + (num_microbatches - 1) * self.bottleneck_s


class _Band:
    """Per-shape arrays for stages that end at unit ``j`` and start at ``i = j - W + 1 + w``."""

    def __init__(self, model: _Model, width: int) -> None:
        n = model.n
        self.width = width
        self.model = model
        j = np.arange(n)[:, None]
        i = j - width + 1 + np.arange(width)[None, :]
        self.valid = i >= 0
        ic = np.where(self.valid, i, 0)
        c0 = model.pfb[j + 1] - model.pfb[ic]
        c1 = c0 + (model.pf[j + 1] - model.pf[ic])
        self.c0 = np.where(self.valid & model.allow0, c0, np.inf)
        self.c1 = np.where(self.valid & model.allow1, c1, np.inf)
        comm = model.comm[ic]
        self.c0k = self.c0 + comm
        self.c1k = self.c1 + comm
        self._ic, self._j = ic, j
        self._terms = False
        self._stage_terms_by: dict[tuple[bool, bool, bool], tuple[Any, ...]] = {}
        self.fit0: dict[_Kind, np.ndarray] = {}
        self.fit1: dict[_Kind, np.ndarray] = {}

    def _prepare(self) -> None:
        """The terms of :func:`solvers.problem.stage_memory_peak` per shape, made the first time a capacity binds
        (each is an array of the band's size: where memory never binds, none is made)."""
        if self._terms:
            return
        self._terms = True
        model, n, ic, j = self.model, self.model.n, self._ic, self._j
        self.state = model.pp[j + 1] - model.pp[ic]
        self.grads = model.pg[j + 1] - model.pg[ic]
        self.saved = model.ps[j + 1] - model.ps[ic]
        self.split = model.pw[j + 1] - model.pw[ic]
        # max over u in i..j of (T_u - held by units u+1..j) = max of (T_u + ps[u+1]) less ps[j+1].
        distinct: dict[int, np.ndarray] = {}
        for values in model.transient.values():
            if id(values) not in distinct:
                shifted = (values + model.ps[1:])[ic]
                distinct[id(values)] = np.maximum.accumulate(shifted[:, ::-1], axis=1)[:, ::-1] - model.ps[j + 1]
        self.transient = {kind: distinct[id(values)] for kind, values in model.transient.items()}
        if model.step_add:
            self.step = model.pt[j + 1] - model.pt[ic]
        else:
            self.step = np.maximum.accumulate(model.step[ic][:, ::-1], axis=1)[:, ::-1]
        stage_input = model.stage_input[ic]
        self.stage_input = stage_input
        self.in_grad = model.stage_in_grad[ic]
        self.split_held = self.split - np.where(j == n - 1, float(model.problem.final_output_bytes), 0.0)
        # What sends hold per sent gradient (the stage's input's) and per sent output (its own).
        self.sent_grad = np.where(ic == 0, 0.0, self.in_grad)
        self.sent_output = np.broadcast_to(np.where(j == n - 1, 0.0, model.out_held[:, None]), stage_input.shape)
        self.relayed = np.zeros(stage_input.shape)
        for producer, consumer, nbytes in model.problem.relays:
            self.relayed += np.where((ic > producer) & (j < consumer), float(nbytes), 0.0)
        self.out_grad = np.broadcast_to(model.out_grad[:, None], stage_input.shape)
        # The last stage's own: the step's target (with its buffers) and the losses of finished micro-batches.
        last = np.broadcast_to(np.where(j == n - 1, 1.0, 0.0), stage_input.shape)
        self.target = last * float(model.problem.target_bytes)
        self.kept_loss = last * float(model.problem.kept_loss_bytes)
        if model.buffer_mb:
            self.held1 = np.broadcast_to(model.out_held[:, None], stage_input.shape)
            # The last unit's loss runs after the checkpointed stage: not re-materialised.
            own = np.asarray(model.problem.unit_output_bytes or (0,) * n, dtype=np.float64)[j]
            self.remat1 = self.saved - np.where(j == n - 1, float(model.problem.output_held_bytes), own)
        else:
            self.held1, self.remat1 = stage_input, self.saved

    def _stage_terms(self, recompute: bool, local_in: bool, local_out: bool) -> tuple[Any, ...]:
        """The terms of a stage's memory that do not depend on its moments, per shape: ``(held, held past its I,
        re-materialised, per sent gradient, per sent output, base, base with the optimizer step)``. Kept per
        recomputation and local cuts: every kind of stage with the same three asks again."""
        key = (recompute, local_in, local_out)
        if key not in self._stage_terms_by:
            self._prepare()
            # A stage handing its output over on its rank holds it no more (solvers.problem.stage_memory_peak).
            handed = self.sent_output if local_out else 0.0
            held, remat = (self.held1 - handed, self.remat1) if recompute else (self.saved + self.relayed - handed, 0.0)
            # Under a split backward a relayed tensor's gradient is the buffer it came in (stage_memory_peak).
            passed = self.relayed if self.model.problem.split_backward and not recompute else 0.0
            sent_grad = 0.0 if local_in else self.sent_grad - passed
            sent_output = 0.0 if local_out else self.sent_output
            own_grads = self.out_grad - (passed if local_in else 0.0)
            buffers = self.model.buffer_mb * (self.stage_input + own_grads + self.target)
            memory = self.state + buffers + self.step
            base = self.state + buffers
            held_past = held + self.split_held
            self._stage_terms_by[key] = (held, held_past, remat, sent_grad, sent_output, base, memory)
        return self._stage_terms_by[key]

    def _fits(self, kind: _Kind, recompute: bool) -> np.ndarray:
        moments, cap, local_in, local_out = kind
        if math.isinf(cap) or self.model.most_bytes(moments) <= cap:
            return self.valid & (self.model.allow1 if recompute else self.model.allow0)
        held, held_past, remat, sent_grad, sent_output, base, memory = self._stage_terms(recompute, local_in, local_out)
        # Every moment at once, along a first axis: the same operations in the same order as one moment at a time
        # (so the same sums to the last bit), a dozen numpy calls a kind instead of a dozen a moment.
        terms = _moment_terms(moments, recompute)
        past_input = 0.0 if recompute else terms.split * held_past
        activations = (
            terms.waiting * held + past_input + np.where(terms.acting, remat, 0.0) + terms.done * self.kept_loss
        )
        sends = terms.sent_grads * sent_grad + terms.sent_outputs * sent_output
        here = base - np.where(terms.grads, 0.0, self.grads) + activations + sends
        for acting_kind_, rows in terms.by_kind:
            memory = np.maximum(memory, (here[rows] + self.transient[acting_kind_]).max(axis=0))
        allowed = self.model.allow1 if recompute else self.model.allow0
        return self.valid & allowed & (memory <= cap)

    def fits(self, kind: _Kind, recompute: bool) -> np.ndarray:
        """Which shapes fit a stage of ``kind`` (with or without recomputation); computed once per kind."""
        table = self.fit1 if recompute else self.fit0
        if kind not in table:
            table[kind] = self._fits(kind, recompute)
        return table[kind]


class _Model:
    """The problem as numpy arrays, and the inner DP for one bound."""

    def __init__(self, problem: PartitionProblem) -> None:
        n, p = problem.num_units, problem.num_stages
        self.problem = problem
        self.n, self.p, self.m = n, p, problem.num_microbatches
        fwd = np.asarray(problem.forward_s, dtype=np.float64)
        bwd = np.asarray(problem.backward_s, dtype=np.float64)
        if not (np.all(np.isfinite(fwd)) and np.all(np.isfinite(bwd)) and fwd.min() >= 0 and bwd.min() >= 0):
            raise UsageError("forward_s and backward_s must be finite and >= 0 for the DP solver")
        for name in (
            "cut_forward_s",
            "cut_backward_s",
            "cut_bytes",
            "param_state_bytes",
            "saved_bytes",
            "transient_bytes",
            "in_flight",
            "grad_bytes",
            "split_held_bytes",
            "cut_grad_bytes",
            "step_bytes",
            "input_transient_bytes",
            "weight_transient_bytes",
        ):
            if any(v < 0 for v in getattr(problem, name)):
                raise UsageError(f"{name} must be >= 0 for the DP solver, got {min(getattr(problem, name))}")
        self.pf = np.concatenate(([0.0], np.cumsum(fwd)))
        self.pfb = np.concatenate(([0.0], np.cumsum(fwd + bwd)))

        def per_cut(values: tuple[float, ...] | tuple[int, ...]) -> np.ndarray:
            return np.asarray(values, dtype=np.float64) if values else np.zeros(n - 1)

        def per_unit(values: tuple[float, ...] | tuple[int, ...]) -> np.ndarray:
            return np.asarray(values, dtype=np.float64) if values else np.zeros(n)

        self.comm = np.concatenate(([0.0], per_cut(problem.cut_forward_s) + per_cut(problem.cut_backward_s)))
        self.stage_input = np.concatenate(([float(problem.input_bytes)], per_cut(problem.cut_bytes)))
        self.stage_in_grad = np.concatenate(([0.0], per_cut(problem.cut_grad_bytes)))
        self.pp = np.concatenate(([0.0], np.cumsum(per_unit(problem.param_state_bytes))))
        self.ps = np.concatenate(([0.0], np.cumsum(per_unit(problem.saved_bytes))))
        arrays: dict[int, np.ndarray] = {}
        self.transient = {
            kind: arrays.setdefault(id(values), per_unit(values)) for kind, values in transient_arrays(problem).items()
        }
        self.pg = np.concatenate(([0.0], np.cumsum(per_unit(problem.grad_bytes))))
        self.pw = np.concatenate(([0.0], np.cumsum(per_unit(problem.split_held_bytes))))
        self.step = per_unit(problem.step_bytes)
        self.pt = np.concatenate(([0.0], np.cumsum(self.step)))
        self.step_add = problem.step_bytes_add
        self.buffer_mb = float(problem.buffer_microbatches)
        # Per last unit j: the gradient of its output a stage ending there receives, and what it holds per
        # micro-batch under recomputation (its output; the loss's for the last unit).
        self.out_grad = np.concatenate((per_cut(problem.cut_grad_bytes), [0.0]))
        self.out_held = np.concatenate((per_cut(problem.cut_bytes), [float(problem.output_held_bytes)]))
        self.allow0 = False in problem.recompute_choices
        self.allow1 = True in problem.recompute_choices
        self.moments = tuple(stage_moments(problem, s) for s in range(p))
        self.capacity = tuple(float(c) for c in problem.capacity_bytes) if problem.capacity_bytes else (math.inf,) * p
        # Stages that share (moments, capacity) share their cost array.
        self.stage_kind: list[_Kind] = [(self.moments[s], self.capacity[s], *local_cuts(problem, s)) for s in range(p)]
        self.kinds = tuple(dict.fromkeys(self.stage_kind))
        # Pins bound where stages end: unit u in stage s ends stage s at u or later and stage s - 1 before u.
        self.end_floor, self.end_ceiling = [0] * p, [n - 1] * p
        for unit, stage in problem.pinned:
            self.end_floor[stage] = max(self.end_floor[stage], unit)
            if stage:
                self.end_ceiling[stage - 1] = min(self.end_ceiling[stage - 1], unit - 1)
        self.band: _Band | None = None
        self._most_bytes: dict[tuple[Moment, ...], float] = {}
        self._largest: tuple[float, ...] | None = None
        self.width_mem = self._memory_width()
        self.cache: dict[float, _Found | None] = {}

    def most_bytes(self, moments: tuple[Moment, ...]) -> float:
        """More than any stage of these moments can hold, whatever its units (every term at its largest): where
        the capacity is above it, memory never binds and no shape need be checked. Kept per moments: every band
        of the bisection asks it again for each kind of stage."""
        if moments not in self._most_bytes:
            self._most_bytes[moments] = self._most_bytes_of(moments)
        return self._most_bytes[moments]

    def _most_bytes_of(self, moments: tuple[Moment, ...]) -> float:
        fixed, held, step, transient, in_grad, out_held = self._largest_terms()
        worst = max(
            (m.waiting + m.split + 1) * held
            + m.split * self.pw[-1]
            + m.sent_grads * in_grad
            + m.sent_outputs * out_held
            + m.done * self.problem.kept_loss_bytes
            for m in moments
        )
        return (fixed + max(step, transient + worst)) * (1 + 1e-9) + 1.0

    def _largest_terms(self) -> tuple[float, ...]:
        """Each term of :meth:`most_bytes` at its largest over the units, made once: ``(fixed, held, step,
        transient, per sent gradient, per sent output)``."""
        if self._largest is None:
            p = self.problem
            out_held = float(self.out_held.max()) if self.out_held.size else 0.0
            held = max(self.ps[-1] + sum(b for _, _, b in p.relays), out_held, self.stage_input.max())
            step = self.pt[-1] if self.step_add else float(self.step.max(initial=0.0))
            transient = max((float(v.max(initial=0.0)) for v in self.transient.values()), default=0.0)
            fixed = self.pp[-1] + self.buffer_mb * (self.stage_input.max() + self.out_grad.max() + p.target_bytes)
            self._largest = (fixed, held, step, transient, self.stage_in_grad.max(), out_held)
        return self._largest

    def _memory_width(self) -> int:
        """Widest stage (in units) that fits in the largest capacity, ignoring transients and inputs."""
        cap = max(self.capacity) * (1 + 1e-9)
        if math.isinf(cap):
            return self.n
        # A stage holds at least its state without gradients, and without recompute the micro-batches of its
        # fullest moment; with it, the one re-materialised (where a moment re-materialises one).
        fullest = min(max(m.waiting + m.split for m in moments) for moments in self.moments)
        acting = min(max(int(m.acting) for m in moments) for moments in self.moments)
        per_mb = fullest if not self.allow1 else min(acting, fullest)
        prefix = (self.pp - self.pg) + per_mb * self.ps
        starts = np.searchsorted(prefix, prefix[1:] - cap, side="left")
        return int(min(self.n, np.max(np.arange(1, self.n + 1) - starts) + 1))

    def loosest_bound(self) -> float:
        """A bound at which every stage that fits in memory is allowed (so a partition exists at it if one exists at
        all): the most compute of any run of units no wider than :meth:`_memory_width`."""
        compute = self.pfb + self.pf if self.allow1 else self.pfb
        width = min(self.width_mem, self.n)
        return float(np.max(compute[width:] - compute[:-width])) * (1 + 1e-9)

    def width_for(self, t_max: float) -> int:
        """Band width that holds every stage with compute <= t_max (plus one for rounding)."""
        if math.isinf(t_max):
            return self.width_mem
        # A little slack makes the band a superset despite rounding; stages are masked exactly later.
        slack = t_max * (1 + 1e-9) + 1e-300
        starts = np.searchsorted(self.pfb[:-1], self.pfb[1:] - slack, side="left")
        width = int(np.max(np.arange(1, self.n + 1) - starts)) + 1
        return max(1, min(self.n, width, self.width_mem))

    def ensure_band(self, width: int) -> _Band:
        if self.band is None or self.band.width < width:
            grown = width if self.band is None else max(width, 2 * self.band.width)
            self.band = _Band(self, min(self.n, grown))
        return self.band

    def candidates(self, low: float, high: float) -> np.ndarray:
        """Sorted distinct stage compute times in ``[low, high]`` that some stage can hold in memory."""
        band = self.ensure_band(self.width_for(high))
        found = []
        for recompute, c in ((False, band.c0), (True, band.c1)):
            fits = np.zeros(c.shape, dtype=bool)
            for kind in self.kinds:
                fits |= band.fits(kind, recompute)
            found.append(c[fits & (c >= low) & (c <= high)])
        return np.unique(np.concatenate(found))

    def solve(self, t_max: float) -> _Found | None:
        """Inner DP: minimal sum of (compute + comm in) with every stage compute <= t_max."""
        if t_max in self.cache:
            return self.cache[t_max]
        n, p = self.n, self.p
        width = self.width_for(t_max)
        band = self.ensure_band(width)
        cols = slice(band.width - width, band.width)
        c0, c1, c0k, c1k = band.c0[:, cols], band.c1[:, cols], band.c0k[:, cols], band.c1k[:, cols]
        # Rows (last unit j of stage s) that lie on some complete partition: the s + 1 stages so far reach j
        # (j < (s + 1) * width) and the p - 1 - s left can still cover the rest (n - 1 - j <= (p - 1 - s) *
        # width). Every other row is infinite, or is only ever the predecessor of rows that cannot complete
        # either, so leaving them out changes no value or choice on a complete partition (it skips most rows
        # when p * width is near n: thousands of units on 64-256 stages, or 2 stages of 1,000 units).
        spans = [
            (n - 1, n - 1) if s == p - 1 else (max(s, n - 1 - (p - 1 - s) * width), min(n - p + s, (s + 1) * width - 1))
            for s in range(p)
        ]
        spans = [
            (max(lo, f), min(hi, c)) for (lo, hi), f, c in zip(spans, self.end_floor, self.end_ceiling, strict=True)
        ]
        if any(lo > hi for lo, hi in spans):
            self.cache[t_max] = None
            return None
        # A stage's cost of each shape (recompute only where the plain stage does not fit, inf where neither
        # fits or exceeds t_max), per kind of stage and only on the rows its stages use.
        kind_rows: dict[_Kind, tuple[int, int]] = {}
        for kind, (lo, hi) in zip(self.stage_kind, spans, strict=True):
            low, high = kind_rows.get(kind, (lo, hi))
            kind_rows[kind] = (min(low, lo), max(high, hi))
        costs: dict[_Kind, tuple[int, np.ndarray]] = {}
        for kind, (lo, hi) in kind_rows.items():
            r = slice(lo, hi + 1)
            fit0 = (c0[r] <= t_max) & band.fits(kind, False)[r, cols]
            fit1 = (c1[r] <= t_max) & band.fits(kind, True)[r, cols]
            costs[kind] = (lo, np.where(fit0, c0k[r], np.where(fit1, c1k[r], np.inf)))
        # padded[width - 1 + i] is the least sum of the stages so far that end just before unit i: before the
        # first stage only i = 0 (nothing placed) is finite, after it i = 0 never is. One view for every
        # stage: each stage rewrites padded in place (no arrays allocated per stage), and the view reads it.
        padded = np.full(n + width - 1, np.inf)
        padded[width - 1] = 0.0
        windows = sliding_window_view(padded, width)
        args = np.zeros((p, n), dtype=np.int64)
        f = np.full(n, np.inf)
        index = np.arange(n)
        for s, (lo, hi) in enumerate(spans):
            first, cost = costs[self.stage_kind[s]]
            rows = slice(lo, hi + 1)
            total = cost[lo - first : hi - first + 1] + windows[rows]
            best = np.argmin(total, axis=1)
            f.fill(np.inf)
            f[rows] = total[index[: hi - lo + 1], best]
            args[s, rows] = best
            padded[width - 1] = np.inf
            padded[width:] = f[:-1]
        result: _Found | None = None
        if math.isfinite(f[n - 1]):
            starts, flags, bottleneck = [], [], 0.0
            j = n - 1
            for s in range(p - 1, -1, -1):
                w = int(args[s, j])
                recompute = not (c0[j, w] <= t_max and band.fits(self.stage_kind[s], False)[j, band.width - width + w])
                bottleneck = max(bottleneck, float(c1[j, w] if recompute else c0[j, w]))
                starts.append(j - width + 1 + w)
                flags.append(recompute)
                j = starts[-1] - 1
            result = _Found(float(f[n - 1]), bottleneck, tuple(reversed(starts)), tuple(reversed(flags)))
        self.cache[t_max] = result
        return result


class _Incumbents:
    """The best ``k`` distinct solutions seen so far."""

    def __init__(self, k: int, num_microbatches: int) -> None:
        self.k, self.m = k, num_microbatches
        self.seen: dict[tuple[tuple[int, ...], tuple[bool, ...]], _Found] = {}

    def add(self, found: _Found | None) -> None:
        if found is not None:
            self.seen.setdefault((found.boundaries, found.recompute), found)

    def ranked(self) -> list[_Found]:
        return sorted(self.seen.values(), key=lambda f: (f.objective_s(self.m), f.boundaries, f.recompute))

    def bound(self, fallback_worst: bool = False) -> float:
        """Objective a new candidate must beat: the k-th best; while fewer are known, infinity
        (or, with ``fallback_worst``, the worst one known, to bound the range of ``t_max`` examined)."""
        ranked = self.ranked()
        if len(ranked) >= self.k:
            return ranked[self.k - 1].objective_s(self.m)
        return ranked[-1].objective_s(self.m) if fallback_worst and ranked else math.inf


def _search(model: _Model, best: _Incumbents) -> None:
    """Examine the bottleneck bounds that can matter (see the module docstring): the least feasible one, an
    upper bound past which none can win, and the candidates between them by branch and bound."""
    c_min = model.pfb if model.allow0 else model.pfb + model.pf
    total = float(c_min[-1])
    cut_comm = np.sort(model.comm[1:])
    sum_low = total + float(np.sum(cut_comm[: model.p - 1]))
    # The whole model as one stage (with recompute if allowed): no stage compute exceeds it.
    t_all = float(model.pfb[-1] + (model.pf[-1] if model.allow1 else 0.0))
    if model.m == 1:
        best.add(model.solve(math.inf))
        return
    # A small problem (its cost mostly Python's) is asked first whether any partition fits at all: one solve at the
    # loosest bound memory leaves, where the gallop would solve a dozen bounds on its way there (a plan search meets
    # many options that no partition fits). A large one is not: that one solve, its band wide open, can cost more
    # than the whole gallop. Not an incumbent: the candidates are the optima of the bounds examined below.
    loosest = model.loosest_bound()
    if model.n * model.width_for(loosest) <= PROBE_CELLS and model.solve(loosest) is None:
        return
    t_min = _least_bottleneck(model, best, c_min, t_all)
    if t_min is None:
        return
    upper = _upper_bound(model, best, t_min, sum_low)
    _branch_and_bound(model, best, t_min, t_all if math.isinf(upper) else upper)


def _least_bottleneck(model: _Model, best: _Incumbents, c_min: np.ndarray, t_all: float) -> float | None:
    """The least bottleneck bound with a feasible partition (None: none up to ``t_all``): gallop upward from the
    lower bound until some bound is feasible, then bisect over the candidates below it."""
    total = float(c_min[-1])
    t_low = max(float(np.diff(c_min).max()), total / model.p) * (1 - 1e-12)
    lo, step = t_low, max(0.05 * t_low, 1e-9 * total, 1e-300)
    hi = min(t_low + step, t_all)
    while (found := model.solve(hi)) is None:
        if hi >= t_all:
            return None
        lo, step = hi, 2 * step
        hi = min(hi + step, t_all)
    best.add(found)
    between = model.candidates(lo, found.bottleneck_s)
    a, b = 0, len(between) - 1  # solve(between[b]) is feasible: it holds found
    while a < b:
        mid = (a + b) // 2
        probe = model.solve(float(between[mid]))
        best.add(probe)
        if probe is None:
            a = mid + 1
        else:
            b = mid
    t_min = float(between[b])
    best.add(model.solve(t_min))
    return t_min


def _upper_bound(model: _Model, best: _Incumbents, t_min: float, sum_low: float) -> float:
    """Bounds above it cannot win: ``(M-1) * t_max + (a lower bound of the sum) >= k-th best`` (inf: no bound
    known yet), tightened by the partition found at it, at most twice."""
    m = model.m
    upper = max(t_min, (best.bound(fallback_worst=True) - sum_low) / (m - 1))
    for _ in range(2):
        if upper <= t_min or math.isinf(upper):
            break
        at_upper = model.solve(upper)
        best.add(at_upper)
        assert at_upper is not None  # feasible at t_min <= upper
        tighter = max(t_min, (best.bound(fallback_worst=True) - at_upper.sum_s) / (m - 1))
        if tighter >= 0.9 * upper:
            upper = tighter
            break
        upper = tighter
    return upper


def _branch_and_bound(model: _Model, best: _Incumbents, t_min: float, upper: float) -> None:
    """Branch and bound over the sorted candidate bounds in ``[t_min, upper]``: an interval whose best possible
    objective (its right end's sum, its left end's bottleneck) cannot beat the k-th best is dropped."""
    m = model.m
    cands = model.candidates(t_min, upper)
    if len(cands) == 0 or cands[0] != t_min:
        cands = np.unique(np.concatenate(([t_min], cands)))
    g: dict[int, float] = {}

    def sum_at(index: int) -> float:
        found = model.solve(float(cands[index]))
        best.add(found)
        assert found is not None
        g[index] = found.sum_s
        return found.sum_s

    last = len(cands) - 1
    sum_at(0)
    sum_at(last)
    heap: list[tuple[float, int, int]] = []

    def push(a: int, b: int) -> None:
        if b - a > 1 and g[a] != g[b]:
            heapq.heappush(heap, (g[b] + (m - 1) * float(cands[a + 1]), a, b))

    push(0, last)
    while heap:
        bound, a, b = heapq.heappop(heap)
        if bound >= best.bound():
            break
        mid = (a + b) // 2
        sum_at(mid)
        # The optimum at cands[mid] has bottleneck <= cands[mid]; g is flat between the two.
        found = model.solve(float(cands[mid]))
        assert found is not None
        flat = int(np.searchsorted(cands, found.bottleneck_s, side="left"))
        if flat > last or cands[flat] != found.bottleneck_s or flat >= mid:
            push(a, mid)
        elif flat > a:
            g[flat] = g[mid]
            push(a, flat)
        # else: the solution at cands[mid] already fits under cands[a], so (a, mid) is flat.
        push(mid, b)


def solve_dp(problem: PartitionProblem, top_k: int = 1) -> list[PartitionSolution]:
    """Solve ``problem`` exactly; return up to ``top_k`` distinct candidates, best first.

    See the module docstring for the method (Alpa, OSDI 2022, Eq. 2-3) and what ``top_k`` means.
    ``objective_s`` and ``bottleneck_s`` of each candidate are recomputed with
    :func:`solvers.problem.evaluate`.

    Raises:
        UsageError: the problem has per-stage speeds or a cap on units per stage (use the ILP solver), negative
            times, a pin out of range, or ``top_k < 1``.
        PlanInfeasibleError: no partition fits in memory and honours the pins.

    Examples:
        >>> p = PartitionProblem(forward_s=(1.0,) * 8, backward_s=(2.0,) * 8, num_stages=4, num_microbatches=4)
        >>> solve_dp(p)[0].boundaries
        (0, 2, 4, 6)
    """
    start = time.perf_counter()
    if not problem.is_homogeneous:
        raise UsageError(
            "the DP solver handles identical stages only; per-stage speed and max units per stage need the ILP "
            "solver (--solver ilp)"
        )
    check_pins(problem)
    if top_k < 1:
        raise UsageError(f"top_k must be >= 1, got {top_k}")
    model = _Model(problem)
    best = _Incumbents(top_k, problem.num_microbatches)
    _search(model, best)
    ranked = best.ranked()
    if not ranked:
        raise PlanInfeasibleError(
            f"no partition of {problem.num_units} units into {problem.num_stages} stages fits in memory"
            f"{' and honours the pins' if problem.pinned else ''}; "
            "add stages, allow recomputation or lower the micro-batch size"
        )
    elapsed = time.perf_counter() - start
    solutions = []
    for found in ranked[:top_k]:
        objective, bottleneck = evaluate(problem, found.boundaries, found.recompute)
        solutions.append(
            PartitionSolution(
                boundaries=found.boundaries,
                recompute=found.recompute,
                objective_s=objective,
                bottleneck_s=bottleneck,
                solver="dp",
                optimal=True,
                gap=0.0,
                solve_s=elapsed,
            )
        )
    solutions.sort(key=lambda sol: (sol.objective_s, sol.boundaries, sol.recompute))
    return solutions


def smallest_plan_bytes(problem: PartitionProblem) -> float:
    """The least memory per stage any partition of ``problem`` needs (its fullest stage), to 0.5 %: the capacity,
    found by bisection, under which :func:`solve_dp` first finds a partition (pins, speeds and caps dropped)."""
    p = problem.num_stages
    single = [
        max(stage_cost(problem, s, u, u, r).memory_bytes for s in range(p) for r in problem.recompute_choices)
        for u in range(problem.num_units)
    ]
    low, high = max(min(single), 1.0), max(sum(single), 1.0)

    def fits(capacity: float) -> bool:
        try:
            solve_dp(replace(problem, capacity_bytes=(capacity,) * p, speed=(), pinned=(), max_units_per_stage=None))
        except PlanInfeasibleError:
            return False
        return True

    while not fits(high):
        high *= 2
    while high - low > 0.005 * high:
        mid = (low + high) / 2
        low, high = (low, mid) if fits(mid) else (mid, high)
    return high
