"""A plain-text table of a profile: per unit, the tensors crossing units, and the unit-sum check."""

from __future__ import annotations

from planner.table import format_table
from profiles.format import Profile

__all__ = ["format_profile_table", "human_bytes", "meta_line", "unit_sum_line"]


def human_bytes(n: int | float) -> str:
    """``1536`` -> ``1.5 KiB``."""
    value = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if abs(value) < 1024 or unit == "GiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    raise AssertionError("unreachable")


def _human_count(n: int) -> str:
    for div, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if n >= div:
            return f"{n / div:.2f}{suffix}"
    return str(n)


def _seconds(s: float) -> str:
    if s < 1e-3:
        return f"{s * 1e6:.0f} us"
    return f"{s * 1e3:.1f} ms" if s < 1 else f"{s:.2f} s"


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

    With a measured piece overhead it adds the unit sum less (units - 1) overheads: a stage run as one
    piece pays the harness's fixed cost once where the units, timed one by one, pay it each.
    """
    units, whole = profile.unit_sum_s(size_index), profile.whole_s(size_index)
    b = profile.micro_batch_sizes[size_index]
    if profile.settings.get("meta"):  # whole_model holds the unit sum: nothing to compare (profile-format.md)
        return f"b={b}: unit sum {_seconds(units)}; whole model not measured (a meta profile holds one unit at a time)"
    path = profile.settings.get("whole_model_path")
    line = f"b={b}: unit sum {_seconds(units)} vs whole model {_seconds(whole)}"
    line += f" ({path}): {_percent(units, whole)}" if path else f": {_percent(units, whole)}"
    extra = profile.num_units - 1
    overhead = profile.overhead_s(size_index)
    if profile.piece_overhead is not None and extra > 0:
        net = units - extra * overhead
        line += f"; less {extra} x piece overhead {_seconds(overhead)}: {_percent(net, whole)}"
    return line


def _percent(value: float, reference: float) -> str:
    return f"{(value - reference) / reference * 100:+.1f}%" if reference > 0 else "n/a"


def _table(rows: list[list[str]], right: set[int]) -> list[str]:
    align = "".join(">" if i in right else "<" for i in range(len(rows[0])))
    return format_table(rows[0], rows[1:], align=align).splitlines()


def _unit_table(profile: Profile, j: int) -> list[str]:
    rows = [["#", "unit", "type", "params", "fwd ms", "bwd ms", "GFLOPs(MAC)", "output", "saved"]]
    for i, u in enumerate(profile.units):
        params = _human_count(u.param_count) + (" (tied)" if u.tied_params else "")
        rows.append(
            [
                str(i),
                u.name,
                u.type,
                params,
                f"{u.forward_s[j] * 1e3:.2f}",
                f"{u.backward_s[j] * 1e3:.2f}",
                f"{u.flops[j] / 1e9:.4g}",
                human_bytes(u.output_bytes[j]),
                human_bytes(u.saved_bytes[j]),
            ]
        )
    return _table(rows, right={0, 3, 4, 5, 6, 7, 8})


def _tensor_table(profile: Profile, j: int) -> list[str]:
    rows = [["tensor", "from", "to", "dtype", "grad", "bytes", ""]]
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
    for b in sizes:
        j = profile.size_index(b)
        lines += ["", f"micro-batch size {b}:"]
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
            lines.append(f"b={b}: " + ", ".join(f"+{_seconds(f)} / +{_seconds(w)}" for f, w in pairs))
    return "\n".join(lines)
