"""Every cheating behaviour is flagged on every segment where it cheats; the
honest trace passes every segment."""

from __future__ import annotations

from pathlib import Path

import pytest

from node.behaviors import CHEATS, make_behavior
from node.behaviors.steps import Cheat
from node.proof import state_hash
from node.train.behavior import behavior_names
from node.train.step import load_state, state_tensors
from node.train.trace import read_manifest, regenerate_many, run_training
from verifier.jobs import job
from verifier.replay import verify_trace_segment

K, T = 5, 20  # 4 segments of 5 steps: tiny on a shared CPU
CNN_CHEATS = ["skip", "fewer_steps", "bad_step", "more_steps", "other_data", "half_batch",
              "low_lr:0.9", "noise:0.01", "bf16", "stale:2", "spoof", "blindfold:0.25",
              "lazy:0.5", "lazy:0.5,mode=spoof,salt=3", "poison", "poison:2,mode=shape", "amplify"]
LM_CHEATS = ["skip", "fewer_steps", "low_lr:0.9", "noise:0.01", "bf16", "spoof", "amplify"]


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("datasets")


def _check(kind: str, name: str, cache: Path, out: Path) -> None:
    ctx = job(kind, cache, k=K, total_steps=T)
    behavior = make_behavior(name)
    run_training(ctx, out, job_id=3, behavior=behavior)
    for seg in range(ctx.spec.segment_count):
        v = verify_trace_segment(ctx, out, seg)
        cheats = isinstance(behavior, Cheat) and behavior.cheats_on(seg, ctx.spec.segment_count)
        assert v.passed != cheats, f"{name} segment {seg}: {v.summary()}"
        if cheats:  # flagged by the state comparison itself, with a margin
            assert v.ratio > 3 * 1e-3, v.summary()


def test_all_cheats_are_registered() -> None:
    for cls in CHEATS:
        assert cls.name in behavior_names()


@pytest.mark.parametrize("name", ["honest", *CNN_CHEATS])
def test_cnn_behaviour_is_judged_right_on_every_segment(name: str, cache: Path,
                                                        tmp_path: Path) -> None:
    _check("cnn", name, cache, tmp_path / "trace")


@pytest.mark.parametrize("name", ["honest", *LM_CHEATS])
def test_lm_behaviour_is_judged_right_on_every_segment(name: str, cache: Path,
                                                       tmp_path: Path) -> None:
    _check("lm", name, cache, tmp_path / "trace")


def test_make_behavior_parses_positional_and_keywords() -> None:
    b = make_behavior("lazy:0.25,mode=spoof,salt=9")
    assert (b.fraction, b.mode, b.salt) == (0.25, "spoof", 9)  # type: ignore[attr-defined]
    assert make_behavior("noise,rel=0.02").rel == 0.02  # type: ignore[attr-defined]


def test_bad_step_answers_disputes_along_its_own_trajectory(cache: Path, tmp_path: Path) -> None:
    """The consistent liar's bisection states agree with honest ones before its bad
    step, differ from it on, and lead to its own committed checkpoint."""
    ctx = job("cnn", cache, k=K, total_steps=T)
    b = make_behavior("bad_step")
    run_training(ctx, tmp_path, job_id=3, behavior=b)
    manifest = read_manifest(tmp_path)
    bad = K + K // 2 + 1  # segment 1's middle step
    steps = list(range(K + 1, 2 * K))
    own = regenerate_many(ctx, tmp_path, steps, b.dispute_step)
    honest = regenerate_many(ctx, tmp_path, steps)
    for t in steps:
        assert (state_hash(own[t]) == state_hash(honest[t])) == (t < bad), t
    last = load_state(ctx, own[2 * K - 1], step=2 * K - 1)
    b.dispute_step(ctx, last, 2 * K)
    assert state_hash(state_tensors(last)).hex() == manifest.state_hashes[2]
