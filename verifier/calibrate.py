"""Turn a drift matrix into tolerance numbers, and show the margin to cheats.

rho = safety x the largest honest ratio (rounded up to one significant digit),
separately for the whole state, single tensors and optimizer moments. The
margin is the smallest cheat ratio over rho: the protocol wants >= 10x.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from node.behaviors import make_behavior
from node.train.step import TrainContext, load_state, state_tensors
from verifier.drift import (
    BASELINE,
    MATRIX,
    DriftMatrix,
    HonestConfig,
    _sig_up,
    honest_starts,
    measure,
    replay_with,
)
from verifier.replay import Tensors, judge
from verifier.tolerance import TolerancePolicy

# Cheats that cheat on every segment (lazy/blindfold are mixtures of these).
CHEAT_PROBES: tuple[str, ...] = ("skip", "fewer_steps", "more_steps", "other_data",
                                 "half_batch", "low_lr:0.9", "noise:0.01", "bf16", "stale",
                                 "spoof")


@dataclass(frozen=True)
class Calibration:
    job: str
    k: int
    safety: float
    honest_max_ratio: float
    honest_max_tensor_ratio: float
    honest_max_opt_ratio: float
    honest_max_unmasked_ratio: float
    honest_max_loss_rel: float
    rho: float
    rho_tensor: float
    rho_opt: float
    false_flags: list[str]
    """config@segment rows that fail the policy in force (should be empty)."""
    cheat_min_ratio: dict[str, float] = field(default_factory=dict)

    @property
    def margin(self) -> float:
        """Smallest cheat ratio over the calibrated rho (>= 10 wanted)."""
        return min(self.cheat_min_ratio.values(), default=math.inf) / self.rho

    def policy(self, base: TolerancePolicy | None = None) -> TolerancePolicy:
        b = base or TolerancePolicy()
        return TolerancePolicy(rho=self.rho, rho_tensor=self.rho_tensor, rho_opt=self.rho_opt,
                               abs_tol=b.abs_tol, mask_bound_factor=b.mask_bound_factor,
                               mask_trust=b.mask_trust, adam_eps=b.adam_eps,
                               rho_loss=b.rho_loss, opt_floor=b.opt_floor)

    def to_dict(self) -> dict[str, Any]:
        return dict(asdict(self), margin=self.margin)


def cheat_ratios(ctx: TrainContext, start: Tensors, segment: int,
                 names: Sequence[str] = CHEAT_PROBES) -> dict[str, float]:
    """Each cheat's claim from one honest start, judged against the baseline replay."""
    k = ctx.spec.checkpoint_interval
    replayed, _ = replay_with(BASELINE, ctx, start, segment * k, k)
    out: dict[str, float] = {}
    for name in names:
        state = load_state(ctx, start, step=segment * k)
        claimed, _ = make_behavior(name).run_segment(ctx, state, segment, segment * k, k)
        v = judge(ctx, segment, segment * k, start, replayed, state_tensors(claimed),
                  TolerancePolicy())
        out[name] = v.ratio
    return out


def derive(job: str, k: int, matrix: DriftMatrix, safety: float = 5.0,
           in_force: TolerancePolicy | None = None) -> Calibration:
    rows = matrix.rows
    return Calibration(
        job=job, k=k, safety=safety,
        honest_max_ratio=matrix.max_of("ratio"),
        honest_max_tensor_ratio=matrix.max_of("worst_param_ratio"),
        honest_max_opt_ratio=matrix.max_of("worst_opt_ratio"),
        honest_max_unmasked_ratio=matrix.max_of("unmasked_ratio"),
        honest_max_loss_rel=matrix.max_of("loss_rel"),
        rho=_sig_up(safety * matrix.max_of("ratio")),
        rho_tensor=_sig_up(safety * matrix.max_of("worst_param_ratio")),
        rho_opt=_sig_up(safety * matrix.max_of("worst_opt_ratio")),
        false_flags=[f"{r.config}@{r.segment}" for r in rows if not r.passed])


def calibrate(ctx: TrainContext, job: str, segments: Sequence[int],
              dataset_path: str | Path | None = None,
              configs: Sequence[HonestConfig] = MATRIX, safety: float = 5.0,
              subprocess_configs: bool = True,
              policy: TolerancePolicy | None = None) -> tuple[Calibration, DriftMatrix]:
    """Measure the drift matrix on ``segments`` and the cheats on the first of them."""
    matrix = measure(ctx, job, segments, dataset_path, configs, policy, subprocess_configs)
    cal = derive(job, ctx.spec.checkpoint_interval, matrix, safety, policy)
    seg = segments[-1]
    start = honest_starts(ctx, [seg])[seg]
    cal.cheat_min_ratio.update(cheat_ratios(ctx, start, seg))
    return cal, matrix
