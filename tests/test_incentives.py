"""The incentives section of docs/protocol.md, computed from the deployed parameters:
cheating on any fraction of a job loses money, with a puppet challenger and with
sybils holding up to a third of the capped verifier stake."""

from __future__ import annotations

from eth_utils import keccak

from devnet.testing import LocalChain
from node.incentives import (
    Incentives,
    catch_probability,
    cheating_gain,
    jury_capture,
    max_sybil_share,
    worst_gain,
)
from node.proof import sample_segments

SYBIL_SHARE = 1 / 3  # the share of capped verifier stake docs/protocol.md states


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
