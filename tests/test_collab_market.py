"""CollabMarket against anvil: collaborative jobs whose every (round, slot) inner run is a
JobMarket job reserved for the slot holder. Real flows: slots, rounds, sub-jobs claimed and
committed with real Merkle proofs, settlement through the market (accepted, missed,
condemned), the outer state's first-poster + jury challenge, throughput caps, payments and
conservation of both markets after every step."""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

import pytest
from eth_utils import keccak

from devnet.params import TOKEN
from devnet.testing import FAKE_INIT, LocalChain, expect_revert, fake_trace, job_terms
from node.chain.client import ChainClient
from node.chain.contracts import (
    SOLVER,
    VERIFIER,
    ChallengePhase,
    CollabStatus,
    CollabTerms,
    JobStatus,
    JuryPhase,
    OuterVerdict,
    RoundPhase,
    Verdict,
)
from node.chain.ids import CaseId, CollabId, JobId
from node.proof import sample_segments, sample_segments_with_final
from node.roles.collab_submit import collab_report
from node.roles.leafserve import sample_size_of

revert = expect_revert

SUB_REWARD, SUB_BUDGET = 10 * TOKEN, 3 * TOKEN
H, K = 10, 5  # inner steps, checkpoint interval: 2 segments per inner run
SEGS = H // K
ROUND = 600  # seconds per round
OUTER0 = keccak(b"outer0")
VSTAKE = 200 * TOKEN  # = the devnet's sortition cap: every eligible draw is accepted
RATE = 1_000  # claimed milli-steps/s, well above H * 1000 / ROUND = 17 per slot
BPS = 10_000
BURN = "0x000000000000000000000000000000000000dEaD"


def outer(r: int) -> bytes:
    return keccak(f"outer{r + 1}".encode())


def init(r: int) -> bytes:
    """S_0 of round r's inner runs."""
    return FAKE_INIT if r == 0 else keccak(f"init{r}".encode())


@dataclass
class Net:
    chain: LocalChain
    submitter: ChainClient
    workers: list[ChainClient]
    verifiers: list[ChainClient]
    outsider: ChainClient

    def by_address(self, addr: str) -> ChainClient:
        return next(c for c in self.chain.clients if c.address == addr)


def solver(chain: LocalChain, i: int) -> ChainClient:
    """A registered solver that has allowed the CollabMarket its slot bonds."""
    w = chain.join(i, SOLVER, 500 * TOKEN)
    w.token.approve(w.collab.address, 1_000 * TOKEN)
    return w


def fresh_solver(chain: LocalChain, i: int) -> ChainClient:
    """A registered solver past the deployment's funded accounts (``i`` >= 10)."""
    chain.extra(i, 1_000 * TOKEN)
    return solver(chain, i)


def make_net(chain: LocalChain) -> Net:
    """3 workers, 4 verifiers, the submitter, an outsider."""
    return Net(chain, submitter=chain[5],
               workers=[solver(chain, i) for i in (1, 2, 3)],
               verifiers=[chain.join(i, VERIFIER, VSTAKE) for i in (4, 6, 7, 8)],
               outsider=chain[9])


@pytest.fixture
def net(chain: LocalChain) -> Net:
    return make_net(chain)


def terms(rounds: int = 2, min_workers: int = 2, max_workers: int = 3, **kw: Any) -> CollabTerms:
    n = rounds * max_workers
    base = CollabTerms(spec_hash=keccak(b"spec"), dataset_hash=keccak(b"dataset"),
                       reward=n * SUB_REWARD + 5, verification_budget=n * SUB_BUDGET + 1,
                       min_workers=min_workers, max_workers=max_workers, inner_steps=H,
                       steps_per_segment=K, rounds=rounds, round_duration=ROUND,
                       init_state_hash=init(0), outer_init_hash=OUTER0)
    return replace(base, **kw)


def post(net: Net, t: CollabTerms) -> CollabId:
    return net.submitter.post_collab_job(t)


def conserved(net: Net) -> None:
    r = net.chain.reader
    for b in (r.registry, r.market, r.dispute, r.collab):
        assert r.token.balance_of(b.address) == int(b.call("totalOwed")), b.name
    # INVARIANT of the OuterJury: what a tally slashes leaves in the same call.
    assert r.token.balance_of(r.outer_jury.address) == 0


def sub_jobs(net: Net, job: CollabId, r: int) -> list[JobId]:
    return net.chain.reader.collab.get_round(job, r).sub_jobs


def work(net: Net, job: CollabId, r: int, slots: list[int] | None = None) -> None:
    """Each chosen slot's holder claims its reserved sub-job, commits a trace from the
    round's S_0 (real Merkle root and proofs) and puts its sampled segments' leaves on
    chain: the evidence its run is paid on with no committee attesting (issue 30)."""
    ids = sub_jobs(net, job, r)
    for slot, jid in enumerate(ids):
        if jid == 0 or (slots is not None and slot not in slots):
            continue
        w = net.by_address(net.chain.reader.market.reserved_solver_of(jid))
        w.market.claim_job(jid)
        leaves, tree = fake_trace(jid, SEGS, K, tag=f"r{r}s{slot}", init=init(r))
        w.market.commit_trace(jid, leaves, tree)
        net.chain.publish_sample(w, jid, leaves, tree)


def window(net: Net) -> int:
    return net.chain.reader.market.market_params().verification_window


def bond_of(net: Net) -> int:
    return net.chain.reader.collab.collab_params().outer_bond


def slot_bond(net: Net) -> int:
    return net.chain.reader.collab.collab_params().slot_bond


def post_outer(net: Net, who: ChainClient, job: CollabId, r: int, h: bytes | None = None) -> None:
    who.token.approve(who.collab.address, bond_of(net))
    who.collab.post_outer(job, r, h or outer(r), init(r + 1))


def accept_outer(net: Net, job: CollabId, r: int) -> None:
    net.chain.advance(net.chain.reader.collab.collab_params().outer_window)
    net.outsider.collab.accept_outer(job, r)


def honest_round(net: Net, job: CollabId, r: int) -> None:
    c = net.outsider.collab
    c.start_round(job)
    work(net, job, r)
    net.chain.advance(window(net))
    c.settle_round(job)
    post_outer(net, net.submitter, job, r)
    accept_outer(net, job, r)


def claim_all(net: Net, job: CollabId) -> None:
    for w in net.workers:
        w.collab.claim_slot(job, 1, RATE)


def settled_one_round_job(net: Net) -> CollabId:
    """A one-round job whose three slots worked their sub-jobs, settled: its outer
    state is next (phase Outer, nothing posted)."""
    job = post(net, terms(rounds=1))
    claim_all(net, job)
    net.outsider.collab.start_round(job)
    work(net, job, 0)
    net.chain.advance(window(net))
    net.outsider.collab.settle_round(job)
    return job


# --- (a) the honest job -----------------------------------------------------------------


def test_honest_three_slot_two_round_job(net: Net) -> None:
    chain, sub, c = net.chain, net.submitter, net.chain.reader.collab
    m = chain.reader.market
    t = terms()
    before = sub.token.balance_of(sub.address)
    job = post(net, t)
    assert job == c.collab_count() == 1
    j = c.get_collab(job)
    assert (j.status, j.phase, j.sub_reward, j.sub_budget, j.pool) == \
        (CollabStatus.OPEN, RoundPhase.IDLE, SUB_REWARD, SUB_BUDGET,
         t.reward + t.verification_budget)
    assert (j.outer_hash, j.init_state_hash) == (OUTER0, FAKE_INIT)
    conserved(net)
    assert revert(net.outsider.collab.start_round, job).error == "TooFewWorkers"
    for i, w in enumerate(net.workers):
        assert w.collab.claim_slot(job, 1, RATE) == [i]
    assert c.slot_holders(job) == [w.address for w in net.workers]
    assert c.claimed_of(net.workers[0].address) == RATE

    for r in range(2):
        r_start = net.outsider.collab.start_round(job)
        ids = sub_jobs(net, job, r)
        assert len(ids) == 3 and all(ids)
        ev = c.events(r_start, "RoundStarted")[0]["args"]
        assert (ev["round"], list(ev["subJobs"])) == (r, ids)
        for slot, jid in enumerate(ids):
            mj = m.get_job(jid)
            assert (mj.submitter, mj.reward, mj.verification_budget, mj.total_steps,
                    mj.steps_per_segment, mj.init_state_hash, mj.solve_duration) == \
                (c.address, SUB_REWARD, SUB_BUDGET, H, K, init(r), ROUND)
            assert m.reserved_solver_of(jid) == net.workers[slot].address
            ref = c.sub_job_of(jid)
            assert (ref.collab_job_id, ref.round, ref.slot) == (job, r, slot)
        rd = c.get_round(job, r)
        assert rd.deadline == rd.start + ROUND and c.get_collab(job).phase == RoundPhase.RUNNING
        assert revert(net.outsider.collab.start_round, job).error == "WrongRoundPhase"
        conserved(net)
        work(net, job, r)
        e = revert(net.outsider.collab.settle_round, job)  # windows still open
        assert (e.error, e.error_args) == ("RoundNotSettled", {"marketJobId": ids[0]})
        assert revert(net.submitter.collab.post_outer, job, r, outer(r), init(r + 1)).error \
            == "WrongRoundPhase"
        chain.advance(window(net))
        rs = net.outsider.collab.settle_round(job)
        st = c.events(rs, "RoundSettled")[0]["args"]
        assert (st["acceptedMask"], st["accepted"], st["sharedPot"]) == (0b111, 3, 0)
        for jid in ids:
            assert m.get_job(jid).status == JobStatus.FINALIZED
        for w in net.workers:
            assert c.delivered_of(w.address) > 0
        rd = c.get_round(job, r)
        assert rd.settled and rd.accepted_slots() == [0, 1, 2]
        assert c.get_collab(job).phase == RoundPhase.OUTER
        conserved(net)
        assert revert(net.outsider.collab.accept_outer, job, r).error == "NothingPosted"
        post_outer(net, sub, job, r)
        e = revert(net.outsider.collab.post_outer, job, r, outer(r), init(r + 1))
        assert e.error == "AlreadyPosted"
        assert revert(net.outsider.collab.accept_outer, job, r).error == "OuterWindowOpen"
        conserved(net)
        accept_outer(net, job, r)
        rd = c.get_round(job, r)
        assert rd.accepted and rd.outer_hash == outer(r)
        conserved(net)
    j = c.get_collab(job)
    assert (j.status, j.round, j.outer_hash, j.pool) == (CollabStatus.FINISHED, 2, outer(1), 0)
    assert revert(net.outsider.collab.start_round, job).error == "CollabNotLive"
    # each worker: two accepted inner runs, paid by the market; the submitter: the rest
    for w in net.workers:
        assert m.credits(w.address) == 2 * SUB_REWARD
        assert w.market.withdraw() == 2 * SUB_REWARD
        assert w.registry.locked_stake(w.address) == 0
        # the job is over: its slot's bond comes back, the slot is freed
        assert c.credits(w.address) == slot_bond(net)
        assert w.collab.withdraw() == slot_bond(net)
    assert not any(int(h, 16) for h in c.slot_holders(job))
    refund = t.reward + t.verification_budget - 6 * SUB_REWARD  # nobody attested: budget back
    assert c.credits(sub.address) == refund + 2 * bond_of(net)  # + its two outer bonds
    assert sub.collab.withdraw() == refund + 2 * bond_of(net)
    assert sub.token.balance_of(sub.address) == before - 6 * SUB_REWARD
    assert c.total_owed() == 0 and m.credits(c.address) == 0
    conserved(net)
    # What `polnet job status --collab` prints, from the chain alone.
    rep = collab_report(net.chain.reader, job)
    assert (rep["status"], rep["rounds"]) == ("finished", 2)
    assert [(h["round"], h["accepted"], h["dropped"]) for h in rep["history"]] == \
        [(0, [0, 1, 2], []), (1, [0, 1, 2], [])]
    assert rep["model_outer_hash"] == "0x" + outer(1).hex()
    assert rep["history"][1]["outer_hash"] == "0x" + outer(1).hex()


# --- (b) reserved sub-jobs --------------------------------------------------------------


def test_strangers_cannot_claim_or_settle_a_reserved_sub_job(net: Net) -> None:
    chain = net.chain
    job = post(net, terms())
    claim_all(net, job)
    net.outsider.collab.start_round(job)
    ids = sub_jobs(net, job, 0)
    w0, w1 = net.workers[0], net.workers[1]
    e = revert(w1.market.claim_job, ids[0])
    assert (e.error, e.error_args) == ("NotReservedSolver", {"jobId": ids[0],
                                                             "caller": w1.address})
    for who in (net.outsider, w0, net.submitter):
        e = revert(who.market.cancel, ids[0])
        assert (e.error, e.error_args) == ("OnlySubmitter", {"jobId": ids[0],
                                                             "caller": who.address})
    work(net, job, 0, slots=[0])
    w1.market.claim_job(ids[1])
    chain.advance(ROUND + window(net) + 5)
    e = revert(net.outsider.market.finalize, ids[0])
    assert e.error == "OnlySubmitter"
    assert revert(w0.market.finalize, ids[0]).error == "OnlySubmitter"
    assert revert(net.outsider.market.reclaim, ids[1]).error == "OnlySubmitter"
    # ordinary jobs are untouched: anyone still claims, finalizes, reclaims them
    sub = net.submitter
    sub.token.approve(sub.market.address, 10**24)
    plain = sub.market.post_job(job_terms(reward=SUB_REWARD, budget=0))
    assert chain.reader.market.reserved_solver_of(plain) == "0x" + "00" * 20
    ref = chain.reader.collab.sub_job_of(plain)
    assert (ref.collab_job_id, ref.round, ref.slot) == (0, 0, 0)  # not an inner run
    w1.market.claim_job(plain)
    chain.advance(3700)
    net.outsider.market.reclaim(plain)
    conserved(net)


def test_reserved_job_reopens_reserved(net: Net) -> None:
    """A reserved job posted directly (the contract is for any submitter) stays reserved
    after a reclaim reopens it."""
    sub, w0, w1 = net.submitter, net.workers[0], net.workers[1]
    m = sub.market
    sub.token.approve(m.address, 10**24)
    jid = m.post_reserved_job(job_terms(reward=SUB_REWARD, budget=0), w0.address)
    assert revert(m.post_reserved_job, job_terms(), "0x" + "00" * 20).error == "ZeroAddress"
    w0.market.claim_job(jid)
    net.chain.advance(3700)
    assert revert(net.outsider.market.reclaim, jid).error == "OnlySubmitter"
    m.reclaim(jid)
    assert m.get_job(jid).status == JobStatus.OPEN
    assert revert(w1.market.claim_job, jid).error == "NotReservedSolver"
    w0.market.claim_job(jid)
    conserved(net)


def test_a_reserved_job_samples_its_final_segment_and_few_others(net: Net) -> None:
    """A reserved sub-job (an inner run) is sampled as its final segment plus
    ``reservedSampleCount`` of the others, not the ordinary job's n: an inner run of S
    segments costs a committee (1 + n_r) / S of its training, not all of it. The attack
    it must not open: a worker that trains honestly but commits forged final weights
    (a scaled delta, or any poison) would pass whenever the sample missed the final
    segment; it never does, whatever the seed."""
    chain, m = net.chain, net.chain.reader.market
    mp = m.market_params()
    n_r, segments = mp.reserved_sample_count, 12
    assert 1 + n_r < segments  # a strict subset of the sub-job
    sub = net.submitter
    sub.token.approve(sub.market.address, 10**24)
    for i, w in enumerate(net.workers):
        jid = sub.market.post_reserved_job(job_terms(reward=SUB_REWARD, budget=0,
                                                     segments=segments), w.address)
        plain = sub.market.post_job(job_terms(reward=SUB_REWARD, budget=0, segments=segments))
        for job, by in ((jid, w), (plain, net.workers[(i + 1) % 3])):
            by.market.claim_job(job)
            by.market.commit_trace(job, *fake_trace(job, segments, tag=f"w{i}-{job}"))
        chain.mine(m.get_job(plain).sample_block - chain.w3.eth.block_number + 1)
        for job in (jid, plain):
            net.outsider.market.fix_seed(job)
        got = m.sampled_segments(jid)
        assert got == sample_segments_with_final(m.seed_of(jid), segments, n_r)
        assert got[0] == segments - 1 and len(set(got)) == len(got) == 1 + n_r
        assert m.sampled_segments(plain) == sample_segments(m.seed_of(plain), segments,
                                                            mp.sample_count)
        # the solver sizes its sparse checkpoints (keep_every_for) for what is sampled
        for job in (jid, plain):
            assert sample_size_of(net.chain.reader, job) == len(m.sampled_segments(job))
    conserved(net)


# --- (c) a missed deadline ----------------------------------------------------------------


def test_missed_deadline_drops_the_worker_and_shares_its_slash(net: Net) -> None:
    """An honest worker that claims its sub-job and misses the deadline once: it loses the
    market's missed-deadline share of its sub-job bond and its slot bond (issue 30 item 5:
    before, the slot bond came back), both to the round's accepted workers, and its
    delivered record; the job goes on, and it rejoins with one slot."""
    chain, c, m = net.chain, net.chain.reader.collab, net.chain.reader.market
    b = slot_bond(net)
    mp = m.market_params()
    job = post(net, terms())
    late = net.workers[2]
    bal0 = late.token.balance_of(late.address)
    claim_all(net, job)
    net.outsider.collab.start_round(job)
    ids = sub_jobs(net, job, 0)
    work(net, job, 0, slots=[0, 1])
    late.market.claim_job(ids[2])  # ... and never commits
    bond = SUB_REWARD * mp.bond_factor_bps // BPS
    assert late.registry.locked_stake(late.address) == bond
    chain.advance(ROUND // 2)
    assert revert(net.outsider.collab.settle_round, job).error == "RoundNotSettled"
    chain.advance(ROUND)
    r = net.outsider.collab.settle_round(job)
    slashed = bond * mp.missed_deadline_slash_bps // BPS
    drop = c.events(r, "SubJobDropped")[0]["args"]
    assert (drop["slot"], drop["worker"], drop["reason"]) == (2, late.address, 0)
    st = c.events(r, "RoundSettled")[0]["args"]
    assert (st["acceptedMask"], st["sharedPot"], st["perWorker"]) == \
        (0b011, slashed + b, (slashed + b) // 2)
    for w in net.workers[:2]:  # part of its sub-job bond and its slot bond to the others
        assert c.credits(w.address) == (slashed + b) // 2
    assert not c.events(r, "WorkerExcluded")  # a miss is not a proven wrong
    assert late.registry.locked_stake(late.address) == 0
    assert late.registry.free_stake(late.address) == 500 * TOKEN - slashed
    assert c.slot_holders(job)[2] == "0x" + "00" * 20  # its slot is freed
    assert c.credits(late.address) == 0  # its slot bond is gone
    assert not c.is_excluded(job, late.address) and c.delivered_of(late.address) == 0
    assert m.get_job(ids[2]).status == JobStatus.CANCELLED
    assert c.get_collab(job).phase == RoundPhase.OUTER  # 2 >= minWorkers: the round holds
    conserved(net)
    post_outer(net, net.submitter, job, 0)
    accept_outer(net, job, 0)
    # it claims a slot again (one: its record is gone), with a new bond, and rejoins
    assert late.collab.claim_slot(job, 1, RATE) == [2]
    honest_round(net, job, 1)
    assert c.get_round(job, 1).accepted_slots() == [0, 1, 2]
    assert c.get_collab(job).status == CollabStatus.FINISHED
    assert m.credits(late.address) == SUB_REWARD
    for w in net.workers[:2]:  # + its slot bond: the job is over
        assert w.collab.withdraw() == (slashed + b) // 2 + b
    assert late.collab.withdraw() == b  # its second bond only: the first is gone
    assert late.token.balance_of(late.address) == bal0 - b
    conserved(net)


# --- (d) quorum, retries, failure ------------------------------------------------------------


def test_below_min_workers_retries_then_fails_and_refunds(net: Net) -> None:
    chain, c = net.chain, net.chain.reader.collab
    t = terms(max_workers=3, min_workers=2)
    job = post(net, t)
    w0, w1 = net.workers[0], net.workers[1]
    w0.collab.claim_slot(job, 1, RATE)
    w1.collab.claim_slot(job, 1, RATE)
    retries = c.collab_params().max_round_retries
    for attempt in range(retries + 1):
        net.outsider.collab.start_round(job)
        assert c.get_round(job, 0).attempt == attempt
        work(net, job, 0, slots=[0])  # slot 1 never claims its sub-job
        chain.advance(ROUND + 1)
        r = net.outsider.collab.settle_round(job)
        drop = c.events(r, "SubJobDropped")[0]["args"]
        assert (drop["slot"], drop["reason"]) == (1, 2)
        conserved(net)
        j = c.get_collab(job)
        if attempt < retries:
            assert (j.status, j.phase, j.round, j.retries) == \
                (CollabStatus.RUNNING, RoundPhase.IDLE, 0, attempt + 1)
            assert c.events(r, "RoundRetried")
            assert revert(net.outsider.collab.start_round, job).error == "TooFewWorkers"
            w1.collab.claim_slot(job, 1, RATE)  # a new bond each time
    j = c.get_collab(job)
    assert j.status == CollabStatus.FAILED and j.pool == 0
    ev = c.events(r, "CollabFailed")[0]["args"]
    # the three accepted inner runs were paid (they did the work); the rest comes back
    assert ev["refund"] == t.reward + t.verification_budget - 3 * SUB_REWARD
    assert c.credits(net.submitter.address) == ev["refund"]
    assert chain.reader.market.credits(w0.address) == 3 * SUB_REWARD
    assert revert(w1.collab.claim_slot, job, 1, RATE).error == "CollabNotLive"
    assert revert(net.outsider.collab.settle_round, job).error == "CollabNotLive"
    assert revert(net.outsider.collab.post_outer, job, 0, outer(0), init(1)).error == \
        "CollabNotLive"
    net.submitter.collab.withdraw()
    conserved(net)


# --- (e) the outer state: first poster + jury challenge ---------------------------------------


def _challenge_and_draw(net: Net, job: CollabId, r: int,
                        challenger: ChainClient) -> tuple[CaseId, list[Any]]:
    """Challenge the posted outer state and draw its OuterJury case: (case id, jury)."""
    chain, c, oj = net.chain, net.chain.reader.collab, net.chain.reader.outer_jury
    jp = oj.jury_params()
    challenger.token.approve(c.address, c.collab_params().outer_bond)
    challenger.collab.challenge_outer(job, r)
    rd = c.get_round(job, r)
    assert (rd.challenge_phase, rd.challenger) == (ChallengePhase.LIVE, challenger.address)
    case = rd.jury_case
    assert oj.get_case(case).phase == JuryPhase.DRAWING
    assert revert(net.outsider.outer_jury.draw, case).error == "JuryNotReady"
    chain.mine(jp.jury_lookahead + 1)
    net.outsider.outer_jury.draw(case)
    cs = oj.get_case(case)
    assert (cs.phase, cs.job_id, cs.round) == (JuryPhase.VOTING, job, r)
    assert len(cs.jury) == jp.jury_size
    assert rd.poster not in cs.jury and challenger.address not in cs.jury
    assert set(cs.jury) <= {v.address for v in net.verifiers}
    return case, cs.jury


def _jury_round(net: Net, job: CollabId, r: int, challenger: ChainClient, vote: bool | list[bool],
                reveal: int | None = None) -> Any:
    """Challenge the posted outer state, draw the jury, juror i votes ``vote`` (or
    ``vote[i]``; the first ``reveal`` of them reveal), resolve. Returns (jury, the
    resolve receipt)."""
    chain, oj = net.chain, net.chain.reader.outer_jury
    jp = oj.jury_params()
    case, jury = _challenge_and_draw(net, job, r, challenger)
    votes = vote if isinstance(vote, list) else [vote] * len(jury)
    salt = keccak(b"salt")
    for a, v in zip(jury, votes, strict=True):
        net.by_address(a).outer_jury.commit_vote(case, v, salt)
    assert revert(net.by_address(jury[0]).outer_jury.reveal_vote, case, votes[0], salt).error \
        == "RevealNotOpen"
    assert revert(net.outsider.outer_jury.commit_vote, case, votes[0], salt).error == "NotJuror"
    chain.advance(jp.commit_window)
    assert revert(net.by_address(jury[0]).outer_jury.reveal_vote, case, not votes[0],
                  salt).error == "BadReveal"
    for a, v in list(zip(jury, votes, strict=True))[:reveal]:
        net.by_address(a).outer_jury.reveal_vote(case, v, salt)
    assert revert(net.outsider.collab.resolve_outer, job, r).error == "RevealNotOver"
    chain.advance(jp.reveal_window)
    return jury, net.outsider.collab.resolve_outer(job, r)


def _shares(amount: int, n: int) -> list[int]:
    """How the CollabMarket splits ``amount`` over n majority jurors (dust to the first)."""
    each = amount // n
    return [amount - each * (n - 1)] + [each] * (n - 1)


def test_outer_challenge_wrong_hash_and_griefer(net: Net) -> None:
    chain, c = net.chain, net.chain.reader.collab
    cp = c.collab_params()
    bond = cp.outer_bond
    job = settled_one_round_job(net)
    cheat, sub = net.outsider, net.submitter
    chain.set_balance(cheat.address, 10**20)
    sub.token.transfer(cheat.address, 10 * bond)
    post_outer(net, cheat, job, 0, keccak(b"wrong"))
    assert revert(cheat.collab.challenge_outer, job, 0).error == "PosterCannotChallenge"
    jury, r = _jury_round(net, job, 0, sub, vote=False)
    ev = c.events(r, "OuterResolved")[0]["args"]
    assert (ev["verdict"], ev["validVotes"], ev["invalidVotes"]) == (OuterVerdict.INVALID, 0, 3)
    per = _shares(bond // 2, 3)
    assert [c.credits(a) for a in jury] == per
    assert c.credits(sub.address) == 2 * bond - bond // 2  # its bond back + the rest
    rd = c.get_round(job, 0)
    assert (rd.poster, rd.outer_hash, rd.last_verdict) == ("0x" + "00" * 20, bytes(32),
                                                           OuterVerdict.INVALID)
    assert revert(net.outsider.collab.accept_outer, job, 0).error == "NothingPosted"
    conserved(net)

    # the honest re-post; a griefer challenges it and loses its bond
    post_outer(net, sub, job, 0)
    posted = c.get_round(job, 0)
    jury2, r = _jury_round(net, job, 0, cheat, vote=True)
    ev = c.events(r, "OuterResolved")[0]["args"]
    assert (ev["verdict"], ev["validVotes"]) == (OuterVerdict.VALID, 3)
    first = dict(zip(jury, per, strict=True))
    for a, share in zip(jury2, per, strict=True):
        assert c.credits(a) == share + first.get(a, 0)
    assert c.credits(sub.address) == 2 * bond - bond // 2 + bond - bond // 2
    rd = c.get_round(job, 0)
    assert rd.poster == sub.address and rd.window_end >= chain.timestamp() + cp.outer_window // 2
    assert rd.window_end >= posted.window_end
    # the griefer cannot challenge the same post twice
    cheat.token.approve(c.address, bond)
    assert revert(cheat.collab.challenge_outer, job, 0).error == "AlreadyChallenged"
    conserved(net)
    accept_outer(net, job, 0)
    assert c.get_collab(job).status == CollabStatus.FINISHED
    assert c.get_collab(job).outer_hash == outer(0)
    conserved(net)


def test_outer_challenge_without_quorum_is_void(net: Net) -> None:
    """Too few reveals: Void, the challenger's bond back, the post stays. The silent jurors
    are slashed (the OuterJury holds the registry authority the CollabMarket lacks): their
    stake goes to the juror who revealed, or is burned when nobody did, never to the poster
    or the challenger, who could own the silent jurors and would profit from a stall."""
    chain, c, reg = net.chain, net.chain.reader.collab, net.chain.reader.registry
    bond = c.collab_params().outer_bond
    cut = net.chain.reader.outer_jury.jury_params().juror_slash
    assert cut > 0
    job = settled_one_round_job(net)
    sub, w = net.submitter, net.workers[0]
    post_outer(net, w, job, 0)
    free = {v.address: reg.free_stake(v.address) for v in net.verifiers}
    jury, r = _jury_round(net, job, 0, sub, vote=False, reveal=1)  # one reveal < quorum 2
    ev = c.events(r, "OuterResolved")[0]["args"]
    assert ev["verdict"] == OuterVerdict.VOID
    slashed = net.chain.reader.outer_jury.events(r, "JurorSlashed")
    assert [(e["args"]["juror"], e["args"]["amount"], e["args"]["burned"]) for e in slashed] \
        == [(a, cut, False) for a in jury[1:]]
    assert c.credits(sub.address) == bond and c.credits(w.address) == 0
    assert c.credits(jury[0]) == 2 * cut  # the one who revealed takes the silent ones' stake
    assert [reg.free_stake(a) for a in jury] == [free[jury[0]]] + [free[a] - cut
                                                                   for a in jury[1:]]
    assert c.get_round(job, 0).poster == w.address  # the post stays, open to others
    conserved(net)
    # another challenger; nobody draws its jury for 256 blocks: the request re-arms
    other = net.workers[1]
    other.token.approve(c.address, bond)
    other.collab.challenge_outer(job, 0)
    case = c.get_round(job, 0).jury_case
    oj = net.chain.reader.outer_jury
    chain.mine(300)
    r = net.outsider.outer_jury.draw(case)
    assert oj.events(r, "JuryRequested")
    cs = oj.get_case(case)
    assert cs.phase == JuryPhase.DRAWING and cs.request_block == r["blockNumber"]
    assert revert(net.outsider.collab.accept_outer, job, 0).error == "ChallengeLive"
    chain.mine(oj.jury_params().jury_lookahead + 1)
    net.outsider.outer_jury.draw(case)
    assert oj.get_case(case).phase == JuryPhase.VOTING
    jury2 = oj.get_case(case).jury
    assert [reg.seat_locked_stake(a) for a in jury2] == [cut] * len(jury2)  # seated
    before = {a: reg.free_stake(a) + reg.seat_locked_stake(a) for a in jury2}
    burned = net.chain.reader.token.balance_of(BURN)
    chain.advance(oj.jury_params().commit_window + oj.jury_params().reveal_window)
    r = net.outsider.collab.resolve_outer(job, 0)  # nobody voted: Void, all three burned
    assert c.events(r, "OuterResolved")[0]["args"]["verdict"] == OuterVerdict.VOID
    assert oj.get_case(case).phase == JuryPhase.TALLIED
    assert all(e["args"]["burned"] for e in oj.events(r, "JurorSlashed"))
    assert [reg.free_stake(a) + reg.seat_locked_stake(a) for a in jury2] == \
        [before[a] - cut for a in jury2]
    assert net.chain.reader.token.balance_of(BURN) == burned + len(jury2) * cut
    assert c.credits(other.address) == bond  # its bond back, none of the slashed stake
    conserved(net)
    accept_outer(net, job, 0)
    assert c.credits(w.address) == bond + slot_bond(net)  # + its slot's: the job is over
    conserved(net)


def test_a_jury_drawn_below_quorum_is_void_at_once_and_slashes_nobody(net: Net) -> None:
    """Too few eligible jurors (here every other verifier moved stake after the request,
    so the draw skips them): nobody was asked to vote, so nobody pays. The case tallies
    Void at once, the challenger's bond comes back, the post stays open."""
    chain, c, oj = net.chain, net.chain.reader.collab, net.chain.reader.outer_jury
    bond = c.collab_params().outer_bond
    job = settled_one_round_job(net)
    post_outer(net, net.workers[0], job, 0)
    sub = net.submitter
    sub.token.approve(c.address, bond)
    sub.collab.challenge_outer(job, 0)
    case = c.get_round(job, 0).jury_case
    # `polnet job status --collab` names the live challenge's jury case
    rep = collab_report(net.chain.reader, job)["history"][0]
    assert (rep["outer_challenge"], rep["jury_case"]) == \
        (f"jury case {case} drawing (0 jurors)", case)
    for v in net.verifiers[1:]:
        v.registry.request_unbond(1)  # stake moved after the request: not drawable
    stakes = {v.address: net.chain.reader.registry.free_stake(v.address) for v in net.verifiers}
    chain.mine(oj.jury_params().jury_lookahead + 1)
    r = net.outsider.outer_jury.draw(case)
    cs = oj.get_case(case)
    assert len(cs.jury) < oj.jury_params().quorum
    assert set(cs.jury) <= {net.verifiers[0].address}
    assert cs.phase == JuryPhase.VOTING and cs.commit_end == cs.reveal_end == chain.timestamp()
    assert revert(net.by_address(net.verifiers[0].address).outer_jury.commit_vote, case, True,
                  keccak(b"s")).error in ("CommitClosed", "NotJuror")
    r = net.outsider.collab.resolve_outer(job, 0)
    assert c.events(r, "OuterResolved")[0]["args"]["verdict"] == OuterVerdict.VOID
    assert not oj.events(r, "JurorSlashed")
    assert {v.address: net.chain.reader.registry.free_stake(v.address)
            for v in net.verifiers} == stakes
    assert c.credits(sub.address) == bond
    assert c.get_round(job, 0).poster == net.workers[0].address
    conserved(net)


def test_minority_and_silent_outer_jurors_pay_the_majority(net: Net) -> None:
    """A forged outer state, and a juror who votes for it without recomputing (or is the
    forger's puppet), and one who stays silent: both lose stake to the two who voted right;
    the forger loses its bond. Then the honest re-post: a juror voting against it loses."""
    c, reg = net.chain.reader.collab, net.chain.reader.registry
    bond = c.collab_params().outer_bond
    cut = net.chain.reader.outer_jury.jury_params().juror_slash
    job = settled_one_round_job(net)
    cheat, sub = net.workers[2], net.submitter
    post_outer(net, cheat, job, 0, keccak(b"forged"))
    free = {v.address: reg.free_stake(v.address) for v in net.verifiers}
    # jurors 0, 1 vote invalid; juror 2 votes valid but only the first two reveal
    jury, r = _jury_round(net, job, 0, sub, vote=[False, False, True], reveal=2)
    ev = c.events(r, "OuterResolved")[0]["args"]
    assert (ev["verdict"], ev["validVotes"], ev["invalidVotes"]) == (OuterVerdict.INVALID, 0, 2)
    assert [reg.free_stake(a) for a in jury] == [free[jury[0]], free[jury[1]],
                                                 free[jury[2]] - cut]
    assert [c.credits(a) for a in jury] == [*_shares(bond // 2 + cut, 2), 0]
    assert c.credits(sub.address) == 2 * bond - bond // 2
    assert c.credits(cheat.address) == 0
    conserved(net)
    # the honest re-post, a griefer's challenge, and a juror voting against the truth
    post_outer(net, sub, job, 0)
    griefer = net.workers[1]
    paid = {a: c.credits(a) for a in jury}
    free = {v.address: reg.free_stake(v.address) for v in net.verifiers}
    jury2, r = _jury_round(net, job, 0, griefer, vote=[True, False, True])
    ev = c.events(r, "OuterResolved")[0]["args"]
    assert (ev["verdict"], ev["validVotes"], ev["invalidVotes"]) == (OuterVerdict.VALID, 2, 1)
    assert [reg.free_stake(a) for a in jury2] == [free[jury2[0]], free[jury2[1]] - cut,
                                                  free[jury2[2]]]
    got = [c.credits(a) - paid.get(a, 0) for a in jury2]
    assert got == [_shares(bond // 2 + cut, 2)[0], 0, _shares(bond // 2 + cut, 2)[1]]
    assert c.credits(sub.address) == 2 * bond - bond // 2 + bond - bond // 2
    conserved(net)
    accept_outer(net, job, 0)
    assert c.get_collab(job).outer_hash == outer(0)
    conserved(net)


def test_only_the_collab_market_opens_and_tallies_jury_cases(net: Net) -> None:
    """A stranger cannot open a case (to have jurors drawn against anyone) or tally one
    (to slash jurors, or end a case whose bonds the CollabMarket holds); the binding is
    the deployer's, once; the registry lets the OuterJury take unlocked stake only."""
    oj, me = net.outsider.outer_jury, net.outsider.address
    e = revert(oj.transact, "open", 1, 0, me, me)
    assert (e.error, e.error_args) == ("NotCollab", {"caller": me})
    assert revert(oj.transact, "tally", 1).error == "NotCollab"
    assert revert(oj.transact, "bind", me).error == "NotDeployer"
    assert revert(net.chain[0].outer_jury.transact, "bind", me).error == "AlreadyBound"
    assert net.chain.reader.registry.call("outerJury") == oj.address
    assert net.chain.reader.outer_jury.call("collab") == net.chain.reader.collab.address
    assert revert(oj.draw, 99).error == "UnknownCase"


# --- (f) a condemned sub-job --------------------------------------------------------------


def test_condemned_worker_is_dropped_and_its_slash_share_reaches_the_others(net: Net) -> None:
    chain, c, m = net.chain, net.chain.reader.collab, net.chain.reader.market
    mp = m.market_params()
    job = post(net, terms())
    claim_all(net, job)
    net.outsider.collab.start_round(job)
    ids = sub_jobs(net, job, 0)
    work(net, job, 0, slots=[0, 1])
    cheat = net.workers[2]
    cheat.market.claim_job(ids[2])
    leaves, tree = fake_trace(ids[2], SEGS, K, tag="cheat", init=init(0))
    cheat.market.commit_trace(ids[2], leaves, tree)
    v = net.verifiers[0]
    did = v.market.challenge(ids[2], 0, leaves[0], tree.proof(0), leaves[1], tree.proof(1))
    clock = int(chain.reader.dispute.call("params").clock)
    chain.advance(clock + 1)
    r = net.outsider.dispute.timeout(did)  # the cheat never answers: its clock runs out
    assert m.events(r, "DisputeResolved")[0]["args"]["verdict"] == Verdict.SOLVER_TIMED_OUT
    assert revert(net.outsider.collab.settle_round, job).error == "RoundNotSettled"
    chain.advance(window(net) + mp.dispute_grace)
    r = net.outsider.collab.settle_round(job)
    bond = SUB_REWARD * mp.bond_factor_bps // BPS
    to_sub = bond * mp.submitter_share_bps // BPS
    drop = c.events(r, "SubJobDropped")[0]["args"]
    assert (drop["slot"], drop["worker"], drop["reason"]) == (2, cheat.address, 1)
    st = c.events(r, "RoundSettled")[0]["args"]
    assert (st["acceptedMask"], st["sharedPot"]) == (0b011, to_sub)
    for w in net.workers[:2]:
        assert c.credits(w.address) == to_sub // 2
    assert m.credits(v.address) == bond - to_sub  # the challenger, by the market
    assert cheat.registry.free_stake(cheat.address) == 500 * TOKEN - bond
    assert c.slot_holders(job)[2] == "0x" + "00" * 20
    assert m.get_job(ids[2]).status == JobStatus.CANCELLED
    assert c.delivered_of(cheat.address) == 0  # no record from a condemned run
    # ... and it is out of the job: the freed slot is not its to take again.
    assert c.is_excluded(job, cheat.address) and not c.is_excluded(job, net.workers[0].address)
    assert revert(cheat.collab.claim_slot, job, 1, 10**9).error == "ExcludedWorker"
    conserved(net)


# --- (g) throughput ---------------------------------------------------------------------------


def test_a_node_that_under_delivers_cannot_keep_many_slots(net: Net) -> None:
    chain, c = net.chain, net.chain.reader.collab
    job = post(net, terms(rounds=3, max_workers=3, min_workers=1))
    slow, other = net.workers[0], net.workers[1]
    required = -(-H * 1000 // ROUND)  # 17 milli-steps/s per slot
    e = revert(slow.collab.claim_slot, job, 2, 2 * required - 1)
    assert (e.error, e.error_args) == ("ThroughputTooLow", {"claimed": 2 * required - 1,
                                                            "needed": 2 * required})
    # No delivered record: its claimed rate is only its word, so one slot.
    e = revert(slow.collab.claim_slot, job, 2, 20_000)
    assert (e.error, e.error_args) == ("SlotCapExceeded", {"wouldHold": 2, "cap": 1})
    assert slow.collab.claim_slot(job, 1, 20_000) == [0]
    honest_round(net, job, 0)  # it commits at once: a fast record
    claimed = c.delivered_of(slow.address)
    assert claimed >= 2 * required
    assert slow.collab.claim_slot(job, 1, claimed) == [1]  # its record covers two slots
    net.outsider.collab.start_round(job)
    start = c.get_round(job, 1).start
    chain.advance(ROUND - 10)  # it commits both inner runs just before the deadline
    work(net, job, 1)
    chain.advance(window(net))
    r = net.outsider.collab.settle_round(job)
    committed = chain.reader.market.get_job(sub_jobs(net, job, 1)[1]).committed_at
    delivered = 2 * H * 1000 // (committed - start)
    assert c.delivered_of(slow.address) == delivered
    assert c.events(r, "DeliveredRecorded")[0]["args"]["milliStepsPerSec"] == delivered
    assert delivered // required == 1  # it can run one slot's rate, not two
    post_outer(net, net.submitter, job, 1)
    accept_outer(net, job, 1)
    # it may not take more slots while its claim outruns what it delivered ...
    e = revert(slow.collab.claim_slot, job, 1, claimed)
    assert (e.error, e.error_args) == ("SlotCapExceeded", {"wouldHold": 3, "cap": 1})
    # ... nor claim an honest rate that does not cover them
    e = revert(slow.collab.claim_slot, job, 1, delivered)
    assert e.error == "ThroughputTooLow"
    # and the next round releases its excess slot
    r = net.outsider.collab.start_round(job)
    rel = c.events(r, "SlotReleased")[0]["args"]
    assert (rel["slot"], rel["node"], rel["reason"]) == (1, slow.address, 2)
    assert c.slot_holders(job) == [slow.address, "0x" + "00" * 20, "0x" + "00" * 20]
    ids = sub_jobs(net, job, 2)
    assert ids[0] != 0 and ids[1] == 0
    # another node takes the freed slot (from the next round on)
    assert other.collab.claim_slot(job, 1, RATE) == [1]
    conserved(net)


def test_a_squatter_without_a_record_holds_one_slot_and_pays_for_missing(net: Net) -> None:
    """Issue 30 item 5, the attack replayed. Before: one address with 130 POL took all 16
    slots of a job (its self-declared rate was uncapped: it had never delivered), claimed
    each sub-job and let the deadline pass. It lost 50% of a 0.94 POL sub-job bond per
    slot, got its slot bonds back, was not excluded, and the job FAILED after 3 attempts in
    184 s for 22.5 POL, 10.7x cheaper than the idle path (a slot bond per idle slot). Now:
    with no delivered record it takes one slot whatever rate it claims; missing it forfeits
    the slot bond to the honest workers beside the market's share, and the job goes on
    with the others. Each retry it squats costs it another slot bond."""
    chain, c, m = net.chain, net.chain.reader.collab, net.chain.reader.market
    mp = m.market_params()
    b = slot_bond(net)
    squatter = fresh_solver(chain, 10)
    bal0 = squatter.token.balance_of(squatter.address)
    job = post(net, terms())
    e = revert(squatter.collab.claim_slot, job, 3, 10**12)
    assert (e.error, e.error_args) == ("SlotCapExceeded", {"wouldHold": 3, "cap": 1})
    assert squatter.collab.claim_slot(job, 1, 10**12) == [0]
    e = revert(squatter.collab.claim_slot, job, 1, 10**12)  # nor one at a time
    assert (e.error, e.error_args) == ("SlotCapExceeded", {"wouldHold": 2, "cap": 1})
    honest = net.workers[:2]
    for w in honest:
        w.collab.claim_slot(job, 1, RATE)
    net.outsider.collab.start_round(job)
    ids = sub_jobs(net, job, 0)
    squatter.market.claim_job(ids[0])  # ... and lets the deadline pass
    work(net, job, 0, slots=[1, 2])
    chain.advance(ROUND + window(net) + 1)
    r = net.outsider.collab.settle_round(job)
    slashed = SUB_REWARD * mp.bond_factor_bps // BPS * mp.missed_deadline_slash_bps // BPS
    st = c.events(r, "RoundSettled")[0]["args"]
    assert (st["acceptedMask"], st["sharedPot"]) == (0b110, slashed + b)
    for w in honest:
        assert c.credits(w.address) == (slashed + b) // 2
    assert c.get_collab(job).phase == RoundPhase.OUTER  # the job goes on
    assert c.credits(squatter.address) == 0
    assert squatter.token.balance_of(squatter.address) == bal0 - b
    assert squatter.registry.free_stake(squatter.address) == 500 * TOKEN - slashed
    conserved(net)
    # Squatting the retry costs another bond, for one slot again.
    assert squatter.collab.claim_slot(job, 1, 10**12) == [0]
    assert squatter.token.balance_of(squatter.address) == bal0 - 2 * b
    conserved(net)


def test_a_worker_that_misses_loses_its_extra_slots(net: Net) -> None:
    """A node with a record holds two slots in job A and two in job B. In A it works one
    slot and lets the other's sub-job lapse: that slot's bond goes to the honest worker
    (none of the pot to its own accepted slot) and its record is cleared, so B's next
    round releases its extra slot there (bond back) and A refuses it a second one."""
    chain, c = net.chain, net.chain.reader.collab
    b = slot_bond(net)
    job = post(net, terms(rounds=3, min_workers=1))
    job_b = post(net, terms(rounds=1, min_workers=1))
    sq, w0 = net.workers[0], net.workers[1]
    sq.collab.claim_slot(job, 1, RATE)
    w0.collab.claim_slot(job, 1, RATE)
    honest_round(net, job, 0)
    rec = c.delivered_of(sq.address)
    assert sq.collab.claim_slot(job, 1, rec) == [2]  # a record: a second slot
    assert sq.collab.claim_slot(job_b, 2, rec) == [0, 1]
    net.outsider.collab.start_round(job)
    work(net, job, 1, slots=[0, 1])  # slot 2's sub-job is never claimed
    chain.advance(ROUND + window(net) + 1)
    r = net.outsider.collab.settle_round(job)
    st = c.events(r, "RoundSettled")[0]["args"]
    assert (st["acceptedMask"], st["sharedPot"], st["perWorker"]) == (0b011, b, b)
    assert c.credits(w0.address) == b and c.credits(sq.address) == 0
    assert c.delivered_of(sq.address) == 0  # its accepted slot 0 recorded nothing
    conserved(net)
    e = revert(sq.collab.claim_slot, job, 1, rec)
    assert (e.error, e.error_args) == ("SlotCapExceeded", {"wouldHold": 2, "cap": 1})
    r = net.outsider.collab.start_round(job_b)
    rel = c.events(r, "SlotReleased")[0]["args"]
    assert (rel["slot"], rel["node"], rel["reason"]) == (1, sq.address, 2)
    assert c.credits(sq.address) == b  # B's slot 1 was not the one it missed
    assert c.slot_holders(job_b) == [sq.address, "0x" + "00" * 20, "0x" + "00" * 20]
    conserved(net)


def test_a_condemned_worker_loses_its_other_slots_in_the_job(net: Net) -> None:
    """A node with a record holds two slots, works one honestly and cheats on the other:
    the condemned run excludes it, its pot share goes to the honest worker alone, and
    the next round releases its honest slot too (reason 4, bond back), so it holds
    nothing in a job it was proven wrong in."""
    chain, c, m = net.chain, net.chain.reader.collab, net.chain.reader.market
    mp = m.market_params()
    b = slot_bond(net)
    job = post(net, terms(rounds=3, min_workers=1))
    cheat, w0 = net.workers[0], net.workers[1]
    cheat.collab.claim_slot(job, 1, RATE)
    w0.collab.claim_slot(job, 1, RATE)
    honest_round(net, job, 0)
    assert cheat.collab.claim_slot(job, 1, c.delivered_of(cheat.address)) == [2]
    net.outsider.collab.start_round(job)
    ids = sub_jobs(net, job, 1)
    work(net, job, 1, slots=[0, 1])
    cheat.market.claim_job(ids[2])
    leaves, tree = fake_trace(ids[2], SEGS, K, tag="cheat", init=init(1))
    cheat.market.commit_trace(ids[2], leaves, tree)
    did = net.verifiers[0].market.challenge(ids[2], 0, leaves[0], tree.proof(0), leaves[1],
                                            tree.proof(1))
    chain.advance(int(chain.reader.dispute.call("params").clock) + 1)
    net.outsider.dispute.timeout(did)
    chain.advance(window(net) + mp.dispute_grace)
    r = net.outsider.collab.settle_round(job)
    to_sub = SUB_REWARD * mp.bond_factor_bps // BPS * mp.submitter_share_bps // BPS
    st = c.events(r, "RoundSettled")[0]["args"]
    assert (st["acceptedMask"], st["sharedPot"], st["perWorker"]) == (0b011, to_sub, to_sub)
    assert c.credits(w0.address) == to_sub
    assert c.events(r, "WorkerExcluded")[0]["args"]["node"] == cheat.address
    assert c.credits(cheat.address) == b  # the condemned slot's bond: the market slashed
    post_outer(net, net.submitter, job, 1)
    accept_outer(net, job, 1)
    r = net.outsider.collab.start_round(job)
    rel = c.events(r, "SlotReleased")[0]["args"]
    assert (rel["slot"], rel["node"], rel["reason"]) == (0, cheat.address, 4)
    assert c.credits(cheat.address) == 2 * b
    assert sub_jobs(net, job, 2)[0] == 0 and cheat.address not in c.slot_holders(job)
    conserved(net)


# --- (h) bad inputs --------------------------------------------------------------------------


def test_bad_inputs_revert_with_named_errors(net: Net) -> None:
    sub, c = net.submitter, net.submitter.collab
    sub.token.approve(c.address, 10**27)
    cp = c.collab_params()
    cases: list[tuple[dict[str, Any], str]] = [
        ({"reward": 0}, "ZeroReward"),
        ({"spec_hash": bytes(32)}, "ZeroHash"),
        ({"outer_init_hash": bytes(32)}, "ZeroHash"),
        ({"init_state_hash": bytes(32)}, "ZeroHash"),
        ({"reward": 2**96 // 100 + 1}, "AmountTooLarge"),
        ({"verification_budget": 2**96}, "AmountTooLarge"),
        ({"min_workers": 0}, "InvalidWorkers"),
        ({"min_workers": 4}, "InvalidWorkers"),
        ({"max_workers": cp.max_slots + 1}, "InvalidWorkers"),
        ({"inner_steps": 0}, "InvalidSteps"),
        ({"steps_per_segment": 0}, "InvalidSteps"),
        ({"inner_steps": 11}, "InvalidSteps"),
        ({"inner_steps": 5 * 2**32, "steps_per_segment": 1}, "InvalidSteps"),
        ({"rounds": 0}, "InvalidRounds"),
        ({"rounds": cp.max_rounds + 1}, "InvalidRounds"),
        ({"round_duration": 0}, "InvalidDuration"),
        ({"round_duration": 365 * 86400 + 1}, "InvalidDuration"),
        ({"reward": 5}, "SubJobTooSmall"),
    ]
    for kw, err in cases:
        assert revert(c.post_collab_job, terms(**kw)).error == err, kw
    job = c.post_collab_job(terms())
    w = net.workers[0]
    assert revert(net.outsider.collab.claim_slot, job, 1, RATE).error == "NotRegisteredSolver"
    assert revert(w.collab.claim_slot, job, 0, RATE).error == "ZeroCount"
    e = revert(w.collab.claim_slot, job, 4, 10**6)
    assert (e.error, e.error_args) == ("NotEnoughFreeSlots", {"wanted": 4, "free": 3})
    e = revert(w.collab.claim_slot, job, 2**32 - 1, 2**64 - 1)  # no overflow panic
    assert e.error == "NotEnoughFreeSlots"
    assert revert(w.collab.claim_slot, 99, 1, RATE).error == "UnknownCollab"
    assert revert(w.collab.leave_slot, job, 0).error == "NotSlotHolder"
    w.collab.claim_slot(job, 1, RATE)
    r = w.collab.leave_slot(job, 0)
    assert net.chain.reader.collab.events(r, "SlotReleased")[0]["args"]["reason"] == 0
    assert revert(net.outsider.collab.settle_round, job).error == "WrongRoundPhase"
    assert revert(net.outsider.collab.challenge_outer, job, 0).error == "WrongRoundPhase"
    assert revert(net.outsider.collab.post_outer, job, 1, outer(0), init(1)).error == \
        "WrongRound"
    assert revert(net.outsider.collab.withdraw).error == "NothingToWithdraw"
    # deployment guards
    addrs = {n: net.chain.deployment.address_of(n) for n in ("PolToken", "NodeRegistry",
                                                             "JobMarket", "OuterJury")}
    from devnet.params import CollabParams, OuterJuryParams

    good = CollabParams.model_validate(net.chain.deployment.params["collab"])
    for update in ({"outer_window": 1}, {"max_slots": 0}, {"max_slots": 65},
                   {"max_rounds": 0}, {"max_round_retries": 101},
                   {"throughput_tolerance_bps": 10_001}):
        p = good.model_copy(update=update)
        e = revert(net.chain[0].deploy, "CollabMarket", addrs["PolToken"],
                   addrs["NodeRegistry"], addrs["JobMarket"], addrs["OuterJury"],
                   tuple(p.model_dump().values()))
        assert e.error == "InvalidParams", update
    jgood = OuterJuryParams.model_validate(net.chain.deployment.params["outer_jury"])
    unbond = net.chain.reader.registry.call("unbondDelay")
    for update in ({"jury_lookahead": 0}, {"jury_lookahead": 129}, {"jury_size": 0},
                   {"quorum": 0}, {"commit_window": 0}, {"reveal_window": 0},
                   # a juror could unbond before the tally and escape its slash
                   {"commit_window": unbond // 2, "reveal_window": 1}):
        jp = jgood.model_copy(update=update)
        e = revert(net.chain[0].deploy, "OuterJury", addrs["PolToken"], addrs["NodeRegistry"],
                   tuple(jp.model_dump().values()))
        assert e.error == "InvalidParams", update
    conserved(net)


def test_a_slot_changes_hands_between_rounds(net: Net) -> None:
    """Churn: a holder cannot leave a slot whose sub-job is live (leaving then would dodge
    the bond an idle sub-job forfeits); once the round has settled it leaves with its bond
    back, and a newcomer takes the slot for the next round."""
    chain, c, m = net.chain, net.chain.reader.collab, net.chain.reader.market
    job = post(net, terms())
    claim_all(net, job)
    net.outsider.collab.start_round(job)
    leaver = net.workers[2]
    e = revert(leaver.collab.leave_slot, job, 2)
    assert (e.error, e.error_args["phase"]) == ("WrongRoundPhase", RoundPhase.RUNNING)
    newcomer = solver(chain, 9)
    assert revert(newcomer.collab.claim_slot, job, 1, RATE).error == "NotEnoughFreeSlots"
    work(net, job, 0)
    chain.advance(window(net))
    net.outsider.collab.settle_round(job)
    post_outer(net, net.submitter, job, 0)
    # between rounds (phase Outer, then Idle) the slot is free to leave, bond and all
    r = leaver.collab.leave_slot(job, 2)
    assert c.events(r, "SlotReleased")[0]["args"]["reason"] == 0
    assert c.credits(leaver.address) == slot_bond(net)
    accept_outer(net, job, 0)
    assert newcomer.collab.claim_slot(job, 1, RATE) == [2]
    net.outsider.collab.start_round(job)
    assert m.reserved_solver_of(sub_jobs(net, job, 1)[2]) == newcomer.address
    conserved(net)


def test_idle_slot_holders_forfeit_their_slot_bonds(net: Net) -> None:
    """The attack: sybil solvers take slots and never run their reserved sub-jobs, to stall
    a job at no cost (before slot bonds, an idle slot only cost gas). Now each idle slot's
    bond is forfeited to the round's accepted workers, never back to the idler; with
    nobody accepted it goes to the submitter, whose job the idlers stalled. A sybil that
    also works an accepted slot gets back at most a share of what its idle one lost."""
    chain, c = net.chain, net.chain.reader.collab
    b = slot_bond(net)
    job = post(net, terms())
    honest, sybil = net.workers[0], net.workers[1]
    idle = net.workers[2]
    before = {w.address: w.token.balance_of(w.address) for w in net.workers}
    claim_all(net, job)
    for w in net.workers:  # every slot is backed by its bond
        assert w.token.balance_of(w.address) == before[w.address] - b
    assert c.total_owed() == c.get_collab(job).pool + 3 * b
    net.outsider.collab.start_round(job)
    work(net, job, 0, slots=[0, 1])  # the idle sybil (slot 2) never claims its sub-job
    chain.advance(ROUND + 1)
    r = net.outsider.collab.settle_round(job)
    drop = c.events(r, "SubJobDropped")[0]["args"]
    assert (drop["slot"], drop["worker"], drop["reason"]) == (2, idle.address, 2)
    st = c.events(r, "RoundSettled")[0]["args"]
    assert (st["sharedPot"], st["perWorker"]) == (b, b // 2)
    assert c.credits(honest.address) == c.credits(sybil.address) == b // 2
    assert c.credits(idle.address) == 0  # its bond is gone ...
    assert c.slot_holders(job)[2] == "0x" + "00" * 20  # ... and so is its slot
    conserved(net)
    # Its pair's share never covers the idle slot's bond: the sybil pair is b / 2 down.
    assert c.credits(sybil.address) + c.credits(idle.address) < b

    # A job where every holder idles: the forfeits go to the submitter, the round retries.
    sub = net.submitter
    owed = c.credits(sub.address)
    job2 = post(net, terms(rounds=1))
    claim_all(net, job2)
    net.outsider.collab.start_round(job2)
    chain.advance(ROUND + 1)
    r = net.outsider.collab.settle_round(job2)
    assert [e["args"]["reason"] for e in c.events(r, "SubJobDropped")] == [2, 2, 2]
    assert c.events(r, "RoundRetried")
    assert c.credits(sub.address) - owed == 3 * b
    assert not any(int(h, 16) for h in c.slot_holders(job2))
    conserved(net)
