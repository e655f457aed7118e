"""What follows a rank's last action: the step tail the simulator adds per rank (``RuntimeTerms.step_tail_s``).

Gradient synchronisation over the data-parallel replicas, the sum of a weight tied across ranks, then the
optimizer step and ``zero_grad`` (docs/cost-model.md, "Runtime terms"); and which ranks start their tails together
because a tied weight's sum waits for both.
"""

from __future__ import annotations

from planner.cost import CostSettings, DataParallel, UnitCosts, bytes_per_param, tie_owner
from profiles.format import Profile

__all__ = ["step_tails", "tail_groups", "LAST_BUCKET_BYTES"]

LAST_BUCKET_BYTES = 25 * 2**20
"""The gradients reduced after a rank's last backward when the reduction overlaps the backward: a bucket of DDP's
default size (``bucket_cap_mb=25``), whose reduction can start only once its last gradient is computed."""


def _gradient_sync_s(dp: DataParallel | None, weight_bytes: float, grad_bytes: float, backward_s: float = 0.0) -> float:
    """A rank's gradient synchronisation over its replicas after its last backward: DDP all-reduces
    the gradients; ZeRO-1 reduce-scatters them and all-gathers the updated weights (the same volume);
    FSDP has reduce-scattered them after every backward already (``planner.cost._with_gathers``), unless it
    keeps the stage gathered all step (``gathered_all_step``): then the step gathers the weights once and
    reduce-scatters the gradients once, ZeRO-1's volume. Overlapped (``overlaps_backward``), the gradients'
    part runs behind the rank's last backward of ``backward_s``, all but the last bucket (:data:`LAST_BUCKET_BYTES`)."""
    if dp is None or (dp.shard == "full" and not dp.gathered_all_step):
        return 0.0
    if dp.shard != "none":
        grads_s, weights_s = dp.gather_s(grad_bytes), dp.gather_s(weight_bytes)
    else:
        grads_s, weights_s = dp.allreduce_s(grad_bytes), 0.0
    if dp.overlaps_backward:
        # Behind the rank's last backward (``backward_s``): what outlasts it is left, and never less than the last
        # bucket, whose gradients are ready only when the backward ends.
        last = min(grad_bytes, LAST_BUCKET_BYTES)
        last_s = dp.gather_s(last) if dp.shard != "none" else dp.allreduce_s(last)
        grads_s = max(min(grads_s, last_s), grads_s - backward_s)
    return grads_s + weights_s


def tail_groups(
    profile: Profile, stage_units: list[range] | list[list[int]], stage_rank: tuple[int, ...]
) -> tuple[tuple[int, ...], ...]:
    """Pairs of ranks whose step tails open with the sum of a weight tied across them (a copy and
    its owner on different ranks): neither finishes it before both have finished their last action."""
    unit_rank = {u: stage_rank[s] for s, units in enumerate(stage_units) for u in units}
    pairs = {
        tuple(sorted((unit_rank[u], unit_rank[tie_owner(profile, u)])))
        for u, unit in enumerate(profile.units)
        if unit.tied_param_count and unit.tied_params
    }
    return tuple(sorted(p for p in pairs if p[0] != p[1]))


def step_tails(
    profile: Profile,
    costs: UnitCosts,
    settings: CostSettings,
    stage_units: list[range] | list[list[int]],
    stage_rank: tuple[int, ...],
) -> tuple[float, ...]:
    """Per rank, what follows its last action: gradient synchronisation over the data-parallel replicas,
    tied-gradient sum, then optimizer step and zero_grad.

    The replicas' synchronisation (see :func:`_gradient_sync_s`) needs no calibration. With one,
    ``optimizer_s(parameters and parameter tensors of the rank)`` (docs/cost-model.md, "Runtime terms"),
    plus, for every tied copy whose owner sits on another rank, the two ranks swapping the copy's gradient
    (``Calibration.swap_s``: one message each way at once). Zero for every rank without either.
    """
    num_ranks = max(stage_rank) + 1
    cal, dp = settings.calibration, settings.data_parallel
    if cal is None and dp is None:
        return (0.0,) * num_ranks
    unit_rank = {u: stage_rank[s] for s, units in enumerate(stage_units) for u in units}
    params, tensors = [0] * num_ranks, [0] * num_ranks
    for u, r in unit_rank.items():
        params[r] += costs.param_count[u]
        tensors[r] += profile.units[u].param_tensor_count
    weight_bytes, grad_bytes, _ = bytes_per_param(profile.device.dtype, settings.optimizer)
    backward_s = [0.0] * num_ranks
    for u, r in unit_rank.items():
        backward_s[r] += costs.backward_s[u]
    tails = [_gradient_sync_s(dp, n * weight_bytes, n * grad_bytes, b) for n, b in zip(params, backward_s, strict=True)]
    if cal is None:
        return tuple(tails)
    # A sharded optimizer steps only the replica's share of the parameters.
    share = dp.replicas if dp is not None and dp.shard != "none" else 1
    for r, (n, k) in enumerate(zip(params, tensors, strict=True)):
        tails[r] += cal.optimizer_s(settings.optimizer, -(-n // share), k) if n else 0.0
    for u, unit in enumerate(profile.units):
        if unit.tied_param_count and unit.tied_params:
            here, there = unit_rank[u], unit_rank[tie_owner(profile, u)]
            if here != there:
                seconds = cal.swap_s(unit.tied_param_count * weight_bytes)
                tails[here] += seconds
                tails[there] += seconds
    return tuple(tails)
