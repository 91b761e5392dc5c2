"""Token amounts as people read them: POL with exact decimals (18), never floats."""

from __future__ import annotations

TOKEN = 10**18  # wei per POL


def wei_to_pol(wei: int) -> str:
    """Token wei as an exact decimal of POL: 1100000000000000001 -> "1.100000000000000001"."""
    whole, frac = divmod(abs(wei), TOKEN)
    text = f"{whole}.{frac:018d}".rstrip("0").rstrip(".")
    return f"-{text}" if wei < 0 else text
