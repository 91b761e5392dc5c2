"""Who was credited what for a job, read from its settlement events (the market's own
record): shared by `polnet job status` and the explorer."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any


def job_payouts(events: Iterable[Any]) -> list[dict[str, Any]]:
    """Who was credited what for this job, from its settlement events."""
    out: list[dict[str, Any]] = []
    attested: dict[int, list[str]] = {}
    for e in events:
        a = e.args
        if e.event == "Attested":
            attested.setdefault(int(a["round"]), []).append(str(a["verifier"]))
        elif e.event == "JobFinalized":
            out.append({"to": str(a["solver"]), "amount": int(a["reward"]), "why": "reward"})
            for v in attested.get(max(attested, default=0), []):
                out.append({"to": v, "amount": int(a["perAttestation"]), "why": "attestation"})
        elif e.event == "RoundSettled":
            out.append({"to": "submitter", "amount": int(a["toSubmitter"]),
                        "why": f"share of the slashed bond (round {a['round']})"})
        elif e.event == "RewardPaid":
            out.append({"to": str(a["challenger"]), "amount": int(a["amount"]),
                        "why": f"proved the solver wrong (dispute {a['disputeId']})"})
            if int(a["juryAmount"]):
                out.append({"to": f"jury of dispute {a['disputeId']}",
                            "amount": int(a["juryAmount"]), "why": "majority jurors"})
        elif e.event == "JobCancelled":
            out.append({"to": "submitter", "amount": int(a["refund"]), "why": "cancelled"})
    return out
