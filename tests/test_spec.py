"""Job specs: strict validation with the offending field named, canonical hashing."""

from __future__ import annotations

import copy
import json
import tomllib
from pathlib import Path
from typing import Any

import pytest

from node.errors import SpecError
from node.proof import content_hash
from node.spec import MAX_CHECKPOINT_INTERVAL, TOLERANCE_DEFAULTS, load_spec, parse_spec

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


@pytest.fixture
def base() -> dict[str, Any]:
    return load_spec(EXAMPLES / "cnn_digits.toml").model_dump(mode="json")


def set_path(d: dict[str, Any], dotted: str, value: Any) -> dict[str, Any]:
    d = copy.deepcopy(d)
    *parents, last = dotted.split(".")
    cur = d
    for p in parents:
        cur = cur[p]
    cur[last] = value
    return d


@pytest.mark.parametrize("name", ["cnn_digits", "lm_text", "mlp_digits"])
def test_examples_load_and_hash_canonically(name: str, tmp_path: Path) -> None:
    spec = load_spec(EXAMPLES / f"{name}.toml")
    assert spec.spec_hash() == content_hash(json.loads(spec.canonical_json()))
    # The same spec as JSON (any key order, any whitespace) hashes the same.
    as_json = tmp_path / "spec.json"
    as_json.write_text(json.dumps(json.loads(spec.canonical_json()), indent=3))
    assert load_spec(as_json).spec_hash() == spec.spec_hash()
    assert spec.estimated_memory_mb() <= spec.resources.max_memory_mb


def test_int_and_float_literals_hash_alike(base: dict[str, Any]) -> None:
    a = parse_spec(set_path(base, "optimizer.lr", 1))
    b = parse_spec(set_path(base, "optimizer.lr", 1.0))
    assert a.spec_hash() == b.spec_hash()


def test_tolerance_defaults_follow_precision(base: dict[str, Any]) -> None:
    base.pop("tolerance")
    fp32 = parse_spec(base)
    bf16 = parse_spec({**base, "precision": "bf16"})
    assert fp32.tolerance.rho == TOLERANCE_DEFAULTS["fp32"]["rho"] == 1e-3
    assert bf16.tolerance.rho == TOLERANCE_DEFAULTS["bf16"]["rho"] > fp32.tolerance.rho
    partial = parse_spec({**base, "tolerance": {"rho": 5e-3}})
    assert partial.tolerance.rho == 5e-3 and partial.tolerance.abs_tol == 1e-7
    assert fp32.spec_hash() != bf16.spec_hash()  # the resolved policy is part of the hash


def test_cnn_activation_defaults_to_silu_and_is_hashed(base: dict[str, Any]) -> None:
    assert "activation" not in tomllib.loads((EXAMPLES / "cnn_digits.toml").read_text())["model"]
    spec = parse_spec(base)
    assert spec.model.activation == "silu"  # type: ignore[union-attr]
    relu = parse_spec(set_path(base, "model.activation", "relu"))
    assert relu.spec_hash() != spec.spec_hash()  # a different model is a different job


def test_detection_target_gives_44_samples(base: dict[str, Any]) -> None:
    assert parse_spec(base).detection.samples() == 44


BAD = [
    ("unknown top-level field", "colour", "blue", "colour"),
    ("unknown nested field", "optimizer.momentum_typo", 0.9, "optimizer.momentum_typo"),
    ("negative lr", "optimizer.lr", -0.1, "optimizer.lr"),
    ("zero lr", "optimizer.lr", 0.0, "optimizer.lr"),
    ("T not multiple of k", "total_steps", 205, "checkpoint_interval"),
    ("k too large", "checkpoint_interval", MAX_CHECKPOINT_INTERVAL + 1, "checkpoint_interval"),
    ("unknown family", "model.family", "rnn", "model.family"),
    ("unknown optimizer", "optimizer.name", "lion", "optimizer.name"),
    ("bad hash: short", "dataset_hash", "abc123", "dataset_hash"),
    ("bad hash: 0x", "dataset_hash", "0x" + "a" * 64, "dataset_hash"),
    ("bad hash: upper", "dataset_hash", "A" * 64, "dataset_hash"),
    ("string for int", "batch_size", "64", "batch_size"),
    ("float for int", "total_steps", 200.0, "total_steps"),
    ("negative seed", "seed", -1, "seed"),
    ("precision", "precision", "fp8", "precision"),
    ("dropout 1", "model.dropout", 1.0, "model.dropout"),
    ("empty channels", "model.channels", [], "model.channels"),
    ("bad channel", "model.channels", [32, "x"], "model.channels.1"),
    ("unknown activation", "model.activation", "tanh", "model.activation"),
    ("image not poolable", "model.image_size", 10, "model.image_size"),
    ("rho <= 0", "tolerance.rho", 0.0, "tolerance.rho"),
    ("fraction 1", "detection.fraction", 1.0, "detection.fraction"),
    ("too big for memory", "model.channels", [4096, 4096], "resources.max_memory_mb"),
]


@pytest.mark.parametrize(("what", "path", "value", "field"), BAD, ids=[b[0] for b in BAD])
def test_bad_spec_rejected_with_field(base: dict[str, Any], what: str, path: str, value: Any,
                                      field: str) -> None:
    with pytest.raises(SpecError) as info:
        parse_spec(set_path(base, path, value))
    assert info.value.field == field, str(info.value)
    assert str(info.value).startswith(f"{field}: ")


def test_transformer_heads_must_divide_width() -> None:
    d = load_spec(EXAMPLES / "lm_text.toml").model_dump(mode="json")
    with pytest.raises(SpecError) as info:
        parse_spec(set_path(d, "model.n_heads", 5))
    assert info.value.field == "model.n_heads"
    with pytest.raises(SpecError) as info:  # ~3.5B params cannot fit the declared 1 GB
        parse_spec(set_path(d, "model.d_model", 16_384))
    assert info.value.field == "resources.max_memory_mb"


def test_missing_required_field(base: dict[str, Any]) -> None:
    del base["seed"]
    with pytest.raises(SpecError) as info:
        parse_spec(base)
    assert info.value.field == "seed"


def test_bad_files(tmp_path: Path) -> None:
    p = tmp_path / "s.toml"
    p.write_text("seed = [")
    with pytest.raises(SpecError, match="not valid TOML"):
        load_spec(p)
    j = tmp_path / "s.json"
    j.write_text("[1, 2]")
    with pytest.raises(SpecError, match="JSON object"):
        load_spec(j)
    with pytest.raises(SpecError, match="cannot read"):
        load_spec(tmp_path / "missing.toml")


def test_spec_is_immutable(base: dict[str, Any]) -> None:
    from pydantic import ValidationError  # noqa: PLC0415

    spec = parse_spec(base)
    with pytest.raises(ValidationError):
        spec.seed = 2  # type: ignore[misc]


@pytest.mark.parametrize("name", ["cnn_digits", "lm_text", "mlp_digits"])
def test_analytic_param_count_matches_model(name: str) -> None:
    from node.train.models import build_model  # noqa: PLC0415

    spec = load_spec(EXAMPLES / f"{name}.toml")
    model = build_model(spec.model, 0)
    assert sum(p.numel() for p in model.parameters()) == spec.model.param_count()
