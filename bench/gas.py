"""Gas per call of one whole job life on a fresh anvil.

post -> claim -> commit -> fixSeed -> 3 attestations -> finalize -> withdrawals
(solver, 3 verifiers). Gas is each receipt's gasUsed; per-call figures for calls
made several times (attest, withdraw) are averages.

Usage: python bench/gas.py [--no-dispute]
Prints a table, then as the last line JSON: {"postJob", "claimJob", "commitResult",
"fixSeed", "attest", "finalize", "withdraw", "total_one_job", ...}, merged with the
dispute figures of bench/gas_dispute.py unless --no-dispute.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from eth_utils import keccak  # noqa: E402

from devnet.anvil import AnvilProcess, dev_accounts, start_anvil  # noqa: E402
from devnet.deploy import deploy_all  # noqa: E402
from devnet.params import TOKEN, DevnetParams  # noqa: E402
from devnet.testing import LocalChain  # noqa: E402
from node.chain.contracts import SOLVER, VERIFIER  # noqa: E402
from node.chain.rpc import make_web3  # noqa: E402
from node.proof import build_trace_tree  # noqa: E402

SEGMENTS, K = 64, 50  # a 3,200-step job checkpointed every 50 steps
ATTESTORS = 3


def measure_job_gas(anvil: AnvilProcess | None = None) -> dict[str, int]:
    """One job life on fresh contracts; gas per call and the total."""
    params = DevnetParams()
    node = anvil or start_anvil(accounts=params.accounts)
    try:
        accts = dev_accounts(params.accounts)
        dep = deploy_all(make_web3(node.url), accts[0], params, fund=accts, rpc_url=node.url)
        return _job_life(LocalChain(node, dep))
    finally:
        if anvil is None:
            node.stop()


def _job_life(c: LocalChain) -> dict[str, int]:
    gas: dict[str, list[int]] = {}

    def rec(name: str, receipt: Any) -> None:
        gas.setdefault(name, []).append(int(receipt["gasUsed"]))

    submitter, solver = c[1], c.join(2, SOLVER, 500 * TOKEN)
    verifiers = [c.join(i, VERIFIER, 100 * TOKEN) for i in range(3, 3 + ATTESTORS)]
    submitter.token.approve(submitter.market.address, 200 * TOKEN)
    r = submitter.market.transact("postJob", keccak(b"spec"), keccak(b"data"), 100 * TOKEN,
                                  30 * TOKEN, 3600)
    rec("postJob", r)
    job = int(submitter.market.event_arg(r, "JobPosted", "jobId"))
    rec("claimJob", solver.market.claim_job(job))
    states = [keccak(b"state%d" % i) for i in range(SEGMENTS + 1)]
    leaves, tree = build_trace_tree(job, K, states, [10**9] * SEGMENTS)
    rec("commitResult", solver.market.commit_result(job, tree.root, states[-1], SEGMENTS, K))
    c.mine(c.reader.market.market_params().sample_lookahead + 1)
    rec("fixSeed", solver.market.transact("fixSeed", job))
    sampled = c.reader.market.sampled_segments(job)
    for v, seg in zip(verifiers, sampled, strict=False):
        rec("attest", v.market.attest(job, seg))
    c.advance(c.reader.market.market_params().verification_window)
    rec("finalize", submitter.market.finalize(job))
    for who in (solver, *verifiers):
        rec("withdraw", who.market.transact("withdraw"))
    out = {k: round(sum(v) / len(v)) for k, v in gas.items()}
    out["total_one_job"] = sum(sum(v) for v in gas.values())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--no-dispute", action="store_true", help="skip the dispute figures")
    args = ap.parse_args()
    result: dict[str, Any] = dict(measure_job_gas())
    rows = [(k, v) for k, v in result.items()]
    if not args.no_dispute:
        from bench.gas_dispute import measure_dispute_gas  # noqa: PLC0415

        for k, v in measure_dispute_gas().items():
            result.setdefault(k, v)
            rows.append((k, v))
    print(f"one job life: {SEGMENTS} segments of {K} steps, {ATTESTORS} attestations")
    for k, v in rows:
        print(f"  {k:<34} {v:>12,}" if isinstance(v, int) and not isinstance(v, bool)
              else f"  {k:<34} {v!s:>12}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
