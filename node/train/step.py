"""The one training step every role runs: solver, verifier replay, dispute juror.

Everything a step consumes is a function of ``(spec.seed, step)``:

* S_0: the model from ``derive_seed(seed, "init")`` on the CPU, with an
  explicitly zeroed optimizer state (so every S_t has the same tensor names);
* the batch of step t (1-based): epoch ``e = (t-1) // steps_per_epoch`` uses
  the permutation ``randperm(N)`` from ``derive_seed(seed, "epoch", e)``; the
  last partial batch of an epoch is dropped;
* dropout masks: a CPU generator seeded with ``derive_seed(seed, "step", t)``;
* the learning rate: a pure function of ``t`` (``spec.schedule``).
There is no other hidden state, so ``load_state`` + ``train_step`` continues a
run bit for bit. Deterministic algorithms are on and the thread count is fixed
per context.

Honest knobs (run-local, not in the spec: other hardware or a solver may
differ in them; the verifier's drift matrix uses them): ``threads``,
``micro_batches`` (gradient accumulation: m equal chunks, loss/m each, one
optimizer step; dropout masks are the unsplit step's, see
``models.StepRandomness``), ``optimizer_impl`` ("single" | "foreach" |
"fused": torch's kernel flags) and ``compute_dtype`` (float64: model and
optimizer state in fp64; ``state_tensors`` casts back to fp32, the checkpoint
dtype). The defaults define the reference bits.

Public API (the verifier builds on exactly this)::

    ctx = TrainContext.create(spec, dataset, device="cpu", threads=1,
                              micro_batches=1, optimizer_impl="single",
                              compute_dtype=torch.float32)
    state = init_state(ctx)                        # S_0, state.step == 0
    loss = train_step(ctx, state, step)            # S_{step-1} -> S_step in place
    tensors = state_tensors(state)                 # CPU copies, names below
    state = load_state(ctx, tensors, step=None)    # CheckpointError if they don't fit
    batch_indices(ctx, step) -> Tensor; step_generator(ctx, step) -> Generator

State tensor names: ``model.<param or buffer>``, ``optim.<param>.<key>``
(SGD: ``momentum_buffer``; AdamW: ``step``, ``exp_avg``, ``exp_avg_sq``) and
``meta.step`` (int64 scalar: binds the step number into the state hash).
"""

from __future__ import annotations

import hashlib
import math
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

import torch

from node.datasets import Dataset
from node.errors import CheckpointError, SpecError, TrainingError
from node.spec import TEXT_CONFIGS, AdamWConfig, JobSpec, SGDConfig
from node.train.models import PolnetModel, StepRandomness, build_model

STEP_KEY = "meta.step"
CHECKPOINT_DTYPE = torch.float32
OptimizerImpl = Literal["single", "foreach", "fused"]


def derive_seed(seed: int, *parts: object) -> int:
    """A 63-bit seed from the job seed and a purpose, e.g. ("step", 17).

    Hashing (not ``seed + step``) keeps streams of different purposes apart."""
    label = "/".join(["polnet", str(seed), *map(str, parts)]).encode()
    return int.from_bytes(hashlib.sha256(label).digest()[:8], "little") >> 1


_PREPARE = threading.Lock()


def prepare_torch() -> None:
    """Deterministic algorithms on, once per process. The first call imports torch's
    compiler stack (about 4 s of GIL-holding imports, more on a busy machine): a role
    starts this in a worker thread as it starts, so the first job does not pay it, and
    the lock makes a job that comes first wait for that one import, not start another."""
    with _PREPARE:
        if not torch.are_deterministic_algorithms_enabled() \
                or torch.is_deterministic_algorithms_warn_only_enabled():
            torch.use_deterministic_algorithms(True)


@dataclass
class TrainContext:
    """A spec bound to its data, a device and a thread count. Create with ``create``."""

    spec: JobSpec
    dataset: Dataset
    device: torch.device
    threads: int
    inputs: torch.Tensor      # vision: x [N, C, H, W]; text: tokens [L]
    targets: torch.Tensor | None
    num_samples: int
    micro_batches: int = 1
    optimizer_impl: OptimizerImpl = "single"
    compute_dtype: torch.dtype = torch.float32
    # A collaborative round's inner run (node.train.rounds) numbers its trace 0..H but
    # draws data, dropout and learning rate at the job-wide step t*H + h: ``step_offset``
    # is t*H and ``schedule_steps`` the schedule's length (H x R; None: spec.total_steps).
    step_offset: int = 0
    schedule_steps: int | None = None
    # S_0's weights of a fine-tuning job (spec.init_weights; node.train.init_weights
    # checked the file against the hash); None: the seeded weights.
    init_weights: Mapping[str, torch.Tensor] | None = None
    _perm_cache: dict[int, torch.Tensor] = field(default_factory=dict, repr=False)

    @classmethod
    def create(cls, spec: JobSpec, dataset: Dataset, device: str | torch.device = "cpu",
               threads: int = 1, micro_batches: int = 1,
               optimizer_impl: OptimizerImpl = "single",
               compute_dtype: torch.dtype = torch.float32,
               init_weights: Mapping[str, torch.Tensor] | None = None) -> TrainContext:
        """``init_weights``: S_0's weights when the spec names them (load them with
        ``node.train.init_weights.load_init_weights``)."""
        if dataset.hash_hex != spec.dataset_hash:
            raise SpecError(f"dataset {dataset.hash_hex} is not the spec's {spec.dataset_hash}",
                            field="dataset_hash")
        if threads < 1:
            raise TrainingError("threads must be >= 1")
        if micro_batches < 1 or spec.batch_size % micro_batches:
            raise TrainingError(f"micro_batches {micro_batches} must divide batch_size "
                                f"{spec.batch_size}")
        if optimizer_impl not in ("single", "foreach", "fused"):
            raise TrainingError(f"unknown optimizer_impl {optimizer_impl!r}")
        if compute_dtype not in (torch.float32, torch.float64):
            raise TrainingError("compute_dtype must be torch.float32 or torch.float64")
        if compute_dtype == torch.float64 and spec.precision != "fp32":
            raise TrainingError("an fp64 replay only makes sense for an fp32 job")
        if (spec.init_weights is None) != (init_weights is None):
            raise SpecError("the spec names init weights but none were given (fetch the "
                            "file it names)" if init_weights is None else
                            "init weights were given but the spec names none",
                            field="init_weights")
        dev = torch.device(device)
        if dev.type == "cuda":  # cuBLAS is only deterministic with a fixed workspace
            os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
            # fp32 means IEEE fp32: TF32 (10-bit mantissa; cuDNN's default for convs)
            # drifts far beyond the fp32 tolerance (bench/drift_gpu.py).
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
        prepare_torch()
        torch.set_num_threads(threads)
        inputs, targets, n = _bind_data(spec, dataset)
        if n < spec.batch_size:
            raise SpecError(f"batch_size {spec.batch_size} exceeds the dataset's {n} samples",
                            field="batch_size")
        return cls(spec, dataset, dev, threads, inputs, targets, n, micro_batches,
                   optimizer_impl, compute_dtype, init_weights=init_weights)

    @property
    def steps_per_epoch(self) -> int:
        return self.num_samples // self.spec.batch_size

    def permutation(self, epoch: int) -> torch.Tensor:
        perm = self._perm_cache.get(epoch)
        if perm is None:
            gen = torch.Generator(device="cpu")
            gen.manual_seed(derive_seed(self.spec.seed, "epoch", epoch))
            perm = torch.randperm(self.num_samples, generator=gen)
            self._perm_cache = {epoch: perm}  # steps run in order: one epoch is enough
        return perm

    def sequences(self, idx: torch.Tensor, length: int) -> torch.Tensor:
        """Token windows ``[len(idx), length]`` of an LM's samples ``idx``: non-overlapping
        windows of ``context`` tokens, each with the next token (node.data.stream
        overrides this to read shards)."""
        win = idx.unsqueeze(1) * (length - 1) + torch.arange(length)
        return self.inputs[win]

    def before_step(self, step: int) -> None:
        """Called before step ``step`` draws its batch (a streamed dataset prefetches)."""


def _bind_data(spec: JobSpec, ds: Dataset) -> tuple[torch.Tensor, torch.Tensor | None, int]:
    m = spec.model
    if isinstance(m, TEXT_CONFIGS):
        if ds.kind != "text":
            raise SpecError(f"{m.family} needs a text dataset", field="dataset_hash")
        if len(ds.vocab) > m.vocab_size:
            raise SpecError(f"dataset vocab has {len(ds.vocab)} symbols > {m.vocab_size}",
                            field="model.vocab_size")
        tokens = ds.tensors["tokens"].to(torch.int64)
        # Non-overlapping windows of context+1 tokens (input + shifted target).
        return tokens, None, (tokens.numel() - 1) // m.context
    if ds.kind != "vision":
        raise SpecError(f"{m.family} needs a vision dataset", field="dataset_hash")
    x, y = ds.tensors["x"].to(torch.float32), ds.tensors["y"].to(torch.int64)
    if m.family == "mlp" and x[0].numel() != m.input_dim:
        raise SpecError(f"dataset samples have {x[0].numel()} features", field="model.input_dim")
    if m.family == "cnn" and tuple(x.shape[1:]) != (m.in_channels, m.image_size, m.image_size):
        raise SpecError(f"dataset samples are {tuple(x.shape[1:])}", field="model.image_size")
    if int(y.max()) >= m.num_classes:
        raise SpecError(f"dataset has label {int(y.max())}", field="model.num_classes")
    return x, y, x.shape[0]


@dataclass
class TrainState:
    """Model + optimizer after ``step`` steps. Mutated in place by ``train_step``."""

    model: PolnetModel
    optimizer: torch.optim.Optimizer
    step: int
    param_names: dict[int, str]  # id(param) -> name, for optimizer state naming
    compute_dtype: torch.dtype = torch.float32
    #: Set by a behaviour whose state no process holds whole (node.train.distributed,
    #: fsdp): the leaf's hash, built from the shards, stands in for its tensors.
    leaf: ShardedLeaf | None = None


@dataclass(frozen=True)
class ShardedLeaf:
    """A leaf state given by its hash (built from its shards in a fixed order: the
    ordinary state hash) and, for a kept leaf, the directory its ranks wrote its
    ``torch.distributed.checkpoint`` shards into (node.train.shardckpt), else None."""

    state_hash: bytes
    partial_dir: str | None = None
    #: S_0 of a sharded run (kept as a single file): its tensors' (dtype, shape) and
    #: its tensor of a name, whole, made afresh at each call, so that its file is
    #: written one tensor at a time.
    layout: Mapping[str, tuple[torch.dtype, tuple[int, ...]]] | None = None
    whole: Callable[[str], torch.Tensor] | None = None


def _make_optimizer(ctx: TrainContext, model: PolnetModel) -> torch.optim.Optimizer:
    o = ctx.spec.optimizer
    params = list(model.parameters())
    # Reference: foreach=False, one fixed kernel path on every device.
    flags = {"single": {"foreach": False}, "foreach": {"foreach": True},
             "fused": {"fused": True}}[ctx.optimizer_impl]
    if isinstance(o, SGDConfig):
        return torch.optim.SGD(params, lr=o.lr, momentum=o.momentum, nesterov=o.nesterov,
                               weight_decay=o.weight_decay, **flags)
    assert isinstance(o, AdamWConfig)
    return torch.optim.AdamW(params, lr=o.lr, betas=(o.beta1, o.beta2), eps=o.eps,
                             weight_decay=o.weight_decay, **flags)


def _optim_keys(spec: JobSpec) -> tuple[str, ...]:
    return ("momentum_buffer",) if isinstance(spec.optimizer, SGDConfig) \
        else ("step", "exp_avg", "exp_avg_sq")


def _fresh_state(ctx: TrainContext) -> TrainState:
    model = build_model(ctx.spec.model, derive_seed(ctx.spec.seed, "init"))
    if ctx.init_weights is not None:  # fine-tuning: S_0's weights are the file's
        model.load_state_dict(ctx.init_weights, strict=True)
    model = model.to(device=ctx.device, dtype=ctx.compute_dtype)  # fp32 -> fp64 is exact
    model.train()
    opt = _make_optimizer(ctx, model)
    names = {id(p): n for n, p in model.named_parameters()}
    step_device = ctx.device if ctx.optimizer_impl == "fused" else torch.device("cpu")
    for p in model.parameters():
        st = opt.state[p]
        for key in _optim_keys(ctx.spec):
            # AdamW's step counter: a float32 scalar, on the CPU unless fused (torch's layout).
            st[key] = torch.zeros((), dtype=torch.float32, device=step_device) \
                if key == "step" else torch.zeros_like(p)
    return TrainState(model, opt, 0, names, ctx.compute_dtype)


def init_state(ctx: TrainContext) -> TrainState:
    """S_0: seeded weights, zeroed optimizer state."""
    return _fresh_state(ctx)


def initial_state_hash(ctx: TrainContext) -> bytes:
    """Hash of S_0, which follows from the spec alone: the submitter fixes it on chain
    (``postJob``) so no solver can start from weights of its choosing."""
    from node.proof import state_hash  # noqa: PLC0415 - proof imports torch lazily too

    return state_hash(state_tensors(init_state(ctx)))


def _export_dtype(t: torch.Tensor, compute_dtype: torch.dtype) -> torch.dtype:
    return CHECKPOINT_DTYPE if t.dtype == compute_dtype != CHECKPOINT_DTYPE else t.dtype


def _export(t: torch.Tensor, compute_dtype: torch.dtype) -> torch.Tensor:
    return t.detach().to("cpu", dtype=_export_dtype(t, compute_dtype), copy=True).contiguous()


def _live_pairs(state: TrainState) -> list[tuple[str, torch.Tensor]]:
    """(checkpoint name, live tensor) of the weights and optimizer state, ``meta.step``
    aside: the one naming ``state_tensors`` and ``state_views`` export under."""
    pairs = [(f"model.{n}", t) for n, t in state.model.state_dict().items()]
    for p, st in state.optimizer.state.items():
        pname = state.param_names[id(p)]
        pairs += [(f"optim.{pname}.{key}", t) for key, t in st.items()
                  if isinstance(t, torch.Tensor)]
    return pairs


def state_tensors(state: TrainState,
                  into: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """Weights, optimizer state and ``meta.step`` as detached contiguous CPU copies
    (fp64 compute state cast to fp32, the checkpoint dtype). ``into``: an earlier
    result of this state's spec to copy into instead; reused pages copy ~5x faster
    than fresh ones (a 25M-parameter state: 17 ms vs 90 ms)."""
    pairs = _live_pairs(state)
    if into is not None:
        # Anything else than the buffers' names, shapes and dtypes (a state a cheat
        # reshaped, say) is exported afresh: a copy must never change what is hashed.
        if len(pairs) + 1 != len(into) or any(
                (dst := into.get(n)) is None or dst.shape != t.shape
                or dst.dtype != _export_dtype(t, state.compute_dtype) for n, t in pairs):
            return state_tensors(state)
        with torch.no_grad():
            for n, t in pairs:
                into[n].copy_(t)
            into[STEP_KEY].fill_(state.step)
        return into
    out = {n: _export(t, state.compute_dtype) for n, t in pairs}
    out[STEP_KEY] = torch.tensor(state.step, dtype=torch.int64)
    return out


def state_views(state: TrainState) -> dict[str, torch.Tensor]:
    """What ``state_tensors`` exports, without a copy where none is needed (a CPU
    tensor already in its checkpoint dtype is the live buffer itself): for hashing
    a state on the training thread before training mutates it again. The bytes
    are ``state_tensors``'s, so the hash is too."""
    cd = state.compute_dtype
    out = {n: t.detach() if t.device.type == "cpu" and t.dtype == _export_dtype(t, cd)
           else _export(t, cd) for n, t in _live_pairs(state)}
    out[STEP_KEY] = torch.tensor(state.step, dtype=torch.int64)
    return out


def load_state(ctx: TrainContext, tensors: Mapping[str, torch.Tensor],
               step: int | None = None) -> TrainState:
    """Rebuild a state from ``state_tensors`` output; names, shapes and dtypes must match."""
    state = _fresh_state(ctx)
    want = state_tensors(state)
    missing, extra = want.keys() - tensors.keys(), tensors.keys() - want.keys()
    if missing or extra:
        raise CheckpointError(f"state tensors do not fit this spec: missing "
                              f"{sorted(missing)[:5]}, unexpected {sorted(extra)[:5]}")
    for name, ref in want.items():
        t = tensors[name]
        if t.shape != ref.shape or t.dtype != ref.dtype:
            raise CheckpointError(f"{name}: {t.dtype}{list(t.shape)} where the spec needs "
                                  f"{ref.dtype}{list(ref.shape)}")
    got_step = int(tensors[STEP_KEY])
    if step is not None and got_step != step:
        raise CheckpointError(f"state is at step {got_step}, expected {step}")
    with torch.no_grad():
        for n, t in state.model.state_dict().items():
            t.copy_(tensors[f"model.{n}"])
        for p, st in state.optimizer.state.items():
            pname = state.param_names[id(p)]
            for key in st:
                st[key].copy_(tensors[f"optim.{pname}.{key}"])
    state.step = got_step
    return state


def batch_indices(ctx: TrainContext, step: int) -> torch.Tensor:
    """Sample indices of step ``step`` (1-based, of the context's own numbering)."""
    if step < 1:
        raise TrainingError(f"steps are 1-based, got {step}")
    step += ctx.step_offset
    b = ctx.spec.batch_size
    epoch, within = divmod(step - 1, ctx.steps_per_epoch)
    return ctx.permutation(epoch)[within * b:(within + 1) * b]


def step_generator(ctx: TrainContext, step: int) -> torch.Generator:
    gen = torch.Generator(device="cpu")
    gen.manual_seed(derive_seed(ctx.spec.seed, "step", step + ctx.step_offset))
    return gen


def batch(ctx: TrainContext, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    ctx.before_step(step)
    idx = batch_indices(ctx, step)
    if ctx.targets is None:
        seq = ctx.sequences(idx, ctx.spec.model.context + 1)  # type: ignore[union-attr]
        x, y = seq[:, :-1], seq[:, 1:]
    else:
        x, y = ctx.inputs[idx], ctx.targets[idx]
    return x.to(ctx.device), y.to(ctx.device)


def lr_at(spec: JobSpec, step: int, total_steps: int | None = None) -> float:
    base, s = spec.optimizer.lr, spec.schedule
    if step <= s.warmup_steps:
        return base * step / s.warmup_steps
    if s.kind == "constant":
        return base
    total = spec.total_steps if total_steps is None else total_steps
    frac = (step - s.warmup_steps) / max(1, total - s.warmup_steps)
    return base * (s.min_lr_ratio + (1 - s.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac)))


def lr_of(ctx: TrainContext, step: int) -> float:
    """The learning rate of the context's step ``step`` (its offset and schedule applied)."""
    return lr_at(ctx.spec, step + ctx.step_offset, ctx.schedule_steps)


def train_step(ctx: TrainContext, state: TrainState, step: int) -> float:
    """Run step ``step`` on ``state`` (which must be S_{step-1}); return its loss."""
    if state.step != step - 1:
        raise TrainingError(f"state is at step {state.step}; cannot run step {step}")
    x, y = batch(ctx, step)
    if x.is_floating_point():
        x = x.to(ctx.compute_dtype)
    rng = StepRandomness(step_generator(ctx, step), ctx.spec.batch_size)
    lr = lr_of(ctx, step)
    for group in state.optimizer.param_groups:
        group["lr"] = lr
    state.optimizer.zero_grad(set_to_none=True)
    m = ctx.micro_batches
    chunk = ctx.spec.batch_size // m
    losses = []
    for i in range(m):
        rows = slice(i * chunk, (i + 1) * chunk)
        rng.begin_chunk(rows)
        with torch.autocast(ctx.device.type, dtype=torch.bfloat16,
                            enabled=ctx.spec.precision == "bf16"):
            logits = state.model(x[rows], rng)
        part = state.model.loss(logits, y[rows])
        (part if m == 1 else part / m).backward()
        losses.append(part.detach())
    loss = losses[0] if m == 1 else torch.stack(losses).mean()
    if ctx.spec.grad_clip is not None:
        torch.nn.utils.clip_grad_norm_(state.model.parameters(), ctx.spec.grad_clip,
                                       foreach=False)
    state.optimizer.step()
    state.step = step
    value = float(loss.detach())
    if not math.isfinite(value):
        raise TrainingError(f"loss is {value} at step {step}: the job diverged")
    return value
