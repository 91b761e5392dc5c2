"""The longest a coalition can hold an honest solver's settlement, and what it pays for it
(issue 30, "delay is priced"), played on a fresh anvil at the devnet's and at
devnet/production.toml's parameters.

The griefers' best play under the horizon rule (disputes and requests open until
committedAt + 2 windows; an ending dispute extends the window no further): griefer A
challenges in the window and stalls on its (long) clock to keep the round open; one
second before the horizon griefer B requests a segment (A's dispute is live), the
solver answers at once, which gives challengers a grace after the answer; in its last
second griefer C opens the final dispute and plays it as long as the rules let it:
each of its bisection moves in the last second of its clock, then the jury's full
lookahead, commit and reveal windows. A is timed out meanwhile. The honest solver moves
at once and calls every permissionless step (timeout, drawJury, resolve, finalize).
The jury votes the step valid (the solver is honest).

Delay is measured from the chain's timestamps: finalize's block minus (committedAt +
verificationWindow), the settlement time with nobody disputing. Before the rule the
same play repeated once per (address, segment): S x addresses links, each up to one
game long (issue 30: 2,000 segments, about 1.8 years).

Usage: python bench/delay.py
Prints one line per parameter set, then as the last line JSON:
{"devnet": {...}, "production": {...}} with, per set, "delay_s", "delay_windows",
"bound_s" (docs/protocol.md's formula), "griefer_bonds_lost_pol", "griefers_net_loss_pol",
"solver_compensated_pol",
"burned_pol", "disputes", "requests".
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from eth_utils import keccak  # noqa: E402

from devnet.anvil import start_anvil  # noqa: E402
from devnet.params import TOKEN, DevnetParams, production_params  # noqa: E402
from devnet.testing import LocalChain, fake_trace, job_terms, own_deployment  # noqa: E402
from node.chain.client import ChainClient  # noqa: E402
from node.chain.contracts import SOLVER, VERIFIER, JobStatus, Phase, Side  # noqa: E402
from node.chain.ids import DisputeId  # noqa: E402

SEGMENTS, K = 16, 50  # k = 50: two bisection rounds at fanout 8
REWARD, BUDGET = 100 * TOKEN, 30 * TOKEN
HORIZON_WINDOWS = 2  # JobMarket.HORIZON_WINDOWS


def worth(c: LocalChain, who: ChainClient) -> int:
    r, a = c.reader, who.address
    return (r.token.balance_of(a) + r.registry.free_stake(a) + r.registry.locked_stake(a)
            + r.registry.node_of(a).unbonding_stake + r.registry.seat_locked_stake(a)
            + r.market.credits(a) + r.dispute.credits(a))


def play(c: LocalChain) -> dict[str, Any]:
    m, g = c.reader.market, c.reader.dispute
    mp, gp = m.market_params(), g.call("params")
    ap = c.reader.availability.availability_params()
    minimum = int(c.reader.registry.call("minVerifierStake"))
    submitter = c[1]
    solver = c.join(2, SOLVER, 500 * TOKEN)
    for i in range(10, 16):  # a pool deep enough that the jury always seats a quorum
        c.extra(i, 200 * TOKEN)
    honest = [c.join(i, VERIFIER, 200 * TOKEN) for i in (3, 4, 5, 6, 7, *range(10, 16))]
    griefers = [c.join(i, VERIFIER, minimum) for i in (8, 9, 0)]
    everyone: dict[str, ChainClient] = {x.address: x for x in [*honest, *griefers]}
    solver0 = worth(c, solver)
    griefers0 = sum(worth(c, x) for x in griefers)
    burned0 = g.total_burned() + m.total_burned()

    job = submitter.post_job(job_terms(REWARD, BUDGET, segments=SEGMENTS, k=K))
    solver.market.claim_job(job)
    leaves, tree = fake_trace(job, SEGMENTS, K)
    solver.market.commit_trace(job, leaves, tree)
    c.mine(mp.sample_lookahead + 1)
    honest[0].market.fix_seed(job)
    for a in m.committee_of(job):
        everyone[a].market.attest(job)
    committed = m.get_job(job).committed_at
    W = mp.verification_window
    horizon = committed + HORIZON_WINDOWS * W

    def challenge(x: ChainClient, seg: int) -> DisputeId:
        return x.market.challenge(job, seg, leaves[seg], tree.proof(seg), leaves[seg + 1],
                                  tree.proof(seg + 1))

    def solver_moves(did: DisputeId) -> None:
        d = g.get_dispute(did)
        solver.dispute.post_mids(did, [keccak(b"m%d" % s) for s in d.mid_steps])

    def at(ts: int) -> None:  # the latest block at timestamp ts (the next one after it)
        now = c.timestamp()
        if ts > now:
            c.advance(ts - now)

    first = challenge(griefers[0], 0)  # A: keeps the round open on its clock
    solver_moves(first)
    at(horizon - 2)
    av = griefers[1].availability
    griefers[1].token.ensure_allowance(av.address, ap.bond)
    av.request(job, 1)  # B, with A live
    solver.availability.publish(job, 1, leaves[1], tree.proof(1), leaves[2], tree.proof(2))
    at(m.get_job(job).window_end - 2)
    last = challenge(griefers[2], 2)  # C: the last dispute the rules admit
    refused = False
    try:
        c.advance(2)
        challenge(honest[0], 3)
    except Exception:  # noqa: BLE001 - a refusal is the expected outcome
        refused = True
    while (d := g.get_dispute(last)).phase == Phase.BISECTION:
        if d.turn == Side.SOLVER:
            solver_moves(last)
        else:  # C moves in the last second of its clock
            at(c.timestamp() + d.challenger_clock_left - 2)
            hashes = g.posted_mids(last, d.mids_root)
            griefers[2].dispute.choose(last, 0, hashes)
    d = g.get_dispute(last)
    c.mine(max(1, d.draw_block - c.reader.block_number() + 1))
    solver.dispute.draw_jury(last)
    d = g.get_dispute(last)
    assert d.phase == Phase.COMMIT, "the jury came up short (Void)"
    for j in d.jury:
        everyone[j].dispute.commit_vote(last, True, keccak(j.encode()))
    at(d.commit_end)
    for j in d.jury:
        everyone[j].dispute.reveal_vote(last, True, keccak(j.encode()))
    at(d.reveal_end)  # every juror revealed: the last reveal resolved it
    # A's clock ran out during C's game: the solver times it out (a loss for A)
    at(c.timestamp() + g.get_dispute(first).challenger_clock_left)
    solver.dispute.timeout(first)
    at(max(m.get_job(job).window_end, c.timestamp() + 1))
    r = solver.market.finalize(job)
    assert m.get_job(job).status == JobStatus.FINALIZED
    settled = int(c.w3.eth.get_block(r["blockNumber"])["timestamp"])
    solver.dispute.settle_delay(job, 1)
    held, owed = c.conservation()
    assert held == owed
    delay = settled - (committed + W)
    rounds = 2  # ceil(log_8 50)
    bound = (W + ap.answer_window + mp.dispute_grace + gp.clock + rounds * gp.clockExtension
             + gp.juryLookahead + 1 + gp.commitWindow + gp.revealWindow)
    return {
        "window_s": W, "delay_s": delay, "delay_windows": round(delay / W, 2),
        "bound_s": bound, "bound_windows": round(bound / W, 2),
        "third_dispute_refused": refused,
        # what the play costs in bonds: A's and C's challenge bonds, B's request share
        "griefer_bonds_lost_pol": (2 * mp.challenge_bond
                                   + ap.bond * ap.solver_share_bps // 10_000) / TOKEN,
        # measured: also moves by what a griefer seated on the committee or jury earned
        "griefers_net_loss_pol": (griefers0 - sum(worth(c, x) for x in griefers)) / TOKEN,
        "solver_compensated_pol": (worth(c, solver) - solver0 - REWARD) / TOKEN,
        "burned_pol": (g.total_burned() + m.total_burned() - burned0) / TOKEN,
        "disputes": 2, "requests": 1, "segments": SEGMENTS, "steps_per_segment": K,
    }


def main() -> None:
    anvil = start_anvil(accounts=10)
    try:
        out = {}
        for name, params in (("devnet", DevnetParams()), ("production", production_params())):
            with own_deployment(anvil, params) as c:
                out[name] = play(c)
            f = out[name]
            print(f"{name}: settlement held {f['delay_s']} s = {f['delay_windows']} windows "
                  f"past the window (bound {f['bound_s']} s = {f['bound_windows']}); "
                  f"griefers' bonds lost {f['griefer_bonds_lost_pol']} POL (net "
                  f"{f['griefers_net_loss_pol']}), solver compensated "
                  f"{f['solver_compensated_pol']} POL, burned {f['burned_pol']} POL")
        print(json.dumps(out))
    finally:
        anvil.stop()


if __name__ == "__main__":
    main()
