"""NodeRegistry against anvil: every function's success path and every revert."""

from __future__ import annotations

import pytest

from devnet.params import TOKEN
from devnet.testing import LocalChain
from node.chain.contracts import SOLVER, VERIFIER
from node.errors import ContractRevert


def revert(fn, *args):  # type: ignore[no-untyped-def]
    with pytest.raises(ContractRevert) as e:
        fn(*args)
    return e.value


def test_register_update_and_verifier_list(chain: LocalChain) -> None:
    c = chain[1]
    reg = c.registry
    r = reg.register(SOLVER | VERIFIER, "12D3KooWa", ["/ip4/127.0.0.1/tcp/4001"], '{"gpu":1}')
    ev = reg.events(r, "NodeRegistered")[0]["args"]
    assert (ev["node"], ev["roles"], ev["peerId"]) == (c.address, 3, "12D3KooWa")
    info = reg.node_of(c.address)
    assert info.registered and info.roles == 3 and info.multiaddrs == ["/ip4/127.0.0.1/tcp/4001"]
    assert info.peer_id == "12D3KooWa" and info.profile == '{"gpu":1}'
    assert c.address in reg.verifiers()
    assert reg.isRegistered(c.address)

    assert revert(reg.register, 1, "x", [], "").error == "AlreadyRegistered"
    reg.update_node(SOLVER, "12D3KooWb", [], "{}")
    assert reg.node_of(c.address).peer_id == "12D3KooWb"
    assert c.address not in reg.verifiers()  # dropped the role, left the list

    other = chain[2].registry
    assert revert(other.update_node, 1, "p", [], "").error == "NotRegistered"
    assert revert(other.register, 0, "p", [], "").error_args == {"roles": 0}
    assert revert(other.register, 4, "p", [], "").error == "InvalidRoles"
    assert revert(other.register, 1, "", [], "").error == "EmptyPeerId"
    assert revert(reg.update_node, 0, "p", [], "").error == "InvalidRoles"


def test_stake_thresholds_unbond_and_withdraw(chain: LocalChain) -> None:
    c = chain[1]
    reg, tok = c.registry, c.token
    assert revert(reg.stake, TOKEN).error == "NotRegistered"
    reg.register(SOLVER | VERIFIER, "p1", [], "{}")
    assert revert(reg.stake, 0).error == "ZeroAmount"
    min_solver = int(reg.minSolverStake())
    before = tok.balance_of(c.address)
    c.stake(min_solver - 1)
    assert reg.is_verifier(c.address) and not reg.is_solver(c.address)
    c.stake(1)
    assert reg.is_solver(c.address)
    assert tok.balance_of(c.address) == before - min_solver
    assert reg.free_stake(c.address) == min_solver

    assert revert(reg.request_unbond, 0).error == "ZeroAmount"
    e = revert(reg.request_unbond, min_solver + 1)
    assert e.error == "InsufficientFreeStake" and e.error_args["needed"] == min_solver + 1
    assert revert(reg.withdraw_unbonded).error == "NothingToWithdraw"
    reg.request_unbond(10 * TOKEN)
    assert int(reg.unbondingStake(c.address)) == 10 * TOKEN
    assert not reg.is_solver(c.address)  # unbonding stake no longer counts
    e = revert(reg.withdraw_unbonded)
    assert e.error == "UnbondNotReady"
    chain.advance(int(reg.unbondDelay()) - 5)
    assert revert(reg.withdraw_unbonded).error == "UnbondNotReady"
    chain.advance(10)
    r = reg.withdraw_unbonded()
    assert reg.events(r, "UnbondWithdrawn")[0]["args"]["amount"] == 10 * TOKEN
    assert tok.balance_of(c.address) == before - min_solver + 10 * TOKEN
    held, owed = chain.conservation()
    assert held == owed


def test_only_market_and_dispute_move_stake(chain: LocalChain) -> None:
    victim = chain.join(1, SOLVER, 200 * TOKEN)
    for i in (0, 1, 2):  # the owner, the node itself, a stranger
        reg = chain[i].registry
        for fn, args in (("lock", (victim.address, 1)), ("unlock", (victim.address, 1)),
                         ("slash", (victim.address, 1, reg.address)),
                         ("slashUnlocked", (victim.address, 1, chain[i].address))):
            e = revert(reg.transact, fn, *args)
            assert (e.error, e.error_args) == ("Unauthorized", {"caller": chain[i].address})
    assert victim.registry.free_stake(victim.address) == 200 * TOKEN


def test_authorities_are_fixed_once(chain: LocalChain) -> None:
    owner, stranger = chain[0], chain[1]
    assert owner.registry.market() == owner.market.address
    assert owner.registry.dispute() == owner.dispute.address
    assert revert(owner.registry.setAuthorized, stranger.address,
                  stranger.address).error == "AlreadyAuthorized"
    e = revert(stranger.registry.setAuthorized, stranger.address, stranger.address)
    assert e.error == "OwnableUnauthorizedAccount"
    assert revert(owner.market.setDisputeGame, stranger.address).error == "AlreadySet"
