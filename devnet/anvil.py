"""Starting and stopping anvil, the local chain.

The platform binary is run directly (not the npm ``bin.mjs`` shim) so that the
pid we record is anvil's own and stopping it leaves no orphan.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import requests
from eth_account import Account
from eth_account.signers.local import LocalAccount

from node.errors import DevnetError

REPO = Path(__file__).resolve().parents[1]
DEV_MNEMONIC = "test test test test test test test test test test test junk"  # anvil's default
CHAIN_ID = 31337


def anvil_binary() -> Path:
    """The anvil executable: ``$POLNET_ANVIL``, the repo's npm package, or PATH."""
    env = os.environ.get("POLNET_ANVIL")
    if env:  # an explicit choice is never second-guessed
        if Path(env).is_file() and os.access(env, os.X_OK):
            return Path(env)
        raise DevnetError(f"POLNET_ANVIL={env} is not an executable anvil: fix or unset it "
                          "(`make setup` / `npm ci` installs one under node_modules)")
    candidates = [REPO / "node_modules/@foundry-rs/anvil-linux-amd64/bin/anvil"]
    on_path = shutil.which("anvil")
    if on_path:
        candidates.append(Path(on_path))
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return c
    raise DevnetError("anvil not found: run `make setup` (or `npm ci`) in the repository, "
                      "or set POLNET_ANVIL to an anvil binary")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def port_in_use(port: int) -> bool:
    """Something listens on the port, or it cannot be bound. SO_REUSEADDR (as anvil
    binds) so that a just-stopped anvil's TIME_WAIT sockets do not count."""
    with socket.socket() as s:
        s.settimeout(0.5)
        if s.connect_ex(("127.0.0.1", port)) == 0:
            return True
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return True
    return False


def dev_accounts(n: int, mnemonic: str = DEV_MNEMONIC) -> list[LocalAccount]:
    """The first ``n`` accounts anvil funds for ``mnemonic`` (BIP-44 m/44'/60'/0'/0/i)."""
    Account.enable_unaudited_hdwallet_features()
    return [Account.from_mnemonic(mnemonic, account_path=f"m/44'/60'/0'/0/{i}")
            for i in range(n)]


def rpc_ready(url: str, timeout: float = 0.5) -> bool:
    try:
        r = requests.post(url, json={"jsonrpc": "2.0", "id": 1, "method": "eth_chainId",
                                     "params": []}, timeout=timeout)
        return r.ok and "result" in r.json()
    except (requests.RequestException, ValueError):
        return False


@dataclass
class AnvilProcess:
    """A running local EVM node (anvil, or Hardhat: devnet/hardhat.py). ``proc`` is set
    when this process started it."""

    port: int
    pid: int
    log_path: Path | None = None
    proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def alive(self) -> bool:
        if self.proc is not None:
            return self.proc.poll() is None
        return pid_alive(self.pid)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM (anvil then writes ``--state``/``--dump-state``), SIGKILL if it hangs."""
        if not self.alive():
            return
        try:
            os.kill(self.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc is not None:
                try:
                    self.proc.wait(timeout=0.05)
                    return
                except subprocess.TimeoutExpired:
                    continue
            if not pid_alive(self.pid):
                return
            time.sleep(0.05)
        os.kill(self.pid, signal.SIGKILL)
        if self.proc is not None:
            self.proc.wait()


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie child of ours counts as dead
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][:1] != "Z"
    except OSError:
        return True


def start_anvil(port: int | None = None, *, accounts: int = 10, block_time: float | None = None,
                state: Path | None = None, load_state: Path | None = None,
                dump_state: Path | None = None, log_path: Path | None = None,
                detach: bool = False, timeout: float = 30.0,
                extra_args: tuple[str, ...] = ()) -> AnvilProcess:
    """Start anvil on 127.0.0.1 and wait until it answers JSON-RPC.

    ``state`` loads from and dumps to one file (restart with the same chain);
    ``detach`` puts it in its own session so it outlives this process.
    """
    port = port or free_port()
    if port_in_use(port):
        raise DevnetError(f"port {port} on 127.0.0.1 is already in use: stop whatever "
                          f"listens there or pick another with --port")
    args = [str(anvil_binary()), "--host", "127.0.0.1", "--port", str(port),
            "--accounts", str(accounts), "--mnemonic", DEV_MNEMONIC,
            "--chain-id", str(CHAIN_ID)]
    if block_time:
        args += ["--block-time", str(block_time)]
    if state:
        args += ["--state", str(state)]
    if load_state:
        args += ["--load-state", str(load_state)]
    if dump_state:
        args += ["--dump-state", str(dump_state)]
    args += list(extra_args)
    return spawn_chain(args, port, "anvil", log_path=log_path, detach=detach, timeout=timeout)


def spawn_chain(args: list[str], port: int, what: str, *, env: dict[str, str] | None = None,
                log_path: Path | None = None, detach: bool = False,
                timeout: float = 30.0, cwd: Path | None = None) -> AnvilProcess:
    """Start a local EVM node (anvil, Hardhat) and wait until it answers JSON-RPC."""
    out: IO[bytes] | int = subprocess.DEVNULL
    if log_path is not None:
        log_path.parent.mkdir(parents=True, exist_ok=True)
        # the node prints the dev accounts' private keys: owner-only from the first byte.
        fd = os.open(log_path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        os.fchmod(fd, 0o600)  # a log left by an older version may be world-readable
        out = os.fdopen(fd, "ab")
    try:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, env=env, cwd=cwd,
                                stdin=subprocess.DEVNULL, start_new_session=detach)
    finally:
        if not isinstance(out, int):
            out.close()
    node = AnvilProcess(port=port, pid=proc.pid, log_path=log_path, proc=proc)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise DevnetError(f"{what} exited with code {proc.returncode} at start"
                              + _log_tail(log_path))
        if rpc_ready(node.url):
            return node
        time.sleep(0.05)
    node.stop()
    raise DevnetError(f"{what} did not answer on {node.url} within {timeout:.0f} s"
                      + _log_tail(log_path))


def _log_tail(log_path: Path | None) -> str:
    """The log's last lines, led by the first line that names an error (Hardhat prints
    its cause, e.g. ``Error HH12: ...``, above a stack trace that fills the tail)."""
    if log_path is None or not log_path.is_file():
        return ""
    lines = log_path.read_text(errors="replace").strip().splitlines()
    cause = next((ln.strip() for ln in lines if re.search(r"\bError\b", ln)), None)
    tail = lines[-5:]
    head = f"\n  cause: {cause}" if cause is not None and cause not in tail else ""
    return f" (log {log_path}:{head}\n  " + "\n  ".join(tail) + ")"
