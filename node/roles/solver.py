"""The solver daemon: claim jobs it can finish in time, train them with a trace,
serve the checkpoints, commit, answer bisection with bitwise-regenerated
states, finalize and withdraw.

Crash safety: every pass derives each job's phase from the chain and the disk
(:mod:`node.roles.solver_machine`) and does the one action it calls for, so a
SIGKILL at any point (a commit mined but not recorded, a lost receipt, a claim
that landed before its record) costs at most the work since the last
checkpoint. Event handlers only note job and dispute ids; ``solver.json`` keeps
what the chain cannot say (the inputs, the published manifest, rejections).
"""

from __future__ import annotations

import dataclasses
import math
import time
from pathlib import Path
from typing import Any

import trio

from node.chain.contracts import Job, JobStatus, Phase
from node.chain.events import ChainEvent
from node.chain.ids import DisputeId, JobId
from node.chain.revert_names import errors
from node.chain.rpc import RPC_FAILURES
from node.chain.view import EventFeed, Snapshot
from node.data.probe import probe_job
from node.errors import ConfigError, ContractRevert, JobRejected, PeerUnavailable, PolnetError
from node.logs import get_logger
from node.p2p.announce import ResultCommitted
from node.proof import build_trace_tree
from node.roles.announce_kinds import StateServed
from node.roles.collab import CollabFollower, finalize_job
from node.roles.evidence import owed_segments, publish_segments, requested_segments
from node.roles.jobfiles import fetch_init_weights, fetch_job_inputs, job_context
from node.roles.leafserve import keep_every_for, serve_missing_leaves
from node.roles.runtime import SOLVER, Runtime, guarded, measure_profile
from node.roles.solver_machine import (
    ACTIVE,
    Adopt,
    Decision,
    Done,
    DrawJury,
    Drop,
    Finalize,
    HeldJobDisk,
    HeldJobView,
    PostMids,
    Publish,
    PublishLeaves,
    ServedState,
    SolverDisk,
    SolverDisputeView,
    SolverJob,
    SolverPhase,
    Timeout,
    Train,
    Wait,
    Withdraw,
    decide_candidate,
    decide_dispute,
    decide_job,
    migrate,
)
from node.roles.state import RoleState
from node.train.budget import machine_memory_mb
from node.units import wei_to_pol

log = get_logger("polnet.solver")

# Reverts that mean "already done, by us or someone else": checked against the ABIs.
CLAIM_BENIGN = errors("InvalidStatus")  # another solver claimed it first
COMMIT_BENIGN = errors("InvalidStatus")  # our commit already landed (a lost receipt, a restart)
# NoEvidence: no attesting majority yet; the solver publishes its sample, then it pays.
FINALIZE_BENIGN = errors("InvalidStatus", "WindowNotOver", "DisputesOpen", "NoEvidence")
# someone else settled the round's held delay compensation first (it is ours either way)
DELAY_BENIGN = errors("NoDelayCompensation", "RoundNotSettled")
DRAW_BENIGN = errors("WrongPhase", "JuryNotReady")
TIMEOUT_BENIGN = errors("WrongPhase", "ClockNotExpired")
MOVE_BENIGN = errors("NotYourTurn", "WrongPhase")

ANNOUNCE_EVERY_S = 3.0
SAFETY_FACTOR = 2.0  # claim only if the estimated training time x this fits the deadline
PROBE_TIMEOUT_S = 120.0  # a job's trial (child start, build, a few steps) must end in this
MAX_CONSIDER_TRIES = 3   # considerations the daemon died in before a job is rejected
MAX_REJECTED = 10_000    # remembered rejections (each costs its submitter a posted job)
REASON_CHARS = 300
TRACE_MANIFEST = "trace.json"  # node.train.trace.MANIFEST_NAME (torch-free here)


class Solver:
    """``memory_mb``: the most memory this solver gives one job (default: half of the
    machine's); a job whose estimate or probe needs more is rejected."""

    def __init__(self, rt: Runtime, behavior: str = "honest", max_jobs: int = 1,
                 memory_mb: int | None = None,
                 probe_timeout_s: float = PROBE_TIMEOUT_S, collab_slots: int = 1,
                 world_size: int = 1, dist_mode: str = "ddp") -> None:
        from node.behaviors import make_behavior  # noqa: PLC0415 - torch is heavy
        from node.roles.verifier_evidence import Evidence  # noqa: PLC0415 - sub-jobs' final states

        self.rt = rt
        self.behavior_name = behavior
        self.behavior = make_behavior(behavior)  # fails early on an unknown name
        # world_size > 1: each job is trained by that many rank processes
        # (node.train.distributed); the ranks get no key, this process commits.
        if world_size > 1 and behavior != "honest":
            raise ConfigError("a distributed solver trains honestly (--behavior honest)")
        if dist_mode not in ("ddp", "fsdp"):
            raise ConfigError(f"unknown distributed mode {dist_mode!r} (ddp or fsdp)")
        self.world_size, self.dist_mode = world_size, dist_mode
        self.max_jobs = max_jobs
        self.memory_mb = memory_mb or machine_memory_mb() // 2
        self.probe_timeout_s = probe_timeout_s
        self.state = RoleState(rt.dir / "solver.json", SolverDisk, migrate)
        self._busy: set[str] = set()  # task keys running now (not persisted)
        self._settled: set[int] = set()  # jobs derived Done in this process: not re-read
        self._looked_over = False  # every candidate checked once since the start
        self._contexts: dict[int, Any] = {}
        self._initial: dict[int, Any] = {}  # sub-job -> its S_0 builder (theta_t)
        # Sub-jobs reserved for our slots: claimed whatever else is active (max_jobs), as
        # the slot bond promised; an unclaimed one is dropped at the round's deadline and
        # the bond lost. Rebuilt by the first pass over the candidates after a restart.
        self._reserved_ours: set[int] = set()
        self._gflops: float | None = None
        # trio time this process last changed a job's ("j7"), a candidate's ("c7") or a
        # dispute's ("d3") state on chain: a snapshot whose update began before it shows
        # the move undone, so the key waits for the next one (else a landed commit would
        # read as "train again" and a landed claim as "lost")
        self._moved: dict[str, float] = {}
        # (job, round) -> the block whose logs were last searched for pending
        # availability requests, and what they named
        self._requested: dict[tuple[int, int], tuple[int, set[int]]] = {}
        evidence = Evidence(rt)
        # Collaborative jobs: slots, theta_t, the rounds' permissionless moves.
        self.collab = CollabFollower(rt, evidence, want_slots=collab_slots,
                                     forge_outer=self.behavior.forges_outer)
        evidence.collab = self.collab

    # --- events (worker thread; only note ids, persisted before the cursor moves) -------

    def _on_event(self, ev: ChainEvent) -> None:
        with self.state as st:
            if ev.event in ("JobPosted", "JobReopened"):
                jid = JobId(int(ev.args["jobId"]))
                if jid not in st.candidates and jid not in st.rejected:
                    st.candidates.append(jid)
                self._settled.discard(jid)
            elif ev.event == "DisputeOpened" and str(ev.args.get("solver", "")).lower() \
                    == self.rt.address.lower():
                did = DisputeId(int(ev.args["id"]))
                if did not in st.disputes:
                    st.disputes.append(did)
        if ev.event == "JobReserved" and str(ev.args.get("solver", "")).lower() \
                == self.rt.address.lower():
            self._reserved_ours.add(int(ev.args["jobId"]))

    # --- main loop --------------------------------------------------------------------

    async def run(self, until: float | None = None) -> None:
        rt = self.rt
        await rt.ensure_registered(SOLVER, rt.settings.stake, self.world_size)
        c = rt.chain_client
        assert c.deployment is not None
        cursor = rt.dir / "solver.cursor"
        if self.state.fresh:  # no usable state: replay every event, the chain re-derives all
            cursor.unlink(missing_ok=True)
        # The process's chain view (issue 31): one blockNumber per tick, one batch per new
        # block; held jobs and disputes are read from its snapshot, not one call each.
        feed = EventFeed(rt.view, cursor_path=cursor)
        log.info("solver_running", behavior=self.behavior_name, address=rt.address)
        from node.train.step import prepare_torch  # noqa: PLC0415 - torch is heavy

        async with trio.open_nursery() as nursery:
            # in the background: never delays a restart
            nursery.start_soon(trio.to_thread.run_sync, prepare_torch)
            nursery.start_soon(self._announcer)
            if self.collab.forge_outer:  # a test cheat's own race (behaviour wrong_outer)
                nursery.start_soon(self.collab.forge_loop)
            while until is None or time.monotonic() < until:
                try:
                    snap = await rt.snapshot()
                    for ev in feed.take():
                        self._on_event(ev)
                    feed.done()
                    await self._tick(nursery, snap)
                except PolnetError as exc:  # one bad pass must not kill the daemon
                    log.warning("solver_tick_failed", error=str(exc))
                except RPC_FAILURES as exc:  # a throttled or flaky provider: wait, go on
                    log.warning("solver_tick_rpc_failed", error=str(exc) or repr(exc),
                                kind=type(exc).__name__)
                await trio.sleep(rt.settings.poll_interval)
            nursery.cancel_scope.cancel()

    async def _tick(self, nursery: trio.Nursery,
                    snap: Snapshot | None = None) -> list[tuple[str, int, object]]:
        """One pass: derive every job's and dispute's phase, do what each calls for.
        Returns what was decided: ("job" | "candidate" | "dispute", id, action)."""
        if snap is None:  # a pass on its own (tests): the chain as of now
            snap = await self.rt.snapshot(fresh=True)
        taken: list[tuple[str, int, object]] = []
        withdraw = False
        # Dispute moves first, before anything else this role does (issue 37): a live
        # dispute clock never waits on collaborative follow-up, our jobs or candidates.
        # Each is a few chain reads and at most one transaction (mids: in the background).
        for did in list(self.state.data.disputes):
            if self._stale(f"d{did}"):
                continue
            try:
                act2 = await self._dispute_move(nursery, did, snap)
            except PolnetError as exc:  # one dispute's failure must not stall the others
                log.warning("dispute_move_failed", dispute=did, error=str(exc))
                continue
            taken.append(("dispute", did, act2))
            withdraw |= isinstance(act2, Withdraw)
        try:
            await self.collab.tick(snap)  # it reads jobs, rounds and cases from the snapshot
        except PolnetError as exc:
            log.warning("collab_tick_failed", error=str(exc))
        for jid in list(self.state.data.jobs):
            if jid in self._settled or self._stale(f"j{jid}"):
                continue
            dec = await self._derive(jid, snap)
            taken.append(("job", jid, dec.action))
            withdraw |= await self._act(nursery, jid, dec)
            if dec.phase == SolverPhase.COMMITTED and self.behavior.serves_data:
                # a sparse trace: serve sampled leaves
                try:
                    await serve_missing_leaves(self, nursery, jid)
                except (PolnetError, OSError) as exc:  # one job's files must not stall
                    log.warning("leaves_not_served", job=jid, error=str(exc))
        # A committed job still needs us (disputes), so it counts until it is paid; one
        # being considered counts too (its claim may land).
        active = sum(1 for r in self.state.data.jobs.values() if r.phase in ACTIVE)
        for jid in list(self.state.data.candidates):
            considering = sum(1 for k in self._busy if k.startswith("c"))
            full = active + considering >= self.max_jobs
            if full and self._looked_over and jid not in self._reserved_ours:
                continue
            # The first pass looks at every candidate even when full: one the chain gives
            # us already (claimed before a kill recorded it) is adopted, never left behind.
            if self._stale(f"c{jid}"):
                continue
            try:
                act = await self._candidate(nursery, jid, snap, may_claim=not full
                                            and considering == 0)
            except PolnetError as exc:  # one job's input must not end the pass
                log.warning("candidate_failed", job=jid, error=str(exc))
                continue
            taken.append(("candidate", jid, act))
            if isinstance(act, Adopt):
                active += 1
        self._looked_over = True
        if withdraw:
            await self._withdraw()
        return taken

    async def _withdraw(self) -> None:
        """The one place credits leave the contracts for this role."""
        await self.rt.withdraw_all()
        await self.collab.withdraw()

    def _stale(self, key: str) -> bool:
        """This process moved ``key`` since the newest snapshot's update began."""
        return self._moved.get(key, -math.inf) >= self.rt.snapshot_started

    def _mark(self, key: str) -> None:
        self._moved[key] = trio.current_time()

    async def _derive(self, jid: JobId, snap: Snapshot | None = None) -> Decision:
        """Derive the job's phase from ``snap`` (None: read the job now) and record it.
        A job the snapshot shows lost is read again before it is given up: only the
        chain as of now may drop a job from our books."""
        c = self.rt.chain_client
        job = snap.jobs.get(jid) if snap is not None else None
        if job is None:  # not in the view (yet), or asked for the chain as of now
            job = await self.rt.chain(c.market.get_job, jid)
            snap = None
        if snap is not None and job.solver.lower() != self.rt.address.lower():
            job = await self.rt.chain(c.market.get_job, jid)
            snap = None
        mine = job.solver.lower() == self.rt.address.lower()
        rec = self.state.data.jobs[jid]
        if mine and job.round != rec.round and job.status != JobStatus.OPEN:
            # The chain's round is the one we hold (e.g. a record from before a reopen).
            with self.state as st:
                st.jobs[jid] = rec = SolverJob(round=job.round, spec=rec.spec,
                                               dataset=rec.dataset)
        credits = await self.rt.credits_owed() if mine and job.status == JobStatus.FINALIZED else 0
        committed = mine and job.status == JobStatus.COMMITTED
        now = 0
        if committed:
            now = snap.timestamp if snap is not None else await self.rt.chain(c.timestamp)
        view = HeldJobView(status=job.status, mine=mine, round=job.round, now=now,
                           window_end=job.window_end,
                           open_disputes=job.open_disputes, credits=credits)
        disk = HeldJobDisk(published=rec.manifest is not None,
                           has_trace=(self._trace_dir(jid) / TRACE_MANIFEST).is_file(),
                           busy=str(jid) in self._busy)
        if committed and disk.has_trace:
            # A pending request counts in the job's open disputes: with none open there
            # is none to search for (no log search per committed job per pass); with
            # some, the logs are searched once per block.
            key, named = (jid, job.round), set[int]()
            if job.open_disputes:
                block = snap.block if snap is not None else -1
                searched, named = self._requested.get(key, (-2, set()))
                if searched != block or block < 0:
                    named = set(await self.rt.chain(requested_segments, c, jid, job))
                    self._requested[key] = (block, named)
            else:
                self._requested.pop(key, None)
            owed = await self.rt.chain(owed_segments, c, jid, job, view.now, named)
            view = dataclasses.replace(view, owed=tuple(owed))
        dec = decide_job(view, disk)
        self._record_phase(jid, dec.phase)
        return dec

    async def _act(self, nursery: trio.Nursery, jid: JobId, dec: Decision) -> bool:
        """Do ``dec.action`` for job ``jid``; True when credits wait to be withdrawn."""
        act = dec.action
        if isinstance(act, Train):
            self._busy.add(str(jid))
            nursery.start_soon(guarded, "_train_and_commit", self._train_and_commit, jid)
        elif isinstance(act, Publish):
            try:
                manifest_id = await self._publish_trace(jid, self._trace_dir(jid))
                log.info("trace_republished", job=jid, manifest=manifest_id)
            except (PolnetError, OSError) as exc:  # one job's files must not stall the pass
                log.warning("trace_republish_failed", job=jid, error=str(exc))
        elif isinstance(act, PublishLeaves) and not self.behavior.serves_data:
            log.info("leaves_withheld", job=jid, segments=list(act.segments))
        elif isinstance(act, PublishLeaves):
            try:
                await publish_segments(self, jid, list(act.segments))
            except (PolnetError, OSError) as exc:  # retried on the next pass
                log.warning("leaves_not_published", job=jid, error=str(exc))
            self._mark(f"j{jid}")
        elif isinstance(act, Finalize):
            await finalize_job(self.rt, self.collab, jid, FINALIZE_BENIGN)
            await self._settle_delay(jid)
            self._mark(f"j{jid}")
        elif isinstance(act, Withdraw):
            await self._settle_delay(jid)
        elif isinstance(act, Done):
            self._settled.add(jid)
        return isinstance(act, Withdraw)

    async def _settle_delay(self, jid: JobId) -> None:
        """Our round was paid: collect the halves of the griefers' lost challenge bonds the
        game held for it (issue 30, delay is priced), so the next withdraw takes them."""
        c = self.rt.chain_client
        job = await self.rt.chain(c.market.get_job, jid)
        if job.status != JobStatus.FINALIZED or job.solver.lower() != self.rt.address.lower():
            return
        if await self.rt.chain(c.dispute.delay_held, jid, job.round):
            await self.rt.transact_ok(c.dispute.settle_delay, jid, job.round,
                                      benign=DELAY_BENIGN)

    def _record_phase(self, jid: JobId, phase: SolverPhase) -> None:
        if self.state.data.jobs[jid].phase == phase:
            return
        with self.state as st:
            st.jobs[jid].phase = phase
        log.info("job_phase", job=jid, phase=phase.value)
        for p in SolverPhase:
            self.rt.metrics.jobs.labels(p.value).set(
                sum(1 for r in self.state.data.jobs.values() if r.phase == p))

    async def _candidate(self, nursery: trio.Nursery, jid: JobId, snap: Snapshot | None = None,
                         may_claim: bool = True) -> object:
        """A posted or reopened job: adopt it if the chain says it is ours already,
        else consider it (if ``may_claim``) in the background: fetching its inputs and
        probing them takes minutes that no pass may wait for. Returns Adopt when it is
        on our books."""
        c = self.rt.chain_client
        job = snap.jobs.get(jid) if snap is not None else None
        if job is None:  # not in the view yet
            job = await self.rt.chain(c.market.get_job, jid)
        rec = self.state.data.jobs.get(jid)
        act = decide_candidate(job.status, job.solver.lower() == self.rt.address.lower(),
                               lost_before=rec is not None and rec.phase == SolverPhase.LOST)
        if isinstance(act, Adopt):
            self._adopt(jid, job, "job_adopted")
        elif isinstance(act, Drop):
            self._drop(jid)
        elif self.collab.is_sub_job(job):
            if await self._claim_sub_job(jid, job):  # our slot's: not bounded by max_jobs
                return Adopt()
        elif may_claim and f"c{jid}" not in self._busy:
            self._busy.add(f"c{jid}")
            nursery.start_soon(guarded, "_consider", self._consider_in_background, jid, job)
        return act

    async def _consider_in_background(self, jid: JobId, job: Job) -> None:
        try:
            await self._consider(jid, job)
        finally:
            self._busy.discard(f"c{jid}")
            self._mark(f"c{jid}")

    async def _claim_sub_job(self, jid: JobId, job: Job) -> bool:
        """A collaborative round's sub-job: ours only if reserved for us (our slot, whose
        claim stated the probed throughput), claimed once we know its theta_t."""
        rt, c = self.rt, self.rt.chain_client
        if str(await rt.chain(c.market.reserved_solver_of, jid)).lower() != rt.address.lower():
            self._drop(jid)  # another slot's: never ours
            return False
        self._reserved_ours.add(jid)
        start = await self.collab.start_state_factory(jid)
        if start is None:
            log.info("sub_job_waits_for_theta", job=jid)
            return False  # stays a candidate: the next pass tries again
        self._contexts[jid], self._initial[jid] = start
        job2 = await self._claim(jid, job)
        if job2 is None:
            return False
        self._adopt(jid, job2, "sub_job_claimed")
        return True

    async def _claim(self, jid: JobId, job: Job) -> Job | None:
        """Stake up to the job's bond if needed and claim it; the job as the chain now
        has it if the claim is ours (benign also when our own claim landed and its
        receipt was lost: the chain decides), else None."""
        rt, c = self.rt, self.rt.chain_client
        need = job.reward * (await rt.chain(c.market.market_params)).bond_factor_bps // 10_000
        if await rt.chain(c.registry.free_stake, rt.address) < need:
            await rt.chain(c.token.ensure_allowance, c.registry.address, need)
            await rt.chain(c.registry.stake, need)
        await rt.transact_ok(c.market.claim_job, jid, benign=CLAIM_BENIGN)
        job = await rt.chain(c.market.get_job, jid)
        if job.status != JobStatus.CLAIMED or job.solver.lower() != rt.address.lower():
            return None
        return job

    def _adopt(self, jid: JobId, job: Job, event: str, keep_every: int = 1) -> None:
        """Put a job the chain gives us on our books (kept if already there);
        ``keep_every``: the sparse trace's M for a job we claim now."""
        with self.state as st:
            if jid in st.candidates:
                st.candidates.remove(jid)
            st.considering.pop(jid, None)
            rec = st.jobs.get(jid)
            if rec is None or rec.round != job.round:
                st.jobs[jid] = SolverJob(round=job.round, spec=job.spec_hash.hex(),
                                         dataset=job.dataset_hash.hex(), keep_every=keep_every)
        self._settled.discard(jid)
        self._mark(f"j{jid}")  # claimed now: a snapshot from before shows it open
        log.info(event, job=jid, round=job.round, status=job.status.name.lower())

    # --- claiming ----------------------------------------------------------------------

    async def _fetch_probe_shards(self, spec_path: Path, ds_path: Path) -> None:
        """A sharded dataset: the shards the probe's steps read, beside the manifest."""
        from node.data.manifest import ShardManifest  # noqa: PLC0415
        from node.data.probe import PROBE_STEPS  # noqa: PLC0415
        from node.data.stream import is_manifest_file, shards_for_steps  # noqa: PLC0415
        from node.roles.jobfiles import load_job_data  # noqa: PLC0415
        from node.spec import parse_spec_json  # noqa: PLC0415

        if not await trio.to_thread.run_sync(is_manifest_file, ds_path):
            return
        spec = parse_spec_json(spec_path.read_bytes())
        manifest = await trio.to_thread.run_sync(load_job_data, ds_path, ds_path.name)
        if not isinstance(manifest, ShardManifest):
            return
        for i in shards_for_steps(manifest, spec.seed, spec.batch_size,
                                  range(1, min(PROBE_STEPS, spec.total_steps) + 1)):
            entry = manifest.shards[i]
            await self.rt.fetch(entry.hash, expected_size=entry.size)

    async def _consider(self, jid: JobId, job: Job) -> bool:
        """Claim ``jid`` if this solver can finish it in time. Nothing a submitter posts
        can stop the daemon here: its inputs are tried in a child process
        (node.data.probe), and any failure rejects the job for good (persisted)."""
        rt = self.rt
        with self.state as st:
            tries = st.considering[jid] = st.considering.get(jid, 0) + 1
        if tries > MAX_CONSIDER_TRIES:
            self._reject(jid, f"the solver stopped {tries - 1} times while considering it")
            return False
        try:
            with trio.fail_after(60):
                spec_path = await rt.fetch(job.spec_hash.hex())
                ds_path = await rt.fetch(job.dataset_hash.hex())
                await self._fetch_probe_shards(spec_path, ds_path)
        except (PeerUnavailable, trio.TooSlowError) as exc:  # maybe later: drop, no verdict
            log.warning("job_skipped", job=jid, reason=str(exc) or "inputs not reachable")
            self._drop(jid)
            return False
        except Exception as exc:  # noqa: BLE001 - whatever the inputs do, the daemon lives
            self._reject(jid, f"inputs unusable: {type(exc).__name__}: {exc}")
            return False
        if self.world_size > 1:
            need = await trio.to_thread.run_sync(self._world_need, spec_path, ds_path)
            if need > self.memory_mb:
                self._reject(jid, f"job needs ~{need} MB over {self.world_size} ranks "
                                  f"({self.dist_mode}); this solver's budget is "
                                  f"{self.memory_mb} MB")
                return False
        try:
            probe = await probe_job(
                spec_path, ds_path, job.spec_hash.hex(), job.dataset_hash.hex(),
                memory_mb=self.memory_mb, max_seconds=job.solve_duration / SAFETY_FACTOR,
                gflops=await self._machine_gflops(), threads=rt.settings.threads,
                timeout_s=self.probe_timeout_s)
        except Exception as exc:  # noqa: BLE001 - JobRejected, or anything else at all
            self._reject(jid, str(exc) if isinstance(exc, JobRejected)
                         else f"{type(exc).__name__}: {exc}")
            return False
        est = probe.seconds_estimate
        rt.metrics.steps_per_second.set(1 / probe.per_step_s if probe.per_step_s else 0)
        if est * SAFETY_FACTOR > job.solve_duration:
            self._reject(jid, f"too slow for us: ~{est:.0f} s x {SAFETY_FACTOR:g} exceeds the "
                         f"{job.solve_duration} s allowed", event="job_too_slow_for_us")
            return False
        claimed = await self._claim(jid, job)
        if claimed is None:
            self._drop(jid)
            return False
        job = claimed
        keep = await keep_every_for(rt, jid, job, probe.per_step_s)
        if self.world_size > 2:  # > 2 ranks sum in an order one process cannot replay
            keep = 1             # bitwise: keep every leaf, regenerate none
        self._adopt(jid, job, "job_claimed", keep_every=keep)
        log.info("job_claim_terms", job=jid, bond_pol=wei_to_pol(job.bond), deadline=job.deadline,
                 estimate_s=round(est, 1), memory_mb=probe.estimate_mb,
                 probe_rss_mb=probe.peak_rss_mb)
        await rt.refresh_stake_metrics()
        return True

    def _world_need(self, spec_path: Path, ds_path: Path) -> int:
        """MB all ranks of a distributed run of the job need together (budget.py)."""
        from node.spec import parse_spec_json  # noqa: PLC0415
        from node.train.budget import estimate_world  # noqa: PLC0415

        spec = parse_spec_json(spec_path.read_bytes())
        return estimate_world(spec, self.world_size, self.dist_mode,
                              ds_path.stat().st_size).total_mb

    def _drop(self, jid: JobId) -> None:
        """No longer a candidate (a later JobReopened may bring it back)."""
        with self.state as st:
            if jid in st.candidates:
                st.candidates.remove(jid)
            st.considering.pop(jid, None)

    def _reject(self, jid: JobId, reason: str, event: str = "job_rejected") -> None:
        """Never consider ``jid`` again, even after a restart or a JobReopened."""
        reason = reason[:REASON_CHARS]
        with self.state as st:
            if jid in st.candidates:
                st.candidates.remove(jid)
            st.considering.pop(jid, None)
            st.rejected[jid] = reason
            while len(st.rejected) > MAX_REJECTED:  # oldest first
                del st.rejected[next(iter(st.rejected))]
        log.warning(event, job=jid, reason=reason)

    async def _machine_gflops(self) -> float:
        if self._gflops is None:
            profile = await trio.to_thread.run_sync(measure_profile)
            self._gflops = float(profile.get("matmul_gflops", 0.0))
        return self._gflops

    # --- training and commit -------------------------------------------------------------

    def _trace_dir(self, jid: JobId) -> Path:
        rec = self.state.data.jobs[jid]
        return self.rt.dir / "jobs" / f"{jid}-r{rec.round}" / "trace"

    async def _context(self, jid: JobId) -> Any:

        if jid not in self._contexts and self.collab.enabled and \
                self.collab.is_sub_job(await self.rt.chain(self.rt.chain_client.market.get_job,
                                                           jid)):
            start = await self.collab.start_state_factory(jid)
            if start is None:
                raise PeerUnavailable(f"theta_t of sub-job {jid} cannot be recomputed yet")
            self._contexts[jid], self._initial[jid] = start
        if jid not in self._contexts:
            rec = self.state.data.jobs[jid]
            spec, dataset = await fetch_job_inputs(self.rt, bytes.fromhex(rec.spec),
                                                   bytes.fromhex(rec.dataset))
            # A distributed trace is regenerated here (dispute points, leaves not kept) by
            # one process: micro-batches like the ranks' split make 2 ranks bitwise equal.
            micro = self.world_size if self.world_size > 1 \
                and spec.batch_size % self.world_size == 0 else 1
            init = await fetch_init_weights(self.rt, spec)
            self._contexts[jid] = await job_context(self.rt, spec, dataset,
                                                    self.rt.settings.threads,
                                                    micro_batches=micro, init_weights=init)
        return self._contexts[jid]

    async def _train_and_commit(self, jid: JobId) -> None:
        from node.train.trace import run_training  # noqa: PLC0415

        key = str(jid)
        rt, c = self.rt, self.rt.chain_client
        try:
            ctx = await self._context(jid)
            out = self._trace_dir(jid)
            last_log = [0.0]

            def progress(p: Any) -> None:
                rt.metrics.steps.inc(ctx.spec.checkpoint_interval)
                if time.monotonic() - last_log[0] > 2 or p.step == p.total_steps:
                    last_log[0] = time.monotonic()
                    log.info("training", job=jid, step=p.step, of=p.total_steps,
                             loss=round(p.segment_loss, 4))

            keep = self.state.data.jobs[jid].keep_every
            t0 = time.monotonic()
            if self.world_size > 1 and jid not in self._initial:  # sub-jobs: one process
                from node.train.distributed import launch  # noqa: PLC0415

                rec = self.state.data.jobs[jid]
                spec_path, ds_path = await rt.fetch(rec.spec), await rt.fetch(rec.dataset)
                manifest = await trio.to_thread.run_sync(
                    lambda: launch(spec_path, ds_path, out, jid, self.world_size,
                                   threads=rt.settings.threads,
                                   mode=self.dist_mode,  # type: ignore[arg-type]
                                   keep_every=keep))
            else:
                manifest = await trio.to_thread.run_sync(
                    lambda: run_training(ctx, out, jid, self.behavior, progress,
                                         keep_every=keep, initial=self._initial.get(jid)))
            train_s = time.monotonic() - t0  # the run itself (bench/collab_pipeline.py)
            manifest_id = await self._publish_trace(jid, out)
            log.info("trace_published", job=jid, root=manifest.root, manifest=manifest_id,
                     train_s=round(train_s, 3))
            leaves, tree = build_trace_tree(jid, manifest.k,
                                            [bytes.fromhex(h) for h in manifest.state_hashes],
                                            manifest.losses_e9)
            if tree.root.hex() != manifest.root:
                raise PolnetError(f"trace manifest root {manifest.root} is not its leaves' root")
            # Benign: our commit already landed (a lost receipt, a restart after it mined).
            await rt.transact_ok(c.market.commit_trace, jid, leaves, tree,
                                 benign=COMMIT_BENIGN)
            dec = await self._derive(jid)  # what the chain now says, not what we sent
            log.info("result_committed" if dec.phase == SolverPhase.COMMITTED
                     else "commit_not_ours", job=jid, root=manifest.root, phase=dec.phase.value)
        except ContractRevert as exc:
            log.warning("commit_failed", job=jid, error=str(exc))
        except Exception as exc:  # the daemon outlives one job; the next tick retries it
            log.exception("training_failed", job=jid, error=repr(exc))
            await trio.sleep(5)
        finally:
            self._busy.discard(key)
            self._mark(f"j{jid}")

    async def _publish_trace(self, jid: JobId, out: Path) -> str:
        from node.train.trace import MANIFEST_NAME, kept_file, read_manifest  # noqa: PLC0415

        manifest = read_manifest(out)
        if not self.behavior.serves_data:  # a test cheat: announce nothing, serve nothing
            with self.state as st:
                st.jobs[jid].manifest = ""  # "published" for the machine, never announced
            return ""
        for entry in manifest.checkpoints:
            # A sharded run's kept leaf is converted to its single file here (once).
            path = await trio.to_thread.run_sync(kept_file, out, manifest,
                                                 entry.step // manifest.k)
            aid = await self.rt.p2p.publish_file(path)
            if aid != entry.sha256:
                raise PolnetError(f"checkpoint {entry.file} changed on disk since training")
        manifest_id = await self.rt.p2p.publish_file(out / MANIFEST_NAME)
        with self.state as st:
            rec = st.jobs[jid]
            rec.manifest, rec.root, rec.final = (manifest_id, manifest.root,
                                                 manifest.final_state_hash)
        return manifest_id

    async def _announcer(self) -> None:
        """Re-announce what we serve: gossip is best effort, so say it again."""
        while True:
            await guarded("announce", self._announce_once)
            await trio.sleep(ANNOUNCE_EVERY_S)

    async def _announce_once(self) -> None:
        live: set[int] = set()
        for jid, rec in list(self.state.data.jobs.items()):
            if rec.phase in (SolverPhase.TRAINING, SolverPhase.COMMITTING,
                             SolverPhase.COMMITTED) and rec.manifest and rec.root and rec.final:
                live.add(jid)
                await self.rt.p2p.announce("result_committed", ResultCommitted(
                    job_id=jid, trace_root="0x" + rec.root,
                    final_state_hash="0x" + rec.final, artifact_ids=[rec.manifest]))
        for s in list(self.state.data.served):
            if s.job_id in live:  # states of settled jobs need no more gossip
                await self.rt.p2p.announce("state_served", StateServed(**s.model_dump()))
        self.rt.metrics.bytes_served.set(self.rt.p2p.server.served_bytes)

    # --- disputes ---------------------------------------------------------------------

    async def _dispute_move(self, nursery: trio.Nursery, did: DisputeId,
                            snap: Snapshot | None = None) -> object:
        c = self.rt.chain_client
        d = snap.disputes.get(did) if snap is not None else None
        if d is None:  # not in the view yet, or asked for the chain as of now
            d = await self.rt.chain(c.dispute.get_dispute, did)
            snap = None
        block = 0
        if d.phase == Phase.DRAWING:
            block = snap.block if snap is not None else await self.rt.chain(c.block_number)
        view = SolverDisputeView(
            phase=d.phase, turn=d.turn, challenger_clock_left=d.challenger_clock_left,
            mid_steps=tuple(d.mid_steps), draw_block=d.draw_block, block=block,
            credits=await self.rt.credits_owed() if d.phase == Phase.RESOLVED else 0)
        act = decide_dispute(view, busy=f"d{did}" in self._busy)
        if isinstance(act, PostMids) and d.job_id not in self.state.data.jobs:
            # Disputes come first in a pass; a job the chain gives us but our books lost
            # is adopted later in the same pass, and its mids posted in the next one.
            log.info("dispute_waits_for_adoption", dispute=did, job=d.job_id)
            return Wait()
        if isinstance(act, Done):
            with self.state as st:
                st.disputes.remove(did)
            log.info("dispute_over", dispute=did, verdict=d.verdict.name)
        elif isinstance(act, DrawJury):
            await self.rt.transact_ok(c.dispute.draw_jury, did, benign=DRAW_BENIGN)
            self._mark(f"d{did}")
        elif isinstance(act, PostMids):
            self._busy.add(f"d{did}")
            nursery.start_soon(guarded, "_post_mids", self._post_mids, did, d.job_id,
                               list(act.steps))
        elif isinstance(act, Timeout):
            await self.rt.transact_ok(c.dispute.timeout, did, benign=TIMEOUT_BENIGN)
            self._mark(f"d{did}")
        return act

    async def serve_state(self, jid: JobId, step: int, tensors: Any) -> str:
        """Store a regenerated state as a checkpoint artifact and announce it."""
        from node.proof import state_hash  # noqa: PLC0415
        from node.train.trace import write_state_file  # noqa: PLC0415

        h = state_hash(tensors)
        path = self._trace_dir(jid).parent / "states" / f"step_{step:08d}.safetensors"
        await trio.to_thread.run_sync(write_state_file, path, tensors, jid, step)
        aid = await self.rt.p2p.publish_file(path)
        served = StateServed(job_id=jid, step=step, state_hash="0x" + h.hex(), artifact_id=aid)
        entry = ServedState(**served.model_dump())
        with self.state as st:
            if entry not in st.served:
                st.served.append(entry)
        await self.rt.p2p.announce("state_served", served)
        return "0x" + h.hex()

    async def _post_mids(self, did: DisputeId, jid: JobId, steps: list[int]) -> None:
        from node.proof import state_hash  # noqa: PLC0415
        from node.train.trace import regenerate_many  # noqa: PLC0415

        try:
            ctx = await self._context(jid)
            states = await trio.to_thread.run_sync(regenerate_many, ctx, self._trace_dir(jid),
                                                   steps, self.behavior.dispute_step,
                                                   self.behavior)
            # lo and hi are checkpoints or mids served before: jurors can fetch both.
            if self.behavior.serves_dispute_states:
                hashes = [bytes.fromhex((await self.serve_state(jid, t, states[t]))[2:])
                          for t in steps]
            else:  # a test cheat: claim the states, serve none of them
                hashes = [state_hash(states[t]) for t in steps]
            await self.rt.transact_ok(self.rt.chain_client.dispute.post_mids, did, hashes,
                                      benign=MOVE_BENIGN)
            log.info("mids_posted", dispute=did, job=jid, steps=steps)
        finally:
            self._busy.discard(f"d{did}")
