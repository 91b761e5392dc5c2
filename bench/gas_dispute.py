"""Gas of one whole dispute over a k-step segment (default k = 64).

Deploys the contracts on a fresh anvil, commits a job whose segment is
attested, then plays: challenge -> log2(k) bisection rounds (postMid + choose;
the last choose draws the jury) -> every juror commits and reveals -> resolve
-> everyone credited withdraws from the game. Gas is each receipt's gasUsed.

The default outcome is the costlier one: the step is invalid (the market
reopens the job and slashes the segment's attestors). ``--valid`` measures the
solver winning instead.

Usage: python bench/gas_dispute.py [--k 64] [--jurors 3] [--attestors 2] [--valid]
Last stdout line: JSON with per-call gas, ``total_full_dispute_k<k>`` and
``target_ok`` (total < 1.5M gas). ``measure_dispute_gas`` returns the same
dict for bench/gas.py to merge.
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
from node.chain.contracts import SOLVER, VERIFIER, Phase  # noqa: E402
from node.chain.rpc import make_web3  # noqa: E402
from node.proof import build_trace_tree  # noqa: E402

TARGET = 1_500_000
SEGMENTS = 16


def _avg(xs: list[int]) -> int:
    return round(sum(xs) / len(xs)) if xs else 0


def measure_dispute_gas(k: int = 64, jurors: int = 3, attestors: int = 2,
                        solver_wins: bool = False, anvil: AnvilProcess | None = None,
                        ) -> dict[str, Any]:
    """Run one full dispute over a ``k``-step segment and return its gas figures.

    Starts (and stops) its own anvil unless ``anvil`` is given; always deploys
    fresh contracts. ``k`` must be a power of two >= 2 for log2(k) rounds.
    """
    if k < 2 or k & (k - 1):
        raise ValueError("k must be a power of two >= 2")
    n_accounts = max(10, 4 + max(jurors, attestors))
    params = DevnetParams.model_validate({
        "accounts": n_accounts,
        "registry": {"unbond_delay": 7200},
        "market": {"verification_window": 3600, "sample_count": SEGMENTS,
                   "max_attestors_per_segment": max(1, attestors)},
        "dispute": {"jury_size": jurors},
    })
    own = anvil is None
    node = anvil or start_anvil(accounts=n_accounts)
    try:
        accts = dev_accounts(n_accounts)
        dep = deploy_all(make_web3(node.url), accts[0], params, fund=accts, rpc_url=node.url)
        return _play(LocalChain(node, dep), k, jurors, attestors, solver_wins)
    finally:
        if own:
            node.stop()


def _play(c: LocalChain, k: int, jurors: int, attestors: int,
          solver_wins: bool) -> dict[str, Any]:
    solver_i, chal_i, submitter_i = 1, 2, 3
    verifier_is = list(range(4, len(c.clients)))
    c.join(solver_i, SOLVER, 500 * TOKEN)
    c.join(chal_i, VERIFIER, 100 * TOKEN)
    for i in verifier_is:
        c.join(i, VERIFIER, 100 * TOKEN)
    sub, solver, chal = c[submitter_i], c[solver_i], c[chal_i]

    job = sub.post_job(keccak(b"spec"), keccak(b"data"), 100 * TOKEN, 30 * TOKEN, 3600)
    solver.market.claim_job(job)
    states = [keccak(b"S%d" % i) for i in range(SEGMENTS + 1)]
    leaves, tree = build_trace_tree(job, k, states, [10**9 + i for i in range(SEGMENTS)])
    solver.market.commit_result(job, tree.root, states[-1], SEGMENTS, k)
    c.mine(c.reader.market.market_params().sample_lookahead + 1)
    seg = SEGMENTS // 2
    for i in verifier_is[:attestors]:
        c[i].market.attest(job, seg)

    gas: dict[str, list[int]] = {n: [] for n in (
        "challenge", "postMid", "choose", "commitVote", "revealVote", "resolve", "withdraw")}
    r = chal.market.transact("challenge", job, seg, leaves[seg].state_hash, leaves[seg].loss_e9,
                             tree.proof(seg), leaves[seg + 1].state_hash,
                             leaves[seg + 1].loss_e9, tree.proof(seg + 1))
    gas["challenge"].append(r["gasUsed"])
    did = int(c.reader.market.event_arg(r, "Challenged", "disputeId"))
    d = c.reader.dispute.get_dispute(did)
    while d.phase == Phase.BISECTION:
        r = solver.dispute.post_mid(did, keccak(b"mid%d" % d.mid))
        gas["postMid"].append(r["gasUsed"])
        r = chal.dispute.choose(did, bool(d.rounds % 2))
        gas["choose"].append(r["gasUsed"])
        d = c.reader.dispute.get_dispute(did)
    assert len(d.jury) == jurors, f"drew {len(d.jury)} jurors, wanted {jurors}"

    idx = c.addresses.index
    for j in d.jury:
        r = c[idx(j)].dispute.commit_vote(did, solver_wins, keccak(b"salt" + j.encode()))
        gas["commitVote"].append(r["gasUsed"])
    c.rpc("evm_mine", d.commit_end)
    for j in d.jury:
        r = c[idx(j)].dispute.reveal_vote(did, solver_wins, keccak(b"salt" + j.encode()))
        gas["revealVote"].append(r["gasUsed"])
    c.rpc("evm_mine", d.reveal_end)
    r = c[0].dispute.resolve(did)
    gas["resolve"].append(r["gasUsed"])
    assert c.reader.dispute.get_dispute(did).solver_won == solver_wins
    for i, a in enumerate(c.addresses):
        if c.reader.dispute.credits(a):
            r = c[i].dispute.transact("withdraw")
            gas["withdraw"].append(r["gasUsed"])
    assert c.reader.dispute.total_owed() == 0

    rounds = len(gas["postMid"])
    total = sum(sum(v) for v in gas.values())
    per_round = [p + ch for p, ch in zip(gas["postMid"], gas["choose"], strict=True)]
    return {
        "k": k, "jurors": jurors, "attestors": attestors,
        "outcome": "valid" if solver_wins else "invalid",
        "bisection_rounds": rounds,
        "challenge": gas["challenge"][0],
        "postMid_avg": _avg(gas["postMid"]),
        "choose_avg": _avg(gas["choose"]),
        "choose_last_with_jury_draw": gas["choose"][-1],
        "bisection_round_avg": _avg(per_round),
        "bisection_round_max": max(per_round),
        "bisection_round_avg_excl_jury_draw": _avg(per_round[:-1]),
        "commitVote_avg": _avg(gas["commitVote"]),
        "revealVote_avg": _avg(gas["revealVote"]),
        "resolve": gas["resolve"][0],
        "withdraw_avg": _avg(gas["withdraw"]),
        "withdraw_count": len(gas["withdraw"]),
        f"total_full_dispute_k{k}": total,
        "target_gas": TARGET,
        "target_ok": total < TARGET,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--k", type=int, default=64)
    ap.add_argument("--jurors", type=int, default=3)
    ap.add_argument("--attestors", type=int, default=2)
    ap.add_argument("--valid", action="store_true", help="the solver wins (step valid)")
    a = ap.parse_args()
    out = measure_dispute_gas(a.k, a.jurors, a.attestors, a.valid)
    print(f"full dispute, k={out['k']} ({out['bisection_rounds']} rounds), "
          f"{out['jurors']} jurors, {out['attestors']} attestors, step {out['outcome']}:")
    for key in ("challenge", "postMid_avg", "choose_avg", "choose_last_with_jury_draw",
                "bisection_round_avg", "commitVote_avg", "revealVote_avg", "resolve",
                "withdraw_avg"):
        print(f"  {key:<28} {out[key]:>10,}")
    total = out[f"total_full_dispute_k{out['k']}"]
    print(f"  {'total (all calls)':<28} {total:>10,}  target < {TARGET:,}: "
          f"{'ok' if out['target_ok'] else 'MISSED'}")
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main()
