"""Bytes a verifier of a sharded job fetches against the whole dataset (issue 32).

Packs a corpus that ships with CPython (pydoc topics and the first ``--mb`` MB of the
standard library's top-level modules, one document per file) into token shards with a
byte-level BPE trained on it,
posts a transformer_lm job that reads one epoch, draws the verifier's sample as
the chain would (verifier.sampler.plan_sample: 10% cheating found with 99%
confidence), and fetches the manifest plus the sampled segments' shards from a
second real libp2p host on 127.0.0.1, counting the bytes off the wire.

    PYTHONPATH=. python bench/shards.py [--mb 4] [--seq-len 65] [--shard-sequences 32] [--k 8]
        [--exact-shards]

``--exact-shards``: shards of exactly ``--shard-sequences`` (default there: k x
batch_size, one segment's sequences) with the tail dropped, so each segment reads one
shard. Without it, shards of ~32 sequences and segments of 64 straddle 2-3 shards.

Last line: JSON with fetched_bytes, dataset_bytes (shards + manifest), their ratio,
the sampled share of segments, the target (sampled share + the manifest's share of
the dataset's bytes) and whether the fetch stayed within it, and the shard counts.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from node.data.pack import pack_tokens
from node.data.stream import fetch_segments, segment_shards
from node.datasets import default_text_source
from node.p2p import P2PSettings, PolnetNode
from node.spec import parse_spec
from verifier.sampler import plan_sample


def measure_fetch(tmp: Path, *, mb: float = 4.0, seq_len: int = 65,
                  shard_sequences: int | None = None, exact_shards: bool = False,
                  vocab_size: int = 2048, batch_size: int = 8, k: int = 8,
                  model: dict[str, Any] | None = None) -> dict[str, Any]:
    """Pack the corpus under ``tmp``, post (in memory) a job reading one epoch with
    ``model`` (default: a tiny transformer_lm; the shards a segment reads depend on the
    seed, batch size and k, not on the model), and count the bytes a verifier's host
    fetches for its sampled segments from a second host."""
    corpus = tmp / "corpus"
    corpus.mkdir()
    (corpus / "0000-topics.txt").write_text(default_text_source().read_text("utf-8"))
    budget = int(mb * 2**20)
    for i, py in enumerate(sorted(Path(os.__file__).parent.glob("*.py")), 1):
        if budget <= 0:
            break
        text = py.read_text(encoding="utf-8", errors="replace")
        (corpus / f"{i:04d}-{py.stem}.txt").write_text(text)
        budget -= len(text)
    t0 = time.perf_counter()
    per_shard = shard_sequences or (k * batch_size if exact_shards else 32)
    packed = pack_tokens(corpus, tmp / "ds", seq_len=seq_len, shard_sequences=per_shard,
                         vocab_size=vocab_size, exact_shards=exact_shards)
    pack_s = time.perf_counter() - t0
    m = packed.manifest
    per_epoch = m.total_sequences // batch_size
    total = per_epoch - per_epoch % k
    spec = parse_spec({
        "model": model or {"family": "transformer_lm", "vocab_size": m.vocab_size,
                           "context": seq_len - 1, "d_model": 32, "n_heads": 2,
                           "n_layers": 1, "d_ff": 64},
        "dataset_hash": packed.hash_hex, "optimizer": {"name": "adamw", "lr": 1e-3},
        "batch_size": batch_size, "total_steps": total,
        "checkpoint_interval": k, "seed": 1})
    seed = hashlib.sha256(b"bench/shards").digest()
    plan = plan_sample(seed, spec.segment_count)
    sampled = sorted(set(plan.required))
    need = segment_shards(m, spec, sampled)

    async def fetch() -> int:
        async with PolnetNode(tmp / "a", P2PSettings()) as a:
            cfg = P2PSettings.model_validate({"bootstrap": [a.addrs[0]]})
            async with PolnetNode(tmp / "b", cfg) as b:
                await a.publish_file(packed.manifest_path)
                for p in packed.shard_paths:
                    await a.publish_file(p)
                got = await fetch_segments(b, packed.hash_hex, spec, sampled, [a.addrs[0]])
                assert got.shards == need
                return got.bytes_received

    t0 = time.perf_counter()
    fetched = trio.run(fetch)
    fetch_s = time.perf_counter() - t0
    manifest_bytes = len(m.to_bytes())
    dataset_bytes = m.total_bytes + manifest_bytes
    return {
        "family": spec.model.family,
        "tokens": packed.tokens, "seq_len": m.seq_len, "vocab_size": m.vocab_size,
        "shards": len(m.shards), "shards_fetched": len(need),
        "segments": spec.segment_count, "segments_sampled": len(sampled),
        "k": spec.checkpoint_interval, "batch_size": spec.batch_size,
        "dataset_bytes": dataset_bytes, "manifest_bytes": manifest_bytes,
        "fetched_bytes": fetched,
        "fetched_share": round(fetched / dataset_bytes, 4),
        "sampled_share": round(len(sampled) / spec.segment_count, 4),
        "target_share": round(len(sampled) / spec.segment_count
                              + manifest_bytes / dataset_bytes, 4),
        "within_target": fetched <= (len(sampled) / spec.segment_count * m.total_bytes
                                     + manifest_bytes),
        "exact_shards": exact_shards, "shard_sequences": per_shard,
        "pack_s": round(pack_s, 2), "fetch_s": round(fetch_s, 2),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq-len", type=int, default=65)
    ap.add_argument("--mb", type=float, default=4.0)
    ap.add_argument("--shard-sequences", type=int, default=None)
    ap.add_argument("--exact-shards", action="store_true")
    ap.add_argument("--vocab-size", type=int, default=2048)
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--k", type=int, default=8)
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        out = measure_fetch(Path(tmp), mb=args.mb, seq_len=args.seq_len,
                            shard_sequences=args.shard_sequences,
                            exact_shards=args.exact_shards, vocab_size=args.vocab_size,
                            batch_size=args.batch_size, k=args.k)
    print(json.dumps({"bench": "shards", **out}))


if __name__ == "__main__":
    main()
