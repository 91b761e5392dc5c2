"""The outer step of a collaborative (DiLoCo) job, issue 13: one rule, recomputed
bit for bit by every party.

Round ``t`` turns the outer state (``theta_t``, outer momentum ``m_t``) and the
accepted deltas ``{slot: delta_i}`` into round ``t + 1``'s with Nesterov SGD on the
averaged pseudo-gradient (torch's ``SGD(nesterov=True, dampening=0)`` rule):

    g       = (sum of delta_i over accepted slots, ascending) / n
    m_{t+1} = mu * m_t + g
    theta_{t+1} = theta_t - lr * (g + mu * m_{t+1})

Determinism rule: on the CPU in float64, coordinate by coordinate, with one IEEE
operation per torch call: every fp32 input is widened exactly, the sum runs in
ascending slot order, then ``/ n``, ``*``, ``+``, ``-`` as written above; no fused
kernels (``add(alpha=)``, ``addcmul``, ``lerp``) whose vectorised and scalar paths
may round differently (FMA or not), and no reduction across coordinates, so the
thread count and the SIMD width cannot change a bit. theta and momentum are then
cast back to the parameter dtype (fp32) with ``Tensor.to`` (round to nearest,
ties to even), once per round. The round commits ``outer_hash``:
``node.proof.state_hash`` over ``theta.<name>``, ``momentum.<name>``,
``meta.round`` (rounds done) and ``meta.slots`` (whose deltas it averaged).

Clipping (``outer.clip_ratio``, off by default): before the sum, a delta whose L2
norm exceeds ``clip_ratio`` x the round's median norm (the lower median of the
accepted deltas') is scaled down to that norm, one float64 multiply per coordinate.
The norms are exact: fp32 squares are exact in float64 and ``math.fsum`` rounds their
sum once, so every party gets the same float whatever the order or thread count. It
bounds what one poisoned delta that passed verification can move (docs/protocol.md).

Public API::

    initial_outer_state(spec, init_path=None) -> OuterState   # theta_0, m_0 = 0
    outer_step(state, deltas, outer) -> OuterState     # IntegrityError on a malformed delta
    outer_hash(state) -> bytes                         # 32 bytes
    check_outer(theta_t, momentum_t, deltas, claimed_hash, *, outer, round_index) -> bool
    run_round(state, contexts, outer) -> RoundResult   # every slot's inner run + outer step
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from node.errors import ConfigError, IntegrityError, TrainingError
from node.proof import state_hash
from node.spec import CollaborativeSpec, NesterovConfig
from node.train.init_weights import load_init_weights
from node.train.inner import InnerRun, Params, inner_run
from node.train.models import build_model
from node.train.shards import ShardContext
from node.train.step import derive_seed

_WIDE = torch.float64


@dataclass(frozen=True)
class OuterState:
    round: int               # rounds done: theta is theta_round
    theta: Params
    momentum: Params
    slots: tuple[int, ...]   # the slots averaged into this state (none for round 0)


def initial_outer_state(spec: CollaborativeSpec, init_path: Path | None = None) -> OuterState:
    """theta_0, m_0 = 0. theta_0: the file the spec's ``init_weights`` names (a
    warm start: ``init_path``, node.train.init_weights checks it), else the inner
    job's S_0 weights (``derive_seed(seed, "init")``)."""
    if spec.init_weights is not None:
        if init_path is None:
            raise ConfigError(f"the job starts from init weights {spec.init_weights}: "
                              "pass their file (`--init-weights`)")
        theta = load_init_weights(spec, init_path)
    else:
        model = build_model(spec.inner.model, derive_seed(spec.inner.seed, "init"))
        theta = {n: t.detach().to("cpu", torch.float32, copy=True).contiguous()
                 for n, t in model.state_dict().items()}
    return OuterState(0, theta, {n: torch.zeros_like(t) for n, t in theta.items()}, ())


def _check_deltas(theta: Mapping[str, torch.Tensor],
                  deltas: Mapping[int, Mapping[str, torch.Tensor]]) -> None:
    if not deltas:
        raise IntegrityError("a round needs at least one accepted delta")
    for slot, delta in deltas.items():
        if delta.keys() != theta.keys():
            raise IntegrityError(f"slot {slot}'s delta does not name the model's tensors")
        for name, ref in theta.items():
            t = delta[name]
            if t.shape != ref.shape or t.dtype != ref.dtype or t.device.type != "cpu":
                raise IntegrityError(f"slot {slot}: {name} is {t.dtype}{list(t.shape)} on "
                                     f"{t.device}, not {ref.dtype}{list(ref.shape)} on cpu")
            if not bool(torch.isfinite(t).all()):
                raise IntegrityError(f"slot {slot}: {name} has non-finite values")


def outer_step(state: OuterState, deltas: Mapping[int, Mapping[str, torch.Tensor]],
               outer: NesterovConfig) -> OuterState:
    """Round ``state.round``'s outer step over the accepted ``deltas`` (see module doc)."""
    _check_deltas(state.theta, deltas)
    slots = tuple(sorted(deltas))
    lr, mu, n = outer.lr, outer.momentum, len(slots)
    scale = clip_scales(deltas, outer.clip_ratio) if outer.clip_ratio is not None else {}
    theta, momentum = {}, {}
    for name, p in state.theta.items():
        acc = torch.zeros(p.shape, dtype=_WIDE)
        for s in slots:
            d = deltas[s][name].to(_WIDE)
            if scale.get(s, 1.0) != 1.0:
                d = d * scale[s]
            acc = acc + d
        g = acc / n
        m = state.momentum[name].to(_WIDE) * mu + g
        upd = g + m * mu
        theta[name] = (p.to(_WIDE) - upd * lr).to(p.dtype)
        momentum[name] = m.to(p.dtype)
    return OuterState(state.round + 1, theta, momentum, slots)


_NORM_CHUNK = 1 << 16  # coordinates turned into Python floats at a time


def delta_norm(delta: Mapping[str, torch.Tensor]) -> float:
    """The exact L2 norm of a delta's floating tensors, rounded once (see module doc).
    One fsum over every square, fed a chunk at a time so a large model's tensors are
    never whole Python lists."""
    squares = (chunk.to(_WIDE).square().tolist()
               for n in sorted(delta) if delta[n].is_floating_point()
               for chunk in delta[n].flatten().split(_NORM_CHUNK))
    return math.sqrt(math.fsum(itertools.chain.from_iterable(squares)))


def clip_scales(deltas: Mapping[int, Mapping[str, torch.Tensor]],
                ratio: float) -> dict[int, float]:
    """Per slot, the factor its delta is scaled by: 1.0, or ``ratio`` x the lower
    median norm / its norm when it is above that bound."""
    norms = {s: delta_norm(d) for s, d in deltas.items()}
    ordered = sorted(norms.values())
    bound = ratio * ordered[(len(ordered) - 1) // 2]
    return {s: 1.0 if v <= bound else bound / v for s, v in norms.items()}


def outer_tensors(state: OuterState) -> dict[str, torch.Tensor]:
    out = {f"theta.{n}": t for n, t in state.theta.items()}
    out.update({f"momentum.{n}": t for n, t in state.momentum.items()})
    out["meta.round"] = torch.tensor(state.round, dtype=torch.int64)
    out["meta.slots"] = torch.tensor(state.slots, dtype=torch.int64)
    return out


def outer_hash(state: OuterState) -> bytes:
    return state_hash(outer_tensors(state))


def check_outer(theta_t: Params, momentum_t: Params,
                deltas: Mapping[int, Mapping[str, torch.Tensor]], claimed_hash: bytes, *,
                outer: NesterovConfig, round_index: int) -> bool:
    """Is ``claimed_hash`` round ``round_index``'s outer state from exactly these
    deltas? Recomputation alone decides; a malformed delta makes the claim false.
    It says nothing about whether a delta is honest: that is ``inner.check_delta``."""
    try:
        new = outer_step(OuterState(round_index, theta_t, momentum_t, ()), deltas, outer)
    except IntegrityError:
        return False
    return outer_hash(new) == claimed_hash


@dataclass(frozen=True)
class RoundResult:
    state: OuterState
    runs: dict[int, InnerRun]


def run_round(state: OuterState, contexts: Sequence[ShardContext],
              outer: NesterovConfig) -> RoundResult:
    """Every given slot's inner run from ``state.theta``, then the outer step over all."""
    if not contexts or len({c.slots for c in contexts}) != len(contexts):
        raise TrainingError("a round needs one context per slot, at least one")
    if state.round >= contexts[0].collab.outer_rounds:
        raise TrainingError(f"the job has {contexts[0].collab.outer_rounds} rounds; "
                            f"round {state.round} is past them")
    runs = {}
    for ctx in contexts:
        run = inner_run(ctx, state.theta, state.round)
        runs[run.slot] = run
    return RoundResult(outer_step(state, {s: r.delta for s, r in runs.items()}, outer), runs)
