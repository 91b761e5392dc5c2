"""`polnet devnet up|down|status|fund`: a local chain with the contracts deployed."""

from __future__ import annotations

import typer


def register(app: typer.Typer) -> None:
    devnet_app = typer.Typer(help="A local anvil chain with the polnet contracts deployed.",
                             no_args_is_help=True)

    @devnet_app.command("up")
    def up(
        port: int = typer.Option(8545, "--port", help="RPC port on 127.0.0.1."),
        accounts: int = typer.Option(10, "--accounts", min=2, max=100,
                                     help="Funded dev accounts."),
        block_time: float | None = typer.Option(None, "--block-time",
                                                help="Seconds per block (default: mine "
                                                     "on every transaction)."),
        evm: str = typer.Option("anvil", "--evm",
                                help="Local chain: anvil, or hardhat (a second, independent "
                                     "EVM implementation)."),
    ) -> None:
        """Start a local chain (anvil by default) in the background, deploy the contracts,
        fund the dev accounts."""
        import devnet  # noqa: PLC0415 - keep `polnet --help` fast

        dep = devnet.start(port=port, accounts=accounts, block_time=block_time, evm=evm)
        typer.echo(f"devnet up at {dep.rpc_url} (chain id {dep.chain_id})")
        for name, addr in dep.contracts.items():
            typer.echo(f"  {name:<13} {addr}")
        typer.echo(f"{len(dep.accounts)} funded dev accounts; deployment file: "
                   f"{devnet.manager.devnet_dir() / 'deployment.json'}")

    @devnet_app.command("down")
    def down() -> None:
        """Stop the devnet (its chain state is discarded)."""
        import devnet  # noqa: PLC0415

        typer.echo("devnet stopped" if devnet.stop() else "devnet was not running")

    @devnet_app.command("fund")
    def fund(
        address: str = typer.Argument(..., help="The account to fund (0x...), e.g. a "
                                                "keystore's address from `polnet key new`."),
        pol: float = typer.Option(1000.0, "--pol", min=0, help="POL to mint to it."),
        eth: float = typer.Option(10.0, "--eth", min=0, help="ETH to add for gas."),
    ) -> None:
        """Give an account of your own POL and gas on the running devnet (the dev
        accounts are funded at `devnet up`; a fresh keystore's address is not)."""
        import devnet  # noqa: PLC0415
        from node.units import TOKEN  # noqa: PLC0415

        eth_after, pol_after = devnet.manager.fund(address, int(pol * TOKEN), int(eth * TOKEN))
        typer.echo(f"{address}: {eth_after / TOKEN:,.4f} ETH, {pol_after / TOKEN:,.4f} POL")

    @devnet_app.command("status")
    def status() -> None:
        """Is the devnet up; block height; contracts (with a code check); balances."""
        import devnet  # noqa: PLC0415

        st = devnet.status()
        if not st.running:
            typer.echo(f"devnet: {st.problem}")
            raise typer.Exit(1)
        typer.echo(f"devnet up: pid {st.pid}, {st.rpc_url}, chain id {st.chain_id}, "
                   f"block {st.block}")
        for c in st.contracts:
            mark = "ok" if c.has_code else "NO CODE"
            bal = "" if c.token_balance is None else f"  holds {c.token_balance / 1e18:,.4f} POL"
            typer.echo(f"  {c.name:<13} {c.address}  code {mark}{bal}")
        typer.echo("  dev accounts (use one with --dev-account N):")
        for n, (addr, eth, pol) in enumerate(st.accounts):
            typer.echo(f"  {n:>3}  {addr}  {eth / 1e18:,.2f} ETH  {pol / 1e18:,.2f} POL")
        if st.problem:
            typer.echo(f"problem: {st.problem}")
            raise typer.Exit(1)

    app.add_typer(devnet_app, name="devnet")
