"""Kept checkpoints of a sharded (FSDP2) run, written with ``torch.distributed.checkpoint``
(each rank its own shards) and converted on demand to the single-file layout that
verifiers, ``job fetch`` and a resumed run read (issue 33).

Layout, beside the single files of node.train.trace::

    .ckpt-00000010.dcp.partial/     being written by the ranks (never read; removed)
    ckpt-00000010.dcp/              .metadata, __<rank>_0.distcp, polnet.json: the
                                    checkpoint's metadata (what the single file's
                                    "polnet" key holds), written last by rank 0
    ckpt-00000010.safetensors       the conversion, once something needed it

Its tensors are those of ``state_tensors`` (names, exported dtypes and shapes); a
sharded tensor is a DTensor of its ranks' local shards. Conversion reads a batch of
tensors at a time (``BATCH_BYTES``; never the whole state), each shard once, and streams
the safetensors file of ``tensor_file_parts`` while it hashes the tensors: the same
bytes as the single file a one-process run writes for the same state. The converted
file's state hash must be the one committed (CheckpointError otherwise, the partial
file removed, the DCP form left as it was). A resumed sharded run checks its kept
leaves the same way without writing anything (``check``); each rank then loads its
own shards (node.train.distributed).

Public API::

    dcp_name(step) -> str;  partial_name(step) -> str
    save_shards(tensors, directory)                       # every rank (collective)
    seal(partial, final, meta) -> (sha256 hex, bytes)     # rank 0: the single file's
    convert(dcp_dir, dest, expected_hash) -> (sha256 hex, bytes)
    check(dcp_dir, spec) -> (meta, sha256 hex, bytes)     # hash-checked, nothing written
    dcp_meta(dcp_dir) -> dict
"""

from __future__ import annotations

import hashlib
import math
import os
import shutil
import warnings
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import torch

from node.boundary import check_fields, decode_json_object
from node.errors import CheckpointError
from node.fsutil import atomic_write, fsync_dir, fsync_file
from node.proof import StateHasher, canonical_json
from node.spec import JobSpec
from node.tensorfile import file_header, st_dtype, tensor_bytes
from node.train.layout import (
    CKPT_FORMAT,
    CKPT_SCHEMES,
    MAX_META_BYTES,
    META_FIELDS,
    compare_layout,
    expected_layout,
    file_meta,
)

META_FILE = "polnet.json"


def dcp_name(step: int) -> str:
    return f"ckpt-{step:08d}.dcp"


def partial_name(step: int) -> str:
    return f".ckpt-{step:08d}.dcp.partial"


def save_shards(tensors: Mapping[str, torch.Tensor], directory: str | Path) -> None:
    """Every rank, together: write ``tensors`` (DTensors of local shards, plain tensors
    for the replicated ones) into ``directory``. Collective: call on every rank."""
    import torch.distributed.checkpoint as dcp  # noqa: PLC0415

    # The plan is the same at every leaf of a run (same tensors, same shards): cached.
    dcp.save(dict(tensors), checkpoint_id=str(directory),
             planner=dcp.DefaultSavePlanner(enable_plan_caching=True))


def _bad(message: str) -> CheckpointError:
    return CheckpointError(f"{message}; the sharded checkpoint is left as it was")


def dcp_meta(dcp_dir: str | Path) -> dict[str, Any]:
    path = Path(dcp_dir) / META_FILE
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise _bad(f"{path} cannot be read: {exc.strerror}") from None
    meta = decode_json_object(raw, max_bytes=MAX_META_BYTES, what=str(path), error=_bad)
    check_fields(meta, META_FIELDS, what=str(path), extra_ok=True, error=_bad)
    return meta


def _layout(dcp_dir: Path) -> dict[str, tuple[torch.dtype, tuple[int, ...]]]:
    from torch.distributed.checkpoint import FileSystemReader  # noqa: PLC0415
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata  # noqa: PLC0415

    try:
        md = FileSystemReader(str(dcp_dir)).read_metadata()
    except Exception as exc:  # noqa: BLE001 - a pickle of a peer's or a damaged disk's
        raise _bad(f"{dcp_dir}: its DCP metadata cannot be read ({exc!r:.200})") from None
    out = {}
    for name, item in md.state_dict_metadata.items():
        if not isinstance(item, TensorStorageMetadata):
            raise _bad(f"{dcp_dir}: {name[:80]!r} is not a tensor")
        out[name] = (item.properties.dtype, tuple(item.size))
    return out


#: Tensors are read in batches of at most this many bytes (one DCP load each: a load
#: re-reads the checkpoint's metadata, so one per tensor is quadratic in their count);
#: a tensor larger than this is read alone. Conversion holds one batch at a time, plus
#: at most this many bytes of tensors read ahead of their turn in the state hash.
BATCH_BYTES = 64 * 2**20


def _nbytes(layout: Mapping[str, tuple[torch.dtype, tuple[int, ...]]], name: str) -> int:
    dtype, shape = layout[name]
    return math.prod(shape) * dtype.itemsize


def _load(dcp_dir: Path, layout: Mapping[str, tuple[torch.dtype, tuple[int, ...]]],
          names: list[str]) -> dict[str, torch.Tensor]:
    """Whole tensors ``names`` of the checkpoint (each from its shards in the ranks'
    files; DCP reads only their byte ranges), in this process, no process group."""
    import torch.distributed.checkpoint as dcp  # noqa: PLC0415
    from torch.distributed.checkpoint.api import CheckpointException  # noqa: PLC0415

    batch = {n: torch.empty(layout[n][1], dtype=layout[n][0]) for n in names}
    try:
        with warnings.catch_warnings():  # "assuming ... a single process": it is
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
            dcp.load(batch, checkpoint_id=str(dcp_dir), no_dist=True)
    # a truncated, damaged or missing shard file (DCP's error is a BaseException)
    except (Exception, CheckpointException) as exc:  # noqa: BLE001
        raise _bad(f"{dcp_dir}: tensors {names[0][:80]!r}.. cannot be read, a shard "
                   f"file is corrupt or missing ({type(exc).__name__})") from None
    return batch


def _digest(dcp_dir: Path, meta: dict[str, Any]) -> tuple[str, int, bytes]:
    """``_stream``'s figures with its bytes written nowhere: (sha256 hex, size, state
    hash) of the single file the checkpoint converts to."""
    parts, result = _stream(dcp_dir, meta)
    for _ in parts:
        pass
    return result()


def _stream(dcp_dir: Path, meta: dict[str, Any]
            ) -> tuple[Iterator[bytes | memoryview], Callable[[], tuple[str, int, bytes]]]:
    """The single file's bytes, a batch of tensors read at a time, and, once they are
    consumed, (its sha256 hex, its size, the state hash of its tensors).

    One read of the shards: tensors come in the file's order (safetensors': by dtype,
    then name) and are hashed as they come in name order; one read ahead of its turn
    (another dtype's; in a real state only ``meta.step``) waits, up to ``BATCH_BYTES``
    of them, and past that is dropped and read again at its turn."""
    layout = _layout(dcp_dir)
    head, order = file_header(layout, file_meta(meta))
    names = sorted(layout)
    h = StateHasher(CKPT_SCHEMES[meta["format"]])
    digest, size, done = hashlib.sha256(), 0, False

    def parts() -> Iterator[bytes | memoryview]:
        nonlocal size, done
        digest.update(head)
        size += len(head)
        yield head
        waiting: dict[str, torch.Tensor] = {}  # read ahead of their turn in the hash
        dropped: set[str] = set()
        held, at = 0, 0  # bytes waiting; names[:at] are hashed

        def hash_ready(final: bool = False) -> None:
            nonlocal held, at
            while at < len(names):
                n = names[at]
                if n in waiting:
                    t = waiting.pop(n)
                    held -= _nbytes(layout, n)
                elif n in dropped or final:
                    t = _load(dcp_dir, layout, [n])[n]
                else:
                    return
                h.tensor(n, t)
                at += 1

        for group in _batches(order, layout):
            batch = _load(dcp_dir, layout, group)
            for n in group:
                t = batch.pop(n)
                part = tensor_bytes(t)
                digest.update(part)
                size += len(part) if isinstance(part, bytes) else part.nbytes
                yield part
                if n == names[at]:
                    h.tensor(n, t)
                    at += 1
                    hash_ready()
                elif held + _nbytes(layout, n) <= BATCH_BYTES:
                    waiting[n] = t
                    held += _nbytes(layout, n)
                else:
                    dropped.add(n)
        hash_ready(final=True)
        done = True

    def result() -> tuple[str, int, bytes]:
        if not done:
            raise RuntimeError("the parts were not all consumed")
        return digest.hexdigest(), size, h.digest()

    return parts(), result


def _batches(names: list[str], layout: Mapping[str, tuple[torch.dtype, tuple[int, ...]]]
             ) -> Iterator[list[str]]:
    """``names`` in order, cut into batches of at most ``BATCH_BYTES`` (or one tensor)."""
    group: list[str] = []
    size = 0
    for name in names:
        n = _nbytes(layout, name)
        if group and size + n > BATCH_BYTES:
            yield group
            group, size = [], 0
        group.append(name)
        size += n
    if group:
        yield group


def _check_meta(dcp_dir: Path, meta: dict[str, Any]) -> None:
    if meta["format"] != CKPT_FORMAT:  # sharded checkpoints came with /2
        raise _bad(f"{dcp_dir} is in format {meta['format'][:40]!r}, not {CKPT_FORMAT}")


def seal(partial: str | Path, final: str | Path, meta: dict[str, Any]) -> tuple[str, int]:
    """Rank 0, once every rank's shards are in ``partial``: add the metadata, check the
    shards hash to ``meta["state_hash"]`` (the hash built from the live shards) and
    rename it to ``final``. Returns what the converted single file's sha256 and size
    will be (the manifest names that file), without writing it."""
    partial, final = Path(partial), Path(final)
    _check_meta(partial, meta)
    atomic_write(partial / META_FILE, canonical_json(meta), durable=True)
    sha, size, got = _digest(partial, meta)
    if got.hex() != meta["state_hash"]:
        raise CheckpointError(f"the shards written to {partial} hash to {got.hex()}, the "
                              f"leaf to {meta['state_hash']}: the sharded save is not the state")
    for f in partial.iterdir():  # the ranks' files, written by the ranks' processes
        fsync_file(f)
    fsync_dir(partial)
    if final.exists():
        shutil.rmtree(final)
    os.replace(partial, final)
    fsync_dir(final.parent)
    return sha, size


def check(dcp_dir: str | Path, spec: JobSpec | None = None) -> tuple[dict[str, Any], str, int]:
    """A kept leaf's DCP checkpoint, read once (a batch at a time) and written nowhere:
    its tensors must be ``spec``'s (when given) and hash to its metadata's state hash,
    else CheckpointError. Returns (its metadata, sha256 hex and size of the single file
    it converts to): what a resumed run's manifest names without converting it."""
    src = Path(dcp_dir)
    meta = dcp_meta(src)
    _check_meta(src, meta)
    if spec is not None:
        compare_layout(expected_layout(spec),
                       {n: (st_dtype(d), s) for n, (d, s) in _layout(src).items()},
                       str(src), "the job's spec")
    sha, size, got = _digest(src, meta)
    if got.hex() != meta["state_hash"]:
        raise _bad(f"{src} hashes to state {got.hex()}, its metadata claims "
                   f"{meta['state_hash'][:80]}: a shard is corrupt")
    return meta, sha, size


def convert(dcp_dir: str | Path, dest: str | Path, expected_hash: bytes | str | None = None
            ) -> tuple[str, int]:
    """Write the single-file checkpoint of ``dcp_dir`` to ``dest`` (atomically): its
    state hash must be the metadata's and ``expected_hash`` (the committed leaf's)
    when given, else CheckpointError, ``dest`` not written and ``dcp_dir`` untouched.
    Returns (sha256 hex, size) of the file."""
    src, dest = Path(dcp_dir), Path(dest)
    meta = dcp_meta(src)
    _check_meta(src, meta)
    want = meta["state_hash"]
    if expected_hash is not None:
        exp = expected_hash.hex() if isinstance(expected_hash, bytes) \
            else expected_hash.lower().removeprefix("0x")
        if exp != want:
            raise _bad(f"{src} claims state {want[:80]}, the trace commits {exp}")
    tmp = dest.with_name(f".{dest.name}.tmp-convert-{os.getpid()}")
    parts, result = _stream(src, meta)
    try:
        with open(tmp, "wb") as f:
            for part in parts:
                f.write(part)
            f.flush()
            os.fsync(f.fileno())
        sha, size, got = result()
        if got.hex() != want:
            raise _bad(f"{src} converts to state {got.hex()}, the committed leaf is "
                       f"{want}: a shard is corrupt (re-train from the previous kept "
                       "checkpoint, or re-fetch it)")
        os.replace(tmp, dest)
        fsync_dir(dest.parent)
    finally:
        tmp.unlink(missing_ok=True)
    return sha, size
