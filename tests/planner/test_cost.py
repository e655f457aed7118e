import math

import pytest

from planner.cost import CostSettings, build_problem, bytes_per_param, parse_bytes, stage_memory, unit_costs
from planner.errors import UsageError
from planner.schedule.orders import Schedule
from solvers.problem import stage_cost
from synthetic import make_profile


@pytest.mark.parametrize(
    ("text", "value"),
    [("80GiB", 80 * 1024**3), ("16GB", 16 * 10**9), ("512MiB", 512 * 1024**2), ("1024", 1024), ("1.5KiB", 1536)],
)
def test_parse_bytes(text, value):
    assert parse_bytes(text) == value


@pytest.mark.parametrize("text", ["0GiB", "-3GB", "lots", ""])
def test_parse_bytes_rejects(text):
    with pytest.raises(UsageError):
        parse_bytes(text)


def test_bytes_per_param_follows_zero_paper():
    assert bytes_per_param("float32", "adam") == (4, 4, 8)
    assert bytes_per_param("bfloat16", "adam") == (2, 2, 12)  # 16 B/param in mixed precision
    assert bytes_per_param("float32", "sgd") == (4, 4, 4)  # with momentum, as the runtime steps it
    with pytest.raises(UsageError, match="unknown optimizer"):
        bytes_per_param("float32", "lion")


@pytest.mark.parametrize("kwargs", [{"link_bytes_per_s": 0}, {"link_latency_s": -1}, {"device_memory_bytes": (0,)}])
def test_settings_reject_non_positive(kwargs):
    with pytest.raises(UsageError):
        CostSettings(**kwargs)


def test_capacity_subtracts_headroom():
    profile = make_profile([1.0, 1.0], memory_bytes=1000)
    assert CostSettings().capacity(profile, 0, 2) == pytest.approx(900)
    assert CostSettings(device_memory_bytes=(100, 200)).capacity(profile, 1, 2) == pytest.approx(180)


@pytest.mark.parametrize("recompute", [False, True])
def test_stage_memory_matches_the_solver_cost(recompute):
    profile = make_profile([1.0, 2.0, 3.0], param_counts=[10, 20, 30], saved_bytes=[100, 200, 300])
    settings = CostSettings(link_bytes_per_s=1e6, link_latency_s=1e-3)
    costs = unit_costs(profile, 1)
    problem = build_problem(
        profile,
        costs,
        settings,
        num_stages=2,
        num_microbatches=4,
        in_flight=(2, 1),
        stage_rank=(0, 1),
        recompute_choices=(False, True),
        schedule=Schedule.ONE_F_ONE_B,
    )
    memory = stage_memory(profile, settings, problem, costs, 1, 1, 2, recompute)
    assert memory.peak == stage_cost(problem, 1, 1, 2, recompute).memory_bytes
    assert memory.params == 50 * 4 and memory.grads == 50 * 4 and memory.optimizer == 50 * 8
    # The last stage under 1F1B holds one micro-batch at its backward: 500 saved bytes; recomputing, the loss's
    # unit's 300 bytes held and the other 200 re-materialised.
    assert memory.activations == 500
    # Receive buffers of the 1024-byte input for each of the 4 micro-batches (the last stage gets no gradient),
    # and the previous backward's 1024-byte input gradient, still held by 1F1B's bwd_sends.
    assert memory.buffers == 4 * 1024 + 1024
    assert memory.transient == 2 * 1024  # unmeasured on this CPU profile: the output and its gradient
    assert memory.peak == 200 + 200 + 400 + 500 + 2048 + 5120


def test_gpipe_peaks_at_the_first_backward_without_gradients_or_the_second_with_them():
    # GPipe holds every micro-batch at its first backward, before the gradients exist; at its second, one
    # fewer and the gradients. Whichever is larger is the peak.
    profile = make_profile([1.0, 1.0], param_counts=[1000, 1000], saved_bytes=[100, 100])
    settings = CostSettings()
    costs = unit_costs(profile, 1)

    def peak(m: int):
        problem = build_problem(
            profile,
            costs,
            settings,
            num_stages=2,
            num_microbatches=m,
            in_flight=(m, m),
            stage_rank=(0, 1),
            recompute_choices=(False,),
            schedule=Schedule.GPIPE,
        )
        return stage_memory(profile, settings, problem, costs, 0, 0, 0, False)

    # 4000 bytes of gradients outweigh one micro-batch's 100: a later backward is the peak, the last here, where
    # GPipe's sends still hold three 1024-byte outputs (fwd_sends_to_wait keeps every send's work to the step's end).
    assert peak(4).grads == 4000 and peak(4).activations == 100
    assert peak(4).buffers == 4 * (1024 + 1024) + 3 * 1024
    huge = make_profile([1.0, 1.0], param_counts=[10, 10], saved_bytes=[10_000, 10_000])
    costs = unit_costs(huge, 1)
    problem = build_problem(
        huge,
        costs,
        settings,
        num_stages=2,
        num_microbatches=4,
        in_flight=(4, 4),
        stage_rank=(0, 1),
        recompute_choices=(False,),
        schedule=Schedule.GPIPE,
    )
    first = stage_memory(huge, settings, problem, costs, 0, 0, 0, False)
    assert first.grads == 0 and first.activations == 4 * 10_000


def test_adam_on_a_cpu_steps_with_two_temporaries_of_the_largest_parameter():
    profile = make_profile([1.0, 1.0], param_counts=[1000, 10], saved_bytes=[0, 0], largest_param_bytes=[3000, 40])
    settings = CostSettings()
    costs = unit_costs(profile, 1)
    problem = build_problem(
        profile,
        costs,
        settings,
        num_stages=1,
        num_microbatches=1,
        in_flight=(1,),
        stage_rank=(0,),
        recompute_choices=(False,),
        schedule=Schedule.GPIPE,
    )
    assert problem.step_bytes == (6000, 80) and not problem.step_bytes_add
    memory = stage_memory(profile, settings, problem, costs, 0, 0, 1, False)
    # The tail (weights, gradients, optimizer state, the input buffer and 6000 bytes of temporaries) outweighs
    # the pipeline's peak (2048 bytes of transient) here.
    assert memory.transient == 6000 and memory.grads == 1010 * 4 and memory.activations == 0
    sgd = CostSettings(optimizer="sgd")
    assert build_problem(
        profile,
        costs,
        sgd,
        num_stages=1,
        num_microbatches=1,
        in_flight=(1,),
        stage_rank=(0,),
        recompute_choices=(False,),
        schedule=Schedule.GPIPE,
    ).step_bytes == (0, 0)


def test_problem_comm_is_latency_plus_bytes_over_bandwidth():
    profile = make_profile([1.0, 1.0], activation_bytes=2000)
    costs = unit_costs(profile, 1)
    problem = build_problem(
        profile,
        costs,
        CostSettings(link_bytes_per_s=1000.0, link_latency_s=0.5),
        num_stages=2,
        num_microbatches=1,
        in_flight=(1, 1),
        stage_rank=(0, 1),
        recompute_choices=(False,),
    )
    assert problem.cut_forward_s == (2.5,)
    assert problem.cut_backward_s == (2.5,)
    assert problem.input_bytes == 2000
    assert math.isclose(problem.capacity_bytes[0], 0.9 * 64 * 1024**3)


def test_the_last_stage_holds_the_steps_target_and_every_finished_micro_batchs_loss():
    # torch's schedules keep each micro-batch's loss until the step ends (_internal_losses); the last stage holds
    # the step's target beside its receive buffers. Under 1F1B the last stage's fullest moment is its last
    # backward: one micro-batch waiting, three finished.
    from dataclasses import replace

    from profiles.format import LossMemory

    bare = make_profile([1.0, 1.0], param_counts=[1000, 1000], saved_bytes=[100, 100])
    with_loss = replace(bare, loss=LossMemory(target_bytes=(40,), kept_bytes=(24,)))
    settings = CostSettings()

    def last_stage(profile):
        costs = unit_costs(profile, 1)
        problem = build_problem(
            profile,
            costs,
            settings,
            num_stages=2,
            num_microbatches=4,
            in_flight=(2, 1),
            stage_rank=(0, 1),
            recompute_choices=(False,),
            schedule=Schedule.ONE_F_ONE_B,
        )
        return stage_memory(profile, settings, problem, costs, 1, 1, 1, False)

    before, after = last_stage(bare), last_stage(with_loss)
    assert after.buffers - before.buffers == 4 * 40
    assert after.activations - before.activations == 3 * 24
    assert after.peak - before.peak == 4 * 40 + 3 * 24
