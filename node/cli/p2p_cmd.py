"""`polnet p2p id | serve`: the node's libp2p identity, and a node serving the store."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

HOME_OPT = typer.Option("--home", envvar="POLNET_HOME", help="Node directory (key + store).")
DEFAULT_HOME = Path.home() / ".polnet"


def register(app: typer.Typer) -> None:
    p2p_app = typer.Typer(help="Peer-to-peer node: identity, serving artifacts.",
                          no_args_is_help=True)

    @p2p_app.command("id")
    def id_(home: Annotated[Path, HOME_OPT] = DEFAULT_HOME) -> None:
        """Print this node's peer id (creating its key on first run, mode 0600)."""
        from node.p2p.config import NodeConfig  # noqa: PLC0415 - libp2p is heavy
        from node.p2p.identity import load_or_create_keypair, peer_id_of  # noqa: PLC0415

        cfg = NodeConfig.in_dir(home)
        typer.echo(peer_id_of(load_or_create_keypair(cfg.key_path)).to_base58())

    @p2p_app.command("serve")
    def serve(
        home: Annotated[Path, HOME_OPT] = DEFAULT_HOME,
        listen: Annotated[str, typer.Option(help="Multiaddr to listen on.")] =
            "/ip4/127.0.0.1/tcp/0",
        bootstrap: Annotated[list[str] | None, typer.Option(
            help="Bootstrap peer multiaddr (/ip4/../tcp/../p2p/ID); repeatable.")] = None,
    ) -> None:
        """Serve the local store until Ctrl-C; prints the multiaddr to fetch from."""
        import trio  # noqa: PLC0415

        from node.p2p.config import NodeConfig  # noqa: PLC0415
        from node.p2p.host import PolnetNode  # noqa: PLC0415
        from node.p2p.serve import serve as run_serve  # noqa: PLC0415

        cfg = NodeConfig.in_dir(home, listen=listen, bootstrap=list(bootstrap or []))

        def ready(node: PolnetNode) -> None:
            typer.echo(f"peer id: {node.peer_id.to_base58()}")
            for a in node.addrs:
                typer.echo(f"listening: {a}")
            n = len(node.store.ids())
            typer.echo(f"serving {n} artifact(s) from {cfg.store_root}; Ctrl-C to stop")

        try:
            trio.run(run_serve, cfg, (), ready)
        except KeyboardInterrupt:
            typer.echo("stopped")

    app.add_typer(p2p_app, name="p2p")
