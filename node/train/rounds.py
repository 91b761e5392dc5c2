"""A collaborative round's inner run as an ordinary trace (issue 13, chain side).

On chain every (round ``t``, slot ``i``) inner run is a JobMarket job of its own (a
"sub-job", reserved for the slot's worker by the CollabMarket): ``T = H`` steps,
checkpoint interval ``k`` = ``inner.checkpoint_interval``, and S_0 the round's start
state (``theta_t`` with a zeroed inner optimizer, step 0), whose hash the CollabMarket
fixes from the round's accepted outer state. So its trace is numbered ``0 .. H`` like
any job's, and the solver's recorder, the verifier's segment replay, bisection and the
jury all run on it unchanged. The round context keeps the job-wide numbering where it
matters: data (slot ``i``'s shard of round ``t``), dropout and the learning rate are
those of global step ``t * H + h`` (``TrainContext.step_offset``), so the sub-job's
final weights are bit for bit ``node.train.inner.inner_run``'s.

Public API::

    round_context(spec, dataset, round_index, slot, threads=1) -> ShardContext
    round_start_state(ctx, theta_t) -> TrainState     # S_0 of the sub-job
    round_initial_hash(ctx, theta_t) -> bytes         # its state hash, fixed on chain
    final_weights(tensors) -> Params                  # theta_i from the final leaf's state
    delta_from_final(theta_t, tensors) -> Params      # theta_t - theta_i
    heldout_loss(ctx, theta, held) -> float           # mean LM loss on held-out windows
    sequential(ctx, theta_0, steps) -> TrainState     # one worker alone: the baseline
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import replace

import torch

from node.datasets import Dataset
from node.errors import TrainingError
from node.proof import state_hash
from node.spec import CollaborativeSpec, parse_spec
from node.train.inner import Params, start_state
from node.train.shards import ShardContext, worker_context
from node.train.step import OptimizerImpl, TrainState, state_tensors, train_step

_MODEL = "model."


def round_context(spec: CollaborativeSpec, dataset: Dataset, round_index: int, slot: int,
                  threads: int = 1, optimizer_impl: OptimizerImpl = "single",
                  compute_dtype: torch.dtype = torch.float32) -> ShardContext:
    """The context of slot ``slot``'s sub-job in round ``round_index``: its spec is the
    worker's inner job cut to ``H`` steps (what the trace and the chain count), its
    offset ``round_index * H`` and its schedule the whole job's ``H x R`` steps."""
    if not 0 <= round_index < spec.outer_rounds:
        raise TrainingError(f"round {round_index} is not in 0..{spec.outer_rounds - 1}")
    base = worker_context(spec, dataset, slot, threads, optimizer_impl, compute_dtype)
    d = base.spec.model_dump(mode="json")
    d["total_steps"] = spec.inner_steps
    return replace(base, spec=parse_spec(d), step_offset=round_index * spec.inner_steps,
                   schedule_steps=spec.inner_steps * spec.outer_rounds, _perm_cache={})


def round_start_state(ctx: ShardContext, theta_t: Mapping[str, torch.Tensor]) -> TrainState:
    """S_0 of a round's sub-job: ``theta_t``, zeroed inner optimizer, step 0."""
    return start_state(ctx, theta_t, 0)


def round_initial_hash(ctx: ShardContext, theta_t: Mapping[str, torch.Tensor]) -> bytes:
    """The hash the CollabMarket fixes as the round's S_0 (the same for every slot:
    seeds and shards do not enter a state)."""
    return state_hash(state_tensors(round_start_state(ctx, theta_t)))


def final_weights(tensors: Mapping[str, torch.Tensor]) -> Params:
    """theta_i: the model weights of a sub-job's final state (``state_tensors`` form)."""
    out = {k.removeprefix(_MODEL): v for k, v in tensors.items() if k.startswith(_MODEL)}
    if not out:
        raise TrainingError("the state holds no model weights")
    return out


def delta_from_final(theta_t: Mapping[str, torch.Tensor],
                     tensors: Mapping[str, torch.Tensor]) -> Params:
    """delta_i = theta_t - theta_i (one fp32 subtraction per coordinate, as
    ``inner_run``), from the final leaf's state of slot i's sub-job."""
    theta_i = final_weights(tensors)
    if theta_i.keys() != theta_t.keys():
        raise TrainingError("the final state's weights do not match theta_t's names")
    return {n: theta_t[n].to(torch.float32) - theta_i[n] for n in theta_i}


EVAL_BATCH = 64


def heldout_loss(ctx: ShardContext, theta: Mapping[str, torch.Tensor],
                 held: torch.Tensor) -> float:
    """Mean next-token loss of weights ``theta`` on the held-out windows ``held``
    (node.train.shards.holdout_indices), dropout off."""
    state = start_state(ctx, theta, 0)
    state.model.eval()
    c = ctx.spec.model.context  # type: ignore[union-attr]
    total = 0.0
    with torch.no_grad():
        for i in range(0, held.numel(), EVAL_BATCH):
            idx = held[i:i + EVAL_BATCH]
            seq = ctx.inputs[idx.unsqueeze(1) * c + torch.arange(c + 1)]
            logits = state.model(seq[:, :-1])
            total += float(state.model.loss(logits, seq[:, 1:])) * idx.numel()
    return total / held.numel()


def sequential(ctx: ShardContext, theta_0: Mapping[str, torch.Tensor],
               steps: int) -> TrainState:
    """``steps`` steps of one context from ``theta_0`` (a fresh inner optimizer): one
    worker training alone, or one solver with an N-times batch (data parallel)."""
    state = start_state(ctx, theta_0, 0)
    for step in range(1, steps + 1):
        train_step(ctx, state, step)
    return state
