"""`polnet deploy` (the contracts onto any EVM chain of a network profile) and
`polnet key new` (an encrypted keystore: keys never go on a command line)."""

from __future__ import annotations

import os
from pathlib import Path

import typer

from node.cli.common import ConfigOpt, KeystoreOpt, settings_from

key_app = typer.Typer(help="Accounts as encrypted keystores (eth-account).",
                      no_args_is_help=True)


def register(app: typer.Typer) -> None:
    app.add_typer(key_app, name="key")

    @app.command("deploy")
    def deploy(
        network: str = typer.Option(..., "--network",
                                    help="Profile \\[networks.NAME] in --config: RPC URL, "
                                         "chain id, where to write the deployment file."),
        config: ConfigOpt = None,
        keystore: KeystoreOpt = None,
        params: Path | None = typer.Option(None, "--params",
                                           help="TOML of contract parameters (\\[registry], "
                                                "\\[market], \\[dispute]); default: the devnet's."),
        mint: list[str] | None = typer.Option(None, "--mint",
                                              help="ADDRESS=POL to mint to (repeatable); the "
                                                   "deployer owns the token."),
        force: bool = typer.Option(False, "--force",
                                   help="Overwrite an existing deployment file."),
    ) -> None:
        """Deploy token, registry, market and dispute game onto the network's chain with
        the keystore's account, wire them, and write the deployment file every other
        command then reads (`polnet --network NAME ...`)."""
        from eth_account import Account

        from devnet.deploy import deploy_all
        from devnet.params import load_params
        from node.chain.client import ChainClient
        from node.chain.rpc import make_web3
        from node.errors import ConfigError
        from node.units import wei_to_pol

        s = settings_from(config, network=network, keystore=keystore)
        prof = s.networks[network]
        if prof.deployment.exists() and not force:
            raise ConfigError(f"{prof.deployment} exists (network {network} is deployed): "
                              "pass --force to deploy anew and overwrite it")
        if s.keystore is None:
            raise ConfigError("deploying needs the owner's key as a keystore: --keystore FILE "
                              "(`polnet key new --out FILE` makes one); keys never go on the "
                              "command line")
        mints = [_parse_mint(m) for m in mint or []]
        w3 = make_web3(prof.rpc_url)
        chain_id = int(w3.eth.chain_id)
        if chain_id != prof.chain_id:
            raise ConfigError(f"the node at {prof.rpc_url} is chain {chain_id}, network "
                              f"{network} says {prof.chain_id}: fix the profile or the URL")
        owner = Account.from_key(s.load_private_key())
        p = load_params(params)
        dep = deploy_all(w3, owner, p, rpc_url=prof.rpc_url)
        c = ChainClient(prof.rpc_url, owner, dep, w3=w3)
        for addr, wei in mints:
            c.token.mint_to(addr, wei)
        dep.save(prof.deployment)
        typer.echo(f"deployed on {network} (chain {chain_id}) by {owner.address}")
        for name, addr in dep.contracts.items():
            typer.echo(f"  {name:<13} {addr}")
        for addr, wei in mints:
            typer.echo(f"  minted {wei_to_pol(wei)} POL to {addr}")
        typer.echo(f"deployment file: {prof.deployment}")


def _parse_mint(text: str) -> tuple[str, int]:
    from eth_utils import is_address, to_checksum_address

    from node.cli.job_cmd import pol_to_wei
    from node.errors import ConfigError

    addr, sep, amount = text.partition("=")
    if not sep or not is_address(addr.strip()):
        raise ConfigError(f"--mint {text!r}: give ADDRESS=POL, e.g. 0xAbc...=1000")
    return to_checksum_address(addr.strip()), pol_to_wei(amount, "--mint")


@key_app.command("new")
def key_new(
    out: Path = typer.Option(..., "--out", help="Keystore file to write (mode 0600)."),
) -> None:
    """Create an account and write it as an encrypted keystore; the password comes from
    POLNET_KEYSTORE_PASSWORD. Prints the address (fund it with gas to use it)."""
    from eth_account import Account

    from node.errors import ConfigError

    password = os.environ.get("POLNET_KEYSTORE_PASSWORD")
    if not password:
        raise ConfigError("set POLNET_KEYSTORE_PASSWORD to the password that will encrypt "
                          "the key")
    if out.exists():
        raise ConfigError(f"{out} exists: pick another --out (a keystore is never overwritten)")
    acct = Account.create()
    blob = Account.encrypt(acct.key, password)
    out.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        import json

        json.dump(blob, f)
    typer.echo(acct.address)
