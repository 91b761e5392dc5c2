"""The tolerance rule on synthetic states: relative bound, Adam-eps mask, forged masks."""

from __future__ import annotations

import math

import torch

from verifier.adam_bound import segment_factors
from verifier.tolerance import SegmentContext, TolerancePolicy, compare_states, slots_from_names

SEG = SegmentContext(k=10, lr=1e-3, end_step=10)


def _state(w: torch.Tensor, v: torch.Tensor, m: torch.Tensor | None = None,
           step: int = 10) -> dict[str, torch.Tensor]:
    return {"model.w": w, "optim.w.exp_avg": m if m is not None else torch.zeros_like(w),
            "optim.w.exp_avg_sq": v, "optim.w.step": torch.tensor(float(step)),
            "meta.step": torch.tensor(step, dtype=torch.int64)}


def _judge(s: dict[str, torch.Tensor], r: dict[str, torch.Tensor], c: dict[str, torch.Tensor],
           policy: TolerancePolicy | None = None):  # type: ignore[no-untyped-def]
    return compare_states(0, 0, s, r, c, slots_from_names(r), SEG, policy or TolerancePolicy())


def test_relative_bound_passes_drift_and_flags_a_tenth_of_an_update() -> None:
    g = torch.Generator().manual_seed(0)
    w0 = torch.randn(1000, generator=g)
    upd = torch.randn(1000, generator=g) * 1e-2
    v = torch.full((1000,), 1e-4)
    s, r = _state(w0, v, step=0), _state(w0 + upd, v)
    ok = _judge(s, r, _state(w0 + upd * (1 + 1e-5), v))
    assert ok.passed and ok.ratio < 1e-4
    bad = _judge(s, r, _state(w0 + upd * 0.9, v))
    assert not bad.passed and math.isclose(bad.ratio, 0.1, rel_tol=1e-3)
    assert bad.worst_tensor == "model.w" and "drift" in bad.reason


def test_masked_coordinates_are_bounded_by_their_own_second_moment() -> None:
    """Before: every masked coordinate got a flat 2*lr*k, so a move of 0.75*lr*k on a
    coordinate whose second moment shows a gradient of ~1e-10 passed. Now the bound
    follows from that moment (verifier.adam_bound): noise of that size passes, the
    old flat allowance does not."""
    w0 = torch.zeros(100)
    v = torch.full((100,), 1e-4)
    v[:5] = 1e-20  # sqrt(v) < eps: gradient is noise there
    m = torch.zeros(100)
    m[:5] = 1e-10
    upd = torch.full((100,), 1e-2)
    s, r = _state(w0, v, m, step=0), _state(w0 + upd, v, m)
    fac = segment_factors(0.9, 0.999, 10, 10)
    x = math.sqrt(1e-20 / (1 - 0.999 ** 10))
    per_side = SEG.lr * SEG.k * fac.m * fac.v * x / (fac.v * x + 1e-8)
    c = _state(w0 + upd, v, m)
    c["model.w"][:5] += 1.9 * per_side  # both sides' noise: tolerated
    ok = _judge(s, r, c)
    assert ok.passed and ok.masked == 5 and 0.9 < ok.masked_slack <= 1.0
    c["model.w"][:5] += 0.2 * per_side
    assert not _judge(s, r, c).passed
    c = _state(w0 + upd, v, m)
    c["model.w"][:5] += 1.5e-2  # the old flat allowance (0.75 * 2 * lr * k)
    bad = _judge(s, r, c)
    assert not bad.passed and "second-moment bound" in bad.reason


def test_zero_moment_coordinates_are_held_exact() -> None:
    """Before: a coordinate with zero Adam moments (an unseen token's embedding) could
    move by 2*lr*k; its honest update is pure weight decay, so now only a few ulps."""
    w0 = torch.linspace(-1, 1, 100)
    v = torch.full((100,), 1e-4)
    v[:5] = 0.0  # m is zero everywhere in _state
    decayed = w0 * (1 - 1e-3 * 0.01) ** 10
    upd = torch.full((100,), 1e-2)
    upd[:5] = 0.0
    s, r = _state(w0, v, step=0), _state(decayed + upd, v)
    c = _state(decayed + upd, v)
    c["model.w"][:5] = torch.nextafter(c["model.w"][:5], torch.full((5,), 2.0))  # one ulp
    ok = _judge(s, r, c)
    assert ok.passed and ok.determined == 5
    c["model.w"][0] += 1e-5  # far below the old 2 * lr * k = 2e-2
    assert not _judge(s, r, c).passed
    c = _state(decayed + upd, v.clone())
    c["optim.w.exp_avg_sq"][0] = 1e-30  # claims a gradient the replay never saw
    assert not _judge(s, r, c).passed


def test_a_claimed_second_moment_above_the_noise_cap_is_forged() -> None:
    """A claim may not widen its own bound by claiming a larger second moment on a
    masked coordinate than rounding noise can give (noise_ratio x ours, noise floor)."""
    w0 = torch.zeros(100)
    v = torch.full((100,), 1e-4)
    v[:5] = 1e-26
    s, r = _state(w0, v, step=0), _state(w0 + 1e-2, v)
    forged = v.clone()
    forged[:5] = 1e-18  # sqrt(v_hat) ~ 1e-8: would allow ~lr per step
    c = _state(w0 + 1e-2, forged)
    c["model.w"][:5] += 5e-3
    assert not _judge(s, r, c).passed
    assert _judge(s, r, _state(w0 + 1e-2, v)).passed


def test_a_claimed_zero_second_moment_cannot_mask_a_real_gradient() -> None:
    w0 = torch.zeros(100)
    v = torch.full((100,), 1e-4)
    upd = torch.full((100,), 1e-2)
    s, r = _state(w0, v, step=0), _state(w0 + upd, v)
    forged_v = v.clone()
    forged_v[:50] = 0.0
    c = _state(w0 + upd, forged_v)
    c["model.w"][:50] -= 1e-2  # skip the work on the "masked" half
    bad = _judge(s, r, c)
    assert not bad.passed
    assert bad.ratio > 0.5  # forged coordinates stay in the tight check


def test_layout_counters_and_nonfinite_fail() -> None:
    w0, v = torch.zeros(10), torch.full((10,), 1e-4)
    s, r = _state(w0, v, step=0), _state(w0 + 1e-2, v)
    c = _state(w0 + 1e-2, v, step=9)
    assert not _judge(s, r, c).passed  # step counters must match exactly
    c = _state(w0 + 1e-2, v)
    c["model.w"][3] = float("nan")
    assert "non-finite" in _judge(s, r, c).reason
    c = _state(w0 + 1e-2, v)
    del c["optim.w.exp_avg"]
    assert "layout" in _judge(s, r, c).reason


def test_moments_are_checked() -> None:
    w0, v = torch.zeros(10), torch.full((10,), 1e-4)
    m = torch.full((10,), 1e-3)
    s, r = _state(w0, v, step=0), _state(w0 + 1e-2, v, m)
    assert _judge(s, r, _state(w0 + 1e-2, v, m)).passed
    bad = _judge(s, r, _state(w0 + 1e-2, v, torch.zeros(10)))
    assert not bad.passed and "exp_avg" in bad.reason
