"""Replay one segment from the solver's own checkpoints and judge it.

Order matters: every commitment (leaf fields, state hash, Merkle proof) of
both ends is checked *before* any compute is spent, so a tampered checkpoint
costs the verifier a hash, not k training steps.

Public API::

    verify_segment(ctx, root=, job_id=, segment=, start=, end=, policy=None,
                   step_fn=train_step) -> Verdict
    replay_to_leaf(ctx, root=, job_id=, segment=, start=, end=, ...) -> Verdict | SegmentReplay
    judge_replay(ctx, replay, root=, job_id=, end=, policy=None) -> Verdict
    check_committed(root, job_id, index, step, committed)   # ProofError/CheckpointError
    replay_segment(ctx, start_tensors, start_step, k, step_fn=train_step)
        -> (replayed tensors, mean loss)
    policy_from_spec(spec) -> TolerancePolicy
    verify_trace_segment(ctx, trace_dir, segment, root=None, policy=None,
                         exact_first=False, init_hash=None) -> Verdict
    expected_initial_hash(ctx) -> bytes | None   # S_0 as the spec fixes it

Leaf 0 is S_0: with ``init_hash`` (the job's S_0, checked against the spec), segment 0
fails unless its start leaf commits exactly that state, whatever the replay says: a
trace trained from chosen weights is consistent with itself and would pass otherwise.
    committed_from_trace(trace_dir, index) -> CommittedState
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import torch

from node.errors import CheckpointError, ProofError, TrainingError, VerificationError
from node.proof import STATE_HASH_SCHEME, StateHashScheme, TraceLeaf, state_hash, verify_proof
from node.spec import AdamWConfig, JobSpec
from node.train.shards import ShardContext
from node.train.step import (
    TrainContext,
    TrainState,
    initial_state_hash,
    load_state,
    lr_of,
    state_tensors,
    train_step,
)
from node.train.trace import (
    kept_file,
    load_checkpoint,
    merkle_proof,
    read_manifest,
    regenerate_many,
)
from verifier.tolerance import (
    SegmentContext,
    TolerancePolicy,
    check_loss,
    compare_states,
    slots_from_names,
)
from verifier.verdict import Verdict

StepFn = Callable[[TrainContext, TrainState, int], float]
Tensors = Mapping[str, torch.Tensor]


@dataclass(frozen=True)
class CommittedState:
    """A checkpoint as served by the solver: its tensors, its leaf and the leaf's proof;
    ``scheme`` is the state hash its trace format names."""

    tensors: Tensors
    leaf: TraceLeaf
    proof: Sequence[bytes]
    scheme: StateHashScheme = STATE_HASH_SCHEME


@dataclass(frozen=True)
class SegmentReplay:
    """Our replay of a segment from the solver's committed start, not yet judged."""

    segment: int
    start: CommittedState
    replayed: dict[str, torch.Tensor]
    loss: float
    seconds: float


def check_committed(root: bytes, job_id: int, index: int, step: int,
                    committed: CommittedState) -> None:
    """The leaf is the one expected and under ``root``, and the tensors hash to it."""
    check_leaf(root, job_id, index, step, committed)
    got = state_hash(committed.tensors, committed.scheme)
    if got != committed.leaf.state_hash:
        raise CheckpointError(f"checkpoint of step {step} hashes to 0x{got.hex()[:16]}… but its "
                              f"leaf commits 0x{committed.leaf.state_hash.hex()[:16]}…: tampered "
                              "or corrupt; fetch it again from another provider")


def check_leaf(root: bytes, job_id: int, index: int, step: int,
               committed: CommittedState) -> None:
    """The leaf is the one expected and is under ``root`` (its tensors are not read)."""
    leaf = committed.leaf
    if (leaf.job_id, leaf.index, leaf.step) != (job_id, index, step):
        raise ProofError(f"leaf is (job {leaf.job_id}, index {leaf.index}, step {leaf.step}); "
                         f"expected (job {job_id}, index {index}, step {step})")
    verify_proof(root, leaf, committed.proof)


def expected_initial_hash(ctx: TrainContext) -> bytes | None:
    """S_0's state hash as the spec alone fixes it (seeded weights, zero optimizer
    state); None for a collaborative round's context, whose S_0 is the round's
    theta_t (``node.train.rounds.round_initial_hash``): its caller knows that hash."""
    return None if isinstance(ctx, ShardContext) else initial_state_hash(ctx)


def leaf_zero_failure(segment: int, k: int, start: CommittedState,
                      init_hash: bytes | None) -> Verdict | None:
    """The failed verdict of segment 0 whose start leaf is not the job's S_0, else None."""
    if segment != 0 or init_hash is None or start.leaf.state_hash == init_hash:
        return None
    return Verdict.failed(0, 0, k, f"leaf 0 commits 0x{start.leaf.state_hash.hex()[:16]}…, "
                          f"not the job's S_0 0x{init_hash.hex()[:16]}…: the trace starts "
                          "from weights the spec does not give (train from init_state)")


def policy_from_spec(spec: JobSpec) -> TolerancePolicy:
    t = spec.tolerance
    eps = spec.optimizer.eps if isinstance(spec.optimizer, AdamWConfig) else 1e-8
    # The spec carries one rho; tensors and moments get 3x (see TolerancePolicy).
    pol = TolerancePolicy(rho=t.rho, rho_tensor=3 * t.rho, abs_tol=t.abs_tol, rho_opt=3 * t.rho,
                          mask_bound_factor=t.adam_eps_mask_bound_factor, adam_eps=eps,
                          rho_loss=max(t.rho, 1e-3))
    if spec.precision != "fp32":
        # The noise cap is fp32's (verifier.adam_bound); other precisions' gradient noise
        # is not measured: noise coordinates keep the flat ceiling, zeros stay exact.
        pol = replace(pol, noise_floor=pol.mask_trust)
    return pol


def segment_context(ctx: TrainContext, start_step: int, k: int) -> SegmentContext:
    lr = max(lr_of(ctx, s) for s in range(start_step + 1, start_step + k + 1))
    o = ctx.spec.optimizer
    if isinstance(o, AdamWConfig):
        return SegmentContext(k=k, lr=lr, beta1=o.beta1, beta2=o.beta2, end_step=start_step + k)
    return SegmentContext(k=k, lr=lr, end_step=start_step + k)


def replay_segment(ctx: TrainContext, start_tensors: Tensors, start_step: int, k: int,
                   step_fn: StepFn = train_step) -> tuple[dict[str, torch.Tensor], float]:
    """Run steps ``start_step+1 .. start_step+k`` from the given state."""
    return _run_steps(ctx, load_state(ctx, start_tensors, step=start_step), start_step, k,
                      step_fn)


def _run_steps(ctx: TrainContext, state: TrainState, start_step: int, k: int,
               step_fn: StepFn) -> tuple[dict[str, torch.Tensor], float]:
    total = 0.0
    for step in range(start_step + 1, start_step + k + 1):
        total += step_fn(ctx, state, step)
    return state_tensors(state), total / k


def non_finite(tensors: Tensors) -> str | None:
    """The first floating tensor holding NaN or infinity, if any."""
    for name in sorted(tensors):
        t = tensors[name]
        if t.is_floating_point() and not bool(torch.isfinite(t).all()):
            return name
    return None


def load_committed_start(ctx: TrainContext, start: Tensors,
                         start_step: int) -> tuple[TrainState | None, str]:
    """The solver's committed start state as a train state, or None and why it is
    no valid state of this job (wrong layout, dtype or step; not finite)."""
    bad = non_finite(start)
    if bad is not None:
        return None, f"committed state S_{start_step} is not finite ({bad})"
    try:
        return load_state(ctx, start, step=start_step), ""
    except CheckpointError as exc:
        return None, f"committed state S_{start_step} does not fit the spec: {exc}"


def judge(ctx: TrainContext, segment: int, start_step: int, start: Tensors,
          replayed: Tensors, claimed: Tensors, policy: TolerancePolicy) -> Verdict:
    """Compare replayed with claimed under ``policy`` (no loss check)."""
    k = ctx.spec.checkpoint_interval
    return compare_states(segment, start_step, start, replayed, claimed,
                          slots_from_names(replayed), segment_context(ctx, start_step, k),
                          policy)


def verify_segment(ctx: TrainContext, *, root: bytes, job_id: int, segment: int,
                   start: CommittedState, end: CommittedState,
                   policy: TolerancePolicy | None = None,
                   step_fn: StepFn = train_step, init_hash: bytes | None = None) -> Verdict:
    """Check both ends' commitments (and leaf 0 against ``init_hash``), replay the
    segment, apply the tolerance rule.

    Raises ProofError/CheckpointError (before any replay) when a checkpoint is
    not the committed one; returns a failing Verdict when the solver's claim
    is out of tolerance, and when its committed start state is no valid state
    (wrong layout, not finite) or cannot be replayed (a step diverges): those
    are the solver's own commitments, so they fail the segment like a bad claim.
    """
    k = ctx.spec.checkpoint_interval
    check_committed(root, job_id, segment, segment * k, start)
    check_committed(root, job_id, segment + 1, segment * k + k, end)
    bad_start = leaf_zero_failure(segment, k, start, init_hash)
    if bad_start is not None:
        return bad_start
    replay = _replay_from(ctx, segment, start, step_fn)
    return replay if isinstance(replay, Verdict) else _judge_replay(ctx, replay, end, policy)


def _replay_from(ctx: TrainContext, segment: int, start: CommittedState,
                 step_fn: StepFn) -> Verdict | SegmentReplay:
    """The segment's k steps from the solver's committed start, or the failed verdict
    when that start is no valid state or the replay fails."""
    k = ctx.spec.checkpoint_interval
    start_step = segment * k
    state, why = load_committed_start(ctx, start.tensors, start_step)
    if state is None:
        return Verdict.failed(segment, start_step, start_step + k, why)
    t0 = time.perf_counter()
    try:
        replayed, loss = _run_steps(ctx, state, start_step, k, step_fn)
    except TrainingError as exc:  # e.g. a finite but absurd state whose loss overflows
        return Verdict.failed(segment, start_step, start_step + k,
                              f"replay from committed state S_{start_step} fails: {exc}")
    return SegmentReplay(segment, start, replayed, loss, time.perf_counter() - t0)


def _judge_replay(ctx: TrainContext, replay: SegmentReplay, end: CommittedState,
                  policy: TolerancePolicy | None) -> Verdict:
    start_step = replay.segment * ctx.spec.checkpoint_interval
    pol = policy or policy_from_spec(ctx.spec)
    verdict = judge(ctx, replay.segment, start_step, replay.start.tensors, replay.replayed,
                    end.tensors, pol)
    verdict = check_loss(verdict, end.leaf.loss_e9 / 1e9, replay.loss, pol)
    return replace(verdict, replay_seconds=replay.seconds)


def committed_from_trace(trace_dir: str | Path, index: int,
                         ctx: TrainContext | None = None) -> CommittedState:
    """Checkpoint ``index`` of a local trace directory with its leaf and proof; a leaf
    the trace did not keep (sparse) is regenerated by honest steps, given ``ctx``.

    The proof comes from the directory's manifest; ``verify_segment`` checks it
    against the root the caller trusts (the chain's), not the manifest's.
    """
    manifest = read_manifest(trace_dir)
    if not 0 <= index <= manifest.segment_count:
        raise VerificationError(f"checkpoint index {index} outside 0..{manifest.segment_count}")
    leaf, proof = merkle_proof(manifest, index)
    scheme = manifest.state_hash_scheme
    if manifest.checkpoint_at(index) is not None:
        # kept_file: a sharded run's DCP checkpoint is converted (once, hash-checked)
        ck = load_checkpoint(kept_file(trace_dir, manifest, index))
        return CommittedState(ck.tensors, leaf, proof, scheme)
    if ctx is None:
        raise VerificationError(f"leaf {index} is not kept in {trace_dir} (keep_every "
                                f"{manifest.keep_every}); regenerating it needs the job's context")
    tensors = regenerate_many(ctx, trace_dir, [index * manifest.k])[index * manifest.k]
    return CommittedState(tensors, leaf, proof, scheme)


def replay_to_leaf(ctx: TrainContext, *, root: bytes, job_id: int, segment: int,
                   start: CommittedState, end: CommittedState,
                   policy: TolerancePolicy | None = None,
                   step_fn: StepFn = train_step,
                   init_hash: bytes | None = None) -> Verdict | SegmentReplay:
    """Replay a segment needing only the end's leaf and proof (``end.tensors`` may be
    empty). When the replay hashes exactly to the end leaf's state hash, the solver's
    end state *is* the honest successor of its start, bit for bit: the verdict (its
    loss claim checked) comes without fetching that state, half of what a verifier
    downloads and hashes. A Verdict too when the start is no valid state or the
    replay fails; otherwise the replay, for ``judge_replay`` with the solver's end
    state (other hardware's drift, or a fault). Commitments are checked before any
    compute, as in ``verify_segment``."""
    k = ctx.spec.checkpoint_interval
    start_step = segment * k
    check_committed(root, job_id, segment, start_step, start)
    check_leaf(root, job_id, segment + 1, start_step + k, end)
    bad_start = leaf_zero_failure(segment, k, start, init_hash)
    if bad_start is not None:
        return bad_start
    replay = _replay_from(ctx, segment, start, step_fn)
    if isinstance(replay, Verdict) or state_hash(replay.replayed, end.scheme) \
            != end.leaf.state_hash:
        return replay
    exact = Verdict(segment, start_step, start_step + k, True,
                    "bitwise equal to the committed state", 0.0, 0.0, 0.0, "", 0.0, 0,
                    replay_seconds=replay.seconds)
    return check_loss(exact, end.leaf.loss_e9 / 1e9, replay.loss,
                      policy or policy_from_spec(ctx.spec))


def judge_replay(ctx: TrainContext, replay: SegmentReplay, *, root: bytes, job_id: int,
                 end: CommittedState, policy: TolerancePolicy | None = None) -> Verdict:
    """``replay_to_leaf``'s replay against the solver's end state: its commitment, then
    the tolerance rule and the loss claim."""
    k = ctx.spec.checkpoint_interval
    check_committed(root, job_id, replay.segment + 1, replay.segment * k + k, end)
    return _judge_replay(ctx, replay, end, policy)


def verify_trace_segment(ctx: TrainContext, trace_dir: str | Path, segment: int,
                         root: bytes | None = None, policy: TolerancePolicy | None = None,
                         step_fn: StepFn = train_step, exact_first: bool = False,
                         init_hash: bytes | None = None) -> Verdict:
    """``verify_segment`` on a local trace directory; ``root`` defaults to the manifest's
    (pass the on-chain root when there is one). ``exact_first``: the daemon's way
    (``replay_to_leaf``): the end state is loaded only when the replay is not bitwise
    equal to it; without it, always compared under the tolerance (drift figures).
    Segment 0's start must be ``init_hash``, by default the spec's S_0
    (``expected_initial_hash``; a collaborative round's caller passes theta_t's)."""
    manifest = read_manifest(trace_dir)
    if not 0 <= segment < manifest.segment_count:
        raise VerificationError(f"segment {segment} outside 0..{manifest.segment_count - 1}")
    if segment == 0 and init_hash is None:
        init_hash = expected_initial_hash(ctx)
    root = root or bytes.fromhex(manifest.root)
    start = committed_from_trace(trace_dir, segment, ctx)
    if exact_first:
        leaf, proof = merkle_proof(manifest, segment + 1)
        end = CommittedState({}, leaf, proof, manifest.state_hash_scheme)
        first = replay_to_leaf(ctx, root=root, job_id=manifest.job_id, segment=segment,
                               start=start, end=end, policy=policy, step_fn=step_fn,
                               init_hash=init_hash)
        if isinstance(first, Verdict):
            return first
        return judge_replay(ctx, first, root=root, job_id=manifest.job_id,
                            end=committed_from_trace(trace_dir, segment + 1, ctx), policy=policy)
    return verify_segment(ctx, root=root, job_id=manifest.job_id, segment=segment, start=start,
                          end=committed_from_trace(trace_dir, segment + 1, ctx), policy=policy,
                          step_fn=step_fn, init_hash=init_hash)
