"""A segment of a trace replayed by several rank processes (issue 33's multi-rank
verifier): each rank reads only its own rows of the solver's checkpoints, steps with
the solver's distributed step, and the tolerance computed from the ranks' rows is the
one-process verdict's to fp64 rounding: an honest trace passes, a cheating one fails,
no rank holds the whole state, a corrupt checkpoint is refused with no rank left."""

from __future__ import annotations

import json
import math
from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
import trio

from node.errors import CheckpointError
from node.tensorfile import DTYPE_BYTES
from node.train.distributed import launch
from node.train.layout import expected_bytes, expected_layout
from node.train.step import TrainContext
from node.train.trace import checkpoint_name, read_manifest
from verifier import dist_replay
from verifier.dist_replay import RankOptions, verify_segment_ranks
from verifier.jobs import dataset_path, job
from verifier.replay import verify_trace_segment
from verifier.verdict import Verdict

K = 5


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("datasets")


def _spec_file(ctx: TrainContext, tmp: Path) -> Path:
    p = tmp / "spec.json"
    p.write_bytes(ctx.spec.canonical_json())
    return p


def _replay_processes(under: Path) -> list[psutil.Process]:
    """Live replay ranks of this test (their config names its files): another test's
    ranks may run beside it under xdist."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        if "-m verifier.dist_replay" in cmd and str(under) in cmd:
            found.append(p)
    return found


def _bound(ctx: TrainContext) -> int:
    """Rank 0's rows (torch.chunk's) of every tensor at 2 ranks, plus the largest tensor
    whole (test_distributed's bound on a solver's rank 0)."""
    tensors = [(shape, DTYPE_BYTES[dt]) for dt, shape in expected_layout(ctx.spec).values()]
    share = sum((-(-shape[0] // 2) if shape else 1) * math.prod(shape[1:]) * size
                for shape, size in tensors)
    return share + max(math.prod(shape) * size for shape, size in tensors)


def _same_figures(one: object, two: object) -> None:
    a, b = one, two
    for field in ("distance", "update_norm", "bound", "ratio"):
        x, y = getattr(a, field), getattr(b, field)
        assert x == pytest.approx(y, rel=1e-12, abs=1e-300), field
    assert getattr(a, "passed") == getattr(b, "passed")  # noqa: B009
    assert getattr(a, "masked") == getattr(b, "masked")  # noqa: B009


@pytest.mark.parallel
def test_two_ranks_replay_an_honest_fsdp_trace(cache: Path, tmp_path: Path) -> None:
    ctx = job("lm", cache, k=K, total_steps=2 * K)
    data = dataset_path("text", cache)
    out = tmp_path / "fsdp"
    got = launch(_spec_file(ctx, tmp_path), data, out, job_id=1, world_size=2, mode="fsdp")
    two = TrainContext.create(ctx.spec, ctx.dataset, micro_batches=2)
    for segment in range(2):
        # Small blocks and hash batches: what a rank holds besides its shards stays small.
        ranked = verify_segment_ranks(ctx, out, segment, 2, data, root=None, options=RankOptions(
            block_bytes=1024, hash_batch_bytes=4096))
        single = verify_trace_segment(ctx, out, segment)
        assert ranked.verdict.passed and single.passed
        # The ranks' step is the solver's: their end state is the committed one, bit for
        # bit (hashed from shards), and the 1-process replay that splits like them agrees.
        assert ranked.end_hash.hex() == got.state_hashes[segment + 1]
        assert ranked.verdict.distance == 0
        _same_figures(ranked.verdict, verify_trace_segment(two, out, segment))
        # No rank held the whole state: its rows of every tensor (its live shards) plus
        # one tensor's rows as it loaded them, or a few blocks of the files' rows, or
        # one batch of the peer's shards (rank 0, hashing).
        assert len(ranked.held_bytes) == 2
        assert max(ranked.held_bytes) <= _bound(ctx) < expected_bytes(ctx.spec)
    # The verifier's command line takes a world size.
    from typer.testing import CliRunner  # noqa: PLC0415

    from node.cli.verifier_cmd import verifier_app  # noqa: PLC0415

    res = CliRunner().invoke(verifier_app, ["replay", str(out), "1", "--dataset", str(data),
                                            "--world-size", "2"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.stdout.strip().splitlines()[-1])["passed"] is True
    assert _replay_processes(tmp_path) == []


@pytest.mark.parallel
def test_two_ranks_fail_a_cheating_trace_as_one_process_does(cache: Path,
                                                              tmp_path: Path) -> None:
    """A rank that sends zeros for its share (ddp solver): the ranks' verdict is the
    one-process verdict of a replay split like theirs, its figures to fp64 rounding."""
    ctx = job("lm", cache, k=K, total_steps=2 * K)
    data = dataset_path("text", cache)
    out = tmp_path / "dist"
    launch(_spec_file(ctx, tmp_path), data, out, job_id=1, world_size=2, cheat="skip")
    two = TrainContext.create(ctx.spec, ctx.dataset, micro_batches=2)
    for segment in range(2):
        ranked = verify_segment_ranks(ctx, out, segment, 2, data, root=None).verdict
        assert not ranked.passed and ranked.ratio > 0
        _same_figures(ranked, verify_trace_segment(two, out, segment))
        assert not verify_trace_segment(ctx, out, segment).passed
    # The verifier daemon's path (`verifier run --world-size 2`): the files it fetched.
    verdict = trio.run(_daemon_judges, ctx, out, data)
    assert verdict is not None and not verdict.passed
    _same_figures(verdict, verify_trace_segment(two, out, 0))
    assert _replay_processes(tmp_path) == []


async def _daemon_judges(ctx: TrainContext, out: Path, data: Path) -> Verdict | None:
    """``judge_segment_ranks`` of segment 0 with a runtime whose p2p serves ``out``'s files
    by sha256 (a daemon's fetch)."""
    from node.roles.verifier_evidence import JobEvidence, judge_segment_ranks  # noqa: PLC0415

    manifest = read_manifest(out)
    files = {c.sha256: out / c.file for c in manifest.checkpoints}

    async def fetch(aid: str, hints: tuple[str, ...], **kw: object) -> Path:
        return files[aid]

    rt = SimpleNamespace(fetch=fetch, settings=SimpleNamespace(threads=1),
                         book=SimpleNamespace(states={}))
    ev = JobEvidence(rt, 1, SimpleNamespace(solver="0x01"), ctx, manifest,  # type: ignore[arg-type]
                     world_size=2, dataset_path=data)
    return await judge_segment_ranks(ev, root=bytes.fromhex(manifest.root), segment=0)


@pytest.mark.parallel
def test_a_corrupt_start_checkpoint_is_refused_with_no_rank_left(
        cache: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    ctx = job("lm", cache, k=K, total_steps=K)
    data = dataset_path("text", cache)
    out = tmp_path / "t"
    launch(_spec_file(ctx, tmp_path), data, out, job_id=1, world_size=1)
    start = out / checkpoint_name(0)
    good = start.read_bytes()
    # Truncated, and one flipped bit: the verifier's own check, before any rank starts.
    flipped = bytearray(good)
    flipped[-100] ^= 1
    for bad, message in [(good[:len(good) // 2], "truncated"),
                         (bytes(flipped), "does not hash to its leaf")]:
        start.write_bytes(bad)
        with pytest.raises(CheckpointError, match=message):
            verify_segment_ranks(ctx, out, 0, 2, data, root=None)
    # The ranks' own check (the rows they read hash to the leaf) when the file changes
    # after the verifier hashed it: refused the same way, every rank gone.
    leaf = bytes.fromhex(read_manifest(out).state_hashes[0])
    real = dist_replay.file_hash
    monkeypatch.setattr(dist_replay, "file_hash",
                        lambda path: leaf if path == start else real(path))
    started: list[int] = []
    with pytest.raises(CheckpointError, match="start rows the ranks read hash to"):
        verify_segment_ranks(ctx, out, 0, 2, data, root=None,
                             options=RankOptions(on_start=started.extend))
    assert len(started) == 2 and not any(psutil.pid_exists(p) for p in started)
    assert _replay_processes(tmp_path) == []
    start.write_bytes(good)


def test_verifier_commands_take_a_world_size() -> None:
    from typer.testing import CliRunner  # noqa: PLC0415

    from node.cli import verifier_daemon_cmd  # noqa: PLC0415
    from node.cli.verifier_cmd import verifier_app  # noqa: PLC0415

    if "run" not in {c.name for c in verifier_app.registered_commands}:
        verifier_daemon_cmd.register(verifier_app)  # adds `run` to the verifier group
    for command in ("run", "replay"):
        out = CliRunner().invoke(verifier_app, [command, "--help"], terminal_width=200)
        assert out.exit_code == 0 and "--world-size" in out.output, command
