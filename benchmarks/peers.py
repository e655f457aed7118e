"""The partitioners people use today, run as their own code where it is installed.

- DeepSpeed (``pip install deepspeed``): ``deepspeed.runtime.utils.partition_uniform`` and
  ``partition_balanced``, called the way ``PipelineModule._partition_layers`` calls them for
  ``partition_method='uniform'``, ``'parameters'`` (the default) and ``'type:<block>'``, plus
  ``partition_balanced`` fed the profiled unit times (what a careful user would do; DeepSpeed's own
  ``'profile'`` method raises NotImplementedError).
- torchgpipe (``pip install torchgpipe``): ``balance_by_time`` is ``blockpartition.solve`` on the
  per-layer times in integer microseconds (``torchgpipe.balance.profile_times``); fed the profiled times.
- Megatron-LM / torchtitan: uniform transformer layers per stage, the embedding on the first and the
  final norm + head on the last stage; and torchtitan's ``generate_llm_fqn_per_model_part`` with
  ``input_weight = output_weight = 1`` (one fewer layer on the first and last stage), ported below
  because torchtitan is a training repository, not installed here.

Every function returns ``boundaries`` (the first unit of every stage) or raises :class:`PeerSkipped`
with the reason, which the tables print.
"""

from __future__ import annotations

import re
import signal
from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["PeerSkipped", "block_units", "peer_partitions", "peer_versions"]

_SOLVE_TIMEOUT_S = 20


class PeerSkipped(Exception):
    """A peer that is not installed, does not apply to the model, or returns an invalid partition."""


def peer_versions() -> dict[str, str]:
    versions = {}
    for name in ("deepspeed", "torchgpipe"):
        try:
            module = __import__(name)
            versions[name] = getattr(module, "__version__", "?")
        except Exception as exc:  # not installed, or fails to import: the benchmark says so
            versions[name] = f"not available ({type(exc).__name__})"
    return versions


def block_units(names: Sequence[str]) -> tuple[int, int] | None:
    """``(first, last)`` indices of the model's repeated block list (``prefix.0``, ``prefix.1``, ...).

    None when no block list covers at least half of the units (e.g. a UNet's levels): layer-based
    partitioners (Megatron, torchtitan, DeepSpeed ``type:``) then do not apply.
    """
    prefixes = Counter(m.group(1) for n in names if (m := re.fullmatch(r"(.*)\.(\d+)", n)))
    if not prefixes:
        return None
    prefix, count = prefixes.most_common(1)[0]
    if count * 2 < len(names):
        return None
    indices = [i for i, n in enumerate(names) if re.fullmatch(re.escape(prefix) + r"\.\d+", n)]
    if indices != list(range(indices[0], indices[-1] + 1)):
        return None
    return indices[0], indices[-1]


def _parts_to_boundaries(parts: Sequence[Any], n: int, p: int, who: str) -> tuple[int, ...]:
    parts = [int(x) for x in parts]
    if (
        len(parts) != p + 1
        or parts[0] != 0
        or parts[-1] != n
        or any(b <= a for a, b in zip(parts, parts[1:], strict=False))
    ):
        raise PeerSkipped(f"{who} returned an invalid partition {parts} for {n} units on {p} stages")
    return tuple(parts[:-1])


def _deepspeed() -> Any:
    try:
        import logging

        logging.getLogger("DeepSpeed").setLevel(logging.ERROR)
        from deepspeed.runtime import utils
    except Exception as exc:
        raise PeerSkipped(f"deepspeed not installed ({type(exc).__name__}): pip install deepspeed") from None
    return utils


def _with_timeout(fn: Callable[[], Any], who: str) -> Any:
    # torchgpipe's block partition can loop forever on some inputs; a pure-Python loop is interruptible.
    def _alarm(signum: int, frame: Any) -> None:
        raise TimeoutError

    old = signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(_SOLVE_TIMEOUT_S)
    try:
        return fn()
    except TimeoutError:
        raise PeerSkipped(f"{who} did not return within {_SOLVE_TIMEOUT_S} s (it loops on this input)") from None
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, old)


def deepspeed_uniform(n: int, p: int) -> tuple[int, ...]:
    return _parts_to_boundaries(_deepspeed().partition_uniform(num_items=n, num_parts=p), n, p, "partition_uniform")


def deepspeed_balanced(weights: Sequence[float], p: int, who: str) -> tuple[int, ...]:
    utils = _deepspeed()
    parts = _with_timeout(lambda: utils.partition_balanced(weights=list(weights), num_parts=p), who)
    return _parts_to_boundaries(parts, len(weights), p, who)


def torchgpipe_by_time(times_s: Sequence[float], p: int) -> tuple[int, ...]:
    try:
        from torchgpipe.balance import balance_cost
    except Exception as exc:
        raise PeerSkipped(f"torchgpipe not installed ({type(exc).__name__}): pip install torchgpipe") from None
    micros = [int(t * 1_000_000) for t in times_s]  # torchgpipe's profile_times unit
    balance = _with_timeout(lambda: balance_cost(micros, p), "torchgpipe balance_cost")
    if len(balance) != p or sum(balance) != len(times_s) or min(balance) < 1:
        raise PeerSkipped(f"torchgpipe returned balance {balance} for {len(times_s)} units on {p} stages")
    starts, at = [], 0
    for size in balance:
        starts.append(at)
        at += size
    return tuple(starts)


def _layers_to_boundaries(layers_per_stage: Sequence[int], first: int, n: int) -> tuple[int, ...]:
    # Units before the block list join stage 0, units after it join the last stage, so the first and
    # last stages may hold no layer at all (torchtitan allows it: e.g. a stage of norm + output only).
    starts, at = [0], first
    for count in layers_per_stage[:-1]:
        at += count
        starts.append(at)
    if any(b <= a for a, b in zip(starts, starts[1:], strict=False)) or starts[-1] >= n:
        raise PeerSkipped(f"leaves an empty stage ({list(layers_per_stage)} layers per stage)")
    return tuple(starts)


def megatron_uniform(first: int, last: int, n: int, p: int) -> tuple[int, ...]:
    """Megatron-LM: ``num_layers / P`` layers per stage (Megatron asserts divisibility)."""
    layers = last - first + 1
    if layers % p:
        raise PeerSkipped(f"Megatron needs the {layers} layers divisible by {p} stages")
    return _layers_to_boundaries([layers // p] * p, first, n)


def torchtitan_weighted(
    first: int, last: int, n: int, p: int, input_weight: int = 1, output_weight: int = 1
) -> tuple[int, ...]:
    """torchtitan's ``generate_llm_fqn_per_model_part``: the embedding and the head each count as a layer."""
    layers = last - first + 1
    effective = layers + input_weight + output_weight
    per_stage, extra = divmod(effective, p)
    if per_stage == 0 or input_weight > per_stage or output_weight > per_stage:
        raise PeerSkipped(f"torchtitan refuses {layers} layers on {p} stages (weights exceed layers per stage)")
    counts, current = [], 0
    for s in range(p):
        budget = per_stage + (1 if s < extra else 0)
        if s == 0:
            budget -= input_weight
        elif s == p - 1:
            budget -= output_weight
        take = max(0, min(budget, layers - current))
        counts.append(take)
        current += take
    return _layers_to_boundaries(counts, first, n)


def peer_partitions(
    names: Sequence[str], times_s: Sequence[float], param_counts: Sequence[int], p: int
) -> dict[str, tuple[int, ...] | str]:
    """Every peer's boundaries for ``p`` stages, or the reason it was skipped."""
    n = len(names)
    blocks = block_units(names)
    runs: dict[str, Callable[[], tuple[int, ...]]] = {
        "DeepSpeed uniform": lambda: deepspeed_uniform(n, p),
        "DeepSpeed parameters (default)": lambda: deepspeed_balanced(param_counts, p, "partition_balanced"),
        "DeepSpeed type:block": lambda: _type_block(blocks, n, p),
        "DeepSpeed balanced on times": lambda: deepspeed_balanced(times_s, p, "partition_balanced"),
        "torchgpipe balance_by_time": lambda: torchgpipe_by_time(times_s, p),
        "Megatron uniform layers": lambda: megatron_uniform(*_need_blocks(blocks), n, p),
        "torchtitan (first/last one fewer)": lambda: torchtitan_weighted(*_need_blocks(blocks), n, p),
    }
    out: dict[str, tuple[int, ...] | str] = {}
    for name, run in runs.items():
        try:
            out[name] = run()
        except PeerSkipped as exc:
            out[name] = str(exc)
    return out


def _need_blocks(blocks: tuple[int, int] | None) -> tuple[int, int]:
    if blocks is None:
        raise PeerSkipped("no repeated block list: layer-based partitioning does not apply")
    return blocks


def _type_block(blocks: tuple[int, int] | None, n: int, p: int) -> tuple[int, ...]:
    first, last = _need_blocks(blocks)
    weights = [1 if first <= i <= last else 0 for i in range(n)]
    return deepspeed_balanced(weights, p, "partition_balanced (type:)")
