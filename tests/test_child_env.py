"""Issue 37, item 4: the child that handles a stranger's spec and dataset gets no key,
no password and no inherited descriptor. The real probe child, read through /proc
while it runs."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import pytest
import trio

from devnet.testing import tiny_mlp_spec
from node.childenv import child_env
from node.data.probe import ProbeResult, probe_job
from node.datasets import pack_digits

SECRETS = {"POLNET_PRIVATE_KEY": "0x" + "ab" * 32, "POLNET_KEYSTORE_PASSWORD": "hunter2",
           "AWS_SECRET_ACCESS_KEY": "s3cr3t", "GITHUB_TOKEN": "ghp_x"}


def _children_running(module: bytes) -> list[int]:
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            if ppid == os.getpid() and module in (d / "cmdline").read_bytes():
                out.append(int(d.name))
        except (OSError, ValueError, IndexError):
            continue
    return out


def _seen(pid: int) -> tuple[dict[str, str], set[str]]:
    raw = Path(f"/proc/{pid}/environ").read_bytes()
    env = dict(kv.decode(errors="replace").split("=", 1) for kv in raw.split(b"\0") if b"=" in kv)
    fds = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            fds.add(os.readlink(fd))
        except OSError:
            continue
    return env, fds


def test_probe_child_gets_no_keys_and_no_descriptors(tmp_path: Path,
                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    """Before: ``probe_job`` passed all of ``os.environ`` to the child that parses and
    runs a submitter's spec and dataset, POLNET_PRIVATE_KEY and POLNET_KEYSTORE_PASSWORD
    included. Now the running child's environment holds none of them (nor any other
    secret-named variable), no descriptor the parent opened reaches it, and the honest
    job still probes fine."""
    for k, v in SECRETS.items():
        monkeypatch.setenv(k, v)
    keyfile = tmp_path / "keystore.json"
    keyfile.write_text("{}")
    fd = os.open(keyfile, os.O_RDONLY)
    os.set_inheritable(fd, True)  # as a careless parent might leave one
    data = pack_digits()
    ds_hash = hashlib.sha256(data).hexdigest()
    spec_b = tiny_mlp_spec(ds_hash, 4, 2)
    (tmp_path / "spec.json").write_bytes(spec_b)
    (tmp_path / "data.bin").write_bytes(data)
    seen: list[tuple[dict[str, str], set[str]]] = []
    result: list[ProbeResult] = []

    async def main() -> None:
        async def probe() -> None:
            result.append(await probe_job(
                tmp_path / "spec.json", tmp_path / "data.bin", hashlib.sha256(spec_b).hexdigest(),
                ds_hash, memory_mb=1024, max_seconds=600, threads=1))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(probe)
            while not result:
                for pid in _children_running(b"node.data.probe"):
                    try:
                        seen.append(_seen(pid))
                    except OSError:  # it ended between the two reads
                        continue
                if seen:
                    break
                await trio.sleep(0.02)

    try:
        trio.run(main)
    finally:
        os.close(fd)
    assert seen, "the probe child was never seen running"
    assert result and result[0].per_step_s > 0  # the honest path is served
    for env, fds in seen:
        assert not set(SECRETS) & set(env), sorted(env)
        assert not any(k.startswith("POLNET_") for k in env), sorted(env)
        assert not any(v in env.values() for v in SECRETS.values())
        assert env.get("OMP_NUM_THREADS") == "1" and "PYTHONPATH" in env
        assert str(keyfile) not in fds, fds


def test_child_env_refuses_to_pass_a_secret(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("POLNET_PRIVATE_KEY", "0x01")
    monkeypatch.setenv("MKL_CBWR", "COMPATIBLE")
    env = child_env({"ATEN_CPU_CAPABILITY": "default"})
    assert "POLNET_PRIVATE_KEY" not in env
    assert env["MKL_CBWR"] == "COMPATIBLE" and env["ATEN_CPU_CAPABILITY"] == "default"
    with pytest.raises(ValueError, match="secret"):
        child_env({"POLNET_KEYSTORE_PASSWORD": "x"})
