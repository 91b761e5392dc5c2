"""Sharded token datasets: a canonical manifest naming content-addressed shards.

A sharded dataset is a manifest (canonical JSON; its sha256 is the spec's
``dataset_hash``) plus shards, each a safetensors file holding ``tokens``
``[sequences, seq_len]`` of token ids (``uint16`` when the vocabulary fits, else
``int32``), named in the manifest by sha256 and size. The manifest also names the
tokenizer (a ``tokenizers`` JSON file) by sha256: the ids mean nothing without it,
but training needs only the ids, so solvers and verifiers never fetch it.

Both come from peers, so both are bounded before use: the manifest by its size,
field types and ranges (pydantic, after a bounded JSON decode); a shard by its hash
and size against the manifest entry, then its header (names, dtype, shape) before
any tensor is read, then its token ids against the vocabulary.

Public API::

    ShardManifest(...).to_bytes() / .hash_hex      # canonical bytes and their sha256
    parse_manifest(raw, expected_hash=None) -> ShardManifest    # IntegrityError if bad
    is_shard_manifest(raw) -> bool                 # a manifest, not a safetensors dataset
    encode_shard(tokens [n, seq_len], dtype) -> bytes
    parse_shard(raw, manifest, index) -> Tensor int32 [n, seq_len]  # IntegrityError if bad
    stream_memory_bytes(manifest) -> int     # what a StreamContext may hold at once
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Annotated, Literal

import numpy as np
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from safetensors.numpy import load as np_load
from safetensors.numpy import save as np_save

from node.boundary import decode_json_object
from node.errors import IntegrityError
from node.proof import canonical_json
from node.tensorfile import parse_header

if TYPE_CHECKING:
    import torch

FORMAT = "polnet-shards/1"
SHARD_FORMAT = "polnet-shard/1"
META_KEY = "polnet"
MAX_MANIFEST_BYTES = 4 * 2**20        # ~30k shard entries
MAX_SHARDS = 16_384
MAX_SEQ_LEN = 65_536
MAX_SHARD_BYTES = 512 * 2**20
MAX_SHARD_HEADER = 4096               # one tensor and one short metadata string
MAX_VOCAB = 2**31 - 1
DTYPES: dict[str, tuple[type[np.integer], str]] = {"uint16": (np.uint16, "U16"),
                                                   "int32": (np.int32, "I32")}
Hex64 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


def _bad(message: str) -> IntegrityError:
    return IntegrityError(f"{message}: not a usable sharded dataset; repack it with "
                          "`polnet dataset pack tokens`")


class ShardEntry(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    hash: Hex64
    sequences: int = Field(ge=1, le=MAX_SHARD_BYTES // 2)
    size: int = Field(ge=8, le=MAX_SHARD_BYTES)


class ShardManifest(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, strict=True)

    format: Literal["polnet-shards/1"] = "polnet-shards/1"
    name: str = Field(default="", max_length=200)
    tokenizer: Hex64                  # sha256 of the tokenizers JSON file
    vocab_size: int = Field(ge=2, le=MAX_VOCAB)
    eos_id: int = Field(ge=0, le=MAX_VOCAB)
    seq_len: int = Field(ge=2, le=MAX_SEQ_LEN)
    dtype: Literal["uint16", "int32"]
    shards: list[ShardEntry] = Field(min_length=1, max_length=MAX_SHARDS)

    @model_validator(mode="after")
    def _consistent(self) -> ShardManifest:
        if self.eos_id >= self.vocab_size:
            raise ValueError(f"eos_id {self.eos_id} is outside the {self.vocab_size}-id vocab")
        if self.dtype == "uint16" and self.vocab_size > 2**16:
            raise ValueError(f"a {self.vocab_size}-id vocab does not fit uint16")
        item = 2 if self.dtype == "uint16" else 4
        for i, s in enumerate(self.shards):
            if s.size != shard_size(s.sequences, self.seq_len, item):
                raise ValueError(f"shard {i} claims {s.size} bytes; {s.sequences} x "
                                 f"{self.seq_len} {self.dtype} ids take "
                                 f"{shard_size(s.sequences, self.seq_len, item)}")
        return self

    def to_bytes(self) -> bytes:
        return canonical_json(self.model_dump(mode="json"))

    @property
    def hash_hex(self) -> str:
        return hashlib.sha256(self.to_bytes()).hexdigest()

    @property
    def total_sequences(self) -> int:
        return sum(s.sequences for s in self.shards)

    @property
    def total_bytes(self) -> int:
        return sum(s.size for s in self.shards)


def _shard_header(n: int, seq_len: int, st_dtype: str) -> bytes:
    """The exact safetensors header np_save writes for one shard (checked in tests)."""
    import json  # noqa: PLC0415

    meta = canonical_json({"format": SHARD_FORMAT}).decode()
    body = json.dumps({"__metadata__": {META_KEY: meta},
                       "tokens": {"dtype": st_dtype, "shape": [n, seq_len],
                                  "data_offsets": [0, n * seq_len * (2 if st_dtype == "U16"
                                                                     else 4)]}},
                      separators=(",", ":")).encode()
    return body + b" " * (-len(body) % 8)


def shard_size(n: int, seq_len: int, item: int) -> int:
    """File size of a shard of ``n`` sequences: 8 + header (padded to 8) + data."""
    header = _shard_header(n, seq_len, "U16" if item == 2 else "I32")
    return 8 + len(header) + n * seq_len * item


HELD_SHARDS = 6 + 2  # StreamContext: cached + loading (node.data.stream)


def stream_memory_bytes(manifest: ShardManifest) -> int:
    """The most a StreamContext holds: its cached and in-flight shards, as raw bytes
    and int32 ids, each as large as the largest shard the manifest names."""
    biggest = max(s.size for s in manifest.shards)
    ids = max(s.sequences for s in manifest.shards) * manifest.seq_len * 4
    return HELD_SHARDS * (biggest + ids)


def encode_shard(tokens: np.ndarray, dtype: str) -> bytes:
    """Shard bytes for ``tokens [n, seq_len]``: the same ids give the same bytes."""
    np_dtype, _ = DTYPES[dtype]
    meta = canonical_json({"format": SHARD_FORMAT}).decode()
    return np_save({"tokens": np.ascontiguousarray(tokens, dtype=np_dtype)},
                   metadata={META_KEY: meta})


def is_shard_manifest(raw: bytes) -> bool:
    """A sharded dataset's manifest starts as canonical JSON does; a safetensors
    dataset starts with its 8-byte little-endian header length."""
    return raw[:1] == b"{"


def parse_manifest(raw: bytes, expected_hash: str | None = None,
                   origin: str = "dataset manifest") -> ShardManifest:
    """Hash, then a bounded decode, then fields and ranges; canonical bytes only (so
    one dataset has one hash)."""
    got = hashlib.sha256(raw).hexdigest()
    if expected_hash is not None and got != expected_hash.lower().removeprefix("0x"):
        raise IntegrityError(f"{origin} has sha256 {got} but the spec expects "
                             f"{expected_hash}: fetch the dataset the job names")
    obj = decode_json_object(raw, max_bytes=MAX_MANIFEST_BYTES, what=origin, error=_bad)
    try:
        manifest = ShardManifest.model_validate(obj)
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(map(str, first["loc"])) or "manifest"
        raise _bad(f"{origin}: {where}: {first['msg']}") from None
    if manifest.to_bytes() != raw:
        raise _bad(f"{origin} is not in canonical form")
    return manifest


def parse_shard(raw: bytes, manifest: ShardManifest, index: int,
                origin: str | None = None) -> torch.Tensor:
    """Shard ``index`` of ``manifest`` as int32 ``[sequences, seq_len]``, or
    IntegrityError naming the shard and what is wrong with it."""
    if not 0 <= index < len(manifest.shards):
        raise IntegrityError(f"shard {index} is not in 0..{len(manifest.shards) - 1}")
    entry = manifest.shards[index]
    what = origin or f"shard {index} ({entry.hash[:12]})"
    if len(raw) != entry.size:
        raise IntegrityError(f"{what} is {len(raw)} bytes, the manifest says {entry.size}: "
                             "truncated or padded; fetch it again")
    got = hashlib.sha256(raw).hexdigest()
    if got != entry.hash:
        raise IntegrityError(f"{what} has sha256 {got}, the manifest says {entry.hash}: "
                             "corrupt or substituted; fetch it again from another peer")
    # The hash matched a manifest we checked, but the packer may be hostile: the
    # header and ids are checked as for any peer's file.
    header = parse_header(raw, max_header=MAX_SHARD_HEADER, what=what, error=_bad)
    want = (DTYPES[manifest.dtype][1], (entry.sequences, manifest.seq_len))
    if header.layout() != {"tokens": want}:
        raise _bad(f"{what} holds {header.layout()}, the manifest says tokens {want}")
    import torch  # noqa: PLC0415 - a solver's probe reads manifests before torch loads

    try:
        arr = np_load(raw)["tokens"]
    except Exception as exc:  # noqa: BLE001 - the header checked out, the bytes did not
        raise _bad(f"{what} is corrupt ({exc})") from None
    ids = torch.from_numpy(arr.astype(np.int32, copy=False))  # int64 only per batch
    lo, hi = int(ids.min()), int(ids.max())
    if lo < 0 or hi >= manifest.vocab_size:
        raise _bad(f"{what}: token ids span {lo}..{hi}, outside the "
                   f"{manifest.vocab_size}-id vocab")
    return ids
