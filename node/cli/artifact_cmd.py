"""`polnet artifact put | get | ls | gc`: the content-addressed store and p2p fetching.

Every command acts on node NAME's store (``HOME/nodes/NAME/p2p/store``), the one its
daemon serves from: `polnet artifact ls --name solver` lists what `polnet solver run`
holds.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer

from node.cli.common import BootstrapOpt, ConfigOpt, NameOpt, settings_from

if TYPE_CHECKING:
    from node.store import ArtifactStore


def _store(config: Path | None, name: str | None) -> ArtifactStore:
    from node.store import ArtifactStore  # noqa: PLC0415

    s = settings_from(config, name=name)
    return ArtifactStore(s.p2p_dir / "store", s.p2p.max_artifact_size)


def register(app: typer.Typer) -> None:
    art_app = typer.Typer(help="Content-addressed artifacts (id = sha256 of the bytes).",
                          no_args_is_help=True)

    @art_app.command("put")
    def put(
        file: Annotated[Path, typer.Argument(exists=True, dir_okay=False)],
        config: ConfigOpt = None,
        name: NameOpt = None,
        pin: Annotated[str | None, typer.Option(help="Pin reason, e.g. job:42.")] = None,
    ) -> None:
        """Store FILE and print its artifact id."""
        store = _store(config, name)
        aid = store.put_file(file)
        if pin:
            store.pin(aid, pin)
        typer.echo(aid)

    @art_app.command("get")
    def get(
        artifact_id: Annotated[str, typer.Argument(metavar="ID")],
        peer: Annotated[list[str] | None, typer.Option(
            "--peer", help="Provider multiaddr (/ip4/../tcp/../p2p/ID); repeatable. "
                           "Without it, providers come from the DHT via --bootstrap.")] = None,
        bootstrap: BootstrapOpt = None,
        out: Annotated[Path | None, typer.Option("--out", help="Copy the artifact here.")] = None,
        config: ConfigOpt = None,
        name: NameOpt = None,
    ) -> None:
        """Fetch an artifact from peers (verified chunk by chunk, resumable)."""
        import trio  # noqa: PLC0415
        from rich.progress import (  # noqa: PLC0415
            BarColumn,
            DownloadColumn,
            Progress,
            TransferSpeedColumn,
        )

        from node.p2p.host import PolnetNode  # noqa: PLC0415

        s = settings_from(config, name=name, bootstrap=bootstrap)

        async def main() -> None:
            async with PolnetNode(s.p2p_dir, s.p2p) as node:
                with Progress("[progress.description]{task.description}", BarColumn(),
                              DownloadColumn(), TransferSpeedColumn()) as bar:
                    task = bar.add_task(artifact_id[:12], total=None)

                    def progress(done: int, total: int) -> None:
                        bar.update(task, completed=done, total=total)

                    await node.fetch(artifact_id, peers=peer or None, progress=progress)
                path = node.store.path(artifact_id)
                if out is not None:
                    await trio.to_thread.run_sync(shutil.copyfile, path, out)
                    path = out
                typer.echo(str(path))

        trio.run(main)

    @art_app.command("ls")
    def ls(config: ConfigOpt = None, name: NameOpt = None) -> None:
        """List stored artifacts with their size and pins."""
        store = _store(config, name)
        pins = store.pins()
        ids = store.ids()
        if not ids:
            typer.echo(f"no artifacts in {store.root}")
            return
        typer.echo(f"{'artifact id (sha256 of the bytes)':<64}  {'bytes':>14}  kept for")
        for aid in ids:
            why = ", ".join(pins.get(aid, [])) or "nothing (`polnet artifact gc` deletes it)"
            typer.echo(f"{aid}  {store.size(aid):>14,}  {why}")

    @art_app.command("gc")
    def gc(config: ConfigOpt = None, name: NameOpt = None) -> None:
        """Delete artifacts no pin keeps."""
        removed = _store(config, name).gc()
        typer.echo(f"removed {len(removed)} artifact(s)")

    app.add_typer(art_app, name="artifact")
