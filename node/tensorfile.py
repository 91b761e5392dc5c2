"""Safetensors headers, read and checked before a single tensor is.

A safetensors file is ``u64 N`` (little endian), ``N`` bytes of JSON naming
each tensor's dtype, shape and byte range, then the tensor bytes. Checkpoints
and datasets come from peers and submitters, so the header is decoded through
node.boundary under a caller's bound on ``N``, and every entry is checked:
a known dtype, a sane shape, a byte range of exactly ``numel * itemsize``,
ranges contiguous from 0 to the end of the file. A caller then compares the
names, shapes and dtypes with what it expects and only then reads the data.

Public API::

    read_header(f, file_size, max_header=..., what=..., error=...) -> Header
    parse_header(raw, max_header=..., what=..., error=...) -> Header   # whole file in memory
    tensor_file_parts(tensors, metadata) -> [header, buffers...]   # a file, unjoined
    file_header(layout, metadata) -> (header bytes, tensor order)   # to stream one
    st_dtype(torch dtype) -> safetensors dtype name
    DTYPE_BYTES                                  # safetensors dtype -> item size
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, BinaryIO

from node.boundary import ErrorFactory, decode_json_object
from node.errors import MalformedInput

if TYPE_CHECKING:
    import torch

DTYPE_BYTES = {"BOOL": 1, "U8": 1, "I8": 1, "F8_E5M2": 1, "F8_E4M3": 1, "I16": 2, "U16": 2,
               "F16": 2, "BF16": 2, "I32": 4, "U32": 4, "F32": 4, "I64": 8, "U64": 8, "F64": 8}
MAX_RANK = 8
METADATA_KEY = "__metadata__"


@dataclass(frozen=True)
class TensorInfo:
    dtype: str
    shape: tuple[int, ...]
    start: int  # byte range within the data section
    end: int

    @property
    def numel(self) -> int:
        return math.prod(self.shape)


@dataclass(frozen=True)
class Header:
    tensors: dict[str, TensorInfo]
    metadata: dict[str, str]
    data_start: int  # 8 + N

    @property
    def data_bytes(self) -> int:
        return max((t.end for t in self.tensors.values()), default=0)

    def layout(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        return {name: (t.dtype, t.shape) for name, t in self.tensors.items()}


def _is_int(v: object) -> bool:
    return type(v) is int  # JSON true/false decode to bool, a subclass of int


def _entry(name: str, spec: Any, what: str, error: ErrorFactory) -> TensorInfo:
    if not isinstance(spec, dict) or set(spec) != {"dtype", "shape", "data_offsets"}:
        raise error(f"{what}: tensor {name[:80]!r} is not {{dtype, shape, data_offsets}}")
    dtype, shape, offsets = spec["dtype"], spec["shape"], spec["data_offsets"]
    if not isinstance(dtype, str) or dtype not in DTYPE_BYTES:
        raise error(f"{what}: tensor {name[:80]!r} has unknown dtype {str(dtype)[:20]!r}")
    if not isinstance(shape, list) or len(shape) > MAX_RANK \
            or not all(_is_int(d) and d >= 0 for d in shape):
        raise error(f"{what}: tensor {name[:80]!r} has a bad shape")
    if not isinstance(offsets, list) or len(offsets) != 2 \
            or not all(_is_int(o) and o >= 0 for o in offsets):
        raise error(f"{what}: tensor {name[:80]!r} has bad data_offsets")
    info = TensorInfo(dtype, tuple(shape), offsets[0], offsets[1])
    if info.end - info.start != info.numel * DTYPE_BYTES[dtype]:
        raise error(f"{what}: tensor {name[:80]!r} spans {info.end - info.start} bytes, "
                    f"its shape needs {info.numel * DTYPE_BYTES[dtype]}")
    return info


def _decode(length: int, body: bytes, file_size: int, max_header: int, what: str,
            error: ErrorFactory) -> Header:
    obj = decode_json_object(body, max_bytes=max_header, what=f"{what} header", max_depth=3,
                             error=error)
    meta = obj.pop(METADATA_KEY, {})
    if not isinstance(meta, dict) or not all(isinstance(v, str) for v in meta.values()):
        raise error(f"{what}: {METADATA_KEY} must map strings to strings")
    tensors = {name: _entry(name, spec, what, error) for name, spec in obj.items()}
    pos = 0
    for name, t in sorted(tensors.items(), key=lambda kv: (kv[1].start, kv[1].end)):
        if t.start != pos:
            raise error(f"{what}: tensor {name[:80]!r} starts at byte {t.start}, not {pos} "
                        "(ranges must be contiguous)")
        pos = t.end
    data_start = 8 + length
    if data_start + pos != file_size:
        raise error(f"{what}: header describes {data_start + pos} bytes, the file has "
                    f"{file_size}: truncated or padded")
    return Header(tensors, meta, data_start)


def _length(first8: bytes, file_size: int, max_header: int, what: str,
            error: ErrorFactory) -> int:
    if len(first8) < 8:
        raise error(f"{what} is {file_size} bytes: too short for a safetensors file")
    length = int.from_bytes(first8, "little")
    if length > max_header:
        raise error(f"{what} header claims {length} bytes (at most {max_header} here)")
    if 8 + length > file_size:
        raise error(f"{what} header claims {length} bytes, the file has {file_size}")
    return length


def read_header(f: BinaryIO, file_size: int, *, max_header: int, what: str = "tensor file",
                error: ErrorFactory = MalformedInput) -> Header:
    """Read and check the header from the start of ``f`` (reads 8 + N bytes only)."""
    length = _length(f.read(8), file_size, max_header, what, error)
    body = f.read(length)
    if len(body) != length:
        raise error(f"{what} ended inside its header")
    return _decode(length, body, file_size, max_header, what, error)


def parse_header(raw: bytes, *, max_header: int, what: str = "tensor file",
                 error: ErrorFactory = MalformedInput) -> Header:
    """``read_header`` for a file already in memory."""
    length = _length(raw[:8], len(raw), max_header, what, error)
    return _decode(length, raw[8:8 + length], len(raw), max_header, what, error)


# safetensors' dtypes, in its own order: it lays tensors out by dtype, largest rank
# first, then by name; following it makes ``tensor_file_parts`` its ``save``'s bytes.
_ST_ORDER = ("BOOL", "U8", "I8", "I16", "F16", "BF16", "I32", "F32", "F64", "I64")


def st_dtype(dtype: torch.dtype) -> str:
    """The safetensors name of a torch dtype (ValueError for one it has none for)."""

    names = _st_names()
    if dtype not in names:
        raise ValueError(f"no safetensors dtype for {dtype}")
    return names[dtype]


def torch_dtype(name: str) -> torch.dtype:
    """The torch dtype of a safetensors dtype name (ValueError for one torch lacks here)."""
    for dtype, st in _st_names().items():
        if st == name:
            return dtype
    raise ValueError(f"no torch dtype for safetensors {name[:20]!r}")


def _st_names() -> dict[torch.dtype, str]:
    import torch  # noqa: PLC0415 - lazy: readers of headers need no torch

    return {torch.float32: "F32", torch.float64: "F64", torch.float16: "F16",
            torch.bfloat16: "BF16", torch.int64: "I64", torch.int32: "I32",
            torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL"}


def file_header(layout: Mapping[str, tuple[torch.dtype, Sequence[int]]],
                metadata: Mapping[str, str]) -> tuple[bytes, list[str]]:
    """A safetensors file's header (length prefix included) for tensors of ``layout``
    (name -> dtype, shape) and the order their bytes follow it in: a file can be
    streamed one tensor at a time (node.train.shardckpt) in ``tensor_file_parts``'s bytes."""
    names = sorted(layout, key=lambda n: (-_ST_ORDER.index(st_dtype(layout[n][0])), n))
    header: dict[str, Any] = {METADATA_KEY: dict(metadata)} if metadata else {}
    pos = 0
    for name in names:
        dtype, shape = layout[name]
        nbytes = math.prod(shape) * dtype.itemsize
        header[name] = {"dtype": st_dtype(dtype), "shape": [int(d) for d in shape],
                        "data_offsets": [pos, pos + nbytes]}
        pos += nbytes
    body = json.dumps(header, separators=(",", ":")).encode()
    body += b" " * (-len(body) % 8)  # safetensors aligns the data section to 8 bytes
    return len(body).to_bytes(8, "little") + body, names


def tensor_file_parts(tensors: Mapping[str, torch.Tensor],
                      metadata: Mapping[str, str]) -> list[bytes | memoryview]:
    """A safetensors file as its parts, the tensors' own buffers (no copy of a CPU
    contiguous tensor): safetensors' ``save`` builds the whole file in memory first
    (0.58 s and 600 MB of fresh pages for a 300 MB state); written in order, these
    parts are the same bytes."""

    head, names = file_header({n: (t.dtype, tuple(t.shape)) for n, t in tensors.items()},
                              metadata)
    return [head, *(b for n in names if (b := tensor_bytes(tensors[n])))]


def tensor_bytes(t: torch.Tensor) -> bytes | memoryview:
    """A tensor's row-major bytes as its file holds them (its own buffer when it is a
    contiguous CPU tensor)."""
    import torch  # noqa: PLC0415

    t = t.detach().cpu().contiguous()
    if not t.numel():
        return b""
    return memoryview(t.reshape(-1).view(torch.uint8).numpy())  # type: ignore[arg-type]
