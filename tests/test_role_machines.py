"""The roles as state machines (issue 12, "nodes that survive anything").

Table tests of each role's pure decision over the chain statuses x disk states
that matter, each kill window among them (a commit mined but not recorded, a lost
receipt and its retry, a salt saved but its commitment not sent, another party
finalizing or claiming first); loading the untyped state files the old code wrote;
and, on a real anvil, a solver whose on-disk state is stale or gone after the
chain moved, recovered by its next passes.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio

from devnet.params import TOKEN
from devnet.testing import LocalChain, fake_trace, job_terms, node_settings
from node.chain.contracts import SOLVER, VERIFIER, JobStatus, Phase, Side
from node.chain.ids import DisputeId, JobId
from node.roles import juror_machine as jm
from node.roles import solver_machine as sm
from node.roles import submitter_machine as subm
from node.roles import verifier_machine as vm
from node.roles.state import RoleState

S = JobStatus
NOW, WINDOW_END = 1_000, 1_060

# --- solver -----------------------------------------------------------------------------


def held(status: JobStatus, mine: bool = True, now: int = NOW, disputes: int = 0,
         credits: int = 0) -> sm.HeldJobView:
    return sm.HeldJobView(status=status, mine=mine, round=1, now=now, window_end=WINDOW_END,
                          open_disputes=disputes, credits=credits)


def disk(published: bool = False, has_trace: bool = False, busy: bool = False) -> sm.HeldJobDisk:
    return sm.HeldJobDisk(published=published, has_trace=has_trace, busy=busy)


AFTER = WINDOW_END + 1
P = sm.SolverPhase

SOLVER_JOB_TABLE = [
    # (case, chain, disk, phase, action)
    ("claimed: train", held(S.CLAIMED), disk(), P.TRAINING, sm.Train),
    ("claimed, training now", held(S.CLAIMED), disk(busy=True), P.TRAINING, sm.Wait),
    ("killed after publish, before the commit mined", held(S.CLAIMED),
     disk(published=True, has_trace=True), P.COMMITTING, sm.Train),
    ("commit's receipt lost, not mined: retry", held(S.CLAIMED),
     disk(published=True, has_trace=True), P.COMMITTING, sm.Train),
    ("committed, window open", held(S.COMMITTED), disk(published=True, has_trace=True),
     P.COMMITTED, sm.Wait),
    ("commit mined, killed before any record: disk says training", held(S.COMMITTED),
     disk(published=True, has_trace=True), P.COMMITTED, sm.Wait),
    ("committed, state file lost, trace on disk: publish again", held(S.COMMITTED),
     disk(has_trace=True), P.COMMITTED, sm.Publish),
    ("committed, nothing on disk, window over", held(S.COMMITTED, now=AFTER), disk(),
     P.COMMITTED, sm.Finalize),
    ("window over, no dispute: finalize", held(S.COMMITTED, now=AFTER),
     disk(published=True), P.COMMITTED, sm.Finalize),
    ("window just ends", held(S.COMMITTED, now=WINDOW_END), disk(published=True),
     P.COMMITTED, sm.Wait),
    ("window over, a dispute open", held(S.COMMITTED, now=AFTER, disputes=1),
     disk(published=True), P.COMMITTED, sm.Wait),
    ("another party finalized first", held(S.FINALIZED, credits=100), disk(published=True),
     P.PAID, sm.Withdraw),
    ("our finalize mined, killed before the withdraw", held(S.FINALIZED, credits=100),
     disk(published=True), P.PAID, sm.Withdraw),
    ("withdraw mined, its receipt lost", held(S.FINALIZED), disk(published=True),
     P.PAID, sm.Done),
    ("reclaimed after the deadline (reopened)", held(S.OPEN, mine=False), disk(),
     P.LOST, sm.Done),
    ("another solver holds the new round", held(S.CLAIMED, mine=False), disk(published=True),
     P.LOST, sm.Done),
    ("another solver committed", held(S.COMMITTED, mine=False), disk(published=True),
     P.LOST, sm.Done),
    ("finalized for another solver", held(S.FINALIZED, mine=False, credits=5), disk(),
     P.LOST, sm.Done),
    ("cancelled", held(S.CANCELLED, mine=False), disk(), P.LOST, sm.Done),
]


@pytest.mark.parametrize(("case", "chain", "on_disk", "phase", "action"), SOLVER_JOB_TABLE,
                         ids=[row[0] for row in SOLVER_JOB_TABLE])
def test_solver_job_decision(case: str, chain: sm.HeldJobView, on_disk: sm.HeldJobDisk,
                             phase: sm.SolverPhase, action: type) -> None:
    dec = sm.decide_job(chain, on_disk)
    assert (dec.phase, type(dec.action)) == (phase, action), case


CANDIDATE_TABLE = [
    ("open: consider", S.OPEN, False, False, sm.Consider),
    ("open, we failed it once", S.OPEN, False, True, sm.Drop),
    ("claim mined, killed before its record", S.CLAIMED, True, False, sm.Adopt),
    ("claim mined, record says lost (stale)", S.CLAIMED, True, True, sm.Adopt),
    ("state deleted, our commit on chain", S.COMMITTED, True, False, sm.Adopt),
    ("state deleted, paid on chain", S.FINALIZED, True, False, sm.Adopt),
    ("another solver claimed first", S.CLAIMED, False, False, sm.Drop),
    ("cancelled by its submitter", S.CANCELLED, False, False, sm.Drop),
    ("finalized for another solver", S.FINALIZED, False, False, sm.Drop),
]


@pytest.mark.parametrize(("case", "status", "mine", "lost", "action"), CANDIDATE_TABLE,
                         ids=[row[0] for row in CANDIDATE_TABLE])
def test_solver_candidate_decision(case: str, status: JobStatus, mine: bool, lost: bool,
                                   action: type) -> None:
    assert type(sm.decide_candidate(status, mine, lost)) is action, case


def sdispute(phase: Phase, turn: Side = Side.SOLVER, block: int = 10, draw_block: int = 10,
             clock: int = 30, credits: int = 0) -> sm.SolverDisputeView:
    return sm.SolverDisputeView(phase=phase, turn=turn, block=block, draw_block=draw_block,
                                challenger_clock_left=clock, mid_steps=(2, 4), credits=credits)


SOLVER_DISPUTE_TABLE = [
    ("resolved, credited", sdispute(Phase.RESOLVED, credits=7), False, sm.Withdraw),
    ("resolved, withdrawn (or nothing owed)", sdispute(Phase.RESOLVED), False, sm.Done),
    ("drawing, block not mined", sdispute(Phase.DRAWING), False, sm.Wait),
    ("drawing, block mined", sdispute(Phase.DRAWING, block=11), False, sm.DrawJury),
    ("our turn", sdispute(Phase.BISECTION), False, sm.PostMids),
    ("our turn, regenerating now", sdispute(Phase.BISECTION), True, sm.Wait),
    ("their turn, clock left", sdispute(Phase.BISECTION, Side.CHALLENGER), False, sm.Wait),
    ("their clock ran out", sdispute(Phase.BISECTION, Side.CHALLENGER, clock=0), False,
     sm.Timeout),
    ("jury voting", sdispute(Phase.COMMIT), False, sm.Wait),
    ("jury revealing", sdispute(Phase.REVEAL), False, sm.Wait),
]


@pytest.mark.parametrize(("case", "view", "busy", "action"), SOLVER_DISPUTE_TABLE,
                         ids=[row[0] for row in SOLVER_DISPUTE_TABLE])
def test_solver_dispute_decision(case: str, view: sm.SolverDisputeView, busy: bool,
                                 action: type) -> None:
    act = sm.decide_dispute(view, busy)
    assert type(act) is action, case
    if isinstance(act, sm.PostMids):
        assert act.steps == (2, 4)


# --- verifier ---------------------------------------------------------------------------


def vjob(status: JobStatus = S.COMMITTED, round_: int = 1, now: int = NOW, disputes: int = 0,
         attested: bool = False, credits: int = 0) -> vm.JobView:
    return vm.JobView(status=status, round=round_, now=now, window_end=WINDOW_END,
                      open_disputes=disputes, attested=attested, credits=credits)


def vdisk(round_: int | None = 1, checked: bool = True, verdicts: dict[int, bool] | None = None,
          attested: bool = False, not_in_committee: bool = False, challenged: bool = False,
          busy: bool = False) -> vm.JobDisk:
    return vm.JobDisk(round=round_, checked=checked,
                      verdicts={0: True, 3: True} if verdicts is None else verdicts,
                      attested=attested, not_in_committee=not_in_committee,
                      challenged=challenged, busy=busy)


FAIL = {0: True, 3: False}
VP = vm.VerifierPhase

VERIFIER_JOB_TABLE = [
    ("committed, not checked", vjob(), vdisk(checked=False, verdicts={}), VP.PENDING, vm.Check),
    ("checking now", vjob(), vdisk(checked=False, busy=True), VP.PENDING, vm.Wait),
    ("all passed: attest", vjob(), vdisk(), VP.CHECKED, vm.Attest),
    ("attest mined, killed before the record", vjob(attested=True), vdisk(), VP.CHECKED,
     vm.Wait),
    ("attested", vjob(), vdisk(attested=True), VP.CHECKED, vm.Wait),
    ("not in the committee", vjob(), vdisk(not_in_committee=True), VP.CHECKED, vm.Wait),
    ("a segment failed: challenge", vjob(), vdisk(verdicts=FAIL), VP.CHECKED, vm.Challenge),
    ("challenge mined, killed before the record (our dispute noted)", vjob(),
     vdisk(verdicts=FAIL, challenged=True), VP.CHECKED, vm.Wait),
    ("window over, a dispute open: challenges still open", vjob(now=WINDOW_END + 5,
                                                                disputes=1),
     vdisk(verdicts=FAIL), VP.CHECKED, vm.Challenge),
    ("window over, no dispute: finalize", vjob(now=WINDOW_END + 1), vdisk(), VP.CHECKED,
     vm.Finalize),
    ("window over before we checked", vjob(now=WINDOW_END + 1), vdisk(checked=False),
     VP.PENDING, vm.Finalize),
    ("another party finalized first, we are credited", vjob(S.FINALIZED, credits=3),
     vdisk(attested=True), VP.DONE, vm.Withdraw),
    ("finalized, withdrawn", vjob(S.FINALIZED), vdisk(attested=True), VP.DONE, vm.Done),
    ("condemned round settled, job reopened", vjob(S.OPEN), vdisk(verdicts=FAIL), VP.DONE,
     vm.Done),
    ("recommitted in a new round", vjob(round_=2), vdisk(round_=1), VP.DONE, vm.Done),
    ("round not known, job moved on", vjob(S.CLAIMED), vdisk(round_=None, checked=False),
     VP.DONE, vm.Done),
]


@pytest.mark.parametrize(("case", "chain", "on_disk", "phase", "action"), VERIFIER_JOB_TABLE,
                         ids=[row[0] for row in VERIFIER_JOB_TABLE])
def test_verifier_job_decision(case: str, chain: vm.JobView, on_disk: vm.JobDisk,
                               phase: vm.VerifierPhase, action: type) -> None:
    dec = vm.decide_job(chain, on_disk)
    assert (dec.phase, type(dec.action)) == (phase, action), case


def test_has_attested_is_read_only_when_it_decides() -> None:
    assert vm.needs_attest_check(vdisk())
    for d in (vdisk(attested=True), vdisk(not_in_committee=True), vdisk(verdicts=FAIL),
              vdisk(checked=False), vdisk(verdicts={})):
        assert not vm.needs_attest_check(d)


COMMIT = b"\x11" * 32


def vdispute(phase: Phase, turn: Side = Side.SOLVER, clock: int = 30, now: int = NOW,
             block: int = 10, won: bool = False, mine: bytes | None = None,
             revealed: bool = False, settled: bool = True, credits: int = 0) -> vm.DisputeView:
    return vm.DisputeView(phase=phase, turn=turn, solver_clock_left=clock, now=now, block=block,
                          draw_block=10, reveal_end=WINDOW_END, won=won, my_commitment=mine,
                          my_revealed=revealed, round_settled=settled, credits=credits)


CH = vm.VerifierDispute(role=vm.Role.CHALLENGER, job=JobId(1), round=1)
JUROR = vm.VerifierDispute(role=vm.Role.JUROR)
SALTED = vm.VerifierDispute(role=vm.Role.JUROR, valid=True, salt="ab" * 32)

VERIFIER_DISPUTE_TABLE = [
    ("won, round not settled: settle it", vdispute(Phase.RESOLVED, won=True, settled=False),
     CH, vm.SettleRound),
    ("won, settled (by us or another party first)", vdispute(Phase.RESOLVED, won=True,
                                                             credits=9), CH, vm.Withdraw),
    ("won, withdrawn", vdispute(Phase.RESOLVED, won=True), CH, vm.Done),
    ("lost", vdispute(Phase.RESOLVED), CH, vm.Done),
    ("juror, resolved, paid", vdispute(Phase.RESOLVED, credits=2), SALTED, vm.Withdraw),
    ("drawing, block mined", vdispute(Phase.DRAWING, block=11), JUROR, vm.DrawJury),
    ("drawing, not yet", vdispute(Phase.DRAWING), CH, vm.Wait),
    ("solver's clock ran out", vdispute(Phase.BISECTION, clock=0), CH, vm.Timeout),
    ("solver's turn", vdispute(Phase.BISECTION), CH, vm.Wait),
    ("our turn to choose", vdispute(Phase.BISECTION, Side.CHALLENGER), CH, vm.Choose),
    ("a juror does not choose", vdispute(Phase.BISECTION, Side.CHALLENGER), JUROR, vm.Wait),
    ("seated, no vote yet", vdispute(Phase.COMMIT, mine=vm.NO_VOTE), JUROR, vm.CommitVote),
    ("salt saved, killed before the commitment landed",
     vdispute(Phase.COMMIT, mine=vm.NO_VOTE), SALTED, vm.ResendVote),
    ("commitment mined, its receipt lost", vdispute(Phase.COMMIT, mine=COMMIT), SALTED,
     vm.Wait),
    ("no seat on chain", vdispute(Phase.COMMIT), JUROR, vm.Wait),
    ("the challenger does not vote", vdispute(Phase.COMMIT, mine=vm.NO_VOTE), CH, vm.Wait),
    ("reveal", vdispute(Phase.REVEAL, mine=COMMIT), SALTED, vm.RevealVote),
    ("reveal mined, killed before any record", vdispute(Phase.REVEAL, mine=COMMIT,
                                                        revealed=True), SALTED, vm.Wait),
    ("salt lost: nothing to reveal", vdispute(Phase.REVEAL, mine=COMMIT), JUROR, vm.Wait),
    ("never committed: nothing to reveal", vdispute(Phase.REVEAL, mine=vm.NO_VOTE), SALTED,
     vm.Wait),
    ("reveal over: resolve", vdispute(Phase.REVEAL, now=WINDOW_END + 1, mine=COMMIT), SALTED,
     vm.Resolve),
    ("reveal over, challenger resolves too", vdispute(Phase.REVEAL, now=WINDOW_END + 1), CH,
     vm.Resolve),
]


@pytest.mark.parametrize(("case", "view", "on_disk", "action"), VERIFIER_DISPUTE_TABLE,
                         ids=[row[0] for row in VERIFIER_DISPUTE_TABLE])
def test_verifier_dispute_decision(case: str, view: vm.DisputeView,
                                   on_disk: vm.VerifierDispute, action: type) -> None:
    assert type(vm.decide_dispute(view, on_disk)) is action, case


# --- submitter --------------------------------------------------------------------------

SUBMITTER_TABLE = [
    ("open: serve", S.OPEN, 0, None, False, subm.SubmitterPhase.POSTED, subm.Serve),
    ("claimed: serve", S.CLAIMED, 0, "m.st", False, subm.SubmitterPhase.POSTED, subm.Serve),
    ("committed: serve", S.COMMITTED, 5, None, False, subm.SubmitterPhase.POSTED, subm.Serve),
    ("final, fetch pending", S.FINALIZED, 5, "m.st", False, subm.SubmitterPhase.FINAL,
     subm.FetchModel),
    ("final, fetched, budget left credited", S.FINALIZED, 5, "m.st", True,
     subm.SubmitterPhase.FINAL, subm.Withdraw),
    ("final by another party, nothing owed", S.FINALIZED, 0, None, False,
     subm.SubmitterPhase.FINAL, subm.Done),
    ("cancelled, refund credited", S.CANCELLED, 7, "m.st", False,
     subm.SubmitterPhase.CANCELLED, subm.Withdraw),
    ("cancelled, withdrawn", S.CANCELLED, 0, None, False, subm.SubmitterPhase.CANCELLED,
     subm.Done),
]


@pytest.mark.parametrize(("case", "status", "credits", "fetch_to", "fetched", "phase",
                          "action"), SUBMITTER_TABLE, ids=[row[0] for row in SUBMITTER_TABLE])
def test_submitter_decision(case: str, status: JobStatus, credits: int, fetch_to: str | None,
                            fetched: bool, phase: subm.SubmitterPhase, action: type) -> None:
    dec = subm.decide(status, credits, fetch_to, fetched)
    assert (dec.phase, type(dec.action)) == (phase, action), case


# --- the state files the old code wrote ---------------------------------------------------

OLD_SOLVER = {
    "jobs": {"3": {"round": 1, "phase": "committed", "spec": "aa" * 32, "dataset": "bb" * 32,
                   "manifest": "cc" * 32, "root": "dd" * 32, "final": "ee" * 32},
             "4": {"round": 2, "phase": "training", "spec": "aa" * 32, "dataset": "bb" * 32},
             "5": {"phase": "lost"}},  # no inputs recorded: the chain's events bring it back
    "candidates": [6, 7], "disputes": [2],
    "served": [{"job_id": 3, "step": 4, "state_hash": "0x" + "11" * 32,
                "artifact_id": "22" * 32}],
    "rejected": {"8": "too slow"}, "considering": {"7": 1},
}

OLD_VERIFIER = {
    "jobs": {"3": {"round": 1, "phase": "checked", "verdicts": {"0": True, "5": False},
                   "attested": "not in committee", "challenged": True},
             "4": {"round": None, "phase": "pending", "verdicts": {}},
             "9": {"round": 2, "phase": "done", "verdicts": {"1": True}, "attested": True}},
    "disputes": {"2": {"role": "challenger"},
                 "6": {"role": "juror", "valid": True, "salt": "ab" * 32, "committed": True,
                       "revealed": False},
                 "7": {"role": "juror", "phase": "over"}},
}


def test_old_solver_state_loads(tmp_path: Path) -> None:
    path = tmp_path / "solver.json"
    path.write_text(json.dumps(OLD_SOLVER))
    st = RoleState(path, sm.SolverDisk, sm.migrate)
    assert not st.fresh
    d = st.data
    j3, j4 = JobId(3), JobId(4)
    assert set(d.jobs) == {3, 4} and d.jobs[j3].manifest == "cc" * 32
    assert d.jobs[j4].phase == sm.SolverPhase.TRAINING and d.jobs[j4].round == 2
    assert (d.candidates, d.disputes, d.rejected, d.considering) == ([6, 7], [2],
                                                                     {8: "too slow"}, {7: 1})
    assert d.served[0].job_id == 3
    st.save()  # and what it writes reads back the same
    assert RoleState(path, sm.SolverDisk, sm.migrate).data == d


def test_old_verifier_state_loads(tmp_path: Path) -> None:
    path = tmp_path / "verifier.json"
    path.write_text(json.dumps(OLD_VERIFIER))
    st = RoleState(path, vm.VerifierDisk, vm.migrate)
    d = st.data
    jobs = {j: d.jobs[JobId(j)] for j in (3, 4, 9)}
    disputes = {i: d.disputes[DisputeId(i)] for i in (2, 6, 7)}
    assert jobs[3].checked and jobs[3].not_in_committee and not jobs[3].attested
    assert jobs[3].verdicts == {0: True, 5: False} and jobs[3].challenged
    assert jobs[4].round is None and not jobs[4].checked
    assert jobs[9].attested and jobs[9].phase == vm.VerifierPhase.DONE
    assert disputes[2].role == vm.Role.CHALLENGER and disputes[2].job is None
    assert disputes[6].salt == "ab" * 32 and disputes[6].valid is True
    assert disputes[7].over and not disputes[6].over


@pytest.mark.parametrize("text", ["{not json", "[1, 2]", '{"jobs": {"1": {"round": "x"}}}',
                                  '{"disputes": {"1": {"role": "king"}}}'])
def test_unreadable_state_starts_from_the_chain(tmp_path: Path, text: str) -> None:
    path = tmp_path / "verifier.json"
    path.write_text(text)
    st = RoleState(path, vm.VerifierDisk, vm.migrate)
    assert st.fresh and st.data == vm.VerifierDisk()
    assert (tmp_path / "verifier.json.bad").read_text() == text  # kept for a post-mortem
    assert not path.exists()


# --- on a real anvil: a solver whose disk is stale or gone after the chain moved ----------

STAKE = 500 * TOKEN
REWARD = 100 * TOKEN


def test_solver_recovers_from_a_stale_or_lost_state_file(chain: LocalChain,
                                                         tmp_path: Path) -> None:
    """Job A: committed on chain, the state file the old code wrote still says
    "training" (SIGKILL between the mined commitResult and the write). Job B: claimed
    and committed, its record gone (the state file lost, only the replayed JobPosted
    left as a candidate). The next passes must adopt B, train neither again, finalize
    A once its window is over, take B's payment that another party finalized first,
    and withdraw both rewards."""
    from node.roles.runtime import Runtime  # noqa: PLC0415 - libp2p is heavy
    from node.roles.solver import Solver  # noqa: PLC0415

    settings = node_settings(tmp_path, chain, "solver", 2, STAKE)
    sub = chain[1]
    window = chain.reader.market.market_params().verification_window
    grace = chain.reader.market.market_params().dispute_grace
    out: dict[str, Any] = {}

    async def main() -> None:
        async with Runtime(settings, "solver") as rt:
            await rt.ensure_registered(SOLVER, STAKE)
            c = rt.chain_client
            await rt.chain(sub.token.ensure_allowance, sub.market.address, 2 * 110 * TOKEN)
            jobs, traces = [], []
            for _ in range(2):
                jid = await rt.chain(sub.market.post_job, job_terms(REWARD, 10 * TOKEN))
                await rt.chain(c.market.claim_job, jid)
                leaves, tree = fake_trace(jid)
                await rt.chain(c.market.commit_trace, jid, leaves, tree)
                jobs.append(jid)
                traces.append((leaves, tree))
            a, b = jobs
            ja = await rt.chain(c.market.get_job, a)
            # What the old code had written before it was killed: A "training", B unknown.
            (rt.dir / "solver.json").write_text(json.dumps({
                "jobs": {str(a): {"round": ja.round, "phase": "training",
                                  "spec": ja.spec_hash.hex(), "dataset": ja.dataset_hash.hex()}},
                "candidates": [b], "disputes": [], "served": [], "rejected": {},
                "considering": {}}))
            balance0 = await rt.chain(c.token.balance_of, rt.address)
            solver = Solver(rt)
            passes: list[list[tuple[str, int, object]]] = []
            async with trio.open_nursery() as nursery:
                passes.append(await solver._tick(nursery))
                out["phases_open"] = {j: r.phase for j, r in solver.state.data.jobs.items()}
                await rt.chain(chain.advance, window + 5)
                # No committee (no verifiers): each round is paid on its sample's leaves,
                # which the solver had put on chain before it was killed (issue 30).
                for jid, (leaves, tree) in zip(jobs, traces, strict=True):
                    await rt.chain(chain.publish_sample, c, jid, leaves, tree)
                await rt.chain(chain.advance, grace + 1)
                await rt.chain(sub.market.finalize, b)  # another party finalizes B first
                for _ in range(3):
                    passes.append(await solver._tick(nursery))
                out["busy"] = set(solver._busy)
            out["passes"] = passes
            out["jobs"] = (a, b)
            out["status"] = [(await rt.chain(c.market.get_job, j)).status for j in jobs]
            out["credits"] = await rt.chain(c.market.credits, rt.address)
            out["gained"] = await rt.chain(c.token.balance_of, rt.address) - balance0
            out["phases"] = {j: r.phase for j, r in solver.state.data.jobs.items()}
            out["trace_dirs"] = sorted(p.name for p in (rt.dir / "jobs").glob("*")) \
                if (rt.dir / "jobs").is_dir() else []

    trio.run(main)
    a, b = out["jobs"]
    passes = out["passes"]
    acts = [{(kind, i): type(act) for kind, i, act in p} for p in passes]
    # First pass: A is committed (not retrained), B is adopted from the chain.
    assert acts[0][("job", a)] is sm.Wait, acts
    assert acts[0][("candidate", b)] is sm.Adopt, acts
    assert out["phases_open"] == {a: sm.SolverPhase.COMMITTED, b: sm.SolverPhase.TRAINING}
    # After the window: finalize A; B was finalized by another party: withdraw, once.
    assert acts[1][("job", a)] is sm.Finalize, acts
    assert acts[1][("job", b)] is sm.Withdraw, acts
    assert sm.Train not in {t for p in acts for t in p.values()}, acts
    assert out["busy"] == set() and out["trace_dirs"] == []  # no training ever started
    assert out["status"] == [JobStatus.FINALIZED, JobStatus.FINALIZED]
    assert out["credits"] == 0 and out["gained"] == 2 * REWARD, out
    assert out["phases"] == {a: sm.SolverPhase.PAID, b: sm.SolverPhase.PAID}
    # Settled jobs are not read again in this process.
    assert ("job", a) not in acts[-1] and ("job", b) not in acts[-1], acts



def committed_job(chain: LocalChain) -> tuple[JobId, list[Any], Any, int]:
    """A committed fake-trace job, its seed fixed, and a dev account in its committee."""
    verifiers = (4, 5, 6, 7, 8)
    for i in verifiers:
        chain.join(i, VERIFIER, 200 * TOKEN)
    solver = chain.join(2, SOLVER, STAKE)
    sub = chain[1]
    sub.token.ensure_allowance(sub.market.address, 110 * TOKEN)
    jid = sub.market.post_job(job_terms(REWARD, 10 * TOKEN))
    solver.market.claim_job(jid)
    leaves, tree = fake_trace(jid)
    solver.market.commit_trace(jid, leaves, tree)
    chain.mine(5)  # past the sample block
    chain[4].market.fix_seed(jid)
    committee = chain.reader.market.committee_of(jid)
    assert committee, "the seed drew nobody"
    return jid, leaves, tree, next(i for i in verifiers if chain.addresses[i] in committee)


def old_verifier_file(path: Path, jid: JobId, verdicts: dict[str, bool]) -> None:
    """verifier.json as the old code wrote it after checking ``jid`` (round 1)."""
    path.write_text(json.dumps({"jobs": {str(jid): {"round": 1, "phase": "checked",
                                                    "verdicts": verdicts}},
                                "disputes": {}}))


def test_verifier_recovers_an_attestation_it_did_not_record(chain: LocalChain,
                                                            tmp_path: Path) -> None:
    """A committee member's attestation mined, then SIGKILL before the write: its state
    file (the old layout) says "checked", not attested. The next pass must not attest
    again; once the window is over it finalizes and withdraws its attestation pay."""
    from node.roles.runtime import Runtime  # noqa: PLC0415 - libp2p is heavy
    from node.roles.verifier import Verifier  # noqa: PLC0415

    jid, _, _, me = committed_job(chain)
    chain[me].market.attest(jid)  # mined; the daemon was killed before writing it down
    chain.attest_majority(jid)  # another seat too: a majority, the round is paid (issue 30)
    params = chain.reader.market.market_params()
    settings = node_settings(tmp_path, chain, "verifier", me, 200 * TOKEN)
    out: dict[str, Any] = {}

    async def main() -> None:
        async with Runtime(settings, "verifier") as rt:
            c = rt.chain_client
            old_verifier_file(rt.dir / "verifier.json", jid, {"0": True, "5": True})
            v = Verifier(rt)
            balance0 = await rt.chain(c.token.balance_of, rt.address)
            passes = []
            async with trio.open_nursery() as nursery:
                passes.append(await v._tick(nursery))
                await rt.chain(chain.advance, params.verification_window + 5)
                for _ in range(3):
                    passes.append(await v._tick(nursery))
            out["passes"] = passes
            out["status"] = (await rt.chain(c.market.get_job, jid)).status
            out["gained"] = await rt.chain(c.token.balance_of, rt.address) - balance0
            out["credits"] = await rt.chain(c.market.credits, rt.address)
            out["phase"] = v.state.data.jobs[jid].phase

    trio.run(main)
    acts = [{(kind, i): type(act) for kind, i, act in p} for p in out["passes"]]
    assert acts[0] == {("job", jid): vm.Wait}, acts  # hasAttested says done
    assert acts[1:] == [{("job", jid): vm.Finalize}, {("job", jid): vm.Withdraw},
                        {("job", jid): vm.Done}], acts
    assert out["status"] == JobStatus.FINALIZED
    assert out["gained"] == 10 * TOKEN // params.attestors_per_job and out["credits"] == 0
    assert out["phase"] == vm.VerifierPhase.DONE


def test_verifier_attests_for_its_share_once_that_share_passed(chain: LocalChain,
                                                               tmp_path: Path) -> None:
    """A committee member attests when the segments of its own seat's share are judged
    and passed, not before, and without waiting for the rest of the sample (which it
    replays afterwards as a watchdog); a verifier holding no seat never attests."""
    from node.proof import sample_share  # noqa: PLC0415
    from node.roles.runtime import Runtime  # noqa: PLC0415 - libp2p is heavy
    from node.roles.verifier import Verifier  # noqa: PLC0415

    jid, _, _, me = committed_job(chain)
    m = chain.reader.market
    sample, committee = m.sampled_segments(jid), [str(a) for a in m.committee_of(jid)]
    mine = sample_share(sample, len(committee), committee.index(chain.addresses[me]))
    assert 0 < len(mine) < len(sample)
    outsider = next(i for i in (5, 6, 7, 8) if chain.addresses[i] not in committee)
    out: dict[str, Any] = {}

    async def main() -> None:
        async with Runtime(node_settings(tmp_path, chain, "verifier", me, 200 * TOKEN),
                           "verifier") as rt:
            v = Verifier(rt)
            with v.state as st:  # all but the last of our share judged (and the rest)
                st.jobs[jid] = vm.VerifierJob(round=1, verdicts={
                    s: True for s in sample if s != mine[-1]})
            await v._maybe_attest(jid)
            out["early"] = await rt.chain(rt.chain_client.market.has_attested, jid, rt.address)
            with v.state as st:  # our share whole, the others not judged yet
                st.jobs[jid].verdicts = {s: True for s in mine}
            await v._maybe_attest(jid)
            out["attested"] = v.state.data.jobs[jid].attested
        async with Runtime(node_settings(tmp_path / "o", chain, "verifier", outsider,
                                         200 * TOKEN), "verifier") as rt:
            w = Verifier(rt)
            with w.state as st:
                st.jobs[jid] = vm.VerifierJob(round=1, verdicts={s: True for s in sample})
            await w._maybe_attest(jid)
            out["outsider"] = (w.state.data.jobs[jid].attested,
                               w.state.data.jobs[jid].not_in_committee)

    trio.run(main)
    assert out["early"] is False
    assert out["attested"] is True and m.has_attested(jid, chain.addresses[me])
    assert out["outsider"] == (False, True)
    assert m.attestors_of(jid) == [chain.addresses[me]]


def test_verifier_recovers_a_challenge_it_did_not_record(chain: LocalChain,
                                                         tmp_path: Path) -> None:
    """Its challenge mined, then SIGKILL before the write: the state file knows only the
    failing verdict. Replaying the chain's events (the daemon's own watcher and
    handler), the next pass must know the dispute as its own and not challenge again."""
    from node.chain.events import EventWatcher  # noqa: PLC0415
    from node.roles.runtime import Runtime  # noqa: PLC0415
    from node.roles.verifier import Verifier  # noqa: PLC0415

    jid, leaves, tree, me = committed_job(chain)
    did = chain[me].market.challenge(jid, 3, leaves[3], tree.proof(3), leaves[4],
                                     tree.proof(4))
    settings = node_settings(tmp_path, chain, "verifier", me, 200 * TOKEN)
    out: dict[str, Any] = {}

    async def main() -> None:
        async with Runtime(settings, "verifier") as rt:
            c = rt.chain_client
            assert c.deployment is not None
            old_verifier_file(rt.dir / "verifier.json", jid, {"3": False})
            v = Verifier(rt)
            watcher = EventWatcher(c.w3, [c.market, c.dispute],
                                   start_block=c.deployment.deploy_block)
            async with trio.open_nursery() as nursery:
                await rt.chain(watcher.poll, v._on_event)
                out["pass"] = await v._tick(nursery)
                out["move"] = await v._dispute_move(did)
                nursery.cancel_scope.cancel()
            out["dispute"] = v.state.data.disputes[did]
            out["open"] = (await rt.chain(c.market.get_job, jid)).open_disputes

    trio.run(main)
    assert [(k, i, type(a)) for k, i, a in out["pass"]] == [("job", jid, vm.Wait)]
    d = out["dispute"]
    assert (d.role, d.job, d.round) == (vm.Role.CHALLENGER, jid, 1)
    assert type(out["move"]) is vm.Wait  # the solver's turn
    assert out["open"] == 1  # one dispute: ours, not a second


def test_submitter_serving_ends_with_what_another_party_settled(chain: LocalChain,
                                                                tmp_path: Path) -> None:
    """A job the submitter serves is finalized by another party while the submitter is
    down; serving again from the chain's status, it stops serving and withdraws the
    verification budget nobody earned."""
    from node.roles.runtime import Runtime  # noqa: PLC0415 - libp2p is heavy
    from node.roles.submitter import serve_until_final, submitter_state  # noqa: PLC0415

    solver = chain.join(2, SOLVER, STAKE)
    budget = 10 * TOKEN
    settings = node_settings(tmp_path, chain, "submitter", 1, 0)
    window = chain.reader.market.market_params().verification_window
    grace = chain.reader.market.market_params().dispute_grace
    out: dict[str, Any] = {}

    async def main() -> None:
        async with Runtime(settings, "submitter") as rt:
            c = rt.chain_client
            await rt.chain(c.token.ensure_allowance, c.market.address, REWARD + budget)
            jid = await rt.chain(c.market.post_job, job_terms(REWARD, budget))
            with submitter_state(rt) as st:
                st.jobs[jid] = subm.SubmittedJob(spec="aa" * 32, dataset="bb" * 32)
            await rt.chain(solver.market.claim_job, jid)
            leaves, tree = fake_trace(jid)
            await rt.chain(solver.market.commit_trace, jid, leaves, tree)
            await rt.chain(chain.advance, window + 5)
            # no committee: paid on the sample's leaves, one grace later (issue 30)
            await rt.chain(chain.publish_sample, solver, jid, leaves, tree)
            await rt.chain(chain.advance, grace + 1)
            await rt.chain(solver.market.finalize, jid)  # another party, first
            balance0 = await rt.chain(c.token.balance_of, rt.address)
            with trio.fail_after(30):
                await serve_until_final(rt, [jid], timeout=None)
            out["gained"] = await rt.chain(c.token.balance_of, rt.address) - balance0
            out["credits"] = await rt.chain(c.market.credits, rt.address)

    trio.run(main)
    assert out == {"gained": budget, "credits": 0}, out


def test_verifier_events_are_read_by_their_contract(chain: LocalChain, tmp_path: Path) -> None:
    """OuterJury's JuryDrawn names a caseId, DisputeGame's an id: the one verifier handler
    sees both (one chain view), and an outer jury that seats this verifier once ended its
    daemon with a KeyError. Each event is read by the contract that emitted it."""
    from node.chain.events import ChainEvent  # noqa: PLC0415
    from node.roles.runtime import Runtime  # noqa: PLC0415
    from node.roles.verifier import Verifier  # noqa: PLC0415

    me = 4
    settings = node_settings(tmp_path, chain, "verifier", me, 200 * TOKEN)
    addr = chain.addresses[me]

    def event(contract: str, name: str, **args: Any) -> ChainEvent:
        return ChainEvent(contract, name, args, 1, "0x" + "00" * 32, 0, "0x" + "11" * 20)

    async def main() -> dict[DisputeId, vm.VerifierDispute]:
        async with Runtime(settings, "verifier") as rt:
            v = Verifier(rt)
            v._on_event(event("OuterJury", "JuryDrawn", caseId=7, jury=[addr],
                              commitEnd=1, revealEnd=2))
            v._on_event(event("DisputeGame", "JuryDrawn", id=3, jurySeed=b"\0" * 32,
                              jury=[addr], commitEnd=1, revealEnd=2))
            return dict(v.state.data.disputes)

    disputes = trio.run(main)
    assert list(disputes) == [3] and disputes[DisputeId(3)].role == vm.Role.JUROR


# --- the one juror machine (DisputeGame's juries and OuterJury's) ------------------------

JUROR_TABLE = [
    # (case, stage, seated, saved, committed, revealed, action)
    ("seated, commit stage, nothing yet", jm.JuryStage.COMMIT, True, False, False, False,
     jm.CommitVote),
    ("vote on disk, commitment not landed", jm.JuryStage.COMMIT, True, True, False, False,
     jm.ResendVote),
    ("committed: wait for the reveal stage", jm.JuryStage.COMMIT, True, True, True, False,
     vm.Wait),
    ("not seated", jm.JuryStage.COMMIT, False, False, False, False, vm.Wait),
    ("reveal", jm.JuryStage.REVEAL, True, True, True, False, jm.RevealVote),
    ("revealed", jm.JuryStage.REVEAL, True, True, True, True, vm.Wait),
    ("salt lost: nothing to reveal", jm.JuryStage.REVEAL, True, False, True, False, vm.Wait),
    ("missed the commit: nothing to reveal", jm.JuryStage.REVEAL, True, True, False, False,
     vm.Wait),
    ("over: anyone resolves", jm.JuryStage.OVER, False, False, False, False, jm.Resolve),
    ("over, seated and silent: resolve", jm.JuryStage.OVER, True, True, True, False,
     jm.Resolve),
    ("not a voting stage", jm.JuryStage.OTHER, True, False, False, False, vm.Wait),
]


@pytest.mark.parametrize(("case", "stage", "seated", "saved", "committed", "revealed",
                          "action"), JUROR_TABLE, ids=[row[0] for row in JUROR_TABLE])
def test_juror_decision(case: str, stage: jm.JuryStage, seated: bool, saved: bool,
                        committed: bool, revealed: bool, action: type) -> None:
    got = jm.decide_juror(jm.JurorView(stage, seated, saved, committed, revealed))
    assert isinstance(got, action), f"{case}: {got}"


def test_both_juries_decide_through_the_one_juror_machine() -> None:
    """A dispute's jury (told by the game's phase) and an outer jury (told by its
    clocks) in the same situation get the same action: the verifier and the
    collaborative follower both call decide_juror."""
    salted = vm.VerifierDispute(role=vm.Role.JUROR, valid=True, salt="00" * 32)
    for phase, now, stage in ((Phase.COMMIT, 5, jm.JuryStage.COMMIT),
                              (Phase.REVEAL, WINDOW_END, jm.JuryStage.REVEAL),
                              (Phase.REVEAL, WINDOW_END + 1, jm.JuryStage.OVER)):
        for mine in (vm.NO_VOTE, COMMIT):
            game = vm.decide_dispute(vdispute(phase, now=now, mine=mine), salted)
            outer = jm.decide_juror(jm.JurorView(
                jm.clocked_stage(now, 10 if stage == jm.JuryStage.COMMIT else 0,
                                 WINDOW_END + 1), True, True, mine != vm.NO_VOTE, False))
            assert type(game) is type(outer), (phase, now, mine, game, outer)
