"""A plan request: what the search is asked for, checked once where it enters, for the CLI and the Python API.

:func:`plan_request` turns the options ``plan`` and ``tune`` take (``--ranks``, ``--memory``, ``--pin``,
``--calibration`` ...) into a :class:`PlanRequest`: it refuses conflicting or impossible options in terms of
the options themselves (a pin that cannot hold reads as a pin, not as "no plan fits"), chooses the
calibration, and warns when that calibration learned another model.
"""

from __future__ import annotations

import hashlib
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from planner.calibration import Calibration, calibration_from_dict, load_calibration, shipped_calibration
from planner.cost import CostSettings, default_settings, parse_bytes
from planner.errors import PipeplanWarning, UsageError, shorten
from planner.limits import (
    MAX_DEVICES,
    MAX_GLOBAL_BATCH,
    MAX_JSON_INT,
    MAX_RANKS,
    MAX_UNITS,
    check_at_most,
    check_plan_work,
)
from planner.options import (
    auto_or_positive_int,
    bad,
    bandwidth,
    check_fields,
    heads_pair,
    int_range,
    items,
    nonneg_float,
    option,
    pin,
    positive_float,
    speed_list,
    tensor_parallel_degree,
)
from planner.schedule.orders import Schedule
from planner.tensor_parallel import TpLayout, layout_switches
from profiles.format import Profile

__all__ = [
    "PlanOptions",
    "ClusterOptions",
    "PlanRequest",
    "plan_request",
    "check_pins",
    "pinned_units",
    "calibration_settings",
    "profile_sha256",
    "memory",
    "memory_list",
]

TRAINERS = ("torchtitan", "megatron", "deepspeed", "accelerate")
"""What ``--for`` (and ``export --to``) name."""
COLLECTIVES = ("pipeplan", "torchtitan", "megatron", "deepspeed")
"""Whose data-parallel collectives a cluster plan can be costed with (``plan --collectives``)."""
MIN_DEVICE_BYTES = 2**20
"""A bare number below this is not a device's memory: ``--memory 10`` is refused, not read as 10 bytes."""


def memory(text: str) -> int:
    """``80GiB``, ``16GB``, ``512MiB`` or a byte count of at least 1 MiB."""
    if len(text) > 40:
        raise bad(text, "is not a memory size: write e.g. 80GiB, 16GB or 1073741824")
    if text.strip().startswith("-"):
        raise bad(text, "must be a positive memory size, e.g. 80GiB")
    try:
        value = parse_bytes(text)
    except (UsageError, OverflowError, ValueError):
        raise bad(text, "is not a memory size: write e.g. 80GiB, 16GB or 1073741824 (bytes)") from None
    if text.strip().isdigit() and value < MIN_DEVICE_BYTES:
        raise bad(text, f"bytes is not a device's memory: give a unit, e.g. {text.strip()}GiB or {text.strip()}GB")
    if value > MAX_JSON_INT:
        raise bad(text, "is over pipeplan's limit of 2**53 bytes (8 PiB)")
    return value


def memory_list(text: str) -> tuple[int, ...]:
    return tuple(memory(t) for t in items(text, MAX_RANKS))


_RANKS_HELP = "pipeline ranks (devices), P; each holds one stage, or several under an interleaved schedule"
CLUSTER_RANKS_HELP = "; with --devices: the pipeline degree pp, fixed (default: searched)"
"""What ``--ranks`` means besides, in ``plan``, where ``--devices`` exists."""


@dataclass(frozen=True, kw_only=True)
class PlanOptions:
    """What the plan search is asked for: the options of ``plan`` and ``tune`` (:func:`plan_request` reads them)."""

    ranks: int | None = option(
        None, flag=("--ranks", "--stages"), parse=int_range(1, MAX_RANKS), metavar="P", help=_RANKS_HELP
    )
    global_batch: int = option(
        required=True,
        parse=int_range(1, MAX_GLOBAL_BATCH),
        metavar="B",
        help="samples per iteration, B = micro-batch size b x micro-batch count M",
    )
    memory_bytes: int | None = option(
        None,
        flag="--memory",
        parse=memory,
        unit="bytes",
        metavar="80GiB",
        help="memory of every device (default: the profiled device's; on CPU, shared by the ranks of one "
        "machine), less 10%% headroom",
    )
    device_memory_bytes: tuple[int, ...] | None = option(
        None,
        flag="--device-memory",
        parse=memory_list,
        unit="bytes",
        metavar="80GiB,40GiB,...",
        help="memory per rank, one value each (heterogeneous devices; default: --memory)",
    )
    device_speeds: tuple[float, ...] | None = option(
        None,
        parse=speed_list,
        metavar="1,1,0.5,...",
        help="speed per rank relative to the profiled device, one value each (uses the ILP; default: all 1)",
    )
    link_bytes_per_s: float | None = option(
        None,
        flag="--bandwidth",
        parse=bandwidth,
        unit="bytes/s",
        metavar="25GB/s",
        help="link bandwidth per pipeline hop, bytes or bits per second: 25GB/s, 100Gbps (default: the "
        "calibration's measured link; without one, cpu 1.1GB/s, cuda 25GB/s)",
    )
    link_latency_s: float | None = option(
        None,
        flag="--latency",
        parse=nonneg_float,
        unit="s",
        metavar="SECONDS",
        help="link latency per message, in seconds (default: the calibration's; without one, cpu 130e-6, cuda 10e-6)",
    )
    optimizer: str = option(
        "adam",
        choices=("sgd", "adam"),
        help="the optimizer: decides the state kept per parameter and the step time (default adam)",
    )
    schedule: str = option(
        "auto",
        choices=("auto", *(x.value for x in Schedule if x is not Schedule.NAIVE)),
        help="the pipeline schedule (torch.distributed.pipelining's): auto searches every one (the split-backward "
        "zero-bubble, zbv and dualpipev when the profile measured the split); gpipe: all forwards, then all "
        "backwards; 1f1b: one forward, one backward; interleaved-1f1b and looped-bfs: several stages per rank; "
        "zero-bubble, zbv, dualpipev: the weight gradient apart, filling the bubble (default auto)",
    )
    micro_batch_size: int | None = option(
        None,
        parse=auto_or_positive_int,
        metavar="auto|N",
        help="samples per micro-batch b; auto searches every profiled size that divides --global-batch (default auto)",
    )
    recompute: str = option(
        "auto", choices=("auto", "on", "off"), help="activation recomputation: chosen per stage (auto), on or off"
    )
    solver: str = option(
        "auto",
        choices=("auto", "dp", "ilp"),
        help="the exact solver of the boundaries: dp (fast; takes --pin), ilp (pulp; needed for --device-speeds, "
        "--max-units-per-stage); auto picks (default auto)",
    )
    calibration: str = option(
        "auto",
        metavar="auto|none|CALIBRATION.json",
        help="runtime terms (overhead per action, optimizer, tied-gradient sum, co-location): auto = the one the "
        "profile learned from a short pipeline run of its model (`pipeplan profile` on a CPU), else the one shipped "
        "for the profile's device (cpu: measured on gloo; cuda: estimated), none = compute and links only, "
        "or a file from `pipeplan calibrate` / `pipeplan tune` (default auto)",
    )
    pins: tuple[tuple[str, int], ...] = option(
        (),
        flag="--pin",
        parse=pin,
        repeat=True,
        metavar="UNIT=STAGE",
        help="keep a unit on a stage, e.g. transformer.ln_f=3 (repeatable; default: none)",
    )
    max_units_per_stage: int | None = option(
        None,
        parse=int_range(1, MAX_UNITS),
        help="at most this many units per stage (uses the ILP; default: no cap)",
    )
    ilp_time_limit_s: float = option(
        60.0, flag="--time-limit", parse=positive_float, unit="s", help="ILP time limit in seconds (default 60)"
    )
    trainer: str | None = option(
        None,
        flag="--for",
        choices=TRAINERS,
        help="plan only what this trainer can run (its layout rules: e.g. Megatron keeps the embedding on the "
        "first stage and the final norm and head on the last), so `pipeplan export --to` it takes the plan "
        "(default: any plan torch runs)",
    )

    def __post_init__(self) -> None:
        check_fields(self)


CLUSTER_TITLE = "cluster plans"
CLUSTER_DESCRIPTION = (
    "With --devices N the plan is a pp x dp mesh: pp pipeline ranks (--ranks fixes it) times dp replicas of\n"
    "the pipeline, each stage's gradients reduced over its replicas; --global-batch is the whole step's.\n"
    "--tensor-parallel makes it pp x tp x dp: each pipeline rank a group of tp devices inside a node."
)


@dataclass(frozen=True, kw_only=True)
class ClusterOptions:
    """A cluster plan's options (``plan --devices N``): the mesh, its links, what the replicas shard."""

    devices: int | None = option(
        None,
        parse=int_range(1, MAX_DEVICES),
        metavar="N",
        help="devices to plan for: a pp x dp cluster plan (default: one pipeline of --ranks devices)",
    )
    devices_per_node: int | None = option(
        None,
        parse=int_range(1, MAX_DEVICES),
        metavar="G",
        help="devices per node (default: all on one node)",
    )
    intra_node_bytes_per_s: float | None = option(
        None,
        flag="--intra-node-bandwidth",
        parse=bandwidth,
        unit="bytes/s",
        metavar="450GB/s",
        help="per device, each way, inside a node, as collectives get it (default: cuda 450GB/s, cpu 1.1GB/s; a "
        "device model's NVLink at NCCL's rate)",
    )
    inter_node_bytes_per_s: float | None = option(
        None,
        flag="--inter-node-bandwidth",
        parse=bandwidth,
        unit="bytes/s",
        metavar="50GB/s",
        help="per device, each way, between nodes (default: cuda 50GB/s, cpu 1.1GB/s)",
    )
    shard: str = option(
        "none",
        choices=("none", "optimizer", "full", "auto"),
        help="what the replicas split: none = nothing (DDP), optimizer = optimizer state (ZeRO-1), full = "
        "weights, gradients and optimizer state (FSDP), auto = search each that the plan's runtime runs (--for)",
    )
    tensor_parallel: int | str | None = option(
        None,
        parse=tensor_parallel_degree,
        metavar="auto|T",
        help="tensor-parallel degree tp: each pipeline rank of each replica is a group of T devices in one node "
        "whose transformer blocks are split T ways (--tp-layout says what else); auto searches every T that divides "
        "--devices-per-node and the attention heads (default 1: no tensor parallelism)",
    )
    tp_layout: str | None = option(
        None,
        choices=("blocks", "megatron"),
        help="with --tensor-parallel: what the runtime that runs the plan splits. blocks = pipeplan's runtime "
        "(apply_plan, verify): the blocks only, embeddings, head and sequence whole; megatron = Megatron-Core and "
        "torchtitan (for export): the embedding and head by vocabulary too, sequence parallelism on unless "
        "--sequence-parallel off; verify refuses it (default megatron with --for megatron|torchtitan, else blocks)",
    )
    sequence_parallel: str | None = option(
        None,
        choices=("on", "off"),
        help="with --tp-layout megatron: split the activations outside the matrices too (Megatron's "
        "--sequence-parallel; default on)",
    )
    attention_heads: tuple[int, int] | None = option(
        None,
        parse=heads_pair,
        metavar="H[,KV]",
        help="with --tensor-parallel: the model's attention heads (and key-value heads), which tp must divide "
        "(default: what the profile records)",
    )
    collectives: str | None = option(
        None,
        choices=COLLECTIVES,
        help="whose data-parallel collectives the plan is costed with: pipeplan = pipeplan's runtime (DDP; FSDP "
        "gathered for every micro-batch); a trainer's as it runs them, e.g. torchtitan keeps an FSDP stage gathered "
        "all step and reduce-scatters behind the last backward, megatron and deepspeed reduce after it, NCCL rings "
        "a node's every NIC (default: --for's trainer, else pipeplan)",
    )
    jobs: int | None = option(
        None,
        parse=int_range(1, 256),
        metavar="J",
        help="layouts searched at once, in worker processes (default: the CPUs; the plan is the same)",
    )

    def __post_init__(self) -> None:
        check_fields(self)

    def tp_switches(self, trainer: str | None) -> dict[str, bool]:
        """``plan_cluster``'s tensor-parallel layout from ``--tp-layout`` and ``--sequence-parallel``: by default
        the layout of whoever runs the plan, Megatron's for a plan made ``--for megatron|torchtitan``, else
        pipeplan's."""
        default = TpLayout.MEGATRON if trainer in ("megatron", "torchtitan") else TpLayout.BLOCKS
        layout = TpLayout(self.tp_layout) if self.tp_layout else default
        sequence = None if self.sequence_parallel is None else self.sequence_parallel == "on"
        sequence_parallel, vocab_parallel = layout_switches(layout, sequence)
        return {"sequence_parallel": sequence_parallel, "vocab_parallel": vocab_parallel}

    def collectives_of(self, trainer: str | None) -> str:
        """Whose collectives the plan is costed with: ``--collectives``, else the ``--for`` trainer's, else
        ``pipeplan``'s (accelerate's pipelines run inference: no collectives of their own)."""
        if self.collectives:
            return self.collectives
        return trainer if trainer in COLLECTIVES else "pipeplan"


@dataclass(frozen=True)
class PlanRequest:
    num_ranks: int
    """Pipeline ranks (devices): ``--ranks``."""
    global_batch_size: int
    schedule: Schedule | None = None
    """None: search every schedule (``auto``). A name is parsed once, here."""
    auto_schedules: tuple[Schedule, ...] = ()
    """The schedules ``auto`` chooses from (a trainer's, ``plan --for``); empty: every one torch ships."""
    micro_batch_size: int | None = None
    """None: search every profiled size that divides the global batch."""
    recompute: str = "auto"
    """auto (chosen per stage), on, off."""
    solver: str = "auto"
    """auto (dp, or ilp when devices differ or stages are capped), dp, ilp."""
    settings: CostSettings = field(default_factory=CostSettings)
    pinned: tuple[tuple[str, int], ...] = ()
    """(unit FQN, stage) pairs."""
    max_units_per_stage: int | None = None
    top_k: int = 4
    """Partitions per candidate handed from the solver to the simulator."""
    ilp_time_limit_s: float = 60.0
    ranks_per_machine: int | None = None
    """The processes that share one machine's cores (a cluster plan's: a node's devices of its layout); None: the
    pipeline's ranks. A CPU profile is taken at the threads each of them gets (:meth:`threads_ranks`)."""

    @property
    def threads_ranks(self) -> int:
        """The processes a CPU profile divides the machine's cores among for this request."""
        return self.ranks_per_machine or self.num_ranks

    def __post_init__(self) -> None:
        if self.num_ranks < 1:
            raise UsageError(f"--ranks must be >= 1, got {self.num_ranks}")
        if self.global_batch_size < 1:
            raise UsageError(f"--global-batch must be >= 1, got {self.global_batch_size}")
        # The bounds of planner.limits, checked where a request enters (README, "Limits").
        check_at_most("--ranks", self.num_ranks, MAX_RANKS)
        check_at_most("--global-batch", self.global_batch_size, MAX_GLOBAL_BATCH)
        check_at_most("--micro-batch-size", self.micro_batch_size or 1, MAX_GLOBAL_BATCH)
        if self.recompute not in ("auto", "on", "off"):
            raise UsageError(f"--recompute must be auto, on or off, got {self.recompute!r}")
        if self.solver not in ("auto", "dp", "ilp"):
            raise UsageError(f"--solver must be auto, dp or ilp, got {self.solver!r}")
        if self.micro_batch_size is not None and self.micro_batch_size < 1:
            raise UsageError(f"--micro-batch-size must be >= 1, got {self.micro_batch_size}")
        if self.max_units_per_stage is not None and self.max_units_per_stage < 1:
            raise UsageError(f"--max-units-per-stage must be >= 1, got {self.max_units_per_stage}")
        if isinstance(self.schedule, str) and not isinstance(self.schedule, Schedule):
            # The Python API's edge: a name becomes the enum once and travels as the enum.
            object.__setattr__(self, "schedule", None if self.schedule == "auto" else Schedule.parse(self.schedule))


def profile_sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def plan_request(profile: Profile, options: PlanOptions, *, cluster: bool = False) -> PlanRequest:
    """The search request of ``plan`` / ``tune`` (``cluster``: a ``--devices`` plan, whose pipeline degree is
    chosen per layout, ``options.ranks`` fixing it if given). ``options.calibration``: ``auto`` (the one the
    profile learned while profiling, else the one shipped for its device), ``none`` or a calibration file;
    ``options.trainer`` is the caller's to apply (:func:`planner.trainer_rules.for_trainer` builds on the
    request). Raises UsageError on options that cannot hold."""
    stages = options.ranks
    if options.memory_bytes is not None and options.device_memory_bytes is not None:
        raise UsageError("--memory and --device-memory conflict: give one (--memory is every device's memory)")
    chosen = None if options.schedule == "auto" else Schedule.parse(options.schedule)
    sizes = [options.micro_batch_size] if options.micro_batch_size is not None else profile.micro_batch_sizes
    if stages is None and not cluster:
        raise UsageError("give --ranks P (one pipeline of P ranks), or --devices N for a cluster plan")
    if cluster and (options.pins or options.device_memory_bytes or options.device_speeds):
        raise UsageError("--pin, --device-memory and --device-speeds are per pipeline rank: use them without --devices")
    if not cluster:
        assert stages is not None
        check_plan_work(stages, options.global_batch, sizes)
    if options.pins:
        assert stages is not None
        check_pins(profile, options.pins, stages, chosen)
    memory = (options.memory_bytes,) if options.memory_bytes is not None else options.device_memory_bytes
    if memory is None and not cluster and profile.device.kind == "cpu":
        assert stages is not None
        # The ranks of one pipeline on a CPU are processes of one machine: they share its memory.
        memory = (profile.device.memory_bytes // stages,)
    settings = default_settings(
        profile,
        optimizer=options.optimizer,
        link_bytes_per_s=options.link_bytes_per_s,
        link_latency_s=options.link_latency_s,
        device_memory_bytes=memory or (),
        device_speeds=options.device_speeds or (),
        **calibration_settings(options.calibration, profile.device.kind, profile),
    )
    warn_other_model(settings.calibration, profile)
    return PlanRequest(
        num_ranks=stages or 1,  # a cluster plan sets the pipeline degree per layout
        global_batch_size=options.global_batch,
        schedule=chosen,
        micro_batch_size=options.micro_batch_size,
        recompute=options.recompute,
        solver=options.solver,
        settings=settings,
        pinned=tuple(options.pins),
        max_units_per_stage=options.max_units_per_stage,
        ilp_time_limit_s=options.ilp_time_limit_s,
    )


LEARNED_LABEL = "learned while profiling"
"""The calibration label of a profile's own ``pipeline_calibration``."""
MODELLED_LABEL = "modelled from the device model"
"""The label of a modelled profile's (``pipeplan profile --device-model``)."""


def calibration_settings(calibration: str, device_kind: str, profile: Profile | None = None) -> dict[str, object]:
    """``auto|none|FILE`` as CostSettings fields. ``auto``: the calibration ``profile`` learned from a run of its
    model in a pipeline (``pipeplan profile``), else the one shipped for the device."""
    if calibration == "none":
        return {}
    if calibration == "auto":
        learned = profile.pipeline_calibration if profile is not None else None
        if learned is not None:
            label = MODELLED_LABEL if profile is not None and "modelled" in profile.settings else LEARNED_LABEL
            return {"calibration": calibration_from_dict(learned), "calibration_label": label}
        return {"calibration": shipped_calibration(device_kind), "calibration_label": "shipped"}
    return {"calibration": load_calibration(calibration), "calibration_label": str(calibration)}


def warn_other_model(calibration: object, profile: Profile) -> None:
    """A calibration refit on one model (``calibrate --model``, ``tune``) carries that model's per-action
    cost: say so when another model is planned with it."""
    note = calibration.learned_model if isinstance(calibration, Calibration) else None
    if note is not None and note.get("fingerprint") != profile.model.fingerprint:
        warnings.warn(
            f"the calibration learned {note.get('name')}'s per-action cost, not {profile.model.name}'s: its "
            "predictions for this model may be off by that difference",
            PipeplanWarning,
            stacklevel=3,
        )


def check_pins(profile: Profile, pins: Sequence[tuple[str, int]], num_ranks: int, schedule: Schedule | None) -> None:
    """Each pin names a unit, once, at a stage that leaves every other stage a unit, in model order.

    Said here, in terms of the pins, rather than as the solver's "no plan fits" (which reads as memory).
    """
    names = [u.name for u in profile.units]
    index = {name: i for i, name in enumerate(names)}
    n = len(names)
    # Stage counts the search may try: one stage per rank, or 2 or 4 per rank when interleaving.
    looped = schedule is None or schedule.multi_stage
    counts = [num_ranks] + ([num_ranks * v for v in (2, 4) if num_ranks * v <= n] if looped else [])
    chosen: dict[str, int] = {}
    for name, stage in pins:
        if name not in index:
            raise UsageError(
                f"--pin {shorten(name, 60)}={stage}: no unit of that name (units: {shorten(', '.join(names), 120)})"
            )
        if chosen.get(name, stage) != stage:
            raise UsageError(f"--pin {shorten(name, 60)} is given twice, to stage {chosen[name]} and to stage {stage}")
        chosen[name] = stage
        k = index[name]
        # A stage counted from the end (-1: the last) is stage s + stage of s stages.
        resolved = [(stage + s if stage < 0 else stage, s) for s in counts]
        if any(0 <= at < s and at <= k and s - 1 - at <= n - 1 - k for at, s in resolved):
            continue
        at = stage + counts[0] if stage < 0 else stage
        if at >= max(counts) or at < 0:
            why = f"stages are 0..{max(counts) - 1} (or -1 for the last) for {num_ranks} ranks"
        elif at > k:
            why = f"stages 0..{at - 1} before it need a unit each, and only {k} units come before it"
        else:
            why = (
                f"stages {at + 1}..{counts[0] - 1} after it need a unit each, and only {n - 1 - k} units come after it"
            )
        raise UsageError(f"--pin {shorten(name, 60)}={stage}: unit {k} of 0..{n - 1} cannot be on stage {stage}: {why}")
    # In model order, stages never go back (a stage counted from the end, as on one pipeline of counts[0]).
    by_unit = sorted((index[name], stage + counts[0] if stage < 0 else stage, name) for name, stage in chosen.items())
    for (_, s1, n1), (_, s2, n2) in zip(by_unit, by_unit[1:], strict=False):
        if s2 < s1:
            raise UsageError(
                f"--pin {shorten(n1, 40)}={chosen[n1]} and --pin {shorten(n2, 40)}={chosen[n2]} conflict: "
                f"{shorten(n2, 40)} comes later in the model, so its stage cannot be earlier"
            )


def pinned_units(profile: Profile, request: PlanRequest, virtual_stages: int) -> tuple[tuple[int, int], ...]:
    """The request's pins as (unit index, stage) for a search with ``virtual_stages`` stages per rank."""
    names = [u.name for u in profile.units]
    pins = []
    for name, given in request.pinned:
        stage = given + request.num_ranks * virtual_stages if given < 0 else given  # -1: the last stage
        if name not in names:
            raise UsageError(f"cannot pin unknown unit {name!r}")
        if not 0 <= stage < request.num_ranks * virtual_stages:
            raise UsageError(
                f"cannot pin {name} to stage {stage}: stages are 0..{request.num_ranks * virtual_stages - 1}"
            )
        pins.append((names.index(name), stage))
    return tuple(pins)
