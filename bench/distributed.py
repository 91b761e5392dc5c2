"""A job trained by 1, 2 and 4 rank processes (node.train.distributed, gloo on CPU).

For the ~25M-parameter LM of bench/scale.py (few steps: this machine is small and
shared), at each world size:
- ``steps_per_s``: steps over the time rank 0 spent inside the ranks' steps;
- ``trace_overhead_pct``: rank 0's run time outside those steps (state broadcast,
  hashing, checkpoint writes, manifest) over the time inside them; ``_no_sync``:
  the same without the run's one state broadcast; ``recording_s_per_segment``;
  with few steps and k small these are far above a real job's (k = 10..50);
  ``recording_overhead_pct``: the no-sync figure less S_0's build (``s0_build_s``, timed
  here on one thread as a rank builds it), which an untraced run pays too: what the
  trace itself costs, the figure the <= 2 % target is for;
- ``max_replay_ratio``: the largest ratio (|R - C| / replayed update) of any segment
  of that trace replayed by a 1-rank verifier (no micro-batches).
Then the same ratio for the test cheats of rank 1 at world size 2 ("skip": zeros
for its share; "stale": its previous gradient every other step), against the spec's
rho: honest must sit below rho, every cheat above.

Usage: python bench/distributed.py [--steps 4] [--k 2] [--worlds 1,2,4] [--model lm25m|lm]
       [--mode ddp|fsdp] [--keep-every 1] [--replay|--no-replay] [--cheats|--no-cheats]
(fsdp: world sizes > 1 shard; the cheats stay ddp. A run long enough for the overhead
target, e.g. --steps 200 --k 50 --keep-every 4 --no-replay --no-cheats, leaves the replay
and cheat rows to a short run.)
The last stdout line is the JSON (also written to bench/results/distributed_cpu.json).
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from node.datasets import load_dataset  # noqa: E402
from node.spec import JobSpec, load_spec, parse_spec  # noqa: E402
from node.train.distributed import launch  # noqa: E402
from node.train.step import TrainContext, init_state  # noqa: E402
from verifier.jobs import dataset_path  # noqa: E402
from verifier.replay import verify_trace_segment  # noqa: E402

LM25M = {"d_model": 512, "n_heads": 8, "n_layers": 8, "d_ff": 2048}  # bench/scale.py


def spec_for(model: str, steps: int, k: int, data_hash: str) -> JobSpec:
    d = load_spec(ROOT / "examples" / "lm_text.toml").model_dump(mode="json")
    d["dataset_hash"] = data_hash
    if model == "lm25m":
        d["model"].update(LM25M)
        d["batch_size"] = 4
        d["resources"]["max_memory_mb"] = 8192
    d["total_steps"], d["checkpoint_interval"] = steps, k
    return parse_spec(d)


def run(spec_file: Path, data: Path, out: Path, world: int, cheat: str | None = None,
        mode: str = "ddp", keep_every: int = 1) -> dict[str, Any]:
    t0 = time.perf_counter()
    launch(spec_file, data, out, job_id=1, world_size=world, cheat=cheat,  # type: ignore[arg-type]
           keep_every=keep_every, mode=mode)  # type: ignore[arg-type]
    wall = time.perf_counter() - t0
    timing = json.loads((out.parent / f"{out.name}.ranks" / "timing.json").read_text())
    return {"wall_s": round(wall, 2), **timing}


def max_ratio(ctx: TrainContext, trace: Path) -> tuple[float, bool]:
    verdicts = [verify_trace_segment(ctx, trace, s) for s in range(ctx.spec.segment_count)]
    return max(v.ratio for v in verdicts), all(v.passed for v in verdicts)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--k", type=int, default=2)
    ap.add_argument("--worlds", default="1,2,4")
    ap.add_argument("--model", choices=("lm25m", "lm"), default="lm25m")
    ap.add_argument("--mode", choices=("ddp", "fsdp"), default="ddp",
                    help="fsdp: leaves hashed from shards, kept ones DCP checkpoints")
    ap.add_argument("--keep-every", type=int, default=1, help="sparse checkpoints (M)")
    ap.add_argument("--replay", action=argparse.BooleanOptionalAction, default=True,
                    help="a 1-rank verifier replays every segment (needs --keep-every 1)")
    ap.add_argument("--cheats", action=argparse.BooleanOptionalAction, default=True,
                    help="the cheat rows (two more 2-rank runs)")
    args = ap.parse_args()
    worlds = [int(w) for w in args.worlds.split(",")]
    tmp = Path(tempfile.mkdtemp(prefix="polnet-dist-"))
    data = dataset_path("text", tmp)
    ds = load_dataset(data)
    spec = spec_for(args.model, args.steps, args.k, ds.hash_hex)
    spec_file = tmp / "spec.json"
    spec_file.write_bytes(spec.canonical_json())
    ctx = TrainContext.create(spec, ds)
    torch.set_num_threads(1)  # as a rank (threads_per_rank)
    init_state(ctx)  # warm: imports and allocator
    t_build = time.perf_counter()
    init_state(ctx)
    s0_build = time.perf_counter() - t_build
    rho = spec.tolerance.rho
    out: dict[str, Any] = {"model": args.model, "mode": args.mode,
                           "params": spec.model.param_count(),
                           "steps": args.steps, "k": args.k, "keep_every": args.keep_every,
                           "replayed": args.replay, "rho": rho, "backend": "gloo",
                           "threads_per_rank": 1, "s0_build_s": round(s0_build, 3),
                           "worlds": {}}
    for w in worlds:
        t = run(spec_file, data, tmp / f"w{w}", w, mode=args.mode if w > 1 else "ddp",
                keep_every=args.keep_every)
        # An unkept leaf of a multi-rank trace regenerates bitwise only with the ranks'
        # micro-batches: a sparse run's replay rows come from a keep-every-1 run.
        ratio, passed = max_ratio(ctx, tmp / f"w{w}") if args.replay else (None, None)
        out["worlds"][str(w)] = {
            "steps_per_s": round(args.steps / t["train_s"], 4),
            "trace_overhead_pct": round(100 * (t["run_s"] - t["train_s"]) / t["train_s"], 1),
            # Without the run's one state broadcast (a fixed cost, not per step):
            "trace_overhead_pct_no_sync": round(
                100 * (t["run_s"] - t["train_s"] - t.get("sync_s", 0.0)) / t["train_s"], 1),
            "recording_overhead_pct": round(
                100 * (t["run_s"] - t["train_s"] - t.get("sync_s", 0.0) - s0_build)
                / t["train_s"], 2),
            "recording_s_per_segment": round(
                (t["run_s"] - t["train_s"] - t.get("sync_s", 0.0)) / t["segments"], 3),
            "launch_wall_s": t["wall_s"], "max_replay_ratio": ratio, "all_passed": passed,
            # fsdp: what rank 0 held of its peers' shards to hash a leaf, and the state
            **({"leaf_largest_bytes": t["leaf_largest_bytes"], "state_bytes": t["state_bytes"],
                "leaf_save_s": round(t["leaf_save_s"], 3)} if args.mode == "fsdp" else {})}
        print(json.dumps({f"world_{w}": out["worlds"][str(w)]}), flush=True)
    cheats: dict[str, Any] = {}
    for cheat in ("skip", "stale") if args.cheats else ():
        run(spec_file, data, tmp / f"cheat-{cheat}", 2, cheat)
        verdicts = [verify_trace_segment(ctx, tmp / f"cheat-{cheat}", s)
                    for s in range(spec.segment_count)]
        cheats[cheat] = {"min_ratio": min(v.ratio for v in verdicts),
                         "all_failed": not any(v.passed for v in verdicts)}
        print(json.dumps({f"cheat_{cheat}": cheats[cheat]}), flush=True)
    honest = max((v["max_replay_ratio"] for v in out["worlds"].values()
                  if v["max_replay_ratio"] is not None), default=None)
    cheat_min = min((c["min_ratio"] for c in cheats.values()), default=None)
    out["cheats_world_2"] = cheats
    out["largest_honest_ratio"] = honest
    out["honest_margin_to_rho"] = rho / honest if honest else None
    out["smallest_cheat_ratio"] = cheat_min
    out["cheat_over_honest"] = cheat_min / honest if honest and cheat_min else None
    out["nccl"] = "not run (no GPU on this machine)"
    shutil.rmtree(tmp, ignore_errors=True)  # a 25M state is ~300 MB a checkpoint
    line = json.dumps(out, sort_keys=True)
    results = ROOT / "bench" / "results"
    results.mkdir(exist_ok=True)
    suffix = ("" if args.mode == "ddp" else f"_{args.mode}") + \
        ("" if args.cheats else f"_s{args.steps}_k{args.k}_m{args.keep_every}")
    (results / f"distributed_cpu_{args.model}{suffix}.json").write_text(line + "\n")
    print(line)


if __name__ == "__main__":
    main()
