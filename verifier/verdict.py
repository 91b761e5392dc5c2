"""Verdicts: what a segment check found, with the figures that justify it.

A verdict is evidence: it goes into logs, attestations and challenge bonds, so
it carries the numbers (distance, bound, ratio, worst tensor) and not only a
boolean. ``to_dict`` gives plain JSON-able values.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any


def _finite(x: float) -> float | str:
    return x if math.isfinite(x) else str(x)


@dataclass(frozen=True)
class TensorCheck:
    """One tensor's comparison of replayed R against claimed C (start S).

    ``distance`` = ||R - C|| and ``update`` = ||R - S|| over the tightly checked
    (unmasked) coordinates; ``bound`` = rho * update + abs. ``masked`` counts the
    coordinates given the loose Adam-eps bound, ``masked_violations`` those of
    them that broke it.
    """

    name: str
    kind: str  # "param", "exp_avg", "exp_avg_sq", "exact"
    distance: float
    update: float
    bound: float
    masked: int
    masked_violations: int
    passed: bool

    @property
    def ratio(self) -> float:
        """Drift relative to the replayed update (what rho is calibrated against)."""
        if self.update > 0:
            return self.distance / self.update
        return 0.0 if self.distance == 0 else math.inf

    @property
    def slack(self) -> float:
        """distance / bound: <= 1 passes the tight check."""
        if self.bound > 0:
            return self.distance / self.bound
        return 0.0 if self.distance == 0 else math.inf


@dataclass(frozen=True)
class Verdict:
    """The outcome of checking one segment ``(start_step, end_step]``.

    ``distance``/``update_norm``/``bound`` are the overall figures over all
    parameters (masked coordinates excluded); ``ratio`` = distance/update_norm;
    ``worst_tensor`` is the tensor with the largest slack (distance/bound).
    """

    segment: int
    start_step: int
    end_step: int
    passed: bool
    reason: str
    distance: float
    update_norm: float
    bound: float
    worst_tensor: str
    worst_slack: float
    masked: int
    loss_claimed: float | None = None
    loss_replayed: float | None = None
    replay_seconds: float = 0.0
    tensors: tuple[TensorCheck, ...] = field(default=(), repr=False)
    masked_slack: float = 0.0
    """max over Adam-eps-masked coordinates of |R - C| / their bound (<= 1 passes)."""
    determined: int = 0
    """Masked coordinates whose update was pure weight decay (held exact)."""

    @classmethod
    def failed(cls, segment: int, start_step: int, end_step: int, reason: str) -> Verdict:
        """A segment that fails without a comparison: the solver's committed state
        cannot be loaded, has the wrong layout, is not finite, or cannot be replayed."""
        return cls(segment, start_step, end_step, False, reason, math.inf, 0.0, 0.0, "",
                   math.inf, 0)

    @property
    def ratio(self) -> float:
        if self.update_norm > 0:
            return self.distance / self.update_norm
        return 0.0 if self.distance == 0 else math.inf

    def summary(self) -> str:
        state = "PASS" if self.passed else "FAIL"
        return (f"segment {self.segment} ({self.start_step},{self.end_step}] {state}: "
                f"|R-C|={self.distance:.3e} bound={self.bound:.3e} ratio={self.ratio:.2e} "
                f"worst={self.worst_tensor} (slack {self.worst_slack:.2f}) masked={self.masked}"
                + ("" if self.passed else f" — {self.reason}"))

    def to_dict(self, with_tensors: bool = False) -> dict[str, Any]:
        d = asdict(self)
        d.pop("tensors")
        d["ratio"] = self.ratio
        if with_tensors:
            d["tensors"] = [dict(asdict(t), ratio=t.ratio, slack=t.slack) for t in self.tensors]
        return {k: _finite(v) if isinstance(v, float) else v for k, v in d.items()}
