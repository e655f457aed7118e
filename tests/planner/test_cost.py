import math

import pytest

from planner.cost import CostSettings, build_problem, bytes_per_param, parse_bytes, stage_memory, unit_costs
from planner.errors import UsageError
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
    assert bytes_per_param("float32", "sgd") == (4, 4, 0)
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
    )
    memory = stage_memory(profile, costs, settings, 1, 2, in_flight=1, recompute=recompute)
    assert memory.peak == stage_cost(problem, 1, 1, 2, recompute).memory_bytes
    assert memory.params == 50 * 4 and memory.grads == 50 * 4 and memory.optimizer == 50 * 8
    # Without recompute: 500 saved bytes x 1 in flight; with: the 1024-byte input + one re-materialisation.
    assert memory.activations == (1024 + 500 if recompute else 500)
    assert memory.transient == 2 * 1024


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
