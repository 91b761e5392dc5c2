"""The drift matrix: how far honest replays on "other hardware" land from an
honest claim, relative to the update — the data the tolerance is calibrated on.

One machine emulates other hardware with knobs an honest solver may differ in:
thread count, oneDNN on/off, ATen's SIMD level (``ATEN_CPU_CAPABILITY``) and
MKL's code path (``MKL_CBWR``, ``MKL_ENABLE_INSTRUCTIONS``) — those two are read
at import, so they run in a fresh subprocess —, gradient-accumulation order
(one batch vs 4 micro-batches), Adam's foreach/fused kernels and an fp64
reference. The claim C is the plain replay (threads=1, fp32, defaults); each
configuration's replay R is judged against it exactly as a verifier would.

Until ``TrainContext`` grows these knobs (node/train/REQUESTS.md),
``variant_step`` emulates accumulation, the Adam kernel flag and fp64 with the
same batch, randomness and learning rate as ``train_step``.
"""

from __future__ import annotations

import contextlib
import json
import math
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Literal

import torch
import torch.nn.functional as F  # noqa: N812
from safetensors.torch import load_file, save_file

from node.childenv import child_env
from node.errors import ConfigError, TrainingError
from node.train.step import (
    TrainContext,
    TrainState,
    batch,
    init_state,
    load_state,
    lr_of,
    state_tensors,
    step_generator,
    train_step,
)
from verifier.replay import StepFn, Tensors, judge
from verifier.tolerance import TolerancePolicy
from verifier.verdict import Verdict

OptimizerImpl = Literal["single", "foreach", "fused"]


@dataclass(frozen=True)
class HonestConfig:
    name: str
    threads: int = 1
    mkldnn: bool = True
    micro_batches: int = 1
    optimizer_impl: OptimizerImpl = "single"
    float64: bool = False
    env: tuple[tuple[str, str], ...] = ()
    """Variables read at import: the replay runs in a fresh subprocess."""

    @property
    def needs_subprocess(self) -> bool:
        return bool(self.env)

    @property
    def plain_step(self) -> bool:
        return self.micro_batches == 1 and self.optimizer_impl == "single" and not self.float64


BASELINE = HonestConfig("baseline")
MATRIX: tuple[HonestConfig, ...] = (
    HonestConfig("threads2", threads=2),
    HonestConfig("onednn_off", mkldnn=False),
    HonestConfig("accum_4x", micro_batches=4),
    HonestConfig("adam_foreach", optimizer_impl="foreach"),
    HonestConfig("adam_fused", optimizer_impl="fused"),
    HonestConfig("fp64", float64=True),
    HonestConfig("aten_default", env=(("ATEN_CPU_CAPABILITY", "default"),)),
    HonestConfig("aten_avx2", env=(("ATEN_CPU_CAPABILITY", "avx2"),)),
    HonestConfig("mkl_cbwr_compat", env=(("MKL_CBWR", "COMPATIBLE"),)),
    HonestConfig("mkl_sse42", env=(("MKL_ENABLE_INSTRUCTIONS", "SSE4_2"),)),
    HonestConfig("all_knobs", threads=2, mkldnn=False, micro_batches=4,
                 optimizer_impl="foreach",
                 env=(("ATEN_CPU_CAPABILITY", "default"), ("MKL_CBWR", "COMPATIBLE"))),
)


def config_by_name(name: str) -> HonestConfig:
    for c in (BASELINE, *MATRIX):
        if c.name == name:
            return c
    raise ConfigError(f"unknown drift config {name!r}; known: "
                      f"{[c.name for c in (BASELINE, *MATRIX)]}")


# --- honest variants -----------------------------------------------------------------


def variant_step(cfg: HonestConfig) -> StepFn:
    """``train_step`` with the config's accumulation order, Adam kernel and dtype."""
    if cfg.plain_step:
        return train_step

    def step_fn(ctx: TrainContext, state: TrainState, step: int) -> float:
        if state.step != step - 1:
            raise TrainingError(f"state is at step {state.step}; cannot run step {step}")
        m = cfg.micro_batches
        if m > 1 and getattr(ctx.spec.model, "dropout", 0.0) > 0:
            raise ConfigError("micro-batching with dropout changes the masks' draw order")
        x, y = batch(ctx, step)
        rng = step_generator(ctx, step)
        for group in state.optimizer.param_groups:
            group["lr"] = lr_of(ctx, step)
            group["foreach"] = cfg.optimizer_impl == "foreach"
            group["fused"] = cfg.optimizer_impl == "fused"
        state.optimizer.zero_grad(set_to_none=True)
        total = 0.0
        for xs, ys in zip(x.chunk(m), y.chunk(m), strict=True):
            if cfg.float64 and xs.is_floating_point():
                xs = xs.double()
            logits = state.model(xs, rng)
            loss = (F.cross_entropy(logits.reshape(-1, logits.shape[-1]), ys.reshape(-1))
                    if cfg.float64 else state.model.loss(logits, ys))
            (loss / m).backward()
            total += float(loss.detach()) / m
        if ctx.spec.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(state.model.parameters(), ctx.spec.grad_clip,
                                           foreach=False)
        state.optimizer.step()
        state.step = step
        return total

    return step_fn


@contextlib.contextmanager
def applied(cfg: HonestConfig) -> Iterator[None]:
    """Process-wide knobs for the duration of a replay (restored afterwards)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(cfg.threads)
    try:
        with torch.backends.mkldnn.flags(enabled=cfg.mkldnn):
            yield
    finally:
        torch.set_num_threads(threads)


def _to_float64(state: TrainState) -> None:
    state.model.double()
    for st in state.optimizer.state.values():
        for key in ("exp_avg", "exp_avg_sq", "momentum_buffer"):
            if key in st:
                st[key] = st[key].double()


def replay_with(cfg: HonestConfig, ctx: TrainContext, start: Tensors, start_step: int,
                k: int) -> tuple[dict[str, torch.Tensor], float]:
    """Replay in this process under ``cfg`` (its env vars are NOT applied here)."""
    with applied(cfg):
        state = load_state(ctx, start, step=start_step)
        if cfg.float64:
            _to_float64(state)
        step_fn = variant_step(cfg)
        total = sum(step_fn(ctx, state, s) for s in range(start_step + 1, start_step + k + 1))
        out = state_tensors(state)
    return {n: t.to(start[n].dtype) for n, t in out.items()}, total / k


# --- subprocess configurations -----------------------------------------------------------


def replay_in_subprocess(cfg: HonestConfig, ctx: TrainContext, dataset_path: str | Path,
                         start: Tensors, start_step: int, k: int, workdir: str | Path,
                         timeout: float = 300.0) -> tuple[dict[str, torch.Tensor], float, str]:
    """Replay under ``cfg`` in a fresh interpreter with its environment; returns
    (tensors, mean loss, the ATen CPU capability the child reported)."""
    d = Path(tempfile.mkdtemp(prefix=f"drift-{cfg.name}-", dir=workdir))
    save_file({n: t.contiguous() for n, t in start.items()}, d / "start.safetensors")
    job = {"spec": json.loads(ctx.spec.canonical_json()), "dataset": str(dataset_path),
           "start_step": start_step, "k": k, "config": asdict(cfg)}
    (d / "job.json").write_text(json.dumps(job))
    env = child_env(dict(cfg.env))  # the job's data, so no keys (node.childenv)
    proc = subprocess.run([sys.executable, "-m", "verifier.drift", str(d)], env=env,
                          capture_output=True, text=True, timeout=timeout, check=False,
                          close_fds=True)
    if proc.returncode != 0:
        raise TrainingError(f"drift worker {cfg.name} failed: {proc.stderr[-2000:]}")
    res = json.loads((d / "result.json").read_text())
    return load_file(d / "out.safetensors"), float(res["loss"]), str(res["capability"])


def _worker(d: Path) -> None:
    from node.data.stream import context_for_file  # noqa: PLC0415
    from node.spec import parse_spec  # noqa: PLC0415

    job = json.loads((d / "job.json").read_text())
    cfg = HonestConfig(**{**job["config"], "env": tuple(map(tuple, job["config"]["env"]))})
    spec = parse_spec(job["spec"])
    # a one-file dataset or a shard manifest (its shards beside it)
    ctx = context_for_file(spec, job["dataset"], spec.dataset_hash, threads=cfg.threads)
    out, loss = replay_with(cfg, ctx, load_file(d / "start.safetensors"), job["start_step"],
                            job["k"])
    save_file(out, d / "out.safetensors")
    (d / "result.json").write_text(json.dumps(
        {"loss": loss, "capability": torch.backends.cpu.get_cpu_capability()}))


# --- the measurement --------------------------------------------------------------------


@dataclass(frozen=True)
class DriftRow:
    """One honest configuration on one segment, judged against the baseline claim."""

    job: str
    config: str
    segment: int
    k: int
    ratio: float
    """Overall masked parameter drift / replayed update (what rho bounds)."""
    worst_param_ratio: float
    worst_param: str
    worst_opt_ratio: float
    unmasked_ratio: float
    """The same without the Adam-eps mask: why the mask exists."""
    masked: int
    loss_rel: float
    passed: bool
    capability: str = ""
    reason: str = ""
    masked_slack: float = 0.0
    """max over Adam-eps-masked coordinates of |R - C| / their bound (<= 1 passes)."""
    determined: int = 0
    """Masked coordinates held exact (zero moments: pure weight decay)."""


def _row(job: str, cfg: str, v: Verdict, unmasked: Verdict, loss_c: float, loss_r: float,
         capability: str) -> DriftRow:
    params = [t for t in v.tensors if t.kind == "param"]
    opts = [t for t in v.tensors if t.kind in ("exp_avg", "exp_avg_sq", "momentum")]
    wp = max(params, key=lambda t: t.ratio)
    return DriftRow(job, cfg, v.segment, v.end_step - v.start_step, v.ratio, wp.ratio, wp.name,
                    max((t.ratio for t in opts), default=0.0), unmasked.ratio, v.masked,
                    abs(loss_c - loss_r) / max(abs(loss_r), 1e-12), v.passed, capability,
                    v.reason, v.masked_slack, v.determined)


def honest_starts(ctx: TrainContext, segments: Sequence[int]) -> dict[int, dict[str, torch.Tensor]]:
    """Honest S_{s*k} for each requested segment s (one training pass)."""
    k = ctx.spec.checkpoint_interval
    state = init_state(ctx)
    out: dict[int, dict[str, torch.Tensor]] = {}
    for s in range(max(segments) + 1):
        if s in segments:
            out[s] = state_tensors(state)
        for step in range(s * k + 1, (s + 1) * k + 1):
            train_step(ctx, state, step)
    return out


@dataclass
class DriftMatrix:
    rows: list[DriftRow] = field(default_factory=list)

    def max_of(self, attr: str) -> float:
        return max((float(getattr(r, attr)) for r in self.rows), default=0.0)


def measure(ctx: TrainContext, job: str, segments: Sequence[int],
            dataset_path: str | Path | None = None,
            configs: Sequence[HonestConfig] = MATRIX, policy: TolerancePolicy | None = None,
            subprocess_configs: bool = True, workdir: str | Path | None = None) -> DriftMatrix:
    """Replay each segment under each config and judge it against the baseline claim."""
    pol = policy or TolerancePolicy()
    k = ctx.spec.checkpoint_interval
    starts = honest_starts(ctx, segments)
    matrix = DriftMatrix()
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        for seg, start in starts.items():
            claimed, loss_c = replay_with(BASELINE, ctx, start, seg * k, k)
            for cfg in configs:
                if cfg.needs_subprocess and (not subprocess_configs or dataset_path is None):
                    continue
                if cfg.micro_batches > 1 and getattr(ctx.spec.model, "dropout", 0.0) > 0:
                    continue  # see variant_step
                if cfg.needs_subprocess and dataset_path is not None:
                    r, loss_r, cap = replay_in_subprocess(cfg, ctx, dataset_path, start, seg * k,
                                                         k, tmp)
                else:
                    (r, loss_r), cap = replay_with(cfg, ctx, start, seg * k, k), ""
                v = judge(ctx, seg, seg * k, start, r, claimed, pol)
                unmasked = judge(ctx, seg, seg * k, start, r, claimed, replace(pol, adam_eps=0.0))
                matrix.rows.append(_row(job, cfg.name, v, unmasked, loss_c, loss_r,
                                        cap or torch.backends.cpu.get_cpu_capability()))
    return matrix


def _sig_up(x: float, digits: int = 1) -> float:
    """Round up to ``digits`` significant digits (a bound never rounds down)."""
    if x <= 0 or not math.isfinite(x):
        return x
    e = math.floor(math.log10(x)) - digits + 1
    return math.ceil(x / 10**e) * 10**e


if __name__ == "__main__":
    _worker(Path(sys.argv[1]))
