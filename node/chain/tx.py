"""Sending transactions: local nonces, gas estimation, receipts, decoded reverts.

The simulation before sending is ``eth_estimateGas`` itself: it executes the
call, so one round trip both estimates gas and surfaces a revert (decoded into
:class:`ContractRevert`) before any nonce is spent. A transaction that still
reverts when mined is replayed with ``eth_call`` on its parent block to recover
the reason.

The private key stays inside the eth-account object; nothing here logs,
formats or reprs it.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from eth_account.signers.local import LocalAccount
from eth_typing import ChecksumAddress
from hexbytes import HexBytes
from web3 import Web3
from web3.exceptions import ContractLogicError, TimeExhausted, TransactionNotFound, Web3RPCError
from web3.types import TxParams, TxReceipt

from node.chain.artifacts import ErrorTable
from node.chain.rpc import TRANSPORT_ERRORS, endpoint_of, rpc_guard
from node.errors import ContractRevert, TransactionFailed
from node.logs import get_logger

log = get_logger("polnet.chain.tx")

_NONCE_ERRORS = ("nonce too low", "already known", "replacement transaction underpriced",
                 "nonce too high")


def revert_from(exc: ContractLogicError, errors: ErrorTable) -> ContractRevert:
    data = exc.data
    if isinstance(data, dict):  # some nodes nest it: {"data": "0x..."}
        data = data.get("data")
    if isinstance(data, str) and data.startswith("0x"):
        return errors.decode(data)
    return ContractRevert("Reverted", {}, f"contract reverted: {exc.message or exc}")


def _mined_revert(exc: Web3RPCError) -> tuple[HexBytes, str] | None:
    """(tx hash, revert data) when the node says it mined the transaction and it reverted."""
    resp = exc.rpc_response or {}
    err = resp.get("error") if isinstance(resp, dict) else None
    data = err.get("data") if isinstance(err, dict) else None
    if not isinstance(data, dict) or not isinstance(data.get("txHash"), str):
        return None
    raw = data.get("data")
    return HexBytes(data["txHash"]), raw if isinstance(raw, str) and raw.startswith("0x") else ""


class TxSender:
    """Signs and sends transactions for one account. Thread-safe.

    Nonces are kept locally so that back-to-back transactions do not wait on each
    other; on a nonce error (another process used the account, or a send failed
    half-way) the nonce is re-read from the node and the send retried.
    """

    def __init__(self, w3: Web3, account: LocalAccount, errors: ErrorTable, *,
                 gas_margin: float = 1.2, receipt_timeout: float = 120.0) -> None:
        self.w3 = w3
        self._account = account
        self.errors = errors
        self.gas_margin = gas_margin
        self.receipt_timeout = receipt_timeout
        self._lock = threading.Lock()
        self._nonce: int | None = None
        self._chain_id: int | None = None
        self._fee: tuple[float, int] = (0.0, 0)  # (fetched at, gas price)
        self._url = endpoint_of(w3)

    @property
    def address(self) -> ChecksumAddress:
        return self._account.address

    def __repr__(self) -> str:
        return f"TxSender({self.address})"

    # --- public -----------------------------------------------------------------

    def simulate(self, tx: TxParams) -> int:
        """Gas the call needs; raises ContractRevert if it would revert."""
        call: TxParams = {"from": self.address, **tx}  # type: ignore[typeddict-item]
        try:
            with rpc_guard(self._url):
                # "pending": the block the transaction will land in (number, time)
                return int(self.w3.eth.estimate_gas(call, "pending"))
        except ContractLogicError as exc:
            raise revert_from(exc, self.errors) from None
        except Web3RPCError as exc:
            raise TransactionFailed(f"simulation failed: {exc.message}") from None

    def send(self, tx: TxParams, *, gas: int | None = None) -> TxReceipt:
        """Simulate, sign, send and wait for ``tx`` (``to``/``data``/``value``)."""
        return self.wait(self.submit(tx, gas=gas), tx)

    def submit(self, tx: TxParams, *, gas: int | None = None) -> HexBytes:
        """Simulate, sign and send ``tx`` without waiting; returns its hash. Several
        submits then :meth:`wait` land in one block on a chain with a block time."""
        if gas is None:
            gas = int(self.simulate(tx) * self.gas_margin) + 10_000
        signed: list[HexBytes] = []  # hashes this submit signed, newest last
        for attempt in range(4):
            try:
                return self._sign_and_send(tx, gas, signed)
            except Web3RPCError as exc:
                if attempt < 3 and any(s in exc.message.lower() for s in _NONCE_ERRORS):
                    log.debug("nonce resync", account=self.address, reason=exc.message)
                    self.resync_nonce()
                    # A send whose answer was lost may have landed after all (its resend
                    # is then "nonce too low"): signing it again under a new nonce would
                    # pay twice, so look our own transaction up first.
                    sent = self._landed(signed[-1] if signed else None)
                    if sent is not None:
                        return sent
                    continue
                mined = _mined_revert(exc)
                if mined is not None:
                    # Hardhat mines a reverting transaction and answers the send with the
                    # revert: the nonce is spent and the reason is in the answer.
                    tx_hash, data = mined
                    self.resync_nonce()
                    raise (self.errors.decode(data) if data else self._reason_for_failed(
                        self.w3.eth.get_transaction_receipt(tx_hash), tx)) from None
                raise TransactionFailed(f"transaction rejected by the node: {exc.message}") \
                    from None
        raise AssertionError("unreachable")

    def wait(self, tx_hash: HexBytes, tx: TxParams | None = None) -> TxReceipt:
        try:
            with rpc_guard(self._url):
                receipt = self.w3.eth.wait_for_transaction_receipt(
                    tx_hash, timeout=self.receipt_timeout, poll_latency=0.05)
        except TimeExhausted:
            raise TransactionFailed(
                f"transaction {tx_hash.hex()} not mined after {self.receipt_timeout:.0f} s"
            ) from None
        if receipt["status"] != 1:
            raise self._reason_for_failed(receipt, tx)
        return receipt

    def _landed(self, tx_hash: HexBytes | None) -> HexBytes | None:
        if tx_hash is None:
            return None
        try:
            with rpc_guard(self._url):
                self.w3.eth.get_transaction(tx_hash)
        except TransactionNotFound:
            return None
        return tx_hash

    def resync_nonce(self) -> None:
        with self._lock:
            self._nonce = None

    # --- internals --------------------------------------------------------------

    def _gas_price(self) -> int:
        at, price = self._fee
        if time.monotonic() - at > 2.0:
            price = int(self.w3.eth.gas_price)
            self._fee = (time.monotonic(), price)
        return price

    def _sign_and_send(self, tx: TxParams, gas: int, signed_log: list[HexBytes]) -> HexBytes:
        with self._lock, rpc_guard(self._url):
            if self._chain_id is None:
                self._chain_id = int(self.w3.eth.chain_id)
            if self._nonce is None:
                self._nonce = int(self.w3.eth.get_transaction_count(self.address, "pending"))
            price = self._gas_price()
            full: dict[str, Any] = {
                "to": tx.get("to"), "data": tx.get("data", b""), "value": tx.get("value", 0),
                "gas": gas, "nonce": self._nonce, "chainId": self._chain_id,
                # headroom for base-fee rises between blocks; unused fee is not charged
                "maxFeePerGas": 2 * price + 10**9, "maxPriorityFeePerGas": min(price, 10**9),
            }
            if full["to"] is None:
                del full["to"]
            signed = self._account.sign_transaction(full)
            signed_log.append(HexBytes(signed.hash))
            try:
                tx_hash = self.w3.eth.send_raw_transaction(signed.raw_transaction)
            except BaseException:
                # we cannot know whether the node took it: re-read the nonce next time
                self._nonce = None
                raise
            self._nonce += 1
            return tx_hash

    def _reason_for_failed(self, receipt: TxReceipt, tx: TxParams | None) -> TransactionFailed:
        tx_hash = receipt["transactionHash"].hex()
        if tx is not None:
            call: TxParams = {"from": self.address, **tx,  # type: ignore[typeddict-item]
                              "gas": receipt["gasUsed"] + 100_000}
            # Replay on the state the block left (a transaction ahead of ours in the same
            # block, e.g. a rival claim, is what usually made it revert), then before it.
            mined = int(receipt["blockNumber"])
            for block in (mined, max(mined - 1, 0)):
                try:
                    self.w3.eth.call(call, block_identifier=block)
                except ContractLogicError as exc:
                    return revert_from(exc, self.errors)
                except Web3RPCError:
                    continue
                except TRANSPORT_ERRORS:
                    break
        return TransactionFailed(f"transaction {tx_hash} reverted on chain and its replay at "
                                 "the mined block passes (reason unavailable)")


__all__ = ["TxSender", "revert_from"]
