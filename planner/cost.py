"""The cost model: from a profile and the hardware, the numbers a solver optimises.

Every formula is written out, with its source, in docs/cost-model.md. This module turns a
:class:`~profiles.format.Profile` at one micro-batch size into a
:class:`~solvers.problem.PartitionProblem`, and breaks a chosen stage's memory down for the plan.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property, lru_cache

from planner.bounds import UnitWork
from planner.calibration import Calibration, ring_s
from planner.errors import UsageError
from planner.graph import build_graph, cut_bytes, cut_grad_bytes
from planner.schedule.memory import memory_moments
from planner.schedule.orders import Schedule, kept_rank_orders
from profiles.format import Profile, UnitProfile
from solvers.problem import Moment, PartitionProblem, stage_memory_peak

__all__ = [
    "Optimizer",
    "CostSettings",
    "DEFAULT_LINKS",
    "HEADROOM_FRACTION",
    "bytes_per_param",
    "parse_bytes",
    "default_settings",
    "UnitCosts",
    "unit_costs",
    "build_problem",
    "schedule_moments",
    "stage_memory",
    "tie_owner",
    "SHARDING",
    "MemoryBreakdown",
    "DataParallel",
    "state_bytes_per_param",
    "split_backward_times",
]

SHARDING = ("none", "optimizer", "full")
"""``none``: DDP (every replica keeps everything); ``optimizer``: ZeRO-1 (optimizer state split over the
replicas); ``full``: FSDP / ZeRO-3 (weights, gradients and optimizer state split, weights gathered per use)."""


@dataclass(frozen=True)
class MemoryBreakdown:
    params: int
    """Weights of the stage's units."""
    grads: int
    optimizer: int
    activations: int
    """Saved activations of the micro-batches in flight (or stage inputs under recomputation)."""
    transient: int
    """Working memory of the largest unit's forward+backward."""
    peak: int
    """Sum of the parts: what the stage needs at its peak."""
    buffers: int = 0
    """Communication buffers and the step's batch: torch's receive buffers of every micro-batch, gradient
    buckets of the replicas' reduction (absent in plans made before it was modelled: 0)."""


# One-way link per pipeline hop: (bytes/s, latency s).
# cpu: gloo over localhost (~1.1 GB/s from 1 MiB, ~0.13 ms one way for 64 KiB; `pipeplan calibrate` measures
#      the machine's own).
# cuda: one 200 Gb/s InfiniBand link per GPU (25 GB/s), the inter-node hop pipeline parallelism usually spans.
DEFAULT_LINKS: dict[str, tuple[float, float]] = {"cpu": (1.1e9, 1.3e-4), "cuda": (25e9, 1e-5)}

# Memory a device cannot give to tensors: allocator fragmentation, the CUDA context, the framework.
HEADROOM_FRACTION = 0.10

Optimizer = str  # "sgd" | "adam"

# Bytes per parameter (weights, gradients, optimizer state), after ZeRO (Rajbhandari et al., SC 2020, Sec. 3.1):
# fp32 Adam keeps m and v (8 B); mixed precision keeps 16-bit weights and gradients plus an fp32 master copy,
# m and v (12 B). SGD is the one the runtime steps (planner/runtime/run_setup.py ``make_optimizer``): with
# momentum, one fp32 buffer (4 B), beside the fp32 master copy in mixed precision.
_BYTES_PER_PARAM: dict[tuple[bool, str], tuple[int, int, int]] = {
    (False, "sgd"): (4, 4, 4),
    (False, "adam"): (4, 4, 8),
    (True, "sgd"): (2, 2, 8),
    (True, "adam"): (2, 2, 12),
}


def bytes_per_param(dtype: str, optimizer: Optimizer) -> tuple[int, int, int]:
    """``(weights, grads, optimizer)`` bytes per parameter for a profile dtype and an optimizer."""
    if optimizer not in ("sgd", "adam"):
        raise UsageError(f"unknown optimizer {optimizer!r}: choose sgd or adam")
    return _BYTES_PER_PARAM[(dtype != "float32", optimizer)]


_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([KMGT]?)(i?)B?\s*$", re.IGNORECASE)


def parse_bytes(text: str) -> int:
    """Parse ``80GiB``, ``16GB``, ``512MiB`` or a plain byte count; reject non-positive values."""
    match = _SIZE.match(str(text))
    if not match:
        raise UsageError(f"cannot read memory size {text!r}: write e.g. 80GiB, 16GB or 1073741824")
    number, prefix, binary = float(match.group(1)), match.group(2).upper(), bool(match.group(3))
    power = " KMGT".index(prefix) if prefix else 0
    value = int(number * (1024 if binary else 1000) ** power)
    if value <= 0:
        raise UsageError(f"memory size must be positive, got {text!r}")
    return value


@dataclass(frozen=True)
class DataParallel:
    """Every pipeline stage replicated on ``replicas`` devices, its gradients reduced over them each step.

    Collectives are rings (Patarasuk & Yuan, JPDC 2009; Thakur et al., IJHPCA 2005): an all-reduce of
    ``n`` bytes over ``d`` devices is ``2 (d - 1)`` steps of ``n / d`` bytes, a reduce-scatter or an
    all-gather ``d - 1`` such steps, each on the slowest link of the ring.
    """

    replicas: int
    bytes_per_s: float
    """The slowest link a stage's ring of replicas crosses (inter-node once the ring leaves a node)."""
    latency_s: float
    shard: str = "none"
    """One of :data:`SHARDING`."""
    per_unit: bool = False
    """Full sharding as trainers apply it outside a pipeline (torchtitan's ``fully_shard`` on every block, pp =
    1): each unit resharded after its forward and its gradients reduce-scattered after its backward, the next
    unit's gather prefetched behind this one's compute."""
    gathered_all_step: bool = False
    """Full sharding under a pipeline as torchtitan runs it: gathered once a step, reduce-scattered once."""
    overlaps_backward: bool = False
    """The gradients' reduction runs behind the rank's last backward (DDP): only what outlasts it is left."""

    @property
    def reshards_per_unit(self) -> bool:
        """Full sharding across replicas, resharded unit by unit (:attr:`per_unit`)."""
        return self.per_unit and self.shard == "full" and self.replicas > 1

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise UsageError(f"data-parallel replicas must be >= 1, got {self.replicas}")
        if self.bytes_per_s <= 0 or self.latency_s < 0:
            raise UsageError(f"a data-parallel link needs bandwidth > 0 and latency >= 0, got {self}")
        if self.shard not in SHARDING:
            raise UsageError(f"--shard must be one of {', '.join(SHARDING)}, got {self.shard!r}")

    def _steps_s(self, steps: int, num_bytes: float) -> float:
        return ring_s(steps, num_bytes, self.replicas, self.latency_s, self.bytes_per_s)

    def allreduce_s(self, num_bytes: float) -> float:
        return self._steps_s(2 * (self.replicas - 1), num_bytes)

    def gather_s(self, num_bytes: float) -> float:
        """An all-gather (or a reduce-scatter) of ``num_bytes`` in all."""
        return self._steps_s(self.replicas - 1, num_bytes)

    def state_divisors(self) -> tuple[int, int, int]:
        """What divides (weights, gradients, optimizer state) per device: ZeRO stages 0, 1 and 3
        (Rajbhandari et al., SC 2020, Sec. 5)."""
        d = self.replicas
        return {"none": (1, 1, 1), "optimizer": (1, 1, d), "full": (d, d, d)}[self.shard]


@dataclass(frozen=True)
class CostSettings:
    optimizer: Optimizer = "adam"
    link_bytes_per_s: float = DEFAULT_LINKS["cpu"][0]
    link_latency_s: float = DEFAULT_LINKS["cpu"][1]
    device_memory_bytes: tuple[int, ...] = ()
    """Per rank: the device's memory before headroom (empty = the profile's device memory on every rank)."""
    headroom_fraction: float = HEADROOM_FRACTION
    device_speeds: tuple[float, ...] = ()
    """Per rank: speed relative to the profiled device (empty = all 1)."""
    calibration: Calibration | None = None
    """Runtime terms (overhead per action, optimizer, tied-gradient sum, co-location); None: textbook model."""
    calibration_label: str = "none"
    """Where ``calibration`` came from, recorded in the plan: ``none``, ``shipped`` or the file name."""
    data_parallel: DataParallel | None = None
    """Replicas of every stage (a cluster plan's ``dp``); None: one pipeline, nothing to reduce."""

    def __post_init__(self) -> None:
        if self.link_bytes_per_s <= 0:
            raise UsageError(f"bandwidth must be positive, got {self.link_bytes_per_s}")
        if self.link_latency_s < 0:
            raise UsageError(f"latency must be >= 0, got {self.link_latency_s}")
        if any(m <= 0 for m in self.device_memory_bytes):
            raise UsageError("device memory must be positive")
        if any(v <= 0 for v in self.device_speeds):
            raise UsageError("device speeds must be positive")
        if not 0 <= self.headroom_fraction < 1:
            raise UsageError(f"headroom must be in [0, 1), got {self.headroom_fraction}")
        bytes_per_param("float32", self.optimizer)

    def capacity(self, profile: Profile, rank: int, num_ranks: int) -> float:
        """Usable bytes on ``rank``: its memory (default: the profiled device's) less the headroom."""
        if self.device_memory_bytes:
            if len(self.device_memory_bytes) not in (1, num_ranks):
                raise UsageError(f"--device-memory has {len(self.device_memory_bytes)} values for {num_ranks} ranks")
            total = self.device_memory_bytes[rank if len(self.device_memory_bytes) > 1 else 0]
        else:
            total = profile.device.memory_bytes
        return total * (1 - self.headroom_fraction)

    def speed(self, rank: int, num_ranks: int) -> float:
        if not self.device_speeds:
            return 1.0
        if len(self.device_speeds) != num_ranks:
            raise UsageError(f"--device-speeds has {len(self.device_speeds)} values for {num_ranks} ranks")
        return self.device_speeds[rank]


def default_settings(profile: Profile, **overrides: object) -> CostSettings:
    """Settings with the link defaults of the profile's device kind (or the calibration's measured link),
    then ``overrides``; a calibration of another device kind or backend is refused."""
    bandwidth, latency = DEFAULT_LINKS.get(profile.device.kind, DEFAULT_LINKS["cpu"])
    calibration = overrides.get("calibration")
    if isinstance(calibration, Calibration):
        calibration.check_device(profile.device.kind)
        bandwidth, latency = calibration.p2p_bytes_per_s, calibration.p2p_latency_s
    values: dict[str, object] = {"link_bytes_per_s": bandwidth, "link_latency_s": latency}
    values.update({k: v for k, v in overrides.items() if v is not None})
    return CostSettings(**values)  # type: ignore[arg-type]


@dataclass(frozen=True)
class UnitCosts:
    """Per-unit and per-cut numbers at one micro-batch size."""

    forward_s: tuple[float, ...]
    backward_s: tuple[float, ...]
    param_count: tuple[int, ...]
    """Parameters each unit holds on its stage: its own plus copies of tied ones."""
    saved_bytes: tuple[int, ...]
    transient_bytes: tuple[int, ...]
    cut_bytes: tuple[int, ...]
    cut_grad_bytes: tuple[int, ...]
    input_bytes: int
    input_s: tuple[float, ...] = ()
    """Per unit, the input-gradient part I of the backward as torch's zero-bubble schedules run it
    (``stage_backward_input``); empty when the profile did not measure the split."""
    weight_s: tuple[float, ...] = ()
    """Per unit, the weight-gradient part W (``stage_backward_weight``); empty as above."""
    weight_grad_bytes: tuple[int, ...] = ()
    """Per unit, the gradients I keeps alive until W (profile ``weight_grad_bytes``); empty if unmeasured."""
    held_bytes: tuple[int, ...] = ()
    """Per unit, what one micro-batch's forward leaves alive until its backward (profile ``held_bytes``; its
    ``saved_bytes`` where unmeasured). Empty: ``saved_bytes``."""
    largest_param_bytes: tuple[int, ...] = ()
    """Per unit, its largest parameter tensor (profile ``largest_param_bytes``; 0 where unmeasured)."""
    param_tensor_count: tuple[int, ...] = ()
    """Per unit, parameter tensors its stage holds (tied copies included)."""
    input_transient_bytes: tuple[int, ...] = ()
    """Per unit, the working memory of its I (profile ``input_transient_bytes``); empty where unmeasured."""
    weight_transient_bytes: tuple[int, ...] = ()
    """Per unit, the working memory of its W (profile ``weight_transient_bytes``); empty where unmeasured."""
    output_bytes: int = 0
    """The model's output per micro-batch (the last unit's ``output_bytes``)."""
    relays: tuple[tuple[int, int, int], ...] = ()
    """``(producer, last consumer, bytes)`` of the tensors that need a gradient and skip a unit: what a stage
    between the two passes on (planner/runtime/apply.py relays them, a copy per micro-batch)."""
    unit_output_bytes: tuple[int, ...] = ()
    """Per unit, the bytes of the tensors it makes that later units read (the profile's ``tensors``)."""
    target_bytes: int = 0
    """The loss's target per micro-batch (profile ``loss.target_bytes``; 0 where unmeasured)."""
    kept_loss_bytes: int = 0
    """What the loss's output keeps per micro-batch (profile ``loss.kept_bytes``; 0 where unmeasured)."""

    @cached_property
    def work(self) -> UnitWork:
        """What every partition computes per micro-batch with a full backward (planner/bounds.py); kept, as
        a cluster search asks for it once per layout and schedule."""
        return UnitWork.of(self.forward_s, self.backward_s)

    @cached_property
    def split_work(self) -> UnitWork:
        """As :attr:`work` with the backward split into I and W where measured."""
        return UnitWork.of(self.forward_s, self.backward_s, self.input_s, self.weight_s) if self.weight_s else self.work

    @property
    def activation_bytes(self) -> tuple[int, ...]:
        """Per unit, what one micro-batch holds from its forward to its backward: :attr:`held_bytes` where
        measured, else the saved activations."""
        return self.held_bytes or self.saved_bytes


_RECENT_COSTS: dict[tuple[int, int], tuple[Profile, UnitCosts]] = {}
"""The last few :func:`unit_costs` results, by profile identity (the profile is kept, so its id stays its own):
a cluster search asks for the same profile's costs once per layout, and the graph behind them costs 20 ms
at 2,000 units."""


def unit_costs(profile: Profile, micro_batch_size: int) -> UnitCosts:
    key = (id(profile), micro_batch_size)
    if key in _RECENT_COSTS and _RECENT_COSTS[key][0] is profile:
        return _RECENT_COSTS[key][1]
    if len(_RECENT_COSTS) >= 32:  # a cluster search with tensor parallelism holds a profile per degree
        del _RECENT_COSTS[next(iter(_RECENT_COSTS))]
    costs = _unit_costs(profile, micro_batch_size)
    _RECENT_COSTS[key] = (profile, costs)
    return costs


def _made_bytes(profile: Profile, size_index: int) -> tuple[int, ...]:
    """Per unit, the bytes of the tensors it makes that later units read."""
    made = [0] * len(profile.units)
    for t in profile.tensors:
        if t.producer >= 0:
            made[t.producer] += t.bytes[size_index]
    return tuple(made)


def _unit_costs(profile: Profile, micro_batch_size: int) -> UnitCosts:
    k = profile.size_index(micro_batch_size)
    graph = build_graph(profile)
    units = profile.units
    transient = tuple(_unit_transient(u, k) for u in units)
    held = all(u.held_bytes is not None for u in units)
    split = all(u.has_split for u in units)
    return UnitCosts(
        forward_s=tuple(u.forward_s[k] for u in units),
        backward_s=tuple(u.backward_s[k] for u in units),
        param_count=tuple(u.param_count + u.tied_param_count for u in units),
        saved_bytes=tuple(u.saved_bytes[k] for u in units),
        transient_bytes=transient,
        cut_bytes=tuple(cut_bytes(profile, k, graph)),
        cut_grad_bytes=tuple(cut_grad_bytes(profile, k, graph)),
        input_bytes=sum(t.bytes[k] for t in profile.tensors if t.producer == -1),
        input_s=tuple(u.backward_input_s[k] for u in units) if split else (),  # type: ignore[index]
        weight_s=tuple(u.backward_weight_s[k] for u in units) if split else (),  # type: ignore[index]
        weight_grad_bytes=tuple(u.weight_grad_bytes[k] if u.weight_grad_bytes else 0 for u in units) if split else (),
        held_bytes=tuple(u.held_bytes[k] for u in units) if held else (),  # type: ignore[index]
        largest_param_bytes=tuple(u.largest_param_bytes for u in units),
        input_transient_bytes=_per_size(units, "input_transient_bytes", k),
        weight_transient_bytes=_per_size(units, "weight_transient_bytes", k),
        output_bytes=units[-1].output_bytes[k],
        unit_output_bytes=_made_bytes(profile, k),
        target_bytes=profile.loss.target_bytes[k] if profile.loss else 0,
        kept_loss_bytes=profile.loss.kept_bytes[k] if profile.loss else 0,
        relays=tuple(
            (t.producer, t.last_consumer, t.bytes[k])
            for t in profile.tensors
            if t.needs_grad and t.producer >= 0 and t.last_consumer - t.producer > 1
        ),
        param_tensor_count=tuple(u.param_tensor_count for u in units),
    )


def _per_size(units: tuple[UnitProfile, ...], name: str, k: int) -> tuple[int, ...]:
    """An optional per-size unit field at one size for every unit, or empty when any unit lacks it."""
    values = [getattr(u, name) for u in units]
    return () if any(v is None for v in values) else tuple(v[k] for v in values)


def _unit_transient(unit: UnitProfile, k: int) -> int:
    """A unit's backward working memory: measured by live tensor bytes (profile ``transient_bytes``); in
    profiles made before, the CUDA allocator's peak of its forward+backward, or on CPU its output plus that
    output's gradient (the two tensors alive at the boundary of its forward and backward)."""
    if unit.transient_bytes is not None:
        return unit.transient_bytes[k]
    if unit.peak_bytes is not None:
        return unit.peak_bytes[k]
    return 2 * unit.output_bytes[k]


def split_backward_times(
    costs: UnitCosts,
    stage_units: list[range] | list[list[int]],
    forward_s: list[float],
    backward_s: list[float],
    recompute: tuple[bool, ...],
    speed: tuple[float, ...] = (),
) -> tuple[list[float], list[float]]:
    """Per stage, the split backward ``(I, W)`` of one micro-batch, as torch 2.13 runs it; ``([], [])``
    when the profile did not measure the split (the schedules then run the backward unsplit).

    A stage's I and W are its units' (docs/cost-model.md, "Split backward"); a recomputed stage re-runs
    its forward inside I, the first backward pass. The first stage is different: torch's
    ``PipelineStage.backward_one_chunk`` skips I for it (its input needs no gradient) and
    ``backward_weight_one_chunk`` runs the stage's whole backward as W, so there I = 0 and W = its full
    backward ``backward_s[0]``. A recomputing stage runs its whole backward, the re-run forward included, in I
    and nothing in W (planner/runtime/apply.py ``backward_whole``: torch's split re-materialises a checkpointed
    stage once per parameter group).
    """
    if not costs.weight_s:
        return [], []
    inputs, weights = [], []
    for s, units in enumerate(stage_units):
        scale = speed[s] if speed else 1.0
        if recompute[s]:
            inputs.append(backward_s[s])
            weights.append(0.0)
            continue
        if s == 0:
            inputs.append(0.0)
            weights.append(backward_s[0])
            continue
        i = sum(costs.input_s[u] for u in units) / scale + (forward_s[s] if recompute[s] else 0.0)
        inputs.append(i)
        weights.append(sum(costs.weight_s[u] for u in units) / scale)
    return inputs, weights


def _transfer_s(num_bytes: int, settings: CostSettings) -> float:
    return 0.0 if num_bytes == 0 else settings.link_latency_s + num_bytes / settings.link_bytes_per_s


def state_bytes_per_param(profile: Profile, settings: CostSettings) -> float:
    """Bytes per parameter on one device: weights, gradients and optimizer state, each split over the
    data-parallel replicas as far as the sharding goes."""
    per_param = bytes_per_param(profile.device.dtype, settings.optimizer)
    divisors = settings.data_parallel.state_divisors() if settings.data_parallel else (1, 1, 1)
    return sum(b / d for b, d in zip(per_param, divisors, strict=True))


def _with_gathers(
    profile: Profile, costs: UnitCosts, settings: CostSettings
) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per unit ``(forward_s, backward_s)``, with full sharding's collectives.

    Under ``full`` (FSDP's defaults: reshard after forward, reduce-scatter after each backward) every
    micro-batch gathers a unit's weights before its forward and again before its backward, and
    reduce-scatters its gradients after; none of it is assumed hidden behind compute. (Its memory is the
    runtime's, which keeps a stage gathered all step: :func:`_state_parts`.)
    """
    dp = settings.data_parallel
    if dp is None or dp.shard != "full" or dp.replicas == 1 or dp.gathered_all_step:
        return costs.forward_s, costs.backward_s
    weights, grads, _ = bytes_per_param(profile.device.dtype, settings.optimizer)
    gather = [dp.gather_s(n * weights) for n in costs.param_count]
    scatter = [dp.gather_s(n * grads) for n in costs.param_count]
    if dp.reshards_per_unit:
        # FSDP's prefetch: a unit's collectives run behind its neighbour's compute; the longer of the two counts.
        forward = tuple(max(f, g) for f, g in zip(costs.forward_s, gather, strict=True))
        backward = tuple(max(b, g + r) for b, g, r in zip(costs.backward_s, gather, scatter, strict=True))
        return forward, backward
    forward = tuple(f + g for f, g in zip(costs.forward_s, gather, strict=True))
    backward = tuple(b + g + r for b, g, r in zip(costs.backward_s, gather, scatter, strict=True))
    return forward, backward


@lru_cache(maxsize=1024)
def schedule_moments(
    schedule: Schedule, num_stages: int, num_microbatches: int, num_ranks: int
) -> tuple[tuple[Moment, ...], ...]:
    """Per stage, the moments at which it may peak under ``schedule`` (planner/schedule/memory.py), as the solvers
    weigh them. A recomputing stage re-materialises its forward in B and I (it runs its whole backward in I,
    planner/runtime/apply.py ``backward_whole``, the first stage's too); the first stage under a split backward
    runs no I otherwise (its input needs no gradient: torch's ``backward_one_chunk`` skips it), so there a
    micro-batch past I holds what a waiting one does, its I moment is named W and its W moment B."""
    out = []
    for s, moments in enumerate(memory_moments(schedule, num_stages, num_microbatches, num_ranks)):
        first_split = s == 0 and schedule.splits_backward
        # A recomputing stage's I runs its whole backward; the first stage's I is empty and its W the whole one.
        converted = set()
        for m in moments:
            waiting, split, kind = (m.waiting, m.split, m.kind)
            if first_split:
                waiting, split, kind = m.waiting + m.split, 0, {"I": "W", "W": "B"}.get(m.kind, m.kind)
            held = (m.sent_grads, m.sent_outputs, m.done, m.held_output)  # by sends, losses, the loop
            converted.add(Moment(waiting, split, m.grads, m.kind in "BI", kind, *held))
        out.append(tuple(sorted(converted)))
    return tuple(out)


@lru_cache(maxsize=1024)
def _every_backward_split(schedule: Schedule, num_stages: int, num_microbatches: int, num_ranks: int) -> bool:
    """Whether every backward of ``schedule`` is an I and a W (zero-bubble, ZBV; DualPipeV runs most as B): then a
    relayed tensor's gradient passes through its relaying stage as the buffer it came in (``torch.autograd.grad``
    returns a copy's gradient unchanged), where a full backward accumulates a copy of it into ``.grad``."""
    if not schedule.splits_backward:
        return False
    orders = kept_rank_orders(schedule, num_stages, num_microbatches, num_ranks)
    return not any(step.kind == "B" for order in orders for step in order)


def _step_bytes(profile: Profile, costs: UnitCosts, settings: CostSettings) -> tuple[tuple[int, ...], bool]:
    """Per unit, what the step's tail allocates for it, and whether a stage's is its units' sum.

    The optimizer's temporaries: torch's Adam on a CPU updates one parameter at a time (the single-tensor
    path: ``foreach`` defaults to off on a CPU), and ``exp_avg_sq.sqrt() / bias_correction2_sqrt`` holds two
    temporaries of the parameter's size, so a stage's is twice its largest parameter; on CUDA the ``foreach``
    path takes each ``sqrt`` of the whole list at once: one fp32 copy of the stage's parameters. SGD with
    momentum updates in place. A tied weight's copy is summed with its owner's through a buffer of the
    gradient's size (planner/runtime/apply.py ``_sum_across``), before the optimizer step.
    """
    _, grad_b, _ = bytes_per_param(profile.device.dtype, settings.optimizer)
    foreach = profile.device.kind == "cuda"
    # ZeRO-1, and FSDP resharded unit by unit, step the shard of the optimizer state a device keeps; a pipeline
    # stage under FSDP steps with its whole gradients gathered (measured: tests/planner/runtime/test_verify_memory).
    dp = settings.data_parallel
    shards = dp.state_divisors()[2] if dp and (dp.shard == "optimizer" or dp.reshards_per_unit) else 1
    if settings.optimizer != "adam":
        optimizer = [0] * len(costs.param_count)
    elif foreach:
        optimizer = [4 * n // shards for n in costs.param_count]
    else:
        optimizer = [2 * b // shards for b in costs.largest_param_bytes]
    tied = [u.tied_param_count * grad_b if u.tied_params else 0 for u in profile.units]
    for u, unit in enumerate(profile.units):
        if unit.tied_params and unit.tied_param_count:
            owner = tie_owner(profile, u)
            tied[owner] = max(tied[owner], unit.tied_param_count * grad_b)
    if foreach:
        return tuple(o + t for o, t in zip(optimizer, tied, strict=True)), True
    return tuple(max(o, t) for o, t in zip(optimizer, tied, strict=True)), False


def _state_parts(profile: Profile, settings: CostSettings, params: int, tensors: int) -> tuple[int, int, int, int]:
    """``(weights, grads, optimizer, buckets)`` bytes of ``params`` parameters in ``tensors`` tensors on one device.

    Adam keeps a 4-byte ``step`` per parameter tensor beside m and v; DDP (a cluster plan replicating without
    sharding the weights) reduces the gradients through buckets as large as they are, kept from step to step.
    """
    per_param = bytes_per_param(profile.device.dtype, settings.optimizer)
    dp = settings.data_parallel
    divisors = dp.state_divisors() if dp else (1, 1, 1)
    weights, grads, optimizer = (round(params * b / d) for b, d in zip(per_param, divisors, strict=True))
    if settings.optimizer == "adam":
        optimizer += 4 * tensors
    buckets = 0
    if dp is not None and dp.replicas > 1 and dp.shard == "full" and not dp.per_unit:
        # torch's PipelineStage keeps an FSDP stage's parameters gathered from its first forward to the step's
        # end and accumulates its gradients unsharded (``backward_maybe_with_nosync``: no reshard, no gradient
        # sync until ``perform_reduce_grad``): the shard and the whole weights, the whole gradients.
        weights += params * per_param[0]
        grads = params * per_param[1]
    elif dp is not None and dp.replicas > 1 and dp.shard != "full":
        buckets = grads
    # Resharded unit by unit (per_unit), a device keeps the shards only and no buckets: the units gathered at a
    # time are working memory (build_problem).
    return weights, grads, optimizer, buckets


def build_problem(
    profile: Profile,
    costs: UnitCosts,
    settings: CostSettings,
    *,
    num_stages: int,
    num_microbatches: int,
    in_flight: tuple[int, ...],
    stage_rank: tuple[int, ...],
    recompute_choices: tuple[bool, ...],
    pinned: tuple[tuple[int, int], ...] = (),
    max_units_per_stage: int | None = None,
    split_backward: bool = False,
    schedule: Schedule | None = None,
) -> PartitionProblem:
    """The partition problem of ``num_stages`` stages placed on ranks by ``stage_rank``.

    A rank holding ``v`` stages (interleaved schedules) gives each ``1/v`` of its capacity, so any
    partition the solver accepts fits on the rank as a whole. With ``schedule``, each stage's memory is its
    peak over that schedule's moments (:func:`schedule_moments`); without, over one moment of ``in_flight``
    micro-batches with the gradients present.
    """
    num_ranks = max(stage_rank) + 1
    per_rank = [stage_rank.count(r) for r in range(num_ranks)]
    forward, backward = _with_gathers(profile, costs, settings)
    transient = costs.transient_bytes
    dp = settings.data_parallel
    if dp is not None and dp.reshards_per_unit:
        # A unit's whole weights and gradients while it runs, and the next unit's weights prefetched.
        weights, grads, _ = bytes_per_param(profile.device.dtype, settings.optimizer)
        transient = tuple(t + n * (2 * weights + grads) for t, n in zip(transient, costs.param_count, strict=True))
    tensors = costs.param_tensor_count or (0,) * len(costs.param_count)
    parts = [_state_parts(profile, settings, n, k) for n, k in zip(costs.param_count, tensors, strict=True)]
    split = schedule.splits_backward if schedule is not None else split_backward
    all_split = schedule is not None and _every_backward_split(schedule, num_stages, num_microbatches, num_ranks)
    steps, add = _step_bytes(profile, costs, settings)
    activations = costs.activation_bytes
    return PartitionProblem(
        forward_s=forward,
        backward_s=backward,
        num_stages=num_stages,
        num_microbatches=num_microbatches,
        cut_forward_s=tuple(_transfer_s(b, settings) for b in costs.cut_bytes),
        cut_backward_s=tuple(_transfer_s(b, settings) for b in costs.cut_grad_bytes),
        cut_bytes=costs.cut_bytes,
        input_bytes=costs.input_bytes,
        param_state_bytes=tuple(sum(p) for p in parts),
        saved_bytes=activations,
        transient_bytes=transient,
        in_flight=in_flight,
        capacity_bytes=tuple(settings.capacity(profile, r, num_ranks) / per_rank[r] for r in stage_rank),
        recompute_choices=recompute_choices,
        speed=tuple(settings.speed(r, num_ranks) for r in stage_rank) if settings.device_speeds else (),
        pinned=pinned,
        max_units_per_stage=max_units_per_stage,
        moments=schedule_moments(schedule, num_stages, num_microbatches, num_ranks) if schedule is not None else (),
        grad_bytes=tuple(p[1] for p in parts),
        split_held_bytes=costs.weight_grad_bytes if split and costs.weight_grad_bytes else (),
        buffer_microbatches=num_microbatches,
        cut_grad_bytes=costs.cut_grad_bytes,
        output_held_bytes=activations[-1],
        step_bytes=steps,
        step_bytes_add=add,
        local_inputs=tuple(s > 0 and stage_rank[s - 1] == stage_rank[s] for s in range(num_stages)),
        relays=costs.relays,
        input_transient_bytes=costs.input_transient_bytes,
        weight_transient_bytes=costs.weight_transient_bytes,
        # Past I the last stage lets go of the model's output and of what only the loss saved: torch's
        # stage_backward_input detaches the loss, freeing its graph (cross-entropy's log-probabilities, MSE's
        # difference: one tensor of the output's size), but for the output of the rank's latest forward, which
        # the schedule's loop still references.
        final_output_bytes=min(activations[-1], 2 * costs.output_bytes),
        target_bytes=costs.target_bytes,
        kept_loss_bytes=costs.kept_loss_bytes,
        latest_output_bytes=costs.output_bytes,
        unit_output_bytes=costs.unit_output_bytes,
        split_backward=all_split,
    )


def stage_memory(
    profile: Profile,
    settings: CostSettings,
    problem: PartitionProblem,
    costs: UnitCosts,
    stage: int,
    first: int,
    last: int,
    recompute: bool,
) -> MemoryBreakdown:
    """Memory of stage ``stage`` holding units ``first..last`` at its peak, by part: the solvers' own formula
    (``solvers.problem.stage_memory_peak``), its state split into weights, gradients, optimizer state and the
    gradient buckets (reported with the buffers)."""
    peak = stage_memory_peak(problem, stage, first, last, recompute)
    tensors = costs.param_tensor_count or (0,) * len(costs.param_count)
    units = range(first, last + 1)
    per_unit = [_state_parts(profile, settings, costs.param_count[u], tensors[u]) for u in units]
    weights, grads, optimizer, buckets = (sum(part) for part in zip(*per_unit, strict=True))
    grads = grads if peak.grads_bytes else 0
    buffers = round(peak.buffers_bytes) + buckets
    parts = (weights, grads, optimizer, round(peak.activations_bytes), round(peak.transient_bytes))
    return MemoryBreakdown(*parts, peak=sum(parts) + buffers, buffers=buffers)


def tie_owner(profile: Profile, unit: int) -> int:
    """The first unit using any of ``unit``'s tied parameters: it counts them, later users keep copies."""
    names = set(profile.units[unit].tied_params)
    return next(i for i, u in enumerate(profile.units) if names & set(u.tied_params))
