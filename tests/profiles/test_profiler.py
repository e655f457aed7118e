"""The profiler end to end: units, data flow (skip connections, GPT-2's mask), tied weights, errors."""

from __future__ import annotations

import os
import warnings

import pytest
import torch
from torch import nn

from delay_layers import Sleep
from planner.errors import ProfilingError, UsageError
from profiles.dataflow import capture_export
from profiles.format import load_profile, save_profile
from profiles.measure_settings import MeasureSettings
from profiles.models import BUILTIN_MODELS
from profiles.profiler import profile_model
from profiles.report import format_profile_table
from profiles.units import find_units
from profiles.workload import Workload

torch.set_num_threads(1)
FAST = {"repeats": 1, "warmup": 0, "progress": False, "min_time_s": 0.0}


class Merge(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor, skip: torch.Tensor) -> torch.Tensor:
        return self.fc(x + skip)


class SkipNet(nn.Module):
    """a -> b -> c, and a's output passed to c as well: a skip over b.

    (Were the add written here in the parent, between b and c, pipeline() would put it in b's piece:
    the split marker sits at the start of c's forward. The skip must enter c itself.)
    """

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(4, 8)
        self.b = nn.Linear(8, 8)
        self.c = Merge()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h0 = self.a(x)
        return self.c(self.b(h0), h0)


def _skipnet() -> Workload:
    torch.manual_seed(0)
    return Workload(SkipNet(), lambda b: (torch.randn(b, 4), torch.randn(b, 2)), nn.functional.mse_loss, "skipnet")


@pytest.fixture(scope="module")
def gpt2_profile():
    return profile_model(BUILTIN_MODELS["gpt2-tiny"](), MeasureSettings(micro_batch_sizes=(1, 2), **FAST))


def test_skip_connection_flow_matches_hand_computed(tmp_path) -> None:
    profile = profile_model(_skipnet(), MeasureSettings(micro_batch_sizes=(1, 3), **FAST))
    assert [u.name for u in profile.units] == ["a", "b", "c"]
    assert profile.settings["capture"] == "export"
    flows = {(t.producer, t.consumers, t.bytes, t.needs_grad) for t in profile.tensors}
    assert flows == {
        (-1, (0,), (1 * 4 * 4, 3 * 4 * 4), False),  # the input x
        (0, (1, 2), (1 * 8 * 4, 3 * 8 * 4), True),  # h0: read by b and, over b, by c's add
        (1, (2,), (1 * 8 * 4, 3 * 8 * 4), True),  # h1
    }
    assert [u.flops for u in profile.units] == [(32, 96), (64, 192), (16, 48)]
    assert [u.param_count for u in profile.units] == [40, 72, 18]


def test_unet_long_skips_reach_the_matching_decoder_level() -> None:
    workload = BUILTIN_MODELS["unet-small"]()
    units = list(workload.units)
    capture = capture_export(workload.model, (workload.make_batch(2)[0],), units)
    consumers = {units[e.producer]: [units[c] for c in e.consumers] for e in capture.edges if e.producer >= 0}
    assert consumers["enc.0"] == ["enc.1", "dec.2"]
    assert consumers["enc.1"] == ["enc.2", "dec.1"]
    assert consumers["enc.2"] == ["mid", "dec.0"]
    enc0 = next(e for e in capture.edges if e.producer == 0)
    assert enc0.nbytes == 2 * 16 * 32 * 32 * 4


def test_gpt2_tiny_units_in_execution_order(gpt2_profile) -> None:
    names = [u.name for u in gpt2_profile.units]
    assert names == ["transformer.wte", "transformer.wpe"] + [f"transformer.h.{i}" for i in range(4)] + [
        "transformer.ln_f",
        "lm_head",
    ]
    assert gpt2_profile.settings["seq_len"] == 32
    assert gpt2_profile.settings["capture"] == "export"


def test_gpt2_tiny_records_its_heads_and_splits_as_megatron_does(gpt2_profile) -> None:
    from planner.cluster import Cluster, MeshSearch, plan_cluster
    from planner.cost import CostSettings
    from planner.request import PlanRequest
    from planner.tensor_parallel import Role, attention_heads, unit_roles

    # GPT2Config(n_head=4): what a tensor-parallel degree must divide (tp 2 and 4 on a node of 4).
    assert (gpt2_profile.settings["attention_heads"], gpt2_profile.settings["kv_heads"]) == (4, 4)
    assert attention_heads(gpt2_profile) == (4, 4)
    assert unit_roles(gpt2_profile) == (Role.EMBEDDING,) * 2 + (Role.BLOCK,) * 4 + (Role.REPLICATED, Role.HEAD)
    request = PlanRequest(num_ranks=1, global_batch_size=4, settings=CostSettings())
    result = plan_cluster(
        gpt2_profile,
        request,
        Cluster(4, 4, 1.1e9, 1.1e9, 1.3e-4),
        MeshSearch(pipeline_degree=2, tensor_parallel=2),
        sha256="0" * 64,
    )
    assert (result.plan.mesh.pp, result.plan.mesh.tp, result.plan.mesh.dp) == (2, 2, 1)


def test_gpt2_tiny_attention_mask_crosses_every_block(gpt2_profile) -> None:
    blocks = (2, 3, 4, 5)
    masks = [t for t in gpt2_profile.tensors if t.consumers == blocks]
    assert len(masks) == 1
    mask = masks[0]
    assert mask.producer == 1 and not mask.needs_grad
    # (B, 1, T, T) at T = 32, 4 bytes (float additive mask) or 1 byte (bool) per element
    assert mask.bytes[0] in (32 * 32 * 4, 32 * 32) and mask.bytes[1] == 2 * mask.bytes[0]
    hidden = [t for t in gpt2_profile.tensors if t.producer == 2]
    assert [(t.consumers, t.bytes) for t in hidden] == [((3,), (32 * 64 * 4, 2 * 32 * 64 * 4))]


def test_gpt2_tiny_sums_flops_and_tied_weights(gpt2_profile) -> None:
    p = gpt2_profile
    for u in p.units:
        assert all(x > 0 for x in u.forward_s) and all(x >= 0 for x in u.backward_s)
    block = p.units[2]
    # per token: c_attn 64x192, c_proj 64x64, MLP 2 x 64x256; attention 2 x T x 64; two LayerNorms at 5/elt
    T = 32
    expected = T * (64 * 192 + 64 * 64 + 2 * 64 * 256) + 2 * T * T * 64 + 2 * 5 * T * 64
    assert block.flops == (expected, 2 * expected)
    assert p.units[-1].flops[0] == T * 64 * 1000
    assert sum(u.param_count for u in p.units) == p.model.param_count == 272_256
    assert p.units[-1].param_count == 0 and "lm_head.weight" in p.units[-1].tied_params
    # The stage holding lm_head keeps its own copy of the tied embedding: the cost model counts it there.
    assert p.units[-1].tied_param_count == 1000 * 64 and p.units[0].tied_param_count == 0
    assert p.units[0].param_count == 1000 * 64 and "lm_head.weight" in p.units[0].tied_params
    assert p.whole_s(0) > 0 and p.unit_sum_s(1) > 0
    assert all(u.saved_bytes[1] > u.saved_bytes[0] for u in p.units[2:])


def test_profile_round_trips_through_a_file(gpt2_profile, tmp_path) -> None:
    path = tmp_path / "gpt2.json"
    save_profile(gpt2_profile, path)
    loaded = load_profile(path)
    assert loaded == gpt2_profile
    assert loaded.settings == gpt2_profile.settings


def test_report_shows_units_skip_and_check_line(gpt2_profile) -> None:
    text = format_profile_table(gpt2_profile)
    assert "transformer.h.3" in text and "GPT2Block" in text
    assert "skip" in text
    assert "b=1: unit sum" in text and "b=2: unit sum" in text
    assert "micro-batch size 2:" in format_profile_table(gpt2_profile, all_sizes=True)


def test_sleep_units_order_forward_times() -> None:
    model = nn.Sequential(Sleep(0.0), Sleep(0.03), Sleep(0.01))
    workload = Workload(model, lambda b: (torch.randn(b, 4), torch.randn(b, 4)), nn.functional.mse_loss, "sleep")
    # export traces tensor ops only (a sleep is not one): time these units by hooks
    profile = profile_model(
        workload, MeasureSettings(micro_batch_sizes=(1,), units=["0", "1", "2"], capture="hooks", **FAST)
    )
    fwd = [u.forward_s[0] for u in profile.units]
    assert fwd[0] < fwd[2] < fwd[1]
    assert profile.settings["capture"] == "hooks"


class _SizeLog(nn.Module):
    """A linear layer that logs the batch size of every call (eager: capture by hooks)."""

    def __init__(self, log: list[int]) -> None:
        super().__init__()
        self.lin, self.log = nn.Linear(4, 4), log

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.log.append(x.shape[0])
        return self.lin(x)


def test_rounds_visit_every_size_in_turn_starting_one_size_later_each_round() -> None:
    log: list[int] = []
    model = nn.Sequential(_SizeLog(log), nn.Linear(4, 4))
    workload = Workload(model, lambda b: (torch.randn(b, 4), torch.randn(b, 4)), nn.functional.mse_loss, "logged")
    timing = {**FAST, "repeats": 2, "max_repeats": 2}
    profile = profile_model(
        workload, MeasureSettings(micro_batch_sizes=(1, 2, 3), units=["0", "1"], capture="hooks", **timing)
    )
    sizes = [int(b) for b in log]
    runs = [b for i, b in enumerate(sizes) if i == 0 or sizes[i - 1] != b]  # consecutive calls at one size, collapsed
    # set-up (loss, capture) one size after another, then round 0 from b = 1, round 1 from b = 2; timed one
    # size after another, b = 1 would never come back once b = 2 began; after the rounds, each size's extras
    assert runs == [1, 2, 3, 1, 2, 3, 2, 3, 1, 2, 3]
    assert profile.settings["repeats_used"] == [2, 2, 2]


def test_untraceable_model_falls_back_to_hooks(caplog) -> None:
    class Branchy(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = nn.Linear(4, 4)
            self.b = nn.Linear(4, 4)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            h = self.a(x)
            if h.sum().item() > 0:  # data-dependent control flow: torch.export cannot trace it
                h = -h
            return self.b(h)

    workload = Workload(Branchy(), lambda b: (torch.randn(b, 4), torch.randn(b, 4)), nn.functional.mse_loss)
    with caplog.at_level("INFO", logger="pipeplan"):
        profile = profile_model(workload, MeasureSettings(micro_batch_sizes=(1, 2), units=["a", "b"], **FAST))
    assert profile.settings["capture"] == "hooks"
    assert "export_error" in profile.settings
    assert [(t.producer, t.consumers, t.bytes) for t in profile.tensors] == [(-1, (0,), (16, 32)), (0, (1,), (16, 32))]
    assert "timing units by hooks" in caplog.text
    assert [u.param_count for u in profile.units] == [20, 20]


@pytest.mark.parametrize("capture", ["export", "hooks"])
def test_tied_weight_counts_once_and_is_named_by_both_units(capture: str) -> None:
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(10, 4)
            self.head = nn.Linear(4, 10, bias=False)
            self.head.weight = self.emb.weight

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return self.head(self.emb(ids))

    def batch(b: int) -> tuple[torch.Tensor, torch.Tensor]:
        return torch.arange(b * 3).reshape(b, 3) % 10, torch.zeros(b, 3, 10)

    workload = Workload(Tied(), batch, nn.functional.mse_loss, "tied")
    profile = profile_model(
        workload, MeasureSettings(micro_batch_sizes=(1,), units=["emb", "head"], capture=capture, **FAST)
    )
    assert [u.param_count for u in profile.units] == [40, 0]
    assert [u.tied_param_count for u in profile.units] == [0, 40]
    assert profile.model.param_count == 40
    assert "head.weight" in profile.units[1].tied_params
    assert profile.units[0].tied_params != ()


def test_find_units_default_and_depth() -> None:
    workload = BUILTIN_MODELS["unet-small"]()
    x = workload.make_batch(1)[0]
    assert find_units(workload.model, (x,)) == list(workload.units)
    assert find_units(workload.model, (x,), 2)[3] == "mid.block"
    mlp = BUILTIN_MODELS["mlp"]()
    assert find_units(mlp.model, (mlp.make_batch(1)[0],), ["head", "layers.0"]) == ["layers.0", "head"]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (["layers.0", "layers.9"], "unknown unit 'layers.9'"),
        (["layers.0", "layers.0.fc1"], "overlap"),
        (["head", "head"], "listed twice"),
        (0, "depth 0"),
    ],
)
def test_find_units_rejects_bad_specs(spec, message: str) -> None:
    mlp = BUILTIN_MODELS["mlp"]()
    with pytest.raises(UsageError, match=message):
        find_units(mlp.model, (mlp.make_batch(1)[0],), spec)


def test_bad_arguments_are_usage_errors() -> None:
    workload = _skipnet()
    with pytest.raises(UsageError, match=r"positive integers, got \[0, 2\]"):
        profile_model(workload, MeasureSettings(micro_batch_sizes=(0, 2), **FAST))
    with pytest.raises(UsageError, match="unknown dtype 'float64'"):
        profile_model(workload, MeasureSettings(dtype="float64", **FAST))


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_cuda_is_a_profiling_error() -> None:
    with pytest.raises(ProfilingError, match="CUDA is not available on this machine"):
        profile_model(_skipnet(), MeasureSettings(device="cuda", **FAST))


def test_one_unit_profile_matches_the_whole_model_by_construction() -> None:
    # One unit means no split points: the unit's piece is the model exported as one piece, and the
    # whole model is that same piece, measured once.
    profile = profile_model(
        BUILTIN_MODELS["mlp"](), MeasureSettings(micro_batch_sizes=(1, 2), units=["layers.0"], **FAST)
    )
    assert profile.num_units == 1
    assert profile.settings["whole_model_path"] == "exported as one piece"
    assert [profile.unit_sum_s(j) for j in (0, 1)] == [profile.whole_s(j) for j in (0, 1)]
    assert "b=1: unit sum" in format_profile_table(profile) and ": +0.0%" in format_profile_table(profile)


def test_profile_records_piece_overhead_rounds_and_whole_model_path(gpt2_profile, tmp_path) -> None:
    p = gpt2_profile
    assert p.piece_overhead is not None and len(p.piece_overhead.forward_s) == 2
    assert all(p.overhead_s(j) > 0 for j in (0, 1))
    assert p.settings["whole_model_path"] == "exported as one piece"
    assert p.settings["repeats_used"] == [1, 1] and p.settings["max_repeats"] == 1
    assert "keep_freed_memory" in p.settings
    # the speed reference, once per round (profiles/reference.py): two sizes, one round each
    assert 0 < p.settings["reference_s"] < 1.0
    assert "(exported as one piece)" in format_profile_table(p) and "less 7 x piece overhead" in format_profile_table(p)


def test_hooks_capture_checks_against_the_eager_model() -> None:
    model = nn.Sequential(Sleep(0.0), Sleep(0.0))
    workload = Workload(model, lambda b: (torch.randn(b, 4), torch.randn(b, 4)), nn.functional.mse_loss, "sleep")
    profile = profile_model(
        workload, MeasureSettings(micro_batch_sizes=(1,), units=["0", "1"], capture="hooks", **FAST)
    )
    assert profile.settings["whole_model_path"] == "eager model"
    assert profile.piece_overhead is not None and profile.overhead_s(0) > 0


def test_the_load_warning_needs_cores_busy_now_as_well(monkeypatch) -> None:
    # The 1-minute load average lags: right after a previous profile it is high on idle cores. The warning
    # fires only when cores are busy now too (or when /proc/stat cannot say).
    from profiles import profiler

    cores = profiler.os.cpu_count() or 1
    monkeypatch.setattr(profiler.os, "getloadavg", lambda: (float(cores), 0.0, 0.0))
    cpu = torch.device("cpu")
    for busy_now, warned in ((0.0, False), (float(cores), True), (None, True)):
        monkeypatch.setattr(profiler, "busy_cores", lambda busy_now=busy_now: busy_now)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert profiler._warn_if_busy(cpu) == float(cores)
        assert any("other work competes for the CPU" in str(w.message) for w in caught) is warned
    monkeypatch.setattr(profiler.os, "getloadavg", lambda: (0.0, 0.0, 0.0))
    monkeypatch.setattr(profiler, "busy_cores", lambda: float(cores))
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        profiler._warn_if_busy(cpu)
    assert caught == []


def test_busy_cores_reads_a_share_of_the_machine() -> None:
    import os

    from profiles.profiler import busy_cores

    busy = busy_cores(0.05)
    assert busy is not None  # this machine has /proc/stat
    assert 0.0 <= busy <= (os.cpu_count() or 1)


def test_the_speed_reference_is_the_same_layer_and_input_everywhere() -> None:
    from profiles.reference import SpeedReference

    a, b = SpeedReference(torch.device("cpu")), SpeedReference(torch.device("cpu"))
    for (name, p), q in zip(a.layer.named_parameters(), b.layer.parameters(), strict=True):
        assert torch.equal(p, q), name
    assert torch.equal(a.x, b.x) and torch.equal(a.grad, b.grad) and tuple(a.x.shape) == (4, 64, 128)
    a.warm_up(2)
    assert a.samples == [] and a.median_s is None
    calls: list[int] = []
    a.layer.register_forward_hook(lambda *_: calls.append(1))
    times = [a.time_once() for _ in range(3)]
    assert a.samples == times and all(t > 0 for t in times) and a.median_s == sorted(times)[1]
    assert len(calls) == 6  # each timed call right after an untimed one: warm, whatever ran before it
    assert all(p.grad is None for p in a.layer.parameters())  # no gradient piles up from one timing to the next


def test_a_cpu_profile_carries_its_times_at_each_ranks_threads() -> None:
    from profiles.threads import profiled_thread_counts, rank_thread_counts

    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 16))
    workload = Workload(model, lambda b: (torch.randn(b, 16), torch.randn(b, 16)), nn.functional.mse_loss)
    profile = profile_model(workload, MeasureSettings(micro_batch_sizes=(1, 2), units=["0", "1", "2"], **FAST))
    scaling = profile.thread_scaling
    cores = os.cpu_count() or 1
    assert scaling is not None and scaling.cores == cores
    assert scaling.threads == profiled_thread_counts(cores, profile.threads)
    profiled = scaling.threads.index(profile.threads)
    assert scaling.factor[profiled] == (1.0, 1.0) and all(f > 0 for row in scaling.factor for f in row)
    assert len(scaling.reference_s) == len(scaling.threads) and all(r > 0 for r in scaling.reference_s)
    assert rank_thread_counts(16) == (16, 8, 4, 2, 1) and rank_thread_counts(6) == (6, 3, 1)
    assert rank_thread_counts(1) == (1,) and rank_thread_counts(16, fewest_ranks=2) == (8, 4, 2, 1)
    # A pipeline's ranks' counts and the profiled one: a single rank's (all the cores) only where it was profiled.
    assert profiled_thread_counts(16, 8) == (8, 4, 2, 1) and profiled_thread_counts(16, 16) == (16, 8, 4, 2, 1)
    assert profiled_thread_counts(2, 1) == (1,) and profiled_thread_counts(6, 6) == (6, 3, 1)


def test_a_thread_ratio_outside_what_threads_can_do_is_clamped() -> None:
    from profiles.threads import SLACK, plausible

    assert plausible(1.7, 1, 2) == 1.7  # 1 thread of 2: between no gain and perfect scaling
    assert plausible(0.008, 1, 2) == pytest.approx(1 / SLACK)  # 2 threads spinning on a busy machine
    assert plausible(9.0, 1, 2) == pytest.approx(2 * SLACK)
    assert plausible(0.1, 4, 2) == pytest.approx(0.5 / SLACK) and plausible(3.0, 4, 2) == pytest.approx(SLACK)


def test_a_long_step_is_timed_at_each_count_without_an_untimed_one_first() -> None:
    from profiles.dataflow import Piece
    from profiles.threads import _MIN_ROUNDS, MAX_STEP_S, measure_thread_scaling

    class Counted(nn.Linear):
        calls = 0

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            type(self).calls += 1
            return super().forward(x)

    piece = Piece("fc", Counted(4, 4), (torch.randn(2, 4),), (True,))
    factors = measure_thread_scaling(
        piece, device=torch.device("cpu"), loss_fn=None, target=None, step_s=MAX_STEP_S * 2, thread_counts=(2, 1)
    )
    assert Counted.calls == 2 * _MIN_ROUNDS  # every step timed: at 1 (profiled) and 2 threads, the fewest rounds
    assert factors[1] == 1.0 and factors[0] > 0
    Counted.calls = 0
    measure_thread_scaling(
        piece, device=torch.device("cpu"), loss_fn=None, target=None, step_s=0.0, thread_counts=(2, 1), min_time_s=0
    )
    assert Counted.calls == 2 + 2 * _MIN_ROUNDS  # a short step: one untimed at each count first


def test_the_progress_bar_times_the_rounds_from_their_start(monkeypatch) -> None:
    """The ETA is the rounds' rate over the steps left: the seconds spent splitting the model before the first
    round (a clock that only the splits move, here) must not count as time the first step took."""
    import tqdm as tqdm_package

    import profiles.loaded_profile as loaded_profile

    clock = [1000.0]
    elapsed_at_steps: list[float] = []

    class Bar(tqdm_package.tqdm):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            self._time = lambda: clock[0]
            self.start_t = self.last_print_t = clock[0]

        def update(self, n: float | None = 1) -> bool | None:
            elapsed_at_steps.append(self.format_dict["elapsed"])
            return super().update(n)

    split = loaded_profile._capture

    def slow_split(*args, **kwargs):  # noqa: ANN002, ANN003, ANN202 - the function's own signature
        clock[0] += 100.0
        return split(*args, **kwargs)

    monkeypatch.setattr(tqdm_package, "tqdm", Bar)
    monkeypatch.setattr(loaded_profile, "_capture", slow_split)
    settings = MeasureSettings(micro_batch_sizes=(1, 2), repeats=1, max_repeats=1, warmup=0, min_time_s=0.0)
    profile_model(BUILTIN_MODELS["mlp"](), settings)
    assert elapsed_at_steps and max(elapsed_at_steps) == 0.0, elapsed_at_steps[:3]
