"""The local network's own bookkeeping check, which every whole-network test and demo
ends on: it must see a token the contracts hold but do not owe."""

from __future__ import annotations

from pathlib import Path

from devnet.localnet import LocalNet
from devnet.params import short_network_params
from node.chain.client import ChainClient


def test_contracts_gap_sees_a_token_held_but_not_owed(tmp_path: Path) -> None:
    with LocalNet(tmp_path / "net", short_network_params()) as net:
        assert net.contracts_gap() == 0 and net.conserved()
        donor = ChainClient.from_deployment(net.deployment, 1)
        donor.token.transfer(net.c.market.address, 5)  # nobody is owed it
        assert net.contracts_gap() == 5 and not net.conserved()
