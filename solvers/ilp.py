"""The partition problem as a mixed-integer linear program (pulp; HiGHS or CBC).

Same objective and memory rule as :func:`solvers.problem.evaluate`, plus what the DP cannot do:
per-stage device ``speed``, ``pinned`` (unit, stage) pairs and ``max_units_per_stage``.

Formulation (contiguous by construction, so the LP relaxation stays tight):

- ``y[u,s] = 1`` iff unit ``u`` sits in a stage ``<= s``; non-increasing in ``u``, non-decreasing in
  ``s``, ``y[u,P-1] = 1``. Unit ``u`` can only be in stages ``P-n+u .. u``, which fixes many ``y``.
  Membership is ``x[u,s] = y[u,s] - y[u,s-1]``; every stage holds at least one unit.
- stage ``s >= 1`` starts at unit ``u`` iff ``y[u-1,s-1] - y[u,s-1] = 1`` (stages are non-empty), so
  the communication into a stage and its input bytes are linear in ``y``: no extra variables.
- recompute ``r[s]`` binary (fixed when only one choice is allowed); its extra forward time
  ``w[s] >= F_s - F_total * (1 - r[s])``, ``w >= 0`` linearises ``r[s] * F_s``;
- ``c_s = (F_s + B_s + w_s) / speed_s``; ``T >= c_s``; minimise ``sum_s (c_s + k_s) + (M-1) T``;
- memory per stage with big-M on ``r[s]`` (rows scaled by the capacity), transient as
  ``h_s >= transient_u * x[u,s]``.

Times are divided by the total compute and bytes by the stage capacity, so coefficients are O(1).
The returned partition is re-scored with :func:`~solvers.problem.evaluate` (exact, not the solver's
float), after choosing per stage the cheapest recompute flag that fits.
"""

from __future__ import annotations

import math
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import pulp

from planner.errors import PlanInfeasibleError, SolverError, UsageError
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
from solvers.quiet import quiet_stdout

__all__ = ["solve_ilp", "BACKENDS"]

BACKENDS = ("auto", "highs", "cbc")

_Term = pulp.LpVariable | int


def _solver(backend: str, time_limit_s: float) -> tuple[str, pulp.LpSolver]:
    if backend not in BACKENDS:
        raise UsageError(f"unknown ILP backend {backend!r}; choose one of {', '.join(BACKENDS)}")
    if backend == "auto":
        backend = "highs" if pulp.HiGHS().available() else "cbc"
    if backend == "highs":
        if not pulp.HiGHS().available():
            raise UsageError("ILP backend 'highs' needs the highspy package; pip install highspy or use --backend cbc")
        return backend, pulp.HiGHS(msg=False, timeLimit=time_limit_s, gapRel=0.0, gapAbs=0.0, threads=1)
    with warnings.catch_warnings():
        # pulp 3.3 deprecates the bundled CBC for 4.0; it is still the one that needs no install.
        warnings.simplefilter("ignore", DeprecationWarning)
        return backend, pulp.PULP_CBC_CMD(msg=False, timeLimit=time_limit_s, gapRel=0.0, gapAbs=0.0, threads=1)


def _var(prob: pulp.LpProblem, name: str, lowBound: float | None = None, cat: str = "Continuous") -> pulp.LpVariable:
    # pulp >= 3.3 attaches variables to the model (direct construction is deprecated there).
    if hasattr(prob, "add_variable"):
        return prob.add_variable(name, lowBound=lowBound, cat=cat)
    return pulp.LpVariable(name, lowBound=lowBound, cat=cat)


def _expr(terms: Iterable[tuple[float, _Term]], constant: float = 0.0) -> pulp.LpAffineExpression:
    """``constant + sum(coef * term)`` where a term is a variable or a fixed 0/1."""
    coefs: dict[pulp.LpVariable, float] = {}
    for coef, term in terms:
        if coef == 0:
            continue
        if isinstance(term, int):
            constant += coef * term
        else:
            coefs[term] = coefs.get(term, 0.0) + coef
    return pulp.LpAffineExpression(list(coefs.items()), constant=constant)


def _largest(
    prob: pulp.LpProblem,
    name: str,
    values: tuple[int, ...],
    s: int,
    scale: float,
    member: Callable[[int, int], list[tuple[float, _Term]]],
) -> list[tuple[float, _Term]]:
    """A variable at least the largest ``values[u]`` of stage ``s``'s units (0 terms when all are 0)."""
    if not values or max(values) <= 0:
        return []
    peak = _var(prob, name, lowBound=0)
    for u, v in enumerate(values):
        if v:
            prob += _expr([(1.0, peak)] + [(-v / scale * c, t) for c, t in member(u, s)]) >= 0
    return [(1.0, peak)]


class _Assignment:
    """The formulation's ``y[u, s]`` (unit ``u`` in a stage ``<= s``) and the linear terms made of them.

    A term is ``(coefficient, variable or fixed 0/1)``; fixed entries of ``y`` are ints, so the rows only hold
    the variables that can move."""

    def __init__(self, prob: pulp.LpProblem, num_units: int, num_stages: int) -> None:
        n, p = num_units, num_stages
        self.prob, self.num_units = prob, n
        y: dict[tuple[int, int], _Term] = {}
        for u in range(n):
            for s in range(-1, p):
                if s == -1:
                    y[u, s] = 0
                elif s >= u or s == p - 1:
                    y[u, s] = 1  # units before u fill at most u stages
                elif s < p - n + u:
                    y[u, s] = 0  # the n - u units from u on need the remaining stages
                else:
                    y[u, s] = _var(prob, f"y_{u}_{s}", cat=pulp.LpBinary)
        # Non-increasing in u, non-decreasing in s: contiguous stages.
        for u in range(n):
            for s in range(p - 1):
                if u + 1 < n and not (isinstance(y[u + 1, s], int) and isinstance(y[u, s], int)):
                    prob += _expr([(1, y[u + 1, s]), (-1, y[u, s])]) <= 0
                if s + 1 < p - 1 and not (isinstance(y[u, s], int) and isinstance(y[u, s + 1], int)):
                    prob += _expr([(1, y[u, s]), (-1, y[u, s + 1])]) <= 0
        self.y = y

    def member(self, u: int, s: int) -> list[tuple[float, _Term]]:
        """``x[u, s]``: unit ``u`` sits in stage ``s``."""
        return [(1.0, self.y[u, s]), (-1.0, self.y[u, s - 1])]

    def summed(self, values: tuple, s: int, scale: float) -> list[tuple[float, _Term]]:
        """``sum(values[u] for u in stage s) / scale`` (no terms for no values)."""
        if not values:
            return []
        return [(c * values[u] / scale, t) for u in range(self.num_units) for c, t in self.member(u, s)]

    def starts(self, values_at_cut: list[float], s: int, scale: float) -> list[tuple[float, _Term]]:
        """Linear ``values_at_cut[u-1] / scale`` of the unit where stage s >= 1 starts."""
        y = self.y
        terms: list[tuple[float, _Term]] = []
        for u in range(1, self.num_units):
            v = values_at_cut[u - 1] / scale
            terms += [(v, y[u - 1, s - 1]), (-v, y[u, s - 1])]
        return terms


class _StageEnds:
    """What crosses the cuts around stage ``s``, per micro-batch, as terms scaled by ``scale``."""

    def __init__(self, problem: PartitionProblem, assign: _Assignment, s: int, scale: float) -> None:
        n = problem.num_units

        def at_cut(values: tuple, k: int) -> float:
            return float(values[k]) if values else 0.0

        self.problem, self.assign, self.s, self.scale = problem, assign, s, scale
        self.last = s == problem.num_stages - 1
        self.cut_bytes = [at_cut(problem.cut_bytes, k) for k in range(n - 1)]
        self.cut_grads = [at_cut(problem.cut_grad_bytes, k) for k in range(n - 1)]

    def stage_input(self, per_mb: float) -> list[tuple[float, _Term]]:
        """``per_mb`` times the bytes of the stage's input (the model's input for the first stage)."""
        if self.s == 0:
            return [(per_mb * self.problem.input_bytes / self.scale, 1)]
        return [(per_mb * c, t) for c, t in self.assign.starts(self.cut_bytes, self.s, self.scale)]

    def stage_end(self, values: list[float], last_value: float) -> list[tuple[float, _Term]]:
        """Linear ``values[j]`` of the unit ``j`` where stage ``s`` ends (``last_value`` for the model's last)."""
        if self.last:
            return [(last_value / self.scale, 1)]
        return self.assign.starts(values, self.s + 1, self.scale)


@dataclass(frozen=True)
class _MemoryTerms:
    """Stage ``s``'s memory as linear terms scaled by its capacity (:func:`solvers.problem.stage_memory_peak`'s
    parts), with the bounds of their left sides that big-M rows need."""

    state: list[tuple[float, _Term]]
    grads: list[tuple[float, _Term]]
    saved: list[tuple[float, _Term]]
    split_held: list[tuple[float, _Term]]
    buffers: list[tuple[float, _Term]]
    step: list[tuple[float, _Term]]
    handed: list[tuple[float, _Term]]
    """Negative: a stage handing its output over on its rank holds it no more."""
    sent_grad: list[tuple[float, _Term]]
    sent_output: list[tuple[float, _Term]]
    relayed: list[tuple[float, _Term]]
    transient: dict[str, list[tuple[float, _Term]]]
    local_in: bool
    kept_loss: float
    top: float
    """A bound on a row's left side before what varies per moment."""
    relayed_all: float
    saved_all: float
    split_all: float
    most_held: float


def _memory_rows(problem: PartitionProblem, assign: _Assignment, s: int, r: _Term, cap: float) -> None:
    """Stage ``s`` fits in ``cap``: one row for the step's tail and one per moment and recompute choice, the
    terms of :func:`solvers.problem.stage_memory_peak`, linear in the assignment (rows scaled by ``cap``)."""
    prob = assign.prob
    scale = cap if cap > 0 else 1.0
    choices = set(problem.recompute_choices)
    ends = _StageEnds(problem, assign, s, scale)
    terms = _memory_terms(problem, assign, ends)
    steady = terms.state + terms.buffers + terms.step
    if problem.split_backward and terms.local_in and terms.relayed:
        # Not recomputing, a relayed gradient is the buffer it came in, kept by the stage before (stage_memory_peak).
        passed = [(-problem.buffer_microbatches * c, t) for c, t in terms.relayed]
        if False in choices:
            _add_row(prob, r, steady + passed, False, terms.top)
        if True in choices:
            _add_row(prob, r, steady, True, terms.top)
    else:
        _add_row(prob, r, steady, None, terms.top)
    max_grads, max_bytes = max(ends.cut_grads, default=0), max(ends.cut_bytes, default=0)
    # The last stage's latest output, which the schedule's loop still references at some moments past I.
    latest = problem.latest_output_bytes / scale if ends.last else 0.0
    for m in stage_moments(problem, s):
        sends = [(m.sent_grads * c, t) for c, t in terms.sent_grad] + [
            (m.sent_outputs * c, t) for c, t in terms.sent_output
        ]
        sends += [(m.done * terms.kept_loss, 1)] if terms.kept_loss else []
        sends += [(m.held_output * latest, 1)] if m.held_output and latest else []
        most_sent = (m.sent_grads * max_grads + m.sent_outputs * max_bytes) / scale
        most_sent += m.done * terms.kept_loss + m.held_output * latest
        if False in choices:
            _add_row(prob, r, *_kept_row(problem, terms, m, sends, most_sent))
        if True in choices:
            _add_row(prob, r, *_recompute_row(problem, ends, terms, m, sends, most_sent))


def _memory_terms(problem: PartitionProblem, assign: _Assignment, ends: _StageEnds) -> _MemoryTerms:
    """Stage ``ends.s``'s memory terms; adds the variables (and their rows) that linearise relays and peaks."""
    n, s, scale = problem.num_units, ends.s, ends.scale
    cut_bytes, cut_grads = ends.cut_bytes, ends.cut_grads
    local_in, local_out = local_cuts(problem, s)
    buffers = ends.stage_input(problem.buffer_microbatches)
    buffers += [(problem.buffer_microbatches * c, t) for c, t in ends.stage_end(cut_grads, 0.0)]
    # The last stage's own: the step's target (with its buffers) and the losses of finished micro-batches.
    kept_loss = problem.kept_loss_bytes / scale if ends.last else 0.0
    if ends.last and problem.target_bytes:
        buffers.append((problem.buffer_microbatches * problem.target_bytes / scale, 1))
    relayed = _relayed(problem, assign, s, scale)
    # The last stage lets the model's output go at I (split_held for it is less that output).
    split = assign.summed(problem.split_held_bytes, s, scale)
    split_held = split + ([(-problem.final_output_bytes / scale, 1)] if ends.last else [])
    transient = _transient(problem, assign, ends)
    if problem.step_bytes_add:
        step = assign.summed(problem.step_bytes, s, scale)
    else:
        step = _largest(assign.prob, f"o_{s}", problem.step_bytes, s, scale, assign.member)
    # Big-M for a row that holds only under one recompute choice: a bound on its left side.
    top = (
        sum(problem.param_state_bytes)
        + max((max(v, default=0) for v in transient_arrays(problem).values()), default=0)
        + max(problem.step_bytes, default=0) * (n if problem.step_bytes_add else 1)
        + problem.buffer_microbatches
        * (max([problem.input_bytes, *cut_bytes]) + max(cut_grads, default=0) + problem.target_bytes)
    ) / scale
    return _MemoryTerms(
        state=assign.summed(problem.param_state_bytes, s, scale),
        grads=assign.summed(problem.grad_bytes, s, scale),
        saved=assign.summed(problem.saved_bytes, s, scale),
        split_held=split_held,
        buffers=buffers,
        step=step,
        handed=[(-c, t) for c, t in ends.stage_end(cut_bytes, 0.0)] if local_out else [],
        # What sends hold: the stage's input's gradients and its outputs (solvers.problem.stage_memory_peak).
        sent_grad=[] if (local_in or s == 0) else assign.starts(cut_grads, s, scale),
        sent_output=[] if local_out else ends.stage_end(cut_bytes, 0.0),
        relayed=relayed,
        transient=transient,
        local_in=local_in,
        kept_loss=kept_loss,
        top=top,
        relayed_all=sum(b for _, _, b in problem.relays) / scale,
        saved_all=sum(problem.saved_bytes) / scale,
        split_all=sum(problem.split_held_bytes) / scale,
        most_held=max([problem.input_bytes, *cut_bytes, problem.output_held_bytes]) / scale,
    )


def _relayed(problem: PartitionProblem, assign: _Assignment, s: int, scale: float) -> list[tuple[float, _Term]]:
    """The tensors relayed through stage ``s`` (made before it, read after it): max(0, made before - read within),
    the product of the two for binaries, linear since it enters only with positive coefficients."""
    prob, y = assign.prob, assign.y
    relayed: list[tuple[float, _Term]] = []
    for k, (producer, consumer, nbytes) in enumerate(problem.relays):
        if s == 0:
            continue
        # Read by no unit (its consumer past the last): relayed by every stage after its maker's, as
        # solvers.problem.relayed_bytes has it.
        read = [] if consumer >= problem.num_units else [(1.0, y[consumer, s])]
        z = _var(prob, f"z_{k}_{s}", lowBound=0)
        prob.addConstraint(_expr([(1.0, z), (-1.0, y[producer, s - 1]), *read]) >= 0)
        if problem.split_backward:
            # It also enters with negative coefficients below: exactly the product, not only a lower bound.
            prob.addConstraint(_expr([(1.0, z), (-1.0, y[producer, s - 1])]) <= 0)
            if read:
                prob.addConstraint(_expr([(1.0, z), *read]) <= 1)
        relayed.append((nbytes / scale, z))
    return relayed


def _transient(problem: PartitionProblem, assign: _Assignment, ends: _StageEnds) -> dict[str, list]:
    """Per kind of action, the stage's largest transient: max over its units of (T_u + held by the units from u
    on), less what the stage holds at its end (the units after its last)."""
    n, s, scale = problem.num_units, ends.s, ends.scale
    prefix = [0]
    for v in problem.saved_bytes or (0,) * n:
        prefix.append(prefix[-1] + v)
    held_to_end = [(-c, t) for c, t in ends.stage_end([float(prefix[k + 1]) for k in range(n - 1)], float(prefix[n]))]
    return {
        kind: (
            _largest(
                assign.prob,
                f"h{kind}_{s}",
                tuple(v + prefix[u + 1] for u, v in enumerate(values)),
                s,
                scale,
                assign.member,
            )
            + held_to_end
            if values
            else []
        )
        for kind, values in transient_arrays(problem).items()
    }


def _kept_row(
    problem: PartitionProblem, terms: _MemoryTerms, m: Moment, sends: list[tuple[float, _Term]], most_sent: float
) -> tuple[list[tuple[float, _Term]], bool, float]:
    """The row of moment ``m`` without recomputation: every waiting or split micro-batch holds its activations."""
    no_grads = [] if m.grads else [(-c, t) for c, t in terms.grads]
    base = terms.state + terms.buffers + sends + terms.transient[acting_kind(m, False)]
    if problem.split_backward:  # a relayed gradient is the buffer it came in (stage_memory_peak)
        times = problem.buffer_microbatches if terms.local_in else m.sent_grads
        base = base + [(-times * c, t) for c, t in terms.relayed]
    held = terms.saved + terms.relayed + terms.handed
    lhs = base + no_grads + [((m.waiting + m.split) * c, t) for c, t in held]
    lhs += [(m.split * c, t) for c, t in terms.split_held]
    bound = (
        terms.top
        + most_sent
        + (m.waiting + m.split) * (terms.saved_all + terms.relayed_all)
        + m.split * terms.split_all
    )
    return lhs, False, bound


def _recompute_row(
    problem: PartitionProblem,
    ends: _StageEnds,
    terms: _MemoryTerms,
    m: Moment,
    sends: list[tuple[float, _Term]],
    most_sent: float,
) -> tuple[list[tuple[float, _Term]], bool, float]:
    """The row of moment ``m`` with recomputation: a waiting micro-batch holds only its stage's input (or, with
    buffers, its output), the acting one re-materialises its forward."""
    # A recomputing stage runs its whole backward in I: nothing past it is held.
    remat = list(terms.saved)
    if problem.buffer_microbatches:
        held = ends.stage_end(ends.cut_bytes, problem.output_held_bytes)
        if ends.last:  # the loss runs after the checkpointed stage: not re-materialised
            remat.append((-problem.output_held_bytes / ends.scale, 1))
        elif problem.unit_output_bytes:  # the last unit's outputs, let go before the backward peaks
            own = [float(v) for v in problem.unit_output_bytes[:-1]]
            remat += [(-c, t) for c, t in ends.stage_end(own, 0.0)]
    else:
        held = ends.stage_input(1)
    no_grads = [] if m.grads else [(-c, t) for c, t in terms.grads]
    base = terms.state + terms.buffers + sends + terms.transient[acting_kind(m, True)]
    lhs = base + no_grads + [(m.waiting * c, t) for c, t in held + terms.handed]
    lhs += [(int(m.acting) * c, t) for c, t in remat]
    return lhs, True, terms.top + most_sent + m.waiting * terms.most_held + terms.saved_all


def _add_row(prob: pulp.LpProblem, r: _Term, lhs: list[tuple[float, _Term]], when: bool | None, bound: float) -> None:
    """``lhs <= 1`` (the capacity, scaled), always (``when`` None) or only where the recompute flag ``r == when``
    (big-M on ``r``, ``bound`` bounding ``lhs``)."""
    if isinstance(r, int) or when is None:
        if when is None or bool(r) == when:
            prob.addConstraint(_expr(lhs) <= 1.0)
        return
    big = max(0.0, bound - 1.0)
    if when:
        prob.addConstraint(_expr(lhs + [(big, r)]) <= 1.0 + big)
    else:
        prob.addConstraint(_expr(lhs + [(-big, r)]) <= 1.0)


def _check(problem: PartitionProblem) -> None:
    n, p = problem.num_units, problem.num_stages
    if problem.speed and min(problem.speed) <= 0:
        raise UsageError(f"every stage speed must be > 0, got {min(problem.speed)}")
    check_pins(problem)
    if problem.max_units_per_stage is not None and problem.max_units_per_stage * p < n:
        raise PlanInfeasibleError(
            f"{p} stages of at most {problem.max_units_per_stage} units cannot hold {n} units; "
            "raise max units per stage or add stages"
        )


def _best_flags(problem: PartitionProblem, boundaries: tuple[int, ...], flags: list[bool]) -> tuple[bool, ...]:
    """Per stage the cheapest allowed recompute flag that fits (the solver's flag if none fits)."""
    ends = (*boundaries[1:], problem.num_units)
    chosen = []
    for s, (first, end) in enumerate(zip(boundaries, ends, strict=True)):
        fits = [r for r in sorted(problem.recompute_choices) if stage_cost(problem, s, first, end - 1, r).feasible]
        chosen.append(fits[0] if fits else flags[s])
    return tuple(chosen)


def solve_ilp(problem: PartitionProblem, time_limit_s: float = 60.0, backend: str = "auto") -> PartitionSolution:
    """Solve ``problem`` as a MILP with ``backend`` ("highs", "cbc" or "auto": HiGHS when available).

    Returns the solver's best partition; ``optimal`` tells whether it was proven optimal, ``gap`` is
    the relative MIP gap (0.0 when proven, ``None`` when the backend does not report it) and
    ``solve_s`` the wall time including model building.

    Raises:
        UsageError: an unknown backend, a non-positive time limit or speed, a pin out of range.
        PlanInfeasibleError: no partition satisfies memory, pins and unit caps.
        SolverError: the time limit passed before any feasible partition was found.

    Examples:
        >>> p = PartitionProblem(forward_s=(1.0,) * 6, backward_s=(2.0,) * 6, num_stages=2,
        ...                      num_microbatches=4, speed=(2.0, 1.0))
        >>> solve_ilp(p).boundaries
        (0, 4)
    """
    start = time.perf_counter()
    if not time_limit_s > 0:
        raise UsageError(f"time limit must be > 0 seconds, got {time_limit_s}")
    name, solver = _solver(backend, time_limit_s)
    _check(problem)
    prob = pulp.LpProblem("pipeplan_partition", pulp.LpMinimize)
    assign = _Assignment(prob, problem.num_units, problem.num_stages)
    _stage_rows(problem, assign)
    _pin(problem, assign)
    with quiet_stdout():
        prob.solve(solver)
    proven = _check_status(problem, prob, time_limit_s)
    boundaries = _boundaries(problem, assign)
    recompute = _best_flags(problem, boundaries, _solver_flags(problem, prob))
    objective, bottleneck_s = evaluate(problem, boundaries, recompute)
    if not math.isfinite(objective):
        raise SolverError(
            f"the ILP's partition {boundaries} does not fit in memory when checked exactly (solver tolerance); "
            "use --solver dp or loosen the capacity slightly"
        )
    gap: float | None = 0.0 if proven else None
    if name == "highs" and not proven:
        info_gap = prob.solverModel.getInfo().mip_gap
        gap = float(info_gap) if math.isfinite(info_gap) else None
    return PartitionSolution(
        boundaries=boundaries,
        recompute=recompute,
        objective_s=objective,
        bottleneck_s=bottleneck_s,
        solver=f"ilp-{name}",
        optimal=proven,
        gap=gap,
        solve_s=time.perf_counter() - start,
    )


def _stage_rows(problem: PartitionProblem, assign: _Assignment) -> None:
    """Per stage: non-empty (and capped), its compute under the bottleneck ``T``, its memory; then the objective
    ``sum_s (c_s + k_s) + (M-1) T`` and a valid cut on ``T``. Times are divided by the total compute."""
    prob, y = assign.prob, assign.y
    n, p, m = problem.num_units, problem.num_stages, problem.num_microbatches
    fwd, bwd = problem.forward_s, problem.backward_s
    speed = problem.speed or (1.0,) * p
    scale_s = math.fsum(fwd) + math.fsum(bwd) or 1.0

    def at(values: tuple, k: int) -> float:
        return values[k] if values else 0

    total_f = math.fsum(fwd)
    bottleneck = _var(prob, "T", lowBound=0)
    choices = set(problem.recompute_choices)
    objective_terms: list[tuple[float, _Term]] = [((m - 1), bottleneck)]
    comm = [at(problem.cut_forward_s, k) + at(problem.cut_backward_s, k) for k in range(n - 1)]
    for s in range(p):
        prob += _expr([(1, y[u, s]) for u in range(n)] + [(-1, y[u, s - 1]) for u in range(n)]) >= 1
        if problem.max_units_per_stage is not None:
            prob += _expr([(1, y[u, s]) for u in range(n)] + [(-1, y[u, s - 1]) for u in range(n)]) <= (
                problem.max_units_per_stage
            )
        r: _Term = _var(prob, f"r_{s}", cat=pulp.LpBinary) if len(choices) == 2 else int(next(iter(choices)))
        forward = assign.summed(fwd, s, scale_s)
        compute = forward + assign.summed(bwd, s, scale_s)
        if isinstance(r, int):
            compute += forward if r else []
        else:
            # Recomputation's extra forward r * F_s, linearised: w >= F_s - F_total (1 - r), w >= 0.
            extra = _var(prob, f"w_{s}", lowBound=0)
            prob += extra >= _expr(forward + [(total_f / scale_s, r)], -total_f / scale_s)
            compute.append((1.0, extra))
        compute = [(c / speed[s], t) for c, t in compute]
        prob += _expr([(1.0, bottleneck)] + [(-c, t) for c, t in compute]) >= 0
        objective_terms += compute
        if s > 0:
            objective_terms += assign.starts(comm, s, scale_s)
        cap = problem.capacity_bytes[s] if problem.capacity_bytes else math.inf
        if not math.isinf(cap):
            _memory_rows(problem, assign, s, r, cap)
    prob += _expr(objective_terms)
    # A valid cut: speed-weighted stage times add up to at least the whole model's compute.
    prob += bottleneck >= (math.fsum(fwd) + math.fsum(bwd)) / scale_s / sum(speed)


def _pin(problem: PartitionProblem, assign: _Assignment) -> None:
    """Each pinned unit in its stage: in a stage ``<= stage`` and not in one ``<= stage - 1``."""
    for unit, stage in problem.pinned:
        for term, want in ((assign.y[unit, stage], 1), (assign.y[unit, stage - 1], 0)):
            if not isinstance(term, int):
                assign.prob += term == want


def _check_status(problem: PartitionProblem, prob: pulp.LpProblem, time_limit_s: float) -> bool:
    """Whether the solver proved its partition optimal; raises where it found none."""
    if prob.status == pulp.LpStatusInfeasible or prob.sol_status == pulp.LpSolutionInfeasible:
        raise PlanInfeasibleError(
            f"no partition of {problem.num_units} units into {problem.num_stages} stages fits in memory and honours "
            "the constraints; add stages, allow recomputation or lower the micro-batch size"
        )
    if prob.sol_status not in (pulp.LpSolutionOptimal, pulp.LpSolutionIntegerFeasible):
        raise SolverError(
            f"ILP found no feasible solution within {time_limit_s:g} s; raise --time-limit or use --solver dp"
        )
    return prob.sol_status == pulp.LpSolutionOptimal


def _boundaries(problem: PartitionProblem, assign: _Assignment) -> tuple[int, ...]:
    """The first unit of each stage in the solver's assignment (checked contiguous)."""
    n, p = problem.num_units, problem.num_stages
    stage_of = [next(s for s in range(p) if _one(assign.y[u, s])) for u in range(n)]
    boundaries = tuple(stage_of.index(s) if s in stage_of else -1 for s in range(p))
    if any(b < 0 for b in boundaries) or any(a > b for a, b in zip(stage_of, stage_of[1:], strict=False)):
        raise SolverError(f"the ILP returned a partition that is not contiguous (stages per unit {stage_of})")
    return boundaries


def _solver_flags(problem: PartitionProblem, prob: pulp.LpProblem) -> list[bool]:
    """Per stage, the recompute flag the solver chose (the only allowed one where there is no choice)."""
    choices = set(problem.recompute_choices)
    flags = []
    for s in range(problem.num_stages):
        var = prob.variablesDict().get(f"r_{s}")
        flags.append(bool(round(var.varValue)) if var is not None else bool(next(iter(choices))))
    return flags


def _one(term: _Term) -> bool:
    if isinstance(term, int):
        return bool(term)
    return (term.varValue or 0.0) > 0.5
