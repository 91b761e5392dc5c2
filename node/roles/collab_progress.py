"""The submitter's view of its collaborative job while it serves it: every accepted
theta_r, checked against the chain, and its held-out loss (issue 13).

A submitter wants the model and to see it learn. Each time the CollabMarket accepts a
round's outer state, the serving submitter takes theta_{r+1} the way any follower does
(node.roles.collab: a peer's announced copy if its outer hash is the accepted one,
else recomputed from the accepted sub-jobs' committed final states), keeps it in its
data dir and records the held-out loss (node.train.rounds.heldout_loss, on windows in
no worker's shard) in ``collab/<job>/losses.json``; ``polnet job status --collab``
prints it beside each round. Nothing here is trusted by anyone else: a loss is the
submitter's own evaluation of weights whose hash the chain fixed.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import trio

from node.chain.ids import CollabId
from node.chain.view import Snapshot
from node.errors import PolnetError
from node.logs import get_logger
from node.roles.collab import CollabFollower
from node.roles.runtime import Runtime

log = get_logger("polnet.submitter")

LOSSES_FILE = "losses.json"


def losses_path(node_dir: Path, cid: CollabId) -> Path:
    return node_dir / "collab" / str(cid) / LOSSES_FILE


def read_losses(node_dir: Path, cid: CollabId) -> dict[int, dict[str, Any]]:
    """{r: {"loss", "outer_hash"}} for theta_r (r outer steps done); {} when the file
    is missing or unreadable (a status view must not fail over it)."""
    try:
        raw = json.loads(losses_path(node_dir, cid).read_text())
        return {int(r): dict(v) for r, v in raw.items()}
    except (OSError, ValueError, TypeError, AttributeError):
        return {}


class CollabProgress:
    """Follows one collaborative job's accepted outer states; ``tick`` records what is
    new. Only reads the chain (a submitter makes no collaborative moves)."""

    def __init__(self, rt: Runtime, cid: CollabId) -> None:
        from node.roles.verifier_evidence import Evidence  # noqa: PLC0415 - torch is heavy

        self.rt = rt
        self.cid = cid
        evidence = Evidence(rt)
        self.follower = CollabFollower(rt, evidence)
        evidence.collab = self.follower
        self.losses = read_losses(rt.dir, cid)
        self._eval: Any = None  # (context, held-out indices), built once

    async def tick(self, snap: Snapshot) -> Any:
        """Record what is new as of ``snap`` (the process's chain view); returns the
        job there (read alone if the view lacks it), the caller's poll."""
        job = snap.collabs.get(self.cid)
        if job is None:
            job = await self.rt.chain(self.rt.chain_client.collab.get_collab, self.cid)
        await self._record_new(snap, job)
        return job

    async def _record_new(self, snap: Snapshot, job: Any) -> None:
        c = self.rt.chain_client
        # theta_r is known for r = 0 and for every round r - 1 whose outer state the
        # chain accepted: job.round counts them.
        for r in range(job.round + 1):
            if r in self.losses:
                continue
            if r > 0:
                rnd = snap.round(self.cid, r - 1)
                if rnd is None:
                    rnd = await self.rt.chain(c.collab.get_round, self.cid, r - 1)
                if not rnd.accepted:
                    return
                want = rnd.outer_hash
            else:
                want = None  # round 0: the follower checks it against outerInitHash
            state = await self.follower.outer_state(self.cid, r)
            if state is None:
                return  # the accepted final states are not fetchable yet: next pass
            await self._record(r, state, want)

    async def _record(self, r: int, state: Any, want: bytes | None) -> None:
        from node.train.diloco import outer_hash  # noqa: PLC0415

        got = outer_hash(state)
        if want is not None and got != want:
            # Our recomputation disagrees with what the chain accepted: say so loudly,
            # record nothing (the follower drops its cache on the next restart).
            log.warning("collab_outer_mismatch", job=self.cid, round=r,
                        accepted="0x" + want.hex(), ours="0x" + got.hex())
            return
        if self._eval is None:
            spec, ds = await self.follower.inputs(self.cid)
            self._eval = await trio.to_thread.run_sync(self._eval_set, spec, ds)
        loss = await trio.to_thread.run_sync(self._loss, state.theta)
        self.losses[r] = {"loss": loss, "outer_hash": "0x" + got.hex()}
        await trio.to_thread.run_sync(self._write)
        log.info("collab_round_loss", job=self.cid, round=r, heldout_loss=round(loss, 5))

    def _eval_set(self, spec: Any, ds: Any) -> tuple[Any, Any]:
        from node.train.shards import holdout_indices, worker_context  # noqa: PLC0415

        ctx = worker_context(spec, ds, 0, threads=self.rt.settings.threads)
        return ctx, holdout_indices(spec, ctx.num_samples)

    def _loss(self, theta: Any) -> float:
        from node.train.rounds import heldout_loss  # noqa: PLC0415

        ctx, held = self._eval
        return heldout_loss(ctx, theta, held)

    def _write(self) -> None:
        from node.fsutil import atomic_write  # noqa: PLC0415

        path = losses_path(self.rt.dir, self.cid)
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(path, json.dumps({str(r): v for r, v in sorted(self.losses.items())},
                                      indent=1).encode())

    async def tick_safely(self) -> Any:
        """``tick`` on the newest snapshot, with a failure logged rather than raised
        (serving the inputs matters more than a loss figure); the job as of the
        snapshot either way."""
        snap = await self.rt.snapshot()
        try:
            return await self.tick(snap)
        except (PolnetError, OSError, ValueError) as exc:
            log.warning("collab_progress_failed", job=self.cid, error=str(exc))
        except Exception as exc:  # a bug or an unchecked input: logged whole, not fatal
            log.exception("collab_progress_crashed", job=self.cid, error=repr(exc))
        job = snap.collabs.get(self.cid)
        if job is None:
            job = await self.rt.chain(self.rt.chain_client.collab.get_collab, self.cid)
        return job
