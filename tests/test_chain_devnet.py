"""`polnet devnet up/status/down` end to end, and its clear errors."""

from __future__ import annotations

import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

import pytest

import devnet
from devnet.anvil import free_port, pid_alive
from node.chain.artifacts import artifacts_dir
from node.chain.client import ChainClient
from node.chain.deployment import Deployment
from node.errors import DevnetError


def polnet(home: Path, *args: str, env: dict[str, str] | None = None
           ) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "node.cli.main", *args], capture_output=True,
                          text=True, timeout=120,
                          env={**os.environ, "POLNET_HOME": str(home), **(env or {})})


@pytest.mark.skipif(not (artifacts_dir() / "DisputeGame.json").is_file(),
                    reason="contract artifacts missing: run `make contracts`")
def test_cli_up_status_down(tmp_path: Path) -> None:
    port = free_port()
    up = polnet(tmp_path, "devnet", "up", "--port", str(port), "--accounts", "3")
    try:
        assert up.returncode == 0, up.stderr
        assert f"127.0.0.1:{port}" in up.stdout and "JobMarket" in up.stdout
        dep_file = tmp_path / "devnet" / "deployment.json"
        assert stat.S_IMODE(dep_file.stat().st_mode) == 0o600
        dep = Deployment.load(dep_file)
        assert dep.chain_id == 31337 and len(dep.accounts) == 3
        assert set(dep.contracts) == {"PolToken", "NodeRegistry", "JobMarket", "DisputeGame",
                                      "OuterJury", "CollabMarket", "Availability"}
        client = ChainClient.from_deployment(dep, account=1)
        assert client.token.balance_of(client.address) == dep.params["mint_per_account"]
        assert client.registry.market() == dep.contracts["JobMarket"]

        st = polnet(tmp_path, "devnet", "status")
        assert st.returncode == 0, st.stderr
        assert st.stdout.count("code ok") == 7 and "block" in st.stdout

        # a keystore's fresh address gets POL and gas without `cast`
        fresh = "0x" + "ab" * 20
        funded = polnet(tmp_path, "devnet", "fund", fresh, "--pol", "250", "--eth", "2")
        assert funded.returncode == 0, funded.stderr
        assert client.token.balance_of(fresh) == 250 * 10**18
        assert client.eth_balance(fresh) == 2 * 10**18
        bad = polnet(tmp_path, "devnet", "fund", "0xnope")
        assert bad.returncode == 1 and "not an address" in bad.stderr

        again = polnet(tmp_path, "devnet", "up", "--port", str(free_port()))
        assert again.returncode == 1 and "already running" in again.stderr
        assert "polnet devnet down" in again.stderr
    finally:
        down = polnet(tmp_path, "devnet", "down")
    assert down.returncode == 0 and "stopped" in down.stdout
    assert not (tmp_path / "devnet" / "deployment.json").exists()
    st = polnet(tmp_path, "devnet", "status")
    assert st.returncode == 1 and "not running" in st.stdout
    assert "not running" in polnet(tmp_path, "devnet", "down").stdout


def test_port_in_use_is_a_clear_error(tmp_path: Path) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        with pytest.raises(DevnetError, match="already in use"):
            devnet.start(port=port, home=tmp_path)
    assert devnet.running(tmp_path) is None


def test_missing_anvil_says_run_setup(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POLNET_ANVIL", str(tmp_path / "no-anvil"))
    with pytest.raises(DevnetError, match="make setup"):
        devnet.start(port=free_port(), home=tmp_path)
    r = polnet(tmp_path, "devnet", "up", "--port", str(free_port()),
               env={"POLNET_ANVIL": str(tmp_path / "no-anvil")})
    assert r.returncode == 1 and "npm ci" in r.stderr and "Traceback" not in r.stderr


def test_stale_pid_file_is_not_running(tmp_path: Path) -> None:
    (tmp_path / "devnet").mkdir()
    (tmp_path / "devnet" / "anvil.pid").write_text('{"pid": 999999, "port": 1}')
    assert not pid_alive(999999)
    assert devnet.running(tmp_path) is None
