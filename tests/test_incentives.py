"""The incentives section of docs/protocol.md, computed from the deployed parameters:
cheating on any fraction of a job loses money, with a puppet challenger and with
sybils holding up to a third of the capped verifier stake."""

from __future__ import annotations

import pytest
from eth_utils import keccak

from devnet.params import DevnetParams
from devnet.testing import LocalChain
from node.errors import ConfigError
from node.incentives import (
    FLOOR_CONFIDENCE,
    FLOOR_FRACTION,
    MARGIN,
    SYBIL_SHARE,
    Incentives,
    catch_probability,
    cheating_gain,
    incentive_sample_count,
    jury_capture,
    max_sybil_share,
    required_sample_count,
    rounds_for_floor,
    worst_gain,
)
from node.proof import sample_segments


def deployed(chain: LocalChain) -> Incentives:
    mp = chain.reader.market.market_params()
    dp = chain.reader.dispute.call("params")
    return Incentives(bond_factor=mp.bond_factor_bps / 10_000, sample_count=mp.sample_count,
                      jury_size=int(dp.jurySize))


def test_cheating_loses_for_every_fraction_at_the_deployed_parameters(
        chain: LocalChain) -> None:
    p = deployed(chain)
    for s in (0.0, 0.1, 0.2, SYBIL_SHARE):
        gain, at = worst_gain(p, s)
        assert gain < 0, f"cheating on f={at} gains {gain:.3f} R per unit saved at s={s}"
    # margin at the stated sybil share: at least half of the saved work is lost
    assert worst_gain(p, SYBIL_SHARE)[0] < -0.5
    assert max_sybil_share(p) > SYBIL_SHARE


def test_the_model_can_say_cheating_pays() -> None:
    """No bond and a captured jury: the check must fail, or it proves nothing."""
    assert worst_gain(Incentives(bond_factor=0.0, sample_count=44, jury_size=3), 0.6)[0] > 0
    assert cheating_gain(Incentives(bond_factor=1.5, sample_count=1, jury_size=3), 0.5,
                         0.9) > 0


def test_detection_bound_holds_for_the_real_sampler(chain: LocalChain) -> None:
    """p(f) uses 1 - (1 - f)^n; the contract's sampler (node.proof mirrors it, with
    shared test vectors) draws without replacement, so it catches at least that often."""
    n = chain.reader.market.market_params().sample_count
    segments, faked = 64, set(range(0, 64, 11))  # 6 of 64
    trials = 2000
    caught = sum(bool(faked & set(sample_segments(keccak(b"%d" % i), segments, n)))
                 for i in range(trials))
    bound = 1 - (1 - len(faked) / segments) ** n
    assert caught / trials >= bound - 0.03
    assert jury_capture(0.0, 3) == 0 and abs(jury_capture(1.0, 3) - 1) < 1e-12
    p = Incentives(bond_factor=1.5, sample_count=n, jury_size=3)
    assert catch_probability(p, 1.0, 0.0) == 1.0


def test_the_deployed_sample_count_is_the_one_the_incentives_require(chain: LocalChain) -> None:
    p = deployed(chain)
    assert p.sample_count == required_sample_count(p.bond_factor, p.jury_size)
    assert DevnetParams().market.sample_count == p.sample_count
    reserved = chain.reader.market.market_params().reserved_sample_count
    assert reserved == incentive_sample_count(p.bond_factor, p.jury_size)
    assert DevnetParams().market.reserved_sample_count == reserved


def test_a_reserved_sub_job_needs_the_incentive_term_and_meets_the_floor_over_rounds() -> None:
    """A collaborative worker's inner runs draw n_r of their non-final segments each (the
    final one is always replayed). n_r is the incentive term alone: every fraction still
    loses the margin at n_r, and a worker faking half of every inner run is caught in 99%
    of its runs of ``rounds_for_floor`` rounds (one catch excludes it from the job)."""
    n_r = incentive_sample_count(1.5, 3)
    assert n_r == 1 < required_sample_count(1.5, 3)
    p = Incentives(1.5, n_r, 3)
    for f in (1e-3, 0.1, 0.5, 1.0):
        assert cheating_gain(p, f, SYBIL_SHARE) <= -MARGIN * f, f
    rounds = rounds_for_floor(n_r)
    assert (1 - FLOOR_FRACTION) ** (n_r * rounds) <= 1 - FLOOR_CONFIDENCE
    assert (1 - FLOOR_FRACTION) ** (n_r * (rounds - 1)) > 1 - FLOOR_CONFIDENCE
    assert rounds_for_floor(2) == (rounds + 1) // 2


@pytest.mark.parametrize("bond_factor", [1.25, 1.5, 2.0, 4.0])
@pytest.mark.parametrize("jury_size", [1, 3, 5])
def test_the_derived_count_makes_every_fraction_lose_with_the_margin(bond_factor: float,
                                                                     jury_size: int) -> None:
    try:
        n = required_sample_count(bond_factor, jury_size)
    except ConfigError:  # then not even every segment sampled would do: f = 1 is caught
        assert cheating_gain(Incentives(bond_factor, 10**6, jury_size), 1.0, SYBIL_SHARE) \
            > -MARGIN
        return
    p = Incentives(bond_factor, n, jury_size)
    for f in (1e-4, 1e-3, 0.01, 0.1, 0.3, 0.5, 0.9, 1.0):  # off the grid worst_gain uses
        assert cheating_gain(p, f, SYBIL_SHARE) <= -MARGIN * f, f
    # the floor: faking half of one job goes unnoticed in at most 1% of jobs
    assert (1 - FLOOR_FRACTION) ** n <= 1 - FLOOR_CONFIDENCE
    assert n == 7  # the floor binds: the bond alone deters a risk-neutral cheater


def test_too_small_a_bond_is_refused_and_a_larger_margin_can_need_more_samples() -> None:
    with pytest.raises(ConfigError, match="raise the bond"):
        required_sample_count(0.5, 3)
    # with a cheap honest run (cost 0.2 R) even a zero bond deters, from the floor on
    assert required_sample_count(0.0, 3, cost=0.2, margin=0.5) == 7
    # without the floor, the count is what the expected-value argument needs
    assert required_sample_count(1.5, 3, floor_fraction=0.99) == 1
