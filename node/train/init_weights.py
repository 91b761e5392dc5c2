"""S_0's weights of a fine-tuning job, theta_0 of a warm-started collaborative job:
a file the submitter serves.

Any job may start from given weights (``JobSpec.init_weights``: its S_0 is these
weights with a zeroed optimizer state, so leaf 0, fixed on chain, is that state's
hash); DiLoCo starts its workers from a pretrained model and a collaborative spec names such
weights by the sha256 of a safetensors file (``init_weights``) holding exactly the
inner model's state dict as ``model.<name>`` (fp32), the names a single-solver
checkpoint uses, so a finished job's checkpoint gives one (``from_checkpoint``).
Every worker and verifier fetches the file from the submitter and reads it here:
bytes against the spec's hash, the header against the model before any tensor is
loaded, and every value finite, so a bad file is refused whole, with its reason.

Public API::

    write_init_weights(theta, path) -> str     # theta: {name: tensor}; the sha256 hex
    from_checkpoint(checkpoint, model, out) -> str   # model.* of a checkpoint; sha256 hex
    load_init_weights(spec, path) -> Params    # Job- or CollaborativeSpec; IntegrityError, ...
    from_hf_dir(hf_dir, model, out) -> str     # a transformers save_pretrained dir; sha256 hex
    max_file_bytes(model) -> int               # a bound for fetching one from a peer
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from pathlib import Path

import torch

from node.errors import CheckpointError, IntegrityError
from node.proof import file_sha256
from node.spec import CollaborativeSpec, JobSpec, ModelConfig
from node.tensorfile import read_header, tensor_file_parts
from node.train.inner import Params
from node.train.layout import HEADER_BASE_BYTES, HEADER_BYTES_PER_TENSOR, Layout, compare_layout
from node.train.models import build_skeleton

PREFIX = "model."
WHOSE = "the spec's model"


def expected_layout(model: ModelConfig) -> Layout:
    return {PREFIX + n: ("F32", tuple(t.shape))
            for n, t in build_skeleton(model).state_dict().items()}


def max_file_bytes(model: ModelConfig) -> int:
    want = expected_layout(model)
    return (8 + HEADER_BASE_BYTES + HEADER_BYTES_PER_TENSOR * len(want)
            + sum(4 * math.prod(shape) for _, shape in want.values()))


def write_init_weights(theta: Mapping[str, torch.Tensor], path: Path) -> str:
    """Write ``{name: tensor}`` (the model's state dict) as an init-weights file."""
    from node.fsutil import atomic_write  # noqa: PLC0415

    tensors = {PREFIX + n: t.detach().to("cpu", torch.float32).contiguous()
               for n, t in theta.items()}
    atomic_write(path, tensor_file_parts(tensors, {}))
    return file_sha256(path)


def from_checkpoint(checkpoint: Path, model: ModelConfig, out: Path) -> str:
    """The ``model.*`` tensors of a polnet checkpoint (a finished job's final state)
    as an init-weights file for ``model``; returns its sha256 for the spec."""
    from safetensors import safe_open  # noqa: PLC0415

    want = expected_layout(model)
    size = checkpoint.stat().st_size
    with checkpoint.open("rb") as f:
        header = read_header(f, size, max_header=HEADER_BASE_BYTES
                             + HEADER_BYTES_PER_TENSOR * 4 * len(want),
                             what=f"checkpoint {checkpoint}", error=CheckpointError)
    compare_layout(want, {n: v for n, v in header.layout().items() if n.startswith(PREFIX)},
                   f"checkpoint {checkpoint}", WHOSE)
    with safe_open(str(checkpoint), framework="pt") as f:
        theta = {n.removeprefix(PREFIX): f.get_tensor(n) for n in want}
    return write_init_weights(theta, out)


def load_init_weights(spec: JobSpec | CollaborativeSpec, path: Path) -> Params:
    """S_0's weights (theta_0) from the file the spec's ``init_weights`` names, checked whole."""
    from safetensors.torch import load_file  # noqa: PLC0415

    if spec.init_weights is None:
        raise ValueError("the spec names no init_weights")
    what = f"init weights {path.name}"
    got = file_sha256(path)
    if got != spec.init_weights:
        raise IntegrityError(f"{what} hashes to {got}, not the spec's init_weights "
                             f"{spec.init_weights}: pass the file the spec names")
    model = spec.inner.model if isinstance(spec, CollaborativeSpec) else spec.model
    want = expected_layout(model)
    with path.open("rb") as f:
        header = read_header(f, os.fstat(f.fileno()).st_size,
                             max_header=HEADER_BASE_BYTES + HEADER_BYTES_PER_TENSOR * len(want),
                             what=what, error=CheckpointError)
    compare_layout(want, header.layout(), what, WHOSE)
    theta = {n.removeprefix(PREFIX): t.contiguous() for n, t in load_file(str(path)).items()}
    for name, t in theta.items():
        if not bool(torch.isfinite(t).all()):
            raise CheckpointError(f"{what}: {name} has non-finite values")
    return theta



def from_hf_dir(hf_dir: Path, model: ModelConfig, out: Path) -> str:
    """A ``save_pretrained`` directory's ``model.safetensors`` (e.g. a published GPT-2)
    as an init-weights file for the spec's HF-family ``model``: every tensor must fit
    the spec's configuration; weights the file leaves out are only those tied to one
    it holds (an output head tied to the embedding). Returns the file's sha256."""
    from safetensors.torch import load_file  # noqa: PLC0415

    from node.train.hf_models import hf_module  # noqa: PLC0415
    from node.train.models import build_model  # noqa: PLC0415

    src = hf_dir / "model.safetensors"
    if not src.is_file():
        raise CheckpointError(f"{hf_dir} holds no model.safetensors (a sharded or .bin "
                              "checkpoint: re-save it with save_pretrained(safe_serialization"
                              "=True, max_shard_size='100GB'))")
    polnet_model = build_model(model, 0)  # every tensor is then replaced or tied
    hf = hf_module(polnet_model)
    want = {n: tuple(t.shape) for n, t in hf.state_dict().items()}
    size = src.stat().st_size
    with src.open("rb") as f:
        header = read_header(f, size, max_header=HEADER_BASE_BYTES
                             + HEADER_BYTES_PER_TENSOR * 4 * len(want),
                             what=f"HF checkpoint {src}", error=CheckpointError)
    got = {n: shape for n, (_, shape) in header.layout().items()}
    extra = sorted(got.keys() - want.keys())
    wrong = sorted(n for n in got.keys() & want.keys() if got[n] != want[n])
    if extra or wrong:
        raise CheckpointError(f"{src} does not fit the spec's {model.family} configuration: "
                              f"unexpected {extra[:3]}, other shape {wrong[:3]} "
                              f"(e.g. {[(n, got[n], want[n]) for n in wrong[:1]]})")
    tensors = load_file(str(src))
    hf.load_state_dict({n: t.to(torch.float32) for n, t in tensors.items()}, strict=False)
    loaded = {hf.state_dict()[n].data_ptr() for n in tensors}
    untied = sorted(n for n, t in hf.state_dict().items()
                    if n not in tensors and t.data_ptr() not in loaded)
    if untied:
        raise CheckpointError(f"{src} lacks {untied[:3]} (not tied to any weight it holds)")
    return write_init_weights(polnet_model.state_dict(), out)
