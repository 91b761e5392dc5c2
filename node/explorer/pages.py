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
import time
from collections.abc import Iterable, Sequence
from typing import Any

from node.chain.contracts import DisputeState, Job, JobStatus, Phase, Verdict, Vote
from node.explorer.index import LossCurve, NodeRecord, Snapshot
from node.units import wei_to_pol, when

STYLE = """
body{font:14px/1.45 system-ui,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}
header{background:#1d2330;color:#fff;padding:10px 24px}header a{color:#fff;margin-right:18px}
main{padding:16px 24px;max-width:1200px}h1{font-size:20px}h2{font-size:16px;margin-top:26px}
table{border-collapse:collapse;background:#fff;margin:6px 0}
td,th{border:1px solid #d8dce3;padding:4px 8px;text-align:left;vertical-align:top}
th{background:#eef0f4}.mono{font-family:ui-monospace,monospace;font-size:12px}
.finalized{color:#137333}.committed{color:#1a55b0}.open{color:#7a5b00}
.cancelled{color:#777}.claimed{color:#6b3fa0}.bad{color:#b3261e;font-weight:600}
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


def _utc(ts: int) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(ts))


def short(addr: str) -> str:
    return addr if len(addr) < 12 else f"{addr[:6]}…{addr[-4:]}"


def node_link(addr: str) -> str:
    if not addr or int(addr, 16) == 0:
        return "-"
    return f'<a class="mono" href="/node/{esc(addr)}" title="{esc(addr)}">{esc(short(addr))}</a>'


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
            f'disputes</a><a href="/nodes">nodes</a><span class="muted">chain {snap.chain_id} · '
            f"block {snap.head} · {esc(_utc(snap.timestamp))}</span></header>"
            f"<main>{body}</main></body></html>")


def status_cell(job: Job) -> str:
    name = job.status.name.lower()
    return f'<span class="{name}">{esc(name)}</span>'


def _verdict(d: DisputeState) -> str:
    if d.verdict == Verdict.NONE:
        return esc(d.phase.name.lower())
    cls = "bad" if d.verdict in (Verdict.INVALID, Verdict.SOLVER_TIMED_OUT) else ""
    return f'<span class="{cls}">{esc(d.verdict.name.lower())}</span>'


# --- pages ---------------------------------------------------------------------------


def jobs_page(snap: Snapshot) -> str:
    rows = []
    for jid in sorted(snap.jobs, reverse=True):
        j = snap.jobs[jid]
        ds = snap.disputes_of(jid)
        paid = sum(p["amount"] for p in snap.payouts(jid))
        rows.append([f'<a href="/job/{jid}">{jid}</a>', status_cell(j), esc(pol(j.reward)),
                     node_link(j.solver), esc(j.segment_count), esc(j.round),
                     f"{j.attestations}", esc(len(ds)) + (" <span class=bad>(lost)</span>"
                                                          if any(_lost(d) for d in ds) else ""),
                     esc(pol(paid))])
    body = (f"<h1>Jobs ({snap.job_count})</h1>"
            + table(["job", "status", "reward", "solver", "segments", "round", "attestations",
                     "disputes", "paid out"], rows, "jobs"))
    return page("jobs", body, snap)


def _lost(d: DisputeState) -> bool:
    return d.verdict in (Verdict.INVALID, Verdict.SOLVER_TIMED_OUT)


def job_page(snap: Snapshot, jid: int, curve: LossCurve | None,
             sampled: list[int], committee: list[str], attestors: list[str]) -> str:
    j = snap.jobs[jid]
    now = snap.timestamp
    facts = [
        ("status", status_cell(j)), ("round", esc(j.round)),
        ("submitter", node_link(j.submitter)), ("solver", node_link(j.solver)),
        ("reward", esc(pol(j.reward))), ("verification budget", esc(pol(j.verification_budget))),
        ("solver bond", esc(pol(j.bond))),
        ("steps", f"{j.total_steps} ({j.segment_count} segments of {j.steps_per_segment})"),
        ("posted", esc(when(j.posted_at, now))), ("deadline", esc(when(j.deadline, now))),
        ("window ends", esc(when(j.window_end, now))),
        ("trace root", f'<span class="mono">0x{j.trace_root.hex()}</span>'),
        ("spec hash", f'<span class="mono">0x{j.spec_hash.hex()}</span>'),
        ("open disputes", esc(j.open_disputes)),
    ]
    body = [f"<h1>Job {jid}</h1>", table(["", ""], ([esc(k), v] for k, v in facts), "facts")]
    body.append("<h2>Loss per segment</h2>")
    if curve is None:
        body.append('<p class="muted">no trace of this round on this node (a solver\'s node '
                    "shows the curve of the trace it committed)</p>")
    else:
        body.append(loss_svg(curve.losses, curve.steps_per_segment))
        body.append(f'<p class="muted">from {esc(curve.source)}, round {curve.round}; its root '
                    "is the one committed on chain</p>")
    body.append("<h2>Sampled segments</h2>")
    body.append(f"<p>{esc(', '.join(map(str, sampled))) or 'not drawn yet'}</p>")
    body.append("<h2>Committee and attestations</h2>")
    body.append(table(["verifier", "attested"], ([node_link(a), "yes" if a in attestors else
                                                  "no"] for a in committee), "committee"))
    body.append("<h2>Disputes</h2>")
    body.append(table(["dispute", "segment", "challenger", "state", "range now"],
                      ([f'<a href="/dispute/{d.id}">{d.id}</a>', esc(d.segment),
                        node_link(d.challenger), _verdict(d), f"{d.lo}..{d.hi}"]
                       for d in snap.disputes_of(jid)), "disputes"))
    body.append("<h2>Payouts</h2>")
    body.append(table(["to", "amount", "why"],
                      ([node_link(p["to"]) if p["to"].startswith("0x") else esc(p["to"]),
                        esc(pol(p["amount"])), esc(p["why"])] for p in snap.payouts(jid)),
                      "payouts"))
    body.append("<h2>Events</h2>")
    body.append(table(["block", "event", "details"],
                      ([esc(e.block_number), esc(e.event), f'<span class="mono">'
                        f"{esc(_args(e.args))}</span>"] for e in snap.job_events.get(jid, [])),
                      "events"))
    return page(f"job {jid}", "".join(body), snap)


def dispute_page(snap: Snapshot, did: int) -> str:
    d = snap.disputes[did]
    now = snap.timestamp
    live = d.phase in (Phase.BISECTION, Phase.DRAWING, Phase.COMMIT, Phase.REVEAL)
    turn = d.next_move
    facts = [
        ("job", f'<a href="/job/{d.job_id}">{d.job_id}</a>'), ("segment", esc(d.segment)),
        ("solver", node_link(d.solver)), ("challenger", node_link(d.challenger)),
        ("state", _verdict(d)), ("turn", esc(turn)),
        ("solver clock left", esc(f"{d.solver_clock_left} s" if live else "-")),
        ("challenger clock left", esc(f"{d.challenger_clock_left} s" if live else "-")),
        ("challenge bond", esc(pol(d.challenge_bond))),
        ("votes", f"valid {d.valid_votes} · invalid {d.invalid_votes}"),
        ("commit ends", esc(when(d.commit_end, now))),
        ("reveal ends", esc(when(d.reveal_end, now))),
    ]
    rows = [[esc(i), f"{lo}..{hi}", esc(hi - lo)] for i, (lo, hi) in enumerate(snap.ranges(did))]
    votes: list[Vote | None] = [*d.votes, *([None] * (len(d.jury) - len(d.votes)))]
    jury = [[node_link(a), esc(_vote(v))] for a, v in zip(d.jury, votes, strict=False)]
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
             esc(d.segment), node_link(d.challenger), _verdict(d), f"{d.lo}..{d.hi}",
             esc(d.rounds)] for d in sorted(snap.disputes.values(), key=lambda d: -d.id))
    body = "<h1>Disputes</h1>" + table(["dispute", "job", "segment", "challenger", "state",
                                        "range", "rounds"], rows, "disputes")
    return page("disputes", body, snap)


def nodes_page(snap: Snapshot) -> str:
    rows = ([node_link(n.address), esc(_roles(n.info.roles)), esc(pol(n.info.free_stake)),
             esc(pol(n.info.locked_stake)), esc(n.jobs_solved), esc(n.attestations),
             f'<span class="{"bad" if n.slashed else ""}">{esc(pol(n.slashed))}</span>']
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
        ("free stake", esc(pol(i.free_stake))), ("locked stake", esc(pol(i.locked_stake))),
        ("unbonding", esc(pol(i.unbonding_stake))),
        ("seat-locked (juror / attestor seats)", esc(pol(i.seat_locked_stake))),
        ("jobs solved", esc(n.jobs_solved)), ("steps delivered", esc(n.steps_delivered)),
        ("rewards", esc(pol(n.rewards))), ("attestations", esc(n.attestations)),
        ("credits to withdraw", esc(pol(n.market_credits + n.game_credits))),
        ("slashed in all", f'<span class="{"bad" if n.slashed else ""}">{esc(pol(n.slashed))}'
                           "</span>"),
    ]
    body = (f"<h1>Node {esc(short(n.address))}</h1>"
            + table(["", ""], ([esc(k), v] for k, v in facts), "facts")
            + "<h2>Slashes</h2>"
            + table(["block", "amount", "from"], ([esc(s["block"]), esc(pol(s["amount"])),
                                                   esc(s["from"])] for s in n.slashes), "slashes"))
    return page(f"node {short(n.address)}", body, snap)


def not_found(snap: Snapshot, what: str) -> str:
    return page("not found", f"<h1>Not found</h1><p>{esc(what)}</p>"
                '<p><a href="/">all jobs</a></p>', snap)


def _roles(mask: int) -> str:
    names = [n for bit, n in ((1, "solver"), (2, "verifier")) if mask & bit]
    return ", ".join(names) or "-"


def _args(args: dict[str, Any]) -> str:
    def plain(v: Any) -> Any:
        if isinstance(v, bytes):
            return "0x" + v.hex()[:16] + ("…" if len(v) > 8 else "")
        if isinstance(v, list | tuple):
            return [plain(x) for x in v]
        return v
    return ", ".join(f"{k}={plain(v)}" for k, v in args.items() if k != "jobId")


# --- the loss curve -----------------------------------------------------------------


def loss_svg(losses: Sequence[float], k: int, width: int = 640, height: int = 240) -> str:
    """A line chart of segment losses over training steps, as inline SVG."""
    pad_l, pad_r, pad_t, pad_b = 56, 16, 14, 34
    w, h = width - pad_l - pad_r, height - pad_t - pad_b
    vals = [float(x) for x in losses]
    if not vals:
        return '<p class="muted">no segments</p>'
    lo, hi = min(vals), max(vals)
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
    labels = (f'<text x="{pad_l - 6}" y="{pad_t + 4}" text-anchor="end" font-size="11">'
              f"{hi:.3g}</text>"
              f'<text x="{pad_l - 6}" y="{pad_t + h}" text-anchor="end" font-size="11">{lo:.3g}'
              f'</text><text x="{pad_l}" y="{height - 8}" font-size="11">step {k}</text>'
              f'<text x="{pad_l + w}" y="{height - 8}" text-anchor="end" font-size="11">'
              f"step {n * k}</text>")
    return (f'<svg class="loss" xmlns="http://www.w3.org/2000/svg" width="{width}" '
            f'height="{height}" viewBox="0 0 {width} {height}" role="img" '
            f'aria-label="loss per segment">{axis}{labels}'
            f'<polyline fill="none" stroke="#1a55b0" stroke-width="2" points="{pts}"/>{dots}'
            "</svg>")


__all__ = ["JobStatus", "dispute_page", "disputes_page", "esc", "job_page", "jobs_page",
           "loss_svg", "node_page", "nodes_page", "not_found"]
