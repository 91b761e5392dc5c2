"""`polnet`: the command line of a polnet node.

Each area of the node registers its own commands from a module of its own
(``node/cli/<area>_cmd.py`` exposing ``register(app)``), so this file only
wires them together. Heavy imports (torch, web3, libp2p) happen inside the
commands, keeping ``polnet --help`` fast.
"""

from __future__ import annotations

import importlib

import typer

from node import logs

HELP = """polnet: verifiable neural-network training on an open network.

New here? Start a local network and watch it work:

  make demo                      # devnet, submitter, solvers, verifiers, settlement

Or step by step:

  polnet devnet up               # local chain with contracts deployed
  polnet train examples/cnn_digits.toml   # train a job locally, print its trace root
  polnet job submit SPEC --dataset FILE --reward 100
  polnet solver run              # earn by training jobs
  polnet verifier run            # earn by checking them
  polnet explorer                # browse jobs, disputes and nodes (read-only)

Every command has --help.
"""

app = typer.Typer(help=HELP, no_args_is_help=True, rich_markup_mode="rich",
                  pretty_exceptions_show_locals=False)

_AREAS = ["devnet", "train", "dataset", "verifier", "verifier_daemon", "p2p", "artifact", "job",
          "solver", "dispute", "node", "demo", "explorer", "network"]


@app.callback()
def _root(
    log_json: bool = typer.Option(False, "--log-json", help="Log JSON lines instead of text."),
    log_level: str = typer.Option("INFO", "--log-level", help="DEBUG, INFO, WARNING, ERROR."),
    p2p_log_level: str | None = typer.Option(
        None, "--p2p-log-level",
        help="libp2p's own logs (default: WARNING; DEBUG with --log-level DEBUG)."),
    network: str | None = typer.Option(
        None, "--network",
        help="Use the chain of profile \\[networks.NAME] from --config (RPC URL, chain id, "
             "deployment file): `polnet --network NAME solver run --config FILE`."),
) -> None:
    import os  # noqa: PLC0415

    from node.errors import ConfigError  # noqa: PLC0415

    if network is not None:  # read by every command's settings, like POLNET_NETWORK
        os.environ["POLNET_NETWORK"] = network

    try:
        logs.configure(json=log_json, level=log_level, p2p_level=p2p_log_level)
    except ConfigError as exc:
        raise typer.BadParameter(str(exc)) from None


for _area in _AREAS:
    try:
        _mod = importlib.import_module(f"node.cli.{_area}_cmd")
    except ModuleNotFoundError as exc:  # an area not built yet must not break the CLI
        if exc.name != f"node.cli.{_area}_cmd":
            raise
        continue
    _mod.register(app)


def main() -> None:
    """Entry point: a PolnetError ends in one readable line and exit code 1, not a traceback."""
    from node.errors import PolnetError  # noqa: PLC0415

    try:
        app()
    except PolnetError as exc:
        typer.secho(f"error: {exc}", fg=typer.colors.RED, err=True)
        raise SystemExit(1) from None


if __name__ == "__main__":
    main()
