"""Following collaborative (DiLoCo) jobs on chain: the outer-state chain every party
recomputes, and the permissionless moves that keep a job going (issue 13).

On chain (contracts/src/CollabMarket.sol) every (round, slot) inner run is a JobMarket
sub-job reserved for the slot's worker, so training, committing, sampling, attesting,
challenging and the bisection game are the solver's and verifier's ordinary work on
it. This module adds what is particular to a collaborative job, for the solver and
the verifier daemons alike:

- **theta_t, recomputed.** Round 0 starts from the spec's seeded weights, or from a
  warm-started job's ``init_weights`` file, fetched from the submitter with the spec
  and dataset (checked against the job's ``outerInitHash``); round ``r + 1`` from
  round ``r``'s outer step over the deltas of its *accepted* sub-jobs, each delta
  taken from that sub-job's committed final leaf (fetched over libp2p and checked
  against the chain like any checkpoint: node.train.rounds.delta_from_final). A
  worker never sends a delta of its own: a delta that does not match its trace
  cannot exist. Outer states are cached on disk; a node that joins late (or
  restarts) catches up the same way.
- **Moves anyone may make**, each benign when someone else made it first:
  ``startRound`` once the previous outer state is accepted, ``settleRound`` once
  the round's sub-jobs are final or late, ``postOuter`` (our recomputed hash) when
  nothing is posted, ``challengeOuter`` when what is posted is not what we recompute,
  ``acceptOuter`` after the window, ``OuterJury.draw`` / ``resolveOuter`` for
  challenges, and jury duty on the OuterJury (commit, then reveal, "valid" iff the
  posted hash is our recomputation; a silent or minority juror loses stake).
- **Slots** (solvers only): claim ``want_slots`` free slots with the throughput the
  probe measured for the job's inner run; one while the node has no delivered record
  (the market's rule: a node never accepted, or that missed since, holds one per job).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import secrets
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import trio

from node.chain.ids import CaseId, CollabId, JobId
from node.errors import (
    CheckpointError,
    ContractRevert,
    IntegrityError,
    PeerUnavailable,
    PolnetError,
    SpecError,
)
from node.fsutil import atomic_write
from node.logs import get_logger
from node.roles.bans import BanList
from node.roles.juror_machine import (
    CommitVote,
    JurorView,
    ResendVote,
    Resolve,
    RevealVote,
    clocked_stage,
    decide_juror,
)
from node.roles.runtime import Runtime
from node.spec import MAX_SPEC_BYTES, CollaborativeSpec, parse_collaborative_spec_json

if TYPE_CHECKING:
    from node.chain.contracts import (
        CollabJob,
        CollabParamsView,
        CollabRound,
        Job,
        JuryCase,
        OuterJuryParamsView,
    )
    from node.chain.view import Snapshot
    from node.datasets import Dataset
    from node.train.diloco import OuterState
    from node.train.trace import TraceManifest
    from verifier.replay import CommittedState


class SubJobEvidence(Protocol):
    """A sub-job's checked trace (node.roles.verifier_evidence.JobEvidence)."""

    manifest: TraceManifest

    async def committed(self, index: int) -> CommittedState: ...


class Evidence(Protocol):
    """Where the follower gets a sub-job's evidence (node.roles.verifier_evidence.Evidence, which
    holds a follower: a protocol, so neither module imports the other)."""

    async def for_job(self, job_id: JobId, job: Job | None = None) -> SubJobEvidence | None: ...

log = get_logger("polnet.collab")

# CollabStatus / RoundPhase / ChallengePhase of ICollabMarket; Phase of IOuterJury.
OPEN, RUNNING, FINISHED, FAILED = 1, 2, 3, 4
IDLE, ROUND_RUNNING, OUTER = 0, 1, 2
NO_CHALLENGE = 0
JURY_DRAWING = 1

ZERO_ADDRESS = "0x" + "0" * 40  # an unset address in a chain view
ANNOUNCE_EVERY_S = 5.0
# An announced theta_r is fetched in the background (never inline in a tick), all its
# senders together within this budget per (job, round), each within its own share.
OUTER_FETCH_BUDGET_S = 90.0
OUTER_FETCH_PER_SENDER_S = 30.0
# A job whose inputs could not be fetched is left out of the tick this long (after the
# 1st, 2nd, ... failure): a job posted with inputs nobody serves must not cost every
# pass its fetch timeout.
INPUTS_RETRY_S = (10.0, 30.0, 60.0, 120.0)
JOIN_GRACE_S = 40.0  # round 0 waits this long for its slots to fill (see _join_window_over)
CHECKED_TTL_S = 2.0  # a round view read for theta's inputs serves one pass, at most this
# The tick's chain work runs when the snapshot has a new block, or local work finished
# (a state recomputed or fetched, a claim done); else at most this often: a time-only
# condition (round 0's join grace, an inputs retry, a sub-job's evidence fetched) must
# not wait for a block, which an automining devnet makes only on transactions.
IDLE_PASS_S = 3.0

# Benign reverts (someone else moved first); transact_ok checks each name against the
# ABIs when it is used, so a deployment without a CollabMarket never needs them.
START_BENIGN = ("WrongRoundPhase", "CollabNotLive", "TooFewWorkers")
# A pipelined start (issue 35): the pipeline filled, the pool waits for orphans, or another
# node's roll-back cleared the post we read.
PIPE_START_BENIGN = (*START_BENIGN, "PipelineFull", "PipelineUnfunded", "NothingPosted")
ORPHAN_BENIGN = ("NotOrphan", "RoundNotSettled")
# ChallengeLive: pipelined, a challenged candidate holds its round's settlement.
SETTLE_BENIGN = ("WrongRoundPhase", "CollabNotLive", "RoundNotSettled", "NoEvidence",
                 "ChallengeLive")
POST_BENIGN = ("WrongRoundPhase", "CollabNotLive", "WrongRound", "AlreadyPosted",
               "SubJobNotCommitted")
CHALLENGE_BENIGN = ("WrongRoundPhase", "WrongRound", "OuterWindowClosed", "ChallengeLive",
                    "NothingPosted", "AlreadyChallenged", "PosterCannotChallenge")
ACCEPT_BENIGN = ("WrongRoundPhase", "WrongRound", "OuterWindowOpen", "ChallengeLive",
                 "NothingPosted")
# NothingPosted: another node resolved the challenge first and an Invalid verdict cleared
# the post (its view was read before that block).
# WrongPhase: the OuterJury case moved on (drawn, or tallied by another node's resolve).
JURY_BENIGN = ("WrongRoundPhase", "WrongRound", "NoChallenge", "JuryNotReady", "RevealNotOver",
               "NothingPosted", "WrongPhase")
VOTE_BENIGN = ("WrongPhase", "NotJuror", "AlreadyCommitted", "AlreadyRevealed", "CommitClosed",
               "RevealNotOpen", "BadReveal", "NoCommitment")
SLOT_BENIGN = ("NotEnoughFreeSlots", "SlotCapExceeded", "CollabNotLive", "ThroughputTooLow",
               "ExcludedWorker")


@dataclass
class _Vote:
    valid: bool
    salt: bytes
    committed: bool = False  # the commit transaction came back (landed, or had before)
    revealed: bool = False  # likewise the reveal: until then it is sent again


def load_votes(path: Path) -> dict[CaseId, _Vote]:
    """The outer-jury votes saved by :func:`save_votes` ({} if none, or unreadable)."""
    try:
        raw = json.loads(path.read_text())
        return {CaseId(int(k)): _Vote(bool(v["valid"]), bytes.fromhex(str(v["salt"])),
                              bool(v.get("committed", False)), bool(v.get("revealed", False)))
                for k, v in raw.items()}
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        log.warning("outer_votes_unreadable", path=str(path), error=repr(exc))
        return {}


def save_votes(path: Path, votes: dict[CaseId, _Vote]) -> None:
    """Atomically, owner-only: each salt is on disk before its commitment is sent, so a
    juror restarted between commit and reveal still reveals (a silent juror is slashed)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, json.dumps({
        str(k): {"valid": v.valid, "salt": v.salt.hex(), "committed": v.committed,
                 "revealed": v.revealed} for k, v in votes.items()}).encode(), private=True)


class CollabFollower:
    """One per daemon. ``evidence`` fetches sub-jobs' committed states (verifier's
    Evidence: manifests and checkpoints checked against the chain); ``want_slots``:
    slots a solver claims per collaborative job (0: follow and vote only)."""

    def __init__(self, rt: Runtime, evidence: Evidence, want_slots: int = 0,
                 forge_outer: bool = False) -> None:
        self.rt = rt
        self.evidence = evidence
        self.want_slots = want_slots
        # A test cheat (behaviour wrong_outer): post one forged outer state per job.
        self.forge_outer = forge_outer
        self._forged: set[CollabId] = set()
        self.dir = rt.dir / "collab"
        self._specs: dict[CollabId, tuple[CollaborativeSpec, Dataset]] = {}
        self._init_states: dict[CollabId, OuterState] = {}  # warm-started jobs' theta_0, m_0
        self._outer: dict[tuple[CollabId, int], OuterState] = {}
        self._outer_hashes: dict[tuple[CollabId, int], bytes] = {}  # of _outer, taken once
        # theta_r's inputs: round r - 1's sub-job per slot whose delta it holds (0: none).
        # Market ids are never reused, so equal inputs mean the same theta_r: a roll-back,
        # a retry or a dropped delta changes them and the stale state is forgotten.
        self._inputs: dict[tuple[CollabId, int], list[JobId]] = {}
        self._final: set[tuple[CollabId, int]] = set()  # theta_r whose round r - 1 is accepted
        # round views read this pass (a tick clears them; a follower that never ticks,
        # the submitter's, reads again after CHECKED_TTL_S)
        self._checked: dict[tuple[CollabId, int], tuple[float, list[JobId] | None]] = {}
        self._depth: dict[CollabId, int] = {}  # pipeline depth D per job (immutable)
        self._subs_seen: dict[CollabId, set[JobId]] = {}  # per job: sub-jobs of started rounds
        self._subs_done: set[JobId] = set()  # of those, finalized or cancelled in the market
        self._votes_path = self.dir / "outer-votes.json"
        self._votes: dict[CaseId, _Vote] = load_votes(self._votes_path)  # by OuterJury case id
        self._bad: set[CollabId] = set()  # jobs whose spec or round 0 is unusable: ignored
        self._over: set[CollabId] = set()  # finished or failed jobs: never read again
        self._claimed_rate: dict[CollabId, int] = {}
        self._round_zero_ok: set[CollabId] = set()  # round-0 commitments checked
        self._first_seen: dict[CollabId, float] = {}
        self._published: dict[tuple[CollabId, int], str] = {}
        # Announcers that served an unusable theta_r: on disk, by peer id and account.
        self.bad_announcers = BanList(self.dir / "bad-announcers.json")
        self.fetch_budget_s = OUTER_FETCH_BUDGET_S
        self.fetch_per_sender_s = OUTER_FETCH_PER_SENDER_S
        self._fetching: set[tuple[CollabId, int]] = set()  # background fetches running
        self._fetch_spent: dict[tuple[CollabId, int], float] = {}  # seconds, per (job, round)
        self._fetched: dict[tuple[CollabId, int], OuterState] = {}  # checked, not yet taken
        self._claiming: int | None = None  # the job whose slot claim runs in the background
        self._last_claim = 0  # the job whose claim ran last: the next one takes its turn
        self._inputs_retry: dict[CollabId, tuple[int, float]] = {}  # job -> (failures, retry at)
        self._announced_at = 0.0
        self._collab_params: CollabParamsView | None = None  # immutable: read once
        self._outer_jury_params: OuterJuryParamsView | None = None
        # The chain as of the last pass (node/chain/view.py): what it holds is read from
        # it, not one call each; None (no pass yet: tests, the submitter) reads directly.
        self._snap: Snapshot | None = None
        self._snap_started = -math.inf  # trio time its view update began
        self._seen: tuple[int, int] | None = None  # (epoch, block) of the last chain pass
        self._ran_at = -math.inf
        self._wake = False  # local work finished: the next tick runs a chain pass
        # (move, job, round or id) -> trio time it was sent: a snapshot read before that
        # shows the move undone, so it is not sent again on it
        self._moved: dict[tuple[str, int, int], float] = {}

    # --- chain views ----------------------------------------------------------------

    async def _collab(self, cid: CollabId) -> CollabJob:
        s = self._snap
        if s is not None and cid in s.collabs:
            return s.collabs[cid]
        return await self.rt.chain(self.rt.chain_client.collab.get_collab, cid)

    async def _round(self, cid: CollabId, r: int) -> CollabRound:
        got = self._snap.round(cid, r) if self._snap is not None else None
        if got is not None:
            return got
        return await self.rt.chain(self.rt.chain_client.collab.get_round, cid, r)

    async def _market_job(self, jid: JobId) -> Job:
        s = self._snap
        if s is not None and jid in s.jobs:
            return s.jobs[jid]
        return await self.rt.chain(self.rt.chain_client.market.get_job, jid)

    async def _case(self, case_id: CaseId) -> JuryCase:
        s = self._snap
        if s is not None and case_id in s.cases:
            return s.cases[case_id]
        return await self.rt.chain(self.rt.chain_client.outer_jury.get_case, case_id)

    async def _holders(self, cid: CollabId) -> list[str]:
        s = self._snap
        if s is not None and cid in s.holders:
            return list(s.holders[cid])
        return [str(h) for h in
                await self.rt.chain(self.rt.chain_client.collab.slot_holders, cid)]

    async def _orphans(self, cid: CollabId) -> int:
        s = self._snap
        if s is not None and cid in s.orphans:
            return s.orphans[cid]
        return int(await self.rt.chain(self.rt.chain_client.collab.orphans_of, cid))

    async def _now(self) -> int:
        """The chain's clock as of the snapshot: a move it allows is allowed in any later
        block (one it forbids may revert: benign)."""
        if self._snap is not None:
            return self._snap.timestamp
        return int(await self.rt.chain(self.rt.chain_client.timestamp))

    async def _block(self) -> int:
        if self._snap is not None:
            return self._snap.block
        return int(await self.rt.chain(self.rt.chain_client.block_number))

    async def _move(self, key: tuple[str, int, int], fn: Any, *args: Any,
                    benign: tuple[str, ...]) -> bool:
        """``transact_ok(fn, *args)`` unless this move was sent since the snapshot was read
        (it would show the move undone: a duplicate only reverts, but costs a call)."""
        if self._moved.get(key, -math.inf) >= self._snap_started:
            return False
        try:
            return await self.rt.transact_ok(fn, *args, benign=benign)
        finally:
            self._moved[key] = trio.current_time()

    @property
    def enabled(self) -> bool:
        c = self.rt.chain_client
        return c.deployment is not None and "CollabMarket" in c.deployment.contracts

    def is_sub_job(self, market_job: Any) -> bool:
        """Is this market job (a Job view) one of the CollabMarket's sub-jobs?"""
        if not self.enabled:
            return False
        return str(market_job.submitter).lower() == self.rt.chain_client.collab.address.lower()

    async def inputs(self, cid: CollabId) -> tuple[CollaborativeSpec, Dataset]:
        """The job's collaborative spec and dataset, fetched over libp2p by their
        on-chain hashes (the store checks the bytes; the spec must be canonical)."""
        if cid not in self._specs:
            try:
                self._specs[cid] = await self._fetch_inputs(cid)
            except PeerUnavailable:
                n = self._inputs_retry.get(cid, (0, 0.0))[0] + 1
                wait = INPUTS_RETRY_S[min(n, len(INPUTS_RETRY_S)) - 1]
                self._inputs_retry[cid] = (n, time.monotonic() + wait)
                log.info("collab_inputs_unreachable", job=cid, failures=n, retry_in_s=wait)
                raise
            self._inputs_retry.pop(cid, None)
        return self._specs[cid]

    async def _fetch_inputs(self, cid: CollabId) -> tuple[CollaborativeSpec, Dataset]:
        """``inputs`` itself: PeerUnavailable while the submitter does not serve them."""
        from node.datasets import load_dataset  # noqa: PLC0415 - torch is heavy

        job = await self._collab(cid)
        path = await self.rt.fetch(job.spec_hash.hex(), (job.submitter,),
                                   expected_size=MAX_SPEC_BYTES)
        spec = parse_collaborative_spec_json(path.read_bytes())
        if spec.spec_hash() != job.spec_hash:
            raise SpecError("the served collaborative spec is not in canonical form",
                            field="spec")
        ds_path = await self.rt.fetch(job.dataset_hash.hex(), (job.submitter,))
        ds = await trio.to_thread.run_sync(load_dataset, ds_path, job.dataset_hash.hex())
        if spec.init_weights is not None:
            # theta_0's file is an input like the others: no probe, so no slot claim,
            # before we hold it (a submitter withholding it reaps no slot bonds).
            self._init_states[cid] = await self._fetch_init_weights(cid, spec,
                                                                    job.submitter)
        return spec, ds

    async def _fetch_init_weights(self, cid: CollabId, spec: CollaborativeSpec,
                                  submitter: str) -> OuterState:
        """A warm-started job's round-0 outer state from the theta_0 file its submitter
        serves, read once and checked whole; a file that is not the spec's model makes
        the job unusable (SpecError)."""
        from node.train import diloco  # noqa: PLC0415
        from node.train.init_weights import max_file_bytes  # noqa: PLC0415

        assert spec.init_weights is not None
        path = await self.rt.fetch(spec.init_weights, (submitter,), timeout=30,
                                   expected_size=max_file_bytes(spec.inner.model))
        try:
            return await trio.to_thread.run_sync(diloco.initial_outer_state, spec, path)
        except (IntegrityError, CheckpointError) as exc:
            raise SpecError(f"collaborative job {cid}: its init weights are unusable: {exc}",
                            field="init_weights") from exc

    async def round_context(self, cid: CollabId, round_index: int, slot: int) -> Any:
        spec, ds = await self.inputs(cid)
        # Building a model (and a first torch import) takes seconds on a busy machine:
        # never on the event loop, whose transfer deadlines would blame the peers.
        return await trio.to_thread.run_sync(_round_context, spec, ds, round_index, slot,
                                             self.rt.settings.threads)

    # --- the outer-state chain --------------------------------------------------------

    def _path(self, cid: CollabId, r: int) -> Path:
        return self.dir / str(cid) / f"outer-{r:06d}.safetensors"

    async def outer_state(self, cid: CollabId, r: int) -> OuterState | None:
        """theta_r (and the outer momentum): round r's start. None while round r - 1 has
        not settled (pipelined, D > 0: not every delta is committed yet) or its final
        states cannot be fetched yet. A cached theta_r whose inputs the chain no longer
        shows (a roll-back, a dropped delta, a retry) is forgotten with every later one."""
        from node.train import diloco  # noqa: PLC0415

        key = (cid, r)
        want: list[JobId] | None = None
        final = r == 0 or (key in self._final and key in self._outer)
        if not final:
            got = await self._round_inputs(cid, r - 1)
            if got is None:
                if key in self._outer or self._path(cid, r).is_file():
                    self._forget(cid, r, "inputs_gone")
                return None
            want, final = got
            if key in self._outer and self._inputs.get(key) != want:
                self._forget(cid, r, "inputs_changed")
        if key in self._outer:
            return self._outer[key]
        spec, _ = await self.inputs(cid)
        state = await trio.to_thread.run_sync(self._load_cached, cid, r, spec, want, final)
        if state is None and r > 0 and final:
            # an announced state is used only once round r - 1 is accepted (it was checked
            # against the accepted hash): the inputs are then final.
            state = self._fetched.pop(key, None)
            if state is None:
                self._start_fetch(cid, r)  # in the background; recomputing meanwhile
        if state is None:
            if r == 0:
                job = await self._collab(cid)
                state = self._init_states.get(cid)
                if state is None:  # seeded: a function of the spec alone
                    state = await trio.to_thread.run_sync(diloco.initial_outer_state, spec)
                # Before round 0's outer state is accepted the job's outerHash is its
                # outerInitHash; later rounds are checked by their accepted hashes.
                if job.round == 0 and await _outer_hash(state) != job.outer_hash:
                    raise SpecError(f"collaborative job {cid}: outerInitHash is not the spec's "
                                    "theta_0", field="outer_init_hash")
            else:
                assert want is not None
                state = await self._recompute(cid, r, spec, want)
                if state is None:
                    return None
            await trio.to_thread.run_sync(self._save, cid, r, state, want)
        self._outer[key] = state
        self._wake = True  # a new state: the moves it allows need no new block
        if want is not None:
            self._inputs[key] = want
        if final:
            self._final.add(key)
        self._fetched.pop(key, None)  # a fetch that finished after we recomputed
        return state

    async def _job_depth(self, cid: CollabId) -> int:
        """The job's pipeline depth D (immutable: read once)."""
        if cid not in self._depth:
            self._depth[cid] = (await self._collab(cid)).pipeline_depth
        return self._depth[cid]

    async def _round_inputs(self, cid: CollabId, q: int) -> tuple[list[JobId], bool] | None:
        """(round q's sub-job per slot whose delta makes theta_{q+1}, 0 where none; whether
        round q is accepted, so final): its accepted sub-jobs once settled; pipelined
        (D > 0), before that every posted sub-job once all are committed (the candidate's
        inputs). None while neither. Read once per tick."""
        from node.chain.contracts import JobStatus  # noqa: PLC0415

        key = (cid, q)
        if key in self._checked and time.monotonic() - self._checked[key][0] < CHECKED_TTL_S:
            got = self._checked[key][1]
            return None if got is None else (got, False)
        out: list[JobId] | None = None
        for _ in range(2):  # read again once: a settlement may land between direct reads
            rnd = await self._round(cid, q)
            self._note_subs(cid, rnd.sub_jobs)
            if rnd.settled:
                out = [s if rnd.accepted_mask >> i & 1 else JobId(0)
                       for i, s in enumerate(rnd.sub_jobs)]
                if rnd.accepted:
                    return out, True
                break
            if not any(rnd.sub_jobs) or await self._job_depth(cid) == 0:
                break
            statuses = [(await self._market_job(s)).status for s in rnd.sub_jobs if s]
            if all(st == JobStatus.COMMITTED for st in statuses):
                out = list(rnd.sub_jobs)
                break
            if not any(st in (JobStatus.FINALIZED, JobStatus.CANCELLED) for st in statuses):
                break  # deltas still missing (only a settlement finalizes a sub-job)
        self._checked[key] = (time.monotonic(), out)
        return None if out is None else (out, False)

    def _forget(self, cid: CollabId, r: int, why: str) -> None:
        """Drop theta_r and every later state of the job, in memory and on disk: each
        descends from one the chain no longer shows."""
        dropped = sorted(k[1] for k in self._outer if k[0] == cid and k[1] >= r)
        for key in [k for k in self._outer if k[0] == cid and k[1] >= r]:
            self._outer.pop(key, None)
        for d in (self._outer_hashes, self._inputs, self._published, self._fetched):
            for key in [k for k in d if k[0] == cid and k[1] >= r]:
                d.pop(key, None)
        self._final = {k for k in self._final if not (k[0] == cid and k[1] >= r)}
        folder = self.dir / str(cid)
        if folder.is_dir():
            for f in folder.glob("outer-*"):
                try:
                    if int(f.name[6:12]) >= r:
                        f.unlink(missing_ok=True)
                except ValueError:
                    continue
        log.info("collab_outer_forgotten", job=cid, from_round=r, rounds=dropped, reason=why)

    def _prune(self, cid: CollabId, keep_from: int) -> None:
        """A pipelined job's states below round ``keep_from`` (the base: final, and never
        read again by this follower), in memory and on disk."""
        for key in [k for k in self._outer if k[0] == cid and k[1] < keep_from]:
            self._outer.pop(key, None)
            self._outer_hashes.pop(key, None)
            self._inputs.pop(key, None)
            self._published.pop(key, None)
            self._final.discard(key)
        folder = self.dir / str(cid)
        if not folder.is_dir():
            return
        for f in folder.glob("outer-*"):
            try:
                if int(f.name[6:12]) < keep_from:
                    f.unlink(missing_ok=True)
            except ValueError:
                continue

    def _note_subs(self, cid: CollabId, subs: list[JobId]) -> None:
        """Remember a started round's sub-jobs (on disk): after a roll-back the chain no
        longer lists them, and they are the orphans to settle."""
        seen = self._subs_seen.get(cid)
        if seen is None:
            seen = self._subs_seen[cid] = set(self._read_subs(cid))
        new = {s for s in subs if s} - seen
        if not new:
            return
        seen |= new
        path = self.dir / str(cid) / "sub-jobs.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps(sorted(seen)).encode())

    def _read_subs(self, cid: CollabId) -> list[JobId]:
        try:
            return [JobId(int(x)) for x in json.loads((self.dir / str(cid) / "sub-jobs.json")
                                               .read_text())]
        except FileNotFoundError:
            return []
        except (OSError, ValueError, TypeError) as exc:
            log.warning("collab_sub_jobs_unreadable", job=cid, error=repr(exc))
            return []

    async def _recompute(self, cid: CollabId, r: int, spec: CollaborativeSpec,
                         subs: list[JobId]) -> OuterState | None:
        """theta_r: the outer step from theta_{r-1} over the deltas of ``subs`` (round
        r - 1's sub-jobs, per slot; 0 where none)."""
        from node.train import diloco  # noqa: PLC0415
        from node.train.rounds import delta_from_final  # noqa: PLC0415

        prev = await self.outer_state(cid, r - 1)
        if prev is None:
            return None
        deltas = {}
        for slot, sub in enumerate(subs):
            if not sub:
                continue
            ev = await self.evidence.for_job(sub)
            if ev is None:
                log.info("collab_final_state_pending", job=cid, round=r - 1, sub_job=sub)
                return None
            final = await ev.committed(ev.manifest.segment_count)
            deltas[slot] = await trio.to_thread.run_sync(delta_from_final, prev.theta,
                                                         final.tensors)
        state = await trio.to_thread.run_sync(diloco.outer_step, prev, deltas,
                                              spec.outer_optimizer)
        log.info("collab_outer_recomputed", job=cid, round=r, slots=sorted(deltas),
                 outer_hash=(await _outer_hash(state)).hex())
        return state

    def _hints(self, cid: CollabId, r: int) -> list[tuple[str, str]]:
        """(sender, artifact) announced for theta_r, banned senders left out."""
        accounts = self.rt.peer_accounts
        return [(s, a) for s, a in self.rt.book.outer_hints(cid, r)
                if not self.bad_announcers.banned(s, accounts.get(s))]

    def _start_fetch(self, cid: CollabId, r: int) -> None:
        """Fetch an announced theta_r in the background (the next ``outer_state`` takes
        it), unless one runs, the (job, round)'s budget is spent or no sender is left."""
        key = (cid, r)
        if key in self._fetching or self._fetch_spent.get(key, 0.0) >= self.fetch_budget_s \
                or not self._hints(cid, r):
            return
        nursery = self.rt.p2p.nursery
        assert nursery is not None, "runtime not entered"
        self._fetching.add(key)
        nursery.start_soon(self._fetch_announced, cid, r)

    async def _fetch_announced(self, cid: CollabId, r: int) -> None:
        """theta_r from peers' ``outer_state`` announcements, kept only if its outer hash
        is the one the CollabMarket accepted for round r - 1 (a joiner or a restarted
        worker need not recompute every round since the first). A task of its own:
        nothing may escape it (it runs in the node's nursery)."""
        key = (cid, r)
        try:
            c = self.rt.chain_client
            rnd = await self.rt.chain(c.collab.get_round, cid, r - 1)
            if not rnd.accepted or key in self._outer:
                return
            spec, _ = await self.inputs(cid)
            for sender, aid in self._hints(cid, r):
                left = self.fetch_budget_s - self._fetch_spent.get(key, 0.0)
                if left <= 0:
                    log.info("collab_outer_fetch_budget_spent", job=cid, round=r)
                    return
                t0 = trio.current_time()
                try:
                    with trio.fail_after(min(left, self.fetch_per_sender_s)):
                        state = await self._fetch_one(aid, r, spec)
                    if await _outer_hash(state) != rnd.outer_hash:
                        raise IntegrityError(f"outer state {aid} is not the accepted theta_{r}")
                except (PolnetError, OSError, trio.TooSlowError) as exc:
                    # Charged to the sender, on disk: a sender that served nothing usable,
                    # slowly or wrongly, never costs this node a download again.
                    reason = f"{type(exc).__name__}: {exc}"
                    log.warning("collab_outer_announcement_bad", job=cid, round=r,
                                artifact=aid, sender=sender, error=reason[:300])
                    self.bad_announcers.ban(f"outer_state {cid}/{r}: {reason}", sender,
                                            self.rt.peer_accounts.get(sender))
                    continue
                finally:
                    self._fetch_spent[key] = self._fetch_spent.get(key, 0.0) \
                        + trio.current_time() - t0
                log.info("collab_outer_fetched", job=cid, round=r, artifact=aid)
                if key not in self._outer:  # not recomputed meanwhile
                    self._fetched[key] = state
                    self._wake = True
                return
        except Exception as exc:  # the next tick tries again or recomputes
            log.exception("collab_outer_fetch_failed", job=cid, round=r, error=repr(exc))
        finally:
            self._fetching.discard(key)

    async def _fetch_one(self, aid: str, r: int, spec: CollaborativeSpec) -> OuterState:
        from node.train.outer_file import max_file_bytes  # noqa: PLC0415

        path = await self.rt.fetch(aid, expected_size=max_file_bytes(spec),
                                   timeout=self.fetch_per_sender_s)
        state = await trio.to_thread.run_sync(load_outer_file, path, r, spec)
        if state is None:
            raise CheckpointError(f"outer state {aid} vanished from the store")
        return state

    async def announce(self) -> None:
        """Serve the newest accepted outer state of every live job we follow."""
        from node.roles.announce_kinds import OuterStateServed  # noqa: PLC0415

        latest: dict[CollabId, int] = {}
        for cid, r in self._outer:
            # Pipelined, a state ahead of the accepted ones may still be rolled back: a
            # joiner would find it not the accepted one and ban us. Only final ones.
            if self._depth.get(cid, 0) and (cid, r) not in self._final:
                continue
            latest[cid] = max(r, latest.get(cid, -1))
        for cid, r in latest.items():
            if r == 0:
                continue
            path = self._path(cid, r)
            if not path.is_file():
                continue
            aid = self._published.get((cid, r))
            if aid is None:
                aid = self._published[(cid, r)] = await self.rt.p2p.publish_file(path)
            h = await self._known_hash(cid, r)
            await self.rt.p2p.announce("outer_state", OuterStateServed(
                collab_job_id=cid, round=r, outer_hash="0x" + h.hex(), artifact_id=aid))

    def _inputs_path(self, cid: CollabId, r: int) -> Path:
        return self.dir / str(cid) / f"outer-{r:06d}.inputs.json"

    def _save(self, cid: CollabId, r: int, state: OuterState,
              inputs: list[JobId] | None) -> None:
        """theta_r and its inputs (round r - 1's sub-jobs it holds the deltas of), the
        inputs first: a state file is never read without the inputs it was made from."""
        from safetensors.torch import save  # noqa: PLC0415

        from node.train.diloco import outer_tensors  # noqa: PLC0415

        path = self._path(cid, r)
        path.parent.mkdir(parents=True, exist_ok=True)
        if inputs is not None:
            atomic_write(self._inputs_path(cid, r), json.dumps(inputs).encode())
        tensors = {k: v.contiguous() for k, v in outer_tensors(state).items()}
        atomic_write(path, save(tensors))

    def _load_cached(self, cid: CollabId, r: int, spec: CollaborativeSpec,
                     want: list[JobId] | None, final: bool) -> OuterState | None:
        """theta_r from disk, if made from ``want`` (round r - 1's sub-jobs; a file
        without recorded inputs counts only when they are final, as every state of a
        follower before issue 35 was)."""
        path = self._path(cid, r)
        if r > 0 and want is not None and path.is_file():
            try:
                have = json.loads(self._inputs_path(cid, r).read_text())
            except FileNotFoundError:
                have = want if final else None
            except (OSError, ValueError) as exc:
                log.warning("collab_outer_inputs_unreadable", path=str(path), error=str(exc))
                have = None
            if have != want:
                path.unlink(missing_ok=True)
                return None
        try:
            return load_outer_file(path, r, spec)
        except Exception as exc:  # noqa: BLE001 - a damaged cache is recomputed, not fatal
            log.warning("collab_outer_cache_unusable", path=str(path), error=str(exc))
            path.unlink(missing_ok=True)
            return None

    async def next_hashes(self, cid: CollabId, r: int) -> tuple[bytes, bytes] | None:
        """(outer hash of theta_{r+1}, S_0 hash of round r + 1's sub-jobs) as we
        recompute them."""
        from node.train.rounds import round_initial_hash  # noqa: PLC0415

        state = await self.outer_state(cid, r + 1)
        if state is None:
            return None
        # S_0 of round r + 1's sub-jobs; after the last round, of the round that would
        # follow (a state hash has no round in it, so round 0's context computes it).
        ctx = await self.round_context(cid, 0, 0)
        nxt = await trio.to_thread.run_sync(round_initial_hash, ctx, state.theta)
        return await self._known_hash(cid, r + 1), nxt

    async def _known_hash(self, cid: CollabId, r: int) -> bytes:
        """The hash of theta_r we hold (``outer_state`` put it there), hashed once: the
        announcer and each tick's outer-phase check both ask for it."""
        h = self._outer_hashes.get((cid, r))
        if h is None:
            h = self._outer_hashes[(cid, r)] = await _outer_hash(self._outer[(cid, r)])
        return h

    async def start_state_factory(self, market_job_id: JobId) -> Any:
        """For the solver: (context, S_0 builder) of one of its sub-jobs, or None when
        theta_t is not known yet."""
        from node.train.rounds import round_start_state  # noqa: PLC0415

        c = self.rt.chain_client
        ref = await self.rt.chain(c.collab.sub_job_of, market_job_id)
        cid, r, slot = ref.collab_job_id, ref.round, ref.slot
        state = await self.outer_state(cid, r)
        if state is None:
            return None
        ctx = await self.round_context(cid, r, slot)
        theta = state.theta
        if await self._job_depth(cid) > 0:
            # Pipelined, a round may start on a candidate we do not hold (one rolled back
            # since, or another's): train only from the S_0 the sub-job fixes.
            from node.train.rounds import round_initial_hash  # noqa: PLC0415

            mj = await self.rt.chain(c.market.get_job, market_job_id)
            if await trio.to_thread.run_sync(round_initial_hash, ctx, theta) \
                    != mj.init_state_hash:
                log.info("collab_sub_job_start_unknown", job=cid, round=r,
                         sub_job=market_job_id)
                return None
        return ctx, (lambda: round_start_state(ctx, theta))

    # --- one pass -----------------------------------------------------------------------

    async def tick(self, snap: Snapshot | None = None) -> None:
        """One pass over ``snap`` (the daemon's; None: the chain as of now). Its chain
        work runs only on a new block, after local work finished, or IDLE_PASS_S after
        the last: a tick between blocks reads nothing."""
        if not self.enabled:
            return
        if snap is None:
            snap = await self.rt.snapshot(fresh=True)
        if time.monotonic() - self._announced_at > ANNOUNCE_EVERY_S:
            self._announced_at = time.monotonic()
            try:
                await self.announce()
            except (PolnetError, OSError) as exc:
                log.warning("collab_announce_failed", error=str(exc))
        mark, t = (snap.epoch, snap.block), trio.current_time()
        if mark == self._seen and not self._wake and t - self._ran_at < IDLE_PASS_S:
            return
        self._seen, self._ran_at, self._wake = mark, t, False
        self._snap, self._snap_started = snap, self.rt.snapshot_started
        self._moved = {k: v for k, v in self._moved.items() if v >= self._snap_started}
        self._checked.clear()  # round views are read afresh each pass
        jobs: list[tuple[CollabId, Any]] = []
        now = time.monotonic()
        # every collaborative job's CollabPosted is in the view: its ids are 1..n
        for cid in map(CollabId, range(1, max(snap.collabs, default=0) + 1)):
            if cid in self._bad or cid in self._over \
                    or self._inputs_retry.get(cid, (0, 0.0))[1] > now:
                continue
            job = await self._contained(cid, self._live_job, cid)
            if job is not None:
                jobs.append((cid, job))
        # Slot claims start first, in the background (a probe takes up to minutes; a
        # restarted worker must re-claim within the outer window). Then outer moves
        # (post, challenge, jury votes and reveals, resolve): their windows run on the
        # chain's clock (issue 37). Then what may wait: round starts, settlements.
        self._start_claim(jobs)
        for cid, job in jobs:
            # Pipelined, the base round's candidate is posted (and challenged) while the
            # round still runs.
            if job.phase == OUTER or (job.pipeline_depth and job.phase == ROUND_RUNNING):
                await self._contained(cid, self._outer_moves, cid, job.round,
                                      job.pipeline_bond, job.phase == OUTER)
        for cid, job in jobs:
            if cid not in self._bad:
                await self._contained(cid, self._follow, cid, job)
            if cid not in self._bad and job.pipeline_depth:
                await self._pipeline(cid, job)

    def _start_claim(self, jobs: list[tuple[CollabId, Any]]) -> None:
        """Start one job's slot claim in the background unless one runs; the jobs take
        turns (the one after the last tried), so none waits behind another."""
        if not self.want_slots or self._claiming is not None:
            return
        open_ = [(cid, job) for cid, job in jobs if job.phase in (IDLE, OUTER)]
        if not open_:
            return
        cid, job = next(((c, j) for c, j in open_ if c > self._last_claim), open_[0])
        self._claiming = self._last_claim = cid
        nursery = self.rt.p2p.nursery
        assert nursery is not None, "runtime not entered"
        nursery.start_soon(self._claim_in_background, cid, job)

    async def _contained(self, cid: CollabId, fn: Any, *args: Any) -> Any:
        """``fn(*args)`` for job ``cid``; a failure is logged and stays that job's (a
        SpecError marks the job unusable). None on failure."""
        try:
            return await fn(*args)
        except (PolnetError, OSError) as exc:  # one job must not stall the others
            log.warning("collab_follow_failed", job=cid, error=str(exc))
            if isinstance(exc, SpecError):
                self._bad.add(cid)
        except Exception as exc:  # a bug or an input no check caught: logged whole,
            # and still one job's: the tick goes on to the others
            log.exception("collab_follow_crashed", job=cid, error=repr(exc))
        return None

    async def _live_job(self, cid: CollabId) -> Any:
        """The job's chain view, or None when there is nothing to do for it."""
        job = await self._collab(cid)
        if job.status in (FINISHED, FAILED):
            if job.pipeline_depth and await self._orphans(cid):
                # a roll-back's orphans outlive the job: settled still (their workers
                # are paid, the escrow goes back to the submitter)
                await self._settle_orphans(cid, job)
                return None
            self._over.add(cid)  # final: the tick reads it no more (a hot-path read saved)
            return None
        return None if job.status == 0 else job

    async def _follow(self, cid: CollabId, job: Any) -> None:
        """Round starts and settlements (the tick makes claims and outer moves first)."""
        c = self.rt.chain_client
        r = job.round
        if job.phase == IDLE:
            if r == 0 and job.retries == 0 and not await self._join_window_over(cid):
                return
            # pipelined, another node may have started the base meanwhile: then ours is
            # a start ahead, which may find nothing posted yet
            await self._move(("start", cid, r), c.collab.start_round, cid,
                             benign=PIPE_START_BENIGN if job.pipeline_depth else START_BENIGN)
            return
        if job.phase == ROUND_RUNNING:
            rnd = await self._round(cid, r)
            if await self._round_may_settle(rnd):
                await self._move(("settle", cid, r), c.collab.settle_round, cid,
                                 benign=SETTLE_BENIGN)

    async def _pipeline(self, cid: CollabId, job: Any) -> None:
        """A pipelined job's moves past the base round (issue 35), each contained on its
        own (one failing call is logged and retried next pass, never stops the others):
        post the speculative rounds' candidates, start the next round on the newest post
        we agree with, settle the orphans of rolled-back rounds, prune old states."""
        b = job.round
        for q in range(b + 1, b + job.ahead + 1):
            await self._contained(cid, self._post_candidate, cid, q, job.pipeline_bond)
        await self._contained(cid, self._start_ahead, cid, job)
        await self._contained(cid, self._settle_orphans, cid, job)
        self._prune(cid, b)

    async def _post_candidate(self, cid: CollabId, q: int, pipe: int) -> None:
        """Round q's candidate theta_{q+1} (over all its deltas, once all are committed),
        unless someone posted one. A speculative post is challengeable from its post, within
        its window: one we disagree with is challenged (and its jury served) at once, as a
        base round's is; it is accepted only once its round is the base."""
        c = self.rt.chain_client
        rnd = await self._round(cid, q)
        if str(rnd.poster).lower() != ZERO_ADDRESS:
            await self._outer_moves(cid, q, pipe, settled=False, rnd=rnd)
            return
        mine = await self.next_hashes(cid, q)
        if mine is None or self._moved.get(("post", cid, q), -math.inf) >= self._snap_started:
            return
        await self._bond(c.collab.address, pipe=pipe)
        if await self._move(("post", cid, q), c.collab.post_outer, cid, q, mine[0], mine[1],
                            benign=POST_BENIGN):
            log.info("collab_candidate_posted", job=cid, round=q, outer_hash=mine[0].hex())

    async def _start_ahead(self, cid: CollabId, job: Any) -> None:
        """Start round base + ahead + 1 while the base is still open, on round base +
        ahead's post, when the chain allows it (at most D ahead, not past the last round)
        and the post is the state we recompute (no run is wasted on a forged one)."""
        c = self.rt.chain_client
        q = job.round + job.ahead + 1
        if job.phase == IDLE or job.ahead >= job.pipeline_depth or q >= job.rounds:
            return
        prev = await self._round(cid, q - 1)
        if str(prev.poster).lower() == ZERO_ADDRESS:
            return
        mine = await self.next_hashes(cid, q - 1)
        if mine is None:
            return
        if mine != (prev.outer_hash, prev.next_init_hash):
            log.info("collab_pipeline_waits", job=cid, round=q, reason="post_disagrees")
            return
        if await self._move(("start", cid, q), c.collab.start_round, cid,
                            benign=PIPE_START_BENIGN):
            log.info("collab_round_started_ahead", job=cid, round=q, base=job.round)

    async def _settle_orphans(self, cid: CollabId, job: Any) -> None:
        """``settleOrphan`` each sub-job of a rolled-back round that is due (anyone may:
        its worker is paid, or its escrow comes back to the pool). Each call on its own:
        one failure is logged and retried next pass."""
        from node.chain.contracts import JobStatus  # noqa: PLC0415

        rt, c = self.rt, self.rt.chain_client
        live: set[JobId] = set()
        for q in range(job.round, min(job.round + job.ahead + 1, job.rounds)):
            subs = (await self._round(cid, q)).sub_jobs
            self._note_subs(cid, subs)
            live.update(subs)
        if not await self._orphans(cid):
            return
        if cid not in self._subs_seen:
            self._subs_seen[cid] = set(self._read_subs(cid))
        now = await self._now()
        for sub in sorted(self._subs_seen[cid] - live - self._subs_done):
            try:
                mj = await self._market_job(sub)
                if mj.status in (JobStatus.FINALIZED, JobStatus.CANCELLED):
                    self._subs_done.add(sub)
                    continue
                due = mj.status == JobStatus.OPEN \
                    or (mj.status == JobStatus.CLAIMED and now > mj.deadline) \
                    or (mj.status == JobStatus.COMMITTED and now >= mj.window_end
                        and mj.open_disputes == 0)
                if not due:
                    continue
                ref = await rt.chain(c.collab.sub_job_of, sub)
                if (await self._round(cid, ref.round)).sub_jobs[ref.slot] \
                        == sub and ref.round <= job.round + job.ahead:
                    continue  # still live (its round restarted since we read it)
                if await self._move(("orphan", cid, sub), c.collab.settle_orphan, sub,
                                    benign=ORPHAN_BENIGN):
                    log.info("collab_orphan_settled", job=cid, sub_job=sub, round=ref.round)
            except (PolnetError, OSError) as exc:
                log.warning("collab_orphan_settle_failed", job=cid, sub_job=sub, error=str(exc))

    async def _claim_in_background(self, cid: CollabId, job: Any) -> None:
        """Slot claims, one job at a time: a task of its own, nothing escapes it."""
        try:
            await self._contained(cid, self._maybe_claim_slots, cid, job)
        finally:
            self._claiming = None
            self._wake = True  # the next job's claim need not wait for a block

    async def _join_window_over(self, cid: CollabId) -> bool:
        """Round 0 waits for every slot to be taken, or JOIN_GRACE_S after we first saw
        the job (workers probe the job before claiming): the contract lets anyone start
        it with workers.min, which would leave late joiners idle for a whole round."""
        holders = await self._holders(cid)
        if all(int(str(h), 16) for h in holders):
            return True
        first = self._first_seen.setdefault(cid, time.monotonic())
        return time.monotonic() - first >= JOIN_GRACE_S

    async def _round_may_settle(self, rnd: Any) -> bool:
        """Past the deadline, or every sub-job final (saves failing calls)."""
        from node.chain.contracts import JobStatus  # noqa: PLC0415

        now = await self._now()
        if now >= rnd.deadline:
            return True
        for sub in rnd.sub_jobs:
            if sub == 0:
                continue
            job = await self._market_job(sub)
            if job.status == JobStatus.COMMITTED and now >= job.window_end \
                    and job.open_disputes == 0:
                continue
            if job.status not in (JobStatus.FINALIZED, JobStatus.CANCELLED):
                return False
        return True

    async def _outer_moves(self, cid: CollabId, r: int, pipe: int = 0, settled: bool = True,
                           rnd: Any = None) -> None:
        """``pipe``: the job's pipeline bond, on top of a post's outer bond (issue 35);
        ``settled``: the round is (a pipelined base round's candidate is posted and
        challenged before, accepted only after); ``rnd``: the round as this pass read it."""
        rt, c = self.rt, self.rt.chain_client
        mine = await self.next_hashes(cid, r)
        if mine is None:
            return
        if rnd is None:
            rnd = await self._round(cid, r)
        now = await self._now()
        if str(rnd.poster).lower() == ZERO_ADDRESS:
            if self._moved.get(("post", cid, r), -math.inf) >= self._snap_started:
                return  # posted since the snapshot was read (no bond to allow again)
            await self._bond(c.collab.address, pipe=pipe)
            if await self._move(("post", cid, r), c.collab.post_outer, cid, r, mine[0],
                                mine[1], benign=POST_BENIGN):
                log.info("collab_outer_posted", job=cid, round=r, outer_hash=mine[0].hex())
            return
        agrees = rnd.outer_hash == mine[0] and rnd.next_init_hash == mine[1]
        if rnd.challenge_phase == NO_CHALLENGE:
            if not agrees and now < rnd.window_end \
                    and str(rnd.poster).lower() != rt.address.lower():
                if self._moved.get(("challenge", cid, r), -math.inf) >= self._snap_started:
                    return
                await self._bond(c.collab.address)
                if await self._move(("challenge", cid, r), c.collab.challenge_outer, cid, r,
                                    benign=CHALLENGE_BENIGN):
                    log.warning("collab_outer_challenged", job=cid, round=r,
                                posted=rnd.outer_hash.hex(), recomputed=mine[0].hex())
            elif agrees and now >= rnd.window_end and settled:
                await self._move(("accept", cid, r), c.collab.accept_outer, cid, r,
                                 benign=ACCEPT_BENIGN)
            return
        # A live challenge: its jury is drawn and votes in the OuterJury contract.
        case = await self._case(rnd.jury_case)
        if case.phase == JURY_DRAWING:
            if await self._block() > case.request_block + \
                    (await self._jury_params()).jury_lookahead:
                await self._move(("draw", cid, rnd.jury_case), c.outer_jury.draw,
                                 rnd.jury_case, benign=JURY_BENIGN)
            return
        await self._jury_duty(cid, r, rnd.jury_case, case, agrees, now)

    async def forge_loop(self) -> None:
        """The wrong_outer cheat (a task of its own): watch live jobs every 0.2 s and
        post a forged outer state the moment a round's outer phase opens, before anyone
        can have recomputed it; once per job, retried in later rounds if beaten."""
        c = self.rt.chain_client
        while self.enabled:
            try:
                for cid in map(CollabId,
                               range(1, await self.rt.chain(c.collab.collab_count) + 1)):
                    if cid in self._forged:
                        continue
                    job = await self.rt.chain(c.collab.get_collab, cid)
                    if job.status != RUNNING:
                        continue
                    if job.pipeline_depth:
                        # pipelined: a speculative round's candidate, the newest first (the
                        # chain refuses it until the round's deltas are all committed)
                        for q in range(job.round + job.ahead, job.round, -1):
                            if await self._forge(cid, q, job.pipeline_bond):
                                break
                    elif job.phase == OUTER:
                        await self._forge(cid, job.round, job.pipeline_bond)
            except (PolnetError, OSError) as exc:
                log.warning("collab_forge_failed", error=str(exc))
            await trio.sleep(0.2)

    async def _forge(self, cid: CollabId, r: int, pipe: int) -> bool:
        rt, c = self.rt, self.rt.chain_client
        rnd = await rt.chain(c.collab.get_round, cid, r)
        if str(rnd.poster).lower() != ZERO_ADDRESS:
            return False
        fake = hashlib.sha256(b"forged outer state" + cid.to_bytes(32, "big")
                              + r.to_bytes(32, "big")).digest()
        await self._bond(c.collab.address, pipe=pipe)  # a forger posts the same bonds
        if await rt.transact_ok(c.collab.post_outer, cid, r, fake, fake, benign=POST_BENIGN):
            self._forged.add(cid)
            log.warning("collab_outer_forged", job=cid, round=r, outer_hash=fake.hex())
            return True
        return False

    async def _jury_duty(self, cid: CollabId, r: int, case_id: CaseId, case: JuryCase, agrees: bool,
                         now: int) -> None:
        """Vote on an outer jury we sit on (valid iff the post is our recomputation: a
        silent or minority juror loses stake), and resolve the case once reveals are over."""
        rt, c = self.rt, self.rt.chain_client
        vote = self._votes.get(case_id)
        seated = rt.address.lower() in (str(a).lower() for a in case.jury)
        act = decide_juror(JurorView(
            clocked_stage(now, case.commit_end, case.reveal_end), seated=seated,
            saved=vote is not None, committed=vote is not None and vote.committed,
            revealed=vote is not None and vote.revealed))
        if isinstance(act, CommitVote | ResendVote):
            if vote is None:  # the salt on disk before the commitment leaves
                vote = self._votes[case_id] = _Vote(agrees, secrets.token_bytes(32))
                save_votes(self._votes_path, self._votes)
            # a saved vote whose commit did not come back: the same salt again
            await rt.transact_ok(c.outer_jury.commit_vote, case_id, vote.valid, vote.salt,
                                 benign=VOTE_BENIGN)
            vote.committed = True
            save_votes(self._votes_path, self._votes)
            log.info("collab_outer_vote_committed", job=cid, round=r, case=case_id,
                     valid=vote.valid)
        elif isinstance(act, RevealVote):
            assert vote is not None
            await rt.transact_ok(c.outer_jury.reveal_vote, case_id, vote.valid, vote.salt,
                                 benign=VOTE_BENIGN)
            vote.revealed = True  # only once the reveal came back: a failed one is resent
            save_votes(self._votes_path, self._votes)
            log.info("collab_outer_vote_revealed", job=cid, round=r, case=case_id,
                     valid=vote.valid)
        elif isinstance(act, Resolve):
            await self._move(("resolve", cid, r), c.collab.resolve_outer, cid, r,
                             benign=JURY_BENIGN)

    async def _jury_params(self) -> OuterJuryParamsView:
        """The OuterJury's Params: immutable, so read once."""
        if self._outer_jury_params is None:
            c = self.rt.chain_client
            self._outer_jury_params = await self.rt.chain(c.outer_jury.jury_params)
        return self._outer_jury_params

    async def _params(self) -> CollabParamsView:
        """The CollabMarket's Params: immutable, so read once."""
        if self._collab_params is None:
            c = self.rt.chain_client
            self._collab_params = await self.rt.chain(c.collab.collab_params)
        return self._collab_params

    async def _bond(self, spender: str, slots: int = 0, pipe: int = 0) -> None:
        """Allow ``spender`` one outer bond, or ``slots`` slot bonds; each plus ``pipe``, a
        pipelined job's pipeline bond (0 at depth 0)."""
        c = self.rt.chain_client
        p = await self._params()
        await self.rt.chain(c.token.ensure_allowance, spender,
                            (p.slot_bond + pipe) * slots if slots else p.outer_bond + pipe)

    async def _maybe_claim_slots(self, cid: CollabId, job: Any) -> None:
        rt, c = self.rt, self.rt.chain_client
        if await rt.chain(c.collab.is_excluded, cid, rt.address):
            return  # one of our inner runs here was condemned: we are out of this job
        holders = await self._holders(cid)
        held = sum(1 for h in holders if str(h).lower() == rt.address.lower())
        free = sum(1 for h in holders if int(str(h), 16) == 0)
        want = min(self.want_slots - held, free)
        if want > 0 and not await rt.chain(c.collab.delivered_of, rt.address):
            # No delivered record (never accepted, or missed since): the market allows one
            # slot per job, so asking for more would only revert (SlotCapExceeded).
            want = min(want, 1 - held)
        if want <= 0:
            return
        await self._check_round_zero(cid, job)
        rate = await self._claimed_rate_for(cid, job)
        if rate is None:
            return
        await self._bond(c.collab.address, slots=want, pipe=job.pipeline_bond)
        if await rt.transact_ok(c.collab.claim_slot, cid, want, rate, benign=SLOT_BENIGN):
            log.info("collab_slot_claimed", job=cid, slots=want, milli_steps_per_s=rate)

    async def _check_round_zero(self, cid: CollabId, job: Any) -> None:
        """Before a slot bond is at stake in a job not yet past round 0: the submitter's
        round-0 commitments (outerInitHash, initStateHash) must be the spec's theta_0.
        Posting others would let no worker commit round 0, and the slot bonds of those
        who claimed would reach the submitter; SpecError marks the job unusable."""
        from node.train.rounds import round_initial_hash  # noqa: PLC0415

        if job.round != 0 or cid in self._round_zero_ok:
            return
        state = await self.outer_state(cid, 0)  # SpecError if outerInitHash is another's
        assert state is not None  # round 0's state needs no settled round
        ctx = await self.round_context(cid, 0, 0)
        s0 = await trio.to_thread.run_sync(round_initial_hash, ctx, state.theta)
        if s0 != job.init_state_hash:
            raise SpecError(f"collaborative job {cid}: initStateHash is not S_0 of the "
                            "spec's theta_0", field="init_state_hash")
        self._round_zero_ok.add(cid)

    async def _claimed_rate_for(self, cid: CollabId, job: Any) -> int | None:
        """The inner run's measured speed (milli-steps per second), from the solver's
        child-process probe of round 0's inner job: what the claim states."""
        from node.data.probe import probe_job  # noqa: PLC0415

        if cid in self._claimed_rate:
            return self._claimed_rate[cid]
        # A restarted worker states the rate it measured before (same machine, same job):
        # a ~10 s probe could cost it the outer window in which it may re-claim its slot.
        saved = self.dir / str(cid) / "claimed-rate"
        try:
            self._claimed_rate[cid] = int(saved.read_text())
            return self._claimed_rate[cid]
        except (OSError, ValueError):
            pass
        ctx = await self.round_context(cid, 0, 0)
        spec_file = self.dir / str(cid) / "inner-spec.json"
        spec_file.parent.mkdir(parents=True, exist_ok=True)
        spec_file.write_bytes(ctx.spec.canonical_json())
        ds_path = await self.rt.fetch(job.dataset_hash.hex())
        try:
            probe = await probe_job(spec_file, ds_path, ctx.spec.spec_hash_hex(),
                                    job.dataset_hash.hex(), memory_mb=_memory_mb(),
                                    max_seconds=float(job.round_duration),
                                    gflops=0.0, threads=self.rt.settings.threads)
        except Exception as exc:  # noqa: BLE001 - a job we cannot run: never claim it
            log.warning("collab_job_rejected", job=cid, reason=str(exc))
            self._bad.add(cid)
            return None
        rate = int(1000 / probe.per_step_s) if probe.per_step_s else 0
        self._claimed_rate[cid] = rate
        saved.write_text(str(rate))
        return rate

    async def withdraw(self) -> int:
        c = self.rt.chain_client
        if not self.enabled or await self.rt.chain(c.collab.credits, self.rt.address) == 0:
            return 0
        try:
            return int(await self.rt.chain(c.collab.withdraw))
        except ContractRevert as exc:
            log.info("tx_not_needed", call="collab.withdraw", error=exc.error)
            return 0


def _round_context(spec: CollaborativeSpec, ds: Dataset, round_index: int, slot: int,
                   threads: int) -> Any:
    from node.train.rounds import round_context  # noqa: PLC0415 - torch is heavy

    return round_context(spec, ds, round_index, slot, threads=threads)


async def _outer_hash(state: OuterState) -> bytes:
    """An outer state's hash, taken in a worker thread (it reads every parameter)."""
    from node.train.diloco import outer_hash  # noqa: PLC0415

    return await trio.to_thread.run_sync(outer_hash, state)


def _memory_mb() -> int:
    from node.train.budget import machine_memory_mb  # noqa: PLC0415

    return int(os.environ.get("POLNET_COLLAB_MEMORY_MB", machine_memory_mb() // 2))


async def finalize_job(rt: Runtime, follower: CollabFollower, jid: JobId,
                       benign: tuple[str, ...]) -> bool:
    """``market.finalize(jid)``, or for a collaborative sub-job (which only its
    CollabMarket may finalize) ``settleRound`` of its job, which finalizes it."""
    c = rt.chain_client
    if follower.enabled and follower.is_sub_job(await rt.chain(c.market.get_job, jid)):
        ref = await rt.chain(c.collab.sub_job_of, jid)
        rnd = await rt.chain(c.collab.get_round, ref.collab_job_id, ref.round)
        if rnd.sub_jobs[ref.slot] != jid:  # its round was rolled back: an orphan (issue 35)
            return await rt.transact_ok(c.collab.settle_orphan, jid, benign=ORPHAN_BENIGN)
        return await rt.transact_ok(c.collab.settle_round, ref.collab_job_id,
                                    benign=SETTLE_BENIGN)
    return await rt.transact_ok(c.market.finalize, jid, benign=benign)


def load_outer_file(path: Path, r: int, spec: CollaborativeSpec) -> OuterState | None:
    """An outer state file, ours or a peer's (None if there is no file; CheckpointError
    if it is not a well-formed round-``r`` state of ``spec``: node.train.outer_file)."""
    from node.train.outer_file import read_outer_file  # noqa: PLC0415 - torch is heavy

    return read_outer_file(path, r, spec)
