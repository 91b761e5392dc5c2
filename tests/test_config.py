"""Node configuration: file < environment < flags, strict keys, keys kept secret."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from eth_account import Account
from eth_typing import HexStr

from devnet.testing import LocalChain
from node.config import load_config
from node.errors import ConfigError, PolnetError

KEY = "0x" + "11" * 32


def test_precedence_file_then_env_then_flags(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "node.toml"
    cfg.write_text('name = "from-file"\nthreads = 2\npoll_interval = 3.0\n'
                   '[p2p]\nbootstrap = ["/ip4/127.0.0.1/tcp/1/p2p/x"]\n')
    s = load_config(cfg)
    assert (s.name, s.threads, s.poll_interval) == ("from-file", 2, 3.0)
    monkeypatch.setenv("POLNET_THREADS", "4")
    monkeypatch.setenv("POLNET_NAME", "from-env")
    s = load_config(cfg)
    assert (s.name, s.threads, s.poll_interval) == ("from-env", 4, 3.0)
    s = load_config(cfg, name="from-flag", threads=None)  # None = flag not given
    assert (s.name, s.threads) == ("from-flag", 4)


def test_unknown_or_bad_keys_are_named(tmp_path: Path) -> None:
    cfg = tmp_path / "node.toml"
    cfg.write_text("thread = 2\n")
    with pytest.raises(ConfigError, match="thread"):
        load_config(cfg)
    cfg.write_text('threads = 0\n')
    with pytest.raises(ConfigError, match="threads"):
        load_config(cfg)
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "missing.toml")


def test_private_key_never_printed(tmp_path: Path) -> None:
    s = load_config(None, private_key=KEY, home=tmp_path)
    assert KEY not in repr(s) and KEY[2:] not in str(s.model_dump())
    assert s.load_private_key() == KEY


def test_keystore_roundtrip_and_wrong_password(tmp_path: Path) -> None:
    ks = tmp_path / "key.json"
    ks.write_text(json.dumps(Account.encrypt(HexStr(KEY), "correct horse")))
    s = load_config(None, keystore=ks, keystore_password="correct horse", home=tmp_path)
    assert s.load_private_key() == KEY
    bad = load_config(None, keystore=ks, keystore_password="wrong", home=tmp_path)
    with pytest.raises(ConfigError) as err:
        bad.load_private_key()
    assert "wrong" not in str(err.value) and KEY[2:] not in str(err.value)
    with pytest.raises(ConfigError, match="POLNET_KEYSTORE_PASSWORD"):
        load_config(None, keystore=ks, home=tmp_path).load_private_key()


def test_no_account_names_the_fix(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--dev-account"):
        load_config(None, home=tmp_path).load_private_key()
    s = load_config(None, home=tmp_path, dev_account=0)
    with pytest.raises(PolnetError, match="polnet devnet up"):
        s.load_private_key()  # no devnet deployment under this home


def test_p2p_section_from_file_env_and_flags(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "node.toml"
    cfg.write_text('[p2p]\nlisten = "/ip4/0.0.0.0/tcp/4001"\nban_s = 60.0\n'
                   '[p2p.serve]\nmax_streams_total = 32\n')
    s = load_config(cfg)
    assert (s.p2p.listen, s.p2p.ban_s, s.p2p.serve.max_streams_total) == \
        ("/ip4/0.0.0.0/tcp/4001", 60.0, 32)
    assert s.p2p.serve.reserved_for_registered == 16  # a nested default survives the file
    monkeypatch.setenv("POLNET_P2P__LISTEN", "/ip4/0.0.0.0/tcp/4002")
    monkeypatch.setenv("POLNET_P2P__SERVE__MAX_STREAMS_TOTAL", "48")
    monkeypatch.setenv("POLNET_P2P__FETCH__MIN_RATE_BPS", "1024")
    s = load_config(cfg)
    assert (s.p2p.listen, s.p2p.serve.max_streams_total, s.p2p.fetch.min_rate_bps) == \
        ("/ip4/0.0.0.0/tcp/4002", 48, 1024)
    assert s.p2p.ban_s == 60.0  # the file's value where the environment says nothing
    s = load_config(cfg, listen="/ip4/127.0.0.1/tcp/4003", bootstrap=["/ip4/1.2.3.4/tcp/1/p2p/x"])
    assert (s.p2p.listen, s.p2p.bootstrap) == ("/ip4/127.0.0.1/tcp/4003",
                                               ["/ip4/1.2.3.4/tcp/1/p2p/x"])
    assert s.p2p.serve.max_streams_total == 48  # a flag replaces only what it names


def test_p2p_section_is_strict_and_old_keys_say_where_they_went(tmp_path: Path) -> None:
    cfg = tmp_path / "node.toml"
    cfg.write_text("[p2p.serve]\nmax_stream_total = 3\n")
    with pytest.raises(ConfigError, match="max_stream_total"):
        load_config(cfg)
    cfg.write_text('listen = "/ip4/0.0.0.0/tcp/1"\n')
    with pytest.raises(ConfigError, match=r"p2p\.listen"):
        load_config(cfg)


def test_one_listen_default_and_one_home(tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from node.p2p.config import DEFAULT_LISTEN, P2PSettings

    monkeypatch.setenv("POLNET_HOME", str(tmp_path))
    s = load_config(None, name="solver")
    assert s.p2p.listen == P2PSettings().listen == DEFAULT_LISTEN
    assert s.p2p_dir == tmp_path / "nodes" / "solver" / "p2p"


def test_p2p_settings_reach_the_node_the_daemons_build(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    """Runtime builds PolnetNode(settings.p2p_dir, settings.p2p): what the environment
    sets is what the node serves and fetches with."""
    from node.p2p.host import PolnetNode

    monkeypatch.setenv("POLNET_P2P__SERVE__MAX_STREAMS_TOTAL", "8")
    monkeypatch.setenv("POLNET_P2P__BAN_S", "5")
    s = load_config(None, home=tmp_path, name="v1", listen="/ip4/127.0.0.1/tcp/0")
    node = PolnetNode(s.p2p_dir, s.p2p)  # not started: no sockets
    assert node.server.limits.max_streams_total == 8 and node.banned.ban_s == 5.0
    assert node.store.root == tmp_path / "nodes" / "v1" / "p2p" / "store"
    assert (tmp_path / "nodes" / "v1" / "p2p" / "p2p.key").exists()


def test_network_profile_fills_rpc_deployment_and_confirmations(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "net.toml"
    cfg.write_text('[networks.l2]\nrpc_url = "http://127.0.0.1:9999"\nchain_id = 10\n'
                   'deployment = "~/l2.json"\nconfirmations = 3\n'
                   '[networks.other]\nrpc_url = "http://127.0.0.1:1"\nchain_id = 1\n'
                   'deployment = "o.json"\n')
    s = load_config(cfg, network="l2")
    assert (s.rpc_url, s.deployment_path, s.confirmations, s.expected_chain_id) == (
        "http://127.0.0.1:9999", Path("~/l2.json").expanduser(), 3, 10)
    # an explicit value still wins over the profile's
    s = load_config(cfg, network="l2", rpc_url="http://127.0.0.1:8000", confirmations=0)
    assert (s.rpc_url, s.confirmations) == ("http://127.0.0.1:8000", 0)
    monkeypatch.setenv("POLNET_NETWORK", "other")  # what `polnet --network other` sets
    assert load_config(cfg).rpc_url == "http://127.0.0.1:1"
    with pytest.raises(ConfigError, match=r"unknown network 'nope' \(configured: l2, other\)"):
        load_config(cfg, network="nope")
    monkeypatch.delenv("POLNET_NETWORK")
    bad = tmp_path / "bad.toml"
    bad.write_text('[networks.x]\nrpc_url = "ftp://x"\nchain_id = 1\ndeployment = "d"\n')
    with pytest.raises(ConfigError, match="networks.x.rpc_url"):
        load_config(bad)
    assert load_config(None).network is None and load_config(None).confirmations == 0


def test_a_deployment_of_another_chain_is_refused(chain: LocalChain) -> None:
    from node.chain.client import ChainClient

    wrong = chain.deployment.model_copy(update={"chain_id": 1})
    with pytest.raises(ConfigError, match=r"is chain 31337, but the deployment file is for "
                                          r"chain 1"):
        ChainClient(chain.url, None, wrong)


def test_a_profile_naming_another_chain_is_refused_by_every_command(
        chain: LocalChain, tmp_path: Path) -> None:
    """`chain_id` in a network profile was checked by `deploy` alone: every other
    command signed or read on whatever chain its rpc_url answered."""
    import os
    import subprocess
    import sys

    dep = tmp_path / "deployment.json"
    chain.deployment.save(dep)
    cfg = tmp_path / "polnet.toml"
    cfg.write_text(f'[networks.wrong]\nrpc_url = "{chain.url}"\nchain_id = 10\n'
                   f'deployment = "{dep}"\n')
    env = {**os.environ, "POLNET_HOME": str(tmp_path / "home")}
    for args in (["job", "list"], ["job", "status", "1"], ["dispute", "status", "1"],
                 ["solver", "run", "--dev-account", "2"]):
        out = subprocess.run([sys.executable, "-m", "node.cli.main", "--network", "wrong",
                              *args, "--config", str(cfg)],
                             env=env, capture_output=True, text=True, timeout=120)
        msg = out.stdout + out.stderr
        assert out.returncode != 0, (args, msg)
        assert "chain_id = 10" in msg and "is chain 31337" in msg, (args, msg)
