"""A contract bound to a sender: calls and transactions generated from the ABI.

``bound.fn(*args)`` is an ``eth_call`` for view/pure functions and a sent,
mined transaction (returning the receipt) for the rest, so no wrapper is
hand-copied per function. Typed facades in :mod:`node.chain.contracts` add
signatures on top for the calls the daemons use.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from eth_typing import ChecksumAddress, HexStr
from web3 import Web3
from web3.contract import Contract
from web3.exceptions import ContractLogicError
from web3.logs import DISCARD
from web3.types import BlockIdentifier, EventData, TxParams, TxReceipt, Wei

from node.chain.abi import FunctionABI, functions_of
from node.chain.artifacts import ErrorTable
from node.chain.rpc import endpoint_of, rpc_guard
from node.chain.tx import TxSender, revert_from
from node.errors import ChainError


class Bound:
    def __init__(self, name: str, contract: Contract, sender: TxSender | None,
                 errors: ErrorTable) -> None:
        self.name = name
        self.contract = contract
        self.sender = sender
        self.errors = errors
        self._fns: dict[str, FunctionABI] = functions_of(list(contract.abi))  # type: ignore[arg-type]
        self._url = endpoint_of(contract.w3)

    def __repr__(self) -> str:
        who = self.sender.address if self.sender else "read-only"
        return f"<{self.name} at {self.address} as {who}>"

    @property
    def address(self) -> ChecksumAddress:
        return self.contract.address

    @property
    def w3(self) -> Web3:
        return self.contract.w3

    def functions(self) -> list[str]:
        return sorted(self._fns)

    def fn(self, name: str) -> FunctionABI:
        try:
            return self._fns[name]
        except KeyError:
            raise AttributeError(f"{self.name} has no function {name!r}") from None

    def encode(self, fn: str, *args: Any) -> str:
        return "0x" + self.fn(fn).encode(args).hex()

    def call_params(self, fn: str, *args: Any, sender: str | None = None) -> TxParams:
        params: TxParams = {"to": self.address, "data": HexStr(self.encode(fn, *args))}
        frm = sender or (self.sender.address if self.sender else None)
        if frm:
            params["from"] = Web3.to_checksum_address(frm)
        return params

    def call(self, fn: str, *args: Any, block: BlockIdentifier = "latest",
             sender: str | None = None) -> Any:
        """``eth_call`` of ``fn``; reverts raise ContractRevert."""
        params = self.call_params(fn, *args, sender=sender)
        try:
            with rpc_guard(self._url):
                raw = self.w3.eth.call(params, block_identifier=block)
        except ContractLogicError as exc:
            raise revert_from(exc, self.errors) from None
        return self.fn(fn).decode(bytes(raw))

    def tx_params(self, fn: str, *args: Any, value: int = 0) -> TxParams:
        return {"to": self.address, "data": HexStr(self.encode(fn, *args)), "value": Wei(value)}

    def transact(self, fn: str, *args: Any, value: int = 0, gas: int | None = None) -> TxReceipt:
        """Send ``fn(*args)`` and wait for it; reverts raise ContractRevert."""
        if self.sender is None:
            raise ChainError(f"{self.name}.{fn}: this client has no account to send from")
        return self.sender.send(self.tx_params(fn, *args, value=value), gas=gas)

    def simulate(self, fn: str, *args: Any, value: int = 0) -> int:
        """Gas ``fn(*args)`` would use; raises ContractRevert if it would revert."""
        if self.sender is None:
            raise ChainError(f"{self.name}.{fn}: this client has no account to send from")
        return self.sender.simulate(self.tx_params(fn, *args, value=value))

    def events(self, receipt: TxReceipt, event: str) -> list[EventData]:
        """This contract's ``event`` logs in ``receipt``, decoded."""
        return list(getattr(self.contract.events, event)().process_receipt(receipt,
                                                                          errors=DISCARD))

    def event_arg(self, receipt: TxReceipt, event: str, arg: str) -> Any:
        found = self.events(receipt, event)
        if not found:
            raise ChainError(f"{self.name}: no {event} event in transaction "
                             f"{receipt['transactionHash'].hex()}")
        return found[0]["args"][arg]

    def __getattr__(self, name: str) -> Callable[..., Any]:
        fns = self.__dict__.get("_fns", {})
        f = fns.get(name)
        if f is None:
            raise AttributeError(f"{self.__dict__.get('name', 'contract')} has no function "
                                 f"{name!r}")
        if f.is_view:
            return lambda *args, **kw: self.call(name, *args, **kw)
        return lambda *args, **kw: self.transact(name, *args, **kw)


def batch_call(w3: Web3, calls: list[tuple[Bound, str, tuple[Any, ...]]],
               block: BlockIdentifier = "latest") -> list[Any]:
    """Many view calls in one JSON-RPC batch (one round trip)."""
    tag = block if isinstance(block, str) else hex(int(block))  # type: ignore[arg-type]
    reqs = [("eth_call", [{"to": b.address, "data": b.encode(fn, *args)}, tag])
            for b, fn, args in calls]
    with rpc_guard(endpoint_of(w3)):
        resps = w3.provider.make_batch_request(reqs)  # type: ignore[attr-defined]
    if not isinstance(resps, list):
        raise ChainError(f"batch call failed: {resps.get('error')}")
    results: list[Any] = []
    for (b, fn, _), resp in zip(calls, resps, strict=True):
        if "error" in resp:
            raise ChainError(f"{b.name}.{fn} failed in batch: {resp['error']}")
        results.append(b.fn(fn).decode(bytes.fromhex(resp["result"].removeprefix("0x"))))
    return results
