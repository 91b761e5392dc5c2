"""`polnet dataset pack tokens`: corpus -> tokenizer -> fixed-length token shards.

Documents are read in a fixed order (files by sorted relative path; rows and lines
in file order), so the same documents give the same bytes whatever holds them: a
JSONL file, a Parquet or Arrow table, or a folder of text files (one document per
file). A byte-level BPE tokenizer is trained on them (``tokenizers``; training is
deterministic, measured across runs and thread counts) or supplied as a
``tokenizers`` JSON file named by its sha256. Each document's ids, then the end
of text id, are concatenated and cut into sequences of ``seq_len`` ids (the tail
that does not fill one is dropped), which are dealt into shards whose sizes differ
by at most one sequence, or (``exact_shards``) into shards of exactly
``shard_sequences`` each, the sequences that fill no shard dropped: with
``shard_sequences = k * batch_size`` each segment of a job reads exactly one shard,
so a verifier fetches the sampled share of the bytes (plus the manifest).

Public API::

    read_documents(source, text_field="text") -> Iterator[str]
    train_tokenizer(documents, vocab_size) -> bytes          # tokenizers JSON
    load_tokenizer(path, expected_hash=None) -> bytes       # IntegrityError on mismatch
    pack_tokens(source, out_dir, seq_len, ...) -> Packed    # writes manifest + shards
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

import numpy as np

from node.data.manifest import (
    MAX_SEQ_LEN,
    MAX_SHARDS,
    ShardEntry,
    ShardManifest,
    encode_shard,
    shard_size,
)
from node.errors import DatasetError, IntegrityError
from node.fsutil import atomic_write

EOS = "<|endoftext|>"
TEXT_SUFFIXES = {".txt", ".md", ".text"}
TABLE_SUFFIXES = {".jsonl", ".parquet", ".arrow", ".feather"}
MAX_TOKENIZER_BYTES = 64 * 2**20
MAX_TOKENS = 2**31   # ids held in memory while packing


def _text_of(value: object, where: str, text_field: str) -> str:
    if not isinstance(value, str):
        raise DatasetError(f"{where}: field {text_field!r} is {type(value).__name__}, "
                           "not a string (name the text column with --text-field)")
    return value


def _jsonl(path: Path, text_field: str) -> Iterator[str]:
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DatasetError(f"{path}:{n}: not JSON ({exc.msg})") from None
            if not isinstance(row, dict) or text_field not in row:
                raise DatasetError(f"{path}:{n}: a JSONL line must be an object with a "
                                   f"{text_field!r} field")
            yield _text_of(row[text_field], f"{path}:{n}", text_field)


def _table(path: Path, text_field: str) -> Iterator[str]:
    import pyarrow as pa  # noqa: PLC0415 - heavy, only for tables
    import pyarrow.ipc as ipc  # noqa: PLC0415
    import pyarrow.parquet as pq  # noqa: PLC0415

    try:
        if path.suffix == ".parquet":
            batches: Iterable[pa.RecordBatch] = pq.ParquetFile(path).iter_batches(
                columns=[text_field])
        else:
            try:
                reader = ipc.open_file(path)  # Arrow IPC file (also Feather v2)
                batches = [reader.get_batch(i) for i in range(reader.num_record_batches)]
            except pa.ArrowInvalid:
                batches = ipc.open_stream(path)
        for b in batches:
            if text_field not in b.schema.names:
                raise DatasetError(f"{path}: no column {text_field!r} (columns: "
                                   f"{b.schema.names[:10]}); name it with --text-field")
            for v in b.column(text_field).to_pylist():
                yield _text_of(v, str(path), text_field)
    except (pa.ArrowException, OSError) as exc:
        raise DatasetError(f"{path}: cannot read the table ({exc})") from None


def _files(source: Path) -> list[Path]:
    if source.is_file():
        return [source]
    if not source.is_dir():
        raise DatasetError(f"{source} is neither a file nor a folder")
    found = sorted((p for p in source.rglob("*") if p.is_file()
                    and p.suffix in TEXT_SUFFIXES | TABLE_SUFFIXES),
                   key=lambda p: p.relative_to(source).as_posix())
    if not found:
        raise DatasetError(f"{source} holds no {sorted(TEXT_SUFFIXES | TABLE_SUFFIXES)} files")
    return found


def read_documents(source: str | Path, text_field: str = "text") -> Iterator[str]:
    """The documents of a file or folder, in a fixed order."""
    for path in _files(Path(source)):
        if path.suffix == ".jsonl":
            yield from _jsonl(path, text_field)
        elif path.suffix in TABLE_SUFFIXES:
            yield from _table(path, text_field)
        else:
            try:
                yield path.read_text(encoding="utf-8")
            except UnicodeDecodeError as exc:
                raise DatasetError(f"{path}: not UTF-8 text (byte {exc.start})") from None


def train_tokenizer(documents: Iterable[str], vocab_size: int) -> bytes:
    """A byte-level BPE tokenizer (GPT-2 style, ``<|endoftext|>`` = id 0) as JSON bytes."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: PLC0415

    if not 257 <= vocab_size <= 2**20:
        raise DatasetError(f"vocab_size {vocab_size}: byte-level BPE needs 257..1048576 "
                           "(256 bytes + end of text)")
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[EOS],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(documents, trainer=trainer)
    return tok.to_str().encode("utf-8")


def load_tokenizer(path: str | Path, expected_hash: str | None = None) -> bytes:
    """A supplied tokenizers JSON file, refused unless its sha256 is ``expected_hash``."""
    p = Path(path)
    if p.stat().st_size > MAX_TOKENIZER_BYTES:
        raise DatasetError(f"{p} is over {MAX_TOKENIZER_BYTES} bytes: not a tokenizer file")
    raw = p.read_bytes()
    got = hashlib.sha256(raw).hexdigest()
    if expected_hash is not None and got != expected_hash.lower().removeprefix("0x"):
        raise IntegrityError(f"tokenizer {p} has sha256 {got}, not the {expected_hash} "
                             "it was named by: use the file that hash names")
    return raw


@dataclass(frozen=True)
class Packed:
    manifest: ShardManifest
    manifest_path: Path
    tokenizer_path: Path
    shard_paths: list[Path]
    tokens: int

    @property
    def hash_hex(self) -> str:
        return self.manifest.hash_hex


def _encode_all(tok_json: bytes, documents: Iterable[str], eos_id: int) -> np.ndarray:
    from tokenizers import Tokenizer  # noqa: PLC0415

    tok = Tokenizer.from_str(tok_json.decode("utf-8"))
    parts: list[np.ndarray] = []
    total = 0
    batch: list[str] = []

    def flush() -> None:
        nonlocal total
        for enc in tok.encode_batch(batch, add_special_tokens=False):
            ids = np.asarray([*enc.ids, eos_id], dtype=np.int64)
            total += ids.size
            parts.append(ids)
        batch.clear()
        if total > MAX_TOKENS:
            raise DatasetError(f"over {MAX_TOKENS} tokens: pack the corpus in parts")

    for doc in documents:
        batch.append(doc)
        if len(batch) == 1024:
            flush()
    flush()
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)


def pack_tokens(source: str | Path, out_dir: str | Path, seq_len: int,
                shard_sequences: int = 1024, vocab_size: int = 8192,
                tokenizer: str | Path | None = None, tokenizer_hash: str | None = None,
                text_field: str = "text", name: str = "", exact_shards: bool = False) -> Packed:
    """Tokenize ``source`` into ``out_dir``: ``manifest.json`` (its sha256 is the
    dataset hash), ``tokenizer.json`` and ``shards/<sha256>.safetensors``.
    ``exact_shards``: every shard holds ``shard_sequences`` (the rest is dropped)."""
    if not 2 <= seq_len <= MAX_SEQ_LEN:
        raise DatasetError(f"seq_len {seq_len} must lie in 2..{MAX_SEQ_LEN}")
    if shard_sequences < 1:
        raise DatasetError("shard_sequences must be >= 1")
    tok_json = (load_tokenizer(tokenizer, tokenizer_hash) if tokenizer is not None
                else train_tokenizer(read_documents(source, text_field), vocab_size))
    from tokenizers import Tokenizer  # noqa: PLC0415

    try:
        tok = Tokenizer.from_str(tok_json.decode("utf-8"))
    except Exception as exc:  # noqa: BLE001 - whatever the library says about the file
        raise DatasetError(f"not a tokenizers JSON file ({str(exc)[:200]})") from None
    eos_id = tok.token_to_id(EOS)
    if eos_id is None:
        raise DatasetError(f"the tokenizer has no {EOS!r} token (it separates documents)")
    vocab = tok.get_vocab_size(with_added_tokens=True)
    ids = _encode_all(tok_json, read_documents(source, text_field), eos_id)
    n_seq = ids.size // seq_len
    if n_seq < 1:
        raise DatasetError(f"{source}: {ids.size} tokens do not fill one {seq_len}-token "
                           "sequence")
    if exact_shards:
        if n_seq < shard_sequences:
            raise DatasetError(f"{source}: {n_seq} sequences do not fill one shard of "
                               f"{shard_sequences}")
        n_seq -= n_seq % shard_sequences
    seqs = ids[:n_seq * seq_len].reshape(n_seq, seq_len)
    n_shards = -(-n_seq // shard_sequences)
    if n_shards > MAX_SHARDS:
        raise DatasetError(f"{n_shards} shards > {MAX_SHARDS}: raise --shard-sequences")
    dtype: Literal["uint16", "int32"] = "uint16" if vocab <= 2**16 else "int32"
    out = Path(out_dir)
    (out / "shards").mkdir(parents=True, exist_ok=True)
    base, extra = divmod(n_seq, n_shards)
    entries, paths, start = [], [], 0
    for i in range(n_shards):
        n = base + (1 if i < extra else 0)
        raw = encode_shard(seqs[start:start + n], dtype)
        start += n
        digest = hashlib.sha256(raw).hexdigest()
        path = out / "shards" / f"{digest}.safetensors"
        atomic_write(path, raw, durable=False)
        entries.append(ShardEntry(hash=digest, sequences=n, size=len(raw)))
        paths.append(path)
        assert len(raw) == shard_size(n, seq_len, 2 if dtype == "uint16" else 4)
    manifest = ShardManifest(name=name, tokenizer=hashlib.sha256(tok_json).hexdigest(),
                             vocab_size=vocab, eos_id=eos_id, seq_len=seq_len, dtype=dtype,
                             shards=entries)
    atomic_write(out / "tokenizer.json", tok_json)
    atomic_write(out / "manifest.json", manifest.to_bytes())
    return Packed(manifest, out / "manifest.json", out / "tokenizer.json", paths,
                  int(n_seq * seq_len))
