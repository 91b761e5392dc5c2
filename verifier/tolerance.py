"""The tolerance model: is a claimed end state C within honest drift of the
replayed state R?

A segment passes iff, over all parameters together and for every tensor,

    ||R - C|| <= rho * ||R - S|| + abs_tol * sqrt(n)

on the *tight* coordinates (S is the committed start state, n the number of
tight coordinates, so ``abs_tol`` is a per-coordinate RMS floor that only
matters when a tensor barely moved). The bound is relative to the replayed
update: a cheat differs from R by a sizeable fraction of an update, honest
hardware by ~1e-6..1e-4 of it (NOTES.md, and ``verifier.drift``).

Adam amplifies rounding noise where the second moment is ~0 (sqrt(v_hat) < eps:
the gradient there is noise, e.g. attention key biases), turning 1e-10 of noise
into a sizeable step. Those coordinates are *masked*: excluded from the tight
check and held to a per-coordinate bound (:mod:`verifier.adam_bound`): exact up to
a few ulps where the replay's moments are zero (the update is pure weight decay),
else scaled by the coordinate's own second moment, never above the old flat
``mask_bound_factor * lr * k``.

The mask comes from R (trusted: the verifier computed it) or from C, but a
coordinate C claims to be ~0 is only accepted where R agrees it is small
(sqrt(v_hat_R) < mask_trust * eps): otherwise a solver could mask arbitrary
coordinates by claiming a zero second moment.

The Adam moments are checked too, with the same rule per tensor (rho_opt):
the next segment is replayed *from* the claimed optimizer state, so a forged
moment would otherwise go unchecked. Integer state (step counters) must match
exactly.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from verifier.adam_bound import AdamMoments, check_masked, segment_factors
from verifier.verdict import TensorCheck, Verdict


@dataclass(frozen=True)
class TolerancePolicy:
    """The numbers of the rule above. Defaults: fp32, calibrated (``verifier.calibrate``)."""

    rho: float = 1e-3
    """Overall bound (all parameters together), relative to the replayed update."""
    rho_tensor: float = 3e-3
    """Per-parameter-tensor bound: small tensors (norm biases) drift relatively more
    (fp64 vs fp32 reached 2.5e-4 on a LayerNorm bias while the whole state drifted 7e-6)."""
    abs_tol: float = 1e-7
    """Per-coordinate RMS floor (absolute), for tensors that barely moved."""
    rho_opt: float = 3e-3
    """Per-tensor bound for the optimizer's moments (exp_avg, exp_avg_sq, momentum)."""
    mask_bound_factor: float = 2.0
    """Ceiling of the per-coordinate bound on masked coordinates: factor * lr * k."""
    noise_ratio: float = 4.0
    """A claimed sqrt(v_hat) on a masked coordinate is trusted up to this times ours
    (honest fp32 machines measured within 1.8x, verifier/adam_bound.py)..."""
    noise_floor: float = 0.01
    """...or up to this times eps (honest fp32 noise measured <= 2.2e-12 = 2.2e-4 eps)."""
    exact_ulps: float = 2.0
    """Determined (zero-moment) coordinates: allowed rounding of weight decay, in ulps
    of |p| per step (fp64 vs fp32 measured 0.6 per step)."""
    mask_trust: float = 100.0
    """C may mask a coordinate only where sqrt(v_hat_R) < mask_trust * eps."""
    opt_floor: float = 1e-6
    """Floor for the moments, relative to their norm (they have no natural unit)."""
    adam_eps: float = 1e-8
    rho_loss: float = 1e-3
    """Relative bound on the segment's mean loss vs the replayed one."""

    def scaled(self, factor: float) -> TolerancePolicy:
        return replace(self, rho=self.rho * factor, rho_tensor=self.rho_tensor * factor,
                       rho_opt=self.rho_opt * factor,
                       abs_tol=self.abs_tol * factor, rho_loss=self.rho_loss * factor)


@dataclass(frozen=True)
class OptimSlots:
    """Names of one parameter's optimizer tensors in a state dict (None: absent)."""

    exp_avg: str | None = None
    exp_avg_sq: str | None = None
    step: str | None = None
    momentum_buffer: str | None = None


def slots_from_names(names: Iterable[str], param_prefix: str = "model.",
                     optim_prefix: str = "optim.") -> dict[str, OptimSlots]:
    """Map ``model.<p>`` to its ``optim.<p>.<key>`` tensors (``node.train.step`` naming)."""
    found: dict[str, dict[str, str]] = {}
    for name in names:
        if not name.startswith(optim_prefix):
            continue
        pname, _, key = name[len(optim_prefix):].rpartition(".")
        if key in OptimSlots.__dataclass_fields__:
            found.setdefault(param_prefix + pname, {})[key] = name
    return {p: OptimSlots(**keys) for p, keys in found.items()}


@dataclass(frozen=True)
class SegmentContext:
    """What the rule needs to know about the segment besides the states."""

    k: int
    lr: float
    """Largest learning rate used in the segment (schedules vary it)."""
    beta1: float = 0.9
    beta2: float = 0.999
    end_step: int = 0
    """Adam step count after the segment, for bias correction (0: read from state)."""


@dataclass(frozen=True)
class Sums:
    """One check's figures over some rows of its tensors: sums, so the figures of a
    tensor split by rows over ranks are the sums of the ranks' (verifier.dist_replay).
    ``d2`` = sum (R - C)^2 and ``u2`` = sum (R - S)^2 over the tight coordinates, ``r2``
    = sum R^2 there (the moments' relative floor), ``n`` their count; ``masked`` and
    ``violations`` count masked coordinates and those out of bound; ``mismatch``
    counts differing rows of an exact check."""

    d2: float = 0.0
    u2: float = 0.0
    r2: float = 0.0
    n: int = 0
    masked: int = 0
    violations: int = 0
    mismatch: int = 0

    def vector(self) -> list[float]:
        return [self.d2, self.u2, self.r2, float(self.n), float(self.masked),
                float(self.violations), float(self.mismatch)]

    @classmethod
    def of_vector(cls, v: list[float]) -> Sums:
        return cls(v[0], v[1], v[2], int(v[3]), int(v[4]), int(v[5]), int(v[6]))


#: Floats of one check in ``Sums.vector``.
SUMS_WIDTH = 7


@dataclass(frozen=True)
class Partials:
    """``compare_states``'s figures over some rows: per check (name, kind, sums), in
    the order the verdict lists them, with the maxima and counts of masked
    coordinates. The partials of disjoint rows combine (``combine``) to those of all."""

    checks: tuple[tuple[str, str, Sums], ...]
    masked_slack: float = 0.0
    determined: int = 0


def combine(parts: Sequence[Partials]) -> Partials:
    """The partials of the union of the parts' rows: sums add (in the given order, so
    the result is the same on every rank), the masked slack is their maximum."""
    first = parts[0]
    checks = []
    for i, (name, kind, _) in enumerate(first.checks):
        acc = [0.0] * SUMS_WIDTH
        for p in parts:
            if p.checks[i][:2] != (name, kind):
                raise ValueError(f"partials disagree on check {i}: {p.checks[i][:2]} vs "
                                 f"{(name, kind)}")
            acc = [a + b for a, b in zip(acc, p.checks[i][2].vector(), strict=True)]
        checks.append((name, kind, Sums.of_vector(acc)))
    return Partials(tuple(checks), max(p.masked_slack for p in parts),
                    sum(p.determined for p in parts))


# (dtype, shape) per tensor: torch dtypes, or a file header's names ("F32")
Layout = Mapping[str, tuple[Any, tuple[int, ...]]]


def layout_of(tensors: Mapping[str, torch.Tensor]) -> dict[str, tuple[torch.dtype,
                                                                      tuple[int, ...]]]:
    return {n: (t.dtype, tuple(t.shape)) for n, t in tensors.items()}


def layout_mismatch(replayed: Layout, claimed: Layout,
                    replayed_order: bool = False) -> str | None:
    """Why the claimed state's layout is not the replayed one's, or None (the first
    tensor that differs in name order, or in ``replayed``'s order)."""
    if set(claimed) != set(replayed):
        extra, missing = sorted(set(claimed) - set(replayed)), sorted(set(replayed) - set(claimed))
        return f"state layout differs: extra {extra[:3]} missing {missing[:3]}"
    for name in replayed if replayed_order else sorted(replayed):
        (rd, rs), (cd, cs) = replayed[name], claimed[name]
        if cs != rs or cd != rd:
            return f"{name}: claimed {cd}{list(cs)}, expected {rd}{list(rs)}"
    return None


def non_finite_reason(name: str) -> str:
    return f"{name}: claimed state has non-finite values"


def _norm2(x: torch.Tensor) -> float:
    return float(torch.sum(x.double() ** 2))


def _sums(s: torch.Tensor, r: torch.Tensor, c: torch.Tensor, tight: torch.Tensor | None,
          masked: int = 0, violations: int = 0, rel: bool = False) -> Sums:
    """The tight check's sums (``rel``: with R's own norm, for a relative floor)."""
    d = (r - c)
    u = (r - s)
    if tight is not None:
        d, u = d[tight], u[tight]
    r2 = _norm2(r[tight] if tight is not None else r) if rel else 0.0
    return Sums(_norm2(d), _norm2(u), r2, d.numel(), masked, violations)


def _tight(name: str, kind: str, sums: Sums, rho: float, abs_floor: float | None,
           rel_floor: float = 0.0) -> TensorCheck:
    """Tight check; the floor is ``abs_floor * sqrt(n)`` or ``rel_floor * ||R||``."""
    dist, upd = math.sqrt(sums.d2), math.sqrt(sums.u2)
    floor = abs_floor * math.sqrt(sums.n) if abs_floor is not None \
        else rel_floor * math.sqrt(sums.r2)
    bound = rho * upd + floor
    ok = dist <= bound and sums.violations == 0 and math.isfinite(dist)
    return TensorCheck(name, kind, dist, upd, bound, sums.masked, sums.violations, ok)


def _bias_correction(beta: float, step: float) -> float:
    return 1.0 - beta ** step if step > 0 else 1.0


def _step_of(state: Mapping[str, torch.Tensor], slots: OptimSlots, default: int) -> float:
    if slots.step is not None and slots.step in state:
        return float(state[slots.step].double().reshape(-1)[0])
    return float(default)


def compare_states(
    segment: int,
    start_step: int,
    start: Mapping[str, torch.Tensor],
    replayed: Mapping[str, torch.Tensor],
    claimed: Mapping[str, torch.Tensor],
    slots: Mapping[str, OptimSlots],
    seg: SegmentContext,
    policy: TolerancePolicy,
) -> Verdict:
    """Apply the rule. ``slots`` maps each parameter name to its Adam tensors;
    every other float tensor is compared as a parameter, every non-float one
    exactly."""
    bad = layout_mismatch(layout_of(replayed), layout_of(claimed), replayed_order=True)
    for name in replayed if bad is None else ():
        c = claimed[name]
        if c.is_floating_point() and not bool(torch.isfinite(c).all()):
            bad = non_finite_reason(name)
            break
    if bad is not None:
        return failed_verdict(segment, start_step, seg, bad)
    parts = partial_sums(start, replayed, claimed, slots, seg, policy, start_step)
    return verdict_of(segment, start_step, seg, policy, parts)


def failed_verdict(segment: int, start_step: int, seg: SegmentContext, reason: str) -> Verdict:
    return Verdict(segment, start_step, start_step + seg.k, False, reason, math.inf, 0.0, 0.0,
                   "", math.inf, 0)


def partial_sums(start: Mapping[str, torch.Tensor], replayed: Mapping[str, torch.Tensor],
                 claimed: Mapping[str, torch.Tensor], slots: Mapping[str, OptimSlots],
                 seg: SegmentContext, policy: TolerancePolicy, start_step: int,
                 skip: frozenset[str] = frozenset()) -> Partials:
    """The rule's figures over the rows the three mappings hold (all of them, or one
    rank's dim-0 rows of each tensor): every coordinate's mask and bound depend on that
    coordinate alone, so rows can be judged apart and their sums added. ``skip``:
    tensors whose figures another rank gives (a tensor every rank holds whole) count
    as zero rows here; they are still read (the optimizer's step counts)."""
    end_step = start_step + seg.k
    slot_names = {n for sl in slots.values()
                  for n in (sl.exp_avg, sl.exp_avg_sq, sl.step, sl.momentum_buffer) if n}
    checks: list[tuple[str, str, Sums]] = []
    eps = policy.adam_eps
    loose = policy.mask_bound_factor * seg.lr * seg.k
    determined = 0
    masked_slack = 0.0

    for name in sorted(replayed):
        if name in slot_names:
            continue
        r = replayed[name]
        if not r.is_floating_point():
            mismatch = 0 if name in skip or torch.equal(r, claimed[name]) else 1
            checks.append((name, "exact", Sums(mismatch=mismatch)))
            continue
        s, c = start[name], claimed[name]
        sl = slots.get(name)
        tight: torch.Tensor | None = None
        masked = violations = held_exact = 0
        slack = 0.0
        opt_checks: list[tuple[str, str, Sums]] = []
        if sl is not None and sl.exp_avg_sq is not None:
            bc2_r = _bias_correction(seg.beta2, _step_of(replayed, sl, seg.end_step or end_step))
            bc2_c = _bias_correction(seg.beta2, _step_of(claimed, sl, seg.end_step or end_step))
            sv_r = (replayed[sl.exp_avg_sq].double() / bc2_r).sqrt()
            sv_c = (claimed[sl.exp_avg_sq].double() / bc2_c).sqrt()
            mask_r, mask_c = sv_r < eps, sv_c < eps
            # C may not mask what R shows to be a real gradient (see module doc).
            forged = mask_c & ~mask_r & (sv_r >= policy.mask_trust * eps)
            # Forged coordinates stay in the tight check (and count as violations).
            mask = mask_r | (mask_c & ~forged)
            tight = ~mask
            masked = int(mask.sum())
            violations = int(forged.sum())
            if masked:
                # Masked moments must stay at noise level on the claimed side.
                violations += int((sv_c[mask] >= policy.mask_trust * eps).sum())
                adam_step = int(_step_of(replayed, sl, seg.end_step or end_step))
                bc1 = _bias_correction(seg.beta1, adam_step)
                mb = check_masked(
                    s=s, r=r, c=c, mask=mask,
                    mom_r=AdamMoments.of(replayed.get(sl.exp_avg or ""),
                                         replayed[sl.exp_avg_sq], bc1, bc2_r),
                    mom_c=AdamMoments.of(claimed.get(sl.exp_avg or ""),
                                         claimed[sl.exp_avg_sq], bc1, bc2_c),
                    lr=seg.lr, k=seg.k, eps=eps,
                    factors=segment_factors(seg.beta1, seg.beta2, adam_step, seg.k),
                    noise_ratio=policy.noise_ratio, noise_floor=policy.noise_floor,
                    exact_ulps=policy.exact_ulps, ceiling=loose)
                violations += mb.violations
                slack, held_exact = mb.slack, mb.determined
        if sl is not None:
            for kind, slot in (("exp_avg", sl.exp_avg), ("exp_avg_sq", sl.exp_avg_sq),
                               ("momentum", sl.momentum_buffer)):
                if slot is None:
                    continue
                opt_checks.append((slot, kind, _sums(start[slot], replayed[slot],
                                                     claimed[slot], tight, rel=True)))
            if sl.step is not None:
                same = torch.equal(replayed[sl.step], claimed[sl.step])
                opt_checks.append((sl.step, "exact", Sums(mismatch=0 if same else 1)))
        mine = [(name, "param", _sums(s, r, c, tight, masked, violations)), *opt_checks]
        if name in skip:  # another rank counts it (it and its slots are whole everywhere)
            mine = [(n, kind, Sums()) for n, kind, _ in mine]
        else:
            masked_slack = max(masked_slack, slack)
            determined += held_exact
        checks.extend(mine)
    return Partials(tuple(checks), masked_slack, determined)


def verdict_of(segment: int, start_step: int, seg: SegmentContext, policy: TolerancePolicy,
               parts: Partials) -> Verdict:
    """The verdict of the rule from its figures over every row."""
    end_step = start_step + seg.k
    loose = policy.mask_bound_factor * seg.lr * seg.k
    checks: list[TensorCheck] = []
    dist2 = upd2 = 0.0
    n = masked_total = 0
    for name, kind, sums in parts.checks:
        if kind == "exact":
            ok = sums.mismatch == 0
            checks.append(TensorCheck(name, "exact", 0.0 if ok else math.inf, 0.0, 0.0, 0, 0,
                                      ok))
        elif kind == "param":
            checks.append(_tight(name, kind, sums, policy.rho_tensor, policy.abs_tol))
            dist2 += sums.d2
            upd2 += sums.u2
            n += sums.n
            masked_total += sums.masked
        else:
            checks.append(_tight(name, kind, sums, policy.rho_opt, None, policy.opt_floor))

    distance, update = math.sqrt(dist2), math.sqrt(upd2)
    bound = policy.rho * update + policy.abs_tol * math.sqrt(n)
    worst = max(checks, key=lambda t: t.slack, default=None)
    failed = [t for t in checks if not t.passed]
    if not math.isfinite(distance) or distance > bound:
        reason = (f"parameters drift {distance:.3e} > bound {bound:.3e} "
                  f"(ratio {distance / update if update else math.inf:.2e} vs rho {policy.rho:g})")
    elif failed:
        t = max(failed, key=lambda t: t.slack)
        if t.masked_violations:
            reason = (f"{t.name}: {t.masked_violations} Adam-eps-masked coordinates out of "
                      "their second-moment bound (exact where the moments are zero, at most "
                      f"{loose:.2e}) or claiming moments the replay does not show")
        elif t.kind == "exact":
            reason = f"{t.name}: must match exactly"
        else:
            reason = (f"{t.name} ({t.kind}): drift {t.distance:.3e} > bound {t.bound:.3e} "
                      f"(ratio {t.ratio:.2e})")
    else:
        reason = "within tolerance"
    return Verdict(segment, start_step, end_step, not failed and distance <= bound, reason,
                   distance, update, bound, worst.name if worst else "",
                   worst.slack if worst else 0.0, masked_total, tensors=tuple(checks),
                   masked_slack=parts.masked_slack, determined=parts.determined)


def check_loss(verdict: Verdict, claimed: float, replayed: float,
               policy: TolerancePolicy) -> Verdict:
    """Attach the mean-loss comparison; a wrong claimed loss fails the segment."""
    ok = abs(claimed - replayed) <= policy.rho_loss * abs(replayed) + 1e-6
    v = replace(verdict, loss_claimed=claimed, loss_replayed=replayed)
    if ok or not verdict.passed:
        return v
    return replace(v, passed=False, reason=f"claimed mean loss {claimed:.6g} != replayed "
                   f"{replayed:.6g}")
