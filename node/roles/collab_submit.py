"""Posting a collaborative (DiLoCo) job and reporting on it (issue 13).

``postCollabJob`` fixes what every round's sub-jobs are checked against: the spec
and dataset hashes (the inputs workers fetch from us over libp2p), round 0's S_0
(the spec's seeded weights with a zeroed inner optimizer: node.train.rounds) and
the outer-state hash of theta_0 with zero momentum (node.train.diloco), so no
worker or poster can start the job from weights of its own.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import trio

from node.chain.client import ChainClient
from node.chain.contracts import ChallengePhase, CollabRound, CollabTerms
from node.chain.ids import CollabId
from node.datasets import dataset_hash
from node.errors import ConfigError, SpecError
from node.logs import get_logger
from node.proof import file_sha256
from node.roles.collab import ZERO_ADDRESS
from node.roles.runtime import Runtime
from node.roles.submitter import MAX_AMOUNT, publish_and_approve
from node.spec import CollaborativeSpec, load_collaborative_spec
from node.units import wei_to_pol

log = get_logger("polnet.submitter")
MAX_PIPELINE_DEPTH = 4  # the CollabMarket's bound (InvalidDepth above)


@dataclass(frozen=True)
class CollabRequest:
    spec_path: Path
    dataset_path: Path
    reward: int
    budget: int
    round_duration: int
    init_weights_path: Path | None = None  # theta_0's file, if the spec names one
    pipeline_depth: int = 0  # D: rounds that may start on a candidate (issue 35), 0..4


def check_collab_request(req: CollabRequest) -> CollaborativeSpec:
    """Everything that can be checked before any token moves."""
    spec = load_collaborative_spec(req.spec_path)
    if not req.dataset_path.is_file():
        raise ConfigError(f"dataset {req.dataset_path} does not exist; "
                          "make one with `polnet dataset pack`")
    got = dataset_hash(req.dataset_path)
    if got != spec.inner.dataset_hash:
        raise SpecError(f"the spec names dataset {spec.inner.dataset_hash} but "
                        f"{req.dataset_path} hashes to {got}: set inner.dataset_hash = "
                        f"\"{got}\" or pass the right file", field="inner.dataset_hash")
    _check_init_weights(spec, req.init_weights_path)
    sub_jobs = spec.outer_rounds * spec.workers.max
    if req.reward < sub_jobs:
        raise ConfigError(f"--reward must pay each of the {sub_jobs} sub-jobs "
                          f"({spec.outer_rounds} rounds x {spec.workers.max} slots) something")
    if req.reward > MAX_AMOUNT // 100 or req.budget > MAX_AMOUNT:
        raise ConfigError("--reward/--budget exceed the market's bounds: lower them")
    if req.round_duration < 10:
        raise ConfigError("--round-duration must be at least 10 seconds")
    if not 0 <= req.pipeline_depth <= MAX_PIPELINE_DEPTH:
        raise ConfigError(f"--pipeline-depth must be 0..{MAX_PIPELINE_DEPTH}")
    return spec


def _check_init_weights(spec: CollaborativeSpec, path: Path | None) -> None:
    if path is not None and not path.is_file():
        raise ConfigError(f"init weights {path} does not exist; make them with "
                          "`polnet job init-weights`")
    if spec.init_weights is None:
        if path is not None:
            raise SpecError("--init-weights was given but the spec names no init_weights: "
                            f"set init_weights = \"{file_sha256(path)}\" to start from it",
                            field="init_weights")
        return
    if path is None:
        raise ConfigError(f"the spec starts from init weights {spec.init_weights}: pass "
                          "their file with --init-weights (make one with "
                          "`polnet job init-weights`)")
    got = file_sha256(path)
    if got != spec.init_weights:
        raise SpecError(f"the spec names init weights {spec.init_weights} but {path} hashes "
                        f"to {got}: set init_weights = \"{got}\" or pass the right file",
                        field="init_weights")


def collab_initial_hashes(spec: CollaborativeSpec, dataset_path: Path,
                          init_path: Path | None = None) -> tuple[bytes, bytes]:
    """(S_0 of round 0's sub-jobs, outer hash of theta_0 with zero momentum)."""
    from node.datasets import load_dataset  # noqa: PLC0415 - torch is heavy
    from node.train.diloco import initial_outer_state, outer_hash  # noqa: PLC0415
    from node.train.rounds import round_context, round_initial_hash  # noqa: PLC0415

    ds = load_dataset(dataset_path, spec.inner.dataset_hash)
    state = initial_outer_state(spec, init_path)
    return round_initial_hash(round_context(spec, ds, 0, 0), state.theta), outer_hash(state)


async def post_collab(rt: Runtime, req: CollabRequest) -> CollabId:
    """Store and serve the inputs, escrow reward + budget, post; returns the job id."""
    spec = check_collab_request(req)
    c = rt.chain_client
    # theta_0 first: a file that is not the spec's model fails before anything is served
    init_hash, outer0 = await trio.to_thread.run_sync(collab_initial_hashes, spec,
                                                      req.dataset_path, req.init_weights_path)
    if req.init_weights_path is not None:
        init_id = await rt.p2p.publish_file(req.init_weights_path)
        assert init_id == spec.init_weights
    spec_id, ds_id = await publish_and_approve(rt, spec, req.dataset_path,
                                               req.reward + req.budget, c.collab.address)
    terms = CollabTerms(
        spec_hash=spec.spec_hash(), dataset_hash=bytes.fromhex(ds_id), reward=req.reward,
        verification_budget=req.budget, min_workers=spec.workers.min,
        max_workers=spec.workers.max, inner_steps=spec.inner_steps,
        steps_per_segment=spec.inner.checkpoint_interval, rounds=spec.outer_rounds,
        round_duration=req.round_duration, init_state_hash=init_hash, outer_init_hash=outer0,
        pipeline_depth=req.pipeline_depth)
    cid = await rt.chain(c.collab.post_collab_job, terms)
    log.info("collab_job_posted", job=cid, spec=spec_id, dataset=ds_id,
             reward_pol=wei_to_pol(req.reward), rounds=spec.outer_rounds,
             slots=spec.workers.max)
    return cid


async def serve_collab_until_done(rt: Runtime, cid: CollabId, timeout: float | None) -> str:
    """Serve the inputs (the runtime does) until the job is Finished or Failed, keeping
    each accepted theta_r and its held-out loss (node.roles.collab_progress), then
    withdraw what the CollabMarket owes us (the unspent escrow). Returns the status."""
    from node.roles.collab_progress import CollabProgress  # noqa: PLC0415 - torch is heavy

    c = rt.chain_client
    progress = CollabProgress(rt, cid)
    with trio.move_on_after(timeout if timeout is not None else float("inf")):
        while True:
            job = await progress.tick_safely()
            if job.status.name in ("FINISHED", "FAILED"):
                break
            await trio.sleep(rt.settings.poll_interval * 4)
    got = (await rt.snapshot(fresh=True)).collabs.get(cid)
    job = got if got is not None else await rt.chain(c.collab.get_collab, cid)
    with trio.move_on_after(120):  # the last round's theta: bounded, the job is over
        while job.status.name == "FINISHED" and job.round not in progress.losses:
            await progress.tick_safely()
            await trio.sleep(rt.settings.poll_interval * 4)
    if await rt.chain(c.collab.credits, rt.address) > 0:
        await rt.chain(c.collab.withdraw)
    return job.status.name.lower()


def _challenge_text(c: ChainClient, rnd: CollabRound) -> str:
    """"none", or the live challenge's OuterJury case: its phase and jury size."""
    if rnd.challenge_phase == ChallengePhase.NONE:
        return "none"
    case = c.outer_jury.get_case(rnd.jury_case)
    return f"jury case {rnd.jury_case} {case.phase.name.lower()} ({len(case.jury)} jurors)"


def collab_report(c: ChainClient, cid: CollabId,
                  losses: dict[int, dict[str, Any]] | None = None) -> dict[str, Any]:
    """A collaborative job from the chain: status, slots, and per round its start,
    accepted and dropped slots (with their sub-jobs) and the accepted outer hash.
    ``losses`` (a serving submitter's record, node.roles.collab_progress): the held-out
    loss of theta_r, reported as round r - 1's result and as the initial loss."""
    losses = losses or {}

    def loss_of(r: int, outer: bytes | None) -> float | None:
        rec = losses.get(r)  # only if it is the loss of the weights the chain accepted
        if rec is None or (outer is not None and rec.get("outer_hash") != "0x" + outer.hex()):
            return None
        return float(rec["loss"])

    job = c.collab.get_collab(cid)
    rounds = []
    last = job.round if job.status.name in ("RUNNING", "OPEN") else job.rounds - 1
    for r in range(0, min(last, job.rounds - 1) + 1):
        rnd = c.collab.get_round(cid, r)
        if rnd.start == 0:
            continue
        subs = {i: s for i, s in enumerate(rnd.sub_jobs) if s}
        accepted = rnd.accepted_slots()
        rounds.append({
            "round": r, "attempt": rnd.attempt, "start": rnd.start, "deadline": rnd.deadline,
            "settled": rnd.settled, "sub_jobs": subs, "accepted": accepted,
            "dropped": sorted(i for i in subs if rnd.settled and i not in accepted),
            "outer_hash": "0x" + rnd.outer_hash.hex() if rnd.accepted else None,
            "outer_challenge": _challenge_text(c, rnd),
            "jury_case": rnd.jury_case or None,
            "last_verdict": rnd.last_verdict.name.lower(),
            "loss": loss_of(r + 1, rnd.outer_hash) if rnd.accepted else None})
    return {
        "job": cid, "status": job.status.name.lower(), "phase": job.phase.name.lower(),
        "round": job.round, "rounds": job.rounds, "inner_steps": job.inner_steps,
        "workers": {"min": job.min_workers, "max": job.max_workers},
        "slots": [None if str(a).lower() == ZERO_ADDRESS else a
                  for a in c.collab.slot_holders(cid)],
        "reward_pol": wei_to_pol(job.reward), "per_sub_job_pol": wei_to_pol(job.sub_reward),
        "pool_pol": wei_to_pol(job.pool), "model_outer_hash": "0x" + job.outer_hash.hex(),
        "initial_loss": loss_of(0, None),
        "history": rounds}
