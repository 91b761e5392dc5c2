"""Who trains on what in a collaborative job (issue 13): disjoint per-round shards.

Round ``t`` (0-based) permutes the training samples (all but the trailing
``holdout_samples``) with ``randperm`` from ``derive_seed(seed, "collab", "round", t)``
and cuts the front into ``workers.max`` contiguous shards of
``S = n_train // workers.max`` samples; slot ``i`` gets shard ``i``. Its ``H`` inner
steps take ``H`` batches of ``B`` consecutive samples from the front of that shard
(``H * B <= S`` is checked), so within a round no sample is used twice, by one
worker or by two, and the assignment is a function of (spec, round, slot) alone:
anyone recomputes it and no worker picks its data.

The contexts plug into ``node.train.step`` unchanged. Inner step ``h`` (1-based) of
round ``t`` is global step ``t * H + h``, and a context's "epoch" is the round
(``steps_per_epoch = H``), so ``train_step``'s ``batch(ctx, step)`` reads the
assignment through ``ctx.permutation(round)``. A worker's context runs the inner
job with its own seed ``derive_seed(seed, "collab", "slot", i)``, which only feeds
``step_generator``: dropout masks differ between workers at the same step. (Initial
weights come from the job's own seed, ``node.train.diloco.initial_outer_state``.)

Public API::

    worker_context(spec, dataset, slot, threads=1) -> ShardContext
    data_parallel_context(spec, dataset, slots, threads=1) -> ShardContext
        # one solver, batch len(slots) * B: step h's batch is the slots' step-h
        # batches side by side (the synchronous data-parallel baseline)
    shard_indices(spec, num_samples, round_index, slot) -> Tensor[H * B]
    holdout_indices(spec, num_samples) -> Tensor
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, fields
from typing import Any

import torch

from node.datasets import Dataset
from node.errors import SpecError, TrainingError
from node.spec import CollaborativeSpec, parse_spec
from node.train.step import OptimizerImpl, TrainContext, derive_seed


def _train_samples(spec: CollaborativeSpec, num_samples: int) -> int:
    n_train = num_samples - spec.holdout_samples
    shard = n_train // spec.workers.max
    need = spec.inner_steps * spec.inner.batch_size
    if shard < need:
        raise SpecError(f"a shard holds {max(shard, 0)} samples ({num_samples} in the dataset, "
                        f"{spec.holdout_samples} held out, {spec.workers.max} slots) but "
                        f"inner_steps x batch_size needs {need}", field="inner_steps")
    return n_train


def _check_slot(spec: CollaborativeSpec, slot: int) -> None:
    if not 0 <= slot < spec.workers.max:
        raise TrainingError(f"slot {slot} is not in 0..{spec.workers.max - 1}")


def shard_indices(spec: CollaborativeSpec, num_samples: int, round_index: int,
                  slot: int) -> torch.Tensor:
    """The ``H * B`` sample indices of ``slot`` in round ``round_index``, in step order."""
    _check_slot(spec, slot)
    if not 0 <= round_index < spec.outer_rounds:
        raise TrainingError(f"round {round_index} is not in 0..{spec.outer_rounds - 1}")
    n_train = _train_samples(spec, num_samples)
    gen = torch.Generator(device="cpu")
    gen.manual_seed(derive_seed(spec.inner.seed, "collab", "round", round_index))
    perm = torch.randperm(n_train, generator=gen)
    start = slot * (n_train // spec.workers.max)
    return perm[start:start + spec.inner_steps * spec.inner.batch_size]


def holdout_indices(spec: CollaborativeSpec, num_samples: int) -> torch.Tensor:
    """The held-out samples: in no shard of any round."""
    n_train = _train_samples(spec, num_samples)
    return torch.arange(n_train, num_samples)


@dataclass
class ShardContext(TrainContext):
    """A TrainContext whose epoch ``t`` is round ``t`` of the given slots' shards."""

    collab: CollaborativeSpec = field(kw_only=True)
    slots: tuple[int, ...] = field(kw_only=True)

    @property
    def steps_per_epoch(self) -> int:
        return self.collab.inner_steps

    def permutation(self, epoch: int) -> torch.Tensor:
        perm = self._perm_cache.get(epoch)
        if perm is None:
            h, b = self.collab.inner_steps, self.collab.inner.batch_size
            per_slot = [shard_indices(self.collab, self.num_samples, epoch, s).view(h, b)
                        for s in self.slots]
            # [H, slots, B]: step h's batch is every slot's step-h batch, in slot order.
            perm = torch.stack(per_slot, dim=1).reshape(-1)
            self._perm_cache = {epoch: perm}
        return perm


def _context(spec: CollaborativeSpec, dataset: Dataset, slots: Sequence[int], seed: int,
             threads: int, optimizer_impl: OptimizerImpl,
             compute_dtype: torch.dtype) -> ShardContext:
    for s in slots:
        _check_slot(spec, s)
    if len(set(slots)) != len(slots) or not slots:
        raise TrainingError(f"slots {list(slots)} must be distinct and not empty")
    d = spec.inner.model_dump(mode="json")
    d["seed"], d["batch_size"] = seed, spec.inner.batch_size * len(slots)
    base = TrainContext.create(parse_spec(d), dataset, threads=threads,
                               optimizer_impl=optimizer_impl, compute_dtype=compute_dtype)
    _train_samples(spec, base.num_samples)  # fail now, not at the first batch
    kept: dict[str, Any] = {f.name: getattr(base, f.name) for f in fields(TrainContext)}
    return ShardContext(**kept, collab=spec, slots=tuple(slots))


def worker_context(spec: CollaborativeSpec, dataset: Dataset, slot: int, threads: int = 1,
                   optimizer_impl: OptimizerImpl = "single",
                   compute_dtype: torch.dtype = torch.float32) -> ShardContext:
    """The context slot ``slot``'s inner runs use (the defaults are the reference bits)."""
    _check_slot(spec, slot)
    return _context(spec, dataset, (slot,), derive_seed(spec.inner.seed, "collab", "slot", slot),
                    threads, optimizer_impl, compute_dtype)


def data_parallel_context(spec: CollaborativeSpec, dataset: Dataset, slots: Sequence[int],
                          threads: int = 1) -> ShardContext:
    """One solver seeing the given slots' data at once (batch ``len(slots) * B``): the
    synchronous data-parallel run a collaborative job is compared with."""
    return _context(spec, dataset, tuple(slots), derive_seed(spec.inner.seed, "collab", "dp"),
                    threads, "single", torch.float32)
