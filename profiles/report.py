"""A plain-text table of a profile: per unit, the tensors crossing units, and the unit-sum check."""

from __future__ import annotations

from planner.formatting import format_table, human_bytes, human_count, human_flops, human_seconds
from profiles.format import Profile

__all__ = ["format_profile_table", "meta_line", "unit_sum_line", "cost_line"]


def meta_line(profile: Profile) -> str:
    """For a meta profile: the peak resident memory against the model's weights, and the copied units."""
    settings = profile.settings
    if not settings.get("meta"):
        return ""
    line = "meta profile (one unit materialised at a time)"
    peak = settings.get("peak_rss_bytes")
    if isinstance(peak, int) and profile.model.param_bytes > 0:
        line += (
            f": peak resident memory {human_bytes(peak)} for {human_bytes(profile.model.param_bytes)} of parameters "
            f"({peak / profile.model.param_bytes:.0%})"
        )
    copied = settings.get("sampled_from")
    if isinstance(copied, dict) and copied:
        measured = len({str(v) for v in copied.values()})
        line += f"; {len(copied)} units copied from {measured} measured identical unit{'s' if measured > 1 else ''}"
    return line


def unit_sum_line(profile: Profile, size_index: int) -> str:
    """``b=2: unit sum 17.2 ms vs whole model 15.7 ms (exported as one piece): +9.5%; ...`` (fwd + bwd).

    The percentage is :meth:`Profile.unit_sum_error`: where the rounds paired the two, the median of their ratio
    in each round, and the medians' own ratio follows it. With a measured piece overhead it adds the unit sum
    less (units - 1) overheads: a stage run as one piece pays the harness's fixed cost once where the units,
    timed one by one, pay it each.
    """
    units, whole = profile.unit_sum_s(size_index), profile.whole_s(size_index)
    b = profile.micro_batch_sizes[size_index]
    if profile.settings.get("meta"):  # whole_model holds the unit sum: nothing to compare (profile-format.md)
        return (
            f"b={b}: unit sum {human_seconds(units)}; whole model not measured (a meta profile holds one unit at a "
            "time)"
        )
    path = profile.settings.get("whole_model_path")
    error = profile.unit_sum_error(size_index)
    line = f"b={b}: unit sum {human_seconds(units)} vs whole model {human_seconds(whole)}"
    line += f" ({path}): {error * 100:+.1f}%" if path else f": {error * 100:+.1f}%"
    if profile.paired_unit_sum_ratio(size_index) is not None and whole > 0:
        errors, rounds = profile.settings.get("unit_sum_ratio_error"), profile.settings.get("repeats_used")
        known = f", +-{errors[size_index] * 100:.1f}%" if isinstance(errors, list) and len(errors) > size_index else ""
        over = f" over {rounds[size_index]} rounds" if isinstance(rounds, list) and len(rounds) > size_index else ""
        line += f" (paired in each round{over}{known}; the medians apart {_percent(units, whole)})"
    extra = profile.num_units - 1
    overhead = profile.overhead_s(size_index)
    if profile.piece_overhead is not None and extra > 0 and whole > 0:
        net = error - extra * overhead / whole
        line += f"; less {extra} x piece overhead {human_seconds(overhead)}: {net * 100:+.1f}%"
    return line


def _percent(value: float, reference: float) -> str:
    return f"{(value - reference) / reference * 100:+.1f}%" if reference > 0 else "n/a"


def _table(rows: list[list[str]], right: set[int]) -> list[str]:
    align = "".join(">" if i in right else "<" for i in range(len(rows[0])))
    return format_table(rows[0], rows[1:], align=align).splitlines()


def _unit_table(profile: Profile, j: int) -> list[str]:
    rows = [["#", "unit", "type", "params", "forward", "backward", "FLOPs (MAC)", "output", "saved"]]
    for i, u in enumerate(profile.units):
        params = human_count(u.param_count) + (" (tied)" if u.tied_params else "")
        rows.append(
            [
                str(i),
                u.name,
                u.type,
                params,
                human_seconds(u.forward_s[j]),
                human_seconds(u.backward_s[j]),
                human_flops(u.flops[j]),
                human_bytes(u.output_bytes[j]),
                human_bytes(u.saved_bytes[j]),
            ]
        )
    return _table(rows, right={0, 3, 4, 5, 6, 7, 8})


def _tensor_table(profile: Profile, j: int) -> list[str]:
    rows = [["tensor", "from", "to", "dtype", "grad", "bytes", "skip"]]
    for t in profile.tensors:
        src = "input" if t.producer < 0 else str(t.producer)
        skip = "skip" if t.last_consumer > t.producer + 1 else ""
        rows.append(
            [
                t.name,
                src,
                ",".join(map(str, t.consumers)),
                t.dtype,
                "yes" if t.needs_grad else "no",
                human_bytes(t.bytes[j]),
                skip,
            ]
        )
    return _table(rows, right={1, 5})


def format_profile_table(profile: Profile, micro_batch_size: int | None = None, all_sizes: bool = False) -> str:
    """The profile as text, at ``micro_batch_size`` (default the smallest) or at every size."""
    if all_sizes:
        sizes = list(profile.micro_batch_sizes)
    else:
        sizes = [micro_batch_size if micro_batch_size is not None else min(profile.micro_batch_sizes)]
    d = profile.device
    lines = [
        f"model {profile.model.name}: {profile.model.param_count:,} parameters, {profile.num_units} units; "
        f"{d.kind} {d.name} ({d.dtype}), capture {profile.settings.get('capture', '?')}, "
        f"threads {profile.settings.get('threads', '?')}",
    ]
    meta = meta_line(profile)
    if meta:
        lines.append(meta)
    others = [b for b in profile.micro_batch_sizes if b not in sizes]
    for b in sizes:
        j = profile.size_index(b)
        also = f" (also profiled: {', '.join(map(str, others))}; show --micro-batch-size N|all)" if others else ""
        lines += ["", f"micro-batch size {b}{also}:"]
        lines += _unit_table(profile, j)
        if profile.tensors:
            lines += ["", f"tensors crossing units (micro-batch size {b}):"]
            lines += _tensor_table(profile, j)
    lines += ["", "unit sum vs whole model (forward + backward):"]
    lines += [unit_sum_line(profile, j) for j in range(len(profile.micro_batch_sizes))]
    if profile.resume is not None:
        gaps = ", ".join(f"{g * 1e3:g}" for g in profile.resume.gaps_s)
        lines += ["", f"after a wait of {gaps} ms, the whole model's forward / backward took longer by:"]
        for j, b in enumerate(profile.micro_batch_sizes):
            pairs = zip(profile.resume.forward_s[j], profile.resume.backward_s[j], strict=True)
            lines.append(f"b={b}: " + ", ".join(f"+{human_seconds(f)} / +{human_seconds(w)}" for f, w in pairs))
    cost = cost_line(profile)
    if cost:
        lines += ["", cost]
    return "\n".join(lines)


def cost_line(profile: Profile) -> str | None:
    """What measuring ``profile`` took, part by part, as its settings record it (None where they record none: a
    modelled profile, or one measured one unit at a time)."""
    s, parts = profile.settings, []
    if "rounds_s" in s:
        rounds = s.get("repeats_used")
        each = ", ".join(f"{r} at b={b}" for r, b in zip(rounds or (), profile.micro_batch_sizes, strict=False))
        each = f" ({each})" if each else ""
        parts.append(f"{human_seconds(s['rounds_s'])} of rounds{each}")
    if "after_rounds_s" in s:
        parts.append(f"{human_seconds(s['after_rounds_s'])} after them (the model after a wait, at other threads)")
    if "pipeline_run_s" in s:
        parts.append(f"{human_seconds(s['pipeline_run_s'])} running it as a pipeline")
    return f"measuring took {', '.join(parts)}" if parts else None
