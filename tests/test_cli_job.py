"""`polnet job` output against a real chain: what a submission would cost (--dry-run),
watching a job to its end, and unknown ids refused with exit code 1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from devnet.testing import LocalChain, job_terms
from node.datasets import pack_digits, write_dataset

REPO = Path(__file__).resolve().parent.parent
SUBMITTER = 1


def polnet_env(home: Path, chain: LocalChain) -> dict[str, str]:
    chain.deployment.save(home / "devnet" / "deployment.json")  # the default deployment path
    return {**os.environ, "POLNET_HOME": str(home)}


def run(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "node.cli.main", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=120)


def test_dry_run_shows_cost_and_bond_and_posts_nothing(chain: LocalChain,
                                                        tmp_path: Path) -> None:
    env = polnet_env(tmp_path, chain)
    data = tmp_path / "digits.safetensors"
    write_dataset(pack_digits(), data)
    before = chain.reader.market.job_count()
    out = run(env, "job", "submit", str(REPO / "examples" / "mlp_digits.toml"), "--dataset",
              str(data), "--reward", "1.1", "--budget", "0.000000000000000001", "--dry-run",
              "--dev-account", str(SUBMITTER))
    assert out.returncode == 0, out.stderr
    assert "you escrow   1.100000000000000001 POL = reward 1.1 POL + verification budget " \
           "0.000000000000000001 POL" in out.stdout
    bps = chain.reader.market.market_params().bond_factor_bps
    bond = 1_100_000_000_000_000_000 * bps // 10_000  # the contract's own arithmetic
    whole, frac = divmod(bond, 10**18)
    shown = f"{whole}.{frac:018d}".rstrip("0").rstrip(".")
    assert f"solver bond  {shown} POL" in out.stdout
    assert "enough" in out.stdout and chain.addresses[SUBMITTER] in out.stdout
    assert chain.reader.market.job_count() == before  # nothing posted
    assert not (tmp_path / "nodes").exists()  # no node started, nothing stored


def test_dry_run_offline_still_shows_the_cost(tmp_path: Path) -> None:
    data = tmp_path / "digits.safetensors"
    write_dataset(pack_digits(), data)
    out = run({**os.environ, "POLNET_HOME": str(tmp_path)}, "job", "submit",
              str(REPO / "examples" / "mlp_digits.toml"), "--dataset", str(data),
              "--reward", "100", "--dry-run")
    assert out.returncode == 0, out.stderr
    assert "you escrow   110 POL = reward 100 POL + verification budget 10 POL" in out.stdout
    assert "solver bond  unknown" in out.stdout and "polnet devnet up" in out.stdout


def test_watch_follows_a_job_to_its_end(chain: LocalChain, tmp_path: Path) -> None:
    env = polnet_env(tmp_path, chain)
    jid = chain[SUBMITTER].post_job(job_terms())
    watch = subprocess.Popen([sys.executable, "-m", "node.cli.main", "job", "status", str(jid),
                              "--watch", "--json", "--interval", "0.2"], cwd=REPO, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert watch.stdout is not None
        first = json.loads(watch.stdout.readline())
        assert first["status"] == "open"
        time.sleep(0.5)
        chain[SUBMITTER].market.cancel(jid)
        rest, err = watch.communicate(timeout=60)
    finally:
        watch.kill()
    assert watch.returncode == 0, err
    lines = [json.loads(ln) for ln in rest.splitlines()]
    assert lines and lines[-1]["status"] == "cancelled"  # it printed the change, then ended


def test_unknown_job_and_dispute_ids_exit_1(chain: LocalChain, tmp_path: Path) -> None:
    env = polnet_env(tmp_path, chain)
    for area in ("job", "dispute"):
        out = run(env, area, "status", "999")
        assert out.returncode == 1 and f"no {area} 999" in out.stderr, out.stderr
        assert "Traceback" not in out.stderr


def test_fetch_of_a_job_not_final_says_so_at_once(chain: LocalChain, tmp_path: Path) -> None:
    env = polnet_env(tmp_path, chain)
    job = chain[SUBMITTER].post_job(job_terms())
    out = run(env, "job", "fetch", str(job), "--out", str(tmp_path / "m.safetensors"),
              "--dev-account", str(SUBMITTER))
    assert out.returncode == 1 and f"job {job} is open, not finalized" in out.stderr
    assert not (tmp_path / "nodes").exists()  # it asked the chain: no p2p node, no peer wait
    missing = run(env, "job", "fetch", "999", "--dev-account", str(SUBMITTER))
    assert missing.returncode == 1 and "no job 999" in missing.stderr


def test_submit_checks_the_balance_before_starting_anything(chain: LocalChain,
                                                             tmp_path: Path) -> None:
    env = polnet_env(tmp_path, chain)
    data = tmp_path / "digits.safetensors"
    write_dataset(pack_digits(), data)
    have = chain.reader.token.balance_of(chain.addresses[SUBMITTER])
    too_much = f"{have // 10**18 + 1}"
    out = run(env, "job", "submit", str(REPO / "examples" / "mlp_digits.toml"), "--dataset",
              str(data), "--reward", too_much, "--budget", "0", "--dev-account", str(SUBMITTER))
    assert out.returncode == 1 and "short by" in out.stderr and "POL" in out.stderr, out.stderr
    assert "wei" not in out.stderr
    assert not (tmp_path / "nodes").exists()  # no node started, nothing stored


def test_a_reward_beyond_the_market_bound_is_refused_in_pol(tmp_path: Path) -> None:
    data = tmp_path / "digits.safetensors"
    write_dataset(pack_digits(), data)
    out = run({**os.environ, "POLNET_HOME": str(tmp_path)}, "job", "submit",
              str(REPO / "examples" / "mlp_digits.toml"), "--dataset", str(data),
              "--reward", "800000000", "--dev-account", str(SUBMITTER))
    assert out.returncode == 1 and "at most 792281625.142643375935439503 POL" in out.stderr


def test_collaborative_spec_dry_run_and_status(chain: LocalChain, tmp_path: Path) -> None:
    """A kind = "collaborative" spec goes to the CollabMarket path: the dry run shows the
    rounds, slots and per-inner-run pay; a wrong dataset is refused naming the field, a
    pipeline depth past the CollabMarket's 4 naming the range;
    `status --collab` refuses an unknown collaborative job."""
    from node.datasets import pack_text

    env = polnet_env(tmp_path, chain)
    text = tmp_path / "text.safetensors"
    write_dataset(pack_text(), text)
    spec = REPO / "examples" / "collab_lm_text.toml"
    out = run(env, "job", "submit", str(spec), "--dataset", str(text), "--reward", "80",
              "--dry-run")
    assert out.returncode == 0, out.stderr
    assert "20 rounds x 4 slots (at least 4 per round) x 50 inner steps" in out.stdout
    assert "each of the 80 sub-jobs pays its worker 1 POL" in out.stdout
    digits = tmp_path / "digits.safetensors"
    write_dataset(pack_digits(), digits)
    bad = run(env, "job", "submit", str(spec), "--dataset", str(digits), "--reward", "80",
              "--dry-run")
    assert bad.returncode == 1 and "inner.dataset_hash" in bad.stderr, bad.stderr
    deep = run(env, "job", "submit", str(spec), "--dataset", str(text), "--reward", "80",
               "--pipeline-depth", "5", "--dry-run")
    assert deep.returncode == 1 and "--pipeline-depth must be 0..4" in deep.stderr, deep.stderr
    missing = run(env, "job", "status", "7", "--collab")
    assert missing.returncode == 1 and "no collaborative job 7" in missing.stderr
    assert "Traceback" not in missing.stderr + bad.stderr


def test_status_and_list_read_as_people_say_them(chain: LocalChain, tmp_path: Path) -> None:
    """`job status` printed "reward": 100000000000000000000 and unix times in its events
    table; `job list` showed only open disputes. Amounts are POL (2 decimals, exact with
    --exact), times are dates, parties have roles."""
    env = polnet_env(tmp_path, chain)
    jid = chain[SUBMITTER].post_job(job_terms(reward=100 * 10**18 + 1))
    out = run(env, "job", "status", str(jid))
    assert out.returncode == 0, out.stderr
    assert "100000000000000000001" not in out.stdout and "100 POL" in out.stdout
    assert "submitter" in out.stdout and "JobPosted" in out.stdout
    exact = run(env, "job", "status", str(jid), "--exact")
    assert "100.000000000000000001 POL" in exact.stdout
    listed = run(env, "job", "list")
    assert listed.returncode == 0, listed.stderr
    assert "(0 open)" in listed.stdout


def test_dry_run_with_a_keystore_shows_its_balance(chain: LocalChain, tmp_path: Path) -> None:
    """`--dry-run --keystore` left out the balance line the dev accounts get."""
    env = {**polnet_env(tmp_path, chain), "POLNET_KEYSTORE_PASSWORD": "correct horse"}
    ks = tmp_path / "me.json"
    made = run(env, "key", "new", "--out", str(ks))
    assert made.returncode == 0, made.stderr
    addr = json.loads(ks.read_text())["address"].lower()
    data = tmp_path / "digits.safetensors"
    write_dataset(pack_digits(), data)
    out = run(env, "job", "submit", str(REPO / "examples" / "mlp_digits.toml"), "--dataset",
              str(data), "--reward", "5", "--dry-run", "--keystore", str(ks))
    assert out.returncode == 0, out.stderr
    line = next(ln for ln in out.stdout.splitlines() if ln.startswith("your balance"))
    assert "0 POL" in line and addr in line.lower() and "short by" in line


def test_watch_prints_changes_not_the_table_again(chain: LocalChain, tmp_path: Path) -> None:
    env = polnet_env(tmp_path, chain)
    jid = chain[SUBMITTER].post_job(job_terms())
    watch = subprocess.Popen([sys.executable, "-m", "node.cli.main", "job", "status", str(jid),
                              "--watch", "--interval", "0.2"], cwd=REPO, env=env,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert watch.stdout is not None
        for line in watch.stdout:  # the first report is the whole table
            if "events" in line:
                break
        time.sleep(1.0)
        chain[SUBMITTER].market.cancel(jid)
        rest, err = watch.communicate(timeout=60)
    finally:
        watch.kill()
    assert watch.returncode == 0, err
    assert "status: open -> cancelled" in rest and "JobCancelled" in rest
    assert "job " + str(jid) not in rest  # no second table
