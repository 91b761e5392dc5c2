"""Gas of the data-availability game (issue 30) at bench/gas.py's production shape.

Three rounds on one deployment: an honest solver answering one availability request
(the request, its answer, the attested round's finalize); a withholding solver (a root
over leaf 0 and the last leaf only) whose request runs out (the request, the expiry that
condemns the round, the finalize that settles it); and an honest solver whose committee
stays silent, publishing all of its sampled segments' leaves itself (the sum, and per
segment) before its finalize. Gas is each receipt's gasUsed.
"""

from __future__ import annotations

from typing import Any

from devnet.params import TOKEN
from devnet.testing import FAKE_INIT, LocalChain, fake_trace, job_terms
from node.chain.client import ChainClient
from node.chain.ids import JobId
from node.proof import MerkleTree, TraceLeaf


def _post(c: LocalChain, submitter: ChainClient, solver: ChainClient, segments: int,
          k: int) -> JobId:
    terms = job_terms(reward=100 * TOKEN, budget=30 * TOKEN, duration=3600,
                      segments=segments, k=k)
    submitter.token.approve(submitter.market.address, terms.reward + terms.verification_budget)
    job = submitter.market.post_job(terms)
    solver.market.claim_job(job)
    return job


def _seed(c: LocalChain, job: JobId) -> list[str]:
    m = c.reader.market
    c.mine(m.market_params().sample_lookahead + 1)
    c[0].market.fix_seed(job)
    return list(m.committee_of(job))


def _past_window(c: LocalChain, job: JobId) -> None:
    end = c.reader.market.get_job(job).window_end
    c.advance(max(1, end - c.timestamp() + 1))


def measure_availability_gas(c: LocalChain, submitter: ChainClient, solver: ChainClient,
                             asker: ChainClient, segments: int, k: int) -> dict[str, Any]:
    """``asker``: any funded account but the solver (a committee member, in practice)."""
    av = c.reader.availability
    ap = av.availability_params()
    asker.token.approve(av.address, 10 * ap.bond)
    out: dict[str, Any] = {}

    # an honest solver answers a request; a majority attests; it is paid
    job = _post(c, submitter, solver, segments, k)
    leaves, tree = fake_trace(job, segments, k)
    solver.market.commit_trace(job, leaves, tree)
    committee = _seed(c, job)
    r = asker.availability.transact("request", job, 5)
    out["da_request"] = int(r["gasUsed"])
    r = solver.availability.publish(job, 5, leaves[5], tree.proof(5), leaves[6], tree.proof(6))
    out["da_answer_by_honest_solver"] = int(r["gasUsed"])
    for a in committee[:len(committee) // 2 + 1]:
        c.client_of(a).market.attest(job)
    _past_window(c, job)
    out["da_honest_finalize"] = int(submitter.market.finalize(job)["gasUsed"])

    # a withholding solver: the request runs out, the round is condemned and settled
    job = _post(c, submitter, solver, segments, k)
    first = TraceLeaf(job, 0, 0, FAKE_INIT, 0)
    last = TraceLeaf(job, segments, segments * k, b"\x77" * 32, 1)
    t2 = MerkleTree.from_leaves([first, last])
    solver.market.commit_result(job, t2.root, last, t2.proof(0), t2.proof(1))
    _seed(c, job)
    r = asker.availability.transact("request", job, 5)
    out["da_request_withheld"] = int(r["gasUsed"])
    rid = int(av.event_arg(r, "Requested", "requestId"))
    c.advance(ap.answer_window + 1)
    out["da_expire_condemns"] = int(asker.availability.expire(rid)["gasUsed"])
    _past_window(c, job)
    out["da_withheld_finalize_settles"] = int(submitter.market.finalize(job)["gasUsed"])

    # a silent committee: the honest solver publishes its whole sample
    job = _post(c, submitter, solver, segments, k)
    leaves, tree = fake_trace(job, segments, k)
    solver.market.commit_trace(job, leaves, tree)
    _seed(c, job)
    sample = c.reader.market.sampled_segments(job)
    pub = [int(solver.availability.publish(job, s, leaves[s], tree.proof(s), leaves[s + 1],
                                           tree.proof(s + 1))["gasUsed"]) for s in sample]
    _past_window(c, job)
    out["da_publish_sample_total"] = sum(pub)
    out["da_publish_sample_segments"] = len(pub)
    out["da_publish_avg"] = round(sum(pub) / len(pub))
    out["da_silent_committee_finalize"] = int(submitter.market.finalize(job)["gasUsed"])
    return out


def print_availability(d: dict[str, Any]) -> None:
    print("data availability (issue 30):")
    print(f"  honest solver: request {d['da_request']:,}, its answer "
          f"{d['da_answer_by_honest_solver']:,} (the solver's only cost), finalize "
          f"{d['da_honest_finalize']:,}")
    print(f"  withholding solver: request {d['da_request_withheld']:,}, expire (condemns) "
          f"{d['da_expire_condemns']:,}, finalize (settles) "
          f"{d['da_withheld_finalize_settles']:,}")
    print(f"  silent committee: the solver publishes {d['da_publish_sample_segments']} sampled "
          f"segments for {d['da_publish_sample_total']:,} (avg {d['da_publish_avg']:,}), "
          f"finalize {d['da_silent_committee_finalize']:,}")
