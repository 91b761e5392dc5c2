"""Issue 30 item 8: leaf 0 is checked off chain too. A trace trained from weights of
the solver's choosing is consistent with itself, so before these checks every
segment of it replayed fine off chain; only the chain compared leaf 0, and only
with the hash the submitter posted, which nothing compared with the spec."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
import torch
import trio

from devnet.params import TOKEN
from devnet.testing import LocalChain, node_settings, sha
from node.chain.contracts import JobTerms
from node.chain.ids import JobId
from node.proof import state_hash
from node.roles.verifier_evidence import judge_segment, posted_initial_problem
from node.train.step import TrainContext, TrainState, init_state, initial_state_hash, state_tensors
from node.train.trace import read_manifest, run_training
from verifier.jobs import job
from verifier.replay import CommittedState, committed_from_trace, verify_trace_segment

K, T, JOB = 5, 20, JobId(3)
SUBMITTER, SOLVER_ACCT = 1, 2


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("datasets")


def chosen(ctx: TrainContext) -> TrainState:
    """S_0 with a planted edit: the spec's seeded weights, one bias moved."""
    state = init_state(ctx)
    with torch.no_grad():
        state.model.get_parameter("head.bias").add_(0.5)
    return state


@pytest.fixture(scope="module")
def chosen_trace(cache: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    ctx = job("cnn", cache, k=K, total_steps=T)
    out = tmp_path_factory.mktemp("chosen")
    run_training(ctx, out, job_id=JOB, initial=lambda: chosen(ctx))
    return out


@pytest.mark.parametrize("exact_first", [False, True])
def test_local_replay_of_a_trace_from_chosen_weights_fails_on_leaf_0(
        cache: Path, chosen_trace: Path, exact_first: bool) -> None:
    """Before: every segment of this trace passed ``verify_trace_segment`` (each replays
    from its own committed start). Now segment 0 fails: its start is not the spec's S_0."""
    ctx = job("cnn", cache, k=K, total_steps=T)
    v = verify_trace_segment(ctx, chosen_trace, 0, exact_first=exact_first)
    assert not v.passed and "leaf 0" in v.reason and "S_0" in v.reason, v.summary()
    for seg in range(1, ctx.spec.segment_count):  # the rest replays as it always did
        assert verify_trace_segment(ctx, chosen_trace, seg, exact_first=exact_first).passed
    honest = chosen_trace.parent / "honest"
    run_training(ctx, honest, job_id=JOB)
    assert verify_trace_segment(ctx, honest, 0, exact_first=exact_first).passed


def test_the_verifiers_segment_check_holds_leaf_0_to_the_jobs_s0(
        cache: Path, chosen_trace: Path) -> None:
    """The daemon's per-segment judge (``judge_segment``) fails segment 0 of the chosen
    trace given the job's S_0; without it (as before) the segment passed."""
    ctx = job("cnn", cache, k=K, total_steps=T)
    root = bytes.fromhex(read_manifest(chosen_trace).root)

    async def committed(i: int) -> CommittedState:
        return committed_from_trace(chosen_trace, i)

    async def judge(init: bytes | None):  # type: ignore[no-untyped-def]
        return await judge_segment(committed, ctx, root=root, job_id=JOB, segment=0,
                                   init_hash=init)

    before = trio.run(judge, None)
    assert before is not None and before.passed
    after = trio.run(judge, initial_state_hash(ctx))
    assert after is not None and not after.passed and "leaf 0" in after.reason


def test_a_job_whose_posted_s0_is_not_the_specs_is_refused(cache: Path) -> None:
    """The verifier's refusal rule (``Evidence.for_job`` applies it before any fetch of
    a checkpoint): a posted initStateHash of chosen weights is refused with a reason
    that names the fix; the spec's own S_0 is accepted."""
    ctx = job("cnn", cache, k=K, total_steps=T)
    posted = state_hash(state_tensors(chosen(ctx)))
    why = posted_initial_problem(ctx, posted)
    assert why is not None and "refused" in why and "initial_state_hash(spec)" in why
    assert posted_initial_problem(ctx, initial_state_hash(ctx)) is None


def test_verifier_refuses_a_committed_job_whose_posted_s0_is_chosen(
        chain: LocalChain, tmp_path: Path) -> None:
    """On anvil: a submitter posts the hash of chosen weights as initStateHash and its
    solver trains from them, so the chain's leaf-0 check passes and the job commits.
    Before, a verifier built its evidence and replayed every sampled segment fine (each
    replays from its own start), and its committee attested. Now ``Evidence.for_job``
    refuses the job (no evidence, so no verdict and no attestation) and says why; an
    honest job on the same chain is accepted, its S_0 held for segment 0."""
    from devnet.testing import real_job_terms, tiny_mlp_spec  # noqa: PLC0415
    from node.chain.contracts import SOLVER, JobStatus  # noqa: PLC0415
    from node.datasets import pack_digits, parse_dataset  # noqa: PLC0415
    from node.roles.runtime import Runtime  # noqa: PLC0415
    from node.roles.solver import Solver  # noqa: PLC0415
    from node.roles.solver_machine import SolverJob  # noqa: PLC0415
    from node.roles.verifier_evidence import Evidence  # noqa: PLC0415
    from node.spec import parse_spec_json  # noqa: PLC0415

    digits = pack_digits()
    spec_b = tiny_mlp_spec(sha(digits), 4, 2)
    honest_terms = real_job_terms(spec_b, digits, 4, 2)
    ctx = TrainContext.create(parse_spec_json(spec_b), parse_dataset(digits))

    def planted() -> TrainState:
        state = init_state(ctx)
        with torch.no_grad():
            next(iter(state.model.parameters())).add_(0.5)
        return state

    chosen_terms = replace(honest_terms,
                           init_state_hash=state_hash(state_tensors(planted())))
    stake = 200 * TOKEN

    async def commit(rt: Runtime, terms: JobTerms, initial: Any) -> JobId:
        """The solver daemon's own training and commit (tests.role_support.train_and_commit),
        from ``initial`` when given."""
        rt.p2p.store.put_bytes(spec_b)
        rt.p2p.store.put_bytes(digits)
        jid = await rt.chain(chain[SUBMITTER].post_job, terms)
        await rt.chain(rt.chain_client.market.claim_job, jid)
        job = await rt.chain(rt.chain_client.market.get_job, jid)
        solver = Solver(rt)
        with solver.state as st:
            st.jobs[jid] = SolverJob(round=job.round, spec=sha(spec_b), dataset=sha(digits))
        if initial is not None:
            solver._contexts[jid], solver._initial[jid] = ctx, initial
        await solver._train_and_commit(jid)
        manifest = solver.state.data.jobs[jid].manifest
        assert manifest is not None
        rt.book.manifests[jid] = [manifest]  # as its result_committed announcement says
        return jid

    async def main() -> tuple[Any, ...]:
        settings = node_settings(tmp_path, chain, "solver", SOLVER_ACCT, stake)
        async with Runtime(settings, "solver") as rt:
            await rt.ensure_registered(SOLVER, stake)
            bad = await commit(rt, chosen_terms, planted)
            good = await commit(rt, honest_terms, None)
            c = rt.chain_client
            statuses = [(await rt.chain(c.market.get_job, j)).status for j in (bad, good)]
            ev = Evidence(rt)
            return (statuses, await ev.for_job(bad), ev.refused.get(bad),
                    await ev.for_job(good), bad)

    statuses, bad_ev, why, good_ev, bad = trio.run(main)
    assert statuses == [JobStatus.COMMITTED, JobStatus.COMMITTED]  # the chain took both
    assert bad_ev is None and why is not None and "not S_0 of its spec" in why
    assert good_ev is not None and good_ev.init_hash == honest_terms.init_state_hash
