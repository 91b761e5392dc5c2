"""Cross-device drift: claims trained on the CPU, replayed on another device, judged by
the verifier's tolerance (issue 30: the masked-coordinate bounds must hold across CPU
and GPU; fp32 on the GPU must not be flagged, TF32 should be).

For the CNN and the char LM: honest starts S of a few segments on the CPU; the claim C
is the CPU replay from S (threads 1, the reference), each configuration's replay R runs
from the same S on its device. Configurations: ``cpu_threads2`` (the CPU reference
row), and on CUDA ``cuda_fp32`` (TF32 off for matmul and cuDNN, as ``TrainContext``
now sets it) and ``cuda_tf32`` (turned back on after the context is made, to show
what TF32 would do; ``tf32_turned_off_by_context`` says the context refused it).
Against each R it judges the honest C, the compute-saving cheats of
``verifier.calibrate.CHEAT_PROBES`` (their claims made on the CPU from S) and the
write channel of issue 30 item 7 (C with its zero-moment coordinates moved by 0.99 *
2 * lr * k, ``node.behaviors.trigger``). Needs no network (the datasets ship with
scikit-learn and CPython). The last stdout line is JSON; per job and configuration:
honest_max_ratio vs rho, honest_max_masked_slack (<= 1: the zero-moment exactness and
second-moment bound hold), determined (zero-moment coordinates held exact),
false_flags, cheat_min_ratio, cheats_flagged, write_channel_flagged.

    python bench/drift_gpu.py --device cuda            # about a minute on one H200
    python bench/drift_gpu.py --device cpu --segments 2 --k 4   # the CPU path, tiny
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
import traceback
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from node.behaviors import make_behavior
from node.behaviors.trigger import MaskedTrigger
from node.train.step import TrainContext, load_state, state_tensors
from verifier.calibrate import CHEAT_PROBES
from verifier.drift import BASELINE, honest_starts, replay_with
from verifier.jobs import job
from verifier.replay import Tensors, judge, policy_from_spec, replay_segment
from verifier.verdict import Verdict


@dataclass(frozen=True)
class DeviceConfig:
    name: str
    device: str
    threads: int = 1
    tf32: bool = False


def configs(device: str) -> list[DeviceConfig]:
    out = [DeviceConfig("cpu_threads2", "cpu", threads=2)]
    if device == "cpu":
        return out + [DeviceConfig("cpu_fp32", "cpu")]
    return out + [DeviceConfig(f"{device}_fp32", device),
                  DeviceConfig(f"{device}_tf32", device, tf32=True)]


def set_tf32(on: bool) -> None:
    torch.backends.cuda.matmul.allow_tf32 = on
    torch.backends.cudnn.allow_tf32 = on


def write_channel_claim(ctx: TrainContext, claimed: Tensors, start_step: int) -> Tensors:
    """The honest claim with its zero-moment coordinates moved (issue 30 item 7)."""
    k = ctx.spec.checkpoint_interval
    state = load_state(ctx, claimed, step=start_step + k)
    MaskedTrigger("zero")._move(ctx, state, start_step, k)
    return state_tensors(state)


def cheat_claims(ctx: TrainContext, start: Tensors, seg: int) -> dict[str, Tensors]:
    k = ctx.spec.checkpoint_interval
    out: dict[str, Tensors] = {}
    for name in CHEAT_PROBES:
        if name == "half_batch" and ctx.spec.model.family != "cnn":
            continue  # as tests/test_adversary.py: the LM's cheats list
        state = load_state(ctx, start, step=seg * k)
        claimed, _ = make_behavior(name).run_segment(ctx, state, seg, seg * k, k)
        out[name] = state_tensors(claimed)
    return out


def run_job(kind: str, cache: Path, segments: int, k: int, device: str) -> dict[str, Any]:
    ctx = job(kind, cache, k=k, total_steps=segments * k)
    policy = policy_from_spec(ctx.spec)
    segs = list(range(segments))
    starts = honest_starts(ctx, segs)
    claims = {s: replay_with(BASELINE, ctx, starts[s], s * k, k)[0] for s in segs}
    cheats = {s: cheat_claims(ctx, starts[s], s) for s in segs}
    channel = {s: write_channel_claim(ctx, claims[s], s * k) for s in segs}
    out: dict[str, Any] = {"rho": policy.rho}
    for cfg in configs(device):
        t0 = time.perf_counter()
        try:
            set_tf32(cfg.tf32)
            dctx = TrainContext.create(ctx.spec, ctx.dataset, device=cfg.device,
                                       threads=cfg.threads)
            # TrainContext turns TF32 off on CUDA (fp32 is IEEE fp32); TF32 is switched
            # back on here to show what it would do.
            refused = cfg.tf32 and not torch.backends.cudnn.allow_tf32
            set_tf32(cfg.tf32)
            honest: list[Verdict] = []
            cheat_rows: dict[str, list[Verdict]] = {}
            trig: list[Verdict] = []
            for s in segs:
                r, _ = replay_segment(dctx, starts[s], s * k, k)
                honest.append(judge(ctx, s, s * k, starts[s], r, claims[s], policy))
                for name, c in cheats[s].items():
                    cheat_rows.setdefault(name, []).append(
                        judge(ctx, s, s * k, starts[s], r, c, policy))
                trig.append(judge(ctx, s, s * k, starts[s], r, channel[s], policy))
            out[cfg.name] = {
                "honest_max_ratio": max(v.ratio for v in honest),
                "honest_max_masked_slack": max(v.masked_slack for v in honest),
                "honest_max_tensor_slack": max(v.worst_slack for v in honest),
                "determined": [v.determined for v in honest],
                "false_flags": [f"{v.segment}: {v.reason}" for v in honest if not v.passed],
                "cheat_min_ratio": {n: min(v.ratio for v in vs) for n, vs in cheat_rows.items()},
                "cheats_flagged": all(not v.passed for vs in cheat_rows.values() for v in vs),
                "write_channel_flagged": all(not v.passed for v in trig)
                if any(v.determined for v in trig) else None,
                "tf32_turned_off_by_context": refused if cfg.tf32 else None,
                "seconds": round(time.perf_counter() - t0, 1),
            }
        except Exception as exc:  # noqa: BLE001 - one configuration must not hide the others
            traceback.print_exc()
            out[cfg.name] = {"error": repr(exc)}
        finally:
            set_tf32(False)
    return out


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--segments", type=int, default=4)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--jobs", default="cnn,lm")
    a = ap.parse_args(argv)
    # Before CUDA's first use (TrainContext sets it too): deterministic cuBLAS.
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    t0 = time.perf_counter()
    torch.set_num_threads(1)
    res: dict[str, Any] = {"device": a.device, "segments": a.segments, "k": a.k,
                           "torch": torch.__version__}
    if a.device.startswith("cuda"):
        res["gpu"] = torch.cuda.get_device_name(0)
    with tempfile.TemporaryDirectory() as tmp:
        for kind in a.jobs.split(","):
            res[kind] = run_job(kind, Path(tmp), a.segments, a.k, a.device)
    res["seconds"] = round(time.perf_counter() - t0, 1)
    print(json.dumps(_clean(res)))
    return res


def _clean(x: Any) -> Any:
    """Strict JSON: infinities and NaN as strings."""
    if isinstance(x, dict):
        return {k: _clean(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_clean(v) for v in x]
    return str(x) if isinstance(x, float) and not math.isfinite(x) else x


if __name__ == "__main__":
    sys.exit(0 if main() else 1)
