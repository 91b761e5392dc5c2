"""A worker's inner run in a collaborative round (issue 13) and the delta it sends.

The inner run of (round ``t``, slot ``i``) starts from the shared weights
``theta_t`` and applies ``node.train.step.train_step`` ``H`` times on the slot's
context (``node.train.shards``: its batches, its dropout seed), global steps
``t*H + 1 .. t*H + H``. It sends the pseudo-gradient
``delta_i = theta_t - theta_i`` (fp32, one rounded subtraction per coordinate).

Inner optimizer state: **reset every round** (zeroed moments, AdamW step counter 0),
not carried per slot. Then an inner run is a pure function of public things
(``theta_t``, the spec, ``t``, ``i``): a verifier replays it from the round's
committed ``theta_t`` without any of the worker's private history, and a slot whose
worker leaves can be taken over next round with nothing handed over (churn).
DiLoCo carries AdamW state per worker; the reset costs some quality (the moments
restart each round; bias correction keeps the first steps well-scaled), and the
bench (bench/collab.py) reports the result with the reset.

Parameters (``Params``) are the model's ``state_dict`` names to fp32 CPU tensors.

Public API::

    start_state(ctx, theta, step) -> TrainState     # theta loaded, optimizer zeroed
    inner_run(ctx, theta_t, round_index) -> InnerRun  # .theta, .delta, .losses
    delta_hash(delta, round_index, slot) -> bytes    # 32 bytes, node.proof.state_hash
    check_delta(ctx, theta_t, round_index, claimed_hash) -> bool  # exact replay
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

import torch

from node.errors import CheckpointError, TrainingError
from node.proof import state_hash
from node.train.shards import ShardContext
from node.train.step import TrainContext, TrainState, init_state, state_tensors, train_step

Params = dict[str, torch.Tensor]
_MODEL = "model."


@dataclass(frozen=True)
class InnerRun:
    round_index: int
    slot: int
    theta: Params        # theta_i after H inner steps
    delta: Params        # theta_t - theta_i
    losses: list[float]  # one per inner step


def start_state(ctx: TrainContext, theta: Mapping[str, torch.Tensor], step: int) -> TrainState:
    """A train state at ``step`` holding ``theta`` with a zeroed optimizer state."""
    state = init_state(ctx)
    own = state.model.state_dict()
    if own.keys() != theta.keys():
        raise CheckpointError(f"weights do not fit this model: missing "
                              f"{sorted(own.keys() - theta.keys())[:5]}, unexpected "
                              f"{sorted(theta.keys() - own.keys())[:5]}")
    with torch.no_grad():
        for name, t in own.items():
            if theta[name].shape != t.shape:
                raise CheckpointError(f"{name}: shape {list(theta[name].shape)} where the "
                                      f"model has {list(t.shape)}")
            t.copy_(theta[name])
    state.step = step
    return state


def model_params(state: TrainState) -> Params:
    """The weights of ``state`` as fp32 CPU copies (``state_tensors``' export rule)."""
    return {k.removeprefix(_MODEL): v for k, v in state_tensors(state).items()
            if k.startswith(_MODEL)}


def inner_run(ctx: ShardContext, theta_t: Mapping[str, torch.Tensor],
              round_index: int) -> InnerRun:
    if len(ctx.slots) != 1:
        raise TrainingError("an inner run is one slot's: use node.train.shards.worker_context")
    h = ctx.collab.inner_steps
    state = start_state(ctx, theta_t, round_index * h)
    losses = [train_step(ctx, state, round_index * h + j) for j in range(1, h + 1)]
    theta_i = model_params(state)
    delta = {n: theta_t[n].to(torch.float32) - theta_i[n] for n in theta_i}
    return InnerRun(round_index, ctx.slots[0], theta_i, delta, losses)


def delta_hash(delta: Mapping[str, torch.Tensor], round_index: int, slot: int) -> bytes:
    """What a worker commits for its delta: bound to its round and slot, so a delta
    cannot be replayed into another round or passed off as another slot's."""
    tensors = {f"delta.{n}": t for n, t in delta.items()}
    tensors["meta.round"] = torch.tensor(round_index, dtype=torch.int64)
    tensors["meta.slot"] = torch.tensor(slot, dtype=torch.int64)
    return state_hash(tensors)


def check_delta(ctx: ShardContext, theta_t: Mapping[str, torch.Tensor], round_index: int,
                claimed_hash: bytes) -> bool:
    """Replay the slot's inner run from ``theta_t`` and compare delta hashes exactly.

    Exact equality holds for a replay with the worker's own knobs (the reference:
    ``threads=1``, ``optimizer_impl="single"``, fp32). A replay on other hardware
    needs the tolerance check of verifier/tolerance.py on ``theta_i`` instead (not
    built yet for rounds)."""
    run = inner_run(ctx, theta_t, round_index)
    return delta_hash(run.delta, round_index, run.slot) == claimed_hash
