"""Job inputs from the network: the spec and dataset a job names on chain.

The chain holds ``specHash`` = sha256 of the spec's canonical JSON and
``datasetHash`` = sha256 of the dataset file, which are exactly their artifact
ids, so whatever a peer serves is checked by the store before we parse it.

A sharded dataset's file is its manifest (node.data.manifest): ``job_context``
binds it to a StreamContext whose shards are fetched when a step first needs
them (a solver prefetches ahead; a verifier, ``lookahead=0``, fetches only what
its sampled segments read).
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING, Any

import trio

from node.data.manifest import MAX_MANIFEST_BYTES, ShardManifest, parse_manifest
from node.data.stream import LOOKAHEAD_STEPS, StreamContext, is_manifest_file, store_source
from node.datasets import Dataset, load_dataset
from node.errors import CheckpointError, IntegrityError, SpecError
from node.roles.runtime import Runtime
from node.spec import MAX_SPEC_BYTES, JobSpec, parse_spec_json

if TYPE_CHECKING:
    from node.train.step import TrainContext

JobData = Dataset | ShardManifest


def load_job_data(path: Path, expected_hash: str) -> JobData:
    """A one-file dataset, or a sharded dataset's manifest (its shards come later)."""
    if is_manifest_file(path):
        with open(path, "rb") as f:
            return parse_manifest(f.read(MAX_MANIFEST_BYTES + 1), expected_hash, str(path))
    return load_dataset(path, expected_hash)


async def fetch_job_inputs(rt: Runtime, spec_hash: bytes, dataset_hash: bytes,
                           hint_accounts: tuple[str, ...] = ()) -> tuple[JobSpec, JobData]:
    # A spec is small: a provider claiming more is lying and is refused before a byte.
    spec_path = await rt.fetch(spec_hash.hex(), hint_accounts, expected_size=MAX_SPEC_BYTES)
    spec = parse_spec_json(spec_path.read_bytes())
    if spec.spec_hash() != spec_hash:
        # The store checked the file's sha256; a non-canonical encoding would land here.
        raise SpecError("the served spec is not in canonical form", field="spec")
    ds_path = await rt.fetch(dataset_hash.hex(), hint_accounts)
    dataset = await trio.to_thread.run_sync(load_job_data, ds_path, dataset_hash.hex())
    return spec, dataset


async def job_context(rt: Runtime, spec: JobSpec, data: JobData, threads: int,
                      hint_accounts: tuple[str, ...] = (),
                      lookahead: int = LOOKAHEAD_STEPS, micro_batches: int = 1,
                      init_weights: Any = None) -> TrainContext:
    """``data`` bound to ``spec``, off the event loop. A StreamContext's shards are
    fetched from its worker threads through this loop: train and replay on it from
    a thread (trio.to_thread), never on the loop itself."""
    from node.train.step import TrainContext  # noqa: PLC0415 - torch is heavy

    if isinstance(data, Dataset):
        return await trio.to_thread.run_sync(functools.partial(
            TrainContext.create, spec, data, threads=threads, micro_batches=micro_batches,
            init_weights=init_weights))
    token = trio.lowlevel.current_trio_token()

    def fetch(artifact_id: str, size: int) -> None:
        trio.from_thread.run(functools.partial(rt.fetch, artifact_id, hint_accounts,
                                               expected_size=size), trio_token=token)

    source = store_source(rt.p2p.store, fetch)
    return await trio.to_thread.run_sync(functools.partial(
        StreamContext.open, spec, data, source, threads=threads, lookahead=lookahead,
        micro_batches=micro_batches, init_weights=init_weights))


async def fetch_init_weights(rt: Runtime, spec: JobSpec,
                             hint_accounts: tuple[str, ...] = ()) -> Any:
    """S_0's weights of a fine-tuning job (``spec.init_weights``), fetched with a size
    bound from the spec's model and checked whole (node.train.init_weights); None for
    a job that starts from its seed. A file that does not fit makes the job unusable."""
    if spec.init_weights is None:
        return None
    from node.train.init_weights import load_init_weights, max_file_bytes  # noqa: PLC0415

    path = await rt.fetch(spec.init_weights, hint_accounts,
                          expected_size=max_file_bytes(spec.model))
    try:
        return await trio.to_thread.run_sync(load_init_weights, spec, path)
    except (IntegrityError, CheckpointError) as exc:
        raise SpecError(f"the job's init weights are unusable: {exc}",
                        field="init_weights") from exc
