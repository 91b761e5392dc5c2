"""Cheats on the work itself: skipped, missing or extra steps, wrong data,
wrong learning rate, wrong precision, added noise, stale claims."""

from __future__ import annotations

import torch

from node.behaviors.common import cheat_step, params, probe_loss, set_step
from node.train.behavior import SegmentBehavior
from node.train.step import TrainContext, TrainState, train_step


class Cheat(SegmentBehavior):
    """A behaviour that cheats on the segments ``cheats_on`` names (all by default)."""

    def cheats_on(self, segment_index: int, segment_count: int) -> bool:
        return True


class SkipSteps(Cheat):
    """Claim the start state unchanged (counters advanced): no compute at all."""

    name = "skip"

    def run_segment(self, ctx: TrainContext, state: TrainState, segment_index: int,
                    start_step: int, k: int) -> tuple[TrainState, float]:
        loss = probe_loss(ctx, state, start_step + 1)
        return set_step(state, start_step + k), loss


class FewerSteps(Cheat):
    """Run only ``k - missing`` of the k steps."""

    name = "fewer_steps"

    def __init__(self, missing: int = 1) -> None:
        self.missing = missing

    def run_segment(self, ctx: TrainContext, state: TrainState, segment_index: int,
                    start_step: int, k: int) -> tuple[TrainState, float]:
        done = max(0, k - self.missing)
        losses = [train_step(ctx, state, s) for s in range(start_step + 1, start_step + done + 1)]
        loss = sum(losses) / len(losses) if losses else probe_loss(ctx, state, start_step + 1)
        return set_step(state, start_step + k), loss


class WithholdStates(FewerSteps):
    """``fewer_steps`` that, when challenged, posts its bisection hashes but never
    serves the states behind them."""

    name = "withhold"
    serves_dispute_states = False


class Dark(SkipSteps):
    """``skip`` that serves nothing at all: no trace manifest, no state, no leaf asked
    for on chain (issue 30's withholding solver, condemned by an availability request)."""

    name = "dark"
    serves_data = False
    serves_dispute_states = False


class MoreSteps(Cheat):
    """Run ``k + extra`` steps (e.g. to look better), claim k."""

    name = "more_steps"

    def __init__(self, extra: int = 1) -> None:
        self.extra = extra

    def run_segment(self, ctx: TrainContext, state: TrainState, segment_index: int,
                    start_step: int, k: int) -> tuple[TrainState, float]:
        losses = [train_step(ctx, state, s)
                  for s in range(start_step + 1, start_step + k + self.extra + 1)]
        return set_step(state, start_step + k), sum(losses[:k]) / k


class _ConsistentLiar(Cheat):
    """Trains every step through its own ``dispute_step``, so it answers disputes along
    the very trajectory it committed."""

    def run_segment(self, ctx: TrainContext, state: TrainState, segment_index: int,
                    start_step: int, k: int) -> tuple[TrainState, float]:
        total = sum(self.dispute_step(ctx, state, s)
                    for s in range(start_step + 1, start_step + k + 1))
        return state, total / k


class OneBadStep(_ConsistentLiar):
    """Honest but for one step per segment, the ``at``-th (1-based; 0 = the middle one,
    k // 2 + 1), trained on the batch of step + ``offset``. It answers disputes along
    this same trajectory (a consistent liar), so bisection must find that very step."""

    name = "bad_step"

    def __init__(self, at: int = 0, offset: int = 7) -> None:
        self.at = at
        self.offset = offset

    def is_bad(self, ctx: TrainContext, step: int) -> bool:
        k = ctx.spec.checkpoint_interval
        return (step - 1) % k + 1 == (self.at or k // 2 + 1)

    def dispute_step(self, ctx: TrainContext, state: TrainState, step: int) -> float:
        if self.is_bad(ctx, step):
            return cheat_step(ctx, state, step, data_step=step + self.offset)
        return train_step(ctx, state, step)


class _KnobCheat(Cheat):
    """k steps through ``cheat_step`` with one knob turned."""

    def knobs(self, step: int) -> dict[str, object]:
        raise NotImplementedError

    def run_segment(self, ctx: TrainContext, state: TrainState, segment_index: int,
                    start_step: int, k: int) -> tuple[TrainState, float]:
        total = 0.0
        for s in range(start_step + 1, start_step + k + 1):
            total += cheat_step(ctx, state, s, **self.knobs(s))  # type: ignore[arg-type]
        return state, total / k


class OtherData(_KnobCheat):
    """Train on another step's batch (data the solver prefers, or cached)."""

    name = "other_data"

    def __init__(self, offset: int = 7) -> None:
        self.offset = offset

    def knobs(self, step: int) -> dict[str, object]:
        return {"data_step": step + self.offset}


class HalfBatch(_KnobCheat):
    """Train on a fraction of each batch (half the compute)."""

    name = "half_batch"

    def __init__(self, fraction: float = 0.5) -> None:
        self.fraction = fraction

    def knobs(self, step: int) -> dict[str, object]:
        return {"batch_fraction": self.fraction}


class LowLR(_KnobCheat):
    """Train with the learning rate scaled by ``factor``."""

    name = "low_lr"

    def __init__(self, factor: float = 0.5) -> None:
        self.factor = factor

    def knobs(self, step: int) -> dict[str, object]:
        return {"lr_scale": self.factor}


class Amplify(_ConsistentLiar):
    """A byzantine collaborative worker: honest, except that the last segment's steps
    take ``factor`` x the learning rate, so its delta (theta_t - final weights) is
    blown up. It answers disputes along the same trajectory."""

    name = "amplify"

    def __init__(self, factor: float = 5.0) -> None:
        self.factor = factor

    def cheats_on(self, segment_index: int, segment_count: int) -> bool:
        return segment_index == segment_count - 1

    def _last(self, ctx: TrainContext, step: int) -> bool:
        return step > ctx.spec.total_steps - ctx.spec.checkpoint_interval

    def dispute_step(self, ctx: TrainContext, state: TrainState, step: int) -> float:
        if self._last(ctx, step):
            return cheat_step(ctx, state, step, lr_scale=self.factor)
        return train_step(ctx, state, step)


class WrongOuter(Cheat):
    """A collaborative worker whose inner runs are honest but which, the first time it
    may post a round's outer state, posts a forged one instead of recomputing it
    (node.roles.collab reads ``forges_outer``)."""

    name = "wrong_outer"
    forges_outer = True

    def cheats_on(self, segment_index: int, segment_count: int) -> bool:
        return False

    def run_segment(self, ctx: TrainContext, state: TrainState, segment_index: int,
                    start_step: int, k: int) -> tuple[TrainState, float]:
        total = sum(train_step(ctx, state, s) for s in range(start_step + 1, start_step + k + 1))
        return state, total / k


class BF16(_KnobCheat):
    """Compute in bf16 autocast (cheaper on accelerators) while the job says fp32."""

    name = "bf16"

    def knobs(self, step: int) -> dict[str, object]:
        return {"bf16": True}


class Noise(Cheat):
    """Honest steps, then Gaussian noise of ``rel`` x each tensor's update norm."""

    name = "noise"

    def __init__(self, rel: float = 0.01, seed: int = 0) -> None:
        self.rel, self.seed = rel, seed

    def run_segment(self, ctx: TrainContext, state: TrainState, segment_index: int,
                    start_step: int, k: int) -> tuple[TrainState, float]:
        before = params(state)
        total = sum(train_step(ctx, state, s) for s in range(start_step + 1, start_step + k + 1))
        gen = torch.Generator().manual_seed(self.seed * 1_000_003 + segment_index)
        with torch.no_grad():
            for n, p in state.model.named_parameters():
                z = torch.randn(p.shape, generator=gen)
                upd = float((p - before[n]).norm())
                p.add_(z * (self.rel * upd / max(float(z.norm()), 1e-30)))
        return state, total / k


class Stale(Cheat):
    """Claim the state of ``lag`` segments ago (S_0 when there is none): a replayed
    old checkpoint instead of new work."""

    name = "stale"

    def __init__(self, lag: int = 1) -> None:
        self.lag = lag
        self._history: list[dict[str, torch.Tensor]] = []

    def run_segment(self, ctx: TrainContext, state: TrainState, segment_index: int,
                    start_step: int, k: int) -> tuple[TrainState, float]:
        self._history.append({n: t.clone() for n, t in state.model.state_dict().items()})
        old = self._history[max(0, len(self._history) - 1 - self.lag)]
        loss = probe_loss(ctx, state, start_step + 1)
        with torch.no_grad():
            for n, t in state.model.state_dict().items():
                t.copy_(old[n])
        return set_step(state, start_step + k), loss


class Poison(Cheat):
    """Honest, but the claimed end state of segment ``at`` holds a NaN (``mode="nan"``)
    or a tensor of the wrong shape (``mode="shape"``); the next segment trains on from
    the honest state. Segment ``at`` fails on its claim, segment ``at + 1`` on its
    committed start state: a verifier must fail (and challenge) both, each on its own."""

    name = "poison"

    def __init__(self, at: int = 1, mode: str = "nan") -> None:
        if mode not in ("nan", "shape"):
            raise ValueError("mode must be 'nan' or 'shape'")
        self.at, self.mode = at, mode
        self._saved: tuple[torch.nn.Parameter, torch.Tensor] | None = None

    def cheats_on(self, segment_index: int, segment_count: int) -> bool:
        return segment_index in (self.at, self.at + 1)

    def run_segment(self, ctx: TrainContext, state: TrainState, segment_index: int,
                    start_step: int, k: int) -> tuple[TrainState, float]:
        if self._saved is not None:  # back to the honest state before training on
            p, honest = self._saved
            p.data = honest
            self._saved = None
        total = sum(train_step(ctx, state, s) for s in range(start_step + 1, start_step + k + 1))
        if segment_index == self.at:
            p = next(iter(state.model.parameters()))
            self._saved = (p, p.data)
            if self.mode == "nan":
                bad = p.data.clone()
                bad.view(-1)[0] = float("nan")
            else:
                bad = torch.zeros(p.shape[0] + 1, *p.shape[1:], dtype=p.dtype)
            p.data = bad
        return state, total / k
