"""Throughput of a whole local network: jobs settled per hour on the devnet with
N solvers and M verifiers, and the time from commit to finalize.

Real daemons (OS processes) on loopback libp2p and anvil, real training of
small MLP jobs on digits. The verification window is a deployment parameter
and dominates commit -> finalize; the figure to watch is how close the measured
time comes to it (overhead of sampling, replay, attestation and finalize).

Last line of stdout: JSON.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from devnet.localnet import LocalNet  # noqa: E402
from devnet.params import DevnetParams  # noqa: E402
from node.demo import pack_inputs, spec_for  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--solvers", type=int, default=2)
    ap.add_argument("--verifiers", type=int, default=3)
    ap.add_argument("--jobs", type=int, default=4)
    ap.add_argument("--window", type=int, default=30, help="verification window (s)")
    ap.add_argument("--steps", type=int, default=40, help="training steps per job")
    args = ap.parse_args()
    params = DevnetParams.model_validate({
        "market": {"verification_window": args.window, "sample_count": 4},
        "registry": {"unbond_delay": 1800}})
    with tempfile.TemporaryDirectory(prefix="polnet-bench-net-") as tmp:
        home = Path(tmp)
        inputs = pack_inputs(home / "data")
        digits_hash = hashlib.sha256(inputs["digits"].read_bytes()).hexdigest()
        with LocalNet(home / "net", params) as net:
            for i in range(args.verifiers):
                net.start_verifier(f"v{i}", 4 + i)
            for i in range(args.solvers):
                net.start_solver(f"s{i}", 4 + args.verifiers + i)
            jobs = []
            t0 = time.monotonic()
            for j in range(args.jobs):
                spec = spec_for("mlp_digits.toml", digits_hash, home / f"job{j}.toml",
                                total_steps=args.steps, seed=100 + j)
                jobs.append(net.submit(f"sub{j}", 1, spec, inputs["digits"], reward=10,
                                       budget=2, solve_duration=600))
            for job in jobs:
                net.wait_job(job, {3}, 900)
            wall = time.monotonic() - t0
            w3 = net.c.w3
            commit_to_final = []
            committed: dict[int, int] = {}
            for ev in net.events():
                ts = int(w3.eth.get_block(ev.block_number)["timestamp"])
                if ev.event == "ResultCommitted":
                    committed[int(ev.args["jobId"])] = ts
                elif ev.event == "JobFinalized":
                    commit_to_final.append(ts - committed[int(ev.args["jobId"])])
            conserved = net.conserved()
    mean_ctf = sum(commit_to_final) / len(commit_to_final)
    result = {
        "bench": "network", "solvers": args.solvers, "verifiers": args.verifiers,
        "jobs": args.jobs, "steps_per_job": args.steps, "verification_window_s": args.window,
        "wall_s": round(wall, 1), "jobs_per_hour": round(args.jobs / wall * 3600, 1),
        "commit_to_finalize_s_mean": round(mean_ctf, 1),
        "commit_to_finalize_s_max": max(commit_to_final),
        "overhead_over_window_s": round(mean_ctf - args.window, 1),
        "tokens_conserved": conserved,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
