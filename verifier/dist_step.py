"""A dispute's one step judged by N rank processes, none holding the whole state (issue
33's multi-rank juror).

The one-process juror (``node.roles.verifier``'s ``_vote``) replays S_lo -> S_lo+1 from
the solver's state at the agreed hash and votes valid when the replay hashes to the
claimed S_hi bit for bit, else (the claimed state fetched) when the claimed state is
within the tolerance of the replay. Here the same: this process hashes the S_lo file
a tensor at a time (it is usually a served bisection state, not a kept leaf), then the
ranks of ``verifier.dist_replay`` read their rows of it, run one step of the solver's
distributed step and hash the result from shards. Given the claimed file too, each
rank sums the rule's figures over its rows and the verdict comes from their sums, as
a segment's does.

Public API::

    judge_step_ranks(ctx, dataset_path, world_size, *, lo_step, lo_hash, lo_file,
                     hi_hash, hi_file=None, hi_step=None, policy=None, init_hash=None,
                     options=None) -> StepJudgement
"""

from __future__ import annotations

import os
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from node.errors import CheckpointError
from node.train.step import STEP_KEY, TrainContext
from verifier.dist_replay import RankOptions, ReplayRankConfig, _layout, _run, file_hash
from verifier.replay import policy_from_spec, segment_context
from verifier.tolerance import (
    Partials,
    SegmentContext,
    Sums,
    TolerancePolicy,
    failed_verdict,
    layout_mismatch,
    non_finite_reason,
    verdict_of,
)
from verifier.verdict import Verdict


@dataclass(frozen=True)
class StepJudgement:
    """A juror's finding on one step. ``valid`` None: the replay is not the claimed
    state bit for bit and no claimed file was given (fetch it, judge again with it)."""

    valid: bool | None
    end_hash: bytes  # the replayed S_hi, hashed from shards (empty: no replay ran)
    verdict: Verdict | None  # the tolerance's, when a claimed file was compared
    held_bytes: tuple[int, ...]


def _invalid(lo_step: int, n: int, ctx: TrainContext, why: str) -> StepJudgement:
    return StepJudgement(False, b"", failed_verdict(-1, lo_step, segment_context(ctx, lo_step, n),
                                                    why), ())


def _checked_file(path: Path, want: bytes, step: int) -> None:
    """The juror's own check, before any rank starts (``load_checkpoint``'s, streamed)."""
    if file_hash(path) != want:
        raise CheckpointError(f"state file {path} of step {step} does not hash to the "
                              f"dispute's 0x{want.hex()[:16]}…: not the state the dispute "
                              "names; fetch it again from the solver or another provider")


def _held_step(path: Path) -> int:
    from safetensors import safe_open  # noqa: PLC0415

    with safe_open(str(path), "pt") as f:
        return int(f.get_tensor(STEP_KEY))


def judge_step_ranks(ctx: TrainContext, dataset_path: str | Path, world_size: int, *,
                     lo_step: int, lo_hash: bytes, lo_file: Path, hi_hash: bytes,
                     hi_file: Path | None = None, hi_step: int | None = None,
                     policy: TolerancePolicy | None = None, init_hash: bytes | None = None,
                     options: RankOptions | None = None) -> StepJudgement:
    """The juror's judgement of S_lo -> S_hi (``hi_step``: lo_step + 1 unless given) with
    ``world_size`` ranks, from the (hash, file) of S_lo and the hash of S_hi (and its
    file, for the tolerance: ``hi_file``). CheckpointError
    (before any rank starts) when a file does not hash to the dispute's hash for it;
    TrainingError when a rank fails."""
    from node.train.dist_plan import check_world  # noqa: PLC0415
    from node.train.layout import expected_layout  # noqa: PLC0415
    from node.train.trace import SPEC_NAME  # noqa: PLC0415

    check_world(ctx.spec.batch_size, world_size)
    n = 1 if hi_step is None else hi_step - lo_step
    _checked_file(lo_file, lo_hash, lo_step)
    if hi_file is not None:
        _checked_file(hi_file, hi_hash, lo_step + n)
    # What the one-process juror's replay_range refuses: no valid start state.
    if lo_step == 0 and init_hash is not None and lo_hash != init_hash:
        return _invalid(lo_step, n, ctx, "the state at step 0 is not the job's S_0")
    want = expected_layout(ctx.spec)
    if _layout(lo_file, ctx) != want:
        return _invalid(lo_step, n, ctx, f"committed state S_{lo_step} does not fit the spec")
    held = _held_step(lo_file)
    if held != lo_step:  # load_state's refusal on one process (a rank's would raise)
        return _invalid(lo_step, n, ctx, f"committed state S_{lo_step} does not fit the spec: "
                        f"it holds step {held}")
    why = None if hi_file is None else layout_mismatch(want, _layout(hi_file, ctx))
    if why is not None:
        return _invalid(lo_step, n, ctx, why)
    pol = policy or policy_from_spec(ctx.spec)
    options = options or RankOptions()
    with tempfile.TemporaryDirectory(prefix="polnet-step-") as tmp:
        out = Path(tmp)
        (out / SPEC_NAME).write_bytes(ctx.spec.canonical_json())
        figures = _run(ReplayRankConfig(
            0, world_size, 0, os.getpid(), str(out / SPEC_NAME), str(dataset_path),
            options.threads, str(lo_file), "" if hi_file is None else str(hi_file), lo_step,
            lo_hash.hex(), asdict(pol), str(out), options.block_bytes,
            options.hash_batch_bytes, steps=n), options.on_start)
    return _judge(segment_context(ctx, lo_step, n), lo_step, pol, figures, hi_hash,
                  hi_file is not None)


def _judge(seg: SegmentContext, lo_step: int, pol: TolerancePolicy, figures: dict[str, Any],
           hi_hash: bytes, compared: bool) -> StepJudgement:
    held = tuple(int(b) for b in figures["held_bytes"])
    end = bytes.fromhex(figures["end_hash"])
    if figures["bad_start"]:
        why = f"committed state S_{lo_step} is not finite ({figures['bad_start']})"
        return StepJudgement(False, end, failed_verdict(-1, lo_step, seg, why), held)
    verdict: Verdict | None = None
    if compared and figures["bad_claim"]:
        verdict = failed_verdict(-1, lo_step, seg, non_finite_reason(figures["bad_claim"]))
    elif compared:
        parts = Partials(tuple((n, kind, Sums.of_vector(v)) for n, kind, v in figures["checks"]),
                         figures["masked_slack"], figures["determined"])
        verdict = verdict_of(-1, lo_step, seg, pol, parts)
    # The replay is the claimed state bit for bit: valid, whatever the figures.
    valid = True if end == hi_hash else None if verdict is None else verdict.passed
    return StepJudgement(valid, end, verdict, held)
