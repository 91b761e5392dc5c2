"""Which segments a verifier replays.

The mandatory sample is the chain's: ``node.proof.sample_segments`` from the
32-byte seed (a block hash after the commit), with n from the job's detection
target, so a solver faking a fraction f of its segments is caught with
probability 1 - (1 - f)^n. A verifier may add segments of its own choosing:
the ones whose claimed update norm or loss change stands out, where a cheat
that saves compute on "boring" stretches (blindfold top-Q) does not hide.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from node.proof import LOSS_SCALE, sample_segments, samples_for_detection


@dataclass(frozen=True)
class SamplePlan:
    seed: bytes
    segment_count: int
    n_required: int
    required: tuple[int, ...]
    """Chain-drawn segments, in draw order: these must be checked."""
    extra: tuple[int, ...] = ()
    """Verifier-chosen extras, most suspicious first."""

    @property
    def segments(self) -> tuple[int, ...]:
        return self.required + self.extra

    def detection_probability(self, fraction: float) -> float:
        """Chance the required sample hits at least one of ``fraction`` faked segments."""
        return detection_probability(self.segment_count, len(self.required), fraction)


def detection_probability(segment_count: int, n: int, fraction: float) -> float:
    """Exact for sampling without replacement (hypergeometric), ~1-(1-f)^n for large counts."""
    bad = round(fraction * segment_count)
    good = segment_count - bad
    if n > good:
        return 1.0
    miss = math.comb(good, n) / math.comb(segment_count, n)
    return 1.0 - miss


def suspicious_segments(losses_e9: Sequence[int], update_norms: Sequence[float] | None = None,
                        count: int = 0, exclude: Sequence[int] = ()) -> list[int]:
    """Rank segments by how much they stand out and return the top ``count``.

    ``losses_e9[i]`` is segment i's claimed mean loss (leaf i+1); a segment's
    score is its relative update norm (norm / median) when norms are known,
    plus its relative loss jump vs the previous segment.
    """
    n = len(losses_e9)
    if count <= 0 or n == 0:
        return []
    losses = [x / LOSS_SCALE for x in losses_e9]
    scores = [0.0] * n
    for i in range(1, n):
        prev = losses[i - 1]
        scores[i] += abs(losses[i] - prev) / max(abs(prev), 1e-12)
    if update_norms is not None:
        if len(update_norms) != n:
            raise ValueError("need one update norm per segment")
        med = sorted(update_norms)[n // 2] or 1.0
        for i, u in enumerate(update_norms):
            scores[i] += u / med
    skip = set(exclude)
    ranked = sorted((i for i in range(n) if i not in skip), key=lambda i: (-scores[i], i))
    return ranked[:count]


def plan_sample(seed: bytes, segment_count: int, fraction: float = 0.1,
                confidence: float = 0.99, extra: int = 0,
                losses_e9: Sequence[int] | None = None,
                update_norms: Sequence[float] | None = None) -> SamplePlan:
    """The chain's sample for a detection target, plus ``extra`` self-chosen segments."""
    n = samples_for_detection(fraction, confidence)
    required = sample_segments(seed, segment_count, n)
    chosen: list[int] = []
    if extra and losses_e9 is not None:
        chosen = suspicious_segments(losses_e9, update_norms, extra, exclude=required)
    return SamplePlan(seed, segment_count, n, tuple(required), tuple(chosen))
