"""Training on a sharded dataset: a shard-local data order, streamed shards.

The order is a function of ``(seed, step)`` as for a one-file dataset
(node.train.step), but shard-local. Epoch ``e`` visits the shards in the order
``randperm(S)`` from ``derive_seed(seed, "shards", e)``, and shard ``i``'s
sequences in the order ``randperm(n_i)`` from ``derive_seed(seed, "shard", e, i)``;
the epoch's sequence order is those runs end to end and step ``t`` takes the next
``batch_size`` of them (the last partial batch of an epoch is dropped). With
``batch_size <= min(n_i)`` (checked) a step reads at most two shards, and which
ones follows from the manifest's counts and the seed alone: a solver prefetches
the next steps' shards while it trains, a verifier fetches only the shards of its
sampled segments (plus the manifest).

Public API::

    check_order(manifest, batch_size)              # SpecError unless steps are shard-local
    shards_for_steps(manifest, seed, batch_size, steps, step_offset=0) -> list[int]
    segment_shards(manifest, spec, segments) -> list[int]
    StreamContext.open(spec, manifest, source, threads=1, ...) -> StreamContext
        # a TrainContext: train_step, run_training, replay_segment take it unchanged
    dir_source(folder) / store_source(store, fetch=None) / sibling_source(manifest)
    context_for_file(spec, path, expected_hash=None, threads=1) -> TrainContext
        # a one-file dataset or a shard manifest, whichever the file is
    async fetch_segments(node, manifest_hash, spec, segments, peers=None) -> SegmentFetch
"""

from __future__ import annotations

import bisect
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import torch

from node.data.manifest import (
    HELD_SHARDS,
    MAX_MANIFEST_BYTES,
    ShardEntry,
    ShardManifest,
    is_shard_manifest,
    parse_manifest,
    parse_shard,
)
from node.datasets import Dataset
from node.errors import IntegrityError, SpecError, TrainingError
from node.spec import TEXT_CONFIGS, JobSpec
from node.train.step import OptimizerImpl, TrainContext, derive_seed, prepare_torch

if TYPE_CHECKING:
    from node.p2p import PolnetNode
    from node.store import ArtifactStore

ShardSource = Callable[[int, ShardEntry], bytes]   # (index, entry) -> the shard's bytes
LOOKAHEAD_STEPS = 8
FETCH_PARALLEL = 3  # under the 4 streams a provider grants a stranger (ServeLimits)


def check_order(manifest: ShardManifest, batch_size: int) -> None:
    smallest = min(s.sequences for s in manifest.shards)
    if batch_size > smallest:
        raise SpecError(f"batch_size {batch_size} exceeds the smallest shard's {smallest} "
                        "sequences: a step must read at most 2 shards (repack with more "
                        "sequences per shard)", field="batch_size")
    if manifest.total_sequences < batch_size:
        raise SpecError(f"batch_size {batch_size} exceeds the dataset's "
                        f"{manifest.total_sequences} sequences", field="batch_size")


def _shard_order(seed: int, epoch: int, count: int) -> list[int]:
    gen = torch.Generator(device="cpu")
    gen.manual_seed(derive_seed(seed, "shards", epoch))
    return torch.randperm(count, generator=gen).tolist()


def _local_order(seed: int, epoch: int, shard: int, n: int) -> torch.Tensor:
    gen = torch.Generator(device="cpu")
    gen.manual_seed(derive_seed(seed, "shard", epoch, shard))
    return torch.randperm(n, generator=gen)


def shards_for_steps(manifest: ShardManifest, seed: int, batch_size: int,
                     steps: Iterable[int], step_offset: int = 0) -> list[int]:
    """The shards steps ``steps`` (1-based) read, from counts and seed only (no data)."""
    check_order(manifest, batch_size)
    counts = [s.sequences for s in manifest.shards]
    per_epoch = sum(counts) // batch_size
    out: set[int] = set()
    ends: dict[int, tuple[list[int], list[int]]] = {}
    for step in steps:
        if step < 1:
            raise TrainingError(f"steps are 1-based, got {step}")
        epoch, within = divmod(step + step_offset - 1, per_epoch)
        if epoch not in ends:
            order = _shard_order(seed, epoch, len(counts))
            cum, total = [], 0
            for i in order:
                total += counts[i]
                cum.append(total)
            ends = {epoch: (order, cum)}
        order, cum = ends[epoch]
        first, last = within * batch_size, (within + 1) * batch_size - 1
        for k in range(bisect.bisect_right(cum, first), bisect.bisect_right(cum, last) + 1):
            out.add(order[k])
    return sorted(out)


def segment_shards(manifest: ShardManifest, spec: JobSpec, segments: Iterable[int]) -> list[int]:
    """The shards a replay of ``segments`` (0-based) reads."""
    k = spec.checkpoint_interval
    steps = [s * k + j for s in segments for j in range(1, k + 1)]
    return shards_for_steps(manifest, spec.seed, spec.batch_size, steps)


def dir_source(folder: str | Path) -> ShardSource:
    """Shards in a folder that `polnet dataset pack tokens` wrote (``shards/<sha256>``)."""
    root = Path(folder)

    def load(index: int, entry: ShardEntry) -> bytes:
        for p in (root / "shards" / f"{entry.hash}.safetensors", root / entry.hash):
            if p.is_file():
                return p.read_bytes()
        raise IntegrityError(f"shard {index} ({entry.hash[:12]}) is not in {root}")
    return load


def store_source(store: ArtifactStore,
                 fetch: Callable[[str, int], None] | None = None) -> ShardSource:
    """Shards from the content-addressed store; ``fetch(hash, size)`` (blocking) brings
    a missing one in first, e.g. over p2p from the solver's training thread."""

    def load(index: int, entry: ShardEntry) -> bytes:
        if not store.has(entry.hash) and fetch is not None:
            fetch(entry.hash, entry.size)
        with store.open(entry.hash) as f:
            return f.read(entry.size + 1)
    return load


@dataclass
class StreamContext(TrainContext):
    """A TrainContext whose sequences come from shards, loaded on demand and
    prefetched ``lookahead`` steps ahead in a background thread."""

    manifest: ShardManifest = field(kw_only=True)
    source: ShardSource = field(kw_only=True)
    lookahead: int = field(default=LOOKAHEAD_STEPS, kw_only=True)
    max_cached: int = field(default=HELD_SHARDS - 2, kw_only=True)  # 2 more in flight
    _offsets: list[int] = field(default_factory=list, repr=False)
    _cache: OrderedDict[int, torch.Tensor] = field(default_factory=OrderedDict, repr=False)
    _pending: dict[int, Future[torch.Tensor]] = field(default_factory=dict, repr=False)
    _pool: ThreadPoolExecutor | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    loads: list[int] = field(default_factory=list, repr=False)   # shard indices, in load order

    @classmethod
    def open(cls, spec: JobSpec, manifest: ShardManifest, source: ShardSource,
             threads: int = 1, micro_batches: int = 1, optimizer_impl: OptimizerImpl = "single",
             compute_dtype: torch.dtype = torch.float32,
             lookahead: int = LOOKAHEAD_STEPS,
             init_weights: Mapping[str, torch.Tensor] | None = None) -> StreamContext:
        if manifest.hash_hex != spec.dataset_hash:
            raise SpecError(f"dataset {manifest.hash_hex} is not the spec's "
                            f"{spec.dataset_hash}", field="dataset_hash")
        m = spec.model
        if not isinstance(m, TEXT_CONFIGS):  # transformer_lm and the hf_* families
            raise SpecError(f"{m.family} cannot train on token shards (a language model "
                            "can: transformer_lm, hf_llama, hf_gpt2, hf_albert)",
                            field="model.family")
        if manifest.vocab_size > m.vocab_size:
            raise SpecError(f"the dataset's tokenizer has {manifest.vocab_size} ids > "
                            f"vocab_size {m.vocab_size}", field="model.vocab_size")
        if m.context + 1 > manifest.seq_len:
            raise SpecError(f"context {m.context} needs sequences of {m.context + 1} tokens; "
                            f"the shards hold {manifest.seq_len}", field="model.context")
        if threads < 1 or micro_batches < 1 or spec.batch_size % micro_batches:
            raise TrainingError("threads must be >= 1 and micro_batches divide batch_size")
        if (spec.init_weights is None) != (init_weights is None):
            raise SpecError("the spec's init_weights and the weights given disagree: fetch "
                            "the file the spec names", field="init_weights")
        check_order(manifest, spec.batch_size)
        prepare_torch()
        torch.set_num_threads(threads)
        ds = Dataset(kind="text", name=manifest.name, hash_hex=manifest.hash_hex, tensors={},
                     meta={"sharded": True})
        offsets = [0]
        for s in manifest.shards:
            offsets.append(offsets[-1] + s.sequences)
        return cls(spec, ds, torch.device("cpu"), threads, torch.empty(0, dtype=torch.int64),
                   None, manifest.total_sequences, micro_batches, optimizer_impl, compute_dtype,
                   init_weights=init_weights, manifest=manifest, source=source,
                   lookahead=lookahead, _offsets=offsets)

    def permutation(self, epoch: int) -> torch.Tensor:
        """Global sequence ids (manifest order) of the epoch, in the order they are read."""
        perm = self._perm_cache.get(epoch)
        if perm is None:
            parts = [self._offsets[i] + _local_order(self.spec.seed, epoch, i, s.sequences)
                     for i, s in ((i, self.manifest.shards[i]) for i in
                                  _shard_order(self.spec.seed, epoch,
                                               len(self.manifest.shards)))]
            perm = torch.cat(parts)
            self._perm_cache = {epoch: perm}
        return perm

    def sequences(self, idx: torch.Tensor, length: int) -> torch.Tensor:
        shard_of = torch.searchsorted(torch.tensor(self._offsets), idx, right=True) - 1
        out = torch.empty(idx.numel(), length, dtype=torch.int64)
        for shard in shard_of.unique().tolist():
            rows = (shard_of == shard).nonzero().flatten()
            out[rows] = self._shard(shard)[idx[rows] - self._offsets[shard], :length].long()
        return out

    def before_step(self, step: int) -> None:
        """Start loading the shards of the next ``lookahead`` steps."""
        if self.lookahead <= 0:
            return
        last = min(step + self.lookahead, self.spec.total_steps + 1)  # none past the job
        ahead = shards_for_steps(self.manifest, self.spec.seed, self.spec.batch_size,
                                 range(step, last), self.step_offset)
        for shard in ahead:
            self._future(shard)

    def _load(self, shard: int) -> torch.Tensor:
        entry = self.manifest.shards[shard]
        return parse_shard(self.source(shard, entry), self.manifest, shard)

    def _future(self, shard: int) -> Future[torch.Tensor] | None:
        with self._lock:
            if shard in self._cache:
                return None
            fut = self._pending.get(shard)
            if fut is None:
                if self._pool is None:
                    self._pool = ThreadPoolExecutor(max_workers=HELD_SHARDS - self.max_cached,
                                                    thread_name_prefix="shard-prefetch")
                fut = self._pool.submit(self._load, shard)
                self._pending[shard] = fut
            return fut

    def _shard(self, shard: int) -> torch.Tensor:
        with self._lock:
            hit = self._cache.get(shard)
            if hit is not None:
                self._cache.move_to_end(shard)
                return hit
        fut = self._future(shard)
        try:
            tensor = self._load(shard) if fut is None else fut.result()
        except BaseException:
            with self._lock:  # a fetch that failed is tried afresh next time
                self._pending.pop(shard, None)
            raise
        with self._lock:
            self._pending.pop(shard, None)
            self._cache[shard] = tensor
            self.loads.append(shard)
            while len(self._cache) > self.max_cached:
                self._cache.popitem(last=False)
        return tensor

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None


def is_manifest_file(path: str | Path) -> bool:
    with open(path, "rb") as f:
        return is_shard_manifest(f.read(1))


def sibling_source(manifest_path: str | Path) -> ShardSource:
    """Shards beside a manifest: the folder `pack tokens` wrote, or the store the
    manifest was fetched into (``objects/<id[:2]>/<id>``)."""
    p = Path(manifest_path)
    packed, objects = dir_source(p.parent), p.parent.parent

    def load(index: int, entry: ShardEntry) -> bytes:
        stored = objects / entry.hash[:2] / entry.hash
        return stored.read_bytes() if stored.is_file() else packed(index, entry)
    return load


def context_for_file(spec: JobSpec, path: str | Path, expected_hash: str | None = None,
                     threads: int = 1, source: ShardSource | None = None,
                     lookahead: int = LOOKAHEAD_STEPS,
                     init_weights: Mapping[str, torch.Tensor] | None = None) -> TrainContext:
    """A context for a dataset file: a one-file dataset, or a shard manifest whose
    shards come from ``source`` (by default beside it: ``sibling_source``)."""
    from node.datasets import load_dataset  # noqa: PLC0415

    if not is_manifest_file(path):
        return TrainContext.create(spec, load_dataset(path, expected_hash), threads=threads,
                                   init_weights=init_weights)
    with open(path, "rb") as f:
        raw = f.read(MAX_MANIFEST_BYTES + 1)
    manifest = parse_manifest(raw, expected_hash, origin=str(path))
    return StreamContext.open(spec, manifest, source or sibling_source(path), threads=threads,
                              lookahead=lookahead, init_weights=init_weights)


@dataclass
class SegmentFetch:
    manifest: ShardManifest
    shards: list[int]
    bytes_received: int      # chunk bytes off the wire, manifest included


async def fetch_segments(node: PolnetNode, manifest_hash: str, spec: JobSpec,
                         segments: Sequence[int] | None,
                         peers: Sequence[str] | None = None) -> SegmentFetch:
    """Fetch a sharded dataset's manifest and the shards ``segments`` read (all of them
    when ``segments`` is None: a solver), checking each against the manifest."""
    import trio  # noqa: PLC0415 - only the p2p side needs it

    got = 0
    stats = await node.fetch(manifest_hash, peers, expected_size=MAX_MANIFEST_BYTES)
    got += stats.bytes_received
    raw = await trio.to_thread.run_sync(node.store.path(manifest_hash).read_bytes)
    manifest = parse_manifest(raw, manifest_hash)
    wanted = (list(range(len(manifest.shards))) if segments is None
              else segment_shards(manifest, spec, segments))
    limit = trio.Semaphore(FETCH_PARALLEL)  # a fetch mostly waits on round trips

    async def one(i: int) -> None:
        nonlocal got
        entry = manifest.shards[i]
        async with limit:
            stats = await node.fetch(entry.hash, peers, expected_size=entry.size)
        got += stats.bytes_received
        data = await trio.to_thread.run_sync(node.store.path(entry.hash).read_bytes)
        await trio.to_thread.run_sync(parse_shard, data, manifest, i)

    async with trio.open_nursery() as nursery:
        for i in wanted:
            nursery.start_soon(one, i)
    return SegmentFetch(manifest, wanted, got)
