"""Adversarial solver behaviours, registered by name into
``node.train.behavior`` so a solver can run one with ``--behavior NAME``.

They exist to prove the verifier catches them (tests/test_adversary*.py,
bench/verify_cost.py) and must never be a default. Names (kwargs):

    skip                         claim S_start unchanged
    fewer_steps (missing=1)      k - missing steps
    bad_step (at=0, offset=7)    one step per segment on another batch (0 = the
                                 middle one); disputes answered along that trajectory
    withhold (missing=1)         fewer_steps; in a dispute posts hashes, serves no state
    dark                         skip; serves nothing: no manifest, no state, no leaf
                                 an availability request names (issue 30)
    more_steps (extra=1)         k + extra steps
    other_data (offset=7)        another step's batch
    half_batch (fraction=0.5)    part of each batch
    low_lr (factor=0.5)          scaled learning rate
    noise (rel=0.01, seed=0)     honest + noise of rel x update norm
    bf16                         bf16 autocast on an fp32 job
    stale (lag=1)                claim the state of lag segments ago
    spoof (target_seed=1)        infinitesimal-update interpolation (Fang et al.)
    blindfold (q=0.25)           honest on the first q of segments, spoof after
    lazy (fraction=0.1, mode=skip|spoof, salt=0)   cheat on a fraction of segments
    poison (at=1, mode=nan|shape) commit a NaN / wrong-shape state at the end of segment at
    amplify (factor=5)           the last segment at factor x the learning rate: a
                                 byzantine collaborative worker's blown-up delta
    wrong_outer                  honest inner runs; posts a forged outer state once
                                 per collaborative job (caught by recomputation)

``make_behavior("lazy:0.1,mode=spoof")`` parses a command-line string: the
value after ':' is the first parameter, ``key=value`` pairs the others.
"""

from __future__ import annotations

import inspect
from typing import Any

from node.behaviors.spoof import Blindfold, InfinitesimalSpoof, LazyFraction
from node.behaviors.steps import (
    BF16,
    Amplify,
    Cheat,
    Dark,
    FewerSteps,
    HalfBatch,
    LowLR,
    MoreSteps,
    Noise,
    OneBadStep,
    OtherData,
    Poison,
    SkipSteps,
    Stale,
    WithholdStates,
    WrongOuter,
)
from node.errors import TrainingError
from node.train.behavior import SegmentBehavior, get_behavior, register_behavior

CHEATS: tuple[type[Cheat], ...] = (SkipSteps, FewerSteps, OneBadStep, MoreSteps, OtherData,
                                   HalfBatch, LowLR, Noise, BF16, Stale, InfinitesimalSpoof,
                                   Blindfold, LazyFraction, WithholdStates, Poison, Amplify,
                                   WrongOuter, Dark)
for _cls in CHEATS:
    register_behavior(_cls.name, _cls)


def _coerce(value: str) -> Any:
    for conv in (int, float):
        try:
            return conv(value)
        except ValueError:
            pass
    return value


def make_behavior(text: str) -> SegmentBehavior:
    """``NAME[:FIRST][,KEY=VALUE...]`` -> a registered behaviour instance."""
    name, _, rest = text.partition(":")
    if "," in name:  # "name,key=value" without a positional value
        name, _, rest = text.partition(",")
        rest = "," + rest
    kwargs: dict[str, Any] = {}
    parts = [p for p in rest.split(",")] if rest else []
    if parts and "=" not in parts[0] and parts[0]:
        cls = next((c for c in CHEATS if c.name == name), None)
        params = list(inspect.signature(cls.__init__).parameters)[1:] if cls else []
        if not params:
            raise TrainingError(f"behaviour {name!r} takes no positional parameter")
        kwargs[params[0]] = _coerce(parts[0])
        parts = parts[1:]
    for p in parts:
        if not p:
            continue
        key, sep, value = p.partition("=")
        if not sep:
            raise TrainingError(f"bad behaviour parameter {p!r} (want key=value)")
        kwargs[key.strip()] = _coerce(value.strip())
    try:
        return get_behavior(name, **kwargs)
    except TypeError as exc:
        raise TrainingError(f"behaviour {name!r}: {exc}") from None


__all__ = ["CHEATS", "Cheat", "make_behavior"]
