"""The chaos run's per-account books (bench/chaos.py ``owed_delta``): every way the
contracts move an account's tokens must be attributed, or an honest run reports tokens
unaccounted (CI, stop 41: an answered availability request paid the solver 1 POL of the
requester's bond, a transfer no ``Credited`` event names)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from typing import Any

from node.chain.events import ChainEvent

ROOT = Path(__file__).resolve().parent.parent
_spec = importlib.util.spec_from_file_location("chaos_bench", ROOT / "bench" / "chaos.py")
assert _spec is not None and _spec.loader is not None
chaos = importlib.util.module_from_spec(_spec)
sys.modules["chaos_bench"] = chaos  # its dataclasses look their module up
_spec.loader.exec_module(chaos)

SOLVER, ASKER, OTHER = "0x" + "a" * 40, "0x" + "b" * 40, "0x" + "c" * 40
POL = 10**18


def ev(name: str, block: int, **args: Any) -> ChainEvent:
    return ChainEvent(contract="x", event=name, args=args, block_number=block,
                      tx_hash=f"0x{block:064x}", log_index=0, address="0x" + "0" * 40)


def test_answered_request_moves_the_bond_between_requester_and_solver() -> None:
    evs = [ev("JobClaimed", 1, jobId=7, solver=SOLVER, round=0, bond=0, deadline=0),
           ev("Requested", 2, requestId=1, jobId=7, round=0, segment=3, challenger=ASKER,
              deadline=9),
           ev("Answered", 3, requestId=1, jobId=7, toSolver=POL, toChallenger=POL)]
    assert chaos.owed_delta(evs, ASKER, 2 * POL) == -POL
    assert chaos.owed_delta(evs, SOLVER, 2 * POL) == POL
    assert chaos.owed_delta(evs, OTHER, 2 * POL) == 0


def test_expired_and_pending_requests() -> None:
    evs = [ev("JobClaimed", 1, jobId=7, solver=SOLVER, round=0, bond=0, deadline=0),
           ev("Requested", 2, requestId=1, jobId=7, round=0, segment=3, challenger=ASKER,
              deadline=9),
           ev("Expired", 3, requestId=1, jobId=7, challenger=ASKER, refund=2 * POL),
           ev("Requested", 4, requestId=2, jobId=7, round=1, segment=1, challenger=ASKER,
              deadline=19)]
    # the refunded bond is back; the pending one is still held by the contract
    assert chaos.owed_delta(evs, ASKER, 2 * POL) == -2 * POL
    assert chaos.owed_delta(evs, SOLVER, 2 * POL) == 0


def test_a_reclaimed_job_pays_the_round_s_solver() -> None:
    evs = [ev("JobClaimed", 1, jobId=7, solver=OTHER, round=0, bond=0, deadline=0),
           ev("JobClaimed", 5, jobId=7, solver=SOLVER, round=1, bond=0, deadline=0),
           ev("Requested", 6, requestId=1, jobId=7, round=1, segment=0, challenger=ASKER,
              deadline=9),
           ev("Answered", 7, requestId=1, jobId=7, toSolver=POL, toChallenger=POL)]
    assert chaos.owed_delta(evs, SOLVER, 2 * POL) == POL
    assert chaos.owed_delta(evs, OTHER, 2 * POL) == 0
