"""One job trained by N processes over torch.distributed (issue 33).

``launch`` starts N rank processes (gloo on CPU; NCCL would take the same code on
GPUs) that find each other through a TCP store the launcher holds on 127.0.0.1.
The ranks are children without secrets (node.childenv): the launcher, the solver
daemon, keeps the chain account and p2p; rank 0 owns the trace directory (it runs
``run_training`` with a behaviour that drives the other ranks); ranks 1..N-1 only
compute. A step splits its batch by node.train.dist_plan.

Two modes:

* ``ddp``: every rank holds the whole state; each backpropagates its rows and
  the gradients are summed by one all-reduce of a flat buffer before the optimizer
  step, so every rank applies the same update bit for bit.
* ``fsdp``: FSDP2 (``fully_shard``) shards weights, gradients and optimizer state
  over the ranks (gradients averaged by its reduce-scatter of unscaled losses). The
  state hash is the ordinary one, built from the shards (``_Rank.leaf``): per tensor
  in name order rank 0 hashes its own dim-0 shard, then each other rank's, received
  in batches of ``hash_batch_bytes``; nobody gathers the state, so existing hash
  vectors and verifiers are unchanged and a 1-rank verifier replays the segments.
  Kept leaves are written with torch.distributed.checkpoint, each rank its shards,
  and converted to the single-file layout on demand (node.train.shardckpt,
  trace.kept_file). Nor is the start state ever whole in one process: every rank
  builds its shards of S_0 a parameter at a time, or loads its own shards of the
  kept leaf it resumes from (``_Rank.build_start``).

Control: before each segment rank 0 broadcasts ``[op, start step, first, keep]``; a
run starts with an fsdp start op (``_START_S0``, ``_START_DCP``) or, ddp or a kept
single file, its first segment broadcasts the state rank 0 started from; so a
restart after a killed rank resumes every rank from the last kept checkpoint. A rank
that dies ends the launch: the launcher kills every other rank's process group and
raises; the ranks also die with the
launcher (PR_SET_PDEATHSIG), so no rank outlives it.

Public API::

    launch(spec_path, dataset_path, out_dir, job_id, world_size, threads=1,
           mode="ddp", keep_every=1, cheat=None, on_start=None,
           hash_batch_bytes=HASH_BATCH_BYTES) -> TraceManifest
    python -m node.train.distributed '<rank config json>'   # one rank (internal)
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import math
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Literal

import torch
import torch.distributed as dist

from node.childenv import child_env
from node.errors import CheckpointError, TrainingError
from node.train.behavior import SegmentBehavior
from node.train.dist_plan import HASH_BATCH_BYTES, check_world, rank_rows
from node.train.step import (
    STEP_KEY,
    ShardedLeaf,
    TrainContext,
    TrainState,
    _export,
    _export_dtype,
    _live_pairs,
    batch,
    derive_seed,
    init_state,
    load_state,
    lr_of,
    state_tensors,
    step_generator,
)

Mode = Literal["ddp", "fsdp"]
#: Test cheats of rank 1 (data-parallel only): "skip" sends zeros for its share of
#: the batch without computing it; "stale" sends its previous step's gradient every
#: other step. Replay must flag both.
Cheat = Literal["skip", "stale"]
STORE_TIMEOUT = timedelta(seconds=120)
# A collective waits at most this long for a peer: a hung peer ends the job rather
# than the job hanging (the launcher kills it sooner when a rank exits).
PG_TIMEOUT = timedelta(seconds=600)
_PR_SET_PDEATHSIG = 1
#: fsdp: a leaf's shards travel to rank 0 in batches of about this many bytes per rank
#: (fewer messages; rank 0 holds one batch per peer at a time, never the state).
# Control words (the first of the four rank 0 broadcasts before each thing it asks).
_STOP, _SEGMENT, _START_S0, _START_DCP = 0, 1, 2, 3


@dataclass(frozen=True)
class RankConfig:
    rank: int
    world_size: int
    store_port: int
    spec_path: str
    dataset_path: str
    out_dir: str
    job_id: int
    threads: int
    mode: str
    keep_every: int
    parent_pid: int
    cheat: str | None = None
    hash_batch_bytes: int = 0


# --- one rank ------------------------------------------------------------------------


class _Rank:
    """This process's part of the job: its live state (whole or sharded) and steps."""

    def __init__(self, ctx: TrainContext, cfg: RankConfig) -> None:
        self.ctx, self.cfg = ctx, cfg
        self.rank, self.world = cfg.rank, cfg.world_size
        self.live: TrainState | None = None
        self._mesh: Any = None
        self._stale: list[torch.Tensor] | None = None
        self._last_part = torch.zeros(())
        self.largest_held = 0  # the largest piece a leaf hash held (rank 0)
        self.start_held = 0  # the most bytes of the start state this rank held at once
        self.save_seconds = 0.0  # inside leaf(): the DCP saves
        self._value: Callable[[str], torch.Tensor] = _no_value

    # State in and out.

    def sync_from(self, tensors: dict[str, torch.Tensor] | None, step: int) -> None:
        """Rank 0's full state (``tensors`` there, None elsewhere) becomes every rank's."""
        template = tensors if tensors is not None else state_tensors(init_state(self.ctx))
        for name in sorted(template):
            dist.broadcast(template[name], src=0)
        self.start_held = sum(t.nbytes for t in template.values())  # the whole state
        plain = load_state(self.ctx, template, step=step)
        self.live = self._shard(plain) if self.cfg.mode == "fsdp" else plain

    def build_start(self, step: int, from_dcp: bool) -> None:
        """fsdp, every rank: its shards of the run's start state, built here with no
        process holding the whole state: S_0 (``step`` 0) one parameter at a time, each
        drawn whole as ``build_model`` draws it and cut to this rank's rows; or the kept
        leaf at ``step``, each rank loading its own shards of it with
        torch.distributed.checkpoint (collective)."""
        from torch.distributed.tensor import DTensor  # noqa: PLC0415

        ctx, cd = self.ctx, self.ctx.compute_dtype
        model, value = self._skeleton()
        state = _fresh_optimizer_state(ctx, model)  # zeroed, sharded
        transient = 0
        with torch.no_grad():
            if from_dcp:
                transient = self._load_shards(state, step)
            else:
                init = ctx.init_weights
                for name, p in model.named_parameters():
                    assert isinstance(p, DTensor)
                    full = (init[name] if init is not None else value(name)).to(cd)
                    transient = max(transient, full.nbytes)
                    local = p.to_local()
                    at = -(-p.shape[0] // self.world) * self.rank
                    local.copy_(full[at:at + local.shape[0]])
                    del full
                for name, b in model.named_buffers():
                    if init is not None and name in init:
                        b.copy_(init[name])
        state.step = step
        self.live = state
        self.start_held = transient + sum(
            (t.to_local() if isinstance(t, DTensor) else t).nbytes
            for _, t in _live_pairs(state))
        self._value = value

    def _skeleton(self) -> tuple[Any, Callable[[str], torch.Tensor]]:
        """The FSDP2 module of this rank: parameters allocated as shards only, buffers
        as ``build_model`` makes them; and each parameter's initial value on demand."""
        from torch.distributed.device_mesh import init_device_mesh  # noqa: PLC0415
        from torch.distributed.fsdp import fully_shard  # noqa: PLC0415

        from node.train.models import build_deferred  # noqa: PLC0415

        ctx = self.ctx
        if self._mesh is None:
            self._mesh = init_device_mesh("cpu", (self.world,))
        model, value = build_deferred(ctx.spec.model, derive_seed(ctx.spec.seed, "init"))
        model = model.to(dtype=ctx.compute_dtype)  # as step._fresh_state (device: below)
        model.train()
        fully_shard(model, mesh=self._mesh)
        buffers = dict(model.named_buffers())
        model.to_empty(device=ctx.device)  # the shards: uninitialised, filled by the caller
        for name, b in buffers.items():  # to_empty dropped the buffers' values
            owner, _, leaf = name.rpartition(".")
            setattr(model.get_submodule(owner), leaf, b.to(ctx.device))
        return model, value

    def _load_shards(self, state: TrainState, step: int) -> int:
        """Each rank reads its own rows of the kept leaf at ``step`` (its DCP checkpoint,
        checked by rank 0's resume) into its live shards, in place where the live
        tensor is in the checkpoint's dtype; returns the bytes of the extra buffers."""
        import torch.distributed.checkpoint as dcp  # noqa: PLC0415
        from torch.distributed.tensor import DTensor  # noqa: PLC0415

        from node.train.shardckpt import dcp_name  # noqa: PLC0415

        cd = self.ctx.compute_dtype
        targets: dict[str, torch.Tensor] = {}
        copies: list[tuple[torch.Tensor, torch.Tensor]] = []  # (live, loaded into)
        for name, t in _live_pairs(state):
            t = t.detach()
            live = t.to_local() if isinstance(t, DTensor) else t
            into = live if live.dtype == _export_dtype(live, cd) and live.is_contiguous() \
                else torch.empty(live.shape, dtype=_export_dtype(live, cd))
            if into is not live:
                copies.append((live, into))
            targets[name] = into if not isinstance(t, DTensor) else DTensor.from_local(
                into, t.device_mesh, t.placements, shape=t.shape, stride=t.stride(),
                run_check=False)
        targets[STEP_KEY] = torch.tensor(-1, dtype=torch.int64)
        dcp.load(targets, checkpoint_id=str(Path(self.cfg.out_dir) / dcp_name(step)))
        if int(targets[STEP_KEY]) != step:
            raise TrainingError(f"the kept leaf of step {step} holds step "
                                f"{int(targets[STEP_KEY])}")
        for live, into in copies:
            live.copy_(into)
        return sum(into.nbytes for _, into in copies)

    def load_rows(self, path: str, step: int) -> str | None:
        """fsdp, every rank (a verifier's replay): its own dim-0 rows of the single-file
        state at ``path`` (safetensors slices, so no rank reads the whole state), tensors
        not sharded on dim 0 whole. Returns the first tensor (in name order) whose rows
        here are not finite, else None. CheckpointError when the file cannot be read or
        holds another step."""
        from torch.distributed.tensor import DTensor  # noqa: PLC0415

        model, _ = self._skeleton()
        state = _fresh_optimizer_state(self.ctx, model)
        bad: str | None = None
        transient = 0
        with torch.no_grad(), _reading(path) as f:
            for name, t in sorted(_live_pairs(state), key=lambda p: p[0]):
                src = read_rows(f, name, shard_slice(t, self.world, self.rank))
                if bad is None and src.is_floating_point() and not bool(src.isfinite().all()):
                    bad = name
                transient = max(transient, src.nbytes)
                (t.to_local() if isinstance(t, DTensor) else t).copy_(src)
                del src
            held = int(f.get_tensor(STEP_KEY))
        if held != step:
            raise CheckpointError(f"{path} holds step {held}, not {step}: not the committed "
                                  "start state; fetch it again")
        state.step = step
        self.live = state
        self.start_held = transient + self.live_bytes()
        return bad

    def live_bytes(self) -> int:
        """Bytes of this rank's live state: its shards, and tensors held whole."""
        from torch.distributed.tensor import DTensor  # noqa: PLC0415

        assert self.live is not None
        return sum((t.to_local() if isinstance(t, DTensor) else t).nbytes
                   for _, t in _live_pairs(self.live))

    def start_leaf(self) -> ShardedLeaf | None:
        """fsdp, every rank, after ``build_start`` of S_0: its hash from the shards (rank 0
        gets it), with S_0's tensors one at a time for its single file (redrawn, the
        optimizer's zeros made), which rank 0's writer checks against that hash."""
        state = self.live
        assert state is not None
        leaf = self.leaf(None)
        if leaf is None:
            return None
        cd, value, init = state.compute_dtype, self._value, self.ctx.init_weights
        params = {f"model.{n}" for n, _ in state.model.named_parameters()}
        layout: dict[str, tuple[torch.dtype, tuple[int, ...]]] = {
            n: (_export_dtype(t, cd), tuple(t.shape)) for n, t in _live_pairs(state)}
        layout[STEP_KEY] = (torch.int64, ())
        # Buffers are small and training may change them: copied now.
        plain = {n: _export(t, cd) for n, t in _live_pairs(state)
                 if n.startswith("model.") and n not in params}

        def whole(name: str) -> torch.Tensor:
            if name in params:
                pname = name.removeprefix("model.")
                return _export((init[pname] if init is not None else value(pname)).to(cd), cd)
            if name in plain:
                return plain[name]
            if name == STEP_KEY:
                return torch.tensor(0, dtype=torch.int64)
            return torch.zeros(layout[name][1], dtype=layout[name][0])  # optimizer state

        return ShardedLeaf(leaf.state_hash, None, layout, whole)

    def _shard(self, plain: TrainState) -> TrainState:
        from torch.distributed.device_mesh import init_device_mesh  # noqa: PLC0415
        from torch.distributed.fsdp import fully_shard  # noqa: PLC0415
        from torch.distributed.tensor import DTensor, distribute_tensor  # noqa: PLC0415

        if self._mesh is None:
            self._mesh = init_device_mesh("cpu", (self.world,))
        full_optim = {n: t for n, t in state_tensors(plain).items() if n.startswith("optim.")}
        model = plain.model
        fully_shard(model, mesh=self._mesh)
        fresh = _fresh_optimizer_state(self.ctx, model)
        with torch.no_grad():
            for p, st in fresh.optimizer.state.items():
                assert isinstance(p, DTensor)  # fully_shard made every parameter one
                pname = fresh.param_names[id(p)]
                for key in st:
                    full = full_optim[f"optim.{pname}.{key}"]
                    st[key] = full.clone() if key == "step" else \
                        distribute_tensor(full, p.device_mesh, p.placements)
        fresh.step = plain.step
        return fresh

    def leaf(self, partial_dir: str | None) -> ShardedLeaf | None:
        """Every rank, at a leaf of a sharded run: build the state hash from the shards
        (rank 0 gets it; None elsewhere) and, given ``partial_dir`` (a kept leaf), write
        each rank's shards there with torch.distributed.checkpoint.

        The hash is ``state_hash`` of ``state_tensors``, streamed (node.proof.StateHasher):
        per tensor in name order rank 0 hashes its header, then its own dim-0 shard,
        then each other rank's in rank order. The row-major bytes of a Shard(0) tensor
        are its shards' in rank order. Shards travel in batches: consecutive tensors (in
        name order) whose largest shards come to at most ``hash_batch_bytes``, one
        message per rank and batch (a tensor with a larger shard alone), dropped once
        hashed; so rank 0 holds its own shards plus one batch per peer, never the state."""
        from torch.distributed.tensor import DTensor, Shard  # noqa: PLC0415

        from node.proof import StateHasher  # noqa: PLC0415

        state = self.live
        assert state is not None
        cd = state.compute_dtype
        h = StateHasher() if self.rank == 0 else None
        save: dict[str, torch.Tensor] = {}
        pairs = dict(_live_pairs(state))
        pairs[STEP_KEY] = torch.tensor(state.step, dtype=torch.int64)
        names = sorted(pairs)
        # (global tensor, this rank's exported shard) of each Shard(0) tensor
        sharded: dict[str, tuple[Any, torch.Tensor]] = {}
        for name in names:
            t = pairs[name].detach()
            if isinstance(t, DTensor) and tuple(t.placements) == (Shard(0),):
                local = t.to_local()
                if local.shape[0] != _rows(t.shape[0], self.world, self.rank):
                    raise TrainingError(f"{name}: rank {self.rank} holds {local.shape[0]} "
                                        f"rows of {t.shape[0]}, not torch.chunk's share")
                dtype = _export_dtype(local, cd)
                sharded[name] = (t, local if local.dtype == dtype and local.is_contiguous()
                                 else _export(local, cd))
        for group in _batches(names, sharded, self.world, self.cfg.hash_batch_bytes, cd):
            if h is None:
                mine = [sharded[n][1].reshape(-1).view(torch.uint8)
                        for n in group if n in sharded]
                flat = torch.cat(mine) if mine else torch.zeros(0, dtype=torch.uint8)
                if flat.numel():
                    dist.send(flat, dst=0)
            peers: list[torch.Tensor] = []
            if h is not None:
                for src in range(1, self.world):
                    n = sum(_shard_bytes(sharded[m][0], self.world, src, cd)
                            for m in group if m in sharded)
                    buf = torch.empty(n, dtype=torch.uint8)
                    if n:
                        dist.recv(buf, src=src)
                    peers.append(buf)
                self.largest_held = max(self.largest_held, sum(b.numel() for b in peers))
            at = [0] * len(peers)
            for name in group:
                if name in sharded:
                    t, mine_t = sharded[name]
                    if h is not None:
                        h.begin(name, mine_t.dtype, t.shape)
                        h.update(mine_t)
                        for i, buf in enumerate(peers):
                            n = _shard_bytes(t, self.world, i + 1, cd)
                            h.update(buf[at[i]:at[i] + n].view(mine_t.dtype))
                            at[i] += n
                    if partial_dir is not None:
                        save[name] = DTensor.from_local(mine_t, t.device_mesh, t.placements,
                                                        shape=t.shape, stride=t.stride(),
                                                        run_check=False)
                    continue
                # Not sharded on dim 0 (optimizer steps, buffers, meta.step): whole.
                t = pairs[name].detach()
                full = _export(t.full_tensor() if isinstance(t, DTensor) else t, cd)
                if h is not None:
                    h.tensor(name, full)
                if partial_dir is not None:
                    save[name] = full
            del peers
        if partial_dir is not None:
            from node.train.shardckpt import save_shards  # noqa: PLC0415

            # A killed run's leftover partial directory is gone: run_training's resume
            # removed it before the first segment (rank 0 alone, the ranks waiting).
            t0 = time.perf_counter()
            save_shards(save, partial_dir)
            self.save_seconds += time.perf_counter() - t0
        if h is None:
            return None
        return ShardedLeaf(h.digest(), partial_dir)

    # One step.

    def step(self, t: int) -> float:
        ctx, state = self.ctx, self.live
        assert state is not None
        if state.step != t - 1:
            raise TrainingError(f"rank {self.rank} is at step {state.step}; cannot run {t}")
        b = ctx.spec.batch_size
        rows = rank_rows(b, self.world, self.rank)
        lr = lr_of(ctx, t)
        for group in state.optimizer.param_groups:
            group["lr"] = lr
        state.optimizer.zero_grad(set_to_none=True)
        params = list(state.model.parameters())
        cheat = self.cfg.cheat if self.rank == 1 else None
        if cheat == "skip" or cheat == "stale" and self._stale is not None and t % 2 == 0:
            part = self._last_part  # claims a loss, computes nothing
            grads = self._stale if cheat == "stale" else None
            for p, g in zip(params, grads or [torch.zeros_like(q) for q in params],
                            strict=True):
                p.grad = g.clone()
        else:
            x, y = batch(ctx, t)
            if x.is_floating_point():
                x = x.to(ctx.compute_dtype)
            from node.train.models import StepRandomness  # noqa: PLC0415

            rng = StepRandomness(step_generator(ctx, t), b)
            rng.begin_chunk(rows)  # this rank's rows of the whole batch's dropout masks
            with torch.autocast(ctx.device.type, dtype=torch.bfloat16,
                                enabled=ctx.spec.precision == "bf16"):
                logits = state.model(x[rows], rng)
            loss_r = state.model.loss(logits, y[rows])
            # FSDP2 averages in its reduce-scatter (gloo has no PREMUL_SUM for a plain
            # sum): (g_0 + g_1) / 2 and g_0/2 + g_1/2 are the same floats, /2 being exact.
            scale = 1 if self.world == 1 or self.cfg.mode == "fsdp" else self.world
            (loss_r if scale == 1 else loss_r / scale).backward()
            part = loss_r.detach()
            if cheat == "stale":
                self._stale = [p.grad.detach().clone() for p in params
                               if p.grad is not None]
        self._last_part = part
        if self.cfg.mode == "ddp" and self.world > 1:
            self._all_reduce([p for p in params if p.grad is not None])
        parts = [torch.zeros_like(part) for _ in range(self.world)]
        dist.all_gather(parts, part)
        loss = parts[0] if self.world == 1 else torch.stack(parts).mean()
        if ctx.spec.grad_clip is not None:
            torch.nn.utils.clip_grad_norm_(params, ctx.spec.grad_clip, foreach=False)
        state.optimizer.step()
        state.step = t
        return float(loss)

    @staticmethod
    def _all_reduce(params: list[torch.nn.Parameter]) -> None:
        """Sum every gradient over the ranks in one flat buffer (one collective)."""
        grads = [p.grad for p in params if p.grad is not None]
        flat = torch.cat([g.reshape(-1) for g in grads])
        dist.all_reduce(flat, op=dist.ReduceOp.SUM)
        at = 0
        for g in grads:
            n = g.numel()
            g.copy_(flat[at:at + n].view_as(g))
            at += n

    def segment(self, start: int, k: int) -> float:
        total = 0.0
        for t in range(start + 1, start + k + 1):
            total += self.step(t)
        return total / k


def _no_value(name: str) -> torch.Tensor:
    raise TrainingError(f"{name}: no initial value outside a run started from S_0")


def _rows(d0: int, world: int, rank: int) -> int:
    """Rows of a dim-0 size ``d0`` that rank ``rank`` holds under Shard(0): torch.chunk's
    split (chunks of ceil(d0 / world), the last ones short or empty)."""
    c = -(-d0 // world)
    return max(0, min(d0, (rank + 1) * c) - rank * c)


def shard_slice(t: Any, world: int, rank: int) -> slice | None:
    """The rows of ``t`` (a live tensor) that rank ``rank`` holds when FSDP2 shards it on
    dim 0 (torch.chunk's split); None for a tensor every rank holds whole."""
    from torch.distributed.tensor import DTensor, Shard  # noqa: PLC0415

    if not (isinstance(t, DTensor) and tuple(t.placements) == (Shard(0),)):
        return None
    at = -(-t.shape[0] // world) * rank
    return slice(at, at + _rows(t.shape[0], world, rank))


def read_rows(f: Any, name: str, rows: slice | None) -> torch.Tensor:
    """``rows`` (dim 0; None: all) of tensor ``name`` of the open safetensors file ``f``:
    a slice read, never the whole tensor unless asked."""
    try:
        return f.get_tensor(name) if rows is None else f.get_slice(name)[rows]
    except Exception as exc:  # safetensors' errors (truncated, missing tensor) are its own
        raise CheckpointError(f"cannot read {name} from the checkpoint ({exc}): corrupt "
                              "or truncated; fetch it again from another provider") from None


@contextlib.contextmanager
def _reading(path: str) -> Any:
    """The safetensors file at ``path``, open for slices; CheckpointError if unreadable."""
    from safetensors import safe_open  # noqa: PLC0415

    try:
        f = safe_open(path, "pt")
    except Exception as exc:  # SafetensorError, OSError: a bad header or no file
        raise CheckpointError(f"cannot open checkpoint {path} ({exc}): corrupt or "
                              "truncated; fetch it again from another provider") from None
    with f:
        yield f


def _shard_bytes(t: Any, world: int, rank: int, cd: torch.dtype) -> int:
    """Bytes of rank ``rank``'s exported shard of the Shard(0) tensor ``t``."""
    return _rows(t.shape[0], world, rank) * math.prod(t.shape[1:]) \
        * _export_dtype(t, cd).itemsize


def _batches(names: list[str], sharded: dict[str, tuple[Any, torch.Tensor]], world: int,
             limit: int, cd: torch.dtype) -> list[list[str]]:
    """``names`` in order, cut where the largest (rank 0's) shards of a batch would pass
    ``limit`` bytes; every rank computes the same cut from the global shapes."""
    out: list[list[str]] = [[]]
    size = 0
    for name in names:
        n = _shard_bytes(sharded[name][0], world, 0, cd) if name in sharded else 0
        if out[-1] and size + n > limit:
            out.append([])
            size = 0
        out[-1].append(name)
        size += n
    return out


def _fresh_optimizer_state(ctx: TrainContext, model: Any) -> TrainState:
    """A TrainState around an already built (sharded) model: a new optimizer with the
    step's zeroed state layout (node.train.step), its tensors shaped like the params."""
    from node.train.step import _make_optimizer, _optim_keys  # noqa: PLC0415

    opt = _make_optimizer(ctx, model)
    names = {id(p): n for n, p in model.named_parameters()}
    for p in model.parameters():
        st = opt.state[p]
        for key in _optim_keys(ctx.spec):
            st[key] = torch.zeros((), dtype=torch.float32) if key == "step" \
                else torch.zeros_like(p)
    return TrainState(model, opt, 0, names, ctx.compute_dtype)


class _Leader(SegmentBehavior):
    """Rank 0's behaviour inside ``run_training``: each segment is run by all ranks."""

    name = "distributed"

    def __init__(self, rank: _Rank, kept: set[int]) -> None:
        self.r = rank
        self.kept = kept  # leaf indices kept as checkpoints (node.train.sparse)
        self.train_seconds = 0.0  # inside the ranks' steps: the rest is recording
        self.sync_seconds = 0.0   # the one state broadcast of a run
        self.leaf_seconds = 0.0   # fsdp: hashes from shards and DCP saves, all ranks
        self.resumed_from = -1    # the step the run's first segment started from
        self.start = "broadcast"  # how the ranks got the start state (timing.json)

    def start_state(self, ctx: TrainContext, step: int,
                    sharded: Path | None) -> TrainState | None:
        """fsdp: every rank builds its shards of S_0 or loads them from the kept leaf's
        DCP checkpoint; anything else (ddp, a kept single file) comes by broadcast in
        the first segment."""
        r = self.r
        if r.cfg.mode != "fsdp" or sharded is None and step != 0:
            return None
        if sharded is not None and sharded.resolve() != \
                (Path(r.cfg.out_dir) / sharded.name).resolve():  # where the ranks look
            raise TrainingError(f"{sharded} is not in the run's directory {r.cfg.out_dir}")
        op = _START_S0 if sharded is None else _START_DCP
        dist.broadcast(torch.tensor([op, step, 0, 0], dtype=torch.int64), src=0)
        t0 = time.perf_counter()
        r.build_start(step, op == _START_DCP)
        state = r.live
        assert state is not None
        if op == _START_S0:
            state.leaf = r.start_leaf()
        self.sync_seconds = time.perf_counter() - t0
        self.resumed_from = step
        self.start = "s0" if op == _START_S0 else "dcp"
        return state

    def run_segment(self, ctx: TrainContext, state: TrainState, segment_index: int,
                    start_step: int, k: int) -> tuple[TrainState, float]:
        r = self.r
        first = r.live is None
        keep = segment_index + 1 in self.kept
        dist.broadcast(torch.tensor([_SEGMENT, start_step, int(first), int(keep)],
                                    dtype=torch.int64), src=0)
        if first:
            self.resumed_from = start_step
            t0 = time.perf_counter()
            r.sync_from(state_tensors(state), start_step)
            self.sync_seconds = time.perf_counter() - t0
            if r.cfg.mode == "ddp":
                r.live = state  # the trace writer hashes the live replicated state
        elif r.live is not None and r.live.step != start_step:
            raise TrainingError(f"rank 0 is at step {r.live.step}, segment starts {start_step}")
        t0 = time.perf_counter()
        loss = r.segment(start_step, k)
        self.train_seconds += time.perf_counter() - t0
        assert r.live is not None
        if r.cfg.mode == "ddp":
            return r.live, loss
        # fsdp: the live state stays sharded; the trace writer gets its hash (and the
        # kept leaf's DCP shards), never its tensors.
        t0 = time.perf_counter()
        r.live.leaf = r.leaf(_partial(r.cfg, start_step + k) if keep else None)
        self.leaf_seconds += time.perf_counter() - t0
        return r.live, loss

    def stop(self) -> None:
        dist.broadcast(torch.tensor([_STOP, 0, 0, 0], dtype=torch.int64), src=0)


def _partial(cfg: RankConfig, step: int) -> str:
    from node.train.shardckpt import partial_name  # noqa: PLC0415

    return str(Path(cfg.out_dir) / partial_name(step))


def _follow(r: _Rank) -> None:
    """Ranks 1..N-1: run whatever segment rank 0 announces until it says stop."""
    k = r.ctx.spec.checkpoint_interval
    while True:
        cmd = torch.zeros(4, dtype=torch.int64)
        dist.broadcast(cmd, src=0)
        op, start, first, keep = (int(v) for v in cmd)
        if op == _STOP:
            return
        if op in (_START_S0, _START_DCP):
            r.build_start(start, op == _START_DCP)
            if op == _START_S0:
                r.start_leaf()
            continue
        if first:
            r.sync_from(None, start)
        r.segment(start, k)
        if r.cfg.mode == "fsdp":
            r.leaf(_partial(r.cfg, start + k) if keep else None)


def _state_bytes(ctx: TrainContext) -> int:
    from node.train.layout import expected_bytes  # noqa: PLC0415

    return expected_bytes(ctx.spec)


def _die_with_parent(parent_pid: int) -> None:
    """Linux: the kernel kills this rank when the thread that started it ends; that
    thread waits in ``launch`` until every rank is dead, so only its death (the
    launcher killed) fires this."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):  # not Linux: the launcher's kill still applies
        pass
    if os.getppid() != parent_pid:  # the parent was gone before prctl took effect
        os._exit(1)


def rank_main(cfg: RankConfig) -> None:
    from node.datasets import load_dataset  # noqa: PLC0415
    from node.spec import parse_spec_json  # noqa: PLC0415
    from node.train.trace import run_training  # noqa: PLC0415

    _die_with_parent(cfg.parent_pid)
    spec = parse_spec_json(Path(cfg.spec_path).read_bytes())
    ctx = TrainContext.create(spec, load_dataset(cfg.dataset_path, spec.dataset_hash),
                              threads=cfg.threads)
    join_group(cfg.rank, cfg.world_size, cfg.store_port)
    try:
        r = _Rank(ctx, cfg)
        if cfg.rank == 0:
            from node.train.sparse import kept_indices  # noqa: PLC0415

            leader = _Leader(r, set(kept_indices(spec.segment_count, cfg.keep_every)))
            t0 = time.perf_counter()
            m = run_training(ctx, cfg.out_dir, cfg.job_id, leader, keep_every=cfg.keep_every)
            leader.stop()
            # Where rank 0's time went (bench/distributed.py reads it): steps vs the rest.
            timing = {"run_s": time.perf_counter() - t0, "train_s": leader.train_seconds,
                      "sync_s": leader.sync_seconds, "segments": m.segment_count,
                      "leaf_s": leader.leaf_seconds, "leaf_save_s": r.save_seconds,
                      "resumed_from": leader.resumed_from,
                      # fsdp: the largest piece rank 0 held to hash a leaf, against the
                      # whole state's bytes (tests: never the whole state)
                      "leaf_largest_bytes": r.largest_held,
                      # how the ranks got the run's start state ("s0", "dcp": each its
                      # shards; "broadcast": rank 0's whole state) and the most bytes of
                      # it rank 0 held at once
                      "start": leader.start, "start_largest_bytes": r.start_held,
                      "state_bytes": _state_bytes(ctx)}
            out = Path(cfg.out_dir)
            (out.parent / f"{out.name}.ranks" / "timing.json").write_text(json.dumps(timing))
        else:
            _follow(r)
    finally:
        dist.destroy_process_group()


# --- the launcher ----------------------------------------------------------------------


def _kill(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        if p.poll() is None:
            with contextlib.suppress(ProcessLookupError):  # it just exited
                os.killpg(p.pid, signal.SIGKILL)  # its session: the rank and anything it forked
    for p in procs:
        p.wait()


def _culprit(codes: list[int | None]) -> tuple[int, int] | None:
    """The failed rank to report: one killed by a signal before one that exited with an
    error, since the others fail on the dead rank's closed sockets (both can be seen
    in one poll on a loaded machine); then the lowest rank."""
    bad = [(i, c) for i, c in enumerate(codes) if c is not None and c != 0]
    return min(bad, key=lambda ic: (ic[1] >= 0, ic[0])) if bad else None


def _tail(path: Path, n: int = 1500) -> str:
    try:
        return path.read_bytes()[-n:].decode("utf-8", "replace")
    except OSError:
        return ""


@contextlib.contextmanager
def rank_store(world_size: int) -> Any:
    """The rendezvous of ``world_size`` ranks: a TCP store on 127.0.0.1; yields its port."""
    store = dist.TCPStore("127.0.0.1", 0, world_size + 1, is_master=True,
                          wait_for_workers=False, timeout=STORE_TIMEOUT)
    try:
        yield store.port
    finally:
        del store


def join_group(rank: int, world_size: int, port: int) -> None:
    """This rank joins the process group of the launcher's store (gloo)."""
    store = dist.TCPStore("127.0.0.1", port, world_size, is_master=False,
                          timeout=STORE_TIMEOUT)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world_size,
                            timeout=PG_TIMEOUT)


def run_ranks(module: str, configs: list[str], logs: Path, threads: int = 1,
              on_start: Callable[[list[int]], None] | None = None,
              after_failure: str = "") -> None:
    """Run ``python -m module <config>`` once per config (rank order), each a child without
    secrets in its own session, logging to ``logs/rank<i>.log``, until all exit. A rank
    that fails kills the others: TrainingError naming it (and ``after_failure``). Every
    rank is dead by the time this returns or raises."""
    logs.mkdir(parents=True, exist_ok=True)
    root = str(Path(__file__).resolve().parents[2])  # the tree `node` is imported from
    env = child_env({"PYTHONPATH": os.pathsep.join(
        [root, *filter(None, [os.environ.get("PYTHONPATH")])]),
        "OMP_NUM_THREADS": str(threads)})
    procs: list[subprocess.Popen[bytes]] = []
    world = len(configs)
    try:
        for rank, cfg in enumerate(configs):
            with open(logs / f"rank{rank}.log", "wb") as log:
                procs.append(subprocess.Popen(
                    [sys.executable, "-m", module, cfg],
                    env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    close_fds=True, start_new_session=True))
        if on_start is not None:
            on_start([p.pid for p in procs])
        while True:
            codes = [p.poll() for p in procs]
            culprit = _culprit(codes)
            if culprit is not None:
                i, c = culprit
                raise TrainingError(f"rank {i} of {world} exited with {c}; {after_failure}. "
                                    f"Its log ends: {_tail(logs / f'rank{i}.log')}")
            if all(c == 0 for c in codes):
                return
            time.sleep(0.05)
    finally:
        _kill(procs)


def launch(spec_path: str | Path, dataset_path: str | Path, out_dir: str | Path, job_id: int,
           world_size: int, threads: int = 1, mode: Mode = "ddp", keep_every: int = 1,
           cheat: Cheat | None = None,
           on_start: Callable[[list[int]], None] | None = None,
           hash_batch_bytes: int = HASH_BATCH_BYTES) -> Any:
    """Train the job with ``world_size`` rank processes into ``out_dir`` (resuming what
    is there, as ``run_training`` does); return its TraceManifest. TrainingError if a
    rank fails; every rank is dead by the time this returns or raises."""
    from node.spec import parse_spec_json  # noqa: PLC0415
    from node.train.trace import read_manifest  # noqa: PLC0415

    spec = parse_spec_json(Path(spec_path).read_bytes())
    check_world(spec.batch_size, world_size)
    if mode not in ("ddp", "fsdp"):
        raise TrainingError(f"unknown distributed mode {mode!r}")
    if cheat is not None and (mode != "ddp" or world_size < 2):
        raise TrainingError("a cheating rank needs data-parallel mode and >= 2 ranks")
    out = Path(out_dir)
    logs = out.parent / f"{out.name}.ranks"
    with rank_store(world_size) as port:
        configs = [json.dumps(asdict(RankConfig(
            rank, world_size, port, str(spec_path), str(dataset_path), str(out), job_id,
            threads, mode, keep_every, os.getpid(), cheat, hash_batch_bytes)))
            for rank in range(world_size)]
        run_ranks("node.train.distributed", configs, logs, threads, on_start,
                  "the job resumes from its last kept checkpoint when restarted")
    return read_manifest(out)


if __name__ == "__main__":
    rank_main(RankConfig(**json.loads(sys.argv[1])))
