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
from pathlib import Path
from typing import Any

import pytest

from devnet.localnet import LocalNet
from node.datasets import pack_text, write_dataset
from node.demo_collab import collab_demo_params, collab_spec_dict

pytestmark = pytest.mark.timeout(900)

SUBMITTER, VERIFIERS = 1, (4, 5, 6)
WORKERS = {"worker-1": 2, "worker-2": 3}
ROUNDS, DEPTH = 3, 2


def write_inputs(data: Path) -> tuple[Path, Path]:
    """The demo's char LM on two slots (both needed each round)."""
    data.mkdir(parents=True, exist_ok=True)
    text = data / "text.safetensors"
    h = write_dataset(pack_text(), text)
    d = collab_spec_dict(h, ROUNDS)
    d["workers"] = {"min": len(WORKERS), "max": len(WORKERS)}
    spec = data / "collab.json"
    spec.write_text(json.dumps(d))
    return spec, text


def run_job(net: LocalNet, tmp: Path, timeout_s: float) -> tuple[int, dict[str, int]]:
    """Start verifiers and workers, post the D = 2 job and wait for its end; returns its
    id and each worker's holdings before."""
    spec, text = write_inputs(tmp / "data")
    for i, v in enumerate(VERIFIERS, start=1):
        net.start_verifier(f"v{i}", v)
    for name, acct in WORKERS.items():
        net.start_solver(name, acct)
    before = {n: net.holdings(net.address(a)) for n, a in WORKERS.items()}
    cid = net.submit_collab("sub", SUBMITTER, spec, text, reward=60, budget=6,
                            round_duration=60, pipeline_depth=DEPTH)
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if net.c.collab.get_collab(cid).status.name in ("FINISHED", "FAILED"):
            break
        net.check_alive()
        time.sleep(1)
    return cid, before


def job_events(net: LocalNet, cid: int) -> list[Any]:
    return [e for e in net.events() if e.contract == "CollabMarket"
            and e.args.get("jobId") == cid]


@pytest.mark.serial  # its rounds race the wall clock: one at a time
def test_a_pipelined_job_overlaps_its_rounds_and_pays_every_worker(tmp_path: Path) -> None:
    with LocalNet(tmp_path / "net", collab_demo_params()) as net:
        c = net.c
        cid, before = run_job(net, tmp_path, 780)
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
