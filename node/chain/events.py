"""EventWatcher: polls ``eth_getLogs``, decodes, delivers each event exactly once.

Filters are unreliable across node restarts, so the watcher polls block ranges
(bounded in size) from a cursor. The cursor file holds the last block whose
events were all handled, plus the keys ``(tx hash, log index)`` already handled
past it; it is rewritten atomically after every event. A restart (of the
watcher, or of the node behind it) resumes from there: nothing is missed and
nothing handled twice. Transport failures are retried with backoff by
:meth:`EventWatcher.run`; a handler that raises stops the watcher and its event
is delivered again on the next run.

Anvil does not reorg, so neither does this; on a real chain pass
``confirmations`` to stay behind the head.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from eth_utils import event_abi_to_log_topic
from web3 import Web3
from web3.contract import Contract
from web3.exceptions import Web3RPCError
from web3.types import FilterParams, LogReceipt

from node.chain.bound import Bound
from node.chain.rpc import TRANSPORT_ERRORS, endpoint_of, rpc_guard
from node.errors import ChainError, RpcUnavailable
from node.fsutil import atomic_write
from node.logs import get_logger

log = get_logger("polnet.chain.events")

Key = tuple[str, int]


@dataclass(frozen=True)
class ChainEvent:
    contract: str
    event: str
    args: dict[str, Any]
    block_number: int
    tx_hash: str
    log_index: int
    address: str

    @property
    def key(self) -> Key:
        return (self.tx_hash, self.log_index)


@dataclass
class Cursor:
    block: int  # every event at or below this block has been handled
    done: set[Key] = field(default_factory=set)  # handled, in blocks above ``block``

    def to_json(self) -> str:
        return json.dumps({"block": self.block, "done": sorted([h, i] for h, i in self.done)})

    @classmethod
    def from_json(cls, text: str) -> Cursor:
        raw = json.loads(text)
        return cls(int(raw["block"]), {(str(h), int(i)) for h, i in raw.get("done", [])})


class EventWatcher:
    """Watch ``contracts`` (bindings or web3 contracts) for events from ``start_block``."""

    def __init__(self, w3: Web3, contracts: Iterable[Bound | Contract], *,
                 cursor_path: Path | None = None, start_block: int = 0,
                 max_range: int = 500, confirmations: int = 0) -> None:
        self.w3 = w3
        self.max_range = max_range
        self.confirmations = confirmations
        self.cursor_path = cursor_path
        self._url = endpoint_of(w3)
        self._decoders: dict[tuple[str, bytes], tuple[str, Any]] = {}
        self._addresses: list[str] = []
        for c in contracts:
            name, contract = (c.name, c.contract) if isinstance(c, Bound) else \
                (type(c).__name__, c)
            self._addresses.append(contract.address)
            for item in contract.abi:
                if item.get("type") == "event" and not item.get("anonymous"):
                    topic = event_abi_to_log_topic(item)  # type: ignore[arg-type]
                    event_cls = getattr(contract.events, str(item.get("name")))
                    self._decoders[(contract.address.lower(), topic)] = (name, event_cls())
        self.cursor = self._load_cursor(start_block - 1)

    # --- cursor ---------------------------------------------------------------------

    def _load_cursor(self, default_block: int) -> Cursor:
        if self.cursor_path and self.cursor_path.is_file():
            return Cursor.from_json(self.cursor_path.read_text())
        return Cursor(default_block)

    def _save_cursor(self) -> None:
        if self.cursor_path is None:
            return
        self.cursor_path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(self.cursor_path, self.cursor.to_json().encode())

    # --- polling --------------------------------------------------------------------

    def _decode(self, raw: LogReceipt) -> ChainEvent | None:
        if not raw["topics"]:
            return None
        dec = self._decoders.get((raw["address"].lower(), bytes(raw["topics"][0])))
        if dec is None:
            return None
        name, event = dec
        data = event.process_log(raw)
        return ChainEvent(contract=name, event=data["event"], args=dict(data["args"]),
                          block_number=int(raw["blockNumber"]),
                          tx_hash="0x" + bytes(raw["transactionHash"]).hex(),
                          log_index=int(raw["logIndex"]), address=raw["address"])

    def fetch(self, from_block: int, to_block: int) -> list[ChainEvent]:
        """Decoded events in [from_block, to_block], in chain order (no cursor involved)."""
        params: FilterParams = {"fromBlock": from_block, "toBlock": to_block,
                                "address": self._addresses}  # type: ignore[typeddict-item]
        with rpc_guard(self._url):
            try:
                raws = self.w3.eth.get_logs(params)
            except Web3RPCError as exc:
                raise ChainError(f"eth_getLogs {from_block}..{to_block} failed: "
                                 f"{exc.message}") from None
        out = [e for e in map(self._decode, raws) if e is not None]
        out.sort(key=lambda e: (e.block_number, e.log_index))
        return out

    def poll(self, handler: Callable[[ChainEvent], None] | None = None) -> list[ChainEvent]:
        """Deliver every new event up to the head once, to ``handler``; return them.

        Raises RpcUnavailable if the node cannot be reached (the cursor stays valid).
        """
        with rpc_guard(self._url):
            head = int(self.w3.eth.block_number) - self.confirmations
        delivered: list[ChainEvent] = []
        while self.cursor.block < head:
            lo = self.cursor.block + 1
            hi = min(head, lo + self.max_range - 1)
            for ev in self.fetch(lo, hi):
                if ev.key in self.cursor.done:
                    continue
                if handler is not None:
                    handler(ev)
                self.cursor.done.add(ev.key)
                self._save_cursor()
                delivered.append(ev)
            self.cursor = Cursor(hi)
            self._save_cursor()
        return delivered

    def run(self, handler: Callable[[ChainEvent], None], stop: threading.Event, *,
            interval: float = 0.5, max_backoff: float = 10.0) -> None:
        """Poll until ``stop`` is set, riding out RPC outages with exponential backoff."""
        backoff = interval
        while not stop.is_set():
            try:
                self.poll(handler)
                backoff = interval
            except (RpcUnavailable, *TRANSPORT_ERRORS) as exc:  # type: ignore[misc]
                log.warning("rpc unavailable; retrying", error=str(exc), retry_in=backoff,
                            cursor=self.cursor.block)
                stop.wait(backoff)
                backoff = min(backoff * 2, max_backoff)
                continue
            stop.wait(interval)
