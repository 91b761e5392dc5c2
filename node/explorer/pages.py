"""The explorer's HTML pages: plain server-rendered HTML and inline SVG, no scripts.

Every string that came from the chain or a file (peer ids, profiles, multiaddrs are
whatever a registrant typed) is escaped here, in one place (:func:`esc`), and the
server sends a Content-Security-Policy that forbids scripts anyway. Characters that
are invisible or reorder text (controls, bidi overrides and isolates, zero-width ones:
whatever Python does not call printable) are shown as ``\u202e``-style escapes, so a
registrant cannot make one peer id look like another or reverse the text around it.
"""

from __future__ import annotations

import html
import json
import math
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from node.chain.contracts import (
    CollabJob,
    DisputeState,
    Job,
    JobStatus,
    NodeInfo,
    OuterVerdict,
    Phase,
    Verdict,
    Vote,
)
from node.chain.events import ChainEvent
from node.chain.ids import CaseId, CollabId, DisputeId, JobId
from node.event_text import AMOUNT_FIELDS, TIME_FIELDS, address_text, field_text
from node.event_text import pol as pol_text
from node.explorer.index import MAX_JOBS, CollabRound, JuryCase, LossCurve, NodeRecord, Snapshot
from node.units import wei_to_pol, when

MAX_NAME = 32  # characters of a node's self-chosen name shown

STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
header{background:#1d2330;color:#fff;padding:10px 24px}header a{color:#fff;margin-right:18px}
main{padding:16px 24px;max-width:1200px}h1{font-size:20px}h2{font-size:16px;margin-top:26px}
table{border-collapse:collapse;background:#fff;margin:6px 0}
td,th{border:1px solid #d8dce3;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#eef0f4}.mono{font-family:ui-monospace,monospace;font-size:12px}
.finalized{color:#137333}.committed{color:#1a55b0}.open{color:#7a5b00}
.cancelled{color:#777}.claimed{color:#6b3fa0}.bad{color:#b3261e;font-weight:600}
.finished{color:#137333}.running{color:#1a55b0}.failed{color:#b3261e}
.muted{color:#6b7280}svg{background:#fff;border:1px solid #d8dce3}
"""


def visible(text: str) -> str:
    """``text`` with every non-printable character (Unicode categories C* and Z* but
    the plain space: U+202E, U+2066, U+200B, NUL, newlines...) written as an escape."""
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else
                   (f"\\u{ord(c):04x}" if ord(c) <= 0xFFFF else f"\\U{ord(c):08x}")
                   for c in text)


def esc(value: object) -> str:
    return html.escape(visible(str(value)), quote=True)


def pol(wei: int) -> str:
    return f"{wei_to_pol(wei)} POL"


def amount(wei: int) -> str:
    """An amount to a sensible precision (``3.33 POL``), the exact one on hover."""
    return f'<span title="{esc(pol(wei))}">{esc(pol_text(wei))}</span>'


def stamp(ts: int) -> str:
    """A unix time as the local time alone: for what is history (a final job's deadline,
    an event's fields), where "in 8 min" measured from now would mislead."""
    if ts == 0:
        return "-"
    return when(ts, ts).split(" (", 1)[0]


def node_name(info: NodeInfo) -> str | None:
    """The ``name`` a node put in its registry profile, if any (self-chosen: always shown
    beside its address, so it cannot pass for a contract or another node)."""
    try:
        prof = json.loads(info.profile)
    except ValueError:
        return None
    name = prof.get("name") if isinstance(prof, dict) else None
    return name[:MAX_NAME] if isinstance(name, str) and name.strip() else None


def names_of(snap: Snapshot) -> dict[str, str]:
    """Address -> label: contracts by name, nodes by ``name 0x1234…abcd`` (or the short
    address); the burn address is named by :func:`address_text`."""
    out = {a: f"{n} contract" for n, a in snap.addresses.items()}
    for a, n in snap.nodes.items():
        name = node_name(n.info)
        out[a] = f"{visible(name)} {short(a)}" if name else short(a)
    return out


def _utc(ts: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts))


def short(addr: str) -> str:
    return addr if len(addr) < 12 else f"{addr[:6]}…{addr[-4:]}"


def node_link(addr: str, snap: Snapshot | None = None) -> str:
    """A link to a node's page: its registered name (if any) beside the short address."""
    if not addr or int(addr, 16) == 0:
        return "-"
    rec = snap.nodes.get(addr) if snap is not None else None
    name = node_name(rec.info) if rec is not None else None
    label = f"{esc(name)} " if name else ""
    return (f'<a href="/node/{esc(addr)}" title="{esc(addr)}">{label}'
            f'<span class="mono">{esc(short(addr))}</span></a>')


def table(head: Sequence[str], rows: Iterable[Sequence[str]], cls: str = "") -> str:
    """A table; cells are HTML already (escape values before passing them)."""
    out = [f'<table class="{cls}">']
    if any(head):  # a key/value table has no header row
        out.append("<tr>" + "".join(f"<th>{esc(h)}</th>" for h in head) + "</tr>")
    n = 0
    for r in rows:
        out.append("<tr>" + "".join(f"<td>{c}</td>" for c in r) + "</tr>")
        n += 1
    if n == 0:
        out.append(f'<tr><td colspan="{len(head)}" class="muted">none</td></tr>')
    return "".join(out) + "</table>"


def page(title: str, body: str, snap: Snapshot) -> str:
    return (f"<!doctype html><html lang=en><head><meta charset=utf-8><title>{esc(title)} · "
            f"polnet explorer</title><style>{STYLE}</style></head><body><header>"
            f'<a href="/"><b>polnet explorer</b></a><a href="/">jobs</a><a href="/disputes">'
            f'disputes</a><a href="/collabs">collaborative</a><a href="/juries">outer juries</a>'
            f'<a href="/nodes">nodes</a><span class="muted">chain {snap.chain_id} · '
            f"block {snap.head} · {esc(_utc(snap.timestamp))}</span></header>"
            f"<main>{body}</main></body></html>")


def status_cell(job: Job) -> str:
    name = job.status.name.lower()
    return f'<span class="{name}">{esc(name)}</span>'


# How a dispute ended, said from the solver's side: "invalid" in red read as "this
# dispute is invalid" when it meant the solver's trace was.
VERDICT_TEXT = {Verdict.VALID: "solver won", Verdict.INVALID: "solver lost",
                Verdict.SOLVER_TIMED_OUT: "solver lost (timed out)",
                Verdict.VOID: "void (no quorum)"}


def _verdict(d: DisputeState) -> str:
    if d.verdict == Verdict.NONE:
        return esc(d.phase.name.lower())
    cls = "bad" if _lost(d) else ""
    return f'<span class="{cls}">{esc(VERDICT_TEXT.get(d.verdict, d.verdict.name.lower()))}</span>'


def _final(job: Job) -> bool:
    return job.status in (JobStatus.FINALIZED, JobStatus.CANCELLED)


def _lost_cell(snap: Snapshot, ds: list[DisputeState]) -> str:
    """The disputes column: how many, and for each lost one who lost it (the solver of
    that round, not necessarily the job's solver now)."""
    lost = [f'<span class="bad">{node_link(d.solver, snap)} lost '
            f'<a href="/dispute/{d.id}">dispute {d.id}</a></span>' for d in ds if _lost(d)]
    return esc(len(ds)) + ("<br>" + "<br>".join(lost) if lost else "")


# --- pages ---------------------------------------------------------------------------


def jobs_page(snap: Snapshot) -> str:
    rows = []
    for jid in sorted(snap.jobs, reverse=True)[:MAX_JOBS]:
        j = snap.jobs[jid]
        ds = snap.disputes_of(jid)
        paid = sum(p["amount"] for p in snap.payouts(jid))
        rows.append([f'<a href="/job/{jid}">{jid}</a>', status_cell(j), amount(j.reward),
                     node_link(j.solver, snap), esc(j.segment_count), esc(j.round),
                     f"{j.attestations}", _lost_cell(snap, ds), amount(paid)])
    more = (f'<p class="muted">the newest {MAX_JOBS}; older ones at /job/ID</p>'
            if len(snap.jobs) > MAX_JOBS else "")
    body = (f"<h1>Jobs ({snap.job_count})</h1>" + more
            + table(["job", "status", "reward", "solver", "segments", "round", "attestations",
                     "disputes", "paid out"], rows, "jobs"))
    return page("jobs", body, snap)


def _lost(d: DisputeState) -> bool:
    return d.verdict in (Verdict.INVALID, Verdict.SOLVER_TIMED_OUT)


def job_page(snap: Snapshot, jid: JobId, curve: LossCurve | None,
             sampled: list[int], committee: list[str], attestors: list[str],
             spec_name: str = "") -> str:
    j = snap.jobs[jid]
    now = snap.timestamp
    # A final job's deadline and window are history: "in 8 min" would read as pending.
    due = stamp if _final(j) else (lambda ts: when(ts, now))
    facts = [
        ("status", status_cell(j)), ("round", esc(j.round)),
        ("submitter", node_link(j.submitter, snap)), ("solver", node_link(j.solver, snap)),
        ("reward", amount(j.reward)), ("verification budget", amount(j.verification_budget)),
        ("solver bond", amount(j.bond)),
        ("steps", f"{j.total_steps} ({j.segment_count} segments of {j.steps_per_segment})"),
        ("posted", esc(when(j.posted_at, now))), ("deadline", esc(due(j.deadline))),
        ("window ends", esc(due(j.window_end))),
        ("trace root", f'<span class="mono">0x{j.trace_root.hex()}</span>'),
        ("spec", (f"{esc(spec_name)} " if spec_name else "")
         + f'<span class="mono">0x{j.spec_hash.hex()}</span>'),
        ("open disputes", esc(j.open_disputes)),
    ]
    sub = snap.sub_job_of.get(jid)
    if sub is not None:
        cid, r, slot = sub
        facts.insert(1, ("collaborative job", f'<a href="/collab/{cid}">{cid}</a>, round '
                                              f"{esc(r)}, slot {esc(slot)} (an inner run)"))
    body = [f"<h1>Job {jid}</h1>", table(["", ""], ([esc(k), v] for k, v in facts), "facts")]
    body.append("<h2>Loss per segment</h2>")
    if curve is None:
        body.append('<p class="muted">no trace of this round on this node (a solver\'s node '
                    "shows the curve of the trace it committed)</p>")
    else:
        names = names_of(snap)
        who = names.get(j.solver, short(j.solver)) if int(j.solver, 16) else "no solver"
        title = (f"job {jid}" + (f" · {spec_name}" if spec_name else "")
                 + f" · round {curve.round} · solver {who}")
        body.append(loss_svg(curve.losses, curve.steps_per_segment, title=title))
        body.append(table(["segment", "to step", "tokens seen", "loss"], (
            [esc(r["segment"]), esc(r["step"]),
             "-" if r["tokens_seen"] is None else esc(f"{r['tokens_seen']:,}"),
             esc(f"{r['loss']:.4f}")] for r in curve.rows()), "segments"))
        body.append(f'<p class="muted">from {esc(curve.source)}, round {curve.round}; its root '
                    "is the one committed on chain</p>")
    body.append("<h2>Sampled segments</h2>")
    body.append(f"<p>{esc(', '.join(map(str, sampled))) or 'not drawn yet'}</p>")
    body.append("<h2>Committee and attestations</h2>")
    body.append(table(["verifier", "attested"], ([node_link(a, snap), "yes" if a in attestors
                                                  else "no"] for a in committee), "committee"))
    body.append("<h2>Disputes</h2>")
    body.append(table(["dispute", "segment", "solver", "challenger", "state", "range now"],
                      ([f'<a href="/dispute/{d.id}">{d.id}</a>', esc(d.segment),
                        node_link(d.solver, snap), node_link(d.challenger, snap), _verdict(d),
                        f"{d.lo}..{d.hi}"] for d in snap.disputes_of(jid)), "disputes"))
    body.append("<h2>Payouts</h2>")
    body.append(table(["to", "amount", "why"],
                      ([node_link(p["to"], snap) if p["to"].startswith("0x") else esc(p["to"]),
                        amount(p["amount"]), esc(p["why"])] for p in snap.payouts(jid)),
                      "payouts"))
    body.append("<h2>Events</h2>")
    body.append(events_table(snap, snap.job_events.get(jid, []), skip=("jobId",)))
    return page(f"job {jid}", "".join(body), snap)


def events_table(snap: Snapshot, events: Iterable[ChainEvent],
                 skip: tuple[str, ...] = ()) -> str:
    names = names_of(snap)
    return table(["block", "event", "details"],
                 ([esc(e.block_number), esc(e.event),
                   "<br>".join(f"{esc(k)}: {event_field(snap, names, e.event, k, v)}"
                               for k, v in e.args.items() if k not in skip)]
                  for e in events), "events")


def event_field(snap: Snapshot, names: Mapping[str, str], event: str, field: str,
                value: Any) -> str:
    """One event field as HTML: decoded by :func:`node.event_text.field_text`; amounts
    rounded with the exact value on hover, times as local times (the relative time on
    hover), nodes linked by name."""
    if isinstance(value, str) and value.startswith("0x") and len(value) == 42:
        if value in snap.nodes:
            return node_link(value, snap)
        return f'<span title="{esc(value)}">{esc(address_text(value, names))}</span>'
    if isinstance(value, int) and not isinstance(value, bool):
        if field in AMOUNT_FIELDS:
            return amount(value)
        if field in TIME_FIELDS:
            return f'<span title="{esc(when(value, snap.timestamp))}">{esc(stamp(value))}</span>'
    return esc(field_text(event, field, value, names, now=snap.timestamp))


def dispute_page(snap: Snapshot, did: DisputeId) -> str:
    d = snap.disputes[did]
    now = snap.timestamp
    live = d.phase in (Phase.BISECTION, Phase.DRAWING, Phase.COMMIT, Phase.REVEAL)
    turn = d.next_move
    facts = [
        ("job", f'<a href="/job/{d.job_id}">{d.job_id}</a>'), ("segment", esc(d.segment)),
        ("solver", node_link(d.solver, snap)), ("challenger", node_link(d.challenger, snap)),
        ("state", _verdict(d)), ("turn", esc(turn)),
        ("solver clock left", esc(f"{d.solver_clock_left} s" if live else "-")),
        ("challenger clock left", esc(f"{d.challenger_clock_left} s" if live else "-")),
        ("challenge bond", amount(d.challenge_bond)),
        ("votes", f"valid {d.valid_votes} · invalid {d.invalid_votes}"),
        # a settled dispute's windows are history, not a countdown
        ("commit ends", esc(when(d.commit_end, now) if live else stamp(d.commit_end))),
        ("reveal ends", esc(when(d.reveal_end, now) if live else stamp(d.reveal_end))),
    ]
    rows = [[esc(i), f"{lo}..{hi}", esc(hi - lo)] for i, (lo, hi) in enumerate(snap.ranges(did))]
    votes: list[Vote | None] = [*d.votes, *([None] * (len(d.jury) - len(d.votes)))]
    jury = [[node_link(a, snap), esc(_vote(v))] for a, v in zip(d.jury, votes, strict=False)]
    body = (f"<h1>Dispute {did}</h1>" + table(["", ""], ([esc(k), v] for k, v in facts), "facts")
            + "<h2>Bisection: range per round</h2>" + table(["round", "steps", "width"], rows,
                                                             "rounds")
            + "<h2>Jury</h2>" + (table(["juror", "vote"], jury, "jury") if d.jury else
                                  '<p class="muted">no jury drawn (yet): the range must reach '
                                  "one step first</p>"))
    return page(f"dispute {did}", body, snap)


def _vote(v: Vote | None) -> str:
    if v is None:
        return "-"
    if v.revealed:
        return "valid" if v.valid else "invalid"
    return "committed" if v.commitment != bytes(32) else "silent"


def disputes_page(snap: Snapshot) -> str:
    rows = ([f'<a href="/dispute/{d.id}">{d.id}</a>', f'<a href="/job/{d.job_id}">{d.job_id}</a>',
             esc(d.segment), node_link(d.solver, snap), node_link(d.challenger, snap),
             _verdict(d), f"{d.lo}..{d.hi}", esc(d.rounds)]
            for d in sorted(snap.disputes.values(), key=lambda d: -d.id))
    body = "<h1>Disputes</h1>" + table(["dispute", "job", "segment", "solver", "challenger",
                                        "state", "range", "rounds"], rows, "disputes")
    return page("disputes", body, snap)


def nodes_page(snap: Snapshot) -> str:
    rows = ([node_link(n.address, snap), esc(_roles(n.info.roles)), amount(n.info.free_stake),
             amount(n.info.locked_stake), esc(n.jobs_solved), esc(n.attestations),
             f'<span class="{"bad" if n.slashed else ""}">{amount(n.slashed)}</span>']
            for n in snap.nodes.values())
    body = "<h1>Nodes</h1>" + table(["node", "roles", "free stake", "locked", "jobs solved",
                                     "attestations", "slashed"], rows, "nodes")
    return page("nodes", body, snap)


def node_page(snap: Snapshot, n: NodeRecord) -> str:
    i = n.info
    facts = [
        ("address", f'<span class="mono">{esc(n.address)}</span>'),
        ("roles", esc(_roles(i.roles))), ("peer id", f'<span class="mono">{esc(i.peer_id)}</span>'),
        ("multiaddrs", "<br>".join(f'<span class="mono">{esc(m)}</span>' for m in i.multiaddrs)),
        ("profile", f'<span class="mono">{esc(i.profile)}</span>'),
        ("name", esc(node_name(i) or "-")),
        ("free stake", amount(i.free_stake)), ("locked stake", amount(i.locked_stake)),
        ("unbonding", amount(i.unbonding_stake)),
        ("seat-locked (juror / attestor seats)", amount(i.seat_locked_stake)),
        ("jobs solved", esc(n.jobs_solved)), ("steps delivered", esc(n.steps_delivered)),
        ("rewards", amount(n.rewards)), ("attestations", esc(n.attestations)),
        ("credits to withdraw", amount(n.market_credits + n.game_credits + n.collab_credits)),
        ("slashed in all", f'<span class="{"bad" if n.slashed else ""}">{amount(n.slashed)}'
                           "</span>"),
    ]
    body = (f"<h1>Node {esc(short(n.address))}</h1>"
            + table(["", ""], ([esc(k), v] for k, v in facts), "facts")
            + "<h2>Slashes</h2>"
            + table(["block", "amount", "from", "for"],
                    ([esc(s["block"]), amount(s["amount"]), esc(s["from"]),
                      _slash_cause(snap, n.address, s)] for s in n.slashes), "slashes"))
    return page(f"node {short(n.address)}", body, snap)


def _slash_cause(snap: Snapshot, node: str, s: Mapping[str, Any]) -> str:
    """Links to the job and dispute a slash paid for. The registry's Slashed event names
    neither: the index matched the job (or dispute) by transaction; a bond slashed when
    the job was finalized was lost in the disputes of that job this node lost."""
    job, did, case = s.get("job"), s.get("dispute"), s.get("case")
    dids = ([int(did)] if did is not None else
            [d.id for d in snap.disputes_of(JobId(int(job))) if d.solver == node and _lost(d)]
            if job is not None else [])
    links = [f'<a href="/job/{int(job)}">job {int(job)}</a>'] if job is not None else []
    links += [f'<a href="/dispute/{i}">dispute {i}</a>' for i in dids]
    if case is not None:
        links.append(f'<a href="/jury/{int(case)}">outer jury case {int(case)}</a>')
    return " · ".join(links) or "-"


# --- collaborative jobs and their outer juries ------------------------------------------

# IOuterJury.Verdict / ICollabMarket.OuterVerdict, said from the posted outer state's side.
OUTER_TEXT = {OuterVerdict.VALID: "outer state stands (challenger lost)",
              OuterVerdict.INVALID: "outer state wrong (poster lost)",
              OuterVerdict.VOID: "void (no quorum or a tie)"}


def _collab_status(j: CollabJob) -> str:
    name = j.status.name.lower()
    return f'<span class="{esc(name)}">{esc(name)}</span>'


def _outer_verdict(v: int | None) -> str:
    if v is None:
        return "-"
    try:
        verdict = OuterVerdict(v)
    except ValueError:
        return esc(f"{v} (unknown)")
    cls = "bad" if verdict == OuterVerdict.INVALID else ""
    return f'<span class="{cls}">{esc(OUTER_TEXT.get(verdict, verdict.name.lower()))}</span>'


def _hash(h: bytes | None) -> str:
    if h is None:
        return "-"
    return f'<span class="mono" title="0x{h.hex()}">0x{h.hex()[:12]}…</span>'


def slot_holders(snap: Snapshot, cid: CollabId) -> dict[int, str]:
    """Slot -> its holder now, from SlotClaimed / SlotReleased."""
    out: dict[int, str] = {}
    for e in snap.collab_events.get(cid, []):
        if e.event == "SlotClaimed":
            out[int(e.args["slot"])] = str(e.args["node"])
        elif e.event == "SlotReleased":
            out.pop(int(e.args["slot"]), None)
    return dict(sorted(out.items()))


def collabs_page(snap: Snapshot) -> str:
    rows = []
    for cid in sorted(snap.collabs, reverse=True):
        j = snap.collabs[cid]
        rows.append([f'<a href="/collab/{cid}">{cid}</a>', _collab_status(j),
                     esc(j.phase.name.lower()), esc(f"{j.round} of {j.rounds}"),
                     node_link(j.submitter, snap), esc(f"{j.min_workers}..{j.max_workers}"),
                     esc(len(slot_holders(snap, cid))), amount(j.reward), amount(j.sub_reward),
                     esc(len(snap.rounds.get(cid, []))), esc(len(snap.juries_of(cid)))])
    body = (f"<h1>Collaborative jobs ({len(snap.collabs)})</h1>"
            + table(["job", "status", "round phase", "round", "submitter", "workers",
                     "slots held", "reward", "per sub-job", "round attempts", "outer juries"],
                    rows, "collabs"))
    return page("collaborative jobs", body, snap)


def _sub_jobs_cell(snap: Snapshot, rd: CollabRound) -> str:
    out = []
    for slot, jid in enumerate(rd.sub_jobs):
        if not jid:
            out.append(f"slot {slot}: -")
            continue
        j = snap.jobs.get(jid)
        state = ("accepted" if slot in rd.accepted else
                 f'<span class="bad">dropped: '
                 f'{esc(field_text("SubJobDropped", "reason", rd.dropped[slot]))}</span>'
                 if slot in rd.dropped else status_cell(j) if j is not None else "-")
        who = rd.workers.get(slot) or (j.solver if j is not None and int(j.solver, 16) else None)
        out.append(f'slot {slot}: <a href="/job/{jid}">job {jid}</a> '
                   + (node_link(who, snap) + " " if who else "") + state)
    return "<br>".join(out) or "-"


def _outer_cell(snap: Snapshot, rd: CollabRound) -> str:
    out = []
    for e in rd.posts:
        a = e.args
        if e.event == "OuterPosted":
            out.append(f"posted by {node_link(str(a['poster']), snap)}: "
                       f"{_hash(bytes(a['outerHash']))}")
        elif e.event == "OuterChallenged":
            case = int(a["juryCase"])
            out.append(f"challenged by {node_link(str(a['challenger']), snap)}: "
                       f'<a href="/jury/{case}">outer jury case {case}</a>')
        elif e.event == "OuterResolved":
            out.append(f"{_outer_verdict(int(a['verdict']))} ({esc(a['validVotes'])} valid, "
                       f"{esc(a['invalidVotes'])} invalid)")
    if rd.outer_accepted is not None:
        out.append(f"accepted: {_hash(rd.outer_accepted)}")
    return "<br>".join(out) or "-"


def collab_page(snap: Snapshot, cid: CollabId) -> str:
    j = snap.collabs[cid]
    facts = [
        ("status", _collab_status(j)), ("round phase", esc(j.phase.name.lower())),
        ("round", esc(f"{j.round} of {j.rounds} (retries of this one: {j.retries})")),
        ("submitter", node_link(j.submitter, snap)),
        ("workers", esc(f"{j.min_workers} to {j.max_workers}")),
        ("inner steps", esc(f"{j.inner_steps} per round ({j.steps_per_segment} per segment)")),
        ("round duration", esc(f"{j.round_duration} s")),
        ("reward", amount(j.reward)), ("verification budget", amount(j.verification_budget)),
        ("per sub-job", f"{amount(j.sub_reward)} + {amount(j.sub_budget)} verification"),
        ("pool left", amount(j.pool)),
        ("spec", f'<span class="mono">0x{j.spec_hash.hex()}</span>'),
        ("dataset", f'<span class="mono">0x{j.dataset_hash.hex()}</span>'),
        ("S_0 of the current round", f'<span class="mono">0x{j.init_state_hash.hex()}</span>'),
        ("outer state (last accepted)", f'<span class="mono">0x{j.outer_hash.hex()}</span>'),
    ]
    holders = slot_holders(snap, cid)
    body = [f"<h1>Collaborative job {cid}</h1>",
            table(["", ""], ([esc(k), v] for k, v in facts), "facts"),
            "<h2>Slots</h2>",
            table(["slot", "holder"], ([esc(s), node_link(a, snap)] for s, a in holders.items()),
                  "slots"),
            "<h2>Rounds</h2>",
            table(["round", "attempt", "started", "deadline", "sub-jobs (per slot)", "settled",
                   "outer state"],
                  ([esc(rd.round), esc(rd.attempt), f"block {esc(rd.started_block)}",
                    esc(stamp(rd.deadline)), _sub_jobs_cell(snap, rd),
                    ("retried (too few accepted)" if rd.retried else
                     "yes" + (f", {amount(rd.per_worker)} more per worker"
                              if rd.per_worker else "")) if rd.settled or rd.retried else "no",
                    _outer_cell(snap, rd)] for rd in snap.rounds.get(cid, [])), "rounds"),
            "<h2>Outer juries</h2>",
            _juries_table(snap, snap.juries_of(cid)),
            "<h2>Events</h2>",
            events_table(snap, snap.collab_events.get(cid, []), skip=("jobId",))]
    return page(f"collaborative job {cid}", "".join(body), snap)


def _juries_table(snap: Snapshot, cases: Iterable[JuryCase]) -> str:
    return table(["case", "job", "round", "challenger", "phase", "jury", "votes", "verdict"],
                 ([f'<a href="/jury/{c.id}">{c.id}</a>',
                   f'<a href="/collab/{c.job_id}">{c.job_id}</a>', esc(c.round),
                   node_link(c.challenger, snap) if c.challenger else "-", esc(c.phase),
                   esc(len(c.jury)), esc(f"{len(c.committed)} committed, "
                                         f"{len(c.revealed)} revealed"),
                   _outer_verdict(c.verdict)]
                  for c in sorted(cases, key=lambda c: -c.id)), "juries")


def juries_page(snap: Snapshot) -> str:
    body = (f"<h1>Outer juries ({len(snap.juries)})</h1>"
            '<p class="muted">each decides a challenged outer state of a collaborative job</p>'
            + _juries_table(snap, snap.juries.values()))
    return page("outer juries", body, snap)


def jury_page(snap: Snapshot, case_id: CaseId) -> str:
    c = snap.juries[case_id]
    now = snap.timestamp
    live = c.verdict is None
    facts = [
        ("collaborative job", f'<a href="/collab/{c.job_id}">{c.job_id}</a>'),
        ("round", esc(c.round)),
        ("challenger", node_link(c.challenger, snap) if c.challenger else "-"),
        ("phase", esc(c.phase)), ("requested", f"block {esc(c.requested_block)}"),
        ("drawn from", f"block {esc(c.draw_block)} ({esc(c.pool_len)} in the verifier pool)"),
        ("commit ends", esc((when(c.commit_end, now) if live else stamp(c.commit_end))
                            if c.jury else "-")),
        ("reveal ends", esc((when(c.reveal_end, now) if live else stamp(c.reveal_end))
                            if c.jury else "-")),
        ("verdict", _outer_verdict(c.verdict)),
        ("votes", esc(f"valid {c.valid_votes} · invalid {c.invalid_votes}")
         if not live else esc(f"{len(c.committed)} committed, {len(c.revealed)} revealed")),
    ]

    def vote(a: str) -> str:
        if a in c.revealed:
            return "valid" if c.revealed[a] else "invalid"
        return "committed" if a in c.committed else "silent" if not live else "-"

    jury = [[node_link(a, snap), esc(vote(a)),
             amount(c.slashed[a]) if a in c.slashed else "-"] for a in c.jury]
    body = (f"<h1>Outer jury case {case_id}</h1>"
            + table(["", ""], ([esc(k), v] for k, v in facts), "facts")
            + "<h2>Jury</h2>"
            + (table(["juror", "vote", "slashed"], jury, "jury") if c.jury else
               '<p class="muted">not drawn yet</p>')
            + "<h2>Events</h2>"
            + events_table(snap, snap.case_events.get(case_id, []), skip=("caseId",)))
    return page(f"outer jury case {case_id}", body, snap)


def not_found(snap: Snapshot, what: str) -> str:
    return page("not found", f"<h1>Not found</h1><p>{esc(what)}</p>"
                '<p><a href="/">all jobs</a></p>', snap)


def _roles(mask: int) -> str:
    names = [n for bit, n in ((1, "solver"), (2, "verifier")) if mask & bit]
    return ", ".join(names) or "-"


# --- the loss curve -----------------------------------------------------------------


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """Round tick values whose range covers [lo, hi] (so the lowest loss is never clipped)."""
    if hi - lo <= 1e-12 * max(1.0, abs(hi)):  # one value (or all equal): centre it
        d = abs(hi) * 0.05 or 0.5
        lo, hi = lo - d, hi + d
    span = hi - lo
    raw = span / (n - 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.floor(lo / step) * step
    out = [first]
    while out[-1] < hi - 1e-12 * step or len(out) < 2:
        out.append(first + len(out) * step)
    return out


def loss_svg(losses: Sequence[float], k: int, width: int = 640, height: int = 260,
             title: str = "") -> str:
    """A line chart of segment losses over training steps, as inline SVG: axis titles,
    y ticks spanning every value, the job and solver in its title."""
    pad_l, pad_r, pad_t, pad_b = 64, 16, 28, 44
    w, h = width - pad_l - pad_r, height - pad_t - pad_b
    vals = [float(x) for x in losses if math.isfinite(float(x))]
    if not vals:
        return '<p class="muted">no segments</p>'
    margin = 0.04 * (max(vals) - min(vals))  # no point sits on an axis or the frame
    ticks = _ticks(min(vals) - margin, max(vals) + margin)
    lo, hi = ticks[0], ticks[-1]
    span = hi - lo or 1.0
    n = len(vals)

    def xy(i: int, v: float) -> tuple[float, float]:
        x = pad_l + (w * i / (n - 1) if n > 1 else w / 2)
        return x, pad_t + h * (1 - (v - lo) / span)

    pts = " ".join(f"{x:.1f},{y:.1f}" for x, y in (xy(i, v) for i, v in enumerate(vals)))
    dots = "".join(f'<circle cx="{x:.1f}" cy="{y:.1f}" r="2.5" fill="#1a55b0"/>'
                   for x, y in (xy(i, v) for i, v in enumerate(vals)))
    axis = (f'<line x1="{pad_l}" y1="{pad_t + h}" x2="{pad_l + w}" y2="{pad_t + h}" '
            f'stroke="#888"/><line x1="{pad_l}" y1="{pad_t}" x2="{pad_l}" y2="{pad_t + h}" '
            'stroke="#888"/>')
    yt = "".join(f'<text class="ytick" x="{pad_l - 6}" y="{xy(0, t)[1] + 4:.1f}" '
                 f'text-anchor="end" font-size="11">{t:.4g}</text>'
                 f'<line x1="{pad_l}" y1="{xy(0, t)[1]:.1f}" x2="{pad_l + w}" '
                 f'y2="{xy(0, t)[1]:.1f}" stroke="#eee"/>' for t in ticks)
    labels = (f'<text x="{pad_l}" y="{pad_t + h + 16}" font-size="11">step {k}</text>'
              f'<text x="{pad_l + w}" y="{pad_t + h + 16}" text-anchor="end" font-size="11">'
              f"step {n * k}</text>"
              f'<text class="xtitle" x="{pad_l + w / 2:.0f}" y="{height - 6}" '
              'text-anchor="middle" font-size="12">training step (end of segment)</text>'
              f'<text class="ytitle" x="14" y="{pad_t + h / 2:.0f}" text-anchor="middle" '
              f'font-size="12" transform="rotate(-90 14 {pad_t + h / 2:.0f})">'
              "loss (segment mean)</text>"
              f'<text class="title" x="{pad_l}" y="16" font-size="12" font-weight="600">'
              f"{esc(title)}</text>")
    return (f'<svg class="loss" xmlns="http://www.w3.org/2000/svg" width="{width}" '
            f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
            f'aria-label="{esc(title or "loss per segment")}">{axis}{yt}{labels}'
            f'<polyline fill="none" stroke="#1a55b0" stroke-width="2" points="{pts}"/>{dots}'
            "</svg>")


__all__ = ["JobStatus", "collab_page", "collabs_page", "dispute_page", "disputes_page", "esc",
           "job_page", "jobs_page", "juries_page", "jury_page", "loss_svg", "node_page",
           "nodes_page", "not_found"]
