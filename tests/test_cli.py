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
