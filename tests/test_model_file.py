"""A fetched model loads by itself: weights + the job's spec in one file, rebuilt
bit for bit (issue 14)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from node.datasets import pack_digits, pack_text, parse_dataset
from node.errors import MalformedInput, PolnetError
from node.spec import JobSpec, load_spec, parse_spec
from node.train.models import load_model, model_spec, save_model
from node.train.step import TrainContext, init_state, state_tensors, train_step

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def spec_from(example: str, **changes: Any) -> JobSpec:
    d = load_spec(EXAMPLES / f"{example}.toml").model_dump(mode="json")
    for key, value in changes.items():
        d[key] = {**d[key], **value} if isinstance(value, dict) else value
    return parse_spec(d)


DIGITS = pack_digits()
CASES = {
    # relu: the activation is part of the architecture the file must carry
    "cnn-relu": (spec_from("cnn_digits", model={"activation": "relu", "dropout": 0.1}), DIGITS),
    "mlp": (spec_from("mlp_digits"), DIGITS),
    "lm": (spec_from("lm_text", model={"context": 16, "d_model": 16, "n_heads": 2, "d_ff": 32,
                                       "n_layers": 1}, batch_size=4), pack_text()),
}


def _trained(spec: JobSpec, raw: bytes, steps: int = 3) -> tuple[TrainContext, Any]:
    d = spec.model_dump(mode="json")
    spec = parse_spec({**d, "total_steps": steps, "checkpoint_interval": 1,
                       "schedule": {**d["schedule"], "warmup_steps": 0},
                       "dataset_hash": hashlib.sha256(raw).hexdigest()})
    ctx = TrainContext.create(spec, parse_dataset(raw))
    state = init_state(ctx)
    for t in range(1, steps + 1):
        train_step(ctx, state, t)
    return ctx, state


@pytest.mark.parametrize("case", sorted(CASES))
def test_fetched_model_loads_to_the_same_bits(tmp_path: Path, case: str) -> None:
    spec, raw = CASES[case]
    ctx, state = _trained(spec, raw)
    path = save_model(tmp_path / "model.safetensors", state_tensors(state), ctx.spec,
                      job_id=7, state_hash="00" * 32)  # as `polnet job fetch` does
    model = load_model(path)
    assert model_spec(path) == ctx.spec
    ds = ctx.dataset
    x = ds.tensors["x"][:16] if ds.kind == "vision" else \
        ds.tensors["tokens"][:32].long().view(2, 16)
    state.model.eval()
    with torch.no_grad():
        want, got = state.model(x), model(x)
    assert torch.equal(want, got)
    assert not model.training
    # The file is plain safetensors: the weights under their module names, nothing else.
    from safetensors import safe_open

    with safe_open(str(path), "pt") as f:
        assert set(f.keys()) == set(model.state_dict())
        meta = json.loads(f.metadata()["polnet"])
    assert meta["job_id"] == 7 and meta["spec_hash"] == ctx.spec.spec_hash_hex()


def test_files_that_are_not_polnet_models_say_how_to_get_one(tmp_path: Path) -> None:
    spec, raw = CASES["mlp"]
    ctx, state = _trained(spec, raw, steps=1)
    weights = {k.removeprefix("model."): v for k, v in state_tensors(state).items()
               if k.startswith("model.")}
    old = tmp_path / "old.safetensors"
    save_file(weights, str(old), metadata={"job_id": "1"})  # what fetch wrote before
    with pytest.raises(MalformedInput, match="polnet job fetch"):
        load_model(old)
    good = save_model(tmp_path / "good.safetensors", weights, ctx.spec)
    other = parse_spec({**ctx.spec.model_dump(mode="json"),
                        "model": {**ctx.spec.model.model_dump(mode="json"), "hidden": [8]}})
    lying = save_model(tmp_path / "lying.safetensors", weights, other)  # spec != weights
    assert isinstance(load_model(good), torch.nn.Module)
    with pytest.raises(MalformedInput, match="do not fit"):
        load_model(lying)
    (tmp_path / "junk.safetensors").write_bytes(b"\x00" * 5)
    with pytest.raises(PolnetError, match="too short"):
        load_model(tmp_path / "junk.safetensors")
    with pytest.raises(MalformedInput, match="cannot be read"):
        load_model(tmp_path / "missing.safetensors")
