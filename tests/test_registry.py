"""NodeRegistry against anvil: every function's success path and every revert, the
append-only sortition pool and the stake-weighted draw."""

from __future__ import annotations

from eth_utils import keccak

from devnet.params import TOKEN
from devnet.testing import LocalChain, PoolView, expect_revert, job_terms
from node.chain.contracts import SOLVER, VERIFIER

revert = expect_revert


def test_register_update_and_sortition_pool(chain: LocalChain) -> None:
    c = chain[1]
    reg = c.registry
    r = reg.register(SOLVER | VERIFIER, "12D3KooWa", ["/ip4/127.0.0.1/tcp/4001"], '{"gpu":1}')
    ev = reg.events(r, "NodeRegistered")[0]["args"]
    assert (ev["node"], ev["roles"], ev["peerId"]) == (c.address, 3, "12D3KooWa")
    info = reg.node_of(c.address)
    assert info.registered and info.roles == 3 and info.multiaddrs == ["/ip4/127.0.0.1/tcp/4001"]
    assert info.peer_id == "12D3KooWa" and info.profile == '{"gpu":1}'
    assert info.changed_at == r["blockNumber"]
    assert reg.isRegistered(c.address)
    # registering costs nothing, so it buys no place in the pool: only staked verifiers
    assert reg.verifiers() == [] and not reg.is_verifier(c.address)
    min_v = int(reg.minVerifierStake())
    c.stake(min_v - 1)
    assert reg.verifiers() == [] and not reg.is_verifier(c.address)
    c.stake(1)
    assert reg.verifiers() == [c.address] and reg.is_verifier(c.address)
    assert reg.verifierAt(0) == c.address

    assert revert(reg.register, 1, "x", [], "").error == "AlreadyRegistered"
    r = reg.update_node(SOLVER, "12D3KooWb", [], "{}")
    assert reg.node_of(c.address).peer_id == "12D3KooWb"
    assert reg.node_of(c.address).changed_at == r["blockNumber"]
    assert not reg.is_verifier(c.address)  # dropped the role: no longer eligible...
    assert reg.verifiers() == [c.address]  # ...but the pool is append-only
    reg.update_node(VERIFIER, "12D3KooWb", [], "{}")
    assert reg.is_verifier(c.address) and reg.verifiers() == [c.address]  # not twice

    # a solver-only node with stake enters the pool once it takes the verifier role
    s = chain.join(2, SOLVER, 3 * min_v)
    assert reg.verifiers() == [c.address]
    s.registry.update_node(SOLVER | VERIFIER, "p2", [], "")
    assert reg.verifiers() == [c.address, s.address]
    assert int(reg.verifierCount()) == 2
    assert revert(reg.verifierAt, 2).error == "Panic"  # out of bounds

    other = chain[3].registry
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
    r = reg.request_unbond(10 * TOKEN)
    assert int(reg.unbondingStake(c.address)) == 10 * TOKEN
    assert reg.node_of(c.address).changed_at == r["blockNumber"]
    assert not reg.is_solver(c.address)  # unbonding stake no longer counts
    min_v = int(reg.minVerifierStake())
    assert reg.is_verifier(c.address)
    reg.request_unbond(min_solver - 10 * TOKEN - min_v + 1)  # free: min_v - 1
    assert not reg.is_verifier(c.address)
    assert c.address in reg.verifiers()  # still in the pool; the draw checks eligibility
    e = revert(reg.withdraw_unbonded)
    assert e.error == "UnbondNotReady"
    chain.advance(int(reg.unbondDelay()) - 5)
    assert revert(reg.withdraw_unbonded).error == "UnbondNotReady"
    chain.advance(10)
    r = reg.withdraw_unbonded()
    unbonded = min_solver - min_v + 1
    assert reg.events(r, "UnbondWithdrawn")[0]["args"]["amount"] == unbonded
    assert tok.balance_of(c.address) == before - min_solver + unbonded
    held, owed = chain.conservation()
    assert held == owed


def test_stake_is_bounded_so_packed_buckets_cannot_wrap(chain: LocalChain) -> None:
    # Free, locked and seat-locked stake share one word (uint96, uint96 and uint64 gwei): the
    # registry's total is bounded so no bucket can be truncated, whoever holds how many tokens.
    c = chain[1]
    c.registry.register(VERIFIER, "p1", [], "{}")
    chain[0].token.mint_to(c.address, 2**96)
    c.token.approve(c.registry.address, 2**97)
    staked = int(c.registry.call("totalOwed"))
    room = 2**96 - 1 - staked
    e = revert(c.registry.stake, room + 1)
    assert (e.error, e.error_args) == ("StakeTooLarge", {"amount": room + 1, "room": room})
    c.registry.stake(room)
    assert c.registry.free_stake(c.address) == room
    assert revert(c.registry.stake, 1).error == "StakeTooLarge"
    held, owed = chain.conservation()
    assert held == owed


def test_only_market_and_dispute_move_stake(chain: LocalChain) -> None:
    victim = chain.join(1, SOLVER, 200 * TOKEN)
    for i in (0, 1, 2):  # the owner, the node itself, a stranger
        reg = chain[i].registry
        for fn, args in (("lock", (victim.address, 1)), ("unlock", (victim.address, 1)),
                         ("slash", (victim.address, 1, reg.address)),
                         ("slashUnlocked", (victim.address, 1, chain[i].address)),
                         ("slashUnlockedBatch", ([victim.address], 1, reg.address)),
                         ("drawSeats", (b"\x01" * 32, 1, 1, 0, [], 1, 1)),
                         ("closeSeats", ([victim.address], 1, 1, reg.address))):
            e = revert(reg.transact, fn, *args)
            assert (e.error, e.error_args) == ("Unauthorized", {"caller": chain[i].address})
    assert victim.registry.free_stake(victim.address) == 200 * TOKEN


def test_authorities_are_fixed_once(chain: LocalChain) -> None:
    owner, stranger = chain[0], chain[1]
    assert owner.registry.market() == owner.market.address
    assert owner.registry.dispute() == owner.dispute.address
    assert owner.registry.call("outerJury") == owner.outer_jury.address
    assert revert(owner.registry.setAuthorized, stranger.address, stranger.address,
                  stranger.address).error == "AlreadyAuthorized"
    e = revert(stranger.registry.setAuthorized, stranger.address, stranger.address,
               stranger.address)
    assert e.error == "OwnableUnauthorizedAccount"
    assert revert(owner.market.setDisputeGame, stranger.address).error == "AlreadySet"


def test_the_outer_jury_only_takes_unlocked_stake(chain: LocalChain) -> None:
    """The OuterJury's authority is the least it needs (slashing silent and minority
    jurors' free or unbonding stake, to itself): it never locks, unlocks or slashes a bond."""
    owner, a, b = chain[0], chain[1], chain[2]
    reg = owner.deploy("NodeRegistry", owner.token.address, 60, 1, 1, 1)
    reg.setAuthorized(a.address, b.address, owner.address)  # owner plays the outer jury
    for fn, args in (("lock", (a.address, 1)), ("unlock", (a.address, 1)),
                     ("slash", (a.address, 1, owner.address)),
                     ("slashUnlockedBatch", ([a.address], 1, owner.address))):
        e = revert(reg.transact, fn, *args)
        assert (e.error, e.error_args) == ("Unauthorized", {"caller": owner.address}), fn
    r = reg.transact("slashUnlocked", a.address, 1, owner.address)  # allowed; a has nothing
    assert [e["args"]["amount"] for e in reg.events(r, "Slashed")] == [0]
    e = revert(reg.transact, "slashUnlocked", a.address, 1, chain[3].address)
    assert e.error == "InvalidSlashRecipient"


def test_only_free_stake_makes_a_verifier(chain: LocalChain) -> None:
    """Locked stake backs a bond and cannot be slashed by a jury or an attestor slash,
    so it does not count toward verifier eligibility (it still does for a solver)."""
    node = chain.join(1, SOLVER | VERIFIER, 200 * TOKEN)
    reg = node.registry
    min_v = int(reg.minVerifierStake())
    sub = chain[5]
    bps = node.market.market_params().bond_factor_bps
    reward = (200 * TOKEN - min_v + 1) * 10_000 // bps + 1  # leaves min_v - 1 free
    job = sub.post_job(job_terms(reward=reward, budget=0))
    assert reg.is_verifier(node.address)
    r = node.market.claim_job(job)
    info = reg.node_of(node.address)
    assert info.free_stake < min_v and info.free_stake + info.locked_stake == 200 * TOKEN
    assert info.changed_at == r["blockNumber"]
    assert not reg.is_verifier(node.address) and reg.is_solver(node.address)
    node.stake(min_v)  # free stake again
    assert reg.is_verifier(node.address)


def test_sortition_follows_its_spec(chain: LocalChain) -> None:
    reg = chain.reader.registry
    cap = int(reg.sortitionCap())
    assert cap == 200 * TOKEN
    stakes = {1: 50, 2: 80, 3: 200, 4: 400, 5: 120, 6: 100, 7: 150, 8: 90}
    for i, amount in stakes.items():
        chain.join(i, SOLVER | VERIFIER if i == 5 else VERIFIER, amount * TOKEN)
    chain[6].registry.request_unbond(60 * TOKEN)  # below the minimum: in the pool, never drawn
    chain[7].registry.update_node(SOLVER, "p7", [], "")  # dropped the role
    snap = chain.pool_snapshot()  # what a draw's request takes
    snap_len = int(reg.verifierCount())
    assert snap_len == 8
    chain[8].stake(10 * TOKEN)  # moved after the snapshot: skipped by draws as of it
    chain.join(9, VERIFIER, 100 * TOKEN)  # joined after it: beyond its pool length
    a = chain.addresses
    # the tree as of the snapshot: capped free stake of each verifier, 0 for the others,
    # whatever moved since (8 staked 10 more, 9 joined)
    unit = int(reg.WEIGHT_UNIT())
    want_w = [0 if i in (6, 7) else min(stakes[i], 200) * TOKEN // unit for i in range(1, 9)]
    assert chain.reader.registry.weights_at(99, snap) == [*want_w, 0]  # 9: not yet
    assert chain.reader.registry.weights_at(99, chain.w3.eth.block_number)[7:] == \
        [100 * TOKEN // unit] * 2
    head = chain.w3.eth.block_number
    cases = [(3, snap_len, snap, []), (3, snap_len, snap, [a[3], a[4]]),
             (8, snap_len, snap, []), (3, 99, head, []), (1, snap_len, head, [a[1]]),
             (0, snap_len, snap, []), (5, 0, snap, [])]
    seen: set[str] = set()
    view = PoolView.read(reg)
    assert view.attempts == 8
    for s in range(25):
        seed = keccak(b"seed%d" % s)
        for want, pool_len, snapshot, exclude in cases:
            got = reg.sortition(seed, want, pool_len, snapshot, exclude)
            assert got == view.draw(seed, want, pool_len, snapshot, exclude), (s, want)
            assert len(set(got)) == len(got) <= want and not set(got) & set(exclude)
            if snapshot == snap:
                assert not {a[6], a[7], a[8], a[9]} & set(got)
            seen |= set(got)
    assert {a[1], a[2], a[3], a[4], a[5], a[8], a[9]} <= seen
    assert not {a[6], a[7]} & seen
    # weight is capped free stake: the capped nodes are drawn about 4x as often as the
    # minimum-stake one (a fixed set of seeds, so the counts are deterministic)
    firsts = [reg.sortition(keccak(b"w%d" % s), 1, snap_len, snap, [])[:1] for s in range(120)]
    count = {x: sum(f == [a[x]] for f in firsts) for x in (1, 3, 4)}
    assert count[3] > 2 * count[1] and count[4] > 2 * count[1]


def test_constructor_guards(chain: LocalChain) -> None:
    owner = chain[0]
    tok, zero = owner.token.address, "0x" + "00" * 20
    ten_years = 10 * 365 * 86400
    assert revert(owner.deploy, "NodeRegistry", zero, 60, 1, 1, 1).error == "ZeroAddress"
    for delay, min_v, cap in ((60, 0, 1), (60, 10, 9), (ten_years + 1, 1, 1)):
        e = revert(owner.deploy, "NodeRegistry", tok, delay, 1, min_v, cap)
        assert e.error == "InvalidParams", (delay, min_v, cap)
    reg = owner.deploy("NodeRegistry", tok, ten_years, 0, 10, 10)  # the bounds themselves
    assert (int(reg.unbondDelay()), int(reg.minVerifierStake()), int(reg.sortitionCap())) == \
        (ten_years, 10, 10)


def test_new_addresses_do_not_move_the_draw_snapshot(chain: LocalChain) -> None:
    """A restarted verifier re-registers its new port (updateNode): that must not make it
    ineligible for draws snapshotted before (seen in e2e: a restarted committee member
    lost its seat); a change of roles does count."""
    node = chain.join(1, VERIFIER, 200 * TOKEN)
    reg = node.registry
    before = reg.node_of(node.address).changed_at
    chain.mine(2)
    node.registry.update_node(VERIFIER, "12D3KooWdev1", ["/ip4/127.0.0.1/tcp/5999"])
    assert reg.node_of(node.address).changed_at == before
    r = node.registry.update_node(VERIFIER | SOLVER, "12D3KooWdev1",
                                  ["/ip4/127.0.0.1/tcp/5999"])
    assert reg.node_of(node.address).changed_at == r["blockNumber"] > before
