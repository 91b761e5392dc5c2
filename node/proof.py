"""Commitments shared by every role: spec hashing, state hashing, trace leaves,
the Merkle tree and segment sampling.

There is exactly one copy of each rule, used by the solver, the verifier and
(through identical Solidity in ``contracts/src/libraries``) the contracts; two
copies would drift and flag honest solvers. Test vectors in
``tests/vectors/`` pin Python and Solidity to each other.

Merkle tree: OpenZeppelin ``MerkleProof`` compatible. Leaves are
double-hashed, ``keccak256(bytes.concat(keccak256(abi.encode(...))))``, and
inner nodes hash the *sorted* pair, so a proof is just the list of siblings.
"""

from __future__ import annotations

import functools
import hashlib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from eth_abi import encode as abi_encode
from eth_utils import keccak

from node.errors import ProofError

if TYPE_CHECKING:  # torch is heavy; only the state hash needs it
    import torch

LOSS_SCALE = 10**9
"""Losses go into leaves as ``round(loss * LOSS_SCALE)`` (uint256): no floats on chain."""


# --- canonical JSON ------------------------------------------------------------


def canonical_json(obj: Any) -> bytes:
    """Serialise ``obj`` canonically: sorted keys, no whitespace, UTF-8,
    floats in Python's shortest round-trip form, NaN/inf refused."""

    def check(o: Any) -> None:
        if isinstance(o, float) and not math.isfinite(o):
            raise ValueError("non-finite float cannot be hashed canonically")
        if isinstance(o, dict):
            for v in o.values():
                check(v)
        elif isinstance(o, list | tuple):
            for v in o:
                check(v)

    check(obj)
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      allow_nan=False).encode("utf-8")


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_sha256(path: str | Path) -> str:
    """sha256 hex of a file's bytes, read 1 MiB at a time (datasets and weights are large)."""
    digest = hashlib.sha256()
    with Path(path).open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def content_hash(obj: Any) -> bytes:
    """32-byte sha256 of the canonical JSON of ``obj``: the on-chain spec hash."""
    return hashlib.sha256(canonical_json(obj)).digest()


# --- state hash ------------------------------------------------------------------


StateHashScheme = Literal["sha256", "blake3"]
STATE_HASH_SCHEME: StateHashScheme = "blake3"
"""The scheme new traces use (``polnet-trace/2``); ``sha256`` is ``polnet-trace/1``'s.
BLAKE3 runs ~3.5x faster than sha256 on one core (AVX2/AVX-512) and was half the
cost of a checkpoint; both give 32 bytes, so leaves and contracts are unchanged."""


def _hasher(scheme: StateHashScheme) -> Any:
    if scheme == "blake3":
        from blake3 import blake3  # noqa: PLC0415 - lazy like torch

        # One thread: on two cores its rayon pool was slower, not faster (25M
        # parameters: 67-127 ms against 64 ms).
        return blake3()
    if scheme == "sha256":
        return hashlib.sha256()
    raise ValueError(f"unknown state hash scheme {scheme!r}")


@functools.lru_cache(maxsize=4096)
def _tensor_prefix(name: str, dtype: Any, shape: tuple[int, ...], nbytes: int) -> bytes:
    """A tensor's length-prefixed header and its byte count: the same for every
    state of a job, so built once (per-tensor Python work was most of a small
    state's hash: 11 us a tensor against 6 us of hashing for the 70k-param CNN)."""
    header = "\x00".join((name, str(dtype).removeprefix("torch."),
                          ",".join(str(d) for d in shape))).encode()
    return len(header).to_bytes(8, "little") + header + nbytes.to_bytes(8, "little")


def _tensor_bytes(t: torch.Tensor) -> Any:
    """A CPU tensor's little-endian contiguous bytes, in place where it can be."""
    import torch  # noqa: PLC0415 - lazy, see module docstring

    t = t.detach()
    if t.device.type != "cpu":
        t = t.cpu()
    if not t.is_contiguous():
        t = t.contiguous()
    # a view as uint8 gives the raw little-endian bytes (x86/ARM are LE)
    return t.reshape(-1).view(torch.uint8).numpy()


def state_hash(tensors: Mapping[str, torch.Tensor],
               scheme: StateHashScheme = STATE_HASH_SCHEME) -> bytes:
    """``scheme`` over tensors in name order: for each, the name, dtype, shape and
    little-endian contiguous bytes, each length-prefixed so no two states share
    an encoding. Tensors are hashed on the CPU, in place (no byte copy)."""
    import torch  # noqa: PLC0415 - lazy, see module docstring

    h = _hasher(scheme)
    for name in sorted(tensors):  # StateHasher is this loop cut into pieces
        t = tensors[name].detach()
        if t.device.type != "cpu":
            t = t.cpu()
        if not t.is_contiguous():
            t = t.contiguous()
        n = t.numel()
        h.update(_tensor_prefix(name, t.dtype, tuple(t.shape), n * t.element_size()))
        if n:  # a view as uint8 gives the raw little-endian bytes (x86/ARM are LE)
            h.update(t.reshape(-1).view(torch.uint8).numpy())
    return bytes(h.digest())


class StateHasher:
    """``state_hash`` fed one piece at a time: the same rule, so the same 32 bytes.

    For each tensor, in name order, ``begin(name, dtype, shape)`` then its row-major
    bytes in any number of ``update`` calls (a dim-0 sharded tensor's bytes are its
    shards' in rank order: nobody needs to hold it whole). ``begin`` refuses a
    name out of order and a tensor whose byte count its updates did not meet, so a
    streamed hash cannot silently differ from ``state_hash`` of the same tensors.
    ``largest`` is the largest single piece it was given (what a caller held)."""

    def __init__(self, scheme: StateHashScheme = STATE_HASH_SCHEME) -> None:
        self._h = _hasher(scheme)
        self._name: str | None = None
        self._dtype: Any = None
        self._left = 0
        self.largest = 0

    def begin(self, name: str, dtype: torch.dtype, shape: Sequence[int]) -> None:
        self._close()
        if self._name is not None and name <= self._name:
            raise ValueError(f"tensor {name!r} comes after {self._name!r}: names must be "
                             "hashed in sorted order, each once")
        shape = tuple(int(d) for d in shape)
        nbytes = math.prod(shape) * dtype.itemsize
        self._h.update(_tensor_prefix(name, dtype, shape, nbytes))
        self._name, self._dtype, self._left = name, dtype, nbytes

    def update(self, piece: torch.Tensor) -> None:
        """The next bytes of the current tensor: ``piece`` in its (the tensor's) dtype."""
        if self._name is None:
            raise ValueError("update before begin")
        if piece.dtype != self._dtype:
            raise ValueError(f"{self._name}: a {piece.dtype} piece of a {self._dtype} tensor")
        n = piece.numel() * piece.element_size()
        if n > self._left:
            raise ValueError(f"{self._name}: {n} bytes where {self._left} are left")
        if n:
            self._h.update(_tensor_bytes(piece))
        self._left -= n
        self.largest = max(self.largest, n)

    def tensor(self, name: str, t: torch.Tensor) -> None:
        """A whole tensor: ``begin`` and one ``update``."""
        self.begin(name, t.dtype, t.shape)
        self.update(t)

    def digest(self) -> bytes:
        self._close()
        return bytes(self._h.digest())

    def _close(self) -> None:
        if self._left:
            raise ValueError(f"{self._name}: {self._left} bytes never given")


# --- trace leaves ------------------------------------------------------------------


@dataclass(frozen=True)
class TraceLeaf:
    """Leaf ``index`` commits the state after ``step = index * k``.

    Leaf 0 is the initial state S_0 (loss 0); leaf i >= 1 closes segment i-1,
    whose steps are ``((i-1)k, ik]``, and carries that segment's mean loss.
    """

    job_id: int
    index: int
    step: int
    state_hash: bytes
    loss_e9: int

    def encode(self) -> bytes:
        return abi_encode(
            ["uint256", "uint256", "uint256", "bytes32", "uint256"],
            [self.job_id, self.index, self.step, self.state_hash, self.loss_e9],
        )

    def hash(self) -> bytes:
        """OpenZeppelin standard-tree leaf: keccak256(keccak256(abi.encode(...)))."""
        return keccak(keccak(self.encode()))


def loss_to_e9(loss: float) -> int:
    if not math.isfinite(loss) or loss < 0:
        raise ValueError(f"loss must be a finite non-negative number, got {loss!r}")
    return round(loss * LOSS_SCALE)


def hash_pair(a: bytes, b: bytes) -> bytes:
    """OpenZeppelin ``Hashes.commutativeKeccak256``: hash of the sorted pair."""
    return keccak(a + b) if a < b else keccak(b + a)


class MerkleTree:
    """A binary tree over leaf hashes kept in index order.

    Levels pair neighbours left to right; an odd node at the end of a level is
    promoted unchanged. Proofs are sibling lists verified with sorted-pair
    hashing, so OpenZeppelin's ``MerkleProof.verify`` accepts them.
    """

    def __init__(self, leaf_hashes: Sequence[bytes]) -> None:
        if not leaf_hashes:
            raise ValueError("a Merkle tree needs at least one leaf")
        for h in leaf_hashes:
            if len(h) != 32:
                raise ValueError("leaf hashes must be 32 bytes")
        levels: list[list[bytes]] = [list(leaf_hashes)]
        while len(levels[-1]) > 1:
            cur = levels[-1]
            nxt = [hash_pair(cur[i], cur[i + 1]) for i in range(0, len(cur) - 1, 2)]
            if len(cur) % 2:
                nxt.append(cur[-1])
            levels.append(nxt)
        self._levels = levels

    @classmethod
    def from_leaves(cls, leaves: Iterable[TraceLeaf]) -> MerkleTree:
        return cls([leaf.hash() for leaf in leaves])

    @property
    def root(self) -> bytes:
        return self._levels[-1][0]

    def __len__(self) -> int:
        return len(self._levels[0])

    def proof(self, index: int) -> list[bytes]:
        if not 0 <= index < len(self):
            raise IndexError(f"leaf {index} out of range 0..{len(self) - 1}")
        out: list[bytes] = []
        for level in self._levels[:-1]:
            sib = index ^ 1
            if sib < len(level):
                out.append(level[sib])
            index //= 2
        return out


def process_proof(leaf_hash: bytes, proof: Sequence[bytes]) -> bytes:
    node = leaf_hash
    for sib in proof:
        node = hash_pair(node, sib)
    return node


def verify_proof(root: bytes, leaf: TraceLeaf, proof: Sequence[bytes]) -> None:
    """Raise :class:`ProofError` unless ``leaf`` is in the tree with ``root``."""
    if process_proof(leaf.hash(), proof) != root:
        raise ProofError(
            f"Merkle proof for leaf {leaf.index} (step {leaf.step}) does not reach root "
            f"0x{root.hex()}: the checkpoint or proof was not the one committed"
        )


# --- segment sampling ----------------------------------------------------------------


def sample_segments(seed: bytes, segment_count: int, n: int) -> list[int]:
    """The ``n`` distinct segments (of ``segment_count``) drawn from ``seed``.

    Draw i is ``uint256(keccak256(abi.encode(seed, i))) % segment_count``;
    duplicates are skipped. Identical to ``SegmentSampler.sample`` in Solidity.
    If ``n >= segment_count`` every segment is returned, in draw order.
    """
    if len(seed) != 32:
        raise ValueError("seed must be 32 bytes")
    if segment_count <= 0:
        return []
    n = min(n, segment_count)
    chosen: list[int] = []
    seen: set[int] = set()
    i = 0
    while len(chosen) < n:
        r = int.from_bytes(keccak(abi_encode(["bytes32", "uint256"], [seed, i])), "big")
        s = r % segment_count
        if s not in seen:
            seen.add(s)
            chosen.append(s)
        i += 1
    return chosen


def sample_segments_with_final(seed: bytes, segment_count: int, n: int) -> list[int]:
    """A reserved sub-job's sample (a collaborative inner run): the final segment first,
    then ``sample_segments(seed, segment_count - 1, n)`` among the others. The final
    segment ends in the committed weights a worker's delta is taken from, so a forged
    delta is replayed every round. Identical to ``SegmentSampler.sampleWithFinal``."""
    if segment_count <= 0:
        return []
    return [segment_count - 1, *sample_segments(seed, segment_count - 1, n)]


def sample_share(sample: Sequence[int], seats: int, seat: int) -> list[int]:
    """Committee seat ``seat``'s share of ``sample`` (in draw order): the segments at
    positions ``seat, seat + seats, ...``. The seat's attestation covers these, and its
    attestor is slashed only for an invalid segment among them (``JobMarket``:
    ``SegmentSampler.indexOf(...) % seats``)."""
    if not 0 <= seat < seats:
        raise ValueError(f"seat {seat} is not one of {seats}")
    return list(sample[seat::seats])


def samples_for_detection(fraction: float, confidence: float) -> int:
    """Smallest n with ``1 - (1 - fraction)**n >= confidence``."""
    if not 0 < fraction < 1 or not 0 < confidence < 1:
        raise ValueError("fraction and confidence must lie strictly between 0 and 1")
    return math.ceil(math.log(1 - confidence) / math.log(1 - fraction))


def build_trace_tree(job_id: int, k: int, state_hashes: Sequence[bytes],
                     losses_e9: Sequence[int]) -> tuple[list[TraceLeaf], MerkleTree]:
    """Leaves for checkpoints ``S_0, S_k, ...`` and the tree over them.

    ``losses_e9[i]`` is the mean loss of segment i; ``len(state_hashes)`` must
    be ``len(losses_e9) + 1``.
    """
    if len(state_hashes) != len(losses_e9) + 1:
        raise ValueError("need one more state hash than segment losses")
    leaves = [TraceLeaf(job_id, 0, 0, state_hashes[0], 0)]
    for i, (h, loss) in enumerate(zip(state_hashes[1:], losses_e9, strict=True), start=1):
        leaves.append(TraceLeaf(job_id, i, i * k, h, loss))
    return leaves, MerkleTree.from_leaves(leaves)
