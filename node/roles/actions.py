"""Actions every role's decision function may return (each role module adds its own)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Finalize:
    pass


@dataclass(frozen=True)
class Withdraw:
    pass


@dataclass(frozen=True)
class Wait:
    pass


@dataclass(frozen=True)
class Done:
    """Nothing more to do for it."""


@dataclass(frozen=True)
class DrawJury:
    pass
