"""`polnet explorer`: browse jobs, disputes and nodes in a web browser (read-only)."""

from __future__ import annotations

from pathlib import Path

import typer

from node.cli.common import ConfigOpt, settings_from


def register(app: typer.Typer) -> None:
    @app.command("explorer")
    def explorer(
        config: ConfigOpt = None,
        port: int = typer.Option(8600, "--port", help="Port to serve on (0: any free one)."),
        host: str = typer.Option("127.0.0.1", "--host",
                                 help="Address to bind; beyond loopback needs --public."),
        public: bool = typer.Option(False, "--public",
                                    help="Allow --host beyond loopback (other machines can "
                                         "then browse every node's peer id and addresses)."),
        home: Path | None = typer.Option(None, "--home",
                                         help="Where nodes keep their files (default: "
                                              "POLNET_HOME), for the loss curves."),
    ) -> None:
        """Serve the job explorer: jobs with state, reward, solver, sampled segments,
        attestations and payouts; a loss curve per job; disputes with their bisection
        range per round, clocks and votes; nodes with stake, delivered work and slashes.

        Reads the chain of the deployment in your config (`polnet devnet up` writes one)
        and never sends a transaction. Open the printed URL in a browser."""
        from node.chain.client import ChainClient
        from node.chain.deployment import Deployment
        from node.explorer.index import ChainIndex
        from node.explorer.server import ExplorerServer, check_bind

        warning = check_bind(host, public)  # before touching the chain: a refusal is cheap
        if warning:
            typer.secho(warning, fg=typer.colors.YELLOW, err=True)
        s = settings_from(config)
        c = ChainClient.from_deployment(Deployment.load(s.deployment_path), None, s.rpc_url,
                                        s.expected_chain_id, rpc=s.rpc)
        srv = ExplorerServer(ChainIndex(c, home or s.home), host, port, public=public)
        typer.echo(f"polnet explorer on {srv.url} (chain {c.chain_id}); Ctrl-C stops it")
        try:
            srv.serve_forever()
        except KeyboardInterrupt:
            pass
        finally:
            srv.server_close()
