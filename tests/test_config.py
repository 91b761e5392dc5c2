"""Node configuration: file < environment < flags, strict keys, keys kept secret."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from eth_account import Account
from eth_typing import HexStr

from node.config import load_config
from node.errors import ConfigError, PolnetError

KEY = "0x" + "11" * 32


def test_precedence_file_then_env_then_flags(tmp_path: Path,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    cfg = tmp_path / "node.toml"
    cfg.write_text('name = "from-file"\nthreads = 2\npoll_interval = 3.0\n'
                   'bootstrap = ["/ip4/127.0.0.1/tcp/1/p2p/x"]\n')
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
