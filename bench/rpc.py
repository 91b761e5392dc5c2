"""RPC requests of a verifier pass, old polling vs the chain view (issue 31), at 10, 100
and 1,000 jobs on a fresh anvil, counted by the proxy of devnet/rpcproxy.py (one HTTP
request each; a JSON-RPC batch counts once).

Jobs are posted through the contracts (JobMarket.postJob). "Old" is the read pattern
of the verifier's pass before the chain view, replayed call for call: its
EventWatcher poll (eth_blockNumber, plus eth_getLogs when a block arrived), the
latest block's timestamp, and one ``getJob`` per job it follows (every job whose
ResultCommitted it saw and has not derived settled in this process: here every job
on chain, the first pass after a restart, or every job in its window). "New" is what
the pass reads now: ``ChainView.update()`` (the Runtime's snapshot; jobs and
disputes come from it). Each is measured on a pass where a block with one new event
arrived (a job posted: "busy") and on one where none did ("idle"); idle requests/hour assume the
default 0.5 s poll interval (7,200 passes an hour).

The collaborative follower (CollabFollower.tick, in every solver and verifier) is a row
of its own: ``--collab`` collaborative jobs are posted (CollabMarket.postCollabJob;
idle: round 0 waiting for its slots to fill, what every follower passes over until
workers come). "Old" replays the tick before it read the snapshot, call for call:
``collabCount``, then per job ``getCollab`` and ``slotHolders`` (round 0's join
window), on every pass with or without a block. "New" is the view's update, which now
also reads the rounds, slot holders, orphan counts and OuterJury cases new events name:
the follower's own reads on a snapshot are zero (tests/test_collab_view.py asserts it).

"ws" is the same view with new heads pushed over anvil's WebSocket
(node/chain/heads.py, ``[rpc] ws_url``): a pass without a block makes no request; the
view still asks for the block number over HTTP once every ``CHECK_EVERY_S`` (30 s), so
an idle hour costs 120 requests.

"explorer" is the explorer's index (node/explorer/index.py, ``ChainIndex``; its own
view plus the node reads a block's events name) taking in the same block ("busy") and
asked again with none ("idle").

Usage: python bench/rpc.py [--sizes 10,100,1000] [--collab 10]
Last line: JSON {"<n>": {"old_busy", "new_busy", "old_idle", "new_idle",
"old_idle_per_hour", "new_idle_per_hour", "ws_busy", "ws_idle", "ws_idle_per_hour",
"explorer_busy", "explorer_idle"},
..., "collab_<m>": {the first six keys}}.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from devnet.anvil import dev_accounts, start_anvil  # noqa: E402
from devnet.deploy import deploy_all  # noqa: E402
from devnet.params import TOKEN, DevnetParams  # noqa: E402
from devnet.rpcproxy import RpcProxy  # noqa: E402
from devnet.testing import FAKE_INIT, job_terms  # noqa: E402
from node.chain.client import ChainClient  # noqa: E402
from node.chain.contracts import CollabTerms  # noqa: E402
from node.chain.events import EventWatcher  # noqa: E402
from node.chain.heads import CHECK_EVERY_S, HeadSubscription  # noqa: E402
from node.chain.ids import CollabId, JobId  # noqa: E402
from node.chain.rpc import make_web3  # noqa: E402
from node.chain.view import ChainView  # noqa: E402
from node.explorer.index import ChainIndex  # noqa: E402

PASSES_PER_HOUR = 3600 / 0.5


def old_pass(c: ChainClient, watcher: EventWatcher, jobs: list[JobId]) -> None:
    """The reads of the verifier's pass before the chain view (node/roles/verifier.py)."""
    watcher.poll()
    c.timestamp()
    for jid in jobs:
        c.market.get_job(jid)


def old_collab_pass(c: ChainClient, jobs: list[CollabId]) -> None:
    """The reads of CollabFollower.tick before the snapshot, for jobs in round 0 waiting
    for their slots (node/roles/collab.py: tick, _live_job, _join_window_over)."""
    c.collab.collab_count()
    for cid in jobs:
        c.collab.get_collab(cid)
        c.collab.slot_holders(cid)


def collab_terms() -> CollabTerms:
    sub_reward, sub_budget, rounds, workers = 10 * TOKEN, 3 * TOKEN, 2, 3
    n = rounds * workers
    return CollabTerms(spec_hash=b"s" * 32, dataset_hash=b"d" * 32,
                       reward=n * sub_reward + 5, verification_budget=n * sub_budget + 1,
                       min_workers=2, max_workers=workers, inner_steps=10,
                       steps_per_segment=5, rounds=rounds, round_duration=600,
                       init_state_hash=FAKE_INIT, outer_init_hash=b"o" * 32)


def counted(proxy: RpcProxy, fn: object, *args: object) -> int:
    n = proxy.counts["total"]
    fn(*args)  # type: ignore[operator]
    return proxy.counts["total"] - n


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", default="10,100,1000")
    ap.add_argument("--collab", type=int, default=10, help="collaborative jobs (0: no row)")
    args = ap.parse_args()
    sizes = [int(s) for s in args.sizes.split(",") if s]
    accts = dev_accounts(4)
    anvil = start_anvil(accounts=10)
    try:
        w3 = make_web3(anvil.url)
        dep = deploy_all(w3, accts[0], DevnetParams(), fund=accts, rpc_url=anvil.url)
        submitter = ChainClient(anvil.url, accts[1], dep)
        terms = job_terms(reward=TOKEN, budget=TOKEN)
        submitter.token.approve(submitter.market.address, 10**30)
        proxy = RpcProxy(anvil.url).start()
        reader = ChainClient(proxy.url, None, dep)
        out: dict[str, dict[str, float]] = {}
        posted = 0
        heads = HeadSubscription(anvil.url.replace("http://", "ws://", 1)).start()
        for n in sizes:
            t0 = time.monotonic()
            while posted < n:
                submitter.market.post_job(terms)
                posted += 1
            jobs = [JobId(j) for j in range(1, n + 1)]
            watcher = EventWatcher(reader.w3, [reader.market, reader.dispute],
                                   start_block=dep.deploy_block)
            view = ChainView(reader)
            wview = ChainView(reader, heads=heads)
            index = ChainIndex(reader, min_age_s=0)
            old_pass(reader, watcher, jobs)  # catch up: all at the head
            view.update()
            index.snapshot()
            wview.update()  # last: its HTTP head check is fresh (one every 30 s)
            submitter.market.post_job(terms)  # a new block with one of our events
            posted += 1
            head = w3.eth.block_number
            deadline = time.monotonic() + 30
            while (heads.head() or 0) < head and time.monotonic() < deadline:
                time.sleep(0.01)
            # The pushed-heads view first: a 1,000-job old pass takes longer than its
            # 30 s check, which would be counted here otherwise.
            ws_busy = counted(proxy, wview.update)
            ws_idle = counted(proxy, wview.update)
            old_busy = counted(proxy, old_pass, reader, watcher, jobs)
            new_busy = counted(proxy, view.update)
            explorer_busy = counted(proxy, index.snapshot)
            old_idle = counted(proxy, old_pass, reader, watcher, jobs)
            new_idle = counted(proxy, view.update)
            explorer_idle = counted(proxy, index.snapshot)
            out[str(n)] = {"old_busy": old_busy, "new_busy": new_busy,
                           "old_idle": old_idle, "new_idle": new_idle,
                           "old_idle_per_hour": old_idle * PASSES_PER_HOUR,
                           "new_idle_per_hour": new_idle * PASSES_PER_HOUR,
                           "ws_busy": ws_busy, "ws_idle": ws_idle,
                           "ws_idle_per_hour": ws_idle * PASSES_PER_HOUR
                           + 3600 / CHECK_EVERY_S,
                           "explorer_busy": explorer_busy, "explorer_idle": explorer_idle}
            print(f"{n:5d} jobs: pass with a new block old {old_busy} / new {new_busy} "
                  f"requests; idle pass old {old_idle} / new {new_idle} "
                  f"({old_idle * PASSES_PER_HOUR:,.0f} vs {new_idle * PASSES_PER_HOUR:,.0f}"
                  f" an hour); pushed heads: {ws_busy} / {ws_idle}; explorer: "
                  f"{explorer_busy} / {explorer_idle}; "
                  f"set-up {time.monotonic() - t0:.1f}s", flush=True)
        heads.close()
        if args.collab:
            out[f"collab_{args.collab}"] = collab_row(submitter, reader, proxy, args.collab)
        proxy.stop()
    finally:
        anvil.stop()
    print(json.dumps(out))


def collab_row(submitter: ChainClient, reader: ChainClient, proxy: RpcProxy,
               m: int) -> dict[str, float]:
    t0 = time.monotonic()
    terms = collab_terms()
    submitter.token.approve(submitter.collab.address, 10**30)
    first = reader.collab.collab_count() + 1
    for _ in range(m):
        submitter.collab.post_collab_job(terms)
    jobs = list(range(first, first + m))
    view = ChainView(reader)
    view.update()
    submitter.collab.post_collab_job(terms)  # a new block with one collaborative event
    jobs.append(jobs[-1] + 1)
    old_busy = counted(proxy, old_collab_pass, reader, jobs)
    new_busy = counted(proxy, view.update)
    old_idle = counted(proxy, old_collab_pass, reader, jobs)
    new_idle = counted(proxy, view.update)
    print(f"{m:5d} collaborative jobs, follower: pass with a new block old {old_busy} / new "
          f"{new_busy} requests; idle pass old {old_idle} / new {new_idle} "
          f"({old_idle * PASSES_PER_HOUR:,.0f} vs {new_idle * PASSES_PER_HOUR:,.0f} an hour);"
          f" set-up {time.monotonic() - t0:.1f}s", flush=True)
    return {"old_busy": old_busy, "new_busy": new_busy, "old_idle": old_idle,
            "new_idle": new_idle, "old_idle_per_hour": old_idle * PASSES_PER_HOUR,
            "new_idle_per_hour": new_idle * PASSES_PER_HOUR}


if __name__ == "__main__":
    main()
