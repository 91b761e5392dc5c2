"""End-to-end collaborative (DiLoCo) job: real `polnet` daemons as OS processes, a real
anvil devnet with the CollabMarket, loopback libp2p and real training of a small char LM.

One job, 4 worker slots, 3 rounds: one honest worker, one (``wrong_outer``) that trains
honestly but posts a forged outer state the first time it can, one byzantine
(``amplify``: its last inner segment at 5x the learning rate, a blown-up delta) and one
SIGKILLed while it trains round 1 and started again. Asserted besides: the forged
outer state is challenged by recomputation alone, voted Invalid, its poster's bond
lost and the round's accepted state is another. Asserted: the byzantine inner run is condemned
through the ordinary dispute game, its worker slashed and never in an accepted set;
the killed worker's sub-job is dropped for its missed deadline and it rejoins later
from theta_t it recomputes over libp2p; the job finishes; every honest worker is paid
per accepted inner run; the contracts hold exactly what they owe; the final outer
state the chain committed is the one every honest node recomputed; and the serving
submitter recorded every round's held-out loss, which `job status --collab` prints.

The job is warm-started (a spec whose ``init_weights`` names theta_0's file, served by
the submitter): every worker, verifier and the submitter's own record start from those
weights, which a node that fell back on the seeded weights could not (outerInitHash
would not match and it would follow nothing).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from devnet.localnet import LocalNet
from node.chain.contracts import JobStatus
from node.chain.ids import CollabId, JobId
from node.demo_collab import (
    BYZANTINE,
    KILLED,
    WORKERS,
    collab_demo_params,
    final_and_solo_loss,
    warm_start_inputs,
    write_collab_inputs,
)
from node.roles.collab_progress import read_losses

pytestmark = pytest.mark.timeout(900)

SUBMITTER, VERIFIERS = 1, (4, 5, 6)
ROUNDS = 3
FORGER = "worker-2"
BEHAVIOURS = {BYZANTINE: "amplify", FORGER: "wrong_outer"}
INVALID = 2  # ICollabMarket.OuterVerdict
WARM_STEPS = 40  # theta_0: one worker's weights after 40 steps from another seed


@pytest.mark.serial  # its rounds race the wall clock: one at a time
def test_collab_job_survives_a_byzantine_and_a_killed_worker(tmp_path: Path) -> None:
    with LocalNet(tmp_path / "net", collab_demo_params()) as net:
        c = net.c
        spec, text = write_collab_inputs(tmp_path / "data", ROUNDS)
        init = warm_start_inputs(spec, text, WARM_STEPS)
        for i, v in enumerate(VERIFIERS, start=1):
            net.start_verifier(f"v{i}", v)
        for name, acct in WORKERS.items():
            net.start_solver(name, acct, BEHAVIOURS.get(name, "honest"))
        before = {n: net.holdings(net.address(a)) for n, a in WORKERS.items()}
        cid = net.submit_collab("sub", SUBMITTER, spec, text, reward=120, budget=12,
                                round_duration=45, init_weights=init)
        killed = restarted = False
        lost = JobId(0)  # the killed worker's round-1 sub-job
        end = time.monotonic() + 840
        while time.monotonic() < end:
            job = c.collab.get_collab(cid)
            if job.status.name in ("FINISHED", "FAILED"):
                break
            if not killed and job.round == 1 and job.phase.name == "RUNNING":
                rnd = c.collab.get_round(cid, 1)
                mine = [s for s in rnd.sub_jobs if s and c.market.get_job(s).solver.lower()
                        == net.address(WORKERS[KILLED]).lower()]
                if mine and c.market.get_job(mine[0]).status == JobStatus.CLAIMED:
                    net.kill(KILLED)
                    killed, lost = True, mine[0]
            elif killed and not restarted and (
                    job.round >= 2 or max(c.timestamp(), int(time.time()))
                    > c.market.get_job(lost).deadline):
                # Its round-1 run is lost (past its deadline): it boots while the round
                # settles, then takes a slot again for round 2 within the outer window.
                # Wall clock too: a block that lags on a loaded machine must not hold
                # the restart until round 2 has begun without it.
                net.start_solver(KILLED, WORKERS[KILLED])
                restarted = True
            net.check_alive()
            time.sleep(1)
        job, events = finished(net, cid)
        byz = net.address(WORKERS[BYZANTINE]).lower()
        kill = net.address(WORKERS[KILLED]).lower()
        dropped = [e.args for e in events if e.event == "SubJobDropped"]
        accepted = [e.args for e in events if e.event == "SubJobAccepted"]
        # The byzantine worker's run was condemned (reason 1) and none of its runs counted.
        assert any(str(d["worker"]).lower() == byz and d["reason"] == 1 for d in dropped)
        assert not any(str(a["worker"]).lower() == byz for a in accepted)
        assert any(e.event == "DisputeResolved" and e.args.get("verdict") == 2 for e in events)
        # The killed worker missed round 1's deadline (reason 0)...
        assert killed and any(str(d["worker"]).lower() == kill and d["round"] == 1
                              and d["reason"] == 0 for d in dropped)
        # ... rejoined round 2 from theta_2 (fetched or recomputed over libp2p) ...
        assert any(str(a["worker"]).lower() == kill and a["round"] == 2 for a in accepted)
        # ... the byzantine worker was excluded after its first condemned run ...
        assert all(d["round"] == 0 for d in dropped if str(d["worker"]).lower() == byz)
        assert c.collab.is_excluded(cid, net.address(WORKERS[BYZANTINE]))
        # ... the honest inner runs were all accepted ...
        gain = {n: net.holdings(net.address(a)) - before[n] for n, a in WORKERS.items()}
        for name in ("worker-1", FORGER):
            addr = net.address(WORKERS[name]).lower()
            assert sum(1 for a in accepted if str(a["worker"]).lower() == addr) >= ROUNDS
        assert gain["worker-1"] > 0 and gain[BYZANTINE] < 0
        # ... and the forged outer state was exposed by recomputation: challenged, voted
        # Invalid, never accepted; the forger paid its bond for it.
        forger = net.address(WORKERS[FORGER]).lower()
        forged = [e.args for e in events if e.event == "OuterPosted"
                  and str(e.args["poster"]).lower() == forger
                  and e.args["outerHash"] != c.collab.get_round(cid, e.args["round"]).outer_hash]
        assert forged, "the wrong_outer worker never got to post first"
        for f in forged:
            assert any(e.event == "OuterResolved" and e.args["round"] == f["round"]
                       and e.args["verdict"] == INVALID for e in events)
        assert gain[FORGER] < gain["worker-1"]
        assert net.conserved(), net.books()
        # The chain's final model is what the honest nodes recomputed, and it learned.
        losses = final_and_solo_loss(net.home, spec, text, cid, job.outer_hash,
                                     ["worker-1", "worker-2"], init)
        assert losses["collab"] < losses["initial"]
        # The serving submitter kept every accepted theta_r and its held-out loss, and
        # `job status --collab` prints them beside the rounds.
        rec = read_losses(net.home / "nodes" / "sub", cid)
        assert sorted(rec) == list(range(ROUNDS + 1))
        for r in range(ROUNDS):
            assert rec[r + 1]["outer_hash"] == "0x" + c.collab.get_round(cid, r).outer_hash.hex()
        assert rec[ROUNDS]["loss"] == pytest.approx(losses["collab"], rel=1e-4)
        assert rec[0]["loss"] == pytest.approx(losses["initial"], rel=1e-4)
        # theta_0 was the served file, not the spec's seeded weights.
        warm, seeded = warm_and_seeded_outer_hashes(spec, init)
        assert rec[0]["outer_hash"] == "0x" + warm.hex() and warm != seeded
        env = {**os.environ, "POLNET_HOME": str(net.home)}
        out = subprocess.run([sys.executable, "-m", "node.cli.main", "job", "status", str(cid),
                              "--collab", "--name", "sub"], env=env, capture_output=True,
                             text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        assert f"held-out loss {rec[ROUNDS]['loss']:.4f}" in out.stdout


@pytest.mark.parallel
def test_a_skipping_worker_is_slashed_and_the_others_are_paid_by_contribution(
        tmp_path: Path) -> None:
    """Three worker nodes on 4 slots: worker-1 asks for 2 (``--collab-slots 2``) but,
    with no delivered record yet, takes the one the market allows (issue 30 item 5),
    worker-2 one, and one that skips its inner steps (``skip``: its run claims the start
    state, no compute) another. The skipper's run is challenged, condemned in the dispute game
    and dropped; the skipper is slashed and excluded and never accepted. The job
    finishes, and every node is paid by its accepted inner runs: each accepted run's
    sub-job pays its solver the job's sub-reward, and each settled round's shared pot
    goes per accepted run (RoundSettled.perWorker), so a node's gain is exactly that."""
    rounds = 1  # the skipper's run is condemned in round 0, which settles without it
    workers = {"worker-1": (2, "honest", "2"), "worker-2": (3, "honest", "1"),
               "worker-skip": (7, "skip", "1")}
    with LocalNet(tmp_path / "net", collab_demo_params()) as net:
        c = net.c
        spec, text = write_collab_inputs(tmp_path / "data", rounds)
        for i, v in enumerate(VERIFIERS, start=1):
            net.start_verifier(f"v{i}", v)
        for name, (acct, behavior, slots) in workers.items():
            net.start_solver(name, acct, behavior, "--collab-slots", slots)
        addr = {n: net.address(a).lower() for n, (a, _, _) in workers.items()}
        before = {n: net.holdings(net.address(a)) for n, (a, _, _) in workers.items()}
        cid = net.submit_collab("sub", SUBMITTER, spec, text, reward=80, budget=8,
                                round_duration=60)
        end = time.monotonic() + 600
        while time.monotonic() < end:
            if c.collab.get_collab(cid).status.name in ("FINISHED", "FAILED"):
                break
            net.check_alive()
            time.sleep(1)
        job, events = finished(net, cid)
        collab_evs = [e for e in events if e.contract == "CollabMarket"
                      and e.args.get("jobId") == cid]
        accepted = [e.args for e in collab_evs if e.event == "SubJobAccepted"]
        dropped = [e.args for e in collab_evs if e.event == "SubJobDropped"]
        runs = {n: [a for a in accepted if str(a["worker"]).lower() == w]
                for n, w in addr.items()}
        # The skipper: condemned (reason 1) through a dispute, never accepted, excluded,
        # and it lost money.
        assert any(str(d["worker"]).lower() == addr["worker-skip"] and d["reason"] == 1
                   for d in dropped), dropped
        assert not runs["worker-skip"]
        assert c.collab.is_excluded(cid, net.address(workers["worker-skip"][0]))
        sub_ids = {int(a["marketJobId"]) for a in accepted}
        assert any(e.event == "DisputeResolved" and e.args.get("verdict") == 2
                   for e in events)
        # Every round settled with the honest runs; fresh worker-1 held one slot: its
        # daemon asked for one (asking for two reverts, and would leave it none). Only
        # once round 0 settled (a record) may it take a second.
        assert len(runs["worker-1"]) == len(runs["worker-2"]) == rounds
        settled = next(i for i, e in enumerate(collab_evs) if e.event == "RoundSettled")
        early = [e.args for e in collab_evs[:settled] if e.event == "SlotClaimed"
                 and str(e.args["node"]).lower() == addr["worker-1"]]
        assert len(early) == 1, early
        # Paid by contribution, to the token: sub-job rewards of its accepted runs plus
        # the per-run share of each round's pot.
        per_run = {int(e.args["round"]): int(e.args["perWorker"]) for e in collab_evs
                   if e.event == "RoundSettled"}
        assert sorted(per_run) == list(range(rounds))
        finalized = {int(e.args["jobId"]): e.args for e in events
                     if e.contract == "JobMarket" and e.event == "JobFinalized"}
        assert sub_ids <= finalized.keys()
        for name in ("worker-1", "worker-2"):
            mine = runs[name]
            assert all(str(finalized[int(a["marketJobId"])]["solver"]).lower() == addr[name]
                       and int(finalized[int(a["marketJobId"])]["reward"]) == job.sub_reward
                       for a in mine)
            owed = sum(job.sub_reward + per_run[int(a["round"])] for a in mine)
            gain = net.holdings(net.address(workers[name][0])) - before[name]
            assert gain == owed, (name, gain, owed, len(mine))
        assert net.holdings(net.address(workers["worker-skip"][0])) < before["worker-skip"]
        assert net.conserved(), net.books()


def finished(net: LocalNet, cid: CollabId) -> tuple[Any, list[Any]]:
    """The job, which must have finished, and the chain's events once the daemons have
    withdrawn what they were credited."""
    job = net.c.collab.get_collab(cid)
    assert job.status.name == "FINISHED", f"job ended {job.status.name}; logs {net.home}"
    time.sleep(6)
    return job, net.events()


def warm_and_seeded_outer_hashes(spec_path: Path, init: Path) -> tuple[bytes, bytes]:
    from node.spec import load_collaborative_spec
    from node.train.diloco import initial_outer_state, outer_hash

    spec = load_collaborative_spec(spec_path)
    seeded = spec.model_copy(update={"init_weights": None})
    return (outer_hash(initial_outer_state(spec, init)),
            outer_hash(initial_outer_state(seeded)))


@pytest.mark.parallel
def test_a_submitter_withholding_theta_0_reaps_no_slot_bonds(tmp_path: Path) -> None:
    """The attacks: make workers claim slots (bonds at stake) in a job whose round 0
    they cannot train, and collect the bonds when they miss it. (1) Post a warm-started
    job, serve spec and dataset but not theta_0's file: a worker holds theta_0 before
    it probes, so it claims nothing until the file is served; then the same worker
    claims a slot (the gate is the file). (2) Post jobs of the same spec whose
    initStateHash or outerInitHash is not the spec's theta_0: the worker checks both
    before claiming and never claims there."""
    import shutil

    from eth_utils import keccak

    from node.chain.client import ChainClient
    from node.chain.contracts import CollabTerms

    with LocalNet(tmp_path / "net", collab_demo_params()) as net:
        c = net.c
        spec, text = write_collab_inputs(tmp_path / "data", 1)
        init = warm_start_inputs(spec, text, 5)
        cid = net.submit_collab("sub", SUBMITTER, spec, text, reward=40, budget=4,
                                round_duration=45, init_weights=init)
        net.bootstrap_from("sub")
        # The same submitter posts the same inputs twice more, with forged commitments.
        j = c.collab.get_collab(cid)
        liar = ChainClient.from_deployment(net.deployment, SUBMITTER)
        honest = CollabTerms(j.spec_hash, j.dataset_hash, j.reward, j.verification_budget,
                             j.min_workers, j.max_workers, j.inner_steps, j.steps_per_segment,
                             j.rounds, j.round_duration, j.init_state_hash, j.outer_hash)
        forged = {liar.post_collab_job(replace(honest, init_state_hash=keccak(b"s0"))):
                  "initStateHash",
                  liar.post_collab_job(replace(honest, outer_init_hash=keccak(b"theta0"))):
                  "outerInitHash"}
        digest = load_spec_init(spec)
        served = net.home / "nodes" / "sub" / "p2p" / "store" / "objects" / digest[:2] / digest
        assert served.is_file()
        served.unlink()  # the submitter withholds it from now on
        worker = net.address(WORKERS["worker-1"])
        before = net.holdings(worker)
        net.start_solver("worker-1", WORKERS["worker-1"])
        log = net.home / "logs" / "worker-1.log"
        end = time.monotonic() + 240
        while time.monotonic() < end and not _failed_on(log, digest) and not any(
                e.event == "SlotClaimed" for e in net.events()):
            net.check_alive()
            time.sleep(1)
        assert not any(e.event == "SlotClaimed" for e in net.events()), \
            "the worker claimed a slot (its bond at stake) without theta_0"
        assert _failed_on(log, digest), f"the worker never tried theta_0; see {log}"
        assert not any(int(h, 16) for h in c.collab.slot_holders(cid))
        assert net.holdings(worker) == before
        # Served again: the same worker fetches it, probes and claims its slot, and
        # finds the forged jobs unusable.
        shutil.copyfile(init, served)
        end = time.monotonic() + 240
        while time.monotonic() < end and not (
                any(e.event == "SlotClaimed" for e in net.events())
                and all(_refused(log, f, what) for f, what in forged.items())):
            net.check_alive()
            time.sleep(1)
        assert [str(h).lower() for h in c.collab.slot_holders(cid)][0] == worker.lower()
        for f, what in forged.items():
            assert _refused(log, f, what), f"job {f} ({what} forged) not refused; see {log}"
            assert not any(int(h, 16) for h in c.collab.slot_holders(f))
        assert [e.args["jobId"] for e in net.events() if e.event == "SlotClaimed"] == [cid]
        assert net.conserved(), net.books()


def load_spec_init(spec_path: Path) -> str:
    from node.spec import load_collaborative_spec

    digest = load_collaborative_spec(spec_path).init_weights
    assert digest is not None
    return digest


def _failed_on(log: Path, digest: str) -> bool:
    """Has the worker logged a failed attempt at the job that names theta_0's file?"""
    if not log.is_file():
        return False
    return any("collab_follow_failed" in line and digest[:16] in line
               for line in log.read_text(errors="replace").splitlines())


def _refused(log: Path, cid: CollabId, what: str) -> bool:
    """Has the worker marked job ``cid`` unusable for its forged ``what``?"""
    return log.is_file() and any(
        "collab_follow_failed" in line and f"job {cid}: {what} is not" in line
        for line in log.read_text(errors="replace").splitlines())
