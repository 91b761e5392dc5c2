"""Gas of one whole dispute over a k-step segment (default k = 64).

Deploys the contracts on a fresh anvil with production sampling (64 segments, 44
sampled, a committee of 3 that attests), then plays: challenge of a sampled segment ->
ceil(log_fanout(k)) bisection rounds (postMids + choose; the last choose requests the
jury) -> drawJury once the seed block is mined -> every juror commits and reveals ->
resolve -> finalize of the condemned round after the window (the solver's bond split
once, the attestors slashed, the winner and its jury paid) -> everyone credited
withdraws (the market credits the challenger, the submitter and, for an invalid step,
the majority jurors; the game credits jurors' slashes and shares of a lost challenge). Gas is
each receipt's gasUsed; the committee's own attestations belong to the job's life
(bench/gas.py), not to the dispute. The figures are of a dispute after warm-up disputes
on the same contracts paid every node once (an account's first credit ever writes a
fresh storage word); the first dispute on fresh contracts is printed beside them.

The default outcome is the costlier one: the step is invalid, and the challenger picks
a middle part whenever there is one (both range ends move: two hash writes).
``--valid`` measures the solver winning instead (the challenger's bond is slashed:
part to the jury, the rest burned; nothing to finalize or claim for the dispute).

The same run also plays the game deployed with fanout 2 (plain halving) for
comparison, unless ``--fanout`` picks one.

Usage: python bench/gas_dispute.py [--k 64] [--jurors 3] [--valid] [--fanout N]
Last stdout line: JSON with per-call gas, ``total_full_dispute_k<k>``, ``target_gas``
and ``target_ok`` (total without the per-account withdrawals <= 1.2M gas, as a job's
life in bench/gas.py) for the devnet's fanout, and
``total_full_dispute_k<k>_fanout2``. ``measure_dispute_gas`` returns one run's dict
for bench/gas.py to merge.
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
from devnet.testing import LocalChain, fake_trace, job_terms, set_balance  # noqa: E402
from node.chain.contracts import SOLVER, VERIFIER, Phase  # noqa: E402
from node.chain.ids import DisputeId  # noqa: E402
from node.chain.rpc import make_web3  # noqa: E402

TARGET = 1_200_000
SEGMENTS, SAMPLES, COMMITTEE = 64, 44, 3  # production sampling, as in bench/gas.py
SOLVER_STAKE = 500 * TOKEN
MAX_WARMUP_DISPUTES = 16  # bounded: measure anyway once reached (all_paid_before says)
CALLS = ("challenge", "postMids", "choose", "drawJury", "commitVote", "revealVote",
         "finalize", "withdraw")


def _avg(xs: list[int]) -> int:
    return round(sum(xs) / len(xs)) if xs else 0


def _accounts(jurors: int) -> int:
    # deployer, solver, challenger, submitter; the committee, the jury and as many again
    return 4 + COMMITTEE + 2 * jurors + 3


def measure_dispute_gas(k: int = 64, jurors: int = 3, solver_wins: bool = False,
                        fanout: int | None = None,
                        anvil: AnvilProcess | None = None) -> dict[str, Any]:
    """Run one full dispute over a ``k``-step segment and return its gas figures.

    Starts (and stops) its own anvil unless ``anvil`` is given; always deploys
    fresh contracts, with the devnet's fanout unless ``fanout`` is given.
    """
    if k < 2:
        raise ValueError("k must be >= 2")
    n_accounts = _accounts(jurors)
    dispute: dict[str, Any] = {"jury_size": jurors, "quorum": jurors // 2 + 1}
    if fanout is not None:
        dispute["fanout"] = fanout
    params = DevnetParams.model_validate({
        "accounts": n_accounts,
        "registry": {"unbond_delay": 7200},
        "market": {"verification_window": 3600, "sample_count": SAMPLES,
                   "attestors_per_job": COMMITTEE},
        "dispute": dispute,
    })
    own = anvil is None
    node = anvil or start_anvil(accounts=n_accounts)
    try:
        accts = dev_accounts(n_accounts)
        w3 = make_web3(node.url)
        for a in accts:  # a shared anvil may fund fewer accounts with ether
            set_balance(w3, a.address, 10**24)
        dep = deploy_all(w3, accts[0], params, fund=accts, rpc_url=node.url)
        return _play(LocalChain(node, dep), k, jurors, solver_wins)
    finally:
        if own:
            node.stop()


def _play(c: LocalChain, k: int, jurors: int, solver_wins: bool) -> dict[str, Any]:
    solver_i = 1
    cap = int(c.reader.registry.call("sortitionCap"))
    c.join(solver_i, SOLVER, SOLVER_STAKE)
    for i in range(4, len(c.clients)):
        c.join(i, VERIFIER, cap)  # at the cap: every draw attempt on one is accepted
    # The first dispute on fresh contracts pays one-time writes, and every account's
    # first credit ever writes a fresh word (22.1k gas) where a later one rewrites a
    # dirty one (2.9k). Warm-up disputes run until every verifier, the challenger and
    # the submitter have been paid once (bounded); the figures are the next dispute's,
    # what a dispute costs a network whose nodes have been paid before.
    first, paid = _dispute(c, k, jurors, solver_wins, first=True)
    warmups = 1
    everyone = set(c.addresses[2:])
    while not solver_wins and not everyone <= paid and warmups < MAX_WARMUP_DISPUTES:
        _, more = _dispute(c, k, jurors, solver_wins, first=False)
        paid |= more
        warmups += 1
    gas, _ = _dispute(c, k, jurors, solver_wins, first=False)
    out = _summary(gas, c, k, jurors, solver_wins)
    out["total_first_dispute_fresh"] = sum(sum(v) for v in first.values())
    out["warmup_disputes"] = warmups
    out["all_paid_before"] = everyone <= paid
    return out


def _top_up(c: LocalChain, i: int, target: int) -> None:
    """Stake account ``i`` back up to ``target`` free stake (slashes drain it)."""
    free = c.reader.registry.free_stake(c.addresses[i])
    if free < target:
        c[i].stake(target - free)


def _dispute(c: LocalChain, k: int, jurors: int, solver_wins: bool,
             first: bool) -> tuple[dict[str, list[int]], set[str]]:
    solver_i, chal_i, submitter_i = 1, 2, 3
    cap = int(c.reader.registry.call("sortitionCap"))
    sub, solver, chal = c[submitter_i], c[solver_i], c[chal_i]
    m, g = c.reader.market, c.reader.dispute
    idx = c.addresses.index
    if not first:  # stake moved before the commit: the draws' snapshots do not see it
        _top_up(c, solver_i, SOLVER_STAKE)
        for i in range(4, len(c.clients)):
            _top_up(c, i, cap)

    job = sub.post_job(job_terms(100 * TOKEN, 30 * TOKEN, 3600, SEGMENTS, k))
    solver.market.claim_job(job)
    leaves, tree = fake_trace(job, SEGMENTS, k)
    solver.market.commit_trace(job, leaves, tree)
    # the challenger stakes after the commit: never on the committee it then disputes
    if first:
        c.join(chal_i, VERIFIER, cap)
    else:  # any stake move after the commit block keeps it off the committee's draw
        _top_up(c, chal_i, cap)
        chal.stake(1)
    c.mine(m.market_params().sample_lookahead + 1)
    sub.market.fix_seed(job)
    committee = m.committee_of(job)
    assert len(committee) == COMMITTEE, committee
    assert chal.address not in committee
    for a in committee:
        c[idx(a)].market.attest(job)
    sampled = m.sampled_segments(job)
    seg = sampled[len(sampled) // 2]  # a sampled segment: an invalid verdict slashes attestors

    gas: dict[str, list[int]] = {n: [] for n in CALLS}
    r = chal.market.transact("challenge", job, seg, leaves[seg].state_hash, leaves[seg].loss_e9,
                             tree.proof(seg), leaves[seg + 1].state_hash,
                             leaves[seg + 1].loss_e9, tree.proof(seg + 1))
    gas["challenge"].append(r["gasUsed"])
    did = DisputeId(int(m.event_arg(r, "Challenged", "disputeId")))
    d = g.get_dispute(did)
    while d.phase == Phase.BISECTION:
        hs = [keccak(b"mid%d" % t) for t in d.mid_steps]
        r = solver.dispute.post_mids(did, hs)
        gas["postMids"].append(r["gasUsed"])
        part = len(hs) // 2 if len(hs) > 1 else d.rounds % 2  # a middle part: both ends move
        r = chal.dispute.choose(did, part, hs)
        gas["choose"].append(r["gasUsed"])
        d = g.get_dispute(did)
    assert d.phase == Phase.DRAWING, d.phase
    behind = d.draw_block - int(c.w3.eth.block_number)
    if behind > 0:
        c.mine(behind)
    r = sub.dispute.draw_jury(did)  # anyone: here the submitter
    gas["drawJury"].append(r["gasUsed"])
    d = g.get_dispute(did)
    assert len(d.jury) == jurors, f"drew {len(d.jury)} jurors, wanted {jurors}"

    for j in d.jury:
        r = c[idx(j)].dispute.commit_vote(did, solver_wins, keccak(b"salt" + j.encode()))
        gas["commitVote"].append(r["gasUsed"])
    c.rpc("evm_mine", d.commit_end)
    for j in d.jury:
        r = c[idx(j)].dispute.reveal_vote(did, solver_wins, keccak(b"salt" + j.encode()))
        gas["revealVote"].append(r["gasUsed"])
    # every juror revealed: the last reveal settled the dispute (no resolve transaction)
    assert g.get_dispute(did).phase == Phase.RESOLVED
    assert g.get_dispute(did).solver_won == solver_wins
    if not solver_wins:
        c.rpc("evm_mine", m.get_job(job).window_end)
        r = sub.market.finalize(job)  # the condemned round: bond split, attestors slashed
        gas["finalize"].append(r["gasUsed"])
        assert m.events(r, "AttestorSlashed"), "the sampled segment's attestors were not slashed"
        assert m.events(r, "RewardPaid"), "finalize did not pay the round's winner"
    paid: set[str] = set()
    for i, who in enumerate(c.addresses):  # jurors of an invalid step: paid by the market
        if g.credits(who) or m.credits(who):
            paid.add(who)
        if g.credits(who):
            gas["withdraw"].append(c[i].dispute.transact("withdraw")["gasUsed"])
        if m.credits(who):
            gas["withdraw"].append(c[i].market.transact("withdraw")["gasUsed"])
    # a valid step leaves half its lost bond held for the round's solver (settleDelay,
    # once the round settles: not part of the dispute)
    assert g.total_owed() == g.total_delay_held() and int(m.call("totalCredits")) == 0

    return gas, paid


def _summary(gas: dict[str, list[int]], c: LocalChain, k: int, jurors: int,
             solver_wins: bool) -> dict[str, Any]:
    g = c.reader.dispute
    rounds = len(gas["postMids"])
    total = sum(sum(v) for v in gas.values())
    per_round = [p + ch for p, ch in zip(gas["postMids"], gas["choose"], strict=True)]
    dispute_game = (sum(gas["postMids"]) + sum(gas["choose"]) + sum(gas["drawJury"])
                    + sum(gas["commitVote"]) + sum(gas["revealVote"]))
    return {
        "k": k, "fanout": int(g.call("params").fanout),
        "jurors": jurors, "attestors": COMMITTEE, "segments": SEGMENTS,
        "sampled_segments": SAMPLES,
        "outcome": "valid" if solver_wins else "invalid",
        "bisection_rounds": rounds,
        "challenge": gas["challenge"][0],
        "postMids_avg": _avg(gas["postMids"]),
        "choose_avg": _avg(gas["choose"]),
        "choose_last_with_jury_request": gas["choose"][-1],
        "bisection_round_avg": _avg(per_round),
        "bisection_round_max": max(per_round),
        "drawJury": gas["drawJury"][0],
        "commitVote_avg": _avg(gas["commitVote"]),
        # the last juror's reveal settles (what a separate `resolve` did before)
        "revealVote_avg": _avg(gas["revealVote"][:-1]),
        "revealVote_last_resolves": gas["revealVote"][-1],
        "finalize_condemned": gas["finalize"][0] if gas["finalize"] else None,
        "withdraw_avg": _avg(gas["withdraw"]),
        "withdraw_count": len(gas["withdraw"]),
        "tx_count": sum(len(v) for v in gas.values()),
        "subtotal_game_moves": dispute_game,
        "subtotal_settlement": total - dispute_game,
        f"total_full_dispute_k{k}": total,
        # withdrawals are per account (one pulls any number of credits)
        f"total_full_dispute_k{k}_without_withdrawals": total - sum(gas["withdraw"]),
        "target_gas": TARGET,
        "target_ok": total - sum(gas["withdraw"]) <= TARGET,
    }


def print_run(run: dict[str, Any]) -> None:
    total = run[f"total_full_dispute_k{run['k']}"]
    print(f"full dispute, k={run['k']}, fanout {run['fanout']} "
          f"({run['bisection_rounds']} rounds), {run['jurors']} jurors, "
          f"{run['attestors']} attestors, step {run['outcome']}:")
    for key in ("challenge", "postMids_avg", "choose_avg", "choose_last_with_jury_request",
                "bisection_round_avg", "drawJury", "commitVote_avg", "revealVote_avg",
                "revealVote_last_resolves", "finalize_condemned", "withdraw_avg"):
        if run[key] is not None:
            print(f"  {key:<30} {run[key]:>10,}")
    print(f"  {'withdrawals':<30} {run['withdraw_count']:>10}")
    bare = run[f"total_full_dispute_k{run['k']}_without_withdrawals"]
    print(f"  {'total (' + str(run['tx_count']) + ' transactions)':<30} {total:>10,}")
    print(f"  {'without withdrawals':<30} {bare:>10,}  target <= {TARGET:,}: "
          f"{'ok' if run['target_ok'] else 'MISSED by ' + format(bare - TARGET, ',')}")
    print(f"  (the first dispute on fresh contracts: {run['total_first_dispute_fresh']:,}; "
          f"the figures above follow {run['warmup_disputes']} warm-up disputes, every node "
          f"paid before: {run['all_paid_before']})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--k", type=int, default=64)
    ap.add_argument("--jurors", type=int, default=3)
    ap.add_argument("--valid", action="store_true", help="the solver wins (step valid)")
    ap.add_argument("--fanout", type=int, default=None,
                    help="parts per round (default: the devnet's, compared with 2)")
    a = ap.parse_args()
    node = start_anvil(accounts=_accounts(a.jurors))
    try:
        out = measure_dispute_gas(a.k, a.jurors, a.valid, a.fanout, anvil=node)
        runs = [out]
        if a.fanout is None:
            runs.append(measure_dispute_gas(a.k, a.jurors, a.valid, 2, anvil=node))
    finally:
        node.stop()
    for run in runs:
        print_run(run)
    total_key = f"total_full_dispute_k{out['k']}"
    if len(runs) > 1:
        out[f"{total_key}_fanout2"] = runs[1][total_key]
        out["bisection_rounds_fanout2"] = runs[1]["bisection_rounds"]
    print(json.dumps(out, sort_keys=True))


if __name__ == "__main__":
    main()
