"""Cost of trace recording (state hashing, checkpoints, Merkle tree, manifest).

Trains the example CNN and LM with ``run_training`` at the default k and at a
larger k, timing inside each run the honest segments (training) apart from
everything else (recording), so the load of a shared machine hits both sides
alike. Checkpoints are hashed and written on a writer thread that overlaps
training; its CPU time is measured separately. A plain ``train_step`` loop is
interleaved with every traced run as an end-to-end check (noisy when shared).

Per model, at the default k (medians over repetitions):
- ``overhead_pct``: wall time the run spends outside training, over training
  time (what recording costs the run, waiting for the writer included);
- ``overhead_train_thread_cpu_pct``: the same in CPU time of the training thread;
- ``overhead_total_cpu_pct``: all recording CPU, writer thread included (the
  cost if nothing overlapped, e.g. on a machine with one free core);
- ``end_to_end_wall_pct``: best traced run over best plain loop;
- ``checkpoint_bytes_per_step``, and the k for 2% overhead by a ``fixed + c/k``
  fit through the two measured k (null if the fixed part alone exceeds 2%).

Usage: python bench/trace_overhead.py [--reps 3] [--threads 1] [--keep-every 1]
(``--keep-every M``: sparse checkpoints, node.train.sparse; 1 keeps all, as before)
The last stdout line is that JSON.
"""

from __future__ import annotations

import argparse
import json
import math
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from node.datasets import pack_digits, pack_text, parse_dataset  # noqa: E402
from node.spec import JobSpec, load_spec, parse_spec  # noqa: E402
from node.train import trace  # noqa: E402
from node.train.behavior import HonestBehavior  # noqa: E402
from node.train.step import TrainContext, TrainState, init_state, train_step  # noqa: E402

JOBS = {  # example, total steps, k values (the first is the default)
    "cnn": ("cnn_digits", 400, (10, 50)),
    "lm": ("lm_text", 100, (10, 50)),
}


def spec_for(example: str, steps: int, k: int) -> JobSpec:
    d = load_spec(ROOT / "examples" / f"{example}.toml").model_dump(mode="json")
    d["total_steps"], d["checkpoint_interval"] = steps, k
    return parse_spec(d)


class CheckpointTimer:
    """Wraps the recorder's checkpoint writer (run on its writer thread) to
    measure that thread's CPU time for hashing, serialising and writing."""

    def __init__(self) -> None:
        self.cpu = 0.0
        self._inner = trace._write_checkpoint

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        t0 = time.thread_time()
        try:
            return self._inner(*args, **kwargs)
        finally:
            self.cpu += time.thread_time() - t0


class TimedHonest(HonestBehavior):
    """Honest segments, timed: everything else in run_training is recording."""

    def __init__(self) -> None:
        self.wall = self.cpu = 0.0

    def run_segment(self, ctx: TrainContext, state: TrainState, segment_index: int,
                    start_step: int, k: int) -> tuple[TrainState, float]:
        w, c = time.perf_counter(), time.thread_time()
        try:
            return super().run_segment(ctx, state, segment_index, start_step, k)
        finally:
            self.wall += time.perf_counter() - w
            self.cpu += time.thread_time() - c


def plain_wall(ctx: TrainContext) -> float:
    t0 = time.perf_counter()
    state = init_state(ctx)
    for step in range(1, ctx.spec.total_steps + 1):
        train_step(ctx, state, step)
    return time.perf_counter() - t0


def traced(ctx: TrainContext, out: Path, keep_every: int = 1) -> dict[str, float]:
    """Overheads measured inside one run (training vs the rest), so machine
    load affects numerator and denominator alike."""
    shutil.rmtree(out, ignore_errors=True)
    timer, behavior = CheckpointTimer(), TimedHonest()
    trace._write_checkpoint = timer  # type: ignore[assignment]
    try:
        w, c = time.perf_counter(), time.thread_time()
        trace.run_training(ctx, out, job_id=1, behavior=behavior, keep_every=keep_every)
        wall, cpu = time.perf_counter() - w, time.thread_time() - c
    finally:
        trace._write_checkpoint = timer._inner
    return {
        "wall_s": wall,
        "overhead_wall": (wall - behavior.wall) / behavior.wall,
        "overhead_train_thread_cpu": (cpu - behavior.cpu) / behavior.cpu,
        "overhead_total_cpu": (cpu - behavior.cpu + timer.cpu) / behavior.cpu,
        "bytes": float(sum(p.stat().st_size for p in out.glob("ckpt-*.safetensors"))),
    }


def k_for_2pct(ks: list[int], overheads: list[float]) -> int | None:
    # overhead(k) = fixed + c / k, fitted through the two measured points.
    (k1, o1), (k2, o2) = (ks[0], overheads[0]), (ks[-1], overheads[-1])
    c = max((o1 - o2) / (1 / k1 - 1 / k2), 0.0)
    fixed = o1 - c / k1
    if fixed >= 0.02:
        return None
    return max(1, math.ceil(c / (0.02 - fixed)))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--keep-every", type=int, default=1)
    args = ap.parse_args()

    data = {"digits": parse_dataset(pack_digits()), "text": parse_dataset(pack_text())}
    runs: dict[tuple[str, int], list[dict[str, float]]] = {}
    plains: dict[tuple[str, int], list[float]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        for rep in range(args.reps):
            for name, (example, steps, ks) in JOBS.items():
                for k in ks:
                    spec = spec_for(example, steps, k)
                    ds = data["text" if spec.model.family == "transformer_lm" else "digits"]
                    ctx = TrainContext.create(spec, ds, threads=args.threads)
                    order = ("plain", "traced") if rep % 2 == 0 else ("traced", "plain")
                    for mode in order:
                        if mode == "plain":
                            plains.setdefault((name, k), []).append(plain_wall(ctx))
                        else:
                            out = Path(tmp) / f"{name}-{k}"
                            runs.setdefault((name, k), []).append(
                                traced(ctx, out, args.keep_every))
                    r = runs[(name, k)][-1]
                    print(f"rep {rep} {name} k={k}: plain {plains[(name, k)][-1]:.2f}s, traced "
                          f"{r['wall_s']:.2f}s; recording: wall {100 * r['overhead_wall']:.2f}%"
                          f", train-thread cpu {100 * r['overhead_train_thread_cpu']:.2f}%, "
                          f"total cpu {100 * r['overhead_total_cpu']:.2f}%", flush=True)

    def med(name: str, k: int, key: str) -> float:
        return statistics.median(r[key] for r in runs[(name, k)])

    results: dict[str, Any] = {}
    for name, (_example, steps, ks) in JOBS.items():
        k0 = ks[0]
        by_k = {key: [med(name, k, key) for k in ks] for key in
                ("overhead_wall", "overhead_train_thread_cpu", "overhead_total_cpu")}
        results[name] = {
            "default_k": k0,
            "steps": steps,
            "overhead_pct": round(100 * by_k["overhead_wall"][0], 2),
            "overhead_train_thread_cpu_pct": round(100 * by_k["overhead_train_thread_cpu"][0], 2),
            "overhead_total_cpu_pct": round(100 * by_k["overhead_total_cpu"][0], 2),
            "end_to_end_wall_pct": round(100 * (min(r["wall_s"] for r in runs[(name, k0)])
                                                / min(plains[(name, k0)]) - 1), 2),
            "overhead_pct_by_k": {key.removeprefix("overhead_"): {
                str(k): round(100 * o, 2) for k, o in zip(ks, v, strict=True)}
                for key, v in by_k.items()},
            "checkpoint_bytes_per_step": round(runs[(name, k0)][0]["bytes"] / steps),
            "k_for_2pct": k_for_2pct(list(ks), by_k["overhead_wall"]),
            "k_for_2pct_total_cpu": k_for_2pct(list(ks), by_k["overhead_total_cpu"]),
        }
    print(json.dumps({"bench": "trace_overhead", "reps": args.reps, "threads": args.threads,
                      "keep_every": args.keep_every, "models": results}))


if __name__ == "__main__":
    main()
