"""`polnet p2p id | serve`: a node's libp2p identity, and a node serving its store.

Both act on the node NAME under ``POLNET_HOME`` (``HOME/nodes/NAME/p2p``): the same
key and store its daemon (`polnet solver run --name NAME`, ...) uses.
"""

from __future__ import annotations

import contextlib
import json
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Annotated

import typer

from node.cli.common import BootstrapOpt, ConfigOpt, ListenOpt, NameOpt, settings_from

if TYPE_CHECKING:
    from node.config import NodeSettings
    from node.p2p.host import PolnetNode


async def serve(settings: NodeSettings, provide: Sequence[str] = (),
                on_ready: Callable[[PolnetNode], None] | None = None) -> None:
    """Serve the node's store until cancelled, announcing ``provide`` (default: all)."""
    import trio  # noqa: PLC0415

    from node.p2p.host import PolnetNode  # noqa: PLC0415 - libp2p is heavy

    async with PolnetNode(settings.p2p_dir, settings.p2p) as node:
        for aid in provide or node.store.ids():
            try:
                await node.provide(aid)
            except Exception as exc:  # no DHT peers yet: still serve direct requests
                print(f"provide {aid[:12]} failed: {exc!r}", file=sys.stderr)
        if on_ready is not None:
            on_ready(node)
        await trio.sleep_forever()


def register(app: typer.Typer) -> None:
    p2p_app = typer.Typer(help="Peer-to-peer node: identity, serving artifacts.",
                          no_args_is_help=True)

    @p2p_app.command("id")
    def id_(config: ConfigOpt = None, name: NameOpt = None) -> None:
        """Print node NAME's peer id (creating its key on first run, mode 0600)."""
        from node.p2p.identity import load_or_create_keypair, peer_id_of  # noqa: PLC0415

        s = settings_from(config, name=name)
        typer.echo(peer_id_of(load_or_create_keypair(s.p2p_dir / "p2p.key")).to_base58())

    @p2p_app.command("serve")
    def serve_cmd(
        config: ConfigOpt = None,
        name: NameOpt = None,
        listen: ListenOpt = None,
        bootstrap: BootstrapOpt = None,
        provide: Annotated[list[str] | None, typer.Option(
            "--provide", help="Announce only this artifact id on the DHT (repeatable; "
                              "default: every stored one).")] = None,
        as_json: Annotated[bool, typer.Option(
            "--json", help='Print one line {"peer_id", "addrs"} once listening.')] = False,
    ) -> None:
        """Serve node NAME's store until Ctrl-C; prints the multiaddrs to fetch from.

        Serving limits come from the settings: e.g. POLNET_P2P__SERVE__BYTES_PER_SECOND_PER_PEER
        or the p2p.serve table of a --config TOML."""
        import trio  # noqa: PLC0415

        s = settings_from(config, name=name, listen=listen, bootstrap=bootstrap)

        def ready(node: PolnetNode) -> None:
            if as_json:
                typer.echo(json.dumps({"peer_id": node.peer_id.to_base58(),
                                       "addrs": node.addrs}))
                sys.stdout.flush()
                return
            typer.echo(f"peer id: {node.peer_id.to_base58()}")
            for a in node.addrs:
                typer.echo(f"listening: {a}")
            n = len(node.store.ids())
            typer.echo(f"serving {n} artifact(s) from {node.store.root}; Ctrl-C to stop")

        with contextlib.suppress(KeyboardInterrupt):
            trio.run(serve, s, tuple(provide or ()), ready)

    app.add_typer(p2p_app, name="p2p")
