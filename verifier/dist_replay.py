"""A segment of a trace replayed by N rank processes, none holding the whole state
(issue 33's multi-rank verifier).

The verifier (this process) checks both ends' commitments before any compute, as
``verify_trace_segment`` does: leaf and proof under the root, and each kept file's
state hash streamed a tensor at a time (never the state in memory). Then N ranks
(gloo, FSDP2 as the solver's ``fsdp`` mode) each read only their own dim-0 rows of
the start file (safetensors slices; tensors not sharded on dim 0 whole), check
that the rows hash to the start leaf (the hash built from shards, as the solver's
ranks build it), run the k steps with the solver's distributed step
(``node.train.distributed._Rank``) and hash the end state from shards. Each rank
then applies the tolerance rule to its rows against the same rows of the solver's
end file (``verifier.tolerance.partial_sums``: every coordinate's mask and bound
are its own, the figures are sums of squares, counts and a maximum), the ranks'
figures are gathered and added in rank order in float64, and the verdict comes from
the sums (``verdict_of``), as the one-process rule's does from the whole tensors.

Public API::

    verify_segment_ranks(ctx, trace_dir, segment, world_size, dataset_path, *, root,
                         policy=None, init_hash=None, options=RankOptions()) -> RankedVerdict
    verify_files_ranks(ctx, dataset_path, world_size, *, root, job_id, segment, start,
                       end, policy=None, init_hash=None, options=RankOptions()) -> RankedVerdict
    python -m verifier.dist_replay '<rank config json>'   # one rank (internal)
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from node.errors import CheckpointError, PolnetError, VerificationError
from node.fsutil import atomic_write
from node.proof import STATE_HASH_SCHEME, StateHasher
from node.train.distributed import (
    HASH_BATCH_BYTES,
    RankConfig,
    _die_with_parent,
    _Rank,
    join_group,
    rank_store,
    read_rows,
    run_ranks,
    shard_slice,
)
from node.train.step import STEP_KEY, TrainContext, _export, _export_dtype, _live_pairs
from verifier.replay import (
    CommittedState,
    check_leaf,
    expected_initial_hash,
    leaf_zero_failure,
    policy_from_spec,
    segment_context,
)
from verifier.tolerance import (
    Partials,
    Sums,
    TolerancePolicy,
    check_loss,
    combine,
    failed_verdict,
    layout_mismatch,
    non_finite_reason,
    partial_sums,
    slots_from_names,
    verdict_of,
)
from verifier.verdict import Verdict

#: The most bytes of one tensor's rows a rank compares at once (a few such blocks of
#: the start and claimed files are alive together, beside the rank's live shards).
BLOCK_BYTES = 16 * 2**20
#: Errors a rank reports to the verifier by type (the rest: TrainingError).
_ERRORS: dict[str, type[PolnetError]] = {"CheckpointError": CheckpointError,
                                         "VerificationError": VerificationError}


@dataclass(frozen=True)
class ReplayRankConfig:
    rank: int
    world_size: int
    store_port: int
    parent_pid: int
    spec_path: str
    dataset_path: str
    threads: int
    start_file: str
    end_file: str
    start_step: int
    start_hash: str  # hex: the start leaf's state hash
    policy: dict[str, float]
    out: str  # rank 0's figures (result.json) and any rank's error (rank<i>.error.json)
    block_bytes: int = BLOCK_BYTES  # the most bytes of a tensor's rows compared at once
    hash_batch_bytes: int = HASH_BATCH_BYTES  # peers' shards rank 0 hashes at once
    steps: int = 0  # steps replayed (0: the spec's checkpoint interval; a juror's: 1)


@dataclass(frozen=True)
class RankedVerdict:
    """The verdict, the replayed end state's hash (built from shards) and the most bytes
    of state each rank held at once (its live shards plus checkpoint rows read)."""

    verdict: Verdict
    end_hash: bytes
    held_bytes: tuple[int, ...]


# --- the verifier's side ---------------------------------------------------------------


def file_hash(path: Path) -> bytes:
    """The state hash of a kept single file, read a tensor at a time in name order."""
    from safetensors import safe_open  # noqa: PLC0415

    h = StateHasher()
    try:
        with safe_open(str(path), "pt") as f:
            for name in sorted(f.keys()):
                h.tensor(name, f.get_tensor(name))
    except PolnetError:
        raise
    except Exception as exc:  # safetensors' own errors: a corrupt file
        raise CheckpointError(f"cannot read checkpoint {path} ({exc}): corrupt or "
                              "truncated; fetch it again from another provider") from None
    return h.digest()


def _layout(path: Path, ctx: TrainContext) -> dict[str, tuple[str, tuple[int, ...]]]:
    """The file's tensors as (safetensors dtype, shape), from its checked header."""
    from node.tensorfile import read_header  # noqa: PLC0415
    from node.train.layout import max_header_bytes  # noqa: PLC0415

    try:
        with open(path, "rb") as f:
            header = read_header(f, path.stat().st_size,
                                 max_header=max_header_bytes(ctx.spec),
                                 what=f"checkpoint {path.name}", error=CheckpointError)
    except OSError as exc:
        raise CheckpointError(f"cannot read checkpoint {path}: {exc.strerror}; fetch it "
                              "again") from None
    return header.layout()


@dataclass(frozen=True)
class RankOptions:
    """How the ranks run: threads each, a callback given their pids, and the most bytes
    a rank holds at once of a tensor's file rows (comparing) and of a peer's shards
    (rank 0, hashing)."""

    threads: int = 1
    on_start: Callable[[list[int]], None] | None = None
    block_bytes: int = BLOCK_BYTES
    hash_batch_bytes: int = HASH_BATCH_BYTES


def verify_segment_ranks(ctx: TrainContext, trace_dir: str | Path, segment: int,
                         world_size: int, dataset_path: str | Path, *, root: bytes | None,
                         policy: TolerancePolicy | None = None,
                         init_hash: bytes | None = None,
                         options: RankOptions = RankOptions()) -> RankedVerdict:
    """Replay ``segment`` of the trace in ``trace_dir`` with ``world_size`` ranks and judge
    it under the tolerance the one-process replay applies (``verify_files_ranks``). Both
    ends must be kept leaves."""
    from node.train.trace import kept_file, merkle_proof, read_manifest  # noqa: PLC0415

    manifest = read_manifest(trace_dir)
    if not 0 <= segment < manifest.segment_count:
        raise VerificationError(f"segment {segment} outside 0..{manifest.segment_count - 1}")
    ends: list[tuple[CommittedState, Path]] = []
    for index in (segment, segment + 1):
        if manifest.checkpoint_at(index) is None:
            raise VerificationError(f"leaf {index} is not kept in {trace_dir}: a multi-rank "
                                    "replay reads kept files only; replay on one process")
        leaf, proof = merkle_proof(manifest, index)
        ends.append((CommittedState({}, leaf, proof, manifest.state_hash_scheme),
                     kept_file(trace_dir, manifest, index)))
    if segment == 0 and init_hash is None:
        init_hash = expected_initial_hash(ctx)
    return verify_files_ranks(ctx, dataset_path, world_size, root=root or bytes.fromhex(
        manifest.root), job_id=manifest.job_id, segment=segment, start=ends[0], end=ends[1],
        policy=policy, init_hash=init_hash, options=options)


def verify_files_ranks(ctx: TrainContext, dataset_path: str | Path, world_size: int, *,
                       root: bytes, job_id: int, segment: int,
                       start: tuple[CommittedState, Path], end: tuple[CommittedState, Path],
                       policy: TolerancePolicy | None = None, init_hash: bytes | None = None,
                       options: RankOptions = RankOptions()) -> RankedVerdict:
    """``verify_segment``'s judgement with ``world_size`` ranks, from the segment's two
    ends as (CommittedState without tensors: leaf and proof, its single file). Both
    leaves and files are checked (ProofError/CheckpointError) before any rank starts;
    TrainingError when a rank fails."""
    from node.train.dist_plan import check_world  # noqa: PLC0415
    from node.train.layout import expected_layout  # noqa: PLC0415
    from node.train.trace import SPEC_NAME  # noqa: PLC0415

    check_world(ctx.spec.batch_size, world_size)
    k = ctx.spec.checkpoint_interval
    start_step = segment * k
    for index, (committed, path) in ((segment, start), (segment + 1, end)):
        if committed.scheme != STATE_HASH_SCHEME:
            raise VerificationError(f"a multi-rank replay hashes with {STATE_HASH_SCHEME}; "
                                    f"this trace uses {committed.scheme}: replay on one process")
        check_leaf(root, job_id, index, index * k, committed)
        if file_hash(path) != committed.leaf.state_hash:
            raise CheckpointError(f"checkpoint of step {index * k} does not hash to its leaf "
                                  f"0x{committed.leaf.state_hash.hex()[:16]}…: tampered or "
                                  "corrupt; fetch it again from another provider")
    seg = segment_context(ctx, start_step, k)
    bad = leaf_zero_failure(segment, k, start[0], init_hash)
    want = expected_layout(ctx.spec)
    if bad is None and _layout(start[1], ctx) != want:
        bad = failed_verdict(segment, start_step, seg, f"committed state S_{start_step} does "
                             "not fit the spec: its tensors' names, dtypes or shapes differ")
    why = layout_mismatch(want, _layout(end[1], ctx))
    if bad is None and why is not None:
        bad = failed_verdict(segment, start_step, seg, why)
    if bad is not None:
        return RankedVerdict(bad, b"", ())
    pol = policy or policy_from_spec(ctx.spec)
    with tempfile.TemporaryDirectory(prefix="polnet-replay-") as tmp:
        out = Path(tmp)
        (out / SPEC_NAME).write_bytes(ctx.spec.canonical_json())
        figures = _run(ReplayRankConfig(
            0, world_size, 0, os.getpid(), str(out / SPEC_NAME), str(dataset_path),
            options.threads, str(start[1]), str(end[1]), start_step,
            start[0].leaf.state_hash.hex(), asdict(pol), str(out), options.block_bytes,
            options.hash_batch_bytes), options.on_start)
    return _judge(ctx, segment, pol, figures, end[0].leaf.loss_e9 / 1e9)


def _run(cfg: ReplayRankConfig, on_start: Callable[[list[int]], None] | None) -> dict[str, Any]:
    """Run the ranks; rank 0's figures, or the error a rank reported."""
    from node.errors import TrainingError  # noqa: PLC0415

    out = Path(cfg.out)
    with rank_store(cfg.world_size) as port:
        configs = [json.dumps(asdict(replace(cfg, rank=r, store_port=port)))
                   for r in range(cfg.world_size)]
        try:
            run_ranks("verifier.dist_replay", configs, out, cfg.threads, on_start,
                      "the replay can be run again")
        except TrainingError:
            for path in sorted(out.glob("rank*.error.json")):
                err = json.loads(path.read_text())
                raise _ERRORS.get(err["type"], TrainingError)(err["message"]) from None
            raise
    result: dict[str, Any] = json.loads((out / "result.json").read_text())
    return result


def _judge(ctx: TrainContext, segment: int, pol: TolerancePolicy, figures: dict[str, Any],
           claimed_loss: float) -> RankedVerdict:

    k = ctx.spec.checkpoint_interval
    start_step = segment * k
    seg = segment_context(ctx, start_step, k)
    held = tuple(int(b) for b in figures["held_bytes"])
    end = bytes.fromhex(figures["end_hash"])
    if figures["bad_start"]:
        why = f"committed state S_{start_step} is not finite ({figures['bad_start']})"
        return RankedVerdict(failed_verdict(segment, start_step, seg, why), end, held)
    if figures["bad_claim"]:
        return RankedVerdict(failed_verdict(segment, start_step, seg,
                                            non_finite_reason(figures["bad_claim"])), end, held)
    parts = Partials(tuple((n, kind, Sums.of_vector(v)) for n, kind, v in figures["checks"]),
                     figures["masked_slack"], figures["determined"])
    verdict = check_loss(verdict_of(segment, start_step, seg, pol, parts), claimed_loss,
                         figures["loss"], pol)
    return RankedVerdict(replace(verdict, replay_seconds=figures["seconds"]), end, held)


# --- one rank ----------------------------------------------------------------------------


class _Rows(Mapping[str, torch.Tensor]):
    """Some rows of each tensor of a kept file (``rows``: name -> dim-0 slice, None:
    whole), read on each access (nothing cached), counting the bytes of rows alive at
    once (``peak``, shared by the mappings given the same ``held`` list)."""

    def __init__(self, f: Any, rows: Mapping[str, slice | None], held: list[int]) -> None:
        self.f, self.rows, self.held = f, rows, held
        self.non_finite: str | None = None  # the first tensor read with a non-finite row

    def __getitem__(self, name: str) -> torch.Tensor:
        if name not in self.rows:
            raise KeyError(name)
        t = read_rows(self.f, name, self.rows[name])
        if self.non_finite is None and t.is_floating_point() and not bool(t.isfinite().all()):
            self.non_finite = name
        self.held[0] += t.nbytes
        self.held[1] = max(self.held[1], self.held[0])
        weakref.finalize(t, self._freed, t.nbytes)
        return t

    def _freed(self, n: int) -> None:
        self.held[0] -= n

    def __contains__(self, name: object) -> bool:
        return name in self.rows

    def __iter__(self) -> Iterator[str]:
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)


def _first(names: list[str | None]) -> str | None:
    """The first tensor any rank names, in name order."""
    found = sorted(n for n in names if n is not None)
    return found[0] if found else None


def _gather(value: Any, world: int) -> list[Any]:
    out: list[Any] = [None] * world
    dist.all_gather_object(out, value)
    return out


def _replay(ctx: TrainContext, cfg: ReplayRankConfig) -> dict[str, Any] | None:
    """This rank's part; rank 0 returns the figures of all (None elsewhere)."""
    world, rank = cfg.world_size, cfg.rank
    r = _Rank(ctx, RankConfig(rank, world, cfg.store_port, cfg.spec_path, cfg.dataset_path,
                              "", 0, cfg.threads, "fsdp", 1, cfg.parent_pid, None,
                              cfg.hash_batch_bytes))
    bad_start = _first(_gather(r.load_rows(cfg.start_file, cfg.start_step), world))
    start = r.leaf(None)  # the loaded rows, hashed from the shards as the solver does
    ok = torch.tensor([1 if start is None or start.state_hash.hex() == cfg.start_hash else 0])
    dist.broadcast(ok, src=0)
    if not int(ok):
        if rank == 0:
            raise CheckpointError(f"the start rows the ranks read hash to "
                                  f"0x{start.state_hash.hex()[:16] if start else ''}…, not the "
                                  f"leaf's 0x{cfg.start_hash[:16]}…: the file changed or is "
                                  "corrupt; fetch it again")
        return None
    loss, seconds, end_hash = float("nan"), 0.0, ""
    parts: Partials | None = None
    held = r.start_held
    bad_claim: str | None = None
    if bad_start is None:
        t0 = time.perf_counter()
        loss = r.segment(cfg.start_step, _steps(ctx, cfg))
        seconds = time.perf_counter() - t0
        end = r.leaf(None)
        end_hash = end.state_hash.hex() if end is not None else ""
        # rank 0 hashing: its shards and one batch of each peer's
        held = max(held, r.live_bytes() + r.largest_held)
        if cfg.end_file:  # none: a juror's first pass, the end hash alone
            parts, bad_claim, compare_held = _compare(ctx, r, cfg)
            held = max(held, compare_held)
    gathered = _gather((parts, bad_claim, held), world)
    if rank != 0:
        return None
    all_parts = [p for p, _, _ in gathered]
    total = combine([p for p in all_parts if p is not None]) \
        if all(p is not None for p in all_parts) and cfg.end_file else None
    return {"bad_start": bad_start, "bad_claim": _first([b for _, b, _ in gathered]),
            "held_bytes": [h for _, _, h in gathered], "loss": loss, "seconds": seconds,
            "end_hash": end_hash,
            "checks": [[n, kind, s.vector()] for n, kind, s in total.checks] if total else [],
            "masked_slack": total.masked_slack if total else 0.0,
            "determined": total.determined if total else 0}


def _compare(ctx: TrainContext, r: _Rank, cfg: ReplayRankConfig
             ) -> tuple[Partials, str | None, int]:
    """The rule's figures over this rank's rows: the replayed shards against the same
    rows of the start and the claimed end files. The rows go in blocks (every tensor's
    rows cut into the same number of parts, each at most ``block_bytes``), so besides
    its shards a rank holds a few blocks of the files at a time; the figures of the
    blocks add up like the ranks'."""
    from safetensors import safe_open  # noqa: PLC0415

    state = r.live
    assert state is not None
    cd = state.compute_dtype
    live = {n: t.detach() for n, t in _live_pairs(state)}
    live[STEP_KEY] = torch.tensor(state.step, dtype=torch.int64)
    replayed = {n: _local(t, cd) for n, t in live.items()}
    mine = {n: shard_slice(t, r.world, r.rank) for n, t in live.items()}
    share = sum(t.nbytes for t in replayed.values())
    blocks = max([1] + [-(-replayed[n].nbytes // cfg.block_bytes)
                        for n, rows in mine.items() if rows is not None])
    seg_ctx = segment_context(ctx, cfg.start_step, _steps(ctx, cfg))
    policy = TolerancePolicy(**cfg.policy)
    held = [0, 0]  # checkpoint rows alive now, at most
    parts: list[Partials] = []
    bad: str | None = None
    with safe_open(cfg.start_file, "pt") as fs, safe_open(cfg.end_file, "pt") as fc:
        for j in range(blocks):
            rows = {n: None if s is None else _part(s, j, blocks) for n, s in mine.items()}
            # Tensors every rank holds whole count once: rank 0's first block.
            skip = frozenset(n for n, s in mine.items() if s is None and (r.rank or j))
            here = {n: t if (s := mine[n]) is None
                    else t[_part(slice(0, s.stop - s.start), j, blocks)]
                    for n, t in replayed.items()}
            claimed = _Rows(fc, rows, held)
            parts.append(partial_sums(_Rows(fs, rows, held), here, claimed,
                                      slots_from_names(here), seg_ctx, policy,
                                      cfg.start_step, skip))
            bad = bad or claimed.non_finite
    return combine(parts), bad, share + held[1]


def _part(rows: slice, j: int, blocks: int) -> slice:
    """Part ``j`` of ``blocks`` of the rows ``rows`` (the last parts may be empty)."""
    n = rows.stop - rows.start
    return slice(rows.start + j * n // blocks, rows.start + (j + 1) * n // blocks)


def _local(t: torch.Tensor, cd: torch.dtype) -> torch.Tensor:
    """This rank's rows of a live tensor as the checkpoint holds them (fp32 export)."""
    from torch.distributed.tensor import DTensor  # noqa: PLC0415

    local = t.to_local() if isinstance(t, DTensor) else t
    return local if _export_dtype(local, cd) == local.dtype else _export(local, cd)


def _steps(ctx: TrainContext, cfg: ReplayRankConfig) -> int:
    return cfg.steps or ctx.spec.checkpoint_interval


def rank_main(cfg: ReplayRankConfig) -> None:
    from node.data.stream import context_for_file  # noqa: PLC0415
    from node.spec import parse_spec_json  # noqa: PLC0415

    _die_with_parent(cfg.parent_pid)
    out = Path(cfg.out)
    try:
        spec = parse_spec_json(Path(cfg.spec_path).read_bytes())
        ctx = context_for_file(spec, cfg.dataset_path, spec.dataset_hash, threads=cfg.threads)
        join_group(cfg.rank, cfg.world_size, cfg.store_port)
        try:
            figures = _replay(ctx, cfg)
        finally:
            dist.destroy_process_group()
    except PolnetError as exc:
        atomic_write(out / f"rank{cfg.rank}.error.json", json.dumps(
            {"type": type(exc).__name__, "message": str(exc)}).encode())
        sys.exit(1)
    if figures is not None:
        atomic_write(out / "result.json", json.dumps(figures).encode())


if __name__ == "__main__":
    rank_main(ReplayRankConfig(**json.loads(sys.argv[1])))
