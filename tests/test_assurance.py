"""Assurance a submitter can buy (issue 30, item 6), on a real anvil.

Before: every job was sampled at the market's n (7), so an edit of one segment (a
poisoner trains honestly and changes one segment; every later segment replays bitwise
from the edited state) was caught with P = 7 / S: 0.35 for a 20-segment job, 0.007 at
S = 1,000, and no submitter could pay for more. Now ``postJob`` takes n, from the
market's derived floor up to every segment, and escrows the verification budget per
segment replayed; the committee replays the job's n, read from chain.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import pytest
import trio

from devnet.params import TOKEN, DevnetParams
from devnet.testing import (
    LocalChain,
    expect_revert,
    job_terms,
    node_settings,
    real_job_terms,
    sha,
    tiny_mlp_spec,
)
from node.chain.contracts import VERIFIER, JobStatus
from node.incentives import (
    MAX_JOB_SAMPLES,
    catch_one_edit,
    priced_budget,
    samples_to_catch_one_edit,
)
from tests.role_support import train_and_commit

pytestmark = pytest.mark.timeout(240)

SUBMITTER, SOLVER_I, VERIFIER_I = 1, 2, 4
STAKE = 200 * TOKEN
PARAMS = DevnetParams.model_validate({
    # one seat, so that one verifier's share is the whole sample; a long window so only
    # the product, not the test's pace, decides
    "market": {"verification_window": 600, "attestors_per_job": 1},
})


def test_sample_count_below_the_floor_or_above_s_reverts(module_chain: LocalChain) -> None:
    """A submitter cannot buy less than the derived n (that would undo the incentives'
    floor), nor more than every segment (or the cap that keeps a dispute's sample
    lookup within a block); nothing is escrowed by a refused post."""
    c, sub = module_chain, module_chain[SUBMITTER]
    floor = c.reader.market.market_params().sample_count
    assert floor == DevnetParams().market.sample_count == 7
    c[SUBMITTER].token.ensure_allowance(c.reader.market.address, 10**9 * TOKEN)
    before = c.reader.token.balance_of(c.addresses[SUBMITTER])
    for n, top, segs in ((floor - 1, 12, 12), (13, 12, 12),
                         (MAX_JOB_SAMPLES + 1, MAX_JOB_SAMPLES, 2000)):
        e = expect_revert(sub.market.post_job,
                          dataclasses.replace(job_terms(segments=segs, k=1), sample_count=n))
        assert e.error == "SampleCountOutOfRange"
        assert e.error_args == {"n": n, "min": floor, "max": top}
    assert c.reader.token.balance_of(c.addresses[SUBMITTER]) == before
    # A job shorter than the floor is replayed whole by default, and may ask for it.
    for n in (0, 3):
        jid = sub.post_job(dataclasses.replace(job_terms(segments=3, k=1), sample_count=n))
        assert c.reader.market.get_job(jid).sample_count == 3
    held, owed = c.conservation()
    assert held == owed


def test_the_fee_scales_with_n(module_chain: LocalChain) -> None:
    """The committee is paid for what it replays: verification_budget pays the floor,
    n samples escrow budget * n / floor (the contract's integer arithmetic)."""
    c, sub = module_chain, module_chain[SUBMITTER]
    base = 7 * TOKEN + 1  # not a multiple of 7: the division is the contract's
    got = {}
    for n in (0, 7, 8, 12):
        t = dataclasses.replace(job_terms(budget=base, segments=12, k=1), sample_count=n)
        before = c.reader.token.balance_of(c.addresses[SUBMITTER])
        jid = sub.post_job(t)
        job = c.reader.market.get_job(jid)
        assert before - c.reader.token.balance_of(c.addresses[SUBMITTER]) \
            == t.reward + job.verification_budget == sub.escrow_of(t)
        got[n] = (job.sample_count, job.verification_budget)
    assert got[0] == got[7] == (7, base)
    assert got[8] == (8, priced_budget(base, 8, 7)) == (8, base * 8 // 7)
    assert got[12] == (12, base * 12 // 7)
    assert got[7][1] < got[8][1] < got[12][1]
    held, owed = c.conservation()
    assert held == owed


@pytest.mark.parallel
def test_full_replay_samples_every_segment_and_the_committee_replays_all(
        module_chain: LocalChain, tmp_path: Path) -> None:
    """A full-replay job (n = S = 10 > the floor 7) is sampled whole, its committee's
    verifier daemon replays every segment with the real replay code, attests, and is paid
    the budget priced for 10 samples."""
    from node.roles.runtime import Runtime  # noqa: PLC0415 - libp2p is heavy
    from node.roles.verifier import Verifier  # noqa: PLC0415

    c = module_chain
    steps = segments = 10
    digits = pack_digits_cached()
    spec_b = tiny_mlp_spec(sha(digits), steps, 1)
    base = 7 * TOKEN
    terms = dataclasses.replace(real_job_terms(spec_b, digits, steps, 1, budget=base),
                                sample_count=segments)
    out: dict[str, Any] = {}

    async def main() -> None:
        async with Runtime(node_settings(tmp_path, c, "solver", SOLVER_I, STAKE),
                           "solver") as srt:
            vset = node_settings(tmp_path, c, "verifier", VERIFIER_I, STAKE,
                                 [srt.p2p.addrs[0]])
            async with Runtime(vset, "verifier") as vrt, trio.open_nursery() as nursery:
                # registered before the commit: the committee is drawn from stake as of then
                await vrt.ensure_registered(VERIFIER, STAKE)
                solver, jid = await train_and_commit(srt, c, SUBMITTER, terms, spec_b, digits,
                                                     STAKE)
                job = await srt.chain(c.reader.market.get_job, jid)
                await srt.chain(lambda: c.mine(max(1, job.sample_block
                                                      - c.w3.eth.block_number + 1)))
                v = Verifier(vrt)
                nursery.start_soon(solver._announcer)
                nursery.start_soon(v.run)
                with trio.fail_after(120):  # a bound against a verifier that never attests
                    while not (jid in v.state.data.jobs and v.state.data.jobs[jid].attested):
                        await trio.sleep(0.5)
                nursery.cancel_scope.cancel()
            out["jid"] = jid
            out["verdicts"] = dict(v.state.data.jobs[jid].verdicts)

    trio.run(main)
    r, jid = c.reader, out["jid"]
    job = r.market.get_job(jid)
    assert job.sample_count == segments
    assert sorted(r.market.sampled_segments(jid)) == list(range(segments))
    assert r.market.committee_of(jid) == [c.addresses[VERIFIER_I]]
    assert out["verdicts"] == {s: True for s in range(segments)}  # every segment replayed
    assert r.market.has_attested(jid, c.addresses[VERIFIER_I])
    c.advance(job.window_end - c.timestamp() + 1)
    rf = c[SOLVER_I].market.finalize(jid)
    (fin,) = r.market.events(rf, "JobFinalized")
    assert fin["args"]["perAttestation"] == base * segments // 7 == job.verification_budget
    assert r.market.get_job(jid).status == JobStatus.FINALIZED
    held, owed = c.conservation()
    assert held == owed


def test_catch_probability_of_one_edit() -> None:
    """The figures docs/protocol.md quotes: n for 50 / 90 / 99 % at S = 20, 100, 1000."""
    assert [catch_one_edit(7, s) for s in (20, 100, 1000)] == [0.35, 0.07, 0.007]
    table = {s: [samples_to_catch_one_edit(p, s) for p in (0.5, 0.9, 0.99)]
             for s in (20, 100, 1000)}
    assert table == {20: [10, 18, 20], 100: [50, 90, 99], 1000: [500, 900, 990]}
    assert catch_one_edit(20, 20) == 1.0


def pack_digits_cached() -> bytes:
    from node.datasets import pack_digits  # noqa: PLC0415

    return pack_digits()


def test_cli_shows_the_catch_probability_before_posting(module_chain: LocalChain,
                                                         tmp_path: Path) -> None:
    """`polnet job submit --dry-run` with --samples / --full-replay says what one edited
    segment's chance of being replayed is at the chosen n and at the floor, and what the
    priced budget escrows; an n below the floor is refused before anything is sent."""
    from typer.testing import CliRunner  # noqa: PLC0415

    from node.cli.main import app  # noqa: PLC0415
    from node.datasets import write_dataset  # noqa: PLC0415

    repo = Path(__file__).resolve().parent.parent
    module_chain.deployment.save(tmp_path / "devnet" / "deployment.json")
    data = tmp_path / "digits.safetensors"
    write_dataset(pack_digits_cached(), data)
    runner = CliRunner()

    def submit(*extra: str) -> Any:
        return runner.invoke(app, ["job", "submit", str(repo / "examples" / "mlp_digits.toml"),
                                   "--dataset", str(data), "--reward", "100", "--budget", "7",
                                   "--dry-run", "--dev-account", str(SUBMITTER), *extra],
                             env={"POLNET_HOME": str(tmp_path)})

    import structlog  # noqa: PLC0415

    # the CLI configures logging onto the runner's captured stdout, closed afterwards
    saved = structlog.get_config()
    try:
        check_cli(submit, module_chain)
    finally:
        structlog.configure(**saved)


def check_cli(submit: Any, module_chain: LocalChain) -> None:
    before = module_chain.reader.market.job_count()
    out = submit()  # examples/mlp_digits.toml: 200 steps, checkpoint every 10: S = 20
    assert out.exit_code == 0, out.output
    assert "sampled      7 of 20 segments: an edit of ONE segment is caught with " \
           "P = 7/20 = 0.35" in out.output
    out = submit("--samples", "14")
    assert out.exit_code == 0, out.output
    assert "P = 14/20 = 0.7" in out.output and "floor n = 7 gives P = 7/20 = 0.35" in out.output
    assert "you escrow   114 POL for 14 samples = reward 100 POL + verification budget " \
           "14 POL (7 x 14 / 7)" in out.output
    out = submit("--full-replay")
    assert out.exit_code == 0, out.output
    assert "20 of 20 segments (full replay): an edit of ONE segment is caught with " \
           "P = 20/20 = 1" in out.output
    out = submit("--samples", "3")
    assert out.exit_code != 0 and "at least 7" in out.output + str(out.exception)
    assert module_chain.reader.market.job_count() == before  # nothing posted


@pytest.mark.parallel
def test_a_requested_unsampled_segment_is_regenerated_and_served(module_chain: LocalChain,
                                                                   tmp_path: Path) -> None:
    """Any leaf can be requested and is served during the window, not only sampled ones:
    a watcher names a segment outside the sample of a sparse trace (one checkpoint in 4
    kept), and the honest solver daemon both puts its leaves on chain and regenerates the
    states it did not keep, serving them so the watcher can replay the segment."""
    from node.chain.availability import RequestState  # noqa: PLC0415
    from node.chain.contracts import SOLVER  # noqa: PLC0415
    from node.roles.runtime import Runtime  # noqa: PLC0415 - libp2p is heavy
    from node.roles.solver import Solver  # noqa: PLC0415
    from node.roles.solver_machine import SolverJob  # noqa: PLC0415
    from node.train.trace import read_manifest  # noqa: PLC0415

    c, r = module_chain, module_chain.reader
    steps, keep = 12, 4
    digits = pack_digits_cached()
    spec_b = tiny_mlp_spec(sha(digits), steps, 1)
    terms = real_job_terms(spec_b, digits, steps, 1)
    asker = c[3]
    asker.token.ensure_allowance(r.availability.address,
                                 r.availability.availability_params().bond)
    out: dict[str, Any] = {}

    async def main() -> None:
        async with Runtime(node_settings(tmp_path, c, "solver", SOLVER_I, STAKE),
                           "solver") as rt:
            await rt.ensure_registered(SOLVER, STAKE)
            rt.p2p.store.put_bytes(spec_b)
            rt.p2p.store.put_bytes(digits)
            jid = await rt.chain(c[SUBMITTER].post_job, terms)
            await rt.chain(rt.chain_client.market.claim_job, jid)
            solver = Solver(rt)
            with solver.state as st:  # the sparse trace a slow model's solver would keep
                st.jobs[jid] = SolverJob(round=1, spec=sha(spec_b), dataset=sha(digits),
                                         keep_every=keep)
            await solver._train_and_commit(jid)
            manifest = read_manifest(solver._trace_dir(jid))
            job = await rt.chain(r.market.get_job, jid)
            await rt.chain(c.mine, max(1, job.sample_block - c.w3.eth.block_number + 1))
            await rt.chain(asker.market.fix_seed, jid)
            sample = set(await rt.chain(r.market.sampled_segments, jid))
            seg = next(s for s in range(steps) if s not in sample)
            want = sorted({seg, seg + 1} - set(manifest.kept))
            assert manifest.kept == [0, 4, 8, 12] and want  # an end the trace did not keep
            out.update(jid=jid, seg=seg, want=want, hashes=list(manifest.state_hashes))
            out["rid"] = await rt.chain(asker.availability.request, jid, seg)
            async with trio.open_nursery() as nursery:
                with trio.fail_after(60):  # a bound against a solver that never serves it
                    while not set(want) <= set(solver.state.data.jobs[jid].leaves_served):
                        await solver._tick(nursery)
                        await trio.sleep(0.2)
                nursery.cancel_scope.cancel()
            out["served"] = {s.step: s.state_hash for s in solver.state.data.served
                             if s.job_id == jid}

    trio.run(main)
    assert r.availability.get_request(out["rid"]).state == RequestState.ANSWERED
    assert out["seg"] not in r.market.sampled_segments(out["jid"])
    for leaf in out["want"]:  # the regenerated state is the committed one, bit for bit
        committed = out["hashes"][leaf]
        committed = committed if isinstance(committed, str) else "0x" + committed.hex()
        assert out["served"][leaf].removeprefix("0x") == committed.removeprefix("0x")
