"""Verification cost, detection rate and honest/cheat margins for the CNN and the LM.

For each job:
* cost: a replay step (start checkpoint load + hash + proof + replay + the end
  leaf's hash: an honest replay is bitwise equal, so the daemon never loads the
  end state; per step) vs a training step, both timed in this run; the verification share
  for a job of SEGMENTS segments with n=44 samples (f=10% at 99%) is
  44 * replay / (SEGMENTS * train), and at the market's derived count
  (``verify_pct_market_n``: devnet.params.SAMPLE_COUNT, node.incentives);
* detection: one lazy trace (f=0.1) of DET_SEGMENTS segments, every segment
  judged once, then many sampling seeds through node.proof.sample_segments:
  measured rate vs 1-(1-f)^n;
* false flags: the whole drift matrix (subprocess configs included) on two
  segments; smallest cheat ratio per cheat over the largest honest ratio.
The last stdout line is JSON.
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
import time
from pathlib import Path

from devnet.params import SAMPLE_COUNT
from node.behaviors import make_behavior
from node.behaviors.spoof import LazyFraction
from node.proof import sample_segments, samples_for_detection
from node.train.step import init_state, train_step
from node.train.trace import run_training
from verifier.calibrate import cheat_ratios
from verifier.drift import honest_starts, measure
from verifier.jobs import dataset_path, job
from verifier.replay import verify_trace_segment

SEGMENTS = 2000          # assumed job size for the cost share: T = SEGMENTS * k
K = 20
DET_SEGMENTS, DET_K = 300, 4
SEEDS = 2000
F = 0.1


def cost(kind: str, cache: Path, tmp: Path) -> dict[str, float]:
    ctx = job(kind, cache, k=K, total_steps=4 * K)
    state = init_state(ctx)
    t0 = time.perf_counter()
    for s in range(1, 4 * K + 1):
        train_step(ctx, state, s)
    train = (time.perf_counter() - t0) / (4 * K)
    run_training(ctx, tmp / f"{kind}-cost", job_id=1)
    t0 = time.perf_counter()
    for seg in range(4):
        assert verify_trace_segment(ctx, tmp / f"{kind}-cost", seg, exact_first=True).passed
    replay = (time.perf_counter() - t0) / (4 * K)
    n = samples_for_detection(0.1, 0.99)
    return {"train_step_ms": train * 1e3, "replay_step_ms": replay * 1e3,
            "replay_over_train": replay / train,
            "verify_pct": 100 * n * replay / (SEGMENTS * train), "n": n,
            "verify_pct_market_n": 100 * SAMPLE_COUNT * replay / (SEGMENTS * train),
            "market_n": SAMPLE_COUNT,
            "segments_for_5pct": n * replay / train / 0.05}


def detection(kind: str, cache: Path, tmp: Path) -> dict[str, float]:
    ctx = job(kind, cache, k=DET_K, total_steps=DET_SEGMENTS * DET_K)
    lazy = LazyFraction(F, mode="skip", salt=1)
    out = tmp / f"{kind}-lazy"
    run_training(ctx, out, job_id=2, behavior=lazy)
    failed = {s for s in range(DET_SEGMENTS) if not verify_trace_segment(ctx, out, s).passed}
    cheated = {s for s in range(DET_SEGMENTS) if lazy.cheats_on(s)}
    n = samples_for_detection(F, 0.99)
    hits = sum(bool(failed & set(sample_segments(hashlib.sha256(str(i).encode()).digest(),
                                                 DET_SEGMENTS, n))) for i in range(SEEDS))
    f_actual = len(cheated) / DET_SEGMENTS
    return {"lazy_fraction": f_actual, "flagged_equals_cheated": failed == cheated,
            "detection_measured": hits / SEEDS, "detection_formula": 1 - (1 - f_actual) ** n}


def margins(kind: str, cache: Path) -> dict[str, object]:
    ctx = job(kind, cache, k=K, total_steps=4 * K)
    m = measure(ctx, kind, [0, 2], dataset_path("digits" if kind == "cnn" else "text", cache))
    honest = m.max_of("ratio")
    start = honest_starts(ctx, [2])[2]
    cheats = cheat_ratios(ctx, start, 2)
    lazy_spoof = make_behavior("lazy:1.0,mode=spoof")  # sanity: registered and parseable
    assert lazy_spoof.name == "lazy"
    flags = [f"{r.config}@{r.segment}" for r in m.rows if not r.passed]
    return {"honest_rows": len(m.rows), "false_flags": len(flags), "false_flag_rows": flags,
            "honest_max_ratio": honest,
            "honest_max_ratio_excl_flags": max((r.ratio for r in m.rows if r.passed),
                                               default=0.0),
            "cheat_over_honest": {c: r / max(honest, 1e-30) for c, r in cheats.items()},
            "cheat_ratio": cheats}


def main() -> None:
    result: dict[str, object] = {"assumed_segments": SEGMENTS, "k": K,
                                 "det_segments": DET_SEGMENTS, "det_k": DET_K, "seeds": SEEDS}
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        for kind in ("cnn", "lm"):
            t0 = time.perf_counter()
            r = {**cost(kind, tmp, tmp), **detection(kind, tmp, tmp), **margins(kind, tmp)}
            r["bench_seconds"] = time.perf_counter() - t0
            print(kind, json.dumps(r, default=float), file=sys.stderr)
            result[kind] = r
    print(json.dumps(result, default=float, sort_keys=True))


if __name__ == "__main__":
    main()
