"""Warm-started collaborative jobs (issue 13): theta_0 from a file the spec names.

Real weights of the demo's char LM, real files; the e2e test (tests/test_collab_e2e.py)
runs a warm-started job through the network, with every node fetching the file."""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from node.datasets import Dataset, pack_text, parse_dataset, write_dataset
from node.demo_collab import collab_spec_dict, warm_start_inputs
from node.errors import CheckpointError, ConfigError, IntegrityError, SpecError
from node.proof import file_sha256
from node.roles.collab_submit import CollabRequest, check_collab_request, collab_initial_hashes
from node.spec import CollaborativeSpec, load_collaborative_spec, parse_collaborative_spec
from node.train.diloco import initial_outer_state, outer_hash
from node.train.init_weights import (
    expected_layout,
    load_init_weights,
    max_file_bytes,
    write_init_weights,
)
from node.train.inner import start_state
from node.train.shards import worker_context
from node.train.step import state_tensors, train_step

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_SPEC_HASH = "dc08f24405ea7ac1e8a4850f2cfd93e23ce88d8c5b7bb4bb930c8456246171ae"


@pytest.fixture(scope="module")
def text() -> Dataset:
    return parse_dataset(pack_text())


def spec_with(ds: Dataset, init: str | None = None) -> CollaborativeSpec:
    d: dict[str, Any] = collab_spec_dict(ds.hash_hex, 2)
    if init is not None:
        d["init_weights"] = init
    return parse_collaborative_spec(d)


def theta_of(spec: CollaborativeSpec, shift: float = 0.0) -> dict[str, torch.Tensor]:
    return {n: t + shift for n, t in initial_outer_state(spec).theta.items()}


def test_a_spec_without_init_weights_hashes_as_before_the_field() -> None:
    # The example's hash from before init_weights existed: posted jobs keep theirs.
    spec = load_collaborative_spec(ROOT / "examples" / "collab_lm_text.toml")
    assert spec.init_weights is None
    assert spec.spec_hash_hex() == EXAMPLE_SPEC_HASH
    assert b"init_weights" not in spec.canonical_json()
    warm = spec.model_copy(update={"init_weights": "ab" * 32})
    assert warm.spec_hash_hex() != EXAMPLE_SPEC_HASH
    assert b'"init_weights":"' + b"ab" * 32 + b'"' in warm.canonical_json()


def test_init_weights_must_be_a_sha256(text: Dataset) -> None:
    with pytest.raises(SpecError) as err:
        spec_with(text, "0x" + "ab" * 32)
    assert err.value.field == "init_weights" and "sha256" in str(err.value)


def test_a_warm_started_job_starts_from_the_file(text: Dataset, tmp_path: Path) -> None:
    seeded = spec_with(text)
    theta = theta_of(seeded, 0.25)
    path = tmp_path / "init.safetensors"
    digest = write_init_weights(theta, path)
    assert digest == file_sha256(path) and path.stat().st_size <= max_file_bytes(
        seeded.inner.model)
    warm = spec_with(text, digest)
    state = initial_outer_state(warm, path)
    assert state.round == 0 and state.slots == ()
    for n, t in theta.items():
        assert torch.equal(state.theta[n], t) and not state.momentum[n].any()
    # Every party that loads the file gets the same outer hash, not the seeded one's.
    assert outer_hash(state) == outer_hash(initial_outer_state(warm, path))
    assert outer_hash(state) != outer_hash(initial_outer_state(seeded))
    # The chain's round-0 commitments follow the file too.
    ds_path = tmp_path / "text.safetensors"
    write_dataset(pack_text(), ds_path)
    assert collab_initial_hashes(warm, ds_path, path) != collab_initial_hashes(seeded, ds_path)
    with pytest.raises(ConfigError, match="--init-weights"):
        initial_outer_state(warm)


def _bad_files(spec: CollaborativeSpec, tmp: Path) -> dict[str, tuple[Path, type[Exception]]]:
    theta = theta_of(spec)
    name = next(iter(theta))
    out: dict[str, tuple[Path, type[Exception]]] = {}
    missing = dict(theta)
    del missing[name]
    extra = {**theta, "head.bias2": torch.zeros(3)}
    shape = {**theta, name: torch.zeros(3)}
    nan = {**theta, name: theta[name].clone().fill_(math.nan)}
    for label, tensors in (("missing", missing), ("extra", extra), ("shape", shape),
                           ("nan", nan)):
        p = tmp / f"{label}.safetensors"
        write_init_weights(tensors, p)
        out[label] = (p, CheckpointError)
    wide = tmp / "f64.safetensors"
    save_file({"model." + n: t.double() for n, t in theta.items()}, str(wide))
    out["f64"] = (wide, CheckpointError)
    garbage = tmp / "garbage.safetensors"
    garbage.write_bytes((10**12).to_bytes(8, "little") + b"{}")
    out["garbage"] = (garbage, CheckpointError)
    good = tmp / "good.safetensors"
    write_init_weights(theta, good)
    cut = tmp / "cut.safetensors"
    cut.write_bytes(good.read_bytes()[:-100])
    out["truncated"] = (cut, CheckpointError)
    return out


def test_a_bad_init_file_is_refused_with_its_reason(text: Dataset, tmp_path: Path) -> None:
    seeded = spec_with(text)
    for label, (path, exc) in _bad_files(seeded, tmp_path).items():
        spec = spec_with(text, file_sha256(path))  # the spec names exactly this file
        with pytest.raises(exc) as err:
            load_init_weights(spec, path)
        assert path.name in str(err.value), label
    good = tmp_path / "good.safetensors"
    other = spec_with(text, "cd" * 32)  # the file is fine but not the one named
    with pytest.raises(IntegrityError, match="not the spec's init_weights"):
        load_init_weights(other, good)


def test_submit_checks_the_file_against_the_spec(text: Dataset, tmp_path: Path) -> None:
    ds_path = tmp_path / "text.safetensors"
    write_dataset(pack_text(), ds_path)
    init = tmp_path / "init.safetensors"
    digest = write_init_weights(theta_of(spec_with(text), 0.1), init)
    other = tmp_path / "other.safetensors"
    write_init_weights(theta_of(spec_with(text), 0.2), other)

    def req(spec: dict[str, Any], path: Path | None) -> CollabRequest:
        p = tmp_path / "spec.json"
        p.write_text(json.dumps(spec))
        return CollabRequest(p, ds_path, 10**20, 10**18, 60, path)

    plain = collab_spec_dict(text.hash_hex, 2)
    warm = {**plain, "init_weights": digest}
    assert check_collab_request(req(warm, init)).init_weights == digest
    assert check_collab_request(req(plain, None)).init_weights is None
    with pytest.raises(ConfigError, match="--init-weights"):
        check_collab_request(req(warm, None))
    with pytest.raises(SpecError) as err:
        check_collab_request(req(warm, other))
    assert err.value.field == "init_weights" and file_sha256(other) in str(err.value)
    with pytest.raises(SpecError) as err:  # a file for a spec that starts from its seed
        check_collab_request(req(plain, init))
    assert err.value.field == "init_weights" and digest in str(err.value)
    with pytest.raises(ConfigError, match="does not exist"):
        check_collab_request(req(warm, tmp_path / "nope.safetensors"))


def polnet(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "node.cli.main", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_cli_turns_a_checkpoint_into_init_weights(text: Dataset, tmp_path: Path) -> None:
    """`polnet job init-weights`: a trained job's checkpoint (weights, optimizer state,
    step) becomes theta_0 of a collaborative spec."""
    spec = spec_with(text)
    ctx = worker_context(spec, text, 0)
    state = start_state(ctx, initial_outer_state(spec).theta, 0)
    for step in range(1, 4):
        train_step(ctx, state, step)
    ckpt = tmp_path / "ckpt.safetensors"
    tensors = state_tensors(state)
    assert any(n.startswith("optim.") for n in tensors)
    save_file(tensors, str(ckpt))
    spec_path = tmp_path / "collab.json"
    spec_path.write_text(json.dumps(collab_spec_dict(text.hash_hex, 2)))
    out = tmp_path / "init.safetensors"
    # A real process: the CLI configures logging for its own stderr, not pytest's.
    res = polnet("job", "init-weights", str(ckpt), "--spec", str(spec_path), "--out", str(out))
    assert res.returncode == 0, res.stderr
    digest = file_sha256(out)
    assert f'init_weights = "{digest}"' in res.stdout
    theta = load_init_weights(spec_with(text, digest), out)
    assert set(theta) == {n.removeprefix("model.") for n in expected_layout(spec.inner.model)}
    for n, t in theta.items():
        assert torch.equal(t, tensors["model." + n])
    # A checkpoint of another model is refused, naming what does not fit.
    small = {**collab_spec_dict(text.hash_hex, 2)}
    small["inner"] = {**small["inner"], "model": {**small["inner"]["model"], "d_model": 32}}
    spec_path.write_text(json.dumps(small))
    res = polnet("job", "init-weights", str(ckpt), "--spec", str(spec_path),
                 "--out", str(tmp_path / "x.safetensors"))
    assert res.returncode != 0
    assert "where the spec's model needs" in res.stdout + res.stderr
    assert not (tmp_path / "x.safetensors").exists()


def test_demo_warm_start_writes_a_spec_that_names_its_file(text: Dataset,
                                                           tmp_path: Path) -> None:
    from node.demo_collab import write_collab_inputs

    spec_path, ds_path = write_collab_inputs(tmp_path, 2)
    init = warm_start_inputs(spec_path, ds_path, 5)
    spec = load_collaborative_spec(spec_path)
    assert spec.init_weights == file_sha256(init)
    seeded = spec_with(text)
    assert spec.spec_hash() != seeded.spec_hash()
    assert outer_hash(initial_outer_state(spec, init)) != outer_hash(initial_outer_state(seeded))
