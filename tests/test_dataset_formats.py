"""`polnet dataset pack` for your own data: images per class, CSV, arrays, text; each
malformed input refused with a DatasetError that names the file and the fix."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from node.dataset_formats import (
    pack_arrays,
    pack_csv,
    pack_image_folder,
    pack_text_file,
    spec_hints,
)
from node.datasets import parse_dataset
from node.errors import DatasetError, PolnetError
from node.spec import load_spec, parse_spec
from node.train.step import TrainContext, init_state, train_step

REPO = Path(__file__).resolve().parent.parent


def image_folder(root: Path, shape: tuple[int, ...] = (8, 8), per_class: int = 3) -> Path:
    rng = np.random.default_rng(0)
    for cls in ("cat", "dog", "eel"):
        (root / cls).mkdir(parents=True)
        for i in range(per_class):
            np.save(root / cls / f"{i}.npy", rng.integers(0, 256, shape, dtype=np.uint8))
    return root


def test_image_folder(tmp_path: Path) -> None:
    root = image_folder(tmp_path / "pets")
    raw = pack_image_folder(root)
    ds = parse_dataset(raw)
    assert ds.tensors["x"].shape == (9, 1, 8, 8) and ds.num_classes == 3
    assert ds.meta["classes"] == ["cat", "dog", "eel"]
    assert ds.tensors["y"].tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert float(ds.tensors["x"].max()) <= 1.0  # uint8 pixels scaled to [0, 1]
    assert pack_image_folder(root) == raw  # same files, same bytes, same hash
    assert spec_hints(raw) == {"num_classes": 3, "mlp.input_dim": 64, "cnn.in_channels": 1,
                               "cnn.image_size": 8}


@pytest.mark.parametrize("breakage, fix", [
    ("one_class", "sub-folder of its own"),
    ("no_npy", "convert images to .npy"),
    ("mixed_shapes", "resize every image"),
    ("not_an_array", "numpy.save"),
    ("rank", "channels first"),
    ("nan", "drop or impute"),
])
def test_image_folder_malformed(tmp_path: Path, breakage: str, fix: str) -> None:
    root = image_folder(tmp_path / "pets")
    cat = root / "cat"
    if breakage == "one_class":
        for d in ("dog", "eel"):
            for f in (root / d).iterdir():
                f.unlink()
            (root / d).rmdir()
    elif breakage == "no_npy":
        for f in cat.iterdir():
            f.unlink()
        (cat / "a.png").write_bytes(b"\x89PNG")
    elif breakage == "mixed_shapes":
        np.save(cat / "9.npy", np.zeros((4, 4), dtype=np.uint8))
    elif breakage == "not_an_array":
        (cat / "0.npy").write_bytes(b"not numpy")
    elif breakage == "rank":
        np.save(cat / "0.npy", np.zeros((1, 1, 8, 8), dtype=np.float32))
    elif breakage == "nan":
        np.save(cat / "0.npy", np.full((8, 8), np.nan, dtype=np.float32))
    with pytest.raises(DatasetError, match=fix) as err:
        pack_image_folder(root)
    assert str(root) in str(err.value)
    assert isinstance(err.value, PolnetError) and isinstance(err.value, ValueError)


def test_csv_trains_an_mlp(tmp_path: Path) -> None:
    csv = tmp_path / "iris.csv"
    rows = ["sepal,petal,width,kind"] + [f"{i % 5}.5,{i % 3},{i / 10},{'ab'[i % 2]}"
                                          for i in range(40)]
    csv.write_text("\n".join(rows) + "\n")
    raw = pack_csv(csv, label="kind")
    ds = parse_dataset(raw)
    assert ds.tensors["x"].shape == (40, 1, 1, 3) and ds.meta["classes"] == ["a", "b"]
    assert spec_hints(raw)["mlp.input_dim"] == 3
    # The spec the hints describe trains on it.
    d = load_spec(REPO / "examples" / "mlp_digits.toml").model_dump(mode="json")
    spec = parse_spec({**d, "dataset_hash": hashlib.sha256(raw).hexdigest(), "total_steps": 2,
                       "checkpoint_interval": 1, "batch_size": 8,
                       "schedule": {**d["schedule"], "warmup_steps": 0},
                       "model": {**d["model"], "input_dim": 3, "num_classes": 2}})
    ctx = TrainContext.create(spec, ds)
    loss = train_step(ctx, init_state(ctx), 1)
    assert torch.isfinite(torch.as_tensor(loss)).all()
    ints = tmp_path / "ints.csv"
    ints.write_text("a,label\n1,0\n2,3\n")
    assert parse_dataset(pack_csv(ints)).num_classes == 4  # integer labels are indices


@pytest.mark.parametrize("text, label, fix", [
    ("a,b\n1,2\n", "label", "--label COLUMN"),
    ("a,label\n1,0\n2\n", "label", "header has 2"),
    ("a,label\nx,0\n2,1\n", "label", "encode categories as numbers"),
    ("a,label\nnan,0\n2,1\n", "label", "impute"),
    ("a,label\n", "label", "at least one sample"),
    ("a,label\n1,0\n2,0\n", "label", "at least 2"),
    ("a,label\n1,-1\n2,0\n", "label", "class indices"),
])
def test_csv_malformed(tmp_path: Path, text: str, label: str, fix: str) -> None:
    p = tmp_path / "d.csv"
    p.write_text(text)
    with pytest.raises(DatasetError, match=fix) as err:
        pack_csv(p, label)
    assert str(p) in str(err.value)


def test_arrays_npz_and_npy(tmp_path: Path) -> None:
    x = np.random.default_rng(1).normal(size=(12, 5)).astype(np.float32)
    y = np.arange(12) % 3
    np.savez(tmp_path / "d.npz", x=x, y=y)
    ds = parse_dataset(pack_arrays(tmp_path / "d.npz"))
    assert ds.tensors["x"].shape == (12, 1, 1, 5) and ds.num_classes == 3
    assert torch.equal(ds.tensors["x"].view(12, 5), torch.from_numpy(x))
    np.save(tmp_path / "x.npy", np.zeros((12, 2, 4, 4), dtype=np.float64))
    np.save(tmp_path / "y.npy", y)
    ds = parse_dataset(pack_arrays(tmp_path / "x.npy", tmp_path / "y.npy"))
    assert ds.tensors["x"].shape == (12, 2, 4, 4)


@pytest.mark.parametrize("case, fix", [
    ("npz_keys", "needs arrays 'x'"),
    ("npy_no_labels", "--labels"),
    ("count", "one label per sample"),
    ("float_labels", "integer array"),
    ("pickle", "readable"),
    ("suffix", "expected a .npz"),
])
def test_arrays_malformed(tmp_path: Path, case: str, fix: str) -> None:
    x, y = np.zeros((4, 3), dtype=np.float32), np.array([0, 1, 0, 1])
    labels = None
    if case == "npz_keys":
        np.savez(tmp_path / "d.npz", features=x, labels=y)
        src = tmp_path / "d.npz"
    elif case == "npy_no_labels":
        np.save(src := tmp_path / "x.npy", x)
    elif case in ("count", "float_labels"):
        np.save(src := tmp_path / "x.npy", x)
        np.save(labels := tmp_path / "y.npy",
                y[:3] if case == "count" else y.astype(np.float32))
    elif case == "pickle":  # object arrays would need pickle, which is never loaded
        np.save(src := tmp_path / "x.npy", np.array([{"a": 1}] * 4, dtype=object))
        np.save(labels := tmp_path / "y.npy", y)
    else:
        (src := tmp_path / "d.txt").write_text("1 2 3")
    with pytest.raises(DatasetError, match=fix):
        pack_arrays(src, labels)


def test_text_file(tmp_path: Path) -> None:
    p = tmp_path / "poem.txt"
    p.write_text("to be or not to be\n", encoding="utf-8")
    ds = parse_dataset(pack_text_file(p))
    assert ds.kind == "text" and "".join(ds.vocab[i] for i in ds.tensors["tokens"][:5]) == "to be"
    assert spec_hints(pack_text_file(p))["vocab_size"] == len(set("to be or not to be\n"))
    (tmp_path / "latin1.txt").write_bytes("caf\xe9".encode("latin-1"))
    with pytest.raises(DatasetError, match="re-encode"):
        pack_text_file(tmp_path / "latin1.txt")
    (tmp_path / "one.txt").write_text("x")
    with pytest.raises(DatasetError, match="at least 2"):
        pack_text_file(tmp_path / "one.txt")
    with pytest.raises(DatasetError, match="cannot be read"):
        pack_text_file(tmp_path / "missing.txt")


def test_cli_packs_a_csv_and_names_a_missing_source(tmp_path: Path) -> None:
    p = tmp_path / "d.csv"
    p.write_text("f1,f2,y\n0.1,0.2,0\n0.3,0.4,1\n")
    out = tmp_path / "d.safetensors"
    env = {**os.environ, "POLNET_HOME": str(tmp_path)}

    def polnet(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "node.cli.main", "dataset", "pack", *args],
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=120)

    ok = polnet("csv", str(out), "--source", str(p), "--label", "y")
    assert ok.returncode == 0, ok.stderr
    assert hashlib.sha256(out.read_bytes()).hexdigest() in ok.stdout
    assert "mlp.input_dim = 2" in ok.stdout and "num_classes = 2" in ok.stdout
    bad = polnet("images", str(out))
    assert bad.returncode == 1 and "--source" in bad.stderr and "Traceback" not in bad.stderr
    bad = polnet("csv", str(out), "--source", str(p))
    assert bad.returncode == 1 and "--label COLUMN" in bad.stderr
