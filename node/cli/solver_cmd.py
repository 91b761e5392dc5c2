"""`polnet solver run`: earn by training jobs."""

from __future__ import annotations

import typer

from node.cli.common import (
    BootstrapOpt,
    ConfigOpt,
    DevAccountOpt,
    KeystoreOpt,
    ListenOpt,
    MetricsOpt,
    NameOpt,
    ThreadsOpt,
    run_daemon,
    settings_from,
)

app = typer.Typer(help="Run a solver: claim jobs, train with a proof-of-learning trace, "
                       "get paid.", no_args_is_help=True)


@app.command("run")
def run(
    config: ConfigOpt = None,
    name: NameOpt = None,
    dev_account: DevAccountOpt = None,
    keystore: KeystoreOpt = None,
    listen: ListenOpt = None,
    bootstrap: BootstrapOpt = None,
    metrics_port: MetricsOpt = None,
    threads: ThreadsOpt = None,
    behavior: str = typer.Option("honest", "--behavior",
                                 help="Segment behaviour (demos/tests only: e.g. lazy:0.5)."),
    max_jobs: int = typer.Option(1, "--max-jobs", min=1, help="Jobs trained at once."),
    collab_slots: int = typer.Option(
        1, "--collab-slots", min=0, max=64,
        help="Slots to take in each collaborative (DiLoCo) job (0: none)."),
    world_size: int = typer.Option(
        1, "--world-size", min=1, max=64,
        help="Rank processes that train each job together (torch.distributed, gloo); "
             "the ranks get no key."),
    dist_mode: str = typer.Option(
        "ddp", "--dist-mode",
        help="ddp: every rank holds the model; fsdp: FSDP2 shards it over the ranks."),
    duration: float | None = typer.Option(None, "--duration",
                                          help="Stop after this many seconds."),
) -> None:
    """Register + stake if needed, then claim, train, commit and defend jobs until Ctrl-C."""
    from node.roles.solver import Solver

    settings = settings_from(config, name=name or "solver", dev_account=dev_account,
                             keystore=keystore, listen=listen, bootstrap=bootstrap,
                             metrics_port=metrics_port, threads=threads)
    run_daemon(settings, "solver", lambda rt: Solver(rt, behavior=behavior, max_jobs=max_jobs,
                                            collab_slots=collab_slots,
                                            world_size=world_size, dist_mode=dist_mode),
               duration)


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="solver")
