"""A ~100M-parameter Llama-configuration job (node.spec_hf) on the CPU: step time,
trace overhead, and one segment's replay against its training time.

Trains ``--steps`` steps (segments of ``--k``) of an ``hf_llama`` model on the
bundled char corpus with ``run_training`` (S_0 and every leaf hashed, checkpoints
written), timing the honest segments inside the run apart from everything else
(recording: hashing, checkpoint files, Merkle tree), as bench/trace_overhead.py
does. Then the verifier replays the last segment from its committed start
(``verify_trace_segment``: load, replay, compare under the tolerance) and the
replay's wall time is set against that segment's training time.

Figures (last stdout line, JSON):
- ``params``, ``step_s`` (mean honest step), ``tokens_per_s``;
- ``trace_overhead_pct``: wall outside training over training time;
- ``checkpoint_bytes``: one checkpoint file (weights + AdamW state);
- ``replay_s``, ``segment_train_s``, ``replay_over_train``; ``replay_passed``.

Usage: python bench/hf.py [--steps 4] [--k 2] [--batch 1] [--context 128]
[--threads N] [--tiny]   (--tiny: a 1M model, to check the script quickly)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from node.spec import parse_spec  # noqa: E402
from node.spec_hf import installed_transformers_version  # noqa: E402
from node.train.behavior import HonestBehavior  # noqa: E402
from node.train.step import TrainContext, TrainState, init_state  # noqa: E402
from node.train.trace import run_training  # noqa: E402
from verifier.jobs import dataset  # noqa: E402
from verifier.replay import verify_trace_segment  # noqa: E402


class TimedHonest(HonestBehavior):
    """Honest segments, timed: everything else in run_training is recording."""

    def __init__(self) -> None:
        self.segments: list[float] = []

    def run_segment(self, ctx: TrainContext, state: TrainState, segment_index: int,
                    start_step: int, k: int) -> tuple[TrainState, float]:
        t0 = time.perf_counter()
        try:
            return super().run_segment(ctx, state, segment_index, start_step, k)
        finally:
            self.segments.append(time.perf_counter() - t0)


def llama_100m(vocab: int, context: int, tiny: bool) -> dict[str, Any]:
    size = ({"hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
             "num_attention_heads": 4} if tiny else
            # 104.6M: 12 x 7.67M per layer + 2 x 8192 x 768 embeddings/head.
            {"hidden_size": 768, "intermediate_size": 2304, "num_hidden_layers": 12,
             "num_attention_heads": 12})
    return {"family": "hf_llama", "transformers_version": installed_transformers_version(),
            "vocab_size": max(vocab, 8192), "context": context, **size}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--k", type=int, default=2)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--tiny", action="store_true")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        ds = dataset("text", tmp)
        spec = parse_spec({
            "name": "bench-hf-llama", "seed": 1, "dataset_hash": ds.hash_hex,
            "model": llama_100m(len(ds.vocab), args.context, args.tiny),
            "optimizer": {"name": "adamw", "lr": 3e-4}, "batch_size": args.batch,
            "total_steps": args.steps, "checkpoint_interval": args.k,
            "resources": {"max_memory_mb": 65_536}})
        ctx = TrainContext.create(spec, ds, threads=args.threads)
        t_build = time.perf_counter()
        init_state(ctx)  # imports transformers' model code once, outside the timings
        build = time.perf_counter() - t_build
        out = Path(tmp) / "trace"
        behavior = TimedHonest()
        t0 = time.perf_counter()
        manifest = run_training(ctx, out, job_id=1, behavior=behavior)
        wall = time.perf_counter() - t0
        train = sum(behavior.segments)
        ckpt = max(p.stat().st_size for p in out.glob("ckpt-*.safetensors"))
        last = manifest.segment_count - 1
        t1 = time.perf_counter()
        verdict = verify_trace_segment(ctx, out, last)
        replay = time.perf_counter() - t1
        seg_train = behavior.segments[-1]
        result = {
            "bench": "hf", "family": "hf_llama", "params": spec.model.param_count(),
            "transformers": installed_transformers_version(), "threads": args.threads,
            "batch": args.batch, "context": args.context, "steps": args.steps, "k": args.k,
            "step_s": round(train / args.steps, 3),
            "tokens_per_s": round(args.steps * args.batch * args.context / train, 1),
            "first_build_s": round(build, 2), "run_wall_s": round(wall, 2),
            "trace_overhead_pct": round(100 * (wall - train) / train, 2),
            "checkpoint_bytes": ckpt,
            "replay_s": round(replay, 3), "segment_train_s": round(seg_train, 3),
            "replay_over_train": round(replay / seg_train, 3),
            "replay_passed": verdict.passed, "replay_ratio": verdict.ratio,
        }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
