"""``hf:path/to/config.json``: a transformers model built from a local config file, random-initialised.

Nothing is downloaded: the config file names the architecture (``model_type``), transformers builds it
with random weights (seed 0) for one of four tasks, and the workload feeds it random batches of the right
kind with the task's loss:

==========================  ==========================================  ===================================
task                        inputs (by keyword)                         output, loss
==========================  ==========================================  ===================================
``causal-lm``               ``input_ids`` (B, T)                        logits; next-token cross-entropy
``masked-lm``               ``input_ids``, ``attention_mask`` (B, T)    logits; cross-entropy on every token
``seq2seq``                 ``input_ids``, ``decoder_input_ids``        logits; next-token cross-entropy
``image-classification``    ``pixel_values`` (B, C, S, S)               logits; cross-entropy on labels
==========================  ==========================================  ===================================

The task defaults to what the config's ``architectures`` says (``...ForCausalLM``, ``...ForMaskedLM``,
``...ForConditionalGeneration``, ``...ForImageClassification``), else seq2seq for an encoder-decoder and
causal-lm otherwise. Dropout is set to 0 (runs must be comparable), the KV cache off (models that return
one cannot be exported) and attention eager (fvcore counts its FLOPs).

Options ride in the spec, so that every rank of ``verify`` rebuilds the same model from the plan's model
name: ``hf:config.json?task=seq2seq&seq_len=32``. :func:`hf_config_workload` writes that full spec as
the workload's name.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch import nn

from planner.errors import ModelSpecError, shorten
from profiles.models.hf_spec import PREFIX, parse_hf_spec, resolve_hf_spec
from profiles.workload_type import Workload

__all__ = ["TASKS", "PREFIX", "parse_hf_spec", "hf_config_workload"]

TASKS = ("causal-lm", "masked-lm", "seq2seq", "image-classification")
DEFAULT_SEQ_LEN = 16
_AUTO_CLASSES = {
    "causal-lm": "AutoModelForCausalLM",
    "masked-lm": "AutoModelForMaskedLM",
    "seq2seq": "AutoModelForSeq2SeqLM",
    "image-classification": "AutoModelForImageClassification",
}
_ARCHITECTURE_SUFFIXES = (
    ("ForCausalLM", "causal-lm"),
    ("LMHeadModel", "causal-lm"),
    ("ForMaskedLM", "masked-lm"),
    ("ForConditionalGeneration", "seq2seq"),
    ("ForSeq2SeqLM", "seq2seq"),
    ("ForImageClassification", "image-classification"),
)


def _task_of(config: Any) -> str:
    for arch in getattr(config, "architectures", None) or ():
        for suffix, task in _ARCHITECTURE_SUFFIXES:
            if str(arch).endswith(suffix):
                return task
    if getattr(config, "is_encoder_decoder", False):
        return "seq2seq"
    if hasattr(config, "image_size") and hasattr(config, "num_channels"):
        return "image-classification"
    return "causal-lm"


def _zero_dropout(config: Any) -> None:
    """Every float ``*dropout*``/``*pdrop*`` setting, nested configs included, set to 0."""
    for key, value in list(vars(config).items()):
        if isinstance(value, float) and ("dropout" in key or "pdrop" in key):
            setattr(config, key, 0.0)
        elif hasattr(value, "to_dict") and hasattr(value, "model_type"):  # a sub-config (vision tower, ...)
            _zero_dropout(value)


def _load_config(path: str) -> Any:
    file = Path(path)
    if file.is_dir():
        file = file / "config.json"
    if not file.is_file():
        raise ModelSpecError(f"config file not found: {shorten(str(file), 200)}")
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeError, ValueError) as exc:
        raise ModelSpecError(f"cannot read {shorten(str(file), 120)} as JSON: {shorten(str(exc), 120)}") from None
    if not isinstance(data, dict) or not isinstance(data.get("model_type"), str):
        raise ModelSpecError(
            f'{shorten(str(file), 120)} has no "model_type": a transformers config.json names its architecture, '
            'e.g. "model_type": "llama"'
        )
    from transformers import AutoConfig

    model_type = data.pop("model_type")
    try:
        return AutoConfig.for_model(model_type, **data)
    except Exception as exc:
        raise ModelSpecError(
            f"transformers cannot build a {model_type!r} config from {shorten(str(file), 80)}: "
            f"{shorten(f'{type(exc).__name__}: {exc}', 150)}"
        ) from None


def _token_loss(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1))


def _max_positions(config: Any) -> int | None:
    for key in ("max_position_embeddings", "n_positions", "max_sequence_length"):
        value = getattr(config, key, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def _batches(task: str, config: Any, seq_len: int) -> Callable[[int], tuple[dict[str, torch.Tensor], torch.Tensor]]:
    vocab = int(getattr(config, "vocab_size", 0) or 0)
    if task != "image-classification" and vocab < 2:
        raise ModelSpecError(f"the {config.model_type} config has no vocab_size: it cannot be a {task} model")

    def ids(g: torch.Generator, batch_size: int, length: int) -> torch.Tensor:
        return torch.randint(0, vocab, (batch_size, length), generator=g)

    def make_batch(batch_size: int) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        g = torch.Generator().manual_seed(1000 + batch_size)
        if task == "causal-lm":
            tokens = ids(g, batch_size, seq_len + 1)
            return {"input_ids": tokens[:, :-1].contiguous()}, tokens[:, 1:].contiguous()
        if task == "masked-lm":
            tokens = ids(g, batch_size, seq_len)
            return {"input_ids": tokens, "attention_mask": torch.ones_like(tokens)}, tokens
        if task == "seq2seq":
            source, target = ids(g, batch_size, seq_len), ids(g, batch_size, seq_len + 1)
            return {"input_ids": source, "decoder_input_ids": target[:, :-1].contiguous()}, target[:, 1:].contiguous()
        size = int(getattr(config, "image_size", 224))
        channels = int(getattr(config, "num_channels", 3))
        pixels = torch.randn(batch_size, channels, size, size, generator=g)
        return {"pixel_values": pixels}, torch.randint(0, int(config.num_labels), (batch_size,), generator=g)

    return make_batch


def hf_config_workload(spec: str, task: str | None = None, seq_len: int | None = None) -> Workload:
    """The workload of ``hf:PATH[?task=..&seq_len=..]``; ``task``/``seq_len`` (CLI options) fill the spec's gaps.

    Raises :class:`ModelSpecError` for a missing or malformed config, an unknown task, an option given
    twice with different values, or a model transformers cannot build for the task.
    """
    path, chosen_task, seq_len = resolve_hf_spec(spec, task, seq_len)
    config = _load_config(path)
    chosen_task = chosen_task or _task_of(config)
    if chosen_task not in TASKS:
        raise ModelSpecError(f"unknown task {chosen_task!r}: use one of {', '.join(TASKS)}")
    length = seq_len or min(DEFAULT_SEQ_LEN, _max_positions(config) or DEFAULT_SEQ_LEN)
    limit = _max_positions(config)
    if chosen_task != "image-classification" and limit is not None and length > limit:
        raise ModelSpecError(f"seq_len {length} exceeds the config's {limit} positions: use seq_len <= {limit}")
    if hasattr(config, "use_cache"):
        # A KV cache in the output is a cache object, not tensors: torch.export cannot return it nor a stage send it.
        config.use_cache = False
    _zero_dropout(config)
    config._attn_implementation = "eager"  # fvcore counts eager attention's matmuls
    import transformers

    auto = getattr(transformers, _AUTO_CLASSES[chosen_task])
    torch.manual_seed(0)
    try:
        model = auto.from_config(config)
    except Exception as exc:
        raise ModelSpecError(
            f"transformers cannot build a {config.model_type} model for {chosen_task}: "
            f"{shorten(f'{type(exc).__name__}: {exc}', 160)}"
        ) from None
    loss = nn.functional.cross_entropy if chosen_task == "image-classification" else _token_loss
    name = f"{PREFIX}{path}?task={chosen_task}"
    if chosen_task != "image-classification":
        name += f"&seq_len={length}"
    notes = (f"built {type(model).__name__} from {path} (task {chosen_task}, random weights, dropout 0)",)
    return Workload(model, _batches(chosen_task, config, length), loss, name, notes=notes)
