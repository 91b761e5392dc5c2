"""The README's newcomer path stays true: every `polnet` command in it exists in the real
CLI with the options it uses, and the ones that run by
themselves (devnet up/status/down, dataset pack, train, a dry-run submit, job list) do,
in order, on a fresh POLNET_HOME."""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from devnet.anvil import free_port

REPO = Path(__file__).resolve().parents[1]
README = REPO / "README.md"
PLACEHOLDER = "/ip4/127.0.0.1/tcp/4001/p2p/12D3KooWDpJ7As7BWAwRMfu1VU2WrnqGqf7ys6ULHXmMU8AMNaQ1"
RUNS = ("devnet up", "devnet status", "dataset pack", "train", "job list", "devnet down")


def newcomer_commands() -> list[list[str]]:
    """The `polnet` command lines of the README's "A newcomer's path" block."""
    text = README.read_text()
    section = text.split("## A newcomer's path", 1)[1]
    block = section.split("```bash", 1)[1].split("```", 1)[0]
    lines, cur = [], ""
    for raw in block.splitlines():
        line = raw.split(" #", 1)[0].rstrip() if not raw.lstrip().startswith("#") else ""
        cur = f"{cur} {line.strip()}" if cur else line.strip()
        if cur.endswith("\\"):
            cur = cur[:-1].rstrip()
            continue
        if cur.startswith("polnet "):
            lines.append(cur)
        cur = ""
    return [shlex.split(ln.replace("<v1 multiaddr>", PLACEHOLDER))[1:] for ln in lines]


GROUPS = {"devnet", "dataset", "job", "dispute", "solver", "verifier", "p2p", "artifact",
          "key"}


def _help(path: tuple[str, ...], cache: dict[tuple[str, ...], str]) -> str:
    # A process of its own: the CLI configures logging globally, in-process it would
    # leave later tests logging to a closed capture.
    if path not in cache:
        res = subprocess.run([sys.executable, "-m", "node.cli.main", *path, "--help"],
                             cwd=REPO, env={**os.environ, "COLUMNS": "200"},
                             capture_output=True, text=True, timeout=120)
        assert res.returncode == 0, f"`polnet {' '.join(path)}` is no command: {res.stderr}"
        cache[path] = res.stdout
    return cache[path]


def test_every_readme_command_exists_with_its_options() -> None:
    cmds = newcomer_commands()
    assert len(cmds) >= 15, cmds  # the block was found and read
    cache: dict[tuple[str, ...], str] = {}
    for argv in cmds:
        path = tuple(argv[:2]) if argv[0] in GROUPS else tuple(argv[:1])
        text = _help(path, cache)
        for opt in (a.split("=", 1)[0] for a in argv if a.startswith("--")):
            assert opt in text, f"README: `polnet {' '.join(argv)}`: {' '.join(path)} has no {opt}"


def test_the_readme_path_runs_on_a_fresh_home(tmp_path: Path) -> None:
    env = {**os.environ, "POLNET_HOME": str(tmp_path / "home")}
    port = str(free_port())
    ran: list[str] = []
    try:
        for argv in newcomer_commands():
            what = next((r for r in RUNS if " ".join(argv).startswith(r)), None)
            if what is None and argv[:2] == ["job", "submit"] and "--dry-run" in argv:
                what = "job submit --dry-run"
            if what is None:
                continue
            if what == "devnet up":
                argv = [*argv, "--port", port]  # the README's default port may be taken here
            if what == "train":  # the README's `my_job.toml`: a copy with the packed hash
                _write_job(tmp_path)
            out = subprocess.run([sys.executable, "-m", "node.cli.main", *argv], cwd=tmp_path,
                                 env=env, capture_output=True, text=True, timeout=300)
            assert out.returncode == 0, f"`polnet {' '.join(argv)}`: {out.stderr[-1500:]}"
            ran.append(what)
            if what == "dataset pack":
                assert re.search(r"[0-9a-f]{64}", out.stdout), out.stdout
            if what == "job submit --dry-run":
                assert "you escrow" in out.stdout and "solver bond" in out.stdout, out.stdout
    finally:
        subprocess.run([sys.executable, "-m", "node.cli.main", "devnet", "down"], env=env,
                       capture_output=True, timeout=60)
    assert ran == ["devnet up", "devnet status", "dataset pack", "train",
                   "job submit --dry-run", "job list", "devnet down"], ran


def _write_job(tmp: Path) -> None:
    """What the README asks of a newcomer: copy examples/cnn_digits.toml and put in the
    hash `dataset pack` printed (a short run here, so the test stays quick)."""
    import hashlib

    digest = hashlib.sha256((tmp / "digits.safetensors").read_bytes()).hexdigest()
    spec = (REPO / "examples" / "cnn_digits.toml").read_text()
    spec = re.sub(r'dataset_hash = "[0-9a-f]+"', f'dataset_hash = "{digest}"', spec)
    spec = re.sub(r"total_steps = \d+", "total_steps = 20", spec)
    (tmp / "my_job.toml").write_text(spec)
