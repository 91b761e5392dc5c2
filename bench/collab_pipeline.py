"""Worker utilisation of a collaborative job, sequential (D = 0) against pipelined (D = 2)
rounds (issue 35), on a real network: anvil with the CollabMarket, `polnet` daemons as OS
processes (two workers on the job's two slots, three verifiers, the serving submitter),
loopback libp2p, the demo's small char LM (node.demo_collab).

First one inner run (round 0, slot 0: ``run_training`` of the sub-job, the solver's own
call) is timed in this process: T. Then, for each depth D and each W in ``--windows``,
one honest job whose market verification window and CollabMarket outer window are both
``ceil(W x T)`` seconds runs to its end, and is measured:

- inner compute: the sum of every sub-job's training time as its solver logged it
  (``trace_published train_s``, the ``run_training`` call itself);
- job wall time: from the first observation of round 0 running to that of the job
  finished (polled every ``POLL_S``), wall clock;
- utilisation = the accepted runs' inner compute / (job wall time x workers): the
  share of its time the average worker spent on training that counted (``busy``: all
  runs, also those that missed their deadline or were rolled back);
- the training span (from round 0's start to the last sub-job's commit, the solvers'
  log stamps) and the tail after it (the last round's verification and outer windows,
  one per job whatever D is: at W = 3 inner runs it alone caps a whole job of R rounds
  at R / (R + 3)), and ``utilisation_in_span``: the accepted compute over the span.

Usage: python bench/collab_pipeline.py [--quick] [--rounds 4] [--inner-steps 1000]
       [--windows 3 6] [--depths 0 2]
``--quick``: 3 rounds. The last stdout line is a JSON object, its ``utilisation`` the
four figures ("D0_W3", ...). The machine is shared (its cores with the daemons, the
verifiers' replays and anvil): T is measured once, on it, before the jobs.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from devnet.localnet import LocalNet  # noqa: E402
from node.datasets import load_dataset, pack_text, write_dataset  # noqa: E402
from node.demo_collab import collab_demo_params, collab_spec_dict  # noqa: E402
from node.spec import parse_collaborative_spec  # noqa: E402

SUBMITTER, VERIFIERS = 1, (4, 5, 6)
WORKERS = {"worker-1": 2, "worker-2": 3}
POLL_S = 0.5
ROUND_IN_INNER_RUNS = 20  # the round deadline, in inner runs (measured in-process)
JOB_TIMEOUT_S = 1800.0


def write_inputs(data: Path, rounds: int, inner_steps: int) -> tuple[Path, Path, dict[str, Any]]:
    """The demo's char LM on two slots, both needed each round; H = ``inner_steps`` in
    two segments (the demo's 20 steps take a tenth of a second: the windows would be
    all there is)."""
    data.mkdir(parents=True, exist_ok=True)
    text = data / "text.safetensors"
    h = write_dataset(pack_text(), text)
    d = collab_spec_dict(h, rounds, inner_steps=inner_steps, k=inner_steps // 2)
    d["workers"] = {"min": len(WORKERS), "max": len(WORKERS)}
    spec = data / "collab.json"
    spec.write_text(json.dumps(d))
    return spec, text, d


def time_inner_run(d: dict[str, Any], text: Path) -> float:
    """Seconds of one inner run (round 0, slot 0) as a solver trains it: a warm-up run,
    then the median of three."""
    from node.train.diloco import initial_outer_state
    from node.train.rounds import round_context, round_start_state
    from node.train.trace import run_training

    spec = parse_collaborative_spec(d)
    ds = load_dataset(text, spec.inner.dataset_hash)
    ctx = round_context(spec, ds, 0, 0, threads=1)
    theta = initial_outer_state(spec).theta
    walls = []
    for _ in range(4):
        with tempfile.TemporaryDirectory() as tmp:
            t0 = time.perf_counter()
            run_training(ctx, tmp, 1, initial=lambda: round_start_state(ctx, theta))
            walls.append(time.perf_counter() - t0)
    return sorted(walls[1:])[1]


def train_seconds(net: LocalNet, sub_jobs: set[int]) -> dict[int, float]:
    """Each sub-job's training time, from its solver's log."""
    out: dict[int, float] = {}
    for name in WORKERS:
        for line in (net.home / "logs" / f"{name}.log").read_text(errors="replace").splitlines():
            if "trace_published" not in line or "train_s=" not in line:
                continue
            fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
            jid = int(fields.get("job", "0"))
            if jid in sub_jobs:
                out[jid] = float(fields["train_s"])
    return out


def last_commit_at(net: LocalNet, sub_jobs: set[int]) -> float:
    """Wall-clock time (epoch s) of the last sub-job commit, from the solvers' logs: the
    end of the job's training span (what follows is the last round's windows)."""
    last = 0.0
    for name in WORKERS:
        for line in (net.home / "logs" / f"{name}.log").read_text(errors="replace").splitlines():
            if "result_committed" not in line:
                continue
            fields = dict(f.split("=", 1) for f in line.split() if "=" in f)
            if int(fields.get("job", "0")) in sub_jobs:
                stamp = line.split()[0].rstrip("Z")
                last = max(last, datetime.fromisoformat(stamp).replace(
                    tzinfo=UTC).timestamp())
    return last


def run_job(tmp: Path, spec: Path, text: Path, depth: int, window: int,
            round_duration: int) -> dict[str, Any]:
    params = collab_demo_params().model_dump()
    params["market"]["verification_window"] = window
    params["collab"]["outer_window"] = window
    from devnet.params import DevnetParams

    with LocalNet(tmp / "net", DevnetParams.model_validate(params)) as net:
        c = net.c
        for i, v in enumerate(VERIFIERS, start=1):
            net.start_verifier(f"v{i}", v)
        for name, acct in WORKERS.items():
            net.start_solver(name, acct)
        cid = net.submit_collab("sub", SUBMITTER, spec, text, reward=60, budget=6,
                                round_duration=round_duration, pipeline_depth=depth)
        t_start: float | None = None
        t_start_epoch = 0.0
        end = time.monotonic() + JOB_TIMEOUT_S
        status = ""
        while time.monotonic() < end:
            job = c.collab.get_collab(cid)
            status = job.status.name
            if t_start is None and job.phase.name != "IDLE":
                t_start, t_start_epoch = time.monotonic(), time.time()
            if status in ("FINISHED", "FAILED"):
                break
            net.check_alive()
            time.sleep(POLL_S)
        wall = time.monotonic() - (t_start or end)
        if status != "FINISHED":
            raise SystemExit(f"D={depth} W={window}s: the job ended {status}; logs {net.home}")
        evs = [e for e in net.events() if e.contract == "CollabMarket"
               and e.args.get("jobId") == cid]
        subs = {int(i) for e in evs if e.event == "RoundStarted" for i in e.args["subJobs"] if i}
        started: dict[int, int] = {}  # each round's first start
        for e in evs:
            if e.event == "RoundStarted":
                started.setdefault(int(e.args["round"]), e.block_number)
        useful = {int(e.args["marketJobId"]) for e in evs if e.event == "SubJobAccepted"}
        accepted = {int(e.args["round"]): e.block_number for e in evs
                    if e.event == "OuterAccepted"}
        trained = train_seconds(net, subs)
        accepted_s = sum(t for j, t in trained.items() if j in useful)
        # The training span ends at the last commit; then only the last round's windows
        # (verification, outer) remain, a fixed cost per job that no pipeline shortens.
        span = last_commit_at(net, subs) - t_start_epoch
        return {"depth": depth, "window_s": window, "round_duration_s": round_duration,
                "wall_s": round(wall, 1), "sub_jobs": len(subs), "runs_logged": len(trained),
                "runs_accepted": len(useful),
                "inner_compute_s": round(sum(trained.values()), 2),
                "accepted_compute_s": round(accepted_s, 2),
                # the accepted runs' compute only: a run that missed its deadline or was
                # rolled back is busy time, not utilisation
                "utilisation": round(accepted_s / (wall * len(WORKERS)), 3),
                "busy": round(sum(trained.values()) / (wall * len(WORKERS)), 3),
                "training_span_s": round(span, 1),
                "tail_s": round(wall - span, 1),
                "utilisation_in_span": round(accepted_s / (span * len(WORKERS)), 3),
                "rounds_started_before_predecessor_final": sum(
                    1 for r in started if r > 0 and r - 1 in accepted
                    and started[r] < accepted[r - 1]),
                "rolled_back": sum(1 for e in evs if e.event == "RoundsRolledBack")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="3 rounds")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--inner-steps", type=int, default=1000,
                    help="H (even): each inner run's steps, in two segments")
    ap.add_argument("--windows", type=float, nargs="+", default=[3.0, 6.0],
                    help="each window as a multiple of one inner run")
    ap.add_argument("--depths", type=int, nargs="+", default=[0, 2])
    args = ap.parse_args()
    rounds = 3 if args.quick else args.rounds
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="polnet-pipe-bench-") as tmp_s:
        tmp = Path(tmp_s)
        spec, text, d = write_inputs(tmp / "data", rounds, args.inner_steps)
        t_inner = time_inner_run(d, text)
        print(f"one inner run: {t_inner:.2f}s", flush=True)
        runs: list[dict[str, Any]] = []
        for depth in args.depths:
            for w in args.windows:
                window = max(2, math.ceil(w * t_inner))
                # A deadline, not a wait: room for a run on this shared machine (where
                # two workers, three verifiers and anvil share the cores, a run took
                # several times T).
                round_duration = max(30, math.ceil(ROUND_IN_INNER_RUNS * t_inner))
                r = run_job(tmp / f"d{depth}-w{w:g}", spec, text, depth, window,
                            round_duration)
                r["windows_in_inner_runs"] = w
                runs.append(r)
                print(f"D={depth} W={w:g}x ({window}s): {r}", flush=True)
    print(json.dumps({
        "bench": "collab_pipeline", "quick": args.quick, "rounds": rounds,
        "workers": len(WORKERS), "inner_steps": args.inner_steps,
        "inner_run_s": round(t_inner, 2),
        "utilisation": {f"D{r['depth']}_W{r['windows_in_inner_runs']:g}": r["utilisation"]
                        for r in runs},
        "utilisation_in_span": {
            f"D{r['depth']}_W{r['windows_in_inner_runs']:g}": r["utilisation_in_span"]
            for r in runs},
        "runs": runs, "bench_total_s": round(time.perf_counter() - started, 1)}))


if __name__ == "__main__":
    main()
