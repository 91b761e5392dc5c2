"""Pipelined collaborative rounds (issue 35) against anvil: with pipeline depth D, rounds start
on posted candidates up to D past the last finalized one, settle and finalize in order, and a
candidate proven wrong rolls back every round built on it, its culprit's pipeline bond paying
for the wasted runs. Conservation of every contract after every step."""

from __future__ import annotations

from typing import Any

import pytest
from eth_utils import keccak

from devnet.params import TOKEN
from devnet.testing import LocalChain, expect_revert, fake_trace
from node.chain.client import ChainClient
from node.chain.contracts import (
    VERIFIER,
    CollabStatus,
    JobStatus,
    OuterVerdict,
    RoundPhase,
    Verdict,
)
from node.chain.ids import CaseId, CollabId, JobId
from tests.test_collab_market import (
    BPS,
    ROUND,
    SEGS,
    SUB_BUDGET,
    SUB_REWARD,
    K,
    Net,
    _challenge_and_draw,
    claim_all,
    conserved,
    init,
    make_net,
    outer,
    post,
    sub_jobs,
    terms,
    window,
)

revert = expect_revert
ZERO = "0x" + "00" * 20


@pytest.fixture
def net(chain: LocalChain) -> Net:
    return make_net(chain)


def bonds(net: Net, job: CollabId) -> tuple[int, int, int]:
    """(slot bond, outer bond, pipeline bond P) of a job."""
    cp = net.chain.reader.collab.collab_params()
    p = net.chain.reader.collab.get_collab(job).pipeline_bond
    return cp.slot_bond + p, cp.outer_bond + p, p


def work_from(net: Net, job: CollabId, r: int, s0: bytes, slots: list[int] | None = None,
              tag: str = "") -> None:
    """Chosen slots' holders claim and commit round r's sub-jobs from S_0 ``s0``, evidence
    on chain (as tests/test_collab_market.py's ``work``, with the S_0 a candidate gave)."""
    for slot, jid in enumerate(sub_jobs(net, job, r)):
        if jid == 0 or (slots is not None and slot not in slots):
            continue
        w = net.by_address(net.chain.reader.market.reserved_solver_of(jid))
        w.market.claim_job(jid)
        leaves, tree = fake_trace(jid, SEGS, K, tag=f"{tag}r{r}s{slot}", init=s0)
        w.market.commit_trace(jid, leaves, tree)
        net.chain.publish_sample(w, jid, leaves, tree)


def candidate(net: Net, who: ChainClient, job: CollabId, r: int, h: bytes | None = None,
              nxt: bytes | None = None) -> None:
    who.token.approve(who.collab.address, bonds(net, job)[1])
    who.collab.post_outer(job, r, h or outer(r), nxt or init(r + 1))


def pipelined_job(net: Net, rounds: int, depth: int) -> CollabId:
    job = post(net, terms(rounds=rounds, pipeline_depth=depth))
    claim_all(net, job)
    return job


def test_depth_zero_is_sequential_and_depth_is_bounded(net: Net) -> None:
    c = net.chain.reader.collab
    e = revert(net.submitter.collab.post_collab_job, terms(pipeline_depth=5))
    assert (e.error, e.error_args) == ("InvalidDepth", {"depth": 5})
    job = pipelined_job(net, 2, 0)
    j = c.get_collab(job)
    assert (j.pipeline_depth, j.ahead, j.pipeline_bond) == (0, 0, 0)
    assert bonds(net, job)[0] == c.collab_params().slot_bond  # no pipeline bond at D = 0
    net.outsider.collab.start_round(job)
    work_from(net, job, 0, init(0))
    # every delta committed, yet no candidate and no round ahead: today's engine
    assert revert(net.submitter.collab.post_outer, job, 0, outer(0), init(1)).error \
        == "WrongRoundPhase"
    assert revert(net.outsider.collab.start_round, job).error == "WrongRoundPhase"
    e = revert(net.outsider.collab.settle_orphan, sub_jobs(net, job, 0)[0])
    assert e.error == "NotOrphan"
    conserved(net)


def test_depth_two_runs_two_rounds_ahead_and_finalizes_in_order(net: Net) -> None:
    chain, c, m = net.chain, net.chain.reader.collab, net.chain.reader.market
    sub, out = net.submitter, net.outsider.collab
    job = pipelined_job(net, 4, 2)
    slot_b, outer_b, p = bonds(net, job)
    assert p == 2 * 3 * SUB_REWARD
    assert c.total_owed() >= 3 * slot_b
    out.start_round(job)
    assert revert(out.start_round, job).error == "NothingPosted"  # no candidate for round 0 yet
    work_from(net, job, 0, init(0), slots=[0, 1])
    e = revert(sub.collab.post_outer, job, 0, outer(0), init(1))
    assert (e.error, e.error_args) == ("SubJobNotCommitted",
                                       {"marketJobId": sub_jobs(net, job, 0)[2]})
    work_from(net, job, 0, init(0), slots=[2])
    candidate(net, sub, job, 0)  # theta_1 over all of round 0's committed deltas
    conserved(net)
    # round 1 starts on the candidate while round 0 is still open to challenge
    out.start_round(job)
    j = c.get_collab(job)
    assert (j.round, j.phase, j.ahead) == (0, RoundPhase.RUNNING, 1)
    for jid in sub_jobs(net, job, 1):
        assert m.get_job(jid).init_state_hash == init(1)
    assert revert(out.start_round, job).error == "NothingPosted"
    work_from(net, job, 1, init(1))
    candidate(net, sub, job, 1)  # a speculative round's candidate
    out.start_round(job)  # round 2: two ahead of round 0, the last not finalized
    assert c.get_collab(job).ahead == 2
    e = revert(out.start_round, job)
    assert (e.error, e.error_args) == ("PipelineFull", {"round": 3})
    # in order only: nothing past round 0 settles or is accepted first; a speculative
    # candidate is challengeable within its window from its post (now closed), not later
    posted1 = c.get_round(job, 1)
    assert posted1.window_end == posted1.posted_at + c.collab_params().outer_window
    chain.advance(c.collab_params().outer_window + window(net))
    e = revert(out.accept_outer, job, 1)
    assert (e.error, e.error_args) == ("WrongRound", {"round": 1, "current": 0})
    net.workers[0].token.approve(c.address, outer_b)
    assert revert(net.workers[0].collab.challenge_outer, job, 1).error == "OuterWindowClosed"
    assert revert(net.workers[0].collab.challenge_outer, job, 3).error == "WrongRound"
    assert revert(out.accept_outer, job, 0).error == "WrongRoundPhase"  # round 0 not settled
    assert revert(net.workers[0].collab.leave_slot, job, 0).error == "WrongRoundPhase"
    conserved(net)
    out.settle_round(job)
    out.accept_outer(job, 0)
    j = c.get_collab(job)
    assert (j.round, j.phase, j.ahead, j.init_state_hash) == (1, RoundPhase.RUNNING, 1, init(1))
    # round 1's candidate keeps its window from its post: no fresh window as the base
    assert c.get_round(job, 1).window_end == posted1.window_end < chain.timestamp()
    work_from(net, job, 2, init(2))
    candidate(net, sub, job, 2)
    out.start_round(job)  # round 3, two ahead of round 1
    assert revert(out.start_round, job).error == "PipelineFull"
    work_from(net, job, 3, init(3))
    for r in (1, 2, 3):
        chain.advance(window(net))
        out.settle_round(job)
        if r == 3:  # the only post after its settlement
            candidate(net, sub, job, 3)
            assert revert(out.accept_outer, job, r).error == "OuterWindowOpen"
        chain.advance(c.collab_params().outer_window)
        out.accept_outer(job, r)
        conserved(net)
    j = c.get_collab(job)
    assert (j.status, j.round, j.outer_hash, j.ahead) == (CollabStatus.FINISHED, 4, outer(3), 0)
    for w in net.workers:
        assert m.credits(w.address) == 4 * SUB_REWARD
        assert c.credits(w.address) == slot_b  # slot and pipeline bond back
    assert c.credits(sub.address) == 4 * outer_b + (
        terms(rounds=4).reward + terms(rounds=4).verification_budget - 12 * SUB_REWARD)
    conserved(net)


def _condemn(net: Net, jid: JobId, leaves: Any, tree: Any) -> None:
    """A verifier challenges the sub-job's first segment; the cheat never answers."""
    chain, m = net.chain, net.chain.reader.market
    chain.extra(11, 1_000 * TOKEN)
    v = chain.join(11, VERIFIER, 500 * TOKEN)  # free stake for the dispute bond
    did = v.market.challenge(jid, 0, leaves[0], tree.proof(0), leaves[1], tree.proof(1))
    chain.advance(int(chain.reader.dispute.call("params").clock) + 1)
    r = net.outsider.dispute.timeout(did)
    assert m.events(r, "DisputeResolved")[0]["args"]["verdict"] == Verdict.SOLVER_TIMED_OUT


def _cheat_then_two_ahead(net: Net, job: CollabId) -> tuple[list[JobId], list[JobId]]:
    """Round 0 with the third worker's forged delta in its candidate, rounds 1 and 2 started
    on it, then the forged sub-job condemned: (round 0's sub-jobs, rounds 1-2's sub-jobs)."""
    sub, out, cheat = net.submitter, net.outsider.collab, net.workers[2]
    out.start_round(job)
    ids0 = sub_jobs(net, job, 0)
    work_from(net, job, 0, init(0), slots=[0, 1])
    cheat.market.claim_job(ids0[2])
    leaves, tree = fake_trace(ids0[2], SEGS, K, tag="cheat", init=init(0))
    cheat.market.commit_trace(ids0[2], leaves, tree)
    candidate(net, sub, job, 0)  # includes the cheat's delta
    out.start_round(job)
    work_from(net, job, 1, init(1))
    candidate(net, sub, job, 1)
    out.start_round(job)
    work_from(net, job, 2, init(2))
    _condemn(net, ids0[2], leaves, tree)
    return ids0, sub_jobs(net, job, 1) + sub_jobs(net, job, 2)


def test_a_condemned_delta_rolls_back_the_rounds_built_on_it(net: Net) -> None:
    chain, c, m = net.chain, net.chain.reader.collab, net.chain.reader.market
    mp = m.market_params()
    sub, out = net.submitter, net.outsider.collab
    t = terms(rounds=3, pipeline_depth=2)
    sub_balance0 = sub.token.balance_of(sub.address)
    job = pipelined_job(net, 3, 2)
    slot_b, outer_b, p = bonds(net, job)
    honest, cheat = net.workers[:2], net.workers[2]
    ids0, orphans = _cheat_then_two_ahead(net, job)
    assert revert(out.settle_round, job).error == "RoundNotSettled"
    # the cheat cannot take its pipeline bond out before the settlement condemns it
    assert revert(cheat.collab.leave_slot, job, 2).error == "WrongRoundPhase"
    assert revert(out.settle_orphan, orphans[0]).error == "NotOrphan"  # not rolled back yet
    chain.advance(window(net) + mp.dispute_grace)
    pool0 = c.get_collab(job).pool
    credits0 = c.credits(sub.address)
    r = out.settle_round(job)
    # the roll-back: rounds 1..2, built on the bad theta_1; the cheat's P refills the pool
    rb = c.events(r, "RoundsRolledBack")[0]["args"]
    assert (rb["jobId"], rb["firstRound"], rb["lastRound"], rb["reason"], rb["poolRefund"]) == \
        (job, 1, 2, 0, 6 * SUB_REWARD)
    assert [e["args"]["round"] for e in c.events(r, "OuterWithdrawn")] == [0, 1]
    assert c.credits(sub.address) - credits0 == 2 * outer_b  # its posts: no fault, bonds back
    drop = c.events(r, "SubJobDropped")[0]["args"]
    assert (drop["slot"], drop["worker"], drop["reason"]) == (2, cheat.address, 1)
    bond = SUB_REWARD * mp.bond_factor_bps // BPS
    to_sub = bond * mp.submitter_share_bps // BPS
    st = c.events(r, "RoundSettled")[0]["args"]
    assert (st["acceptedMask"], st["sharedPot"]) == (0b011, to_sub + p - 6 * SUB_REWARD)
    assert c.credits(cheat.address) == slot_b - p  # its slot bond back, never P
    j = c.get_collab(job)
    assert (j.round, j.phase, j.ahead) == (0, RoundPhase.OUTER, 0)
    assert j.pool - pool0 == 6 * SUB_REWARD + 2 * SUB_BUDGET + SUB_REWARD + SUB_BUDGET
    for q in (1, 2):
        rd = c.get_round(job, q)
        assert (rd.sub_jobs, rd.poster) == ([0, 0, 0], ZERO)
    assert c.is_excluded(job, cheat.address)
    assert c.orphans_of(job) == len(orphans) == 6
    conserved(net)

    # followers recompute theta_1 over the accepted deltas and the pipeline resumes from it
    redo = keccak(b"init1 without the cheat")
    assert revert(out.start_round, job).error == "NothingPosted"
    candidate(net, sub, job, 0, keccak(b"outer1 redone"), redo)
    out.start_round(job)
    new1 = sub_jobs(net, job, 1)
    assert new1[2] == 0 and all(new1[:2])
    assert all(m.get_job(jid).init_state_hash == redo for jid in new1[:2])
    assert revert(cheat.collab.claim_slot, job, 1, 10**9).error == "ExcludedWorker"
    e = revert(out.settle_orphan, new1[0])
    assert e.error == "NotOrphan"
    conserved(net)

    # the rolled-back runs were honest work from the S_0 they were given: paid in full
    credit0 = {w.address: m.credits(w.address) for w in net.workers}
    pool1 = c.get_collab(job).pool
    for jid in orphans:
        rs = out.settle_orphan(jid)
        assert c.events(rs, "OrphanSettled")[0]["args"]["paid"]
        assert m.get_job(jid).status == JobStatus.FINALIZED
        assert c.orphans_of(job) == len(orphans) - 1 - orphans.index(jid)
        conserved(net)
    assert revert(out.settle_orphan, orphans[0]).error == "NotOrphan"  # settled once
    assert c.orphans_of(job) == 0
    for w in honest:
        assert m.credits(w.address) - credit0[w.address] == 2 * SUB_REWARD
    assert m.credits(cheat.address) - credit0[cheat.address] == 2 * SUB_REWARD
    assert c.get_collab(job).pool - pool1 == 6 * SUB_BUDGET  # unpaid budget back
    # so far the pool has spent 2 accepted runs of round 0 and escrowed round 1's re-run:
    # the 6 wasted runs cost it nothing (the cheat's P paid them)
    total = t.reward + t.verification_budget
    assert c.get_collab(job).pool == total - 2 * SUB_REWARD - 2 * (SUB_REWARD + SUB_BUDGET)
    conserved(net)

    # the re-run: rounds 1 and 2 again on the recomputed states, two workers; the job ends
    redo2 = keccak(b"init2 redone")
    work_from(net, job, 1, redo, tag="redo")
    candidate(net, sub, job, 1, keccak(b"outer2 redone"), redo2)
    out.start_round(job)  # round 2, still one ahead of round 0 (its re-post is in its window)
    work_from(net, job, 2, redo2, tag="redo")
    chain.advance(c.collab_params().outer_window)
    out.accept_outer(job, 0)
    for rnd in (1, 2):
        chain.advance(max(window(net), c.collab_params().outer_window))
        out.settle_round(job)
        if rnd == 2:
            candidate(net, sub, job, 2, keccak(b"outer3 redone"), keccak(b"init3"))
            chain.advance(c.collab_params().outer_window)
        out.accept_outer(job, rnd)
        conserved(net)
    j = c.get_collab(job)
    assert (j.status, j.outer_hash) == (CollabStatus.FINISHED, keccak(b"outer3 redone"))
    # every token accounted for: once all withdraw, the CollabMarket holds none
    for w in honest:
        assert m.credits(w.address) - credit0[w.address] == 4 * SUB_REWARD  # 2 wasted, 2 redone
    for who in [sub, *net.workers, *net.verifiers]:
        if c.credits(who.address):
            who.collab.withdraw()
    assert c.total_owed() == 0
    assert chain.reader.token.balance_of(c.address) == 0
    # the submitter paid 2 + 2 + 2 accepted runs of its 3 rounds: nothing for the wasted ones
    assert sub.token.balance_of(sub.address) == sub_balance0 - 6 * SUB_REWARD
    conserved(net)


def test_an_invalid_candidate_rolls_back_and_its_poster_pays(net: Net) -> None:
    chain, c = net.chain, net.chain.reader.collab
    sub, out, liar = net.submitter, net.outsider.collab, net.outsider
    job = pipelined_job(net, 2, 1)
    slot_b, outer_b, p = bonds(net, job)
    chain.set_balance(liar.address, 10**20)
    sub.token.transfer(liar.address, 2 * outer_b)
    out.start_round(job)
    work_from(net, job, 0, init(0))
    candidate(net, liar, job, 0, keccak(b"forged"), keccak(b"forged init"))
    out.start_round(job)
    assert c.get_collab(job).ahead == 1
    orphans = sub_jobs(net, job, 1)
    work_from(net, job, 1, keccak(b"forged init"), slots=[0])
    bond = c.collab_params().outer_bond
    pool0 = c.get_collab(job).pool
    case = _open_challenge(net, job, sub)
    # the candidate's challenge is decided before its round settles
    assert revert(out.settle_round, job).error == "ChallengeLive"
    _, r = _finish_jury(net, job, case, vote=False)
    assert c.events(r, "OuterResolved")[0]["args"]["verdict"] == OuterVerdict.INVALID
    rb = c.events(r, "RoundsRolledBack")[0]["args"]
    assert (rb["firstRound"], rb["lastRound"], rb["reason"], rb["poolRefund"]) == \
        (1, 1, 1, 3 * SUB_REWARD)
    assert c.get_collab(job).pool - pool0 == 3 * SUB_REWARD
    # the challenger: its bond back + the liar's outer bond less the jurors' half + P's rest
    assert c.credits(sub.address) == 2 * bond - bond // 2 + p - 3 * SUB_REWARD
    assert c.get_collab(job).ahead == 0
    conserved(net)
    chain.advance(window(net))
    r = out.settle_round(job)
    assert not c.events(r, "RoundsRolledBack") and not c.events(r, "SubJobDropped")
    candidate(net, sub, job, 0)
    out.start_round(job)
    assert all(sub_jobs(net, job, 1)) and set(sub_jobs(net, job, 1)).isdisjoint(orphans)
    for jid in orphans:  # committed (slot 0) or never claimed: cancelled at once
        rs = out.settle_orphan(jid)
        conserved(net)
        assert c.events(rs, "OrphanSettled")[0]["args"]["paid"] == (jid == orphans[0])
    assert c.credits(liar.address) == 0
    conserved(net)


def _open_challenge(net: Net, job: CollabId, challenger: ChainClient,
                    r: int = 0) -> CaseId:
    case, _ = _challenge_and_draw(net, job, r, challenger)
    return case


def _vote(net: Net, votes: dict[CaseId, bool]) -> None:
    """Each case's jurors all commit and reveal its vote, the cases side by side; their
    reveal windows then end."""
    chain, oj = net.chain, net.chain.reader.outer_jury
    jp = oj.jury_params()
    salt = keccak(b"salt")
    for case, vote in votes.items():
        for a in oj.get_case(case).jury:
            net.by_address(a).outer_jury.commit_vote(case, vote, salt)
    chain.advance(jp.commit_window)
    for case, vote in votes.items():
        for a in oj.get_case(case).jury:
            net.by_address(a).outer_jury.reveal_vote(case, vote, salt)
    chain.advance(jp.reveal_window)


def _finish_jury(net: Net, job: CollabId, case: CaseId, vote: bool,
                 r: int = 0) -> tuple[list[Any], Any]:
    """The case's jurors vote ``vote`` (``_vote``); the case is then resolved."""
    _vote(net, {case: vote})
    jury = net.chain.reader.outer_jury.get_case(case).jury
    return jury, net.outsider.collab.resolve_outer(job, r)


def test_a_withheld_delta_blocks_the_candidate_and_rolls_nothing_back(net: Net) -> None:
    chain, c = net.chain, net.chain.reader.collab
    sub, out = net.submitter, net.outsider.collab
    job = pipelined_job(net, 2, 2)
    slot_b, _, p = bonds(net, job)
    out.start_round(job)
    work_from(net, job, 0, init(0), slots=[0, 1])  # slot 2 withholds
    assert revert(sub.collab.post_outer, job, 0, outer(0), init(1)).error == "SubJobNotCommitted"
    assert revert(out.start_round, job).error == "NothingPosted"
    chain.advance(ROUND + 1)
    r = out.settle_round(job)
    assert not c.events(r, "RoundsRolledBack")
    holder = net.workers[2].address
    assert c.credits(holder) == p  # a miss loses the slot bond only, never P
    st = c.events(r, "RoundSettled")[0]["args"]
    assert st["sharedPot"] == slot_b - p
    # the round finished sequentially; the pipeline resumes from its ordinary post
    candidate(net, sub, job, 0)
    out.start_round(job)
    assert c.get_collab(job).ahead == 1
    assert revert(out.start_round, job).error == "PipelineFull"  # no round 2 in this job
    conserved(net)


def test_a_roll_back_never_fails_the_job_while_its_orphans_hold_the_escrow(net: Net) -> None:
    """The pipeline bond refunds a rolled-back run's reward, not its verification budget:
    that comes back only as the orphans settle. With a budget five times the reward, the
    re-run's second (speculative) round cannot be funded right after the roll-back: its
    start reverts PipelineUnfunded and the job stays live (it is not failed as a job whose
    pool ran dry would be), and once the orphans settle the same start goes through. (The
    base-round side of the rule, a base start waiting while orphans are out, is not played
    here: in this geometry the base's re-run is always funded.)"""
    c, m = net.chain.reader.collab, net.chain.reader.market
    sub, out = net.submitter, net.outsider.collab
    big = 5 * SUB_REWARD  # per sub-job
    job = post(net, terms(rounds=3, pipeline_depth=2, verification_budget=9 * big + 1))
    claim_all(net, job)
    ids0, orphans = _cheat_then_two_ahead(net, job)
    net.chain.advance(window(net) + m.market_params().dispute_grace)
    r = out.settle_round(job)
    assert c.events(r, "RoundsRolledBack")[0]["args"]["firstRound"] == 1
    redo = keccak(b"init1 without the cheat")
    candidate(net, sub, job, 0, keccak(b"outer1 redone"), redo)
    out.start_round(job)  # round 1 again: two workers' escrow, which the pool still has
    work_from(net, job, 1, redo, tag="redo")
    candidate(net, sub, job, 1, keccak(b"outer2 redone"), keccak(b"init2 redone"))
    pool = c.get_collab(job).pool
    assert pool < 2 * (SUB_REWARD + big)  # round 2's escrow is still in the orphans
    assert revert(out.start_round, job).error == "PipelineUnfunded"
    j = c.get_collab(job)
    assert (j.status, j.ahead) == (CollabStatus.RUNNING, 1)  # live, nothing failed
    conserved(net)
    for jid in orphans:
        out.settle_orphan(jid)
    assert c.get_collab(job).pool >= 2 * (SUB_REWARD + big)
    out.start_round(job)  # the same start, now funded
    assert c.get_collab(job).ahead == 2 and all(sub_jobs(net, job, 2)[:2])
    conserved(net)


def _fund(net: Net, who: ChainClient, job: CollabId, posts: int = 2) -> None:
    net.chain.set_balance(who.address, 10**20)
    net.submitter.token.transfer(who.address, posts * bonds(net, job)[1])


def test_an_invalid_speculative_candidate_rolls_back_only_the_rounds_after_it(net: Net) -> None:
    """A wrong candidate for a speculative round is challenged from its post, while the base
    still runs: the base's settlement waits for the verdict; Invalid removes the candidate
    (its poster's outer bond and P forfeit), rolls back only the rounds built on it, refills
    the pool from P; the base and the round itself go on and the job finishes."""
    chain, c, m = net.chain, net.chain.reader.collab, net.chain.reader.market
    sub, out, liar = net.submitter, net.outsider.collab, net.outsider
    job = pipelined_job(net, 3, 2)
    _, _, p = bonds(net, job)
    bond = c.collab_params().outer_bond
    _fund(net, liar, job)
    out.start_round(job)
    work_from(net, job, 0, init(0))
    candidate(net, sub, job, 0)
    out.start_round(job)
    work_from(net, job, 1, init(1))
    forged = keccak(b"forged init")
    candidate(net, liar, job, 1, keccak(b"forged"), forged)  # speculative and wrong
    out.start_round(job)  # round 2, on the forged state
    orphans = sub_jobs(net, job, 2)
    assert all(m.get_job(jid).init_state_hash == forged for jid in orphans)
    work_from(net, job, 2, forged, slots=[0])
    case = _open_challenge(net, job, sub, r=1)  # speculative: challengeable at once
    _vote(net, {case: False})
    chain.advance(window(net))
    # the base's settlement could run now, but a live challenge of a round in flight holds it
    e = revert(out.settle_round, job)
    assert (e.error, e.error_args) == ("ChallengeLive", {"jobId": job, "round": 1})
    conserved(net)
    pool0 = c.get_collab(job).pool
    credits0 = c.credits(sub.address)
    r = out.resolve_outer(job, 1)
    assert c.events(r, "OuterResolved")[0]["args"]["verdict"] == OuterVerdict.INVALID
    rb = c.events(r, "RoundsRolledBack")[0]["args"]
    assert (rb["firstRound"], rb["lastRound"], rb["reason"], rb["poolRefund"]) == \
        (2, 2, 1, 3 * SUB_REWARD)
    assert not c.events(r, "OuterWithdrawn")  # round 2 had no candidate
    assert c.get_collab(job).pool - pool0 == 3 * SUB_REWARD
    assert c.credits(sub.address) - credits0 == 2 * bond - bond // 2 + p - 3 * SUB_REWARD
    j = c.get_collab(job)
    assert (j.round, j.phase, j.ahead) == (0, RoundPhase.RUNNING, 1)
    assert c.orphans_of(job) == 3
    # only round 2 is gone: round 0's candidate and round 1's sub-jobs stand
    assert c.get_round(job, 0).poster == sub.address
    assert all(sub_jobs(net, job, 1)) and sub_jobs(net, job, 2) == [0, 0, 0]
    rd1 = c.get_round(job, 1)
    assert (rd1.poster, rd1.last_verdict) == (ZERO, OuterVerdict.INVALID)
    conserved(net)

    # the base settles and is accepted at once (its window from post is long over); round 1
    # is re-posted honestly and round 2 restarts on it
    r = out.settle_round(job)
    assert not c.events(r, "RoundsRolledBack")
    out.accept_outer(job, 0)
    j = c.get_collab(job)
    assert (j.round, j.phase, j.ahead) == (1, RoundPhase.RUNNING, 0)
    candidate(net, sub, job, 1)
    out.start_round(job)
    assert all(sub_jobs(net, job, 2)) and set(sub_jobs(net, job, 2)).isdisjoint(orphans)
    for jid in orphans:
        out.settle_orphan(jid)
        conserved(net)
    assert c.orphans_of(job) == 0
    work_from(net, job, 2, init(2), tag="redo")
    chain.advance(max(window(net), c.collab_params().outer_window))
    out.settle_round(job)
    out.accept_outer(job, 1)
    chain.advance(window(net))
    out.settle_round(job)
    candidate(net, sub, job, 2)
    chain.advance(c.collab_params().outer_window)
    out.accept_outer(job, 2)
    assert c.get_collab(job).status == CollabStatus.FINISHED
    assert c.credits(liar.address) == 0  # its outer bond and P forfeit
    for who in [sub, *net.workers, *net.verifiers]:
        if c.credits(who.address):
            who.collab.withdraw()
    assert c.total_owed() == 0 and chain.reader.token.balance_of(c.address) == 0
    conserved(net)


def test_a_speculative_challenge_holds_the_settlement_that_would_roll_it_back(net: Net) -> None:
    """Round 1's candidate is challenged while round 0 carries a forged delta. The forged
    sub-job is condemned before the jury decides; round 0's settlement (which would roll
    round 1 back) waits for the verdict, so the verdict lands on a round still in flight,
    and only then does the settlement roll rounds 1 and 2 back."""
    chain, c, m = net.chain, net.chain.reader.collab, net.chain.reader.market
    mp = m.market_params()
    sub, out, poster, cheat = net.submitter, net.outsider.collab, net.outsider, net.workers[2]
    job = pipelined_job(net, 3, 2)
    _fund(net, poster, job)
    out.start_round(job)
    ids0 = sub_jobs(net, job, 0)
    work_from(net, job, 0, init(0), slots=[0, 1])
    cheat.market.claim_job(ids0[2])
    leaves, tree = fake_trace(ids0[2], SEGS, K, tag="cheat", init=init(0))
    cheat.market.commit_trace(ids0[2], leaves, tree)
    candidate(net, sub, job, 0)
    out.start_round(job)
    work_from(net, job, 1, init(1))
    candidate(net, poster, job, 1)  # right given theta_1, which holds the forged delta
    out.start_round(job)
    work_from(net, job, 2, init(2))
    case = _open_challenge(net, job, sub, r=1)
    # the forged run is disputed and condemned while the jury votes
    chain.extra(11, 1_000 * TOKEN)
    v = chain.join(11, VERIFIER, 500 * TOKEN)
    did = v.market.challenge(ids0[2], 0, leaves[0], tree.proof(0), leaves[1], tree.proof(1))
    _vote(net, {case: True})
    chain.advance(max(int(chain.reader.dispute.call("params").clock) + 1,
                      window(net) + mp.dispute_grace))
    r = net.outsider.dispute.timeout(did)
    assert m.events(r, "DisputeResolved")[0]["args"]["verdict"] == Verdict.SOLVER_TIMED_OUT
    e = revert(out.settle_round, job)
    assert (e.error, e.error_args) == ("ChallengeLive", {"jobId": job, "round": 1})
    r = out.resolve_outer(job, 1)
    assert c.events(r, "OuterResolved")[0]["args"]["verdict"] == OuterVerdict.VALID
    assert not c.events(r, "RoundsRolledBack")
    assert c.get_round(job, 1).poster == poster.address and c.get_collab(job).ahead == 2
    conserved(net)
    r = out.settle_round(job)
    rb = c.events(r, "RoundsRolledBack")[0]["args"]
    assert (rb["firstRound"], rb["lastRound"], rb["reason"]) == (1, 2, 0)
    assert [e["args"]["round"] for e in c.events(r, "OuterWithdrawn")] == [0, 1]
    j = c.get_collab(job)
    assert (j.round, j.phase, j.ahead) == (0, RoundPhase.OUTER, 0)
    assert c.is_excluded(job, cheat.address)
    conserved(net)


def test_a_valid_speculative_candidate_is_accepted_in_order_without_a_fresh_window(
        net: Net) -> None:
    """Round 1's candidate is challenged from its post and found Valid while round 0 is the
    base; acceptOuter(0) gives it no fresh window, so once round 1 settles it is accepted
    at once (its window from its post, or the verdict's half window, long over)."""
    chain, c = net.chain, net.chain.reader.collab
    sub, out, poster = net.submitter, net.outsider.collab, net.outsider
    job = pipelined_job(net, 2, 1)
    _, outer_b, _ = bonds(net, job)
    bond = c.collab_params().outer_bond
    _fund(net, poster, job)
    out.start_round(job)
    work_from(net, job, 0, init(0))
    candidate(net, sub, job, 0)
    out.start_round(job)
    work_from(net, job, 1, init(1))
    candidate(net, poster, job, 1)
    assert revert(poster.collab.challenge_outer, job, 1).error == "PosterCannotChallenge"
    case = _open_challenge(net, job, sub, r=1)
    _, r = _finish_jury(net, job, case, vote=True, r=1)
    assert c.events(r, "OuterResolved")[0]["args"]["verdict"] == OuterVerdict.VALID
    rd1 = c.get_round(job, 1)
    assert (rd1.poster, rd1.last_verdict) == (poster.address, OuterVerdict.VALID)
    assert revert(out.accept_outer, job, 1).error == "WrongRound"  # in order: base first
    chain.advance(window(net))
    out.settle_round(job)
    out.accept_outer(job, 0)
    j = c.get_collab(job)
    assert (j.round, j.phase, j.ahead) == (1, RoundPhase.RUNNING, 0)
    assert c.get_round(job, 1).window_end == rd1.window_end <= chain.timestamp()
    chain.advance(window(net))
    out.settle_round(job)
    r = out.accept_outer(job, 1)  # no outer window to wait for
    assert c.events(r, "OuterAccepted")[0]["args"]["round"] == 1
    assert c.get_collab(job).status == CollabStatus.FINISHED
    # the poster: its bonds back and the challenger's bond less the jurors' half
    assert c.credits(poster.address) == outer_b + bond - bond // 2
    conserved(net)


def test_an_invalid_verdict_waits_for_a_later_rounds_live_challenge(net: Net) -> None:
    """A verdict never lands on a rolled-back round: with round 1's candidate under
    challenge, the Invalid verdict on round 0's (which rolls round 1 back) cannot be applied
    (`ChallengeLive`) until round 1's case is resolved; then it rolls round 1 back."""
    c = net.chain.reader.collab
    sub, out, liar, other = net.submitter, net.outsider.collab, net.outsider, net.workers[0]
    job = pipelined_job(net, 2, 1)
    _, outer_b, _ = bonds(net, job)
    _fund(net, liar, job)
    out.start_round(job)
    work_from(net, job, 0, init(0))
    forged = keccak(b"forged init")
    candidate(net, liar, job, 0, keccak(b"forged"), forged)
    out.start_round(job)
    work_from(net, job, 1, forged)
    candidate(net, sub, job, 1)
    case0 = _open_challenge(net, job, sub, r=0)
    case1 = _open_challenge(net, job, other, r=1)
    _vote(net, {case0: False, case1: True})
    e = revert(out.resolve_outer, job, 0)
    assert (e.error, e.error_args) == ("ChallengeLive", {"jobId": job, "round": 1})
    assert c.get_collab(job).ahead == 1
    r = out.resolve_outer(job, 1)
    assert c.events(r, "OuterResolved")[0]["args"]["verdict"] == OuterVerdict.VALID
    conserved(net)
    credits0 = c.credits(sub.address)
    r = out.resolve_outer(job, 0)
    assert c.events(r, "OuterResolved")[0]["args"]["verdict"] == OuterVerdict.INVALID
    rb = c.events(r, "RoundsRolledBack")[0]["args"]
    assert (rb["firstRound"], rb["lastRound"], rb["reason"]) == (1, 1, 1)
    assert [e["args"]["round"] for e in c.events(r, "OuterWithdrawn")] == [1]
    assert c.credits(sub.address) - credits0 > outer_b  # its round-1 bonds back, and more
    j = c.get_collab(job)
    assert (j.round, j.phase, j.ahead) == (0, RoundPhase.RUNNING, 0)
    assert c.get_round(job, 0).poster == ZERO
    conserved(net)


def test_a_sybil_chain_of_challenges_delays_a_right_candidate_one_bond_per_link(
        net: Net) -> None:
    """The delay attack on a pipelined post (issue 35's hold), played with three sybil
    addresses against a right candidate of the base round. One link at a time: a second
    challenge while one is live is refused, and so is an address's second challenge of the
    same post. Each link holds the base's settlement while its jury sits, costs its sybil
    the outer bond (half to the majority jurors, half to the poster) and reopens the post
    for at least half an outer window. So the delay grows by one jury's windows plus half
    an outer window per address, each paid for in full, and it stops with the addresses:
    then the round settles and the candidate is accepted, the poster richer by half a bond
    per link, and every contract's books balance."""
    chain, c, oj = net.chain, net.chain.reader.collab, net.chain.reader.outer_jury
    cp, jp = c.collab_params(), oj.jury_params()
    sub, out = net.submitter, net.outsider.collab
    bond = cp.outer_bond
    job = pipelined_job(net, 2, 1)
    _, outer_b, _ = bonds(net, job)
    out.start_round(job)
    work_from(net, job, 0, init(0))
    candidate(net, sub, job, 0)
    out.start_round(job)  # the pipeline trains round 1 ahead whatever the chain does
    work_from(net, job, 1, init(1))
    sybils = []
    for i in (10, 11, 12):
        s = chain.extra(i, bond)
        chain.set_balance(s.address, 10**20)
        sybils.append(s)
    jurors = {v.address for v in net.verifiers}
    juror_credits0 = sum(c.credits(a) for a in jurors)
    poster_credits0 = c.credits(sub.address)
    first_end = c.get_round(job, 0).window_end
    for n, s in enumerate(sybils, start=1):
        case = _open_challenge(net, job, s, r=0)
        assert revert(out.settle_round, job).error == "ChallengeLive"
        other = sybils[n % len(sybils)]
        other.token.approve(c.address, bond)
        assert revert(other.collab.challenge_outer, job, 0).error == "ChallengeLive"
        _, r = _finish_jury(net, job, case, vote=True, r=0)
        verdict = c.events(r, "OuterResolved")[0]["args"]
        assert verdict["verdict"] == OuterVerdict.VALID
        now = chain.timestamp()
        assert verdict["windowEnd"] >= now + cp.outer_window // 2 - 1  # the post reopens
        assert chain.reader.token.balance_of(s.address) == 0 and c.credits(s.address) == 0
        assert c.credits(sub.address) - poster_credits0 == n * (bond - bond // 2)
        # its address is spent on this post, bond or not
        chain.extra(10 + n - 1, bond)
        s.token.approve(c.address, bond)
        e = revert(s.collab.challenge_outer, job, 0)
        assert (e.error, e.error_args) == ("AlreadyChallenged", {"challenger": s.address})
        conserved(net)
    # the delay is what the links bought: past the first window by at least the last
    # half window, and the jurors were paid half a bond per link
    assert c.get_round(job, 0).window_end > first_end
    assert sum(c.credits(a) for a in jurors) - juror_credits0 == len(sybils) * (bond // 2)
    chain.advance(window(net))  # round 0's runs are due
    out.settle_round(job)
    end = c.get_round(job, 0).window_end
    if chain.timestamp() < end:
        assert revert(out.accept_outer, job, 0).error == "OuterWindowOpen"
        chain.advance(end - chain.timestamp() + 1)
    r = out.accept_outer(job, 0)
    assert c.events(r, "OuterAccepted")[0]["args"]["round"] == 0
    # without the chain, acceptance was due at first_end: each link bought a jury's windows
    assert chain.timestamp() - first_end \
        >= len(sybils) * (jp.commit_window + jp.reveal_window)
    j = c.get_collab(job)
    assert (j.round, j.phase, j.ahead) == (1, RoundPhase.RUNNING, 0)
    assert c.credits(sub.address) - poster_credits0 \
        == outer_b + len(sybils) * (bond - bond // 2)
    conserved(net)
