"""Measuring one piece: exact FLOPs, exact saved bytes, timings ordered by a sleep layer."""

from __future__ import annotations

import torch
from torch import nn

from delay_layers import Sleep
from profiles.dataflow import Piece
from profiles.measure import count_flops, measure_piece, saved_tensor_bytes

torch.set_num_threads(1)
CPU = torch.device("cpu")


def test_linear_flops_are_in_times_out_times_batch() -> None:
    assert count_flops(nn.Linear(64, 32), (torch.randn(8, 64),)) == 8 * 64 * 32


def test_conv2d_flops_are_one_mac_per_kernel_tap() -> None:
    conv = nn.Conv2d(3, 8, kernel_size=3, padding=1)
    # every output element (2 x 8 x 16 x 16) takes 3 x 3 x 3 multiply-adds
    assert count_flops(conv, (torch.randn(2, 3, 16, 16),)) == 2 * 8 * 16 * 16 * 3 * 3 * 3


def test_sdpa_flops_are_counted_by_the_registered_handle() -> None:
    class Attention(nn.Module):
        def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
            return nn.functional.scaled_dot_product_attention(q, k, v)

    q = torch.randn(2, 4, 16, 8)
    # Q K^T and P V: batch 2 x heads 4 x 16 queries x 16 keys x (8 + 8)
    assert count_flops(Attention(), (q, q, q)) == 2 * 4 * 16 * 16 * 16


def test_kwargs_are_bound_for_flop_counting() -> None:
    class Scaled(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(16, 16)

        def forward(self, x: torch.Tensor, *, scale: float = 1.0) -> torch.Tensor:
            return self.fc(x) * scale

    assert count_flops(Scaled(), (torch.randn(3, 16),), {"scale": 2.0}) == 3 * 16 * 16


def test_saved_bytes_of_linear_relu_linear_is_exact() -> None:
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64))
    # the input (32x64) and the ReLU output (32x256, saved twice, counted once); weights excluded
    assert saved_tensor_bytes(model, torch.randn(32, 64)) == 32 * 64 * 4 + 32 * 256 * 4 == 40_960


def test_measure_piece_reports_saved_and_output_bytes() -> None:
    model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64))
    piece = Piece("mlp", model, (torch.randn(32, 64),), (False,))
    m = measure_piece(piece, device=CPU, repeats=1, warmup=1)
    assert m.saved_bytes == 40_960
    assert m.output_bytes == 32 * 64 * 4
    assert m.peak_bytes is None
    assert m.memory is not None
    # Held: the ReLU's output (saved, 32x256) and the output (32x64); the input was there before the forward.
    assert m.memory.held_bytes == 32 * 256 * 4 + 32 * 64 * 4
    # At the second Linear's backward: its input's gradient, its weight's gradient before it is added to the
    # one accumulated, and its bias's.
    assert m.memory.transient_bytes == 32 * 256 * 4 + 256 * 64 * 4 + 64 * 4
    assert m.forward_s > 0 and m.backward_s > 0
    assert all(p.grad is None for p in model.parameters())  # gradients are not left behind


class _CatSkip(nn.Module):
    """A UNet decoder's shape: a layer's output concatenated with the input that skipped it."""

    def __init__(self) -> None:
        super().__init__()
        self.a = nn.Linear(8, 8)
        self.b = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.cat([self.a(x), x], dim=1))


def test_weight_grad_bytes_count_the_whole_storage_a_kept_slice_holds() -> None:
    m = measure_piece(Piece("cat", _CatSkip(), (torch.randn(4, 8),), (True,)), device=CPU, repeats=1, warmup=0)
    # I keeps for W the gradient at a's output, a 4x8 slice of the cat's 4x16 gradient, which holds all of
    # it (256 bytes, not 128), and the gradient at b's output (4x4, 64 bytes).
    assert m.weight_grad_bytes == 4 * 16 * 4 + 4 * 4 * 4


def test_input_needing_grad_is_differentiated() -> None:
    piece = Piece("fc", nn.Linear(4, 4), (torch.randn(2, 4),), (True,))
    m = measure_piece(piece, device=CPU, repeats=2, warmup=0)
    assert m.backward_s > 0


def test_piece_without_gradient_has_zero_backward() -> None:
    piece = Piece("argmax", nn.Identity(), (torch.arange(6).reshape(2, 3),), (False,))
    m = measure_piece(piece, device=CPU, repeats=1, warmup=0)
    assert m.backward_s == 0.0
    assert m.saved_bytes == 0
    assert m.output_bytes == 6 * 8


def test_loss_is_part_of_the_last_piece() -> None:
    model = nn.Linear(8, 8)
    piece = Piece("head", model, (torch.randn(4, 8),), (True,))
    plain = measure_piece(piece, device=CPU, repeats=1, warmup=0)
    with_loss = measure_piece(
        piece, device=CPU, repeats=1, warmup=0, loss_fn=nn.functional.mse_loss, target=torch.zeros(4, 8)
    )
    # mse_loss keeps its two operands, the output and the target: two more 4x8 float32 tensors
    assert with_loss.saved_bytes == plain.saved_bytes + 2 * 4 * 8 * 4


def test_forward_times_follow_sleep_durations() -> None:
    x = torch.randn(2, 4)
    times = [
        measure_piece(Piece(f"s{s}", Sleep(s), (x,), (True,)), device=CPU, repeats=1, warmup=0).forward_s
        for s in (0.0, 0.03, 0.01)
    ]
    assert times[1] >= 0.03 and times[2] >= 0.01
    assert times[0] < times[2] < times[1]


class _Counted(nn.Linear):
    """A Linear that counts its forward calls."""

    calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        type(self).calls += 1
        return super().forward(x)


def test_without_the_split_each_repeat_runs_one_forward_and_no_i_or_w() -> None:
    piece = Piece("fc", _Counted(8, 8), (torch.randn(4, 8),), (True,))
    _Counted.calls = 0
    split = measure_piece(piece, device=CPU, repeats=3, warmup=0, track_memory=False)
    with_split = _Counted.calls
    _Counted.calls = 0
    whole = measure_piece(piece, device=CPU, repeats=3, warmup=0, track_memory=False, split=False)
    # one untimed probe each; then per repeat a forward and backward, and with the split a forward, I and W
    assert (with_split, _Counted.calls) == (1 + 3 * 2, 1 + 3)
    assert split.backward_input_s > 0 and split.backward_weight_s > 0
    assert whole.backward_s > 0 and whole.backward_input_s == whole.backward_weight_s == 0.0


def test_without_the_probe_nothing_runs_untimed_and_no_bytes_are_read() -> None:
    piece = Piece("fc", _Counted(8, 8), (torch.randn(4, 8),), (True,))
    _Counted.calls = 0
    probed = measure_piece(piece, device=CPU, repeats=1, warmup=1, track_memory=False, split=False)
    assert (_Counted.calls, probed.output_bytes) == (2, 4 * 8 * 4)  # the probe was the warm-up
    _Counted.calls = 0
    cold = measure_piece(piece, device=CPU, repeats=1, warmup=0, track_memory=False, split=False, probe=False)
    assert (_Counted.calls, cold.output_bytes, cold.saved_bytes) == (1, 0, 0)
    assert cold.forward_s > 0 and cold.backward_s > 0


def test_a_pieces_tracked_memory_is_the_same_at_one_thread_and_at_every_core() -> None:
    """measure_piece tracks memory on every core (its time is not measured): the bytes must not depend on it.
    A gpt2-tiny block, attention and all, forward, backward and the backward split into I and W."""
    from profiles.cores import intra_op_threads
    from profiles.measure import _PieceRun
    from profiles.models import BUILTIN_MODELS

    workload = BUILTIN_MODELS["gpt2-tiny"]()
    block = workload.model.transformer.h[0]
    hidden = torch.randn(4, 128, block.ln_1.normalized_shape[0], requires_grad=True)
    piece = Piece("block", block, (hidden.detach(),), (True,))
    measured = []
    for threads in (1, 2):
        with intra_op_threads(threads):
            run = _PieceRun(piece, CPU, None, None)
            run.warm_up(1)
            measured.append(run.tracked())
            run.clear_input_grads()
            block.zero_grad(set_to_none=True)
    assert measured[0] == measured[1]
    assert measured[0].held_bytes > 0 and measured[0].transient_bytes > 0
