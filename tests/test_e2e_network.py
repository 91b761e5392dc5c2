"""End-to-end: real `polnet` daemons as OS processes, a real anvil devnet,
loopback libp2p and real training on bundled digits.

These are the slowest tests (a few minutes in all on 2 cores): each scenario
runs whole jobs through claim, training, sampled replay, dispute and
settlement, and kills or freezes parts of the network on the way.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import safetensors.torch
import torch

from devnet.localnet import LocalNet
from devnet.params import short_network_params
from node.chain.ids import DisputeId
from node.demo import pack_inputs, spec_for

pytestmark = [pytest.mark.timeout(420), pytest.mark.parallel]

SUBMITTER, HONEST, CHEATER, V1, V2, V3 = 1, 2, 3, 4, 5, 6


INVALID, VALID, SOLVER_TIMED_OUT = 2, 1, 3  # IJobMarket.Verdict


def small_job(tmp: Path, total_steps: int = 40) -> tuple[Path, Path]:
    inputs = pack_inputs(tmp / "data")
    spec = spec_for("mlp_digits.toml", _hash(inputs["digits"]), tmp / "data" / "job.toml",
                    total_steps=total_steps)
    return spec, inputs["digits"]


def _hash(p: Path) -> str:
    import hashlib

    return hashlib.sha256(p.read_bytes()).hexdigest()


def start_verifiers(net: LocalNet) -> None:
    for name, acct in (("v1", V1), ("v2", V2), ("v3", V3)):
        net.start_verifier(name, acct)


def dispute_events(net: LocalNet, did: DisputeId) -> dict[str, list[dict[str, Any]]]:
    out: dict[str, list[dict[str, Any]]] = {}
    for ev in net.events():
        if ev.contract == "DisputeGame" and ev.args.get("id") == did:
            out.setdefault(ev.event, []).append(ev.args)
    return out


def test_cheater_bisected_to_one_step_slashed_and_job_finished_by_honest_solver(
        tmp_path: Path) -> None:
    """A solver that skips the last step of every segment, and when challenged posts
    its bisection hashes but serves none of the states, is bisected to that step (the
    challenger replays the honest mids exactly, so it needs none served; the jury
    cannot get the step's start state: it counts against the solver, no clock runs out),
    found invalid by the jury and slashed; the challenger is paid; the job reopens
    and an honest solver, SIGKILLed mid-job and restarted, still commits; a verifier
    killed right after the commit and a frozen RPC are both survived."""
    spec, dataset = small_job(tmp_path)
    with LocalNet(tmp_path / "net", short_network_params()) as net:
        start_verifiers(net)
        net.start_solver("cheat", CHEATER, "withhold")
        cheat_before = net.holdings(net.address(CHEATER))
        job = net.submit("sub", SUBMITTER, spec, dataset)
        net.wait_event("Challenged", 180, jobId=job)
        ch_before = {net.address(a): net.holdings(net.address(a)) for a in (V1, V2, V3)}
        net.start_solver("honest", HONEST)
        # Verifiers may each challenge; every dispute plays out, and the round's bond is
        # settled once, paying the earliest-opened dispute the solver lost.
        resolved = net.wait_event("DisputeResolved", 300, contract="DisputeGame", jobId=job)
        assert resolved.args["verdict"] == INVALID
        did = DisputeId(int(resolved.args["id"]))
        challenger = next(str(e.args["challenger"]) for e in net.events()
                          if e.event == "Challenged" and e.args["disputeId"] == did)
        evs = dispute_events(net, did)
        last = evs["RangeNarrowed"][-1] if "RangeNarrowed" in evs else None
        jury = evs["JuryDrawn"][0]["jury"]
        # Its mids are honest states' hashes: the challenger's own replay reproduces each
        # exactly, so it needs none of them served and walks to the skipped last step,
        # whose start the solver never serves to the jury.
        end = int(evs["DisputeOpened"][0]["endStep"])
        assert last is not None and (int(last["lo"]), int(last["hi"])) == (end - 1, end)
        assert len(evs["MidsPosted"]) == len(evs["RangeNarrowed"]) >= 1
        assert "TimedOut" not in evs
        assert net.address(CHEATER) not in jury and challenger not in jury
        assert all(v["valid"] is False for v in evs.get("VoteRevealed", []))
        claimed = net.wait_event("RewardPaid", 180, contract="JobMarket")
        paid = str(claimed.args["challenger"])
        assert int(claimed.args["amount"]) > 0
        assert net.holdings(net.address(CHEATER)) < cheat_before  # bond slashed
        time.sleep(3)
        assert net.holdings(paid) > ch_before[paid]  # bond back + the challenger's share

        # Round 2: the honest solver claims the reopened job; kill it mid-job, restart.
        net.wait_event("JobClaimed", 120, jobId=job, solver=net.address(HONEST))
        net.kill("honest", signal.SIGKILL)
        net.start_solver("honest", HONEST)
        committed = net.wait_event("ResultCommitted", 180, jobId=job,
                                   solver=net.address(HONEST))
        # A verifier dies right after the commit and comes back; the RPC freezes.
        net.kill("v1", signal.SIGKILL)
        net.start_verifier("v1", V1)
        net.pause_rpc(4)
        net.wait_job(job, {3}, 180)
        # the round's one committee seat attested (restarted or not)
        seat = net.c.market.committee_of(job)
        assert len(seat) == 1
        assert any(e.event == "Attested" and e.args["verifier"] == seat[0]
                   and e.block_number >= committed.block_number for e in net.events())
        net.check_alive()
        assert net.conserved(), net.books()


def test_honest_solver_challenged_by_malicious_verifier_wins(tmp_path: Path) -> None:
    spec, dataset = small_job(tmp_path)
    with LocalNet(tmp_path / "net", short_network_params()) as net:
        net.start_verifier("bad", V1, module="tests.malicious_verifier")
        net.start_verifier("v2", V2)
        net.start_verifier("v3", V3)
        # The honest solver logs JSON and serves Prometheus metrics.
        net.polnet("honest", "--log-json", "solver", "run", *net.node_args("honest", HONEST),
                   "--metrics-port", "0")
        info = net.wait_node("honest")
        solver_before = net.holdings(net.address(HONEST))
        bad_before = net.holdings(net.address(V1))
        job = net.submit("sub", SUBMITTER, spec, dataset)
        challenged = net.wait_event("Challenged", 180, jobId=job)
        assert challenged.args["challenger"] == net.address(V1)
        resolved = net.wait_event("DisputeResolved", 300, contract="DisputeGame",
                                  id=int(challenged.args["disputeId"]))
        assert resolved.args["verdict"] == VALID
        net.wait_job(job, {3}, 120)
        # The solver's daemon claims its delay compensation once the round is paid.
        settled = net.wait_event("DelayCompensationSettled", 120, contract="DisputeGame",
                                 jobId=job)
        held = net.wait_event("DelayCompensationHeld", 5, contract="DisputeGame", jobId=job)
        time.sleep(3)
        gained = net.holdings(net.address(HONEST)) - solver_before
        reward = net.c.market.get_job(job).reward
        # The reward, plus the half of the losing challenger's bond (after its jurors'
        # share) held for the delayed solver; the other half is burned.
        assert settled.args["solver"] == net.address(HONEST)
        assert settled.args["paid"] == held.args["amount"] > 0
        assert gained == reward + settled.args["paid"]
        assert net.holdings(net.address(V1)) < bad_before
        assert net.c.dispute.total_burned() > 0
        assert net.conserved(), net.books()
        def scrape() -> str:
            return urllib.request.urlopen(f"http://127.0.0.1:{info['metrics_port']}/metrics",
                                          timeout=10).read().decode()

        metrics = scrape()
        for _ in range(20):  # the job is paid: its bond is no longer locked (bounded wait)
            if 'polnet_stake{kind="locked"} 0.0' in metrics:
                break
            time.sleep(1)
            metrics = scrape()
        assert 'polnet_stake{kind="locked"} 0.0' in metrics
        assert "polnet_stake" in metrics and "polnet_training_steps_total" in metrics
        steps = [ln for ln in metrics.splitlines()
                 if ln.startswith("polnet_training_steps_total ")]
        assert steps and float(steps[0].split()[1]) >= 40
        lines = [ln for ln in (net.home / "logs" / "honest.log").read_text().splitlines()
                 if ln.startswith("{")]
        events = [json.loads(ln)["event"] for ln in lines]
        assert "job_claimed" in events and "result_committed" in events

        # The submitter's view: status as JSON, then the trained model itself.
        env = {**os.environ, "POLNET_HOME": str(net.home)}
        out = subprocess.run([sys.executable, "-m", "node.cli.main", "job", "status", str(job),
                              "--json"], env=env, capture_output=True, text=True, timeout=60)
        report = json.loads(out.stdout)
        assert report["status"] == "finalized" and report["solver"] == net.address(HONEST)
        assert {"to": net.address(HONEST), "amount": reward, "why": "reward"} in report["payouts"]
        assert any(e["event"] == "Challenged" for e in report["events"])
        out = subprocess.run([sys.executable, "-m", "node.cli.main", "dispute", "status",
                              str(challenged.args["disputeId"]), "--json"], env=env,
                             capture_output=True, text=True, timeout=60)
        game = json.loads(out.stdout)
        for area, missing in (("job", "999"), ("dispute", "999")):  # no zero-filled records
            bad = subprocess.run([sys.executable, "-m", "node.cli.main", area, "status",
                                  missing], env=env, capture_output=True, text=True, timeout=60)
            assert bad.returncode == 1 and f"no {area} 999" in bad.stderr, bad.stderr
        lo, hi = game["range"]
        assert (game["phase"], game["solver_won"], hi - lo, game["mid_steps"]) == (
            "resolved", True, 1, [])
        assert hi == game["steps"][1]  # the malicious challenger always took the last part
        assert game["rounds"] >= 1 and game["invalid_votes"] == 0
        model = tmp_path / "model.safetensors"
        fetch = net.polnet("fetch", "job", "fetch", str(job), "--out", str(model),
                           *net.node_args("fetch", SUBMITTER))
        assert fetch.wait(120) == 0, (net.home / "logs" / "fetch.log").read_text()[-2000:]
        # A newcomer's fetch is quiet: nothing from libp2p above INFO (issue 36 saw 269
        # lines, 261 of them gossipsub's "Rate limit exceeded").
        noisy = [ln for ln in (net.home / "logs" / "fetch.log").read_text().splitlines()
                 if "libp2p" in ln and re.search(r"\[(warning|error|critical)\s*\]", ln, re.I)]
        assert not noisy, noisy[:5]
        weights = safetensors.torch.load_file(str(model))
        assert weights and all(not k.startswith(("optim.", "meta.")) for k in weights)
        from node.spec import load_spec
        from node.train.models import load_model, model_spec

        assert model_spec(model) == load_spec(spec)  # the job's spec rides in the file
        assert load_model(model)(torch.zeros(2, 1, 8, 8)).shape == (2, 10)


def test_consistent_liar_is_bisected_to_its_one_bad_step(tmp_path: Path) -> None:
    """A solver with one wrong step inside each segment (the 5th of 10) defends its own
    trajectory in the dispute (its mids follow the bad step). The challenger walks the
    round's parts and disputes the first state out of tolerance, then, when every mid
    agrees, the last part; the game ends on exactly the bad step, the jury votes
    invalid and the solver is slashed."""
    spec, dataset = small_job(tmp_path)
    with LocalNet(tmp_path / "net", short_network_params()) as net:
        start_verifiers(net)
        net.start_solver("liar", CHEATER, "bad_step:5")
        liar_before = net.holdings(net.address(CHEATER))
        job = net.submit("sub", SUBMITTER, spec, dataset)
        resolved = net.wait_event("DisputeResolved", 300, contract="DisputeGame", jobId=job)
        assert resolved.args["verdict"] == INVALID
        evs = dispute_events(net, DisputeId(int(resolved.args["id"])))
        start = int(evs["DisputeOpened"][0]["startStep"])
        assert int(evs["DisputeOpened"][0]["endStep"]) - start == 10
        # fanout 8 over 10 steps: mids at +1 2 3 5 6 7 8; S_5 is the first that is off,
        # so part [3, 5]; then the mid at +4 agrees: the last part, [4, 5]
        narrowed = [(int(e["lo"]) - start, int(e["hi"]) - start)
                    for e in evs["RangeNarrowed"]]
        assert narrowed == [(3, 5), (4, 5)]
        assert all(v["valid"] is False for v in evs.get("VoteRevealed", []))
        # the bond is settled once, by finalize after the window and its grace
        net.wait_event("RoundSettled", 180, contract="JobMarket", jobId=job)
        assert net.holdings(net.address(CHEATER)) < liar_before
        assert net.conserved(), net.books()


def test_solver_that_stops_answering_loses_on_time(tmp_path: Path) -> None:
    spec, dataset = small_job(tmp_path)
    with LocalNet(tmp_path / "net", short_network_params()) as net:
        start_verifiers(net)
        net.start_solver("cheat", CHEATER, "skip")
        job = net.submit("sub", SUBMITTER, spec, dataset)
        net.wait_event("Challenged", 180, jobId=job)
        net.kill("cheat", signal.SIGKILL)  # gone: it will never post its mids
        resolved = net.wait_event("DisputeResolved", 260, contract="DisputeGame", jobId=job)
        assert resolved.args["verdict"] == SOLVER_TIMED_OUT
        did = DisputeId(int(resolved.args["id"]))
        timed_out = [e for e in net.events() if e.event == "TimedOut" and e.args["id"] == did]
        assert timed_out and int(timed_out[0].args["loser"]) == 0  # Side.Solver
        assert not any(e.event == "JuryDrawn" and e.args["id"] == did for e in net.events())
        # the bond is settled after the window (and the grace every dispute end leaves)
        net.wait_job(job, {0}, 150)  # reopened for another solver
        assert net.c.market.round_info(job, 1).first_winner > 0
        assert net.conserved(), net.books()


def test_dark_solver_is_condemned_by_an_availability_request(tmp_path: Path) -> None:
    """Issue 30: before, a solver that trained nothing and served nothing was paid at the
    window's end (nobody could replay, challenge or attest it). Now the committee member
    that cannot fetch its share names a segment in an availability request; the solver
    cannot answer, the request expires and condemns the round: the bond is split and the
    job reopens, without a dispute opened or a step replayed."""
    spec, dataset = small_job(tmp_path)
    with LocalNet(tmp_path / "net", short_network_params()) as net:
        start_verifiers(net)
        before = net.holdings(net.address(CHEATER))
        net.start_solver("dark", CHEATER, "dark")
        job = net.submit("sub", SUBMITTER, spec, dataset)
        asked = net.wait_event("Requested", 240, contract="Availability", jobId=job)
        assert asked.args["challenger"] in {net.address(v) for v in (V1, V2, V3)}
        net.wait_event("Expired", 150, contract="Availability", jobId=job)
        net.wait_event("RoundSettled", 150, contract="JobMarket", jobId=job)
        assert net.holdings(net.address(CHEATER)) < before  # its bond, split
        assert not any(e.event in ("Challenged", "JuryDrawn", "Attested") for e in net.events())
        assert net.conserved(), net.books()
