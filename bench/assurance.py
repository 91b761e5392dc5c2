"""Assurance a submitter can buy (issue 30, item 6): for S = 20, 100, 1,000 and 1,024
segments, the n a submitter needs to catch an edit of ONE segment with 50 / 90 / 99 %
(P = n / S), the fee multiple it escrows (n / floor, floor = the market's n = 7), and the
worst gas of the on-chain sample lookup a dispute's resolve runs for that n
(`SegmentSampler.indexOf` of the sample's last-drawn segment, through LibHarness on a
fresh anvil, eth_estimateGas: a transaction's 21,000 base included). The lookup is what
`JobMarket.MAX_SAMPLES` = 1,024 bounds.

    python bench/assurance.py        # table, then one JSON line
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from devnet.anvil import start_anvil  # noqa: E402
from devnet.params import DevnetParams  # noqa: E402
from node.chain.rpc import make_web3  # noqa: E402
from node.incentives import (  # noqa: E402
    MAX_JOB_SAMPLES,
    catch_one_edit,
    sample_floor,
    samples_to_catch_one_edit,
)
from node.proof import sample_segments  # noqa: E402

SEED = b"\x42" * 32


def main() -> dict[str, Any]:
    floor_n = DevnetParams().market.sample_count
    node = start_anvil(accounts=2)
    try:
        w3 = make_web3(node.url)
        art = json.loads((ROOT / "contracts" / "out" / "LibHarness.json").read_text())
        factory = w3.eth.contract(abi=art["abi"], bytecode=art["bytecode"])
        rcpt = w3.eth.wait_for_transaction_receipt(
            factory.constructor().transact({"from": w3.eth.accounts[0]}))
        h = w3.eth.contract(address=rcpt["contractAddress"], abi=art["abi"])
        cases = []
        for segments in (20, 100, 1000, MAX_JOB_SAMPLES):
            floor = sample_floor(floor_n, segments)
            for p in (0.5, 0.9, 0.99, 1.0):
                n = samples_to_catch_one_edit(p, segments)
                if n > MAX_JOB_SAMPLES:
                    continue
                last = sample_segments(SEED, segments, n)[-1]  # the most draws to find
                gas = h.functions.indexOf(SEED, segments, n, last).estimate_gas()
                assert h.functions.indexOf(SEED, segments, n, last).call() == n - 1
                cases.append({"S": segments, "target": p, "n": n,
                              "p_catch_one_edit": round(catch_one_edit(n, segments), 4),
                              "fee_x_floor": round(n / floor, 3),
                              "index_of_worst_gas": gas})
        shipped = {s: catch_one_edit(floor_n, s) for s in (20, 100, 1000)}
    finally:
        node.stop()
    print(f"floor n = {floor_n}: P(catch one edit) = "
          + ", ".join(f"{p:.3g} at S = {s}" for s, p in shipped.items()))
    print(f"{'S':>5} {'target':>6} {'n':>5} {'P':>7} {'fee x':>7} {'indexOf gas':>12}")
    for c in cases:
        print(f"{c['S']:>5} {c['target']:>6} {c['n']:>5} {c['p_catch_one_edit']:>7} "
              f"{c['fee_x_floor']:>7} {c['index_of_worst_gas']:>12,}")
    return {"floor_n": floor_n, "shipped": shipped, "cases": cases}


if __name__ == "__main__":
    print(json.dumps(main()))
