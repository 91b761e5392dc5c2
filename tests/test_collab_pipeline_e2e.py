"""Pipelined collaborative rounds (issue 35), the daemons' side, end to end: real `polnet`
daemons as OS processes on an anvil devnet with the CollabMarket, loopback libp2p and
real training of the demo's small char LM.

One job at pipeline depth D = 2, two honest workers on its two slots, three rounds. The
daemons post each round's candidate theta_{r+1} as soon as its deltas are committed and
start round r + 1 on it while round r is still open to challenge. Asserted: the job
finishes; some round started (from the chain's events) before its predecessor was
finalized; every worker was paid exactly its accepted runs (sub-reward plus its share
of each round's pot); the contracts hold exactly what they owe.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from devnet.localnet import LocalNet
from node.chain.ids import CollabId, JobId
from node.datasets import pack_text, write_dataset
from node.demo_collab import collab_demo_params, collab_spec_dict

pytestmark = pytest.mark.timeout(900)

SUBMITTER, VERIFIERS = 1, (4, 5, 6)
WORKERS = {"worker-1": 2, "worker-2": 3}
ROUNDS, DEPTH = 3, 2


def write_inputs(data: Path, min_workers: int, max_workers: int) -> tuple[Path, Path]:
    """The demo's char LM on ``max_workers`` slots, ``min_workers`` needed each round."""
    data.mkdir(parents=True, exist_ok=True)
    text = data / "text.safetensors"
    h = write_dataset(pack_text(), text)
    d = collab_spec_dict(h, ROUNDS)
    d["workers"] = {"min": min_workers, "max": max_workers}
    spec = data / "collab.json"
    spec.write_text(json.dumps(d))
    return spec, text


@dataclass
class Run:
    cid: CollabId
    before: dict[str, int]  # each worker's holdings before the job
    spec: Path
    text: Path


def run_job(net: LocalNet, tmp: Path, workers: dict[str, int], min_workers: int,
            reward: int, cheats: dict[str, str] | None = None, timeout_s: float = 780) -> Run:
    """Start verifiers and workers (``cheats``: a worker's behaviour, honest otherwise),
    post the D = 2 job and wait for its end with no orphan left."""
    spec, text = write_inputs(tmp / "data", min_workers, len(workers))
    for i, v in enumerate(VERIFIERS, start=1):
        net.start_verifier(f"v{i}", v)
    for name, acct in workers.items():
        net.start_solver(name, acct, (cheats or {}).get(name, "honest"))
    before = {n: net.holdings(net.address(a)) for n, a in workers.items()}
    cid = net.submit_collab("sub", SUBMITTER, spec, text, reward=reward, budget=reward // 10,
                            round_duration=60, pipeline_depth=DEPTH)
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if net.c.collab.get_collab(cid).status.name in ("FINISHED", "FAILED") \
                and net.c.collab.orphans_of(cid) == 0:
            break
        net.check_alive()
        time.sleep(1)
    return Run(cid, before, spec, text)


def job_events(net: LocalNet, cid: CollabId) -> list[Any]:
    return [e for e in net.events() if e.contract == "CollabMarket"
            and e.args.get("jobId") == cid]


@pytest.mark.serial  # its rounds race the wall clock: one at a time
def test_a_pipelined_job_overlaps_its_rounds_and_pays_every_worker(tmp_path: Path) -> None:
    with LocalNet(tmp_path / "net", collab_demo_params()) as net:
        c = net.c
        run = run_job(net, tmp_path, WORKERS, len(WORKERS), reward=60)
        cid, before = run.cid, run.before
        job = c.collab.get_collab(cid)
        assert job.status.name == "FINISHED", f"job ended {job.status.name}; logs {net.home}"
        assert job.pipeline_depth == DEPTH
        time.sleep(6)  # the daemons withdraw what they were credited
        evs = job_events(net, cid)
        started = {int(e.args["round"]): e.block_number for e in evs
                   if e.event == "RoundStarted"}
        accepted_at = {int(e.args["round"]): e.block_number for e in evs
                       if e.event == "OuterAccepted"}
        assert sorted(accepted_at) == list(range(ROUNDS))
        assert not any(e.event == "RoundsRolledBack" for e in evs)
        # Overlap: a round began while its predecessor was not finalized yet.
        overlapped = [r for r in range(1, ROUNDS) if started[r] < accepted_at[r - 1]]
        assert overlapped, (started, accepted_at)
        # Every worker paid exactly its accepted runs.
        accepted = [e.args for e in evs if e.event == "SubJobAccepted"]
        assert len(accepted) == ROUNDS * len(WORKERS)
        per_run = {int(e.args["round"]): int(e.args["perWorker"]) for e in evs
                   if e.event == "RoundSettled"}
        for name, acct in WORKERS.items():
            addr = net.address(acct).lower()
            mine = [a for a in accepted if str(a["worker"]).lower() == addr]
            assert len(mine) == ROUNDS
            owed = sum(job.sub_reward + per_run[int(a["round"])] for a in mine)
            assert net.holdings(net.address(acct)) - before[name] == owed, name
        assert net.conserved(), net.books()


BYZ_WORKERS = {"worker-1": 2, "worker-2": 3, "worker-byz": 7}


def honest_final_hash(spec_path: Path, text: Path, honest_slots: list[int]) -> bytes:
    """theta_R of the job computed here, without the node: every round's outer step over
    the honest slots' inner runs alone (node.train.inner.inner_run is a sub-job's trace
    bit for bit: tests/test_collab_rounds.py)."""
    from node.datasets import load_dataset
    from node.spec import load_collaborative_spec
    from node.train.diloco import initial_outer_state, outer_hash, outer_step
    from node.train.inner import inner_run
    from node.train.shards import worker_context

    spec = load_collaborative_spec(spec_path)
    ds = load_dataset(text, spec.inner.dataset_hash)
    ctxs = {s: worker_context(spec, ds, s) for s in honest_slots}
    state = initial_outer_state(spec)
    for r in range(spec.outer_rounds):
        deltas = {s: inner_run(ctx, state.theta, r).delta for s, ctx in ctxs.items()}
        state = outer_step(state, deltas, spec.outer_optimizer)
    return outer_hash(state)


@pytest.mark.serial  # its rounds race the wall clock: one at a time
def test_a_condemned_delta_rolls_back_the_rounds_built_on_it(tmp_path: Path) -> None:
    """Three workers on three slots (two needed), one byzantine (``skip``: its runs skip
    their inner steps, condemned in the ordinary dispute game). Its delta is in its
    round's candidate, on which the daemons start the next rounds; its condemnation
    rolls them back, the daemons recompute the next state without it and run them again,
    and settle the orphans. Asserted: a roll-back of the rounds after the one its first
    condemned run was in (reason 0, a condemned delta);
    the job finishes with the outer state of the honest slots' runs alone, recomputed
    here; the byzantine worker is excluded and never accepted; every orphan is settled,
    the honest workers' paid; each honest worker gains exactly its accepted runs (sub-
    reward and pot share) plus its paid orphans' sub-rewards; the contracts hold what
    they owe."""
    with LocalNet(tmp_path / "net", collab_demo_params()) as net:
        c = net.c
        run = run_job(net, tmp_path, BYZ_WORKERS, 2, reward=90, cheats={"worker-byz": "skip"})
        cid, before, spec, text = run.cid, run.before, run.spec, run.text
        job = c.collab.get_collab(cid)
        assert job.status.name == "FINISHED", f"job ended {job.status.name}; logs {net.home}"
        assert c.collab.orphans_of(cid) == 0, f"orphans left; logs {net.home}"
        time.sleep(6)  # the daemons withdraw what they were credited
        events = net.events()
        evs = [e for e in events if e.contract == "CollabMarket" and e.args.get("jobId") == cid]
        addr = {n: net.address(a).lower() for n, a in BYZ_WORKERS.items()}
        condemned = [int(e.args["round"]) for e in evs if e.event == "SubJobDropped"
                     and str(e.args["worker"]).lower() == addr["worker-byz"]
                     and e.args["reason"] == 1]
        assert condemned
        rolled = [e.args for e in evs if e.event == "RoundsRolledBack"]
        assert rolled and rolled[0]["firstRound"] == min(condemned) + 1 \
            and rolled[0]["reason"] == 0, (rolled, condemned)
        accepted = [e.args for e in evs if e.event == "SubJobAccepted"]
        assert not any(str(a["worker"]).lower() == addr["worker-byz"] for a in accepted)
        assert c.collab.is_excluded(cid, net.address(BYZ_WORKERS["worker-byz"]))
        slot_of = {str(e.args["node"]).lower(): int(e.args["slot"]) for e in evs
                   if e.event == "SlotClaimed"}
        honest = sorted(slot_of[addr[n]] for n in ("worker-1", "worker-2"))
        assert job.outer_hash == honest_final_hash(spec, text, honest)
        # Orphans: every one settled; the honest workers' runs paid.
        orphans = {JobId(int(e.args["marketJobId"])): bool(e.args["paid"]) for e in evs
                   if e.event == "OrphanSettled"}
        assert orphans
        finalized = {int(e.args["jobId"]): e.args for e in events
                     if e.contract == "JobMarket" and e.event == "JobFinalized"}
        per_run = {int(e.args["round"]): int(e.args["perWorker"]) for e in evs
                   if e.event == "RoundSettled"}
        for name in ("worker-1", "worker-2"):
            mine_orphans = [j for j in orphans
                            if str(c.market.get_job(j).solver).lower() == addr[name]]
            assert mine_orphans and all(orphans[j] for j in mine_orphans), (name, orphans)
            mine = [a for a in accepted if str(a["worker"]).lower() == addr[name]]
            assert len(mine) == ROUNDS
            owed = sum(job.sub_reward + per_run[int(a["round"])] for a in mine) \
                + sum(int(finalized[j]["reward"]) for j in mine_orphans)
            gain = net.holdings(net.address(BYZ_WORKERS[name])) - before[name]
            assert gain == owed, (name, gain, owed)
        assert net.holdings(net.address(BYZ_WORKERS["worker-byz"])) < before["worker-byz"]
        assert net.conserved(), net.books()


FORGE_WORKERS = {"worker-1": 2, "worker-2": 3, "worker-forger": 7}
INVALID = 2  # ICollabMarket.OuterVerdict


@pytest.mark.serial  # its rounds race the wall clock: one at a time
def test_a_forged_speculative_candidate_is_challenged_from_its_post(tmp_path: Path) -> None:
    """Three workers, one ``wrong_outer``: at D = 2 it posts a forged candidate for a
    speculative round (one ahead of the base) the moment the chain takes it. The
    followers do not start a round on it; they challenge it within its window from its
    post, while its round is still speculative, the jury finds it Invalid and it is
    removed; the honest candidate is posted again and the job finishes, the forger's
    bonds lost, the contracts conserved."""
    with LocalNet(tmp_path / "net", collab_demo_params()) as net:
        c = net.c
        run = run_job(net, tmp_path, FORGE_WORKERS, 2, reward=90,
                      cheats={"worker-forger": "wrong_outer"})
        cid, before = run.cid, run.before
        job = c.collab.get_collab(cid)
        assert job.status.name == "FINISHED", f"job ended {job.status.name}; logs {net.home}"
        time.sleep(6)  # the daemons withdraw what they were credited
        evs = job_events(net, cid)
        forger = net.address(FORGE_WORKERS["worker-forger"]).lower()
        accepted_at = {int(e.args["round"]): e.block_number for e in evs
                       if e.event == "OuterAccepted"}
        assert sorted(accepted_at) == list(range(ROUNDS))
        forged = [e for e in evs if e.event == "OuterPosted"
                  and str(e.args["poster"]).lower() == forger
                  and e.args["outerHash"] != c.collab.get_round(cid, e.args["round"]).outer_hash]
        assert forged, f"the wrong_outer worker never posted a forged candidate; logs {net.home}"
        f = forged[0]
        q = int(f.args["round"])
        # speculative when posted: its predecessor not finalized yet
        assert q > 0 and f.block_number < accepted_at[q - 1], (q, f.block_number, accepted_at)
        challenged = [e for e in evs if e.event == "OuterChallenged" and e.args["round"] == q
                      and e.block_number >= f.block_number]
        assert challenged and challenged[0].block_number < accepted_at[q - 1], \
            "not challenged while speculative"
        assert any(e.event == "OuterResolved" and e.args["round"] == q
                   and e.args["verdict"] == INVALID for e in evs)
        gain = {n: net.holdings(net.address(a)) - before[n] for n, a in FORGE_WORKERS.items()}
        assert gain["worker-forger"] < gain["worker-1"], gain
        assert net.conserved(), net.books()
