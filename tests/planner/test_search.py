import json
import warnings

import pytest

from planner.cost import CostSettings
from planner.errors import PlanInfeasibleError, UsageError
from planner.request import PlanRequest
from planner.schedule.pipeline import Pipeline
from planner.schedule.simulate import simulate
from planner.search import make_plan
from solvers.problem import stage_cost
from synthetic import make_profile

SHA = "00" * 32
FAST_LINK = CostSettings(link_bytes_per_s=1e15, link_latency_s=0.0)


def _plan(profile, **kwargs):
    kwargs.setdefault("settings", FAST_LINK)
    return make_plan(profile, PlanRequest(**kwargs), sha256=SHA)


def test_equal_units_split_evenly():
    plan = _plan(make_profile([1.0] * 8), num_ranks=4, global_batch_size=8, schedule="1f1b", recompute="off")
    assert plan.split_points == ("layers.2", "layers.4", "layers.6")
    assert [s.rank for s in plan.stages] == [0, 1, 2, 3]
    # Uniform 1F1B with f = 2, b = 4 per stage: (M + P - 1)(f + b) = 11 * 6.
    assert plan.predicted.iteration_s == pytest.approx(66.0)
    assert plan.predicted.bubble_fraction == pytest.approx(3 / 11)


def test_heavy_lm_head_gets_a_stage_of_its_own_and_beats_uniform():
    profile = make_profile([1.0] * 7 + [4.0])
    plan = _plan(profile, num_ranks=4, global_batch_size=16, schedule="1f1b", recompute="off")
    assert plan.stages[-1].units == ("layers.7",)
    uniform = next(b for b in plan.baselines if b.name.startswith("uniform"))
    assert uniform.split_points == ("layers.2", "layers.4", "layers.6")
    assert uniform.iteration_s > plan.predicted.iteration_s * 1.15


def test_prediction_is_the_simulation_of_the_stages():
    profile = make_profile([1.0, 3.0, 1.0, 2.0, 2.0, 1.0])
    plan = _plan(profile, num_ranks=3, global_batch_size=6, schedule="gpipe", recompute="off")
    result = simulate(
        Pipeline([s.forward_s for s in plan.stages], [s.backward_s for s in plan.stages], 6, "gpipe", num_ranks=3)
    )
    assert plan.predicted.iteration_s == pytest.approx(result.iteration_s)
    # GPipe with zero communication is a pair of flow shops (docs/cost-model.md).
    f = [s.forward_s for s in plan.stages]
    b = [s.backward_s for s in plan.stages]
    assert result.iteration_s == pytest.approx(sum(f) + 5 * max(f) + sum(b) + 5 * max(b))


def test_auto_search_picks_a_schedule_and_micro_batch_size():
    profile = make_profile([1.0] * 8, sizes=(1, 2, 4))
    plan = _plan(profile, num_ranks=2, global_batch_size=8)
    assert plan.micro_batch_size * plan.num_microbatches == 8
    assert plan.schedule in ("gpipe", "1f1b", "interleaved-1f1b")
    assert plan.solver.candidates >= 3


def test_memory_forces_recomputation():
    # 4 units, each 8 MB saved per micro-batch; 1 MB input; GPipe holds all 8 micro-batches.
    profile = make_profile([1.0] * 4, saved_bytes=[8_000_000] * 4, activation_bytes=1_000_000, param_counts=[10] * 4)
    settings = CostSettings(link_bytes_per_s=1e15, link_latency_s=0.0, device_memory_bytes=(100_000_000,))
    plan = _plan(profile, num_ranks=2, global_batch_size=8, schedule="gpipe", settings=settings)
    assert any(s.recompute for s in plan.stages)
    assert all(s.memory_bytes.peak <= 90_000_000 for s in plan.stages)
    with pytest.raises(PlanInfeasibleError, match="no plan fits"):
        _plan(profile, num_ranks=2, global_batch_size=8, schedule="gpipe", recompute="off", settings=settings)


def test_no_plan_fits_says_what_the_smallest_plan_needs():
    # Four equal units of 1 MB of state (Adam, 16 B x 62,500 parameters) on 2 devices: the smallest plan holds
    # two units a device. Usable memory a little below it: no plan; the message gives its need in MiB.
    from planner.formatting import human_bytes
    from planner.search import _least_memory_problem
    from solvers.dp import smallest_plan_bytes

    profile = make_profile([1.0] * 4, param_counts=[62_500] * 4, saved_bytes=[1000] * 4)
    request = PlanRequest(num_ranks=2, global_batch_size=4, settings=FAST_LINK)
    problem, _, _, _ = _least_memory_problem(profile, request)
    exact = min(
        max(stage_cost(problem, 0, 0, k - 1, True).memory_bytes, stage_cost(problem, 1, k, 3, True).memory_bytes)
        for k in range(1, 4)
    )
    least = smallest_plan_bytes(problem)
    assert exact <= least <= exact * 1.005
    settings = CostSettings(link_bytes_per_s=1e15, link_latency_s=0.0, device_memory_bytes=(int(exact / 0.9 * 0.97),))
    with pytest.raises(PlanInfeasibleError) as caught:
        _plan(profile, num_ranks=2, global_batch_size=4, settings=settings)
    message = str(caught.value)
    assert (
        f"the smallest plan (1f1b, micro-batch 1, recomputation on every stage) needs {human_bytes(least)}" in message
    )
    assert "MiB usable" in message and "GiB" not in message
    # Usable memory just above it: that plan exists.
    roomy = CostSettings(link_bytes_per_s=1e15, link_latency_s=0.0, device_memory_bytes=(int(least / 0.9 * 1.01),))
    plan = _plan(profile, num_ranks=2, global_batch_size=4, settings=roomy)
    usable = plan.constraints["capacity_bytes"][0]
    assert all(s.memory_bytes.peak * len(plan.stages_of_rank(s.rank)) <= usable for s in plan.stages)


def test_no_plan_fits_under_the_asked_schedule_counts_its_stages_per_device():
    # Interleaved 1F1B gives each of a device's 2 stages half of it: the smallest plan is that schedule's.
    from planner.formatting import human_bytes
    from planner.search import _least_memory_problem
    from solvers.dp import smallest_plan_bytes

    profile = make_profile([1.0] * 8, param_counts=[62_500] * 8, saved_bytes=[1000] * 8)
    request = PlanRequest(num_ranks=2, global_batch_size=4, schedule="interleaved-1f1b", settings=FAST_LINK)
    problem, _, schedule, per_device = _least_memory_problem(profile, request)
    assert schedule.value == "interleaved-1f1b" and per_device == 2 and problem.num_stages == 4
    least = smallest_plan_bytes(problem) * per_device

    def settings(device_bytes: float) -> CostSettings:
        return CostSettings(link_bytes_per_s=1e15, link_latency_s=0.0, device_memory_bytes=(int(device_bytes),))

    with pytest.raises(PlanInfeasibleError, match="interleaved-1f1b, 2 stages a device") as caught:
        _plan(
            profile,
            num_ranks=2,
            global_batch_size=4,
            schedule="interleaved-1f1b",
            settings=settings(least / 0.9 * 0.97),
        )
    assert f"needs {human_bytes(least)}" in str(caught.value)
    plan = _plan(
        profile, num_ranks=2, global_batch_size=4, schedule="interleaved-1f1b", settings=settings(least / 0.9 * 1.01)
    )
    assert plan.schedule.value == "interleaved-1f1b"


def test_a_unit_that_cannot_fit_anywhere_is_named():
    profile = make_profile([1.0] * 3, param_counts=[10, 10_000_000, 10])
    settings = CostSettings(device_memory_bytes=(50_000_000,))
    with pytest.raises(PlanInfeasibleError, match="unit layers.1 alone needs"):
        _plan(profile, num_ranks=2, global_batch_size=2, settings=settings)


def test_bad_requests():
    profile = make_profile([1.0] * 3, sizes=(2, 4))
    with pytest.raises(UsageError, match="cannot cut 3 units into 4 stages"):
        _plan(profile, num_ranks=4, global_batch_size=4)
    with pytest.raises(UsageError, match="not divisible by any profiled micro-batch size"):
        _plan(profile, num_ranks=2, global_batch_size=7)


def test_same_inputs_give_the_same_plan():
    profile = make_profile([1.0, 2.0, 3.0, 1.0, 1.0], sizes=(1, 2))
    a = _plan(profile, num_ranks=2, global_batch_size=4)
    b = _plan(profile, num_ranks=2, global_batch_size=4)
    assert json.dumps(a.to_dict(), sort_keys=True) == json.dumps(b.to_dict(), sort_keys=True)
    assert a.solver.solve_s is None


def test_ilp_is_used_for_heterogeneous_devices():
    settings = CostSettings(link_bytes_per_s=1e15, link_latency_s=0.0, device_speeds=(2.0, 1.0))
    plan = _plan(make_profile([1.0] * 6), num_ranks=2, global_batch_size=4, schedule="1f1b", settings=settings)
    assert plan.solver.name == "ilp"
    # The twice-as-fast rank takes twice the units.
    assert len(plan.stages[0].units) == 4


def test_measured_split_makes_the_zero_bubble_schedules_win():
    # Equal units, b = 2 f with W = half of b: the split schedules fill the 1F1B bubble with W.
    profile = make_profile([1.0] * 8, weight_share=0.5)
    plan = _plan(profile, num_ranks=4, global_batch_size=8, recompute="off")
    assert plan.schedule.splits_backward
    one = _plan(profile, num_ranks=4, global_batch_size=8, recompute="off", schedule="1f1b")
    assert plan.predicted.iteration_s < one.predicted.iteration_s
    # Each stage carries its I and W; the first stage runs its whole backward as W (torch skips its I).
    assert all(s.input_s is not None and s.weight_s is not None for s in plan.stages)
    assert plan.stages[0].input_s == 0.0 and plan.stages[0].weight_s == plan.stages[0].backward_s
    # The peers keep their 1F1B.
    assert all(b.name.endswith("1f1b") for b in plan.baselines)


def test_without_a_measured_split_auto_leaves_the_split_schedules_out():
    plan = _plan(make_profile([1.0] * 8), num_ranks=4, global_batch_size=8, recompute="off")
    assert not plan.schedule.splits_backward
    # Asked for by name, zero-bubble runs with the backward unsplit: no I/W in the plan.
    zb = _plan(make_profile([1.0] * 8), num_ranks=4, global_batch_size=8, recompute="off", schedule="zero-bubble")
    assert all(s.weight_s is None for s in zb.stages)


@pytest.mark.parametrize("schedule", ["zbv", "dualpipev"])
def test_v_schedules_plan_in_a_v(schedule):
    plan = _plan(make_profile([1.0] * 8, weight_share=0.5), num_ranks=2, global_batch_size=8, schedule=schedule)
    assert plan.num_stages == 4 and plan.virtual_stages == 2
    assert [s.rank for s in plan.stages] == [0, 1, 1, 0]


def test_near_best_prefers_evenly_used_ranks():
    from planner.search import Candidate, _ranked

    def candidate(iteration_s, busy, peak):
        sim = simulate(Pipeline([1.0, 1.0], [1.0, 1.0], 2, "gpipe"))
        sim = type(sim)(**{**sim.__dict__, "iteration_s": iteration_s, "busy_s": busy})
        return Candidate(1, 2, sim.schedule, 1, None, None, sim, peak)  # type: ignore[arg-type]

    lopsided = candidate(10.0, (9.0, 0.1), 1.0)
    even = candidate(10.05, (8.0, 8.0), 2.0)
    even_small = candidate(10.08, (8.0, 8.0), 1.5)
    slow = candidate(12.0, (5.0, 5.0), 0.5)
    ranked = _ranked([lopsided, even, even_small, slow])
    assert ranked == [even_small, even, lopsided, slow]


def test_split_schedules_count_the_gradients_kept_for_w():
    # Past I a micro-batch holds its activations and the 64 bytes of gradients I keeps for W, until W (the last
    # stage no longer its output and the loss's, but for the output of the rank's latest forward, which torch's
    # schedule loop keeps until the next): at each backward action's start, the stage holds its waiting
    # micro-batches and those past I.
    from planner.cost import schedule_moments

    profile = make_profile([1.0] * 4, weight_share=0.5, saved_bytes=[1000] * 4)
    zb = _plan(profile, num_ranks=2, global_batch_size=4, recompute="off", schedule="zero-bubble")
    one = _plan(profile, num_ranks=2, global_batch_size=4, recompute="off", schedule="1f1b")
    moments = schedule_moments(zb.schedule, zb.num_stages, zb.num_microbatches, zb.num_ranks)
    last = zb.num_stages - 1
    for z in zb.stages:
        kept = 0 if z.index == 0 else 64  # the first stage runs no I: its micro-batches keep nothing for W
        # Past I the last stage lets go of its output and the loss's saved tensor (2 x 1024 bytes), at most
        # what its last unit holds (1000 bytes here).
        kept -= min(1000, 2 * 1024) if z.index == last else 0
        weights, grads = 4000 * len(z.units), 4000 * len(z.units)
        held = 1000 * len(z.units)
        state = weights + grads + 8000 * len(z.units)
        # Receive buffers of 4 micro-batches: the 1024-byte input, the output's 1024-byte gradient; and what
        # the runtime's sends still hold (an input gradient, an output) of the micro-batches sent.
        received = 4 * (1024 + (1024 if z.index < last else 0))
        sent_grad, sent_out = (1024 if z.index > 0 else 0), (1024 if z.index < last else 0)
        expected = max(
            state
            - (0 if m.grads else grads)
            + m.waiting * held
            + m.split * (held + kept)
            + 2048
            + received
            + m.sent_grads * sent_grad
            + m.sent_outputs * sent_out
            + (m.held_output * 1024 if z.index == last else 0)
            for m in moments[z.index]
        )
        assert z.memory_bytes.peak == expected
    for o in one.stages:
        assert o.memory_bytes.activations == 1000 * len(o.units) * o.in_flight


@pytest.mark.parametrize("seed", range(6))
def test_floors_leave_the_plan_unchanged(seed):
    # make_plans with two plans skips nothing (planner/bounds.py); its first is what the pruned search picks.
    import random

    from planner.calibration import shipped_calibration
    from planner.search import make_plans, plan_key

    rng = random.Random(seed)
    times = [rng.uniform(0.5, 2.0) for _ in range(rng.randint(8, 14))] + [rng.uniform(2.0, 5.0)]
    profile = make_profile(times, sizes=(1, 2, 4))
    settings = CostSettings(calibration=shipped_calibration("cpu")) if seed % 2 else FAST_LINK
    request = PlanRequest(num_ranks=rng.choice((2, 3, 4)), global_batch_size=rng.choice((8, 16)), settings=settings)
    pruned = make_plan(profile, request, sha256=SHA)
    everything = make_plans(profile, request, sha256=SHA, count=2)
    assert plan_key(pruned) == plan_key(everything[0])
    assert pruned.predicted.iteration_s == everything[0].predicted.iteration_s
    assert pruned.solver.candidates < everything[0].solver.candidates  # and the floors did skip some


@pytest.mark.parametrize("seed", range(8))
def test_partitions_shared_between_schedules_leave_the_plan_unchanged(seed, monkeypatch):
    # Interleaved 1F1B and looped BFS at the same v pose one problem apart from the micro-batches held; the
    # looser one's partitions serve the other when they fit its memory. Memory binds in half the seeds.
    import random

    import planner.search as search
    from planner.search import plan_key

    rng = random.Random(seed)
    times = [rng.uniform(0.5, 2.0) for _ in range(rng.randint(8, 12))]
    saved = [rng.choice((1, 4, 16)) * 2**20 for _ in times]
    memory = 2**36 if seed % 2 else 40 * 2**20
    profile = make_profile(times, sizes=(1, 2), saved_bytes=saved, memory_bytes=memory)
    for schedule in ("looped-bfs", None):
        request = PlanRequest(num_ranks=2, global_batch_size=8, schedule=schedule, recompute="off", settings=FAST_LINK)
        try:
            shared = make_plan(profile, request, sha256=SHA)
        except PlanInfeasibleError:
            continue
        with monkeypatch.context() as m:
            m.setattr(search, "_reused", lambda solved, problem: None)
            alone = make_plan(profile, request, sha256=SHA)
        assert plan_key(shared) == plan_key(alone)
        assert shared.predicted.iteration_s == alone.predicted.iteration_s


def test_a_looser_problems_partitions_serve_only_where_they_fit():
    from dataclasses import replace

    from planner.search import _reused
    from solvers.problem import Moment, PartitionProblem, PartitionSolution

    problem = PartitionProblem(
        forward_s=(1.0, 1.0, 1.0, 1.0),
        backward_s=(2.0, 2.0, 2.0, 2.0),
        num_stages=2,
        num_microbatches=4,
        saved_bytes=(10, 10, 10, 10),
        in_flight=(1, 3),
        capacity_bytes=(60.0, 60.0),
    )
    even = PartitionSolution((0, 2), (False, False), 18.0, 6.0, solver="dp")  # stage 1 holds 20 B x 3 = 60 B
    first = PartitionSolution((0, 1), (False, False), 30.0, 9.0, solver="dp")  # stage 1 holds 30 B x 3 = 90 B

    def held(*waiting: int) -> tuple[tuple[Moment, ...], ...]:
        return tuple((Moment(w),) for w in waiting)

    assert _reused([(held(1, 1), [even])], problem) == [even]
    assert _reused([(held(1, 1), [even, first])], problem) is None  # one does not fit: solve it afresh
    assert _reused([(held(1, 4), [even])], problem) is None  # held more on stage 1: its optimum may be too tight
    assert _reused([(held(1, 1), [])], problem) == []  # the looser problem had no partition: neither has this
    assert _reused([(held(1, 1), [even])], replace(problem, in_flight=(1, 4))) is None  # 80 B > 60 B
    # A moment with the gradients present holds more than one without them, whatever the sizes.
    no_grads = ((Moment(1, 0, False),), (Moment(3, 0, False),))
    with_grads = ((Moment(1, 0, True),), (Moment(3, 0, True),))
    assert _reused([(no_grads, [even])], problem) == [even]
    assert _reused([(with_grads, [even])], replace(problem, moments=no_grads)) is None


def test_a_cpu_plan_records_the_threads_its_profile_was_measured_with():
    # A replay then measures the stages with as many (planner.runtime.replay.profiled_threads).
    from dataclasses import replace

    profile = make_profile([1.0] * 4)
    assert "threads" not in _plan(profile, num_ranks=2, global_batch_size=4).device
    plan = _plan(replace(profile, settings={"threads": 3}), num_ranks=2, global_batch_size=4)
    assert plan.device == {"kind": "cpu", "name": "test-cpu", "dtype": "float32", "threads": 3}
    assert plan.profile_threads == 3
    assert replace(plan, device={**plan.device, "threads": True}).profile_threads is None  # JSON's true is no count


def test_a_plan_records_its_profiles_speed_reference():
    # verify compares the machine's speed now against it (profiles/reference.py).
    from dataclasses import replace

    profile = make_profile([1.0] * 4)
    plan = _plan(profile, num_ranks=2, global_batch_size=4)
    assert "reference_s" not in plan.device and plan.profile_reference_s is None
    plan = _plan(replace(profile, settings={"reference_s": 0.004}), num_ranks=2, global_batch_size=4)
    assert plan.device["reference_s"] == 0.004 and plan.profile_reference_s == 0.004
    for bad in (True, -1.0, "fast", float("nan")):
        assert replace(plan, device={**plan.device, "reference_s": bad}).profile_reference_s is None


def test_a_plan_records_the_profiles_unit_sum_at_its_micro_batch_size() -> None:
    # A replay's speed reference is the model's units, timed as the profile timed them (profiles/model_reference.py).
    from dataclasses import replace

    from profiles.format import ThreadScaling

    base = make_profile([1.0, 2.0, 1.0, 2.0], sizes=(1, 2))  # units: 6 s forward + 12 s backward per sample
    request = PlanRequest(num_ranks=2, global_batch_size=4, schedule="gpipe", micro_batch_size=2, recompute="off")
    assert "unit_sum_s" not in _plan_of(base, request).device  # no capture recorded: no pieces to rebuild
    exported = replace(base, settings={**base.settings, "capture": "export"})
    plan = _plan_of(exported, request)
    assert plan.device["unit_sum_s"] == pytest.approx(36.0) and plan.device["capture"] == "export"
    assert plan.profile_unit_sum_s == pytest.approx(36.0)
    # At the threads each rank gets, as the stages are.
    scaling = ThreadScaling((2, 1), factor=((1.0, 1.0), (1.5, 1.6)), reference_s=(0.004, 0.006))
    threaded = replace(exported, thread_scaling=scaling, settings={**exported.settings, "threads": 2})
    assert _plan_of(threaded, request).profile_unit_sum_s == pytest.approx(36.0 * 1.6)
    # A meta profile copies sampled units' times: no reference to time a replay against.
    meta = replace(exported, settings={**exported.settings, "meta": True})
    assert _plan_of(meta, request).profile_unit_sum_s is None
    assert replace(plan, device={**plan.device, "capture": "fx"}).profile_unit_sum_s is None


def _plan_of(profile, request):
    return make_plan(profile, request, sha256="0" * 64)


@pytest.mark.parametrize("seed", range(4))
def test_the_profile_resume_curve_enters_calibrated_plans_and_the_floors_still_hold(seed):
    # An action after a wait costs more (profiles/resume.py): the calibrated prediction carries the curve of
    # the plan's micro-batch size and is no faster for it; the floors stay lower bounds, so pruning keeps
    # the exhaustive search's plan; the textbook model has no runtime terms and ignores it.
    import random
    from dataclasses import replace

    from planner.calibration import shipped_calibration
    from planner.search import make_plans, plan_key
    from profiles.format import Resume

    rng = random.Random(seed)
    times = [rng.uniform(0.5, 2.0) for _ in range(rng.randint(8, 12))]
    plain = make_profile(times, sizes=(1, 2, 4))
    gaps = (0.5, 2.0)
    curve = Resume(gaps, tuple((0.1 * b, 0.3 * b) for b in (1, 2, 4)), tuple((0.05, 0.2) for _ in range(3)))
    profile = replace(plain, resume=curve)
    settings = CostSettings(calibration=shipped_calibration("cpu"))
    request = PlanRequest(num_ranks=rng.choice((2, 3)), global_batch_size=8, settings=settings)
    plan = make_plan(profile, request, sha256=SHA)
    assert plan.predicted.runtime.resume == curve.curve(profile.size_index(plan.micro_batch_size))
    assert plan.predicted.iteration_s >= make_plan(plain, request, sha256=SHA).predicted.iteration_s
    assert plan.simulation().iteration_s == pytest.approx(plan.predicted.iteration_s)
    everything = make_plans(profile, request, sha256=SHA, count=2)
    assert plan_key(plan) == plan_key(everything[0])
    textbook = make_plan(profile, PlanRequest(request.num_ranks, 8, settings=FAST_LINK), sha256=SHA)
    assert textbook.predicted.runtime.resume == ()


def test_a_cpu_plan_is_made_with_the_threads_each_rank_will_have() -> None:
    from dataclasses import replace

    from profiles.format import ThreadScaling

    base = make_profile([1.0, 2.0, 1.0, 2.0], sizes=(1,))
    scaling = ThreadScaling((2, 1), factor=((1.0,), (1.7,)), reference_s=(0.004, 0.006))
    profile = replace(base, thread_scaling=scaling, settings={**base.settings, "threads": 2, "reference_s": 0.004})
    request = PlanRequest(num_ranks=2, global_batch_size=4, schedule="gpipe", recompute="off")
    plan = make_plan(profile, request, sha256="0" * 64)
    alone = make_plan(base, request, sha256="0" * 64)
    # Each of 2 ranks on the 2-core profiling machine gets 1 thread: every stage 1.7x the 2-thread times.
    assert [s.forward_s for s in plan.stages] == pytest.approx([1.7 * s.forward_s for s in alone.stages])
    assert plan.device["threads"] == 1 and plan.device["reference_s"] == 0.006
    one = make_plan(profile, replace(request, num_ranks=1), sha256="0" * 64)
    assert one.device["threads"] == 2 and one.stages[0].forward_s == pytest.approx(6.0)


@pytest.mark.parametrize("seed", range(4))
def test_the_options_floors_hold_under_a_co_location_slowdown_that_depends_on_the_micro_batch(seed):
    # The simulator scales a pipeline's compute by the co-location factor at its micro-batch size; the floors
    # take that factor too (a slowdown of 1.3 to 1.6 here), and stay under every partition's simulated step.
    import random
    from dataclasses import replace

    from planner.calibration import shipped_calibration
    from planner.search import _options, _order_floor_s, _search

    rng = random.Random(seed)
    times = [rng.uniform(0.5, 2.0) for _ in range(rng.randint(8, 12))]
    profile = make_profile(times, sizes=(1, 2, 4))
    calibration = replace(shipped_calibration("cpu"), colocation_factor_by_micro_batch_size={1: 1.3, 4: 1.6})
    request = PlanRequest(
        num_ranks=rng.choice((2, 3, 4)), global_batch_size=16, settings=CostSettings(calibration=calibration)
    )
    options = {(o.micro_batch_size, o.schedule, o.virtual_stages): o for o in _options(profile, request, [])}
    candidates = _search(profile, request, None).candidates
    assert candidates
    for c in candidates:
        option = options[(c.micro_batch_size, c.schedule, c.virtual_stages)]
        assert option.floor_s <= c.simulation.iteration_s
        assert _order_floor_s(option, request, 0.0) <= c.simulation.iteration_s  # 0 to beat: always solved
    tight = min(
        c.simulation.iteration_s / options[(c.micro_batch_size, c.schedule, c.virtual_stages)].floor_s
        for c in candidates
    )
    assert tight < 1.3  # the floors took the slowdown: without it every step is 1.3x or more above them


def test_half_the_ranks_is_advised_only_where_the_profile_timed_their_threads() -> None:
    from dataclasses import replace

    from planner.search import fewer_ranks_faster
    from profiles.format import ThreadScaling

    # Four equal units, one micro-batch on 2 ranks: half the step idle. One rank of this 2-core machine gets both
    # cores, 0.6x the profiled time where the profile timed that: 4 x 3 s x 0.6 = 7.2 s against the pair's 12 s.
    base = make_profile([1.0] * 4, sizes=(1,))
    timed = replace(
        base,
        thread_scaling=ThreadScaling((2, 1), ((0.6,), (1.0,)), (1.0, 1.5), cores=2),
        settings={**base.settings, "threads": 1},
    )
    request = PlanRequest(num_ranks=2, global_batch_size=1)
    plan = make_plan(timed, request, sha256="0" * 64)
    assert plan.predicted.bubble_fraction > 0.4 and plan.predicted.iteration_s == pytest.approx(12.0, rel=1e-3)
    assert fewer_ranks_faster(timed, request, plan) == (1, pytest.approx(7.2))
    # Timed only at the pipeline's count (a profile made without --ranks 1): no advice, and no warning.
    untimed = replace(timed, thread_scaling=ThreadScaling((1,), ((1.0,),), (1.5,), cores=2))
    assert not untimed.timed_for_ranks(1) and untimed.timed_for_ranks(2) and timed.timed_for_ranks(1)
    assert fewer_ranks_faster(untimed, request, make_plan(untimed, request, sha256="0" * 64)) is None
    # Planned for that one rank, the plan takes the profiled times and says so; for 2, nothing to say.
    from planner.errors import PipeplanWarning
    from planner.planning import plan_profile
    from planner.request import PlanOptions

    with pytest.warns(PipeplanWarning, match=r"1 rank\(s\) get 2, which it did not time"):
        one = plan_profile(untimed, PlanOptions(ranks=1, global_batch=1), sha256="0" * 64).plan
    assert one.predicted.iteration_s == pytest.approx(12.0, rel=1e-3)  # 4 x 3 s, as profiled
    with warnings.catch_warnings():
        warnings.simplefilter("error", PipeplanWarning)
        plan_profile(untimed, PlanOptions(ranks=2, global_batch=1), sha256="0" * 64)
