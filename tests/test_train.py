"""Deterministic training on the real bundled data: same inputs -> same bits."""

from __future__ import annotations

import filecmp
import hashlib
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

from node.datasets import Dataset, load_dataset, pack_digits, pack_text, write_dataset
from node.errors import CheckpointError, IntegrityError, SpecError, TrainingError
from node.proof import state_hash
from node.spec import JobSpec, load_spec, parse_spec
from node.train.behavior import SegmentBehavior, get_behavior, register_behavior
from node.train.step import (
    TrainContext,
    TrainState,
    batch_indices,
    init_state,
    load_state,
    state_tensors,
    state_views,
    train_step,
)
from node.train.trace import (
    checkpoint_name,
    load_checkpoint,
    regenerate,
    regenerate_many,
    run_training,
)

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"


@pytest.fixture(scope="module")
def data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("data")
    write_dataset(pack_digits(), d / "digits.safetensors")
    write_dataset(pack_text(), d / "text.safetensors")
    return d


def spec_from(example: str, **changes: Any) -> JobSpec:
    d = load_spec(EXAMPLES / f"{example}.toml").model_dump(mode="json")
    for key, value in changes.items():
        if isinstance(value, dict):
            d[key] = {**d[key], **value}
        else:
            d[key] = value
    return parse_spec(d)


def tiny_lm(**changes: Any) -> JobSpec:
    """A ~40k-param 2-layer LM with dropout: LM behaviour at test speed."""
    base: dict[str, Any] = {"batch_size": 8, "total_steps": 30, "checkpoint_interval": 10}
    model = {"context": 32, "d_model": 32, "n_heads": 2, "d_ff": 64, "dropout": 0.1,
             **changes.pop("model", {})}
    return spec_from("lm_text", model=model, **{**base, **changes})


def ctx_for(spec: JobSpec, data_dir: Path) -> TrainContext:
    name = "text" if spec.model.family == "transformer_lm" else "digits"
    return TrainContext.create(spec, load_dataset(data_dir / f"{name}.safetensors",
                                                  spec.dataset_hash))


def reference_states(ctx: TrainContext) -> list[dict[str, torch.Tensor]]:
    """S_0..S_T from a plain loop, no trace machinery involved."""
    state = init_state(ctx)
    out = [state_tensors(state)]
    for t in range(1, ctx.spec.total_steps + 1):
        train_step(ctx, state, t)
        out.append(state_tensors(state))
    return out


def assert_bitwise(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].dtype == b[name].dtype and torch.equal(a[name], b[name]), name


def same_tree(a: Path, b: Path) -> None:
    names = sorted(p.name for p in a.iterdir())
    assert names == sorted(p.name for p in b.iterdir())
    for n in names:
        assert filecmp.cmp(a / n, b / n, shallow=False), n


@pytest.mark.parametrize("make", [lambda: spec_from("cnn_digits", total_steps=60),
                                  tiny_lm], ids=["cnn", "lm"])
def test_same_spec_twice_same_root_and_bytes(make: Any, data_dir: Path, tmp_path: Path) -> None:
    spec = make()
    m1 = run_training(ctx_for(spec, data_dir), tmp_path / "a", job_id=7)
    m2 = run_training(ctx_for(spec, data_dir), tmp_path / "b", job_id=7)
    assert m1.root == m2.root
    same_tree(tmp_path / "a", tmp_path / "b")
    assert len(m1.state_hashes) == spec.segment_count + 1
    assert m1.losses[-1] < m1.losses[0]  # it actually learns


def test_different_seed_or_job_gives_different_root(data_dir: Path, tmp_path: Path) -> None:
    spec = spec_from("mlp_digits", total_steps=40)
    m1 = run_training(ctx_for(spec, data_dir), tmp_path / "a", job_id=1)
    m2 = run_training(ctx_for(spec_from("mlp_digits", total_steps=40, seed=8), data_dir),
                      tmp_path / "b", job_id=1)
    m3 = run_training(ctx_for(spec, data_dir), tmp_path / "c", job_id=2)
    assert m1.state_hashes[0] != m2.state_hashes[0]  # init depends on the seed
    assert len({m1.root, m2.root, m3.root}) == 3
    assert m1.state_hashes == m3.state_hashes  # the job id is in the leaves only


@pytest.mark.parametrize("make", [tiny_lm, lambda: spec_from("mlp_digits", total_steps=40)],
                         ids=["lm-adamw-dropout", "mlp-sgd-cosine"])
def test_trace_and_regenerate_are_bitwise(make: Any, data_dir: Path, tmp_path: Path) -> None:
    spec = make()
    ctx = ctx_for(spec, data_dir)
    ref = reference_states(ctx)
    manifest = run_training(ctx, tmp_path, job_id=3)
    k = spec.checkpoint_interval
    assert manifest.state_hashes == [state_hash(ref[i * k]).hex()
                                     for i in range(spec.segment_count + 1)]
    rnd = random.Random(0)
    for step in [0, k, spec.total_steps, *rnd.sample(range(1, spec.total_steps), 5)]:
        assert_bitwise(regenerate(ctx, tmp_path, step), ref[step])
    # a dispute round's mids: several steps of one segment (and of the next, and a
    # checkpoint) in one walk, given out of order
    steps = [k + 3, k + 1, k + k // 2, 2 * k, 2 * k + 1, 1]
    many = regenerate_many(ctx, tmp_path, steps)
    assert sorted(many) == sorted(steps)
    for step in steps:
        assert_bitwise(many[step], ref[step])
    with pytest.raises(TrainingError, match="outside"):
        regenerate_many(ctx, tmp_path, [1, spec.total_steps + 1])


def test_global_rng_and_reloads_do_not_leak_into_steps(data_dir: Path) -> None:
    ctx = ctx_for(tiny_lm(total_steps=10), data_dir)
    ref = reference_states(ctx)
    state = init_state(ctx)
    for t in range(1, 11):
        torch.manual_seed(t * 1000 + 1)  # noise in the global RNG must not matter
        torch.rand(7)
        state = load_state(ctx, state_tensors(state), step=t - 1)  # round trip each step
        train_step(ctx, state, t)
    assert_bitwise(state_tensors(state), ref[10])


def test_dropout_masks_change_per_step(data_dir: Path) -> None:
    with_drop = ctx_for(tiny_lm(total_steps=10), data_dir)
    no_drop = ctx_for(tiny_lm(total_steps=10, model={"dropout": 0.0}), data_dir)
    s1, s2 = init_state(with_drop), init_state(no_drop)
    assert_bitwise(state_tensors(s1), state_tensors(s2))  # same S_0: dropout has no params
    train_step(with_drop, s1, 1)
    train_step(no_drop, s2, 1)
    assert not torch.equal(state_tensors(s1)["model.head.weight"],
                           state_tensors(s2)["model.head.weight"])


def test_batches_are_epoch_permutations(data_dir: Path) -> None:
    ctx = ctx_for(spec_from("mlp_digits"), data_dir)
    spe = ctx.steps_per_epoch
    epoch0 = torch.cat([batch_indices(ctx, t) for t in range(1, spe + 1)])
    epoch1 = torch.cat([batch_indices(ctx, t) for t in range(spe + 1, 2 * spe + 1)])
    assert len(set(epoch0.tolist())) == spe * ctx.spec.batch_size  # no repeats in an epoch
    assert not torch.equal(epoch0, epoch1)
    with pytest.raises(TrainingError):
        batch_indices(ctx, 0)


def test_train_step_refuses_wrong_step(data_dir: Path) -> None:
    ctx = ctx_for(spec_from("mlp_digits"), data_dir)
    with pytest.raises(TrainingError, match="step 0"):
        train_step(ctx, init_state(ctx), 2)


def test_load_state_rejects_foreign_tensors(data_dir: Path) -> None:
    ctx = ctx_for(spec_from("mlp_digits"), data_dir)
    good = state_tensors(init_state(ctx))
    with pytest.raises(CheckpointError, match="missing"):
        load_state(ctx, {k: v for k, v in good.items() if k != "model.head.bias"})
    with pytest.raises(CheckpointError, match="model.head.bias"):
        load_state(ctx, {**good, "model.head.bias": torch.zeros(3)})
    with pytest.raises(CheckpointError, match="step 0"):
        load_state(ctx, good, step=5)


class FreezeSegment(SegmentBehavior):
    """A lazy solver: claims segment 1 without training (just bumps the step)."""

    name = "test-freeze"

    def run_segment(self, ctx: TrainContext, state: TrainState, segment_index: int,
                    start_step: int, k: int) -> tuple[TrainState, float]:
        if segment_index != 1:
            return get_behavior("honest").run_segment(ctx, state, segment_index, start_step, k)
        state.step = start_step + k
        return state, 1.0


def test_training_continues_from_the_claimed_state(data_dir: Path, tmp_path: Path) -> None:
    register_behavior("test-freeze", FreezeSegment)
    spec = spec_from("mlp_digits", total_steps=30)
    ctx = ctx_for(spec, data_dir)
    manifest = run_training(ctx, tmp_path, 1, behavior=get_behavior("test-freeze"))
    s10, s20 = (load_checkpoint(tmp_path / checkpoint_name(s)).tensors for s in (10, 20))
    for name in s10:
        if name != "meta.step":
            assert torch.equal(s10[name], s20[name]), name
    assert manifest.losses[1] == 1.0
    # Segment 2 really trained from the claimed S_20, not from an honest one.
    assert_bitwise(regenerate(ctx, tmp_path, 30),
                   load_checkpoint(tmp_path / checkpoint_name(30)).tensors)
    assert manifest.state_hashes != run_training(ctx, tmp_path / "honest", 1).state_hashes


def test_dataset_pack_is_byte_identical_across_processes(data_dir: Path) -> None:
    code = ("import hashlib; from node.datasets import pack_digits, pack_text; "
            "print(hashlib.sha256(pack_digits()).hexdigest(), "
            "hashlib.sha256(pack_text()).hexdigest())")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True,
                         text=True, timeout=120, check=True).stdout.split()
    local = [hashlib.sha256((data_dir / f"{n}.safetensors").read_bytes()).hexdigest()
             for n in ("digits", "text")]
    assert out == local
    assert load_spec(EXAMPLES / "cnn_digits.toml").dataset_hash == local[0]
    assert load_spec(EXAMPLES / "lm_text.toml").dataset_hash == local[1]


def test_dataset_hash_is_checked(data_dir: Path) -> None:
    with pytest.raises(IntegrityError, match="polnet dataset pack"):
        load_dataset(data_dir / "text.safetensors", "0" * 64)
    digits: Dataset = load_dataset(data_dir / "digits.safetensors")
    assert digits.kind == "vision" and digits.tensors["x"].shape == (1797, 1, 8, 8)
    with pytest.raises(SpecError) as info:  # an LM spec cannot bind the digits
        TrainContext.create(tiny_lm(dataset_hash=digits.hash_hex), digits)
    assert info.value.field == "dataset_hash"


def test_honest_knobs_drift_little_and_keep_the_layout(data_dir: Path) -> None:
    """micro-batching, Adam kernels and an fp64 replay: tiny drift, same tensors.

    Mask equality under micro-batching shows as drift ~1e-5 of the update; a
    different mask would be ~1e-1."""
    spec = tiny_lm(total_steps=10)
    ds = load_dataset(data_dir / "text.safetensors")

    def run(**knobs: Any) -> dict[str, torch.Tensor]:
        ctx = TrainContext.create(spec, ds, **knobs)
        state = init_state(ctx)
        for t in range(1, 6):
            train_step(ctx, state, t)
        return state_tensors(state)

    def rel(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
        names = [n for n in a if n.startswith("model.")]
        diff = torch.cat([(a[n].double() - b[n].double()).flatten() for n in names]).norm()
        upd = torch.cat([(b[n].double() - s0[n].double()).flatten() for n in names]).norm()
        return float(diff / upd)

    s0 = state_tensors(init_state(TrainContext.create(spec, ds)))
    ref = run()
    assert_bitwise(run(optimizer_impl="foreach"), ref)  # bitwise on CPU (NOTES.md)
    for knobs in ({"micro_batches": 2}, {"optimizer_impl": "fused"},
                  {"compute_dtype": torch.float64}):
        got = run(**knobs)
        assert {n: (t.dtype, t.shape) for n, t in got.items()} == \
            {n: (t.dtype, t.shape) for n, t in ref.items()}
        assert 0 < rel(got, ref) < 1e-3, knobs
    with pytest.raises(TrainingError, match="divide"):
        TrainContext.create(spec, ds, micro_batches=3)


def test_state_views_hash_as_the_exported_copy(data_dir: Path) -> None:
    """The trace hashes a small state's live buffers (no copy): same bytes as the
    checkpoint export, in fp32 (views of the live tensors) and fp64 compute (cast)."""
    from node.proof import state_hash  # noqa: PLC0415

    ds = load_dataset(data_dir / "text.safetensors")
    for dtype in (torch.float32, torch.float64):
        ctx = TrainContext.create(tiny_lm(total_steps=10), ds, compute_dtype=dtype)
        state = init_state(ctx)
        for t in range(1, 4):
            train_step(ctx, state, t)
        views, copy = state_views(state), state_tensors(state)
        assert {n: (t.dtype, t.shape) for n, t in views.items()} == \
            {n: (t.dtype, t.shape) for n, t in copy.items()}, dtype
        assert state_hash(views) == state_hash(copy), dtype
        live = state.model.state_dict()["head.weight"]
        shares = views["model.head.weight"].data_ptr() == live.data_ptr()
        assert shares == (dtype == torch.float32), dtype  # fp64: a cast copy


def test_init_is_explicit_and_seeded() -> None:
    from node.train.models import build_model  # noqa: PLC0415

    cfg = tiny_lm().model
    a, b, c = build_model(cfg, 1), build_model(cfg, 1), build_model(cfg, 2)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[n], sb[n]) for n in sa)
    assert not torch.equal(sa["head.weight"], sc["head.weight"])
    for name, t in sa.items():
        if ".ln" in f".{name}" and name.endswith("weight"):
            assert torch.equal(t, torch.ones_like(t)), name
        elif name.endswith("bias"):
            assert torch.equal(t, torch.zeros_like(t)), name
