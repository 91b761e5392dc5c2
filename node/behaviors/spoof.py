"""Spoofs from the proof-of-learning literature and partial cheats.

* ``spoof`` — infinitesimal-update spoof (Fang et al. 2023): no training;
  every segment moves the weights a small step from S_start straight toward a
  target model the attacker already has, arriving at the end of the job.
  Per-step updates are tiny, so "is this update plausible?" checks pass; a
  replay-relative bound does not (the honest update from S_start is large).
* ``blindfold`` — honest only on the segments with the largest updates (the
  first ``q`` of the job, where updates are largest), the spoof elsewhere.
* ``lazy`` — cheats on a pseudo-random fraction f of segments (skip or spoof),
  honest elsewhere: what sampling with n segments catches with 1-(1-f)^n.
"""

from __future__ import annotations

import hashlib
import math

import torch

from node.behaviors.common import probe_loss, set_step
from node.behaviors.steps import Cheat
from node.train.behavior import HonestBehavior
from node.train.models import build_model
from node.train.step import TrainContext, TrainState, derive_seed


class InfinitesimalSpoof(Cheat):
    name = "spoof"

    def __init__(self, target: dict[str, torch.Tensor] | None = None,
                 target_seed: int = 1) -> None:
        self.target = target
        self.target_seed = target_seed

    def _target(self, ctx: TrainContext) -> dict[str, torch.Tensor]:
        if self.target is None:  # "a model obtained elsewhere": another init
            m = build_model(ctx.spec.model, derive_seed(ctx.spec.seed, "spoof", self.target_seed))
            self.target = {n: p.detach() for n, p in m.named_parameters()}
        return self.target

    def run_segment(self, ctx: TrainContext, state: TrainState, segment_index: int,
                    start_step: int, k: int) -> tuple[TrainState, float]:
        target = self._target(ctx)
        remaining = max(1, ctx.spec.segment_count - segment_index)
        loss = probe_loss(ctx, state, start_step + 1)
        with torch.no_grad():
            for n, p in state.model.named_parameters():
                p.add_((target[n].to(p.device) - p) / remaining)
        return set_step(state, start_step + k), loss


class Blindfold(InfinitesimalSpoof):
    name = "blindfold"

    def __init__(self, q: float = 0.25, target: dict[str, torch.Tensor] | None = None,
                 target_seed: int = 1) -> None:
        super().__init__(target, target_seed)
        self.q = q
        self._honest = HonestBehavior()

    def cheats_on(self, segment_index: int, segment_count: int) -> bool:
        return segment_index >= math.ceil(self.q * segment_count)

    def run_segment(self, ctx: TrainContext, state: TrainState, segment_index: int,
                    start_step: int, k: int) -> tuple[TrainState, float]:
        if not self.cheats_on(segment_index, ctx.spec.segment_count):
            return self._honest.run_segment(ctx, state, segment_index, start_step, k)
        return super().run_segment(ctx, state, segment_index, start_step, k)


class LazyFraction(Cheat):
    """Cheat (``mode`` = "skip" or "spoof") on segments whose hash(salt, index)
    falls below ``fraction``; the solver picks them before it knows the sample."""

    name = "lazy"

    def __init__(self, fraction: float = 0.1, mode: str = "skip", salt: int = 0) -> None:
        if not 0.0 <= fraction <= 1.0:
            raise ValueError("fraction must lie in [0, 1]")
        if mode not in ("skip", "spoof"):
            raise ValueError("mode must be 'skip' or 'spoof'")
        self.fraction, self.mode, self.salt = fraction, mode, salt
        self._honest = HonestBehavior()
        self._spoof = InfinitesimalSpoof()

    def cheats_on(self, segment_index: int, segment_count: int = 0) -> bool:
        h = hashlib.sha256(f"lazy/{self.salt}/{segment_index}".encode()).digest()
        return int.from_bytes(h[:8], "big") < self.fraction * 2**64

    def run_segment(self, ctx: TrainContext, state: TrainState, segment_index: int,
                    start_step: int, k: int) -> tuple[TrainState, float]:
        if not self.cheats_on(segment_index):
            return self._honest.run_segment(ctx, state, segment_index, start_step, k)
        if self.mode == "spoof":
            return self._spoof.run_segment(ctx, state, segment_index, start_step, k)
        loss = probe_loss(ctx, state, start_step + 1)
        return set_step(state, start_step + k), loss
