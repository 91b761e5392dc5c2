"""`polnet node status [ADDRESS]`: a node's registration and stake as the registry holds it.

Seat-locked stake is what a juror's or attestor's seats would lose to a slash: it is
taken out of free stake when the seat is drawn and given back when the seat ends, so
a node sees here why it cannot unbond or claim with all of its stake.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import typer

from node.cli.common import ConfigOpt, DevAccountOpt, KeystoreOpt, NameOpt

app = typer.Typer(help="Your node as the chain sees it: roles, stake, seats.",
                  no_args_is_help=True)


@app.command("status")
def status(
    address: str = typer.Argument(None, help="Node address (default: this node's account, "
                                             "from --keystore or --dev-account)."),
    config: ConfigOpt = None,
    dev_account: DevAccountOpt = None,
    keystore: KeystoreOpt = None,
    name: NameOpt = None,
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
) -> None:
    """Roles, free / seat-locked / bonded / unbonding stake, when unbonding can be
    withdrawn, and whether the node has a collaborative delivered record. With the
    running node's --name (or its config), also its reachability: public, private
    (behind NAT) or unknown, its relayed addresses and its peers by connection kind."""
    from node.chain.client import ChainClient
    from node.chain.contracts import SOLVER, VERIFIER
    from node.chain.deployment import Deployment
    from node.cli.common import settings_from
    from node.errors import ConfigError
    from node.units import wei_to_pol

    s = settings_from(config, dev_account=dev_account, keystore=keystore, name=name)
    key = s.load_private_key() if address is None else None
    if address is None and key is None:
        raise ConfigError("which node? give an ADDRESS, --keystore FILE or --dev-account N")
    c = ChainClient.from_deployment(Deployment.load(s.deployment_path), key, s.rpc_url,
                                    s.expected_chain_id, rpc=s.rpc)
    who = address or c.address
    n = c.registry.node_of(who)
    if not n.registered:
        raise ConfigError(f"{who} is not registered: a daemon registers itself on start "
                          "(`polnet solver run` / `polnet verifier run`)")
    roles = [r for bit, r in ((SOLVER, "solver"), (VERIFIER, "verifier")) if n.roles & bit]
    delivered = None
    if c.deployment is not None and "CollabMarket" in c.deployment.contracts:
        delivered = c.collab.delivered_of(who)
    data = {"address": who, "roles": roles, "peer_id": n.peer_id,
            "free_stake": n.free_stake, "seat_locked_stake": n.seat_locked_stake,
            "bonded_stake": n.locked_stake, "unbonding_stake": n.unbonding_stake,
            "unbond_available_at": n.unbond_available_at or None,
            "collab_delivered_record": bool(delivered) if delivered is not None else None}
    local = _local_node(s.node_dir, n.peer_id)
    if local is not None:
        data["reachability"] = local.get("reachability")
        data["connections"] = local.get("connections")
    if as_json:
        typer.echo(json.dumps(data))
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"node {who}", show_header=False)
    t.add_row("roles", ", ".join(roles) or "-")
    t.add_row("peer id", n.peer_id or "-")
    t.add_row("free stake", f"{wei_to_pol(n.free_stake)} POL (claims, seats and draws use it)")
    t.add_row("seat-locked", f"{wei_to_pol(n.seat_locked_stake)} POL (held for juror / "
                             "attestor seats until they end: slashable, not withdrawable)")
    t.add_row("bonded", f"{wei_to_pol(n.locked_stake)} POL (solver bonds of claimed jobs)")
    t.add_row("unbonding", f"{wei_to_pol(n.unbonding_stake)} POL" + (
        f", withdrawable {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime(n.unbond_available_at))}"
        " UTC" if n.unbonding_stake else ""))
    if delivered is not None:
        t.add_row("collab record", "delivered (may hold several slots)" if delivered else
                  "none yet (one slot per collaborative job)")
    reach = data.get("reachability")
    if isinstance(reach, dict):
        relays = reach.get("relay_addrs") or []
        t.add_row("reachability", str(reach.get("status")) + (
            f" (confirmed by {len(reach.get('confirmed_by') or [])} peers)"
            if reach.get("status") == "public" else ""))
        t.add_row("relayed addrs", "\n".join(relays) or "-")
        t.add_row("relay service", "on" if reach.get("relay_serving") else "off")
        conns = data.get("connections")
        kinds = list(conns.values()) if isinstance(conns, dict) else []
        t.add_row("peers", ", ".join(f"{kinds.count(kind)} {kind}"
                                     for kind in ("direct", "relayed")))
    Console().print(t)


def _local_node(node_dir: Path, peer_id: str) -> dict[str, Any] | None:
    """The running daemon's node.json in `node_dir`, if it is this node's and alive."""
    import os

    try:
        info = json.loads((node_dir / "node.json").read_text())
        os.kill(int(info["pid"]), 0)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return info if isinstance(info, dict) and info.get("peer_id") == peer_id else None


def register(root: typer.Typer) -> None:
    root.add_typer(app, name="node")
