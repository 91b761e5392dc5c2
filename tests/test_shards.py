"""Sharded token datasets (issue 32): packing from every input format to one hash,
tokenizers named by hash, hostile manifests and shards refused, the shard-local
order, training/tracing/replaying on shards, and a verifier that fetches only its
segments' shards over real libp2p hosts on 127.0.0.1."""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq
import pytest
import torch
import trio

from node.behaviors import make_behavior
from node.data.manifest import (
    ShardEntry,
    ShardManifest,
    encode_shard,
    parse_manifest,
    parse_shard,
    shard_size,
)
from node.data.pack import Packed, pack_tokens
from node.data.stream import (
    StreamContext,
    dir_source,
    fetch_segments,
    segment_shards,
    shards_for_steps,
)
from node.datasets import default_text_source
from node.errors import DatasetError, IntegrityError, SpecError
from node.proof import canonical_json
from node.spec import JobSpec, parse_spec
from node.train.step import batch_indices
from node.train.trace import run_training
from tests.test_p2p import nodes
from verifier.replay import committed_from_trace, verify_segment

SEQ, PER_SHARD, VOCAB = 33, 32, 300
K, T, JOB = 3, 12, 11


def documents() -> list[str]:
    text = default_text_source().read_text(encoding="utf-8")[:60_000]
    return [text[i:i + 3000] for i in range(0, len(text), 3000)]


def pack(src: Path, out: Path, **kw: Any) -> Packed:
    return pack_tokens(src, out, seq_len=SEQ, vocab_size=VOCAB,
                       **{"shard_sequences": PER_SHARD, **kw})


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("corpus")
    docs = documents()
    (root / "c.jsonl").write_text("".join(json.dumps({"text": d, "n": i}) + "\n"
                                          for i, d in enumerate(docs)))
    pq.write_table(pa.table({"text": docs, "n": list(range(len(docs)))}), root / "c.parquet",
                   row_group_size=3)
    with ipc.new_file(root / "c.arrow", pa.schema([("text", pa.string())])) as w:
        w.write_table(pa.table({"text": docs}))
    (root / "folder" / "sub").mkdir(parents=True)
    for i, d in enumerate(docs):  # sorted by relative path: a/ files, then sub/
        (root / "folder" / ("sub" if i >= 10 else "") / f"d{i:03d}.txt").write_text(d)
    return root


@pytest.fixture(scope="module")
def packed(corpus: Path, tmp_path_factory: pytest.TempPathFactory) -> Packed:
    return pack(corpus / "c.jsonl", tmp_path_factory.mktemp("packed"))


def test_every_format_packs_to_the_same_manifest_hash(corpus: Path, packed: Packed,
                                                      tmp_path: Path) -> None:
    for src in ("c.parquet", "c.arrow", "folder"):
        assert pack(corpus / src, tmp_path / src).hash_hex == packed.hash_hex, src
    m = packed.manifest
    assert packed.manifest_path.read_bytes() == m.to_bytes()
    assert hashlib.sha256(m.to_bytes()).hexdigest() == packed.hash_hex
    assert len(m.shards) > 10 and m.dtype == "uint16" and m.vocab_size == VOCAB
    counts = {s.sequences for s in m.shards}
    assert max(counts) - min(counts) <= 1 and max(counts) <= PER_SHARD
    for i, p in enumerate(packed.shard_paths):  # every shard is what the manifest names
        assert parse_shard(p.read_bytes(), m, i).shape == (m.shards[i].sequences, SEQ)
    # other text, other hash
    (tmp_path / "other.jsonl").write_text(json.dumps({"text": documents()[0][::-1] * 3}) + "\n")
    assert pack(tmp_path / "other.jsonl", tmp_path / "o").hash_hex != packed.hash_hex


def test_tokenizer_is_named_by_hash(corpus: Path, packed: Packed, tmp_path: Path) -> None:
    tok = packed.tokenizer_path
    digest = hashlib.sha256(tok.read_bytes()).hexdigest()
    assert packed.manifest.tokenizer == digest
    again = pack(corpus / "c.parquet", tmp_path / "a", tokenizer=tok, tokenizer_hash=digest)
    assert again.hash_hex == packed.hash_hex
    with pytest.raises(IntegrityError, match="not the 0{64} it was named by"):
        pack(corpus / "c.parquet", tmp_path / "b", tokenizer=tok, tokenizer_hash="0" * 64)
    edited = tmp_path / "edited.json"
    edited.write_bytes(tok.read_bytes().replace(b'"<|endoftext|>"', b'"<|end|>"'))
    with pytest.raises(DatasetError, match="no '<|endoftext|>' token"):
        pack(corpus / "c.parquet", tmp_path / "c", tokenizer=edited)
    with pytest.raises(DatasetError, match="no column 'body'"):
        pack(corpus / "c.parquet", tmp_path / "d", text_field="body")


def test_corrupt_truncated_and_hostile_shards_are_refused(packed: Packed) -> None:
    m, raw = packed.manifest, packed.shard_paths[2].read_bytes()
    flipped = bytearray(raw)
    flipped[-3] ^= 1
    with pytest.raises(IntegrityError, match="shard 2 .* corrupt or substituted"):
        parse_shard(bytes(flipped), m, 2)
    with pytest.raises(IntegrityError, match="shard 2 .* truncated or padded"):
        parse_shard(raw[:-5], m, 2)
    # A hostile packer's manifest names its own shards correctly by hash: the ids, the
    # dtype and the shape are checked anyway.
    n = m.shards[0].sequences
    for ids, what in ((np.full((n, SEQ), VOCAB, np.int64), "outside the 300-id vocab"),):
        bad = encode_shard(ids, "uint16")
        evil = m.model_copy(update={"shards": [ShardEntry(
            hash=hashlib.sha256(bad).hexdigest(), sequences=n, size=len(bad))]})
        with pytest.raises(IntegrityError, match=what):
            parse_shard(bad, evil, 0)
    wide = encode_shard(np.zeros((n, SEQ), np.int64), "int32")
    evil = ShardManifest.model_validate({**m.model_dump(), "shards": [{
        "hash": hashlib.sha256(wide).hexdigest(), "sequences": n,
        "size": len(wide) - n * SEQ * 2}]})  # a uint16 shard's size, int32 bytes
    with pytest.raises(IntegrityError, match="is .* bytes, the manifest says"):
        parse_shard(wide, evil, 0)


def test_hostile_manifests_are_refused(packed: Packed) -> None:
    raw = packed.manifest_path.read_bytes()
    assert parse_manifest(raw, packed.hash_hex) == packed.manifest
    with pytest.raises(IntegrityError, match="the spec expects"):
        parse_manifest(raw, "0" * 64)
    d = json.loads(raw)
    cases: list[tuple[dict[str, Any], str]] = [
        ({**d, "shards": []}, "at least 1"),
        ({**d, "seq_len": 10**9}, "seq_len"),
        ({**d, "dtype": "float32"}, "dtype"),
        ({**d, "vocab_size": 70_000}, "does not fit uint16"),
        ({**d, "eos_id": VOCAB}, "outside the"),
        ({**d, "shards": [{**d["shards"][0], "size": 10**8}]}, "claims"),
        ({**d, "shards": [{**d["shards"][0], "sequences": 10**7}]}, "claims"),
        ({**d, "extra": 1}, "extra"),
    ]
    for obj, what in cases:
        with pytest.raises(IntegrityError, match=what):
            parse_manifest(canonical_json(obj))
    with pytest.raises(IntegrityError, match="canonical"):
        parse_manifest(json.dumps(d, indent=1).encode())
    with pytest.raises(IntegrityError, match="over|exceeds|bytes"):
        parse_manifest(b"{" + b" " * (5 * 2**20) + b"}")


def lm_spec(dataset_hash: str, **kw: Any) -> JobSpec:
    return parse_spec({
        "model": {"family": "transformer_lm", "vocab_size": VOCAB, "context": SEQ - 1,
                  "d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32},
        "dataset_hash": dataset_hash, "optimizer": {"name": "adamw", "lr": 3e-3},
        "batch_size": 8, "total_steps": T, "checkpoint_interval": K, "seed": 5, **kw})


def test_order_is_shard_local_and_known_in_advance(packed: Packed) -> None:
    m = packed.manifest
    spec = lm_spec(packed.hash_hex)
    ctx = StreamContext.open(spec, m, dir_source(packed.manifest_path.parent), lookahead=0)
    per_epoch = ctx.steps_per_epoch
    two = 0
    for step in [*range(1, 25), per_epoch, per_epoch + 1]:
        want = shards_for_steps(m, spec.seed, spec.batch_size, [step])
        assert 1 <= len(want) <= 2
        two += len(want) == 2
        ctx.loads.clear()
        ctx._cache.clear()
        ctx.sequences(batch_indices(ctx, step), SEQ)
        assert sorted(set(ctx.loads)) == want, step
    assert two  # some steps straddle two shards
    seen = torch.cat([batch_indices(ctx, s) for s in range(1, per_epoch + 1)]).tolist()
    assert len(seen) == len(set(seen)) == per_epoch * spec.batch_size  # no repeats in an epoch
    # the next epoch visits the shards in another order
    assert shards_for_steps(m, 5, 8, [1]) != shards_for_steps(m, 5, 8, [per_epoch + 1])
    with pytest.raises(SpecError, match="a step must read at most 2 shards"):
        StreamContext.open(lm_spec(packed.hash_hex, batch_size=PER_SHARD + 1), m,
                           dir_source(packed.manifest_path.parent))
    with pytest.raises(SpecError, match="context"):
        StreamContext.open(lm_spec(packed.hash_hex, model={
            "family": "transformer_lm", "vocab_size": VOCAB, "context": SEQ, "d_model": 16,
            "n_heads": 2, "n_layers": 1, "d_ff": 32}), m, dir_source(packed.manifest_path.parent))


def only(packed: Packed, allowed: set[int]) -> Any:
    """A shard source that serves only ``allowed`` (what a verifier fetched)."""
    inner = dir_source(packed.manifest_path.parent)

    def load(index: int, entry: ShardEntry) -> bytes:
        if index not in allowed:
            raise AssertionError(f"shard {index} was read but not fetched")
        return inner(index, entry)
    return load


@pytest.mark.parametrize("behavior", ["honest", "other_data"])
def test_a_job_on_shards_trains_traces_and_replays(packed: Packed, tmp_path: Path,
                                                   behavior: str) -> None:
    spec = lm_spec(packed.hash_hex)
    ctx = StreamContext.open(spec, packed.manifest, dir_source(packed.manifest_path.parent))
    try:
        manifest = run_training(ctx, tmp_path, job_id=JOB, behavior=make_behavior(behavior))
    finally:
        ctx.close()
    root = bytes.fromhex(manifest.root)
    read_in_training = set(ctx.loads)
    verdicts = []
    for seg in range(spec.segment_count):
        need = set(segment_shards(packed.manifest, spec, [seg]))
        assert behavior != "honest" or need <= read_in_training
        vctx = StreamContext.open(spec, packed.manifest, only(packed, need))
        start, end = committed_from_trace(tmp_path, seg), committed_from_trace(tmp_path, seg + 1)
        verdicts.append(verify_segment(vctx, root=root, job_id=JOB, segment=seg, start=start,
                                       end=end).passed)
        vctx.close()
    assert verdicts == [behavior == "honest"] * spec.segment_count


@pytest.mark.parallel  # waits on two libp2p hosts
def test_a_verifier_fetches_only_its_segments_shards(packed: Packed, tmp_path: Path) -> None:
    m = packed.manifest
    spec = lm_spec(packed.hash_hex)
    sampled = [1, 3]
    need = segment_shards(m, spec, sampled)
    assert 1 <= len(need) < len(m.shards) // 4

    async def main() -> None:
        with trio.fail_after(60):
            async with nodes(tmp_path, 2) as (submitter, verifier):
                assert await submitter.publish_file(packed.manifest_path) == packed.hash_hex
                for p in packed.shard_paths:
                    await submitter.publish_file(p)
                addr = [submitter.addrs[0]]
                got = await fetch_segments(verifier, packed.hash_hex, spec, sampled, addr)
                assert got.shards == need
                want = len(m.to_bytes()) + sum(m.shards[i].size for i in need)
                assert got.bytes_received == want < m.total_bytes // 4
                held = {e.hash for e in m.shards if verifier.store.has(e.hash)}
                assert held == {m.shards[i].hash for i in need}
                # a solver takes them all
                solver = await fetch_segments(verifier, packed.hash_hex, spec, None, addr)
                assert solver.shards == list(range(len(m.shards)))
                assert solver.bytes_received == m.total_bytes - (want - len(m.to_bytes()))

    trio.run(main)
    # the shards fetched are enough to replay those segments (no other shard is read)
    vctx = StreamContext.open(spec, m, only(packed, set(need)))
    for seg in sampled:
        for step in range(seg * K + 1, seg * K + K + 1):
            vctx.sequences(batch_indices(vctx, step), SEQ)
    vctx.close()
    assert torch.tensor(sorted(set(vctx.loads))).tolist() == need


@contextlib.contextmanager
def _finalized(tmp_path: Path, spec_path: Path, manifest_path: Path,
               timeout: float) -> Iterator[tuple[Any, int]]:
    """A local network (3 verifiers, a solver) that ran the job to Finalized, books balanced."""
    from devnet.localnet import LocalNet  # noqa: PLC0415 - only the daemon tests need it
    from devnet.params import short_network_params  # noqa: PLC0415

    with LocalNet(tmp_path / "net", short_network_params()) as net:
        for name, acct in (("v1", 4), ("v2", 5), ("v3", 6)):
            net.start_verifier(name, acct)
        net.start_solver("solver", 2)
        job = net.submit("sub", 1, spec_path, manifest_path)
        net.wait_job(job, {3}, timeout)  # Finalized
        assert net.conserved(), net.books()
        yield net, job


@pytest.mark.parallel  # real daemons and anvil: mostly waiting
@pytest.mark.timeout(420)
def test_sharded_job_runs_through_the_daemons(packed: Packed, tmp_path: Path) -> None:
    """`polnet job submit` a manifest: the submitter serves its shards, the solver
    streams them while it trains, the job is finalized, and each verifier's store
    holds the shards of the segments it replayed, not the whole dataset."""

    spec = lm_spec(packed.hash_hex, total_steps=60, checkpoint_interval=2,
                   detection={"fraction": 0.5, "confidence": 0.9})
    spec_path = tmp_path / "job.json"
    spec_path.write_bytes(spec.canonical_json())
    m = packed.manifest
    with _finalized(tmp_path, spec_path, packed.manifest_path, 300) as (net, job):

        def held(name: str) -> set[int]:
            objects = net.home / "nodes" / name / "p2p" / "store" / "objects"
            return {i for i, e in enumerate(m.shards) if (objects / e.hash[:2] / e.hash).is_file()}

        trained = set(shards_for_steps(m, spec.seed, spec.batch_size, range(1, 61)))
        assert held("solver") == trained  # what its steps read, none past the last step
        verified = [held(v) for v in ("v1", "v2", "v3")]
        assert any(verified), verified
        assert all(v <= trained and len(v) < len(trained) for v in verified), verified


def test_a_failed_shard_load_is_retried(packed: Packed) -> None:
    inner, calls = dir_source(packed.manifest_path.parent), []

    def flaky(index: int, entry: ShardEntry) -> bytes:
        calls.append(index)
        if len(calls) == 1:
            raise IntegrityError("peer went away")
        return inner(index, entry)

    ctx = StreamContext.open(lm_spec(packed.hash_hex), packed.manifest, flaky, lookahead=0)
    idx = batch_indices(ctx, 1)[:1]
    with pytest.raises(IntegrityError, match="peer went away"):
        ctx.sequences(idx, SEQ)
    assert ctx.sequences(idx, SEQ).shape == (1, SEQ) and len(calls) == 2
    ctx.close()


def test_cli_packs_tokens_and_trains_on_them(corpus: Path, tmp_path: Path) -> None:
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    def polnet(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "node.cli.main", *args],
                              cwd=Path(__file__).parents[1], capture_output=True, text=True,
                              timeout=300)

    out = tmp_path / "ds"
    ok = polnet("dataset", "pack", "tokens", str(out), "--source", str(corpus / "c.jsonl"),
                "--seq-len", str(SEQ), "--shard-sequences", str(PER_SHARD), "--vocab-size",
                str(VOCAB))
    assert ok.returncode == 0, ok.stderr
    digest = hashlib.sha256((out / "manifest.json").read_bytes()).hexdigest()
    assert f'dataset_hash = "{digest}"' in ok.stdout and "context <= 32" in ok.stdout
    spec = tmp_path / "job.json"
    spec.write_bytes(lm_spec(digest).canonical_json())
    run = polnet("train", str(spec), "--dataset", str(out / "manifest.json"), "--out",
                 str(tmp_path / "trace"))
    assert run.returncode == 0, run.stderr
    assert json.loads((tmp_path / "trace" / "trace.json").read_text())["dataset_hash"] == digest


def test_probe_bounds_what_streaming_holds(packed: Packed, tmp_path: Path) -> None:
    """A manifest is small but may name 512 MiB shards: the solver's probe budgets the
    shards a StreamContext holds, so such a job is refused before a shard is fetched."""
    from node.data.probe import run_probe  # noqa: PLC0415
    from node.errors import JobRejected  # noqa: PLC0415

    def probe(manifest_path: Path, digest: str) -> Any:
        spec = lm_spec(digest)
        spec_path = tmp_path / f"{digest[:8]}.json"
        spec_path.write_bytes(spec.canonical_json())
        return run_probe(spec_path, manifest_path, spec.spec_hash_hex().removeprefix("0x"),
                         digest, memory_mb=1500, max_seconds=600, gflops=1.0, threads=1)

    ok = probe(packed.manifest_path, packed.hash_hex)  # trains its steps on the shards beside
    assert ok.per_step_s > 0 and ok.estimate_mb < 1500
    n = 8_000_000  # 33 uint16 ids each: a 528 MB shard
    huge = ShardManifest.model_validate({**packed.manifest.model_dump(), "shards": [
        {"hash": "ab" * 32, "sequences": n, "size": shard_size(n, SEQ, 2)}]})
    path = tmp_path / "huge.json"
    path.write_bytes(huge.to_bytes())
    with pytest.raises(JobRejected, match="budget is 1500 MB"):
        probe(path, huge.hash_hex)


def test_training_prefetches_the_next_steps_shards(packed: Packed) -> None:
    import threading  # noqa: PLC0415

    from node.train.step import init_state, train_step  # noqa: PLC0415

    inner, seen = dir_source(packed.manifest_path.parent), []

    def source(index: int, entry: ShardEntry) -> bytes:
        seen.append((index, threading.current_thread().name))
        return inner(index, entry)

    spec = lm_spec(packed.hash_hex)
    ctx = StreamContext.open(spec, packed.manifest, source, lookahead=8)
    train_step(ctx, init_state(ctx), 1)
    for fut in list(ctx._pending.values()):
        fut.result()
    ctx.close()
    assert sorted({i for i, _ in seen}) == shards_for_steps(packed.manifest, spec.seed,
                                                            spec.batch_size, range(1, 9))
    assert len(seen) == len({i for i, _ in seen})  # each loaded once
    assert all(name.startswith("shard-prefetch") for _, name in seen)  # off the step's thread


def test_exact_shards_of_one_segment_each_fetch_the_sampled_share(corpus: Path,
                                                                   tmp_path: Path) -> None:
    """Shards of exactly k x batch_size sequences: every segment reads one shard, no two
    segments the same one, so a verifier's sampled segments are the sampled share of
    the bytes (plus the manifest); the sequences that fill no shard are dropped."""
    per = K * 8
    exact = pack(corpus / "c.jsonl", tmp_path / "x", shard_sequences=per, exact_shards=True)
    m = exact.manifest
    assert {s.sequences for s in m.shards} == {per}
    loose = pack(corpus / "c.jsonl", tmp_path / "l", shard_sequences=per)
    assert m.total_sequences == loose.manifest.total_sequences // per * per
    spec = lm_spec(exact.hash_hex, total_steps=m.total_sequences // 8)  # one epoch
    assert spec.segment_count == len(m.shards)
    read = [segment_shards(m, spec, [s]) for s in range(spec.segment_count)]
    assert all(len(r) == 1 for r in read)
    assert sorted(r[0] for r in read) == list(range(len(m.shards)))
    sampled = [0, 2, 5]
    fetched = sum(m.shards[i].size for i in segment_shards(m, spec, sampled))
    shard_bytes = sum(s.size for s in m.shards)
    assert fetched * spec.segment_count == shard_bytes * len(sampled)
    with pytest.raises(DatasetError, match="do not fill one shard"):
        pack(corpus / "c.jsonl", tmp_path / "big", shard_sequences=10**6, exact_shards=True)


def hf_spec(dataset_hash: str, model: dict[str, Any]) -> JobSpec:
    from node.spec_hf import installed_transformers_version  # noqa: PLC0415

    return lm_spec(dataset_hash, model={"transformers_version": installed_transformers_version(),
                                        "context": SEQ - 1, "num_attention_heads": 2,
                                        "hidden_size": 16, "intermediate_size": 32,
                                        "num_hidden_layers": 1, **model})


@pytest.mark.parametrize("model", [
    {"family": "hf_llama", "vocab_size": VOCAB},
    {"family": "hf_albert", "vocab_size": VOCAB + 1, "mask_token_id": VOCAB,
     "embedding_size": 8},
], ids=["llama", "albert"])
def test_hf_families_train_on_shards_and_export_the_tokenizer(
        packed: Packed, tmp_path: Path, model: dict[str, Any]) -> None:
    """An HF family on BPE token shards: every segment replays from only the shards it
    reads; the fetched model exports with the manifest's tokenizer, which
    AutoTokenizer loads with the job's ids and whose logits are the final state's."""
    import transformers  # noqa: PLC0415

    from node.train.hf_export import export_hf  # noqa: PLC0415
    from node.train.models import load_model, save_model  # noqa: PLC0415

    m = packed.manifest
    spec = hf_spec(packed.hash_hex, model)
    ctx = StreamContext.open(spec, m, dir_source(packed.manifest_path.parent))
    try:
        manifest = run_training(ctx, tmp_path / "t", job_id=JOB)
    finally:
        ctx.close()
    root = bytes.fromhex(manifest.root)
    for seg in range(spec.segment_count):
        vctx = StreamContext.open(spec, m, only(packed, set(segment_shards(m, spec, [seg]))))
        v = verify_segment(vctx, root=root, job_id=JOB, segment=seg,
                           start=committed_from_trace(tmp_path / "t", seg),
                           end=committed_from_trace(tmp_path / "t", seg + 1))
        vctx.close()
        assert v.passed, (seg, v.reason)
    final = committed_from_trace(tmp_path / "t", spec.segment_count).tensors
    path = save_model(tmp_path / "model.safetensors", final, spec)
    out = export_hf(path, tmp_path / "hf", tokenizer_json=packed.tokenizer_path.read_bytes())
    tok = transformers.AutoTokenizer.from_pretrained(out)
    text = "def f(x):\n    return x"
    ids = tok(text, return_tensors="pt").input_ids
    from tokenizers import Tokenizer  # noqa: PLC0415

    raw = Tokenizer.from_file(str(packed.tokenizer_path))
    assert ids[0].tolist() == raw.encode(text).ids  # the ids the shards hold
    assert tok.decode(ids[0]) == text
    auto = (transformers.AutoModelForMaskedLM if model["family"] == "hf_albert"
            else transformers.AutoModelForCausalLM)
    hf = auto.from_pretrained(out, attn_implementation="eager").eval()
    with torch.no_grad():
        assert torch.equal(hf(ids).logits, load_model(path)(ids))
    if model["family"] == "hf_albert":
        assert tok.mask_token == "[MASK]" and tok.mask_token_id == VOCAB


@pytest.mark.parallel  # real daemons and anvil: mostly waiting
@pytest.mark.timeout(600)
def test_an_hf_llama_job_on_shards_runs_through_the_daemons_and_fetches_as_hf(
        packed: Packed, tmp_path: Path) -> None:
    """End to end on the devnet: BPE token shards packed from a corpus, an hf_llama job
    submitted, streamed and trained by the ordinary solver, verified by the ordinary
    verifiers, finalized; `polnet job fetch --format hf DIR` writes a directory that
    transformers loads as it is, with the dataset's tokenizer (the submitter serves it)."""
    import math  # noqa: PLC0415
    import os  # noqa: PLC0415
    import subprocess  # noqa: PLC0415
    import sys  # noqa: PLC0415

    import transformers  # noqa: PLC0415
    from tokenizers import Tokenizer  # noqa: PLC0415

    from node.train.models import load_model  # noqa: PLC0415

    spec = hf_spec(packed.hash_hex, {"family": "hf_llama", "vocab_size": VOCAB})
    spec = parse_spec({**spec.model_dump(mode="json"), "total_steps": 12,
                       "detection": {"fraction": 0.5, "confidence": 0.9}})
    spec_path = tmp_path / "job.json"
    spec_path.write_bytes(spec.canonical_json())
    model, hf_dir = tmp_path / "model.safetensors", tmp_path / "hf"
    with _finalized(tmp_path, spec_path, packed.manifest_path, 420) as (net, job):
        # the submitter's node (its store holds the tokenizer it published), its
        # `job submit` done once the job was final
        fetch = net.polnet("sub", "job", "fetch", str(job), "--out", str(model),
                           "--format", "hf", str(hf_dir), *net.node_args("sub", 1))
        assert fetch.wait(180) == 0, (net.home / "logs" / "sub.log").read_text()[-2000:]
        # `job status` shows tokens seen and loss per segment (the solver's trace here)
        status = subprocess.run([sys.executable, "-m", "node.cli.main", "job", "status",
                                 str(job), "--json"], capture_output=True, text=True,
                                 timeout=120, env={**os.environ, "POLNET_HOME": str(net.home)})
        assert status.returncode == 0, status.stderr[-2000:]
        rows = json.loads(status.stdout)["segments"]
        assert [(r["segment"], r["step"], r["tokens_seen"]) for r in rows] == [
            (i, (i + 1) * K, (i + 1) * K * spec.batch_size * (SEQ - 1))
            for i in range(spec.segment_count)]
        assert all(math.isfinite(r["loss"]) for r in rows)
        table = subprocess.run([sys.executable, "-m", "node.cli.main", "job", "status",
                                str(job)], capture_output=True, text=True, timeout=120,
                               env={**os.environ, "POLNET_HOME": str(net.home),
                                    "COLUMNS": "200"})
        assert "loss per segment" in table.stdout and "tokens seen" in table.stdout
        assert f"{spec.total_steps * spec.batch_size * (SEQ - 1):,}" in table.stdout
    tok = transformers.AutoTokenizer.from_pretrained(hf_dir)
    text = "import os\nprint(os.sep)"
    ids = tok(text, return_tensors="pt").input_ids
    assert ids[0].tolist() == Tokenizer.from_file(str(packed.tokenizer_path)).encode(text).ids
    lm = transformers.AutoModelForCausalLM.from_pretrained(hf_dir,
                                                           attn_implementation="eager").eval()
    with torch.no_grad():
        assert torch.equal(lm(ids).logits, load_model(model)(ids))
        out = lm.generate(ids, max_new_tokens=4, do_sample=False)
    assert out.shape == (1, ids.shape[1] + 4)
    assert isinstance(tok.decode(out[0]), str)
