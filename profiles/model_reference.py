"""The model's own units as the speed reference of a replay, each timed as the profile timed it.

A replay runs every stage of a plan in one process, which holds the whole model, so how fast the machine runs
at that moment can be read from the very computation the plan is made of: every unit at the plan's micro-batch
size, one forward and one backward each (the last with the loss), through
:func:`profiles.measure.measure_piece` as each profiling round after the first times it (profiles/profiler.py:
an untimed pass before a short unit alone, no split backward), their sum
against the profile's unit sum at that size. What is left between the replayed stages and the prediction at
that speed is what the plan composes: units into stages, stages into a schedule, memory held between them.

The fixed reference layer (profiles/reference.py), a few milliseconds of small matrices, need not follow a long
model's stages: its small matrices and the model's large ones are slowed differently by whatever else runs, and
it can read the machine faster while every stage runs slower. Nor is the whole model as one piece a fair
stand-in: timed in rounds shared with other micro-batch sizes it need not equal its units added up, which is what
the plan's prediction is made of.

Timing the units once per step costs a micro-batch through every stage (two for short units): a quarter as much
again on a plan of 4 micro-batches. On real processes each rank times the units of its
own stages, alone, in turn (planner/runtime/rank_timing.py): added up over the ranks, the same units. Then
every rank times them once more at the same moment (:meth:`UnitReference.time_together`): how much the ranks
slow each other now, which the alone timing cannot see (docs/cost-model.md, "The machine's speed").
"""

from __future__ import annotations

import statistics
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch import nn

from profiles.dataflow import Piece, capture_export, capture_hooks
from profiles.measure import WARM_BELOW_S, measure_piece

__all__ = ["UnitReference", "unit_pieces", "WAKE_S"]

WAKE_S = 0.02
"""Untimed work before each timed pass of a model whose units take less than this (:meth:`UnitReference.time_once`)."""


def unit_pieces(model: nn.Module, inputs: tuple[Any, ...], capture: str, units: Sequence[str]) -> tuple[Piece, ...]:
    """``model`` split into ``units`` as the profile split it: by ``torch.export`` (``capture`` ``export``),
    or by hooks on the eager modules (``hooks``)."""
    if capture == "hooks":
        return capture_hooks(model, inputs, list(units)).pieces
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return capture_export(model, inputs, list(units)).pieces


class UnitReference:
    """Every unit of a model on one micro-batch, ready to be timed between a replay's steps."""

    def __init__(
        self,
        pieces: Sequence[Piece],
        device: torch.device,
        loss_fn: Callable[[Any, torch.Tensor], torch.Tensor] | None,
        target: torch.Tensor,
    ) -> None:
        """``loss_fn``: the last of ``pieces`` is the model's last unit, and computes the loss as the profile's
        did; None: it is not (a rank's share of the model that ends before the last unit)."""
        self.pieces, self.device, self.loss_fn, self.target = tuple(pieces), device, loss_fn, target
        self.samples: list[float] = []
        self.together_samples: list[float] = []
        self.short: list[bool] = [True] * len(self.pieces)
        """Per piece, whether it is warmed before each timed pass (:data:`WARM_BELOW_S`), as the profile's rounds
        warm it: known from :meth:`warm_up`."""

    def _measure(self, first: bool) -> float:
        total = 0.0
        for i, piece in enumerate(self.pieces):
            last = self.loss_fn is not None and i == len(self.pieces) - 1
            m = measure_piece(
                piece,
                device=self.device,
                repeats=1,
                warmup=1 if first or self.short[i] else 0,
                loss_fn=self.loss_fn if last else None,
                target=self.target if last else None,
                track_memory=False,
                split=False,
                probe=first,
            )
            if first:
                self.short[i] = m.forward_s + m.backward_s < WARM_BELOW_S
            total += m.forward_s + m.backward_s
        return total

    def warm_up(self) -> None:
        """Every unit once untimed and once timed, dropped: the profile's first round warms up alike (its later
        rounds, like :meth:`time_once`, time each unit once, right after an untimed iteration of it where the unit
        is short)."""
        self._measure(first=True)

    def _timed_pass(self, wake: bool, last_s: float | None) -> float:
        # ``last_s``: the previous sample of the same kind, to tell whether a pass is shorter than WAKE_S
        if wake and (last_s is None or last_s < WAKE_S):
            started = time.perf_counter()
            while time.perf_counter() - started < WAKE_S:
                self._measure(first=False)
        return self._measure(first=False)

    def time_once(self, wake: bool = True) -> float:
        """Every unit's forward+backward once, in seconds, added up; also kept in ``samples``.

        With ``wake``, after untimed passes over every unit for :data:`WAKE_S` where a pass is shorter than that:
        right after a wait, the first milliseconds of work run slow (profiles/resume.py), and the profile timed its
        units back to back. Without it (work ran just before), at once."""
        elapsed = self._timed_pass(wake, self.samples[-1] if self.samples else None)
        self.samples.append(elapsed)
        return elapsed

    def time_together(self, wake: bool = True) -> float:
        """As :meth:`time_once`, kept in ``together_samples``: for a pass timed while the other ranks run theirs
        (:func:`planner.runtime.launch.every_rank_at_once`)."""
        elapsed = self._timed_pass(wake, self.together_samples[-1] if self.together_samples else None)
        self.together_samples.append(elapsed)
        return elapsed

    def keep_busy(self) -> None:
        """One untimed pass over every unit: company for the ranks still timing theirs."""
        self._measure(first=False)

    @property
    def median_s(self) -> float | None:
        return statistics.median(self.samples) if self.samples else None

    @property
    def together_median_s(self) -> float | None:
        return statistics.median(self.together_samples) if self.together_samples else None
