"""Helpers the cheating behaviours share: a cheater's own step (same math as
``train_step`` but with the knob it cheats on), counter fix-ups so that a cheat
is caught by its numbers and not by a trivially wrong step counter, and
parameter snapshots."""

from __future__ import annotations

import torch

from node.errors import TrainingError
from node.train.step import TrainContext, TrainState, batch, lr_of, step_generator


def cheat_step(ctx: TrainContext, state: TrainState, step: int, *, data_step: int | None = None,
               batch_fraction: float = 1.0, lr_scale: float = 1.0, bf16: bool = False) -> float:
    """``train_step`` with one dishonest knob: another step's batch, part of the
    batch, a scaled learning rate, or bf16 autocast on an fp32 job."""
    if state.step != step - 1:
        raise TrainingError(f"state is at step {state.step}; cannot run step {step}")
    x, y = batch(ctx, data_step if data_step is not None else step)
    if batch_fraction < 1.0:
        n = max(1, int(x.shape[0] * batch_fraction))
        x, y = x[:n], y[:n]
    rng = step_generator(ctx, step)
    for group in state.optimizer.param_groups:
        group["lr"] = lr_of(ctx, step) * lr_scale
    state.optimizer.zero_grad(set_to_none=True)
    with torch.autocast(ctx.device.type, dtype=torch.bfloat16,
                        enabled=bf16 or ctx.spec.precision == "bf16"):
        logits = state.model(x, rng)
    loss = state.model.loss(logits, y)
    loss.backward()
    if ctx.spec.grad_clip is not None:
        torch.nn.utils.clip_grad_norm_(state.model.parameters(), ctx.spec.grad_clip,
                                       foreach=False)
    state.optimizer.step()
    state.step = step
    return float(loss.detach())


def set_step(state: TrainState, step: int) -> TrainState:
    """Claim ``step``: the state's counter and every optimizer step counter."""
    state.step = step
    for st in state.optimizer.state.values():
        t = st.get("step")
        if isinstance(t, torch.Tensor):
            t.fill_(float(step))
    return state


def params(state: TrainState) -> dict[str, torch.Tensor]:
    return {n: p.detach().clone() for n, p in state.model.named_parameters()}


@torch.no_grad()
def probe_loss(ctx: TrainContext, state: TrainState, step: int) -> float:
    """A plausible loss to claim without training: one forward pass on step's batch."""
    x, y = batch(ctx, step)
    return float(state.model.loss(state.model(x, None), y))
