"""Job inputs from the network: the spec and dataset a job names on chain.

The chain holds ``specHash`` = sha256 of the spec's canonical JSON and
``datasetHash`` = sha256 of the dataset file, which are exactly their artifact
ids, so whatever a peer serves is checked by the store before we parse it.
"""

from __future__ import annotations

from typing import Any

import trio

from node.datasets import Dataset, load_dataset
from node.errors import CheckpointError, IntegrityError, SpecError
from node.roles.runtime import Runtime
from node.spec import MAX_SPEC_BYTES, JobSpec, parse_spec_json


async def fetch_job_inputs(rt: Runtime, spec_hash: bytes, dataset_hash: bytes,
                           hint_accounts: tuple[str, ...] = ()) -> tuple[JobSpec, Dataset]:
    # A spec is small: a provider claiming more is lying and is refused before a byte.
    spec_path = await rt.fetch(spec_hash.hex(), hint_accounts, expected_size=MAX_SPEC_BYTES)
    spec = parse_spec_json(spec_path.read_bytes())
    if spec.spec_hash() != spec_hash:
        # The store checked the file's sha256; a non-canonical encoding would land here.
        raise SpecError("the served spec is not in canonical form", field="spec")
    ds_path = await rt.fetch(dataset_hash.hex(), hint_accounts)
    dataset = await trio.to_thread.run_sync(load_dataset, ds_path, dataset_hash.hex())
    return spec, dataset


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
