"""Sparse traces (keep_every = M): the same commitments as a dense trace, ~1/M of
its checkpoint bytes, and every leaf or bisection state served bitwise equal to
the dense one, regenerated from the nearest kept checkpoint. Also: the versioned
state hash (BLAKE3 in polnet-trace/2, sha256 in /1) and its shared vectors."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from node.behaviors import make_behavior
from node.behaviors.spoof import LazyFraction
from node.datasets import load_dataset, pack_digits, write_dataset
from node.errors import CheckpointError, MalformedInput, TrainingError
from node.proof import state_hash
from node.spec import load_spec, parse_spec
from node.train.sparse import fit_keep_every, kept_indices, nearest_kept
from node.train.step import TrainContext
from node.train.trace import (
    MANIFEST_NAME,
    TraceManifest,
    checkpoint_name,
    load_checkpoint,
    read_manifest,
    regenerate_many,
    run_training,
    write_state_file,
)
from verifier.replay import verify_trace_segment

ROOT = Path(__file__).resolve().parent.parent
M = 4
SEGMENTS, K = 20, 10


@pytest.fixture(scope="module")
def context(tmp_path_factory: pytest.TempPathFactory) -> TrainContext:
    data = tmp_path_factory.mktemp("data") / "digits.safetensors"
    write_dataset(pack_digits(), data)
    d = load_spec(ROOT / "examples" / "mlp_digits.toml").model_dump(mode="json")
    d["optimizer"] = {"name": "adamw", "lr": 0.002}
    d["total_steps"], d["checkpoint_interval"] = SEGMENTS * K, K
    spec = parse_spec(d)
    return TrainContext.create(spec, load_dataset(data, spec.dataset_hash))


@pytest.fixture(scope="module")
def dense(context: TrainContext, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("dense")
    run_training(context, out, 5)
    return out


@pytest.fixture(scope="module")
def sparse(context: TrainContext, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("sparse")
    run_training(context, out, 5, keep_every=M)
    return out


def ckpt_bytes(trace: Path) -> int:
    return sum(p.stat().st_size for p in trace.glob("ckpt-*.safetensors"))


def test_kept_indices() -> None:
    assert kept_indices(20, 4) == [0, 4, 8, 12, 16, 20]
    assert kept_indices(10, 4) == [0, 4, 8, 10]  # the final state is always kept
    assert kept_indices(3, 1) == [0, 1, 2, 3]
    assert nearest_kept(7, [0, 4, 8, 10]) == 4 and nearest_kept(10, [0, 4, 8, 10]) == 10
    with pytest.raises(TrainingError, match="keep_every"):
        kept_indices(10, 0)


def test_keep_every_shrinks_until_a_whole_sample_regenerates_in_half_the_window() -> None:
    fast = dict(window_s=60, k=10, samples=7)
    assert fit_keep_every(10, step_s=0.005, **fast) == 10  # a small model: as configured
    # 25M parameters at 0.5 s a step: 7 walks of (M-1) x 10 steps within 30 s -> M = 1
    assert fit_keep_every(10, step_s=0.5, **fast) == 1
    m = fit_keep_every(10, step_s=0.05, **fast)
    assert 7 * (m - 1) * 10 * 0.05 <= 30 < 7 * m * 10 * 0.05 and m == 9


def test_sparse_trace_commits_the_same_and_keeps_one_in_m(dense: Path, sparse: Path) -> None:
    d, s = read_manifest(dense), read_manifest(sparse)
    assert (s.root, s.state_hashes, s.losses_e9) == (d.root, d.state_hashes, d.losses_e9)
    assert s.format == "polnet-trace/2" and s.state_hash_scheme == "blake3"
    assert s.kept == [0, 4, 8, 12, 16, 20] and s.keep_every == M
    assert sorted(p.name for p in sparse.glob("ckpt-*")) == \
        [checkpoint_name(i * K) for i in s.kept]
    # the same files, only a few hundred bytes of "skipped" hashes longer
    per_file = ckpt_bytes(dense) / (SEGMENTS + 1)
    assert 0 < ckpt_bytes(sparse) - per_file * len(s.kept) < 1000 * len(s.kept)
    assert ckpt_bytes(dense) / ckpt_bytes(sparse) > 3.4  # 21 files -> 6
    # kept files are byte-identical apart from the "skipped" hashes in their metadata
    for i in s.kept:
        a = load_checkpoint(dense / checkpoint_name(i * K), d.state_hashes[i])
        b = load_checkpoint(sparse / checkpoint_name(i * K), d.state_hashes[i])
        assert len(b.meta["skipped"]) == (0 if i == 0 else i - s.kept[s.kept.index(i) - 1] - 1)
        assert all(torch.equal(a.tensors[n], b.tensors[n]) for n in a.tensors)


def test_every_leaf_and_bisection_state_is_served_bitwise(context: TrainContext, dense: Path,
                                                          sparse: Path) -> None:
    leaves = [i * K for i in range(SEGMENTS + 1)]
    mids = [6 * K + 3, 6 * K + 7, 13 * K + 1, 19 * K + 9]
    got = regenerate_many(context, sparse, leaves + mids)
    want = regenerate_many(context, dense, leaves + mids)
    m = read_manifest(dense)
    for t in leaves + mids:
        assert got[t].keys() == want[t].keys()
        assert all(torch.equal(got[t][n], want[t][n]) for n in got[t]), t
        if t % K == 0:
            assert state_hash(got[t]).hex() == m.state_hashes[t // K]


def test_a_sparse_trace_verifies_locally(context: TrainContext, sparse: Path) -> None:
    verdict = verify_trace_segment(context, sparse, 5)  # both ends regenerated
    assert verdict.passed, verdict.reason


def test_a_missing_kept_checkpoint_is_a_clear_error(context: TrainContext, sparse: Path,
                                                    tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    broken.mkdir()
    for p in sparse.iterdir():
        if p.name != checkpoint_name(8 * K):
            (broken / p.name).write_bytes(p.read_bytes())
    regenerate_many(context, broken, [7 * K])  # from leaf 4: unaffected
    with pytest.raises(CheckpointError, match=r"kept checkpoint ckpt-00000080.*missing.*leaf 9"):
        regenerate_many(context, broken, [9 * K])


def test_sparse_resume_gives_the_same_trace(context: TrainContext, sparse: Path,
                                            tmp_path: Path) -> None:
    out = tmp_path / "resumed"
    out.mkdir()
    for p in sparse.iterdir():  # a run killed after leaf 12 was kept
        if p.name.startswith("ckpt-") and int(p.stem[5:]) <= 12 * K or p.name == "spec.json":
            (out / p.name).write_bytes(p.read_bytes())
    resumed = run_training(context, out, 5, keep_every=M)
    assert resumed.to_json() == read_manifest(sparse).to_json()
    # another M: the kept files do not fit (their skipped lists), so it starts over, right
    again = run_training(context, out, 5, keep_every=5)
    assert again.root == resumed.root and again.kept == [0, 5, 10, 15, 20]


def test_a_cheat_regenerates_its_own_trajectory(context: TrainContext,
                                                tmp_path: Path) -> None:
    lazy = make_behavior("lazy:0.4")
    assert isinstance(lazy, LazyFraction)
    out = tmp_path / "lazy"
    m = run_training(context, out, 5, behavior=lazy, keep_every=M)
    leaf = next(i for i in range(1, SEGMENTS) if i not in m.kept and lazy.cheats_on(i - 1))
    got = regenerate_many(context, out, [leaf * K], behavior=lazy)[leaf * K]
    assert state_hash(got).hex() == m.state_hashes[leaf]
    with pytest.raises(CheckpointError, match="does not reproduce the trace bitwise"):
        regenerate_many(context, out, [leaf * K])  # honest steps cannot make its state


# --- the versioned state hash -------------------------------------------------------------


def test_state_hash_vectors() -> None:
    import importlib.util  # noqa: PLC0415

    vectors = ROOT / "tests" / "vectors"
    spec = importlib.util.spec_from_file_location("polnet_vectors_gen", vectors / "generate.py")
    assert spec is not None and spec.loader is not None
    gen = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(gen)
    stored = json.loads((vectors / "state_hash_vectors.json").read_text())
    assert stored == gen.state_hash_vectors()
    assert {c["scheme"] for c in stored["cases"]} == {"sha256", "blake3"}


def test_old_checkpoints_and_manifests_still_load(dense: Path, tmp_path: Path) -> None:
    ck = load_checkpoint(dense / checkpoint_name(K))
    old = tmp_path / "old.safetensors"
    # A polnet-checkpoint/1 file: the same tensors, hashed with sha256.
    from node.train.trace import META_KEY, _encode_checkpoint  # noqa: PLC0415

    h1 = state_hash(ck.tensors, "sha256")
    old.write_bytes(_encode_checkpoint(dict(ck.tensors), {
        **ck.meta, "format": "polnet-checkpoint/1", "state_hash": h1.hex()}))
    assert load_checkpoint(old, h1).state_hash == h1 != ck.state_hash
    bad = tmp_path / "future.safetensors"
    bad.write_bytes(_encode_checkpoint(dict(ck.tensors), {**ck.meta, "format": "polnet-x/9"}))
    with pytest.raises(CheckpointError, match="format 'polnet-x/9'; this node reads"):
        load_checkpoint(bad)
    assert META_KEY == "polnet"
    d = json.loads((dense / MANIFEST_NAME).read_bytes())
    d.pop("keep_every")
    d["format"] = "polnet-trace/1"
    m1 = TraceManifest.from_json(json.dumps(d).encode())
    assert m1.state_hash_scheme == "sha256" and m1.keep_every == 1
    for fmt, extra in (("polnet-trace/3", {}), ("polnet-trace/1", {"keep_every": 2})):
        with pytest.raises(MalformedInput):
            TraceManifest.from_json(json.dumps({**d, "format": fmt, **extra}).encode())
    d2 = json.loads((dense / MANIFEST_NAME).read_bytes())
    short = {**d2, "checkpoints": d2["checkpoints"][:3]}  # dense claims, entries missing
    with pytest.raises(MalformedInput, match="3 checkpoints where keep_every 1 keeps 21"):
        TraceManifest.from_json(json.dumps(short).encode())
    d2["checkpoints"][1], d2["checkpoints"][2] = d2["checkpoints"][2], d2["checkpoints"][1]
    with pytest.raises(MalformedInput, match="checkpoints must be those of steps"):
        TraceManifest.from_json(json.dumps(d2).encode())


def test_served_states_are_written_in_the_current_format(dense: Path, tmp_path: Path) -> None:
    ck = load_checkpoint(dense / checkpoint_name(2 * K))
    h = write_state_file(tmp_path / "s.safetensors", dict(ck.tensors), 5, 2 * K)
    assert load_checkpoint(tmp_path / "s.safetensors", h).meta["format"] == "polnet-checkpoint/2"


def test_the_solver_serves_exactly_the_missing_ends_of_needed_segments(sparse: Path) -> None:
    from node.roles.leafserve import leaves_to_serve  # noqa: PLC0415

    m = read_manifest(sparse)  # kept 0, 4, 8, ...
    assert leaves_to_serve(m, [3, 5, 19, 99], served=[6]) == [3, 5, 19]
    assert leaves_to_serve(m, [], served=[]) == []
