"""node.chain: connection errors, deploy, generated bindings, tx sender, revert decoding."""

from __future__ import annotations

import threading

import pytest
from eth_abi import encode as abi_encode

from devnet.testing import LocalChain
from node.chain.artifacts import ErrorTable, load_error_table
from node.chain.client import ChainClient
from node.chain.tx import TxSender
from node.errors import ConfigError, ContractRevert, RpcUnavailable, TransactionFailed


def test_rpc_down_says_how_to_fix() -> None:
    from devnet.anvil import free_port

    with pytest.raises(RpcUnavailable, match="polnet devnet up"):
        ChainClient(f"http://127.0.0.1:{free_port()}", timeout=1)


def test_bad_key_is_not_echoed() -> None:
    from node.chain.client import as_account

    with pytest.raises(ConfigError) as e:
        as_account("0xnot-a-key-but-secret-looking")
    assert "secret" not in str(e.value)


def test_private_keys_never_in_reprs(chain: LocalChain) -> None:
    key = chain.deployment.accounts[1].private_key
    c = chain[1]
    texts = [repr(c), str(c), repr(c.sender), repr(c.market), repr(chain.deployment),
             str(chain.deployment), repr(chain.deployment.accounts[1])]
    try:
        c.token.mint(c.address, 1)  # not the owner
    except ContractRevert as e:
        texts += [str(e), repr(e), repr(e.error_args)]
    for t in texts:
        assert key.removeprefix("0x") not in t


def test_deploy_and_generated_calls(chain: LocalChain) -> None:
    owner, other = chain[0], chain[1]
    tok = owner.deploy("PolToken")
    assert tok.functions()[:3] and "mint" in tok.functions()
    tok.mint(other.address, 123)  # generated: a sent transaction
    assert tok.balanceOf(other.address) == 123  # generated: an eth_call
    with pytest.raises(AttributeError):
        tok.noSuchFunction  # noqa: B018


def test_revert_decoded_from_simulation(chain: LocalChain) -> None:
    c = chain[2]
    with pytest.raises(ContractRevert) as e:
        c.token.mint(c.address, 1)
    assert e.value.error == "OwnableUnauthorizedAccount"
    assert e.value.error_args == {"account": c.address}


def test_revert_decoded_from_failed_receipt(chain: LocalChain) -> None:
    c = chain[2]
    nonce = chain.w3.eth.get_transaction_count(c.address)
    # a fixed gas limit skips the simulation, so the transaction is mined and fails
    with pytest.raises(ContractRevert) as e:
        c.token.transact("mint", c.address, 1, gas=100_000)
    assert e.value.error == "OwnableUnauthorizedAccount"
    assert chain.w3.eth.get_transaction_count(c.address) == nonce + 1  # it was mined


def test_revert_caused_by_a_rival_in_the_same_block_is_decoded(chain: LocalChain) -> None:
    """Two solvers claim one job in the same block: the second reverts on chain, and
    only a replay on the state that block left says why (issue 12: it used to replay
    before the block, where the call passes, and report "reason unavailable")."""
    from devnet.testing import job_terms
    from node.chain.contracts import SOLVER

    a, b = chain.join(2, SOLVER, 500 * 10**18), chain.join(3, SOLVER, 500 * 10**18)
    job = chain[1].post_job(job_terms())
    chain.rpc("evm_setAutomine", False)
    try:
        assert a.sender is not None and b.sender is not None
        ha = a.sender.submit(a.market.tx_params("claimJob", job), gas=300_000)
        hb = b.sender.submit(b.market.tx_params("claimJob", job), gas=300_000)
        chain.mine()
    finally:
        chain.rpc("evm_setAutomine", True)
    a.sender.wait(ha)
    with pytest.raises(ContractRevert) as e:
        b.sender.wait(hb, b.market.tx_params("claimJob", job))
    assert e.value.error == "InvalidStatus"


def test_error_table_builtin_and_unknown() -> None:
    t = ErrorTable()
    e = t.decode(bytes.fromhex("08c379a0") + abi_encode(["string"], ["nope"]))
    assert (e.error, e.error_args) == ("Error", {"message": "nope"})
    e = t.decode(bytes.fromhex("4e487b71") + abi_encode(["uint256"], [0x11]))
    assert (e.error, e.error_args["code"]) == ("Panic", 0x11)
    assert t.decode(b"\xde\xad\xbe\xef").error == "Unknown"
    assert t.decode(b"").error == "Reverted"
    table = load_error_table()
    assert any(err.name == "Unauthorized" for err in table.by_selector.values())


def test_concurrent_sends_share_nonces(chain: LocalChain) -> None:
    c = chain[0]
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(5):
                c.token.transfer(chain.addresses[3], 1)
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    before = c.token.balance_of(chain.addresses[3])
    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    assert c.token.balance_of(chain.addresses[3]) == before + 20


def test_recovers_from_nonce_too_low(chain: LocalChain) -> None:
    c = chain[4]
    c.token.transfer(chain.addresses[5], 1)  # primes the local nonce
    # another process uses the same account behind our back
    other = TxSender(chain.w3, chain.accounts[4], c.errors)
    other.send(c.token.tx_params("transfer", chain.addresses[5], 1))
    c.token.transfer(chain.addresses[5], 1)  # stale nonce: resynced, not failed
    assert c.token.balance_of(chain.addresses[5]) >= 3


def test_read_only_client_cannot_send(chain: LocalChain) -> None:
    with pytest.raises(TransactionFailed.__mro__[1]):  # ChainError
        chain.reader.token.transfer(chain.addresses[1], 1)
