"""The tolerance rule on synthetic states: relative bound, Adam-eps mask, forged masks."""

from __future__ import annotations

import math

import torch

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


def test_masked_coordinates_get_the_loose_bound() -> None:
    w0 = torch.zeros(100)
    v = torch.full((100,), 1e-4)
    v[:5] = 1e-20  # sqrt(v) < eps: gradient is noise there
    upd = torch.full((100,), 1e-2)
    s, r = _state(w0, v, step=0), _state(w0 + upd, v)
    c = _state(w0 + upd, v)
    c["model.w"][:5] += 1.5e-2  # a whole lr*k step of amplified noise: tolerated
    ok = _judge(s, r, c)
    assert ok.passed and ok.masked == 5
    c["model.w"][0] += 1.0  # far beyond factor * lr * k
    bad = _judge(s, r, c)
    assert not bad.passed and "masked" in bad.reason


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
