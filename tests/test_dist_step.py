"""A dispute's one step judged by a juror on 2 gloo ranks (verifier.dist_step, the
daemon's ``vote_step_ranks``): the one-process juror's vote, and its figures, from ranks
that each read only their rows of the served bisection state."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import psutil
import pytest
import torch
import trio

from node.errors import CheckpointError
from node.train.distributed import launch
from node.train.step import TrainContext
from node.train.trace import read_manifest, regenerate, write_state_file
from verifier.dist_replay import RankOptions
from verifier.dist_step import judge_step_ranks
from verifier.jobs import dataset_path, job
from verifier.replay import policy_from_spec, replay_segment, segment_context
from verifier.tolerance import compare_states, slots_from_names
from verifier.verdict import Verdict

K = 5
LO = 2  # the disputed step: S_2 -> S_3, inside segment 0 (neither end a kept leaf)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("datasets")


def _ranks_left(under: Path) -> list[psutil.Process]:
    """Live ranks of this test (their config names its files): another test's ranks may
    run beside it under xdist."""
    return [p for p in psutil.process_iter(["cmdline"])
            if "-m verifier.dist_replay" in (cmd := " ".join(p.info["cmdline"] or []))
            and str(under) in cmd]


def _same_figures(a: Verdict, b: Verdict) -> None:
    for name in ("distance", "update_norm", "bound", "ratio"):
        assert getattr(a, name) == pytest.approx(getattr(b, name), rel=1e-12, abs=1e-300), name
    assert (a.passed, a.masked) == (b.passed, b.masked)


class _Served:
    """The solver's fsdp trace and the bisection states it serves (by artifact id)."""

    def __init__(self, ctx: TrainContext, out: Path) -> None:
        self.ctx, self.out = ctx, out
        self.files: dict[str, Path] = {}
        self.manifest = read_manifest(out)
        self.book: dict[tuple[int, str], str] = {}
        for c in self.manifest.checkpoints:
            self.files[c.sha256] = out / c.file

    def serve(self, step: int, tensors: dict[str, torch.Tensor], name: str) -> tuple[bytes, Path]:
        path = self.out / f"{name}.safetensors"
        h = write_state_file(path, tensors, 1, step)
        self.files[name] = path
        self.book[(1, "0x" + h.hex())] = name
        return h, path

    def evidence(self, world_size: int, data: Path) -> object:
        from node.roles.verifier_evidence import JobEvidence  # noqa: PLC0415

        files = self.files

        async def fetch(aid: str, hints: tuple[str, ...], **kw: object) -> Path:
            return files[aid]

        rt = SimpleNamespace(fetch=fetch, settings=SimpleNamespace(threads=1),
                             book=SimpleNamespace(states=self.book))
        return JobEvidence(rt, 1, SimpleNamespace(solver="0x01"), self.ctx,  # type: ignore[arg-type]
                           self.manifest, world_size=world_size,
                           dataset_path=data if world_size > 1 else None)


def _votes(served: _Served, data: Path, hi_hash: bytes, lo_hash: bytes) -> tuple[bool, bool]:
    """The daemon's vote on S_LO -> S_LO+1: one process, then 2 ranks."""
    from node.roles.verifier_evidence import vote_step, vote_step_ranks  # noqa: PLC0415

    async def both() -> tuple[bool, bool]:
        one = await vote_step(served.evidence(1, data), LO, lo_hash, LO + 1,  # type: ignore[arg-type]
                              hi_hash)
        two = await vote_step_ranks(served.evidence(2, data), LO, lo_hash,  # type: ignore[arg-type]
                                    LO + 1, hi_hash)
        return one, two

    return trio.run(both)


def _one_process_figures(two: TrainContext, lo: dict[str, torch.Tensor],
                         hi: dict[str, torch.Tensor]) -> Verdict:
    """The one-process rule on a replay split like the ranks' (2 micro-batches)."""
    replayed, _ = replay_segment(two, lo, LO, 1)
    return compare_states(-1, LO, lo, replayed, hi, slots_from_names(replayed),
                          segment_context(two, LO, 1), policy_from_spec(two.spec))


@pytest.fixture(scope="module")
def trace(cache: Path, tmp_path_factory: pytest.TempPathFactory) -> tuple[TrainContext, Path]:
    ctx = job("lm", cache, k=K, total_steps=K)
    data = dataset_path("text", cache)
    out = tmp_path_factory.mktemp("fsdp")
    spec = out.parent / "spec.json"
    spec.write_bytes(ctx.spec.canonical_json())
    launch(spec, data, out, job_id=1, world_size=2, mode="fsdp")
    return ctx, out


@pytest.mark.parallel
def test_two_ranks_vote_an_honest_step_as_one_process_does(
        cache: Path, trace: tuple[TrainContext, Path]) -> None:
    ctx, out = trace
    data = dataset_path("text", cache)
    two = TrainContext.create(ctx.spec, ctx.dataset, micro_batches=2)
    served = _Served(ctx, out)
    lo = regenerate(two, out, LO)
    hi = regenerate(two, out, LO + 1)
    lo_hash, lo_file = served.serve(LO, lo, "mid2")
    hi_hash, hi_file = served.serve(LO + 1, hi, "mid3")
    # The ranks run the solver's step: their S_3, hashed from shards, is the claimed one.
    first = judge_step_ranks(ctx, data, 2, lo_step=LO, lo_hash=lo_hash, lo_file=lo_file,
                             hi_hash=hi_hash)
    assert first.valid is True and first.end_hash == hi_hash and first.verdict is None
    # Given the claimed file, their figures are the one-process rule's.
    ranked = judge_step_ranks(ctx, data, 2, lo_step=LO, lo_hash=lo_hash, lo_file=lo_file,
                              hi_hash=hi_hash, hi_file=hi_file,
                              options=RankOptions(block_bytes=1024, hash_batch_bytes=4096))
    assert ranked.valid is True and ranked.verdict is not None and ranked.verdict.passed
    _same_figures(ranked.verdict, _one_process_figures(two, lo, hi))
    assert _votes(served, data, hi_hash, lo_hash) == (True, True)
    assert _ranks_left(out) == []


@pytest.mark.parallel
def test_two_ranks_vote_a_perturbed_step_invalid_as_one_process_does(
        cache: Path, trace: tuple[TrainContext, Path]) -> None:
    ctx, out = trace
    data = dataset_path("text", cache)
    two = TrainContext.create(ctx.spec, ctx.dataset, micro_batches=2)
    served = _Served(ctx, out)
    lo = regenerate(two, out, LO)
    hi = regenerate(two, out, LO + 1)
    name = next(n for n, t in sorted(hi.items()) if n.startswith("model.") and t.dim() == 2)
    hi[name] = hi[name] + 1e-2  # a claimed S_3 that is no step of S_2
    lo_hash, lo_file = served.serve(LO, lo, "mid2")
    hi_hash, hi_file = served.serve(LO + 1, hi, "bad3")
    first = judge_step_ranks(ctx, data, 2, lo_step=LO, lo_hash=lo_hash, lo_file=lo_file,
                             hi_hash=hi_hash)
    assert first.valid is None  # not the replay bit for bit: the claimed file is needed
    ranked = judge_step_ranks(ctx, data, 2, lo_step=LO, lo_hash=lo_hash, lo_file=lo_file,
                              hi_hash=hi_hash, hi_file=hi_file)
    assert ranked.valid is False and ranked.verdict is not None
    assert not ranked.verdict.passed and ranked.verdict.ratio > 0
    _same_figures(ranked.verdict, _one_process_figures(two, lo, hi))
    assert _votes(served, data, hi_hash, lo_hash) == (False, False)
    assert _ranks_left(out) == []


@pytest.mark.parallel
def test_a_step_file_off_the_agreed_hash_is_refused_before_ranks_start(
        cache: Path, trace: tuple[TrainContext, Path]) -> None:
    ctx, out = trace
    data = dataset_path("text", cache)
    served = _Served(ctx, out)
    lo_hash, lo_file = served.serve(LO, regenerate(ctx, out, LO), "off2")
    hi_hash, hi_file = served.serve(LO + 1, regenerate(ctx, out, LO + 1), "off3")
    started: list[int] = []
    options = RankOptions(on_start=started.extend)
    # The agreed S_2 is another state than the file served for it.
    with pytest.raises(CheckpointError, match="does not hash to the dispute's"):
        judge_step_ranks(ctx, data, 2, lo_step=LO, lo_hash=hi_hash, lo_file=lo_file,
                         hi_hash=hi_hash, options=options)
    # A claimed file that is not the claimed hash's, likewise.
    with pytest.raises(CheckpointError, match="does not hash to the dispute's"):
        judge_step_ranks(ctx, data, 2, lo_step=LO, lo_hash=lo_hash, lo_file=lo_file,
                         hi_hash=lo_hash, hi_file=hi_file, options=options)
    # A truncated file: corrupt, named as such.
    lo_file.write_bytes(lo_file.read_bytes()[:1000])
    with pytest.raises(CheckpointError, match="corrupt or truncated"):
        judge_step_ranks(ctx, data, 2, lo_step=LO, lo_hash=lo_hash, lo_file=lo_file,
                         hi_hash=hi_hash, options=options)
    # The agreed hash is this file's, but it holds another step: no valid S_2 (invalid,
    # as on one process), judged before ranks start.
    other = judge_step_ranks(ctx, data, 2, lo_step=LO, lo_hash=hi_hash, lo_file=hi_file,
                             hi_hash=lo_hash, options=options)
    assert other.valid is False and other.verdict is not None
    assert "holds step 3" in other.verdict.reason
    assert started == [] and _ranks_left(out) == []
