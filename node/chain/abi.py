"""Function encoding/decoding straight from the ABI with eth_abi.

web3's ``encode_abi`` / ``ContractFunction`` re-derive every element's signature
on each call (milliseconds each); daemons and the invariant test make thousands
of calls, so each function's selector and types are worked out once here.
Structs decode to named tuples (field names as in Solidity).
"""

from __future__ import annotations

from collections import namedtuple
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from typing import Any

from eth_abi import decode as abi_decode
from eth_abi import encode as abi_encode
from eth_utils import keccak, to_checksum_address


def canonical_type(item: dict[str, Any]) -> str:
    """ABI type with tuples expanded: ``(uint256,bytes32)[]``."""
    typ: str = item["type"]
    if typ.startswith("tuple"):
        inner = ",".join(canonical_type(c) for c in item.get("components", []))
        return f"({inner}){typ[len('tuple'):]}"
    return typ


@cache
def _struct_type(name: str, fields: tuple[str, ...]) -> type:
    return namedtuple(name, fields, rename=True)  # type: ignore[misc]  # noqa: PYI024


def _shape(item: dict[str, Any], value: Any) -> Any:
    """Decoded value -> named tuples for structs, checksum addresses."""
    typ: str = item["type"]
    if typ.endswith("]"):
        inner = {**item, "type": typ[: typ.rindex("[")]}
        return [_shape(inner, v) for v in value]
    if typ == "tuple":
        comps = item.get("components", [])
        name = (item.get("internalType") or "struct Struct").split(".")[-1].split()[-1]
        cls = _struct_type(name.strip("[]") or "Struct",
                           tuple(c.get("name") or f"field{i}" for i, c in enumerate(comps)))
        return cls(*(_shape(c, v) for c, v in zip(comps, value, strict=True)))
    if typ == "address":
        return to_checksum_address(value)
    return value


@dataclass(frozen=True)
class FunctionABI:
    name: str
    selector: bytes
    inputs: tuple[dict[str, Any], ...]
    outputs: tuple[dict[str, Any], ...]
    mutability: str

    @classmethod
    def from_abi(cls, item: dict[str, Any]) -> FunctionABI:
        inputs = tuple(item.get("inputs", []))
        sig = f"{item['name']}({','.join(canonical_type(i) for i in inputs)})"
        return cls(item["name"], keccak(text=sig)[:4], inputs, tuple(item.get("outputs", [])),
                   item.get("stateMutability", "nonpayable"))

    @property
    def is_view(self) -> bool:
        return self.mutability in ("view", "pure")

    def encode(self, args: Sequence[Any]) -> bytes:
        if len(args) != len(self.inputs):
            raise TypeError(f"{self.name} takes {len(self.inputs)} arguments, got {len(args)}")
        return self.selector + abi_encode([canonical_type(i) for i in self.inputs], list(args))

    def decode(self, data: bytes) -> Any:
        """Return value: a single output unwrapped, several as a tuple."""
        values = abi_decode([canonical_type(o) for o in self.outputs], data)
        shaped = [_shape(o, v) for o, v in zip(self.outputs, values, strict=True)]
        if len(shaped) == 1:
            return shaped[0]
        return tuple(shaped)


def functions_of(abi: list[dict[str, Any]]) -> dict[str, FunctionABI]:
    """Name -> function; overloaded names are left out (polnet contracts have none)."""
    out: dict[str, FunctionABI] = {}
    seen: set[str] = set()
    for item in abi:
        if item.get("type") != "function":
            continue
        if item["name"] in seen:
            out.pop(item["name"], None)
            continue
        seen.add(item["name"])
        out[item["name"]] = FunctionABI.from_abi(item)
    return out
