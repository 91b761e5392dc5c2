"""Which trace states a solver keeps as full checkpoints.

Every leaf commits the hash of S_{i*k}, but a checkpoint holds weights and both
Adam moments (12 bytes a parameter), so keeping all of them costs ~1.2 GB each at
100M parameters. A solver with ``keep_every = M`` keeps S_0, every M-th leaf and
the final state (the model the submitter paid for); any other leaf state is
regenerated bitwise from the nearest kept one before it when it is sampled or
challenged: at most (M-1)*k steps, the same steps that made it.

Public API::

    kept_indices(segment_count, keep_every) -> list[int]
    nearest_kept(index, kept) -> int            # the largest kept index <= index
    fit_keep_every(keep_every, window_s=, step_s=, k=, samples=) -> int
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence

from node.errors import TrainingError

MAX_KEEP_EVERY = 32
"""A kept checkpoint's metadata carries the hashes of the M-1 states before it (what a
resumed run needs for its manifest); 32 keeps that well inside the header bound."""


def check_keep_every(keep_every: int) -> int:
    if not 1 <= keep_every <= MAX_KEEP_EVERY:
        raise TrainingError(f"keep_every must lie in 1..{MAX_KEEP_EVERY}, got {keep_every}")
    return keep_every


def fit_keep_every(keep_every: int, *, window_s: float, step_s: float, k: int,
                   samples: int, share: float = 0.5) -> int:
    """The largest M <= ``keep_every`` at which regenerating a whole sample, worst
    case, takes at most ``share`` of the verification window: each of the ``samples``
    segments may need a walk of (M - 1) segments of k steps (one core, serially), and
    the verifiers need the rest of the window to replay. 1 (keep all) if none fits."""
    check_keep_every(keep_every)
    if step_s <= 0:
        return keep_every
    fit = 1 + int(share * window_s / (samples * k * step_s))
    return max(1, min(keep_every, fit))


def kept_indices(segment_count: int, keep_every: int) -> list[int]:
    """Leaf indices whose state is kept: 0, M, 2M, ... and the last (``segment_count``)."""
    check_keep_every(keep_every)
    kept = list(range(0, segment_count + 1, keep_every))
    if kept[-1] != segment_count:
        kept.append(segment_count)
    return kept


def nearest_kept(index: int, kept: Sequence[int]) -> int:
    """The largest kept index at or before ``index`` (``kept`` ascending, starting at 0)."""
    pos = bisect.bisect_right(kept, index) - 1
    if pos < 0:
        raise TrainingError(f"no kept checkpoint at or before leaf {index}")
    return kept[pos]
