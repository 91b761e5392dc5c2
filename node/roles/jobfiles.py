"""Job inputs from the network: the spec and dataset a job names on chain.

The chain holds ``specHash`` = sha256 of the spec's canonical JSON and
``datasetHash`` = sha256 of the dataset file, which are exactly their artifact
ids, so whatever a peer serves is checked by the store before we parse it.
"""

from __future__ import annotations

import trio

from node.datasets import Dataset, load_dataset
from node.errors import SpecError
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
