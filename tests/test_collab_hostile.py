"""Issue 37, item 1: ``outer_state`` announcements from strangers. Any registered node
may announce theta_r; a follower that lacks it (a joiner, a restarted worker) fetches
what is announced. Real files through the real reader; on anvil, a real follower
Runtime fetching over libp2p from real hostile peers on loopback."""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path
from typing import Any

import pytest
import torch
import trio
from safetensors.torch import save as st_save

from devnet.testing import LocalChain, node_settings
from node.chain.ids import CollabId
from node.datasets import Dataset, pack_text, parse_dataset
from node.errors import CheckpointError
from node.p2p.announce import Announcement
from node.roles.bans import BanList
from node.spec import CollaborativeSpec, parse_collaborative_spec
from node.train.diloco import OuterState, initial_outer_state, outer_hash, outer_step, outer_tensors
from node.train.outer_file import max_file_bytes, read_outer_file
from tests.test_collab_market import (
    Net,
    accept_outer,
    claim_all,
    post,
    post_outer,
    terms,
    window,
    work,
)
from tests.test_collab_market import net as net  # noqa: F401 - the fixture
from tests.test_collab_rounds import collab
from tests.test_p2p_hostile import started


@pytest.fixture(scope="module")
def text_bytes() -> bytes:
    return pack_text()


@pytest.fixture(scope="module")
def text(text_bytes: bytes) -> Dataset:
    return parse_dataset(text_bytes)


@pytest.fixture(scope="module")
def spec(text: Dataset) -> CollaborativeSpec:
    return parse_collaborative_spec(collab(text.hash_hex, workers={"min": 2, "max": 3}))


def theta_1(spec: CollaborativeSpec) -> OuterState:
    """A round-1 outer state as three slots' deltas make it."""
    s0 = initial_outer_state(spec)
    g = torch.Generator().manual_seed(1)
    deltas = {s: {n: torch.randn(t.shape, generator=g) * 1e-3 for n, t in s0.theta.items()}
              for s in range(3)}
    return outer_step(s0, deltas, spec.outer_optimizer)


def state_bytes(state: OuterState, **change: torch.Tensor | None) -> bytes:
    t = {k: v.contiguous() for k, v in outer_tensors(state).items()}
    for k, v in change.items():
        if v is None:
            del t[k]
        else:
            t[k] = v
    return st_save(t)


def hostile_files(spec: CollaborativeSpec, good: OuterState) -> dict[str, bytes]:
    name = next(iter(good.theta))
    bad_nan = good.theta[name].clone().reshape(-1)
    bad_nan[0] = float("nan")
    return {
        "4 KB of random bytes": os.urandom(4096),
        "no meta.round (88 bytes)": st_save({"x": torch.zeros(4)}),
        "good tensors, no meta.round": state_bytes(good, **{"meta.round": None}),
        "another round": state_bytes(good, **{"meta.round": torch.tensor(7)}),
        "a tensor of the wrong shape": state_bytes(good, **{f"theta.{name}": torch.zeros(3)}),
        "a NaN": state_bytes(good, **{f"theta.{name}": bad_nan.reshape(good.theta[name].shape)}),
        "slots out of range": state_bytes(good, **{"meta.slots": torch.tensor([0, 9])}),
        "meta.round as float": state_bytes(good, **{"meta.round": torch.tensor(1.0)}),
        "truncated": state_bytes(good)[:-100],
    }


def test_outer_files_from_strangers_fail_as_checkpoint_errors(spec: CollaborativeSpec,
                                                              tmp_path: Path) -> None:
    """Before: ``safetensors.load_file`` read a peer's file whole and unchecked: random
    bytes raised SafetensorError, a file without ``meta.round`` KeyError (neither a
    PolnetError, so the follower's tick died of it). Now each is a CheckpointError
    naming what is wrong, and the honest file still loads to the same state."""
    good = theta_1(spec)
    for what, raw in hostile_files(spec, good).items():
        p = tmp_path / "f.safetensors"
        p.write_bytes(raw)
        assert len(raw) <= max_file_bytes(spec) + 8, what
        with pytest.raises(CheckpointError):
            read_outer_file(p, 1, spec)
    p = tmp_path / "good.safetensors"
    p.write_bytes(state_bytes(good))
    got = read_outer_file(p, 1, spec)
    assert got is not None and outer_hash(got) == outer_hash(good)
    assert read_outer_file(tmp_path / "none", 1, spec) is None


def test_ban_list_survives_a_restart_and_reaches_the_account(tmp_path: Path) -> None:
    """Before: bad announcers were a set in memory: a restart, or a new peer id through
    ``updateNode``, bought the same account another try."""
    bans = BanList(tmp_path / "bans.json")
    bans.ban("served junk", "12D3KooWpeerA", "0xAbCd000000000000000000000000000000000001")
    again = BanList(tmp_path / "bans.json")
    assert again.banned("12D3KooWpeerA")
    assert again.banned("12D3KooWnewPeer", "0xabcd000000000000000000000000000000000001")
    assert not again.banned("12D3KooWpeera")  # peer ids are case-sensitive
    assert not again.banned("12D3KooWother", None)
    (tmp_path / "bans.json").write_text("{not json")
    assert len(BanList(tmp_path / "bans.json")) == 0  # damaged: starts empty, no crash
    small = BanList(tmp_path / "small.json", limit=3)
    for i in range(5):
        small.ban("x", f"peer{i:08d}")
    assert len(BanList(tmp_path / "small.json", limit=3)) == 3
    assert not small.banned("peer00000000") and small.banned("peer00000004")


def _announce(rt: Any, sender: str, cid: CollabId, r: int, h: bytes, aid: str) -> None:
    rt.book.add(Announcement(kind="outer_state", sender=sender, seq=0, ts_ms=0, sig="00",
                             payload={"collab_job_id": cid, "round": r,
                                      "outer_hash": "0x" + h.hex(), "artifact_id": aid}))


def test_hostile_outer_state_announcements_leave_the_follower_whole(
        net: Net, spec: CollaborativeSpec, text_bytes: bytes, tmp_path: Path) -> None:
    """Attack: three announcers of theta_1 (4 KB of random bytes, a safetensors file
    without ``meta.round``, an artifact nobody serves), announced after the honest one
    so they are tried first. Before: the follower fetched inline in its tick; the first
    raised SafetensorError out of ``outer_state`` (the tick, then the daemon, died), the
    unserved one cost 30 s of every tick, and the senders were forgotten on restart.
    Now: ``outer_state`` never raises and never waits on a fetch (the first call
    returns None while the background fetch runs), the honest theta_1 is taken, each
    bad sender is charged on disk, and a restarted follower skips them."""
    from node.roles.collab import CollabFollower  # noqa: PLC0415 - libp2p is heavy
    from node.roles.runtime import Runtime  # noqa: PLC0415
    from node.roles.verifier_evidence import Evidence  # noqa: PLC0415

    good = theta_1(spec)
    h1 = outer_hash(good)
    ds_hash = hashlib.sha256(text_bytes).digest()
    job = post(net, terms(rounds=2, spec_hash=spec.spec_hash(), dataset_hash=ds_hash))
    claim_all(net, job)
    net.outsider.collab.start_round(job)
    work(net, job, 0)
    net.chain.advance(window(net))
    net.outsider.collab.settle_round(job)
    post_outer(net, net.submitter, job, 0, h1)
    accept_outer(net, job, 0)
    chain: LocalChain = net.chain
    assert chain.reader.collab.get_round(job, 0).outer_hash == h1
    files = {"junk": os.urandom(4096), "nometa": st_save({"x": torch.zeros(4)}),
             "honest": state_bytes(good)}
    out: dict[str, Any] = {}

    async def main() -> None:
        async with started(tmp_path / "peers", list(files)) as peers:
            ids = {}
            for (name, raw), node in zip(files.items(), peers, strict=True):
                p = tmp_path / f"{name}.safetensors"
                p.write_bytes(raw)
                ids[name] = (node.peer_id.to_base58(), await node.publish_file(p))
            boot = [a for node in peers for a in node.addrs]
            settings = node_settings(tmp_path / "f", chain, "follower", 0, 0, bootstrap=boot)
            async with Runtime(settings, "verifier") as rt:
                rt.p2p.store.put_bytes(spec.canonical_json())
                rt.p2p.store.put_bytes(text_bytes)
                nobody = hashlib.sha256(b"served by nobody").hexdigest()
                _announce(rt, ids["honest"][0], job, 1, h1, ids["honest"][1])
                _announce(rt, ids["junk"][0], job, 1, h1, ids["junk"][1])
                _announce(rt, ids["nometa"][0], job, 1, h1, ids["nometa"][1])
                _announce(rt, "12D3KooWnobodyServesThis", job, 1, h1, nobody)
                rt.peer_accounts[ids["junk"][0]] = net.outsider.address  # its account
                f = CollabFollower(rt, Evidence(rt))
                f.fetch_per_sender_s = 8.0  # the unserved one's share, kept short here
                first = await f.outer_state(job, 1)
                out["first"] = first is not None
                out["fetching"] = (job, 1) in f._fetching
                got = None
                deadline = time.monotonic() + 150
                while got is None and time.monotonic() < deadline:
                    await trio.sleep(0.5)
                    got = await f.outer_state(job, 1)
                out["hash"] = outer_hash(got) if got is not None else None
                out["bans"] = {n: f.bad_announcers.banned(pid) for n, (pid, _) in ids.items()}
                out["nobody_banned"] = f.bad_announcers.banned("12D3KooWnobodyServesThis")
                out["spent"] = f._fetch_spent.get((job, 1), 0.0)
                again = CollabFollower(rt, Evidence(rt))  # a restart: the list is on disk
                out["hints_after_restart"] = [s for s, _ in again._hints(job, 1)]
                # The junk sender's account under a new peer id (updateNode) is still out.
                rt.peer_accounts["12D3KooWjunkNewPeerId"] = net.outsider.address
                _announce(rt, "12D3KooWjunkNewPeerId", job, 1, h1, ids["junk"][1])
                out["new_id_hint"] = "12D3KooWjunkNewPeerId" in \
                    [s for s, _ in again._hints(job, 1)]
                out["honest_id"] = ids["honest"][0]

    trio.run(main)
    assert out["first"] is False and out["fetching"] is True, out  # nothing inline
    assert out["hash"] == h1, out
    assert out["bans"] == {"junk": True, "nometa": True, "honest": False}, out
    assert out["nobody_banned"] is True, out
    assert out["spent"] <= 90.0, out
    assert out["hints_after_restart"] == [out["honest_id"]], out
    assert out["new_id_hint"] is False, out
