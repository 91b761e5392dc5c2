"""Replay integrity (no compute before commitments check out), sampling, and the
drift matrix: no honest configuration is flagged."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
import torch

from node.errors import CheckpointError, ProofError
from node.proof import sample_segments
from node.train.step import TrainContext, TrainState, train_step
from node.train.trace import run_training
from verifier.drift import MATRIX, config_by_name, measure
from verifier.jobs import dataset_path, job
from verifier.replay import committed_from_trace, verify_segment
from verifier.sampler import detection_probability, plan_sample, suspicious_segments


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("datasets")


class CountingStep:
    """The real train_step, counted (no mock of the trainer)."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, ctx: TrainContext, state: TrainState, step: int) -> float:
        self.calls += 1
        return train_step(ctx, state, step)


def test_tampered_checkpoint_is_rejected_before_any_replay(cache: Path, tmp_path: Path) -> None:
    ctx = job("cnn", cache, k=4, total_steps=8)
    manifest = run_training(ctx, tmp_path, job_id=5)
    root = bytes.fromhex(manifest.root)
    start, end = committed_from_trace(tmp_path, 0), committed_from_trace(tmp_path, 1)
    step = CountingStep()
    assert verify_segment(ctx, root=root, job_id=5, segment=0, start=start, end=end,
                          step_fn=step).passed
    assert step.calls == 4

    tampered = dict(end.tensors)
    tampered["model.head.bias"] = tampered["model.head.bias"] + 1e-3
    step = CountingStep()
    with pytest.raises(CheckpointError):
        verify_segment(ctx, root=root, job_id=5, segment=0, start=start,
                       end=dataclasses.replace(end, tensors=tampered), step_fn=step)
    with pytest.raises(ProofError):  # a consistent leaf that is not under the root
        bad_leaf = dataclasses.replace(end.leaf, loss_e9=end.leaf.loss_e9 + 1)
        verify_segment(ctx, root=root, job_id=5, segment=0, start=start,
                       end=dataclasses.replace(end, leaf=bad_leaf), step_fn=step)
    with pytest.raises(ProofError):  # the other segment's checkpoint
        verify_segment(ctx, root=root, job_id=5, segment=0, start=start,
                       end=committed_from_trace(tmp_path, 2), step_fn=step)
    assert step.calls == 0


def test_sample_plan_uses_the_shared_sampler() -> None:
    seed = bytes(range(32))
    plan = plan_sample(seed, 500, 0.1, 0.99, extra=3, losses_e9=[10**9] * 499 + [5 * 10**9])
    assert plan.n_required == 44
    assert list(plan.required) == sample_segments(seed, 500, 44)
    assert 499 in plan.extra or 499 in plan.required
    assert not set(plan.extra) & set(plan.required)
    assert plan.detection_probability(0.1) >= 0.99
    assert detection_probability(10, 44, 0.1) == 1.0
    assert suspicious_segments([1, 1, 9, 1], count=1) == [2]


def _assert_no_false_flag(rows: list) -> None:  # type: ignore[type-arg]
    bad = [f"{r.config}@{r.segment}: {r.reason}" for r in rows if not r.passed]
    assert not bad, bad


def test_honest_configs_in_process_never_flagged_lm(cache: Path) -> None:
    ctx = job("lm", cache, k=10, total_steps=40)
    m = measure(ctx, "lm", [0, 2], subprocess_configs=False)
    assert len(m.rows) == 2 * sum(not c.needs_subprocess for c in MATRIX)
    _assert_no_false_flag(m.rows)
    assert m.max_of("ratio") < 1e-4  # >= 10x under rho


def test_honest_configs_in_process_never_flagged_cnn(cache: Path) -> None:
    ctx = job("cnn", cache, k=10, total_steps=40)
    m = measure(ctx, "cnn", [0, 1, 3], subprocess_configs=False)
    _assert_no_false_flag(m.rows)
    assert m.max_of("ratio") < 1e-4  # >= 10x under rho, segment 0 (S_0) included


def test_onednn_off_from_initial_state_cnn(cache: Path) -> None:
    """Segment 0 (S_0: zero biases, digits ~50% exact-zero pixels) under the native
    conv kernel (NNPACK when oneDNN is off) stays far inside the tolerance."""
    ctx = job("cnn", cache, k=10, total_steps=40)
    m = measure(ctx, "cnn", [0], configs=[config_by_name("onednn_off")], subprocess_configs=False)
    _assert_no_false_flag(m.rows)
    assert m.max_of("ratio") < 1e-4  # >= 10x under rho


def test_relu_cnn_sits_on_the_kink_at_initial_state(cache: Path) -> None:
    """Why the CNN's default activation is smooth: with ReLU, all-zero input patches
    give pre-activations of exactly 0 under oneDNN but +-1e-7..1e-5 under NNPACK,
    so the first conv's bias gradient differs at S_0 and segment 0 drifts ~1e-2."""
    model = {"family": "cnn", "in_channels": 1, "image_size": 8, "channels": [8, 16],
             "hidden": 64, "num_classes": 10, "activation": "relu"}
    if not torch.backends.mkldnn.is_available() or not torch._nnpack_available():
        pytest.skip("needs both oneDNN and NNPACK to emulate two conv kernels")
    ctx = job("cnn", cache, k=10, total_steps=40, model=model)
    m = measure(ctx, "cnn", [0], configs=[config_by_name("onednn_off")], subprocess_configs=False)
    assert m.max_of("ratio") > 1e-3


def test_env_var_config_in_subprocess_never_flagged(cache: Path) -> None:
    ctx = job("lm", cache, k=10, total_steps=20)
    m = measure(ctx, "lm", [1], dataset_path("text", cache),
                configs=[config_by_name("aten_default")])
    assert [r.capability for r in m.rows] == ["DEFAULT"]  # the child really ran without SIMD
    _assert_no_false_flag(m.rows)
