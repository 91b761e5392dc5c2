"""What a verifier knows about one committed job: the solver's trace manifest,
its checkpoints and served dispute states, each checked against the chain
before use. Fetching goes through the node's p2p layer; parsing and hashing
run in worker threads.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

import torch
import trio

from node.chain.contracts import Job
from node.chain.ids import JobId
from node.data.stream import StreamContext
from node.errors import (
    CheckpointError,
    IntegrityError,
    P2PError,
    PeerUnavailable,
    PolnetError,
    ProofError,
    StoreError,
    TrainingError,
)
from node.logs import get_logger
from node.proof import STATE_HASH_SCHEME
from node.roles.collab import CollabFollower
from node.roles.jobfiles import fetch_init_weights, fetch_job_inputs, job_context
from node.roles.runtime import Runtime
from node.train.layout import max_file_bytes
from node.train.shards import ShardContext
from node.train.step import TrainContext
from node.train.trace import (
    MAX_MANIFEST_BYTES,
    TraceLeaf,
    TraceManifest,
    load_checkpoint,
    merkle_proof,
)
from verifier.replay import (
    CommittedState,
    SegmentReplay,
    expected_initial_hash,
    judge_replay,
    load_committed_start,
    policy_from_spec,
    replay_segment,
    replay_to_leaf,
    segment_context,
    verify_segment,
)
from verifier.tolerance import compare_states, slots_from_names
from verifier.verdict import Verdict

log = get_logger("polnet.verifier.evidence")
Tensors = dict[str, torch.Tensor]
_T = TypeVar("_T")


@dataclass
class JobEvidence:
    rt: Runtime
    job_id: JobId
    job: Job
    ctx: TrainContext
    manifest: TraceManifest
    init_hash: bytes | None = None
    """The job's S_0 (checked against the spec, ``posted_initial_problem``): leaf 0 and
    any replay from step 0 must start there."""
    world_size: int = 1
    """Ranks that replay a sampled segment (verifier.dist_replay); 1: this process."""
    dataset_path: Path | None = None
    """The job's dataset file, for the ranks (None: a sharded dataset, one process)."""
    _states: dict[tuple[int, bytes], Tensors] = field(default_factory=dict)

    async def _load(self, artifact_id: str, state_hash: bytes) -> Tensors:
        # The spec bounds the download, then the file and its layout before a tensor
        # byte is read; what we fetch is pinned for the job and collected once it settles.
        path = await self.rt.fetch(artifact_id, (self.job.solver,),
                                   expected_size=max_file_bytes(self.ctx.spec),
                                   job_id=self.job_id)
        ck = await trio.to_thread.run_sync(load_checkpoint, path, state_hash, self.ctx.spec)
        return dict(ck.tensors)

    async def committed(self, index: int) -> CommittedState:
        """Checkpoint ``index`` with its leaf and proof (checked later against the root).
        A leaf the solver did not keep (sparse trace) is one it regenerates and serves
        (``state_served``) once it is sampled: PeerUnavailable until then."""
        leaf, proof, aid = self._leaf_artifact(index)
        tensors = await self._load(aid, leaf.state_hash)
        self._states[(leaf.step, leaf.state_hash)] = tensors
        return CommittedState(tensors, leaf, proof, self.manifest.state_hash_scheme)

    def _leaf_artifact(self, index: int) -> tuple[TraceLeaf, list[bytes], str]:
        """Leaf ``index``, its proof and the artifact holding its state: the kept file, or
        the solver's served regeneration of an unkept leaf."""
        leaf, proof = merkle_proof(self.manifest, index)
        entry = self.manifest.checkpoint_at(index)
        aid = entry.sha256 if entry is not None else \
            self.rt.book.states.get((self.job_id, "0x" + leaf.state_hash.hex()))
        if aid is None:
            raise PeerUnavailable(f"leaf {index} of job {self.job_id} is not kept by its solver "
                                  "and not served (regenerated) yet")
        return leaf, proof, aid

    async def committed_file(self, index: int) -> tuple[CommittedState, Path]:
        """Checkpoint ``index``'s leaf and proof (no tensors) and its file, fetched but not
        loaded: the ranks read their rows of it (``judge_segment_ranks``)."""
        leaf, proof, aid = self._leaf_artifact(index)
        path = await self.rt.fetch(aid, (self.job.solver,),
                                   expected_size=max_file_bytes(self.ctx.spec),
                                   job_id=self.job_id)
        return CommittedState({}, leaf, proof, self.manifest.state_hash_scheme), path

    def commitment(self, index: int) -> CommittedState:
        """Checkpoint ``index``'s leaf and proof without its tensors: what a challenge
        needs, even when the state itself cannot be loaded."""
        leaf, proof = merkle_proof(self.manifest, index)
        return CommittedState({}, leaf, proof, self.manifest.state_hash_scheme)

    async def state(self, step: int, state_hash: bytes, wait: bool = False) -> Tensors | None:
        """The state the solver committed to at ``step`` (a checkpoint or a served
        bisection state), or None if nobody has announced it (yet)."""
        if (step, state_hash) in self._states:
            return self._states[(step, state_hash)]
        k = self.manifest.k
        while True:
            if step % k == 0 and self.manifest.state_hashes[step // k] == state_hash.hex() \
                    and self.manifest.checkpoint_at(step // k) is not None:
                return dict((await self.committed(step // k)).tensors)
            aid = self.rt.book.states.get((self.job_id, "0x" + state_hash.hex()))
            if aid is not None:
                tensors = await self._load(aid, state_hash)
                self._states[(step, state_hash)] = tensors
                return tensors
            if not wait:
                return None
            await trio.sleep(0.5)

    async def state_file(self, step: int, state_hash: bytes) -> Path:
        """``state``'s file, fetched but not loaded (the ranks read their rows of it and
        the caller checks its hash: ``verifier.dist_step``); waits until it is announced."""
        k = self.manifest.k
        while True:
            if step % k == 0 and self.manifest.state_hashes[step // k] == state_hash.hex() \
                    and self.manifest.checkpoint_at(step // k) is not None:
                return (await self.committed_file(step // k))[1]
            aid = self.rt.book.states.get((self.job_id, "0x" + state_hash.hex()))
            if aid is not None:
                return await self.rt.fetch(aid, (self.job.solver,),
                                           expected_size=max_file_bytes(self.ctx.spec),
                                           job_id=self.job_id)
            await trio.sleep(0.5)

    def replay_range(self, lo: Tensors, lo_step: int, hi_step: int) -> Tensors | None:
        """Our replay lo_step -> hi_step from the solver's own lo; None (logged as a failed
        range) when lo is no valid state or the replay fails."""
        lo_state, why = load_committed_start(self.ctx, lo, lo_step)
        if lo_state is not None and lo_step == 0 and self.init_hash is not None:
            from node.proof import state_hash  # noqa: PLC0415 - torch-heavy

            if state_hash(lo, self.manifest.state_hash_scheme) != self.init_hash:
                lo_state, why = None, "the state at step 0 is not the job's S_0"
        if lo_state is None:  # the solver's own state at lo is no valid state
            log.info("range_replayed", job=self.job_id, steps=[lo_step, hi_step],
                     passed=False, reason=why)
            return None
        try:
            replayed, _loss = replay_segment(self.ctx, lo, lo_step, hi_step - lo_step)
        except TrainingError as exc:
            log.info("range_replayed", job=self.job_id, steps=[lo_step, hi_step],
                     passed=False, reason=str(exc))
            return None
        return replayed

    def is_exact(self, replayed: Tensors, hi_step: int, hi_hash: bytes) -> bool:
        """Is our replay's state hash exactly ``hi_hash``? Then the solver's hi *is* the
        honest successor of its lo, bit for bit, and its copy need not be fetched (a
        solver slow to serve it, say restarting, cannot make an honest challenger or
        juror misjudge the range); a hash that differs (other hardware's drift, or a
        fault) needs the solver's state and the tolerance (``step_range_ok``)."""
        from node.proof import state_hash  # noqa: PLC0415 - torch-heavy, like the replay

        if state_hash(replayed, self.manifest.state_hash_scheme) != hi_hash:
            return False
        log.info("range_replayed", job=self.job_id, steps=[hi_step], passed=True, exact=True)
        self._states[(hi_step, hi_hash)] = replayed
        return True

    def step_range_ok(self, lo: Tensors, lo_step: int, hi: Tensors, hi_step: int,
                      replayed: Tensors | None = None) -> bool:
        """Apply the job's tolerance to the solver's hi against our replay lo_step ->
        hi_step (``replayed``, if already run, else run here)."""
        if replayed is None:
            replayed = self.replay_range(lo, lo_step, hi_step)
            if replayed is None:
                return False
        n = hi_step - lo_step
        verdict = compare_states(-1, lo_step, lo, replayed, hi, slots_from_names(replayed),
                                 segment_context(self.ctx, lo_step, n),
                                 policy_from_spec(self.ctx.spec))
        log.info("range_replayed", job=self.job_id, steps=[lo_step, hi_step],
                 passed=verdict.passed, ratio=f"{verdict.ratio:.2e}")
        return verdict.passed


Committed = Callable[[int], Awaitable[CommittedState]]


async def _fetch(committed: Committed, index: int, *, job_id: int, segment: int,
                 k: int) -> CommittedState | Verdict | None:
    """A committed state, or the failed verdict it is, or None: not served (yet)."""
    try:
        return await committed(index)
    except (P2PError, StoreError, trio.TooSlowError) as exc:  # not served (yet)
        log.warning("segment_unavailable", job=job_id, segment=segment, error=str(exc))
        return None
    except CheckpointError as exc:  # the checkpoint the manifest names is no state
        return Verdict.failed(segment, segment * k, segment * k + k,
                              f"committed checkpoint cannot be loaded: {exc}")
    except Exception as exc:  # noqa: BLE001 - one segment must not stop the others
        log.exception("segment_evidence_failed", job=job_id, segment=segment,
                      error=repr(exc))
        return None


async def _checked(fn: Callable[[], _T], *, job_id: int, segment: int) -> _T | None:
    try:
        return await trio.to_thread.run_sync(fn)
    except (ProofError, CheckpointError) as exc:  # evidence that is not the committed one
        log.warning("segment_evidence_mismatch", job=job_id, segment=segment, error=str(exc))
        return None
    except Exception as exc:  # noqa: BLE001 - a verifier-side failure: no verdict
        log.exception("segment_check_failed", job=job_id, segment=segment, error=repr(exc))
        return None


async def judge_segment(committed: Committed, ctx: TrainContext, *, root: bytes, job_id: JobId,
                        segment: int,
                        commitment: Callable[[int], CommittedState] | None = None,
                        init_hash: bytes | None = None) -> Verdict | None:
    """One sampled segment, judged on its own: a Verdict, or None when there is no
    verdict to give yet (its checkpoints cannot be fetched, or what was fetched is
    not what the chain commits to: fetch again later). Never raises on what a peer
    sent: a committed state that is no valid state of the job (bytes that are not a
    checkpoint, a wrong layout, NaN, a replay that diverges) is a *failed* verdict
    saying why, so it gets challenged like any other.

    With ``commitment`` (a leaf and its proof without the state), the end state is
    fetched only when our replay is not bitwise equal to it (``replay_to_leaf``).
    ``init_hash``: the job's S_0; segment 0 fails unless its start leaf is that."""
    k = ctx.spec.checkpoint_interval
    where = {"job_id": job_id, "segment": segment}
    start = await _fetch(committed, segment, k=k, **where)
    if not isinstance(start, CommittedState):
        return start
    replay: SegmentReplay | None = None
    if commitment is not None:
        end_leaf = commitment(segment + 1)
        first = await _checked(lambda: replay_to_leaf(ctx, root=root, job_id=job_id,
                                                      segment=segment, start=start,
                                                      end=end_leaf, init_hash=init_hash),
                              **where)
        if not isinstance(first, SegmentReplay):
            return first
        replay = first
    end = await _fetch(committed, segment + 1, k=k, **where)
    if not isinstance(end, CommittedState):
        return end
    if replay is not None:
        done = replay
        return await _checked(lambda: judge_replay(ctx, done, root=root, job_id=job_id,
                                                   end=end), **where)
    return await _checked(lambda: verify_segment(ctx, root=root, job_id=job_id,
                                                 segment=segment, start=start, end=end,
                                                 init_hash=init_hash),
                          **where)


async def judge_segment_ranks(ev: JobEvidence, *, root: bytes, segment: int) -> Verdict | None:
    """``judge_segment`` with ``ev.world_size`` rank processes, none holding the whole
    state (verifier.dist_replay): a Verdict, or None when there is none to give yet
    (a checkpoint not served, or not the committed one)."""
    from verifier.dist_replay import RankOptions, verify_files_ranks  # noqa: PLC0415

    where = {"job_id": ev.job_id, "segment": segment}
    ends: list[tuple[CommittedState, Path]] = []
    for index in (segment, segment + 1):
        try:
            ends.append(await ev.committed_file(index))
        except (P2PError, StoreError, trio.TooSlowError) as exc:  # not served (yet)
            log.warning("segment_unavailable", error=str(exc), **where)
            return None
    path = ev.dataset_path
    assert path is not None
    options = RankOptions(threads=ev.rt.settings.threads or 1)
    ranked = await _checked(lambda: verify_files_ranks(
        ev.ctx, path, ev.world_size, root=root, job_id=ev.job_id, segment=segment,
        start=ends[0], end=ends[1], init_hash=ev.init_hash, options=options), **where)
    return None if ranked is None else ranked.verdict


async def vote_step(ev: JobEvidence, lo: int, lo_hash: bytes, hi: int, hi_hash: bytes) -> bool:
    """The juror's vote on S_lo -> S_hi, replayed here from the solver's S_lo: valid when
    the replay is S_hi bit for bit, else when the solver's S_hi (fetched only then) is
    within the tolerance. A state not served waits (the caller's deadline)."""
    lo_state = await ev.state(lo, lo_hash, wait=True)
    mine = None if lo_state is None else await trio.to_thread.run_sync(
        ev.replay_range, lo_state, lo, hi)
    if lo_state is None or mine is None:
        return False
    if await trio.to_thread.run_sync(ev.is_exact, mine, hi, hi_hash):
        return True  # the solver's S_hi is our replay, bit for bit
    hi_state = await ev.state(hi, hi_hash, wait=True)
    return hi_state is not None and await trio.to_thread.run_sync(
        ev.step_range_ok, lo_state, lo, hi_state, hi, mine)


async def vote_step_ranks(ev: JobEvidence, lo: int, lo_hash: bytes, hi: int,
                          hi_hash: bytes) -> bool:
    """The juror's vote on S_lo -> S_hi (the daemon's ``_vote``) with ``ev.world_size`` rank
    processes: valid when the ranks' replay hashes to ``hi_hash``, else (the solver's S_hi
    fetched only then, as one process does) when S_hi is within the tolerance. A state
    that is not served waits (the caller's deadline counts it against the solver); a
    replay that fails is invalid, as ``replay_range`` has it."""
    from verifier.dist_replay import RankOptions  # noqa: PLC0415
    from verifier.dist_step import StepJudgement, judge_step_ranks  # noqa: PLC0415

    data = ev.dataset_path
    assert data is not None
    lo_file = await ev.state_file(lo, lo_hash)

    def judge(hi_file: Path | None) -> StepJudgement:
        return judge_step_ranks(ev.ctx, data, ev.world_size, lo_step=lo, lo_hash=lo_hash,
                                lo_file=lo_file, hi_hash=hi_hash, hi_file=hi_file, hi_step=hi,
                                init_hash=ev.init_hash,
                                options=RankOptions(threads=ev.rt.settings.threads or 1))

    why = ""
    try:
        found = await trio.to_thread.run_sync(judge, None)
        if found.valid is None:  # not our replay bit for bit: the tolerance, on the solver's S_hi
            hi_file = await ev.state_file(hi, hi_hash)
            found = await trio.to_thread.run_sync(judge, hi_file)
        valid = bool(found.valid)
        why = found.verdict.reason if found.verdict is not None and not valid else ""
    except TrainingError as exc:  # a replay that fails: invalid, as on one process
        valid, why = False, str(exc)
    log.info("range_replayed", job=ev.job_id, steps=[lo, hi], passed=valid,
             ranks=ev.world_size, reason=why)
    return valid


def posted_initial_problem(ctx: TrainContext, posted: bytes) -> str | None:
    """Why a job whose posted S_0 hash (the chain's initStateHash) is not the spec's
    must not be worked on, or None. The chain checks leaf 0 against the posted hash
    only, so a submitter and solver together could otherwise start from weights of
    their choosing (a backdoor) and pass every replay."""
    want = expected_initial_hash(ctx)
    if want is None or want == posted:
        return None
    return (f"the job's initStateHash 0x{posted.hex()[:16]}… is not S_0 of its spec "
            f"(0x{want.hex()[:16]}…): refused; a submitter posts initial_state_hash(spec)")


class Evidence:
    """Per-job evidence, keyed by (job, trace root) so a reopened job starts afresh."""

    def __init__(self, rt: Runtime, world_size: int = 1) -> None:
        self.rt = rt
        self.world_size = world_size  # ranks a sampled segment is replayed by
        self._jobs: dict[tuple[int, bytes], JobEvidence] = {}
        self.refused: dict[int, str] = {}
        """Jobs not worked on (their posted S_0 is not their spec's), and why."""
        # Set by a daemon following collaborative jobs: a sub-job's context is its
        # round's (node.train.rounds), not one built from the spec alone.
        self.collab: CollabFollower | None = None

    async def for_job(self, job_id: JobId, job: Job | None = None) -> JobEvidence | None:
        rt = self.rt
        if job is None:
            job = await rt.chain(rt.chain_client.market.get_job, job_id)
        key = (job_id, job.trace_root)
        if key in self._jobs:
            return self._jobs[key]
        if job_id in self.refused:
            return None
        manifest = await self._manifest(job_id, job)
        if manifest is None:
            return None
        if self.collab is not None and self.collab.is_sub_job(job):
            ref = await rt.chain(rt.chain_client.collab.sub_job_of, job_id)
            ctx = await self.collab.round_context(ref.collab_job_id, ref.round, ref.slot)
        else:
            spec, dataset = await fetch_job_inputs(rt, job.spec_hash, job.dataset_hash,
                                                   (job.solver,))
            init = await fetch_init_weights(rt, spec, (job.solver, job.submitter))
            # Off the event loop: a model build takes seconds on a busy machine, and a
            # stalled loop would miss transfer deadlines and blame the peers.
            # lookahead 0: a sharded dataset's shards are fetched as the sampled
            # segments' steps read them, and no others.
            ctx = await job_context(rt, spec, dataset, rt.settings.threads, (job.solver,),
                                    lookahead=0, init_weights=init)
            why = await trio.to_thread.run_sync(posted_initial_problem, ctx,
                                                job.init_state_hash)
            if why is not None:
                self.refused[job_id] = why
                log.warning("job_refused", job=job_id, reason=why)
                return None
        # A sub-job's S_0 is its round's theta_t, fixed on chain by the CollabMarket from
        # the accepted outer state (round 0's: checked against the spec's theta_0 by
        # workers before they bond a slot): leaf 0 is held to that hash.
        ev = JobEvidence(rt, job_id, job, ctx, manifest, init_hash=job.init_state_hash)
        if self.world_size > 1 and not isinstance(ctx, StreamContext | ShardContext) \
                and manifest.state_hash_scheme == STATE_HASH_SCHEME:
            # The ranks load the job's dataset file themselves (a sharded dataset's shards
            # come through this daemon's p2p, and ranks hash states with the current
            # scheme only: those jobs replay on one process).
            ev.world_size = self.world_size
            ev.dataset_path = await rt.fetch(job.dataset_hash.hex(), (job.solver,))
        self._jobs[key] = ev
        return ev

    async def _manifest(self, job_id: JobId, job: Job) -> TraceManifest | None:
        for aid in list(self.rt.book.manifests.get(job_id, [])):
            try:
                path = await self.rt.fetch(aid, (job.solver,), timeout=30,
                                           expected_size=MAX_MANIFEST_BYTES, job_id=job_id)
                m = parse_manifest(path.read_bytes())
            except PolnetError as exc:
                log.warning("manifest_unusable", job=job_id, artifact=aid, error=str(exc))
                continue
            if m.job_id == job_id and bytes.fromhex(m.root) == job.trace_root \
                    and m.segment_count == job.segment_count and m.k == job.steps_per_segment:
                return m
            log.warning("manifest_mismatch", job=job_id, artifact=aid)
        return None


def parse_manifest(raw: bytes) -> TraceManifest:
    """A peer's manifest, rejected with IntegrityError if malformed or self-inconsistent."""
    try:
        m = TraceManifest.from_json(raw)
        _, tree = m.leaves_and_tree()
    except (ValueError, TypeError, KeyError) as exc:
        raise IntegrityError(f"malformed trace manifest: {exc}") from None
    if tree.root.hex() != m.root:  # from_json checked the kept checkpoints' steps
        raise IntegrityError("trace manifest does not match its own leaves")
    return m
