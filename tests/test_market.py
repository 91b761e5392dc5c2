"""JobMarket against anvil: the job life, every revert, the committee, reclaim, cancel,
challenges and the once-per-round settlement of condemned rounds."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import pytest
from eth_utils import keccak

from devnet.params import TOKEN
from devnet.testing import FAKE_INIT, LocalChain, expect_revert, fake_trace, job_terms
from node.chain.client import ChainClient
from node.chain.contracts import SOLVER, VERIFIER, JobStatus, JobTerms, Phase, Verdict
from node.chain.ids import DisputeId, JobId
from node.errors import ContractRevert
from node.proof import MerkleTree, TraceLeaf, sample_segments

REWARD, BUDGET, DURATION = 100 * TOKEN, 31 * TOKEN, 3600  # budget / 3 leaves a remainder
SEGMENTS, K = 12, 5
BPS = 10_000
BURN = "0x000000000000000000000000000000000000dEaD"
VSTAKE = 200 * TOKEN  # = the devnet's sortition cap: every eligible draw is accepted


revert = expect_revert


@dataclass
class Roles:
    submitter: ChainClient
    solver: ChainClient
    verifiers: list[ChainClient]
    outsider: ChainClient

    def by_address(self, addr: str) -> ChainClient:
        return next(c for c in [self.solver, *self.verifiers] if c.address == addr)


@pytest.fixture
def roles(chain: LocalChain) -> Roles:
    return Roles(submitter=chain[5], solver=chain.join(1, SOLVER | VERIFIER, 500 * TOKEN),
                 verifiers=[chain.join(i, VERIFIER, VSTAKE) for i in (2, 3, 4, 6)],
                 outsider=chain[7])


def terms(**kw: Any) -> JobTerms:
    base: dict[str, Any] = dict(reward=REWARD, budget=BUDGET, duration=DURATION,
                                segments=SEGMENTS, k=K)
    return job_terms(**{**base, **kw})


def commit(chain: LocalChain, roles: Roles) -> tuple[JobId, list[TraceLeaf], MerkleTree]:
    job = roles.submitter.post_job(terms())
    roles.solver.market.claim_job(job)
    leaves, tree = fake_trace(job, SEGMENTS, K)
    roles.solver.market.commit_trace(job, leaves, tree)
    return job, leaves, tree


def past_sample_block(chain: LocalChain, job: JobId) -> None:
    sb = chain.reader.market.get_job(job).sample_block
    chain.mine(max(1, sb - chain.w3.eth.block_number + 1))


def check_conserved(chain: LocalChain) -> None:
    held, owed = chain.conservation()
    assert held == owed


def clock(chain: LocalChain) -> int:
    return int(chain.reader.dispute.call("params").clock)


def test_whole_job_life(chain: LocalChain, roles: Roles) -> None:
    m, sub, solver = roles.submitter.market, roles.submitter, roles.solver
    sub_before = sub.token.balance_of(sub.address)
    t = terms()
    sub.token.approve(m.address, REWARD + BUDGET)
    r = m.transact("postJob", t.as_tuple())
    job = JobId(int(m.event_arg(r, "JobPosted", "jobId")))
    assert job == m.job_count() == 1
    fixed = m.events(r, "JobTermsFixed")[0]["args"]
    assert (fixed["totalSteps"], fixed["stepsPerSegment"], fixed["initStateHash"]) == \
        (SEGMENTS * K, K, FAKE_INIT)
    j = m.get_job(job)
    assert (j.status, j.submitter, j.reward, j.spec_hash) == (JobStatus.OPEN, sub.address,
                                                               REWARD, t.spec_hash)
    # the trace's shape is fixed by the job, not by the solver
    assert (j.segment_count, j.steps_per_segment, j.total_steps, j.init_state_hash) == \
        (SEGMENTS, K, SEGMENTS * K, FAKE_INIT)
    check_conserved(chain)

    r = solver.market.claim_job(job)
    bond = REWARD * m.market_params().bond_factor_bps // BPS
    assert m.events(r, "JobClaimed")[0]["args"]["bond"] == bond
    assert solver.registry.locked_stake(solver.address) == bond
    assert m.get_job(job).deadline == chain.timestamp() + DURATION

    leaves, tree = fake_trace(job, SEGMENTS, K)
    r = solver.market.commit_trace(job, leaves, tree)
    ev = m.events(r, "ResultCommitted")[0]["args"]
    assert (ev["segmentCount"], ev["stepsPerSegment"]) == (SEGMENTS, K)
    j = m.get_job(job)
    assert j.status == JobStatus.COMMITTED and j.trace_root == tree.root
    assert j.final_state_hash == leaves[-1].state_hash
    assert j.snapshot_block == r["blockNumber"]
    assert j.pool_len == solver.registry.call("verifierCount") == 5
    assert m.committee_of(job) == []  # drawn with the seed
    assert revert(m.fix_seed, job).error == "SampleBlockNotReached"
    assert revert(m.sampled_segments, job).error == "SeedNotFixed"
    # a transaction goes into the block after the head: into the sampling block itself
    chain.mine(j.sample_block - 1 - chain.w3.eth.block_number)
    assert revert(m.fix_seed, job).error == "SampleBlockNotReached"  # at, not past it
    chain.mine(1)
    r = roles.outsider.market.transact("fixSeed", job)
    seed = bytes(m.event_arg(r, "SeedFixed", "seed"))
    assert seed == m.seed_of(job) == chain.w3.eth.get_block(j.sample_block)["hash"]
    committee = m.committee_of(job)
    assert list(m.event_arg(r, "CommitteeDrawn", "committee")) == committee
    verifiers = {v.address for v in roles.verifiers}
    assert len(committee) == m.market_params().attestors_per_job == 3
    assert len(set(committee)) == 3 and set(committee) <= verifiers  # never the solver
    assert revert(m.fix_seed, job).error == "SeedAlreadyFixed"
    n = m.market_params().sample_count
    assert m.sampled_segments(job) == sample_segments(seed, SEGMENTS, n)

    for a in committee[:2]:  # the third seat does not attest
        roles.by_address(a).market.attest(job)
    assert m.get_job(job).attestations == 2
    assert m.attestors_of(job) == committee[:2]
    assert revert(m.finalize, job).error == "WindowNotOver"
    chain.advance(m.market_params().verification_window)
    r = roles.outsider.market.finalize(job)
    per = BUDGET // 3
    fin = m.events(r, "JobFinalized")[0]["args"]
    assert (fin["perAttestation"], fin["attestations"], fin["reward"]) == (per, 2, REWARD)
    assert m.get_job(job).status == JobStatus.FINALIZED
    assert solver.registry.locked_stake(solver.address) == 0
    assert m.credits(solver.address) == REWARD
    assert m.credits(committee[2]) == 0
    assert m.credits(sub.address) == BUDGET - 2 * per  # the idle seat and the remainder
    check_conserved(chain)

    assert solver.market.withdraw() == REWARD
    for a in committee[:2]:
        assert roles.by_address(a).market.withdraw() == per
    assert sub.market.withdraw() == BUDGET - 2 * per
    assert sub.token.balance_of(sub.address) == sub_before - REWARD - 2 * per
    assert revert(sub.market.withdraw).error == "NothingToWithdraw"
    assert m.total_owed() == 0
    check_conserved(chain)


def test_post_job_reverts(chain: LocalChain, roles: Roles) -> None:
    sub = roles.submitter
    m = sub.market
    e = revert(m.post_job, terms(budget=0))
    assert e.error == "ERC20InsufficientAllowance"
    sub.token.approve(m.address, 2**256 - 1)
    assert revert(m.post_job, terms(reward=0)).error == "ZeroReward"
    assert revert(m.post_job, terms(duration=0)).error == "ZeroDuration"
    year = 365 * 86400
    e = revert(m.post_job, terms(duration=year + 1))
    assert (e.error, e.error_args) == ("DurationTooLong", {"duration": year + 1, "max": year})
    m.post_job(terms(duration=year))  # the bound itself is fine
    for zero in ({"spec": bytes(32)}, {"data": bytes(32)}, {"init": bytes(32)}):
        assert revert(m.post_job, terms(**zero)).error == "ZeroHash"
    max_reward = (2**96 - 1) // 100
    from node.roles.submitter import MAX_REWARD

    assert max_reward == MAX_REWARD  # the CLI refuses what the market would (in POL)
    e = revert(m.post_job, terms(reward=max_reward + 1))
    assert (e.error, e.error_args) == ("AmountTooLarge", {"amount": max_reward + 1,
                                                          "max": max_reward})
    e = revert(m.post_job, terms(budget=2**96))
    assert (e.error, e.error_args["max"]) == ("AmountTooLarge", 2**96 - 1)
    base = terms()
    for total, k in ((0, 5), (60, 0), (61, 5), (5 * 2**32, 5), (2**32, 1)):
        bad = replace(base, total_steps=total, steps_per_segment=k)
        e = revert(m.post_job, bad)
        assert (e.error, e.error_args) == ("InvalidTerms", {"totalSteps": total,
                                                            "stepsPerSegment": k})
    one = replace(base, total_steps=2**32 - 1, steps_per_segment=1)
    job = m.post_job(one)  # segment count at uint32 max is fine
    assert m.get_job(job).segment_count == 2**32 - 1
    poor = chain[8]
    poor.token.approve(m.address, 10**30)
    poor.token.transfer(chain.addresses[0], poor.token.balance_of(poor.address))
    assert revert(poor.market.post_job, terms(budget=0)).error == "ERC20InsufficientBalance"
    assert m.get_job(JobId(99)).submitter == "0x" + "00" * 20
    check_conserved(chain)


def test_cancel(chain: LocalChain, roles: Roles) -> None:
    sub = roles.submitter
    job = sub.post_job(terms())
    assert revert(roles.outsider.market.cancel, job).error == "NotSubmitter"
    assert revert(sub.market.cancel, 42).error_args == {"jobId": 42}
    r = sub.market.cancel(job)
    assert sub.market.events(r, "JobCancelled")[0]["args"]["refund"] == REWARD + BUDGET
    e = revert(sub.market.cancel, job)
    assert (e.error, e.error_args["status"]) == ("InvalidStatus", JobStatus.CANCELLED)
    assert revert(roles.solver.market.claim_job, job).error == "InvalidStatus"
    assert sub.market.withdraw() == REWARD + BUDGET
    # A drained account keeps a dirty word (credit + 1 = 1), which is no token: it reads
    # 0, cannot be withdrawn, and the next credit pays exactly what was credited.
    assert sub.market.credits(sub.address) == 0
    assert revert(sub.market.withdraw).error == "NothingToWithdraw"
    before = sub.token.balance_of(sub.address)
    sub.market.cancel(sub.post_job(terms()))
    assert sub.market.credits(sub.address) == REWARD + BUDGET
    check_conserved(chain)
    assert sub.market.withdraw() == REWARD + BUDGET
    assert sub.token.balance_of(sub.address) == before
    job2 = sub.post_job(terms())
    roles.solver.market.claim_job(job2)
    assert revert(sub.market.cancel, job2).error == "InvalidStatus"  # claimed: too late
    check_conserved(chain)


def test_claim_and_commit_reverts(chain: LocalChain, roles: Roles) -> None:
    sub, solver = roles.submitter, roles.solver
    sm = solver.market
    job = sub.post_job(terms())
    assert revert(roles.verifiers[0].market.claim_job, job).error == "NotRegisteredSolver"
    assert revert(roles.outsider.market.claim_job, job).error == "NotRegisteredSolver"
    assert revert(sm.claim_job, 77).error == "UnknownJob"
    big = sub.post_job(terms(reward=1000 * TOKEN, budget=0))  # bond 1500 > stake 500
    e = revert(sm.claim_job, big)
    assert e.error == "InsufficientFreeStake" and e.error_args["needed"] == 1500 * TOKEN
    leaves, tree = fake_trace(job, SEGMENTS, K)
    root, final, p0, pn = tree.root, leaves[-1], tree.proof(0), tree.proof(SEGMENTS)
    assert revert(sm.commit_result, job, root, final, p0, pn).error == "InvalidStatus"
    sm.claim_job(job)
    assert revert(sm.claim_job, job).error == "InvalidStatus"
    assert revert(roles.verifiers[0].market.commit_result, job, root, final, p0,
                  pn).error == "NotSolver"
    zero_final = TraceLeaf(job, SEGMENTS, SEGMENTS * K, bytes(32), final.loss_e9)
    assert revert(sm.commit_result, job, bytes(32), final, p0, pn).error == "InvalidTrace"
    assert revert(sm.commit_result, job, root, zero_final, p0, pn).error == "InvalidTrace"

    def proof_error(*args: Any) -> tuple[str, dict[str, object]]:
        e = revert(sm.commit_result, job, *args)
        return e.error, e.error_args

    first, last = ("InvalidProof", {"leafIndex": 0}), ("InvalidProof", {"leafIndex": SEGMENTS})
    # leaf 0 must be the job's S_0: a trace from other weights does not commit
    lv, tr = fake_trace(job, SEGMENTS, K, init=keccak(b"pretrained"))
    assert proof_error(tr.root, lv[-1], tr.proof(0), tr.proof(SEGMENTS)) == first
    assert proof_error(root, final, pn, pn) == first  # a proof of another leaf
    # ...and a trace of another job (its leaves carry their job id) neither
    lv, tr = fake_trace(job + 1, SEGMENTS, K)
    assert proof_error(tr.root, lv[-1], tr.proof(0), tr.proof(SEGMENTS)) == first
    # the final state must be the last leaf's (index T / k), with its loss
    assert proof_error(root, leaves[-2], p0, tree.proof(SEGMENTS - 1)) == last
    wrong_loss = TraceLeaf(job, SEGMENTS, SEGMENTS * K, final.state_hash, final.loss_e9 + 1)
    assert proof_error(root, wrong_loss, p0, pn) == last
    other_hash = TraceLeaf(job, SEGMENTS, SEGMENTS * K, keccak(b"elsewhere"), final.loss_e9)
    assert proof_error(root, other_hash, p0, pn) == last
    # a shorter trace (fewer, longer segments) ends before the job's last leaf
    lv, tr = fake_trace(job, SEGMENTS // 2, K * 2)
    assert proof_error(tr.root, lv[-1], tr.proof(0), tr.proof(SEGMENTS // 2)) == last
    # ...and a longer one ends after it
    lv, tr = fake_trace(job, SEGMENTS + 1, K)
    assert proof_error(tr.root, lv[-1], tr.proof(0), tr.proof(SEGMENTS + 1)) == last
    assert sm.get_job(job).status == JobStatus.CLAIMED
    chain.advance(DURATION + 1)
    assert revert(sm.commit_result, job, root, final, p0, pn).error == "DeadlinePassed"


def test_attest_by_the_committee_only(chain: LocalChain, roles: Roles) -> None:
    job, _, _ = commit(chain, roles)
    m = roles.outsider.market
    late = roles.verifiers[3]
    assert revert(roles.verifiers[0].market.attest, job).error == "SeedNotFixed"
    late.stake(1)  # stake moved after the commit block: never drawn
    past_sample_block(chain, job)
    assert revert(m.attest, job).error == "NotInCommittee"  # reverted: seed not fixed
    assert m.seed_of(job) == bytes(32)
    assert revert(roles.solver.market.attest, job).error == "NotInCommittee"
    assert m.seed_of(job) == bytes(32)
    committee = m.call("committeeOf", job)  # empty until the seed is fixed
    assert list(committee) == []
    # a committee member's attest fixes the seed and draws the committee on the way
    drawn = [v for v in roles.verifiers if v.registry.is_verifier(v.address)]
    for v in drawn:
        try:
            r = v.market.attest(job)
        except ContractRevert as e:
            assert e.error == "NotInCommittee"
            continue
        break
    else:
        pytest.fail("no verifier was drawn")
    assert m.seed_of(job) != bytes(32)
    assert m.events(r, "SeedFixed") and m.events(r, "CommitteeDrawn")
    assert m.events(r, "Attested")[0]["args"]["verifier"] == v.address
    committee = m.committee_of(job)
    assert v.address in committee and late.address not in committee
    assert roles.solver.address not in committee
    assert set(committee) <= {x.address for x in roles.verifiers[:3]}
    assert m.has_attested(job, v.address) and m.attestors_of(job) == [v.address]
    assert revert(v.market.attest, job).error_args == {"caller": v.address}  # AlreadyAttested
    assert revert(v.market.attest, job).error == "AlreadyAttested"
    assert revert(late.market.attest, job).error == "NotInCommittee"
    others = [a for a in committee if a != v.address]
    for a in others:
        assert not m.has_attested(job, a)
    chain.advance(m.market_params().verification_window)
    for a in others:
        assert revert(roles.by_address(a).market.attest, job).error == "WindowClosed"
    assert m.get_job(job).attestations == 1


def test_empty_pool_draws_an_empty_committee(chain: LocalChain) -> None:
    sub, solver = chain[5], chain.join(1, SOLVER, 500 * TOKEN)
    chain.join(2, VERIFIER, 0)  # zero stake: not in the pool
    job = sub.post_job(terms())
    solver.market.claim_job(job)
    leaves, tree = fake_trace(job, SEGMENTS, K)
    solver.market.commit_trace(job, leaves, tree)
    assert solver.market.get_job(job).pool_len == 0
    past_sample_block(chain, job)
    assert solver.market.fix_seed(job) != bytes(32)
    assert solver.market.committee_of(job) == []
    chain.advance(solver.market.market_params().verification_window)
    # no committee, so no attesting majority: paid only once the sample is on chain
    e = revert(solver.market.finalize, job)
    assert (e.error, e.error_args) == ("NoEvidence", {"attestations": 0, "seats": 0})
    chain.publish_sample(solver, job, leaves, tree)
    chain.advance(solver.market.market_params().dispute_grace)
    solver.market.finalize(job)
    assert solver.market.credits(sub.address) == BUDGET  # nobody to pay
    check_conserved(chain)


def test_finalize_without_attestations_refunds_budget(chain: LocalChain, roles: Roles) -> None:
    """Before issue 30 a round nobody attested was paid at the window's expiry; now the
    solver must first put the sampled segments' leaves on chain (and let disputeGrace pass)."""
    job, leaves, tree = commit(chain, roles)
    m = roles.outsider.market
    assert revert(m.finalize, 5).error == "UnknownJob"
    chain.advance(m.market_params().verification_window)
    assert revert(m.finalize, job).error == "NoEvidence"
    chain.publish_sample(roles.solver, job, leaves, tree)
    chain.advance(m.market_params().dispute_grace)
    m.finalize(job)
    assert m.credits(roles.submitter.address) == BUDGET
    assert m.credits(roles.solver.address) == REWARD
    assert revert(m.finalize, job).error == "InvalidStatus"
    check_conserved(chain)


def test_seed_rearms_after_256_blocks(chain: LocalChain, roles: Roles) -> None:
    job, _, _ = commit(chain, roles)
    m = roles.outsider.market
    old = m.get_job(job).sample_block
    chain.mine(300)
    assert revert(roles.verifiers[0].market.attest, job).error == "SeedNotFixed"
    assert m.fix_seed(job) == bytes(32)  # hash unreadable: re-armed, not fixed
    new = m.get_job(job).sample_block
    assert new > old
    assert m.committee_of(job) == []
    chain.mine(new - chain.w3.eth.block_number + 1)
    seed = m.fix_seed(job)
    assert seed == chain.w3.eth.get_block(new)["hash"]
    assert len(m.committee_of(job)) == 3


def test_missed_deadline_reclaim_and_reclaim_again(chain: LocalChain, roles: Roles) -> None:
    sub, solver = roles.submitter, roles.solver
    job = sub.post_job(terms())
    solver.market.claim_job(job)
    bond = solver.market.get_job(job).bond
    m = roles.outsider.market
    assert revert(m.reclaim, job).error == "DeadlineNotPassed"
    chain.advance(DURATION + 1)
    free_before = solver.registry.free_stake(solver.address)
    r = m.reclaim(job)
    args = m.events(r, "JobReclaimed")[0]["args"]
    penalty = bond * m.market_params().missed_deadline_slash_bps // BPS
    assert (args["slashed"], args["unlocked"]) == (penalty, bond - penalty)
    assert solver.registry.locked_stake(solver.address) == 0
    assert solver.registry.free_stake(solver.address) == free_before + bond - penalty
    assert m.credits(sub.address) == penalty
    j = m.get_job(job)
    assert j.status == JobStatus.OPEN and j.round == 1
    assert j.segment_count == SEGMENTS and j.init_state_hash == FAKE_INIT  # terms survive
    assert revert(m.reclaim, job).error == "InvalidStatus"
    solver.market.claim_job(job)  # reopened: claimable again, a new round
    assert m.get_job(job).round == 2
    check_conserved(chain)
    assert sub.market.withdraw() == penalty


def test_challenge_with_python_merkle_proof(chain: LocalChain, roles: Roles) -> None:
    job, leaves, tree = commit(chain, roles)
    v = roles.verifiers[0]
    seg = 7
    args = (job, seg, leaves[seg], tree.proof(seg), leaves[seg + 1], tree.proof(seg + 1))
    assert revert(roles.solver.market.challenge, *args).error == "SolverCannotChallenge"
    assert revert(roles.outsider.market.challenge, *args).error == "NotVerifier"
    # a wrong proof: the end leaf's loss is not the one committed
    forged = TraceLeaf(job, seg + 1, (seg + 1) * K, leaves[seg + 1].state_hash, 1)
    e = revert(v.market.challenge, job, seg, leaves[seg], tree.proof(seg), forged,
               tree.proof(seg + 1))
    assert (e.error, e.error_args) == ("InvalidProof", {"leafIndex": seg + 1})
    e = revert(v.market.challenge, job, seg, leaves[seg], tree.proof(seg + 1), leaves[seg + 1],
               tree.proof(seg + 1))
    assert (e.error, e.error_args) == ("InvalidProof", {"leafIndex": seg})
    e = revert(v.market.challenge, job, SEGMENTS, leaves[seg], [], leaves[seg], [])
    assert (e.error, e.error_args) == ("SegmentOutOfRange", {"segment": SEGMENTS,
                                                             "segmentCount": SEGMENTS})

    free = v.registry.free_stake(v.address)
    dispute_id = v.market.challenge(*args)
    bond = v.market.market_params().challenge_bond
    assert v.registry.locked_stake(v.address) == bond
    assert v.registry.free_stake(v.address) == free - bond
    ref = v.market.dispute_ref(dispute_id)
    assert (ref.job_id, ref.segment, ref.challenger, ref.round) == (job, seg, v.address, 1)
    assert (ref.settled, ref.verdict) == (False, Verdict.NONE)
    assert v.market.isDisputeLive(dispute_id)
    assert v.market.get_job(job).open_disputes == 1
    chain.advance(v.market.market_params().verification_window)
    assert revert(v.market.finalize, job).error == "DisputesOpen"
    e = revert(v.market.resolveDispute, job, dispute_id, seg, 1, v.address, int(Verdict.VALID))
    assert (e.error, e.error_args) == ("Unauthorized", {"caller": v.address})
    # the window is over, but a live dispute keeps the round open to other challengers
    w = roles.verifiers[1]
    did2 = w.market.challenge(*args)
    assert did2 == dispute_id + 1 and v.market.get_job(job).open_disputes == 2
    # ...the same challenger may dispute the same segment twice (it has not lost yet)
    did3 = v.market.challenge(*args)
    assert v.registry.locked_stake(v.address) == 2 * bond
    assert v.market.dispute_ref(did3).challenger == v.address
    check_conserved(chain)


def test_dispute_facade_reads_the_opened_game(chain: LocalChain, roles: Roles) -> None:
    from node.chain.contracts import Side

    job, leaves, tree = commit(chain, roles)
    v = roles.verifiers[0]
    did = v.market.challenge(job, 3, leaves[3], tree.proof(3), leaves[4], tree.proof(4))
    d = v.dispute.get_dispute(did)
    assert (d.job_id, d.segment, d.solver, d.challenger) == (job, 3, roles.solver.address,
                                                              v.address)
    assert (d.lo, d.hi, d.lo_hash, d.hi_hash) == (3 * K, 4 * K, leaves[3].state_hash,
                                                  leaves[4].state_hash)
    assert d.phase == Phase.BISECTION and d.turn == Side.SOLVER
    assert d.verdict == Verdict.NONE and d.draw_block == 0
    hs = [keccak(b"mid%d" % t) for t in d.mid_steps]
    e = revert(v.dispute.post_mids, did, hs)
    assert e.error == "NotYourTurn"
    roles.solver.dispute.post_mids(did, hs)
    r = v.dispute.choose(did, 0, hs)  # one step left: a jury is requested
    d = v.dispute.get_dispute(did)
    assert d.hi == d.lo + 1 == 3 * K + 1
    lookahead = int(v.dispute.call("params").juryLookahead)
    assert d.phase == Phase.DRAWING and d.draw_block == r["blockNumber"] + lookahead
    assert revert(v.dispute.draw_jury, did).error == "JuryNotReady"


def _timeout(chain: LocalChain, roles: Roles, did: DisputeId) -> Any:
    chain.advance(clock(chain) + 1)
    return roles.outsider.dispute.timeout(did)


def test_lost_challenge_bars_only_that_challenger(chain: LocalChain, roles: Roles) -> None:
    job, leaves, tree = commit(chain, roles)
    m = roles.outsider.market
    v, w, x = roles.verifiers[:3]
    bond = m.market_params().challenge_bond
    grace = m.market_params().dispute_grace
    seg = 2
    args = (job, seg, leaves[seg], tree.proof(seg), leaves[seg + 1], tree.proof(seg + 1))
    burn0 = roles.outsider.token.balance_of(BURN)

    did = v.market.challenge(*args)
    d = v.dispute.get_dispute(did)
    roles.solver.dispute.post_mids(did, [keccak(b"mid%d" % t) for t in d.mid_steps])
    r = _timeout(chain, roles, did)  # the challenger never answers: it loses on clock
    assert m.events(r, "DisputeResolved")[0]["args"]["verdict"] == Verdict.VALID
    assert m.events(r, "ChallengerBarred")[0]["args"]["challenger"] == v.address
    assert m.dispute_ref(did).verdict == Verdict.VALID and not m.isDisputeLive(did)
    assert m.is_barred(job, seg, v.address) and not m.is_barred(job, seg, w.address)
    assert not m.is_barred(job, seg + 1, v.address)
    # the window had run out; the dispute's end leaves others disputeGrace seconds
    now = chain.timestamp()
    assert m.get_job(job).window_end >= now + grace
    assert not m.round_info(job, 1).condemned
    # the loser's bond: half burned, half held for the solver until its round is paid
    # (no jury to share it); nothing reaches the solver before that
    assert v.registry.locked_stake(v.address) == 0
    assert v.registry.free_stake(v.address) == VSTAKE - bond
    assert v.dispute.total_burned() == bond - bond // 2
    assert v.dispute.delay_held(job, 1) == bond // 2
    assert roles.outsider.token.balance_of(BURN) == burn0 + bond - bond // 2
    assert v.dispute.credits(roles.solver.address) == 0
    check_conserved(chain)

    e = revert(v.market.challenge, *args)
    assert (e.error, e.error_args) == ("ChallengerBarredFrom", {"segment": seg,
                                                                "challenger": v.address})
    did2 = w.market.challenge(*args)  # anyone else still may
    d2 = w.dispute.get_dispute(did2)
    roles.solver.dispute.post_mids(did2, [keccak(b"mid%d" % t) for t in d2.mid_steps])
    _timeout(chain, roles, did2)
    assert m.is_barred(job, seg, w.address)
    assert v.dispute.total_burned() == 2 * (bond - bond // 2)
    # past the horizon (commit + 2 windows) an ending dispute extends the window no further
    j = m.get_job(job)
    horizon = j.committed_at + 2 * m.market_params().verification_window
    assert chain.timestamp() >= horizon and j.window_end <= horizon
    chain.advance(grace)
    assert revert(x.market.challenge, *args).error == "WindowClosed"  # no dispute live
    chain.publish_sample(roles.solver, job, leaves, tree)  # nobody attested: the evidence
    chain.advance(grace)
    r = m.finalize(job)  # the solver survived both: paid as usual
    assert m.events(r, "JobFinalized")[0]["args"]["reward"] == REWARD
    assert m.credits(roles.solver.address) == REWARD
    assert roles.solver.registry.locked_stake(roles.solver.address) == 0
    roles.outsider.dispute.settle_delay(job, 1)  # its round paid: the held halves are its
    assert v.dispute.credits(roles.solver.address) == 2 * (bond // 2)
    check_conserved(chain)


def test_solver_timeout_condemns_the_round_settled_once_at_finalize(
        chain: LocalChain, roles: Roles) -> None:
    job, leaves, tree = commit(chain, roles)
    m = roles.outsider.market
    mp = m.market_params()
    v = roles.verifiers[0]
    solver = roles.solver
    seg = 4
    did = v.market.challenge(job, seg, leaves[seg], tree.proof(seg), leaves[seg + 1],
                             tree.proof(seg + 1))
    r = _timeout(chain, roles, did)  # the solver never posts its mids
    assert m.events(r, "DisputeResolved")[0]["args"]["verdict"] == Verdict.SOLVER_TIMED_OUT
    assert m.events(r, "RoundCondemned")[0]["args"]["round"] == 1
    # condemned, not reopened: other disputes of the round may still prove more
    j = m.get_job(job)
    assert j.status == JobStatus.COMMITTED and j.window_end >= chain.timestamp() + \
        mp.dispute_grace
    info = m.round_info(job, 1)
    assert (info.condemned, info.settled, info.jury_wins, info.timeout_wins,
            info.first_winner) == (True, False, 0, 1, did)
    assert m.dispute_ref(did).verdict == Verdict.SOLVER_TIMED_OUT
    assert v.registry.locked_stake(v.address) == 0  # the winner's bond is unlocked
    assert v.dispute.total_burned() == 0
    assert m.credits(v.address) == 0  # nothing paid before the round settles
    assert revert(m.finalize, job).error == "WindowNotOver"
    escrow = int(m.call("totalEscrow"))
    check_conserved(chain)

    chain.advance(mp.dispute_grace)
    bond = j.bond
    r = m.finalize(job)
    to_sub = bond * mp.submitter_share_bps // BPS
    jury_pot = bond * mp.juror_share_bps // BPS
    per = bond - to_sub  # won on the solver's clock, no jurors: it takes their share too
    st = m.events(r, "RoundSettled")[0]["args"]
    assert (st["slashedBond"], st["toSubmitter"], st["perChallenger"], st["perJury"]) == \
        (bond, to_sub, per, 0)
    paid = m.events(r, "RewardPaid")[0]["args"]
    assert (paid["disputeId"], paid["challenger"], paid["amount"], paid["juryAmount"]) == \
        (did, v.address, per, 0)
    assert jury_pot > 0 and not m.events(r, "AttestorSlashed")
    assert m.events(r, "JobReopened")[0]["args"]["formerSolver"] == solver.address
    j = m.get_job(job)
    assert (j.status, j.solver, j.bond, j.round) == (JobStatus.OPEN, "0x" + "00" * 20, 0, 1)
    assert int(m.call("totalEscrow")) == escrow  # the escrow waits for an honest solver
    assert solver.registry.locked_stake(solver.address) == 0
    assert solver.registry.free_stake(solver.address) == 500 * TOKEN - bond
    assert m.credits(roles.submitter.address) == to_sub
    assert m.credits(v.address) == per
    info = m.round_info(job, 1)
    assert info.settled and info.first_winner == did
    assert revert(m.finalize, job).error == "InvalidStatus"  # settled once
    assert v.market.withdraw() == per
    check_conserved(chain)

    # a new round: fresh bars, committee and settlement record
    w = roles.verifiers[1]
    w.registry.update_node(SOLVER | VERIFIER, "12D3KooWw", [])
    w.market.claim_job(job)
    assert m.get_job(job).round == 2 and not m.round_info(job, 2).condemned
    assert m.committee_of(job) == [] and m.attestors_of(job) == []
    check_conserved(chain)


def test_jury_verdict_pays_the_provers_and_slashes_the_attestors(chain: LocalChain) -> None:
    sub, solver = chain[5], chain.join(1, SOLVER | VERIFIER, 500 * TOKEN)
    verifiers = [chain.join(i, VERIFIER, VSTAKE) for i in (2, 3, 4, 6, 8, 9)]
    roles = Roles(submitter=sub, solver=solver, verifiers=verifiers, outsider=chain[7])
    job, leaves, tree = commit(chain, roles)
    m, game = roles.outsider.market, roles.outsider.dispute
    mp = m.market_params()
    dp = game.call("params")
    past_sample_block(chain, job)
    m.fix_seed(job)
    attestor = roles.by_address(m.committee_of(job)[0])
    attestor.market.attest(job)  # one attestor of a segment about to be proven invalid
    sampled = m.sampled_segments(job)
    others = [v for v in verifiers if v is not attestor]
    chal, chal2 = others[0], others[1]
    seg = sampled[0]
    seg2 = next(s for s in range(SEGMENTS) if s != seg)
    did = chal.market.challenge(job, seg, leaves[seg], tree.proof(seg), leaves[seg + 1],
                                tree.proof(seg + 1))
    did2 = chal2.market.challenge(job, seg2, leaves[seg2], tree.proof(seg2), leaves[seg2 + 1],
                                  tree.proof(seg2 + 1))
    d = game.get_dispute(did)
    hs = [keccak(b"mid%d" % t) for t in d.mid_steps]
    solver.dispute.post_mids(did, hs)
    chal.dispute.choose(did, 0, hs)
    d = game.get_dispute(did)
    assert d.phase == Phase.DRAWING
    chain.mine(max(1, d.draw_block - chain.w3.eth.block_number + 1))
    game.draw_jury(did)
    d = game.get_dispute(did)
    assert d.phase == Phase.COMMIT and len(d.jury) >= int(dp.quorum)
    # neither party nor the job's attestor judges it
    assert not {solver.address, chal.address, attestor.address} & set(d.jury)
    salt = keccak(b"salt")
    for a in d.jury:
        roles.by_address(a).dispute.commit_vote(did, False, salt)
    chain.advance(int(dp.commitWindow))
    # the other dispute ends first: the solver's clock ran out meanwhile
    roles.outsider.dispute.timeout(did2)
    assert m.dispute_ref(did2).verdict == Verdict.SOLVER_TIMED_OUT
    assert m.round_info(job, 1).first_winner == did2  # the only one lost so far
    for a in d.jury:  # the last reveal resolves: every juror revealed
        r = roles.by_address(a).dispute.reveal_vote(did, False, salt)
    assert revert(game.resolve, did).error == "WrongPhase"
    assert m.events(r, "DisputeResolved")[0]["args"]["verdict"] == Verdict.INVALID
    assert chal.registry.locked_stake(chal.address) == 0
    info = m.round_info(job, 1)
    # opening order, not finishing order: the earlier-opened jury win is the one paid
    assert (info.condemned, info.sampled_invalid, info.jury_wins, info.timeout_wins,
            info.first_winner) == (True, True, 1, 1, did)
    assert m.get_job(job).status == JobStatus.COMMITTED
    check_conserved(chain)

    chain.advance(mp.dispute_grace)
    bond = REWARD * mp.bond_factor_bps // BPS
    game_credits = int(game.call("totalCredits"))
    juror_credits = [m.credits(a) for a in d.jury]
    r = m.finalize(job)
    cut = int(solver.registry.call("minVerifierStake")) * mp.attestor_slash_bps // BPS
    sl = m.events(r, "AttestorSlashed")
    assert [(e["args"]["attestor"], e["args"]["amount"]) for e in sl] == [(attestor.address, cut)]
    assert attestor.registry.free_stake(attestor.address) == VSTAKE - cut
    to_sub = bond * mp.submitter_share_bps // BPS
    per_jury = bond * mp.juror_share_bps // BPS
    per_ch = bond - to_sub - per_jury  # the jury win alone: the clock win gets nothing
    assert [e["args"]["amount"] for e in m.events(r, "AttestorSlashesBurned")] == [cut]
    st = m.events(r, "RoundSettled")[0]["args"]
    assert (st["slashedBond"], st["perChallenger"], st["perJury"]) == (bond, per_ch, per_jury)
    paid = m.events(r, "RewardPaid")
    assert [(p["args"]["disputeId"], p["args"]["challenger"], p["args"]["amount"],
             p["args"]["juryAmount"]) for p in paid] == [(did, chal.address, per_ch, per_jury)]
    assert m.get_job(job).status == JobStatus.OPEN
    assert m.credits(sub.address) == to_sub
    # the majority jurors' share is credited by the market, split among them
    assert int(game.call("totalCredits")) == game_credits
    shares = {a: m.credits(a) - c for a, c in zip(d.jury, juror_credits, strict=True)}
    assert sum(shares.values()) == per_jury and min(shares.values()) >= per_jury // len(d.jury)
    # the challenger of the dispute won by the clock gets nothing for it (only a juror's
    # share if the draw seated it on the winning dispute's jury)
    assert m.credits(chal.address) == per_ch
    assert m.credits(chal2.address) == shares.get(chal2.address, 0)
    check_conserved(chain)


def test_constructor_and_wiring_guards(chain: LocalChain) -> None:
    from devnet.deploy import constructor_args
    from devnet.params import MarketParams

    owner = chain[0]
    zero = "0x" + "00" * 20
    reg = owner.deploy("NodeRegistry", owner.token.address, 60, 1, 1, 1)
    assert revert(reg.setAuthorized, zero, owner.address, owner.address).error == "ZeroAddress"
    assert revert(reg.setAuthorized, owner.address, owner.address, zero).error == "ZeroAddress"
    addrs = {"PolToken": owner.token.address, "NodeRegistry": reg.address}
    good = MarketParams()
    for bad in ({"sample_count": 0}, {"reserved_sample_count": 0}, {"sample_lookahead": 0},
                {"sample_lookahead": 129},
                {"verification_window": 0}, {"verification_window": 365 * 86400 + 1},
                {"dispute_grace": 0}, {"dispute_grace": 365 * 86400 + 1},
                {"attestors_per_job": 0}, {"attestors_per_job": 17},
                {"missed_deadline_slash_bps": 10_001}, {"attestor_slash_bps": 10_001},
                {"bond_factor_bps": 1_000_001}, {"challenge_bond": 2**96},
                {"submitter_share_bps": 2_001}, {"challenger_share_bps": 4_999}):
        p = good.model_copy(update=bad)  # model_copy skips validation
        e = revert(owner.deploy, "JobMarket", *constructor_args("JobMarket", addrs, p))
        assert e.error == "InvalidParams", bad
    edge = good.model_copy(update={"attestors_per_job": 16, "sample_lookahead": 128,
                                   "challenger_share_bps": 10_000, "juror_share_bps": 0,
                                   "submitter_share_bps": 0})
    owner.deploy("JobMarket", *constructor_args("JobMarket", addrs, edge))
    market = owner.deploy("JobMarket", *constructor_args("JobMarket", addrs, good))
    assert revert(market.setDisputeGame, zero).error == "ZeroAddress"
    assert revert(chain[1].contract("JobMarket", market.address).setDisputeGame,
                  owner.address).error == "OwnableUnauthorizedAccount"
    e = revert(owner.deploy, "JobMarket", zero, reg.address, *constructor_args(
        "JobMarket", addrs, good)[2:])
    assert e.error == "ZeroAddress"
