"""What stalling a collaborative job by squatting its slots costs (issue 30 item 5), before
and after the rule that a miss forfeits the slot bond and a node with no delivered record
holds one slot per job. Arithmetic over the devnet's deployed parameters (devnet/params.py
defaults) and the attack's shape from the issue, not a chain run: the per-slot figures it
multiplies are the ones tests/test_collab_market.py asserts on anvil
(``test_a_squatter_without_a_record_holds_one_slot_and_pays_for_missing``).

The attack (issue 30): one address takes all N = 16 slots, claims each reserved sub-job
and lets it lapse, every attempt (1 + maxRoundRetries), until the job fails. Before: it
lost the market's missed-deadline share of each sub-job bond (0.94 POL bond, 50%) and got
its slot bonds back. The docs' idle path (slots held, sub-jobs never claimed) cost one
slot bond per slot per attempt. After: each address holds one slot, so a stall needs
N - minWorkers + 1 addresses (each a registered solver), and each miss costs the slot bond
and, if claimed, the missed-deadline share.

Usage: python bench/collab_squat.py [--slots 16] [--min-workers 1] [--sub-bond 0.94]
Last line: JSON.
"""

from __future__ import annotations

import argparse
import json

from devnet.params import TOKEN, CollabParams, MarketParams, RegistryParams

BPS = 10_000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--slots", type=int, default=16)
    ap.add_argument("--min-workers", type=int, default=1)
    ap.add_argument("--sub-bond", type=float, default=0.94, help="POL per sub-job bond")
    a = ap.parse_args()
    cp, mp, rp = CollabParams(), MarketParams(), RegistryParams()
    attempts = 1 + cp.max_round_retries
    slot_bond = cp.slot_bond / TOKEN
    miss_share = a.sub_bond * mp.missed_deadline_slash_bps / BPS
    before = attempts * a.slots * miss_share  # one address, slot bonds back
    idle_path = attempts * a.slots * slot_bond  # the price the docs gave for a stall
    squatters = a.slots - a.min_workers + 1  # one slot each, now
    after_claimed = attempts * squatters * (slot_bond + miss_share)
    after_unclaimed = attempts * squatters * slot_bond
    out = {
        "bench": "collab_squat", "computed_from": "devnet/params.py defaults",
        "slots": a.slots, "min_workers": a.min_workers, "attempts": attempts,
        "slot_bond_pol": slot_bond, "sub_job_bond_pol": a.sub_bond,
        "missed_share_pol": round(miss_share, 4),
        "before": {"addresses": 1, "cost_pol": round(before, 2),
                   "idle_path_pol": round(idle_path, 2),
                   "idle_path_over_attack": round(idle_path / before, 1)},
        "after": {"addresses": squatters,
                  "stake_locked_pol": squatters * rp.min_solver_stake / TOKEN,
                  "cost_claimed_pol": round(after_claimed, 2),
                  "cost_unclaimed_pol": round(after_unclaimed, 2),
                  "one_address_slots": 1},
        "after_over_before": round(min(after_claimed, after_unclaimed) / before, 1),
    }
    print(json.dumps(out))


if __name__ == "__main__":
    main()
