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

The market's sample count follows (:func:`required_sample_count`): the smallest n
at which every f loses at least ``margin`` of the work it saves, with sybils holding
``sybil_share``, raised to a per-job floor. Since 1 - (1 - f)^n >= f for n >= 1,
gain(f) / f peaks at f = 1, where it is cost - (1 - q)(1 + bond_factor) whatever
n is: the bond, not the sample, is what deters a risk-neutral cheater, and n = 1
already does when (1 - q)(1 + bond_factor) >= (1 + margin) * cost. The floor is for
one who is not risk-neutral (a single job, stake it does not mind losing): faking
``floor_fraction`` of a job goes unnoticed in at most 1 - ``floor_confidence`` of jobs.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from node.errors import ConfigError
from node.proof import samples_for_detection

MARGIN = 0.5           # a cheater loses at least half of the work it saved, for every f
SYBIL_SHARE = 1 / 3    # of the capped verifier stake, held by the cheater's sybils
FLOOR_FRACTION, FLOOR_CONFIDENCE = 0.5, 0.99  # faking half a job: caught in 99% of jobs
MAX_SAMPLES = 256


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


def required_sample_count(bond_factor: float, jury_size: int, *, cost: float = 1.0,
                          margin: float = MARGIN, sybil_share: float = SYBIL_SHARE,
                          floor_fraction: float = FLOOR_FRACTION,
                          floor_confidence: float = FLOOR_CONFIDENCE) -> int:
    """The market's sample count for ``bond_factor`` (B / R) and an honest training
    cost of ``cost`` * R: the smallest n at which cheating on any fraction loses at
    least ``margin`` of the saved work (``worst_gain <= -margin``), and at least the
    per-job floor ``samples_for_detection(floor_fraction, floor_confidence)``.
    ConfigError when no n can: the bond is too small for the jury's capture risk."""
    floor = samples_for_detection(floor_fraction, floor_confidence)
    return max(incentive_sample_count(bond_factor, jury_size, cost=cost, margin=margin,
                                      sybil_share=sybil_share), floor)


def incentive_sample_count(bond_factor: float, jury_size: int, *, cost: float = 1.0,
                           margin: float = MARGIN, sybil_share: float = SYBIL_SHARE) -> int:
    """The smallest n at which cheating on any fraction loses at least ``margin`` of the
    saved work, with no per-job floor: a reserved sub-job's (a collaborative inner run's)
    draws among its non-final segments. A worker's floor is met over its rounds instead
    (:func:`rounds_for_floor`), and its final segment is always replayed.
    ConfigError when no n can: the bond is too small for the jury's capture risk."""
    for n in range(1, MAX_SAMPLES + 1):
        if worst_gain(Incentives(bond_factor, n, jury_size, cost), sybil_share)[0] <= -margin:
            return n
    q = jury_capture(sybil_share, jury_size)
    raise ConfigError(f"no sample count makes cheating lose {margin:.0%} of the saved work: "
                      f"(1 - q) (1 + bond factor) = {(1 - q) * (1 + bond_factor):.3f} must be "
                      f">= (1 + margin) * cost = {(1 + margin) * cost:.3f} (q = {q:.3f}, the "
                      f"jury capture chance at sybil share {sybil_share:.3f}); raise the bond")


def rounds_for_floor(reserved_samples: int, floor_fraction: float = FLOOR_FRACTION,
                     floor_confidence: float = FLOOR_CONFIDENCE) -> int:
    """Rounds after which a worker faking ``floor_fraction`` of every inner run's
    non-final segments has been caught with ``floor_confidence``: its sub-jobs draw
    ``reserved_samples`` each, and one catch condemns it and excludes it from the job,
    so it escapes R rounds with probability (1 - f)^(n R)."""
    return math.ceil(samples_for_detection(floor_fraction, floor_confidence) / reserved_samples)



# --- Targeted tampering (issue 30 item 6): assurance a submitter buys ------------------
#
# A poisoner trains honestly and edits one segment: it saves no compute, so the bond
# arithmetic above does not price it. Every later segment continues from the edited
# state and replays bitwise, so only a replay of the edited segment itself flags it:
# it is caught when that segment is among the n sampled, P = n / S (or when a watcher
# requests and replays it: any leaf is served during the window, but nobody is paid to).

MAX_JOB_SAMPLES = 1024  # JobMarket.MAX_SAMPLES: the most segments a job may buy sampled


def sample_floor(market_sample_count: int, segments: int) -> int:
    """The least n a job of ``segments`` segments may post with: the market's derived
    n, or every segment when the job has fewer (``JobMarket._post``)."""
    return min(market_sample_count, segments)


def catch_one_edit(n: int, segments: int) -> float:
    """P(an edit of one segment is among the sampled ones): n / S."""
    if segments <= 0:
        raise ConfigError("a job has at least one segment")
    return min(n, segments) / segments


def samples_to_catch_one_edit(probability: float, segments: int) -> int:
    """Least n with ``catch_one_edit(n, segments) >= probability``."""
    if not 0 < probability <= 1:
        raise ConfigError("the probability must lie in (0, 1]")
    return min(segments, math.ceil(probability * segments - 1e-9))


def priced_budget(budget_at_floor: int, n: int, floor: int) -> int:
    """What the market escrows as verification budget for n samples when
    ``budget_at_floor`` pays the floor's: the same fee per replayed segment, in the
    contract's integer arithmetic."""
    return budget_at_floor * n // floor


def poisoner_expected_loss(n: int, segments: int, reward: int, bond: int,
                           jury_size: int, sybil_share: float = 0.0) -> float:
    """What editing one segment costs a poisoner in expectation: caught with
    P = n / S times the chance the jury is not its own, it forfeits the reward and its
    bond (its training was spent either way)."""
    p = catch_one_edit(n, segments) * (1 - jury_capture(sybil_share, jury_size))
    return p * (reward + bond)
