"""Issue 30 item 7: the masked coordinates' tolerance is no write channel. A solver
that trains honestly and moves Adam's masked coordinates by the old flat bound
(2 * lr * k) is flagged on every segment, on the char LM."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from node.behaviors.trigger import MaskedTrigger
from node.train.trace import run_training
from verifier.jobs import job
from verifier.replay import verify_trace_segment

K, T = 5, 20


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("datasets")


def test_zero_moment_trigger_is_flagged_on_every_segment(cache: Path, tmp_path: Path) -> None:
    """Before: moving the embedding rows of tokens not seen yet (Adam moments exactly
    0, so the honest update is pure weight decay) by up to 0.0199 = 2*lr*k with a fixed
    random sign per coordinate passed every replay (928/736/640/544 coordinates a
    segment in the issue's run); the moves add up into a trigger. Now those coordinates
    are held to a few ulps and every segment fails."""
    ctx = job("lm", cache, k=K, total_steps=T)
    b = MaskedTrigger("zero")
    run_training(ctx, tmp_path, job_id=3, behavior=b)
    assert all(n > 100 for n in b.moved), b.moved  # the channel is wide
    for seg in range(ctx.spec.segment_count):
        v = verify_trace_segment(ctx, tmp_path, seg)
        assert not v.passed, v.summary()
        assert "second-moment bound" in v.reason
        assert v.ratio < 1e-3  # invisible to the update-relative check: only the new bound


@pytest.mark.parametrize("fraction", [0.99, 0.05])
def test_noise_moment_trigger_is_flagged_on_every_segment(cache: Path, tmp_path: Path,
                                                          fraction: float) -> None:
    """Before: coordinates whose gradient is rounding noise (0 < sqrt(v_hat) < eps, the
    attention key biases) could move by up to 2*lr*k a segment and pass. Now their bound
    follows from their own second moment (sqrt(v_hat) ~ 1e-12 here: about 1e-3 * lr * k),
    so even 5% of the old allowance is flagged."""
    ctx = job("lm", cache, k=K, total_steps=T)
    b = MaskedTrigger("noise", fraction=fraction)
    run_training(ctx, tmp_path, job_id=3, behavior=b)
    assert all(n > 0 for n in b.moved), b.moved
    for seg in range(ctx.spec.segment_count):
        v = verify_trace_segment(ctx, tmp_path, seg)
        assert not v.passed, v.summary()
        assert "second-moment bound" in v.reason


def test_cross_device_bench_cpu_path() -> None:
    """bench/drift_gpu.py's CPU path (the GPU row runs it with --device cuda): honest
    claims pass on another thread count, every compute-saving cheat and the write
    channel are flagged."""
    root = Path(__file__).parent.parent
    proc = subprocess.run([sys.executable, "bench/drift_gpu.py", "--device", "cpu",
                           "--segments", "1", "--k", "4", "--jobs", "lm"], cwd=root,
                          env={**os.environ, "PYTHONPATH": str(root)}, capture_output=True,
                          text=True, timeout=300, check=True)
    row = json.loads(proc.stdout.strip().splitlines()[-1])["lm"]["cpu_threads2"]
    assert row["false_flags"] == [] and row["honest_max_masked_slack"] <= 1.0
    assert row["cheats_flagged"] and row["write_channel_flagged"]
    assert row["determined"][0] > 100
