"""`polnet train SPEC`: train a job locally, recording its proof-of-learning trace."""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from node.train.trace import TraceManifest


def register(app: typer.Typer) -> None:
    @app.command("train")
    def train(
        spec_path: Annotated[Path, typer.Argument(
            metavar="SPEC", exists=True, dir_okay=False, help="Job spec (.toml or .json).")],
        out: Annotated[Path | None, typer.Option(
            "--out", help="Trace directory (default: traces/<spec hash>-job<id>). "
                          "Rerun with the same --out to resume.")] = None,
        job_id: int = typer.Option(0, "--job-id", min=0, help="Job id bound into the leaves."),
        dataset: Annotated[Path | None, typer.Option(
            "--dataset", exists=True, dir_okay=False,
            help="Dataset file (default: a built-in dataset whose hash matches the spec).")
        ] = None,
        threads: int = typer.Option(1, "--threads", min=1, help="Torch threads (fixed per "
                                    "run: the trace is only reproducible with the same count)."),
        device: str = typer.Option("cpu", "--device", help="cpu, cuda, cuda:1, ..."),
        behavior: str = typer.Option("honest", "--behavior", help="Testing only: a solver "
                                     "behaviour from node.behaviors, e.g. 'lazy:0.1'."),
        keep_every: int = typer.Option(1, "--keep-every", min=1, max=32, help="Keep a full "
                                       "checkpoint every this many segments (and the last); "
                                       "the others are regenerated when needed."),
    ) -> None:
        """Train SPEC, checkpoint every k steps and print the trace root."""
        manifest, out_dir = _run(spec_path, out, job_id, dataset, threads, device, behavior,
                                 keep_every)
        typer.echo(f"trace root  0x{manifest.root}")
        typer.echo(f"final state 0x{manifest.final_state_hash}")
        typer.echo(f"spec hash   0x{manifest.spec_hash}")
        typer.echo(f"{manifest.segment_count} segments of {manifest.k} steps, "
                   f"final loss {manifest.losses[-1]:.4f}; trace in {out_dir}")


def _run(spec_path: Path, out: Path | None, job_id: int, dataset_path: Path | None,
         threads: int, device: str, behavior: str = "honest",
         keep_every: int = 1) -> tuple[TraceManifest, Path]:
    # Heavy imports here so `polnet --help` stays fast.
    from rich.progress import (  # noqa: PLC0415
        BarColumn,
        MofNCompleteColumn,
        Progress,
        TextColumn,
        TimeElapsedColumn,
    )

    from node.data.stream import context_for_file, is_manifest_file  # noqa: PLC0415
    from node.datasets import builtin_dataset, load_dataset  # noqa: PLC0415
    from node.errors import IntegrityError  # noqa: PLC0415
    from node.spec import load_spec  # noqa: PLC0415
    from node.train import trace  # noqa: PLC0415
    from node.train.behavior import HonestBehavior, SegmentBehavior  # noqa: PLC0415
    from node.train.step import TrainContext  # noqa: PLC0415

    if behavior == "honest":
        chosen: SegmentBehavior = HonestBehavior()
    else:  # the adversarial behaviours live with the verifier's tests of them
        from node.behaviors import make_behavior  # noqa: PLC0415

        chosen = make_behavior(behavior)

    spec = load_spec(spec_path)
    ctx: TrainContext | None = None
    if dataset_path is not None and is_manifest_file(dataset_path):
        if device != "cpu":
            raise IntegrityError("a sharded dataset streams on the CPU device only for now")
        ctx = context_for_file(spec, dataset_path, spec.dataset_hash, threads=threads)
        ds = ctx.dataset
    elif dataset_path is not None:
        ds = load_dataset(dataset_path, spec.dataset_hash)
    else:
        found = builtin_dataset(spec.dataset_hash)
        if found is None:
            raise IntegrityError(
                f"no built-in dataset has hash {spec.dataset_hash}: pass --dataset FILE "
                "(`polnet dataset pack digits|text FILE` builds the built-in ones; "
                "docs/datasets.md shows how to pack your own)")
        ds = found
    out_dir = out or Path("traces") / f"{spec.spec_hash_hex()[:12]}-job{job_id}"
    if ctx is None:
        ctx = TrainContext.create(spec, ds, device=device, threads=threads)
    columns = (TextColumn("[bold]train"), BarColumn(), MofNCompleteColumn(),
               TextColumn("loss {task.fields[loss]}"), TextColumn("{task.fields[rate]} steps/s"),
               TimeElapsedColumn())
    with Progress(*columns, transient=False) as bar:
        task = bar.add_task("train", total=spec.total_steps, loss="-", rate="-")
        start = time.perf_counter()

        def on_segment(p: trace.Progress) -> None:
            rate = (p.step - p.resumed_from) / max(time.perf_counter() - start, 1e-9)
            bar.update(task, completed=p.step, loss=f"{p.segment_loss:.4f}", rate=f"{rate:.1f}")

        manifest = trace.run_training(ctx, out_dir, job_id, behavior=chosen, progress=on_segment,
                                      keep_every=keep_every)
        bar.update(task, completed=spec.total_steps)
    return manifest, out_dir
