"""Hand-built profiles, calibrations and verify reports for planner tests: exact numbers, no torch at import."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import TYPE_CHECKING

from planner.calibration import Calibration, OptimizerCost
from profiles.format import DeviceInfo, ModelInfo, Profile, TensorFlow, UnitProfile, WholeModel

if TYPE_CHECKING:
    from planner.runtime.verify_report import VerifyReport

FINGERPRINT = "ab" * 32


def chain_tensors(n: int, nbytes: Sequence[int]) -> list[TensorFlow]:
    """The model input into unit 0, then unit k's output into unit k + 1."""
    tensors = [TensorFlow(-1, (0,), tuple(nbytes), "int64", False, "input")]
    tensors += [TensorFlow(k, (k + 1,), tuple(nbytes), "float32", True, f"h{k}") for k in range(n - 1)]
    return tensors


def _split(backward: float, share: float, per_size) -> dict[str, tuple]:  # type: ignore[no-untyped-def]
    weights = per_size(backward * share)
    return {
        "backward_input_s": per_size(backward * (1 - share)),
        "backward_weight_s": weights,
        "weight_grad_bytes": tuple(64 * (k + 1) for k in range(len(weights))),
    }


def make_profile(
    forward_s: Sequence[float],
    backward_s: Sequence[float] | None = None,
    *,
    sizes: Sequence[int] = (1,),
    param_counts: Sequence[int] | None = None,
    saved_bytes: Sequence[int] | None = None,
    activation_bytes: int = 1024,
    tensors: Sequence[TensorFlow] | None = None,
    memory_bytes: int = 64 * 1024**3,
    scale_with_size: bool = True,
    weight_share: float | None = None,
    largest_param_bytes: Sequence[int] | None = None,
) -> Profile:
    """A profile whose unit k has forward ``forward_s[k] * b`` at micro-batch size b (when scaling).

    With ``weight_share`` the backward split is measured too: W = share x backward, I = the rest (the
    first unit, whose input needs no gradient, all W), and I keeps 64 bytes of gradients per sample.
    """
    n = len(forward_s)
    backward = list(backward_s) if backward_s is not None else [2 * f for f in forward_s]
    params = list(param_counts) if param_counts is not None else [1000] * n
    saved = list(saved_bytes) if saved_bytes is not None else [4096] * n

    def per_size(x: float) -> tuple[float, ...]:
        return tuple(x * b if scale_with_size else x for b in sizes)

    units = tuple(
        UnitProfile(
            name=f"layers.{k}",
            type="Block",
            param_count=params[k],
            param_bytes=4 * params[k],
            forward_s=per_size(forward_s[k]),
            backward_s=per_size(backward[k]),
            flops=tuple(1000 * b for b in sizes),
            output_bytes=tuple(activation_bytes * b for b in sizes),
            saved_bytes=tuple(saved[k] * b for b in sizes),
            largest_param_bytes=largest_param_bytes[k] if largest_param_bytes is not None else 0,
            **(_split(backward[k], weight_share if k else 1.0, per_size) if weight_share is not None else {}),
        )
        for k in range(n)
    )
    flows = tensors if tensors is not None else chain_tensors(n, [activation_bytes * b for b in sizes])
    return Profile(
        model=ModelInfo("synthetic", FINGERPRINT, sum(params), 4 * sum(params)),
        device=DeviceInfo("cpu", "test-cpu", memory_bytes, "float32", "2.13.0"),
        micro_batch_sizes=tuple(sizes),
        units=units,
        tensors=tuple(flows),
        whole_model=WholeModel(tuple(sum(forward_s) * b for b in sizes), tuple(sum(backward) * b for b in sizes)),
    )


TRANSFORMER_NAMES = {
    # style: (embeddings, block prefix and type, final norm, head)
    "gpt2": (("transformer.wte", "transformer.wpe"), "transformer.h", "GPT2Block", "transformer.ln_f", "lm_head"),
    "llama": (("model.embed_tokens",), "model.layers", "LlamaDecoderLayer", "model.norm", "lm_head"),
}


def transformer_profile(
    style: str = "llama",
    *,
    layers: int = 4,
    block_params: int = 1_000_000,
    block_forward_s: float = 0.01,
    hidden_bytes: int = 4096,
    heads: int | None = 8,
    kv_heads: int | None = None,
    sizes: Sequence[int] = (1,),
    memory_bytes: int = 64 * 1024**3,
) -> Profile:
    """A transformer-shaped profile named as transformers' GPT-2 (tied head) or Llama: embeddings, ``layers``
    blocks, final norm, head. Times and bytes scale with the micro-batch size; a block saves 8 hidden states."""
    embeddings, prefix, block_type, norm, head = TRANSFORMER_NAMES[style]
    vocab_params = 2 * block_params

    def unit(name: str, kind: str, params: int, forward: float, saved: int, **extra: object) -> UnitProfile:
        return UnitProfile(
            name=name,
            type=kind,
            param_count=params,
            param_bytes=4 * params,
            forward_s=tuple(forward * b for b in sizes),
            backward_s=tuple(2 * forward * b for b in sizes),
            flops=tuple(1000 * b for b in sizes),
            output_bytes=tuple(hidden_bytes * b for b in sizes),
            saved_bytes=tuple(saved * b for b in sizes),
            **extra,  # type: ignore[arg-type]
        )

    units = [unit(embeddings[0], "Embedding", vocab_params, block_forward_s / 10, 0)]
    units += [unit(name, "Embedding", block_params // 10, block_forward_s / 10, 0) for name in embeddings[1:]]
    units += [unit(f"{prefix}.{k}", block_type, block_params, block_forward_s, 8 * hidden_bytes) for k in range(layers)]
    units.append(unit(norm, "LayerNorm", 1000, block_forward_s / 100, hidden_bytes))
    tied = style == "gpt2"
    units.append(
        unit(
            head,
            "Linear",
            0 if tied else vocab_params,
            block_forward_s,
            4 * hidden_bytes,
            tied_params=(f"{embeddings[0]}.weight",) if tied else (),
            tied_param_count=vocab_params if tied else 0,
        )
    )
    n = len(units)
    flows = [TensorFlow(-1, (0,), tuple(8 * b for b in sizes), "int64", False, "input_ids")]
    flows += [
        TensorFlow(k, (k + 1,), tuple(hidden_bytes * b for b in sizes), "float32", True, f"h{k}") for k in range(n - 1)
    ]
    settings: dict[str, object] = {}
    if heads is not None:
        settings["attention_heads"] = heads
        settings["kv_heads"] = kv_heads or heads
    return Profile(
        model=ModelInfo(f"{style}-shaped", FINGERPRINT, sum(u.param_count for u in units), 0),
        device=DeviceInfo("cpu", "test-cpu", memory_bytes, "float32", "2.13.0"),
        micro_batch_sizes=tuple(sizes),
        units=tuple(units),
        tensors=tuple(flows),
        whole_model=WholeModel(
            tuple(sum(u.forward_s[i] for u in units) for i in range(len(sizes))),
            tuple(sum(u.backward_s[i] for u in units) for i in range(len(sizes))),
        ),
        settings=settings,
    )


def calibration(**changes: object) -> Calibration:
    """A CPU / gloo calibration of round numbers, ``changes`` replacing its fields."""
    base = Calibration(
        device_kind="cpu",
        backend="gloo",
        num_ranks=2,
        threads_per_rank=1,
        p2p_latency_s=1e-4,
        p2p_bytes_per_s=1e9,
        action_overhead_s={"gpipe": 1e-3, "1f1b": 1e-3, "interleaved-1f1b": 1e-3},
        optimizer={"adam": OptimizerCost(per_param_s=1e-8, per_step_s=1e-3), "sgd": OptimizerCost(5e-9, 0.0)},
        colocation_factor=1.0,
    )
    return replace(base, **changes)  # type: ignore[arg-type]


def verify_report(plan, measured_s: float, compute_s: tuple[float, ...], tail_s: float) -> VerifyReport:
    """A processes-mode report of ``plan`` measured at ``measured_s``, each rank's compute ``compute_s[r]``, every
    rank's step tail ``tail_s`` (to refit a calibration from)."""
    from planner.runtime.verify_report import RankTime, VerifyReport

    ranks = tuple(
        RankTime(
            rank=r,
            predicted_compute_s=plan.predicted.busy_s[r],
            predicted_wait_s=0.0,
            predicted_tail_s=plan.predicted.runtime.step_tail_s[r],
            predicted_overhead_s=plan.predicted.overhead_s[r],
            measured_compute_s=compute_s[r],
            measured_wait_s=0.0,
            measured_tail_s=tail_s,
            measured_overhead_s=0.0,
        )
        for r in range(plan.num_ranks)
    )
    return VerifyReport(
        mode="processes",
        schedule=plan.schedule.value,
        num_ranks=plan.num_ranks,
        num_microbatches=plan.num_microbatches,
        steps=3,
        warmup=1,
        tolerance=0.15,
        predicted_iteration_s=plan.predicted.iteration_s,
        measured_iteration_s=measured_s,
        busy_s=(),
        stages=(),
        memory_kind="rss",
        ranks=ranks,
    )
