"""A jury pool that cannot be diluted (issue 30, item 2): draws beside dead entries.

For 0 and 10,000 dead pool entries (addresses that staked the minimum once and
unbonded: slots of weight 0 in the registry's sortition tree, written into storage,
`LocalChain.fill_dead_pool`) beside 6 live verifiers at the sortition cap, on fresh
devnet contracts on one anvil:
- the share of 200 view draws (`sortition`, 3 seats, distinct seeds) that seat a full
  jury of 3;
- `--disputes` real disputes (challenge of a faked trace, bisection to one step,
  `drawJury` once the seed block is mined): the share that seated a full jury and
  the largest `drawJury` gas;
- the gas of one `stake` by a live verifier that moves its tree weight (the tree
  write every verifier stake change pays).
Issue 30 measured, with the append-only pool it replaces: full quorum in 0.05 of
draws with 320 dead entries. Target: every draw full at 10,000, drawJury < 250k gas.

Usage: python bench/gas_pool.py [--dead 0 10000] [--disputes 6]
Last stdout line: JSON {"full_jury_share_view_<n>", "full_jury_share_disputes_<n>",
"draw_jury_gas_max_<n>", "stake_gas_<n>" for each n, "draw_jury_gas_max",
"target_draw_jury_gas", "target_ok"}.
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

from devnet.anvil import start_anvil  # noqa: E402
from devnet.params import TOKEN, DevnetParams  # noqa: E402
from devnet.testing import LocalChain, fake_trace, job_terms, own_deployment  # noqa: E402
from node.chain.contracts import SOLVER, VERIFIER, Phase, Side  # noqa: E402

TARGET = 250_000
SEGMENTS, K = 8, 4
LIVE = (3, 4, 5, 6, 7, 8)  # dev accounts of the live verifiers
VIEW_DRAWS = 200


def _dispute(c: LocalChain, n: int) -> tuple[int, int]:
    """One dispute to its jury; returns (jurors seated, drawJury gas)."""
    owner, solver = c[1], c[2]
    chal = c[LIVE[n % len(LIVE)]]
    job = owner.post_job(job_terms(100 * TOKEN, 30 * TOKEN, segments=SEGMENTS, k=K))
    solver.market.claim_job(job)
    leaves, tree = fake_trace(job, SEGMENTS, K, tag=f"pool{n}")
    solver.market.commit_trace(job, leaves, tree)
    seg = 1 + n % (SEGMENTS - 2)
    g = c.reader.dispute
    did = chal.market.challenge(job, seg, leaves[seg], tree.proof(seg), leaves[seg + 1],
                                tree.proof(seg + 1))
    while (d := g.get_dispute(did)).phase == Phase.BISECTION:
        if d.turn == Side.SOLVER:
            solver.dispute.post_mids(did, [keccak(b"m%d" % s) for s in d.mid_steps])
        else:
            chal.dispute.choose(did, 0, g.posted_mids(did, d.mids_root))
    d = g.get_dispute(did)
    c.mine(max(1, d.draw_block - c.reader.block_number() + 1))
    r = c[0].dispute.draw_jury(did)
    return len(g.get_dispute(did).jury), int(r["gasUsed"])


def measure(dead: int, disputes: int, c: LocalChain) -> dict[str, Any]:
    reg = c.reader.registry
    cap = int(reg.call("sortitionCap"))
    if dead:
        c.fill_dead_pool(dead)
    for i in LIVE:  # the last below the cap, so its `stake` below moves its weight
        c.join(i, SOLVER | VERIFIER, cap - (10 * TOKEN if i == LIVE[-1] else 0))
    c.join(2, SOLVER, 2_000 * TOKEN)  # a bond per job
    pool_len = int(reg.call("verifierCount"))
    block = c.reader.block_number()
    full = sum(len(reg.sortition(keccak(b"view%d" % s), 3, pool_len, block, [])) == 3
               for s in range(VIEW_DRAWS))
    seated, gas = [], []
    for n in range(disputes):
        s, g = _dispute(c, n)
        seated.append(s)
        gas.append(g)
    v = c[LIVE[-1]]
    v.token.ensure_allowance(reg.address, TOKEN)
    stake_gas = int(v.registry.stake(TOKEN)["gasUsed"])

    return {f"full_jury_share_view_{dead}": full / VIEW_DRAWS,
            f"full_jury_share_disputes_{dead}": sum(s == 3 for s in seated) / len(seated),
            f"draw_jury_gas_max_{dead}": max(gas), f"stake_gas_{dead}": stake_gas,
            f"pool_len_{dead}": pool_len}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dead", type=int, nargs="+", default=[0, 10_000])
    ap.add_argument("--disputes", type=int, default=6)
    args = ap.parse_args()
    params = DevnetParams.model_validate({"accounts": 10})
    anvil = start_anvil(accounts=10)
    out: dict[str, Any] = {}
    try:
        for dead in args.dead:
            with own_deployment(anvil, params) as c:
                m = measure(dead, args.disputes, c)
            out.update(m)
            print(json.dumps(m), flush=True)
    finally:
        anvil.stop()
    out["draw_jury_gas_max"] = max(v for k, v in out.items() if k.startswith("draw_jury_gas_max_"))
    out["target_draw_jury_gas"] = TARGET
    out["target_ok"] = out["draw_jury_gas_max"] < TARGET and all(
        v == 1.0 for k, v in out.items() if k.startswith("full_jury_share_"))
    print(json.dumps(out))


if __name__ == "__main__":
    main()
