"""`polnet demo`: a whole network on one machine, run to settlement.

A devnet; three verifiers; a cheating solver (lazy fraction) that takes an LM
job on bundled text; a withholding solver ("dark": commits a root, trains and
serves nothing) that takes an MLP job on digits; an honest solver that takes a
CNN job on digits. The verifiers replay sampled segments, catch the cheat,
bisect it to one step, and the jury's verdict slashes the cheater; the
committee member that cannot fetch the dark solver's data names a segment in an
availability request, which expires unanswered and condemns that round without
anyone replaying a step. Both jobs reopen and the honest solver finishes them.
Every node is its own OS process (see ``devnet.localnet``); this process starts
them and narrates the chain.
"""

from __future__ import annotations

import re
import signal
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from devnet.localnet import REPO, TOKEN, LocalNet
from node.event_text import field_text

# dev account indices
SUBMITTER, HONEST, CHEATER, VERIFIERS, DARK = 1, 2, 3, (4, 5, 6), 7
NARRATED = {"JobPosted", "JobClaimed", "ResultCommitted", "SeedFixed", "CommitteeDrawn",
            "Attested", "Challenged", "MidsPosted", "RangeNarrowed", "JuryRequested",
            "JuryDrawn", "VoteRevealed", "TimedOut", "DisputeResolved", "RoundCondemned",
            "RoundSettled", "RewardPaid", "Burned", "JobReopened", "JobFinalized",
            "AttestorSlashed", "AttestorSlashesBurned", "Slashed", "JurorSlashed",
            "JobReclaimed", "Requested", "Answered", "Expired"}
# CollabMarket events whose jobId is the collaborative job's, not a market job's.
_COLLAB_EVENTS = frozenset({"CollabPosted", "SlotClaimed", "SlotReleased", "RoundStarted",
                            "RoundSettled", "RoundRetried", "OuterPosted", "OuterChallenged",
                            "OuterResolved", "OuterAccepted", "CollabFinished", "CollabFailed",
                            "SubJobPosted", "SubJobAccepted", "SubJobDropped"})
GOOD = {"JobFinalized", "SubJobAccepted", "OuterAccepted", "CollabFinished"}
ALARM = {"SubJobDropped", "OuterChallenged", "CollabFailed",
         "Challenged", "Slashed", "JobReopened", "JurorSlashed", "AttestorSlashed", "TimedOut",
         "RoundCondemned", "Burned", "AttestorSlashesBurned", "Requested", "Expired"}


def demo_params() -> Any:
    """Windows short enough for a demo, long enough for 2 busy cores."""
    from devnet.params import DevnetParams

    # Three verifiers: one committee seat, so two remain to judge a dispute (attestors
    # never sit on its jury).
    return DevnetParams.model_validate({
        "market": {"verification_window": 45, "sample_count": 6, "attestors_per_job": 1,
                   "dispute_grace": 20},
        "dispute": {"clock": 120, "commit_window": 30, "reveal_window": 30},
        "registry": {"unbond_delay": 3600}})


def spec_for(example: str, dataset_hash: str, out: Path, **overrides: int) -> Path:
    """An example spec pointed at a freshly packed dataset (its hash depends on the
    CPython that shipped the text corpus)."""
    text = (REPO / "examples" / example).read_text()
    text = re.sub(r'^dataset_hash = ".*"$', f'dataset_hash = "{dataset_hash}"', text,
                  flags=re.MULTILINE)
    for key, value in overrides.items():
        text = re.sub(rf"^{key} = .*$", f"{key} = {value}", text, flags=re.MULTILINE)
    out.write_text(text)
    return out


def pack_inputs(data: Path) -> dict[str, Path]:
    from node.datasets import pack_digits, pack_text, write_dataset

    data.mkdir(parents=True, exist_ok=True)
    digits, text = data / "digits.safetensors", data / "text.safetensors"
    return {
        "digits": digits, "text": text,
        "cnn": spec_for("cnn_digits.toml", write_dataset(pack_digits(), digits),
                        data / "cnn_digits.toml"),
        "lm": spec_for("lm_text.toml", write_dataset(pack_text(), text), data / "lm_text.toml"),
        "mlp": spec_for("mlp_digits.toml", write_dataset(pack_digits(), digits),
                        data / "mlp_digits.toml"),
    }


class Narrator:
    def __init__(self, net: LocalNet, names: dict[str, str], console: Console,
                 events: set[str] | None = None) -> None:
        self.net, self.names, self.con = net, names, console
        self.events = NARRATED if events is None else events

        # the contracts by name too: slashes and payouts name where tokens went
        dep = net.deployment
        self.known = {**{a: n for n, a in (dep.contracts.items() if dep else ())}, **names}
        # market job id -> "round r slot s, worker": a collaborative inner run by its owner
        self.sub_jobs: dict[int, str] = {}

    def _text(self, event: str, field: str, value: Any) -> str:
        text = field_text(event, field, value, self.known)
        market_job = field == "marketJobId" or (field == "jobId" and event not in _COLLAB_EVENTS)
        if market_job and isinstance(value, int) and value in self.sub_jobs:
            text += f" ({self.sub_jobs[value]})"
        return text

    def __call__(self) -> None:
        for ev in self.net.new_events():
            if ev.event == "SubJobPosted":
                a = ev.args
                self.sub_jobs[int(a["marketJobId"])] = (
                    f"round {a['round']} slot {a['slot']}, "
                    f"{field_text(ev.event, 'worker', a['worker'], self.known)}")
            if ev.event not in self.events:
                continue
            # escaped: a list like jury=[verifier-1, ...] is not rich markup
            parts = [escape(f"{k}={self._text(ev.event, k, v)}") for k, v in ev.args.items()]
            style = "red" if ev.event in ALARM else "green" if ev.event in GOOD \
                else "white"
            self.con.print(f"[dim]#{ev.block_number}[/] [{style}]{ev.contract}.{ev.event}[/] "
                           + " ".join(parts))


def run_demo(home: Path, timeout: float = 900.0) -> int:
    con = Console()
    con.rule("[bold]polnet demo")
    con.print(f"chain, node state and logs under {home}")
    with LocalNet(home, demo_params()) as net:
        dep = net.deployment
        assert dep is not None
        con.print(f"devnet up at {dep.rpc_url}: " +
                  ", ".join(f"{k} {v[:10]}…" for k, v in dep.contracts.items()))
        names = {net.address(SUBMITTER): "submitter", net.address(HONEST): "solver-honest",
                 net.address(CHEATER): "solver-cheat", net.address(DARK): "solver-dark",
                 **{net.address(v): f"verifier-{i + 1}" for i, v in enumerate(VERIFIERS)}}
        narrate = Narrator(net, names, con)
        before = {n: net.holdings(a) for a, n in names.items()}
        inputs = pack_inputs(home / "data")
        for i, v in enumerate(VERIFIERS, start=1):
            net.start_verifier(f"verifier-{i}", v)
        # The cheater starts first and takes the LM job, the dark solver the MLP job, the
        # honest solver the CNN job (one job at a time each, until it is paid or condemned);
        # the honest one takes the other two as they reopen.
        net.start_solver("solver-cheat", CHEATER, "lazy:0.5")
        con.print("3 verifiers and a cheating solver ([red]lazy:0.5[/]) are up")
        lm_job = net.submit("submitter-1", SUBMITTER, inputs["lm"], inputs["text"])
        net.wait_job(lm_job, {1, 2, 3}, 180, narrate)
        net.start_solver("solver-dark", DARK, "dark")
        con.print("a withholding solver ([red]dark[/]: commits a root, serves nothing) is up")
        mlp_job = net.submit("submitter-2", SUBMITTER, inputs["mlp"], inputs["digits"])
        net.wait_job(mlp_job, {1, 2, 3}, 180, narrate)
        net.start_solver("solver-honest", HONEST)
        con.print("an honest solver is up")
        cnn_job = net.submit("submitter-3", SUBMITTER, inputs["cnn"], inputs["digits"])
        net.wait_job(cnn_job, {1, 2, 3}, 180, narrate)
        ok = True
        try:
            # Condemned by evidence it could not give: it has lost its bond and leaves
            # (left running it would claim the reopened job again, and lose again).
            net.wait_event("Expired", timeout, contract="Availability", on_tick=narrate,
                           jobId=mlp_job)
            net.wait_event("RoundSettled", 300, contract="JobMarket", on_tick=narrate,
                           jobId=mlp_job)
            net.kill("solver-dark", signal.SIGTERM)
            con.print("the withholding solver, condemned without a replayed step, leaves")
            for job in (cnn_job, mlp_job, lm_job):
                net.wait_job(job, {3}, timeout, narrate)
            replayed = replayed_before_settlement(net.events(), mlp_job)
            if replayed:
                con.print(f"[red]the withholding solver's round saw {len(replayed)} "
                          "replay-backed moves")
                ok = False
        except Exception as exc:  # report, then still print balances
            con.print(f"[red]{exc}")
            ok = False
        time.sleep(5)  # let the daemons withdraw what they were credited
        narrate()
        after = {n: net.holdings(a) for a, n in names.items()}
        conserved = net.conserved()
    paid = print_balances(before, after, con)
    con.print("contracts' token balance equals what they owe: " +
              ("[green]every token accounted for" if conserved else "[red]MISMATCH"))
    return 0 if ok and paid and conserved else 1


def replayed_before_settlement(events: list[Any], job: int) -> list[Any]:
    """The replay-backed moves (a challenge, an attestation) on the job before its first
    round settled: none for a withholder condemned by an availability request."""
    mine = [e for e in events if e.args.get("jobId") == job]
    first = min(e.block_number for e in mine
                if e.event == "RoundSettled" and e.contract == "JobMarket")
    return [e for e in mine if e.event in ("Challenged", "Attested") and e.block_number <= first]


def holdings_table(before: dict[str, int], after: dict[str, int]) -> Table:
    t = Table(title="holdings (wallet + stake + credits), POL")
    for col in ("account", "before", "after", "change"):
        t.add_column(col, justify="right" if col != "account" else "left")
    for name in before:
        d = after[name] - before[name]
        t.add_row(name, f"{before[name] / TOKEN:,.4f}", f"{after[name] / TOKEN:,.4f}",
                  f"[{'green' if d > 0 else 'red' if d < 0 else 'white'}]{d / TOKEN:+,.4f}")
    return t


def print_balances(before: dict[str, int], after: dict[str, int], con: Console) -> bool:
    con.print(holdings_table(before, after))
    ok = after["solver-honest"] > before["solver-honest"] and \
        after["solver-cheat"] < before["solver-cheat"] and \
        after["solver-dark"] < before["solver-dark"]
    con.print("[green]the honest solver was paid, the cheater slashed and the withholder's "
              "bond split" if ok else
              "[red]settlement did not come out as expected")
    return ok
