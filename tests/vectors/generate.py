"""Regenerate the cross-check vectors from node/proof.py (the single source of truth).

    .venv/bin/python tests/vectors/generate.py

trace_vectors.json: leaves, leaf hashes, roots and proofs of a few trace trees.
sampling_vectors.json: sample_segments and sample_segments_with_final(seed, segment_count,
  n) for a few inputs.
state_hash_vectors.json: node.proof.state_hash of small tensor sets under each scheme
(polnet-trace/1: sha256, /2: blake3), for any other implementation of the state hash.
Contract tests check TraceLib / SegmentSampler (through contracts/src/test/LibHarness.sol,
JobMarket.challenge and JobMarket.sampledSegments) against them.
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from node.proof import (  # noqa: E402
    build_trace_tree,
    sample_segments,
    sample_segments_with_final,
    state_hash,
)


def _h(text: str) -> bytes:
    return hashlib.sha256(text.encode()).digest()


def _hex(b: bytes) -> str:
    return "0x" + b.hex()


def trace_vectors() -> dict:
    cases = []
    for job_id, k, segments in [(1, 10, 1), (1, 10, 2), (7, 5, 5), (42, 50, 8), (3, 1, 16)]:
        states = [_h(f"state-{job_id}-{k}-{i}") for i in range(segments + 1)]
        losses = [2_000_000_000 - 1_000_003 * i for i in range(segments)]
        leaves, tree = build_trace_tree(job_id, k, states, losses)
        cases.append({
            "job_id": job_id,
            "steps_per_segment": k,
            "segment_count": segments,
            "root": _hex(tree.root),
            "leaves": [
                {
                    "index": leaf.index,
                    "step": leaf.step,
                    "state_hash": _hex(leaf.state_hash),
                    "loss_e9": leaf.loss_e9,
                    "leaf_hash": _hex(leaf.hash()),
                    "proof": [_hex(p) for p in tree.proof(leaf.index)],
                }
                for leaf in leaves
            ],
        })
    return {"source": "node/proof.py build_trace_tree", "cases": cases}


def sampling_vectors() -> dict:
    cases = []
    inputs = [
        (bytes(32), 10, 3),
        (_h("seed-a"), 100, 44),
        (_h("seed-b"), 44, 44),
        (_h("seed-c"), 5, 10),
        (_h("seed-d"), 1, 1),
        (_h("seed-e"), 1000, 7),
        (bytes.fromhex("ff" * 32), 17, 16),
    ]
    for seed, count, n in inputs:
        cases.append({"seed": _hex(seed), "segment_count": count, "n": n,
                      "segments": sample_segments(seed, count, n),
                      "with_final": sample_segments_with_final(seed, count, n)})
    return {"source": "node/proof.py sample_segments, sample_segments_with_final",
            "cases": cases}


def _tensor_sets() -> list[tuple[str, dict]]:
    import torch  # noqa: PLC0415 - the other vectors need no torch

    return [
        ("empty", {}),
        ("scalar step", {"meta.step": torch.tensor(7, dtype=torch.int64)}),
        ("mixed", {"model.w": torch.arange(12, dtype=torch.float32).reshape(3, 4) / 7,
                   "model.b": torch.tensor([-0.0, 1.5, float("1e-40")]),
                   "optim.w.step": torch.zeros((), dtype=torch.float32),
                   "meta.step": torch.tensor(2**40, dtype=torch.int64),
                   "empty": torch.zeros(0, 3)}),
    ]


def state_hash_vectors() -> dict:
    cases = []
    for label, tensors in _tensor_sets():
        for scheme in ("sha256", "blake3"):
            cases.append({"label": label, "scheme": scheme,
                          "tensors": {n: {"dtype": str(t.dtype).removeprefix("torch."),
                                          "shape": list(t.shape),
                                          "values": t.reshape(-1).tolist()}
                                      for n, t in sorted(tensors.items())},
                          "state_hash": _hex(state_hash(tensors, scheme))})
    return {"source": "node/proof.py state_hash", "cases": cases}


def main() -> None:
    for name, data in [("trace_vectors.json", trace_vectors()),
                       ("sampling_vectors.json", sampling_vectors()),
                       ("state_hash_vectors.json", state_hash_vectors())]:
        (HERE / name).write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        print(f"wrote tests/vectors/{name}")


if __name__ == "__main__":
    main()
