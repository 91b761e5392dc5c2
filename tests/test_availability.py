"""Issue 30, item 1: no payment without evidence (data availability), played on anvil.

The attack as of 6c4c363: a solver commits a root over two leaves only (leaf 0 = the
job's S_0, the last leaf any final hash) for a 12-segment job, trains and serves
nothing. Every challenge reverts ``InvalidProof`` (no interior leaf exists to prove),
the committee cannot replay so nobody attests, and ``finalize`` paid anyway: +100 POL,
bond returned. Now a round is paid only with evidence (an attesting majority of its
committee, or every sampled segment's leaves on chain), and anyone may name a segment
whose leaves the solver must publish on chain (Availability) or lose the round.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from web3.types import TxReceipt

from devnet.params import TOKEN
from devnet.testing import FAKE_INIT, LocalChain, expect_revert, fake_trace, job_terms
from node.chain.availability import RequestState
from node.chain.client import ChainClient
from node.chain.contracts import SOLVER, VERIFIER, JobStatus
from node.chain.ids import JobId
from node.proof import MerkleTree, TraceLeaf

SEGMENTS, K = 12, 5
REWARD, BUDGET = 100 * TOKEN, 30 * TOKEN

revert = expect_revert


@dataclass
class Net:
    chain: LocalChain
    submitter: ChainClient
    solver: ChainClient
    verifiers: list[ChainClient]

    def by_address(self, a: str) -> ChainClient:
        return next(c for c in self.verifiers if c.address == a)

    def holdings(self, c: ChainClient) -> int:
        r = self.chain.reader
        a = c.address
        return (r.token.balance_of(a) + r.registry.free_stake(a) + r.registry.locked_stake(a)
                + r.registry.node_of(a).unbonding_stake + r.market.credits(a)
                + r.dispute.credits(a))

    def conserved(self) -> None:
        held, owed = self.chain.conservation()
        assert held == owed
        r = self.chain.reader
        assert r.token.balance_of(r.availability.address) == r.availability.total_owed()


@pytest.fixture
def net(chain: LocalChain) -> Net:
    return Net(chain, submitter=chain[1], solver=chain.join(2, SOLVER, 500 * TOKEN),
               verifiers=[chain.join(i, VERIFIER, 200 * TOKEN) for i in (3, 4, 5, 6, 7, 8)])


def fix_seed(net: Net, job: JobId) -> list[str]:
    """Mine past the sampling block, fix the seed; returns the committee drawn."""
    net.chain.mine(net.chain.reader.market.market_params().sample_lookahead + 1)
    net.verifiers[0].market.fix_seed(job)
    committee = net.chain.reader.market.committee_of(job)
    assert len(committee) == 3
    return list(committee)


def post_withholding(net: Net) -> JobId:
    """The issue's solver: a root over leaf 0 (S_0) and the last leaf, nothing else."""
    job = net.submitter.post_job(job_terms(REWARD, BUDGET, segments=SEGMENTS, k=K))
    net.solver.market.claim_job(job)
    first = TraceLeaf(job, 0, 0, FAKE_INIT, 0)
    last = TraceLeaf(job, SEGMENTS, SEGMENTS * K, b"\x77" * 32, 1_000_000)
    tree = MerkleTree.from_leaves([first, last])
    net.solver.market.commit_result(job, tree.root, last, tree.proof(0), tree.proof(1))
    return job


def post_honest(net: Net) -> tuple[JobId, list[TraceLeaf], MerkleTree]:
    job = net.submitter.post_job(job_terms(REWARD, BUDGET, segments=SEGMENTS, k=K))
    net.solver.market.claim_job(job)
    leaves, tree = fake_trace(job, SEGMENTS, K)
    net.solver.market.commit_trace(job, leaves, tree)
    return job, leaves, tree


def request(c: ChainClient, job: JobId, segment: int) -> int:
    av = c.availability
    c.token.ensure_allowance(av.address, av.availability_params().bond)
    return av.request(job, segment)


def publish(c: ChainClient, job: JobId, seg: int, leaves: list[TraceLeaf],
            tree: MerkleTree) -> TxReceipt:
    return c.availability.publish(job, seg, leaves[seg], tree.proof(seg), leaves[seg + 1],
                                  tree.proof(seg + 1))


def past_window(net: Net, job: JobId) -> None:
    end = net.chain.reader.market.get_job(job).window_end
    if end > net.chain.timestamp():
        net.chain.advance(end - net.chain.timestamp())


def test_withholding_solver_is_condemned_not_paid(net: Net) -> None:
    """Before: the two-leaf solver of issue 30 was paid 100 POL and got its 150 POL bond
    back at the window's expiry, having trained and served nothing. Now the unattested
    round is not paid; a committee member names a segment, the solver cannot put its
    leaves on chain, and the round is condemned: the bond is split (20% to the submitter,
    the rest to the requester) and the job reopens with its escrow."""
    c, r = net.chain, net.chain.reader
    before = {x.address: net.holdings(x) for x in (net.submitter, net.solver, *net.verifiers)}
    job = post_withholding(net)
    bond = r.market.get_job(job).bond
    committee = fix_seed(net, job)
    # the ordinary game cannot start: there is no interior leaf to prove
    fake = TraceLeaf(job, 6, 6 * K, b"\x01" * 32, 0)
    e = revert(net.by_address(committee[0]).market.challenge, job, 6, fake, [], fake, [])
    assert e.error == "InvalidProof"
    past_window(net, job)
    e = revert(net.submitter.market.finalize, job)  # before: paid here
    assert e.error == "NoEvidence" and e.error_args == {"attestations": 0, "seats": 3}
    # the committee, unable to fetch, names a segment (still open: no attesting majority)
    asker = net.by_address(committee[0])
    rid = request(asker, job, 6)
    av_bond = r.availability.availability_params().bond
    assert r.availability.total_owed() == av_bond
    net.conserved()
    assert revert(net.submitter.market.finalize, job).error == "DisputesOpen"
    assert revert(request, net.verifiers[5], job, 6).error == "AlreadyRequested"
    assert revert(request, net.solver, job, 3).error == "SolverCannotRequest"
    # the solver has nothing to publish: no proof of an interior leaf verifies
    e = revert(net.solver.availability.publish, job, 6, fake, [b"\x02" * 32], fake, [])
    assert e.error == "InvalidProof"
    assert revert(asker.availability.expire, rid).error == "NotExpired"
    c.advance(r.availability.availability_params().answer_window + 1)
    asker.availability.expire(rid)
    assert r.availability.get_request(rid).state == RequestState.LOST
    assert r.market.round_info(job, 1).condemned
    net.conserved()
    past_window(net, job)
    rf = net.submitter.market.finalize(job)
    (settled,) = r.market.events(rf, "RoundSettled")
    assert settled["args"]["slashedBond"] == bond
    (paid,) = r.market.events(rf, "RewardPaid")
    assert paid["args"]["challenger"] == asker.address and paid["args"]["disputeId"] == 0
    j = r.market.get_job(job)
    assert j.status == JobStatus.OPEN and int(r.market.call("totalEscrow")) == REWARD + BUDGET
    to_submitter = bond * r.market.market_params().submitter_share_bps // 10_000
    assert net.holdings(net.solver) - before[net.solver.address] == -bond
    assert net.holdings(asker) - before[asker.address] == bond - to_submitter
    assert (net.holdings(net.submitter) - before[net.submitter.address]
            == to_submitter - REWARD - BUDGET)  # its escrow still sits in the reopened job
    assert r.availability.total_owed() == 0
    net.conserved()


def test_honest_solver_answers_and_is_paid(net: Net) -> None:
    """An honest solver named by a request publishes the segment's two leaves and is paid
    as usual; it loses only gas, and the requester pays it a share of the bond for the
    trouble (the price of a frivolous request). The published leaves are enough to open
    the ordinary dispute (read from the ``Published`` event)."""
    c, r = net.chain, net.chain.reader
    job, leaves, tree = post_honest(net)
    committee = fix_seed(net, job)
    asker = net.by_address(committee[0])
    solver0, asker0 = net.holdings(net.solver), net.holdings(asker)
    rid = request(asker, job, 4)
    assert r.market.get_job(job).open_disputes == 1
    p = r.availability.availability_params()
    rp = publish(net.solver, job, 4, leaves, tree)
    (pub,) = r.availability.events(rp, "Published")
    start, end = pub["args"]["start"], pub["args"]["end"]
    assert (bytes(start["stateHash"]), bytes(end["stateHash"])) == (
        leaves[4].state_hash, leaves[5].state_hash)
    assert r.availability.get_request(rid).state == RequestState.ANSWERED
    assert r.market.get_job(job).open_disputes == 0
    assert revert(request, net.verifiers[5], job, 4).error == "AlreadyPublished"
    assert revert(publish, net.solver, job, 4, leaves, tree).error == "AlreadyPublished"
    to_solver = p.bond * p.solver_share_bps // 10_000
    assert net.holdings(asker) - asker0 == -to_solver
    net.conserved()
    with c.reverting():  # the leaves on chain open the ordinary game
        did = asker.market.challenge(
            job, 4, TraceLeaf(job, 4, 4 * K, bytes(start["stateHash"]), start["lossE9"]),
            [bytes(x) for x in start["proof"]],
            TraceLeaf(job, 5, 5 * K, bytes(end["stateHash"]), end["lossE9"]),
            [bytes(x) for x in end["proof"]])
        assert r.market.dispute_ref(did).segment == 4
    for a in committee[:2]:  # a majority of the three seats
        net.by_address(a).market.attest(job)
    past_window(net, job)
    net.submitter.market.finalize(job)
    assert r.market.get_job(job).status == JobStatus.FINALIZED
    assert net.holdings(net.solver) - solver0 == REWARD + to_solver
    net.conserved()


def test_silent_committee_is_not_paid_until_the_sample_is_on_chain(net: Net) -> None:
    """Before: a round nobody attested was paid at the window's expiry. Now one attestation
    of three seats is no majority: finalize refuses (``NoEvidence``) and the round stays
    open to availability requests. An honest solver facing a silent committee publishes
    the leaves of every sampled segment itself; each publication leaves ``disputeGrace``
    to dispute it, and once the sample is on chain and the grace has passed undisputed it
    is paid. The delay is the solver's own: it ends one grace after its last publication."""
    c, r = net.chain, net.chain.reader
    job, leaves, tree = post_honest(net)
    committee = fix_seed(net, job)
    net.by_address(committee[0]).market.attest(job)
    past_window(net, job)
    e = revert(net.submitter.market.finalize, job)
    assert e.error_args == {"attestations": 1, "seats": 3}
    sample = r.market.sampled_segments(job)
    assert not r.availability.evidenced(job, 1)
    grace = r.market.market_params().dispute_grace
    for s in sample:
        publish(net.solver, job, s, leaves, tree)
        # the window reopens: others get disputeGrace to dispute what was published
        assert r.market.get_job(job).window_end >= c.timestamp() + grace
    assert r.availability.evidenced(job, 1)
    assert revert(net.submitter.market.finalize, job).error == "WindowNotOver"
    past_window(net, job)
    solver0 = net.holdings(net.solver)
    net.submitter.market.finalize(job)
    assert r.market.get_job(job).status == JobStatus.FINALIZED
    assert net.holdings(net.solver) - solver0 == REWARD  # and its bond unlocked:
    assert r.registry.locked_stake(net.solver.address) == 0
    net.conserved()


def test_requests_close_with_a_majority_and_never_reach_a_condemned_round(net: Net) -> None:
    """Requests are bounded: each segment is answered at most once per round, a round
    attested by a majority takes none after its window, and a condemned round takes
    none (they could only delay its settlement), nor unasked publications."""
    c, r = net.chain, net.chain.reader
    job, leaves, tree = post_honest(net)
    committee = fix_seed(net, job)
    for a in committee[:2]:
        net.by_address(a).market.attest(job)
    past_window(net, job)
    assert revert(request, net.verifiers[0], job, 1).error == "RequestsClosed"
    assert revert(request, net.verifiers[0], job, SEGMENTS).error == "SegmentOutOfRange"
    net.submitter.market.finalize(job)
    assert revert(request, net.verifiers[0], job, 1).error == "NotCommitted"
    # a withheld round, condemned: no further request or publication holds it
    job2 = post_withholding(net)
    fix_seed(net, job2)
    rid = request(net.verifiers[0], job2, 2)
    c.advance(r.availability.availability_params().answer_window + 1)
    net.verifiers[0].availability.expire(rid)
    assert revert(net.verifiers[0].availability.expire, rid).error == "NotPending"
    assert revert(request, net.verifiers[1], job2, 3).error == "AlreadyCondemned"
    net.conserved()


def test_only_the_solver_publishes_unasked(net: Net) -> None:
    """Each unasked publication leaves ``disputeGrace`` of window: were anyone holding the
    trace allowed to publish unasked, a verifier could hold an honest solver's settlement
    segment by segment for nothing. Unasked leaves come from the solver alone; a pending
    request may be answered by anyone (the leaves prove themselves)."""
    r = net.chain.reader
    job, leaves, tree = post_honest(net)
    committee = fix_seed(net, job)
    other = net.verifiers[5]
    e = revert(publish, other, job, 2, leaves, tree)
    assert (e.error, e.error_args) == ("NotSolver", {"caller": other.address})
    rid = request(net.by_address(committee[0]), job, 2)
    publish(other, job, 2, leaves, tree)  # answered by a third party
    assert r.availability.get_request(rid).state == RequestState.ANSWERED
    net.conserved()


def test_a_lost_dispute_is_paid_before_an_unanswered_request(net: Net) -> None:
    """A round lost both ways pays one winner: the earliest-opened dispute the solver lost
    (as before issue 30), not the requester, so a solver's puppet request left unanswered
    cannot take the reward from an honest challenger whose dispute the solver lost."""
    c, r = net.chain, net.chain.reader
    job, leaves, tree = post_honest(net)
    fix_seed(net, job)
    puppet, honest = net.verifiers[0], net.verifiers[1]
    rid = request(puppet, job, 3)
    did = honest.market.challenge(job, 5, leaves[5], tree.proof(5), leaves[6], tree.proof(6))
    d = r.dispute.get_dispute(did)
    c.advance(max(d.solver_clock_left, r.availability.availability_params().answer_window) + 1)
    honest.dispute.timeout(did)  # the solver never posts its mids
    puppet.availability.expire(rid)
    assert r.market.round_info(job, 1).first_winner == did
    past_window(net, job)
    rf = net.submitter.market.finalize(job)
    (paid,) = r.market.events(rf, "RewardPaid")
    assert (paid["args"]["disputeId"], paid["args"]["challenger"]) == (did, honest.address)
    net.conserved()
