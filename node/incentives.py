"""Expected profit of cheating under the deployed parameters (docs/protocol.md, "Incentives").

A solver takes a job paying reward R, locks bond B = R * bond_factor and would
spend cost * R on honest training (cost <= 1, or it would not take the job). It
fakes a fraction f of the segments and saves f * cost * R. It is caught when a
faked segment is among the n sampled ones (any verifier can replay the sample:
the seed is public) and a jury upholds the challenge; then it loses R and B.
Relative to training honestly, cheating gains

    gain(f) = f * cost * R - p(f) * (R + B)

with p(f) = (1 - (1 - f)^n) * (1 - q): the sample misses every faked segment with
probability <= (1 - f)^n, and q is the chance that sybils holding a share s of the
capped verifier stake take at least half the jury's seats (then they can vote the
step valid or force a tie, Void). A puppet challenger changes nothing here: its bond
never reaches the solver, and the round pays only the earliest-opened dispute the
solver lost, so a puppet opened after an honest challenge earns nothing, and one
opened before it is the cheater reporting itself (it is never paid the reward).
"""

from __future__ import annotations

import math
from dataclasses import dataclass


@dataclass(frozen=True)
class Incentives:
    bond_factor: float  # B / R
    sample_count: int  # n
    jury_size: int
    cost: float = 1.0  # honest training cost / R (the worst case is 1)


def jury_capture(s: float, jury_size: int) -> float:
    """P(sybils with stake share ``s`` win >= half the seats): each seat drawn with
    probability ``s`` (independent draws; the sortition's distinct seats only lower it)."""
    need = math.ceil(jury_size / 2)
    return sum(math.comb(jury_size, k) * s**k * (1 - s) ** (jury_size - k)
               for k in range(need, jury_size + 1))


def catch_probability(p: Incentives, f: float, sybil_share: float) -> float:
    detect = 1 - (1 - f) ** p.sample_count
    return detect * (1 - jury_capture(sybil_share, p.jury_size))


def cheating_gain(p: Incentives, f: float, sybil_share: float = 0.0) -> float:
    """Expected gain of faking fraction ``f`` over honest work, in units of R."""
    return f * p.cost - catch_probability(p, f, sybil_share) * (1 + p.bond_factor)


def worst_gain(p: Incentives, sybil_share: float = 0.0, grid: int = 2000) -> tuple[float, float]:
    """(max over f in (0, 1] of cheating_gain / f, the f where it is reached): below zero
    means cheating on any fraction loses money, with the value as the margin per unit
    of saved work."""
    best, at = -math.inf, 0.0
    for i in range(1, grid + 1):
        f = i / grid
        g = cheating_gain(p, f, sybil_share) / f
        if g > best:
            best, at = g, f
    return best, at


def max_sybil_share(p: Incentives, step: float = 0.005) -> float:
    """The largest sybil share of capped verifier stake at which cheating still loses
    for every f."""
    s = 0.0
    while s + step < 1 and worst_gain(p, s + step)[0] < 0:
        s += step
    return s
