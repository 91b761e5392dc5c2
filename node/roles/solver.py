"""The solver daemon: claim jobs it can finish in time, train them with a trace,
serve the checkpoints, commit, answer bisection with bitwise-regenerated
states, finalize and withdraw.

Crash safety: what it works on lives in ``solver.json`` (updated by the event
handler before the event cursor moves), checkpoints are written atomically and
training resumes from the last one, and every pass of the loop reconciles with
the chain, so a SIGKILL at any point costs at most the work since the last
checkpoint.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import trio

from node.chain.contracts import JobStatus, Phase, Side
from node.chain.events import ChainEvent, EventWatcher
from node.chain.revert_names import errors
from node.errors import ContractRevert, JobRejected, PeerUnavailable, PolnetError
from node.logs import get_logger
from node.p2p.announce import ResultCommitted
from node.proof import build_trace_tree
from node.roles.announce_kinds import StateServed
from node.roles.jobfiles import fetch_job_inputs
from node.roles.leafserve import keep_every_for, serve_missing_leaves
from node.roles.runtime import SOLVER, Runtime, guarded, measure_profile
from node.roles.state import RoleState
from node.train.budget import machine_memory_mb
from node.train.probe import probe_job

log = get_logger("polnet.solver")

# Reverts that mean "already done, by us or someone else": checked against the ABIs.
CLAIM_BENIGN = errors("InvalidStatus")  # another solver claimed it first
COMMIT_BENIGN = errors("InvalidStatus")  # our commit already landed (a lost receipt, a restart)
FINALIZE_BENIGN = errors("InvalidStatus", "WindowNotOver", "DisputesOpen")
DRAW_BENIGN = errors("WrongPhase", "JuryNotReady")
TIMEOUT_BENIGN = errors("WrongPhase", "ClockNotExpired")
MOVE_BENIGN = errors("NotYourTurn", "WrongPhase")

ANNOUNCE_EVERY_S = 3.0
SAFETY_FACTOR = 2.0  # claim only if the estimated training time x this fits the deadline
PROBE_TIMEOUT_S = 120.0  # a job's trial (child start, build, a few steps) must end in this
MAX_CONSIDER_TRIES = 3   # considerations the daemon died in before a job is rejected
MAX_REJECTED = 10_000    # remembered rejections (each costs its submitter a posted job)
REASON_CHARS = 300


class Solver:
    """``memory_mb``: the most memory this solver gives one job (default: half of the
    machine's); a job whose estimate or probe needs more is rejected."""

    def __init__(self, rt: Runtime, behavior: str = "honest", max_jobs: int = 1,
                 memory_mb: int | None = None,
                 probe_timeout_s: float = PROBE_TIMEOUT_S) -> None:
        from node.behaviors import make_behavior  # noqa: PLC0415 - torch is heavy

        self.rt = rt
        self.behavior_name = behavior
        self.behavior = make_behavior(behavior)  # fails early on an unknown name
        self.max_jobs = max_jobs
        self.memory_mb = memory_mb or machine_memory_mb() // 2
        self.probe_timeout_s = probe_timeout_s
        # rejected: job id -> why, never considered again; considering: job id -> times
        # a consideration began and did not finish (the daemon died during it).
        self.state = RoleState(rt.dir / "solver.json",
                               {"jobs": {}, "candidates": [], "disputes": [], "served": [],
                                "rejected": {}, "considering": {}})
        self._busy: set[str] = set()  # task keys running now (not persisted)
        self._contexts: dict[int, Any] = {}
        self._gflops: float | None = None

    # --- events (worker thread; persisted before the cursor moves) ----------------------

    def _on_event(self, ev: ChainEvent) -> None:
        with self.state as st:
            if ev.event in ("JobPosted", "JobReopened"):
                jid = int(ev.args["jobId"])
                if jid not in st["candidates"] and str(jid) not in st["rejected"]:
                    st["candidates"].append(jid)
            elif ev.event == "DisputeOpened" and str(ev.args.get("solver", "")).lower() \
                    == self.rt.address.lower():
                did = int(ev.args["id"])
                if did not in st["disputes"]:
                    st["disputes"].append(did)

    # --- main loop --------------------------------------------------------------------

    async def run(self, until: float | None = None) -> None:
        rt = self.rt
        await rt.ensure_registered(SOLVER, rt.settings.stake)
        c = rt.chain_client
        assert c.deployment is not None
        watcher = EventWatcher(c.w3, [c.market, c.dispute], cursor_path=rt.dir / "solver.cursor",
                               start_block=c.deployment.deploy_block)
        log.info("solver_running", behavior=self.behavior_name, address=rt.address)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(self._announcer)
            while until is None or time.monotonic() < until:
                try:
                    await rt.chain(watcher.poll, self._on_event)
                    await self._tick(nursery)
                except PolnetError as exc:  # one bad pass must not kill the daemon
                    log.warning("solver_tick_failed", error=str(exc))
                await trio.sleep(rt.settings.poll_interval)
            nursery.cancel_scope.cancel()

    async def _tick(self, nursery: trio.Nursery) -> None:
        c = self.rt.chain_client
        jobs: dict[str, dict[str, Any]] = self.state.data["jobs"]
        for key, info in list(jobs.items()):
            jid = int(key)
            job = await self.rt.chain(c.market.get_job, jid)
            mine = job.solver.lower() == self.rt.address.lower() and job.round == info["round"]
            if info["phase"] in ("training", "committing") and key not in self._busy:
                if mine and job.status == JobStatus.CLAIMED:
                    self._busy.add(key)
                    nursery.start_soon(guarded, "_train_and_commit", self._train_and_commit, jid)
                elif mine and job.status in (JobStatus.COMMITTED, JobStatus.FINALIZED):
                    # Our commit landed but the daemon died (or lost the receipt) before
                    # writing the phase: the chain says committed, so it is.
                    self._set_phase(jid, "committed")
                else:
                    self._set_phase(jid, "lost")
            elif info["phase"] == "committed":
                if mine and job.status == JobStatus.COMMITTED:  # sparse: sampled leaves
                    await serve_missing_leaves(self, nursery, jid)
                if job.status == JobStatus.FINALIZED:
                    self._set_phase(jid, "paid")
                    await self.rt.withdraw_all()
                elif not mine or job.status != JobStatus.COMMITTED:
                    self._set_phase(jid, "lost")
                elif job.open_disputes == 0 and await self.rt.chain(c.timestamp) > job.window_end:
                    await self.rt.transact_ok(c.market.finalize, jid,
                                              benign=FINALIZE_BENIGN)
        # A committed job still needs us (disputes), so it counts until it is paid.
        active = sum(1 for i in jobs.values()
                     if i["phase"] in ("training", "committing", "committed"))
        for jid in list(self.state.data["candidates"]):
            if active >= self.max_jobs:
                break
            if jobs.get(str(jid), {}).get("phase") == "lost":
                with self.state as st:  # we failed it once; leave it to others
                    st["candidates"].remove(jid)
                continue
            if await self._consider(jid):
                active += 1
        for did in list(self.state.data["disputes"]):
            await self._dispute_move(nursery, did)

    def _set_phase(self, jid: int, phase: str) -> None:
        with self.state as st:
            st["jobs"][str(jid)]["phase"] = phase
        log.info("job_phase", job=jid, phase=phase)
        for name in ("training", "committing", "committed", "paid", "lost"):
            self.rt.metrics.jobs.labels(name).set(
                sum(1 for i in self.state.data["jobs"].values() if i["phase"] == name))

    # --- claiming ----------------------------------------------------------------------

    async def _consider(self, jid: int) -> bool:
        """Claim ``jid`` if this solver can finish it in time. Nothing a submitter posts
        can stop the daemon here: its inputs are tried in a child process
        (node.train.probe), and any failure rejects the job for good (persisted)."""
        rt, c = self.rt, self.rt.chain_client
        job = await rt.chain(c.market.get_job, jid)
        if job.status != JobStatus.OPEN:
            self._drop(jid)
            return False
        with self.state as st:
            tries = st["considering"][str(jid)] = st["considering"].get(str(jid), 0) + 1
        if tries > MAX_CONSIDER_TRIES:
            self._reject(jid, f"the solver stopped {tries - 1} times while considering it")
            return False
        try:
            with trio.fail_after(60):
                spec_path = await rt.fetch(job.spec_hash.hex())
                ds_path = await rt.fetch(job.dataset_hash.hex())
        except (PeerUnavailable, trio.TooSlowError) as exc:  # maybe later: drop, no verdict
            log.warning("job_skipped", job=jid, reason=str(exc) or "inputs not reachable")
            self._drop(jid)
            return False
        except Exception as exc:  # noqa: BLE001 - whatever the inputs do, the daemon lives
            self._reject(jid, f"inputs unusable: {type(exc).__name__}: {exc}")
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
        need = job.reward * (await rt.chain(c.market.market_params)).bond_factor_bps // 10_000
        if await rt.chain(c.registry.free_stake, rt.address) < need:
            await rt.chain(c.token.ensure_allowance, c.registry.address, need)
            await rt.chain(c.registry.stake, need)
        if not await rt.transact_ok(c.market.claim_job, jid, benign=CLAIM_BENIGN):
            self._drop(jid)
            return False
        job = await rt.chain(c.market.get_job, jid)
        keep = await keep_every_for(rt, job, probe.per_step_s)
        with self.state as st:
            st["candidates"].remove(jid)
            st["considering"].pop(str(jid), None)
            st["jobs"][str(jid)] = {"round": job.round, "phase": "training",
                                    "spec": job.spec_hash.hex(),
                                    "dataset": job.dataset_hash.hex(), "keep_every": keep}
        log.info("job_claimed", job=jid, bond=job.bond, deadline=job.deadline,
                 estimate_s=round(est, 1), memory_mb=probe.estimate_mb,
                 probe_rss_mb=probe.peak_rss_mb)
        await rt.refresh_stake_metrics()
        return True

    def _drop(self, jid: int) -> None:
        """No longer a candidate (a later JobReopened may bring it back)."""
        with self.state as st:
            if jid in st["candidates"]:
                st["candidates"].remove(jid)
            st["considering"].pop(str(jid), None)

    def _reject(self, jid: int, reason: str, event: str = "job_rejected") -> None:
        """Never consider ``jid`` again, even after a restart or a JobReopened."""
        reason = reason[:REASON_CHARS]
        with self.state as st:
            if jid in st["candidates"]:
                st["candidates"].remove(jid)
            st["considering"].pop(str(jid), None)
            st["rejected"][str(jid)] = reason
            while len(st["rejected"]) > MAX_REJECTED:  # oldest first
                del st["rejected"][next(iter(st["rejected"]))]
        log.warning(event, job=jid, reason=reason)

    async def _machine_gflops(self) -> float:
        if self._gflops is None:
            profile = await trio.to_thread.run_sync(measure_profile)
            self._gflops = float(profile.get("matmul_gflops", 0.0))
        return self._gflops

    # --- training and commit -------------------------------------------------------------

    def _trace_dir(self, jid: int) -> Path:
        info = self.state.data["jobs"][str(jid)]
        return self.rt.dir / "jobs" / f"{jid}-r{info['round']}" / "trace"

    async def _context(self, jid: int) -> Any:
        from node.train.step import TrainContext  # noqa: PLC0415

        if jid not in self._contexts:
            info = self.state.data["jobs"][str(jid)]
            spec, dataset = await fetch_job_inputs(self.rt, bytes.fromhex(info["spec"]),
                                                   bytes.fromhex(info["dataset"]))
            self._contexts[jid] = TrainContext.create(spec, dataset,
                                                      threads=self.rt.settings.threads)
        return self._contexts[jid]

    async def _train_and_commit(self, jid: int) -> None:
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

            manifest = await trio.to_thread.run_sync(
                lambda: run_training(ctx, out, jid, self.behavior, progress,
                                     keep_every=self.state.data["jobs"][key]
                                     .get("keep_every", 1)))
            self._set_phase(jid, "committing")
            manifest_id = await self._publish_trace(jid, out)
            log.info("trace_published", job=jid, root=manifest.root, manifest=manifest_id)
            leaves, tree = build_trace_tree(jid, manifest.k,
                                            [bytes.fromhex(h) for h in manifest.state_hashes],
                                            manifest.losses_e9)
            if tree.root.hex() != manifest.root:
                raise PolnetError(f"trace manifest root {manifest.root} is not its leaves' root")
            # Benign: our commit already landed (a lost receipt, a restart after it mined).
            await rt.transact_ok(c.market.commit_trace, jid, leaves, tree,
                                 benign=COMMIT_BENIGN)
            job = await rt.chain(c.market.get_job, jid)
            if job.status == JobStatus.COMMITTED and job.solver.lower() == rt.address.lower():
                self._set_phase(jid, "committed")
                log.info("result_committed", job=jid, root=manifest.root,
                         window_end=job.window_end)
            else:
                self._set_phase(jid, "lost")
        except ContractRevert as exc:
            log.warning("commit_failed", job=jid, error=str(exc))
        except Exception as exc:  # the daemon outlives one job; the next tick retries it
            log.exception("training_failed", job=jid, error=repr(exc))
            await trio.sleep(5)
        finally:
            self._busy.discard(key)

    async def _publish_trace(self, jid: int, out: Path) -> str:
        from node.train.trace import MANIFEST_NAME, read_manifest  # noqa: PLC0415

        manifest = read_manifest(out)
        for entry in manifest.checkpoints:
            aid = await self.rt.p2p.publish_file(out / entry.file)
            if aid != entry.sha256:
                raise PolnetError(f"checkpoint {entry.file} changed on disk since training")
        manifest_id = await self.rt.p2p.publish_file(out / MANIFEST_NAME)
        with self.state as st:
            st["jobs"][str(jid)]["manifest"] = manifest_id
            st["jobs"][str(jid)]["root"] = manifest.root
            st["jobs"][str(jid)]["final"] = manifest.final_state_hash
        return manifest_id

    async def _announcer(self) -> None:
        """Re-announce what we serve: gossip is best effort, so say it again."""
        while True:
            await guarded("announce", self._announce_once)
            await trio.sleep(ANNOUNCE_EVERY_S)

    async def _announce_once(self) -> None:
        for key, info in list(self.state.data["jobs"].items()):
            if info["phase"] in ("committing", "committed") and "manifest" in info:
                await self.rt.p2p.announce("result_committed", ResultCommitted(
                    job_id=int(key), trace_root="0x" + info["root"],
                    final_state_hash="0x" + info["final"],
                    artifact_ids=[info["manifest"]]))
        live = {int(k) for k, i in self.state.data["jobs"].items()
                if i["phase"] in ("committing", "committed")}
        for s in list(self.state.data["served"]):
            if s["job_id"] in live:  # states of settled jobs need no more gossip
                await self.rt.p2p.announce("state_served", StateServed(**s))
        self.rt.metrics.bytes_served.set(self.rt.p2p.server.served_bytes)

    # --- disputes ---------------------------------------------------------------------

    async def _dispute_move(self, nursery: trio.Nursery, did: int) -> None:
        c = self.rt.chain_client
        d = await self.rt.chain(c.dispute.get_dispute, did)
        if d.phase == Phase.RESOLVED:
            with self.state as st:
                st["disputes"].remove(did)
            log.info("dispute_over", dispute=did, verdict=d.verdict.name)
            await self.rt.withdraw_all()
            return
        if d.phase == Phase.DRAWING:
            # Anyone may draw; the seed is fixed, so whoever sends it gets the same jury.
            if await self.rt.chain(c.block_number) > d.draw_block:
                await self.rt.transact_ok(c.dispute.draw_jury, did,
                                          benign=DRAW_BENIGN)
            return
        key = f"d{did}"
        if d.phase == Phase.BISECTION and d.turn == Side.SOLVER and key not in self._busy:
            self._busy.add(key)
            nursery.start_soon(guarded, "_post_mids", self._post_mids, did, d.job_id,
                               d.mid_steps)
        elif d.phase == Phase.BISECTION and d.turn == Side.CHALLENGER \
                and d.challenger_clock_left == 0:
            await self.rt.transact_ok(c.dispute.timeout, did,
                                      benign=TIMEOUT_BENIGN)

    async def serve_state(self, jid: int, step: int, tensors: Any) -> str:
        """Store a regenerated state as a checkpoint artifact and announce it."""
        from node.proof import state_hash  # noqa: PLC0415
        from node.train.trace import write_state_file  # noqa: PLC0415

        h = state_hash(tensors)
        path = self._trace_dir(jid).parent / "states" / f"step_{step:08d}.safetensors"
        await trio.to_thread.run_sync(write_state_file, path, tensors, jid, step)
        aid = await self.rt.p2p.publish_file(path)
        served = StateServed(job_id=jid, step=step, state_hash="0x" + h.hex(), artifact_id=aid)
        entry = served.model_dump()
        with self.state as st:
            if entry not in st["served"]:
                st["served"].append(entry)
        await self.rt.p2p.announce("state_served", served)
        return "0x" + h.hex()

    async def _post_mids(self, did: int, jid: int, steps: list[int]) -> None:
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
