"""Volunteers at home: real daemons in Linux network namespaces behind real NAT
(nftables masquerade), a whole job settled through a circuit relay (issue 34).

Topology (devnet/netns.py): a public segment (198.51.100.0/24, or another
documentation range while another lab holds that one) with anvil (served at .254), the
bootstrap node that is also the relay (.11), one verifier (.12) and the submitter
(.13); home A (10.0.1.0/24, behind its own NAT) with the solver; home B (10.0.2.0/24,
behind another NAT) with two verifiers. The home routers drop every unsolicited
inbound packet and no namespace has a route out. The test creates and removes the
namespaces itself (also when it fails) and skips, saying why, where it cannot (not
root, no `ip` / `nft`: `make test` installs nftables).

The dispute test puts a cheating solver at home A and three verifiers at home B
(one more on the public segment): the cheat is challenged, bisected to one step and
judged by a jury drawn from them, NATed jurors fetching the disputed states from the
NATed solver. CI keeps no logs: a failing test prints the daemons' relevant lines.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from devnet.localnet import REPO, LocalNet
from devnet.netns import Home, NatLab
from devnet.params import short_network_params
from node.chain.ids import DisputeId, JobId
from node.demo import pack_inputs, spec_for
from node.errors import PolnetError

pytestmark = [pytest.mark.timeout(600), pytest.mark.parallel]

SUBMITTER, SOLVER, V_PUB, V_B1, V_B2, CHEATER, V_B3 = 1, 2, 3, 4, 5, 6, 7
FINALIZED = 3
INVALID = 2  # IJobMarket.Verdict
WHY_NOT = NatLab.unavailable()


@dataclass
class NatNet(LocalNet):
    """A LocalNet whose daemons run in the lab's namespaces, each on its own address."""

    lab: NatLab | None = None
    where: dict[str, tuple[str, str]] = field(default_factory=dict)  # name -> (ns, ip)
    rpc_url: str = ""

    def polnet(self, name: str, *args: str, module: str = "node.cli.main"
               ) -> subprocess.Popen[bytes]:
        assert self.lab is not None
        ns, ip = self.where[name]
        log = open(self.home / "logs" / f"{name}.log", "ab")  # noqa: SIM115 - lives with proc
        env = {**os.environ, "POLNET_HOME": str(self.home), "OMP_NUM_THREADS": "1",
               "POLNET_RPC_URL": self.rpc_url, "POLNET_P2P__LISTEN": f"/ip4/{ip}/tcp/0",
               "PYTHONPATH": str(REPO)}
        p = subprocess.Popen(self.lab.wrap(ns, [sys.executable, "-m", module, *args]),
                             stdout=log, stderr=subprocess.STDOUT, env=env, cwd=REPO,
                             start_new_session=True)
        self.procs[name] = p
        return p

    def start_relay(self, name: str, timeout: float = 60) -> str:
        """The bootstrap node (a bare `polnet p2p serve`: a relay, having no bootstrap
        peers of its own); returns its multiaddr."""
        self.polnet(name, "p2p", "serve", "--name", name, "--json")
        log = self.home / "logs" / f"{name}.log"
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for line in log.read_text(errors="replace").splitlines():
                if line.startswith('{"peer_id"'):
                    addr = str(json.loads(line)["addrs"][0])
                    self._boot = addr
                    return addr
            self.check_alive()
            time.sleep(0.3)
        raise PolnetError(f"relay {name} did not start; see {log}")

    def info(self, name: str) -> dict[str, Any]:
        data: dict[str, Any] = json.loads((self.home / "nodes" / name / "node.json").read_text())
        return data


@pytest.fixture(params=["cone", "symmetric"])
def lab(request: pytest.FixtureRequest) -> Iterator[NatLab]:
    """The namespaces; both homes behind port-preserving masquerade ("cone"), or
    behind symmetric NAT (a random source port per connection: no hole punch could
    cross it, the job must settle through the relay alone)."""
    if WHY_NOT is not None:
        pytest.skip(f"real-NAT test needs network namespaces and nftables: {WHY_NOT}")
    symmetric = request.param == "symmetric"
    homes = [Home("a", 1, 2, symmetric), Home("b", 2, 3, symmetric)]
    with NatLab(f"pn{os.getpid() % 10000}", homes=homes) as lab_:
        try:
            yield lab_
        finally:
            lab_.close()  # namespaces (and whatever still runs in them) go, pass or fail


def _wait(pred: Any, timeout: float, what: str, net: LocalNet) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        net.check_alive()
        time.sleep(1)
    raise PolnetError(f"{what} not within {timeout:.0f}s; logs in {net.home}/logs")


# What a failure shows of each daemon's log (CI keeps none): its problems, its NAT
# and dispute milestones, and its last lines.
_RELEVANT = re.compile(r"warn|error|exception|traceback|reachab|relay|hole|punch|dcutr|"
                       r"challeng|dispute|mids_|part_chosen|vote_|jury|artifact_fetched|"
                       r"fetch_failed|not_served|job_claimed|result_committed", re.I)
# py-libp2p's own unstructured lines ("Error sending ADD_PROVIDER ...") are many and
# rarely the cause: of those only tracebacks and exception messages count.
_RAISED = re.compile(r"Traceback|\w(Error|Exception): ")


def _relevant(line: str) -> bool:
    structured = line[:4].isdigit()  # a daemon's own line starts with its timestamp
    return bool((_RELEVANT if structured else _RAISED).search(line))


def relevant_logs(net: LocalNet, per_log: int = 60, tail: int = 15) -> str:
    out = []
    for log in sorted((net.home / "logs").glob("*.log")):
        lines = log.read_text(errors="replace").splitlines()
        hits = [ln for ln in lines[:-tail] if _relevant(ln)][-per_log:]
        out.append(f"===== {log.name}: {len(lines)} lines; relevant, then the last {tail}")
        out += [ln[:400] for ln in hits + ["-----"] + lines[-tail:]]
    return "\n".join(out)


@contextlib.contextmanager
def logs_on_failure(net: LocalNet) -> Iterator[None]:
    """On any failure inside, print the daemons' relevant log lines and the chain's
    events (pytest shows them with the failure) before the namespaces and logs go."""
    try:
        yield
    except BaseException:
        with contextlib.suppress(Exception):
            print(relevant_logs(net), file=sys.stderr)
        with contextlib.suppress(Exception):  # and what the chain saw
            evs = [f"#{e.block_number} {e.contract}.{e.event} {dict(e.args)}"[:300]
                   for e in net.events()]
            print("===== chain events (last 80)", *evs[-80:], sep="\n", file=sys.stderr)
        raise


def _serve_chain(net: NatNet, lab: NatLab) -> None:
    """Anvil's JSON-RPC on the public segment (lab.root_ip), for the daemons' RPC URL."""
    assert net.deployment is not None
    anvil_port = int(net.deployment.rpc_url.rsplit(":", 1)[1])
    lab.forward_tcp(anvil_port, anvil_port)
    net.rpc_url = f"http://{lab.root_ip}:{anvil_port}"


def _reach(net: NatNet, name: str) -> dict[str, Any]:
    r: dict[str, Any] = net.info(name).get("reachability") or {}
    return r


def _digits_job(tmp_path: Path) -> tuple[Path, Path]:
    inputs = pack_inputs(tmp_path / "data")
    spec = spec_for("mlp_digits.toml", hashlib.sha256(inputs["digits"].read_bytes()).hexdigest(),
                    tmp_path / "data" / "job.toml", total_steps=40)
    return spec, inputs["digits"]


def test_job_settles_between_homes_behind_nat_through_a_relay(tmp_path: Path,
                                                              lab: NatLab) -> None:
    """The solver at home A and two verifiers at home B are found private by the
    dial-back check, reserve slots on the public relay and announce their relayed
    addresses; they reach each other through the relay, the job settles with home
    B's verifiers fetching the solver's trace and states. Behind port-preserving
    NAT, DCUtR hole punching turns the solver's relayed connections into direct
    ones; behind symmetric NAT they stay relayed and the relay carries the job."""
    spec, dataset = _digits_job(tmp_path)
    params = short_network_params()
    params.market.attestors_per_job = 3  # every verifier sits: both NATed ones fetch
    t0 = time.monotonic()
    net = NatNet(tmp_path / "net", params, lab=lab)
    net.where = {"relay": ("p11", lab.public_ip(11)), "vpub": ("p12", lab.public_ip(12)),
                 "sub": ("p13", lab.public_ip(13)), "solver": ("ha", lab.home_ip("a")),
                 "vb1": ("hb", lab.home_ip("b")), "vb2": ("hb", lab.home_ip("b"))}
    with net, logs_on_failure(net):
        _serve_chain(net, lab)
        relay = net.start_relay("relay")
        assert f"/ip4/{lab.public_ip(11)}/" in relay
        net.start_verifier("vpub", V_PUB)
        net.start_verifier("vb1", V_B1)
        net.start_verifier("vb2", V_B2)
        net.start_solver("solver", SOLVER, "honest", "--metrics-port", "0")

        def reach(name: str) -> dict[str, Any]:
            return _reach(net, name)

        homes = ("solver", "vb1", "vb2")
        _wait(lambda: all(reach(n).get("status") == "private" and reach(n).get("relay_addrs")
                          for n in homes) and reach("vpub").get("status") == "public",
              120, "home nodes private with relay addresses, the public verifier public",
              net)
        reachable_after = time.monotonic() - t0
        for n in homes:
            [addr] = reach(n)["relay_addrs"]
            assert addr.startswith(relay + "/p2p-circuit/p2p/")
        # the operator's view: `polnet node status` and /metrics, inside home A
        env = {**os.environ, "POLNET_HOME": str(net.home), "POLNET_RPC_URL": net.rpc_url,
               "PYTHONPATH": str(REPO)}
        st = subprocess.run(lab.wrap("ha", [sys.executable, "-m", "node.cli.main", "node",
                                            "status", "--name", "solver", "--dev-account",
                                            str(SOLVER), "--json"]),
                            capture_output=True, text=True, timeout=60, env=env, cwd=REPO)
        assert st.returncode == 0, st.stderr[-2000:]
        assert json.loads(st.stdout.strip().splitlines()[-1])["reachability"]["status"] \
            == "private"
        port = net.info("solver")["metrics_port"]
        code = ("import urllib.request; print(urllib.request.urlopen("
                f"'http://127.0.0.1:{port}/metrics', timeout=10).read().decode())")
        metrics = lab.run("ha", [sys.executable, "-c", code]).stdout
        assert "polnet_reachable 0.0" in metrics and "polnet_relay_addrs 1.0" in metrics
        job = net.submit("sub", SUBMITTER, spec, dataset)
        net.wait_job(job, {FINALIZED}, 360)

        solver_id = net.info("solver")["peer_id"]
        fetched_from_solver: dict[str, int] = {}
        kinds: dict[str, str] = {}
        symmetric = any(h.symmetric for h in lab.homes)
        punched = reach("solver").get("hole_punched") or []
        for v in ("vb1", "vb2"):
            conns = net.info(v).get("connections") or {}
            vid = net.info(v)["peer_id"]
            if symmetric:  # no hole punch crosses it: the relay carried everything
                assert conns.get(solver_id) == "relayed", (v, conns)
            else:  # DCUtR turned the relayed connection into a direct one through NAT
                assert conns.get(solver_id) == "direct", (v, conns)
                assert vid in punched or solver_id in (reach(v).get("hole_punched") or []), \
                    (v, punched)
            kinds[v] = str(conns.get(solver_id))
            text = (net.home / "logs" / f"{v}.log").read_text(errors="replace")
            # fetched from the solver (its per-peer chunk counts name it), whose only
            # connection to this verifier is the relayed one (whichever side dialed it)
            fetched = [ln for ln in text.splitlines()
                       if "artifact_fetched" in ln and solver_id in ln]
            assert len(fetched) >= 3, f"{v} fetched {len(fetched)} artifacts from the solver"
            fetched_from_solver[v] = len(fetched)
        net.check_alive()
        assert net.conserved(), net.books()
        print(json.dumps({"symmetric": symmetric, "solver_connection": kinds,
                          "fetched_from_solver": fetched_from_solver,
                          "reachable_after_s": round(reachable_after, 1),
                          "settled_after_s": round(time.monotonic() - t0, 1)}))


def _served(net: NatNet, solver: str, job: JobId) -> dict[int, str]:
    """Step -> artifact id of the states `solver` served for `job` (its bisection mids)."""
    data = json.loads((net.home / "nodes" / solver / "solver.json").read_text())
    return {int(s["step"]): str(s["artifact_id"]) for s in data.get("served", [])
            if int(s["job_id"]) == job}


def test_cheater_behind_nat_is_bisected_and_judged_by_nated_jurors(tmp_path: Path,
                                                                   lab: NatLab) -> None:
    """A solver at home A with one wrong step per segment (bad_step:5) takes the job;
    three verifiers at home B and one on the public segment replay it. One challenges,
    the cheater defends its own trajectory through the bisection, which ends on the bad
    step; the jury is drawn from the verifiers that neither challenged nor attested
    (so at least two of home B's), and its NATed jurors fetch the disputed states
    from the NATed solver, replay the step and vote it invalid. The dispute resolves
    against the cheater and its bond is slashed when the round settles. Behind
    symmetric NAT no hole punch crosses: the jurors fetch through the relay."""
    spec, dataset = _digits_job(tmp_path)
    # The network's own short parameters: one committee seat, a jury of 3, quorum 1.
    params = short_network_params()
    t0 = time.monotonic()
    net = NatNet(tmp_path / "net", params, lab=lab)
    hb = ("hb", lab.home_ip("b"))
    net.where = {"relay": ("p11", lab.public_ip(11)), "vpub": ("p12", lab.public_ip(12)),
                 "sub": ("p13", lab.public_ip(13)), "cheat": ("ha", lab.home_ip("a")),
                 "vb1": hb, "vb2": hb, "vb3": hb}
    home_b = {"vb1": V_B1, "vb2": V_B2, "vb3": V_B3}
    with net, logs_on_failure(net):
        _serve_chain(net, lab)
        net.start_relay("relay")
        net.start_verifier("vpub", V_PUB)
        for name, acct in home_b.items():
            net.start_verifier(name, acct)
        net.start_solver("cheat", CHEATER, "bad_step:5")
        homes = ("cheat", *home_b)
        _wait(lambda: all(_reach(net, n).get("status") == "private"
                          and _reach(net, n).get("relay_addrs") for n in homes)
              and _reach(net, "vpub").get("status") == "public",
              120, "home nodes private with relay addresses, the public verifier public", net)
        reachable_after = time.monotonic() - t0
        cheat = net.address(CHEATER)
        cheat_before = net.holdings(cheat)
        job = net.submit("sub", SUBMITTER, spec, dataset)
        resolved = net.wait_event("DisputeResolved", 360, contract="DisputeGame", jobId=job)
        resolved_after = time.monotonic() - t0
        did = DisputeId(int(resolved.args["id"]))
        evs: dict[str, list[dict[str, Any]]] = {}
        for ev in net.events():
            if ev.contract == "DisputeGame" and ev.args.get("id") == did:
                evs.setdefault(ev.event, []).append(dict(ev.args))
        # against the cheater, by the jury's votes (no clock ran out)
        assert resolved.args["verdict"] == INVALID, resolved.args
        assert int(resolved.args["validVotes"]) == 0 < int(resolved.args["invalidVotes"])
        assert "TimedOut" not in evs, evs.get("TimedOut")
        # bisected: the cheater posted mids each round, the range ends on one step
        opened = evs["DisputeOpened"][0]
        start = int(opened["startStep"])
        narrowed = [(int(e["lo"]) - start, int(e["hi"]) - start) for e in evs["RangeNarrowed"]]
        assert len(evs["MidsPosted"]) == len(narrowed) >= 1, evs.get("MidsPosted")
        assert narrowed[-1] == (4, 5), narrowed  # the 5th step of the segment, the bad one
        lo, hi = start + 4, start + 5
        # the jury: drawn from neither party, its NATed members voted invalid
        challenger = next(str(e.args["challenger"]) for e in net.events()
                          if e.event == "Challenged" and e.args["disputeId"] == did)
        jury = [str(a) for a in evs["JuryDrawn"][0]["jury"]]
        assert jury and cheat not in jury and challenger not in jury, (jury, challenger)
        votes = {str(v["juror"]): bool(v["valid"]) for v in evs.get("VoteRevealed", [])}
        assert votes and not any(votes.values()), votes
        nated = {net.address(a): n for n, a in home_b.items()}
        nated_voters = [nated[j] for j in votes if j in nated]
        assert nated_voters, f"no NATed juror revealed a vote: jury {jury}, votes {votes}"
        # Each NATed juror that voted fetched the bad step's end state S_hi from the
        # NATed solver: a mid served only during the dispute, which no honest replay
        # reproduces. Its start S_lo it fetched too, or holds from its own replay of
        # the segment (bit for bit the solver's honest state, then no fetch is needed:
        # a juror that challenged the same segment got there by replay).
        served = _served(net, "cheat", job)
        assert lo in served and hi in served, sorted(served)
        cheat_id = net.info("cheat")["peer_id"]
        conns: dict[str, str] = {}
        fetched_lo: dict[str, bool] = {}
        for v in nated_voters:
            text = (net.home / "logs" / f"{v}.log").read_text(errors="replace")

            def fetched(step: int, text: str = text) -> bool:
                return any("artifact_fetched" in ln and served[step] in ln and cheat_id in ln
                           for ln in text.splitlines())

            assert fetched(hi), f"juror {v} did not fetch S_{hi} ({served[hi][:12]}) " \
                                "from the solver"
            fetched_lo[v] = fetched(lo)
            assert re.search(rf"vote_committed.*dispute\W+{did}\b.*valid\W+False", text, re.I), \
                f"juror {v} logged no invalid vote on dispute {did}"
            conns[v] = str((net.info(v).get("connections") or {}).get(cheat_id))
        symmetric = any(h.symmetric for h in lab.homes)
        want = "relayed" if symmetric else "direct"  # as the honest test finds
        assert all(k == want for k in conns.values()), conns
        # the round settles: the cheater's bond is slashed, the challenger paid
        settled = net.wait_event("RoundSettled", 180, contract="JobMarket", jobId=job)
        assert int(settled.args["slashedBond"]) > 0, settled.args
        assert any(e.event == "Slashed" and str(e.args["node"]) == cheat
                   for e in net.events()), "no Slashed event names the cheater"
        assert net.holdings(cheat) < cheat_before
        net.check_alive()
        assert net.conserved(), net.books()
        names = {net.address(V_PUB): "vpub", **nated}
        print(json.dumps({"symmetric": symmetric,
                          "challenger": names.get(challenger, challenger),
                          "jury": [names.get(j, j) for j in jury],
                          "nated_voters": nated_voters, "juror_connection_to_solver": conns,
                          "juror_fetched_s_lo": fetched_lo,
                          "narrowed": narrowed, "reachable_after_s": round(reachable_after, 1),
                          "resolved_after_s": round(resolved_after, 1),
                          "settled_after_s": round(time.monotonic() - t0, 1)}))
