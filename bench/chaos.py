"""Chaos run (issue 12): a whole network under random SIGKILLs and RPC freezes.

A devnet with 2 solvers (one a cheater), 3 verifiers and a submitter posting a
bounded stream of small MLP-digits jobs. For ``--duration`` seconds it SIGKILLs
nodes of every role, at random moments and at moments picked from chain events
and node logs (mid-training, mid-commit, mid-replay, mid-dispute, mid-vote, while
the submitter serves its inputs), restarting each with the same ``--name`` (the
daemons resume from their state dirs; a submitter killed after its job was posted
comes back as ``polnet p2p serve`` on the same node directory: same key, same
store, no second post), and SIGSTOPs anvil for a few seconds now and then. Then
it stops killing, lets every job reach a final state (a job left open that no
solver takes is cancelled by the submitter) and checks the money:

- every job finalized or cancelled;
- no honest node slashed (``Slashed``, ``JurorSlashed``, ``AttestorSlashed``, a
  ``JobReclaimed`` that took stake);
- the cheater slashed if it was caught (a dispute on its work it lost);
- every honest node's holdings (wallet + stake + credits) equal what the chain
  says it is owed: its holdings before, plus every ``Credited`` to it, minus every
  ``Slashed`` of it and the escrow it posted;
- the contracts hold exactly what they owe.

Every loop is bounded in time and count; everything listens on 127.0.0.1.
Last line of stdout: JSON (exit status 1 if a check failed).

    .venv/bin/python bench/chaos.py --seed 1 --duration 600 --kills 24
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import random
import re
import shutil
import signal
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from devnet.localnet import TOKEN, LocalNet  # noqa: E402
from devnet.params import short_network_params  # noqa: E402
from node.chain.client import ChainClient  # noqa: E402
from node.chain.contracts import JobStatus  # noqa: E402
from node.chain.events import ChainEvent  # noqa: E402
from node.chain.ids import JobId  # noqa: E402
from node.demo import pack_inputs, spec_for  # noqa: E402
from node.spec import load_spec  # noqa: E402

SUBMITTER, HONEST, CHEATER, V1, V2, V3 = 1, 2, 3, 4, 5, 6
FINAL = (JobStatus.FINALIZED, JobStatus.CANCELLED)
PHASES = ("training", "commit", "replay", "dispute", "vote", "serving")
LOG_LINE = re.compile(r"\[(\w+)\s*\]\s+(\w+)(.*)$")
MAX_LOG_BYTES = 1 << 20  # read at most this much of one log per pass
EXITED_OK = (0, -signal.SIGKILL, -signal.SIGTERM)


@dataclass
class Node:
    name: str
    role: str  # solver | verifier | submitter
    account: int
    behavior: str = "honest"
    job_index: int = -1  # submitters: which job of the stream
    down_since: float | None = None
    restart_at: float | None = None
    last_kill: float = -1e9
    up_since: float = -1e9  # when it was last restarted
    posted: bool = False  # submitters: its job is on chain (restart = serve only)
    jobs: set[int] = field(default_factory=set)  # submitters: its jobs on chain
    done: bool = False    # submitters: its jobs are final; not restarted, not killed
    crashes: int = 0      # exits we did not cause


@dataclass
class Kill:
    t: float
    name: str
    role: str
    phase: str
    why: str

    def as_dict(self) -> dict[str, Any]:
        return {"t": round(self.t, 1), "node": self.name, "role": self.role,
                "phase": self.phase, "why": self.why}


@dataclass
class Chaos:
    net: LocalNet
    rng: random.Random
    args: argparse.Namespace
    data: Path
    nodes: dict[str, Node] = field(default_factory=dict)
    kills: list[Kill] = field(default_factory=list)
    freezes: list[float] = field(default_factory=list)
    specs: list[tuple[Path, str]] = field(default_factory=list)  # (path, spec hash hex)
    log_offsets: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    juries: dict[int, set[str]] = field(default_factory=dict)  # dispute -> not yet voted
    t0: float = field(default_factory=time.monotonic)
    dataset: Path = Path()

    def now(self) -> float:
        return time.monotonic() - self.t0

    def note(self, msg: str) -> None:
        line = f"[{self.now():7.1f}s] {msg}"
        self.notes.append(line)
        print(line, flush=True)

    # --- nodes ---------------------------------------------------------------------------

    def _refresh_boot(self) -> None:
        """Bootstrap new processes from a node that is up now (a restarted node has a new
        port; the registry loop finds the rest)."""
        for n in self.nodes.values():
            if n.role == "submitter" or n.down_since is not None:
                continue
            path = self.net.home / "nodes" / n.name / "node.json"
            p = self.net.procs.get(n.name)
            try:
                info = json.loads(path.read_text())
            except (OSError, ValueError):
                continue
            if p is not None and p.poll() is None and info.get("pid") == p.pid:
                self.net._boot = info["addrs"][0]
                return

    def start(self, n: Node) -> None:
        self._refresh_boot()
        net = self.net
        if n.role == "solver":
            net.polnet(n.name, "solver", "run", *net.node_args(n.name, n.account),
                       "--behavior", n.behavior)
        elif n.role == "verifier":
            net.polnet(n.name, "verifier", "run", *net.node_args(n.name, n.account))
        elif n.posted:  # the job is on chain: serve its inputs again, do not post twice
            boot = ["--bootstrap", net._boot] if net._boot else []
            net.polnet(n.name, "p2p", "serve", "--name", n.name, *boot)
        else:
            spec, _ = self.specs[n.job_index]
            net.polnet(n.name, "job", "submit", str(spec), "--dataset", str(self.dataset),
                       "--reward", "100", "--budget", "12", "--solve-duration", "300",
                       *net.node_args(n.name, n.account))
        n.down_since = n.restart_at = None
        if n.last_kill > -1e9:  # a restart (a first start may be killed at once)
            n.up_since = self.now()

    def kill(self, n: Node, phase: str, why: str) -> None:
        self.net.kill(n.name, signal.SIGKILL)
        t = self.now()
        n.down_since, n.last_kill = t, t
        n.restart_at = t + self.rng.uniform(0.5, 4.0)
        self.kills.append(Kill(t, n.name, n.role, phase, why))
        self.note(f"KILL {n.name} ({n.role}) phase={phase}: {why}")

    def alive(self, n: Node) -> bool:
        p = self.net.procs.get(n.name)
        return n.down_since is None and p is not None and p.poll() is None

    def killable(self, n: Node, min_gap: float = 8.0, min_up: float = 15.0) -> bool:
        """Up ``min_up`` s since a restart, too: a node needs a few seconds to boot and
        then time to act. The devnet's vote windows are 20-25 s (production's are hours),
        so a juror killed twice in one of them was silent through no fault of its own
        (CI, stop 20: one honest slash)."""
        return (self.alive(n) and not n.done and self.now() - n.last_kill >= min_gap
                and self.now() - n.up_since >= min_up)

    def supervise(self) -> None:
        """Restart killed nodes when due; restart (and count) nodes that died on their own;
        stop submitters whose jobs are all final."""
        for n in self.nodes.values():
            p = self.net.procs.get(n.name)
            if n.done:
                continue
            if n.down_since is not None:
                if n.restart_at is not None and self.now() >= n.restart_at:
                    self.start(n)
                    self.note(f"restart {n.name}"
                              + (" (serving only)" if n.role == "submitter" and n.posted
                                 else ""))
                continue
            if p is None or p.poll() is None:
                continue
            if n.role == "submitter" and p.returncode == 0:
                n.done = True  # `job submit` returns once its job is final
                continue
            if p.returncode not in EXITED_OK or n.role != "submitter":
                n.crashes += 1
                self.note(f"CRASH {n.name} exited with {p.returncode}; see "
                          f"{self.net.home}/logs/{n.name}.log (restarting)")
            n.down_since, n.restart_at = self.now(), self.now() + 1.0

    # --- what the network is doing ------------------------------------------------------

    def new_log_lines(self) -> list[tuple[Node, str, str]]:
        out = []
        for n in self.nodes.values():
            path = self.net.home / "logs" / f"{n.name}.log"
            try:
                with path.open("rb") as f:
                    f.seek(self.log_offsets.get(n.name, 0))
                    chunk = f.read(MAX_LOG_BYTES)
            except OSError:
                continue
            end = chunk.rfind(b"\n") + 1
            self.log_offsets[n.name] = self.log_offsets.get(n.name, 0) + end
            for raw in chunk[:end].decode(errors="replace").splitlines():
                m = LOG_LINE.search(raw)
                if m:
                    out.append((n, m.group(2), m.group(3)))
        return out

    def triggers(self, evs: list[ChainEvent]) -> list[tuple[str, Node, str]]:
        """Moments worth a kill: (phase, node to kill, why)."""
        by_addr = {self.net.address(n.account).lower(): n for n in self.nodes.values()
                   if n.role != "submitter"}
        out: list[tuple[str, Node, str]] = []
        for n, event, rest in self.new_log_lines():
            if n.role == "solver" and event == "training":
                out.append(("training", n, f"log training{rest[:60]}"))
            elif n.role == "solver" and (event == "trace_published" or (
                    event == "job_phase" and "committing" in rest)):
                out.append(("commit", n, f"log {event}"))
            elif n.role == "solver" and event == "mids_posted":
                out.append(("dispute", n, "log mids_posted"))
            elif n.role == "verifier" and event in ("checking", "verdict"):
                out.append(("replay", n, f"log {event}"))
            elif n.role == "verifier" and event in ("challenged", "part_chosen",
                                                    "range_replayed"):
                out.append(("dispute", n, f"log {event}"))
            elif n.role == "verifier" and event == "vote_committed":
                out.append(("vote", n, "log vote_committed (before its reveal)"))
        for ev in evs:
            if ev.event == "JobClaimed":
                s = by_addr.get(str(ev.args["solver"]).lower())
                if s:
                    out.append(("training", s, f"JobClaimed job {ev.args['jobId']}"))
            elif ev.event == "ResultCommitted":  # it may not have written its phase yet
                s = by_addr.get(str(ev.args.get("solver", "")).lower())
                if s:
                    out.append(("commit", s, f"ResultCommitted job {ev.args['jobId']}"))
            elif ev.event == "DisputeOpened":
                who = self.rng.choice(("solver", "challenger"))
                s = by_addr.get(str(ev.args[who]).lower())
                if s:
                    out.append(("dispute", s, f"DisputeOpened {ev.args['id']} ({who})"))
            elif ev.event in ("MidsPosted", "RangeNarrowed"):
                out.append(("dispute", self.rng.choice([n for n in self.nodes.values()
                                                        if n.role != "submitter"]),
                            f"{ev.event} dispute {ev.args['id']}"))
            elif ev.event == "JuryDrawn" and ev.args["jury"]:
                self.juries[int(ev.args["id"])] = {str(a).lower() for a in ev.args["jury"]}
                j = by_addr.get(str(self.rng.choice(ev.args["jury"])).lower())
                if j:
                    out.append(("vote", j, f"JuryDrawn dispute {ev.args['id']} (juror)"))
            elif ev.event == "VoteCommitted":  # a juror still voting: replaying, committing
                jury = self.juries.setdefault(int(ev.args["id"]), set())
                jury.discard(str(ev.args["juror"]).lower())
                for a in sorted(jury):
                    if a in by_addr:
                        out.append(("vote", by_addr[a], f"VoteCommitted dispute "
                                    f"{ev.args['id']} by another juror"))
            elif ev.event == "JobPosted":  # its submitter, serving the inputs now
                jid = JobId(int(ev.args["jobId"]))
                subs = [n for n in self.nodes.values() if n.role == "submitter"
                        and jid in n.jobs]
                if subs:
                    out.append(("serving", subs[-1], f"JobPosted {jid}"))
        return out

    # --- the stream of jobs ----------------------------------------------------------------

    def job_statuses(self) -> dict[JobId, JobStatus]:
        m = self.net.c.market
        return {j: m.get_job(j).status for j in map(JobId, range(1, m.job_count() + 1))}

    def posting(self) -> bool:
        """A submitter whose job is not on chain yet (posting is one at a time: one
        account, one nonce sequence)."""
        return any(n.role == "submitter" and not n.posted and not n.done
                   for n in self.nodes.values())

    def mark_posted(self, evs: list[ChainEvent]) -> None:
        for ev in evs:
            if ev.event != "JobPosted":
                continue
            h = bytes(ev.args["specHash"]).hex()
            for n in self.nodes.values():
                if n.role == "submitter" and self.specs[n.job_index][1] == h:
                    n.posted = True
                    n.jobs.add(int(ev.args["jobId"]))

    def maybe_post(self, statuses: dict[JobId, JobStatus]) -> None:
        posted = sum(1 for n in self.nodes.values() if n.role == "submitter")
        live = sum(1 for s in statuses.values() if s not in FINAL)
        if posted >= self.args.jobs or live >= self.args.concurrent or self.posting():
            return
        n = Node(f"sub{posted}", "submitter", SUBMITTER, job_index=posted)
        self.nodes[n.name] = n
        self.start(n)
        self.note(f"post job #{posted} from {n.name}")

    def submitters_done(self, statuses: dict[JobId, JobStatus]) -> None:
        """A serving-only submitter (restarted) is stopped once its jobs are final."""
        for n in self.nodes.values():
            if n.role == "submitter" and n.posted and not n.done and n.jobs \
                    and all(statuses.get(JobId(j)) in FINAL for j in n.jobs):
                p = self.net.procs.get(n.name)
                if p is not None and p.poll() is None:
                    self.net.kill(n.name, signal.SIGTERM)
                n.done = True


def pick_random(ch: Chaos) -> Node | None:
    """A random live node, the role first (so every role is hit), then the node."""
    roles: dict[str, list[Node]] = {}
    for n in ch.nodes.values():
        if ch.killable(n):
            roles.setdefault(n.role, []).append(n)
    if not roles:
        return None
    unhit = sorted(set(roles) - {k.role for k in ch.kills})  # every role, early
    role = ch.rng.choice(unhit or sorted(roles))
    return ch.rng.choice(roles[role])


def run(args: argparse.Namespace, home: Path) -> dict[str, Any]:
    rng = random.Random(args.seed)
    t_start = time.monotonic()
    data = home / "data"
    inputs = pack_inputs(data)
    digits_hash = hashlib.sha256(inputs["digits"].read_bytes()).hexdigest()
    with LocalNet(home / "net", short_network_params()) as net:
        ch = Chaos(net, rng, args, data, dataset=inputs["digits"])
        for j in range(args.jobs):  # distinct specs: each job's inputs come from its submitter
            path = spec_for("mlp_digits.toml", digits_hash, data / f"job{j}.toml",
                            total_steps=args.steps, seed=100 + j)
            ch.specs.append((path, load_spec(path).spec_hash().hex()))
        honest_addrs = {net.address(a): n for a, n in ((HONEST, "honest"), (V1, "v1"),
                                                       (V2, "v2"), (V3, "v3"))}
        cheater = net.address(CHEATER)
        accounts = {**honest_addrs, cheater: "cheat", net.address(SUBMITTER): "submitter"}
        start_block = net.c.block_number()
        before = {a: net.holdings(a) for a in accounts}
        for name, acct in (("v1", V1), ("v2", V2), ("v3", V3)):
            ch.nodes[name] = Node(name, "verifier", acct)
            net.start_verifier(name, acct)
        ch.nodes["honest"] = Node("honest", "solver", HONEST)
        ch.nodes["cheat"] = Node("cheat", "solver", CHEATER, behavior=args.cheat)
        net.start_solver("cheat", CHEATER, args.cheat)
        net.start_solver("honest", HONEST)
        ch.note(f"network up: 3 verifiers, honest solver, cheater ({args.cheat})")

        # --- chaos ------------------------------------------------------------------------
        ch.t0 = time.monotonic()
        freeze_at = sorted(rng.uniform(0.15, 0.85) * args.duration for _ in range(args.freezes))
        want = max(1, math.ceil(args.kills / 10))  # targeted kills per phase wanted
        hits = dict.fromkeys(PHASES, 0)
        # A third of the kills (at least 2) at random moments, whatever else happens.
        random_gap = args.duration / max(2, args.kills // 3)
        next_random = rng.uniform(0.2, 1.0) * random_gap
        last_kill = -1e9
        max_kills = 2 * args.kills
        statuses: dict[JobId, JobStatus] = {}
        for _ in range(100_000):  # bounded: the duration ends it
            if ch.now() >= args.duration:
                break
            evs = net.new_events()
            ch.mark_posted(evs)
            statuses = ch.job_statuses()
            ch.submitters_done(statuses)
            ch.maybe_post(statuses)
            ch.supervise()
            if freeze_at and ch.now() >= freeze_at[0]:
                secs = rng.uniform(3.0, 6.0)
                ch.note(f"FREEZE anvil (SIGSTOP) for {secs:.1f}s")
                net.pause_rpc(secs)
                ch.freezes.append(round(secs, 1))
                freeze_at.pop(0)
            if len(ch.kills) < max_kills:
                for phase, n, why in ch.triggers(evs):
                    p_kill = 0.85 if hits[phase] < want else 0.12
                    if ch.now() - last_kill >= 2.0 and ch.killable(n) and rng.random() < p_kill:
                        ch.kill(n, phase, why)
                        hits[phase] += 1
                        last_kill = ch.now()
                if ch.now() >= next_random:
                    victim = pick_random(ch)
                    if victim is not None:
                        ch.kill(victim, "random", "random moment")
                        last_kill = ch.now()
                    next_random = ch.now() + rng.uniform(0.5, 1.5) * random_gap
            time.sleep(0.3)
        ch.note(f"chaos over: {len(ch.kills)} kills, {len(ch.freezes)} freezes")

        # --- settle ---------------------------------------------------------------------
        for n in ch.nodes.values():  # everything killed comes back now
            if n.down_since is not None:
                n.restart_at = 0.0
        ch.supervise()
        settle_end = time.monotonic() + args.settle_timeout
        open_since: dict[int, float] = {}
        cancelled_stuck: list[dict[str, Any]] = []
        sub_client = ChainClient.from_deployment(net.deployment, SUBMITTER)
        for _ in range(100_000):
            if time.monotonic() >= settle_end:
                break
            evs = net.new_events()
            ch.mark_posted(evs)
            ch.supervise()
            statuses = ch.job_statuses()
            ch.submitters_done(statuses)
            if all(s in FINAL for s in statuses.values()) and not ch.posting():
                break
            for j, s in statuses.items():
                if s != JobStatus.OPEN:
                    open_since.pop(j, None)
                    continue
                open_since.setdefault(j, time.monotonic())
                if time.monotonic() - open_since[j] > args.stuck_open_s and not ch.posting():
                    cancelled_stuck.append({"job": j, "open_s": args.stuck_open_s,
                                            "solvers": solver_views(net, j)})
                    ch.note(f"job {j} open {args.stuck_open_s:.0f}s with no taker: "
                            f"cancelling ({cancelled_stuck[-1]['solvers']})")
                    try:
                        sub_client.market.cancel(j)
                    except Exception as exc:  # claimed meanwhile: keep waiting
                        ch.note(f"cancel {j} failed: {exc}")
            time.sleep(1.0)
        statuses = ch.job_statuses()
        # Let the daemons withdraw what the last settlements credited them (bounded).
        for _ in range(60):
            if all(net.c.market.credits(a) + net.c.dispute.credits(a) == 0
                   for a in honest_addrs):
                break
            time.sleep(1.0)
        if sub_client.market.credits(net.address(SUBMITTER)):
            sub_client.market.withdraw()
        evs = [e for e in net.events() if e.block_number > start_block]
        after = {a: net.holdings(a) for a in accounts}
        credits_left = {honest_addrs[a]: net.c.market.credits(a) + net.c.dispute.credits(a)
                        for a in honest_addrs}
        locked_left = {honest_addrs[a]: net.c.registry.locked_stake(a) for a in honest_addrs}
        conserved_gap = net.contracts_gap()
        bond = net.c.availability.availability_params().bond \
            if "Availability" in net.deployment.contracts else 0  # type: ignore[union-attr]
        crashes = {n.name: n.crashes for n in ch.nodes.values() if n.crashes}

    # --- verdicts -----------------------------------------------------------------------
    expected = {a: before[a] + owed_delta(evs, a, bond) for a in accounts}
    mismatch = {accounts[a]: after[a] - expected[a] for a in accounts if after[a] != expected[a]}
    honest_slashes = slashes_of(evs, set(honest_addrs))
    names = {a.lower(): n for a, n in honest_addrs.items()}
    cheater_slashed = bool(slashes_of(evs, {cheater}))
    caught = cheater_caught(evs, cheater)
    unfinished = {j: s.name for j, s in statuses.items() if s not in FINAL}
    kills_by_role: dict[str, int] = {}
    kills_by_phase: dict[str, int] = {}
    for k in ch.kills:
        kills_by_role[k.role] = kills_by_role.get(k.role, 0) + 1
        kills_by_phase[k.phase] = kills_by_phase.get(k.phase, 0) + 1
    unaccounted = sum(abs(v) for v in mismatch.values()) + abs(conserved_gap)
    failures = []
    if unfinished:
        failures.append(f"jobs not final: {unfinished}")
    if honest_slashes:
        failures.append(f"honest nodes slashed: {honest_slashes}")
    if caught and not cheater_slashed:
        failures.append("the cheater was caught but not slashed")
    if unaccounted:
        failures.append(f"tokens unaccounted: holdings off by {mismatch}, "
                        f"contracts off by {conserved_gap}")
    if crashes:
        failures.append(f"nodes exited on their own: {crashes}")
    result = {
        "bench": "chaos", "seed": args.seed, "duration_s": args.duration,
        "kills": len(ch.kills), "kills_by_role": kills_by_role,
        "kills_by_phase": kills_by_phase, "rpc_freezes": len(ch.freezes),
        "jobs_posted": sum(1 for e in evs if e.event == "JobPosted"),
        "jobs_settled": sum(1 for s in statuses.values() if s == JobStatus.FINALIZED),
        "jobs_cancelled": sum(1 for s in statuses.values() if s == JobStatus.CANCELLED),
        "jobs_cancelled_stuck_open": cancelled_stuck, "jobs_unfinished": unfinished,
        "disputes": sum(1 for e in evs if e.event == "DisputeOpened"),
        "honest_slashes": len(honest_slashes), "tokens_unaccounted": unaccounted,
        "honest_slash_events": [{**s, "name": names.get(s["who"].lower(), s["who"])}
                                for s in honest_slashes],
        "cheater_caught": caught, "cheater_slashed": cheater_slashed,
        "cheater_change_pol": (after[cheater] - before[cheater]) / TOKEN,
        "honest_change_pol": {honest_addrs[a]: (after[a] - before[a]) / TOKEN
                              for a in honest_addrs},
        "credits_unwithdrawn": {k: v for k, v in credits_left.items() if v},
        "stake_locked_left": {k: v for k, v in locked_left.items() if v},
        "crashes": crashes, "failures": failures, "ok": not failures,
        "kill_log": [k.as_dict() for k in ch.kills],
        "wall_s": round(time.monotonic() - t_start, 1),
    }
    return result


def solver_views(net: LocalNet, job: JobId) -> dict[str, Any]:
    """What each solver's state file says about a job nobody takes (for the report)."""
    out: dict[str, Any] = {}
    for name in ("honest", "cheat"):
        try:
            st = json.loads((net.home / "nodes" / name / "solver.json").read_text())
        except (OSError, ValueError):
            continue
        out[name] = {"candidate": job in st.get("candidates", []),
                     "rejected": st.get("rejected", {}).get(str(job)),
                     "phase": st.get("jobs", {}).get(str(job), {}).get("phase"),
                     "active": [k for k, i in st.get("jobs", {}).items()
                                if i.get("phase") in ("training", "committing", "committed")]}
    return out


def owed_delta(evs: list[ChainEvent], addr: str, request_bond: int = 0) -> int:
    """How an account's holdings should have changed by the chain's own record: credits
    in, slashed stake and posted escrow out (stake, locks and withdrawals move tokens
    between its own pockets), and availability bonds: out when a request is made, back on
    expiry, split between the solver and the requester when answered (transfers, not
    credits: no ``Credited`` event names them)."""
    a = addr.lower()
    d = 0
    solver_of: dict[int, str] = {}  # the job's solver as of each event, from the claims
    requester: dict[int, str] = {}
    for e in evs:
        if e.event == "JobClaimed":
            solver_of[int(e.args["jobId"])] = str(e.args["solver"]).lower()
        elif e.event == "Requested" and "challenger" in e.args:
            requester[int(e.args["requestId"])] = str(e.args["challenger"]).lower()
            if requester[int(e.args["requestId"])] == a:
                d -= request_bond
        elif e.event == "Answered":
            if solver_of.get(int(e.args["jobId"])) == a:
                d += int(e.args["toSolver"])
            if requester.get(int(e.args["requestId"])) == a:
                d += int(e.args["toChallenger"])
        elif e.event == "Expired" and str(e.args["challenger"]).lower() == a:
            d += int(e.args["refund"])
        elif e.event == "Credited" and str(e.args["account"]).lower() == a:
            d += int(e.args["amount"])
        elif e.event == "Slashed" and str(e.args["node"]).lower() == a:
            d -= int(e.args["amount"])
        elif e.event == "JobPosted" and str(e.args["submitter"]).lower() == a:
            d -= int(e.args["reward"]) + int(e.args["verificationBudget"])
    return d


def slashes_of(evs: list[ChainEvent], addrs: set[str]) -> list[dict[str, Any]]:
    """Stake taken from ``addrs``: one entry per slash (a juror's or attestor's slash is
    also the registry's ``Slashed`` in the same block: counted once)."""
    low = {a.lower() for a in addrs}
    out: list[dict[str, Any]] = []
    named = {(e.block_number, str(e.args[w]).lower(), int(e.args["amount"])) for e in evs
             for ev_name, w in (("JurorSlashed", "juror"), ("AttestorSlashed", "attestor"))
             if e.event == ev_name}
    for e in evs:
        if e.event == "Slashed" and (e.block_number, str(e.args["node"]).lower(),
                                     int(e.args["amount"])) in named:
            continue
        who = {"Slashed": "node", "JurorSlashed": "juror", "AttestorSlashed": "attestor",
               "JobReclaimed": "solver"}.get(e.event)
        if who is None or str(e.args[who]).lower() not in low:
            continue
        amount = int(e.args.get("amount", e.args.get("slashed", 0)))
        if amount:
            out.append({"event": e.event, "who": str(e.args[who]), "amount": amount,
                        "block": e.block_number,
                        **{k: int(v) for k, v in e.args.items() if k in ("id", "jobId")}})
    return out


def cheater_caught(evs: list[ChainEvent], cheater: str) -> bool:
    """A dispute on the cheater's work that it lost (invalid, or it ran out of time)."""
    theirs = {int(e.args["id"]) for e in evs if e.event == "DisputeOpened"
              and str(e.args["solver"]).lower() == cheater.lower()}
    return any(e.event == "DisputeResolved" and e.contract == "DisputeGame"
               and int(e.args["id"]) in theirs and int(e.args["verdict"]) in (2, 3)
               for e in evs)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--duration", type=float, default=600.0, help="seconds of killing")
    ap.add_argument("--kills", type=int, default=24, help="kills to aim at")
    ap.add_argument("--freezes", type=int, default=2, help="anvil SIGSTOPs (3-6 s each)")
    ap.add_argument("--jobs", type=int, default=8, help="jobs in the stream")
    ap.add_argument("--concurrent", type=int, default=2, help="unfinished jobs at a time")
    ap.add_argument("--steps", type=int, default=40, help="training steps per job")
    ap.add_argument("--cheat", default="lazy:0.5", help="the cheating solver's --behavior")
    ap.add_argument("--settle-timeout", type=float, default=900.0)
    ap.add_argument("--stuck-open-s", type=float, default=90.0,
                    help="after the chaos, a job open this long with no taker is cancelled")
    ap.add_argument("--home", type=Path, default=None, help="keep chain, state and logs here")
    args = ap.parse_args(argv)
    if args.home is not None:
        if args.home.exists():
            shutil.rmtree(args.home)
        result = run(args, args.home)
    else:
        with tempfile.TemporaryDirectory(prefix="polnet-chaos-") as tmp:
            result = run(args, Path(tmp))
    print(json.dumps(result), flush=True)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
