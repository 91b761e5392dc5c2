"""A whole polnet network on one machine, as real OS processes: an anvil devnet
and `polnet` solver / verifier / submitter daemons on loopback libp2p.

Used by `polnet demo` and by the end-to-end tests; nothing here is mocked. Each
node is started through the public CLI, exactly as a user would.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from devnet import manager
from devnet.anvil import free_port
from devnet.params import DevnetParams
from node.chain.client import ChainClient
from node.chain.deployment import Deployment
from node.chain.events import ChainEvent, EventWatcher
from node.chain.ids import CollabId, JobId
from node.errors import PolnetError

REPO = Path(__file__).resolve().parent.parent
TOKEN = 10**18


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, str) and isinstance(b, str):
        return a.lower() == b.lower()
    return bool(a == b)


@dataclass
class LocalNet:
    home: Path
    params: DevnetParams = field(default_factory=DevnetParams)
    block_time: float = 1.0
    accounts: int = 10
    evm: str = "anvil"  # or "hardhat": the same network on a second EVM implementation
    procs: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    deployment: Deployment | None = None
    chain: ChainClient | None = None
    _boot: str | None = None
    _events: list[ChainEvent] = field(default_factory=list)
    _watcher: EventWatcher | None = None

    # --- lifecycle ---------------------------------------------------------------------

    def __enter__(self) -> LocalNet:
        if self.home.exists():
            manager.stop(self.home)
            shutil.rmtree(self.home)
        (self.home / "logs").mkdir(parents=True)
        self.deployment = manager.start(port=free_port(), accounts=self.accounts,
                                        block_time=self.block_time, params=self.params,
                                        home=self.home, evm=self.evm)
        self.chain = ChainClient.from_deployment(self.deployment, None)
        books = [self.chain.market, self.chain.dispute, self.chain.registry]
        if "Availability" in self.deployment.contracts:
            books.append(self.chain.availability)
        if "CollabMarket" in self.deployment.contracts:
            books += [self.chain.collab, self.chain.outer_jury]
        self._watcher = EventWatcher(self.chain.w3, books,
                                     start_block=self.deployment.deploy_block)
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop_all()
        manager.stop(self.home)

    @property
    def c(self) -> ChainClient:
        assert self.chain is not None, "LocalNet not entered"
        return self.chain

    def address(self, dev_account: int) -> str:
        assert self.deployment is not None
        return self.deployment.accounts[dev_account].address

    # --- processes -----------------------------------------------------------------------

    def polnet(self, name: str, *args: str, module: str = "node.cli.main"
               ) -> subprocess.Popen[bytes]:
        """Start `polnet ARGS` as node NAME (log in HOME/logs/NAME.log); ``module``: a
        test's own entry point that takes the same arguments (a cheat is never a flag
        of the production CLI)."""
        log = open(self.home / "logs" / f"{name}.log", "ab")  # noqa: SIM115 - lives with proc
        env = {**os.environ, "POLNET_HOME": str(self.home), "OMP_NUM_THREADS": "1"}
        p = subprocess.Popen([sys.executable, "-m", module, *args], stdout=log,
                             stderr=subprocess.STDOUT, env=env, cwd=REPO,
                             start_new_session=True)
        self.procs[name] = p
        return p

    def node_args(self, name: str, dev_account: int) -> list[str]:
        args = ["--name", name, "--dev-account", str(dev_account)]
        if self._boot:
            args += ["--bootstrap", self._boot]
        return args

    def bootstrap_from(self, name: str) -> None:
        """Nodes started from now on bootstrap to running node NAME (e.g. a submitter
        started before any daemon)."""
        self._boot = self.wait_node(name)["addrs"][0]

    def start_verifier(self, name: str, dev_account: int, *extra: str,
                       module: str = "node.cli.main") -> dict[str, Any]:
        self.polnet(name, "verifier", "run", *self.node_args(name, dev_account), *extra,
                    module=module)
        info = self.wait_node(name)
        if self._boot is None:
            self._boot = info["addrs"][0]
        return info

    def start_solver(self, name: str, dev_account: int, behavior: str = "honest",
                     *extra: str) -> dict[str, Any]:
        self.polnet(name, "solver", "run", *self.node_args(name, dev_account),
                    "--behavior", behavior, *extra)
        info = self.wait_node(name)
        if self._boot is None:
            self._boot = info["addrs"][0]
        return info

    def submit(self, name: str, dev_account: int, spec: Path, dataset: Path,
               reward: float = 100, budget: float = 12, solve_duration: int = 300) -> JobId:
        """Post a job from a serving submitter process; returns the job id."""
        before = self.c.market.job_count()
        self.polnet(name, "job", "submit", str(spec), "--dataset", str(dataset),
                    "--reward", str(reward), "--budget", str(budget),
                    "--solve-duration", str(solve_duration), *self.node_args(name, dev_account))
        end = time.monotonic() + 120
        while time.monotonic() < end:
            if self.c.market.job_count() > before:
                return JobId(before + 1)
            self.check_alive()
            time.sleep(0.5)
        raise PolnetError(f"{name} did not post its job; see {self.home}/logs/{name}.log")

    def submit_collab(self, name: str, dev_account: int, spec: Path, dataset: Path,
                      reward: float = 100, budget: float = 12,
                      round_duration: int = 120, init_weights: Path | None = None,
                      pipeline_depth: int = 0) -> CollabId:
        """Post a collaborative job from a serving submitter process; returns its id.
        ``init_weights``: theta_0's file, for a spec that names one (a warm start);
        ``pipeline_depth``: the job's D (issue 35)."""
        before = self.c.collab.collab_count()
        init = ["--init-weights", str(init_weights)] if init_weights is not None else []
        if pipeline_depth:
            init += ["--pipeline-depth", str(pipeline_depth)]
        self.polnet(name, "job", "submit", str(spec), "--dataset", str(dataset),
                    "--reward", str(reward), "--budget", str(budget),
                    "--round-duration", str(round_duration), *init,
                    *self.node_args(name, dev_account))
        end = time.monotonic() + 120
        while time.monotonic() < end:
            if self.c.collab.collab_count() > before:
                return CollabId(before + 1)
            self.check_alive()
            time.sleep(0.5)
        raise PolnetError(f"{name} did not post its job; see {self.home}/logs/{name}.log")

    def wait_node(self, name: str, timeout: float = 120) -> dict[str, Any]:
        path = self.home / "nodes" / name / "node.json"
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if path.is_file():
                info: dict[str, Any] = json.loads(path.read_text())
                if info.get("pid") == self.procs[name].pid:
                    return info
            if self.procs[name].poll() is not None:
                break
            time.sleep(0.3)
        raise PolnetError(f"node {name} did not start; see {self.home}/logs/{name}.log")

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        p = self.procs[name]
        if p.poll() is None:
            os.killpg(p.pid, sig)
            p.wait(10)

    def check_alive(self) -> None:
        for name, p in self.procs.items():
            if p.poll() not in (None, 0, -signal.SIGKILL, -signal.SIGTERM):
                raise PolnetError(f"{name} exited with {p.returncode}; "
                                  f"see {self.home}/logs/{name}.log")

    def stop_all(self) -> None:
        for p in self.procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        for p in self.procs.values():
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)

    def pause_rpc(self, seconds: float) -> None:
        """Freeze anvil (SIGSTOP) so every RPC call hangs or fails, then resume it."""
        proc = manager.running(self.home)
        if proc is None or proc.pid is None:
            raise PolnetError("anvil is not running")
        pid = proc.pid
        os.kill(pid, signal.SIGSTOP)
        try:
            time.sleep(seconds)
        finally:
            os.kill(pid, signal.SIGCONT)

    # --- chain -------------------------------------------------------------------------

    def events(self) -> list[ChainEvent]:
        """Every event so far (market, dispute game, registry; collab market and outer jury
        when deployed), in chain order."""
        assert self._watcher is not None
        self._events += self._watcher.poll()
        return list(self._events)

    def new_events(self) -> list[ChainEvent]:
        assert self._watcher is not None
        fresh = self._watcher.poll()
        self._events += fresh
        return fresh

    def wait_job(self, job_id: JobId, statuses: Iterable[int], timeout: float,
                 on_tick: Any = None) -> None:
        want = set(statuses)
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if on_tick is not None:
                on_tick()
            if self.c.market.job_count() >= job_id and \
                    int(self.c.market.get_job(job_id).status) in want:
                return
            self.check_alive()
            time.sleep(1)
        raise PolnetError(f"job {job_id} did not reach {sorted(want)} in {timeout:.0f}s; "
                          f"logs in {self.home}/logs")

    def wait_event(self, name: str, timeout: float, contract: str | None = None,
                   on_tick: Any = None, **match: Any) -> ChainEvent:
        """The first event ``name`` (of ``contract``, if given) whose args match."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if on_tick is not None:
                on_tick()
            for ev in self.events():
                if ev.event == name and contract in (None, ev.contract) \
                        and all(_same(ev.args.get(k), v) for k, v in match.items()):
                    return ev
            self.check_alive()
            time.sleep(1)
        seen = [(e.contract, dict(e.args)) for e in self._events if e.event == name]
        raise PolnetError(f"no {name} {match} in {timeout:.0f}s (saw {seen}); "
                          f"logs in {self.home}/logs")

    def holdings(self, address: str) -> int:
        """Wallet + stake + unwithdrawn credits: everything an account owns."""
        c = self.c
        collab = c.collab.credits(address) if self._has_collab else 0
        return (c.token.balance_of(address) + c.registry.free_stake(address)
                + c.registry.locked_stake(address) + c.registry.seat_locked_stake(address)
                + c.market.credits(address)
                + c.dispute.credits(address) + collab)

    @property
    def _has_collab(self) -> bool:
        return self.deployment is not None and "CollabMarket" in self.deployment.contracts

    def conserved(self) -> bool:
        return self.contracts_gap() == 0

    def contracts_gap(self) -> int:
        """What the contracts hold minus what they owe, all read at one block: daemons keep
        sending transactions (a withdrawal moves both sides), so reads spread over two
        blocks could see one side of a transfer and not the other."""
        return sum(held - owed for held, owed in self.books().values())

    def books(self) -> dict[str, tuple[int, int]]:
        """Each contract's (tokens held, totalOwed), all read at one block; the outer jury
        owes nothing, so what it holds counts against the collab market's books."""
        c = self.c
        block = c.w3.eth.block_number
        books: list[Any] = [c.market, c.registry, c.dispute]
        if "Availability" in self.deployment.contracts:  # type: ignore[union-attr]
            books.append(c.availability)  # bonds of pending availability requests
        if self._has_collab:
            books.append(c.collab)
        out: dict[str, tuple[int, int]] = {}
        for b in books:
            held = int(c.token.call("balanceOf", b.address, block=block))
            if b is c.collab:
                held += int(c.token.call("balanceOf", c.outer_jury.address, block=block))
            out[b.name] = (held, int(b.call("totalOwed", block=block)))
        return out
