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


def test_seats_follow_live_disputes(chain: LocalChain) -> None:
    """The bookkeeping behind seats, fed the events a dispute emits (their real names
    and argument names; the juror test in test_juror_slow_provider.py sees them come
    from a real dispute): the job's committee, the parties and the jury are seated
    while the dispute is live, and not once it is resolved; an outer jury's case
    likewise until tallied."""
    from node.chain.events import ChainEvent

    view = RegistryView(chain[0])
    addr = [a.lower() for a in chain.addresses]
    for i in range(8):
        chain[i].registry.register(VERIFIER, f"peer-{i}", [])
    view.refresh()

    def ev(contract: str, name: str, **args: Any) -> None:
        view._take(ChainEvent(contract, name, args, 0, "0x", 0, "0x"), set())

    ev("JobMarket", "CommitteeDrawn", jobId=3, round=0, committee=[addr[1], addr[2]])
    assert view.seats() == set()  # a committee alone is no seat: no dispute yet
    ev("DisputeGame", "DisputeOpened", id=9, jobId=3, solver=addr[3], challenger=addr[4])
    ev("DisputeGame", "JuryDrawn", id=9, jury=[addr[5], addr[6]])
    assert view.seats() == {f"peer-{i}" for i in (1, 2, 3, 4, 5, 6)}
    ev("JobMarket", "DisputeResolved", jobId=3, disputeId=9)  # the market's echo: not it
    assert len(view.seats()) == 6
    ev("DisputeGame", "DisputeResolved", id=9, jobId=3)
    assert view.seats() == set()
    ev("OuterJury", "JuryDrawn", caseId=1, jury=[addr[7]])
    assert view.seats() == {"peer-7"}
    ev("OuterJury", "CaseTallied", caseId=1)
    assert view.seats() == set()
