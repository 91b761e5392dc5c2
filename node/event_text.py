"""Contract events as a person reads them: amounts in POL, times as local times,
enums by name, masks as lists, known addresses by role.

The demo's narration, `polnet job status` and the explorer print events through
``field_text``; ``--json`` output keeps the raw values. The tables below are keyed by
the field names of the contracts' events (contracts/src/interfaces): a new event whose
fields follow those names is decoded without a change here.
"""

from __future__ import annotations

from collections.abc import Mapping
from decimal import ROUND_HALF_EVEN, Decimal
from typing import Any

from node.units import TOKEN, wei_to_pol, when

#: DisputeGame's sink for burned tokens (nobody holds its key).
BURN_ADDRESS = "0x000000000000000000000000000000000000dEaD"

AMOUNT_FIELDS = frozenset({
    "amount", "bond", "freeStake", "juryAmount", "perAttestation", "perChallenger", "perJury",
    "perWorker", "refund", "reward", "sharedPot", "slashed", "slashedBond", "toSubmitter",
    "unbondingStake", "unlocked", "value", "verificationBudget", "seatStake", "lockedStake",
})
TIME_FIELDS = frozenset({"deadline", "windowEnd", "commitEnd", "revealEnd", "availableAt",
                         "answerBy"})
DURATION_FIELDS = frozenset({"solveDuration", "challengerClockLeft", "solverClockLeft"})
BLOCK_FIELDS = frozenset({"drawBlock", "sampleBlock", "newSampleBlock", "oldSampleBlock",
                          "snapshotBlock"})
MASK_FIELDS = frozenset({"acceptedMask"})

# Verdicts: the solver's side is named, so a lost dispute never reads as "invalid dispute".
_DISPUTE_VERDICT = {0: "none", 1: "valid (solver won)", 2: "invalid (solver lost)",
                    3: "solver timed out", 4: "void (no quorum)"}
_OUTER_VERDICT = {0: "none", 1: "valid (outer state stands)", 2: "invalid (outer state wrong)",
                  3: "void (no quorum)"}
_ENUMS: dict[tuple[str | None, str], dict[int, str]] = {
    ("DisputeResolved", "verdict"): _DISPUTE_VERDICT,
    ("CaseTallied", "verdict"): _OUTER_VERDICT,
    ("OuterResolved", "verdict"): _OUTER_VERDICT,
    # ICollabMarket.SlotReleased: why the slot was freed, and what became of its bond.
    ("SlotReleased", "reason"): {0: "left (bond back)",
                                 1: "dropped (bond lost if it missed, back if condemned)",
                                 2: "over its slot cap (bond back)",
                                 3: "job over (bond back)",
                                 4: "its holder is out of the job (bond back)"},
    ("SubJobDropped", "reason"): {0: "missed its deadline", 1: "condemned",
                                  2: "never claimed"},
    ("TimedOut", "loser"): {0: "solver", 1: "challenger"},
    (None, "roles"): {1: "solver", 2: "verifier", 3: "solver+verifier"},
}


def pol(wei: int, exact: bool = False) -> str:
    """``wei`` in POL for people: two decimals (``3.33 POL``), enough significant digits
    for a small amount to show (``0.00042 POL``, never ``0.00``), and the exact decimal
    with ``exact``."""
    if exact:
        return f"{wei_to_pol(wei)} POL"
    x = Decimal(wei) / TOKEN
    if x == 0:
        return "0 POL"
    q = x.quantize(Decimal("0.01"), rounding=ROUND_HALF_EVEN)
    # below a cent: three significant digits, so it never reads as nothing
    text = f"{x:.3g}" if q == 0 else f"{q:f}".rstrip("0").rstrip(".")
    return f"{text} POL"


def address_text(addr: str, names: Mapping[str, str]) -> str:
    """A known address by its name (role, node or contract), the burn address as
    ``burn``, any other one shortened."""
    for k, v in names.items():
        if k.lower() == addr.lower():
            return v
    if addr.lower() == BURN_ADDRESS.lower():
        return "burn (0x…dEaD)"
    return addr[:10] + "…"


def mask_slots(mask: int) -> list[int]:
    """Bit i set -> slot i."""
    return [i for i in range(mask.bit_length()) if mask >> i & 1]


def duration_text(seconds: int) -> str:
    if seconds < 120:
        return f"{seconds} s"
    if seconds < 7200:
        return f"{seconds // 60} min"
    return f"{seconds / 3600:.1f} h"


def field_text(event: str, field: str, value: Any, names: Mapping[str, str] | None = None,
               *, exact: bool = False, now: int | None = None) -> str:
    """One event field as text for people (see the module doc)."""
    names = names or {}
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, bytes):
        return "0x" + value.hex()[:12] + "…"
    if isinstance(value, str):
        if value.startswith("0x") and len(value) == 42:
            return address_text(value, names)
        return value
    if isinstance(value, list | tuple):
        return "[" + ", ".join(field_text(event, field, v, names, exact=exact, now=now)
                               for v in value) + "]"
    if not isinstance(value, int):
        return str(value)
    table = _ENUMS.get((event, field)) or _ENUMS.get((None, field))
    if table is not None:
        return table.get(value, f"{value} (unknown)")
    if field in AMOUNT_FIELDS:
        return pol(value, exact)
    if field in TIME_FIELDS:
        return when(value, now)
    if field in DURATION_FIELDS:
        return duration_text(value)
    if field in BLOCK_FIELDS:
        return f"block {value}"
    if field in MASK_FIELDS:
        return "slots " + str(mask_slots(value))
    return str(value)


def event_line(event: str, args: Mapping[str, Any], names: Mapping[str, str] | None = None,
               *, exact: bool = False, skip: tuple[str, ...] = ()) -> str:
    """``field=text`` for every field of one event, in the event's order."""
    return " ".join(f"{k}={field_text(event, k, v, names, exact=exact)}"
                    for k, v in args.items() if k not in skip)
