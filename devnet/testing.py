"""Helpers for tests and demos driving a local anvil: clients per dev account,
snapshots, time travel. Used by ``tests/conftest.py``."""

from __future__ import annotations

from typing import Any

from eth_account import Account
from eth_account.signers.local import LocalAccount
from eth_utils import keccak
from web3 import Web3

from devnet.anvil import AnvilProcess
from node.chain.client import ChainClient
from node.chain.contracts import JobTerms
from node.chain.deployment import Deployment
from node.chain.rpc import make_web3
from node.errors import ChainError
from node.proof import MerkleTree, TraceLeaf, build_trace_tree

TOKEN = 10**18
FAKE_INIT = keccak(b"state0")  # S_0 of every fake trace below


def job_terms(reward: int = 100 * TOKEN, budget: int = 30 * TOKEN, duration: int = 3600,
              segments: int = 12, k: int = 5, init: bytes = FAKE_INIT,
              spec: bytes = keccak(b"spec"), data: bytes = keccak(b"dataset")) -> JobTerms:
    """Terms of a contract-level test job (no real training behind it)."""
    return JobTerms(spec_hash=spec, dataset_hash=data, reward=reward,
                    verification_budget=budget, solve_duration=duration,
                    total_steps=segments * k, steps_per_segment=k, init_state_hash=init)


def fake_trace(job_id: int, segments: int = 12, k: int = 5, tag: str = "state",
               init: bytes = FAKE_INIT) -> tuple[list[TraceLeaf], MerkleTree]:
    """A trace of made-up state hashes whose leaf 0 is ``init`` (the job's S_0);
    ``tag`` varies the later states (two solvers, or an honest and a faked trace)."""
    states = [init] + [keccak(f"{tag}{i}".encode()) for i in range(1, segments + 1)]
    return build_trace_tree(job_id, k, states, [1_000_000 + i for i in range(segments)])


class LocalChain:
    """A deployment on a local anvil, with one ChainClient per dev account.

    ``clients[0]`` is the deployer (token owner). Reverting a snapshot rolls
    nonces back, so :meth:`revert` resyncs every client's local nonce.
    """

    def __init__(self, anvil: AnvilProcess, deployment: Deployment) -> None:
        self.anvil = anvil
        self.deployment = deployment
        self.url = anvil.url
        self.w3: Web3 = make_web3(self.url)
        self.accounts: list[LocalAccount] = [Account.from_key(a.private_key)
                                             for a in deployment.accounts]
        self.clients = [ChainClient(self.url, a, deployment, w3=self.w3)
                        for a in self.accounts]
        self.reader = ChainClient(self.url, None, deployment, w3=self.w3)

    def __getitem__(self, i: int) -> ChainClient:
        return self.clients[i]

    @property
    def addresses(self) -> list[str]:
        return [a.address for a in self.accounts]

    def rpc(self, method: str, *params: Any) -> Any:
        resp = self.w3.provider.make_request(method, list(params))  # type: ignore[arg-type]
        if "error" in resp:
            raise ChainError(f"{method} failed: {resp['error']}")
        return resp["result"]

    def snapshot(self) -> str:
        return str(self.rpc("evm_snapshot"))

    def revert(self, snap: str) -> None:
        """Roll back to ``snap`` (which is consumed: take a new one to revert again)."""
        if not self.rpc("evm_revert", snap):
            raise ChainError(f"evm_revert({snap}) failed: unknown or consumed snapshot")
        for c in self.clients:
            assert c.sender is not None
            c.sender.resync_nonce()

    def mine(self, blocks: int = 1) -> None:
        self.rpc("anvil_mine", hex(blocks))

    def advance(self, seconds: int, blocks: int = 1) -> None:
        """Move the clock ``seconds`` forward and mine ``blocks`` blocks."""
        self.rpc("evm_increaseTime", seconds)
        self.mine(blocks)

    def conservation(self) -> tuple[int, int]:
        """(tokens held by registry + market + dispute game, what they say they owe)."""
        r = self.reader
        held = owed = 0
        for bound in (r.registry, r.market, r.dispute):
            held += r.token.balance_of(bound.address)
            owed += int(bound.call("totalOwed"))
        return held, owed

    def join(self, i: int, roles: int, stake: int, peer_id: str | None = None) -> ChainClient:
        """Register dev account ``i`` with ``roles`` and stake ``stake`` tokens."""
        c = self.clients[i]
        c.registry.register(roles, peer_id or f"12D3KooWdev{i}", [f"/ip4/127.0.0.1/tcp/{4000 + i}"],
                            '{"device":"cpu"}')
        if stake:
            c.stake(stake)
        return c

    def timestamp(self) -> int:
        return int(self.w3.eth.get_block("latest")["timestamp"])
