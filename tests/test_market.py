"""JobMarket against anvil: the job life, every revert, reclaim, cancel, challenges."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from eth_utils import keccak

from devnet.params import TOKEN
from devnet.testing import LocalChain
from node.chain.client import ChainClient
from node.chain.contracts import SOLVER, VERIFIER, JobStatus
from node.errors import ContractRevert
from node.proof import MerkleTree, TraceLeaf, build_trace_tree, sample_segments

SPEC, DATA = keccak(b"spec"), keccak(b"dataset")
REWARD, BUDGET, DURATION = 100 * TOKEN, 31 * TOKEN, 3600  # budget / 3 leaves a remainder
SEGMENTS, K = 12, 5


def revert(fn, *args):  # type: ignore[no-untyped-def]
    with pytest.raises(ContractRevert) as e:
        fn(*args)
    return e.value


@dataclass
class Roles:
    submitter: ChainClient
    solver: ChainClient
    verifiers: list[ChainClient]
    outsider: ChainClient


@pytest.fixture
def roles(chain: LocalChain) -> Roles:
    return Roles(submitter=chain[5], solver=chain.join(1, SOLVER | VERIFIER, 500 * TOKEN),
                 verifiers=[chain.join(i, VERIFIER, 100 * TOKEN) for i in (2, 3, 4, 6)],
                 outsider=chain[7])


def trace(job_id: int) -> tuple[list[TraceLeaf], MerkleTree]:
    states = [keccak(f"state{i}".encode()) for i in range(SEGMENTS + 1)]
    return build_trace_tree(job_id, K, states, [1_000_000 + i for i in range(SEGMENTS)])


def commit(chain: LocalChain, roles: Roles) -> tuple[int, list[TraceLeaf], MerkleTree]:
    job = roles.submitter.post_job(SPEC, DATA, REWARD, BUDGET, DURATION)
    roles.solver.market.claim_job(job)
    leaves, tree = trace(job)
    roles.solver.market.commit_result(job, tree.root, leaves[-1].state_hash, SEGMENTS, K)
    return job, leaves, tree


def check_conserved(chain: LocalChain) -> None:
    held, owed = chain.conservation()
    assert held == owed


def test_whole_job_life(chain: LocalChain, roles: Roles) -> None:
    m, sub, solver = roles.submitter.market, roles.submitter, roles.solver
    sub_before = sub.token.balance_of(sub.address)
    job = sub.post_job(SPEC, DATA, REWARD, BUDGET, DURATION)
    assert job == m.job_count() == 1
    j = m.get_job(job)
    assert (j.status, j.submitter, j.reward, j.spec_hash) == (JobStatus.OPEN, sub.address,
                                                               REWARD, SPEC)
    check_conserved(chain)

    r = solver.market.claim_job(job)
    bond = REWARD * m.market_params().bond_factor_bps // 10_000
    assert m.events(r, "JobClaimed")[0]["args"]["bond"] == bond
    assert solver.registry.locked_stake(solver.address) == bond
    assert m.get_job(job).deadline == chain.timestamp() + DURATION

    leaves, tree = trace(job)
    solver.market.commit_result(job, tree.root, leaves[-1].state_hash, SEGMENTS, K)
    j = m.get_job(job)
    assert j.status == JobStatus.COMMITTED and j.trace_root == tree.root
    assert revert(m.fix_seed, job).error == "SampleBlockNotReached"
    assert revert(m.sampled_segments, job).error == "SeedNotFixed"
    chain.mine(j.sample_block - chain.w3.eth.block_number)
    seed = roles.outsider.market.fix_seed(job)
    assert seed == m.seed_of(job) == chain.w3.eth.get_block(j.sample_block)["hash"]
    assert revert(m.fix_seed, job).error == "SeedAlreadyFixed"
    n = m.market_params().sample_count
    sampled = m.sampled_segments(job)
    assert sampled == sample_segments(seed, SEGMENTS, n)

    for v, seg in zip(roles.verifiers[:3], sampled, strict=False):
        v.market.attest(job, seg)
    assert m.get_job(job).attestations == 3
    assert revert(m.finalize, job).error == "WindowNotOver"
    chain.advance(m.market_params().verification_window)
    r = roles.outsider.market.finalize(job)
    per = BUDGET // 3
    assert m.events(r, "JobFinalized")[0]["args"]["perAttestation"] == per
    assert m.get_job(job).status == JobStatus.FINALIZED
    assert solver.registry.locked_stake(solver.address) == 0
    assert m.credits(solver.address) == REWARD
    assert m.credits(sub.address) == BUDGET - 3 * per
    check_conserved(chain)

    assert solver.market.withdraw() == REWARD
    for v in roles.verifiers[:3]:
        assert v.market.withdraw() == per
    assert sub.market.withdraw() == BUDGET - 3 * per
    assert sub.token.balance_of(sub.address) == sub_before - REWARD - 3 * per
    assert revert(sub.market.withdraw).error == "NothingToWithdraw"
    assert m.total_owed() == 0
    check_conserved(chain)


def test_post_job_reverts(chain: LocalChain, roles: Roles) -> None:
    sub = roles.submitter
    m = sub.market
    assert revert(m.post_job, SPEC, DATA, REWARD, 0, DURATION).error == \
        "ERC20InsufficientAllowance"
    sub.token.approve(m.address, 10**30)
    assert revert(m.post_job, SPEC, DATA, 0, 0, DURATION).error == "ZeroReward"
    assert revert(m.post_job, SPEC, DATA, REWARD, 0, 0).error == "ZeroDuration"
    assert revert(m.post_job, bytes(32), DATA, REWARD, 0, 1).error == "ZeroHash"
    assert revert(m.post_job, SPEC, bytes(32), REWARD, 0, 1).error == "ZeroHash"
    poor = chain[8]
    poor.token.approve(m.address, 10**30)
    poor.token.transfer(chain.addresses[0], poor.token.balance_of(poor.address))
    assert revert(poor.market.post_job, SPEC, DATA, REWARD, 0, 1).error == \
        "ERC20InsufficientBalance"
    assert revert(m.get_job, 99).error if False else m.get_job(99).submitter.startswith("0x00")


def test_cancel(chain: LocalChain, roles: Roles) -> None:
    sub = roles.submitter
    job = sub.post_job(SPEC, DATA, REWARD, BUDGET, DURATION)
    assert revert(roles.outsider.market.cancel, job).error == "NotSubmitter"
    assert revert(sub.market.cancel, 42).error_args == {"jobId": 42}
    r = sub.market.cancel(job)
    assert sub.market.events(r, "JobCancelled")[0]["args"]["refund"] == REWARD + BUDGET
    e = revert(sub.market.cancel, job)
    assert (e.error, e.error_args["status"]) == ("InvalidStatus", JobStatus.CANCELLED)
    assert revert(roles.solver.market.claim_job, job).error == "InvalidStatus"
    assert sub.market.withdraw() == REWARD + BUDGET
    job2 = sub.post_job(SPEC, DATA, REWARD, BUDGET, DURATION)
    roles.solver.market.claim_job(job2)
    assert revert(sub.market.cancel, job2).error == "InvalidStatus"  # claimed: too late
    check_conserved(chain)


def test_claim_and_commit_reverts(chain: LocalChain, roles: Roles) -> None:
    sub, solver = roles.submitter, roles.solver
    job = sub.post_job(SPEC, DATA, REWARD, BUDGET, DURATION)
    assert revert(roles.verifiers[0].market.claim_job, job).error == "NotRegisteredSolver"
    assert revert(roles.outsider.market.claim_job, job).error == "NotRegisteredSolver"
    assert revert(solver.market.claim_job, 77).error == "UnknownJob"
    big = sub.post_job(SPEC, DATA, 1000 * TOKEN, 0, DURATION)  # bond 1500 > stake 500
    e = revert(solver.market.claim_job, big)
    assert e.error == "InsufficientFreeStake" and e.error_args["needed"] == 1500 * TOKEN
    leaves, tree = trace(job)
    root, final = tree.root, leaves[-1].state_hash
    assert revert(solver.market.commit_result, job, root, final, SEGMENTS, K).error == \
        "InvalidStatus"
    solver.market.claim_job(job)
    assert revert(solver.market.claim_job, job).error == "InvalidStatus"
    assert revert(roles.verifiers[0].market.commit_result, job, root, final, SEGMENTS,
                  K).error == "NotSolver"
    for bad in ((bytes(32), final, SEGMENTS, K), (root, bytes(32), SEGMENTS, K),
                (root, final, 0, K), (root, final, SEGMENTS, 0)):
        assert revert(solver.market.commit_result, job, *bad).error == "InvalidTrace"
    chain.advance(DURATION + 1)
    assert revert(solver.market.commit_result, job, root, final, SEGMENTS, K).error == \
        "DeadlinePassed"


def test_attest_reverts(chain: LocalChain, roles: Roles) -> None:
    job, _, _ = commit(chain, roles)
    m = roles.verifiers[0].market
    assert revert(m.attest, job, 0).error == "SeedNotFixed"
    chain.mine(m.market_params().sample_lookahead + 1)
    sampled = m.sampled_segments(job)
    unsampled = next(s for s in range(SEGMENTS) if s not in sampled)
    assert revert(roles.outsider.market.attest, job, sampled[0]).error == "NotVerifier"
    assert revert(roles.solver.market.attest, job, sampled[0]).error == "SolverCannotAttest"
    assert revert(m.attest, job, SEGMENTS).error == "SegmentOutOfRange"
    assert revert(m.attest, job, unsampled).error == "SegmentNotSampled"
    m.attest(job, sampled[0])  # also fixes the seed
    assert m.seed_of(job) != bytes(32)
    assert revert(m.attest, job, sampled[0]).error == "AlreadyAttested"
    cap = m.market_params().max_attestors_per_segment
    for v in roles.verifiers[1:cap]:
        v.market.attest(job, sampled[0])
    assert revert(roles.verifiers[cap].market.attest, job, sampled[0]).error == \
        "TooManyAttestors"
    assert m.attestorsOf(job, sampled[0]) == [v.address for v in roles.verifiers[:cap]]
    chain.advance(m.market_params().verification_window)
    assert revert(m.attest, job, sampled[1]).error == "WindowClosed"


def test_finalize_without_attestations_refunds_budget(chain: LocalChain, roles: Roles) -> None:
    job, _, _ = commit(chain, roles)
    m = roles.outsider.market
    assert revert(m.finalize, 5).error == "UnknownJob"
    chain.advance(m.market_params().verification_window)
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
    assert m.fix_seed(job) == bytes(32)  # hash unreadable: re-armed, not fixed
    new = m.get_job(job).sample_block
    assert new > old
    chain.mine(new - chain.w3.eth.block_number + 1)
    seed = m.fix_seed(job)
    assert seed == chain.w3.eth.get_block(new)["hash"]


def test_missed_deadline_reclaim_and_reclaim_again(chain: LocalChain, roles: Roles) -> None:
    sub, solver = roles.submitter, roles.solver
    job = sub.post_job(SPEC, DATA, REWARD, BUDGET, DURATION)
    solver.market.claim_job(job)
    bond = solver.market.get_job(job).bond
    m = roles.outsider.market
    assert revert(m.reclaim, job).error == "DeadlineNotPassed"
    chain.advance(DURATION + 1)
    free_before = solver.registry.free_stake(solver.address)
    r = m.reclaim(job)
    args = m.events(r, "JobReclaimed")[0]["args"]
    penalty = bond * m.market_params().missed_deadline_slash_bps // 10_000
    assert (args["slashed"], args["unlocked"]) == (penalty, bond - penalty)
    assert solver.registry.locked_stake(solver.address) == 0
    assert solver.registry.free_stake(solver.address) == free_before + bond - penalty
    assert m.credits(sub.address) == penalty
    j = m.get_job(job)
    assert j.status == JobStatus.OPEN and j.round == 1
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
    assert revert(v.market.challenge, job, SEGMENTS, leaves[seg], [], leaves[seg],
                  []).error == "SegmentOutOfRange"

    free = v.registry.free_stake(v.address)
    dispute_id = v.market.challenge(*args)
    bond = v.market.market_params().challenge_bond
    assert v.registry.locked_stake(v.address) == bond
    assert v.registry.free_stake(v.address) == free - bond
    ref = v.market.disputeRef(dispute_id)
    assert (ref.jobId, ref.segment, ref.challenger) == (job, seg, v.address)
    assert v.market.isDisputeLive(dispute_id)
    assert v.market.get_job(job).open_disputes == 1
    chain.advance(v.market.market_params().verification_window)
    assert revert(v.market.finalize, job).error == "DisputesOpen"
    e = revert(v.market.resolveDispute, job, dispute_id, True)
    assert (e.error, e.error_args) == ("Unauthorized", {"caller": v.address})
    assert revert(v.market.challenge, *args).error == "WindowClosed"
    check_conserved(chain)


def test_dispute_facade_reads_the_opened_game(chain: LocalChain, roles: Roles) -> None:
    from node.chain.contracts import Phase, Side

    job, leaves, tree = commit(chain, roles)
    v = roles.verifiers[0]
    did = v.market.challenge(job, 3, leaves[3], tree.proof(3), leaves[4], tree.proof(4))
    d = v.dispute.get_dispute(did)
    assert (d.job_id, d.segment, d.solver, d.challenger) == (job, 3, roles.solver.address,
                                                              v.address)
    assert (d.lo, d.hi, d.lo_hash, d.hi_hash) == (3 * K, 4 * K, leaves[3].state_hash,
                                                  leaves[4].state_hash)
    assert d.phase == Phase.BISECTION and d.turn == Side.SOLVER
    hs = [keccak(b"mid%d" % t) for t in d.mid_steps]
    e = revert(v.dispute.post_mids, did, hs)
    assert e.error == "NotYourTurn"
    roles.solver.dispute.post_mids(did, hs)
    v.dispute.choose(did, 0, hs)
    assert v.dispute.get_dispute(did).hi == d.mid_steps[0]


def test_upheld_segment_cannot_be_challenged_again(chain: LocalChain) -> None:
    # The devnet's window (60 s) is no longer than one clock: a fresh deployment with
    # a long window lets a dispute end while challenges are still open.
    from devnet.anvil import dev_accounts
    from devnet.deploy import deploy_all
    from devnet.params import DevnetParams, MarketParams

    params = DevnetParams(market=MarketParams(verification_window=3600))
    accts = dev_accounts(len(chain.accounts))
    long = LocalChain(chain.anvil, deploy_all(chain.w3, accts[0], params, fund=accts,
                                              rpc_url=chain.url))
    roles = Roles(submitter=long[5], solver=long.join(1, SOLVER, 500 * TOKEN),
                  verifiers=[long.join(i, VERIFIER, 100 * TOKEN) for i in (2, 3)],
                  outsider=long[7])
    job, leaves, tree = commit(long, roles)
    v = roles.verifiers[0]
    args = (job, 2, leaves[2], tree.proof(2), leaves[3], tree.proof(3))
    did = v.market.challenge(*args)
    d = v.dispute.get_dispute(did)
    roles.solver.dispute.post_mids(did, [keccak(b"mid%d" % t) for t in d.mid_steps])
    long.advance(int(v.dispute.call("params").clock) + 1)  # the challenger never answers
    r = roles.outsider.dispute.timeout(did)
    assert v.market.events(r, "SegmentUpheld")[0]["args"]["segment"] == 2
    assert v.market.isUpheld(job, 2)
    e = revert(roles.verifiers[1].market.challenge, *args)
    assert (e.error, e.error_args) == ("SegmentAlreadyUpheld", {"segment": 2})
    long.advance(3600)
    roles.outsider.market.finalize(job)  # no live dispute left
    check_conserved(long)
    assert roles.solver.dispute.withdraw() > 0  # the challenger's bond, in part


def test_constructor_and_wiring_guards(chain: LocalChain) -> None:
    from devnet.deploy import constructor_args
    from devnet.params import MarketParams

    owner = chain[0]
    zero = "0x" + "00" * 20
    e = revert(owner.deploy, "NodeRegistry", zero, 60, 1, 1)
    assert e.error == "ZeroAddress"
    reg = owner.deploy("NodeRegistry", owner.token.address, 60, 1, 1)
    assert revert(reg.setAuthorized, zero, owner.address).error == "ZeroAddress"
    addrs = {"PolToken": owner.token.address, "NodeRegistry": reg.address}
    bad = MarketParams(sample_lookahead=1, sample_count=1, missed_deadline_slash_bps=10_000,
                       attestor_slash_bps=10_000).model_copy(update={"sample_count": 0})
    e = revert(owner.deploy, "JobMarket", *constructor_args("JobMarket", addrs, bad))
    assert e.error == "InvalidParams"
    market = owner.deploy("JobMarket", *constructor_args("JobMarket", addrs, MarketParams()))
    assert revert(market.setDisputeGame, zero).error == "ZeroAddress"
    assert revert(chain[1].contract("JobMarket", market.address).setDisputeGame,
                  owner.address).error == "OwnableUnauthorizedAccount"
