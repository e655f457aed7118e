"""The calibration format and the runtime terms it gives the planner: exact numbers, no torch."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from planner.calibration import (
    OptimizerCost,
    calibration_from_dict,
    format_calibration,
    load_calibration,
    save_calibration,
    shipped_calibration,
)
from planner.cost import CostSettings, _transfer_s, default_settings, unit_costs
from planner.errors import CalibrationError, UsageError
from planner.prediction import predict_plan
from planner.request import PlanRequest
from planner.schedule.orders import Schedule
from planner.schedule.pipeline import Pipeline
from planner.schedule.simulate import RuntimeTerms, simulate
from planner.search import make_plan, make_plans, plan_key
from planner.step_tails import step_tails, tail_groups
from synthetic import calibration, make_profile


def test_round_trip(tmp_path) -> None:
    cal = calibration(notes={"host": "here"}, transfer_compute_s_per_byte=4e-10)
    save_calibration(cal, tmp_path / "c.json")
    assert load_calibration(tmp_path / "c.json") == cal
    assert cal.runtime_terms(Schedule.GPIPE, (0.0, 0.0)).transfer_compute_s_per_byte == 4e-10
    assert "0.40 ns per byte" in format_calibration(cal)
    older = {k: v for k, v in cal.to_dict().items() if k != "transfer_compute_s_per_byte"}
    assert calibration_from_dict(older).transfer_compute_s_per_byte == 0.0  # files made before it: none


def test_an_overhead_learned_at_several_micro_batch_counts_follows_the_count(tmp_path) -> None:
    cal = calibration(
        action_overhead_s={"gpipe": 3e-3, "1f1b": 1e-3},
        multi_stage_overhead_s={"zero-bubble": 5e-3},
        action_overhead_by_microbatches_s={"gpipe": {2: 1e-3, 4: 3e-3, 8: 4e-3}},
        multi_stage_overhead_by_microbatches_s={"zero-bubble": {2: 5e-3, 4: 7e-3}},
    )
    gpipe = [cal.overhead_for(Schedule.GPIPE, 1, m) for m in (1, 2, 3, 4, 6, 8, 32)]
    assert gpipe == pytest.approx([1e-3, 1e-3, 2e-3, 3e-3, 3.5e-3, 4e-3, 4e-3])
    assert cal.overhead_for(Schedule.GPIPE) == 3e-3  # no count: the value learned at the anchor's
    assert cal.overhead_for(Schedule.ONE_F_ONE_B, 1, 2) == 1e-3  # no counts learned: one value
    assert cal.overhead_for(Schedule.ZERO_BUBBLE, 2, 3) == pytest.approx(6e-3)
    assert cal.runtime_terms(Schedule.GPIPE, (0.0,), (), 1, 3).action_overhead_s == pytest.approx(2e-3)
    save_calibration(cal, tmp_path / "c.json")
    assert load_calibration(tmp_path / "c.json") == cal
    assert "3.000 ms  (1.000 at 2, 3.000 at 4, 4.000 at 8)" in format_calibration(cal)


def test_a_co_location_factor_learned_at_several_sizes_follows_the_size(tmp_path) -> None:
    cal = calibration(colocation_factor=1.1, colocation_factor_by_micro_batch_size={1: 1.3, 4: 1.1, 8: 0.9})
    assert [cal.colocation_for(b) for b in (None, 1, 2, 4, 6, 8, 64)] == pytest.approx(
        [1.1, 1.3, 1.3 - 0.2 / 3, 1.1, 1.0, 0.9, 0.9]
    )
    assert cal.lowest_colocation_factor == 0.9  # what a lower bound may assume
    assert calibration().colocation_for(2) == 1.0 and calibration().lowest_colocation_factor == 1.0
    assert cal.runtime_terms(Schedule.GPIPE, (0.0,), micro_batch_size=1).compute_scale == 1.3
    save_calibration(cal, tmp_path / "c.json")
    assert load_calibration(tmp_path / "c.json") == cal
    assert "co-location factor: 1.100 (compute inside the pipeline / profiled alone); 1.300 at b = 1" in (
        format_calibration(cal)
    )
    with pytest.raises(CalibrationError, match="colocation_factor_by_micro_batch_size"):
        calibration_from_dict({**cal.to_dict(), "colocation_factor_by_micro_batch_size": {"2": 0}})


def test_shipped_calibrations_load() -> None:
    cpu, cuda = shipped_calibration("cpu"), shipped_calibration("cuda")
    assert (cpu.device_kind, cpu.backend, cpu.source) == ("cpu", "gloo", "measured")
    assert (cuda.device_kind, cuda.backend, cuda.source) == ("cuda", "nccl", "estimate")
    assert set(cpu.action_overhead_s) >= {"gpipe", "1f1b", "interleaved-1f1b"}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"format": "pipeplan.plan"}, "not a pipeplan calibration"),
        ({"version": 2}, "unsupported calibration version 2"),
        ({"p2p_bytes_per_s": 0}, r"\$\.p2p_bytes_per_s"),
        ({"action_overhead_s": {"pipedream": 1.0}}, r"\$\.action_overhead_s"),
        ({"device_kind": "tpu"}, r"\$\.device_kind"),
        ({"action_overhead_by_microbatches_s": {"gpipe": {"0": 1e-3}}}, r"\$\.action_overhead_by_microbatches_s"),
        ({"action_overhead_by_microbatches_s": {"gpipe": {}}}, r"\$\.action_overhead_by_microbatches_s"),
    ],
)
def test_invalid_documents_are_refused(change: dict, message: str) -> None:
    data = {**calibration().to_dict(), **change}
    with pytest.raises(CalibrationError, match=message):
        calibration_from_dict(json.loads(json.dumps(data)))


def test_other_device_kind_is_refused() -> None:
    profile = make_profile([1.0, 1.0])
    with pytest.raises(CalibrationError, match="measured on cuda/nccl but the profile is for cpu/gloo"):
        default_settings(profile, calibration=calibration(device_kind="cuda", backend="nccl"))


def test_calibration_sets_the_links() -> None:
    settings = default_settings(make_profile([1.0, 1.0]), calibration=calibration(p2p_bytes_per_s=2e9))
    assert (settings.link_bytes_per_s, settings.link_latency_s) == (2e9, 1e-4)


def test_ring_allreduce_and_transfer() -> None:
    cal = calibration()
    # 2 ranks: 2 (k - 1) = 2 steps of (latency + 1 MB / 2 / 1 GB/s).
    assert cal.allreduce_s(1_000_000, 2) == pytest.approx(2 * (1e-4 + 5e-4))
    assert cal.allreduce_s(1_000_000, 1) == 0.0
    settings = default_settings(make_profile([1.0, 1.0]), calibration=cal)
    assert _transfer_s(1_000_000, settings) == pytest.approx(1e-4 + 1e-3)  # the cost model's link, alpha-beta
    assert cal.overhead_for(Schedule.ZERO_BUBBLE) == 1e-3  # unmeasured: the largest measured value


def test_step_tails_count_optimizer_per_rank() -> None:
    profile = make_profile([1.0] * 4, param_counts=[100, 200, 300, 400])
    settings = CostSettings(calibration=calibration())
    tails = step_tails(profile, unit_costs(profile, 1), settings, [[0, 1], [2, 3]], (0, 1))
    assert tails == pytest.approx((1e-3 + 300 * 1e-8, 1e-3 + 700 * 1e-8))
    assert step_tails(profile, unit_costs(profile, 1), CostSettings(), [[0, 1], [2, 3]], (0, 1)) == (0.0, 0.0)


def test_step_tails_add_the_tied_swap_across_ranks() -> None:
    profile = make_profile([1.0] * 3, param_counts=[1000, 10, 0])
    units = list(profile.units)
    units[0] = replace(units[0], tied_params=("emb.weight",))
    units[2] = replace(units[2], tied_params=("emb.weight",), tied_param_count=1000)
    profile = replace(profile, units=tuple(units))
    settings = CostSettings(calibration=calibration(optimizer={"adam": OptimizerCost(0.0, 0.0)}))
    costs = unit_costs(profile, 1)
    cal = calibration()
    swap = cal.p2p_latency_s + 4000 / cal.p2p_bytes_per_s  # float32 copy of 1,000 parameters, each way at once
    assert cal.swap_s(4000) == pytest.approx(swap) and swap < cal.allreduce_s(4000, 2)
    assert step_tails(profile, costs, settings, [[0, 1], [2]], (0, 1)) == pytest.approx((swap, swap))
    # Both users on one rank: the copies are summed locally, nothing crosses a link.
    assert step_tails(profile, costs, settings, [[0, 1, 2]], (0,)) == (0.0,)
    # Each waits for the other's gradient: the two ranks start their tails together; on one rank, no group.
    assert tail_groups(profile, [[0, 1], [2]], (0, 1)) == ((0, 1),)
    assert tail_groups(profile, [[0], [1], [2]], (0, 1, 2)) == ((0, 2),)
    assert tail_groups(profile, [[0, 1, 2]], (0,)) == ()


def test_a_tied_pair_starts_its_tails_together() -> None:
    # GPipe, two stages of f = 1, b = 2, one micro-batch: rank 1 ends its backward at 4, rank 0 at 6.
    alone = RuntimeTerms(step_tail_s=(1.0, 3.0))
    assert simulate(Pipeline([1.0, 1.0], [2.0, 2.0], 1, "gpipe", runtime=alone)).iteration_s == 7.0  # max(6 + 1, 4 + 3)
    tied = RuntimeTerms(step_tail_s=(1.0, 3.0), tail_groups=((0, 1),))
    result = simulate(Pipeline([1.0, 1.0], [2.0, 2.0], 1, "gpipe", runtime=tied))
    assert result.iteration_s == 9.0  # rank 1 waits in the all-reduce until rank 0 arrives at 6
    tail = next(a for a in result.actions if a.kind == "S" and a.rank == 1)
    assert (tail.start_s, tail.end_s) == (4.0, 9.0)
    stray = RuntimeTerms(step_tail_s=(1.0, 1.0), tail_groups=((0, 2),))
    with pytest.raises(UsageError, match="outside"):
        simulate(Pipeline([1.0, 1.0], [2.0, 2.0], 1, "gpipe", runtime=stray))


def test_calibrated_plan_records_its_runtime_terms() -> None:
    profile = make_profile([0.01] * 4, param_counts=[1000] * 4)
    settings = default_settings(profile, calibration=calibration(colocation_factor=1.5), calibration_label="test")
    request = PlanRequest(num_ranks=2, global_batch_size=2, schedule="gpipe", recompute="off", settings=settings)
    plan = make_plan(profile, request, sha256="0" * 64)
    pred = plan.predicted
    assert (pred.calibration, pred.runtime.action_overhead_s, pred.runtime.compute_scale) == ("test", 1e-3, 1.5)
    assert pred.runtime.step_tail_s == pytest.approx((1e-3 + 2000 * 1e-8,) * 2)
    # The prediction is the simulation of the plan's stages, links and these runtime terms.
    link = 1e-4 + 1024 / 1e9
    again = simulate(
        Pipeline(
            [st.forward_s for st in plan.stages],
            [st.backward_s for st in plan.stages],
            2,
            "gpipe",
            comm_forward_s=[link],
            comm_backward_s=[link],
            runtime=RuntimeTerms(1e-3, pred.runtime.step_tail_s, 1.5),
        ),
    )
    assert pred.iteration_s == again.iteration_s
    textbook = simulate(Pipeline([0.02, 0.02], [0.04, 0.04], 2, "gpipe", comm_forward_s=[link], comm_backward_s=[link]))
    assert pred.iteration_s > textbook.iteration_s + 6 * 1e-3 + pred.runtime.step_tail_s[0]
    assert pred.overhead_s == pytest.approx((4e-3, 4e-3))


def test_overhead_per_action_steers_the_choice_away_from_many_actions() -> None:
    # Four equal units on two ranks: interleaving wins the textbook model (smaller bubble), but with a
    # large overhead per action its twice as many actions lose to one stage per rank.
    profile = make_profile([0.01] * 4, sizes=(1, 2))
    textbook = PlanRequest(num_ranks=2, global_batch_size=8, recompute="off")
    assert make_plan(profile, textbook, sha256="0" * 64).schedule is Schedule.INTERLEAVED_1F1B
    heavy = calibration(action_overhead_s={"gpipe": 0.05, "1f1b": 0.05, "interleaved-1f1b": 0.05})
    request = replace(textbook, settings=CostSettings(calibration=heavy))
    chosen = make_plan(profile, request, sha256="0" * 64)
    assert chosen.virtual_stages == 1 and chosen.micro_batch_size == 2


def test_make_plans_are_distinct_and_ranked() -> None:
    profile = make_profile([0.01, 0.02, 0.03, 0.01], sizes=(1, 2))
    plans = make_plans(profile, PlanRequest(num_ranks=2, global_batch_size=4), sha256="0" * 64, count=4)
    assert len(plans) == 4
    assert len({plan_key(p) for p in plans}) == 4
    times = [p.predicted.iteration_s for p in plans]
    assert times == sorted(times)
    assert plan_key(plans[0]) == plan_key(make_plan(profile, PlanRequest(2, 4), sha256="0" * 64))


def test_predict_plan_reproduces_the_search_and_changes_with_the_calibration() -> None:
    profile = make_profile([0.01, 0.02, 0.03, 0.01], sizes=(1, 2))
    settings = default_settings(profile, calibration=calibration())
    plans = make_plans(
        profile, PlanRequest(num_ranks=2, global_batch_size=4, settings=settings), sha256="0" * 64, count=4
    )
    for plan in plans:
        assert predict_plan(profile, plan, settings).iteration_s == plan.predicted.iteration_s
        slower = default_settings(profile, calibration=calibration(colocation_factor=2.0))
        assert predict_plan(profile, plan, slower).iteration_s > plan.predicted.iteration_s


def test_cli_never_replaces_the_calibration_it_reads(tmp_path, capsys) -> None:
    from cli import main
    from profiles.format import save_profile

    profile, cal = tmp_path / "p.json", tmp_path / "c.json"
    save_profile(make_profile([0.01] * 4), profile)
    save_calibration(calibration(transfer_compute_s_per_byte=4e-10), cal)
    before = cal.read_bytes()
    args = ["plan", str(profile), "--stages", "2", "--global-batch", "4", "--calibration", str(cal)]
    assert main([*args, "--out", str(cal)]) == 2
    assert "is this command's input" in capsys.readouterr().err
    assert cal.read_bytes() == before
    capsys.readouterr()
    assert main([*args, "--out", str(tmp_path / "plan.json")]) == 0
    assert json.loads((tmp_path / "plan.json").read_text())["predicted"]["calibration"] == str(cal)
    out = capsys.readouterr().out
    terms = json.loads((tmp_path / "plan.json").read_text())["predicted"]
    assert f"runtime terms from calibration {cal}: " in out
    assert f"compute x {terms['compute_scale']:.2f} beside the other ranks (co-location)" in out
    assert "0.40 ns of compute per byte sent or received" in out and terms["transfer_compute_s_per_byte"] == 4e-10
    args[-1] = "none"
    assert main([*args, "--out", str(tmp_path / "textbook.json")]) == 0
    assert "runtime terms: none (the textbook model" in capsys.readouterr().out


def test_cli_refuses_a_calibration_of_another_device(tmp_path, capsys) -> None:
    from cli import main
    from profiles.format import save_profile

    profile, cal = tmp_path / "p.json", tmp_path / "c.json"
    save_profile(make_profile([0.01] * 4), profile)
    save_calibration(calibration(device_kind="cuda", backend="nccl"), cal)
    args = ["plan", str(profile), "--stages", "2", "--global-batch", "4", "--calibration", str(cal), "--out"]
    assert main([*args, str(tmp_path / "plan.json")]) == 2
    err = capsys.readouterr().err
    assert "measured on cuda/nccl but the profile is for cpu/gloo" in err and len(err.splitlines()) == 1


def test_step_tails_pay_per_parameter_tensor() -> None:
    profile = make_profile([1.0] * 2, param_counts=[100, 100])
    units = tuple(replace(u, param_tensor_count=k) for u, k in zip(profile.units, (3, 50), strict=True))
    profile = replace(profile, units=units)
    cost = {"adam": OptimizerCost(per_param_s=0.0, per_step_s=0.0, per_tensor_s=1e-4)}
    settings = CostSettings(calibration=calibration(optimizer=cost))
    tails = step_tails(profile, unit_costs(profile, 1), settings, [[0], [1]], (0, 1))
    assert tails == pytest.approx((3e-4, 5e-3))
