"""What people read: POL as exact decimals, times as local time with how far away."""

from __future__ import annotations

import re

from node.units import wei_to_pol, when


def test_pol_is_exact() -> None:
    assert wei_to_pol(1_100_000_000_000_000_001) == "1.100000000000000001"
    assert wei_to_pol(10**20) == "100" and wei_to_pol(0) == "0"
    assert wei_to_pol(-5 * 10**17) == "-0.5"


def test_times_say_local_time_and_distance() -> None:
    now = 1_800_000_000
    assert when(0, now) == "-"
    stamp = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d [+-]\d{4}"
    assert re.fullmatch(stamp + r" \(in 42 s\)", when(now + 42, now))
    assert when(now - 300, now).endswith("(5 min ago)")
    assert when(now + 3 * 3600, now).endswith("(in 3 h)")
