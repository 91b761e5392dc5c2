"""Helpers for tests and demos driving a local anvil: clients per dev account,
snapshots, time travel, a module's own deployment, in-process node settings, a tiny
real training job, a Python model of the registry's sortition and a slow (trickling)
artifact provider. Used by ``tests/conftest.py``, the tests and the benches.

Heavy or networked parts (training, libp2p) are imported where they are used, so
that importing this module stays cheap."""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from eth_abi import encode as abi_encode
from eth_account import Account
from eth_account.signers.local import LocalAccount
from eth_utils import keccak
from pydantic import SecretStr
from web3 import Web3

from devnet.anvil import AnvilProcess, dev_accounts
from devnet.deploy import CONTRACTS, deploy_all
from devnet.hardhat import kind as evm_kind
from devnet.params import DevnetParams
from node.chain.artifacts import artifacts_dir
from node.chain.client import ChainClient
from node.chain.contracts import VERIFIER, JobTerms, NodeInfo, Registry
from node.chain.deployment import Deployment
from node.chain.ids import JobId
from node.chain.rpc import make_web3
from node.config import NodeSettings, load_config
from node.errors import ChainError, ContractRevert
from node.proof import MerkleTree, TraceLeaf, build_trace_tree, canonical_json

if TYPE_CHECKING:
    from libp2p.abc import IHost, INetStream
    from libp2p.crypto.keys import KeyPair

    from node.p2p import PolnetNode

TOKEN = 10**18
FAKE_INIT = keccak(b"state0")  # S_0 of every fake trace below


def expect_revert(fn: Any, *args: Any) -> ContractRevert:
    """Call ``fn(*args)``, which must revert with a custom error; return that error."""
    import pytest  # noqa: PLC0415 - only tests call this

    with pytest.raises(ContractRevert) as e:
        fn(*args)
    return e.value


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


def set_balance(w3: Web3, address: str, wei: int) -> None:
    """``anvil_setBalance`` / ``hardhat_setBalance``, whichever the node speaks."""
    resp = w3.provider.make_request(f"{evm_kind(w3)}_setBalance",  # type: ignore[arg-type]
                                    [address, hex(wei)])
    if "error" in resp:
        raise ChainError(f"setBalance failed: {resp['error']}")


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
        self.kind = evm_kind(self.w3)  # 'anvil' or 'hardhat': their dev RPCs differ

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
        """``blocks`` blocks, the clock unmoved (anvil's default; Hardhat would add 1 s each)."""
        if self.kind == "hardhat":
            self.rpc("hardhat_mine", hex(blocks), "0x0")
        else:
            self.rpc("anvil_mine", hex(blocks))

    def pool_snapshot(self) -> int:
        """Take a sortition-tree snapshot as a draw's request would (the registry lets only
        the market, the dispute game and the outer jury; sent as the market through
        impersonation). Returns its block."""
        reg = self.reader.registry
        market = str(reg.call("market"))
        prefix = "hardhat" if self.kind == "hardhat" else "anvil"
        self.rpc(f"{prefix}_impersonateAccount", market)
        self.set_balance(market, 10**18)
        try:
            tx = reg.contract.functions.snapshot().transact({"from": market})
            receipt = self.w3.eth.wait_for_transaction_receipt(tx)
        finally:
            self.rpc(f"{prefix}_stopImpersonatingAccount", market)
        return int(receipt["blockNumber"])

    def fill_dead_pool(self, n: int) -> None:
        """``n`` dead sortition-pool entries in two storage writes (NodeRegistry's
        ``_pool`` length in slot 6 and ``_poolSize`` in slot 1, beside the market's address
        and the last snapshot block: size n, no snapshot yet):
        slots of weight 0, what the tree holds for addresses that staked the minimum
        once and unbonded, their addresses left 0 (a draw never reads the address of
        a slot it cannot land on). Only on a registry whose pool is empty, so every
        tree node under them is 0 too."""
        reg = self.reader.registry
        if int(reg.call("verifierCount")) != 0:
            raise ChainError("fill_dead_pool needs an empty pool")
        self.rpc("anvil_setStorageAt", reg.address, hex(6), f"0x{n:064x}")
        market = int(reg.call("market"), 16)
        self.rpc("anvil_setStorageAt", reg.address, hex(1), f"0x{market | n << 160:064x}")
        self.mine()
        if int(reg.call("verifierCount")) != n:
            raise ChainError("NodeRegistry's storage layout moved: update fill_dead_pool")

    def set_balance(self, address: str, wei: int) -> None:
        """Ether for gas (the node funds only its first accounts)."""
        set_balance(self.w3, address, wei)

    def advance(self, seconds: int, blocks: int = 1) -> None:
        """Move the clock ``seconds`` forward and mine ``blocks`` blocks."""
        self.rpc("evm_increaseTime", seconds)
        self.mine(blocks)

    def conservation(self) -> tuple[int, int]:
        """(tokens held by registry + market + dispute game (+ availability game, collab
        market and outer jury, when deployed), what they say they owe)."""
        r = self.reader
        held = owed = 0
        bounds = [r.registry, r.market, r.dispute]
        if "CollabMarket" in self.deployment.contracts:
            bounds.append(r.collab)
        if "Availability" in self.deployment.contracts:  # bonds of pending requests
            bounds.append(r.availability)
        for bound in bounds:
            held += r.token.balance_of(bound.address)
            owed += int(bound.call("totalOwed"))
        if "OuterJury" in self.deployment.contracts:  # owes nothing, so holds nothing
            held += r.token.balance_of(r.outer_jury.address)
        return held, owed

    def extra(self, i: int, tokens: int) -> ChainClient:
        """Dev account ``i`` past the ones the deployment funded: ether for gas and
        ``tokens`` POL from the deployer, so a test can field more nodes than the
        chain has funded accounts. Its client stays with the chain (a snapshot's
        revert takes the funds back; the next call funds it again)."""
        for acct in dev_accounts(i + 1)[len(self.clients):]:
            self.accounts.append(acct)
            self.clients.append(ChainClient(self.url, acct, self.deployment, w3=self.w3))
        c = self.clients[i]
        self.set_balance(c.address, 10**21)
        if tokens:
            self.clients[0].token.transfer(c.address, tokens)
        return c

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

    def client_of(self, address: str) -> ChainClient:
        """The dev account client with ``address``."""
        return next(c for c in self.clients if c.address == address)

    def attest_majority(self, job_id: JobId) -> list[str]:
        """A strict majority of the round's committee attests (the seed fixed first, past
        the sampling block): the evidence a clean round is paid on. Returns the attestors."""
        m = self.reader.market
        if m.seed_of(job_id) == bytes(32):
            self.mine(max(1, m.get_job(job_id).sample_block - self.w3.eth.block_number + 1))
            self.clients[0].market.fix_seed(job_id)
        committee = m.committee_of(job_id)
        attestors: list[str] = [a for a in committee if not m.has_attested(job_id, a)]
        attestors = attestors[:len(committee) // 2 + 1 - len(m.attestors_of(job_id))]
        for a in attestors:
            self.client_of(a).market.attest(job_id)
        return attestors

    def publish_sample(self, solver: ChainClient, job_id: JobId, leaves: Sequence[TraceLeaf],
                       tree: MerkleTree) -> None:
        """The solver puts every sampled segment's leaves on chain (Availability): the
        evidence a round no committee majority attested is paid on, one disputeGrace later."""
        m, av = self.reader.market, self.reader.availability
        if m.seed_of(job_id) == bytes(32):
            self.mine(max(1, m.get_job(job_id).sample_block - self.w3.eth.block_number + 1))
            solver.market.fix_seed(job_id)
        rnd = m.get_job(job_id).round
        for s in m.sampled_segments(job_id):
            if not av.is_published(job_id, rnd, s):
                solver.availability.publish(job_id, s, leaves[s], tree.proof(s), leaves[s + 1],
                                            tree.proof(s + 1))

    @contextmanager
    def reverting(self) -> Iterator[LocalChain]:
        """This chain, its state reverted to now when the block ends."""
        snap = self.snapshot()
        try:
            yield self
        finally:
            self.revert(snap)


def sha(b: bytes) -> str:
    """An artifact's id: the hex sha256 of its bytes."""
    return hashlib.sha256(b).hexdigest()


# --- a deployment of one's own --------------------------------------------------------


def artifacts_missing() -> list[str]:
    """The contracts whose build artifacts are absent (``make contracts`` makes them)."""
    d = artifacts_dir()
    return [n for n in CONTRACTS if not (d / f"{n}.json").is_file()]


@contextmanager
def own_deployment(anvil: AnvilProcess, params: DevnetParams,
                   deployer: int = 0) -> Iterator[LocalChain]:
    """Fresh contracts with ``params`` on ``anvil`` (its ``params.accounts`` dev accounts
    funded), every bit of it reverted when the block ends."""
    w3 = make_web3(anvil.url)
    snap = str(w3.provider.make_request("evm_snapshot", [])["result"])  # type: ignore[arg-type]
    accts = dev_accounts(params.accounts)
    dep = deploy_all(w3, accts[deployer], params, fund=accts, rpc_url=anvil.url)
    c = LocalChain(anvil, dep)
    try:
        yield c
    finally:
        c.revert(snap)


# --- in-process nodes and a tiny real job ------------------------------------------------


def node_settings(home: Path, c: LocalChain, name: str, account: int, stake: int,
                  bootstrap: list[str] | None = None) -> NodeSettings:
    """Settings of an in-process ``Runtime`` named ``name`` under ``home``, signing as dev
    account ``account`` of ``c``'s deployment (saved once as ``home/deployment.json``)."""
    dep = home / "deployment.json"
    if not dep.exists():
        c.deployment.save(dep)
    return load_config(None, home=home, name=name, deployment=dep,
                       private_key=SecretStr(c.deployment.accounts[account].private_key),
                       poll_interval=0.2, stake=stake, bootstrap=bootstrap or [])


def tiny_mlp_spec(ds_hash: str, steps: int, k: int) -> bytes:
    """The canonical bytes of a tiny MLP spec on the bundled digits (``ds_hash``):
    ``steps`` steps, a checkpoint every ``k``."""
    from node.spec import parse_spec  # noqa: PLC0415

    d = {"name": "mlp", "seed": 3, "dataset_hash": ds_hash,
         "model": {"family": "mlp", "input_dim": 64, "hidden": [32], "num_classes": 10},
         "optimizer": {"name": "sgd", "lr": 0.05}, "batch_size": 32, "total_steps": steps,
         "checkpoint_interval": k, "resources": {"max_memory_mb": 256}}
    return canonical_json(parse_spec(d).model_dump(mode="json"))


def real_job_terms(spec_b: bytes, data: bytes, steps: int, k: int, reward: int = 10 * TOKEN,
                   budget: int = 3 * TOKEN, duration: int = 600) -> JobTerms:
    """Terms of a job that really trains: its S_0 is the spec's real initial state hash."""
    from node.datasets import parse_dataset  # noqa: PLC0415
    from node.spec import parse_spec_json  # noqa: PLC0415
    from node.train.step import TrainContext, initial_state_hash  # noqa: PLC0415

    init = initial_state_hash(TrainContext.create(parse_spec_json(spec_b), parse_dataset(data)))
    return JobTerms(spec_hash=bytes.fromhex(sha(spec_b)), dataset_hash=bytes.fromhex(sha(data)),
                    reward=reward, verification_budget=budget, solve_duration=duration,
                    total_steps=steps, steps_per_segment=k, init_state_hash=init)


# --- the registry's sortition, re-done in Python ------------------------------------------


@dataclass
class PoolView:
    """What a draw reads from the registry, read once."""

    reg: Registry
    pool: list[str]
    nodes: dict[str, NodeInfo]
    min_v: int
    attempts: int

    @classmethod
    def read(cls, reg: Registry) -> PoolView:
        pool: list[str] = list(reg.verifiers())
        return cls(reg, pool, {a: reg.node_of(a) for a in pool},
                   int(reg.call("minVerifierStake")), int(reg.call("DRAW_ATTEMPTS")))

    def draw(self, seed: bytes, want: int, pool_len: int, snapshot: int,
             exclude: Sequence[str]) -> list[str]:
        """INodeRegistry.sortition as its NatSpec states it (the entries' weights as of
        ``snapshot`` read from the registry's tree, ``weightsAt``)."""
        pool, nodes, min_v = self.pool, self.nodes, self.min_v
        pool_len = min(pool_len, len(pool))
        weights = self.reg.weights_at(pool_len, snapshot) if pool_len else []
        total = sum(weights)
        picked: list[str] = []
        cut: list[tuple[int, int]] = []  # landed slots' (prefix start, weight), sorted
        for i in range(want * self.attempts if total else 0):
            gone = sum(w for _, w in cut)
            if len(picked) >= min(want, pool_len) or gone >= total:
                break
            r = int.from_bytes(keccak(abi_encode(["bytes32", "uint256"], [seed, i])), "big")
            x = r % (total - gone)
            for start, w in cut:  # what is left: skip the ranges landed on before
                if x < start:
                    break
                x += w
            slot, start = 0, 0
            while x >= start + weights[slot]:
                start += weights[slot]
                slot += 1
            cut = sorted([*cut, (start, weights[slot])])
            a = pool[slot]
            if a in exclude:
                continue
            n = nodes[a]
            stake = n.free_stake + n.seat_locked_stake  # a seat is still verifier stake
            eligible = n.registered and n.roles & VERIFIER and stake >= min_v
            if n.changed_at > snapshot or not eligible:
                continue
            picked.append(a)
        return picked


def py_sortition(c: LocalChain, seed: bytes, want: int, pool_len: int, snapshot: int,
                 exclude: Sequence[str]) -> list[str]:
    """``registry.sortition(...)`` as the Python model computes it from ``c``'s registry now."""
    return PoolView.read(c.reader.registry).draw(seed, want, pool_len, snapshot, exclude)


# --- a slow artifact provider (a test cheat) ------------------------------------------


@dataclass
class SlowLog:
    """What a slow provider was asked for, and how many chunks it finished sending."""

    manifests: list[str] = field(default_factory=list)
    reads: list[str] = field(default_factory=list)
    completed: int = 0


def trickle_handler(node: PolnetNode,
                    seen: SlowLog | None = None) -> Callable[[INetStream], Awaitable[None]]:
    """An artifact-protocol handler for ``node`` that answers manifests at once, then sends
    every chunk at 1 byte/s (set it with ``node.host.set_stream_handler(PROTOCOL_ID, ...)``);
    what it is asked for goes to ``seen``."""
    import trio  # noqa: PLC0415

    from node.p2p.wire import encode_frame, read_frame, write_payload  # noqa: PLC0415

    log = seen if seen is not None else SlowLog()

    async def handle(stream: INetStream) -> None:
        try:
            while True:
                req = await read_frame(stream)
                if req.get("op") == "manifest":
                    log.manifests.append(str(req["id"]))
                    await write_payload(stream, {"ok": True},
                                        node.store.manifest(req["id"]).to_bytes())
                    continue
                log.reads.append(str(req["id"]))
                data = node.store.read_range(req["id"], req["offset"], req["length"])
                await stream.write(encode_frame({"ok": True, "size": len(data)}))
                for i in range(len(data)):
                    await stream.write(data[i:i + 1])
                    await trio.sleep(1)
                log.completed += 1
        except Exception:
            with suppress(Exception):
                await stream.reset()

    return handle


# --- streams that ask and never consume (a test cheat, issue 37) ----------------------


async def _ask_forever(host: IHost, server: PolnetNode, aid: str, every_s: float,
                       count: dict[str, int]) -> None:
    """One hostile stream: a manifest request every ``every_s``, no chunk ever pulled.
    Cut or refused, it comes straight back on a new stream."""
    import multiaddr  # noqa: PLC0415
    import trio  # noqa: PLC0415
    from libp2p.peer.peerinfo import info_from_p2p_addr  # noqa: PLC0415

    from node.p2p.wire import PROTOCOL_ID, encode_frame, read_frame  # noqa: PLC0415

    info = info_from_p2p_addr(multiaddr.Multiaddr(server.addrs[0]))
    while True:
        try:
            stream = await host.new_stream(info.peer_id, [PROTOCOL_ID])
            while True:
                await stream.write(encode_frame({"op": "manifest", "id": aid}))
                head = await read_frame(stream)
                if not head.get("ok"):
                    count["refused"] += 1
                    break
                count["answered"] += 1
                await stream.read(head["size"])
                await trio.sleep(every_s)
            with trio.CancelScope(shield=True), suppress(Exception):
                await stream.reset()
        except Exception:  # cut by the server: open another one at once
            count["cut"] += 1
            await trio.sleep(0.05)


@asynccontextmanager
async def hostile_streams(server: PolnetNode, aid: str, ids: int = 16, each: int = 4,
                          every_s: float = 0.5,
                          keys: Sequence[KeyPair] = ()) -> AsyncIterator[dict[str, int]]:
    """``ids`` identities (``keys`` first, then fresh ones) x ``each`` streams, each
    asking ``server`` for ``aid``'s manifest every ``every_s`` until the block ends.
    Yields counts: answered, refused, cut."""
    import multiaddr  # noqa: PLC0415
    import trio  # noqa: PLC0415
    from libp2p.crypto.ed25519 import create_new_key_pair  # noqa: PLC0415
    from libp2p.peer.peerinfo import info_from_p2p_addr  # noqa: PLC0415

    from node.p2p.host import make_host  # noqa: PLC0415

    count = {"answered": 0, "refused": 0, "cut": 0}
    async with AsyncExitStack() as stack:
        hosts = []
        for i in range(ids):
            h = make_host(keys[i] if i < len(keys) else create_new_key_pair())
            await stack.enter_async_context(
                h.run(listen_addrs=[multiaddr.Multiaddr("/ip4/127.0.0.1/tcp/0")]))
            await h.connect(info_from_p2p_addr(multiaddr.Multiaddr(server.addrs[0])))
            hosts.append(h)
        async with trio.open_nursery() as nursery:
            for h in hosts:
                for _ in range(each):
                    nursery.start_soon(_ask_forever, h, server, aid, every_s, count)
            try:
                yield count
            finally:
                nursery.cancel_scope.cancel()
