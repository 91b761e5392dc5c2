"""The verifier daemon: watch commits, replay the sampled segments from the
solver's own checkpoints, attest (once per job, when the seed's committee holds
this verifier) or challenge (whatever other disputes are doing: a lost dispute
binds only its own challenger), play bisection as challenger, draw and serve on
juries, finalize, claim rewards and withdraw.

Crash safety: each pass derives every job's and dispute's phase from the chain
and the disk (:mod:`node.roles.verifier_machine`) and does the one action it calls for;
event handlers only note ids. ``verifier.json`` keeps what the chain cannot
say: verdicts, and each vote's salt, on disk before its commitment is sent, so
a restarted verifier can still reveal.
"""

from __future__ import annotations

import math
import os
import random
import time
from typing import Any

import trio

from node.chain.contracts import DisputeState, JobStatus, Phase, Verdict
from node.chain.events import ChainEvent
from node.chain.ids import DisputeId, JobId
from node.chain.revert_names import errors
from node.chain.rpc import RPC_FAILURES
from node.chain.view import EventFeed, Snapshot
from node.errors import PolnetError
from node.logs import get_logger
from node.proof import sample_share
from node.roles.collab import CollabFollower, finalize_job
from node.roles.runtime import VERIFIER, Runtime, guarded
from node.roles.state import RoleState
from node.roles.verifier_evidence import (
    Evidence,
    judge_segment,
    judge_segment_ranks,
    vote_step,
    vote_step_ranks,
)
from node.roles.verifier_machine import (
    Attest,
    Challenge,
    Check,
    Choose,
    CommitVote,
    DisputeView,
    Done,
    DrawJury,
    Finalize,
    JobDisk,
    JobView,
    ResendVote,
    Resolve,
    RevealVote,
    Role,
    SettleRound,
    Timeout,
    VerifierDisk,
    VerifierDispute,
    VerifierJob,
    VerifierPhase,
    Withdraw,
    decide_dispute,
    decide_job,
    migrate,
    needs_attest_check,
)
from node.roles.withheld import expire_requests, request_withheld
from node.train.step import prepare_torch

log = get_logger("polnet.verifier")

# Reverts that mean "already done, or not ours to do": checked against the ABIs.
BENIGN_ATTEST = errors("AlreadyAttested", "NotInCommittee", "WindowClosed", "InvalidStatus")
BENIGN_CHALLENGE = errors("WindowClosed", "InvalidStatus", "ChallengerBarredFrom",
                          "AlreadyCondemned")
# NoEvidence: no attesting majority yet; the solver publishes its sample, then it pays.
FINALIZE_BENIGN = errors("InvalidStatus", "WindowNotOver", "DisputesOpen", "NoEvidence")
SEED_BENIGN = errors("SeedAlreadyFixed")
DRAW_BENIGN = errors("WrongPhase", "JuryNotReady")
TIMEOUT_BENIGN = errors("WrongPhase", "ClockNotExpired")
REVEAL_BENIGN = errors("AlreadyRevealed", "RevealNotOpen")
RESOLVE_BENIGN = errors("WrongPhase", "RevealNotOver")
MOVE_BENIGN = errors("NotYourTurn", "WrongPhase")
VOTE_BENIGN = errors("AlreadyCommitted", "CommitClosed")


class Verifier:
    """The honest verifier daemon. Its three judgements (`reported_pass`, `chosen_part`,
    `vote_value`) are methods so that a test cheat can override them in its own
    subclass (tests/malicious_verifier.py): no cheat is a flag of the production CLI."""

    def __init__(self, rt: Runtime, world_size: int = 1) -> None:
        self.rt = rt
        self.state = RoleState(rt.dir / "verifier.json", VerifierDisk, migrate)
        # world_size > 1: a sampled segment of a job with a dataset file is replayed by
        # that many rank processes, none holding the whole state (verifier.dist_replay)
        self.evidence = Evidence(rt, world_size)
        # Collaborative jobs: recompute outer states, post / challenge them, sit on their
        # juries, keep rounds moving (a verifier takes no slots).
        self.collab = CollabFollower(rt, self.evidence)
        self.evidence.collab = self.collab
        self._busy: set[str] = set()
        self._settled: set[int] = set()  # jobs derived Done in this process: not re-read
        self._snap: Snapshot | None = None  # the chain as of this pass (Runtime's view)
        self._moved: dict[int, float] = {}  # dispute -> trio time its last move ended

    def _on_event(self, ev: ChainEvent) -> None:
        me = self.rt.address.lower()
        with self.state as st:
            if ev.contract == "JobMarket" and ev.event == "ResultCommitted":
                jid = JobId(int(ev.args["jobId"]))
                # The event does not carry the round: the trio thread reads it (no RPC
                # here, under the state lock the event loop also takes) and starts
                # afresh only if it is a new round (a replayed event keeps the verdicts).
                st.jobs.setdefault(jid, VerifierJob()).seen_commit = True
                self._settled.discard(jid)
            elif ev.contract != "DisputeGame":
                # OuterJury's JuryDrawn names a caseId: its cases are CollabFollower's.
                return
            elif ev.event == "DisputeOpened" and str(ev.args["challenger"]).lower() == me:
                st.disputes.setdefault(DisputeId(int(ev.args["id"])), VerifierDispute(
                    role=Role.CHALLENGER, job=JobId(int(ev.args["jobId"]))))
            elif ev.event == "JuryDrawn" and me in [str(a).lower() for a in ev.args["jury"]]:
                st.disputes.setdefault(DisputeId(int(ev.args["id"])),
                                       VerifierDispute(role=Role.JUROR))

    async def run(self, until: float | None = None) -> None:
        rt = self.rt
        await rt.ensure_registered(VERIFIER, rt.settings.stake)
        c = rt.chain_client
        assert c.deployment is not None
        cursor = rt.dir / "verifier.cursor"
        if self.state.fresh:  # no usable state: replay every event, the chain re-derives all
            cursor.unlink(missing_ok=True)
        # The process's chain view: one blockNumber per tick, one batch per new block;
        # jobs and disputes are read from its snapshot, not one call each per tick.
        feed = EventFeed(rt.view, cursor_path=cursor)
        log.info("verifier_running", address=rt.address, conduct=type(self).__name__)
        async with trio.open_nursery() as nursery:
            # torch's deterministic set-up in the background: never delays a restarted
            # juror's vote, and the first replay does not pay it beside its deadlines
            nursery.start_soon(trio.to_thread.run_sync, prepare_torch)
            while until is None or time.monotonic() < until:
                try:
                    snap = await rt.snapshot()
                    for ev in feed.take():
                        self._on_event(ev)
                    feed.done()
                    await self._tick(nursery, snap)
                except PolnetError as exc:
                    log.warning("verifier_tick_failed", error=str(exc))
                except RPC_FAILURES as exc:  # a throttled or flaky provider: wait, go on
                    log.warning("verifier_tick_rpc_failed", error=str(exc) or repr(exc),
                                kind=type(exc).__name__)
                await trio.sleep(rt.settings.poll_interval)
            nursery.cancel_scope.cancel()

    async def _tick(self, nursery: trio.Nursery,
                    snap: Snapshot | None = None) -> list[tuple[str, int, object]]:
        """One pass: derive each job's phase and act; start a move for each live
        dispute. Returns what was decided: ("job", id, action)."""
        rt = self.rt
        if snap is None:  # a pass on its own (tests): the chain as of now
            snap = await rt.snapshot(fresh=True)
        self._snap = snap
        now = snap.timestamp
        taken: list[tuple[str, int, object]] = []
        await self._fill_dispute_rounds()
        # Dispute moves, votes and reveals first, before anything else this role does
        # (issue 37): each runs as a task of its own, so no job, collaborative follow-up
        # or input of anyone's delays a dispute clock. A dispute moved since the
        # snapshot was read waits for the next one (it would show the move undone).
        for did, d in list(self.state.data.disputes.items()):
            if self._moved.get(did, -math.inf) >= rt.snapshot_started:
                continue
            if f"d{did}" not in self._busy and not d.over:
                self._busy.add(f"d{did}")
                nursery.start_soon(guarded, "_dispute_move", self._dispute_move, did)
        try:
            await self.collab.tick(snap)
        except PolnetError as exc:
            log.warning("collab_tick_failed", error=str(exc))
        withdraw = False
        credits: int | None = None  # read once a pass, and only if a job is settled
        for jid in list(self.state.data.jobs):
            if jid in self._settled:
                continue
            job = snap.jobs.get(jid)
            if job is None:  # not in the view yet: read it alone
                job = await rt.chain(rt.chain_client.market.get_job, jid)
            rec = self.state.data.jobs[jid]
            if rec.seen_commit:
                with self.state as st:
                    if job.status == JobStatus.COMMITTED and rec.round not in (None, job.round):
                        st.jobs[jid] = VerifierJob()  # a new round committed: judge it anew
                    st.jobs[jid].seen_commit = False
                rec = self.state.data.jobs[jid]
            if rec.round is None and job.status == JobStatus.COMMITTED:
                with self.state as st:  # the commit's round: the job's current one
                    st.jobs[jid].round = job.round
            disk = self._job_disk(jid, busy=f"j{jid}" in self._busy)
            done = job.status != JobStatus.COMMITTED or job.round != disk.round
            if done and credits is None:
                credits = await self.rt.credits_owed()
            view = JobView(
                status=job.status, round=job.round, now=now, window_end=job.window_end,
                open_disputes=job.open_disputes,
                attested=not done and needs_attest_check(disk) and await rt.chain(
                    rt.chain_client.market.has_attested, jid, rt.address),
                credits=credits if done and credits is not None else 0)
            dec = decide_job(view, disk)
            taken.append(("job", jid, dec.action))
            self._record_phase(jid, dec.phase)
            act = dec.action
            if isinstance(act, Check | Attest | Challenge):
                self._busy.add(f"j{jid}")
                task = {Check: self._check_job, Attest: self._follow_up,
                        Challenge: self._follow_up}[type(act)]
                nursery.start_soon(guarded, task.__name__, task, jid)
            elif isinstance(act, Finalize):
                await finalize_job(rt, self.collab, jid, FINALIZE_BENIGN)
            elif isinstance(act, Withdraw):
                withdraw = True
            elif isinstance(act, Done):
                self._settled.add(jid)
        if withdraw:
            await self._withdraw()
        return taken

    def _job_disk(self, jid: JobId, busy: bool = False) -> JobDisk:
        rec = self.state.data.jobs[jid]
        return JobDisk(round=rec.round, checked=rec.checked, verdicts=dict(rec.verdicts),
                       attested=rec.attested, not_in_committee=rec.not_in_committee,
                       challenged=rec.challenged or self._challenged(jid, rec.round),
                       busy=busy)

    def _challenged(self, jid: JobId, round_: int | None) -> bool:
        """A dispute of ours on this round (its DisputeOpened names us): the chain's
        record, whether or not our own write after the challenge survived."""
        return round_ is not None and any(
            d.role == Role.CHALLENGER and d.job == jid and d.round == round_
            for d in self.state.data.disputes.values())

    async def _fill_dispute_rounds(self) -> None:
        c = self.rt.chain_client
        for did, d in list(self.state.data.disputes.items()):
            if d.role == Role.CHALLENGER and d.round is None and not d.over:
                ref = await self.rt.chain(c.market.dispute_ref, did)
                with self.state as st:
                    st.disputes[did].job, st.disputes[did].round = ref.job_id, ref.round

    def _record_phase(self, jid: JobId, phase: VerifierPhase) -> None:
        if self.state.data.jobs[jid].phase != phase:
            with self.state as st:
                st.jobs[jid].phase = phase
            log.info("job_phase", job=jid, phase=phase.value)

    async def _withdraw(self) -> None:
        """The one place credits leave the contracts for this role."""
        await self.rt.withdraw_all()
        await self.collab.withdraw()

    def _set(self, jid: JobId, **kw: Any) -> None:
        with self.state as st:
            for k, v in kw.items():
                setattr(st.jobs[jid], k, v)

    # --- sampled replay ------------------------------------------------------------------

    async def _check_job(self, jid: JobId) -> None:
        rt, c = self.rt, self.rt.chain_client
        try:
            job = await rt.chain(c.market.get_job, jid)
            if job.seed == bytes(32):
                if await rt.chain(c.block_number) <= job.sample_block:
                    return  # the seed block is not mined yet: next tick
                await rt.transact_ok(c.market.fix_seed, jid, benign=SEED_BENIGN)
            await expire_requests(self, jid)
            sample = await rt.chain(c.market.sampled_segments, jid)
            mine = await self._own_share(jid, sample)
            # Our committee share first (the attestation covers it alone), then, as a
            # watchdog, the rest of the sample.
            segments = mine + ([s for s in sample if s not in mine]
                               if rt.settings.watch_sample else [])
            ev = await self.evidence.for_job(jid, job)
            if ev is None:  # no manifest announced yet: next tick, or name our share
                await request_withheld(self, jid, job, mine)
                return
            log.info("checking", job=jid, segments=segments, share=mine)
            # Each segment on its own: one that cannot be judged now waits for the next
            # tick; one whose committed state is unusable fails (and gets challenged).
            unjudged: list[int] = []
            for i, seg in enumerate(segments):
                if i == len(mine) and mine and not unjudged:
                    await self._maybe_attest(jid)  # our share is judged: attest before watching
                if seg in self.state.data.jobs[jid].verdicts:
                    continue
                verdict = await judge_segment_ranks(ev, root=job.trace_root, segment=seg) \
                    if ev.world_size > 1 else \
                    await judge_segment(ev.committed, ev.ctx, root=job.trace_root,
                                        job_id=jid, segment=seg, commitment=ev.commitment,
                                        init_hash=ev.init_hash)
                if verdict is None:
                    unjudged.append(seg)
                    continue
                rt.metrics.steps.inc(ev.ctx.spec.checkpoint_interval)
                passed = self.reported_pass(seg == segments[0], verdict.passed)
                rt.metrics.verdicts.labels("pass" if passed else "fail").inc()
                log.info("verdict", job=jid, segment=seg, passed=verdict.passed,
                         ratio=f"{verdict.ratio:.2e}", worst=verdict.worst_tensor,
                         reason=verdict.reason)
                with self.state as st:
                    st.jobs[jid].verdicts[seg] = passed
            if not unjudged:
                self._set(jid, checked=True)
                await self._maybe_attest(jid)
            else:
                log.info("segments_unjudged", job=jid, segments=unjudged)
                await request_withheld(self, jid, job, [s for s in mine if s in unjudged])
            await self._maybe_challenge(jid)
        except PolnetError as exc:
            log.warning("check_failed", job=jid, error=str(exc))
        finally:
            self._busy.discard(f"j{jid}")

    async def _own_share(self, jid: JobId, sample: list[int]) -> list[int]:
        """Our committee seat's share of the sample ([] when we hold no seat): the
        segments our attestation answers for (node.proof.sample_share)."""
        committee = [a.lower() for a in await self.rt.chain(
            self.rt.chain_client.market.committee_of, jid)]
        me = self.rt.address.lower()
        return sample_share(sample, len(committee), committee.index(me)) \
            if me in committee else []

    async def _maybe_attest(self, jid: JobId) -> None:
        """One attestation per job, for our committee share of the sample, if the
        seed's committee holds us, every segment of the share passed and no segment we
        judged failed."""
        rt, c = self.rt, self.rt.chain_client
        info = self.state.data.jobs[jid]
        if info.attested or info.not_in_committee or not info.verdicts \
                or not all(info.verdicts.values()):
            return
        job = await rt.chain(c.market.get_job, jid)
        if job.seed == bytes(32):
            # Not drawn yet as of the latest block: our fixSeed was refused because another
            # one is pending. Deciding "not in committee" now would be for good: next tick.
            return
        mine = await self._own_share(jid, await rt.chain(c.market.sampled_segments, jid))
        if not mine:
            self._set(jid, not_in_committee=True)
            return
        if any(s not in info.verdicts for s in mine):
            return  # our share is not judged yet
        await rt.transact_ok(c.market.attest, jid, benign=BENIGN_ATTEST)
        self._set(jid, attested=True)
        log.info("attested", job=jid, share=mine)

    async def _maybe_challenge(self, jid: JobId) -> None:
        """Dispute one failing segment, whatever other disputes on the job are doing:
        a dispute someone else loses (a solver's puppet, say) binds only them, and the
        round's bond is settled once, paying the earliest-opened dispute the solver lost."""
        rt, c = self.rt, self.rt.chain_client
        info = self.state.data.jobs[jid]
        failing = [s for s, ok in info.verdicts.items() if not ok]
        if not failing or info.challenged or self._challenged(jid, info.round):
            return
        await trio.sleep(random.uniform(0, 2))  # spread transactions of verifiers that agree
        job = await rt.chain(c.market.get_job, jid)
        if job.status != JobStatus.COMMITTED:
            return
        ev = await self.evidence.for_job(jid, job)
        if ev is None:
            return
        seg = failing[0]
        # Leaves and proofs only: a state that cannot be loaded is still challengeable.
        start, end = ev.commitment(seg), ev.commitment(seg + 1)
        await self._challenge(jid, seg, start, end)
        self._set(jid, challenged=True)

    async def _follow_up(self, jid: JobId) -> None:
        """A checked job, each tick while it is open: attest (once the committee is
        drawn) or challenge, whichever its verdicts call for."""
        try:
            await self._maybe_attest(jid)
            await self._maybe_challenge(jid)
        finally:
            self._busy.discard(f"j{jid}")

    async def _challenge(self, jid: JobId, seg: int, start: Any, end: Any) -> None:
        c = self.rt.chain_client
        try:
            did = await self.rt.chain(c.market.challenge, jid, seg, start.leaf, list(start.proof),
                                      end.leaf, list(end.proof))
        except PolnetError as exc:
            if getattr(exc, "error", None) in BENIGN_CHALLENGE:
                log.info("challenge_not_needed", job=jid, segment=seg, error=str(exc))
                return
            raise
        job = await self.rt.chain(c.market.get_job, jid)
        with self.state as st:
            st.disputes[did] = VerifierDispute(role=Role.CHALLENGER, job=jid, round=job.round)
        log.info("challenged", job=jid, segment=seg, dispute=did)

    # --- disputes ---------------------------------------------------------------------

    async def _dispute_view(self, d: DisputeState, info: VerifierDispute) -> DisputeView:
        """What decide_dispute needs from the chain, read only where it matters."""
        rt, c = self.rt, self.rt.chain_client
        me = rt.address.lower()
        seat = [i for i, a in enumerate(d.jury) if a.lower() == me]
        vote = d.votes[seat[0]] if seat and seat[0] < len(d.votes) else None
        won = d.verdict in (Verdict.INVALID, Verdict.SOLVER_TIMED_OUT)
        resolved = d.phase == Phase.RESOLVED
        settled = True
        if resolved and won and info.role == Role.CHALLENGER:
            ref = await rt.chain(c.market.dispute_ref, d.id)
            r = await rt.chain(c.market.round_info, d.job_id, ref.round)
            settled = r.settled
            if settled:
                log.info("round_settled", dispute=d.id, job=d.job_id,
                         paid_us=r.first_winner == d.id)
        snap = self._snap
        return DisputeView(
            phase=d.phase, turn=d.turn, solver_clock_left=d.solver_clock_left,
            now=snap.timestamp if snap is not None else await rt.chain(c.timestamp),
            block=(snap.block if snap is not None else await rt.chain(c.block_number))
            if d.phase == Phase.DRAWING else 0,
            draw_block=d.draw_block, reveal_end=d.reveal_end, won=won,
            my_commitment=None if vote is None else vote.commitment,
            my_revealed=vote is not None and vote.revealed, round_settled=settled,
            credits=await self.rt.credits_owed() if resolved and settled else 0)

    async def _dispute_move(self, did: DisputeId) -> object:
        """Derive the dispute's phase from the chain and make the one move it calls for."""
        rt, c = self.rt, self.rt.chain_client
        act: object = None
        try:
            info = self.state.data.disputes[did]
            d = await self._dispute(did)
            act = decide_dispute(await self._dispute_view(d, info), info)
            if isinstance(act, SettleRound):
                await self._claim(d)
            elif isinstance(act, Withdraw):
                await self._withdraw()
            elif isinstance(act, Done):
                with self.state as st:
                    st.disputes[did].over = True
                log.info("dispute_over", dispute=did, verdict=d.verdict.name,
                         role=info.role.value)
            elif isinstance(act, DrawJury):
                await rt.transact_ok(c.dispute.draw_jury, did, benign=DRAW_BENIGN)
            elif isinstance(act, Timeout):
                await rt.transact_ok(c.dispute.timeout, did, benign=TIMEOUT_BENIGN)
            elif isinstance(act, Choose):
                await self._choose(d)
            elif isinstance(act, CommitVote):
                await self._vote(d)
            elif isinstance(act, ResendVote):
                # The salt was saved but its commitment is not on chain (we died first).
                assert info.salt is not None and info.valid is not None
                await rt.transact_ok(c.dispute.commit_vote, did, info.valid,
                                     bytes.fromhex(info.salt), benign=VOTE_BENIGN)
                log.info("vote_committed", dispute=did, valid=info.valid, resent=True)
            elif isinstance(act, RevealVote):
                assert info.salt is not None and info.valid is not None
                await rt.transact_ok(c.dispute.reveal_vote, did, info.valid,
                                     bytes.fromhex(info.salt), benign=REVEAL_BENIGN)
            elif isinstance(act, Resolve):
                await rt.transact_ok(c.dispute.resolve, did, benign=RESOLVE_BENIGN)
        except PolnetError as exc:
            log.warning("dispute_move_failed", dispute=did, error=str(exc))
        finally:
            self._moved[did] = trio.current_time()
            self._busy.discard(f"d{did}")
        return act

    async def _dispute(self, did: DisputeId) -> DisputeState:
        """The dispute as of this pass's snapshot (read alone if the view lacks it)."""
        d = self._snap.disputes.get(did) if self._snap is not None else None
        if d is None:
            d = await self.rt.chain(self.rt.chain_client.dispute.get_dispute, did)
        return d

    async def _claim(self, d: Any) -> None:
        """Settle the round we won a dispute of: ``finalize`` pays its first winner,
        once the window is over and no dispute of the round is open."""
        rt, c = self.rt, self.rt.chain_client
        job = await rt.chain(c.market.get_job, d.job_id)
        if job.open_disputes == 0 and await rt.chain(c.timestamp) > job.window_end:
            await finalize_job(rt, self.collab, d.job_id, FINALIZE_BENIGN)

    async def _choose(self, d: Any) -> None:
        """Walk the round's parts from lo, replaying each from the solver's own state
        at its start: dispute the first part whose end the solver's state disagrees
        with (or did not serve); if every mid agrees, the fault is in the last part."""
        ev = await self.evidence.for_job(d.job_id)
        if ev is None:
            return
        c = self.rt.chain_client
        dep = c.deployment
        hashes = await self.rt.chain(c.dispute.posted_mids, d.id, d.mids_root,
                                     dep.deploy_block if dep is not None else 0)
        points = d.points
        cur = None
        try:
            # Wait for it a bounded share of our clock, as for the mids: a challenger
            # restarted mid-dispute has not yet heard the solver re-announce its served
            # states, and disputing part 0 for that would lose an honest challenge.
            with trio.move_on_at(trio.current_time() + max(5.0, d.challenger_clock_left / 3)):
                cur = await ev.state(d.lo, d.lo_hash, wait=True)
        except PolnetError as exc:  # e.g. a committed start state that cannot be loaded
            log.warning("low_state_unusable", dispute=d.id, step=d.lo, error=str(exc))
            cur = None
        if cur is None:
            # Nothing to replay from: the first part is as disputable as any, and a
            # state the solver cannot serve counts against it.
            await self.rt.transact_ok(c.dispute.choose, d.id, 0, hashes,
                                      benign=MOVE_BENIGN)
            log.info("part_chosen", dispute=d.id, disputed=[points[0], points[1]],
                     why=f"state {d.lo} unusable or not served")
            return
        # Wait for the solver's mids a bounded share of our clock: a state the solver
        # does not serve counts against it, so then we dispute the part ending there.
        deadline = trio.current_time() + max(5.0, d.challenger_clock_left / 3)
        part, why = len(points) - 2, "all mids agree"
        for j, h in enumerate(hashes):
            step = points[j + 1]
            # A mid our own replay reproduces exactly needs no fetch: the part is honest.
            mine = await trio.to_thread.run_sync(ev.replay_range, cur, points[j], step)
            if mine is not None and await trio.to_thread.run_sync(ev.is_exact, mine, step, h):
                cur = mine
                continue
            nxt = None
            with trio.move_on_at(deadline):
                try:
                    nxt = await ev.state(step, h, wait=True)
                except PolnetError as exc:  # unreachable or bad bytes: not served
                    log.info("mid_fetch_failed", dispute=d.id, step=step, error=str(exc))
            if nxt is None:
                log.warning("mid_state_not_served", dispute=d.id, step=step)
                part, why = j, f"state {step} not served"
                break
            if not await trio.to_thread.run_sync(ev.step_range_ok, cur, points[j], nxt, step,
                                                 mine):
                part, why = j, f"state {step} out of tolerance"
                break
            cur = nxt
        part = self.chosen_part(part, len(points) - 1)
        await self.rt.transact_ok(c.dispute.choose, d.id, part, hashes,
                                  benign=MOVE_BENIGN)
        log.info("part_chosen", dispute=d.id, range=[d.lo, d.hi],
                 disputed=[points[part], points[part + 1]], why=why)

    # --- the judgements a test cheat overrides ----------------------------------------

    def reported_pass(self, first_of_sample: bool, passed: bool) -> bool:
        """What we act on for a replayed segment: its verdict."""
        return passed

    def chosen_part(self, part: int, parts: int) -> int:
        """The part of a bisection round we dispute: the first that fails our replay."""
        return part

    def vote_value(self, valid: bool) -> bool:
        """Our jury vote: what our replay of the step found."""
        return valid

    async def _vote(self, d: Any) -> None:
        """One step, replayed: S_lo -> S_lo+1 against the solver's S_hi. A state
        the solver does not serve in time counts against it."""
        ev = await self.evidence.for_job(d.job_id)
        valid = False
        if ev is not None:
            with trio.move_on_after(max(5.0, d.commit_end - await self.rt.chain(
                    self.rt.chain_client.timestamp) - 10)):
                # `--world-size N`: the step on N ranks, none holding the whole state
                vote = vote_step_ranks if ev.world_size > 1 else vote_step
                valid = await vote(ev, d.lo, d.lo_hash, d.hi, d.hi_hash)
        valid = self.vote_value(valid)
        salt = os.urandom(32)
        with self.state as st:  # salt on disk before the commitment leaves
            st.disputes[d.id].valid, st.disputes[d.id].salt = valid, salt.hex()
        await self.rt.transact_ok(self.rt.chain_client.dispute.commit_vote, d.id, valid, salt,
                                  benign=VOTE_BENIGN)
        log.info("vote_committed", dispute=d.id, step=[d.lo, d.hi], valid=valid)
