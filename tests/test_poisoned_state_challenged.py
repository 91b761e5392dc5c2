"""An unloadable committed state gets challenged on chain (issue 16, item 5).

The attack as first found: the verifier's per-job check wrapped every sampled
segment in one ``try`` and challenged only after the loop, so a committed state
with a NaN or a wrong shape raised, the verdict stayed "failed", no challenge was
ever sent and the cheater was paid when the window closed.
tests/test_verifier_segments.py shows the verdicts and proofs offline; here the
whole path runs with real parts only:

- a real anvil, its own deployment (a sample of every segment: ``sample_count``
  above the job's segment count; long windows so that only the product, not the
  test's pace, decides), real ``JobTerms`` whose S_0 is the spec's real initial state;
- a real solver ``Runtime`` (libp2p host on 127.0.0.1, registered with its real peer
  id and addresses) running the solver daemon's ``Solver`` with the test cheat
  ``poison:1`` (``mode=nan`` or ``mode=shape``): it trains a tiny MLP on the bundled
  digits with ``_train_and_commit``, publishes the trace (whose checkpoint at the end
  of segment 1 holds a NaN, or a tensor of the wrong shape), commits its root, and
  its own ``_announcer`` gossips the manifest;
- a real verifier ``Runtime`` running the verifier daemon's ``Verifier.run`` loop:
  it registers, sees ``ResultCommitted``, fixes the seed, fetches the manifest and
  checkpoints from the solver, judges each sampled segment and challenges.

It must judge the two segments touching the poisoned state (1, whose claimed end it
is, and 2, whose committed start it is) failed and the others passed, and send a
``challenge`` that lands on chain: a ``Challenged`` event for the job, from that
verifier, naming one of those two segments, with a dispute open on that segment.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
import trio

from devnet.params import TOKEN, DevnetParams
from devnet.testing import (
    LocalChain,
    node_settings,
    real_job_terms,
    sha,
    tiny_mlp_spec,
)
from node.chain.contracts import JobStatus, Phase
from node.chain.events import ChainEvent, EventWatcher
from node.chain.ids import JobId
from node.config import NodeSettings
from node.datasets import pack_digits
from node.roles.runtime import Runtime
from node.roles.verifier import Verifier
from node.train.trace import read_manifest
from tests.role_support import train_and_commit

pytestmark = pytest.mark.timeout(240)

CHALLENGE_BOUND_S = 60.0  # a bound against a verifier that never challenges, not a timing
N_ACCOUNTS = 10
DEPLOYER, SUBMITTER, SOLVER_I, VERIFIER_I = 0, 1, 2, 4
STAKE = 200 * TOKEN
STEPS, K = 8, 2  # 4 two-step segments, 5 checkpoints
SEGMENTS = STEPS // K
AT = 1  # the poisoned state: the end of segment 1, checkpoint 2 (step 4)
TOUCHING = {AT, AT + 1}  # the segments that state ends and starts

PARAMS = DevnetParams.model_validate({
    "accounts": N_ACCOUNTS,
    "registry": {"unbond_delay": 7200},  # > window + grace + a whole dispute
    "market": {"verification_window": 600, "sample_count": 2 * SEGMENTS},  # every segment
    "dispute": {"clock": 600, "commit_window": 600, "reveal_window": 60},
})


def settings(home: Path, c: LocalChain, name: str, account: int,
             bootstrap: list[str] | None = None) -> NodeSettings:
    return node_settings(home, c, name, account, STAKE, bootstrap)


@pytest.mark.parametrize("behavior", ["poison:1", "poison:1,mode=shape"])
def test_poisoned_committed_state_is_challenged_on_chain(module_chain: LocalChain,
                                                         tmp_path: Path, behavior: str) -> None:
    c = module_chain  # the module's own deployment (PARAMS), reverted after each test
    digits = pack_digits()
    spec_b = tiny_mlp_spec(sha(digits), STEPS, K)
    terms = real_job_terms(spec_b, digits, STEPS, K)
    verifier_addr = c.addresses[VERIFIER_I]
    out: dict[str, Any] = {}

    def challenged_events(jid: JobId) -> list[ChainEvent]:
        dep = c.deployment
        return [e for e in EventWatcher(c.w3, [c.reader.market]).fetch(
                    dep.deploy_block, c.w3.eth.block_number)
                if e.event == "Challenged" and e.args["jobId"] == jid]

    async def main() -> None:
        async with Runtime(settings(tmp_path, c, "solver", SOLVER_I), "solver") as srt:
            # The cheating solver: registered, trains with the daemon's own code, commits.
            solver, jid = await train_and_commit(srt, c, SUBMITTER, terms, spec_b, digits,
                                                 STAKE, behavior)
            sc = srt.chain_client
            assert solver.state.data.jobs[jid].phase == "committed"
            manifest = read_manifest(solver._trace_dir(jid))
            out["manifest_segments"] = manifest.segment_count
            out["state_hashes"] = list(manifest.state_hashes)
            job = await srt.chain(sc.market.get_job, jid)
            assert job.status == JobStatus.COMMITTED
            await srt.chain(lambda: c.mine(max(1, job.sample_block - c.w3.eth.block_number + 1)))

            # The verifier daemon, its own loop, knowing the solver as a bootstrap peer.
            vset = settings(tmp_path, c, "verifier", VERIFIER_I, [srt.p2p.addrs[0]])
            async with Runtime(vset, "verifier") as vrt, trio.open_nursery() as nursery:
                verifier = Verifier(vrt)
                nursery.start_soon(solver._announcer)  # gossip: said again every 3 s
                nursery.start_soon(verifier.run)
                t0 = time.monotonic()
                with trio.fail_after(CHALLENGE_BOUND_S):
                    while not (evs := await srt.chain(challenged_events, jid)):
                        await trio.sleep(0.5)
                out["took"] = time.monotonic() - t0
                out["events"] = evs
                # The daemon records the dispute it opened (from its DisputeOpened event,
                # possibly before the tx has returned) and then marks the job challenged.
                with trio.fail_after(10):
                    while not (verifier.state.data.disputes
                               and verifier.state.data.jobs[jid].challenged):
                        await trio.sleep(0.1)
                nursery.cancel_scope.cancel()
            out["jid"] = jid
            on_disk = verifier.state.data.model_dump(mode="json")  # as verifier.json has it
            out["verdicts"] = dict(on_disk["jobs"][str(jid)]["verdicts"])
            out["vjob"] = dict(on_disk["jobs"][str(jid)])
            out["disputes"] = dict(on_disk["disputes"])
            did = int(out["events"][0].args["disputeId"])
            out["dispute"] = await srt.chain(c.reader.dispute.get_dispute, did)
            out["job"] = await srt.chain(c.reader.market.get_job, jid)
            out["sampled"] = await srt.chain(c.reader.market.sampled_segments, jid)

    trio.run(main)

    print(json.dumps({"behavior": behavior, "challenge_after_s": round(out["took"], 2),
                      "verdicts": out["verdicts"],
                      "segment": int(out["events"][0].args["segment"])}))
    jid = out["jid"]
    # The market's sample covers every segment, the poisoned ones included.
    assert sorted(out["sampled"]) == list(range(SEGMENTS)) == list(
        range(out["manifest_segments"])), out["sampled"]
    # Each segment judged on its own: the two touching the poisoned state failed, the
    # others passed (the bad state stopped neither the loop nor the other verdicts).
    assert out["verdicts"] == {str(s): s not in TOUCHING for s in range(SEGMENTS)}, out["vjob"]
    assert out["vjob"]["checked"] is True and out["vjob"]["challenged"] is True
    # Exactly one challenge, from this verifier, naming a segment touching the state.
    (ev,) = out["events"]
    assert ev.args["challenger"].lower() == verifier_addr.lower(), ev.args
    assert int(ev.args["segment"]) in TOUCHING, ev.args
    did = int(ev.args["disputeId"])
    assert list(out["disputes"]) == [str(did)], out["disputes"]
    assert out["disputes"][str(did)]["role"] == "challenger", out["disputes"]
    assert out["disputes"][str(did)]["job"] == out["jid"], out["disputes"]
    # The dispute is open on chain, on that segment's steps, against this job's solver.
    d = out["dispute"]
    seg = int(ev.args["segment"])
    assert d.job_id == jid and d.segment == seg, d
    assert d.challenger.lower() == verifier_addr.lower(), d
    assert (d.lo, d.hi) == (seg * K, (seg + 1) * K), d
    hashes = out["state_hashes"]  # the committed leaves, the poisoned one included
    assert (d.lo_hash.hex(), d.hi_hash.hex()) == (hashes[seg], hashes[seg + 1]), d
    assert d.phase == Phase.BISECTION, d
    assert out["job"].status == JobStatus.COMMITTED and out["job"].open_disputes == 1
