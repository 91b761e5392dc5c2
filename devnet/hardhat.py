"""A Hardhat Network node (EDR), the second EVM implementation the tests run on.

Same dev mnemonic as anvil, a different chain id (31338), so nothing may assume
one chain. Started from the repository's npm package with devnet/hardhat.config.js;
``kind(w3)`` tells the two apart where their dev RPCs differ (``anvil_mine`` vs
``hardhat_mine``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from devnet.anvil import DEV_MNEMONIC, REPO, AnvilProcess, free_port, port_in_use, spawn_chain
from node.errors import DevnetError

HARDHAT_CHAIN_ID = 31338
CONFIG = REPO / "devnet" / "hardhat.config.js"


def hardhat_binary() -> Path:
    b = REPO / "node_modules" / ".bin" / "hardhat"
    if not b.exists():
        raise DevnetError("hardhat not found: run `make setup` (or `npm ci`) in the repository")
    return b


def start_hardhat(port: int | None = None, *, accounts: int = 10,
                  block_time: float | None = None, log_path: Path | None = None,
                  detach: bool = False, timeout: float = 90.0) -> AnvilProcess:
    """Start `hardhat node` on 127.0.0.1 and wait until it answers JSON-RPC."""
    port = port or free_port()
    if port_in_use(port):
        raise DevnetError(f"port {port} on 127.0.0.1 is already in use: pick another")
    env = {**os.environ, "HARDHAT_DISABLE_TELEMETRY_PROMPT": "true",
           "POLNET_HH_MNEMONIC": DEV_MNEMONIC, "POLNET_HH_ACCOUNTS": str(accounts),
           "POLNET_HH_CHAIN_ID": str(HARDHAT_CHAIN_ID),
           "POLNET_HH_BLOCK_MS": str(int((block_time or 0) * 1000)),
           "POLNET_HH_CACHE": str((log_path.parent if log_path else Path("/tmp"))
                                  / "hardhat-cache")}
    args = [str(hardhat_binary()), "--config", str(CONFIG), "node", "--hostname", "127.0.0.1",
            "--port", str(port)]
    # Hardhat refuses to run from a directory outside its installation (HH12): start it
    # in the repository, wherever the command was typed.
    return spawn_chain(args, port, "hardhat", env=env, log_path=log_path, detach=detach,
                       timeout=timeout, cwd=REPO)


def kind(w3: Any) -> str:
    """'hardhat' or 'anvil', from the node's client version."""
    version = str(w3.client_version).lower()
    return "hardhat" if "hardhat" in version else "anvil"
