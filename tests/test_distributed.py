"""A job trained by several rank processes over torch.distributed (gloo, CPU) is the
job the single-process step defines: a 1-rank verifier replays every segment, a rank
that skips its share or sends a stale gradient is caught, a killed rank leaves no
process behind and a restart commits the honest trace, and an FSDP2-sharded job's
trace replays on one rank (issue 33)."""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import psutil
import pytest
import trio
from torch.distributed.checkpoint import FileSystemReader

from node.errors import CheckpointError, TrainingError
from node.roles.runtime import measure_profile
from node.tensorfile import DTYPE_BYTES
from node.train import shardckpt
from node.train.budget import estimate, estimate_world
from node.train.dist_plan import check_world, rank_rows
from node.train.distributed import _culprit, launch
from node.train.layout import expected_layout
from node.train.shardckpt import dcp_name
from node.train.step import TrainContext
from node.train.trace import (
    TraceManifest,
    checkpoint_name,
    kept_file,
    read_manifest,
    regenerate_many,
    run_training,
)
from verifier.jobs import dataset_path, job
from verifier.replay import verify_trace_segment

K = 5


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("datasets")


def _spec_file(ctx: TrainContext, tmp: Path) -> Path:
    p = tmp / "spec.json"
    p.write_bytes(ctx.spec.canonical_json())
    return p


def _reference(ctx: TrainContext, tmp: Path, ranks: int = 2,
               keep_every: int = 1) -> TraceManifest:
    """The single-process trace with micro_batches = ranks (dist_plan's equivalence)."""
    two = TrainContext.create(ctx.spec, ctx.dataset, micro_batches=ranks)
    return run_training(two, tmp / "single", job_id=1, keep_every=keep_every)


def _verdicts(ctx: TrainContext, trace: Path) -> list[bool]:
    return [verify_trace_segment(ctx, trace, s).passed for s in range(ctx.spec.segment_count)]


def _rank_processes(out: Path) -> list[psutil.Process]:
    """Live rank processes of the launch into ``out`` (their config names it)."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "-m node.train.distributed" in cmd and str(out) in cmd:
            found.append(p)
    return found


def _start_bound(ctx: TrainContext) -> int:
    """Rank 0's share (torch.chunk's rows) of every tensor of the state, plus its largest
    tensor whole: the most an fsdp rank 0 may hold of the start state of 2 ranks."""
    tensors = [(shape, DTYPE_BYTES[dt]) for dt, shape in expected_layout(ctx.spec).values()]
    share = sum((-(-shape[0] // 2) if shape else 1) * math.prod(shape[1:]) * size
                for shape, size in tensors)
    return share + max(math.prod(shape) * size for shape, size in tensors)


def test_plan_splits_the_batch_like_micro_batches() -> None:
    assert [rank_rows(64, 4, r) for r in range(4)] == \
        [slice(0, 16), slice(16, 32), slice(32, 48), slice(48, 64)]
    with pytest.raises(TrainingError, match="must divide"):
        check_world(64, 3)
    with pytest.raises(TrainingError, match="outside"):
        rank_rows(64, 2, 2)


def test_claims_count_every_rank(cache: Path) -> None:
    spec = job("lm", cache).spec
    one = estimate(spec).total_mb
    # Data-parallel ranks each hold the whole state (and a runtime): a claim counts both.
    assert estimate_world(spec, 1).total_mb == one
    ddp = estimate_world(spec, 2)
    assert ddp.other.weights_bytes == estimate(spec).weights_bytes and ddp.total_mb > one
    # FSDP2 ranks hold a share of the state; rank 0 also gathers it at a leaf.
    fsdp = estimate_world(spec, 4, "fsdp")
    assert fsdp.other.weights_bytes * 4 >= estimate(spec).weights_bytes
    assert fsdp.other.total_bytes < fsdp.rank0.total_bytes
    # A 25M LM at 4 fsdp ranks: rank 0 holds a tensor, hash and read batches beside its
    # share, never the whole state (which a claim used to count it for, and its copies).
    big = spec.model_copy(update={"model": spec.model.model_copy(update={
        "d_model": 512, "n_heads": 8, "n_layers": 8, "d_ff": 2048})})
    whole = estimate(big).weights_bytes + estimate(big).optimizer_bytes
    rank0 = estimate_world(big, 4, "fsdp").rank0
    assert rank0.checkpoint_bytes < whole / 2
    assert rank0.weights_bytes + rank0.optimizer_bytes + rank0.checkpoint_bytes < whole
    profile = measure_profile(2)
    assert profile["world_size"] == 2 and profile["aggregate_memory_mb"] > 0


def test_solver_cli_takes_a_world_size() -> None:
    from typer.testing import CliRunner  # noqa: PLC0415

    from node.cli.solver_cmd import app  # noqa: PLC0415

    out = CliRunner().invoke(app, ["run", "--help"], terminal_width=200)
    assert out.exit_code == 0 and "--world-size" in out.output and "--dist-mode" in out.output


@pytest.mark.parallel
def test_two_ranks_train_the_single_process_job(cache: Path, tmp_path: Path) -> None:
    ctx = job("cnn", cache, k=K, total_steps=10)
    ref = _reference(ctx, tmp_path)
    got = launch(_spec_file(ctx, tmp_path), dataset_path("digits", cache), tmp_path / "dist",
                 job_id=1, world_size=2)
    # 2 ranks == micro_batches=2 bit for bit (one commutative addition per gradient).
    assert got.state_hashes == ref.state_hashes and got.losses == ref.losses
    # A 1-rank verifier (no micro-batches) replays every segment within tolerance,
    # and one that splits like the solver did reproduces it exactly.
    assert _verdicts(ctx, tmp_path / "dist") == [True, True]
    two = TrainContext.create(ctx.spec, ctx.dataset, micro_batches=2)
    assert all(verify_trace_segment(two, tmp_path / "dist", s).distance == 0 for s in range(2))
    assert _rank_processes(tmp_path / "dist") == []


@pytest.mark.parallel
@pytest.mark.parametrize("cheat", ["skip", "stale"])
def test_a_cheating_rank_fails_replay(cache: Path, tmp_path: Path, cheat: str) -> None:
    ctx = job("cnn", cache, k=K, total_steps=10)
    launch(_spec_file(ctx, tmp_path), dataset_path("digits", cache), tmp_path / "dist",
           job_id=1, world_size=2, cheat=cheat)  # type: ignore[arg-type]
    assert _verdicts(ctx, tmp_path / "dist") == [False, False]


@pytest.mark.parallel
@pytest.mark.parametrize("mode", ["ddp", "fsdp"])
def test_a_killed_rank_restarts_from_the_last_checkpoint(cache: Path, tmp_path: Path,
                                                         mode: str) -> None:
    """fsdp: the kept leaves it resumes from are DCP shards, converted as it resumes."""
    ctx = job("cnn", cache, k=K, total_steps=60)
    kept = checkpoint_name if mode == "ddp" else dcp_name
    spec, data, out = _spec_file(ctx, tmp_path), dataset_path("digits", cache), tmp_path / "dist"
    pids: list[int] = []
    errors: list[BaseException] = []

    def first_run() -> None:
        try:
            launch(spec, data, out, job_id=1, world_size=2, on_start=pids.extend,
                   mode=mode)  # type: ignore[arg-type]
        except BaseException as exc:  # noqa: BLE001 - collected for the assertion
            errors.append(exc)

    runner = threading.Thread(target=first_run)
    runner.start()
    deadline = time.monotonic() + 120
    while not (out / kept(2 * K)).exists() and runner.is_alive() \
            and time.monotonic() < deadline:
        time.sleep(0.01)
    assert runner.is_alive() and len(pids) == 2, "the run ended before a rank could be killed"
    psutil.Process(pids[1]).send_signal(signal.SIGKILL)
    runner.join(60)
    assert not runner.is_alive()
    assert len(errors) == 1 and isinstance(errors[0], TrainingError)
    assert "rank 1 of 2 exited with -9" in str(errors[0])
    assert not (out / "trace.json").exists()  # nothing partial to commit
    assert not any(psutil.pid_exists(p) for p in pids) and _rank_processes(out) == []
    kept_before = sorted(out.glob("ckpt-*.safetensors" if mode == "ddp" else "ckpt-*.dcp"))
    assert len(kept_before) >= 2  # it resumes from these, not from S_0
    # The restart resumes and ends with the honest trace of an unbroken run.
    got = launch(spec, data, out, job_id=1, world_size=2, mode=mode)  # type: ignore[arg-type]
    timing = json.loads((tmp_path / "dist.ranks" / "timing.json").read_text())
    assert timing["resumed_from"] >= 2 * K
    if mode == "fsdp":  # each rank loaded its own shards: rank 0 never held the state
        assert timing["start"] == "dcp"
        assert timing["start_largest_bytes"] <= _start_bound(ctx) < timing["state_bytes"]
        assert not list(out.glob("ckpt-*[1-9]*.safetensors"))  # checked, not converted
    ref = _reference(ctx, tmp_path)
    assert got.state_hashes == ref.state_hashes and got.checkpoints == ref.checkpoints
    assert _rank_processes(out) == []


def test_a_launch_blames_the_killed_rank_not_the_ranks_it_took_down() -> None:
    # Rank 0 fails on rank 1's closed sockets: a loaded machine may show both exits in
    # one poll, and the report must still name the rank that was killed.
    assert _culprit([1, -9]) == (1, -9)
    assert _culprit([None, 1, 2]) == (1, 1)
    assert _culprit([0, None]) is None and _culprit([None, None]) is None


@pytest.mark.parallel
def test_fsdp2_sharded_job_replays_on_one_rank(cache: Path, tmp_path: Path) -> None:
    ctx = job("lm", cache, k=K, total_steps=10)
    got = launch(_spec_file(ctx, tmp_path), dataset_path("text", cache), tmp_path / "fsdp",
                 job_id=1, world_size=2, mode="fsdp")
    # Hashed from the shards, rank 0 receiving one at a time: the ordinary state hash.
    assert got.state_hashes == _reference(ctx, tmp_path).state_hashes
    assert _verdicts(ctx, tmp_path / "fsdp") == [True, True]


@pytest.mark.parallel
def test_ranks_die_with_a_killed_launcher(cache: Path, tmp_path: Path) -> None:
    ctx = job("cnn", cache, k=K, total_steps=400)
    spec, data, out = _spec_file(ctx, tmp_path), dataset_path("digits", cache), tmp_path / "dist"
    code = ("import sys; from node.train.distributed import launch; "
            "launch(sys.argv[1], sys.argv[2], sys.argv[3], job_id=1, world_size=2)")
    launcher = subprocess.Popen([sys.executable, "-c", code, str(spec), str(data), str(out)])
    try:
        deadline = time.monotonic() + 120
        while not (out / checkpoint_name(K)).exists() and launcher.poll() is None \
                and time.monotonic() < deadline:
            time.sleep(0.01)
        ranks = _rank_processes(out)
        assert launcher.poll() is None and len(ranks) == 2
        launcher.kill()  # SIGKILL: no cleanup code of the launcher runs
        launcher.wait()
        gone, alive = psutil.wait_procs(ranks, timeout=30)
        assert alive == [] and _rank_processes(out) == []
    finally:
        launcher.kill()
        launcher.wait()


@pytest.mark.parallel
def test_a_sparse_distributed_trace_regenerates_on_one_process(cache: Path,
                                                                tmp_path: Path) -> None:
    """A leaf the ranks did not keep is rebuilt by the solver's daemon (one process) for
    a dispute or a verifier: with micro_batches = 2 it hashes to the 2-rank leaf."""
    ctx = job("cnn", cache, k=K, total_steps=3 * K)
    out = tmp_path / "dist"
    launch(_spec_file(ctx, tmp_path), dataset_path("digits", cache), out, job_id=1,
           world_size=2, keep_every=2)
    assert [c.step for c in read_manifest(out).checkpoints] == [0, 2 * K, 3 * K]
    two = TrainContext.create(ctx.spec, ctx.dataset, micro_batches=2)
    regenerate_many(two, out, [K, K + 2])  # raises unless leaf K hashes as committed
    with pytest.raises(CheckpointError, match="does not reproduce"):
        regenerate_many(ctx, out, [K])  # hence the solver's micro-batched context


async def _publish(out: Path) -> list[str]:
    """``Solver._publish_trace`` of trace ``out`` with a p2p that files by sha256."""
    from node.roles.solver import Solver  # noqa: PLC0415
    from node.train.behavior import HonestBehavior  # noqa: PLC0415

    published: list[str] = []

    async def publish_file(path: Path) -> str:
        published.append(hashlib.sha256(Path(path).read_bytes()).hexdigest())
        return published[-1]

    rec = SimpleNamespace(manifest=None, root=None, final=None)
    state = SimpleNamespace(jobs={1: rec})
    fake = SimpleNamespace(rt=SimpleNamespace(p2p=SimpleNamespace(publish_file=publish_file)),
                           behavior=HonestBehavior(), state=contextlib.nullcontext(state))
    await Solver._publish_trace(fake, 1, out)  # type: ignore[arg-type]
    assert rec.manifest == published[-1]
    return sorted(published[:-1])


@pytest.mark.parallel
def test_fsdp2_leaves_are_hashed_and_kept_as_shards(cache: Path, tmp_path: Path,
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """Each leaf's hash is built from the ranks' shards (rank 0 never holds the whole
    state), kept leaves are DCP checkpoints converted on demand to the very file a
    one-process run writes, hash-checked; a corrupt shard is refused and costs nothing."""
    ctx = job("lm", cache, k=K, total_steps=3 * K)
    out = tmp_path / "fsdp"
    got = launch(_spec_file(ctx, tmp_path), dataset_path("text", cache), out, job_id=1,
                 world_size=2, mode="fsdp", keep_every=2, hash_batch_bytes=32 * 1024)
    ref = _reference(ctx, tmp_path, keep_every=2)
    assert got.state_hashes == ref.state_hashes and got.losses == ref.losses
    timing = json.loads((tmp_path / "fsdp.ranks" / "timing.json").read_text())
    # What rank 0 held of its peer's shards at a time: one batch, not the state.
    assert 0 < timing["leaf_largest_bytes"] <= 32 * 1024 < timing["state_bytes"] / 4
    # Every rank built its shards of S_0 a parameter at a time: no broadcast, rank 0
    # holding its shards and one whole parameter at most.
    assert timing["start"] == "s0"
    assert timing["start_largest_bytes"] <= _start_bound(ctx) < timing["state_bytes"]
    # S_0 (written a tensor at a time) is a file; kept leaves 2 and 3 only DCP shards;
    # leaf 1 is not kept (hashed from the shards, nothing written).
    assert [c.step for c in got.checkpoints] == [0, 2 * K, 3 * K]
    assert (out / checkpoint_name(0)).is_file()
    for step in (2 * K, 3 * K):
        assert (out / dcp_name(step)).is_dir() and not (out / checkpoint_name(step)).exists()
    assert not (out / dcp_name(K)).exists()
    # A corrupt shard: refused with a clear error, nothing written, nothing deleted.
    sharded = out / dcp_name(3 * K)
    shard = sharded / "__1_0.distcp"
    good = shard.read_bytes()
    files = sorted(p.name for p in sharded.iterdir())
    item = max((v for v in FileSystemReader(str(sharded)).read_metadata().storage_data.values()
                if v.relative_path == shard.name), key=lambda v: v.length)
    flipped = bytearray(good)
    flipped[item.offset + item.length // 2] ^= 1  # one bit of its largest tensor's bytes
    for bad, message in [(bytes(flipped), "converts to state .* a shard is corrupt"),
                         (good[:len(good) // 2], "cannot be read, a shard file is corrupt")]:
        shard.write_bytes(bad)
        with pytest.raises(CheckpointError, match=message):
            kept_file(out, got, 3)
        assert not (out / checkpoint_name(3 * K)).exists()
        assert sorted(p.name for p in sharded.iterdir()) == files
        assert [p.name for p in out.glob(".*")] == []
    shard.write_bytes(good)
    # The solver daemon publishing the trace converts them (its p2p store checks the
    # bytes against the manifest's sha256 as the artifact id), reading a few tensors at
    # a time here (the ranks sealed them in one batch each).
    monkeypatch.setattr(shardckpt, "BATCH_BYTES", 4096)
    assert trio.run(_publish, out) == sorted(c.sha256 for c in got.checkpoints)
    # Converted on demand and kept: the bytes a one-process run keeps, each tensor of
    # the shards read once (file order for the bytes, hashed on the way).
    read: list[str] = []
    load = shardckpt._load

    def counted(src: Path, layout: Any, names: list[str]) -> dict[str, Any]:
        read.extend(names)
        return load(src, layout, names)

    monkeypatch.setattr(shardckpt, "_load", counted)
    for path in out.glob("ckpt-*[1-9]*.safetensors"):
        path.unlink()  # the publish above converted them: again, counted
    for index in (2, 3):
        read.clear()
        path = kept_file(out, got, index)
        assert sorted(read) == sorted(expected_layout(ctx.spec))  # each once
        entry = got.checkpoint_at(index)
        assert entry is not None and entry == ref.checkpoint_at(index)
        assert hashlib.sha256(path.read_bytes()).hexdigest() == entry.sha256
        assert path.read_bytes() == (tmp_path / "single" / entry.file).read_bytes()
        before = path.stat().st_mtime_ns
        assert kept_file(out, got, index) == path and path.stat().st_mtime_ns == before
    # A verifier that splits like the solver replays every segment exactly; leaf 1 is
    # regenerated from S_0 and hashes to the leaf committed from the shards.
    two = TrainContext.create(ctx.spec, ctx.dataset, micro_batches=2)
    assert all(verify_trace_segment(two, out, s).distance == 0 for s in range(3))
    assert _rank_processes(out) == []
