"""Issue 30, item 4: delay is priced (bounded, and the delayed solver compensated).

Before (contracts as of 6c4c363): a coalition of minimum-stake verifiers kept one
dispute live at all times against an honest solver: any verifier could challenge
while any dispute of the round was live, and every ending dispute gave the window
another `disputeGrace`. Four chained disputes held `finalize` 732 s for 38.33 POL at
the devnet's clocks; one address may dispute each segment once, so a 2,000-segment
job could be held about 1.8 years for 20,000 POL, and the honest solver got nothing.

Now disputes and requests open only until the horizon, committedAt + 2 verification
windows (past it only the window itself, which the solver's own publications extend,
admits a dispute), and an ending dispute extends the window no further than that.
So settlement comes at most one dispute game after the horizon, whoever plays; half
of each lost challenge's bond (after the jurors' share) is held for the solver, paid
when its round is paid and burned when the round is condemned.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
from eth_utils import keccak

from devnet.params import TOKEN
from devnet.testing import LocalChain, expect_revert, fake_trace, job_terms
from node.chain.client import ChainClient
from node.chain.contracts import SOLVER, VERIFIER, JobStatus, Phase, Side, Verdict
from node.chain.ids import DisputeId, JobId
from node.proof import MerkleTree, TraceLeaf

SEGMENTS, K = 8, 4  # k = 4 < fanout: one bisection round, then a jury
REWARD, BUDGET = 100 * TOKEN, 30 * TOKEN
HORIZON_WINDOWS = 2  # JobMarket.HORIZON_WINDOWS
BURN = "0x000000000000000000000000000000000000dEaD"


@dataclass
class Net:
    chain: LocalChain
    submitter: ChainClient
    solver: ChainClient
    honest: list[ChainClient]
    griefers: list[ChainClient]  # minimum-stake verifiers (a cheater's puppets in test 2)

    def worth(self, c: ChainClient) -> int:
        r, a = self.chain.reader, c.address
        return (r.token.balance_of(a) + r.registry.free_stake(a) + r.registry.locked_stake(a)
                + r.registry.node_of(a).unbonding_stake + r.registry.seat_locked_stake(a)
                + r.market.credits(a) + r.dispute.credits(a))


@pytest.fixture
def net(chain: LocalChain) -> Net:
    minimum = int(chain.reader.registry.call("minVerifierStake"))
    griefers = []
    for i in (10, 11, 12):
        chain.extra(i, minimum + 20 * TOKEN)  # the stake, and tokens for request bonds
        griefers.append(chain.join(i, VERIFIER, minimum))
    return Net(chain, submitter=chain[1], solver=chain.join(2, SOLVER, 500 * TOKEN),
               honest=[chain.join(i, VERIFIER, 200 * TOKEN) for i in (3, 4, 5, 6, 7, 8)],
               griefers=griefers)


def request(c: ChainClient, job: JobId, segment: int) -> int:
    av = c.availability
    c.token.ensure_allowance(av.address, av.availability_params().bond)
    return av.request(job, segment)


def game_params(net: Net) -> Any:
    return net.chain.reader.dispute.call("params")


def commit(net: Net, tag: str = "state") -> tuple[JobId, list[TraceLeaf], MerkleTree]:
    job = net.submitter.post_job(job_terms(REWARD, BUDGET, segments=SEGMENTS, k=K))
    net.solver.market.claim_job(job)
    leaves, tree = fake_trace(job, SEGMENTS, K, tag=tag)
    net.solver.market.commit_trace(job, leaves, tree)
    return job, leaves, tree


def attest_all(net: Net, job: JobId) -> None:
    """Every committee seat attests (griefers drawn too: the round has its majority)."""
    net.chain.mine(3)
    net.honest[0].market.fix_seed(job)
    by: dict[str, ChainClient] = {c.address: c for c in [*net.honest, *net.griefers]}
    for a in net.chain.reader.market.committee_of(job):
        by[a].market.attest(job)


def challenge(c: ChainClient, job: JobId, seg: int, leaves: list[TraceLeaf],
              tree: MerkleTree) -> DisputeId:
    return c.market.challenge(job, seg, leaves[seg], tree.proof(seg), leaves[seg + 1],
                              tree.proof(seg + 1))


def solver_moves(net: Net, did: DisputeId) -> None:
    d = net.chain.reader.dispute.get_dispute(did)
    assert d.phase == Phase.BISECTION and d.turn == Side.SOLVER
    net.solver.dispute.post_mids(did, [keccak(b"m%d" % s) for s in d.mid_steps])


def game_bound(net: Net) -> int:
    """The longest one dispute can last against a solver that moves at once: the
    challenger's clock, one extension per bisection round, the jury's lookahead (a block
    a second on anvil's advance) and its commit and reveal windows."""
    g = game_params(net)
    rounds = 1  # k = 4 < fanout 8
    return (g.clock + rounds * g.clockExtension + g.juryLookahead + 1 + g.commitWindow
            + g.revealWindow)


def test_chained_griefing_is_bounded_and_pays_the_solver(net: Net) -> None:
    """The chain of the issue replayed: each griefer opens its dispute while the previous
    one is live and lets its own clock run out. Before, this went on for as long as the
    griefers had segments x addresses (S x n disputes, 732 s for four). Now the third
    link is refused at the horizon, the round settles within one game of it, and the
    solver gets half of each lost bond."""
    c = net.chain
    m, g = c.reader.market, c.reader.dispute
    W = m.market_params().verification_window
    cb = m.market_params().challenge_bond
    job, leaves, tree = commit(net)
    attest_all(net, job)
    committed = m.get_job(job).committed_at
    horizon = committed + HORIZON_WINDOWS * W
    solver_before = net.worth(net.solver)
    griefers_before = sum(net.worth(x) for x in net.griefers)
    burned0 = g.total_burned()
    clock = game_params(net).clock

    first = challenge(net.griefers[0], job, 0, leaves, tree)
    solver_moves(net, first)
    c.advance(clock + 1)  # the griefer's clock runs out, its dispute still live
    second = challenge(net.griefers[1], job, 1, leaves, tree)  # past the window: chained
    net.honest[0].dispute.timeout(first)
    solver_moves(net, second)
    c.advance(clock + 1)
    assert c.timestamp() >= horizon and m.get_job(job).open_disputes == 1
    # the third link, with the second one live: refused past the horizon
    assert expect_revert(challenge, net.griefers[2], job, 2, leaves, tree).error == \
        "WindowClosed"
    net.honest[0].dispute.timeout(second)
    chain_ids = [first, second]
    assert all(g.get_dispute(d).verdict == Verdict.VALID for d in chain_ids)
    j = m.get_job(job)
    # no ending dispute pushed the window past the horizon
    assert j.window_end <= horizon and j.open_disputes == 0
    if j.window_end > c.timestamp():
        c.advance(j.window_end - c.timestamp())
    net.submitter.market.finalize(job)
    assert m.get_job(job).status == JobStatus.FINALIZED
    assert c.timestamp() <= horizon + game_bound(net)

    # each lost bond: half held for the solver (no jury: no jurors' share), half burned
    held = len(chain_ids) * cb // 2
    assert g.delay_held(job, 1) == held
    assert g.total_burned() - burned0 == len(chain_ids) * cb - held
    assert c.conservation()[0] == c.conservation()[1]
    net.honest[1].dispute.settle_delay(job, 1)
    assert g.delay_held(job, 1) == 0
    assert expect_revert(net.honest[1].dispute.settle_delay, job, 1).error == \
        "NoDelayCompensation"
    assert net.worth(net.solver) - solver_before == REWARD + held
    # the griefers lost their bonds, less what any of them earned on the committee
    per_seat = BUDGET // m.market_params().attestors_per_job
    seated = sum(a in {x.address for x in net.griefers} for a in m.committee_of(job))
    assert griefers_before - sum(net.worth(x) for x in net.griefers) == \
        len(chain_ids) * cb - seated * per_seat
    held_tokens, owed = c.conservation()
    assert held_tokens == owed


def vote(net: Net, did: DisputeId, valid_of: dict[str, bool]) -> None:
    by: dict[str, ChainClient] = {x.address: x for x in [*net.honest, *net.griefers]}
    for a, v in valid_of.items():
        by[a].dispute.commit_vote(did, v, keccak(a.encode()))
    d = net.chain.reader.dispute.get_dispute(did)
    net.chain.advance(d.commit_end - net.chain.timestamp())
    for a, v in valid_of.items():
        by[a].dispute.reveal_vote(did, v, keccak(a.encode()))
    net.chain.advance(d.reveal_end - net.chain.timestamp())
    # every juror revealed: the last reveal resolved it already
    if net.chain.reader.dispute.get_dispute(did).phase != Phase.RESOLVED:
        net.honest[0].dispute.resolve(did)


def test_puppets_cannot_run_out_the_clock_on_an_honest_challenger(net: Net) -> None:
    """The new rule turned against it: a cheater's puppets open disputes at once, on
    other segments, and stall them, hoping to reach the horizon before an honest
    challenge is decided, or to be paid back their bonds. Disputes of a round run
    concurrently, so the honest challenger opens its own after the window closed
    (a puppet's dispute is live, the horizon not reached), the jury condemns the
    cheater, and the puppets' held bonds are burned, not returned."""
    c = net.chain
    m, g = c.reader.market, c.reader.dispute
    W = m.market_params().verification_window
    job, leaves, tree = commit(net, tag="faked")
    attest_all(net, job)
    committed = m.get_job(job).committed_at
    puppets = net.griefers[:2]
    pids = [challenge(p, job, s, leaves, tree) for p, s in zip(puppets, (0, 1), strict=True)]
    for pid in pids:
        solver_moves(net, pid)
    c.advance(committed + W - c.timestamp() + 1)  # the window is over; puppets still live
    assert m.get_job(job).window_end <= c.timestamp()
    honest = net.honest[0]
    fake = 5
    did = challenge(honest, job, fake, leaves, tree)
    assert c.timestamp() < committed + HORIZON_WINDOWS * W
    solver_moves(net, did)
    d = g.get_dispute(did)
    honest.dispute.choose(did, 0, g.posted_mids(did, d.mids_root))
    for pid in pids:  # the puppets' clocks ran out meanwhile: the cheater "wins" those
        c.advance(g.get_dispute(pid).challenger_clock_left + 1)
        net.honest[1].dispute.timeout(pid)
    horizon = committed + HORIZON_WINDOWS * W
    c.advance(max(0, horizon - c.timestamp()) + 1)  # past the horizon: the game goes on
    d = g.get_dispute(did)
    assert d.phase == Phase.DRAWING
    c.mine(max(1, d.draw_block - c.reader.block_number() + 1))
    honest.dispute.draw_jury(did)
    # every juror replays the faked step (jury capture is priced elsewhere: Incentives)
    vote(net, did, dict.fromkeys(g.get_dispute(did).jury, False))
    assert g.get_dispute(did).verdict == Verdict.INVALID
    held = g.delay_held(job, 1)
    assert held == len(pids) * m.market_params().challenge_bond // 2
    j = m.get_job(job)
    if j.window_end > c.timestamp():
        c.advance(j.window_end - c.timestamp())
    net.submitter.market.finalize(job)
    assert m.round_info(job, 1).condemned and m.round_info(job, 1).first_winner == did
    assert m.get_job(job).status == JobStatus.OPEN
    burned0 = g.total_burned()
    net.honest[1].dispute.settle_delay(job, 1)  # condemned: the cheater gets none of it
    assert g.total_burned() - burned0 == held
    assert g.credits(net.solver.address) == 0
    held_tokens, owed = c.conservation()
    assert held_tokens == owed


def test_requests_close_at_the_horizon_unless_the_round_lacks_evidence(net: Net) -> None:
    """Before, an availability request was open while any dispute of the round was
    live, so requests chained with disputes as disputes did. Now a round with its
    attesting majority takes no request past the horizon, and a compensation is not
    paid before its round settles."""
    c = net.chain
    m = c.reader.market
    W = m.market_params().verification_window
    job, leaves, tree = commit(net)
    attest_all(net, job)
    committed = m.get_job(job).committed_at
    pid = challenge(net.griefers[0], job, 0, leaves, tree)
    solver_moves(net, pid)
    c.advance(committed + HORIZON_WINDOWS * W - c.timestamp() - 2)
    request(net.griefers[1], job, 1)  # live dispute, inside the horizon
    c.advance(3)
    assert m.get_job(job).open_disputes == 2
    assert expect_revert(request, net.griefers[2], job, 2).error == "RequestsClosed"
    assert expect_revert(challenge, net.griefers[2], job, 2, leaves, tree).error == \
        "WindowClosed"
    c.advance(c.reader.dispute.get_dispute(pid).challenger_clock_left + 1)
    net.honest[0].dispute.timeout(pid)
    assert expect_revert(net.honest[0].dispute.settle_delay, job, 1).error == "RoundNotSettled"
    held_tokens, owed = c.conservation()
    assert held_tokens == owed


def test_past_the_horizon_only_the_missing_sample_can_be_asked_for(net: Net) -> None:
    """A round nobody vouched for stays open to requests (it must be able to show its
    data or be condemned), but past the horizon only on a sampled segment not yet on
    chain: before, any of its S segments could be asked for, one after another, each
    holding the round another answer window and grace."""
    c = net.chain
    m = c.reader.market
    W = m.market_params().verification_window
    job, leaves, tree = commit(net)
    c.mine(3)
    net.honest[0].market.fix_seed(job)  # a committee is drawn, nobody attests
    sampled = m.sampled_segments(job)
    other = next(s for s in range(SEGMENTS) if s not in sampled)
    c.advance(m.get_job(job).committed_at + HORIZON_WINDOWS * W - c.timestamp() + 1)
    assert expect_revert(request, net.griefers[0], job, other).error == "RequestsClosed"
    request(net.griefers[0], job, sampled[0])  # what the round needs to be paid at all
    assert m.get_job(job).open_disputes == 1
    held_tokens, owed = c.conservation()
    assert held_tokens == owed
