"""The inner DP of solvers/dp.py: the partition problem as numpy arrays (:class:`InnerDP`) and, for one bound on
every stage's compute, the least sum of the stages' costs over the stage shapes that fit (:meth:`InnerDP.solve`).

The shapes allowed for a bound form a band (:class:`Band`): per last unit ``j``, the starts ``i`` whose compute is
within the bound, one ``n x W`` array per term; each shape's compute, and whether it fits in memory as a kind of stage
(its moments, capacity and local cuts), with :func:`solvers.problem.stage_memory_peak`'s formula on arrays. The
search over bounds that calls it is solvers/dp.py's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from planner.errors import UsageError
from solvers.problem import Moment, PartitionProblem, acting_kind, local_cuts, stage_moments, transient_arrays

__all__ = ["Band", "Found", "InnerDP", "StageKind"]

StageKind = tuple[tuple[Moment, ...], float, bool, bool]
"""What a stage's memory depends on besides its units: its moments, its capacity, and whether its input and its
output are handed over in memory (no receive buffers there)."""


@dataclass(frozen=True)
class _MomentTerms:
    """A stage kind's moments as columns along a first axis (shape ``(K, 1, 1)``), for :meth:`Band._fits`. A count
    that is 0 at every moment is None, and so are the gradients where every moment holds them: each term they would
    add is exactly 0, and most stages' moments hold no split backward, no loss and every gradient."""

    waiting: np.ndarray
    split: np.ndarray | None
    done: np.ndarray | None
    held_output: np.ndarray | None
    sent_grads: np.ndarray
    sent_outputs: np.ndarray
    grads: np.ndarray | None
    acting: np.ndarray
    by_kind: tuple[tuple[str, np.ndarray], ...]
    """Per acting kind (whose working memory, :func:`acting_kind`), the moments' rows."""


@lru_cache(maxsize=4096)
def _moment_terms(moments: tuple[Moment, ...], recompute: bool) -> _MomentTerms:
    def column(values: list[float] | list[bool]) -> np.ndarray:
        return np.asarray(values)[:, None, None]

    def counts(values: list[float]) -> np.ndarray | None:
        return column(values) if any(values) else None

    kinds = [acting_kind(m, recompute) for m in moments]
    return _MomentTerms(
        waiting=column([float(m.waiting) for m in moments]),
        split=counts([float(m.split) for m in moments]),
        done=counts([float(m.done) for m in moments]),
        held_output=counts([float(m.held_output) for m in moments]),
        sent_grads=column([float(m.sent_grads) for m in moments]),
        sent_outputs=column([float(m.sent_outputs) for m in moments]),
        grads=None if all(m.grads for m in moments) else column([bool(m.grads) for m in moments]),
        acting=column([bool(m.acting) for m in moments]),
        by_kind=tuple((k, np.asarray([r for r, kk in enumerate(kinds) if kk == k])) for k in dict.fromkeys(kinds)),
    )


class Band:
    """Per-shape arrays for stages that end at unit ``j`` and start at ``i = j - W + 1 + w``."""

    def __init__(self, model: InnerDP, width: int) -> None:
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
        self.fit0: dict[StageKind, np.ndarray] = {}
        self.fit1: dict[StageKind, np.ndarray] = {}

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
        self.latest_output = last * float(model.problem.latest_output_bytes)
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
            base = self.state + buffers
            memory = base + self.step
            held_past = held + self.split_held
            self._stage_terms_by[key] = (held, held_past, remat, sent_grad, sent_output, base, memory)
        return self._stage_terms_by[key]

    def _fits(self, kind: StageKind, recompute: bool) -> np.ndarray:
        moments, cap, local_in, local_out = kind
        if math.isinf(cap) or self.model.most_bytes(moments) <= cap:
            return self.valid & (self.model.allow1 if recompute else self.model.allow0)
        held, held_past, remat, sent_grad, sent_output, base, memory = self._stage_terms(recompute, local_in, local_out)
        # Every moment at once, along a first axis: the same operations in the same order as one moment at a time
        # (so the same sums to the last bit), a dozen numpy calls a kind instead of a dozen a moment.
        terms = _moment_terms(moments, recompute)
        # The terms in the order of solvers.problem.stage_memory_peak's sum; one that is 0 everywhere is left out (x + 0
        # is x), so the sums are the same to the last bit.
        activations = terms.waiting * held
        if terms.split is not None and not recompute:
            activations = activations + terms.split * held_past
        activations = activations + np.where(terms.acting, remat, 0.0)
        if terms.done is not None:
            activations = activations + terms.done * self.kept_loss
        if terms.held_output is not None:
            activations = activations + terms.held_output * self.latest_output
        sends = terms.sent_grads * sent_grad + terms.sent_outputs * sent_output
        if terms.grads is not None:
            base = base - np.where(terms.grads, 0.0, self.grads)
        here = base + activations + sends
        for acting_kind_, rows in terms.by_kind:
            memory = np.maximum(memory, (here[rows] + self.transient[acting_kind_]).max(axis=0))
        allowed = self.model.allow1 if recompute else self.model.allow0
        return self.valid & allowed & (memory <= cap)

    def fits(self, kind: StageKind, recompute: bool) -> np.ndarray:
        """Which shapes fit a stage of ``kind`` (with or without recomputation); computed once per kind."""
        table = self.fit1 if recompute else self.fit0
        if kind not in table:
            table[kind] = self._fits(kind, recompute)
        return table[kind]


@dataclass(frozen=True)
class Found:
    """One inner-DP optimum for a bound ``t_max``."""

    sum_s: float
    bottleneck_s: float
    boundaries: tuple[int, ...]
    recompute: tuple[bool, ...]

    def objective_s(self, num_microbatches: int) -> float:
        return self.sum_s + (num_microbatches - 1) * self.bottleneck_s


class InnerDP:
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
        # A stage's least compute: its forward and backward, with its forward again where it must recompute.
        self.c_min = self.pfb if self.allow0 else self.pfb + self.pf
        self.moments = tuple(stage_moments(problem, s) for s in range(p))
        self.capacity = tuple(float(c) for c in problem.capacity_bytes) if problem.capacity_bytes else (math.inf,) * p
        # Stages that share (moments, capacity) share their cost array.
        self.stage_kind: list[StageKind] = [
            (self.moments[s], self.capacity[s], *local_cuts(problem, s)) for s in range(p)
        ]
        self.kinds = tuple(dict.fromkeys(self.stage_kind))
        # Pins bound where stages end: unit u in stage s ends stage s at u or later and stage s - 1 before u.
        self.end_floor, self.end_ceiling = [0] * p, [n - 1] * p
        for unit, stage in problem.pinned:
            self.end_floor[stage] = max(self.end_floor[stage], unit)
            if stage:
                self.end_ceiling[stage - 1] = min(self.end_ceiling[stage - 1], unit - 1)
        self.band: Band | None = None
        self._most_bytes: dict[tuple[Moment, ...], float] = {}
        self._largest: tuple[float, ...] | None = None
        self.width_mem = self._memory_width()
        self.cache: dict[float, Found | None] = {}

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
            + m.held_output * self.problem.latest_output_bytes
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

    def ensure_band(self, width: int) -> Band:
        if self.band is None or self.band.width < width:
            grown = width if self.band is None else max(width, 2 * self.band.width)
            self.band = Band(self, min(self.n, grown))
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

    def _reach(self, t_max: float, width: int) -> list[tuple[int, int]]:
        """Per stage, the earliest and latest unit it can end at on a partition whose every stage is at most
        ``width`` units and ``t_max`` of compute (its least: recomputation only where the plain stage is not
        allowed), memory aside: the latest is where the stages so far reach taking each as far as it can go, the
        earliest where the stages left reach back from the end likewise (a greedy run's reach is the farthest any
        partition's is, as every sub-run of an allowed stage is allowed). With the bisection's bounds near the
        optimum the two close in, and the DP fills only the rows between them."""
        n, p, prefix = self.n, self.p, self.c_min
        slack = t_max * (1 + 1e-9) + 1e-300  # a superset of the shapes allowed, as width_for's
        cuts = np.arange(n + 1)
        # Per start, the end (exclusive) of the longest stage from it; per end, the start of the longest stage to it.
        ends = np.minimum(np.searchsorted(prefix, prefix + slack, side="right") - 1, cuts + width).tolist()
        starts = np.maximum(np.searchsorted(prefix, prefix - slack, side="left"), cuts - width).tolist()
        latest, start = [], 0
        for _ in range(p):
            end = min(ends[start], n)
            latest.append(end - 1)
            start = max(end, start)
        earliest, stop = [n - 1] * p, n
        for s in range(p - 1, 0, -1):
            stop = max(starts[stop], 0)
            earliest[s - 1] = stop - 1
        return list(zip(earliest, latest, strict=True))

    def solve(self, t_max: float) -> Found | None:
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
            (max(lo, f, early), min(hi, c, late))
            for (lo, hi), f, c, (early, late) in zip(
                spans, self.end_floor, self.end_ceiling, self._reach(t_max, width), strict=True
            )
        ]
        if any(lo > hi for lo, hi in spans):
            self.cache[t_max] = None
            return None
        # A stage's cost of each shape (recompute only where the plain stage does not fit, inf where neither
        # fits or exceeds t_max), per kind of stage and only on the rows its stages use.
        kind_rows: dict[StageKind, tuple[int, int]] = {}
        for kind, (lo, hi) in zip(self.stage_kind, spans, strict=True):
            low, high = kind_rows.get(kind, (lo, hi))
            kind_rows[kind] = (min(low, lo), max(high, hi))
        costs: dict[StageKind, tuple[int, np.ndarray]] = {}
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
        index = np.arange(n)
        last = math.inf
        for s, (lo, hi) in enumerate(spans):
            first, cost = costs[self.stage_kind[s]]
            total = cost[lo - first : hi - first + 1] + windows[lo : hi + 1]
            best = total.argmin(axis=1)
            args[s, lo : hi + 1] = best
            least = total[index[: hi - lo + 1], best]
            # The stage's least sums become the next stage's "ends just before unit j + 1" (padded[width + j]):
            # written straight into padded, the rows off this stage's span infinite; the last unit's is the answer.
            padded[width - 1 :] = np.inf
            end = min(hi, n - 2)
            if end >= lo:
                padded[width + lo : width + end + 1] = least[: end - lo + 1]
            last = float(least[-1]) if hi == n - 1 else math.inf
        result: Found | None = None
        if math.isfinite(last):
            starts, flags, bottleneck = [], [], 0.0
            j = n - 1
            for s in range(p - 1, -1, -1):
                w = int(args[s, j])
                recompute = not (c0[j, w] <= t_max and band.fits(self.stage_kind[s], False)[j, band.width - width + w])
                bottleneck = max(bottleneck, float(c1[j, w] if recompute else c0[j, w]))
                starts.append(j - width + 1 + w)
                flags.append(recompute)
                j = starts[-1] - 1
            result = Found(last, bottleneck, tuple(reversed(starts)), tuple(reversed(flags)))
        self.cache[t_max] = result
        return result
