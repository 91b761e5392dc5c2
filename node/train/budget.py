"""What a job needs, estimated from its spec alone: nothing is built, no torch.

A solver compares this with its own memory and time before it spends anything
on a job (node.data.probe measures the jobs that pass, in a child process).
The figures are fp32 and deliberately generous: weights, gradients, optimizer
state, forward and backward activations, one batch of inputs, the checkpoint
copies the trace writer keeps in flight, the dataset as loaded, and the
interpreter with torch.

Public API::

    estimate(spec, dataset_bytes=0) -> Budget     # .total_mb, .params, ...
    estimate_world(spec, world_size, mode="ddp", dataset_bytes=0) -> WorldBudget
    train_flops_per_step(spec) -> int             # forward + backward, analytic
    min_train_seconds(spec, gflops) -> float      # an optimistic lower bound
    machine_memory_mb() -> int
"""

from __future__ import annotations

import math
import os
from dataclasses import asdict, dataclass

from node.spec import TEXT_CONFIGS, CNNConfig, JobSpec, MLPConfig, TransformerLMConfig
from node.spec_hf import HF_CONFIG_TYPES
from node.tensorfile import DTYPE_BYTES
from node.train.dist_plan import HASH_BATCH_BYTES
from node.train.layout import expected_layout
from node.train.shardckpt import BATCH_BYTES

BYTES_PER_FLOAT = 4
RUNTIME_BASE_MB = 512          # python + torch + polnet imported, before any job data
CHECKPOINT_COPIES = 3          # trace writer: depth 2 in flight + the one being exported
DATASET_EXPANSION = 10         # raw bytes + parsed tensors + float32/int64 copies
#: The probe's measured GFLOP/s is a busy machine's matmul; allow this much more
#: before calling a job too slow from its FLOPs alone (the probe measures the rest).
FLOPS_GENEROSITY = 4.0


@dataclass(frozen=True)
class Budget:
    """Bytes a job needs, by part; ``total_mb`` is what a solver compares."""

    params: int
    weights_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    activation_bytes: int
    batch_bytes: int
    checkpoint_bytes: int
    dataset_bytes: int
    runtime_bytes: int

    @property
    def total_bytes(self) -> int:
        return (self.weights_bytes + self.grads_bytes + self.optimizer_bytes
                + self.activation_bytes + self.batch_bytes + self.checkpoint_bytes
                + self.dataset_bytes + self.runtime_bytes)

    @property
    def total_mb(self) -> int:
        return -(-self.total_bytes // 2**20)

    def summary(self) -> str:
        mb = {k: -(-v // 2**20) for k, v in asdict(self).items() if k.endswith("_bytes")}
        parts = ", ".join(f"{k.removesuffix('_bytes')} {v}" for k, v in mb.items() if v)
        return f"~{self.total_mb} MB for {self.params:,} params ({parts} MB)"


def _batch_bytes(spec: JobSpec) -> int:
    m, b = spec.model, spec.batch_size
    if isinstance(m, TEXT_CONFIGS):
        return 3 * b * (m.context + 1) * 8  # int64 windows, inputs and shifted targets
    if isinstance(m, CNNConfig):
        return b * (m.in_channels * m.image_size ** 2 * BYTES_PER_FLOAT + 8)
    assert isinstance(m, MLPConfig)
    return b * (m.input_dim * BYTES_PER_FLOAT + 8)


def estimate(spec: JobSpec, dataset_bytes: int = 0) -> Budget:
    """The memory a solver needs to train ``spec`` (``dataset_bytes``: the file size)."""
    p = spec.model.param_count()
    weights = p * BYTES_PER_FLOAT
    opt = p * spec.optimizer.state_floats_per_param() * BYTES_PER_FLOAT
    return Budget(
        params=p, weights_bytes=weights, grads_bytes=weights, optimizer_bytes=opt,
        activation_bytes=2 * spec.model.activation_floats(spec.batch_size) * BYTES_PER_FLOAT,
        batch_bytes=_batch_bytes(spec),
        checkpoint_bytes=CHECKPOINT_COPIES * (weights + opt),
        dataset_bytes=DATASET_EXPANSION * max(0, dataset_bytes),
        runtime_bytes=RUNTIME_BASE_MB * 2**20)


@dataclass(frozen=True)
class WorldBudget:
    """A distributed run's memory (node.train.distributed): rank 0 (which keeps the
    trace: under FSDP2 it never holds the whole state) and each other rank;
    ``total_mb`` is the aggregate a solver compares with its aggregate memory."""

    world_size: int
    rank0: Budget
    other: Budget

    @property
    def total_mb(self) -> int:
        return self.rank0.total_mb + (self.world_size - 1) * self.other.total_mb


def estimate_world(spec: JobSpec, world_size: int, mode: str = "ddp",
                   dataset_bytes: int = 0) -> WorldBudget:
    """Per-rank memory of ``spec`` over ``world_size`` ranks. Every rank loads the
    dataset and a runtime; activations and the batch are a 1/N share. ``ddp``: every
    rank holds the whole state; ``fsdp``: weights, gradients and optimizer state
    are 1/N each (rounded up); rank 0 also holds, at most, one tensor whole (S_0 is
    built, and its file written, a tensor at a time), one hash batch per peer (a leaf
    is hashed from the shards) and one read batch (a kept leaf's shards checked), each
    capped by the whole state (node.train.distributed)."""
    one = estimate(spec, dataset_bytes)
    if world_size <= 1:
        return WorldBudget(1, one, one)

    def share(v: int) -> int:
        return -(-v // world_size)

    state = (one.weights_bytes, one.grads_bytes, one.optimizer_bytes)
    w, g, o = (share(v) for v in state) if mode == "fsdp" else state
    other = Budget(params=one.params, weights_bytes=w, grads_bytes=g, optimizer_bytes=o,
                   activation_bytes=share(one.activation_bytes),
                   batch_bytes=one.batch_bytes,  # each rank indexes the whole batch
                   checkpoint_bytes=0, dataset_bytes=one.dataset_bytes,
                   runtime_bytes=one.runtime_bytes)
    extra = one.checkpoint_bytes
    if mode == "fsdp":
        whole = one.weights_bytes + one.optimizer_bytes
        largest = max(math.prod(shape) * DTYPE_BYTES[dt]
                      for dt, shape in expected_layout(spec).values())
        extra = sum(min(whole, v) for v in (
            largest, (world_size - 1) * HASH_BATCH_BYTES, BATCH_BYTES))
    rank0 = Budget(**{**asdict(other), "checkpoint_bytes": extra})
    return WorldBudget(world_size, rank0, other)


def _forward_macs(spec: JobSpec) -> int:
    m, b = spec.model, spec.batch_size
    if isinstance(m, MLPConfig):
        dims = [m.input_dim, *m.hidden, m.num_classes]
        return b * sum(x * y for x, y in zip(dims, dims[1:], strict=False))
    if isinstance(m, CNNConfig):
        total, c_in, side = 0, m.in_channels, m.image_size
        for c in m.channels:
            total += side * side * c_in * c * 9
            c_in, side = c, side // 2
        return b * (total + m.flat_features() * m.hidden + m.hidden * m.num_classes)
    if isinstance(m, HF_CONFIG_TYPES):
        return m.forward_macs(b)
    assert isinstance(m, TransformerLMConfig)
    d, t = m.d_model, m.context
    per_token = m.n_layers * (4 * d * d + 2 * d * m.d_ff + 2 * t * d) + d * m.vocab_size
    return b * t * per_token


def train_flops_per_step(spec: JobSpec) -> int:
    """Forward (2 FLOPs a multiply-accumulate) and backward (twice the forward)."""
    return 3 * 2 * _forward_macs(spec)


def min_train_seconds(spec: JobSpec, gflops: float) -> float:
    """A lower bound on the training time at ``FLOPS_GENEROSITY`` x ``gflops``."""
    if gflops <= 0:
        return 0.0
    return train_flops_per_step(spec) * spec.total_steps / (gflops * FLOPS_GENEROSITY * 1e9)


def machine_memory_mb() -> int:
    """Physical memory of this machine."""
    return int(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20)
