"""The demo's chain narration: lists of addresses and hashes print as names and
short hashes, not swallowed as rich markup (``jury=[verifier-1, ...]``)."""

from __future__ import annotations

from rich.console import Console

from node.chain.events import ChainEvent
from node.demo import Narrator

A1, A2 = "0x" + "11" * 20, "0x" + "22" * 20


class _Events:
    deployment = None

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


def test_every_field_is_decoded_for_people() -> None:
    """The narration printed deadline=1796391574, verdict=2, reason=1, acceptedMask=11,
    reward=100000000000000000000 and the burn address as 0x000000…: every field now
    reads as a person would say it."""
    burn = "0x000000000000000000000000000000000000dEaD"
    evs = [ChainEvent("JobMarket", "JobClaimed",
                      {"jobId": 1, "round": 1, "solver": A1, "bond": 5 * 10**18,
                       "deadline": 1796391574}, 5, "0x", 0, "0x"),
           ChainEvent("DisputeGame", "DisputeResolved",
                      {"id": 1, "jobId": 1, "segment": 3, "verdict": 2, "validVotes": 0,
                       "invalidVotes": 3, "slashedBond": 10**20 // 3}, 6, "0x", 1, "0x"),
           ChainEvent("CollabMarket", "SlotReleased",
                      {"jobId": 1, "slot": 2, "node": A2, "reason": 1}, 7, "0x", 2, "0x"),
           ChainEvent("CollabMarket", "RoundSettled",
                      {"jobId": 1, "round": 0, "accepted": 3, "acceptedMask": 11,
                       "perWorker": 1}, 8, "0x", 3, "0x"),
           ChainEvent("NodeRegistry", "Slashed",
                      {"node": A1, "amount": 10**19, "to": burn, "fromLocked": True},
                      9, "0x", 4, "0x")]
    con = Console(record=True, width=400)
    Narrator(_Events(evs), {A1: "solver-cheat", A2: "worker-1"}, con,  # type: ignore[arg-type]
             {e.event for e in evs})()
    out = con.export_text()
    assert "1796391574" not in out and "deadline=20" in out  # a date, 20xx-..
    assert "bond=5 POL" in out
    assert "verdict=invalid (solver lost)" in out and "slashedBond=33.33 POL" in out
    assert "reason=dropped (bond lost if it missed, back if condemned)" in out
    assert "acceptedMask=slots [0, 1, 3]" in out and "perWorker=1e-18 POL" in out
    assert "to=burn (0x…dEaD)" in out and "fromLocked=yes" in out


def test_amounts_read_to_a_sensible_precision() -> None:
    from node.event_text import pol  # noqa: PLC0415

    assert pol(110 * 10**18 - 1) == "110 POL"
    assert pol(10**20 // 3) == "33.33 POL"
    assert pol(10**20 // 3, exact=True) == "33.333333333333333333 POL"
    assert pol(1) == "1e-18 POL" and pol(42 * 10**13) == "0.00042 POL"
    assert pol(0) == "0 POL" and pol(-5 * 10**17) == "-0.5 POL"


def test_a_collaborative_inner_run_is_named_by_its_round_slot_and_worker() -> None:
    evs = [ChainEvent("CollabMarket", "SubJobPosted",
                      {"jobId": 1, "round": 2, "slot": 3, "marketJobId": 12, "worker": A1},
                      5, "0x", 0, "0x"),
           ChainEvent("JobMarket", "Challenged",
                      {"jobId": 12, "round": 1, "segment": 4, "challenger": A2,
                       "disputeId": 1}, 6, "0x", 1, "0x"),
           ChainEvent("CollabMarket", "SubJobDropped",
                      {"jobId": 1, "round": 2, "slot": 3, "marketJobId": 12, "worker": A1,
                       "reason": 1}, 7, "0x", 2, "0x")]
    con = Console(record=True, width=400)
    Narrator(_Events(evs), {A1: "worker-1", A2: "verifier-2"}, con,  # type: ignore[arg-type]
             {"Challenged", "SubJobDropped"})()
    out = con.export_text()
    assert "Challenged jobId=12 (round 2 slot 3, worker-1)" in out
    assert "SubJobDropped jobId=1 round=2" in out and "reason=condemned" in out
    assert "marketJobId=12 (round 2 slot 3, worker-1)" in out
