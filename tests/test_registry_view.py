"""Off-chain entitlements cost stake (issue 37): what the node learns from the chain.

Before: every registered node got the reserved serving slots and could announce
`outer_state`; registering costs gas only (20 registrations took 0.9 s), so two
free registrations could hold the 16 reserved slots as strangers held theirs.
Now `RegistryView` (what `Runtime` feeds to the p2p layer every 5 s) lists as
staked only nodes whose free + locked stake reaches the lower of the minimum
verifier and solver stakes, on a real anvil; and its RPC cost follows events.
"""

from __future__ import annotations

from typing import Any

from devnet.params import TOKEN
from devnet.testing import LocalChain
from node.chain.contracts import VERIFIER
from node.roles.registry_view import RegistryView


def test_registration_alone_earns_no_entitlement(chain: LocalChain) -> None:
    c = chain
    reader = c[0]
    view = RegistryView(reader)
    lookups: list[str] = []
    node_of = reader.registry.node_of

    def counted(who: str) -> Any:
        lookups.append(who)
        return node_of(who)

    reader.registry.node_of = counted  # type: ignore[method-assign]
    c[1].registry.register(VERIFIER, "peer-staked", ["/ip4/127.0.0.1/tcp/1"])
    c[1].stake(50 * TOKEN)
    c[2].registry.register(VERIFIER, "peer-gas-only", [])  # the attacker: gas, no stake
    c[3].registry.register(VERIFIER, "peer-dust", [])
    c[3].stake(10 * TOKEN)  # below the minimum
    view.refresh()
    assert view.min_stake == 50 * TOKEN
    assert view.staked() == {"peer-staked"}
    assert {p for p, _ in view.peers()} == {"peer-staked", "peer-gas-only", "peer-dust"}
    assert {p for p, _ in view.peers(exclude=c.addresses[1])} == {"peer-gas-only",
                                                                   "peer-dust"}
    # No new event, no lookup: the cost follows events, not peers or requests.
    n = len(lookups)
    view.refresh()
    assert len(lookups) == n
    # Stake moves the entitlement both ways: the dust node tops up, the staked one
    # starts unbonding everything.
    c[3].stake(40 * TOKEN)
    c[1].registry.request_unbond(50 * TOKEN)
    view.refresh()
    assert view.staked() == {"peer-dust"}
    assert sorted(lookups[n:]) == sorted({c.addresses[1].lower(), c.addresses[3].lower()})
