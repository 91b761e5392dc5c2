"""A collaborative round's inner run recorded as an ordinary trace (node.train.rounds):
the sub-job the CollabMarket posts per (round, slot). Real training of a small char LM
on the bundled text, the real trace recorder and the verifier's segment replay."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from node.behaviors.steps import FewerSteps, SkipSteps
from node.datasets import Dataset, pack_text, parse_dataset
from node.errors import SpecError, TrainingError
from node.spec import CollaborativeSpec, parse_collaborative_spec
from node.train.diloco import initial_outer_state, outer_hash, outer_step, run_round
from node.train.inner import inner_run
from node.train.rounds import (
    delta_from_final,
    round_context,
    round_initial_hash,
    round_start_state,
)
from node.train.shards import worker_context
from node.train.trace import load_checkpoint, read_manifest, run_training
from verifier.replay import verify_trace_segment

H, R, K = 6, 3, 3


@pytest.fixture(scope="module")
def text() -> Dataset:
    return parse_dataset(pack_text())


def collab(dataset_hash: str, **over: object) -> dict[str, object]:
    d: dict[str, object] = {
        "kind": "collaborative", "name": "tiny-rounds",
        "inner": {"model": {"family": "transformer_lm", "vocab_size": 128, "context": 16,
                            "d_model": 32, "n_heads": 2, "n_layers": 1, "d_ff": 64,
                            "dropout": 0.1},
                  "dataset_hash": dataset_hash,
                  "optimizer": {"name": "adamw", "lr": 3e-3},
                  "schedule": {"kind": "cosine", "warmup_steps": 2},
                  "batch_size": 4, "total_steps": H * R, "checkpoint_interval": K, "seed": 5},
        "workers": {"min": 2, "max": 2}, "inner_steps": H, "outer_rounds": R,
        "outer_optimizer": {"lr": 0.7, "momentum": 0.9}, "holdout_samples": 64,
    }
    d.update(over)
    return d


@pytest.fixture(scope="module")
def spec(text: Dataset) -> CollaborativeSpec:
    return parse_collaborative_spec(collab(text.hash_hex))


def sub_job(spec: CollaborativeSpec, text: Dataset, theta: dict[str, torch.Tensor], t: int,
            slot: int, out: Path, behavior: object = None) -> Path:
    ctx = round_context(spec, text, t, slot)
    run_training(ctx, out, job_id=100 + 10 * t + slot, behavior=behavior,  # type: ignore[arg-type]
                 initial=lambda: round_start_state(ctx, theta))
    return out


def final_tensors(trace_dir: Path) -> dict[str, torch.Tensor]:
    m = read_manifest(trace_dir)
    entry = m.checkpoint_at(m.segment_count)
    assert entry is not None
    return load_checkpoint(trace_dir / entry.file, m.state_hashes[-1]).tensors


def test_sub_job_trace_is_the_inner_run_bit_for_bit(spec: CollaborativeSpec, text: Dataset,
                                                    tmp_path: Path) -> None:
    """Round 1 (offset H: data, dropout and the cosine schedule of global steps H+1..2H),
    from non-initial weights: the trace's final weights and delta are inner_run's."""
    theta = {n: v + 0.01 for n, v in initial_outer_state(spec).theta.items()}
    out = sub_job(spec, text, theta, 1, 1, tmp_path / "t")
    m = read_manifest(out)
    assert m.total_steps == H and m.segment_count == H // K
    ref = inner_run(worker_context(spec, text, 1), theta, 1)
    got = delta_from_final(theta, final_tensors(out))
    assert got.keys() == ref.delta.keys()
    assert all(torch.equal(got[n], ref.delta[n]) for n in got)
    # Leaf 0 is the round's start state, whose hash the chain fixes; it is the same
    # for every slot (seeds and shards are not part of a state).
    assert m.state_hashes[0] == round_initial_hash(round_context(spec, text, 1, 1), theta).hex()
    assert round_initial_hash(round_context(spec, text, 1, 0), theta) == \
        round_initial_hash(round_context(spec, text, 1, 1), theta)
    # ... and not the spec's seeded S_0: a worker cannot start from weights of its own.
    assert round_initial_hash(round_context(spec, text, 1, 1), theta) != \
        round_initial_hash(round_context(spec, text, 1, 1), initial_outer_state(spec).theta)


def test_round_of_sub_jobs_gives_the_engine_outer_state(spec: CollaborativeSpec,
                                                        text: Dataset, tmp_path: Path) -> None:
    """Deltas taken from the two sub-jobs' final states make the same outer state (hash
    and all) as the round engine's run_round."""
    s0 = initial_outer_state(spec)
    deltas = {i: delta_from_final(s0.theta, final_tensors(
        sub_job(spec, text, s0.theta, 0, i, tmp_path / f"s{i}"))) for i in (0, 1)}
    mine = outer_step(s0, deltas, spec.outer_optimizer)
    engine = run_round(s0, [worker_context(spec, text, i) for i in (0, 1)],
                       spec.outer_optimizer)
    assert outer_hash(mine) == outer_hash(engine.state)


def test_verifier_replays_sub_job_segments(spec: CollaborativeSpec, text: Dataset,
                                           tmp_path: Path) -> None:
    """The verifier's segment replay on the round context passes an honest sub-job and
    flags a worker that skipped or shortened its inner steps on every segment."""
    theta = initial_outer_state(spec).theta
    ctx = round_context(spec, text, 2, 0)
    honest = sub_job(spec, text, theta, 2, 0, tmp_path / "h")
    assert all(verify_trace_segment(ctx, honest, s).passed for s in range(H // K))
    for name, cheat in (("skip", SkipSteps()), ("fewer", FewerSteps())):
        lazy = sub_job(spec, text, theta, 2, 0, tmp_path / name, cheat)
        for s in range(H // K):
            v = verify_trace_segment(ctx, lazy, s)
            assert not v.passed, (name, s)
    # The replay must use the round's offset: a context of another round disagrees.
    assert not verify_trace_segment(round_context(spec, text, 1, 0), honest, 0).passed


def test_round_context_bounds(spec: CollaborativeSpec, text: Dataset) -> None:
    with pytest.raises(TrainingError, match="round 3"):
        round_context(spec, text, R, 0)
    with pytest.raises(TrainingError, match="slot 2"):
        round_context(spec, text, 0, 2)
    with pytest.raises(SpecError, match="warmup_steps"):
        bad = collab(text.hash_hex)
        bad["inner"]["schedule"]["warmup_steps"] = H + 1  # type: ignore[index]
        parse_collaborative_spec(bad)


def test_initial_state_must_be_step_zero(spec: CollaborativeSpec, text: Dataset,
                                         tmp_path: Path) -> None:
    ctx = round_context(spec, text, 0, 0)

    def late() -> object:
        st = round_start_state(ctx, initial_outer_state(spec).theta)
        st.step = K
        return st

    with pytest.raises(TrainingError, match="step 0"):
        run_training(ctx, tmp_path / "x", 1, initial=late)  # type: ignore[arg-type]
