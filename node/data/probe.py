"""Try a job in a child process before a solver takes it.

Everything about a posted job is the submitter's: the spec's bytes, the
dataset's bytes, the model they describe. The solver parses, loads, builds and
runs one warm-up and two timed steps of it in a child process (``python -m
node.data.probe``) that sets its own address-space limit (``RLIMIT_AS``)
before anything else and runs under a wall-clock timeout. An allocator error,
a C-stack overflow in a decoder, the OOM killer or a hang then ends the child,
never the daemon; the daemon reads a one-line JSON verdict or a signal. The
child inherits no key, password or ``POLNET_*`` setting and no descriptor beyond
its three standard streams (node.childenv).

In the child, in order: the spec (hash and canonical form), its estimated
memory against the budget and its FLOPs against the time allowed (nothing
built yet), the dataset and how it binds to the spec (label and token ranges,
matching lengths, finite inputs), then the steps.

Public API::

    await probe_job(spec_path, dataset_path, spec_hash, dataset_hash, *, memory_mb,
                    max_seconds, gflops=0.0, threads=1, timeout_s=120.0) -> ProbeResult
    check_bound_data(ctx)          # SpecError naming the field if data and spec disagree
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from node.childenv import child_env
from node.errors import JobRejected, SpecError

if TYPE_CHECKING:
    from node.train.step import TrainContext

#: Address space the child may map beyond the job's budget: reservations that are
#: never touched (thread stacks, allocator arenas, shared libraries).
VIRTUAL_SLACK_MB = 1024
OUTPUT_LIMIT = 64 * 1024  # bytes of the child's output kept
PROBE_STEPS = 3           # one warm-up, two timed


@dataclass(frozen=True)
class ProbeResult:
    """What the child measured of a job it could run."""

    params: int
    estimate_mb: int
    per_step_s: float
    seconds_estimate: float  # the whole job: steps + hashing/checkpoints + commit
    peak_rss_mb: int


# --- the child ----------------------------------------------------------------------


def _limit_memory(limit_mb: int) -> None:
    limit = limit_mb * 2**20
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))


def check_bound_data(ctx: TrainContext) -> None:
    """The dataset fits the spec beyond what ``TrainContext.create`` checks: every
    label in ``[0, num_classes)``, one label per sample, every token in
    ``[0, vocab_size)``, finite inputs. A step would crash (or diverge) on it later."""
    import torch  # noqa: PLC0415 - the child only

    from node.spec import TEXT_CONFIGS  # noqa: PLC0415

    m = ctx.spec.model
    if isinstance(m, TEXT_CONFIGS) or ctx.targets is None:
        if ctx.inputs.numel() == 0:  # streamed shards: StreamContext.open held the
            return                   # manifest's vocab to vocab_size, each shard's ids to it
        vocab = m.vocab_size if isinstance(m, TEXT_CONFIGS) else 0
        lo, hi = int(ctx.inputs.min()), int(ctx.inputs.max())
        if lo < 0 or hi >= vocab:  # token ids index the embedding
            raise SpecError(f"dataset tokens span [{lo}, {hi}] but the model's vocabulary "
                            f"is [0, {vocab}): raise vocab_size or re-pack the dataset",
                            field="model.vocab_size")
        return
    x, y = ctx.inputs, ctx.targets
    if y.ndim != 1 or y.shape[0] != x.shape[0]:
        raise SpecError(f"dataset has {x.shape[0]} samples but labels of shape "
                        f"{list(y.shape)}: re-pack it with one label per sample",
                        field="dataset_hash")
    lo, hi = int(y.min()), int(y.max())
    if lo < 0 or hi >= m.num_classes:
        raise SpecError(f"dataset labels span [{lo}, {hi}] but the model has classes "
                        f"[0, {m.num_classes}): fix the labels or num_classes",
                        field="model.num_classes")
    if not bool(torch.isfinite(x).all()):
        raise SpecError("dataset inputs hold NaN or infinity: re-pack it with finite values",
                        field="dataset_hash")


def run_probe(spec_path: Path, dataset_path: Path, spec_hash: str, dataset_hash: str,
              memory_mb: int, max_seconds: float, gflops: float, threads: int) -> ProbeResult:
    """The child's work (also callable in-process, e.g. from tests)."""
    from node.spec import parse_spec_json  # noqa: PLC0415
    from node.train.budget import FLOPS_GENEROSITY, estimate, min_train_seconds  # noqa: PLC0415

    try:
        raw = spec_path.read_bytes()
        ds_size = dataset_path.stat().st_size
    except OSError as exc:
        raise JobRejected(f"job inputs cannot be read: {exc}") from None
    spec = parse_spec_json(raw)
    if spec.spec_hash().hex() != spec_hash.lower().removeprefix("0x"):
        raise SpecError("the served spec is not in canonical form", field="spec")
    from node.data.manifest import (  # noqa: PLC0415
        is_shard_manifest,
        parse_manifest,
        stream_memory_bytes,
    )
    from node.train.budget import DATASET_EXPANSION  # noqa: PLC0415

    with open(dataset_path, "rb") as f:
        first = f.read(1)
    if is_shard_manifest(first):  # what streaming holds, set by the largest shard
        held = stream_memory_bytes(parse_manifest(dataset_path.read_bytes(), dataset_hash))
        ds_size = -(-held // DATASET_EXPANSION)  # (estimate scales a file's size by this)
    need = estimate(spec, ds_size)
    if need.total_mb > memory_mb:
        raise JobRejected(f"job needs {need.summary()}; this solver's budget is {memory_mb} MB")
    floor_s = min_train_seconds(spec, gflops)
    if floor_s > max_seconds:
        raise JobRejected(f"job needs at least {floor_s:.0f} s of compute at {gflops:g} GFLOP/s "
                          f"(x{FLOPS_GENEROSITY:g}); its deadline allows {max_seconds:.0f} s")

    from node.data.stream import context_for_file  # noqa: PLC0415 - torch from here on
    from node.train.step import init_state, train_step  # noqa: PLC0415

    # A shard manifest: the caller fetched the shards of the probe's steps into the
    # store beside it (node.data.stream.shards_for_steps). A fine-tuning job's own
    # weights change no step's cost: the seeded ones stand in (the solver fetches and
    # checks the real file before it trains).
    seeded = spec.model_copy(update={"init_weights": None})
    ctx = context_for_file(seeded, dataset_path, dataset_hash, threads=threads, lookahead=0)
    check_bound_data(ctx)
    state = init_state(ctx)
    steps = min(PROBE_STEPS, spec.total_steps)
    times = []
    for s in range(1, steps + 1):
        t0 = time.perf_counter()
        loss = train_step(ctx, state, s)
        times.append(time.perf_counter() - t0)
        if not math.isfinite(loss):
            raise JobRejected(f"loss is {loss} at step {s}: the job diverges at once")
    timed = times[1:] or times
    per_step = sum(timed) / len(timed)
    rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return ProbeResult(params=need.params, estimate_mb=need.total_mb, per_step_s=per_step,
                       # + 30% for hashing and checkpoints, + 2 s for serving and the commit
                       seconds_estimate=per_step * spec.total_steps * 1.3 + 2.0,
                       peak_rss_mb=rss_kb // 1024)


def _main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m node.data.probe")
    ap.add_argument("spec", type=Path)
    ap.add_argument("dataset", type=Path)
    ap.add_argument("--spec-hash", required=True)
    ap.add_argument("--dataset-hash", required=True)
    ap.add_argument("--memory-mb", type=int, required=True)
    ap.add_argument("--limit-mb", type=int, required=True)
    ap.add_argument("--max-seconds", type=float, required=True)
    ap.add_argument("--gflops", type=float, default=0.0)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args(argv)
    _limit_memory(a.limit_mb)  # first: everything after runs under the limit
    try:
        r = run_probe(a.spec, a.dataset, a.spec_hash, a.dataset_hash, a.memory_mb,
                      a.max_seconds, a.gflops, a.threads)
        out: dict[str, Any] = {"ok": True, **r.__dict__}
    except BaseException as exc:  # noqa: BLE001 - the verdict is the point of the child
        out = {"ok": False, "error": type(exc).__name__, "reason": str(exc)[:1000]}
    sys.stdout.write("\n" + json.dumps(out) + "\n")
    sys.stdout.flush()
    os._exit(0 if out["ok"] else 3)  # no atexit work under a tight memory limit


# --- the parent -----------------------------------------------------------------------


def _verdict(stdout: bytes, stderr: bytes, returncode: int | None) -> dict[str, Any]:
    for line in reversed(stdout.decode("utf-8", "replace").splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                out = json.loads(line)
            except ValueError:
                break
            if isinstance(out, dict):
                return out
            break
    if returncode is not None and returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = str(-returncode)
        why = f"the probe died of {name}"
        if -returncode == signal.SIGKILL:
            why += " (the OOM killer, or its timeout)"
    else:
        why = f"the probe exited with status {returncode} and no verdict"
    tail = stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or [""]
    return {"ok": False, "error": "ProbeDied", "reason": f"{why}: {tail[0][:300]}".rstrip(": ")}


async def probe_job(spec_path: Path, dataset_path: Path, spec_hash: str, dataset_hash: str,
                    *, memory_mb: int, max_seconds: float, gflops: float = 0.0,
                    threads: int = 1, timeout_s: float = 120.0) -> ProbeResult:
    """Run the probe in a child limited to ``memory_mb`` (+ slack) and ``timeout_s``.

    Raises :class:`JobRejected` (with the child's reason) for any job it cannot run."""
    import trio  # noqa: PLC0415

    repo = str(Path(__file__).resolve().parents[2])
    # No key, no password, no POLNET_* setting (node.childenv): the child runs a
    # stranger's spec and dataset.
    env = child_env({"PYTHONPATH": os.pathsep.join(
        p for p in (repo, os.environ.get("PYTHONPATH", "")) if p),
        "MALLOC_ARENA_MAX": "2", "OMP_NUM_THREADS": str(threads)})
    cmd = [sys.executable, "-m", "node.data.probe", str(spec_path), str(dataset_path),
           "--spec-hash", spec_hash, "--dataset-hash", dataset_hash,
           "--memory-mb", str(memory_mb), "--limit-mb", str(memory_mb + VIRTUAL_SLACK_MB),
           "--max-seconds", str(max_seconds), "--gflops", str(gflops),
           "--threads", str(threads)]
    proc: Any = None
    with trio.move_on_after(timeout_s) as scope:
        proc = await trio.run_process(cmd, capture_stdout=True, capture_stderr=True,
                                      check=False, env=env, stdin=b"", close_fds=True)
    if scope.cancelled_caught or proc is None:
        raise JobRejected(f"the probe (build + {PROBE_STEPS} steps) did not finish in "
                          f"{timeout_s:.0f} s")
    out = _verdict(proc.stdout[-OUTPUT_LIMIT:], proc.stderr[-OUTPUT_LIMIT:], proc.returncode)
    if not out.get("ok"):
        raise JobRejected(f"{out.get('error', 'Error')}: {out.get('reason', '')}")
    try:
        return ProbeResult(params=int(out["params"]), estimate_mb=int(out["estimate_mb"]),
                           per_step_s=float(out["per_step_s"]),
                           seconds_estimate=float(out["seconds_estimate"]),
                           peak_rss_mb=int(out["peak_rss_mb"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise JobRejected(f"the probe's verdict is malformed: {exc!r}") from None


if __name__ == "__main__":
    _main()
