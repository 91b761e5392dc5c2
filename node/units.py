"""Token amounts as people read them: POL with exact decimals (18), never floats."""

from __future__ import annotations

TOKEN = 10**18  # wei per POL


def wei_to_pol(wei: int) -> str:
    """Token wei as an exact decimal of POL: 1100000000000000001 -> "1.100000000000000001"."""
    whole, frac = divmod(abs(wei), TOKEN)
    text = f"{whole}.{frac:018d}".rstrip("0").rstrip(".")
    return f"-{text}" if wei < 0 else text


def when(ts: int, now: int | None = None) -> str:
    """A unix time as local time with its offset and how far from ``now`` (default: the
    wall clock): "2026-12-01 18:19:01 +0000 (in 42 s)"; "-" for 0 (not set)."""
    import datetime as dt
    import time

    if ts == 0:
        return "-"
    now = int(time.time()) if now is None else now
    d = ts - now
    span = abs(d)
    rel = (f"{span} s" if span < 120 else f"{span // 60} min" if span < 7200
           else f"{span // 3600} h")
    stamp = dt.datetime.fromtimestamp(ts).astimezone().strftime("%Y-%m-%d %H:%M:%S %z")
    return f"{stamp} ({'in ' + rel if d > 0 else rel + ' ago'})"
