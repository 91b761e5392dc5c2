"""Fuzz every loader that takes bytes from a peer or a submitter: only a PolnetError
may ever escape (gossip validation: nothing escapes, a bad message is dropped).

Inputs are random bytes, valid files mutated byte by byte, valid structures with a
field swapped for arbitrary JSON (lists, deep nesting, huge integers), and pure
nesting. ``POLNET_FUZZ_EXAMPLES`` is the total case count over all targets
(default 4,000; a soak: ``POLNET_FUZZ_EXAMPLES=20000``); each target checks it ran
its share. No process may die on any of it: tests/test_boundary.py runs the
nested inputs in a process that imported web3.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import struct
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.peer.id import ID
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from node.datasets import pack_digits, pack_text, parse_dataset
from node.errors import PolnetError
from node.p2p import wire
from node.p2p.announce import AnnouncementVerifier, make_announcement
from node.roles import announce_kinds  # noqa: F401 - registers outer_state
from node.roles.runtime import AnnouncementBook
from node.roles.verifier_evidence import parse_manifest
from node.spec import (
    load_spec,
    parse_collaborative_spec,
    parse_collaborative_spec_json,
    parse_spec,
    parse_spec_json,
)
from node.store.manifest import Manifest, ManifestBuilder, chunk_size_for
from node.train.diloco import OuterState, initial_outer_state, outer_tensors
from node.train.outer_file import read_outer_file
from node.train.step import TrainContext, init_state, state_tensors
from node.train.trace import TraceManifest, load_checkpoint, run_training, write_state_file

ROOT = Path(__file__).resolve().parent.parent
TARGETS = 11
TOTAL = int(os.environ.get("POLNET_FUZZ_EXAMPLES", "4000"))
PER_TARGET = max(1, TOTAL // TARGETS)
FUZZ = settings(max_examples=PER_TARGET, deadline=None, database=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture])
CASES: Counter[str] = Counter()  # cases run per target: the suite checks its own count


def ran_all(target: str) -> None:
    assert CASES[target] >= PER_TARGET, (target, CASES[target], PER_TARGET)


def only_polnet_errors(fn: Callable[[], Any]) -> None:
    with contextlib.suppress(PolnetError):
        fn()


# --- strategies ------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner,
                                                               max_size=4),
    max_leaves=12)


@st.composite
def nested(draw: st.DrawFn) -> bytes:
    """Deep nesting of lists/objects, closed or not, around an optional value."""
    depth = draw(st.integers(1, 70_000))
    opener = draw(st.sampled_from([b"[", b'{"a":', b'[{"a":']))
    closer = {b"[": b"]", b'{"a":': b"}", b'[{"a":': b"}]"}[opener]
    closed = draw(st.booleans())
    return opener * depth + b"1" + (closer * depth if closed else b"")


@st.composite
def big_int(draw: st.DrawFn) -> bytes:
    return b'{"seed": ' + b"9" * draw(st.integers(90, 6000)) + b"}"


def mutated(base: bytes) -> st.SearchStrategy[bytes]:
    """``base`` with a few byte flips, insertions, deletions or a truncation."""
    @st.composite
    def strat(draw: st.DrawFn) -> bytes:
        data = bytearray(base)
        for _ in range(draw(st.integers(1, 6))):
            op = draw(st.sampled_from(["flip", "insert", "delete", "truncate"]))
            # Mutations cluster at the start (length prefix, header) half the time.
            hi = max(0, len(data) - 1)
            pos = draw(st.integers(0, min(hi, 256)) | st.integers(0, hi))
            if op == "flip" and data:
                data[pos] = draw(st.integers(0, 255))
            elif op == "insert":
                data[pos:pos] = draw(st.binary(min_size=1, max_size=16))
            elif op == "delete":
                del data[pos:pos + draw(st.integers(1, 64))]
            else:
                del data[pos:]
        return bytes(data)
    return strat()


def hostile(valid: bytes) -> st.SearchStrategy[bytes]:
    return st.one_of(st.binary(max_size=512), mutated(valid), nested(), big_int(),
                     json_values.map(lambda v: json.dumps(v).encode()))


def with_field(obj: dict[str, Any]) -> st.SearchStrategy[bytes]:
    """``obj`` as JSON with one field (maybe nested one level) replaced by anything."""
    @st.composite
    def strat(draw: st.DrawFn) -> bytes:
        d = json.loads(json.dumps(obj))
        key = draw(st.sampled_from(sorted(d)))
        if isinstance(d[key], dict) and d[key] and draw(st.booleans()):
            d[key][draw(st.sampled_from(sorted(d[key])))] = draw(json_values)
        else:
            d[key] = draw(json_values)
        return json.dumps(d).encode()
    return strat()


# --- fixtures: one valid instance of every input -----------------------------------------


VISION_META = {"format": "polnet-dataset/1", "kind": "vision", "num_classes": 10}


def spec_dict(dataset: bytes) -> dict[str, Any]:
    d = load_spec(ROOT / "examples" / "mlp_digits.toml").model_dump(mode="json")
    d.update(dataset_hash=hashlib.sha256(dataset).hexdigest(), total_steps=4,
             checkpoint_interval=2, batch_size=16, schedule={"kind": "constant"},
             model={"family": "mlp", "input_dim": 64, "hidden": [8], "num_classes": 10})
    return d


@pytest.fixture(scope="module")
def valid(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    digits = pack_digits()
    spec = parse_spec(spec_dict(digits))
    ctx = TrainContext.create(spec, parse_dataset(digits))
    ckpt = tmp_path_factory.mktemp("ckpt") / "state.safetensors"
    write_state_file(ckpt, state_tensors(init_state(ctx)), job_id=1, step=0)
    trace = tmp_path_factory.mktemp("trace")
    run_training(ctx, trace, 1)
    b = ManifestBuilder(chunk_size_for(3 * 2**20))
    b.update(os.urandom(3 * 2**20))
    kp = create_new_key_pair()
    sender = ID.from_pubkey(kp.public_key)
    ann = make_announcement(kp.private_key, sender, "job_posted",
                            {"job_id": 3, "spec_hash": "0x" + "ab" * 32,
                             "dataset_id": "cd" * 32}, 1)
    t = st_load(digits)
    small = st_save({"x": t["x"][:8].clone(), "y": t["y"][:8].clone()},
                    metadata={"polnet": json.dumps(VISION_META)})
    text = pack_text()
    hlen = int.from_bytes(text[:8], "little")
    small_text = st_save({"tokens": torch.arange(50, dtype=torch.int32) % 10},
                         metadata=json.loads(text[8:8 + hlen])["__metadata__"])
    inner = spec_dict(digits)
    inner.update(total_steps=4)
    cspec = parse_collaborative_spec({
        "kind": "collaborative", "name": "fuzz", "inner": inner,
        "workers": {"min": 1, "max": 2}, "inner_steps": 2, "outer_rounds": 2,
        "outer_optimizer": {"lr": 0.7, "momentum": 0.9}, "holdout_samples": 16})
    s0 = initial_outer_state(cspec)
    outer = st_save({k: v.contiguous() for k, v in outer_tensors(
        OuterState(1, s0.theta, s0.momentum, (0, 1))).items()})
    outer_payload = {"collab_job_id": 2, "round": 1, "outer_hash": "0x" + "ef" * 32,
                     "artifact_id": "12" * 32}
    outer_ann = make_announcement(kp.private_key, sender, "outer_state", outer_payload, 2)
    return {"spec": spec, "spec_json": spec.canonical_json(), "ckpt": ckpt.read_bytes(),
            "trace": (trace / "trace.json").read_bytes(), "manifest": b.finish().to_bytes(),
            "ann": ann, "sender": sender, "dataset": small, "text": small_text,
            "cspec": cspec, "cspec_json": cspec.canonical_json(), "outer": outer,
            "outer_payload": outer_payload, "outer_ann": outer_ann, "key": kp.private_key}


# --- targets -----------------------------------------------------------------------------


def test_fuzz_spec(valid: dict[str, Any]) -> None:
    @FUZZ
    @given(raw=hostile(valid["spec_json"]) | with_field(json.loads(valid["spec_json"])))
    def run(raw: bytes) -> None:
        CASES["spec"] += 1
        only_polnet_errors(lambda: parse_spec_json(raw))
    run()
    ran_all("spec")


def test_fuzz_dataset(valid: dict[str, Any]) -> None:
    tensors = st_load(valid["dataset"])

    @st.composite
    def with_meta(draw: st.DrawFn) -> bytes:
        m = json.loads(draw(with_field(VISION_META)))
        text = draw(st.sampled_from([json.dumps(m), json.dumps(draw(json_values))]))
        return st_save(tensors, metadata={"polnet": text})

    @FUZZ
    @given(raw=hostile(valid["dataset"]) | with_meta())
    def run(raw: bytes) -> None:
        CASES["dataset"] += 1
        only_polnet_errors(lambda: parse_dataset(raw))
    run()
    ran_all("dataset")


def _header_swap(raw: bytes) -> st.SearchStrategy[bytes]:
    """A safetensors file whose header has one entry (or the metadata) replaced."""
    hlen = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8:8 + hlen])
    data = raw[8 + hlen:]

    @st.composite
    def strat(draw: st.DrawFn) -> bytes:
        h = json.loads(json.dumps(header))
        key = draw(st.sampled_from(sorted(h)))
        if key == "__metadata__":
            h[key]["polnet"] = draw(st.sampled_from([json.dumps(draw(json_values)),
                                                     draw(nested()).decode()]))
        elif draw(st.booleans()):
            h[key][draw(st.sampled_from(["dtype", "shape", "data_offsets"]))] = draw(json_values)
        else:
            h[key] = draw(json_values)
        body = json.dumps(h).encode()
        return struct.pack("<Q", len(body)) + body + data
    return strat()


def test_fuzz_checkpoint(valid: dict[str, Any], tmp_path: Path) -> None:
    path = tmp_path / "ckpt.safetensors"

    @FUZZ
    @given(raw=hostile(valid["ckpt"]) | _header_swap(valid["ckpt"]), with_spec=st.booleans())
    def run(raw: bytes, with_spec: bool) -> None:
        CASES["checkpoint"] += 1
        path.write_bytes(raw)
        only_polnet_errors(lambda: load_checkpoint(path, spec=valid["spec"] if with_spec
                                                   else None))
    run()
    ran_all("checkpoint")


class MemStream:
    """wire.Stream over fixed bytes: reads what is there, then b"" (the remote closed)."""

    def __init__(self, data: bytes) -> None:
        self.data = data

    async def read(self, n: int | None = None) -> bytes:
        n = len(self.data) if n is None else n
        out, self.data = self.data[:n], self.data[n:]
        return out

    async def write(self, data: bytes) -> None:
        pass


def framed(body: st.SearchStrategy[bytes]) -> st.SearchStrategy[bytes]:
    return body.map(lambda b: struct.pack(">I", len(b)) + b)


def test_fuzz_frame_reader() -> None:
    request = json.dumps({"op": "read", "id": "ab" * 32, "offset": 0, "length": 9}).encode()

    @FUZZ
    @given(raw=st.binary(max_size=64) | framed(hostile(request))
           | mutated(struct.pack(">I", len(request)) + request))
    def run(raw: bytes) -> None:
        CASES["frame"] += 1
        stream = MemStream(raw)

        async def read_all() -> None:
            while True:  # every frame in the bytes, as a server loop would
                await wire.read_frame(stream)

        try:
            trio.run(read_all)
        except PolnetError:
            pass
        except EOFError:  # StreamClosed or cut short: only when the bytes ran out
            assert stream.data == b""
    run()
    ran_all("frame")


def test_fuzz_gossip(valid: dict[str, Any]) -> None:
    fields = json.loads(valid["ann"])

    @FUZZ
    @given(raw=hostile(valid["ann"]) | with_field(fields), topic=st.sampled_from(
        [None, "polnet/jobs/1", "polnet/results/1"]), claim=st.booleans())
    def run(raw: bytes, topic: str | None, claim: bool) -> None:
        CASES["gossip"] += 1
        verifier = AnnouncementVerifier()
        got = verifier.verify(raw, topic, valid["sender"] if claim else None)  # never raises
        assert got is None or raw == valid["ann"] or json.loads(raw) == fields
    run()
    ran_all("gossip")


def test_fuzz_chunk_manifest(valid: dict[str, Any]) -> None:
    @FUZZ
    @given(raw=hostile(valid["manifest"]) | with_field(json.loads(valid["manifest"])))
    def run(raw: bytes) -> None:
        CASES["chunk_manifest"] += 1
        only_polnet_errors(lambda: Manifest.from_bytes(raw))
    run()
    ran_all("chunk_manifest")


def test_fuzz_trace_manifest(valid: dict[str, Any]) -> None:
    @FUZZ
    @given(raw=hostile(valid["trace"]) | with_field(json.loads(valid["trace"])))
    def run(raw: bytes) -> None:
        CASES["trace_manifest"] += 1
        only_polnet_errors(lambda: parse_manifest(raw))
        only_polnet_errors(lambda: TraceManifest.from_json(raw))
    run()
    ran_all("trace_manifest")


def test_fuzz_text_dataset(valid: dict[str, Any]) -> None:
    @FUZZ
    @given(raw=hostile(valid["text"]) | _header_swap(valid["text"]))
    def run(raw: bytes) -> None:
        CASES["text_dataset"] += 1
        only_polnet_errors(lambda: parse_dataset(raw))
    run()
    ran_all("text_dataset")


# --- collaborative jobs (issue 37): specs, outer-state files, outer_state announcements ---


def test_fuzz_collaborative_spec(valid: dict[str, Any]) -> None:
    @FUZZ
    @given(raw=hostile(valid["cspec_json"]) | with_field(json.loads(valid["cspec_json"])))
    def run(raw: bytes) -> None:
        CASES["collab_spec"] += 1
        only_polnet_errors(lambda: parse_collaborative_spec_json(raw))
    run()
    ran_all("collab_spec")


def test_fuzz_outer_state_file(valid: dict[str, Any], tmp_path: Path) -> None:
    """What any registered node may serve as theta_r: only CheckpointError escapes."""
    path = tmp_path / "outer.safetensors"
    path.write_bytes(valid["outer"])
    assert read_outer_file(path, 1, valid["cspec"]) is not None  # the valid one loads

    @FUZZ
    @given(raw=hostile(valid["outer"]) | _header_swap(valid["outer"]), r=st.sampled_from([1, 2]))
    def run(raw: bytes, r: int) -> None:
        CASES["outer_state"] += 1
        path.write_bytes(raw)
        only_polnet_errors(lambda: read_outer_file(path, r, valid["cspec"]))
    run()
    ran_all("outer_state")


def test_fuzz_outer_state_announcement(valid: dict[str, Any]) -> None:
    """Raw bytes: the verifier never raises. Payloads signed by their sender: the
    verifier and then the follower's book take any that validates without raising."""
    payloads = with_field(valid["outer_payload"]).map(json.loads)

    @FUZZ
    @given(raw=hostile(valid["outer_ann"]) | with_field(json.loads(valid["outer_ann"])),
           payload=payloads)
    def run(raw: bytes, payload: dict[str, Any]) -> None:
        CASES["outer_announcement"] += 1
        verifier = AnnouncementVerifier()
        book = AnnouncementBook()
        got = verifier.verify(raw, "polnet/collab/1", valid["sender"])  # never raises
        if got is not None:
            book.add(got)
        try:
            signed = make_announcement(valid["key"], valid["sender"], "outer_state", payload, 3)
        except ValueError:  # the sender's own check refuses it; a hostile one signs anyway
            return
        got = verifier.verify(signed, "polnet/collab/1", valid["sender"])
        assert got is not None
        book.add(got)
        hints = book.outer_hints(int(payload["collab_job_id"]), int(payload["round"]))
        assert hints == [(valid["sender"].to_base58(), str(payload["artifact_id"]))]
    run()
    ran_all("outer_announcement")
