"""Volunteers at home: real daemons in Linux network namespaces behind real NAT
(nftables masquerade), a whole job settled through a circuit relay (issue 34).

Topology (devnet/netns.py): a public segment 198.51.100.0/24 with anvil (served at
.254), the bootstrap node that is also the relay (.11), one verifier (.12) and the
submitter (.13); home A (10.0.1.0/24, behind its own NAT) with the solver; home B
(10.0.2.0/24, behind another NAT) with two verifiers. The home routers drop every
unsolicited inbound packet and no namespace has a route out. The test creates and
removes the namespaces itself (also when it fails) and skips, saying why, where it
cannot (not root, no `ip` / `nft`: `make test` installs nftables).

CI keeps no logs: a failing test prints the daemons' relevant lines.
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
from devnet.netns import PUBLIC_NET, ROOT_IP, Home, NatLab
from devnet.params import short_network_params
from node.demo import pack_inputs, spec_for
from node.errors import PolnetError

pytestmark = [pytest.mark.timeout(600), pytest.mark.parallel]

SUBMITTER, SOLVER, V_PUB, V_B1, V_B2 = 1, 2, 3, 4, 5
FINALIZED = 3
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
    homes = [Home("a", 1, f"{PUBLIC_NET}.2", symmetric), Home("b", 2, f"{PUBLIC_NET}.3",
                                                              symmetric)]
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


def relevant_logs(net: LocalNet, per_log: int = 60, tail: int = 15) -> str:
    out = []
    for log in sorted((net.home / "logs").glob("*.log")):
        lines = log.read_text(errors="replace").splitlines()
        hits = [ln for ln in lines[:-tail] if _RELEVANT.search(ln)][-per_log:]
        out.append(f"===== {log.name}: {len(lines)} lines; relevant, then the last {tail}")
        out += [ln[:400] for ln in hits + ["-----"] + lines[-tail:]]
    return "\n".join(out)


@contextlib.contextmanager
def logs_on_failure(net: LocalNet) -> Iterator[None]:
    """On any failure inside, print the daemons' relevant log lines (pytest shows them
    with the failure) before the namespaces and their logs go."""
    try:
        yield
    except BaseException:
        with contextlib.suppress(Exception):
            print(relevant_logs(net), file=sys.stderr)
        raise


def _serve_chain(net: NatNet, lab: NatLab) -> None:
    """Anvil's JSON-RPC on the public segment (ROOT_IP), for the daemons' RPC URL."""
    assert net.deployment is not None
    anvil_port = int(net.deployment.rpc_url.rsplit(":", 1)[1])
    lab.forward_tcp(anvil_port, anvil_port)
    net.rpc_url = f"http://{ROOT_IP}:{anvil_port}"


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
    net.where = {"relay": ("p11", "198.51.100.11"), "vpub": ("p12", "198.51.100.12"),
                 "sub": ("p13", "198.51.100.13"), "solver": ("ha", lab.home_ip("a")),
                 "vb1": ("hb", lab.home_ip("b")), "vb2": ("hb", lab.home_ip("b"))}
    with net, logs_on_failure(net):
        _serve_chain(net, lab)
        relay = net.start_relay("relay")
        assert "/ip4/198.51.100.11/" in relay
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
        assert net.conserved()
        print(json.dumps({"symmetric": symmetric, "solver_connection": kinds,
                          "fetched_from_solver": fetched_from_solver,
                          "reachable_after_s": round(reachable_after, 1),
                          "settled_after_s": round(time.monotonic() - t0, 1)}))

