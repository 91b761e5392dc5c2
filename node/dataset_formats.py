"""Your own data as a polnet dataset: a folder of images per class, a CSV, arrays, text.

Each reader turns a common format into the one layout training reads
(node.datasets: vision ``x`` float32 ``[N, C, H, W]`` + ``y`` int64, or text
``tokens``) and raises :class:`node.errors.DatasetError` naming the file and
the fix. Packing is deterministic (files and class names in sorted order), so
the same data always gives the same dataset hash. See docs/datasets.md.

Public API::

    pack_image_folder(root) -> bytes        # root/<class>/*.npy, one class per folder
    pack_csv(path, label="label") -> bytes  # numeric features + a label column
    pack_arrays(path, labels=None) -> bytes # .npz with x and y, or .npy + a labels .npy
    pack_text_file(path) -> bytes           # UTF-8 text for the char-level LM
    spec_hints(raw) -> dict                 # the model fields a spec needs for this data
"""

from __future__ import annotations

import csv
import math
from pathlib import Path
from typing import Any

import numpy as np
import torch

from node.datasets import pack_chars, pack_vision, parse_dataset
from node.errors import DatasetError

#: Pillow is not a dependency, so images are NumPy arrays: ``[H, W]`` or ``[C, H, W]``.
IMAGE_SUFFIXES = (".npy",)
MAX_CLASSES = 100_000  # node.spec.MLPConfig.num_classes


def _load_npy(path: Path) -> np.ndarray:
    try:  # allow_pickle=False: a .npy from someone else must not run code
        arr = np.load(path, allow_pickle=False)
    except (ValueError, OSError, EOFError) as exc:
        raise DatasetError(f"{path}: not a readable .npy array ({exc}); save it with "
                           "numpy.save(path, array) from a numeric array") from None
    if not isinstance(arr, np.ndarray):
        raise DatasetError(f"{path}: holds several arrays; use a .npz with --source or "
                           "one array per .npy file")
    return arr


def _as_float(arr: np.ndarray, what: str) -> torch.Tensor:
    """uint8 pixels scaled to [0, 1]; other numbers kept; NaN/inf refused."""
    if arr.dtype.kind not in "uif":
        raise DatasetError(f"{what}: dtype {arr.dtype} is not numeric; convert it to "
                           "float32 (or uint8 pixels)")
    t = torch.from_numpy(np.ascontiguousarray(arr)).to(torch.float32)
    if arr.dtype == np.uint8:
        t = t / 255.0
    if not bool(torch.isfinite(t).all()):
        raise DatasetError(f"{what}: holds NaN or infinite values; drop or impute them")
    return t


def _labels(values: list[str], what: str) -> tuple[torch.Tensor, list[str] | None]:
    """Integer labels are used as they are; any other labels become classes in sorted
    order (their names kept in the metadata)."""
    try:
        ints = [int(v) for v in values]
    except ValueError:
        names = sorted(set(values))
        if len(names) > MAX_CLASSES:
            raise DatasetError(f"{what}: {len(names)} distinct labels; at most "
                               f"{MAX_CLASSES} classes") from None
        index = {n: i for i, n in enumerate(names)}
        return torch.tensor([index[v] for v in values], dtype=torch.int64), names
    if min(ints) < 0 or max(ints) >= MAX_CLASSES:
        raise DatasetError(f"{what}: integer labels span {min(ints)}..{max(ints)}; they must "
                           f"be class indices 0..{MAX_CLASSES - 1} (or use class names)")
    return torch.tensor(ints, dtype=torch.int64), None


def _vision(x: torch.Tensor, y: torch.Tensor, name: str, classes: list[str] | None,
            what: str) -> bytes:
    n_classes = len(classes) if classes is not None else int(y.max()) + 1
    if n_classes < 2:
        raise DatasetError(f"{what}: only one class; a classifier needs at least 2")
    raw = pack_vision(x, y, name, num_classes=n_classes, classes=classes)
    parse_dataset(raw, origin=what)  # the checks every loader applies, now rather than later
    return raw


# --- a folder of images per class ---------------------------------------------------


def pack_image_folder(root: str | Path) -> bytes:
    """``root/<class name>/<image>.npy``: classes are the sub-folders in sorted order,
    each image ``[H, W]`` (one channel) or ``[C, H, W]``, all of one shape."""
    top = Path(root)
    if not top.is_dir():
        raise DatasetError(f"{top}: not a folder; images pack from ROOT/<class>/<image>.npy")
    class_dirs = sorted(p for p in top.iterdir() if p.is_dir() and not p.name.startswith("."))
    if len(class_dirs) < 2:
        raise DatasetError(f"{top}: found {len(class_dirs)} class folder(s); put each class's "
                           "images in a sub-folder of its own (at least 2: ROOT/cat, ROOT/dog)")
    xs: list[torch.Tensor] = []
    ys: list[int] = []
    shape: tuple[int, ...] | None = None
    for label, d in enumerate(class_dirs):
        files = sorted(p for p in d.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES)
        others = sorted(p.name for p in d.iterdir()
                        if p.is_file() and p.suffix.lower() not in IMAGE_SUFFIXES)
        if not files:
            hint = (f" (found {others[:3]}: convert images to .npy arrays, e.g. "
                    "numpy.save('a.npy', numpy.asarray(PIL.Image.open('a.png')))")
            raise DatasetError(f"{d}: class {d.name!r} has no .npy images"
                               f"{hint if others else ''}")
        for f in files:
            arr = _load_npy(f)
            if arr.ndim == 2:
                arr = arr[None]
            if arr.ndim != 3 or 0 in arr.shape:
                raise DatasetError(f"{f}: shape {list(arr.shape)}; an image is [H, W] or "
                                   "[C, H, W] (channels first)")
            if shape is None:
                shape = arr.shape
            elif arr.shape != shape:
                raise DatasetError(f"{f}: shape {list(arr.shape)} but {list(shape)} before it; "
                                   "resize every image to one size")
            xs.append(_as_float(arr, str(f)))
            ys.append(label)
    x, y = torch.stack(xs), torch.tensor(ys, dtype=torch.int64)
    return _vision(x, y, f"images:{top.name}", [d.name for d in class_dirs], str(top))


# --- CSV ------------------------------------------------------------------------------


def pack_csv(path: str | Path, label: str = "label") -> bytes:
    """A CSV with a header row: the column ``label`` holds the class (an index or a
    name), every other column a number. Samples are ``[1, 1, F]`` (an MLP's input_dim
    is F)."""
    p = Path(path)
    try:
        with open(p, newline="", encoding="utf-8") as fh:
            rows = list(csv.reader(fh))
    except (OSError, UnicodeDecodeError) as exc:
        raise DatasetError(f"{p}: cannot be read as UTF-8 CSV ({exc})") from None
    rows = [r for r in rows if any(c.strip() for c in r)]
    if len(rows) < 2:
        raise DatasetError(f"{p}: needs a header row and at least one sample row")
    header = [h.strip() for h in rows[0]]
    if label not in header:
        raise DatasetError(f"{p}: no column {label!r} (columns: {header[:10]}); name the "
                           "label column with --label COLUMN")
    li = header.index(label)
    if len(header) < 2:
        raise DatasetError(f"{p}: no feature columns beside {label!r}")
    feats: list[list[float]] = []
    labels: list[str] = []
    for line, row in enumerate(rows[1:], start=2):
        if len(row) != len(header):
            raise DatasetError(f"{p}:{line}: {len(row)} fields, the header has {len(header)}")
        values = []
        for col, cell in enumerate(row):
            if col == li:
                continue
            try:
                v = float(cell)
            except ValueError:
                raise DatasetError(f"{p}:{line}: column {header[col]!r} holds {cell[:20]!r}, "
                                   "not a number; features must be numeric (encode "
                                   "categories as numbers, or drop the column)") from None
            if not math.isfinite(v):
                raise DatasetError(f"{p}:{line}: column {header[col]!r} is {cell!r}; "
                                   "drop or impute missing values")
            values.append(v)
        feats.append(values)
        labels.append(row[li].strip())
    y, classes = _labels(labels, f"{p}: column {label!r}")
    x = torch.tensor(feats, dtype=torch.float32).view(len(feats), 1, 1, -1)
    return _vision(x, y, f"csv:{p.name}", classes, str(p))


# --- arrays -----------------------------------------------------------------------------


def _rank4(x: torch.Tensor, what: str) -> torch.Tensor:
    """[N, F] -> [N, 1, 1, F]; [N, H, W] -> [N, 1, H, W]; [N, C, H, W] as it is."""
    if x.ndim == 2:
        return x.view(x.shape[0], 1, 1, x.shape[1])
    if x.ndim == 3:
        return x.unsqueeze(1)
    if x.ndim == 4:
        return x
    raise DatasetError(f"{what}: features of shape {list(x.shape)}; give [N, F], [N, H, W] "
                       "or [N, C, H, W]")


def pack_arrays(path: str | Path, labels: str | Path | None = None) -> bytes:
    """Features and labels as NumPy arrays: a ``.npz`` holding ``x`` and ``y``, or a
    ``.npy`` of features with ``labels`` a ``.npy`` of integer labels."""
    p = Path(path)
    if p.suffix == ".npz":
        if labels is not None:
            raise DatasetError(f"{p}: a .npz holds its labels as 'y'; drop --labels")
        try:
            with np.load(p, allow_pickle=False) as z:
                arrays = {k: z[k] for k in z.files}
        except (ValueError, OSError, EOFError) as exc:
            raise DatasetError(f"{p}: not a readable .npz ({exc}); save it with "
                               "numpy.savez(path, x=features, y=labels)") from None
        if not {"x", "y"} <= arrays.keys():
            raise DatasetError(f"{p}: holds {sorted(arrays)[:6]}, needs arrays 'x' (features) "
                               "and 'y' (labels): numpy.savez(path, x=features, y=labels)")
        xa, ya = arrays["x"], arrays["y"]
    elif p.suffix == ".npy":
        if labels is None:
            raise DatasetError(f"{p}: a .npy holds features only; pass --labels LABELS.npy "
                               "(or pack a .npz with x and y)")
        xa, ya = _load_npy(p), _load_npy(Path(labels))
    else:
        raise DatasetError(f"{p}: expected a .npz (x, y) or a .npy with --labels")
    if ya.ndim != 1 or ya.dtype.kind not in "iu":
        raise DatasetError(f"{p}: labels are {ya.dtype}{list(ya.shape)}; they must be a 1-D "
                           "integer array of class indices")
    if xa.ndim < 2 or xa.shape[0] != ya.shape[0] or xa.shape[0] == 0:
        raise DatasetError(f"{p}: {xa.shape[0] if xa.ndim else 0} samples in the features but "
                           f"{ya.shape[0]} labels; give one label per sample (axis 0)")
    y, _ = _labels([str(int(v)) for v in ya], f"{p}: labels")
    x = _rank4(_as_float(xa, str(p)), str(p))
    return _vision(x, y, f"arrays:{p.name}", None, str(p))


# --- text ---------------------------------------------------------------------------------


def pack_text_file(path: str | Path) -> bytes:
    """A UTF-8 text file for the char-level LM: vocab = its distinct characters."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise DatasetError(f"{p}: not UTF-8 (byte {exc.start}); re-encode it, e.g. "
                           f"iconv -t UTF-8 {p.name}") from None
    except OSError as exc:
        raise DatasetError(f"{p}: cannot be read ({exc.strerror})") from None
    if len(text) < 2:
        raise DatasetError(f"{p}: {len(text)} character(s); a text dataset needs at least 2")
    return pack_chars(text, f"chars:{p.name}")


# --- what a spec needs --------------------------------------------------------------------


def spec_hints(raw: bytes) -> dict[str, Any]:
    """The model fields a spec must set for this dataset (printed by `dataset pack`)."""
    ds = parse_dataset(raw)
    if ds.kind == "text":
        return {"family": "transformer_lm", "vocab_size": len(ds.vocab)}
    c, h, w = ds.tensors["x"].shape[1:]
    hints: dict[str, Any] = {"num_classes": ds.num_classes, "mlp.input_dim": c * h * w}
    if h == w:
        hints.update({"cnn.in_channels": c, "cnn.image_size": h})
    return hints
