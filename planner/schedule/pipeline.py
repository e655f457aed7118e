"""A pipeline as the simulator sees it: one value, whoever made it (a plan, a search candidate, a replay, a what-if).

Every caller of the simulator used to assemble seven parallel per-stage lists by hand; a :class:`Pipeline`
holds them once, checked together, with the schedule, the rank count and the runtime terms beside them.
``Plan.pipeline()`` makes one from a plan.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from planner.errors import UsageError
from planner.schedule.orders import Schedule, Step, stage_to_rank
from planner.schedule.simulate import RuntimeTerms, SimulationResult, simulate

__all__ = ["Pipeline"]


def _floats(values: Sequence[float]) -> tuple[float, ...]:
    return tuple(float(v) for v in values)


@dataclass(frozen=True)
class Pipeline:
    """Per-stage times of one micro-batch, the links between stages and what the runtime adds.

    ``input_s``/``weight_s`` are the split backward (I and W) of the schedules that run it, empty when
    unsplit; ``comm_*_s`` and ``cut_*_bytes`` are per cut (``num_stages - 1``), empty for none; ``runtime``
    None is the textbook model (no overhead, no step tail, no co-location, no compute spent on transfers).
    """

    schedule: Schedule
    num_ranks: int
    num_microbatches: int
    forward_s: tuple[float, ...]
    backward_s: tuple[float, ...]
    input_s: tuple[float, ...] = ()
    weight_s: tuple[float, ...] = ()
    comm_forward_s: tuple[float, ...] = ()
    comm_backward_s: tuple[float, ...] = ()
    runtime: RuntimeTerms | None = None
    cut_forward_bytes: tuple[int, ...] = ()
    """Per cut, the activation bytes of one micro-batch sent across it (what a transfer costs in compute:
    ``RuntimeTerms.transfer_compute_s_per_byte``)."""
    cut_backward_bytes: tuple[int, ...] = ()
    """Per cut, the gradient bytes sent back across it."""

    def __post_init__(self) -> None:
        for name in ("forward_s", "backward_s", "input_s", "weight_s", "comm_forward_s", "comm_backward_s"):
            object.__setattr__(self, name, _floats(getattr(self, name)))
        for name in ("cut_forward_bytes", "cut_backward_bytes"):
            object.__setattr__(self, name, tuple(int(b) for b in getattr(self, name)))
        object.__setattr__(self, "schedule", Schedule.parse(self.schedule))
        n = len(self.forward_s)
        lengths = {"backward_s": len(self.backward_s)}
        lengths.update({k: len(getattr(self, k)) for k in ("input_s", "weight_s") if getattr(self, k)})
        for name, length in lengths.items():
            if length != n:
                raise UsageError(f"{name} has {length} values for {n} stages")
        if bool(self.input_s) != bool(self.weight_s):
            raise UsageError("input_s and weight_s go together: give both parts of the split backward")

    @property
    def num_stages(self) -> int:
        return len(self.forward_s)

    @property
    def placement(self) -> tuple[int, ...]:
        """The rank of each stage, as torch places the schedule's stages."""
        return stage_to_rank(self.schedule, self.num_stages, self.num_ranks)

    def at_speed(self, speed: float) -> Pipeline:
        """The stages' compute ``speed`` times slower (the runtime terms as they are; see
        ``RuntimeTerms.at_speed`` for theirs)."""
        if speed == 1.0:
            return self
        return self._restaged(lambda times: tuple(t * speed for t in times), keep_links=True)

    def with_runtime(self, runtime: RuntimeTerms | None) -> Pipeline:
        return replace(self, runtime=runtime)

    def with_backward(self, backward_s: Sequence[float]) -> Pipeline:
        """Other full backward times (e.g. measured whole), a split backward cut in this one's proportions, so
        the schedule's W still fills its bubble."""
        backward = _floats(backward_s)
        if not self.weight_s:
            return replace(self, backward_s=backward)
        inputs, weights = [], []
        for i, w, b in zip(self.input_s, self.weight_s, backward, strict=True):
            share = w / (i + w) if i + w > 0 else 0.0
            inputs.append(b * (1 - share))
            weights.append(b * share)
        return replace(self, backward_s=backward, input_s=tuple(inputs), weight_s=tuple(weights))

    def as_schedule(
        self, schedule: Schedule, virtual_stages: int | None = None, *, action_overhead_s: float | None = None
    ) -> Pipeline:
        """The same per-rank work under another schedule: each rank's stages as one, cut into the schedule's
        ``v`` equal chunks placed as torch places them (looped or V); chunks inside a rank have no transfer
        time, so the given links no longer apply (stages already placed as the schedule places them stay).
        Runtime terms stay (every rank holds the same units, so its step tail is the same), with the
        schedule's own ``action_overhead_s`` if given."""
        v = schedule.default_virtual_stages if virtual_stages is None or schedule.v_shape else virtual_stages
        if not schedule.multi_stage:
            v = 1
        runtime = self.runtime
        if runtime is not None and action_overhead_s is not None:
            runtime = replace(runtime, action_overhead_s=action_overhead_s)
        moved = replace(self, schedule=schedule, runtime=runtime)
        same_stages = self.num_stages == self.num_ranks * v
        if same_stages and (v == 1 or self.placement == stage_to_rank(schedule, self.num_stages, self.num_ranks)):
            return moved
        if self.num_stages != self.num_ranks:
            # Other stages per rank, or the same count placed otherwise: the rank's work is what carries over.
            moved = replace(self._one_stage_per_rank(), schedule=schedule, runtime=runtime)
        if v == 1:
            return moved
        chunks = stage_to_rank(schedule, self.num_ranks * v, self.num_ranks)
        return moved._restaged(lambda times: tuple(times[rank] / v for rank in chunks), keep_links=False)

    def _one_stage_per_rank(self) -> Pipeline:
        """Each rank's stages as one (their times summed); the links between them no longer apply."""
        placement = self.placement

        def merged(times: tuple[float, ...]) -> tuple[float, ...]:
            return tuple(sum(t for t, r in zip(times, placement, strict=True) if r == k) for k in range(self.num_ranks))

        return self._restaged(merged, keep_links=False)

    def _restaged(self, per_stage: Callable[[tuple[float, ...]], tuple[float, ...]], *, keep_links: bool) -> Pipeline:
        """The per-stage times (F, B, I, W; an empty list stays empty) through ``per_stage``; the links between
        stages kept, or dropped where the stages are no longer the ones they joined."""

        def apply(times: tuple[float, ...]) -> tuple[float, ...]:
            return per_stage(times) if times else ()

        links = (
            {}
            if keep_links
            else {"comm_forward_s": (), "comm_backward_s": (), "cut_forward_bytes": (), "cut_backward_bytes": ()}
        )
        return replace(
            self,
            forward_s=apply(self.forward_s),
            backward_s=apply(self.backward_s),
            input_s=apply(self.input_s),
            weight_s=apply(self.weight_s),
            **links,
        )

    def simulate(self, orders: Sequence[Sequence[Step]] | None = None) -> SimulationResult:
        """One iteration of this pipeline (planner.schedule.simulate's model)."""
        return simulate(
            self.forward_s,
            self.backward_s,
            self.num_microbatches,
            self.schedule,
            num_ranks=self.num_ranks,
            comm_forward_s=self.comm_forward_s,
            comm_backward_s=self.comm_backward_s,
            weight_s=self.weight_s,
            input_s=self.input_s,
            orders=orders,
            runtime=self.runtime,
            cut_forward_bytes=self.cut_forward_bytes,
            cut_backward_bytes=self.cut_backward_bytes,
        )
