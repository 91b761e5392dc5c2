"""`polnet verifier run` and `polnet verifier challenge`: the verifier daemon and
a hand-opened challenge (added to the `verifier` group)."""

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


def run(
    config: ConfigOpt = None,
    name: NameOpt = None,
    dev_account: DevAccountOpt = None,
    keystore: KeystoreOpt = None,
    listen: ListenOpt = None,
    bootstrap: BootstrapOpt = None,
    metrics_port: MetricsOpt = None,
    threads: ThreadsOpt = None,
    world_size: int = typer.Option(
        1, "--world-size", min=1, max=64,
        help="Rank processes that replay each sampled segment, and a jury's disputed "
             "step, together (torch.distributed, gloo; FSDP2 shards the state, each rank "
             "reads only its rows of the checkpoints); the challenger's bisection still "
             "replays on one process."),
    duration: float | None = typer.Option(None, "--duration",
                                          help="Stop after this many seconds."),
) -> None:
    """Register + stake, then replay sampled segments, attest, challenge, play disputes
    and serve on juries until Ctrl-C."""
    from node.roles.verifier import Verifier

    settings = settings_from(config, name=name or "verifier", dev_account=dev_account,
                             keystore=keystore, listen=listen, bootstrap=bootstrap,
                             metrics_port=metrics_port, threads=threads)
    run_daemon(settings, "verifier", lambda rt: Verifier(rt, world_size=world_size), duration)


def challenge(
    job_id: int = typer.Argument(..., help="Job id."),
    segment: int = typer.Argument(..., help="Segment to dispute."),
    config: ConfigOpt = None,
    name: NameOpt = None,
    dev_account: DevAccountOpt = None,
    bootstrap: BootstrapOpt = None,
) -> None:
    """Open a dispute on SEGMENT of JOB by hand (needs the solver's trace over p2p);
    a running `verifier run` with the same --name then plays it."""
    import trio

    from node.chain.ids import JobId
    from node.roles.runtime import Runtime
    from node.roles.verifier_evidence import Evidence

    settings = settings_from(config, name=name or "verifier", dev_account=dev_account,
                             bootstrap=bootstrap)

    async def main() -> None:
        async with Runtime(settings, "verifier") as rt:
            c = rt.chain_client
            ev = None
            with trio.move_on_after(30):
                while ev is None:
                    ev = await Evidence(rt).for_job(JobId(job_id))
                    await trio.sleep(0.5)
            if ev is None:
                raise typer.BadParameter(f"no trace of job {job_id} was announced in 30 s")
            start, end = await ev.committed(segment), await ev.committed(segment + 1)
            did = await rt.chain(c.market.challenge, job_id, segment, start.leaf,
                                 list(start.proof), end.leaf, list(end.proof))
            typer.echo(f"dispute {did} opened on job {job_id} segment {segment}")

    trio.run(main)


def register(root: typer.Typer) -> None:
    from node.cli.verifier_cmd import verifier_app

    verifier_app.command("run")(run)
    verifier_app.command("challenge")(challenge)
