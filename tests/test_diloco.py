"""Collaborative (DiLoCo) rounds, issue 13: spec, shards, inner runs, the outer step.

Real training of a small char LM on the bundled text; nothing is mocked."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import save_file

from node.datasets import Dataset, pack_text, parse_dataset
from node.errors import IntegrityError, SpecError
from node.spec import (
    CollaborativeSpec,
    load_collaborative_spec,
    load_spec,
    parse_collaborative_spec,
    parse_collaborative_spec_json,
    parse_spec,
)
from node.train.diloco import (
    OuterState,
    RoundResult,
    check_outer,
    clip_scales,
    delta_norm,
    initial_outer_state,
    outer_hash,
    outer_step,
    run_round,
)
from node.train.inner import (
    Params,
    check_delta,
    delta_hash,
    inner_run,
    model_params,
    start_state,
)
from node.train.shards import (
    ShardContext,
    data_parallel_context,
    holdout_indices,
    shard_indices,
    worker_context,
)
from node.train.step import TrainContext, batch_indices, init_state, train_step

ROOT = Path(__file__).resolve().parent.parent
SLOTS = 4


@pytest.fixture(scope="module")
def text() -> Dataset:
    return parse_dataset(pack_text())


def collab_dict(dataset_hash: str) -> dict[str, Any]:
    # d_ff 768: ff1/ff2 hold 36,864 > 32,768 coordinates (torch's grain size), so
    # elementwise ops on them really are split across threads.
    return {
        "kind": "collaborative", "name": "tiny-diloco",
        "inner": {"model": {"family": "transformer_lm", "vocab_size": 128, "context": 16,
                            "d_model": 48, "n_heads": 2, "n_layers": 1, "d_ff": 768},
                  "dataset_hash": dataset_hash, "optimizer": {"name": "adamw", "lr": 3e-3},
                  "batch_size": 4, "total_steps": 9, "checkpoint_interval": 3, "seed": 7},
        "workers": {"min": 2, "max": SLOTS}, "inner_steps": 3, "outer_rounds": 3,
        "outer_optimizer": {"lr": 0.7, "momentum": 0.9}, "holdout_samples": 256,
    }


@pytest.fixture(scope="module")
def spec(text: Dataset) -> CollaborativeSpec:
    return parse_collaborative_spec(collab_dict(text.hash_hex))


@pytest.fixture(scope="module")
def contexts(spec: CollaborativeSpec, text: Dataset) -> list[ShardContext]:
    return [worker_context(spec, text, s) for s in range(SLOTS)]


@pytest.fixture(scope="module")
def rounds(spec: CollaborativeSpec, contexts: list[ShardContext]) -> list[RoundResult]:
    """Rounds 0 and 1: round 1 starts from a non-zero outer momentum."""
    r0 = run_round(initial_outer_state(spec), contexts, spec.outer_optimizer)
    return [r0, run_round(r0.state, contexts, spec.outer_optimizer)]


def deltas_of(result: RoundResult) -> dict[int, Params]:
    return {s: r.delta for s, r in result.runs.items()}


# --- spec ---------------------------------------------------------------------------


def test_spec_hashes_canonically_and_loads_from_files(spec: CollaborativeSpec,
                                                      tmp_path: Path) -> None:
    again = parse_collaborative_spec_json(spec.canonical_json())
    assert again == spec and again.spec_hash() == spec.spec_hash()
    assert len(spec.spec_hash()) == 32
    assert spec.outer_optimizer.lr == 0.7 and spec.outer_optimizer.momentum == 0.9
    # The inner job is an ordinary JobSpec with the same hash as on its own.
    assert parse_spec(spec.inner.model_dump(mode="json")).spec_hash() == spec.inner.spec_hash()
    path = tmp_path / "collab.json"
    path.write_bytes(spec.canonical_json())
    assert load_collaborative_spec(path) == spec


@pytest.mark.parametrize("path, value, field", [
    ("inner.total_steps", 12, "inner.total_steps"),      # must be H x R
    ("inner_steps", 2, "inner.total_steps"),
    ("workers.min", 5, "workers.min"),                   # min > max
    ("workers.max", 0, "workers.max"),
    ("outer_optimizer.momentum", 1.0, "outer_optimizer.momentum"),
    ("outer_optimizer.lr", 0.0, "outer_optimizer.lr"),
    ("kind", "solo", "kind"),
    ("inner.model.d_model", 47, "inner.model.n_heads"),  # inner spec checks still apply
    ("surprise", 1, "surprise"),
])
def test_bad_collaborative_spec_rejected_with_field(text: Dataset, path: str, value: Any,
                                                    field: str) -> None:
    d = collab_dict(text.hash_hex)
    *parents, last = path.split(".")
    node = d
    for p in parents:
        node = node[p]
    node[last] = value
    with pytest.raises(SpecError) as err:
        parse_collaborative_spec(d)
    assert err.value.field == field


def test_inner_steps_must_be_whole_segments(text: Dataset) -> None:
    d = collab_dict(text.hash_hex)
    d["inner"]["checkpoint_interval"] = 9  # divides T = 9 but not H = 3
    with pytest.raises(SpecError) as err:
        parse_collaborative_spec(d)
    assert err.value.field == "inner_steps"


def test_single_solver_spec_does_not_take_collaborative_fields(text: Dataset) -> None:
    with pytest.raises(SpecError):
        parse_spec(collab_dict(text.hash_hex))


def test_example_is_lm_text_in_four_slots(text: Dataset) -> None:
    spec = load_collaborative_spec(ROOT / "examples" / "collab_lm_text.toml")
    solo = load_spec(ROOT / "examples" / "lm_text.toml")
    assert spec.inner.model == solo.model and spec.inner.optimizer == solo.optimizer
    assert spec.inner.dataset_hash == text.hash_hex == solo.dataset_hash
    assert (spec.workers.max, spec.inner_steps, spec.outer_rounds) == (4, 50, 20)
    assert parse_collaborative_spec_json(spec.canonical_json()).spec_hash() == spec.spec_hash()
    worker_context(spec, text, 3)  # four shards of 50 x 16 windows fit


# --- shards -------------------------------------------------------------------------


def test_shards_are_disjoint_deterministic_and_spare_the_holdout(
        spec: CollaborativeSpec, contexts: list[ShardContext]) -> None:
    n = contexts[0].num_samples
    held = set(holdout_indices(spec, n).tolist())
    assert len(held) == spec.holdout_samples
    by_round = []
    for t in range(spec.outer_rounds):
        shards = [shard_indices(spec, n, t, s) for s in range(SLOTS)]
        flat = torch.cat(shards).tolist()
        assert len(flat) == len(set(flat)) == SLOTS * spec.inner_steps * spec.inner.batch_size
        assert not held & set(flat)
        for s in range(SLOTS):
            assert torch.equal(shards[s], shard_indices(spec, n, t, s))
        by_round.append(shards)
    assert not torch.equal(by_round[0][0], by_round[1][0])  # data moves between rounds


def test_contexts_feed_train_step_the_assigned_batches(spec: CollaborativeSpec,
                                                       contexts: list[ShardContext],
                                                       text: Dataset) -> None:
    h, b, n = spec.inner_steps, spec.inner.batch_size, contexts[0].num_samples
    dp = data_parallel_context(spec, text, range(SLOTS))
    for t in range(spec.outer_rounds):
        for j in range(1, h + 1):
            step = t * h + j
            per_slot = [batch_indices(c, step) for c in contexts]
            for s, got in enumerate(per_slot):
                assert torch.equal(got, shard_indices(spec, n, t, s)[(j - 1) * b:j * b])
            assert torch.equal(batch_indices(dp, step), torch.cat(per_slot))


def test_a_shard_too_small_for_the_round_is_refused(text: Dataset) -> None:
    d = collab_dict(text.hash_hex)
    windows = (text.tensors["tokens"].numel() - 1) // 16
    d["holdout_samples"] = windows - SLOTS * 3 * 4 + 1  # one sample short of 4 shards of H*B
    with pytest.raises(SpecError) as err:
        worker_context(parse_collaborative_spec(d), text, 0)
    assert err.value.field == "inner_steps"


# --- inner runs -----------------------------------------------------------------------


def test_theta_0_is_the_inner_jobs_initial_weights(spec: CollaborativeSpec,
                                                   text: Dataset) -> None:
    ref = model_params(init_state(TrainContext.create(spec.inner, text)))
    theta = initial_outer_state(spec).theta
    assert ref.keys() == theta.keys()
    assert all(torch.equal(ref[k], theta[k]) for k in ref)


def test_inner_run_is_a_pure_function_of_theta_round_and_slot(
        rounds: list[RoundResult], contexts: list[ShardContext], spec: CollaborativeSpec) -> None:
    start = initial_outer_state(spec)
    first = rounds[0].runs[2]
    again = inner_run(contexts[2], start.theta, 0)  # after other runs: no state carried
    assert delta_hash(again.delta, 0, 2) == delta_hash(first.delta, 0, 2)
    assert len(first.losses) == spec.inner_steps
    hashes = {delta_hash(r.delta, 0, s) for s, r in rounds[0].runs.items()}
    assert len(hashes) == SLOTS


# --- the outer step -------------------------------------------------------------------

_CHILD = """
import sys, torch
from safetensors.torch import load_file
from node.spec import parse_collaborative_spec_json
from node.train.diloco import OuterState, outer_hash, outer_step
torch.set_num_threads(1)
spec = parse_collaborative_spec_json(open(sys.argv[1], "rb").read())
t = load_file(sys.argv[2])
names = [k.removeprefix("theta.") for k in t if k.startswith("theta.")]
theta = {n: t["theta." + n] for n in names}
state = OuterState(1, theta, {n: t["momentum." + n] for n in names}, ())
deltas = {s: {n: t[f"delta{s}." + n] for n in names} for s in range(int(sys.argv[3]))}
clipped = spec.outer_optimizer.model_copy(update={"clip_ratio": 1.0})
print(torch.get_num_threads(), outer_hash(outer_step(state, deltas, spec.outer_optimizer)).hex(),
      outer_hash(outer_step(state, {s: d for s, d in deltas.items() if s != 1},
                            spec.outer_optimizer)).hex(),
      outer_hash(outer_step(state, deltas, clipped)).hex())
"""


def test_outer_step_is_bitwise_equal_across_thread_counts(rounds: list[RoundResult],
                                                          spec: CollaborativeSpec,
                                                          tmp_path: Path) -> None:
    state, deltas = rounds[0].state, deltas_of(rounds[1])
    assert any(bool(m.abs().max() > 0) for m in state.momentum.values())
    assert max(t.numel() for t in state.theta.values()) > 32_768
    tensors = {f"theta.{n}": t for n, t in state.theta.items()}
    tensors.update({f"momentum.{n}": t for n, t in state.momentum.items()})
    for s, d in deltas.items():
        tensors.update({f"delta{s}.{n}": t for n, t in d.items()})
    save_file(tensors, tmp_path / "round.safetensors")
    (tmp_path / "spec.json").write_bytes(spec.canonical_json())

    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        full = outer_hash(outer_step(state, deltas, spec.outer_optimizer))
        dropped = outer_hash(outer_step(state, {s: d for s, d in deltas.items() if s != 1},
                                        spec.outer_optimizer))
        # ratio 1: every delta above the lower median is scaled, so the exact norms and
        # the scaling are in the comparison too
        clip = spec.outer_optimizer.model_copy(update={"clip_ratio": 1.0})
        assert sum(v != 1.0 for v in clip_scales(deltas, 1.0).values()) >= 2
        clipped = outer_hash(outer_step(state, deltas, clip))
    finally:
        torch.set_num_threads(before)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-c", _CHILD, str(tmp_path / "spec.json"),
                          str(tmp_path / "round.safetensors"), str(SLOTS)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120, check=True).stdout.split()
    assert out == ["1", full.hex(), dropped.hex(), clipped.hex()]
    assert full == outer_hash(rounds[1].state) != clipped


def test_clipping_bounds_a_scaled_delta_and_leaves_honest_rounds_alone(
        rounds: list[RoundResult], spec: CollaborativeSpec) -> None:
    """A poisoned delta that got past verification (say a forged interior leaf the
    sample missed) moves the outer state by at most clip_ratio x the median delta."""
    state, honest = rounds[0].state, deltas_of(rounds[1])
    norms = {s: delta_norm(d) for s, d in honest.items()}
    median = sorted(norms.values())[(len(norms) - 1) // 2]
    loose = max(norms.values()) / median * 1.001  # binds on no honest delta
    clip = spec.outer_optimizer.model_copy(update={"clip_ratio": loose})
    assert clip_scales(honest, loose) == dict.fromkeys(honest, 1.0)
    assert outer_hash(outer_step(state, honest, clip)) == outer_hash(rounds[1].state)

    byzantine = {**honest, 3: {n: t * 50.0 for n, t in honest[3].items()}}
    scales = clip_scales(byzantine, 2.0)
    assert [scales[s] for s in (0, 1, 2)] == [1.0, 1.0, 1.0] and scales[3] < 1.0
    # the round's lower median: the second smallest of the three honest norms and the huge one
    second = sorted(norms[s] for s in (0, 1, 2))[1]
    assert scales[3] * delta_norm(byzantine[3]) == pytest.approx(2.0 * second, rel=1e-12)

    def distance(a: OuterState) -> float:
        return math.sqrt(sum(float((a.theta[n].double() - t.double()).square().sum())
                             for n, t in rounds[1].state.theta.items()))
    two = spec.outer_optimizer.model_copy(update={"clip_ratio": 2.0})
    unclipped = distance(outer_step(state, byzantine, spec.outer_optimizer))
    clipped = distance(outer_step(state, byzantine, two))
    assert clipped < unclipped / 10
    # the bound is part of the spec, so part of what every party recomputes
    assert check_outer(state.theta, state.momentum, byzantine,
                       outer_hash(outer_step(state, byzantine, two)), outer=two,
                       round_index=1)
    assert not check_outer(state.theta, state.momentum, byzantine,
                           outer_hash(outer_step(state, byzantine, two)),
                           outer=spec.outer_optimizer, round_index=1)


def test_outer_step_is_nesterov_sgd_on_the_mean_delta(rounds: list[RoundResult],
                                                      spec: CollaborativeSpec) -> None:
    """The rule is torch's SGD(nesterov=True) with the mean delta as the gradient."""
    state, deltas, new = rounds[0].state, deltas_of(rounds[1]), rounds[1].state
    params = {n: torch.nn.Parameter(t.double().clone()) for n, t in state.theta.items()}
    opt = torch.optim.SGD(params.values(), lr=0.7, momentum=0.9, nesterov=True)
    for n, p in params.items():
        opt.state[p]["momentum_buffer"] = state.momentum[n].double().clone()
        p.grad = torch.stack([d[n].double() for d in deltas.values()]).mean(0)
    opt.step()
    for n, p in params.items():
        torch.testing.assert_close(new.theta[n], p.detach().float(), rtol=0, atol=1e-6)
    assert new.round == 2 and new.slots == (0, 1, 2, 3)


def test_dropping_a_delta_changes_the_hash_and_recomputes_alike(
        rounds: list[RoundResult], spec: CollaborativeSpec) -> None:
    state, deltas = rounds[0].state, deltas_of(rounds[1])
    without = {s: d for s, d in deltas.items() if s != 2}
    full = outer_hash(rounds[1].state)
    a = outer_hash(outer_step(state, without, spec.outer_optimizer))
    b = outer_hash(outer_step(state, dict(reversed(list(without.items()))),
                              spec.outer_optimizer))  # insertion order does not matter
    assert a == b != full
    kw: dict[str, Any] = {"outer": spec.outer_optimizer, "round_index": 1}
    assert check_outer(state.theta, state.momentum, without, a, **kw)
    assert not check_outer(state.theta, state.momentum, deltas, a, **kw)
    assert not check_outer(state.theta, state.momentum, without, full, **kw)


def test_check_outer_is_exact_about_a_scaled_delta(rounds: list[RoundResult],
                                                   spec: CollaborativeSpec,
                                                   contexts: list[ShardContext]) -> None:
    state, honest = rounds[0].state, deltas_of(rounds[1])
    byzantine = {**honest, 3: {n: t * 10.0 for n, t in honest[3].items()}}
    kw: dict[str, Any] = {"outer": spec.outer_optimizer, "round_index": 1}
    honest_claim = outer_hash(rounds[1].state)
    byz_claim = outer_hash(outer_step(state, byzantine, spec.outer_optimizer))
    assert byz_claim != honest_claim
    # The outer check catches the scaled delta only where the claim did not use it...
    assert check_outer(state.theta, state.momentum, honest, honest_claim, **kw)
    assert not check_outer(state.theta, state.momentum, byzantine, honest_claim, **kw)
    assert not check_outer(state.theta, state.momentum, honest, byz_claim, **kw)
    # ...a claim built on it recomputes fine: the delta itself is judged by its inner run.
    assert check_outer(state.theta, state.momentum, byzantine, byz_claim, **kw)
    assert not check_delta(contexts[3], state.theta, 1, delta_hash(byzantine[3], 1, 3))
    assert check_delta(contexts[3], state.theta, 1, delta_hash(honest[3], 1, 3))
    # A one-ulp change to one coordinate is a different outer state too.
    nudged = {n: t.clone() for n, t in honest[0].items()}
    name = next(iter(nudged))
    nudged[name].view(-1)[0] = torch.nextafter(nudged[name].view(-1)[0], torch.tensor(1.0))
    assert not check_outer(state.theta, state.momentum, {**honest, 0: nudged}, honest_claim,
                           **kw)


def test_a_delta_that_is_not_the_workers_own_inner_run_is_detected(
        rounds: list[RoundResult], contexts: list[ShardContext]) -> None:
    state, runs = rounds[0].state, rounds[1].runs
    # Slot 1 sends slot 0's (honest, but other data's) delta under its own slot.
    assert not check_delta(contexts[1], state.theta, 1, delta_hash(runs[0].delta, 1, 1))
    # Slot 2 replays its round-0 delta in round 1 (or claims it for round 0).
    assert not check_delta(contexts[2], state.theta, 1, delta_hash(rounds[0].runs[2].delta, 1, 2))
    assert not check_delta(contexts[2], state.theta, 0, delta_hash(runs[2].delta, 0, 2))
    # Slot 3 was lazy: it trained only H - 1 of its inner steps.
    lazy = contexts[3]
    h = lazy.collab.inner_steps
    cheat = start_state(lazy, state.theta, h)
    for j in range(1, h):
        train_step(lazy, cheat, h + j)
    lazy_delta = {n: state.theta[n] - t for n, t in model_params(cheat).items()}
    assert not check_delta(contexts[3], state.theta, 1, delta_hash(lazy_delta, 1, 3))
    assert check_delta(contexts[3], state.theta, 1, delta_hash(runs[3].delta, 1, 3))


def test_malformed_deltas_are_refused(rounds: list[RoundResult],
                                      spec: CollaborativeSpec) -> None:
    state, deltas = rounds[0].state, deltas_of(rounds[1])
    name = next(iter(deltas[0]))
    poisoned = {n: t.clone() for n, t in deltas[0].items()}
    poisoned[name].view(-1)[3] = float("nan")
    wrong_shape = {**deltas[0], name: deltas[0][name][:1]}
    missing = {n: t for n, t in deltas[0].items() if n != name}
    kw: dict[str, Any] = {"outer": spec.outer_optimizer, "round_index": 1}
    claim = outer_hash(rounds[1].state)
    for bad in (poisoned, wrong_shape, missing):
        with pytest.raises(IntegrityError):
            outer_step(state, {**deltas, 0: bad}, spec.outer_optimizer)
        with pytest.raises(ValueError):  # IntegrityError is a ValueError too
            outer_step(state, {**deltas, 0: bad}, spec.outer_optimizer)
        assert not check_outer(state.theta, state.momentum, {**deltas, 0: bad}, claim, **kw)
    with pytest.raises(IntegrityError):
        outer_step(state, {}, spec.outer_optimizer)


def test_outer_state_hash_binds_round_and_slots(rounds: list[RoundResult]) -> None:
    s = rounds[1].state
    assert outer_hash(s) != outer_hash(OuterState(s.round + 1, s.theta, s.momentum, s.slots))
    assert outer_hash(s) != outer_hash(OuterState(s.round, s.theta, s.momentum, (0, 1, 2)))
    assert outer_hash(s) != outer_hash(OuterState(s.round, s.theta, s.theta, s.slots))
