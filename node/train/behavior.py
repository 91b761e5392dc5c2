"""Segment behaviours: how a solver produces the end state of each segment.

The training loop (``node.train.trace.run_training``) asks a behaviour for
each segment's end state and *continues from the claimed state*, exactly as a
cheating solver would. ``HonestBehavior`` runs the real steps; the verifier
team registers cheating behaviours (skipped steps, wrong lr, interpolation,
...) from its own modules to test detection.

Public API::

    class SegmentBehavior(ABC):
        def run_segment(self, ctx, state, segment_index, start_step, k)
            -> tuple[TrainState, float]   # (claimed S_{start_step+k}, mean loss)
        def dispute_step(self, ctx, state, step) -> float   # honest unless overridden
    HonestBehavior()
    register_behavior(name, cls); get_behavior(name, **kwargs) -> SegmentBehavior
    behavior_names() -> list[str]

``state`` is S_{start_step}; a behaviour may mutate and return it. The
returned state's ``step`` must be ``start_step + k``; the loss must be finite
and >= 0 (it goes into the trace leaf).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from pathlib import Path
from typing import Any

from node.errors import TrainingError
from node.train.step import TrainContext, TrainState, train_step


class SegmentBehavior(ABC):
    name: str = "abstract"
    #: False: in a dispute the solver posts its bisection hashes but never serves
    #: the states behind them (a test cheat; the game must count that against it).
    serves_dispute_states: bool = True
    #: True: in a collaborative job, the first time this node may post a round's outer
    #: state it posts a forged one it never computed (a test cheat: recomputation
    #: alone must expose it, node.roles.collab).
    forges_outer: bool = False
    #: False: the solver publishes no trace manifest and answers no availability
    #: request (a test cheat: the availability game alone must condemn it, issue 30).
    serves_data: bool = True

    @abstractmethod
    def run_segment(self, ctx: TrainContext, state: TrainState, segment_index: int,
                    start_step: int, k: int) -> tuple[TrainState, float]:
        """Return the claimed state after steps ``start_step+1 .. start_step+k``
        and the mean loss claimed for the segment."""

    def start_state(self, ctx: TrainContext, step: int,
                    sharded: Path | None) -> TrainState | None:
        """The state a run starts from, when this behaviour builds it itself: S_0 of the
        spec (``step`` 0) or the kept leaf at ``step``, given as ``sharded`` (its DCP
        checkpoint, hash-checked) when a sharded run kept it. None (the default):
        ``run_training`` builds S_0 or loads the kept checkpoint whole. A sharded S_0
        comes with its ``leaf`` (hash and whole tensors one at a time, for its file)."""
        return None

    def dispute_step(self, ctx: TrainContext, state: TrainState, step: int) -> float:
        """One step as this solver regenerates it for a dispute's bisection points
        (``regenerate_many(step_fn=...)``). Honest steps by default: a segment-level
        cheat has no intermediate states of its own to defend."""
        return train_step(ctx, state, step)


class HonestBehavior(SegmentBehavior):
    name = "honest"

    def run_segment(self, ctx: TrainContext, state: TrainState, segment_index: int,
                    start_step: int, k: int) -> tuple[TrainState, float]:
        total = 0.0
        for step in range(start_step + 1, start_step + k + 1):
            total += train_step(ctx, state, step)
        return state, total / k


_BEHAVIORS: dict[str, type[SegmentBehavior]] = {"honest": HonestBehavior}


def register_behavior(name: str, cls: type[SegmentBehavior]) -> None:
    if name in _BEHAVIORS and _BEHAVIORS[name] is not cls:
        raise TrainingError(f"behaviour {name!r} is already registered")
    _BEHAVIORS[name] = cls


def get_behavior(name: str, **kwargs: Any) -> SegmentBehavior:
    try:
        return _BEHAVIORS[name](**kwargs)
    except KeyError:
        raise TrainingError(f"unknown behaviour {name!r}; known: {behavior_names()}") from None


def behavior_names() -> list[str]:
    return sorted(_BEHAVIORS)
