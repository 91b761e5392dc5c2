"""Hugging Face model families (issue 32): real transformers models built from a
spec's configuration, trained on the bundled char corpus, traced and replayed by
the verifier's own code; cheats flagged; the spec's bounds, version and init weights."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from node.behaviors import make_behavior
from node.datasets import Dataset
from node.errors import CheckpointError, IntegrityError, SpecError
from node.spec import JobSpec, parse_collaborative_spec, parse_spec
from node.spec_hf import HFGPT2Config, HFLlamaConfig, installed_transformers_version
from node.train.init_weights import from_hf_dir, load_init_weights, write_init_weights
from node.train.models import build_model, save_model
from node.train.step import (
    TrainContext,
    init_state,
    initial_state_hash,
    state_tensors,
    train_step,
)
from node.train.trace import run_training
from verifier.jobs import dataset
from verifier.replay import verify_trace_segment

VERSION = installed_transformers_version()


@pytest.fixture(scope="module")
def text(tmp_path_factory: pytest.TempPathFactory) -> Dataset:
    return dataset("text", tmp_path_factory.mktemp("datasets"))


def llama(v: int, **over: Any) -> dict[str, Any]:
    return {"family": "hf_llama", "transformers_version": VERSION, "vocab_size": v,
            "context": 16, "hidden_size": 32, "intermediate_size": 64,
            "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2,
            **over}


def gpt2(v: int, **over: Any) -> dict[str, Any]:
    return {"family": "hf_gpt2", "transformers_version": VERSION, "vocab_size": v,
            "context": 16, "n_embd": 32, "n_layer": 2, "n_head": 4, "resid_pdrop": 0.1,
            "embd_pdrop": 0.1, **over}


def albert(v: int, **over: Any) -> dict[str, Any]:
    # The mask token sits past the corpus's characters.
    return {"family": "hf_albert", "transformers_version": VERSION, "vocab_size": v + 1,
            "context": 16, "embedding_size": 16, "hidden_size": 32, "num_hidden_layers": 2,
            "num_attention_heads": 4, "intermediate_size": 64, "hidden_dropout_prob": 0.1,
            "mask_token_id": v, **over}


def spec_of(ds: Dataset, model: dict[str, Any], **over: Any) -> JobSpec:
    d: dict[str, Any] = {"name": "hf", "seed": 5, "dataset_hash": ds.hash_hex, "model": model,
                         "optimizer": {"name": "adamw", "lr": 3e-3}, "batch_size": 8,
                         "total_steps": 6, "checkpoint_interval": 3}
    return parse_spec({**d, **over})


# The existing suite's cheats: skipped steps (skip, fewer_steps), a subset of the data
# (half_batch), stale gradients (stale: an old state claimed as new), an lr change.
CHEATS = ("skip", "fewer_steps", "half_batch", "stale", "low_lr")


@pytest.mark.parametrize(("family", "cheats"), [
    (llama, CHEATS), (gpt2, CHEATS), (albert, CHEATS),
], ids=["llama", "gpt2", "albert"])
def test_trains_traces_replays_and_flags_a_cheat(text: Dataset, tmp_path: Path,
                                                 family: Any, cheats: tuple[str, ...]) -> None:
    ctx = TrainContext.create(spec_of(text, family(len(text.vocab))), text)
    rng_before = torch.random.get_rng_state()
    run_training(ctx, tmp_path / "honest", job_id=1)
    # Init, dropout and masking drew from the job's generators only.
    assert torch.equal(rng_before, torch.random.get_rng_state())
    for segment in (0, 1):
        v = verify_trace_segment(ctx, tmp_path / "honest", segment)
        assert v.passed, v.reason
    for cheat in cheats:
        run_training(ctx, tmp_path / cheat, job_id=1, behavior=make_behavior(cheat))
        v = verify_trace_segment(ctx, tmp_path / cheat, 1)
        assert not v.passed, cheat


DETERMINISM = """
import json, sys
from pathlib import Path
from node.spec import parse_spec_json
from node.train.step import TrainContext, initial_state_hash
from node.train.trace import run_training
from verifier.jobs import dataset
spec = parse_spec_json(Path(sys.argv[1]).read_bytes())
tmp = Path(sys.argv[2])
ctx = TrainContext.create(spec, dataset("text", tmp / "data"), threads=int(sys.argv[3]))
m = run_training(ctx, tmp / "trace", job_id=1)
print(json.dumps({"s0": initial_state_hash(ctx).hex(), "root": m.root}))
"""


@pytest.mark.parallel  # waits on two child processes
@pytest.mark.parametrize("family", [llama, gpt2, albert], ids=["llama", "gpt2", "albert"])
def test_same_s0_and_trace_root_in_two_processes_with_other_thread_counts(
        text: Dataset, tmp_path: Path, family: Any) -> None:
    """Two fresh processes, 1 and 2 threads: the same S_0 hash and the same trace root
    (dropout and MLM masking on)."""
    import json
    import os
    import subprocess
    import sys

    spec = spec_of(text, family(len(text.vocab)))
    (tmp_path / "spec.json").write_bytes(spec.canonical_json())
    root = Path(__file__).resolve().parents[1]
    runs = []
    for threads in (1, 2):
        out = subprocess.run([sys.executable, "-c", DETERMINISM, str(tmp_path / "spec.json"),
                              str(tmp_path / f"t{threads}"), str(threads)],
                             capture_output=True, text=True, timeout=600, cwd=root,
                             env={**os.environ, "PYTHONPATH": str(root)})
        assert out.returncode == 0, out.stderr[-2000:]
        runs.append(json.loads(out.stdout.strip().splitlines()[-1]))
    assert runs[0] == runs[1]
    assert initial_state_hash(TrainContext.create(spec, text)).hex() == runs[0]["s0"]


def test_gpt2_dropout_from_the_step_generator(text: Dataset) -> None:
    """Two runs agree bit for bit (dropout is on), a micro-batched run agrees to rounding
    (the unsplit step's masks), and the S_0 hash does not depend on the thread count."""
    spec = spec_of(text, gpt2(len(text.vocab)), total_steps=3)
    losses = []
    for threads, micro in ((1, 1), (1, 1), (2, 2)):
        ctx = TrainContext.create(spec, text, threads=threads, micro_batches=micro)
        state = init_state(ctx)
        losses.append([train_step(ctx, state, t) for t in (1, 2, 3)])
    assert losses[0] == losses[1]
    assert losses[2] == pytest.approx(losses[0], rel=1e-5)
    hashes = {initial_state_hash(TrainContext.create(spec, text, threads=t)) for t in (1, 2)}
    assert len(hashes) == 1


def test_albert_micro_batches_see_the_whole_batch_masks(text: Dataset) -> None:
    spec = spec_of(text, albert(len(text.vocab), hidden_dropout_prob=0.0), total_steps=3)
    runs = []
    for micro in (1, 4):
        ctx = TrainContext.create(spec, text, micro_batches=micro)
        state = init_state(ctx)
        runs.append([train_step(ctx, state, t) for t in (1, 2)])
    assert runs[1] == pytest.approx(runs[0], rel=1e-5)


def test_another_transformers_version_is_refused(text: Dataset) -> None:
    spec = spec_of(text, llama(len(text.vocab), transformers_version="4.0.0"))
    ctx = TrainContext.create(spec, text)  # a node may read the spec; it will not build it
    with pytest.raises(SpecError) as exc:
        init_state(ctx)
    assert exc.value.field == "model.transformers_version"
    assert "4.0.0" in str(exc.value) and VERSION in str(exc.value)


@pytest.mark.parametrize(("over", "field"), [
    ({"hidden_size": 1 << 20}, "model.hidden_size"),
    ({"num_hidden_layers": 10_000}, "model.num_hidden_layers"),
    ({"num_key_value_heads": 3}, "model.num_key_value_heads"),
    ({"max_position_embeddings": 8}, "model.max_position_embeddings"),
    ({"attention_dropout": 0.1}, "model.attention_dropout"),  # not a spec field at all
    ({"attn_implementation": "sdpa"}, "model.attn_implementation"),
    ({"transformers_version": "latest"}, "model.transformers_version"),
])
def test_bounds_refuse(text: Dataset, over: dict[str, Any], field: str) -> None:
    with pytest.raises(SpecError) as exc:
        spec_of(text, llama(len(text.vocab), **over))
    assert exc.value.field == field


def test_budget_applies_and_mask_token_fits(text: Dataset) -> None:
    big = llama(32_000, hidden_size=4096, intermediate_size=11_008, num_hidden_layers=32,
                num_attention_heads=32, num_key_value_heads=32, context=2048)
    with pytest.raises(SpecError) as exc:
        spec_of(text, big)
    assert exc.value.field == "resources.max_memory_mb"
    assert HFLlamaConfig.model_validate(big).param_count() == 6_738_415_616  # Llama-2-7B
    with pytest.raises(SpecError) as exc:
        spec_of(text, albert(len(text.vocab), mask_token_id=len(text.vocab) + 1))
    assert exc.value.field == "model.mask_token_id"


def test_init_weights_fix_leaf_zero(text: Dataset, tmp_path: Path) -> None:
    base = spec_of(text, llama(len(text.vocab)))
    assert "init_weights" not in base.canonical_json().decode()  # old hashes unchanged
    donor = build_model(base.model, 99).state_dict()
    digest = write_init_weights(donor, tmp_path / "init.safetensors")
    spec = spec_of(text, llama(len(text.vocab)), init_weights=digest)
    theta = load_init_weights(spec, tmp_path / "init.safetensors")
    with pytest.raises(SpecError):
        TrainContext.create(spec, text)  # the file is required
    ctx = TrainContext.create(spec, text, init_weights=theta)
    s0 = state_tensors(init_state(ctx))
    assert all(torch.equal(s0[f"model.{n}"], t) for n, t in donor.items())
    run_training(ctx, tmp_path / "trace", job_id=3)
    assert verify_trace_segment(ctx, tmp_path / "trace", 0).passed
    # A trace that started from the seeded weights instead is refused at leaf 0.
    seeded = TrainContext.create(base, text)
    run_training(seeded, tmp_path / "seeded", job_id=3)
    v = verify_trace_segment(ctx, tmp_path / "seeded", 0)
    assert not v.passed, v.reason
    # A file that is not the one named is refused whole.
    other = write_init_weights(build_model(base.model, 1).state_dict(), tmp_path / "o.st")
    assert other != digest
    with pytest.raises(IntegrityError):
        load_init_weights(spec, tmp_path / "o.st")
    with pytest.raises(SpecError):  # a collaborative job names theta_0 at its own level
        parse_collaborative_spec({"kind": "collaborative", "inner": spec.model_dump(),
                                  "workers": {"min": 1, "max": 1}, "inner_steps": 6,
                                  "outer_rounds": 1})


def test_fine_tune_from_a_save_pretrained_dir(text: Dataset, tmp_path: Path) -> None:
    import transformers

    spec = spec_of(text, gpt2(len(text.vocab)))
    conf = transformers.GPT2Config(vocab_size=len(text.vocab), n_embd=32, n_layer=2, n_head=4,
                                   n_positions=16)
    pretrained = transformers.GPT2LMHeadModel(conf)
    pretrained.save_pretrained(tmp_path / "gpt2")
    digest = from_hf_dir(tmp_path / "gpt2", spec.model, tmp_path / "init.safetensors")
    theta = load_init_weights(spec.model_copy(update={"init_weights": digest}),
                              tmp_path / "init.safetensors")
    assert torch.equal(theta["hf.lm_head.weight"], pretrained.lm_head.weight.detach())
    src = pretrained.state_dict()
    assert torch.equal(theta["hf.transformer.h.1.mlp.c_fc.weight"],
                       src["transformer.h.1.mlp.c_fc.weight"])
    wrong = spec_of(text, gpt2(len(text.vocab), n_embd=64))
    with pytest.raises(CheckpointError):
        from_hf_dir(tmp_path / "gpt2", wrong.model, tmp_path / "bad.safetensors")


def test_hf_export_loads_with_from_pretrained_and_generates(text: Dataset,
                                                            tmp_path: Path) -> None:
    import transformers

    from node.train.hf_export import export_hf
    from node.train.models import load_model

    spec = spec_of(text, llama(len(text.vocab)), total_steps=3)
    ctx = TrainContext.create(spec, text)
    state = init_state(ctx)
    for t in (1, 2, 3):
        train_step(ctx, state, t)
    path = save_model(tmp_path / "model.safetensors", state_tensors(state), spec)
    out = export_hf(path, tmp_path / "hf", vocab=text.vocab)
    # Eager attention, as trained: the final state's logits bit for bit (the default,
    # SDPA, rounds differently).
    model = transformers.AutoModelForCausalLM.from_pretrained(
        out, attn_implementation="eager").eval()
    tok = transformers.AutoTokenizer.from_pretrained(out)
    ids = tok("def f(x):", return_tensors="pt").input_ids
    assert tok.decode(ids[0]) == "def f(x):"
    with torch.no_grad():
        want = load_model(path)(ids)
        assert torch.equal(model(ids).logits, want)
        sdpa = transformers.AutoModelForCausalLM.from_pretrained(out).eval()
        assert torch.allclose(sdpa(ids).logits, want, atol=1e-5)
        gen = model.generate(ids, max_new_tokens=5, do_sample=False)
    assert gen.shape == (1, ids.shape[1] + 5)
    # The masked-LM family loads with its auto class too.
    mspec = spec_of(text, albert(len(text.vocab)), total_steps=3)
    mstate = init_state(TrainContext.create(mspec, text))
    mpath = save_model(tmp_path / "m.safetensors", state_tensors(mstate), mspec)
    mout = export_hf(mpath, tmp_path / "hf-mlm", vocab=text.vocab)
    mlm = transformers.AutoModelForMaskedLM.from_pretrained(
        mout, attn_implementation="eager").eval()
    with torch.no_grad():
        assert torch.equal(mlm(ids).logits, load_model(mpath)(ids))
    assert transformers.AutoTokenizer.from_pretrained(mout).mask_token == "[MASK]"


EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.mark.parametrize("name", ["llama_text", "albert_mlm_text", "gpt2_finetune"])
def test_examples_train_a_step(text: Dataset, tmp_path: Path, name: str) -> None:
    """The examples' specs, on this machine's corpus (the examples' dataset hash
    depends on the CPython version); the fine-tune walks its comment's path."""
    import transformers

    from node.spec import load_spec

    d = load_spec(EXAMPLES / f"{name}.toml").model_dump(mode="json")
    assert d["model"]["transformers_version"] == VERSION  # pinned with requirements.lock
    d.update(dataset_hash=text.hash_hex, total_steps=2, checkpoint_interval=1, batch_size=2,
             schedule={"kind": "constant"})
    theta = None
    if "init_weights" in d:
        m = d["model"]
        conf = transformers.GPT2Config(vocab_size=m["vocab_size"], n_embd=m["n_embd"],
                                       n_layer=m["n_layer"], n_head=m["n_head"],
                                       n_positions=m["n_positions"])
        transformers.GPT2LMHeadModel(conf).save_pretrained(tmp_path / "my-gpt2")
        d["init_weights"] = from_hf_dir(tmp_path / "my-gpt2", parse_spec(d).model,
                                        tmp_path / "init.safetensors")
        theta = load_init_weights(parse_spec(d), tmp_path / "init.safetensors")
    spec = parse_spec(d)
    ctx = TrainContext.create(spec, text, init_weights=theta)
    state = init_state(ctx)
    assert 0.0 < train_step(ctx, state, 1) < 10.0


@pytest.mark.parallel  # mostly waits on a `polnet` subprocess (imports torch, transformers)
def test_submit_checks_and_cli_from_hf(text: Dataset, tmp_path: Path) -> None:
    """`polnet job init-weights --from-hf` prints the hash a fine-tuning spec names; the
    submitter refuses a request without that file or with another one, and posts S_0's
    hash from the file (leaf 0)."""
    import subprocess
    import sys

    import transformers

    from node.datasets import dataset_hash, pack_text, write_dataset
    from node.errors import ConfigError
    from node.roles.submitter import JobRequest, check_request, initial_hash

    spec_file = EXAMPLES / "gpt2_finetune.toml"
    m = parse_spec({**load_example("gpt2_finetune"), "dataset_hash": text.hash_hex}).model
    assert isinstance(m, HFGPT2Config)
    conf = transformers.GPT2Config(vocab_size=m.vocab_size, n_embd=m.n_embd, n_layer=m.n_layer,
                                   n_head=m.n_head, n_positions=m.positions)
    transformers.GPT2LMHeadModel(conf).save_pretrained(tmp_path / "my-gpt2")
    out = subprocess.run([sys.executable, "-m", "node.cli.main", "job", "init-weights",
                          "--from-hf", str(tmp_path / "my-gpt2"), "--spec", str(spec_file),
                          "--out", str(tmp_path / "init.safetensors")],
                         capture_output=True, text=True, timeout=300,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.returncode == 0, out.stderr
    digest = out.stdout.strip().splitlines()[-1].split('"')[1]
    assert len(digest) == 64

    data = tmp_path / "text.safetensors"
    write_dataset(pack_text(), data)
    assert dataset_hash(data) == text.hash_hex
    d = {**load_example("gpt2_finetune"), "dataset_hash": text.hash_hex,
         "init_weights": digest}
    (tmp_path / "ft.json").write_bytes(parse_spec(d).canonical_json())
    req = JobRequest(tmp_path / "ft.json", data, 10, 10, 600,
                     init_weights_path=tmp_path / "init.safetensors")
    spec = check_request(req)
    with pytest.raises(ConfigError, match="--init-weights"):
        check_request(JobRequest(tmp_path / "ft.json", data, 10, 10, 600))
    other = tmp_path / "other.safetensors"
    write_init_weights(build_model(spec.model, 4).state_dict(), other)
    with pytest.raises(SpecError) as exc:
        check_request(JobRequest(tmp_path / "ft.json", data, 10, 10, 600,
                                 init_weights_path=other))
    assert exc.value.field == "init_weights"
    theta = load_init_weights(spec, tmp_path / "init.safetensors")
    assert initial_hash(spec, data, tmp_path / "init.safetensors") == initial_state_hash(
        TrainContext.create(spec, text, init_weights=theta))


def load_example(name: str) -> dict[str, Any]:
    from node.spec import load_spec

    return load_spec(EXAMPLES / f"{name}.toml").model_dump(mode="json")



@pytest.mark.parallel  # waits on the probe's child processes
def test_solver_probe_runs_an_hf_job_and_refuses_another_version(tmp_path: Path) -> None:
    """The solver's child-process probe (address-space limit, timeout) takes an HF job
    with transformers imported, and turns another version into a clear rejection."""
    import hashlib

    import trio

    from node.data.probe import probe_job
    from node.datasets import pack_text
    from node.errors import JobRejected

    data = pack_text()
    ds_hash = hashlib.sha256(data).hexdigest()
    (tmp_path / "data.bin").write_bytes(data)

    def probe(version: str) -> Any:
        spec = parse_spec({"seed": 1, "dataset_hash": ds_hash, "batch_size": 4,
                           "model": llama(128, transformers_version=version),
                           "optimizer": {"name": "adamw", "lr": 1e-3},
                           "total_steps": 4, "checkpoint_interval": 2})
        (tmp_path / "spec.json").write_bytes(spec.canonical_json())
        return trio.run(lambda: probe_job(tmp_path / "spec.json", tmp_path / "data.bin",
                                          spec.spec_hash_hex(), ds_hash, memory_mb=1024,
                                          max_seconds=600, timeout_s=300))

    assert probe(VERSION).params == 26_784
    with pytest.raises(JobRejected, match="transformers_version"):
        probe("4.0.0")
