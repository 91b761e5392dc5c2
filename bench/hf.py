"""A ~100M-parameter Llama-configuration job (node.spec_hf) on the CPU: step time,
trace overhead, and one segment's replay against its training time.

Trains ``--steps`` steps (segments of ``--k``) of an ``hf_llama`` model on the
bundled char corpus with ``run_training`` (S_0 and every leaf hashed, checkpoints
written), timing the honest segments inside the run apart from everything else
(recording: hashing, checkpoint files, Merkle tree), as bench/trace_overhead.py
does. Then the verifier replays the last segment from its committed start
(``verify_trace_segment``: load, replay, compare under the tolerance) and the
replay's wall time is set against that segment's training time.

The run's own overhead is measured at the ``--k`` and ``--keep-every`` given; on a
slow CPU a run long enough for a <= 2 % target (hundreds of 100M-parameter steps)
does not fit a bench, so the pieces of recording are also timed on this run's own
state (a leaf hash from the live buffers; a kept checkpoint's copy, hash and
fsynced write) and the overhead at longer segments is derived from them, counting
the background writer's work in full as if it ran on the training cores (the
worst case on a machine whose cores all train).

Figures (last stdout line, JSON):
- ``params``, ``step_s`` (mean honest step), ``tokens_per_s``;
- ``trace_overhead_pct``: wall outside training over training time (gross: S_0's
  build counted in); ``s0_build_s``: S_0 built once more, warm;
  ``recording_overhead_pct``: the same without S_0's build, which an untraced run
  pays too (the figure the <= 2 % target is for);
- ``checkpoint_bytes``: one checkpoint file (weights + AdamW state);
- ``replay_s``, ``segment_train_s``, ``replay_over_train``; ``replay_passed``;
- ``verifier_fetch``: an hf_llama job of this size on a sharded corpus (``--fetch-mb``
  of CPython's own text, exact shards): the bytes a verifier's host fetched for its
  sampled segments against the dataset's bytes, and the target (the sampled share plus
  the manifest);
- ``leaf_hash_s``, ``kept_copy_s``, ``kept_write_s`` (hash + file + fsync);
  ``derived_overhead_pct``: {"k=K,M=M": pct} and ``k_for_2pct_at_M10``: the
  shortest segment (steps) whose derived overhead is <= 2 % keeping every 10th leaf.

Usage: python bench/hf.py [--steps 4] [--k 2] [--keep-every 1] [--batch 1]
[--context 128] [--threads N] [--tiny] [--fetch-mb 4]
(--tiny: a 1M model, to check the script quickly)
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

from bench.shards import measure_fetch  # noqa: E402
from node.proof import state_hash  # noqa: E402
from node.spec import parse_spec  # noqa: E402
from node.spec_hf import installed_transformers_version  # noqa: E402
from node.train.behavior import HonestBehavior  # noqa: E402
from node.train.step import (  # noqa: E402
    TrainContext,
    TrainState,
    init_state,
    state_tensors,
    state_views,
)
from node.train.trace import run_training, write_tensor_file  # noqa: E402
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


def recording_costs(ctx: TrainContext, out: Path, reps: int = 2) -> dict[str, float]:
    """Each piece of recording, timed on a state of the run's spec (its sizes, not its
    values, set the cost; best of ``reps``)."""
    state = init_state(ctx)
    best: dict[str, float] = {}

    def timed(key: str, fn: Any) -> Any:
        t0 = time.perf_counter()
        out_ = fn()
        best[key] = min(best.get(key, float("inf")), time.perf_counter() - t0)
        return out_

    copy = state_tensors(state)
    for i in range(reps):
        timed("leaf_hash_s", lambda: state_hash(state_views(state)))
        timed("kept_copy_s", lambda: state_tensors(state, copy))  # reused pages, as the writer

        def write(i: int = i) -> None:
            state_hash(copy)
            path = out / f"bench-{i}.safetensors"
            write_tensor_file(path, copy, {})
            with open(path, "rb") as f:
                os.fsync(f.fileno())
            path.unlink()
        timed("kept_write_s", write)
    return {k: round(v, 3) for k, v in best.items()}


def derived_pct(p: dict[str, float], step_s: float, k: int, m: int) -> float:
    """Recording over training for segments of ``k`` steps keeping every ``m``-th leaf:
    m - 1 inline leaf hashes and one kept checkpoint (copy, hash, write) per m * k steps."""
    rec = (m - 1) * p["leaf_hash_s"] + p["kept_copy_s"] + p["kept_write_s"]
    return round(100 * rec / (m * k * step_s), 2)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--k", type=int, default=2)
    ap.add_argument("--keep-every", type=int, default=1)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--context", type=int, default=128)
    ap.add_argument("--threads", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--fetch-mb", type=float, default=4.0,
                    help="corpus MB packed into shards for the verifier-fetch figure (0: skip)")
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
        # S_0's build, warm: an untraced run builds its start model too, so it is
        # not recording (run_training builds it inside the timed wall).
        t_build = time.perf_counter()
        init_state(ctx)
        s0_build = time.perf_counter() - t_build
        out = Path(tmp) / "trace"
        behavior = TimedHonest()
        t0 = time.perf_counter()
        manifest = run_training(ctx, out, job_id=1, behavior=behavior,
                                keep_every=args.keep_every)
        wall = time.perf_counter() - t0
        train = sum(behavior.segments)
        ckpt = max(p.stat().st_size for p in out.glob("ckpt-*.safetensors"))
        last = manifest.segment_count - 1
        t1 = time.perf_counter()
        verdict = verify_trace_segment(ctx, out, last)
        replay = time.perf_counter() - t1
        seg_train = behavior.segments[-1]
        pieces = recording_costs(ctx, out)
        step_s = train / args.steps
        result = {
            "bench": "hf", "family": "hf_llama", "params": spec.model.param_count(),
            "transformers": installed_transformers_version(), "threads": args.threads,
            "batch": args.batch, "context": args.context, "steps": args.steps, "k": args.k,
            "step_s": round(train / args.steps, 3),
            "tokens_per_s": round(args.steps * args.batch * args.context / train, 1),
            "first_build_s": round(build, 2), "run_wall_s": round(wall, 2),
            "trace_overhead_pct": round(100 * (wall - train) / train, 2),
            "s0_build_s": round(s0_build, 2),
            "recording_overhead_pct": round(100 * (wall - train - s0_build) / train, 2),
            "checkpoint_bytes": ckpt,
            "replay_s": round(replay, 3), "segment_train_s": round(seg_train, 3),
            "replay_over_train": round(replay / seg_train, 3),
            "replay_passed": verdict.passed, "replay_ratio": verdict.ratio,
            "keep_every": args.keep_every, **pieces,
            "derived_overhead_pct": {f"k={k},M={m}": derived_pct(pieces, step_s, k, m)
                                     for k in (10, 20, 50) for m in (1, 10)},
            "k_for_2pct_at_M10": next(k for k in range(1, 10_001)
                                      if derived_pct(pieces, step_s, k, 10) <= 2.0),
        }
    if args.fetch_mb > 0:
        # The same family's job on a sharded corpus (exact shards: a segment's sequences
        # in one shard): the bytes a verifier's host fetches for its sampled segments.
        with tempfile.TemporaryDirectory() as tmp:
            f = measure_fetch(Path(tmp), mb=args.fetch_mb, seq_len=args.context + 1,
                              exact_shards=True, batch_size=8, k=8,
                              model=llama_100m(2048, args.context, args.tiny))
        result["verifier_fetch"] = {key: f[key] for key in (
            "family", "dataset_bytes", "fetched_bytes", "fetched_share", "sampled_share",
            "target_share", "within_target", "shards", "shards_fetched", "segments",
            "segments_sampled")}
    print(json.dumps(result))


if __name__ == "__main__":
    main()
