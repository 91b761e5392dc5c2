"""`polnet demo`: a whole local network run to settlement."""

from __future__ import annotations

from pathlib import Path

import typer


def demo(
    home: Path = typer.Option(Path(".demo"), "--home",
                              help="Where the demo keeps chain, node state and logs "
                                   "(wiped at start)."),
    timeout: float = typer.Option(900.0, "--timeout", help="Give up after this many seconds."),
) -> None:
    """Start a devnet, 3 verifiers, an honest and a cheating solver and a submitter; post
    two jobs (CNN on digits, LM on text) and run them to settlement."""
    from node.demo import run_demo

    raise typer.Exit(run_demo(home.resolve(), timeout))


def register(root: typer.Typer) -> None:
    root.command("demo")(demo)
