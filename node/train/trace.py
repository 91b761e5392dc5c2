"""The trace recorder: state hashes of S_0, S_k, ..., S_T, per-segment losses, the
Merkle root (node.proof.build_trace_tree), the kept checkpoints and a manifest,
all crash-safe.

Directory layout (``out_dir``)::

    spec.json                       canonical spec (its sha256 is the spec hash)
    ckpt-00000000.safetensors ...   kept S_step (all of them when keep_every = 1, else
                                    node.train.sparse); metadata key "polnet" =
                                    canonical JSON {format, job_id, step, state_hash,
                                    spec_hash, segment_loss (float, null for S_0),
                                    loss_e9, skipped: [[state hash, loss], ...] of the
                                    leaves since the previous kept one}
    ckpt-00000010.dcp/              a sharded (FSDP2) run's kept leaf: its ranks'
                                    torch.distributed.checkpoint shards, converted to
                                    the .safetensors file above when first needed
                                    (node.train.shardckpt; the manifest names that file)
    trace.json                      the manifest (written last)

Every file is written atomically (tmp + rename); states are hashed (small ones on
the training thread, large ones on a background thread) and kept checkpoints
written and fsynced by that thread while training goes on; the directory is
fsynced before the manifest (the commit point) is written durably. A run killed
at any point resumes from its longest valid prefix of kept checkpoints (each is
re-hashed) and, because a step depends only on (S_{t-1}, seed, t), ends with
the same bytes and root as an unbroken run.

Public API::

    run_training(ctx, out_dir, job_id, behavior=None, progress=None,
                 keep_every=1) -> TraceManifest
    load_checkpoint(path, expected_hash=None, spec=None) -> Checkpoint  # CheckpointError if bad
    read_manifest(out_dir) -> TraceManifest      # .kept, .checkpoint_at(i), .state_hash_scheme
    merkle_proof(manifest, index) -> tuple[TraceLeaf, list[bytes]]
    kept_file(trace_dir, manifest, index) -> Path  # a sharded run's converted on demand
    regenerate(ctx, trace_dir, step) -> dict[str, Tensor]   # bitwise S_step
    regenerate_many(ctx, trace_dir, steps, step_fn=train_step, behavior=None)
    checkpoint_name(step) -> str
"""

from __future__ import annotations

import hashlib
import itertools
import math
import os
import re
import shutil
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from node.boundary import check_fields, decode_json_object
from node.errors import CheckpointError, MalformedInput, TrainingError
from node.fsutil import atomic_write, fsync_dir, fsync_file
from node.proof import (
    MerkleTree,
    StateHasher,
    StateHashScheme,
    TraceLeaf,
    build_trace_tree,
    canonical_json,
    loss_to_e9,
)
from node.proof import state_hash as compute_state_hash
from node.spec import MAX_CHECKPOINT_INTERVAL, MAX_STEPS, JobSpec
from node.tensorfile import (
    Header,
    file_header,
    read_header,
    tensor_bytes,
    tensor_file_parts,
    torch_dtype,
)
from node.train import shardckpt
from node.train.behavior import HonestBehavior, SegmentBehavior
from node.train.layout import (
    CKPT_FORMAT,
    CKPT_SCHEMES,
    MAX_META_BYTES,
    META_FIELDS,
    META_KEY,
    check_layout,
    file_meta,
    max_file_bytes,
    max_header_bytes,
)
from node.train.sparse import MAX_KEEP_EVERY as MAX_KEEP
from node.train.sparse import check_keep_every, kept_indices, nearest_kept
from node.train.step import (
    ShardedLeaf,
    TrainContext,
    TrainState,
    init_state,
    load_state,
    state_tensors,
    state_views,
    train_step,
)

MANIFEST_FORMAT = "polnet-trace/2"
# Format -> its state hash. /1 (sha256, every checkpoint kept) still loads and verifies;
# /2 hashes with BLAKE3 and may keep only every M-th checkpoint (node.train.sparse).
MANIFEST_SCHEMES: dict[str, StateHashScheme] = {"polnet-trace/1": "sha256",
                                                "polnet-trace/2": "blake3"}
# ~300 bytes per segment: 64 MiB is > 200,000 checkpoints, far past any real job.
MAX_MANIFEST_BYTES = 64 * 2**20
# A checkpoint's own (unknown-spec) header bound; with a spec it is much tighter.
MAX_CKPT_HEADER = 16 * 2**20
_MANIFEST_FIELDS = {"job_id": "int", "spec_hash": "str", "dataset_hash": "str", "k": "int",
                    "total_steps": "int", "segment_count": "int", "state_hashes": "[str]",
                    "losses": "[float]", "losses_e9": "[int]", "root": "str",
                    "checkpoints": "list"}
_HEX64 = re.compile(r"[0-9a-f]{64}")
_ENTRY_FIELDS = {"step": "int", "file": "str", "sha256": "str", "bytes": "int"}
MANIFEST_NAME = "trace.json"
SPEC_NAME = "spec.json"


def checkpoint_name(step: int) -> str:
    return f"ckpt-{step:08d}.safetensors"


@dataclass(frozen=True)
class Checkpoint:
    tensors: dict[str, torch.Tensor]
    meta: dict[str, Any]
    state_hash: bytes
    file_sha256: str

    @property
    def step(self) -> int:
        return int(self.meta["step"])


@dataclass(frozen=True)
class Progress:
    step: int           # steps done
    total_steps: int
    segment: int        # segment just closed (0-based)
    segment_loss: float
    resumed_from: int   # step the run (re)started from


@dataclass(frozen=True)
class CheckpointEntry:
    step: int
    file: str
    sha256: str
    bytes: int


@dataclass(frozen=True)
class TraceManifest:
    job_id: int
    spec_hash: str
    dataset_hash: str
    k: int
    total_steps: int
    segment_count: int
    state_hashes: list[str]       # hex, S_0 .. S_T
    losses: list[float]           # segment mean losses
    losses_e9: list[int]
    root: str                     # hex, 0x-less
    checkpoints: list[CheckpointEntry]   # the kept ones (/1: all of them)
    keep_every: int = 1
    format: str = MANIFEST_FORMAT

    @property
    def state_hash_scheme(self) -> StateHashScheme:
        return MANIFEST_SCHEMES[self.format]

    def checkpoint_at(self, index: int) -> CheckpointEntry | None:
        """The kept checkpoint of leaf ``index``; None if the solver regenerates it."""
        for entry in self.checkpoints:
            if entry.step == index * self.k:
                return entry
        return None

    @property
    def kept(self) -> list[int]:
        return [c.step // self.k for c in self.checkpoints]

    @property
    def final_state_hash(self) -> str:
        return self.state_hashes[-1]

    def to_json(self) -> bytes:
        return canonical_json(asdict(self))

    @classmethod
    def from_json(cls, raw: bytes) -> TraceManifest:
        """A manifest from a peer or disk; MalformedInput (a ValueError) if bad."""
        d = decode_json_object(raw, max_bytes=MAX_MANIFEST_BYTES, what="trace manifest")
        check_fields(d, _MANIFEST_FIELDS, optional={"format": "str", "keep_every": "int"},
                     what="trace manifest")
        d.setdefault("format", "polnet-trace/1")  # /1 wrote none at first
        if d["format"] not in MANIFEST_SCHEMES:
            raise MalformedInput(f"trace manifest format {d['format'][:40]!r} is not one this "
                                 f"node reads ({', '.join(MANIFEST_SCHEMES)})")
        for c in d["checkpoints"]:
            if not isinstance(c, dict):
                raise MalformedInput("trace manifest: a checkpoint entry is not an object")
            check_fields(c, _ENTRY_FIELDS, what="trace manifest checkpoint entry")
        _check_ranges(d)
        _check_kept(d)
        d["checkpoints"] = [CheckpointEntry(**c) for c in d["checkpoints"]]
        return cls(**d)

    def leaves_and_tree(self) -> tuple[list[TraceLeaf], MerkleTree]:
        return build_trace_tree(self.job_id, self.k,
                                [bytes.fromhex(h) for h in self.state_hashes], self.losses_e9)


def _check_ranges(d: dict[str, Any]) -> None:
    """What the leaves' abi encoding needs: uint256 counts, 32-byte hex hashes."""
    ints = [d["job_id"], d["k"], d["total_steps"], d["segment_count"], *d["losses_e9"],
            *(v for c in d["checkpoints"] for v in (c["step"], c["bytes"]))]
    if not all(0 <= v < 2**256 for v in ints) or not 1 <= d["k"] <= MAX_CHECKPOINT_INTERVAL \
            or d["total_steps"] > MAX_STEPS or d["segment_count"] > MAX_STEPS:
        raise MalformedInput("trace manifest: a count or loss is out of range (uint256, "
                             f"1 <= k <= {MAX_CHECKPOINT_INTERVAL}, steps <= {MAX_STEPS})")
    if not all(_HEX64.fullmatch(h) for h in (*d["state_hashes"], d["root"])):
        raise MalformedInput("trace manifest: state hashes and root must be 64 hex digits")


def _check_kept(d: dict[str, Any]) -> None:
    """Entries are exactly the kept leaves of ``keep_every`` (/1: every leaf), in order."""
    m = d.get("keep_every", 1)
    if d["format"] == "polnet-trace/1" and m != 1 or not 1 <= m <= MAX_KEEP:
        raise MalformedInput(f"trace manifest: keep_every {m} is not valid for {d['format']}")
    count = d["segment_count"] // m + 1 + (d["segment_count"] % m != 0)
    if len(d["checkpoints"]) != count:  # before building a list of a peer's size
        raise MalformedInput(f"trace manifest: {len(d['checkpoints'])} checkpoints where "
                             f"keep_every {m} keeps {count}")
    want = [i * d["k"] for i in kept_indices(d["segment_count"], m)]
    if [c["step"] for c in d["checkpoints"]] != want:
        raise MalformedInput(f"trace manifest: checkpoints must be those of steps {want[:4]}"
                             f"{'...' if len(want) > 4 else ''} (keep_every {m})")


# --- checkpoints ----------------------------------------------------------------------


def write_tensor_file(path: Path, tensors: Mapping[str, torch.Tensor],
                      metadata: Mapping[str, str], durable: bool = False) -> tuple[str, int]:
    """A safetensors file streamed from the tensors' buffers (``tensor_file_parts``,
    atomically), its sha256 taken on the way: (sha256 hex, size)."""
    digest, size = hashlib.sha256(), 0

    def hashed(parts: list[bytes | memoryview]) -> Iterator[bytes | memoryview]:
        nonlocal size
        for part in parts:
            digest.update(part)
            size += len(part) if isinstance(part, bytes) else part.nbytes
            yield part

    atomic_write(path, hashed(tensor_file_parts(tensors, metadata)), durable=durable)
    return digest.hexdigest(), size


def _encode_checkpoint(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> bytes:
    """The checkpoint file in memory (tests; ``write_tensor_file`` writes the same)."""
    return st_save(tensors, metadata=file_meta(meta))


def _corrupt(message: str) -> CheckpointError:
    return CheckpointError(f"{message}; delete it and regenerate or re-fetch it")


def _checkpoint_meta(header: Header, what: str) -> dict[str, Any]:
    if META_KEY not in header.metadata:
        raise _corrupt(f"{what} has no {META_KEY!r} metadata")
    meta = decode_json_object(header.metadata[META_KEY], max_bytes=MAX_META_BYTES,
                              what=f"{what} metadata", error=_corrupt)
    check_fields(meta, META_FIELDS, what=f"{what} metadata", extra_ok=True, error=_corrupt)
    return meta


def load_checkpoint(path: str | Path, expected_hash: bytes | str | None = None,
                    spec: JobSpec | None = None) -> Checkpoint:
    """Read, parse and re-hash a checkpoint; ``expected_hash`` is the state hash
    (bytes or hex) it must have. The metadata's own claim is checked too.

    The safetensors header is read and checked first: bounded, self-consistent and,
    given the job's ``spec``, holding exactly the tensors (names, dtypes, shapes) a
    state of that spec has, in a file of exactly that size. Only then are tensor
    bytes read, so a 1 GB file for a 1 MB model costs nothing but its header."""
    p = Path(path)
    what = f"checkpoint {p}"
    try:
        with open(p, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if spec is not None and size > max_file_bytes(spec):
                raise CheckpointError(f"{what} is {size} bytes; a state of this job's spec is "
                                      f"at most {max_file_bytes(spec)}: it is not this job's")
            header = read_header(f, size, what=what, error=_corrupt,
                                 max_header=MAX_CKPT_HEADER if spec is None
                                 else max_header_bytes(spec))
            if spec is not None:
                check_layout(header, spec, what)
            meta = _checkpoint_meta(header, what)
            f.seek(0)
            raw = f.read()
    except OSError as exc:
        raise CheckpointError(f"{what} cannot be read: {exc.strerror}") from None
    if len(raw) != size:
        raise _corrupt(f"{what} changed while it was read")
    try:
        tensors = st_load(raw)
    except Exception as exc:  # noqa: BLE001 - the header checked out, the bytes did not
        raise _corrupt(f"{what} is corrupt ({exc})") from None
    scheme = CKPT_SCHEMES.get(meta["format"])
    if scheme is None:
        raise CheckpointError(f"{what} is in format {meta['format'][:40]!r}; this node reads "
                              f"{', '.join(CKPT_SCHEMES)}")
    got = compute_state_hash(tensors, scheme)
    if meta["state_hash"] != got.hex():
        raise CheckpointError(f"{what}: tensors hash to {got.hex()} but its metadata "
                              f"claims {meta['state_hash'][:80]}: the file is corrupt")
    if expected_hash is not None:
        want = expected_hash.hex() if isinstance(expected_hash, bytes) \
            else expected_hash.lower().removeprefix("0x")
        if got.hex() != want:
            raise CheckpointError(f"{what} holds state {got.hex()}, expected {want}")
    return Checkpoint(tensors, meta, got, hashlib.sha256(raw).hexdigest())


@dataclass(frozen=True)
class _Record:
    """What the manifest needs of a leaf state (its tensors are not kept)."""

    step: int
    state_hash: bytes
    file_sha256: str    # "" for a state that is not kept as a checkpoint
    segment_loss: float | None
    loss_e9: int
    size: int = -1      # the checkpoint file's bytes; -1: read it off the file

    @classmethod
    def of(cls, ck: Checkpoint) -> _Record:
        return cls(ck.step, ck.state_hash, ck.file_sha256, _loss(ck.meta),
                   int(ck.meta["loss_e9"]))

    @classmethod
    def skipped(cls, step: int, state_hash: bytes, segment_loss: float) -> _Record:
        return cls(step, state_hash, "", segment_loss, loss_to_e9(segment_loss))


def _meta(job_id: int, spec_hash: str, step: int, h: bytes, segment_loss: float | None,
          skipped: list[_Record]) -> dict[str, Any]:
    # "skipped": the leaves since the previous kept checkpoint, so a resumed run can
    # still write them into its manifest.
    return {"format": CKPT_FORMAT, "job_id": job_id, "step": step, "state_hash": h.hex(),
            "spec_hash": spec_hash, "segment_loss": segment_loss,
            "loss_e9": 0 if segment_loss is None else loss_to_e9(segment_loss),
            "skipped": [[r.state_hash.hex(), r.segment_loss] for r in skipped]}


def _seal_sharded(out: Path, job_id: int, spec_hash: str, step: int, leaf: ShardedLeaf,
                  segment_loss: float | None, skipped: list[_Record]) -> _Record:
    """A kept leaf of a sharded run: its ranks wrote its DCP shards; add the metadata,
    check them and name them (node.train.shardckpt). The manifest names the single
    file they convert to, by that file's sha256 and size, as for any checkpoint."""
    assert leaf.partial_dir is not None
    meta = _meta(job_id, spec_hash, step, leaf.state_hash, segment_loss, skipped)
    (out / checkpoint_name(step)).unlink(missing_ok=True)  # a stale conversion
    sha, size = shardckpt.seal(leaf.partial_dir, out / shardckpt.dcp_name(step), meta)
    return _Record(step, leaf.state_hash, sha, segment_loss, meta["loss_e9"], size)


def _write_streamed(out: Path, job_id: int, spec_hash: str, step: int,
                    leaf: ShardedLeaf) -> _Record:
    """S_0 of a sharded run: its file written one tensor at a time (``leaf.whole``), no
    process holding the state; the tensors must hash to the leaf's hash (built from
    the ranks' shards: each rank built the shards it holds)."""
    whole, layout = leaf.whole, leaf.layout
    assert whole is not None and layout is not None
    meta = _meta(job_id, spec_hash, step, leaf.state_hash, None, [])
    head, order = file_header(layout, file_meta(meta))
    h = StateHasher(CKPT_SCHEMES[CKPT_FORMAT])
    for name in sorted(layout):
        h.tensor(name, whole(name))
    if h.digest() != leaf.state_hash:
        raise TrainingError(f"S_0 built tensor by tensor hashes to {h.digest().hex()}, "
                            f"its shards to {leaf.state_hash.hex()}")
    digest, size = hashlib.sha256(), 0

    def parts() -> Iterator[bytes | memoryview]:
        nonlocal size
        for part in itertools.chain([head], (tensor_bytes(whole(n)) for n in order)):
            digest.update(part)
            size += len(part) if isinstance(part, bytes) else part.nbytes
            yield part

    path = out / checkpoint_name(step)
    atomic_write(path, parts())
    fsync_file(path)
    return _Record(step, leaf.state_hash, digest.hexdigest(), None, 0, size)


def _write_checkpoint(out: Path, job_id: int, spec_hash: str, step: int,
                      tensors: dict[str, torch.Tensor], segment_loss: float | None,
                      skipped: list[_Record]) -> _Record:
    h = compute_state_hash(tensors)
    meta = _meta(job_id, spec_hash, step, h, segment_loss, skipped)
    loss_e9 = meta["loss_e9"]
    # Streamed from the tensors (no in-memory file) and fsynced here, on the writer
    # thread while training goes on; the directory once, before the manifest (the
    # commit point) is written durably.
    path = out / checkpoint_name(step)
    sha, _ = write_tensor_file(path, tensors, file_meta(meta))
    fsync_file(path)
    return _Record(step, h, sha, segment_loss, loss_e9)


# A leaf that is not kept is hashed on the training thread, from the live buffers.
# A copy for a background hash costs nearly as much CPU as the hash (a 25M-parameter
# state: 50 ms to copy, 64 ms to hash), and a solver training on every core pays
# the background thread's CPU in training time: inline costs ~12 ms more wall a
# segment on an idle second core and 50 ms less CPU. For a small state, a second
# Python thread also costs the trainer more in GIL hand-offs (up to the 5 ms switch
# interval each) than the hash itself (70k parameters: 0.3 ms of a 35 ms segment).


class _Writer:
    """Hashes every leaf state and serialises and writes the kept ones in order; the
    writes run on one background thread, overlapping the next segment's training.
    At most ``depth`` of its jobs are in flight (memory bound); a failed write
    surfaces at the next submit."""

    def __init__(self, out: Path, job_id: int, spec_hash: str, depth: int = 2) -> None:
        self._args = (out, job_id, spec_hash)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="polnet-ckpt")
        self._entries: list[_Record | Future[_Record]] = []  # one per leaf, in order
        self._pending: list[Future[_Record]] = []            # not seen done yet
        self._skipped: list[_Record] = []  # leaves since the last kept
        self._depth = depth
        # Copies the worker is done with, reused (at most depth + 1 exist at a time).
        self._spare: list[dict[str, torch.Tensor]] = []
        self._lock = threading.Lock()

    def _give_back(self, tensors: dict[str, torch.Tensor]) -> None:
        with self._lock:
            self._spare.append(tensors)

    def _write(self, step: int, tensors: dict[str, torch.Tensor], loss: float | None,
               skipped: list[_Record]) -> _Record:
        try:
            return _write_checkpoint(*self._args, step, tensors, loss, skipped)
        finally:
            self._give_back(tensors)

    def submit(self, state: TrainState, segment_loss: float | None, keep: bool = True) -> None:
        entry: _Record | Future[_Record]
        leaf, state.leaf = state.leaf, None
        if leaf is not None:  # a sharded state: hashed from its shards, no tensors here
            if segment_loss is None:  # S_0: kept as a single file, written from its tensors
                if leaf.whole is None or leaf.partial_dir is not None:
                    raise TrainingError("a sharded S_0 comes with its tensors, no shards")
                entry = self._pool.submit(_write_streamed, *self._args, state.step, leaf)
            elif keep != (leaf.partial_dir is not None):
                raise TrainingError(f"leaf at step {state.step}: the behaviour "
                                    f"{'did not write' if keep else 'wrote'} a checkpoint")
            elif not keep:
                entry = _Record.skipped(state.step, leaf.state_hash, segment_loss)
                self._skipped.append(entry)
            else:
                entry = self._pool.submit(_seal_sharded, *self._args, state.step, leaf,
                                          segment_loss, self._skipped)
                self._skipped = []
        elif not keep:
            assert segment_loss is not None  # S_0 is always kept
            # Hashed here, before training goes on: the live buffers, no copy.
            entry = _Record.skipped(state.step, compute_state_hash(state_views(state)),
                                    segment_loss)
            self._skipped.append(entry)
        else:
            with self._lock:
                spare = self._spare.pop() if self._spare else None
            tensors = state_tensors(state, spare)  # copied now: training mutates it
            entry = self._pool.submit(self._write, state.step, tensors, segment_loss,
                                      self._skipped)
            self._skipped = []
        self._entries.append(entry)
        if isinstance(entry, Future):
            self._pending.append(entry)
        for f in [f for f in self._pending if f.done()]:
            f.result()  # re-raise a failed write now, not at the end
            self._pending.remove(f)
        while len(self._pending) > self._depth:
            self._pending.pop(0).result()

    def finish(self) -> list[_Record]:
        try:
            return [e if isinstance(e, _Record) else e.result() for e in self._entries]
        finally:
            self._pool.shutdown(wait=True, cancel_futures=True)


# --- the run -----------------------------------------------------------------------------


def _prepare_dir(ctx: TrainContext, out: Path) -> str:
    out.mkdir(parents=True, exist_ok=True)
    for stale in out.glob(".*.tmp-*"):  # left by a run killed mid-write
        stale.unlink(missing_ok=True)
    spec_hash = ctx.spec.spec_hash_hex()
    spec_file = out / SPEC_NAME
    if spec_file.exists():
        if hashlib.sha256(spec_file.read_bytes()).hexdigest() != spec_hash:
            raise TrainingError(f"{out} holds a trace of another spec; use a fresh --out")
    else:
        atomic_write(spec_file, ctx.spec.canonical_json())
    return spec_hash


@dataclass(frozen=True)
class _Kept:
    """A kept checkpoint a run resumes from, checked, its tensors not in memory: a
    single file or, a sharded run's, its DCP directory (``sharded``)."""

    step: int
    meta: dict[str, Any]
    record: _Record
    sharded: Path | None


#: A checkpoint is checked on resume in pieces of at most this many bytes.
_CHECK_PIECE = 16 * 2**20


def _check_file(path: Path, spec: JobSpec) -> tuple[dict[str, Any], bytes, str]:
    """``load_checkpoint``'s checks without holding the state: its header fits ``spec``,
    its tensors (read a piece at a time, in name order) hash to its metadata's claim.
    Returns (metadata, state hash, the file's sha256)."""
    what = f"checkpoint {path}"
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size > max_file_bytes(spec):
                raise _corrupt(f"{what} is {size} bytes, more than a state of its spec")
            header = read_header(f, size, what=what, error=_corrupt,
                                 max_header=max_header_bytes(spec))
            check_layout(header, spec, what)
            meta = _checkpoint_meta(header, what)
            scheme = CKPT_SCHEMES.get(meta["format"])
            if scheme is None or header.data_start + header.data_bytes != size:
                raise _corrupt(f"{what} is not a checkpoint this node reads")
            h = StateHasher(scheme)
            for name in sorted(header.tensors):
                info = header.tensors[name]
                dtype = torch_dtype(info.dtype)
                h.begin(name, dtype, info.shape)
                f.seek(header.data_start + info.start)
                left = info.end - info.start
                step = max(dtype.itemsize, _CHECK_PIECE // dtype.itemsize * dtype.itemsize)
                while left:
                    raw = f.read(min(step, left))
                    if not raw or len(raw) % dtype.itemsize:
                        raise _corrupt(f"{what} ended inside {name[:80]!r}")
                    h.update(torch.frombuffer(bytearray(raw), dtype=dtype))
                    left -= len(raw)
            f.seek(0)
            digest = hashlib.sha256()
            while raw := f.read(_CHECK_PIECE):
                digest.update(raw)
    except OSError as exc:
        raise CheckpointError(f"{what} cannot be read: {exc.strerror}") from None
    got = h.digest()
    if meta["state_hash"] != got.hex():
        raise _corrupt(f"{what}: tensors hash to {got.hex()}, its metadata claims "
                       f"{meta['state_hash'][:80]}")
    return meta, got, digest.hexdigest()


def _loss(meta: dict[str, Any]) -> float | None:
    loss = meta.get("segment_loss")
    return None if loss is None else float(loss)


def _skipped_records(meta: dict[str, Any], step: int, first: int,
                     k: int) -> list[_Record] | None:
    """The leaves ``first ..`` before kept ``step`` its metadata lists; None if they do
    not fit."""
    raw = meta.get("skipped", [])
    want = step // k - first
    if meta["format"] != CKPT_FORMAT or not isinstance(raw, list) or len(raw) != want:
        return None
    out = []
    for i, item in enumerate(raw):
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)
                and _HEX64.fullmatch(item[0]) and isinstance(item[1], int | float)
                and math.isfinite(item[1]) and item[1] >= 0):
            return None
        out.append(_Record.skipped((first + i) * k, bytes.fromhex(item[0]), float(item[1])))
    return out


def _resume_point(out: Path, job_id: int, spec: JobSpec,
                  keep_every: int) -> tuple[list[_Record], _Kept | None]:
    """The longest valid prefix of kept checkpoints on disk (every other checkpoint
    file is deleted), the leaf records it covers, and its last checkpoint, to
    continue from."""
    spec_hash, k, segments = spec.spec_hash_hex(), spec.checkpoint_interval, spec.segment_count
    done: list[_Record] = []
    last: _Kept | None = None
    keep: set[str] = set()
    for stale in out.glob(".ckpt-*.dcp.partial"):  # a sharded save a killed run began
        shutil.rmtree(stale, ignore_errors=True)
    for i in kept_indices(segments, keep_every):
        path = out / checkpoint_name(i * k)
        sharded = out / shardckpt.dcp_name(i * k)
        try:
            if not path.exists() and sharded.is_dir():
                # A sharded run's kept leaf: hash-checked in one read, a batch at a time,
                # not converted; the resumed ranks load their own shards of it
                # (SegmentBehavior.start_state), anything else converts it to resume.
                meta, sha, size = shardckpt.check(sharded, spec)
                rec = _Record(i * k, bytes.fromhex(meta["state_hash"]), sha,
                              _loss(meta), int(meta["loss_e9"]), size)
                found = _Kept(i * k, meta, rec, sharded)
            elif path.exists():
                # Checked a tensor at a time; the one resumed from is loaded after.
                meta, got, sha = _check_file(path, spec)
                found = _Kept(int(meta["step"]), meta, _Record(
                    int(meta["step"]), got, sha, _loss(meta), int(meta["loss_e9"])), None)
            else:
                break
        except CheckpointError:
            break
        if found.meta.get("job_id") != job_id or found.meta.get("spec_hash") != spec_hash \
                or found.step != i * k:
            raise TrainingError(f"{path} belongs to another job or spec; use a fresh --out")
        skipped = _skipped_records(found.meta, found.step, len(done), k)
        if skipped is None:  # another keep_every, or an old format: recompute from here
            break
        done += [*skipped, found.record]
        keep.update((path.name, shardckpt.dcp_name(found.step)))
        last = found
    for stale in out.glob("ckpt-*.safetensors"):  # never leave a stale suffix behind
        if stale.name not in keep:
            stale.unlink(missing_ok=True)
    for stale in out.glob("ckpt-*.dcp"):
        if stale.name not in keep:
            shutil.rmtree(stale, ignore_errors=True)
    if len(done) <= segments:  # a manifest only ever describes a finished run
        (out / MANIFEST_NAME).unlink(missing_ok=True)
    return done, last


def run_training(ctx: TrainContext, out_dir: str | Path, job_id: int,
                 behavior: SegmentBehavior | None = None,
                 progress: Callable[[Progress], None] | None = None,
                 keep_every: int = 1,
                 initial: Callable[[], TrainState] | None = None) -> TraceManifest:
    """Train ``ctx.spec`` recording its trace in ``out_dir``, resuming partial work.

    ``initial`` builds S_0 when it is not the spec's seeded state (a collaborative
    round starts from the shared weights: node.train.rounds); the chain checks leaf 0
    against the S_0 hash it fixed either way.

    Every leaf's state is hashed; with ``keep_every = M`` only S_0, every M-th leaf
    state and the final one are kept as checkpoints (node.train.sparse).
    ``progress`` is called each time a segment closes (its checkpoint may still
    be being written). Returns the manifest, also written to ``trace.json``."""
    if job_id < 0 or job_id >= 2**256:
        raise TrainingError("job_id must fit a uint256")
    check_keep_every(keep_every)
    behavior = behavior or HonestBehavior()
    out = Path(out_dir)
    spec = ctx.spec
    k, segments = spec.checkpoint_interval, spec.segment_count
    kept = set(kept_indices(segments, keep_every))
    spec_hash = _prepare_dir(ctx, out)
    done, last = _resume_point(out, job_id, spec, keep_every)
    resumed = list(done)
    writer = _Writer(out, job_id, spec_hash)
    try:
        # The behaviour may build the first state itself (a sharded run: each rank its
        # shards, never the whole state in one process); else it is built here.
        own = None if initial is not None and (last is None or last.step == 0) \
            else behavior.start_state(ctx, 0 if last is None else last.step,
                                      None if last is None else last.sharded)
        if last is not None:
            state = own if own is not None else _load_kept(ctx, out, last)
            del last
        else:
            state = own if own is not None else init_state(ctx) if initial is None \
                else initial()
            if state.step != 0:
                raise TrainingError(f"an initial state must be at step 0, not {state.step}")
            writer.submit(state, None)
        resumed_from = state.step
        for seg in range(state.step // k, segments):
            start = seg * k
            state, loss = behavior.run_segment(ctx, state, seg, start, k)
            if state.step != start + k:
                raise TrainingError(f"behaviour {behavior.name!r} returned step {state.step} "
                                    f"for segment {seg} (expected {start + k})")
            if not math.isfinite(loss) or loss < 0:
                raise TrainingError(f"segment {seg} loss {loss} cannot go into a trace leaf")
            writer.submit(state, loss, keep=seg + 1 in kept)
            if progress is not None:
                progress(Progress(state.step, spec.total_steps, seg, loss, resumed_from))
    finally:
        done += writer.finish()
    _make_durable(out, resumed)
    return _write_manifest(out, ctx, job_id, spec_hash, done, keep_every)


def _load_kept(ctx: TrainContext, out: Path, kept: _Kept) -> TrainState:
    path = out / checkpoint_name(kept.step)
    if kept.sharded is not None:  # resumed by a behaviour that holds whole states
        shardckpt.convert(kept.sharded, path, kept.record.state_hash)
    ck = load_checkpoint(path, kept.record.state_hash, ctx.spec)
    return load_state(ctx, ck.tensors, step=kept.step)


def _make_durable(out: Path, resumed: list[_Record]) -> None:
    """Checkpoints a killed run left (this run's were fsynced as written), then the dir;
    a sharded leaf not converted is durable as sealed."""
    for rec in resumed:
        path = out / checkpoint_name(rec.step)
        if rec.file_sha256 and (rec.size < 0 or path.exists()):
            fsync_file(path)
    fsync_dir(out)


def _write_manifest(out: Path, ctx: TrainContext, job_id: int, spec_hash: str,
                    done: list[_Record], keep_every: int) -> TraceManifest:
    losses = [r.segment_loss for r in done[1:] if r.segment_loss is not None]
    losses_e9 = [r.loss_e9 for r in done[1:]]
    hashes = [r.state_hash for r in done]
    _, tree = build_trace_tree(job_id, ctx.spec.checkpoint_interval, hashes, losses_e9)
    entries = [CheckpointEntry(r.step, checkpoint_name(r.step), r.file_sha256,
                               r.size if r.size >= 0
                               else (out / checkpoint_name(r.step)).stat().st_size)
               for r in done if r.file_sha256]
    manifest = TraceManifest(
        job_id=job_id, spec_hash=spec_hash, dataset_hash=ctx.spec.dataset_hash,
        k=ctx.spec.checkpoint_interval, total_steps=ctx.spec.total_steps,
        segment_count=ctx.spec.segment_count, state_hashes=[h.hex() for h in hashes],
        losses=losses, losses_e9=losses_e9, root=tree.root.hex(), checkpoints=entries,
        keep_every=keep_every)
    atomic_write(out / MANIFEST_NAME, manifest.to_json())
    return manifest


# --- reading a trace ------------------------------------------------------------------


def read_manifest(trace_dir: str | Path) -> TraceManifest:
    path = Path(trace_dir) / MANIFEST_NAME
    try:
        return TraceManifest.from_json(path.read_bytes())
    except FileNotFoundError:
        raise TrainingError(f"no {MANIFEST_NAME} in {trace_dir}: the run is not complete "
                            "(rerun `polnet train` with the same --out to resume)") from None


def merkle_proof(manifest: TraceManifest, index: int) -> tuple[TraceLeaf, list[bytes]]:
    """Leaf ``index`` (state after step ``index*k``) and its OpenZeppelin proof."""
    leaves, tree = manifest.leaves_and_tree()
    if tree.root.hex() != manifest.root:
        raise CheckpointError("manifest root does not match its own leaves")
    return leaves[index], tree.proof(index)


def regenerate(ctx: TrainContext, trace_dir: str | Path, step: int) -> dict[str, torch.Tensor]:
    """S_step rebuilt from the nearest checkpoint at or before it, by honest steps."""
    return regenerate_many(ctx, trace_dir, [step])[step]


def kept_file(trace_dir: str | Path, manifest: TraceManifest, index: int) -> Path:
    """The single file of kept leaf ``index``: a sharded run's DCP checkpoint is converted
    to it the first time it is needed (then kept), and must hash to the committed leaf
    (CheckpointError otherwise; the DCP form is left as it was). The path may not exist
    when neither form does."""
    trace = Path(trace_dir)
    step = index * manifest.k
    path = trace / checkpoint_name(step)
    sharded = trace / shardckpt.dcp_name(step)
    if not path.exists() and sharded.is_dir():
        sha, _ = shardckpt.convert(sharded, path, manifest.state_hashes[index])
        entry = manifest.checkpoint_at(index)
        if entry is not None and entry.sha256 != sha:
            path.unlink(missing_ok=True)
            raise CheckpointError(f"{sharded} converts to a file of sha256 {sha}, the "
                                  f"manifest names {entry.sha256}")
    return path


def _kept_checkpoint(ctx: TrainContext, trace_dir: Path, manifest: TraceManifest,
                     index: int, wanted: int) -> Checkpoint:
    path = kept_file(trace_dir, manifest, index)
    if not path.exists():
        raise CheckpointError(f"kept checkpoint {path.name} (leaf {index}) is missing from "
                              f"{trace_dir}: leaf {wanted} is regenerated from it and cannot "
                              "be served without it; the trace is incomplete (train it again "
                              "into a fresh --out)")
    return load_checkpoint(path, manifest.state_hashes[index], ctx.spec)


def regenerate_many(ctx: TrainContext, trace_dir: str | Path, steps: Sequence[int],
                    step_fn: Callable[[TrainContext, TrainState, int], float] = train_step,
                    behavior: SegmentBehavior | None = None,
                    ) -> dict[int, dict[str, torch.Tensor]]:
    """S_t for every t in ``steps``. A leaf state (t a multiple of k) is the kept
    checkpoint, or is rebuilt from the nearest kept one before it segment by segment
    with ``behavior`` (the one that trained it; honest unless given) and must hash to
    its committed leaf (CheckpointError otherwise: this machine does not reproduce
    the trace). Any other t is reached from S_{floor(t/k)*k} by ``step_fn`` steps
    (honest unless given: a dispute's bisection points). Sorted steps share walks."""
    manifest = read_manifest(trace_dir)
    trace = Path(trace_dir)
    k, kept = manifest.k, manifest.kept
    for step in steps:
        if not 0 <= step <= manifest.total_steps:
            raise TrainingError(f"step {step} outside 0..{manifest.total_steps}")
    behavior = behavior or HonestBehavior()
    out: dict[int, dict[str, torch.Tensor]] = {}
    leaf_at, leaf = -1, {}   # the last leaf state reached, as tensors
    state: TrainState | None = None  # a walk between leaves
    for step in sorted(set(steps)):
        i = step // k
        if not nearest_kept(i, kept) <= leaf_at <= i:  # start over from a kept checkpoint
            j = nearest_kept(i, kept)
            leaf_at, leaf = j, _kept_checkpoint(ctx, trace, manifest, j, i).tensors
        if leaf_at < i:
            seg_state = load_state(ctx, leaf, step=leaf_at * k)
            for seg in range(leaf_at, i):
                seg_state, _ = behavior.run_segment(ctx, seg_state, seg, seg * k, k)
                got = compute_state_hash(state_views(seg_state),
                                         manifest.state_hash_scheme)
                if got.hex() != manifest.state_hashes[seg + 1]:
                    raise CheckpointError(
                        f"leaf {seg + 1} regenerated from kept leaf {leaf_at} hashes to "
                        f"{got.hex()[:16]}… but the trace commits "
                        f"{manifest.state_hashes[seg + 1][:16]}…: this machine or behaviour "
                        "does not reproduce the trace bitwise")
            leaf_at, leaf = i, state_tensors(seg_state)
            state = None
        if step == i * k:
            out[step] = leaf
            continue
        if state is None or state.step // k != i or state.step > step:
            state = load_state(ctx, leaf, step=i * k)
        for t in range(state.step + 1, step + 1):
            step_fn(ctx, state, t)
        out[step] = state_tensors(state)
    return out


def write_state_file(path: str | Path, tensors: dict[str, torch.Tensor], job_id: int,
                     step: int) -> bytes:
    """Write a state that is not a trace checkpoint (a dispute's bisection point) in the
    checkpoint format, atomically, so ``load_checkpoint`` checks it like any other.
    Returns its state hash."""
    h = compute_state_hash(tensors)
    meta = {"format": CKPT_FORMAT, "job_id": job_id, "step": step, "state_hash": h.hex(),
            "spec_hash": "", "segment_loss": None, "loss_e9": 0}
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    write_tensor_file(p, tensors, file_meta(meta), durable=True)  # file and directory
    return h
