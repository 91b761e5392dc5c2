"""The streamed state hash (node.proof.StateHasher) is ``state_hash``: the same 32 bytes
for the same tensors however their bytes are cut (a dim-0 sharded tensor's shards in
rank order, uneven and empty chunks included), for both schemes (issue 33)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from node.proof import StateHasher, state_hash

VECTORS = Path(__file__).parent / "vectors"
DTYPES = [torch.float32, torch.float64, torch.bfloat16, torch.float16, torch.int64,
          torch.int32, torch.uint8, torch.bool]


def _random_state(g: torch.Generator) -> dict[str, torch.Tensor]:
    out: dict[str, torch.Tensor] = {}
    for i in range(12):
        dtype = DTYPES[i % len(DTYPES)]
        rank = int(torch.randint(0, 4, (), generator=g))
        shape = [int(torch.randint(0, 6, (), generator=g)) for _ in range(rank)]
        if i == 3:
            shape = [0, 4]  # empty
        if i == 4:
            shape = []      # 0-d
        t = torch.randn(shape, generator=g, dtype=torch.float64) * 100
        out[f"t{i:02d}.{dtype}"] = t.to(dtype)
    out["meta.step"] = torch.tensor(7, dtype=torch.int64)
    return out


def _shards(t: torch.Tensor, world: int) -> list[torch.Tensor]:
    """What FSDP2's Shard(0) gives each rank: torch.chunk on dim 0, empty past the end."""
    if t.dim() == 0:
        return [t]
    chunks = list(torch.chunk(t, world, dim=0))
    return chunks + [t[:0]] * (world - len(chunks))


@pytest.mark.parametrize("scheme", ["blake3", "sha256"])
@pytest.mark.parametrize("world", [1, 2, 3, 7])
def test_streamed_shards_hash_like_the_whole_state(scheme: str, world: int) -> None:
    g = torch.Generator().manual_seed(world)
    for _ in range(5):
        state = _random_state(g)
        h = StateHasher(scheme)  # type: ignore[arg-type]
        for name in sorted(state):
            t = state[name]
            h.begin(name, t.dtype, t.shape)
            for piece in _shards(t, world):
                h.update(piece)
        assert h.digest() == state_hash(state, scheme)  # type: ignore[arg-type]
        assert h.largest <= max(t.numel() * t.element_size() for t in state.values())


def test_a_streamed_hash_refuses_what_state_hash_would_not_give() -> None:
    h = StateHasher()
    h.begin("b", torch.float32, (4,))
    with pytest.raises(ValueError, match="bytes where"):
        h.update(torch.zeros(5))
    with pytest.raises(ValueError, match="never given"):
        h.begin("c", torch.float32, ())  # b's 16 bytes are missing
    h = StateHasher()
    h.tensor("b", torch.zeros(2))
    with pytest.raises(ValueError, match="sorted order"):
        h.begin("a", torch.float32, ())
    h = StateHasher()
    h.begin("a", torch.float32, (2,))
    with pytest.raises(ValueError, match="piece"):
        h.update(torch.zeros(2, dtype=torch.float64))


def test_the_committed_vectors_stream_to_their_hashes() -> None:
    """Every case of tests/vectors/state_hash_vectors.json, streamed in two uneven pieces
    per tensor, gives its committed hash (and ``state_hash`` still does)."""
    cases = json.loads((VECTORS / "state_hash_vectors.json").read_text())["cases"]
    assert cases
    for case in cases:
        tensors = {n: torch.tensor(v["values"], dtype=getattr(torch, v["dtype"]))
                   .reshape(v["shape"]) for n, v in case["tensors"].items()}
        h = StateHasher(case["scheme"])
        for name in sorted(tensors):
            flat = tensors[name].reshape(-1)
            h.begin(name, flat.dtype, tensors[name].shape)
            cut = flat.numel() // 3
            h.update(flat[:cut])
            h.update(flat[cut:])
        want = case["state_hash"].removeprefix("0x")
        assert h.digest().hex() == want, case["label"]
        assert state_hash(tensors, case["scheme"]).hex() == want, case["label"]
