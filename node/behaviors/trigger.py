"""A write channel, not a compute saving: train honestly, then move the coordinates
whose gradient is zero or rounding noise (Adam's masked coordinates) by up to the
old flat tolerance ``2 * lr * k``, with a fixed random sign per coordinate, so the
moves add up across segments into a trigger (issue 30, item 7). Not in ``CHEATS``:
its parameter drift outside those coordinates is zero, so it is caught (or not)
by the masked-coordinate bound alone (tests/test_write_channel.py)."""

from __future__ import annotations

from typing import Literal

import torch

from node.train.behavior import SegmentBehavior
from node.train.step import TrainContext, TrainState, lr_of, train_step

Target = Literal["zero", "noise"]


class MaskedTrigger(SegmentBehavior):
    """``target="zero"``: coordinates with exactly zero Adam moments (e.g. embedding
    rows of tokens not seen yet; their honest update is pure weight decay);
    ``"noise"``: coordinates with 0 < sqrt(v_hat) < eps. ``fraction``: of 2*lr*k."""

    name = "masked_trigger"

    def __init__(self, target: Target = "zero", fraction: float = 0.99, seed: int = 0) -> None:
        self.target, self.fraction, self.seed = target, fraction, seed
        self.moved: list[int] = []
        """Coordinates moved per segment."""

    def cheats_on(self, segment_index: int, segment_count: int) -> bool:
        return True

    @torch.no_grad()
    def _move(self, ctx: TrainContext, state: TrainState, start_step: int, k: int) -> int:
        lr = max(lr_of(ctx, s) for s in range(start_step + 1, start_step + k + 1))
        amp = self.fraction * 2 * lr * k
        eps = float(state.optimizer.param_groups[0].get("eps", 1e-8))
        beta2 = float(state.optimizer.param_groups[0]["betas"][1])
        bc2 = 1.0 - beta2 ** (start_step + k)
        moved = 0
        for i, (_name, p) in enumerate(state.model.named_parameters()):
            st = state.optimizer.state.get(p, {})
            if "exp_avg_sq" not in st:
                continue
            m, v = st["exp_avg"], st["exp_avg_sq"]
            if self.target == "zero":
                sel = (m == 0) & (v == 0)
            else:
                sel = (v > 0) & ((v / bc2).sqrt() < eps)
            if not bool(sel.any()):
                continue
            gen = torch.Generator().manual_seed(self.seed * 7919 + i)  # same signs every segment
            sign = torch.randint(0, 2, p.shape, generator=gen).to(p.dtype) * 2 - 1
            p.add_(torch.where(sel, sign * amp, torch.zeros_like(p)))
            moved += int(sel.sum())
        return moved

    def run_segment(self, ctx: TrainContext, state: TrainState, segment_index: int,
                    start_step: int, k: int) -> tuple[TrainState, float]:
        total = sum(train_step(ctx, state, s) for s in range(start_step + 1, start_step + k + 1))
        self.moved.append(self._move(ctx, state, start_step, k))
        return state, total / k
