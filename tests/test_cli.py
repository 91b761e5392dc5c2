"""The command line as a newcomer meets it: help that says what to do, and bad
input refused with one actionable line before anything is staked or sent."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def polnet(*args: str, home: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "POLNET_HOME": str(home)}
    return subprocess.run([sys.executable, "-m", "node.cli.main", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


def test_help_names_the_first_steps(tmp_path: Path) -> None:
    out = polnet("--help", home=tmp_path)
    assert out.returncode == 0
    for word in ("make demo", "devnet", "solver", "verifier", "job"):
        assert word in out.stdout


MLP = (REPO / "examples" / "mlp_digits.toml").read_text()


@pytest.mark.parametrize("spec_text, expect", [
    ("bogus = 1\n" + MLP, "bogus"),
    (MLP.replace("lr = 0.05", "lr = -0.05"), "optimizer.lr"),
    ("not = [valid toml", "toml"),
])
def test_submit_rejects_bad_spec_before_any_chain_call(tmp_path: Path, spec_text: str,
                                                       expect: str) -> None:
    spec = tmp_path / "bad.toml"
    spec.write_text(spec_text)
    data = tmp_path / "d.bin"
    data.write_bytes(b"x")
    out = polnet("job", "submit", str(spec), "--dataset", str(data), "--reward", "1",
                 home=tmp_path)
    assert out.returncode == 1
    assert expect.lower() in out.stderr.lower() and "Traceback" not in out.stderr
    assert not (tmp_path / "nodes").exists()  # nothing started, nothing staked


def test_submit_rejects_dataset_that_is_not_the_specs(tmp_path: Path) -> None:
    other = tmp_path / "other.safetensors"
    other.write_bytes(b"not the digits")
    out = polnet("job", "submit", str(REPO / "examples" / "mlp_digits.toml"), "--dataset",
                 str(other), "--reward", "1", home=tmp_path)
    assert out.returncode == 1
    assert "dataset_hash" in out.stderr and "Traceback" not in out.stderr


def test_daemon_without_devnet_says_how_to_start_one(tmp_path: Path) -> None:
    out = polnet("solver", "run", "--dev-account", "2", home=tmp_path)
    assert out.returncode == 1
    assert "polnet devnet up" in out.stderr and "Traceback" not in out.stderr


def test_amounts_are_exact_decimals() -> None:
    from node.cli.job_cmd import pol_to_wei
    from node.errors import ConfigError

    assert pol_to_wei("1.1", "--reward") == 1_100_000_000_000_000_000  # not ...128
    assert pol_to_wei("100", "--reward") == 100 * 10**18
    assert pol_to_wei("0.000000000000000001", "--budget") == 1
    for bad in ("1e-19", "-1", "abc", "nan"):
        with pytest.raises(ConfigError, match="--reward"):
            pol_to_wei(bad, "--reward")


def test_artifact_commands_use_the_store_of_the_daemon_named(tmp_path: Path) -> None:
    """POLNET_HOME is the root for every command; --name picks the node, so `artifact ls
    --name X` lists what the daemon X (Runtime: PolnetNode(settings.p2p_dir)) holds."""
    from node.config import load_config
    from node.store import ArtifactStore

    daemon = load_config(None, home=tmp_path, name="solver1")
    aid = ArtifactStore(daemon.p2p_dir / "store").put_bytes(b"checkpoint bytes")
    out = polnet("artifact", "ls", "--name", "solver1", home=tmp_path)
    assert out.returncode == 0 and aid in out.stdout, out.stderr
    # not a bare hash: its size and what keeps it (nothing here: gc would delete it)
    row = next(ln for ln in out.stdout.splitlines() if aid in ln)
    assert "16" in row and "gc" in row and "kept for" in out.stdout
    assert aid not in polnet("artifact", "ls", "--name", "other", home=tmp_path).stdout
    blob = tmp_path / "blob.bin"
    blob.write_bytes(b"put by hand")
    put = polnet("artifact", "put", str(blob), "--name", "solver1", home=tmp_path)
    assert put.returncode == 0
    assert ArtifactStore(daemon.p2p_dir / "store").has(put.stdout.strip())


def test_p2p_serve_is_a_polnet_command_with_the_nodes_identity(tmp_path: Path) -> None:
    import json

    assert not (REPO / "node" / "p2p" / "serve.py").exists()  # the old entry point is gone
    peer_id = polnet("p2p", "id", "--name", "prov", home=tmp_path).stdout.strip()
    env = {**os.environ, "POLNET_HOME": str(tmp_path), "POLNET_P2P__SERVE__MAX_STREAMS_TOTAL": "8"}
    proc = subprocess.Popen([sys.executable, "-m", "node.cli.main", "--log-level", "WARNING",
                             "p2p", "serve", "--json", "--name", "prov"], cwd=REPO, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        ready = json.loads(proc.stdout.readline())
        assert ready["peer_id"] == peer_id and ready["addrs"][0].endswith(f"/p2p/{peer_id}")
    finally:
        proc.kill()
        proc.wait(10)


def test_bad_p2p_setting_in_the_environment_is_named(tmp_path: Path) -> None:
    env_out = subprocess.run(
        [sys.executable, "-m", "node.cli.main", "artifact", "ls"], cwd=REPO,
        env={**os.environ, "POLNET_HOME": str(tmp_path), "POLNET_P2P__BAN_S": "soon"},
        capture_output=True, text=True, timeout=120)
    assert env_out.returncode == 1 and "p2p.ban_s" in env_out.stderr
    assert "Traceback" not in env_out.stderr


def test_demo_warm_start_without_collab_is_refused_before_anything_starts(
        tmp_path: Path) -> None:
    home = tmp_path / "demo"
    out = polnet("demo", "--warm-start", "40", "--home", str(home), home=tmp_path)
    assert out.returncode == 2
    assert "--collab" in out.stderr and "Traceback" not in out.stderr
    assert not home.exists()  # no devnet, no wipe
    help_text = polnet("demo", "--help", home=tmp_path).stdout
    assert "--warm-start" in help_text and "pretrained" in help_text


def test_help_keeps_bracketed_words(tmp_path: Path) -> None:
    """Rich markup ate ``[networks.NAME]`` and ``[registry]`` from the help texts."""
    top = polnet("--help", home=tmp_path)
    deploy = polnet("deploy", "--help", home=tmp_path)
    assert "[networks.NAME]" in top.stdout
    assert "[networks.NAME]" in deploy.stdout
    assert "[registry]" in deploy.stdout and "[dispute]" in deploy.stdout


def test_a_second_process_under_a_used_name_is_refused(tmp_path: Path) -> None:
    """Two processes under one --name were one peer id on two ports: peers saw
    equivocating records. The second is refused with the first one's pid."""
    env = {**os.environ, "POLNET_HOME": str(tmp_path)}
    first = subprocess.Popen(
        [sys.executable, "-m", "node.cli.main", "p2p", "serve", "--name", "twin",
         "--listen", "/ip4/127.0.0.1/tcp/0"],
        cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        lock = tmp_path / "nodes" / "twin" / "p2p" / "lock"
        for _ in range(600):  # the lock holds the pid once the node is up
            if lock.exists() and lock.read_text().strip() == str(first.pid):
                break
            assert first.poll() is None, first.stdout.read() if first.stdout else ""
            subprocess.run(["sleep", "0.1"], check=True)
        else:
            pytest.fail("the first node never took its identity lock")
        second = polnet("p2p", "serve", "--name", "twin", "--listen", "/ip4/127.0.0.1/tcp/0",
                        home=tmp_path)
        assert second.returncode != 0
        msg = second.stdout + second.stderr
        assert "already running" in msg and str(first.pid) in msg and "--name" in msg
        other = subprocess.Popen(
            [sys.executable, "-m", "node.cli.main", "p2p", "serve", "--name", "other",
             "--listen", "/ip4/127.0.0.1/tcp/0"],
            cwd=REPO, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            other_lock = tmp_path / "nodes" / "other" / "p2p" / "lock"
            for _ in range(600):
                if other_lock.exists() and other_lock.read_text().strip() == str(other.pid):
                    break
                assert other.poll() is None, "a node under another name must start"
                subprocess.run(["sleep", "0.1"], check=True)
            else:
                pytest.fail("a node under another name never started")
        finally:
            other.terminate()
            other.wait(timeout=30)
    finally:
        first.terminate()
        first.wait(timeout=30)
    # the kernel released the lock with the process: the name is free again
    from node.p2p.identity_lock import hold_identity  # noqa: PLC0415

    with hold_identity(tmp_path / "nodes" / "twin" / "p2p"):
        pass
