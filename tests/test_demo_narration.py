"""The demo's chain narration: lists of addresses and hashes print as names and
short hashes, not swallowed as rich markup (``jury=[verifier-1, ...]``)."""

from __future__ import annotations

from rich.console import Console

from node.chain.events import ChainEvent
from node.demo import Narrator

A1, A2 = "0x" + "11" * 20, "0x" + "22" * 20


class _Events:
    def __init__(self, events: list[ChainEvent]) -> None:
        self.events = events

    def new_events(self) -> list[ChainEvent]:
        out, self.events = self.events, []
        return out


def test_lists_of_addresses_and_hashes_are_printed() -> None:
    evs = [ChainEvent("DisputeGame", "JuryDrawn",
                      {"id": 1, "jurySeed": b"\x01" * 32, "jury": [A1, A2]}, 5, "0x", 0, "0x"),
           ChainEvent("DisputeGame", "MidsPosted",
                      {"id": 1, "steps": [19], "hashes": [b"\xab" * 32]}, 6, "0x", 1, "0x"),
           ChainEvent("DisputeGame", "Unnarrated", {"id": 1}, 7, "0x", 2, "0x")]
    con = Console(record=True, width=200)
    Narrator(_Events(evs), {A1: "verifier-1", A2: "verifier-2"}, con)()  # type: ignore[arg-type]
    out = con.export_text()
    assert "JuryDrawn id=1 jurySeed=0x010101010101… jury=[verifier-1, verifier-2]" in out
    assert "MidsPosted id=1 steps=[19] hashes=[0xabababababab…]" in out
    assert "Unnarrated" not in out
