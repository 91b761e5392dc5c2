"""A verifier judges each sampled segment on its own: a committed state with a NaN
or a wrong-shape tensor is a failed segment with a verdict saying why (not an
exception that stops the check), the other segments are still judged, and the
failing segment's leaves and proofs make a valid challenge against the root."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import pytest
import trio

from node.behaviors import make_behavior
from node.chain.ids import JobId
from node.errors import CheckpointError
from node.proof import verify_proof
from node.roles.verifier_evidence import Committed, judge_segment
from node.train.behavior import HonestBehavior
from node.train.step import TrainContext, TrainState
from node.train.trace import (
    TraceManifest,
    checkpoint_name,
    load_checkpoint,
    merkle_proof,
    read_manifest,
    run_training,
)
from verifier.jobs import job
from verifier.replay import CommittedState, committed_from_trace
from verifier.verdict import Verdict

K, T, JOB = 5, 20, JobId(3)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("datasets")


def judge_all(ctx: TrainContext, trace: Path, committed: Committed) -> dict[int, Verdict | None]:
    root = bytes.fromhex(read_manifest(trace).root)

    async def main() -> dict[int, Verdict | None]:
        return {seg: await judge_segment(committed, ctx, root=root, job_id=JOB, segment=seg)
                for seg in range(ctx.spec.segment_count)}

    return trio.run(main)


@pytest.mark.parametrize(("behavior", "bad", "why"), [
    ("poison:1", 1, "not finite"),
    ("poison:1,mode=shape", 1, "does not fit the spec"),
])
def test_unusable_committed_state_fails_its_segments_and_only_them(
        cache: Path, tmp_path: Path, behavior: str, bad: int, why: str) -> None:
    ctx = job("cnn", cache, k=K, total_steps=T)
    run_training(ctx, tmp_path, job_id=JOB, behavior=make_behavior(behavior))

    async def committed(i: int) -> CommittedState:  # the bytes as served, unchecked
        return committed_from_trace(tmp_path, i)

    verdicts = judge_all(ctx, tmp_path, committed)
    assert all(v is not None for v in verdicts.values()), verdicts
    passed = {s: v.passed for s, v in verdicts.items() if v is not None}
    assert passed == {0: True, bad: False, bad + 1: False, 3: True}, verdicts
    start_bad = verdicts[bad + 1]
    assert start_bad is not None
    assert why in start_bad.reason, start_bad.reason

    # A challenge of the first failing segment: its leaves and proofs check out
    # against the committed root even though the state itself is unusable.
    manifest = read_manifest(tmp_path)
    failing = min(s for s, ok in passed.items() if not ok)
    for i in (failing, failing + 1):
        leaf, proof = merkle_proof(manifest, i)
        verify_proof(bytes.fromhex(manifest.root), leaf, proof)


def test_checkpoint_refused_at_load_is_a_failed_segment_too(cache: Path, tmp_path: Path) -> None:
    """Loaded the way the daemon does (checked against the spec's layout from its
    header), the wrong-shape checkpoint raises at load: still a failed verdict."""
    ctx = job("cnn", cache, k=K, total_steps=T)
    run_training(ctx, tmp_path, job_id=JOB, behavior=make_behavior("poison:1,mode=shape"))
    manifest = read_manifest(tmp_path)

    async def committed(i: int) -> CommittedState:
        leaf, proof = merkle_proof(manifest, i)
        ck = load_checkpoint(tmp_path / checkpoint_name(i * K), leaf.state_hash, ctx.spec)
        return CommittedState(ck.tensors, leaf, proof)

    with pytest.raises(CheckpointError):
        trio.run(committed, 2)
    verdicts = judge_all(ctx, tmp_path, committed)
    assert [v.passed if v else None for v in verdicts.values()] == [True, False, False, True]


def test_an_exact_replay_needs_no_end_state_and_a_cheat_is_still_compared(
        cache: Path, tmp_path: Path) -> None:
    """The daemon's way (``commitment`` given): a replay bitwise equal to the end leaf
    passes without that state ever being fetched, so an honest solver slow to serve
    it costs nothing and a verifier downloads half; a segment whose replay differs
    fetches the solver's end state and is judged under the tolerance as before."""
    ctx = job("cnn", cache, k=K, total_steps=T)
    verdicts, fetched = {}, {}
    class LossLiar(HonestBehavior):  # honest states, a wrong mean loss in every leaf
        def run_segment(self, ctx: TrainContext, state: TrainState, segment_index: int,
                        start_step: int, k: int) -> tuple[TrainState, float]:
            state, loss = super().run_segment(ctx, state, segment_index, start_step, k)
            return state, 2 * loss

    for name, behavior in (("honest", None), ("poison", make_behavior("poison:1")),
                           ("liar", LossLiar())):
        trace = tmp_path / name
        run_training(ctx, trace, job_id=JOB, behavior=behavior)
        manifest = read_manifest(trace)
        got: list[int] = []

        async def committed(i: int, trace: Path = trace, got: list[int] = got) -> CommittedState:
            got.append(i)
            return committed_from_trace(trace, i)

        def commitment(i: int, manifest: TraceManifest = manifest) -> CommittedState:
            return CommittedState({}, *merkle_proof(manifest, i), manifest.state_hash_scheme)

        async def main(committed: Committed = committed,
                       commitment: Callable[[int], CommittedState] = commitment,
                       root: bytes = bytes.fromhex(manifest.root)) -> dict[int, Verdict | None]:
            return {s: await judge_segment(committed, ctx, root=root, job_id=JOB, segment=s,
                                           commitment=commitment)
                    for s in range(ctx.spec.segment_count)}

        verdicts[name], fetched[name] = trio.run(main), got
    honest = verdicts["honest"]
    assert all(v is not None and v.passed and v.reason.startswith("bitwise")
               and v.loss_claimed is not None and v.loss_replayed is not None
               and abs(v.loss_claimed - v.loss_replayed) < 1e-8  # the leaf's 1e-9 units
               for v in honest.values()), honest
    assert fetched["honest"] == [0, 1, 2, 3]  # starts only: no end state fetched
    # poison:1: S_2 holds a NaN. Segment 1's replay differs from it, so S_2 is fetched
    # and judged (failed); segment 2 fails on its start before any end is needed.
    poison = verdicts["poison"]
    assert [v.passed if v else None for v in poison.values()] == [True, False, False, True]
    assert all(v is not None and v.reason.startswith("bitwise")
               for s, v in poison.items() if s in (0, 3))
    assert fetched["poison"] == [0, 1, 2, 2, 3]  # one end fetched: the one that differed
    # Exact states do not excuse a false loss claim.
    assert all(v is not None and not v.passed and "claimed mean loss" in v.reason
               for v in verdicts["liar"].values()), verdicts["liar"]
    assert fetched["liar"] == [0, 1, 2, 3]
