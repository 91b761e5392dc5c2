"""Per-coordinate bounds for Adam's *masked* coordinates (second moment below eps):
how far an honest replay on other hardware can land from the claim there.

Adam moves a coordinate by ``lr * m_hat / (sqrt(v_hat) + eps)`` a step (plus the
decoupled weight decay ``p *= 1 - lr * wd``, the same on every machine up to
rounding). Two cases:

* **Determined** (the replay's ``exp_avg`` and ``exp_avg_sq`` are exactly 0: the
  gradient was exactly 0 all along, e.g. the embedding row of a token not seen
  yet). The update is pure weight decay, fully determined by the start state, so
  the claim must match up to the rounding of that multiply (``exact_ulps`` ulps of
  |p| a step) and claim zero moments too. Exact zeros are structural (an index
  never touched), the same on every machine: the drift matrix found none that
  differed.
* **Noise** (``sqrt(v_hat) < eps`` but not 0: the gradient is rounding noise). By
  Cauchy-Schwarz over the gradient history (m_0 = v_0 = 0),
  ``|m_hat_j| <= M_j * sqrt(v_hat_j)`` with ``M_j`` from the betas (1 at step 1,
  about 7.3 in the limit), and ``v_j <= v_end / beta2^(end-j)`` (v decays by at
  most beta2 a step), so each step moves such a coordinate by at most
  ``lr * M * f(V * X)`` with ``f(x) = x / (x + eps)``, ``X`` the end's
  ``sqrt(v_hat)`` and ``V`` the bias-correction factor below. The replay R and an
  honest claim C each move at most that much, so ``|R - C| <= lr * k * M *
  (f(V X_R) + f(V X_C))``. ``X_R`` is ours; the claimed ``X_C`` is trusted only up to
  ``max(noise_ratio * X_R, noise_floor * eps)``: rounding noise on another machine
  is of the same order as ours (the drift matrix: within 2x) or, where ours is ~0
  (an fp64 replay), below fp32's noise floor; a claimed moment above that is a
  forgery and fails. An attacker that claims the largest moment allowed can thus
  move a noise coordinate by about ``lr * k * M * V * noise_floor`` a segment
  (0.07 * lr * k at the defaults late in training, M ~ 7.3), not ``2 * lr * k``;
  one that does not, by ``lr * k * M * V * 2 X_R / eps`` (~1e-3 * lr * k on the LM).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

FP32_ULP = 2.0 ** -23
"""ulp(x) <= FP32_ULP * |x| for a float32 x."""
FP32_TINY = float(torch.finfo(torch.float32).tiny)
"""Moments below this (subnormal) count as zero: hardware that flushes subnormals
reads them as 0, and they move p by at most lr * FP32_TINY / eps a step."""


def moment_ratio(beta1: float, beta2: float, step: int) -> float:
    """Sup of |m_hat| / sqrt(v_hat) after ``step`` Adam steps from zero moments
    (Cauchy-Schwarz; reached by one gradient sequence, so not loose)."""
    if step < 1:
        return 0.0
    r = beta1 * beta1 / beta2
    geo = float(step) if math.isclose(r, 1.0) else (1.0 - r ** step) / (1.0 - r)
    return ((1.0 - beta1) / math.sqrt(1.0 - beta2) * math.sqrt(geo)
            * math.sqrt(1.0 - beta2 ** step) / (1.0 - beta1 ** step))


@dataclass(frozen=True)
class SegmentFactors:
    """``m``: max over the segment's steps of ``moment_ratio``; ``v``: max over them of
    sqrt(v_hat_j) / sqrt(v_hat_end) allowed by v's decay and bias correction."""

    m: float
    v: float


def segment_factors(beta1: float, beta2: float, end_step: int, k: int) -> SegmentFactors:
    steps = range(max(1, end_step - k + 1), end_step + 1)
    m = max((moment_ratio(beta1, beta2, j) for j in steps), default=0.0)
    bc_end = 1.0 - beta2 ** end_step
    v = max((math.sqrt(bc_end / (beta2 ** (end_step - j) * (1.0 - beta2 ** j)))
             for j in steps), default=1.0)
    return SegmentFactors(m, v)


@dataclass(frozen=True)
class MaskedBounds:
    """What the masked coordinates of one tensor showed."""

    violations: int
    slack: float
    """max |R - C| / bound over the masked coordinates (<= 1 passes)."""
    determined: int
    """Coordinates whose update is pure weight decay (zero moments)."""


@dataclass(frozen=True)
class AdamMoments:
    """One side's moments at the segment's end, bias corrected: ``m`` = |m_hat|,
    ``x`` = sqrt(v_hat); ``zero``: both raw moments 0 (or subnormal)."""

    m: torch.Tensor
    x: torch.Tensor
    zero: torch.Tensor

    @classmethod
    def of(cls, exp_avg: torch.Tensor | None, exp_avg_sq: torch.Tensor, bc1: float,
           bc2: float) -> AdamMoments:
        v = exp_avg_sq.double()
        m = exp_avg.double() if exp_avg is not None else torch.zeros_like(v)
        return cls(m.abs() / bc1, (v / bc2).sqrt(), (m.abs() < FP32_TINY) & (v < FP32_TINY))


def check_masked(*, s: torch.Tensor, r: torch.Tensor, c: torch.Tensor, mask: torch.Tensor,
                 mom_r: AdamMoments, mom_c: AdamMoments, lr: float, k: int,
                 factors: SegmentFactors, eps: float, noise_ratio: float, noise_floor: float,
                 exact_ulps: float, ceiling: float) -> MaskedBounds:
    """Apply the module's bounds to the coordinates in ``mask`` (``ceiling``: the
    largest per-coordinate bound ever given, the old flat factor * lr * k)."""
    d = (r.double() - c.double()).abs()[mask]
    mag = torch.maximum(s.double().abs(), r.double().abs())[mask]
    # Weight decay's rounding on both sides, and what subnormal moments can move.
    decay = (exact_ulps * k + 1) * FP32_ULP * mag + 2 * lr * k * FP32_TINY / eps
    zero = mom_r.zero[mask]
    xr, xc, mc = mom_r.x[mask], mom_c.x[mask], mom_c.m[mask]
    cap = torch.clamp(noise_ratio * xr, min=noise_floor * eps)
    # 1e-18: an m whose v underflowed (|g| < 1e-21); it moves p by lr * 1e-10 at most.
    forged = (xc > cap) | (mc > 1.01 * factors.m * xc + 1e-18)
    xc = torch.minimum(xc, cap)

    def f(x: torch.Tensor) -> torch.Tensor:
        return factors.v * x / (factors.v * x + eps)

    noise = torch.clamp(lr * k * factors.m * (f(xr) + f(xc)), max=ceiling)
    bound = torch.where(zero, decay, noise + decay)
    bad = d > bound
    # Determined coordinates: the claim's moments must be exactly zero as well.
    bad |= zero & ~mom_c.zero[mask]
    bad |= ~zero & forged
    slack = float((d / bound.clamp(min=1e-45)).max()) if d.numel() else 0.0
    return MaskedBounds(int(bad.sum()), slack, int(zero.sum()))
