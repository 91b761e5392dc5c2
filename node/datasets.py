"""Content-addressed datasets: one safetensors file, hash = sha256 of its bytes.

Layout: vision datasets hold ``x`` (float32, ``[N, C, H, W]``) and ``y``
(int64, ``[N]``); text datasets hold ``tokens`` (int32, ``[L]``, char-level).
All metadata sits under the single key ``"polnet"`` as canonical JSON:
safetensors writes a multi-key metadata map in a per-process random order, so
several keys would make re-packing the same data give different bytes.

Public API::

    pack_digits() -> bytes            # scikit-learn's bundled digits, no download
    pack_text(path=None) -> bytes     # char-level corpus; default CPython's pydoc_data/topics.py
    pack_vision(x, y, name, classes=None) -> bytes   # any [N, C, H, W] float32 + int64 labels
    pack_chars(text, name) -> bytes   # any text, char-level
    (node.dataset_formats packs folders of images, CSV, .npy/.npz and text files)
    write_dataset(data, out) -> str   # atomic write, returns the sha256 hex
    load_dataset(path, expected_hash=None) -> Dataset   # IntegrityError on mismatch
    parse_dataset(raw, expected_hash=None) -> Dataset
    builtin_dataset(hash_hex) -> Dataset | None         # digits/text packed on the fly
    dataset_hash(path) -> str
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from node.boundary import check_fields, decode_json_object
from node.errors import IntegrityError
from node.fsutil import atomic_write
from node.proof import canonical_json, file_sha256
from node.tensorfile import Header, parse_header

FORMAT = "polnet-dataset/1"
META_KEY = "polnet"
Kind = Literal["vision", "text"]
# Two or three tensors and a vocab: a 1,000,000-symbol vocab, escaped twice
# (canonical JSON inside the header's JSON), stays below this.
MAX_HEADER_BYTES = 32 * 2**20
_META_OPTIONAL = {"name": "str", "num_classes": "int", "shape": "[int]", "vocab": "[str]",
                  "classes": "[str]"}


@dataclass(frozen=True)
class Dataset:
    kind: Kind
    name: str
    hash_hex: str
    tensors: dict[str, torch.Tensor]
    meta: dict[str, Any] = field(default_factory=dict)

    @property
    def vocab(self) -> list[str]:
        return list(self.meta.get("vocab", []))

    @property
    def num_classes(self) -> int:
        return int(self.meta.get("num_classes", 0))


def _pack(tensors: dict[str, torch.Tensor], meta: dict[str, Any]) -> bytes:
    header = canonical_json({"format": FORMAT, **meta}).decode("utf-8")
    return st_save({k: v.contiguous() for k, v in tensors.items()}, metadata={META_KEY: header})


def pack_digits() -> bytes:
    """The 1797 8x8 digits bundled with scikit-learn, pixels scaled to [0, 1]."""
    from sklearn.datasets import load_digits  # noqa: PLC0415 - heavy, only here

    d = load_digits()
    x = torch.from_numpy(d.images).to(torch.float32).div_(16.0).unsqueeze(1)
    y = torch.from_numpy(d.target).to(torch.int64)
    return pack_vision(x, y, "sklearn-digits", num_classes=10)


def pack_vision(x: torch.Tensor, y: torch.Tensor, name: str, num_classes: int | None = None,
                classes: list[str] | None = None) -> bytes:
    """``x`` float32 ``[N, C, H, W]``, ``y`` int64 ``[N]``; ``classes`` names label i."""
    meta: dict[str, Any] = {"kind": "vision", "name": name,
                            "num_classes": num_classes or len(classes or []) or int(y.max()) + 1,
                            "shape": list(x.shape[1:])}
    if classes is not None:
        meta["classes"] = classes
    return _pack({"x": x.to(torch.float32), "y": y.to(torch.int64)}, meta)


def default_text_source() -> Path:
    import pydoc_data.topics  # noqa: PLC0415 - a text corpus every CPython ships

    return Path(pydoc_data.topics.__file__)


def pack_text(path: str | Path | None = None) -> bytes:
    """A char-level corpus: vocab = sorted distinct characters, tokens int32."""
    src = Path(path) if path is not None else default_text_source()
    return pack_chars(src.read_text(encoding="utf-8"), f"chars:{src.name}")


def pack_chars(text: str, name: str) -> bytes:
    vocab = sorted(set(text))
    index = {c: i for i, c in enumerate(vocab)}
    tokens = torch.tensor([index[c] for c in text], dtype=torch.int32)
    return _pack({"tokens": tokens}, {"kind": "text", "name": name, "vocab": vocab})


def write_dataset(data: bytes, out: str | Path) -> str:
    p = Path(out)
    p.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(p, data)
    return hashlib.sha256(data).hexdigest()


def dataset_hash(path: str | Path) -> str:
    return file_sha256(path)


def load_dataset(path: str | Path, expected_hash: str | None = None) -> Dataset:
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise IntegrityError(f"cannot read dataset {p}: {exc.strerror}") from None
    return parse_dataset(raw, expected_hash, origin=str(p))


def _bad(origin: str) -> Callable[[str], IntegrityError]:
    def make(message: str) -> IntegrityError:
        return IntegrityError(f"{message}: not a usable polnet dataset; repack it with "
                              "`polnet dataset pack` (or fix the file it was packed from)")
    return make


def _check_layout(header: Header, kind: str, origin: str) -> None:
    """Names, dtypes and ranks from the header, before any tensor is read."""
    bad = _bad(origin)
    layout = header.layout()
    want = {"vision": {"x": ("F32", 4), "y": ("I64", 1)}, "text": {"tokens": ("I32", 1)}}[kind]
    for name, (dtype, rank) in want.items():
        if name not in layout:
            raise bad(f"{origin}: a {kind} dataset needs tensors {sorted(want)}")
        got_dtype, shape = layout[name]
        if got_dtype != dtype or len(shape) != rank or 0 in shape:
            raise bad(f"{origin}: tensor {name!r} is {got_dtype}{list(shape)}, a {kind} "
                      f"dataset needs a non-empty {dtype} tensor of rank {rank}")
    if kind == "vision" and layout["x"][1][0] != layout["y"][1][0]:
        raise bad(f"{origin}: {layout['x'][1][0]} samples in x but {layout['y'][1][0]} "
                  "labels in y")
    if kind == "text" and layout["tokens"][1][0] < 2:
        raise bad(f"{origin}: a text dataset needs at least 2 tokens")


def _check_values(tensors: dict[str, torch.Tensor], meta: dict[str, Any], origin: str) -> None:
    """Labels and tokens in range, inputs finite: what training would index with."""
    bad = _bad(origin)
    if meta["kind"] == "vision":
        y, classes = tensors["y"], meta.get("num_classes")
        lo, hi = int(y.min()), int(y.max())
        if lo < 0 or (classes is not None and hi >= classes):
            raise bad(f"{origin}: labels span {lo}..{hi}, they must lie in "
                      f"0..{'num_classes-1' if classes is None else classes - 1}")
        if not bool(torch.isfinite(tensors["x"]).all()):
            raise bad(f"{origin}: x holds NaN or infinite values")
        shape = meta.get("shape")
        if shape is not None and list(tensors["x"].shape[1:]) != shape:
            raise bad(f"{origin}: samples are {list(tensors['x'].shape[1:])}, the metadata "
                      f"says {shape}")
    else:
        vocab, tokens = meta.get("vocab", []), tensors["tokens"]
        lo, hi = int(tokens.min()), int(tokens.max())
        if not vocab or lo < 0 or hi >= len(vocab):
            raise bad(f"{origin}: tokens span {lo}..{hi}, they must index the "
                      f"{len(vocab)}-symbol vocab")


def parse_dataset(raw: bytes, expected_hash: str | None = None,
                  origin: str = "dataset") -> Dataset:
    """Hash, then header (bounded, checked), then tensors, then their values.

    A model's own limits (classes, vocab_size, input shape) are compared with the
    dataset when it is bound to a spec (node.train.step.TrainContext.create)."""
    got = hashlib.sha256(raw).hexdigest()
    if expected_hash is not None and got != expected_hash.lower().removeprefix("0x"):
        raise IntegrityError(
            f"{origin} has sha256 {got} but the spec expects {expected_hash}: "
            "fetch the dataset the job names (or fix dataset_hash in the spec; "
            "`polnet dataset pack` prints the hash of a packed file)")
    bad = _bad(origin)
    header = parse_header(raw, max_header=MAX_HEADER_BYTES, what=origin, error=bad)
    if META_KEY not in header.metadata:
        raise bad(f"{origin} has no {META_KEY!r} metadata")
    meta = decode_json_object(header.metadata[META_KEY], max_bytes=MAX_HEADER_BYTES,
                              what=f"{origin} metadata", error=bad)
    check_fields(meta, {"format": "str", "kind": "str"}, optional=_META_OPTIONAL,
                 extra_ok=True, what=f"{origin} metadata", error=bad)
    if meta["format"] != FORMAT or meta["kind"] not in ("vision", "text"):
        raise IntegrityError(f"{origin}: unknown dataset format {meta['format'][:40]!r} or "
                             f"kind {meta['kind'][:40]!r}; expected {FORMAT}, vision|text")
    _check_layout(header, meta["kind"], origin)
    try:
        tensors = st_load(raw)
    except Exception as exc:  # noqa: BLE001 - the header checked out, the bytes did not
        raise bad(f"{origin} is corrupt ({exc})") from None
    _check_values(tensors, meta, origin)
    return Dataset(kind=meta["kind"], name=str(meta.get("name", "")), hash_hex=got,
                   tensors=tensors, meta=meta)


def builtin_dataset(expected_hash: str) -> Dataset | None:
    """The built-in dataset (digits, then the default text) with this hash, if any."""
    for packer in (pack_digits, pack_text):
        raw = packer()
        if hashlib.sha256(raw).hexdigest() == expected_hash:
            return parse_dataset(raw, expected_hash, origin=f"built-in {packer.__name__}")
    return None
