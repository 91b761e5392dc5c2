"""A submitter cannot crash a solver: jobs whose spec, dataset or model would
crash, exhaust or hang the daemon are tried in a child process, rejected for
good (persisted across a restart) and the daemon goes on to solve a good job.

Real anvil, a real in-process solver daemon (libp2p host on loopback), real
child processes and real training on the bundled digits."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
import trio
from pydantic import SecretStr
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from devnet.params import TOKEN
from devnet.testing import LocalChain
from node.chain.contracts import JobStatus, JobTerms
from node.chain.events import ChainEvent
from node.config import NodeSettings, load_config
from node.data.probe import probe_job
from node.datasets import META_KEY, pack_digits, pack_text, parse_dataset
from node.errors import JobRejected, SpecError
from node.proof import canonical_json
from node.roles.runtime import Runtime
from node.roles.solver import Solver
from node.spec import parse_spec, parse_spec_json
from node.train.budget import estimate
from node.train.step import TrainContext, initial_state_hash

pytestmark = pytest.mark.timeout(300)

SUBMITTER, SOLVER_ACCT = 1, 2
REPO = Path(__file__).resolve().parent.parent


def sha(b: bytes) -> str:
    import hashlib

    return hashlib.sha256(b).hexdigest()


def repack(raw: bytes, change: Callable[[dict[str, torch.Tensor]], None]) -> bytes:
    """A dataset file in the real format with its tensors changed by ``change``."""
    tensors = dict(st_load(raw))
    hlen = int.from_bytes(raw[:8], "little")
    meta = json.loads(raw[8:8 + hlen])["__metadata__"]
    change(tensors)
    return st_save({k: v.contiguous() for k, v in tensors.items()}, metadata=meta)


def mlp_spec(ds_hash: str, **over: Any) -> dict[str, Any]:
    d: dict[str, Any] = {
        "name": "mlp", "seed": 3, "dataset_hash": ds_hash,
        "model": {"family": "mlp", "input_dim": 64, "hidden": [32], "num_classes": 10},
        "optimizer": {"name": "sgd", "lr": 0.05}, "batch_size": 32, "total_steps": 20,
        "checkpoint_interval": 10, "resources": {"max_memory_mb": 256}}
    d.update(over)
    return d


def lm_spec(ds_hash: str, vocab: int, **model: Any) -> dict[str, Any]:
    m = {"family": "transformer_lm", "vocab_size": vocab, "context": 16, "d_model": 16,
         "n_heads": 2, "n_layers": 1, "d_ff": 32, "dropout": 0.0, **model}
    return {"name": "lm", "seed": 3, "dataset_hash": ds_hash, "model": m,
            "optimizer": {"name": "adamw", "lr": 1e-3}, "batch_size": 8, "total_steps": 20,
            "checkpoint_interval": 10}


def canonical(d: dict[str, Any]) -> bytes:
    return canonical_json(parse_spec(d).model_dump(mode="json"))


def hostile_inputs() -> dict[str, tuple[bytes, bytes]]:
    """name -> (spec bytes, dataset bytes): each killed a solver before."""
    digits, text = pack_digits(), pack_text()
    vocab = len(json.loads(json.loads(text[8:8 + int.from_bytes(text[:8], "little")])
                           ["__metadata__"][META_KEY])["vocab"])

    def labels(v: int) -> Callable[[dict[str, torch.Tensor]], None]:
        return lambda t: t["y"].__setitem__(5, v)

    neg = repack(digits, labels(-1))
    short = repack(digits, lambda t: t.__setitem__("y", t["y"][:-300].clone()))
    big_tok = repack(text, lambda t: t["tokens"].__setitem__(7, vocab + 5))
    huge = mlp_spec(sha(digits))  # 33.8e9 params: 2 x 1e6 x 16384 + one 16384-wide block
    huge["model"] = {"family": "transformer_lm", "vocab_size": 1_000_000, "context": 16,
                     "d_model": 16_384, "n_heads": 16, "n_layers": 1, "d_ff": 8,
                     "dropout": 0.0}
    huge["resources"] = {"max_memory_mb": 10_000_000}
    over_budget = lm_spec(sha(text), vocab, d_model=2048, n_heads=16, n_layers=6, d_ff=8192)
    over_budget["resources"] = {"max_memory_mb": 100_000}
    return {
        "non-utf8 spec": (b"\xff\xfe{\"seed\": 1}", digits),
        "5000-digit integer": (b'{"seed": 1' + b"1" * 5000 + b"}", digits),
        "nested spec": (b"[" * 30_000 + b"]" * 30_000, digits),
        "label -1": (canonical(mlp_spec(sha(neg))), neg),
        "y shorter than x": (canonical(mlp_spec(sha(short))), short),
        "token >= vocab_size": (canonical(lm_spec(sha(big_tok), vocab)), big_tok),
        "33.8B params": (canonical_json(huge), digits),
        "over this solver's budget": (canonical(over_budget), text),
    }


def test_hostile_specs_are_what_the_issue_says() -> None:
    d = mlp_spec("0" * 64)
    d["model"] = {"family": "transformer_lm", "vocab_size": 1_000_000, "context": 16,
                  "d_model": 16_384, "n_heads": 16, "n_layers": 1, "d_ff": 8, "dropout": 0.0}
    from node.spec import TransformerLMConfig

    cfg = TransformerLMConfig.model_construct(**d["model"])  # unvalidated: the old caps
    assert round(cfg.param_count() / 1e9, 1) == 33.8
    with pytest.raises(SpecError) as info:  # the caps now name a field
        parse_spec({**d, "resources": {"max_memory_mb": 10_000_000}})
    assert info.value.field in ("model.vocab_size", "resources.max_memory_mb")
    with pytest.raises(SpecError) as info:
        parse_spec({**d, "model": {**d["model"], "vocab_size": 100}})
    assert info.value.field == "resources.max_memory_mb"


def test_budget_counts_every_part() -> None:
    spec = parse_spec(mlp_spec("0" * 64))
    b = estimate(spec, dataset_bytes=1000)
    p = spec.model.param_count()
    assert b.params == p and b.weights_bytes == b.grads_bytes == 4 * p
    assert b.optimizer_bytes == 4 * p  # sgd momentum
    assert b.dataset_bytes == 10_000 and b.batch_bytes > 0 and b.activation_bytes > 0
    assert b.total_mb >= 512 and "params" in b.summary()


def test_probe_child_hits_its_memory_limit_not_the_caller(tmp_path: Path) -> None:
    """A model the estimate lets through but the address-space limit does not:
    the allocator error ends in the child's verdict."""
    digits = pack_digits()
    d = mlp_spec(sha(digits), model={"family": "mlp", "input_dim": 64,
                                     "hidden": [8192, 8192], "num_classes": 10},
                 resources={"max_memory_mb": 4096})
    spec_b = canonical(d)
    (tmp_path / "s").write_bytes(spec_b)
    (tmp_path / "d").write_bytes(digits)
    out = subprocess.run(
        [sys.executable, "-m", "node.data.probe", str(tmp_path / "s"), str(tmp_path / "d"),
         "--spec-hash", sha(spec_b), "--dataset-hash", sha(digits), "--memory-mb", "100000",
         "--limit-mb", "900", "--max-seconds", "1000"],
        capture_output=True, cwd=REPO, timeout=120, check=False)
    verdict = json.loads(out.stdout.decode().strip().splitlines()[-1])
    assert verdict["ok"] is False, verdict
    assert "alloc" in verdict["reason"].lower() or verdict["error"] == "MemoryError", verdict

    async def good() -> None:
        with pytest.raises(JobRejected, match="budget is 300 MB"):
            await probe_job(tmp_path / "s", tmp_path / "d", sha(spec_b), sha(digits),
                            memory_mb=300, max_seconds=1000)
        small = canonical(mlp_spec(sha(digits)))
        (tmp_path / "g").write_bytes(small)
        r = await probe_job(tmp_path / "g", tmp_path / "d", sha(small), sha(digits),
                            memory_mb=2048, max_seconds=1000)
        assert r.per_step_s > 0 and r.seconds_estimate > 0 and r.peak_rss_mb > 0

    trio.run(good)


def _settings(home: Path, chain: LocalChain) -> NodeSettings:
    dep = chain.deployment.save(home / "deployment.json")
    return load_config(None, home=home, name="solver", deployment=dep,
                       private_key=SecretStr(chain.deployment.accounts[SOLVER_ACCT].private_key),
                       poll_interval=0.2, stake=200 * TOKEN)


def test_solver_rejects_hostile_jobs_for_good_and_still_solves_a_good_one(
        chain: LocalChain, tmp_path: Path) -> None:
    bad = hostile_inputs()
    digits = pack_digits()
    good_spec = canonical(mlp_spec(sha(digits)))
    sub = chain[SUBMITTER]
    settings = _settings(tmp_path, chain)
    good_init = initial_state_hash(TrainContext.create(parse_spec_json(good_spec),
                                                       parse_dataset(digits)))

    def terms(spec_b: bytes, ds_b: bytes, init: bytes) -> JobTerms:
        return JobTerms(spec_hash=bytes.fromhex(sha(spec_b)), dataset_hash=bytes.fromhex(sha(ds_b)),
                        reward=10 * TOKEN, verification_budget=3 * TOKEN, solve_duration=600,
                        total_steps=20, steps_per_segment=10, init_state_hash=init)

    async def main() -> tuple[dict[str, int], int, dict[str, Any]]:
        async with Runtime(settings, "solver") as rt:
            store = rt.p2p.store  # the inputs as if fetched from the submitter
            jobs: dict[str, int] = {}
            for name, (spec_b, ds_b) in bad.items():
                store.put_bytes(spec_b)
                store.put_bytes(ds_b)
                jobs[name] = await rt.chain(sub.post_job, terms(spec_b, ds_b, bytes(range(32))))
            store.put_bytes(good_spec)
            store.put_bytes(digits)
            good = await rt.chain(sub.post_job, terms(good_spec, digits, good_init))
            solver = Solver(rt, memory_mb=2048)
            deadline = time.monotonic() + 240
            async with trio.open_nursery() as nursery:
                nursery.start_soon(solver.run)
                while time.monotonic() < deadline:
                    rec = solver.state.data.jobs.get(good)
                    if rec is not None and rec.phase == "committed":
                        break
                    await trio.sleep(0.5)
                nursery.cancel_scope.cancel()
            status = (await rt.chain(rt.chain_client.market.get_job, good)).status
            # Restarted on the same state: a JobReopened of a rejected job is no candidate.
            again = Solver(rt, memory_mb=2048)
            for jid in jobs.values():
                again._on_event(ChainEvent("JobMarket", "JobReopened", {"jobId": jid}, 0,
                                           "0x", 0, rt.chain_client.market.address))
            # As solver.json has them (string keys), the shape the asserts below read.
            return jobs, good, {"state": solver.state.data.model_dump(mode="json"),
                                "status": status,
                                "again": again.state.data.model_dump(mode="json")}

    jobs, good, out = trio.run(main)
    st = out["state"]
    assert out["status"] == JobStatus.COMMITTED, st
    assert st["jobs"][str(good)]["phase"] == "committed"
    for name, jid in jobs.items():
        assert str(jid) in st["rejected"], (name, st)
        assert st["rejected"][str(jid)], name  # a reason is recorded
        assert str(jid) not in st["jobs"] and jid not in st["candidates"], name
    reasons = {n: st["rejected"][str(j)] for n, j in jobs.items()}
    assert "budget is 2048 MB" in reasons["over this solver's budget"], reasons
    # Whichever check catches them (the dataset loader's or the probe's), they say why.
    assert "token" in reasons["token >= vocab_size"].lower(), reasons
    assert "label" in reasons["label -1"].lower(), reasons

    assert st["considering"] == {}
    assert out["again"]["candidates"] == []
    assert set(out["again"]["rejected"]) >= {str(j) for j in jobs.values()}


def test_a_probe_that_dies_is_a_rejection_with_the_signal() -> None:
    from node.data.probe import _verdict

    out = _verdict(b"", b"Fatal Python error: Segmentation fault\n", -11)
    assert out["ok"] is False and "SIGSEGV" in out["reason"]
    assert "OOM" in _verdict(b"", b"", -9)["reason"]
    assert _verdict(b'noise\n{"ok": true, "params": 1}\n', b"", 0)["ok"] is True
