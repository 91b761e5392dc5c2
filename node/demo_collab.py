"""`polnet demo --collab`: a collaborative (DiLoCo) job on a whole local network.

A devnet; three verifiers; four solvers that each take a worker slot of one
collaborative job (a small transformer LM on the bundled text): two honest, one
byzantine (``amplify``: its last inner segment runs at 5x the learning rate, a
blown-up delta) and one that is SIGKILLed in the middle of round 1 and started
again two rounds later. Every round's inner runs are JobMarket sub-jobs: the
verifiers replay sampled segments, the byzantine worker's run is challenged,
bisected and condemned by the jury, so it is slashed and its delta never enters
an outer step; the killed worker misses its deadline and is dropped (part of its
bond to the others), then rejoins from the committed theta_t it recomputes over
libp2p. Every node is its own OS process (``devnet.localnet``).

At the end this process takes the job's final weights from a worker's cache,
checks them against the chain's final outer hash, and prints their held-out loss
beside one solver that trained alone for the same number of steps.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table

from devnet.localnet import LocalNet
from node.chain.ids import CollabId
from node.demo import Narrator, holdings_table

if TYPE_CHECKING:  # torch is heavy; the functions that train import it
    from node.datasets import Dataset
    from node.spec import CollaborativeSpec
    from node.train.inner import Params

SUBMITTER, VERIFIERS = 1, (4, 5, 6)
WORKERS = {"worker-1": 2, "worker-2": 3, "worker-byz": 7, "worker-kill": 8}
BYZANTINE, KILLED = "worker-byz", "worker-kill"
NARRATED = {"CollabPosted", "SlotClaimed", "SlotReleased", "RoundStarted", "SubJobAccepted",
            "SubJobDropped", "RoundSettled", "RoundRetried", "OuterPosted", "OuterChallenged",
            "OuterResolved", "OuterAccepted", "CollabFinished", "CollabFailed",
            "JuryDrawn", "CaseTallied", "JurorSlashed",
            "Challenged", "DisputeResolved", "RoundCondemned", "Slashed", "JobReclaimed"}


def collab_demo_params() -> Any:
    """The whole-network test windows plus the CollabMarket's, short for a demo."""
    from devnet.params import DevnetParams, short_network_params

    d = short_network_params().model_dump()
    # A sub-job's sample is its final segment plus reserved_sample_count (1) others: both
    # of the demo's 2 segments. 50 s windows (not 35): 4 workers and 3 verifiers share 2
    # cores here, and a verifier replays each sub-job's segments beside the others'
    # training (a CI run saw 25 s from a commit to the challenge).
    d["market"].update(verification_window=50)
    d["collab"] = {"outer_window": 20, "max_round_retries": 3}
    d["outer_jury"] = {"jury_lookahead": 2, "jury_size": 2, "quorum": 1, "commit_window": 15,
                       "reveal_window": 15}
    return DevnetParams.model_validate(d)


def collab_spec_dict(dataset_hash: str, rounds: int, inner_steps: int = 20,
                     k: int = 10) -> dict[str, Any]:
    """A char LM small enough for 2 busy cores: ~40k parameters, 4 slots."""
    return {
        "kind": "collaborative", "name": "demo-collab-lm",
        "inner": {"name": "demo-collab-lm-inner",
                  "model": {"family": "transformer_lm", "vocab_size": 128, "context": 32,
                            "d_model": 48, "n_heads": 2, "n_layers": 1, "d_ff": 192,
                            "dropout": 0.1},
                  "dataset_hash": dataset_hash, "optimizer": {"name": "adamw", "lr": 3e-3},
                  "batch_size": 8, "total_steps": inner_steps * rounds,
                  "checkpoint_interval": k, "seed": 11},
        "workers": {"min": 2, "max": 4}, "inner_steps": inner_steps, "outer_rounds": rounds,
        # Nesterov 1.0 / 0.5: bench/collab.py measured it below one worker alone at this
        # size, where OpenDiLoCo's 0.7 / 0.9 was not.
        # clip 2: a delta's norm is cut to twice the round's median (docs/protocol.md).
        "outer_optimizer": {"name": "nesterov", "lr": 1.0, "momentum": 0.5, "clip_ratio": 2.0},
        "holdout_samples": 256,
    }


def write_collab_inputs(data: Path, rounds: int) -> tuple[Path, Path]:
    import json

    from node.datasets import pack_text, write_dataset

    data.mkdir(parents=True, exist_ok=True)
    text = data / "text.safetensors"
    h = write_dataset(pack_text(), text)
    spec = data / "collab.json"
    spec.write_text(json.dumps(collab_spec_dict(h, rounds)))
    return spec, text


WARM_SEED = 7919  # a warm start's pretraining seed; the example's is another


def warm_weights(spec: CollaborativeSpec, ds: Dataset, steps: int, seed: int = WARM_SEED,
                 threads: int = 1) -> Params:
    """A stand-in for a pretrained model: one worker's weights after ``steps`` steps at
    batch B of ``spec``'s model and data, from another seed (other initial weights, other
    batches), so that no run started from them replays the warm-up's batches."""
    from node.spec import parse_collaborative_spec
    from node.train.diloco import initial_outer_state
    from node.train.inner import model_params
    from node.train.rounds import sequential
    from node.train.shards import worker_context

    h = spec.inner_steps
    rounds = -(-steps // h)
    d = spec.model_dump(mode="json")
    d["inner"].update(seed=seed, total_steps=h * rounds)
    d.update(outer_rounds=rounds, init_weights=None)
    pre = parse_collaborative_spec(d)
    ctx = worker_context(pre, ds, 0, threads=threads)
    return model_params(sequential(ctx, initial_outer_state(pre).theta, steps))


def warm_start_inputs(spec_path: Path, text: Path, steps: int, seed: int = WARM_SEED) -> Path:
    """Make the job warm-started: ``warm_weights`` become theta_0, written beside the
    spec, whose ``init_weights`` then names them. Returns the file."""
    import json

    from node.datasets import load_dataset
    from node.spec import load_collaborative_spec
    from node.train.init_weights import write_init_weights

    spec = load_collaborative_spec(spec_path)
    theta = warm_weights(spec, load_dataset(text, spec.inner.dataset_hash), steps, seed)
    out = spec_path.with_name("init-weights.safetensors")
    d = json.loads(spec_path.read_text())
    d["init_weights"] = write_init_weights(theta, out)
    spec_path.write_text(json.dumps(d))
    load_collaborative_spec(spec_path)  # still a valid spec
    return out


def final_and_solo_loss(home: Path, spec_path: Path, text: Path, cid: CollabId,
                        outer_hash: bytes, workers: list[str],
                        init: Path | None = None) -> dict[str, float]:
    """The job's final weights (a worker's cached outer state, checked against the
    chain's hash) and one solver alone for H x R steps, on the held-out windows."""
    from node.datasets import load_dataset
    from node.errors import IntegrityError
    from node.roles.collab import load_outer_file
    from node.spec import load_collaborative_spec
    from node.train.diloco import initial_outer_state
    from node.train.diloco import outer_hash as hash_of
    from node.train.inner import model_params
    from node.train.rounds import heldout_loss, sequential
    from node.train.shards import holdout_indices, worker_context

    spec = load_collaborative_spec(spec_path)
    ds = load_dataset(text, spec.inner.dataset_hash)
    ctx = worker_context(spec, ds, 0)
    held = holdout_indices(spec, ctx.num_samples)
    final = None
    for w in workers:
        path = (home / "nodes" / w / "collab" / str(cid)
                / f"outer-{spec.outer_rounds:06d}.safetensors")
        if path.is_file():
            state = load_outer_file(path, spec.outer_rounds, spec)
            if state is not None and hash_of(state) == outer_hash:
                final = state
                break
    if final is None:
        raise IntegrityError("no worker holds the final outer state the chain committed")
    theta_0 = initial_outer_state(spec, init).theta
    solo = sequential(ctx, theta_0, spec.inner_steps * spec.outer_rounds)
    return {"collab": heldout_loss(ctx, final.theta, held),
            "solo": heldout_loss(ctx, model_params(solo), held),
            "initial": heldout_loss(ctx, theta_0, held)}


def run_collab_demo(home: Path, timeout: float = 1500.0, rounds: int = 5,
                    warm_start: int = 0) -> int:
    """``warm_start`` > 0: the job starts from the weights of that many steps of one worker
    from another seed (its spec names the file; the submitter serves it)."""
    con = Console()
    con.rule("[bold]polnet demo --collab")
    con.print(f"chain, node state and logs under {home}")
    with LocalNet(home, collab_demo_params()) as net:
        names = {net.address(SUBMITTER): "submitter",
                 **{net.address(a): n for n, a in WORKERS.items()},
                 **{net.address(v): f"verifier-{i + 1}" for i, v in enumerate(VERIFIERS)}}
        narrate = Narrator(net, names, con, NARRATED)
        before = {n: net.holdings(a) for a, n in names.items()}
        spec, text = write_collab_inputs(home / "data", rounds)
        init = None
        if warm_start:
            con.print(f"pretraining theta_0: {warm_start} steps of one worker (another seed)")
            init = warm_start_inputs(spec, text, warm_start)
        for i, v in enumerate(VERIFIERS, start=1):
            net.start_verifier(f"verifier-{i}", v)
        for name, acct in WORKERS.items():
            net.start_solver(name, acct, "amplify" if name == BYZANTINE else "honest")
        con.print("3 verifiers and 4 workers are up (one byzantine: [red]amplify[/])")
        cid = net.submit_collab("submitter", SUBMITTER, spec, text, reward=200,
                                budget=20, round_duration=90, init_weights=init)
        killed_at: int | None = None
        ok = True
        end = time.monotonic() + timeout
        c = net.c
        try:
            while time.monotonic() < end:
                narrate()
                job = c.collab.get_collab(cid)
                if job.status.name in ("FINISHED", "FAILED"):
                    break
                if killed_at is None and job.round == 1 and job.phase.name == "RUNNING" \
                        and _claimed_sub_job(net, cid, 1, net.address(WORKERS[KILLED])):
                    net.kill(KILLED)
                    killed_at = 1
                    con.print(f"[red]SIGKILL {KILLED} in the middle of round 1")
                elif killed_at is not None and job.round >= killed_at + 2 \
                        and net.procs[KILLED].poll() is not None:
                    net.start_solver(KILLED, WORKERS[KILLED])
                    con.print(f"{KILLED} restarted in round {job.round}: it recomputes "
                              "theta_t over libp2p and claims a free slot")
                net.check_alive()
                time.sleep(1)
            job = c.collab.get_collab(cid)
            ok = job.status.name == "FINISHED"
            if not ok:
                con.print(f"[red]the collaborative job ended {job.status.name} "
                          f"(round {job.round}); logs in {home}/logs")
        except Exception as exc:  # report, then still print balances
            con.print(f"[red]{exc}")
            ok = False
        time.sleep(6)  # let the daemons withdraw what they were credited
        narrate()
        after = {n: net.holdings(a) for a, n in names.items()}
        conserved = net.conserved()
        losses = None
        if ok:
            losses = final_and_solo_loss(home, spec, text, cid, job.outer_hash,
                                         [w for w in WORKERS if w != BYZANTINE], init)
        report = _history(net, cid)
    con.print(report)
    if losses is not None:
        start = f"theta_0 after {warm_start} warm-up steps" if warm_start else "initial"
        con.print(f"held-out loss: {start} {losses['initial']:.4f}; collaborative (4 slots, "
                  f"{rounds} rounds) [bold]{losses['collab']:.4f}[/]; one solver alone for the "
                  f"same steps {losses['solo']:.4f}")
        gain = losses["solo"] - losses["collab"]
        con.print(f"[green]collaborative training is {gain:.4f} below one solver alone: four "
                  "workers' data per round for one worker's wall time" if gain > 0 else
                  f"[yellow]collaborative training is {-gain:.4f} above one solver alone here "
                  "(few rounds from scratch: try --warm-start 100 or more --rounds)")
    paid = print_collab_balances(before, after, con)
    con.print("contracts' token balance equals what they owe: " +
              ("[green]every token accounted for" if conserved else "[red]MISMATCH"))
    return 0 if ok and paid and conserved else 1


def _claimed_sub_job(net: LocalNet, cid: CollabId, r: int, worker: str) -> bool:
    from node.chain.contracts import JobStatus

    rnd = net.c.collab.get_round(cid, r)
    for sub in rnd.sub_jobs:
        if sub:
            job = net.c.market.get_job(sub)
            if job.solver.lower() == worker.lower() and job.status == JobStatus.CLAIMED:
                return True
    return False


def _history(net: LocalNet, cid: CollabId) -> Table:
    from node.roles.collab_progress import read_losses
    from node.roles.collab_submit import collab_report

    rep = collab_report(net.c, cid, read_losses(net.home / "nodes" / "submitter", cid))
    t = Table(title=f"collaborative job {cid}: {rep['status']} (held-out loss of theta_0: "
                    f"{_fmt(rep['initial_loss'])}, as the submitter recorded it)")
    for col in ("round", "tries", "accepted slots", "dropped slots", "outer hash",
                "held-out loss after"):
        t.add_column(col)
    for r in rep["history"]:
        t.add_row(str(r["round"]), str(r["attempt"] + 1), str(r["accepted"]), str(r["dropped"]),
                  (r["outer_hash"] or "-")[:14], _fmt(r["loss"]))
    return t


def _fmt(loss: float | None) -> str:
    return "-" if loss is None else f"{loss:.4f}"


def print_collab_balances(before: dict[str, int], after: dict[str, int], con: Console) -> bool:
    con.print(holdings_table(before, after))
    honest = [n for n in WORKERS if n not in (BYZANTINE, KILLED)]
    ok = all(after[n] > before[n] for n in honest) and after[BYZANTINE] < before[BYZANTINE]
    con.print("[green]the honest workers were paid and the byzantine worker slashed" if ok else
              "[red]settlement did not come out as expected")
    return ok
