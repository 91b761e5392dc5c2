"""Issue 30, items 2 and 3: seats are slashable, played as attacks on anvil.

A juror (or attestor) seated for a cheating friend used to move its free stake out of
a slash's reach after the draw (a bond for a dummy job, or an unbond it withdrew before
anyone resolved), so the slash took nothing. Now the seat's slashable amount is locked
in the registry from the draw until the seat ends. Each docstring says what the attack
achieved at 6c4c363; each test asserts it now costs the full slash.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
from eth_utils import keccak
from web3.types import TxReceipt

from devnet.params import TOKEN
from devnet.testing import LocalChain, expect_revert, fake_trace, job_terms
from node.chain.client import ChainClient
from node.chain.contracts import SOLVER, VERIFIER, Phase, Side, Verdict
from node.chain.ids import DisputeId, JobId
from node.proof import MerkleTree, TraceLeaf

SEGMENTS, K = 8, 4
REWARD, BUDGET = 100 * TOKEN, 30 * TOKEN
STAKE = 200 * TOKEN  # the devnet's sortition cap: every draw attempt on a node is accepted


@dataclass
class Net:
    chain: LocalChain
    owner: ChainClient  # posts the real job, and the dummy jobs its own nodes claim
    solver: ChainClient
    verifiers: list[ChainClient]  # SOLVER | VERIFIER: any of them can claim a dummy job

    def by(self, address: str) -> ChainClient:
        return next(v for v in self.verifiers if v.address == address)

    def holdings(self, c: ChainClient) -> int:
        r, a = self.chain.reader, c.address
        return (r.token.balance_of(a) + r.registry.free_stake(a) + r.registry.locked_stake(a)
                + r.registry.node_of(a).unbonding_stake + r.registry.seat_locked_stake(a)
                + r.market.credits(a) + r.dispute.credits(a))


@pytest.fixture
def net(chain: LocalChain) -> Net:
    for i in range(10, 14):
        chain.extra(i, STAKE)
    verifiers = [chain.join(i, SOLVER | VERIFIER, STAKE) for i in (0, 3, 4, 5, 6, 7, 8, 9,
                                                                   10, 11, 12, 13)]
    return Net(chain, owner=chain[1], solver=chain.join(2, SOLVER, 500 * TOKEN),
               verifiers=verifiers)


def post_commit(net: Net) -> tuple[JobId, list[TraceLeaf], MerkleTree]:
    job = net.owner.post_job(job_terms(REWARD, BUDGET, segments=SEGMENTS, k=K))
    net.solver.market.claim_job(job)
    leaves, tree = fake_trace(job, SEGMENTS, K)
    net.solver.market.commit_trace(job, leaves, tree)
    return job, leaves, tree


def dispute_to_jury(net: Net, challenger: ChainClient, job: JobId, seg: int,
                    leaves: list[TraceLeaf], tree: MerkleTree) -> tuple[DisputeId, list[str]]:
    """Challenge ``seg``, bisect to one step (solver posts made-up hashes), draw the jury."""
    did = dispute_to_request(net, challenger, job, seg, leaves, tree)
    net.verifiers[0].dispute.draw_jury(did)
    return did, [str(a) for a in net.chain.reader.dispute.get_dispute(did).jury]


def dispute_to_request(net: Net, challenger: ChainClient, job: JobId, seg: int,
                       leaves: list[TraceLeaf], tree: MerkleTree) -> DisputeId:
    """Challenge ``seg``, bisect to one step, mine past the block whose hash seeds the jury."""
    c, g = net.chain, net.chain.reader.dispute
    did = challenger.market.challenge(job, seg, leaves[seg], tree.proof(seg), leaves[seg + 1],
                                      tree.proof(seg + 1))
    while (d := g.get_dispute(did)).phase == Phase.BISECTION:
        if d.turn == Side.SOLVER:
            net.solver.dispute.post_mids(did, [keccak(b"m%d" % s) for s in d.mid_steps])
        else:
            challenger.dispute.choose(did, 0, g.posted_mids(did, d.mids_root))
    d = g.get_dispute(did)
    c.mine(max(1, d.draw_block - c.reader.block_number() + 1))
    return did


def commit_reveal(net: Net, did: DisputeId, votes: dict[str, bool]) -> TxReceipt | None:
    """Commit and reveal ``votes``, then let the reveal window pass; the last reveal's
    receipt (it settled the dispute when every juror revealed)."""
    c = net.chain
    for a, v in votes.items():
        net.by(a).dispute.commit_vote(did, v, keccak(a.encode()))
    d = c.reader.dispute.get_dispute(did)
    c.advance(d.commit_end - c.timestamp())
    last = None
    for a, v in votes.items():
        last = net.by(a).dispute.reveal_vote(did, v, keccak(a.encode()))
    c.advance(d.reveal_end - c.timestamp())
    return last


def lock_all_free_in_a_dummy_job(net: Net, node: ChainClient) -> None:
    """``node`` claims a job its owner posted, sized so the bond takes its free stake."""
    reg = net.chain.reader.registry
    bps = net.chain.reader.market.market_params().bond_factor_bps
    reward = reg.free_stake(node.address) * 10_000 // bps
    dummy = net.owner.post_job(job_terms(reward, 0))
    node.market.claim_job(dummy)
    assert reg.free_stake(node.address) < TOKEN  # all but division dust is a bond now


def juror_cut(net: Net, job: JobId) -> int:
    r = net.chain.reader
    bps = r.dispute.call("params").jurorSlashBps
    bond = r.market.get_job(job).bond
    return (bond + r.market.market_params().challenge_bond) * bps // 10_000


def conserved(net: Net) -> None:
    held, owed = net.chain.conservation()
    assert held == owed


def test_a_juror_cannot_lock_its_slash_away_in_a_dummy_job(net: Net) -> None:
    """Before: a juror seated for a cheating friend voted valid, then, before `resolve`,
    claimed a dummy job its own owner had posted, locking all its free stake as a bond.
    `slashUnlocked` took 0 instead of its cut (16 POL at the devnet's parameters); the
    dummy's missed-deadline penalty went back to the same owner: net 0. Now the cut is
    seat-locked at the draw and the minority vote still costs the full cut."""
    c, reg = net.chain, net.chain.reader.registry
    job, leaves, tree = post_commit(net)
    did, jury = dispute_to_jury(net, net.verifiers[0], job, 2, leaves, tree)
    assert len(jury) == 3
    cut = juror_cut(net, job)
    assert cut > 0
    for a in jury:  # seated: the cut is out of free, still the node's verifier stake
        info = reg.node_of(a)
        assert (info.seat_locked_stake, info.free_stake) == (cut, STAKE - cut)
        assert reg.is_verifier(a)
    friend = net.by(jury[0])
    lock_all_free_in_a_dummy_job(net, friend)
    before = net.holdings(friend)
    # every juror reveals: the last reveal resolves
    r = commit_reveal(net, did, {jury[0]: True, jury[1]: False, jury[2]: False})
    assert r is not None
    assert c.reader.dispute.get_dispute(did).verdict == Verdict.INVALID
    slashed = {e["args"]["juror"]: e["args"]["amount"]
               for e in c.reader.dispute.events(r, "JurorSlashed")}
    assert slashed == {friend.address: cut}
    assert before - net.holdings(friend) == cut
    assert [reg.seat_locked_stake(a) for a in jury] == [0, 0, 0]
    assert [reg.free_stake(a) for a in jury[1:]] == [STAKE, STAKE]  # the majority's seats freed
    conserved(net)


def test_a_juror_cannot_unbond_its_slash_away(net: Net) -> None:
    """Before: a seated juror unbonded all its free stake right after the draw; `resolve`
    is anyone's call at any time after the reveal window, and once the unbonding delay
    passed unresolved the juror withdrew and `slashUnlocked` found nothing (free and
    unbonding both 0). Now the seat's cut cannot be unbonded and is slashed whenever
    `resolve` comes."""
    c, reg = net.chain, net.chain.reader.registry
    job, leaves, tree = post_commit(net)
    did, jury = dispute_to_jury(net, net.verifiers[0], job, 5, leaves, tree)
    cut = juror_cut(net, job)
    silent = net.by(jury[2])  # stays silent: a loser whatever the verdict
    free = reg.free_stake(silent.address)
    e = expect_revert(silent.registry.request_unbond, free + 1)  # the seat is not free
    assert e.error == "InsufficientFreeStake"
    silent.registry.request_unbond(free)
    commit_reveal(net, did, {jury[0]: False, jury[1]: False})
    c.advance(int(reg.call("unbondDelay")) + 1)
    silent.registry.withdraw_unbonded()
    assert reg.node_of(silent.address).seat_locked_stake == cut
    before = net.holdings(silent)
    net.verifiers[0].dispute.resolve(did)
    assert c.reader.dispute.get_dispute(did).verdict == Verdict.INVALID
    assert before - net.holdings(silent) == cut
    assert reg.node_of(silent.address).seat_locked_stake == 0
    conserved(net)


def test_an_attestor_cannot_lock_its_slash_away_in_a_dummy_job(net: Net) -> None:
    """Before: an attestor that vouched for a faked segment of its share claimed a dummy
    job of its owner's after attesting, so its free stake was a bond when the round was
    condemned and `slashUnlockedBatch` took 0 of its 25 POL slash. Now each committee
    seat locks the attestor slash when the committee is drawn: the liable seat loses
    it, the others get theirs back at settlement."""
    c = net.chain
    m, reg = c.reader.market, c.reader.registry
    job, leaves, tree = post_commit(net)
    c.mine(3)
    net.verifiers[0].market.fix_seed(job)
    committee, sample = m.committee_of(job), m.sampled_segments(job)
    assert len(committee) == 3 and len(sample) > 4
    cut = int(reg.call("minVerifierStake")) * m.market_params().attestor_slash_bps // 10_000
    assert cut > 0
    assert [reg.seat_locked_stake(a) for a in committee] == [cut] * 3
    for a in committee:
        net.by(a).market.attest(job)
    cheat = net.by(committee[1])  # position 4 of the sample is seat 1's share (4 % 3)
    lock_all_free_in_a_dummy_job(net, cheat)
    watchdog = next(v for v in net.verifiers if v.address not in committee)
    did, jury = dispute_to_jury(net, watchdog, job, sample[4], leaves, tree)
    assert len(jury) == 3
    commit_reveal(net, did, {a: False for a in jury})  # the last reveal resolves
    assert m.round_info(job, 1).liable_seats == 0b010
    before = {a: net.holdings(net.by(a)) for a in committee}
    c.advance(max(0, m.get_job(job).window_end - c.timestamp()))
    r = net.owner.market.finalize(job)  # the condemned round settles
    slashed = {e["args"]["attestor"]: e["args"]["amount"] for e in m.events(r, "AttestorSlashed")}
    assert slashed == {cheat.address: cut}
    assert before[cheat.address] - net.holdings(cheat) == cut
    assert [reg.seat_locked_stake(a) for a in committee] == [0, 0, 0]
    assert [reg.free_stake(a) for a in (committee[0], committee[2])] == [STAKE, STAKE]
    conserved(net)


def test_moves_after_the_request_change_no_one_elses_seat(net: Net) -> None:
    """A draw must not be steerable by what happens after its request (block Q): the
    jury drawn with no move equals the jury drawn, from the same seed, after a verifier
    outside it unbonded everything and another job's committee seated verifiers (seat
    locks move no draw weight). Compared on a reverted anvil snapshot."""
    c, reg = net.chain, net.chain.reader.registry
    job, leaves, tree = post_commit(net)
    other = net.owner.post_job(job_terms(REWARD, BUDGET, segments=SEGMENTS, k=K))
    net.solver.market.claim_job(other)
    o_leaves, o_tree = fake_trace(other, SEGMENTS, K, tag="other")
    net.solver.market.commit_trace(other, o_leaves, o_tree)
    did = dispute_to_request(net, net.verifiers[0], job, 3, leaves, tree)
    snap = c.snapshot()
    net.verifiers[0].dispute.draw_jury(did)
    plain = c.reader.dispute.get_dispute(did).jury
    assert len(plain) == 3
    c.revert(snap)
    leaver = next(v for v in net.verifiers[1:] if v.address not in plain)
    leaver.registry.request_unbond(reg.free_stake(leaver.address))
    net.verifiers[0].market.fix_seed(other)  # seats a committee after Q
    seated = c.reader.market.committee_of(other)
    assert len(seated) == 3 and all(reg.seat_locked_stake(a) > 0 for a in seated)
    net.verifiers[0].dispute.draw_jury(did)
    assert c.reader.dispute.get_dispute(did).jury == plain


def test_dead_entries_do_not_dilute_the_pool(chain: LocalChain) -> None:
    """Before: addresses that staked the minimum once and unbonded stayed in the
    append-only pool, and each cost a draw a try (issue 30 measured quorum in 0.43 /
    0.05 of draws with 80 / 320 dead entries beside 6 live jurors). Now a dead entry
    weighs 0 in the sortition tree: with 40 dead entries beside 6 live verifiers every
    draw of 3 seats 3."""
    reg = chain.reader.registry
    live = [chain.join(i, VERIFIER, STAKE) for i in range(3, 9)]
    min_v = int(reg.call("minVerifierStake"))
    for i in range(14, 54):
        dead = chain.extra(i, min_v)
        chain.join(i, VERIFIER, min_v)
        dead.registry.request_unbond(min_v)
    pool = reg.verifiers()
    assert len(pool) == 46 and sum(reg.is_verifier(a) for a in pool) == len(live)
    block = chain.reader.block_number()
    sizes = [len(reg.sortition(keccak(b"dilute%d" % s), 3, len(pool), block, []))
             for s in range(20)]
    assert sizes == [3] * 20


# --- the sortition tree: dead entries, sybils, moves after the request ----------------

def test_ten_thousand_dead_entries_still_seat_full_juries(chain: LocalChain) -> None:
    """Issue 30's target: 6 live jurors beside 10,000 dead entries (before: quorum in
    0.05 of draws with only 320) and 8 more that really staked and unbonded after them.
    Every draw seats a full jury, and a dispute's `drawJury` stays under 250k gas."""
    chain.fill_dead_pool(10_000)
    min_v = int(chain.reader.registry.call("minVerifierStake"))
    live = [chain.join(i, SOLVER | VERIFIER, STAKE) for i in (0, 3, 4, 5, 6, 7)]
    for i in range(10, 18):  # real dead entries after the live ones
        chain.extra(i, min_v)
        chain.join(i, VERIFIER, min_v).registry.request_unbond(min_v)
    reg = chain.reader.registry
    pool_len = int(reg.call("verifierCount"))
    assert pool_len == 10_014
    block = chain.reader.block_number()
    sizes = [len(reg.sortition(keccak(b"dead%d" % s), 3, pool_len, block, [])) for s in range(30)]
    assert sizes == [3] * 30
    net = Net(chain, owner=chain[1], solver=chain.join(2, SOLVER, 500 * TOKEN), verifiers=live)
    job, leaves, tree = post_commit(net)
    did = dispute_to_request(net, net.verifiers[0], job, 2, leaves, tree)
    r = net.verifiers[1].dispute.draw_jury(did)
    assert len(chain.reader.dispute.get_dispute(did).jury) == 3
    assert r["gasUsed"] < 250_000, r["gasUsed"]


def test_a_sybil_split_weighs_what_the_whole_does(chain: LocalChain) -> None:
    """Splitting stake (up to the cap) over sybil addresses buys no weight: four
    addresses at the 50 POL minimum weigh in the tree exactly what one at 200 does,
    and win a single seat about as often (a fixed set of seeds)."""
    reg = chain.reader.registry
    min_v = int(reg.call("minVerifierStake"))
    assert 4 * min_v == STAKE
    whole = chain.join(3, VERIFIER, STAKE)
    sybils = [chain.join(i, VERIFIER, min_v) for i in (4, 5, 6, 7)]
    others = [chain.join(i, VERIFIER, STAKE) for i in (8, 9)]
    snap = chain.pool_snapshot()
    pool = reg.verifiers()
    w = dict(zip(pool, reg.weights_at(len(pool), snap), strict=True))
    assert sum(w[s.address] for s in sybils) == w[whole.address] == w[others[0].address]
    wins = [reg.sortition(keccak(b"sybil%d" % s), 1, len(pool), snap, [])[0] for s in range(160)]
    n_whole = wins.count(whole.address)
    n_sybil = sum(wins.count(s.address) for s in sybils)
    assert 0.6 < n_sybil / n_whole < 1.6, (n_sybil, n_whole)


def test_a_juror_that_unbonds_after_the_request_is_not_drawn_and_steers_nobody(net: Net) -> None:
    """A juror the seed would seat unbonds after the request (once it knows the seed, or
    by chance): it is not drawn, and every other juror of the undisturbed draw still
    is (the tree is read as of the request, so its exit moves no one else's try). A
    verifier that stakes more after the request gains nothing either."""
    c, reg = net.chain, net.chain.reader.registry
    job, leaves, tree = post_commit(net)
    did = dispute_to_request(net, net.verifiers[0], job, 4, leaves, tree)
    snap = c.snapshot()
    net.verifiers[0].dispute.draw_jury(did)
    plain = [str(a) for a in c.reader.dispute.get_dispute(did).jury]
    assert len(plain) == 3
    c.revert(snap)
    leaver = net.by(plain[1])
    leaver.registry.request_unbond(reg.free_stake(leaver.address))
    outsider = next(v for v in net.verifiers[1:] if v.address not in plain)
    outsider.stake(50 * TOKEN)  # above the cap: it would weigh no more anyway
    net.verifiers[0].dispute.draw_jury(did)
    moved = [str(a) for a in c.reader.dispute.get_dispute(did).jury]
    assert leaver.address not in moved and outsider.address not in moved
    assert {plain[0], plain[2]} <= set(moved) and len(moved) == 3


def test_a_lost_snapshot_delays_the_draw_and_the_request_re_arms(net: Net) -> None:
    """The bound of the tree's history (docs/protocol.md, "A pool that cannot be
    diluted"): a tree node keeps three values, so three later snapshots (other draws'
    requests), each followed by a stake move, make the values as of Q unreadable. The
    draw then reverts `SnapshotLost` instead of reading anything moved after Q (no
    steering, no Void), and once the seed block leaves the 256-block window the request
    re-arms from a fresh snapshot and seats a full jury: a delay, not a capture."""
    c = net.chain
    job, leaves, tree = post_commit(net)
    did = dispute_to_request(net, net.verifiers[0], job, 1, leaves, tree)
    for v in net.verifiers[-3:]:
        c.pool_snapshot()
        v.registry.request_unbond(TOKEN)  # below the cap: its weight moves
    e = expect_revert(net.verifiers[0].dispute.draw_jury, did)
    assert e.error == "SnapshotLost"
    c.mine(300)
    net.verifiers[0].dispute.draw_jury(did)  # the seed block is gone: re-armed at a new Q
    d = c.reader.dispute.get_dispute(did)
    assert d.phase == Phase.DRAWING and not d.jury
    c.mine(max(1, d.draw_block - c.reader.block_number() + 1))
    net.verifiers[0].dispute.draw_jury(did)
    assert len(c.reader.dispute.get_dispute(did).jury) == 3


def test_node_status_shows_a_seated_jurors_locked_stake(net: Net, tmp_path: Path) -> None:
    """A juror sees its seat-locked stake (what a slash would take, out of reach of
    claims and unbonding until the seat ends) in `polnet node status`."""
    job, leaves, tree = post_commit(net)
    _, jury = dispute_to_jury(net, net.verifiers[0], job, 2, leaves, tree)
    cut = juror_cut(net, job)
    net.chain.deployment.save(tmp_path / "devnet" / "deployment.json")  # the default path
    out = subprocess.run([sys.executable, "-m", "node.cli.main", "node", "status", jury[0],
                          "--json"], env={**os.environ, "POLNET_HOME": str(tmp_path)},
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    shown = json.loads(out.stdout)
    assert (shown["seat_locked_stake"], shown["free_stake"]) == (cut, STAKE - cut)
    assert "verifier" in shown["roles"]
    stranger = subprocess.run([sys.executable, "-m", "node.cli.main", "node", "status",
                               "0x" + "ab" * 20], env={**os.environ,
                                                       "POLNET_HOME": str(tmp_path)},
                              capture_output=True, text=True, timeout=120)
    assert stranger.returncode == 1 and "not registered" in stranger.stderr
