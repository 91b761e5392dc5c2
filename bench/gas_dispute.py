"""Gas of one whole dispute over a k-step segment (default k = 64).

Deploys the contracts on a fresh anvil, commits a job whose segment is
attested, then plays: challenge -> ceil(log_fanout(k)) bisection rounds
(postMids + choose; the last choose draws the jury) -> every juror commits and
reveals -> resolve -> everyone credited withdraws from the game. Gas is each
receipt's gasUsed.

The default outcome is the costlier one: the step is invalid (the market
reopens the job and slashes the segment's attestors), and the challenger picks
a middle part whenever there is one (both range ends move: two hash writes).
``--valid`` measures the solver winning instead.

The same run also plays the game deployed with fanout 2 (plain halving) for
comparison, unless ``--fanout`` picks one.

Usage: python bench/gas_dispute.py [--k 64] [--jurors 3] [--attestors 2] [--valid]
                                   [--fanout N]
Last stdout line: JSON with per-call gas, ``total_full_dispute_k<k>`` and
``target_ok`` (total < 1.5M gas) for the devnet's fanout, and
``total_full_dispute_k<k>_fanout2``. ``measure_dispute_gas`` returns one run's
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


def _accounts(jurors: int, attestors: int) -> int:
    return max(10, 4 + max(jurors, attestors))


def measure_dispute_gas(k: int = 64, jurors: int = 3, attestors: int = 2,
                        solver_wins: bool = False, fanout: int | None = None,
                        anvil: AnvilProcess | None = None) -> dict[str, Any]:
    """Run one full dispute over a ``k``-step segment and return its gas figures.

    Starts (and stops) its own anvil unless ``anvil`` is given; always deploys
    fresh contracts, with the devnet's fanout unless ``fanout`` is given.
    """
    if k < 2:
        raise ValueError("k must be >= 2")
    n_accounts = _accounts(jurors, attestors)
    dispute: dict[str, Any] = {"jury_size": jurors}
    if fanout is not None:
        dispute["fanout"] = fanout
    params = DevnetParams.model_validate({
        "accounts": n_accounts,
        "registry": {"unbond_delay": 7200},
        "market": {"verification_window": 3600, "sample_count": SEGMENTS,
                   "max_attestors_per_segment": max(1, attestors)},
        "dispute": dispute,
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
        "challenge", "postMids", "choose", "commitVote", "revealVote", "resolve", "withdraw")}
    r = chal.market.transact("challenge", job, seg, leaves[seg].state_hash, leaves[seg].loss_e9,
                             tree.proof(seg), leaves[seg + 1].state_hash,
                             leaves[seg + 1].loss_e9, tree.proof(seg + 1))
    gas["challenge"].append(r["gasUsed"])
    did = int(c.reader.market.event_arg(r, "Challenged", "disputeId"))
    d = c.reader.dispute.get_dispute(did)
    while d.phase == Phase.BISECTION:
        hs = [keccak(b"mid%d" % t) for t in d.mid_steps]
        r = solver.dispute.post_mids(did, hs)
        gas["postMids"].append(r["gasUsed"])
        part = len(hs) // 2 if len(hs) > 1 else d.rounds % 2  # a middle part: both ends move
        r = chal.dispute.choose(did, part, hs)
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

    rounds = len(gas["postMids"])
    total = sum(sum(v) for v in gas.values())
    per_round = [p + ch for p, ch in zip(gas["postMids"], gas["choose"], strict=True)]
    return {
        "k": k, "fanout": int(c.reader.dispute.call("params").fanout),
        "jurors": jurors, "attestors": attestors,
        "outcome": "valid" if solver_wins else "invalid",
        "bisection_rounds": rounds,
        "challenge": gas["challenge"][0],
        "postMids_avg": _avg(gas["postMids"]),
        "choose_avg": _avg(gas["choose"]),
        "choose_last_with_jury_draw": gas["choose"][-1],
        "bisection_round_avg": _avg(per_round),
        "bisection_round_max": max(per_round),
        "bisection_round_avg_excl_jury_draw": _avg(per_round[:-1]) if rounds > 1 else None,
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
    ap.add_argument("--fanout", type=int, default=None,
                    help="parts per round (default: the devnet's, compared with 2)")
    a = ap.parse_args()
    node = start_anvil(accounts=_accounts(a.jurors, a.attestors))
    try:
        out = measure_dispute_gas(a.k, a.jurors, a.attestors, a.valid, a.fanout, anvil=node)
        runs = [out]
        if a.fanout is None:
            runs.append(measure_dispute_gas(a.k, a.jurors, a.attestors, a.valid, 2,
                                            anvil=node))
    finally:
        node.stop()
    total_key = f"total_full_dispute_k{out['k']}"
    for run in runs:
        print(f"full dispute, k={run['k']}, fanout {run['fanout']} "
              f"({run['bisection_rounds']} rounds), {run['jurors']} jurors, "
              f"{run['attestors']} attestors, step {run['outcome']}:")
        for key in ("challenge", "postMids_avg", "choose_avg", "choose_last_with_jury_draw",
                    "bisection_round_avg", "commitVote_avg", "revealVote_avg", "resolve",
                    "withdraw_avg"):
            print(f"  {key:<28} {run[key]:>10,}")
        print(f"  {'total (all calls)':<28} {run[total_key]:>10,}  target < {TARGET:,}: "
              f"{'ok' if run['target_ok'] else 'MISSED'}")
    if len(runs) > 1:
        out[f"{total_key}_fanout2"] = runs[1][total_key]
        out["bisection_rounds_fanout2"] = runs[1]["bisection_rounds"]
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main()
