"""What a checkpoint of a spec must hold, known before any checkpoint is read.

The names, dtypes and shapes follow ``node.train.step.state_tensors``: the
model's state dict, the optimizer state per parameter, ``meta.step``. They are
read off the model built on the meta device (no memory), so a checkpoint from
a peer is compared with its spec from its safetensors header alone, and its
file size bounded by the spec before one tensor byte is loaded.

Public API::

    expected_layout(spec) -> dict[name, (safetensors dtype, shape)]
    expected_bytes(spec) -> int                  # the tensor data section
    max_header_bytes(spec) -> int                # a generous bound on its header
    check_layout(header, spec, what) -> None     # CheckpointError naming the mismatch
    compare_layout(want, got, what, whose)       # the same for any expected layout
"""

from __future__ import annotations

import math
import threading
from typing import Any

from node.errors import CheckpointError
from node.proof import StateHashScheme, canonical_json
from node.spec import JobSpec
from node.tensorfile import DTYPE_BYTES, Header, st_dtype
from node.train.models import build_skeleton
from node.train.step import STEP_KEY, _optim_keys

Layout = dict[str, tuple[str, tuple[int, ...]]]

# A checkpoint file's format and the state hash it uses. /1 (sha256, every checkpoint
# kept) still loads and verifies; /2 hashes with BLAKE3 and may keep only every M-th
# checkpoint (node.train.sparse).
CKPT_FORMAT = "polnet-checkpoint/2"
CKPT_SCHEMES: dict[str, StateHashScheme] = {"polnet-checkpoint/1": "sha256",
                                            "polnet-checkpoint/2": "blake3"}
META_KEY = "polnet"  # the safetensors metadata entry that holds a checkpoint's metadata
# A kept checkpoint's metadata (its single file's, or a sharded one's polnet.json).
MAX_META_BYTES = 8192  # its "skipped" list: <= 31 x ~100 bytes
META_FIELDS = {"format": "str", "job_id": "int", "step": "int", "state_hash": "str",
               "spec_hash": "str", "segment_loss": "float?", "loss_e9": "int"}

# Header JSON per tensor: its name twice as long as any real one, dtype, a rank-4
# shape and two 12-digit offsets come to < 200 bytes; the metadata is < 1 KiB.
HEADER_BYTES_PER_TENSOR = 512
HEADER_BASE_BYTES = 8192

_cache: dict[str, Layout] = {}
_lock = threading.Lock()


def expected_layout(spec: JobSpec) -> Layout:
    key = spec.spec_hash_hex()
    with _lock:
        if key in _cache:
            return _cache[key]
    model = build_skeleton(spec.model)
    out: Layout = {f"model.{n}": (st_dtype(t.dtype), tuple(t.shape))
                   for n, t in model.state_dict().items()}
    for n, p in model.named_parameters():
        for k in _optim_keys(spec):  # AdamW's "step" is a scalar, as in step._fresh_state
            out[f"optim.{n}.{k}"] = ("F32", () if k == "step" else tuple(p.shape))
    out[STEP_KEY] = ("I64", ())
    with _lock:
        _cache.clear()  # one spec at a time is the common case; never grows
        _cache[key] = out
    return out


def expected_bytes(spec: JobSpec) -> int:
    return sum(math.prod(shape) * DTYPE_BYTES[dt] for dt, shape in expected_layout(spec).values())


def max_header_bytes(spec: JobSpec) -> int:
    return HEADER_BASE_BYTES + HEADER_BYTES_PER_TENSOR * len(expected_layout(spec))


def max_file_bytes(spec: JobSpec) -> int:
    return 8 + max_header_bytes(spec) + expected_bytes(spec)


def check_layout(header: Header, spec: JobSpec, what: str) -> None:
    compare_layout(expected_layout(spec), header.layout(), what, "the job's spec")


def compare_layout(want: Layout, got: Layout, what: str, whose: str) -> None:
    """CheckpointError unless ``got`` names exactly ``want``'s tensors at their dtypes and
    shapes; ``whose`` says where ``want`` comes from, for the message."""
    missing, extra = sorted(want.keys() - got.keys()), sorted(got.keys() - want.keys())
    if missing or extra:
        raise CheckpointError(f"{what} does not fit {whose}: missing {missing[:5]}, "
                              f"unexpected {[n[:80] for n in extra[:5]]}")
    for name, (dtype, shape) in want.items():
        if got[name] != (dtype, shape):
            raise CheckpointError(f"{what}: {name} is {got[name][0]}{list(got[name][1])} "
                                  f"where {whose} needs {dtype}{list(shape)}")


def file_meta(meta: dict[str, Any]) -> dict[str, str]:
    """A checkpoint's metadata as its safetensors header holds it."""
    return {META_KEY: canonical_json(meta).decode("utf-8")}
