"""Issue 30 item 8: leaf 0 is checked off chain too. A trace trained from weights of
the solver's choosing is consistent with itself, so before these checks every
segment of it replayed fine off chain; only the chain compared leaf 0, and only
with the hash the submitter posted, which nothing compared with the spec."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import trio

from node.proof import state_hash
from node.train.step import TrainContext, TrainState, init_state, initial_state_hash, state_tensors
from node.train.trace import read_manifest, run_training
from verifier.evidence import judge_segment, posted_initial_problem
from verifier.jobs import job
from verifier.replay import CommittedState, committed_from_trace, verify_trace_segment

K, T, JOB = 5, 20, 3


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("datasets")


def chosen(ctx: TrainContext) -> TrainState:
    """S_0 with a planted edit: the spec's seeded weights, one bias moved."""
    state = init_state(ctx)
    with torch.no_grad():
        state.model.get_parameter("head.bias").add_(0.5)
    return state


@pytest.fixture(scope="module")
def chosen_trace(cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    ctx = job("cnn", cache, k=K, total_steps=T)
    out = tmp_path_factory.mktemp("chosen")
    run_training(ctx, out, job_id=JOB, initial=lambda: chosen(ctx))
    return out


@pytest.mark.parametrize("exact_first", [False, True])
def test_local_replay_of_a_trace_from_chosen_weights_fails_on_leaf_0(
        cache: Path, chosen_trace: Path, exact_first: bool) -> None:
    """Before: every segment of this trace passed ``verify_trace_segment`` (each replays
    from its own committed start). Now segment 0 fails: its start is not the spec's S_0."""
    ctx = job("cnn", cache, k=K, total_steps=T)
    v = verify_trace_segment(ctx, chosen_trace, 0, exact_first=exact_first)
    assert not v.passed and "leaf 0" in v.reason and "S_0" in v.reason, v.summary()
    for seg in range(1, ctx.spec.segment_count):  # the rest replays as it always did
        assert verify_trace_segment(ctx, chosen_trace, seg, exact_first=exact_first).passed
    honest = chosen_trace.parent / "honest"
    run_training(ctx, honest, job_id=JOB)
    assert verify_trace_segment(ctx, honest, 0, exact_first=exact_first).passed


def test_the_verifiers_segment_check_holds_leaf_0_to_the_jobs_s0(
        cache: Path, chosen_trace: Path) -> None:
    """The daemon's per-segment judge (``judge_segment``) fails segment 0 of the chosen
    trace given the job's S_0; without it (as before) the segment passed."""
    ctx = job("cnn", cache, k=K, total_steps=T)
    root = bytes.fromhex(read_manifest(chosen_trace).root)

    async def committed(i: int) -> CommittedState:
        return committed_from_trace(chosen_trace, i)

    async def judge(init: bytes | None):  # type: ignore[no-untyped-def]
        return await judge_segment(committed, ctx, root=root, job_id=JOB, segment=0,
                                   init_hash=init)

    before = trio.run(judge, None)
    assert before is not None and before.passed
    after = trio.run(judge, initial_state_hash(ctx))
    assert after is not None and not after.passed and "leaf 0" in after.reason


def test_a_job_whose_posted_s0_is_not_the_specs_is_refused(cache: Path) -> None:
    """The verifier's refusal rule (``Evidence.for_job`` applies it before any fetch of
    a checkpoint): a posted initStateHash of chosen weights is refused with a reason
    that names the fix; the spec's own S_0 is accepted."""
    ctx = job("cnn", cache, k=K, total_steps=T)
    posted = state_hash(state_tensors(chosen(ctx)))
    why = posted_initial_problem(ctx, posted)
    assert why is not None and "refused" in why and "initial_state_hash(spec)" in why
    assert posted_initial_problem(ctx, initial_state_hash(ctx)) is None
