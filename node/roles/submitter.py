"""Submitter actions: post a job (spec + dataset served from our own store),
report on jobs, cancel, and fetch the trained model once final.

What it posted is kept in ``submitter.json``; serving until final is driven by
:func:`node.roles.submitter_machine.decide` over the job's status in each new snapshot
of the process's chain view.
"""

from __future__ import annotations

import hashlib
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from node.chain.client import ChainClient
from node.chain.contracts import JobStatus, JobTerms
from node.chain.events import EventWatcher
from node.chain.ids import JobId
from node.chain.payouts import job_payouts
from node.chain.rpc import RPC_FAILURES
from node.chain.view import Snapshot
from node.datasets import dataset_hash
from node.errors import ConfigError, IntegrityError, PolnetError, SpecError
from node.incentives import (
    MAX_JOB_SAMPLES,
    catch_one_edit,
    priced_budget,
    sample_floor,
)
from node.logs import get_logger
from node.p2p.announce import JobPosted
from node.roles.runtime import Runtime
from node.roles.state import RoleState
from node.roles.submitter_machine import (
    Done,
    FetchModel,
    SubmittedJob,
    SubmitterDisk,
    Withdraw,
    decide,
)
from node.spec import CollaborativeSpec, JobSpec, load_spec
from node.units import wei_to_pol

log = get_logger("polnet.submitter")


@dataclass(frozen=True)
class JobRequest:
    spec_path: Path
    dataset_path: Path
    reward: int
    budget: int  # the verification fee at the market's floor n; more samples pay pro rata
    solve_duration: int
    samples: int = 0  # n; 0: the market's floor; FULL_REPLAY: every segment
    # A fine-tuning job's S_0 weights: the file the spec's init_weights names.
    init_weights_path: Path | None = None


FULL_REPLAY = -1


@dataclass(frozen=True)
class Assurance:
    """The sample a job buys and what it costs (``JobMarket._post``'s rule)."""

    n: int
    floor: int  # min(market's derived n, S)
    segments: int  # S
    budget: int  # escrowed: the request's budget * n / floor

    @property
    def catch_one_edit(self) -> float:
        return catch_one_edit(self.n, self.segments)

    @property
    def floor_catch_one_edit(self) -> float:
        return catch_one_edit(self.floor, self.segments)


def assurance(req: JobRequest, spec: JobSpec, market_sample_count: int) -> Assurance:
    """The n ``req`` buys for ``spec`` under the market's derived n; ConfigError
    outside [floor, min(S, MAX_JOB_SAMPLES)], which the market would revert."""
    segments = spec.total_steps // spec.checkpoint_interval
    floor = sample_floor(market_sample_count, segments)
    top = min(segments, MAX_JOB_SAMPLES)
    n = {0: floor, FULL_REPLAY: segments}.get(req.samples, req.samples)
    if not floor <= n <= top:
        raise ConfigError(f"--samples {n}: this job of {segments} segments samples at least "
                          f"{floor} (the market's derived n) and at most {top}"
                          + (f" (the market's cap is {MAX_JOB_SAMPLES}: --full-replay needs "
                             "a coarser checkpoint_interval)" if segments > top else ""))
    return Assurance(n, floor, segments, priced_budget(req.budget, n, floor))


def assurance_lines(a: Assurance) -> list[str]:
    """What a submitter reads before posting: the chance one edited segment is replayed."""
    lines = [f"sampled      {a.n} of {a.segments} segments"
             + (" (full replay)" if a.n == a.segments else "")
             + f": an edit of ONE segment is caught with P = {a.n}/{a.segments} = "
               f"{a.catch_one_edit:.4g}"]
    if a.n != a.floor:
        lines.append(f"             the market's floor n = {a.floor} gives P = "
                     f"{a.floor}/{a.segments} = {a.floor_catch_one_edit:.4g}; the committee "
                     f"is paid per segment replayed: budget {wei_to_pol(a.budget)} POL")
    else:
        lines.append("             (the market's floor; buy more with --samples N or "
                     "--full-replay)")
    return lines


# JobMarket's bounds (MAX_AMOUNT = 2^96 - 1; a bond is up to 100 x the reward).
MAX_AMOUNT = 2**96 - 1
MAX_REWARD = MAX_AMOUNT // 100


def check_request(req: JobRequest) -> JobSpec:
    """Everything that can be checked before any token moves."""
    spec = load_spec(req.spec_path)
    if not req.dataset_path.is_file():
        raise ConfigError(f"dataset {req.dataset_path} does not exist; "
                          "make one with `polnet dataset pack`")
    got = dataset_hash(req.dataset_path)
    if got != spec.dataset_hash:
        raise SpecError(f"the spec names dataset {spec.dataset_hash} but {req.dataset_path} "
                        f"hashes to {got}: set dataset_hash = \"{got}\" or pass the right file",
                        field="dataset_hash")
    if (spec.init_weights is None) != (req.init_weights_path is None):
        raise ConfigError("the spec names init_weights: pass their file (--init-weights)"
                          if req.init_weights_path is None else
                          "--init-weights given but the spec names no init_weights")
    if req.init_weights_path is not None:
        from node.proof import file_sha256  # noqa: PLC0415

        got = file_sha256(req.init_weights_path)
        if got != spec.init_weights:
            raise SpecError(f"{req.init_weights_path} hashes to {got}, not the spec's "
                            f"init_weights {spec.init_weights}", field="init_weights")
    if req.reward <= 0:
        raise ConfigError("--reward must be positive")
    if req.reward > MAX_REWARD or req.budget > MAX_AMOUNT:
        raise ConfigError(f"the market takes a reward of at most {wei_to_pol(MAX_REWARD)} POL "
                          f"and a budget of at most {wei_to_pol(MAX_AMOUNT)} POL "
                          "(JobMarket's bounds): lower --reward/--budget")
    if req.solve_duration < 10:
        raise ConfigError("--solve-duration must be at least 10 seconds")
    return spec


def initial_hash(spec: JobSpec, dataset_path: Path, init_path: Path | None = None) -> bytes:
    """S_0's hash: the job fixes it on chain so no solver starts from weights of its own
    (a fine-tuning job's: the init weights with a zeroed optimizer state)."""
    from node.data.stream import context_for_file  # noqa: PLC0415 - torch is heavy
    from node.train.init_weights import load_init_weights  # noqa: PLC0415
    from node.train.step import initial_state_hash  # noqa: PLC0415

    init = None if init_path is None else load_init_weights(spec, init_path)
    return initial_state_hash(context_for_file(spec, dataset_path, spec.dataset_hash,
                                               lookahead=0, init_weights=init))


async def publish_and_approve(rt: Runtime, spec: JobSpec | CollaborativeSpec,
                              dataset_path: Path, total: int, spender: str) -> tuple[str, str]:
    """Store and serve a job's spec and dataset, check that the account can escrow
    ``total`` and approve ``spender`` (the market) for it; returns (spec id, dataset id)."""
    spec_id = await rt.p2p.publish_bytes(spec.canonical_json())
    ds_id = await rt.p2p.publish_file(dataset_path)
    await publish_shards(rt, dataset_path)
    assert spec_id == spec.spec_hash_hex().removeprefix("0x")
    c = rt.chain_client
    balance = await rt.chain(c.token.balance_of, rt.address)
    if balance < total:
        raise ConfigError(f"account {rt.address} holds {wei_to_pol(balance)} POL but the job "
                          f"escrows {wei_to_pol(total)} POL (reward + budget): fund it or lower "
                          "--reward")
    await rt.chain(c.token.ensure_allowance, spender, total)
    return spec_id, ds_id


async def publish_shards(rt: Runtime, dataset_path: Path) -> None:
    """A shard manifest's shards (`pack tokens` wrote them beside it), each checked, and
    its tokenizer when ``tokenizer.json`` beside it is the one the manifest names (a
    fetched model's ``--format hf`` directory carries it)."""
    from node.data.manifest import parse_manifest, parse_shard  # noqa: PLC0415
    from node.data.pack import MAX_TOKENIZER_BYTES  # noqa: PLC0415
    from node.data.stream import is_manifest_file, sibling_source  # noqa: PLC0415

    if not await trio.to_thread.run_sync(is_manifest_file, dataset_path):
        return
    manifest = await trio.to_thread.run_sync(
        lambda: parse_manifest(dataset_path.read_bytes(), origin=str(dataset_path)))
    source = sibling_source(dataset_path)
    for i, entry in enumerate(manifest.shards):
        raw = await trio.to_thread.run_sync(source, i, entry)
        await trio.to_thread.run_sync(parse_shard, raw, manifest, i)
        assert await rt.p2p.publish_bytes(raw) == entry.hash
    tok = dataset_path.parent / "tokenizer.json"
    if tok.is_file() and tok.stat().st_size <= MAX_TOKENIZER_BYTES:
        raw = await trio.to_thread.run_sync(tok.read_bytes)
        if hashlib.sha256(raw).hexdigest() == manifest.tokenizer:
            await rt.p2p.publish_bytes(raw)


async def post(rt: Runtime, req: JobRequest) -> JobId:
    """Store and advertise the job's inputs, then escrow and post it; returns the job id."""
    spec = check_request(req)
    c = rt.chain_client
    a = assurance(req, spec, (await rt.chain(c.market.market_params)).sample_count)
    spec_id, ds_id = await publish_and_approve(rt, spec, req.dataset_path,
                                               req.reward + a.budget, c.market.address)
    if req.init_weights_path is not None:  # served beside the inputs, like the dataset
        await rt.p2p.publish_file(req.init_weights_path)
    init_hash = await trio.to_thread.run_sync(initial_hash, spec, req.dataset_path,
                                              req.init_weights_path)
    terms = JobTerms(spec_hash=spec.spec_hash(), dataset_hash=bytes.fromhex(ds_id),
                     reward=req.reward, verification_budget=req.budget,
                     solve_duration=req.solve_duration, total_steps=spec.total_steps,
                     steps_per_segment=spec.checkpoint_interval, init_state_hash=init_hash,
                     sample_count=a.n)
    job_id = await rt.chain(c.market.post_job, terms)
    with submitter_state(rt) as st:
        st.jobs[job_id] = SubmittedJob(spec=spec_id, dataset=ds_id)
    await rt.p2p.announce("job_posted", JobPosted(job_id=job_id,
                                                  spec_hash="0x" + spec_id, dataset_id=ds_id,
                                                  spec_id=spec_id))
    log.info("job_posted", job=job_id, spec=spec_id, dataset=ds_id,
             reward_pol=wei_to_pol(req.reward))
    return job_id


def submitter_state(rt: Runtime) -> RoleState[SubmitterDisk]:
    return RoleState(rt.dir / "submitter.json", SubmitterDisk)


async def serve_until_final(rt: Runtime, job_ids: list[JobId], timeout: float | None) -> None:
    """Keep serving the inputs until every job is finalized or cancelled, fetching a
    model asked for and withdrawing what the settlements credited us. Decided over the
    process's chain view (issue 31): one ``eth_blockNumber`` per poll while no block
    arrives, and a pass (no per-job read) only for a new snapshot."""
    deadline = None if timeout is None else time.monotonic() + timeout
    left = set(job_ids)
    seen: tuple[int, int] | None = None  # (epoch, block) of the last pass that went through
    while left and (deadline is None or time.monotonic() < deadline):
        try:
            snap = await rt.snapshot()
            if (snap.epoch, snap.block) != seen:
                await serve_pass(rt, snap, left)
                seen = (snap.epoch, snap.block)
        except RPC_FAILURES as exc:  # a throttled or flaky provider: the next poll retries
            log.warning("submitter_pass_rpc_failed", error=str(exc) or repr(exc),
                        kind=type(exc).__name__)
        if left:
            await trio.sleep(rt.settings.poll_interval)


async def serve_pass(rt: Runtime, snap: Snapshot, left: set[JobId]) -> None:
    """One decision per job of ``left`` over ``snap``, removing those done. A job the
    view lacks (posted since the snapshot) is read alone; ``credits`` is read once, and
    only when a job is final."""
    c = rt.chain_client
    state = submitter_state(rt)
    status: dict[JobId, JobStatus] = {}
    for jid in sorted(left):
        job = snap.jobs.get(jid)
        if job is None:
            job = await rt.chain(c.market.get_job, jid)
        status[jid] = job.status
    final = [j for j, s in status.items() if s in (JobStatus.FINALIZED, JobStatus.CANCELLED)]
    if not final:
        return
    credits = await rt.chain(c.market.credits, rt.address)
    for _ in range(3):  # fetch, withdraw, done: each step's effect is local, no re-read
        withdraw = False
        for jid in list(final):
            rec = state.data.jobs.get(jid)
            fetch_to = rec.fetch_to if rec is not None else None
            dec = decide(status[jid], credits, fetch_to,
                         fetched=fetch_to is not None and Path(fetch_to).is_file())
            if isinstance(dec.action, FetchModel):
                await fetch_model(rt, jid, Path(dec.action.out))
            withdraw |= isinstance(dec.action, Withdraw)
            if isinstance(dec.action, Done):
                left.discard(jid)
                final.remove(jid)
        if withdraw:
            await rt.withdraw_all()
            credits = 0  # all of ours left the market
        if not final:
            return


def job_report(c: ChainClient, job_id: JobId) -> dict[str, Any]:
    """State, parties, sampled segments, verdicts on chain and payouts of one job."""
    job = c.market.get_job(job_id)
    assert c.deployment is not None
    watcher = EventWatcher(c.w3, [c.market, c.dispute], start_block=c.deployment.deploy_block)
    events = [e for e in watcher.fetch(c.deployment.deploy_block, c.block_number())
              if int(e.args.get("jobId", -1)) == job_id]
    sampled: list[int] = []
    # the sample stays part of a final job's record: which segments were checked
    if job.status in (JobStatus.COMMITTED, JobStatus.FINALIZED) and job.seed != bytes(32):
        sampled = c.market.sampled_segments(job_id)
    return {
        "job_id": job_id, "status": job.status.name.lower(), "round": job.round,
        "submitter": job.submitter, "solver": job.solver, "reward": job.reward,
        "verification_budget": job.verification_budget, "bond": job.bond,
        "deadline": job.deadline, "window_end": job.window_end,
        "trace_root": "0x" + job.trace_root.hex(), "segments": job.segment_count,
        "sampled_segments": sampled, "open_disputes": job.open_disputes,
        "total_steps": job.total_steps, "steps_per_segment": job.steps_per_segment,
        "init_state_hash": "0x" + job.init_state_hash.hex(),
        "committee": c.market.committee_of(job_id) if job.round else [],
        "attestations": job.attestations,
        "payouts": job_payouts(events),
        "events": [{"event": e.event, "block": e.block_number,
                    **{k: _plain(v) for k, v in e.args.items()}} for e in events],
    }


def _plain(v: Any) -> Any:
    if isinstance(v, bytes):
        return "0x" + v.hex()
    if isinstance(v, list | tuple):
        return [_plain(x) for x in v]
    return v


async def fetch_model(rt: Runtime, job_id: JobId, out: Path, wait: float = 30.0,
                      hf_dir: Path | None = None) -> Path:
    """Download the final checkpoint of a finalized job and write its model weights
    with the job's spec inside (node.train.models.load_model rebuilds the model);
    ``hf_dir``: also a transformers directory (node.train.hf_export) for hf_* jobs."""
    from node.roles.verifier_evidence import Evidence  # noqa: PLC0415
    from node.train.models import save_model  # noqa: PLC0415

    with submitter_state(rt) as st:  # a pending fetch: a restart finds it on disk
        rec = st.jobs.get(job_id)
        if rec is not None:
            rec.fetch_to = str(out)
    job = await rt.chain(rt.chain_client.market.get_job, job_id)
    if job.status != JobStatus.FINALIZED:
        raise ConfigError(f"job {job_id} is {job.status.name.lower()}, not finalized: "
                          "the model can be fetched once it is final")
    ev = None
    with trio.move_on_after(wait):
        while ev is None:
            ev = await Evidence(rt).for_job(job_id, job)
            if ev is None:
                await trio.sleep(1.0)
    if ev is None:
        raise IntegrityError(f"no peer announced the trace of job {job_id} within {wait:.0f}s; "
                             "is its solver online?")
    final = await ev.committed(job.segment_count)
    if final.leaf.state_hash != job.final_state_hash:
        raise IntegrityError("the final checkpoint is not the state committed on chain")
    path = save_model(out, final.tensors, ev.ctx.spec, job_id=job_id,
                      state_hash=job.final_state_hash.hex())
    if hf_dir is not None:
        from node.train.hf_export import export_hf  # noqa: PLC0415

        tok = await _job_tokenizer(rt, ev.ctx, (job.submitter, job.solver))
        await trio.to_thread.run_sync(export_hf, path, hf_dir, ev.ctx.dataset.vocab, tok)
    return path


async def _job_tokenizer(rt: Runtime, ctx: Any, parties: tuple[str, ...]) -> bytes | None:
    """A sharded job's tokenizer (the manifest names it by sha256), from this node's
    store or its submitter; None for a char-level dataset. A tokenizer no peer serves
    is an IntegrityError naming the hash (the model file is written already)."""
    from node.data.pack import MAX_TOKENIZER_BYTES  # noqa: PLC0415
    from node.data.stream import StreamContext  # noqa: PLC0415

    if not isinstance(ctx, StreamContext):
        return None
    digest = ctx.manifest.tokenizer
    try:
        path = await rt.fetch(digest, parties, timeout=60.0,
                              expected_size=MAX_TOKENIZER_BYTES)
    except PolnetError as exc:
        raise IntegrityError(f"the dataset's tokenizer {digest} could not be fetched "
                             f"({str(exc)[:300]}); the model file is written, the hf "
                             "directory is not: fetch as the node that submitted the job "
                             "(--name; its store holds the tokenizer) or while a node "
                             "serving it is up") from None
    return await trio.to_thread.run_sync(path.read_bytes)
