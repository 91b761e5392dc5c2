"""An outer juror restarted between its commit and its reveal (issue 31).

Before: CollabFollower kept OuterJury vote salts in memory only, so a juror whose
process restarted after committing could not reveal and was slashed as silent; and
it marked a vote revealed before sending the reveal, so a reveal that failed was
never sent again. Now the salt is on disk (collab/outer-votes.json, 0600) before the
commitment leaves, and a reveal is marked done only once its transaction came back.
On a real anvil, with real CollabMarket / OuterJury contracts and a real Runtime.
"""

from __future__ import annotations

import json
import stat
from pathlib import Path

import pytest
import trio
from eth_utils import keccak

from devnet.rpcproxy import RpcProxy
from devnet.testing import node_settings
from node.chain.contracts import OuterVerdict
from node.errors import PolnetError
from tests.test_collab_market import (  # noqa: F401 - net: the fixture
    VSTAKE,
    Net,
    _challenge_and_draw,
    net,
    post_outer,
    settled_one_round_job,
)


def test_outer_juror_restarted_between_commit_and_reveal_reveals(net: Net,  # noqa: F811
                                                                  tmp_path: Path) -> None:
    from node.roles.collab import CollabFollower  # noqa: PLC0415 - libp2p is heavy
    from node.roles.runtime import Runtime  # noqa: PLC0415
    from node.roles.verifier_evidence import Evidence  # noqa: PLC0415

    chain, c = net.chain, net.chain.reader
    jp = c.outer_jury.jury_params()
    job = settled_one_round_job(net)
    post_outer(net, net.workers[2], job, 0, keccak(b"forged"))
    case_id, jury = _challenge_and_draw(net, job, 0, net.submitter)
    me, others = jury[0], jury[1:]
    proxy = RpcProxy(chain.url).start()
    settings = node_settings(tmp_path, chain, "juror", chain.addresses.index(me), VSTAKE)
    settings.rpc_url = proxy.url
    votes_file = settings.node_dir / "collab" / "outer-votes.json"

    async def duty() -> None:
        """One pass of the follower's jury duty, in a process of its own (a restart)."""
        async with Runtime(settings, "verifier") as rt:
            f = CollabFollower(rt, Evidence(rt))
            oj = rt.chain_client.outer_jury
            case = await rt.chain(oj.get_case, case_id)
            now = await rt.chain(rt.chain_client.timestamp)
            # The forged post is not our recomputation: vote invalid.
            await f._jury_duty(job, 0, case_id, case, False, now)

    try:
        trio.run(duty)  # commits; then the process is gone before the reveal window
        saved = json.loads(votes_file.read_text())[str(case_id)]
        assert saved["committed"] and not saved["revealed"] and saved["valid"] is False
        assert stat.S_IMODE(votes_file.stat().st_mode) == 0o600
        salt = keccak(b"salt")
        for a in others:
            net.by_address(a).outer_jury.commit_vote(case_id, False, salt)
        chain.advance(jp.commit_window)
        # The first reveal of the restarted juror fails at the provider: not marked
        # revealed, so the next pass sends it again.
        proxy.fail_next("eth_sendRawTransaction", 1)
        with pytest.raises(PolnetError):
            trio.run(duty)
        assert json.loads(votes_file.read_text())[str(case_id)]["revealed"] is False
        trio.run(duty)  # restarted again: reveals from the salt on disk
        assert json.loads(votes_file.read_text())[str(case_id)]["revealed"] is True
    finally:
        proxy.stop()
    for a in others:
        net.by_address(a).outer_jury.reveal_vote(case_id, False, salt)
    chain.advance(jp.reveal_window)
    r = net.outsider.collab.resolve_outer(job, 0)
    ev = c.collab.events(r, "OuterResolved")[0]["args"]
    assert (ev["verdict"], ev["invalidVotes"]) == (OuterVerdict.INVALID, len(jury))
    # Revealed with the majority: its seat's lock is released whole, nothing slashed.
    assert c.registry.free_stake(me) == VSTAKE and c.registry.seat_locked_stake(me) == 0
