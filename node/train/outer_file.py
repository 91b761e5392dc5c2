"""An outer state file (theta_r, momentum, ``meta.round``, ``meta.slots``), read as
bytes from a stranger: any registered node may announce one (issue 37).

Its safetensors header goes through the bounded decoder (node.tensorfile) and is
compared with the layout the collaborative spec implies before a tensor byte is
loaded; then its meta values and every float are checked. Whatever the bytes, the
only error is :class:`CheckpointError` (a ``PolnetError``), naming what is wrong.

Public API::

    outer_layout(spec) -> Layout          # without meta.slots, whose length varies
    max_file_bytes(spec) -> int           # a bound for fetching one from a peer
    read_outer_file(path, r, spec) -> OuterState | None   # None: no file
"""

from __future__ import annotations

import math
import os
from pathlib import Path
from typing import TYPE_CHECKING

from node.errors import CheckpointError
from node.spec import CollaborativeSpec
from node.tensorfile import read_header
from node.train.layout import HEADER_BASE_BYTES, HEADER_BYTES_PER_TENSOR, Layout, compare_layout

if TYPE_CHECKING:
    from node.train.diloco import OuterState

ROUND_KEY, SLOTS_KEY = "meta.round", "meta.slots"


def outer_layout(spec: CollaborativeSpec) -> Layout:
    from node.train.init_weights import expected_layout  # noqa: PLC0415 - torch is heavy

    model = {n.removeprefix("model."): v for n, v in expected_layout(spec.inner.model).items()}
    out: Layout = {f"theta.{n}": v for n, v in model.items()}
    out.update({f"momentum.{n}": v for n, v in model.items()})
    out[ROUND_KEY] = ("I64", ())
    return out


def _max_header(spec: CollaborativeSpec) -> int:
    return HEADER_BASE_BYTES + HEADER_BYTES_PER_TENSOR * (len(outer_layout(spec)) + 1)


def max_file_bytes(spec: CollaborativeSpec) -> int:
    data = sum(4 * math.prod(shape) for _, shape in outer_layout(spec).values())
    return 8 + _max_header(spec) + data + 8 * spec.workers.max


def read_outer_file(path: Path, r: int, spec: CollaborativeSpec) -> OuterState | None:
    """Round ``r``'s outer state from ``path`` (an ``OuterState``; None if there is no
    file), or CheckpointError if it is not a well-formed round-``r`` state of ``spec``."""
    import torch  # noqa: PLC0415
    from safetensors.torch import load_file  # noqa: PLC0415

    from node.train.diloco import OuterState  # noqa: PLC0415

    if not path.is_file():
        return None
    what = f"outer state {path.name}"
    with path.open("rb") as f:
        header = read_header(f, os.fstat(f.fileno()).st_size, max_header=_max_header(spec),
                             what=what, error=CheckpointError)
    got = header.layout()
    slots_layout = got.pop(SLOTS_KEY, None)
    compare_layout(outer_layout(spec), got, what, "the collaborative spec")
    if slots_layout is None or slots_layout[0] != "I64" or len(slots_layout[1]) != 1 \
            or slots_layout[1][0] > spec.workers.max:
        raise CheckpointError(f"{what}: {SLOTS_KEY} must be I64[n], n <= {spec.workers.max}")
    try:
        t = load_file(str(path))
    except Exception as exc:  # noqa: BLE001 - the header passed; the bytes did not
        raise CheckpointError(f"{what} cannot be read: {exc}") from None
    got_round = int(t[ROUND_KEY])
    if got_round != r:
        raise CheckpointError(f"{what} holds round {got_round}, not {r}")
    slots = tuple(int(s) for s in t[SLOTS_KEY].tolist())
    if list(slots) != sorted(set(slots)) or any(not 0 <= s < spec.workers.max for s in slots) \
            or (r > 0 and not slots):
        raise CheckpointError(f"{what}: {SLOTS_KEY} {list(slots)[:8]} are not distinct "
                              f"ascending slots in [0, {spec.workers.max})")
    theta = {k.removeprefix("theta."): v for k, v in t.items() if k.startswith("theta.")}
    mom = {k.removeprefix("momentum."): v for k, v in t.items() if k.startswith("momentum.")}
    for name, v in (*theta.items(), *mom.items()):
        if not bool(torch.isfinite(v).all()):
            raise CheckpointError(f"{what}: {name} has non-finite values")
    return OuterState(r, theta, mom, slots)
