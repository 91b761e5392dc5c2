"""Collaborative training (issue 13, DiLoCo) against one worker and data parallel.

On examples/collab_lm_text.toml (lm_text.toml's char LM: d_model 96,
2 layers, context 64, per-worker batch 16, AdamW lr 3e-3, dropout 0.1) on the
bundled text, with ``--workers`` N slots, ``--inner-steps`` H, ``--rounds`` R and
the outer Nesterov step (``--outer-lr`` 1.0, ``--outer-momentum`` 0.5 by default:
OpenDiLoCo's 0.7 / 0.9 measured above one worker alone at this short-run size, see
docs/protocol.md), all through node.train.diloco:

- ``solo``: slot 0 alone for H x R sequential steps at batch B (its shards, one
  AdamW state throughout);
- ``collab``: R rounds; each slot's inner run (H steps from theta_t, inner AdamW
  reset per round) and the outer step. Workers run one after another here, so
  the per-round wall time is reported both summed and as the slowest worker plus
  the outer step (what parallel workers would see);
- ``data_parallel``: one solver with an N x B batch (each step's batch is the N
  slots' batches of that step) for H x R steps: synchronous data parallel.

Verification share: one sub-job (round 0, slot 0) traced as the market sees it
(``k`` = the spec's inner checkpoint interval, ``--k``) and one segment verified
from that trace; the market samples a sub-job's final segment plus n of its other
S - 1 = H / k - 1 segments (n: the devnet's ``reserved_sample_count``), and the
committee's seats split that sample.

Eval loss: mean cross-entropy in eval mode over held-out windows (in no shard).
Bytes: a worker sends one fp32 delta per round; synchronous data parallel
all-reduces an fp32 gradient every step, i.e. H per round: sent per worker, that is
``H * P * 4`` sending it whole or ``H * 2 (N-1)/N * P * 4`` in a ring.

Calibration from the issue (N=4, H=50, R=20, plain loop): solo 1.503, collab 1.460,
data parallel x4 batch 1.361. Targets: collab below solo, and within 10% of data
parallel.

``--warm-start STEPS``: a warm-started job, as DiLoCo runs (it starts from a
pretrained model): theta_0 is its spec's ``init_weights`` file, one worker's
weights after STEPS steps from another seed, loaded as every node loads it
(node.train.init_weights); all three arms start from it.

Usage: python bench/collab.py [--quick] [--workers 4] [--inner-steps 50] [--rounds 20]
       [--warm-start 1000]
The last stdout line is the JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from devnet.params import DevnetParams  # noqa: E402
from node.datasets import Dataset, pack_text, parse_dataset  # noqa: E402
from node.demo_collab import warm_weights  # noqa: E402
from node.proof import sample_segments_with_final  # noqa: E402
from node.spec import (  # noqa: E402
    CollaborativeSpec,
    load_collaborative_spec,
    parse_collaborative_spec,
)
from node.train.diloco import initial_outer_state, outer_hash, outer_step  # noqa: E402
from node.train.init_weights import write_init_weights  # noqa: E402
from node.train.inner import Params, inner_run, model_params  # noqa: E402
from node.train.rounds import heldout_loss as eval_loss  # noqa: E402
from node.train.rounds import round_context, round_start_state  # noqa: E402
from node.train.rounds import sequential as run_sequential  # noqa: E402
from node.train.shards import (  # noqa: E402
    ShardContext,
    data_parallel_context,
    holdout_indices,
    worker_context,
)
from node.train.step import TrainState  # noqa: E402
from node.train.trace import run_training  # noqa: E402
from verifier.replay import verify_trace_segment  # noqa: E402


def make_spec(dataset_hash: str, workers: int, h: int, r: int, outer_lr: float = 1.0,
              outer_momentum: float = 0.5, schedule: str | None = None,
              min_lr_ratio: float = 0.0, k: int | None = None,
              seed: int | None = None, init_weights: str | None = None) -> CollaborativeSpec:
    """examples/collab_lm_text.toml at the given size (``k``: the inner checkpoint
    interval, the example's by default; ``seed``: the example's by default;
    ``init_weights``: a warm start's theta_0 file hash)."""
    d = load_collaborative_spec(ROOT / "examples" / "collab_lm_text.toml").model_dump(mode="json")
    if seed is not None:
        d["inner"]["seed"] = seed
    d["init_weights"] = init_weights
    k = k or d["inner"]["checkpoint_interval"]
    if h % k:
        raise SystemExit(f"--k {k} must divide the inner steps H = {h}")
    d["inner"].update(dataset_hash=dataset_hash, total_steps=h * r, checkpoint_interval=k)
    if schedule is not None:
        d["inner"]["schedule"] = {"kind": schedule, "warmup_steps": 0,
                                  "min_lr_ratio": min_lr_ratio}
    d["outer_optimizer"].update(lr=outer_lr, momentum=outer_momentum)  # the example's clip
    d.update(workers={"min": workers, "max": workers}, inner_steps=h, outer_rounds=r)
    return parse_collaborative_spec(d)


def sequential(ctx: ShardContext, theta_0: Params, steps: int) -> tuple[TrainState, float]:
    t0 = time.perf_counter()
    state = run_sequential(ctx, theta_0, steps)
    return state, time.perf_counter() - t0


def verification_share(spec: CollaborativeSpec, ds: Dataset, theta_0: Params,
                       threads: int) -> dict[str, Any]:
    """One sub-job (round 0, slot 0) traced as the market sees it, and one of its
    segments verified from the trace as a verifier does (load, hash, replay, compare).
    A sub-job's sample is its final segment plus ``reserved_sample_count`` of the
    other S - 1 (``sample_segments_with_final``); the committee's seats split it by
    position, so the committee replays the sample once in all."""
    params = DevnetParams()
    n, seats = params.market.reserved_sample_count, params.market.attestors_per_job
    ctx = round_context(spec, ds, 0, 0, threads=threads)
    with tempfile.TemporaryDirectory() as tmp:
        t0 = time.perf_counter()
        manifest = run_training(ctx, tmp, 1, initial=lambda: round_start_state(ctx, theta_0))
        traced_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        verdict = verify_trace_segment(ctx, tmp, 0, exact_first=True)  # the daemon's way
        verify_s = time.perf_counter() - t0
    assert verdict.passed, verdict.reason
    segments = manifest.segment_count
    sampled = len(sample_segments_with_final(bytes(32), segments, n))  # its size: any seed
    per_segment = verify_s / traced_s
    return {"segments_per_sub_job": segments, "reserved_sample_count": n,
            "sampled_per_sub_job": sampled, "committee_seats": seats,
            "sub_job_traced_s": round(traced_s, 2), "verify_segment_s": round(verify_s, 2),
            "share_committee_pct": round(100 * sampled * per_segment, 1),
            "share_busiest_seat_pct": round(100 * -(-sampled // seats) * per_segment, 1)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="H=10, R=3: a smoke run")
    ap.add_argument("--workers", type=int, default=4)
    ap.add_argument("--inner-steps", type=int, default=50)
    ap.add_argument("--rounds", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--outer-lr", type=float, default=1.0)
    ap.add_argument("--outer-momentum", type=float, default=0.5,
                    help="0 with --outer-lr 1 is plain averaging of the workers' weights")
    ap.add_argument("--schedule", choices=["constant", "cosine"], default=None)
    ap.add_argument("--min-lr-ratio", type=float, default=0.0)
    ap.add_argument("--k", type=int, default=None,
                    help="inner checkpoint interval (steps per segment); the example's by default")
    ap.add_argument("--warm-start", type=int, default=0, metavar="STEPS",
                    help="a warm-started job: theta_0 (its spec's init_weights file) is one "
                         "worker's weights after STEPS steps (other seed, other batches); "
                         "all three arms start from it")
    args = ap.parse_args()
    n, h, r = args.workers, args.inner_steps, args.rounds
    if args.quick:
        h, r = 10, 3

    started = time.perf_counter()
    ds = parse_dataset(pack_text())
    init, digest = None, None
    if args.warm_start:  # a warm-started job, as the network runs one: its spec names the file
        init = Path(tempfile.mkdtemp(prefix="polnet-bench-")) / "init-weights.safetensors"
        pre = make_spec(ds.hash_hex, n, h, r, args.outer_lr, args.outer_momentum,
                        args.schedule, args.min_lr_ratio, args.k)
        digest = write_init_weights(warm_weights(pre, ds, args.warm_start,
                                                 threads=args.threads), init)
    spec = make_spec(ds.hash_hex, n, h, r, args.outer_lr, args.outer_momentum, args.schedule,
                     args.min_lr_ratio, args.k, init_weights=digest)
    ctxs = [worker_context(spec, ds, s, threads=args.threads) for s in range(n)]
    held = holdout_indices(spec, ctxs[0].num_samples)
    theta_0 = initial_outer_state(spec, init).theta  # the job's theta_0, m_0 = 0
    if args.warm_start:
        print(f"warm start: {args.warm_start} steps, eval "
              f"{eval_loss(ctxs[0], theta_0, held):.4f}", flush=True)
    params = sum(t.numel() for t in theta_0.values())

    solo_state, solo_wall = sequential(ctxs[0], theta_0, h * r)
    solo = eval_loss(ctxs[0], model_params(solo_state), held)
    print(f"solo: {h * r} steps at batch {spec.inner.batch_size}: eval {solo:.4f} "
          f"({solo_wall:.1f}s)", flush=True)

    dp_ctx = data_parallel_context(spec, ds, range(n), threads=args.threads)
    dp_state, dp_wall = sequential(dp_ctx, theta_0, h * r)
    dp = eval_loss(ctxs[0], model_params(dp_state), held)
    print(f"data parallel: {h * r} steps at batch {dp_ctx.spec.batch_size}: eval {dp:.4f} "
          f"({dp_wall:.1f}s)", flush=True)

    state = initial_outer_state(spec, init)
    curve: list[float] = []
    inner_walls: list[float] = []
    round_seq, round_par, outer_walls = [], [], []
    for t in range(r):
        walls, deltas = [], {}
        for ctx in ctxs:
            w = time.perf_counter()
            run = inner_run(ctx, state.theta, t)
            walls.append(time.perf_counter() - w)
            deltas[run.slot] = run.delta
        w = time.perf_counter()
        state = outer_step(state, deltas, spec.outer_optimizer)
        outer_hash(state)  # what the round commits: part of its cost
        outer_walls.append(time.perf_counter() - w)
        inner_walls += walls
        round_seq.append(sum(walls) + outer_walls[-1])
        round_par.append(max(walls) + outer_walls[-1])
        curve.append(round(eval_loss(ctxs[0], state.theta, held), 4))
        print(f"round {t}: eval {curve[-1]:.4f}, inner runs {min(walls):.1f}..{max(walls):.1f}s,"
              f" outer step + hash {outer_walls[-1] * 1e3:.0f} ms", flush=True)
    collab = curve[-1]
    verification = verification_share(spec, ds, theta_0, args.threads)
    print(f"verification: {verification}", flush=True)

    delta_bytes = params * 4
    whole = h * params * 4
    ring = round(h * 2 * (n - 1) / n * params * 4)
    result: dict[str, Any] = {
        "bench": "collab", "quick": args.quick, "threads": args.threads,
        "warm_start_steps": args.warm_start, "init_weights": digest,
        "model": {**spec.inner.model.model_dump(mode="json"), "params": params},
        "workers": n, "inner_steps": h, "rounds": r, "batch_per_worker": spec.inner.batch_size,
        "inner_optimizer": "adamw lr 3e-3, state reset per round",
        "outer_optimizer": spec.outer_optimizer.model_dump(mode="json"),
        "inner_schedule": spec.inner.schedule.model_dump(mode="json"),
        "heldout_windows": spec.holdout_samples, "spec_hash": spec.spec_hash_hex(),
        "eval_loss": {"solo": round(solo, 4), "collab": collab, "data_parallel": round(dp, 4)},
        "collab_eval_by_round": curve,
        "targets": {"collab_below_solo": collab < solo,
                    "collab_within_10pct_of_data_parallel": collab <= 1.10 * dp,
                    "collab_over_data_parallel": round(collab / dp, 4)},
        "verification_share_of_training": verification,
        "bytes_per_worker_per_round": {"delta": delta_bytes, "allreduce_whole_grad": whole,
                                       "allreduce_ring": ring,
                                       "ratio_whole": round(whole / delta_bytes, 2),
                                       "ratio_ring": round(ring / delta_bytes, 2)},
        "wall_s": {"round_sequential_median": round(statistics.median(round_seq), 2),
                   "round_parallel_median": round(statistics.median(round_par), 2),
                   "inner_run_median": round(statistics.median(inner_walls), 2),
                   "outer_step_and_hash_ms_median": round(1e3 * statistics.median(outer_walls),
                                                          1),
                   "solo_total": round(solo_wall, 1), "data_parallel_total": round(dp_wall, 1),
                   "bench_total": round(time.perf_counter() - started, 1)},
        "calibration_issue_13": {"N": 4, "H": 50, "R": 20, "solo": 1.503, "collab": 1.460,
                                 "data_parallel": 1.361},
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
