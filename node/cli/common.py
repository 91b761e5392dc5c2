"""Options shared by the commands that run a node (solver, verifier, submitter)."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any

import typer

from node.config import NodeSettings, load_config

ConfigOpt = Annotated[Path | None, typer.Option("--config", help="TOML config file.")]
NameOpt = Annotated[str | None, typer.Option("--name", help="Node name: state in HOME/nodes/NAME.")]
DevAccountOpt = Annotated[int | None, typer.Option(
    "--dev-account", help="Use the devnet's dev key N (see `polnet devnet status`).")]
KeystoreOpt = Annotated[Path | None, typer.Option(
    "--keystore", help="eth-account keystore; password from POLNET_KEYSTORE_PASSWORD.")]
ListenOpt = Annotated[str | None, typer.Option("--listen", help="libp2p listen multiaddr.")]
BootstrapOpt = Annotated[list[str] | None, typer.Option(
    "--bootstrap", help="Bootstrap peer multiaddr (repeatable).")]
MetricsOpt = Annotated[int | None, typer.Option(
    "--metrics-port", help="Serve Prometheus /metrics on 127.0.0.1:PORT.")]
ThreadsOpt = Annotated[int | None, typer.Option("--threads", help="Torch threads.")]


def settings_from(config: Path | None, **flags: Any) -> NodeSettings:
    if flags.get("bootstrap") == []:
        flags["bootstrap"] = None
    return load_config(config, **flags)


def run_daemon(settings: NodeSettings, role: str, make: Callable[[Any], Any],
               duration: float | None) -> None:
    """Run ``make(runtime).run(until)`` on one trio loop inside a started Runtime."""
    import time

    import trio

    from node.roles.runtime import Runtime

    async def main() -> None:
        async with Runtime(settings, role) as rt:
            until = None if duration is None else time.monotonic() + duration
            await make(rt).run(until)

    trio.run(main)
