"""How a distributed step splits its global batch over ranks (issue 33).

The rule is fixed by the spec and the step alone, so any world size trains the
job the single-process step defines:

* the step's batch is ``batch_indices(ctx, t)`` (node.train.step), unchanged;
* rank ``r`` of ``N`` takes the contiguous rows ``[r*b/N, (r+1)*b/N)``, exactly
  the rows micro-batch ``r`` of ``micro_batches = N`` takes, with the same rows of
  the whole batch's dropout masks (``StepRandomness``);
* each rank backpropagates ``loss_r / N`` and the gradients are summed by the
  backend (an all-reduce, or FSDP2's reduce-scatter);
* the step's loss is the mean of the N parts in rank order.

With N = 2 the sum is one addition, which commutes, so a 2-rank data-parallel
step equals the single-process step with ``micro_batches = 2`` bit for bit;
with N > 2 the backend's reduction order differs from the accumulation order and
the verifier's tolerance covers the difference (bench/distributed.py).

Public API::

    check_world(batch_size, world_size)          # TrainingError unless N divides b
    rank_rows(batch_size, world_size, rank) -> slice
"""

from __future__ import annotations

from node.errors import TrainingError

# FSDP2 leaf hashing: the peers' shards reach rank 0 in batches of about this size
# (a larger shard alone), so rank 0 holds its shards plus one batch per peer.
HASH_BATCH_BYTES = 16 * 2**20

MAX_WORLD_SIZE = 64


def check_world(batch_size: int, world_size: int) -> None:
    if not 1 <= world_size <= MAX_WORLD_SIZE:
        raise TrainingError(f"world size {world_size} outside 1..{MAX_WORLD_SIZE}")
    if batch_size % world_size:
        raise TrainingError(f"world size {world_size} must divide the batch size {batch_size}")


def rank_rows(batch_size: int, world_size: int, rank: int) -> slice:
    """The rows of the step's batch that ``rank`` computes."""
    check_world(batch_size, world_size)
    if not 0 <= rank < world_size:
        raise TrainingError(f"rank {rank} outside 0..{world_size - 1}")
    chunk = batch_size // world_size
    return slice(rank * chunk, (rank + 1) * chunk)
