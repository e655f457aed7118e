"""The options of ``pipeplan profile``, declared once (planner/options.py): each field is the command's flag,
its help and its default, and what :func:`profiles.from_spec.profile_spec` takes."""

from __future__ import annotations

from dataclasses import dataclass

from planner.limits import MAX_RANKS, MAX_REPEATS
from planner.options import check_fields, int_list, int_range, nonneg_float, option

__all__ = ["ProfileOptions"]


@dataclass(frozen=True, kw_only=True)
class ProfileOptions:
    """What to profile, where, and how long to measure it."""

    model: str = option(positional=True, metavar="MODEL", help="the model to profile (see above)")
    out: str | None = option(
        None, required=True, metavar="PROFILE.json", help="where to write the profile (atomically)"
    )
    micro_batch_sizes: tuple[int, ...] = option(
        (1, 2, 4), parse=int_list, metavar="1,2,4", help="micro-batch sizes to measure (default 1,2,4)"
    )
    device: str = option("cpu", choices=("cpu", "cuda"), help="where to measure: this CPU or a GPU")
    dtype: str = option("float32", choices=("float32", "bfloat16"), help="the weights' and activations' dtype")
    seq_len: int | None = option(
        None,
        parse=int_range(1, 1 << 20),
        help="sequence length in tokens of built-in language models and hf: configs (default: the model's, "
        "128 for the built-ins)",
    )
    task: str | None = option(
        None,
        choices=("causal-lm", "masked-lm", "seq2seq", "image-classification"),
        help="what an hf:CONFIG.json model is built for (default: from the config's architectures)",
    )
    repeats: int = option(
        3,
        parse=int_range(1, MAX_REPEATS),
        help="timed rounds at least (each times every unit once); the median is kept (default 3)",
    )
    max_repeats: int = option(
        8,
        parse=int_range(1, MAX_REPEATS),
        help="timed rounds at most: from the 5th, rounds go on until the unit sum's ratio to the whole model, "
        "timed in the same round, is known to 2%% (the standard error of its median over the rounds) (default 8)",
    )
    warmup: int = option(1, parse=int_range(0, MAX_REPEATS), help="untimed warm-up runs of each unit (default 1)")
    min_time_s: float | None = option(
        None,
        flag="--min-time",
        parse=nonneg_float,
        unit="s",
        metavar="SECONDS",
        help="rounds (each visits every micro-batch size) also go on until they span this long per size "
        "(default 2): a shared machine changes speed from one second to the next, and a median over a moment "
        "sees one speed",
    )
    units: str | None = option(
        None,
        metavar="FQN,FQN|DEPTH",
        help="unit FQNs in execution order, or a module depth (default: the largest repeated block list)",
    )
    threads: int | None = option(
        None,
        parse=int_range(1, 4096),
        exclusive="threads",
        help="CPU intra-op threads while measuring (default: cores // 2, what each rank of a 2-rank pipeline on "
        "this machine gets; the profile also records the scaling to the threads of every other pipeline's ranks)",
    )
    ranks: int | None = option(
        None,
        parse=int_range(1, MAX_RANKS),
        exclusive="threads",
        metavar="P",
        help="time the units with the threads each of P ranks on this machine will get, cores // P, as the runtime "
        "sets (default: P = 2; a CPU profile also records the whole model at every rank count's threads, "
        "and a plan for P ranks uses those)",
    )
    meta: bool = option(
        False,
        help="build the model on the meta device (no weights held) and materialise one unit at a time to measure "
        "it, for a model larger than the device; the whole model is not measured (automatic for an hf: config "
        "whose weights and gradients exceed the device's memory)",
    )
    sample_blocks: bool = option(
        False,
        help="with --meta (implied): measure one unit of each run of identical consecutive units (decoder layers) "
        "and copy its numbers to the others; the profile lists the copies in settings.sampled_from",
    )
    no_pipeline_run: bool = option(
        False,
        help="skip the run, on a CPU, of the model as a 2-rank pipeline (minutes: 3 to 5 for gpt2-small on 2 cores, "
        "about half of its profile) that learns what its actions cost inside a pipeline; `plan` then uses the "
        "calibration shipped for the device",
    )
    no_progress: bool = option(False, help="no progress bar")
    device_model: str | None = option(
        None,
        metavar="GPU|FILE.json",
        help="model the GPU instead of measuring: each unit's times from its FLOPs and bytes through the GPU's "
        "roofline, its memory by the trainers' accounting, for an hf:CONFIG.json gpt2 or llama-like model "
        "(h100-80gb, h800, h200, b200, a100-80gb, a800-80gb, a100-40gb, v100-32gb, v100-16gb, or a device "
        "file: docs/cost-model.md, 'Device models'); seconds, no torch, no GPU",
    )
    precision: str = option(
        "bf16",
        choices=("bf16", "fp16", "fp8"),
        help="with --device-model: the matrix products' precision (fp8: Float8 linear layers, as torchtitan's "
        "and Transformer Engine's)",
    )
    recompute_within: str = option(
        "none",
        choices=("none", "selective", "op"),
        help="with --device-model: recomputation inside each layer, beside the plan's whole-stage recomputation: "
        "selective (the attention core, Megatron's) or op (torch's op-level checkpointing, torchtitan's)",
    )

    def __post_init__(self) -> None:
        check_fields(self)
