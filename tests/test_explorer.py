"""`polnet explorer` against a real anvil: an honest job committed from a real trace (the
page draws its loss curve from the solver's manifest) and a cheating job whose solver lost
a jury dispute, served over HTTP and rendered in headless Chromium (screenshots checked)."""

from __future__ import annotations

import shutil
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from eth_utils import keccak

from devnet.params import TOKEN
from devnet.testing import LocalChain, fake_trace, job_terms
from node.chain.contracts import SOLVER, VERIFIER, JobStatus, Phase
from node.chain.ids import DisputeId, JobId
from node.datasets import load_dataset, pack_digits, write_dataset
from node.errors import PolnetError
from node.explorer.index import ChainIndex
from node.explorer.server import ExplorerServer
from node.spec import load_spec, parse_spec
from node.train.step import TrainContext
from node.train.trace import run_training

ROOT = Path(__file__).resolve().parents[1]
XSS = '<script>alert("x")</script>'
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@dataclass
class Scene:
    chain: LocalChain
    server: ExplorerServer
    honest: JobId
    cheat: JobId
    dispute: DisputeId
    solver: str
    cheater: str
    challenger: str
    losses: list[float]


def _get(url: str, method: str = "GET") -> tuple[int, str, dict[str, str]]:
    req = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:  # noqa: S310 (loopback only)
            return r.status, r.read().decode(), dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(), dict(e.headers)


def _committee_attests(chain: LocalChain, job: JobId) -> None:
    m = chain.reader.market
    sb = m.get_job(job).sample_block
    chain.mine(max(1, sb - chain.w3.eth.block_number + 1))
    chain[0].market.fix_seed(job)
    for a in m.committee_of(job):
        chain[chain.addresses.index(a)].market.attest(job)


@pytest.fixture
def scene(chain: LocalChain, tmp_path: Path) -> Iterator[Scene]:
    home = tmp_path / "home"
    solver = chain.join(1, SOLVER, 500 * TOKEN, peer_id="12D3KooWsolver")
    solver.registry.update_node(SOLVER, "12D3KooWsolver", ["/ip4/127.0.0.1/tcp/4001"],
                                '{"device":"cpu","name":"alice"}')  # a node's --name
    cheater = chain.join(8, SOLVER, 500 * TOKEN, peer_id=XSS)  # what a registrant types
    vs = [chain.join(i, VERIFIER, 200 * TOKEN) for i in (2, 3, 4, 6, 9)]
    sub = chain[5]
    m = chain.reader.market

    # The honest job: really trained; its manifest lies where a solver node keeps it.
    d = load_spec(ROOT / "examples" / "mlp_digits.toml").model_dump(mode="json")
    spec = parse_spec({**d, "total_steps": 40})
    data = tmp_path / "digits.safetensors"
    write_dataset(pack_digits(), data)
    ctx = TrainContext.create(spec, load_dataset(data, spec.dataset_hash))
    honest = JobId(m.job_count() + 1)
    trace_dir = home / "nodes" / "solver" / "jobs" / f"{honest}-r1" / "trace"
    man = run_training(ctx, trace_dir, job_id=honest)
    leaves, tree = man.leaves_and_tree()
    assert sub.post_job(job_terms(segments=spec.segment_count, k=spec.checkpoint_interval,
                                  init=bytes.fromhex(man.state_hashes[0]),
                                  spec=spec.spec_hash())) == honest
    h = spec.spec_hash_hex()  # the spec, as the solver's store holds it (named by its hash)
    held = home / "nodes" / "solver" / "p2p" / "store" / "objects" / h[:2] / h
    held.parent.mkdir(parents=True)
    held.write_bytes(spec.canonical_json())
    solver.market.claim_job(honest)
    solver.market.commit_trace(honest, leaves, tree)
    _committee_attests(chain, honest)
    chain.advance(m.market_params().verification_window)
    chain[0].market.finalize(honest)

    # The cheating job: a made-up trace, proven invalid by a jury.
    cheat = sub.post_job(job_terms())
    cheater.market.claim_job(cheat)
    fl, ft = fake_trace(cheat, 12, 5, tag="fake")
    cheater.market.commit_trace(cheat, fl, ft)
    seg = 3
    chal = vs[0]
    did = chal.market.challenge(cheat, seg, fl[seg], ft.proof(seg), fl[seg + 1],
                                ft.proof(seg + 1))
    g = chain.reader.dispute
    dg = g.get_dispute(did)
    while dg.phase == Phase.BISECTION:
        hs = [keccak(b"mid%d" % t) for t in dg.mid_steps]
        cheater.dispute.post_mids(did, hs)
        chal.dispute.choose(did, 0, hs)
        dg = g.get_dispute(did)
    chain.mine(max(1, dg.draw_block - chain.w3.eth.block_number + 1))
    chain[0].dispute.draw_jury(did)
    dg = g.get_dispute(did)
    by = {c.address: c for c in vs}
    salt = keccak(b"salt")
    for a in dg.jury:
        by[a].dispute.commit_vote(did, False, salt)
    params = g.call("params")
    chain.advance(int(params.commitWindow))
    for a in dg.jury:
        by[a].dispute.reveal_vote(did, False, salt)
    chain.advance(int(params.revealWindow))  # the last reveal resolved it
    chain.advance(m.market_params().dispute_grace)
    chain[0].market.finalize(cheat)
    assert m.get_job(cheat).status == JobStatus.OPEN  # slashed and reopened

    srv = ExplorerServer(ChainIndex(chain.reader, home, min_age_s=0.0)).start()
    try:
        yield Scene(chain, srv, honest, cheat, did, solver.address, cheater.address,
                    chal.address, list(man.losses))
    finally:
        srv.stop()


def test_pages_show_jobs_disputes_nodes_and_payouts(scene: Scene) -> None:
    u = scene.server.url
    status, body, headers = _get(u + "/")
    assert status == 200 and "script-src" not in headers["Content-Security-Policy"]
    assert "default-src 'none'" in headers["Content-Security-Policy"]
    assert f'href="/job/{scene.honest}"' in body and f'href="/job/{scene.cheat}"' in body
    assert "finalized" in body and "(lost)" not in body
    # the lost dispute names who lost it, linked (not a bare "(lost)" beside today's solver)
    lost = body.split(f'href="/job/{scene.cheat}"', 1)[1].split("</tr>", 1)[0]
    assert f'href="/node/{scene.cheater}"' in lost
    assert f'lost <a href="/dispute/{scene.dispute}">dispute {scene.dispute}</a>' in lost
    assert "alice" in body  # the honest solver by its registered name

    status, body, _ = _get(u + f"/job/{scene.honest}")
    assert status == 200
    assert '<svg class="loss"' in body and "its root is the one committed on chain" in body
    n = len(scene.losses)
    pts = body.split('points="', 1)[1].split('"', 1)[0].split()
    assert len(pts) == n  # one point per segment of the committed trace
    # the reward and the attestors' pay, in exact POL
    assert "100 POL" in body and "reward" in body and body.count(">attestation<") == 3
    sampled = scene.chain.reader.market.sampled_segments(scene.honest)
    assert f"<p>{', '.join(map(str, sampled))}</p>" in body  # the seed's sample, kept once final

    status, body, _ = _get(u + f"/job/{scene.cheat}")
    assert status == 200 and "no trace of this round on this node" in body
    assert f'href="/dispute/{scene.dispute}"' in body
    assert "proved the solver wrong" in body and "share of the slashed bond" in body

    status, body, _ = _get(u + f"/dispute/{scene.dispute}")
    assert status == 200 and '<span class="bad">solver lost</span>' in body
    assert ">invalid</span>" not in body  # read as "this dispute is invalid"
    ends = body.split("<td>reveal ends</td>", 1)[1].split("</tr>", 1)[0]
    assert " ago)" not in ends and " (in " not in ends  # settled: a date, not a countdown
    assert body.count(">invalid</td>") >= 2  # the jurors' revealed votes
    assert "15..20" in body  # the range per round starts with the whole segment (3 of k=5)
    rows = body.split("Bisection: range per round", 1)[1].split("</table>", 1)[0]
    assert rows.count("<tr>") >= 3  # header, the segment, at least one narrowing

    status, body, _ = _get(u + f"/node/{scene.cheater}")
    assert status == 200 and "slashed in all" in body and "150 POL" in body
    assert XSS not in body and html_escaped(XSS) in body  # a registrant's text is inert
    status, body, _ = _get(u + f"/node/{scene.solver}")
    assert ">1</td>" in body and "40" in body  # one job solved, its 40 steps delivered

    summary = _get(u + "/api/summary.json")[1]
    assert f'"{scene.cheat}": {{"status": "open"' in summary


def test_event_fields_are_decoded_for_people(scene: Scene) -> None:
    """Before the fix a job page's events table printed ``reward=100000000000000000000``
    and ``deadline=1796391574``, and a finalized job's deadline read "in 8 min". Now
    every field is decoded: amounts in POL (exact on hover), times as local times,
    enums by name, nodes by name and contracts by name; a final job's deadline is a date."""
    import re

    u = scene.server.url
    m = scene.chain.reader.market
    for jid in (scene.honest, scene.cheat):
        status, body, _ = _get(u + f"/job/{jid}")
        assert status == 200
        events = body.split("<h2>Events</h2>", 1)[1].split("</table>", 1)[0]
        assert events.count("<tr>") >= 4, events  # header, posted, claimed, committed...
        text = re.sub(r'title="[^"]*"', "", events)  # the exact values are on hover only
        # a hash shows as its first 12 hex digits, which may all be decimal ones (the CI
        # failure of stop 42: a seed "0x3312939539…"): that is decoded, not a raw integer
        text = re.sub(r"0x[0-9a-fA-F]+…", "0x…", text)
        assert not re.search(r"\d{10,}", text), re.search(r".{60}\d{10,}.{20}", text)
        j = m.get_job(jid)
        for ts in (j.deadline, j.window_end, j.posted_at):
            assert not ts or str(ts) not in text
        assert "reward: <span title=\"100 POL\">100 POL</span>" in events
        assert re.search(r"deadline: <span title=\"[^\"]*\">\d{4}-\d\d-\d\d \d\d:", events)
    body = _get(u + f"/job/{scene.honest}")[1]
    assert 'alice <span class="mono">' in body  # the solver's name beside its address
    deadline = body.split("<td>deadline</td>", 1)[1].split("</tr>", 1)[0]
    assert " (in " not in deadline and " ago)" not in deadline  # history, not a countdown
    cheat = _get(u + f"/job/{scene.cheat}")[1]
    events = cheat.split("<h2>Events</h2>", 1)[1]
    assert "verdict: invalid (solver lost)" in events or "DisputeResolved" not in events


def test_loss_chart_has_titles_and_covers_every_value(scene: Scene) -> None:
    """Before the fix the chart's y axis ended exactly at the lowest loss (the curve sat
    on the axis, its dots clipped), had no axis titles and named neither the job nor the
    solver. Now its ticks span every value, both axes are titled and the chart says
    whose trace of which job it draws."""
    import re

    body = _get(scene.server.url + f"/job/{scene.honest}")[1]
    svg = body.split('<svg class="loss"', 1)[1].split("</svg>", 1)[0]
    ticks = [float(t) for t in re.findall(r'class="ytick"[^>]*>([^<]+)<', svg)]
    assert len(ticks) >= 2 and min(ticks) <= min(scene.losses) and max(ticks) >= max(scene.losses)
    assert "loss (segment mean)" in svg and "training step" in svg
    title = re.search(r'class="title"[^>]*>([^<]+)<', svg)
    assert title is not None and f"job {scene.honest}" in title.group(1)
    assert "alice" in title.group(1) and "mlp-digits" in title.group(1)  # solver, spec
    ys = [float(p.split(",")[1]) for p in svg.split('points="', 1)[1].split('"', 1)[0].split()]
    assert all(28 <= y <= 216 for y in ys)  # inside the plot area (pad_t .. pad_t + h)
    # beside the chart, a row per segment: its last step, tokens seen (an MLP has none)
    rows = re.findall(r"<tr><td>(\d+)</td><td>(\d+)</td><td>([^<]*)</td><td>([^<]*)</td></tr>",
                      body.split('<table class="segments">', 1)[1].split("</table>", 1)[0])
    assert [(int(a), int(b), c) for a, b, c, _ in rows] == [
        (i, (i + 1) * 10, "-") for i in range(len(scene.losses))]
    assert [float(d) for *_, d in rows] == pytest.approx(scene.losses, abs=1e-4)


def test_tokens_seen_per_segment_of_a_language_model(tmp_path: Path) -> None:
    """A language model's segments count the tokens trained on by their end (batch x
    context a step), read from the committed trace and the spec a node here holds."""
    from eth_typing import ChecksumAddress, HexAddress, HexStr

    from node.chain.contracts import Job
    from node.explorer.index import find_loss_curve
    from verifier.jobs import dataset

    text = dataset("text", tmp_path / "data")
    spec = parse_spec({"seed": 1, "dataset_hash": text.hash_hex, "batch_size": 4,
                       "model": {"family": "transformer_lm", "vocab_size": 128, "context": 16,
                                 "d_model": 16, "n_heads": 2, "n_layers": 1, "d_ff": 32},
                       "optimizer": {"name": "adamw", "lr": 1e-3}, "total_steps": 6,
                       "checkpoint_interval": 2})
    home = tmp_path / "home"
    man = run_training(TrainContext.create(spec, text),
                       home / "nodes" / "solver" / "jobs" / "3-r1" / "trace", job_id=3)
    zero = ChecksumAddress(HexAddress(HexStr("0x" + "00" * 20)))
    job = Job(JobStatus.COMMITTED, zero, zero, spec.spec_hash(), bytes(32), 0, 0, 0, 0, 0, 0,
              0, 0, bytes.fromhex(man.root.removeprefix("0x")), bytes(32), 3, 2, 0, bytes(32),
              0, 1, 0, 6, bytes(32), 0, 0)
    curve = find_loss_curve(home, JobId(3), job)
    assert curve is not None and curve.tokens_per_step is None  # no node here holds the spec
    h = spec.spec_hash_hex().removeprefix("0x")
    held = home / "nodes" / "solver" / "p2p" / "store" / "objects" / h[:2] / h
    held.parent.mkdir(parents=True)
    held.write_bytes(spec.canonical_json())
    curve = find_loss_curve(home, JobId(3), job)
    assert curve is not None
    assert [(r["segment"], r["step"], r["tokens_seen"]) for r in curve.rows()] == [
        (0, 2, 2 * 4 * 16), (1, 4, 4 * 4 * 16), (2, 6, 6 * 4 * 16)]
    assert [r["loss"] for r in curve.rows()] == list(man.losses)
    other = Job(**{**job.__dict__, "trace_root": bytes(31) + b"\x01"})
    assert find_loss_curve(home, JobId(3), other) is None  # not the root on chain: not shown


def test_slash_rows_link_to_their_job_and_dispute(scene: Scene) -> None:
    """Before the fix a node's slash rows gave a block and an amount only: which job or
    dispute it paid for had to be dug out of the logs. Now each row links to both."""
    body = _get(scene.server.url + f"/node/{scene.cheater}")[1]
    rows = body.split("<h2>Slashes</h2>", 1)[1].split("</table>", 1)[0]
    assert rows.count("<tr>") >= 2
    assert f'href="/job/{scene.cheat}"' in rows and f'href="/dispute/{scene.dispute}"' in rows


def test_busy_port_is_one_line_naming_port(chain: LocalChain, tmp_path: Path) -> None:
    """Before the fix `polnet explorer` on a port in use printed a 60-line traceback
    ending in "Address already in use". Now it is one line that says to pick --port."""
    import os
    import socket
    import sys

    chain.deployment.save(tmp_path / "devnet" / "deployment.json")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        p = subprocess.run([sys.executable, "-m", "node.cli.main", "explorer", "--port",
                            str(port)], cwd=ROOT,
                           env={**os.environ, "POLNET_HOME": str(tmp_path)},
                           capture_output=True, text=True, timeout=120)
    assert p.returncode == 1, (p.returncode, p.stderr)
    lines = [ln for ln in p.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "--port" in lines[0] and "in use" in lines[0], p.stderr
    assert "Traceback" not in p.stderr and "polnet explorer on" not in p.stdout


def test_bad_requests_get_clear_answers_and_change_nothing(scene: Scene) -> None:
    u = scene.server.url
    head = scene.chain.w3.eth.block_number
    assert _get(u + "/job/999")[0] == 404 and "no job 999" in _get(u + "/job/999")[1]
    assert _get(u + "/dispute/999")[0] == 404
    assert _get(u + "/node/0x" + "ab" * 20)[0] == 404
    assert _get(u + "/job/abc")[0] == 404 and _get(u + "/../etc/passwd")[0] == 404
    assert _get(u + "/" + "x" * 300)[0] == 414
    assert _get(u + "/", "POST")[0] == 405 and _get(u + "/job/1", "DELETE")[0] == 405
    assert scene.chain.w3.eth.block_number == head  # read-only: no transaction was sent


def html_escaped(text: str) -> str:
    import html

    return html.escape(text, quote=True)


def _shot(url: str, out: Path) -> tuple[int, int, list[tuple[int, int, int]]]:
    """Chromium's headless screenshot of ``url``: (width, height, RGB pixels)."""
    assert CHROMIUM is not None
    profile = out.with_suffix(".profile")
    subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                    "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync", "--hide-scrollbars",
                    f"--user-data-dir={profile}", "--window-size=1100,1400",
                    f"--screenshot={out}", url], check=True, capture_output=True, timeout=120)
    return _png_pixels(out.read_bytes())


def _png_pixels(data: bytes) -> tuple[int, int, list[tuple[int, int, int]]]:
    """Decode an 8-bit RGB/RGBA, non-interlaced PNG (what Chromium writes) with zlib."""
    import struct
    import zlib

    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, chunks, ihdr = 8, [], b""
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            ihdr = body
        elif kind == b"IDAT":
            chunks.append(body)
        pos += 12 + length
    w, h, depth, ctype = struct.unpack(">IIBB", ihdr[:10])
    assert depth == 8 and ctype in (2, 6), (depth, ctype)
    bpp = 3 if ctype == 2 else 4
    raw = zlib.decompress(b"".join(chunks))
    stride = w * bpp
    prev = bytearray(stride)
    pixels: list[tuple[int, int, int]] = []
    for y in range(h):
        f = raw[y * (stride + 1)]
        line = bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = prev[i]
            c = prev[i - bpp] if i >= bpp else 0
            if f == 1:
                line[i] = (line[i] + a) & 255
            elif f == 2:
                line[i] = (line[i] + b) & 255
            elif f == 3:
                line[i] = (line[i] + (a + b) // 2) & 255
            elif f == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                line[i] = (line[i] + (a if pa <= pb and pa <= pc else b if pb <= pc else c)) & 255
        pixels.extend((line[i], line[i + 1], line[i + 2]) for i in range(0, stride, bpp))
        prev = line
    return w, h, pixels


@pytest.mark.skipif(CHROMIUM is None, reason="Chromium is not installed: `make setup` installs "
                    "it (Debian package chromium)")
def test_pages_render_in_headless_chromium(scene: Scene, tmp_path: Path) -> None:
    u = scene.server.url
    w, h, px = _shot(f"{u}/job/{scene.honest}", tmp_path / "job.png")
    assert (w, h) == (1100, 1400)
    # the loss curve: the page's stroke colour (#1a55b0) drawn in a few hundred pixels
    curve = sum(1 for p in px if abs(p[0] - 0x1A) < 24 and abs(p[1] - 0x55) < 24
                and abs(p[2] - 0xB0) < 24)
    assert curve > 300, f"only {curve} pixels of the loss curve's colour"
    # the header bar (#1d2330) spans the top of the page
    top = px[5 * w:6 * w]
    assert sum(1 for p in top if p == (0x1D, 0x23, 0x30)) > 0.9 * w
    _, _, px2 = _shot(f"{u}/dispute/{scene.dispute}", tmp_path / "dispute.png")
    # the verdict is shown in the 'bad' colour (#b3261e): a lost dispute is visible at a glance
    red = sum(1 for p in px2 if abs(p[0] - 0xB3) < 30 and p[1] < 0x50 and p[2] < 0x50)
    assert red > 20, f"only {red} red pixels on the dispute page"
    assert CHROMIUM is not None
    dom = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                          "--no-first-run", "--disable-background-networking",
                          "--disable-component-update", "--disable-sync",
                          f"--user-data-dir={tmp_path / 'dom.profile'}", "--dump-dom",
                          f"{u}/node/{scene.cheater}"],
                         check=True, capture_output=True, timeout=120, text=True).stdout
    assert "slashed in all" in dom and "<script>alert" not in dom


def test_polnet_explorer_command_serves_the_devnet(chain: LocalChain, tmp_path: Path) -> None:
    import os
    import sys

    chain.deployment.save(tmp_path / "devnet" / "deployment.json")  # the default path
    chain[5].post_job(job_terms())
    p = subprocess.Popen([sys.executable, "-m", "node.cli.main", "explorer", "--port", "0"],
                         cwd=ROOT, env={**os.environ, "POLNET_HOME": str(tmp_path)},
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert p.stdout is not None
        line = p.stdout.readline()
        assert line.startswith("polnet explorer on http://127.0.0.1:"), (line, p.poll())
        url = line.split()[3]
        status, body, _ = _get(url + "/")
        n = chain.reader.market.job_count()
        assert status == 200 and f"Jobs ({n})" in body and f'href="/job/{n}"' in body
    finally:
        p.terminate()
        p.wait(timeout=30)


# --- hostile clients and registrants (issue 37, item 5) -------------------------------


def test_idle_connections_are_closed_and_their_threads_bounded(chain: LocalChain,
                                                               tmp_path: Path) -> None:
    """Before the fix each connection kept a thread until the client left: 200 idle
    sockets made 201 threads, still there 30 s later, so anyone who could connect could
    grow the process without bound. Now at most ``max_connections`` are served at once
    (the rest get a 503 and are closed) and an idle one is closed after the read timeout."""
    import socket
    import threading
    import time

    cap = 16
    srv = ExplorerServer(ChainIndex(chain.reader, tmp_path, min_age_s=0.0),
                         read_timeout=1.0, max_connections=cap).start()
    base = threading.active_count()
    host, port = srv.server_address[:2]
    socks: list[socket.socket] = []
    try:
        for _ in range(200):
            socks.append(socket.create_connection((str(host), port), timeout=10))
        peak = threading.active_count()
        for _ in range(20):  # while they idle, sample the thread count
            peak = max(peak, threading.active_count())
            time.sleep(0.05)
        assert peak <= base + cap, f"{peak - base} threads for 200 idle connections"
        answers: list[bytes] = []
        for s in socks:  # every socket is closed by the server: 503 now, or at the timeout
            buf = b""
            while chunk := s.recv(4096):
                buf += chunk
            answers.append(buf)
        assert all(a == b"" or a.startswith(b"HTTP/1.1 503") for a in answers)
        for _ in range(100):  # their threads end with them
            if threading.active_count() <= base:
                break
            time.sleep(0.1)
        assert threading.active_count() <= base
        assert _get(srv.url + "/")[0] == 200  # and honest clients are served again
    finally:
        for s in socks:
            s.close()
        srv.stop()


def test_a_request_trickled_byte_by_byte_is_cut_off(chain: LocalChain, tmp_path: Path) -> None:
    """A read timeout alone does not stop a client that sends one byte of its headers
    every half second (slowloris): each read succeeds, and its thread and slot were held
    for as long as it kept trickling. Now the whole request must arrive within the
    request deadline, and the server closes the connection when it does not."""
    import socket

    srv = ExplorerServer(ChainIndex(chain.reader, tmp_path, min_age_s=0.0),
                         read_timeout=1.0, request_deadline=2.0).start()
    host, port = srv.server_address[:2]
    s = socket.create_connection((str(host), port), timeout=5)
    closed = False
    try:
        s.sendall(b"GET / HTTP/1.1\r\n")
        for _ in range(40):  # 20 s of trickling, ten times the deadline
            try:
                s.sendall(b"X")
                s.settimeout(0.5)
                if s.recv(4096) == b"":
                    closed = True
                    break
            except TimeoutError:
                continue
            except OSError:  # reset or broken pipe: closed by the server
                closed = True
                break
        assert closed, "the trickling client kept its connection"
        assert _get(srv.url + "/")[0] == 200  # others are served meanwhile and after
    finally:
        s.close()
        srv.stop()


def test_invisible_and_bidi_characters_render_escaped(chain: LocalChain, tmp_path: Path) -> None:
    """Before the fix a registrant's U+202E (right-to-left override), U+2066 (isolate)
    and U+200B (zero-width space) reached the page as they were: a peer id could pass for
    another node's, and an override reversed the text around it. Now each shows as a
    visible ``\\u202e``-style escape on the node page and in the node list."""
    bad = "\u202e", "\u2066", "\u200b", "\x07"
    c = chain[7]
    c.registry.register(VERIFIER, "12D3KooW\u202eelpmaxe\u200b", ["/ip4/10.0.0.1/tcp/1\u2066x"],
                        '{"device":"cpu\u200b\x07"}')
    srv = ExplorerServer(ChainIndex(chain.reader, tmp_path, min_age_s=0.0)).start()
    try:
        status, body, _ = _get(f"{srv.url}/node/{c.address}")
        assert status == 200
        assert not any(ch in body for ch in bad)
        assert "12D3KooW\\u202eelpmaxe\\u200b" in body  # the peer id, shown with its escapes
        assert "/ip4/10.0.0.1/tcp/1\\u2066x" in body
        assert "cpu\\u200b\\u0007" in body
        status, body, _ = _get(f"{srv.url}/nodes")
        assert status == 200 and not any(ch in body for ch in bad)
    finally:
        srv.stop()


def test_binding_beyond_loopback_needs_public(tmp_path: Path) -> None:
    """Before the fix `polnet explorer --host 0.0.0.0` served every interface without a
    word. Now it is refused with a message naming --public, and --public warns."""
    import os
    import sys

    from node.errors import ConfigError
    from node.explorer.server import check_bind

    p = subprocess.run([sys.executable, "-m", "node.cli.main", "explorer", "--host", "0.0.0.0",
                        "--port", "0"], cwd=ROOT, env={**os.environ, "POLNET_HOME": str(tmp_path)},
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 1 and "--public" in p.stderr, (p.returncode, p.stderr)
    assert "polnet explorer on" not in p.stdout
    for host in ("127.0.0.1", "::1", "localhost", "127.0.0.2"):
        assert check_bind(host, public=False) is None
    for host in ("0.0.0.0", "::", "192.168.1.10", "example.org"):
        with pytest.raises(ConfigError, match="--public"):
            check_bind(host, public=False)
        assert "warning" in (check_bind(host, public=True) or "")
    with pytest.raises(ConfigError, match="--public"):  # the class refuses too, before binding
        ExplorerServer(None, "0.0.0.0", 0)  # type: ignore[arg-type]


def test_a_node_name_cannot_pass_for_a_contract_or_another_node(chain: LocalChain,
                                                                 tmp_path: Path) -> None:
    """Names are what registrants type into their profile: one calling itself "market
    contract" (with a right-to-left override) would pass for the market in the events
    tables if names stood alone. A node's name is always shown beside its own address,
    escaped, and linked to its node page; contracts are named without a link."""
    c = chain.join(7, VERIFIER, 0)
    c.registry.update_node(VERIFIER, "12D3KooWdev7", ["/ip4/127.0.0.1/tcp/4007"],
                           '{"name":"market contract\u202e"}')
    chain[5].post_job(job_terms())
    srv = ExplorerServer(ChainIndex(chain.reader, tmp_path, min_age_s=0.0)).start()
    try:
        body = _get(f"{srv.url}/nodes")[1]
        short = f"{c.address[:6]}…{c.address[-4:]}"
        assert (f'<a href="/node/{c.address}" title="{c.address}">market contract\\u202e '
                f'<span class="mono">{short}</span></a>') in body
        assert "\u202e" not in body
    finally:
        srv.stop()


# --- the index over the chain view (issue 31) ----------------------------------------


def test_requests_per_block_do_not_grow_with_the_jobs_on_chain(chain: LocalChain,
                                                               tmp_path: Path) -> None:
    """Before, every new head re-read up to 500 jobs (``getJob``), every dispute and three
    calls per node, one request each: 5 jobs cost about 50 requests a block, 30 jobs about
    75. Now the index rides the daemons' ChainView: an idle block costs the view's
    ``eth_blockNumber`` and one batch (headers + logs); a block with one new job adds one
    batch of ``eth_call`` (and one of node reads when its events name a registered node).
    Counted as HTTP requests at an RPC proxy, at 5 and at 30 jobs: the same."""
    from devnet.rpcproxy import RpcProxy
    from node.chain.client import ChainClient

    chain.join(1, SOLVER, 500 * TOKEN)
    sub = chain[5]
    proxy = RpcProxy(chain.url).start()
    try:
        index = ChainIndex(ChainClient(proxy.url, None, chain.deployment), tmp_path,
                           min_age_s=0.0)

        def cost(action: object = None) -> int:
            if callable(action):
                action()
            n = proxy.counts["total"]
            index.snapshot()
            return proxy.counts["total"] - n

        figures: dict[int, tuple[int, int, int]] = {}
        for n in (5, 30):
            while chain.reader.market.job_count() < n:
                sub.post_job(job_terms())
            cost()  # catch up
            idle = cost(chain.mine)  # a new block, no event of ours
            busy = cost(lambda: sub.post_job(job_terms()))  # a block with a new job
            same = cost()  # no new block at all
            figures[n] = (idle, busy, same)
            snap = index.snapshot()
            assert snap.job_count == chain.reader.market.job_count() == len(snap.jobs)
        assert figures[5] == figures[30], figures
        idle, busy, same = figures[30]
        assert idle <= 2 and busy <= 3 and same == 1, figures
        # and what it reads is what a full re-read gives
        fresh = ChainIndex(chain.reader, tmp_path, min_age_s=0.0).snapshot()
        snap = index.snapshot()
        assert dict(snap.jobs) == dict(fresh.jobs) and snap.nodes == fresh.nodes
    finally:
        proxy.stop()


def test_a_throttling_provider_delays_the_index_but_loses_nothing(chain: LocalChain,
                                                                   tmp_path: Path) -> None:
    """Behind a provider that answers 429, -32005 or resets a third of its requests (and
    with one retry only, so failures reach the index), a snapshot either comes back or
    raises a PolnetError (the server then serves its last page and says the chain is
    away); once the provider recovers, the index holds exactly what an unthrottled read
    gives: no event taken from the feed is dropped by a build that failed halfway."""
    from devnet.rpcproxy import RpcProxy, Throttle
    from node.chain.client import ChainClient
    from node.chain.rpc import RpcSettings

    solver = chain.join(1, SOLVER, 500 * TOKEN)
    sub = chain[5]
    proxy = RpcProxy(chain.url).start()
    try:
        client = ChainClient(proxy.url, None, chain.deployment,
                             rpc=RpcSettings(retries=1, backoff=0.01, max_backoff=0.05))
        index = ChainIndex(client, tmp_path, min_age_s=0.0)
        index.snapshot()
        proxy.throttle = Throttle(p429=0.15, p32005=0.1, p_reset=0.08, seed=7)
        failed = built = 0
        for _ in range(12):
            sub.post_job(job_terms())
            solver.stake(TOKEN)  # an event naming a node: its entry is read again
            for _ in range(3):
                try:
                    index.snapshot()
                    built += 1
                except PolnetError:
                    failed += 1
        assert failed and built, (failed, built)  # both paths were taken
        proxy.throttle = Throttle()
        index.snapshot()
        # and deterministically: the block's events taken, then the node's read fails
        solver.stake(TOKEN)
        proxy.fail_next("eth_call", 1)
        with pytest.raises(PolnetError):
            index.snapshot()
        snap = index.snapshot()  # no new block since: the same head, read again
        fresh = ChainIndex(chain.reader, tmp_path, min_age_s=0.0).snapshot()
        assert snap.job_count == fresh.job_count == len(snap.jobs)
        assert dict(snap.jobs) == dict(fresh.jobs) and snap.nodes == fresh.nodes
    finally:
        proxy.stop()

def test_a_reorg_rebuilds_the_index(chain: LocalChain, tmp_path: Path) -> None:
    """The chain view starts a new epoch when the chain it saw is replaced (here anvil
    reverting to a snapshot and mining on): the index forgets the replaced blocks'
    events, jobs and node figures and derives them again from the new chain."""
    index = ChainIndex(chain.reader, tmp_path, min_age_s=0.0)
    solver = chain.join(1, SOLVER, 500 * TOKEN)
    before = index.snapshot()
    mark = chain.snapshot()
    jid = chain[5].post_job(job_terms())
    solver.market.claim_job(jid)
    snap = index.snapshot()
    assert jid in snap.jobs and {"JobPosted", "JobClaimed"} <= \
        {e.event for e in snap.job_events[jid]}
    assert snap.nodes[solver.address].info.locked_stake > 0
    chain.revert(mark)
    chain.mine(5)  # a longer chain without the job
    snap = index.snapshot()
    assert index.view.snapshot is not None and index.view.snapshot.epoch == 1
    assert jid not in snap.jobs and jid not in snap.job_events
    assert snap.job_count == before.job_count
    assert snap.nodes[solver.address].info.locked_stake == 0


def test_collaborative_jobs_rounds_sub_jobs_and_outer_juries(chain: LocalChain,
                                                             tmp_path: Path) -> None:
    """Before, the explorer did not watch the CollabMarket or the OuterJury. Now: a page of
    collaborative jobs; each job's page shows its slots and, per round, the sub-jobs (linked
    to their job pages, which link back), what was accepted, the outer state posted,
    challenged and accepted; each outer jury case has a page with its jurors' votes and the
    verdict. The index follows the actions block by block and ends where a fresh one does."""
    import json

    import tests.test_collab_market as cm

    index = ChainIndex(chain.reader, tmp_path, min_age_s=0.0)
    index.snapshot()  # built before the jobs: what follows is taken in block by block
    net = cm.Net(chain, submitter=chain[5], workers=[cm.solver(chain, i) for i in (1, 2, 3)],
                 verifiers=[chain.join(i, VERIFIER, cm.VSTAKE) for i in (4, 6, 7, 8)],
                 outsider=chain[9])
    two = cm.post(net, cm.terms(rounds=2))
    cm.claim_all(net, two)
    for r in range(2):
        cm.honest_round(net, two, r)
        index.snapshot()
    # A one-round job whose first outer state is wrong: challenged, judged by a jury.
    one = cm.settled_one_round_job(net)
    cheat, sub = net.outsider, net.submitter
    chain.set_balance(cheat.address, 10**20)
    sub.token.transfer(cheat.address, 10 * cm.bond_of(net))
    cm.post_outer(net, cheat, one, 0, keccak(b"wrong"))
    index.snapshot()
    jury, _ = cm._jury_round(net, one, 0, sub, vote=False)
    c = chain.reader.collab
    case = c.get_round(one, 0).last_verdict and c.get_round(one, 0).jury_case
    assert case

    srv = ExplorerServer(index).start()
    try:
        u = srv.url
        status, body, _ = _get(u + "/collabs")
        assert status == 200 and "outer juries</a>" in body  # in the header, on every page
        assert f'href="/collab/{two}"' in body and f'href="/collab/{one}"' in body
        row = body.split(f'href="/collab/{two}"', 1)[1].split("</tr>", 1)[0]
        assert ">finished<" in row and "2 of 2" in row

        status, body, _ = _get(u + f"/collab/{two}")
        assert status == 200
        rounds = body.split("<h2>Rounds</h2>", 1)[1].split("</table>", 1)[0]
        assert rounds.count("<tr>") == 3  # the header, rounds 0 and 1
        for r in range(2):
            rd = c.get_round(two, r)
            for slot, jid in enumerate(rd.sub_jobs):
                assert f'slot {slot}: <a href="/job/{jid}">job {jid}</a>' in rounds
            assert f"accepted: <span class=\"mono\" title=\"0x{rd.outer_hash.hex()}\">" in rounds
        assert rounds.count("accepted") >= 6 + 2  # 3 sub-jobs and the outer state, per round
        for w in net.workers:
            assert f'href="/node/{w.address}"' in rounds
        jid = c.get_round(two, 1).sub_jobs[2]
        status, body, _ = _get(u + f"/job/{jid}")
        assert status == 200 and f'<a href="/collab/{two}">{two}</a>, round 1, slot 2' in body

        status, body, _ = _get(u + f"/collab/{one}")
        assert status == 200 and f'href="/jury/{case}"' in body
        assert "outer state wrong (poster lost)" in body
        assert f'challenged by <a href="/node/{sub.address}"' in body
        assert f'posted by <a href="/node/{cheat.address}"' in body

        status, body, _ = _get(u + f"/jury/{case}")
        assert status == 200 and f'<a href="/collab/{one}">{one}</a>' in body
        votes = body.split("<h2>Jury</h2>", 1)[1].split("</table>", 1)[0]
        assert votes.count("<tr>") == len(jury) + 1 and votes.count("<td>invalid</td>") == len(jury)
        for a in jury:
            assert f'href="/node/{a}"' in votes
        assert "outer state wrong (poster lost)" in body
        assert "CaseTallied" in body and "JuryDrawn" in body

        status, body, _ = _get(u + "/juries")
        assert status == 200 and f'href="/jury/{case}"' in body
        assert _get(u + "/collab/999")[0] == 404 and _get(u + "/jury/999")[0] == 404

        # block by block, the index ends where one built at once does
        fresh = ChainIndex(chain.reader, tmp_path, min_age_s=0.0).snapshot()
        snap = index.snapshot()
        assert snap.rounds == fresh.rounds and snap.juries == fresh.juries
        assert snap.nodes == fresh.nodes and dict(snap.collabs) == dict(fresh.collabs)
        summary = json.loads(_get(u + "/api/summary.json")[1])
        assert summary["collabs"][str(one)]["juries"] == [case]
    finally:
        srv.stop()
