"""Trust-boundary loaders: bounded JSON, checkpoint and dataset checks before data is
read, the recursion limit web3 raises, and owner-only secret files.

Real files, real torch states, real subprocesses; no mocks."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from node.boundary import MAX_DEPTH, check_fields, decode_json, json_depth
from node.chain.ids import DisputeId
from node.datasets import pack_digits, pack_text, parse_dataset, write_dataset
from node.errors import CheckpointError, IntegrityError, MalformedInput, SpecError
from node.roles.state import RoleState
from node.roles.verifier_machine import Role, VerifierDisk, VerifierDispute
from node.spec import JobSpec, load_spec, parse_spec, parse_spec_json
from node.train.layout import expected_layout, max_file_bytes
from node.train.step import TrainContext, init_state, state_tensors, train_step
from node.train.trace import load_checkpoint, write_state_file

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
ST_DTYPE = {torch.float32: "F32", torch.int64: "I64"}


def repack(raw: bytes, tensors: dict[str, torch.Tensor] | None = None,
           meta: dict[str, str] | None = None) -> bytes:
    """A safetensors file like ``raw`` with its tensors and/or metadata replaced."""
    hlen = int.from_bytes(raw[:8], "little")
    old_meta = json.loads(raw[8:8 + hlen])["__metadata__"]
    return st_save({k: v.contiguous() for k, v in (tensors or dict(st_load(raw))).items()},
                   metadata=old_meta if meta is None else meta)


def spec_for(name: str, dataset: bytes, **over: Any) -> JobSpec:
    import hashlib

    d = load_spec(EXAMPLES / f"{name}.toml").model_dump(mode="json")
    d["dataset_hash"] = hashlib.sha256(dataset).hexdigest()
    d.update(over)
    return parse_spec(d)


# --- bounded JSON ----------------------------------------------------------------------


def test_decoder_bounds_depth_size_digits_and_encoding() -> None:
    assert decode_json('{"a": ["[[[", {"b": "\\"]]"}]}', max_bytes=100) == \
        {"a": ["[[[", {"b": '"]]'}]}
    assert json_depth("[" * MAX_DEPTH + "]" * MAX_DEPTH) == MAX_DEPTH
    assert json_depth('"' + '\\"' * 1000) == 0  # an unterminated string is one token
    bad: list[bytes | str] = ["[" * (MAX_DEPTH + 1), "[" * 65530, b"\xff\xfe{}",
                              '{"seed": ' + "1" * 5000 + "}", "[NaN]", "1e999", "x" * 101]
    for raw in bad:
        with pytest.raises(MalformedInput):
            decode_json(raw, max_bytes=100_000 if len(raw) != 101 else 100)
    with pytest.raises(SpecError, match="nests 65530 levels"):
        decode_json("[" * 65530, max_bytes=10**6, error=SpecError)


def test_check_fields_names_types_and_extras() -> None:
    check_fields({"a": 1, "b": [1.5, 2], "c": None}, {"a": "int", "b": "[float]"},
                 optional={"c": "str?"}, what="x")
    for obj in ({"a": True, "b": []}, {"a": 1}, {"a": 1, "b": ["x"]}, {"a": 1, "b": [], "z": 0}):
        with pytest.raises(MalformedInput):
            check_fields(obj, {"a": "int", "b": "[float]"}, what="x")


def test_specs_from_peers_fail_cleanly() -> None:
    for raw in (b"\xff\xfe{\"seed\": 1}", b'{"seed": 1' + b"1" * 5000 + b"}",
                b"[" * 30_000 + b"]" * 30_000, b"[1, 2]", b"x" * 100_000):
        with pytest.raises(SpecError):
            parse_spec_json(raw)


# Runs with web3 imported and the recursion limit forced to py_ecc's 100000: the
# limit that turned 65,530 "[" into a SIGSEGV inside json.loads.
NESTED_CHILD = r"""
import struct, sys, trio
import web3  # noqa: F401 - py_ecc raises the recursion limit on import
import node.chain  # noqa: F401 - pins it back
print("pinned", sys.getrecursionlimit(), flush=True)
sys.setrecursionlimit(100000)  # worst case: depth must not matter even so
from node.errors import PolnetError
from node.p2p.announce import AnnouncementVerifier
from node.p2p import wire
from node.spec import parse_spec_json
from node.store.manifest import Manifest
from node.train.trace import TraceManifest
from node.datasets import parse_dataset, pack_digits
from node.tensorfile import parse_header
nested = b"[" * 65530

class Mem:
    def __init__(self, data): self.data = data
    async def read(self, n=None):
        out, self.data = self.data[:n], self.data[n:]
        return out
    async def write(self, data): pass

async def frame():
    await wire.read_frame(Mem(struct.pack(">I", len(nested)) + nested))

def st_file(meta):
    from safetensors.torch import save
    import torch
    return save({"x": torch.zeros(1)}, metadata={"polnet": meta})

loaders = {
    "frame": lambda: trio.run(frame),
    "spec": lambda: parse_spec_json(nested),
    "chunk manifest": lambda: Manifest.from_bytes(nested),
    "trace manifest": lambda: TraceManifest.from_json(nested),
    "dataset metadata": lambda: parse_dataset(st_file(nested.decode())),
    "safetensors header": lambda: parse_header(struct.pack("<Q", len(nested)) + nested,
                                                max_header=10**6),
}
for name, load in loaders.items():
    try:
        load()
    except PolnetError as exc:
        print("rejected", name, type(exc).__name__, flush=True)
assert AnnouncementVerifier().verify(nested) is None
print("rejected gossip", flush=True)
"""


def test_nested_json_kills_no_process() -> None:
    proc = subprocess.run([sys.executable, "-c", NESTED_CHILD], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, (proc.returncode, proc.stderr[-2000:])
    lines = proc.stdout.splitlines()
    assert lines[0] == "pinned 1000"
    assert [ln.split()[1] for ln in lines[1:]] == [
        "frame", "spec", "chunk", "trace", "dataset", "safetensors", "gossip"]


def test_recursion_limit_pinned_whatever_imported_py_ecc_first() -> None:
    code = ("import sys, eth_account, web3; import node.chain; "
            "print(sys.getrecursionlimit())")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, check=True).stdout
    assert int(out) <= 1000


# --- checkpoints -----------------------------------------------------------------------


@pytest.fixture(scope="module")
def digits() -> bytes:
    return pack_digits()


def _layout_of(tensors: dict[str, torch.Tensor]) -> dict[str, tuple[str, tuple[int, ...]]]:
    return {n: (ST_DTYPE[t.dtype], tuple(t.shape)) for n, t in tensors.items()}


@pytest.mark.parametrize("optimizer", [{"name": "sgd", "lr": 0.05},
                                       {"name": "adamw", "lr": 0.002}])
def test_expected_layout_is_what_training_writes(digits: bytes,
                                                 optimizer: dict[str, Any]) -> None:
    spec = spec_for("cnn_digits", digits, optimizer=optimizer)
    ctx = TrainContext.create(spec, parse_dataset(digits))
    state = init_state(ctx)
    train_step(ctx, state, 1)
    assert expected_layout(spec) == _layout_of(state_tensors(state))


def test_streamed_tensor_files_are_safetensors_own_bytes(tmp_path: Path,
                                                          digits: bytes) -> None:
    """Checkpoints are written straight from the tensors (trace.write_tensor_file): the
    bytes, and so the artifact id, are safetensors' ``save``'s, for every dtype it
    orders by and for a real training state; the returned sha256 is the file's."""
    import hashlib  # noqa: PLC0415

    from node.train.trace import write_tensor_file  # noqa: PLC0415

    mixed = {"b": torch.randn(3, 4), "a": torch.arange(5), "z": torch.tensor(7),
             "e": torch.zeros(0, 3), "h": torch.randn(2).to(torch.bfloat16),
             "m": torch.tensor([True, False]), "d": torch.randn(3, dtype=torch.float64),
             "i": torch.arange(4, dtype=torch.int32), "u": torch.arange(3, dtype=torch.uint8),
             "s": torch.randn(2, 3).t()}  # not contiguous
    ctx = TrainContext.create(spec_for("cnn_digits", digits), parse_dataset(digits))
    state = init_state(ctx)
    train_step(ctx, state, 1)
    for tensors, meta in ((mixed, {"polnet": '{"x": 1}'}), (mixed, {}),
                          (state_tensors(state), {"polnet": "{}"})):
        sha, size = write_tensor_file(tmp_path / "f.safetensors", tensors, meta)
        raw = (tmp_path / "f.safetensors").read_bytes()
        assert raw == st_save({k: v.contiguous() for k, v in tensors.items()},
                              metadata=meta or None)
        assert (sha, size) == (hashlib.sha256(raw).hexdigest(), len(raw))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f.safetensors"]  # no tmp left


def test_expected_layout_of_the_lm() -> None:
    text = pack_text()
    spec = spec_for("lm_text", text)
    state = init_state(TrainContext.create(spec, parse_dataset(text)))
    assert expected_layout(spec) == _layout_of(state_tensors(state))


def test_checkpoint_checked_from_its_header(digits: bytes, tmp_path: Path) -> None:
    spec = spec_for("mlp_digits", digits)
    other = spec_for("mlp_digits", digits, model={"family": "mlp", "input_dim": 64,
                                                  "hidden": [256, 64], "num_classes": 10})
    tensors = state_tensors(init_state(TrainContext.create(spec, parse_dataset(digits))))
    good = tmp_path / "good.safetensors"
    h = write_state_file(good, tensors, job_id=1, step=0)
    assert load_checkpoint(good, h, spec).state_hash == h
    with pytest.raises(CheckpointError, match="where the job.s spec needs"):
        load_checkpoint(good, h, other)

    # 1 GB claimed by the file (sparse: no disk used), rejected from its size alone.
    huge = tmp_path / "huge.safetensors"
    with open(huge, "wb") as f:
        f.write(good.read_bytes())
        f.truncate(2**30)
    tracemalloc.start()
    try:
        with pytest.raises(CheckpointError, match="is not this job's"):
            load_checkpoint(huge, h, spec)
        # Without a spec the header bound still applies: the padded tail is caught
        # before any tensor byte is read.
        with pytest.raises(CheckpointError, match="truncated or padded"):
            load_checkpoint(huge)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < max_file_bytes(spec) + 2**20

    raw = good.read_bytes()
    claims_1gb = (2**30).to_bytes(8, "little") + raw[8:]
    for name, data in [("claims", claims_1gb), ("list-meta", repack(raw, meta={"polnet": "[]"})),
                       ("no-meta", repack(raw, meta={})), ("cut", raw[:-5])]:
        p = tmp_path / f"{name}.safetensors"
        p.write_bytes(data)
        for s in (spec, None):
            with pytest.raises(CheckpointError):
                load_checkpoint(p, spec=s)


# --- datasets ----------------------------------------------------------------------------


def test_datasets_checked_at_load(digits: bytes) -> None:
    text = pack_text()
    t = dict(st_load(digits))
    tt = dict(st_load(text))

    def with_(base: dict[str, torch.Tensor], name: str, value: torch.Tensor) -> dict[str, Any]:
        return {**base, name: value}

    y_neg, y_big, x_nan, tok_big = t["y"].clone(), t["y"].clone(), t["x"].clone(), \
        tt["tokens"].clone()
    y_neg[5], y_big[5], x_nan[0, 0, 0, 0], tok_big[7] = -1, 10, float("nan"), 10_000
    bad = {
        "labels span -1": repack(digits, with_(t, "y", y_neg)),
        "labels span 0..10": repack(digits, with_(t, "y", y_big)),
        "labels in y": repack(digits, with_(t, "y", t["y"][:-300].clone())),
        "NaN": repack(digits, with_(t, "x", x_nan)),
        "I64 tensor of rank 1": repack(digits, with_(t, "y", t["y"].to(torch.int32))),
        "tokens span": repack(text, with_(tt, "tokens", tok_big)),
        "must be a JSON object": repack(digits, meta={"polnet": "[1, 2]"}),
        "nests": repack(digits, meta={"polnet": "[" * 50_000}),
        "no 'polnet' metadata": repack(digits, meta={}),
    }
    for what, raw in bad.items():
        with pytest.raises(IntegrityError, match=what) as info:
            parse_dataset(raw)
        assert "polnet dataset pack" in str(info.value)


def test_cli_train_on_bad_labels_prints_one_clean_line(digits: bytes, tmp_path: Path) -> None:
    t = dict(st_load(digits))
    t["y"] = t["y"].clone()
    t["y"][3] = -1
    bad = repack(digits, t)
    ds = tmp_path / "bad.safetensors"
    write_dataset(bad, ds)
    spec_path = tmp_path / "spec.json"
    spec_path.write_bytes(spec_for("mlp_digits", bad).canonical_json())
    proc = subprocess.run([sys.executable, "-m", "node.cli.main", "train", str(spec_path),
                           "--dataset", str(ds), "--out", str(tmp_path / "out")],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr + proc.stdout
    assert "labels span -1..9" in proc.stderr + proc.stdout


# --- secrets on disk -------------------------------------------------------------------


def test_role_state_is_owner_only(tmp_path: Path) -> None:
    state = RoleState(tmp_path / "verifier.json", VerifierDisk)
    with state as data:
        data.disputes[DisputeId(1)] = VerifierDispute(role=Role.JUROR, valid=True, salt="ab" * 32)
    mode = stat.S_IMODE(os.stat(tmp_path / "verifier.json").st_mode)
    assert mode == 0o600
    again = RoleState(tmp_path / "verifier.json", VerifierDisk)
    assert again.data.disputes[DisputeId(1)].salt == "ab" * 32 and not again.fresh


def test_anvil_log_is_owner_only(tmp_path: Path) -> None:
    from devnet.anvil import start_anvil

    log = tmp_path / "anvil.log"
    log.write_bytes(b"")  # an older run's log, created with the default mode
    os.chmod(log, 0o644)
    node = start_anvil(accounts=2, log_path=log)
    try:
        assert stat.S_IMODE(os.stat(log).st_mode) == 0o600
    finally:
        node.stop()
    assert b"Private Keys" in log.read_bytes()
