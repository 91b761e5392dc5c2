"""devnet/production.toml, the shipped parameters for a public chain (issue 15): the
contracts accept them, the sample count is the one the incentives derive, and the
verification window leaves a solver with sparse checkpoints (keep_every 10) time to
regenerate a whole sample of a job of real size."""

from __future__ import annotations

import pytest

from devnet.anvil import AnvilProcess
from devnet.params import DevnetParams, production_params
from devnet.testing import own_deployment
from node.incentives import required_sample_count
from node.train.sparse import fit_keep_every

K, M = 10, 10


@pytest.fixture(scope="module")
def prod() -> DevnetParams:
    return production_params()


def test_the_contracts_deploy_with_the_production_parameters(anvil: AnvilProcess,
                                                             prod: DevnetParams) -> None:
    with own_deployment(anvil, prod) as c:
        mp = c.reader.market.market_params()
        assert mp.verification_window == prod.market.verification_window
        assert mp.sample_count == prod.market.sample_count
        assert int(c.reader.dispute.call("params").clock) == prod.dispute.clock
        assert int(c.reader.registry.call("unbondDelay")) == prod.registry.unbond_delay


def test_the_production_sample_count_is_the_derived_one(prod: DevnetParams) -> None:
    assert prod.market.sample_count == required_sample_count(
        prod.market.bond_factor_bps / 10_000, prod.dispute.jury_size)


def test_a_real_size_sample_regenerates_inside_the_production_window(
        prod: DevnetParams) -> None:
    """bench/scale.py measures a 25M-parameter LM's step at 0.5-0.9 s on one core; the
    window keeps M = 10 for any step up to the bound below (three times that), and
    the devnet's minute does not, which is why the devnet solver keeps every state."""
    n, window = prod.market.sample_count, prod.market.verification_window
    slowest = 0.5 * window / (n * (M - 1) * K)  # half the window for the worst sample
    assert slowest > 2.5
    assert fit_keep_every(M, window_s=window, step_s=slowest, k=K, samples=n) == M
    assert fit_keep_every(M, window_s=window, step_s=1.01 * slowest, k=K, samples=n) < M
    devnet = DevnetParams().market.verification_window
    assert fit_keep_every(M, window_s=devnet, step_s=0.5, k=K, samples=n) == 1
