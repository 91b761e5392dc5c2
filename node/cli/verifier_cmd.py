"""`polnet verifier ...`: calibrate a job's tolerance, replay a trace segment."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

verifier_app = typer.Typer(help="Check solvers' work: calibrate tolerances, replay segments.",
                           no_args_is_help=True)


@verifier_app.command("calibrate")
def calibrate_cmd(
    spec_path: Annotated[Path, typer.Argument(help="Job spec (TOML or JSON).")],
    dataset: Annotated[Path, typer.Option("--dataset", help="The spec's dataset file.")],
    segments: Annotated[str, typer.Option(help="Comma-separated segments to replay.")] = "0,2",
    safety: Annotated[float, typer.Option(help="rho = safety x largest honest ratio.")] = 5.0,
    subprocess_configs: Annotated[bool, typer.Option(
        "--subprocess/--no-subprocess",
        help="Also run the env-var configs (ATEN_CPU_CAPABILITY, MKL_*) in subprocesses.",
    )] = True,
) -> None:
    """Re-measure honest drift for SPEC across emulated hardware and print rho/abs."""
    from rich.console import Console  # noqa: PLC0415
    from rich.table import Table  # noqa: PLC0415

    from node.data.stream import context_for_file  # noqa: PLC0415
    from node.spec import load_spec  # noqa: PLC0415
    from verifier.calibrate import calibrate  # noqa: PLC0415
    from verifier.replay import policy_from_spec  # noqa: PLC0415

    spec = load_spec(spec_path)
    ctx = context_for_file(spec, dataset, spec.dataset_hash)  # a file or a shard manifest
    segs = sorted({int(s) for s in segments.split(",") if s.strip()})
    segs = [s for s in segs if s < spec.segment_count] or [0]
    cal, matrix = calibrate(ctx, spec.name or spec.model.family, segs, dataset, safety=safety,
                            subprocess_configs=subprocess_configs,
                            policy=policy_from_spec(spec))
    table = Table(title=f"honest drift, k={spec.checkpoint_interval} (ratio = |R-C| / |R-S|)")
    for col in ("config", "seg", "ratio", "worst tensor", "opt", "unmasked", "masked",
                "loss rel", "pass"):
        table.add_column(col)
    for r in matrix.rows:
        table.add_row(r.config, str(r.segment), f"{r.ratio:.2e}",
                      f"{r.worst_param_ratio:.2e} {r.worst_param}", f"{r.worst_opt_ratio:.2e}",
                      f"{r.unmasked_ratio:.2e}", str(r.masked), f"{r.loss_rel:.1e}",
                      "yes" if r.passed else "[red]NO[/red]")
    console = Console(stderr=True)
    console.print(table)
    cheats = Table(title="cheats (ratio, smallest matters)")
    cheats.add_column("cheat")
    cheats.add_column("ratio")
    for name, ratio in sorted(cal.cheat_min_ratio.items(), key=lambda kv: kv[1]):
        cheats.add_row(name, f"{ratio:.2e}")
    console.print(cheats)
    console.print(f"rho={cal.rho:g} rho_tensor={cal.rho_tensor:g} rho_opt={cal.rho_opt:g} "
                  f"(policy in force: rho={spec.tolerance.rho:g}); margin {cal.margin:.0f}x; "
                  f"false flags: {cal.false_flags or 'none'}")
    typer.echo(json.dumps(cal.to_dict(), sort_keys=True))


@verifier_app.command("replay")
def replay_cmd(
    trace_dir: Annotated[Path, typer.Argument(help="A trace directory (polnet train --out).")],
    segment: Annotated[int, typer.Argument(help="Segment index (0-based).")],
    dataset: Annotated[Path, typer.Option("--dataset", help="The spec's dataset file.")],
    root: Annotated[str | None, typer.Option(
        "--root", help="Trace root to check against (default: the manifest's).")] = None,
    tensors: Annotated[bool, typer.Option("--tensors", help="Per-tensor figures.")] = False,
    world_size: Annotated[int, typer.Option(
        "--world-size", min=1, max=64,
        help="Rank processes that replay it together (torch.distributed, gloo; FSDP2 "
             "shards the state, each rank reads only its rows of the checkpoints). "
             "1: one process.")] = 1,
) -> None:
    """Replay SEGMENT of TRACE_DIR from its checkpoints and print the verdict (exit 2: fail)."""
    from node.data.stream import context_for_file  # noqa: PLC0415
    from node.spec import load_spec  # noqa: PLC0415
    from node.train.trace import SPEC_NAME  # noqa: PLC0415
    from verifier.dist_replay import verify_segment_ranks  # noqa: PLC0415
    from verifier.replay import verify_trace_segment  # noqa: PLC0415

    spec = load_spec(trace_dir / SPEC_NAME)
    ctx = context_for_file(spec, dataset, spec.dataset_hash)  # a file or a shard manifest
    trusted = bytes.fromhex(root.removeprefix("0x")) if root else None
    if world_size > 1:
        ranked = verify_segment_ranks(ctx, trace_dir, segment, world_size, dataset,
                                      root=trusted)
        verdict = ranked.verdict
        typer.echo(f"{world_size} ranks; replayed end state 0x{ranked.end_hash.hex()}; "
                   f"most state bytes a rank held: {max(ranked.held_bytes, default=0)}",
                   err=True)
    else:
        verdict = verify_trace_segment(ctx, trace_dir, segment, trusted)
    typer.echo(verdict.summary(), err=True)
    typer.echo(json.dumps(verdict.to_dict(with_tensors=tensors), sort_keys=True))
    if not verdict.passed:
        raise typer.Exit(2)


def register(app: typer.Typer) -> None:
    app.add_typer(verifier_app, name="verifier")
