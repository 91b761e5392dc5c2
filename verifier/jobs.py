"""Small reference jobs (CNN on digits, char LM on CPython's pydoc topics) for
calibration, tests and benchmarks: datasets that ship with our dependencies,
models small enough for a shared 2-core machine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from node.datasets import Dataset, load_dataset, pack_digits, pack_text, write_dataset
from node.spec import JobSpec, parse_spec
from node.train.step import TrainContext


def dataset_path(kind: str, cache_dir: str | Path) -> Path:
    """The packed ``digits`` or ``text`` dataset file, created in ``cache_dir`` once."""
    path = Path(cache_dir) / f"{kind}.safetensors"
    if not path.exists():
        write_dataset(pack_digits() if kind == "digits" else pack_text(), path)
    return path


def dataset(kind: str, cache_dir: str | Path) -> Dataset:
    return load_dataset(dataset_path(kind, cache_dir))


def cnn_spec(ds: Dataset, k: int = 10, total_steps: int = 40, **over: Any) -> JobSpec:
    d: dict[str, Any] = {
        "name": "cnn-digits", "seed": 7, "dataset_hash": ds.hash_hex,
        "model": {"family": "cnn", "in_channels": 1, "image_size": 8, "channels": [8, 16],
                  "hidden": 64, "num_classes": 10},
        "optimizer": {"name": "adamw", "lr": 1e-3},
        "batch_size": 64, "total_steps": total_steps, "checkpoint_interval": k,
    }
    return parse_spec({**d, **over})


def lm_spec(ds: Dataset, k: int = 10, total_steps: int = 40, **over: Any) -> JobSpec:
    d: dict[str, Any] = {
        "name": "char-lm", "seed": 11, "dataset_hash": ds.hash_hex,
        "model": {"family": "transformer_lm", "vocab_size": max(2, len(ds.vocab)),
                  "context": 32, "d_model": 32, "n_heads": 2, "n_layers": 1, "d_ff": 64,
                  "dropout": 0.0},
        "optimizer": {"name": "adamw", "lr": 1e-3},
        "batch_size": 16, "total_steps": total_steps, "checkpoint_interval": k,
    }
    return parse_spec({**d, **over})


def job(kind: str, cache_dir: str | Path, k: int = 10, total_steps: int = 40,
        **over: Any) -> TrainContext:
    """A ready ``TrainContext`` for the ``cnn`` or ``lm`` reference job."""
    ds = dataset("digits" if kind == "cnn" else "text", cache_dir)
    spec = (cnn_spec if kind == "cnn" else lm_spec)(ds, k, total_steps, **over)
    return TrainContext.create(spec, ds)
