"""Trace recording: crash-safe resume, checkpoint integrity, Merkle proofs, CLI."""

from __future__ import annotations

import filecmp
import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from node.datasets import load_dataset, pack_digits, write_dataset
from node.errors import CheckpointError, ProofError, TrainingError
from node.proof import TraceLeaf, verify_proof
from node.spec import JobSpec, load_spec, parse_spec
from node.train.step import TrainContext
from node.train.trace import (
    MANIFEST_NAME,
    SPEC_NAME,
    checkpoint_name,
    load_checkpoint,
    merkle_proof,
    read_manifest,
    run_training,
)

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"

# A child that trains and reports each closed segment; the sleep widens the
# window so the parent's SIGKILL lands mid-run (sometimes mid-write).
CHILD = """
import sys, time
from node.datasets import load_dataset
from node.spec import load_spec
from node.train.step import TrainContext
from node.train.trace import run_training
spec = load_spec(sys.argv[1])
ctx = TrainContext.create(spec, load_dataset(sys.argv[2], spec.dataset_hash))
def report(p):
    print(p.step, flush=True)
    time.sleep(0.02)
run_training(ctx, sys.argv[3], 11, progress=report)
print("done", flush=True)
"""


@pytest.fixture(scope="module")
def digits(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("data") / "digits.safetensors"
    write_dataset(pack_digits(), path)
    return path


@pytest.fixture(scope="module")
def spec_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # AdamW + dropout so the optimizer state and per-step randomness both matter.
    d = load_spec(EXAMPLES / "mlp_digits.toml").model_dump(mode="json")
    d["optimizer"] = {"name": "adamw", "lr": 0.002}
    d["total_steps"], d["checkpoint_interval"] = 200, 10
    path = tmp_path_factory.mktemp("spec") / "spec.json"
    path.write_bytes(parse_spec(d).canonical_json())
    return path


def ctx(spec_file: Path, digits: Path) -> TrainContext:
    spec: JobSpec = load_spec(spec_file)
    return TrainContext.create(spec, load_dataset(digits, spec.dataset_hash))


def same_tree(a: Path, b: Path) -> None:
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    for n in names:
        assert filecmp.cmp(a / n, b / n, shallow=False), n


def start_child(spec_file: Path, digits: Path, out: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", CHILD, str(spec_file), str(digits), str(out)],
                            cwd=ROOT, stdout=subprocess.PIPE, text=True)


def kill_after(proc: subprocess.Popen[str], lines: int, extra_s: float = 0.0) -> list[str]:
    assert proc.stdout is not None
    seen = [proc.stdout.readline().strip() for _ in range(lines)]
    time.sleep(extra_s)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    return seen


@pytest.fixture(scope="module")
def reference(spec_file: Path, digits: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("reference")
    run_training(ctx(spec_file, digits), out, 11)
    return out


def test_sigkill_then_resume_gives_same_bytes_and_root(spec_file: Path, digits: Path,
                                                       reference: Path, tmp_path: Path) -> None:
    out = tmp_path / "run"
    first = kill_after(start_child(spec_file, digits, out), lines=4)
    assert first[-1] == "40" and "done" not in first
    assert not (out / MANIFEST_NAME).exists()
    # Second child resumes from the killed run; kill it at a point not tied to a write.
    second = kill_after(start_child(spec_file, digits, out), lines=1, extra_s=0.013)
    # It resumed rather than starting over. S_40 may not be on disk yet when "40"
    # is printed (checkpoints are written behind training, at most 2 in flight).
    assert int(second[0]) >= 30
    manifest = run_training(ctx(spec_file, digits), out, 11)
    assert manifest.root == read_manifest(reference).root
    same_tree(out, reference)


def test_resume_after_corrupt_or_truncated_tail(spec_file: Path, digits: Path, reference: Path,
                                                tmp_path: Path) -> None:
    out = tmp_path / "run"
    run_training(ctx(spec_file, digits), out, 11)
    (out / MANIFEST_NAME).unlink()
    last = out / checkpoint_name(200)
    last.write_bytes(last.read_bytes()[:1000])  # a torn write
    mid = out / checkpoint_name(100)
    raw = bytearray(mid.read_bytes())
    raw[-5] ^= 0xFF  # a flipped bit inside the tensor data
    mid.write_bytes(bytes(raw))
    (out / ".ckpt-00000110.safetensors.tmp-999").write_bytes(b"junk")
    manifest = run_training(ctx(spec_file, digits), out, 11)
    assert manifest.root == read_manifest(reference).root
    same_tree(out, reference)


def test_corrupt_truncated_and_wrong_checkpoints_are_detected(reference: Path,
                                                              tmp_path: Path) -> None:
    manifest = read_manifest(reference)
    src = reference / checkpoint_name(20)
    good = load_checkpoint(src, manifest.state_hashes[2])
    assert good.step == 20 and good.state_hash.hex() == manifest.state_hashes[2]
    assert good.file_sha256 == manifest.checkpoints[2].sha256
    raw = src.read_bytes()
    bad = tmp_path / "bad.safetensors"
    for mangled in (raw[: len(raw) // 2], raw[:7], raw[:-1] + bytes([raw[-1] ^ 1]), b""):
        bad.write_bytes(mangled)
        with pytest.raises(CheckpointError):
            load_checkpoint(bad)
    with pytest.raises(CheckpointError, match="expected"):
        load_checkpoint(src, manifest.state_hashes[3])
    with pytest.raises(CheckpointError, match="cannot be read"):
        load_checkpoint(tmp_path / "missing.safetensors")


def test_manifest_and_merkle_proofs(spec_file: Path, reference: Path) -> None:
    manifest = read_manifest(reference)
    spec = load_spec(spec_file)
    assert manifest.spec_hash == spec.spec_hash_hex()
    assert hashlib.sha256((reference / SPEC_NAME).read_bytes()).hexdigest() == manifest.spec_hash
    assert manifest.segment_count == 20 and len(manifest.checkpoints) == 21
    for entry in manifest.checkpoints:
        assert hashlib.sha256((reference / entry.file).read_bytes()).hexdigest() == entry.sha256
    root = bytes.fromhex(manifest.root)
    for i in range(manifest.segment_count + 1):
        leaf, proof = merkle_proof(manifest, i)
        assert leaf.step == i * manifest.k
        verify_proof(root, leaf, proof)
    leaf, proof = merkle_proof(manifest, 5)
    forged = TraceLeaf(leaf.job_id, leaf.index, leaf.step, leaf.state_hash, leaf.loss_e9 + 1)
    with pytest.raises(ProofError):
        verify_proof(root, forged, proof)


def test_out_dir_of_another_spec_is_refused(spec_file: Path, digits: Path, reference: Path,
                                            tmp_path: Path) -> None:
    other = load_spec(spec_file).model_dump(mode="json")
    other["seed"] = 99
    spec = parse_spec(other)
    c = TrainContext.create(spec, load_dataset(digits, spec.dataset_hash))
    with pytest.raises(TrainingError, match="another spec"):
        run_training(c, reference, 11)


def test_cli_train_prints_the_root(digits: Path, tmp_path: Path) -> None:
    spec = load_spec(EXAMPLES / "mlp_digits.toml")
    expected = run_training(TrainContext.create(spec, load_dataset(digits, spec.dataset_hash)),
                            tmp_path / "lib", 4).root
    polnet = Path(sys.executable).with_name("polnet")
    cmd = [str(polnet), "train", str(EXAMPLES / "mlp_digits.toml"), "--out",
           str(tmp_path / "cli"), "--job-id", "4", "--dataset", str(digits)]
    res = subprocess.run(cmd, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    assert f"trace root  0x{expected}" in res.stdout
    same_tree(tmp_path / "lib", tmp_path / "cli")
