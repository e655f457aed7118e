"""Profile a model named by a MODEL spec, as ``pipeplan profile`` does: the threads its ranks will have, the
meta device when the model cannot be held whole, the units asked for."""

from __future__ import annotations

import logging

import torch

from profiles.cores import rank_threads
from profiles.format import Profile
from profiles.measure_settings import MIN_TIME_S, MeasureSettings
from profiles.meta import too_large
from profiles.profile_options import ProfileOptions
from profiles.profiler import profile_model
from profiles.workload import load_workload

__all__ = ["profile_spec", "parse_units", "needs_meta"]

log = logging.getLogger("pipeplan")


def parse_units(text: str | None) -> list[str] | int | None:
    """``--units``: a module depth (digits) or comma-separated FQNs; None: the default choice."""
    if not text:
        return None
    return int(text) if text.isdigit() else [u.strip() for u in text.split(",") if u.strip()]


def needs_meta(spec: str, *, seq_len: int | None, task: str | None, device: str, dtype: str) -> bool:
    """An ``hf:`` config too large to profile whole on ``device`` (built on meta first: no weights, seconds)."""
    try:
        probe = load_workload(spec, meta=True, seq_len=seq_len, task=task)
    except Exception:  # a best-effort look: the normal build reports what is wrong with the spec, in its words
        return False
    reason = too_large(probe.model, device, dtype)
    if reason:
        log.info("%s: profiling it on the meta device, one unit at a time (--meta)", reason)
    return bool(reason)


def profile_spec(options: ProfileOptions) -> Profile:
    """Build the model ``options.model`` names and profile it (:func:`profiles.profiler.profile_model`).

    ``options.threads`` (else the threads each of ``options.ranks`` processes on this machine gets; on a CPU,
    without either, those of a rank of a 2-rank pipeline) sets torch's intra-op threads for the measurement;
    ``sample_blocks`` implies ``meta``; an ``hf:`` config whose weights and gradients exceed the device goes
    meta by itself.
    """
    spec, device, dtype = options.model, options.device, options.dtype
    seq_len, task = options.seq_len, options.task
    # Timed at a pipeline rank's threads, not all cores: a step with every core's threads is the one a busy
    # machine slows most (a thread waiting for a core stalls the others), and it is not what any rank of a
    # pipeline runs with. The profile still records the scaling to every other rank count's threads.
    threads = options.threads or (rank_threads(options.ranks or 2) if device == "cpu" else None)
    if threads:
        torch.set_num_threads(threads)
    meta = options.meta or options.sample_blocks
    if not meta and spec.startswith("hf:"):
        meta = needs_meta(spec, seq_len=seq_len, task=task, device=device, dtype=dtype)
    workload = load_workload(spec, meta=meta, seq_len=seq_len, task=task)
    settings = MeasureSettings(
        micro_batch_sizes=options.micro_batch_sizes,
        device=device,
        dtype=dtype,
        repeats=options.repeats,
        max_repeats=max(options.max_repeats, options.repeats),
        warmup=options.warmup,
        units=parse_units(options.units),
        progress=not options.no_progress,
        sample_blocks=options.sample_blocks,
        min_time_s=MIN_TIME_S if options.min_time_s is None else options.min_time_s,
    )
    return profile_model(workload, settings)
