"""Compiled contract artifacts and the custom-error table.

Artifacts are ``contracts/out/<Name>.json`` files (``abi``, ``bytecode``,
``deployedBytecode``). The directory is found, in order, from
``$POLNET_ARTIFACTS``, the repository checkout this package lives in, or
``node/chain/_artifacts`` (for an installed wheel that ships them as package data).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import Any

from eth_abi import decode as abi_decode
from eth_utils import keccak, to_checksum_address

from node.chain.abi import canonical_type
from node.errors import ChainError, ContractRevert

ERROR_STRING_SELECTOR = bytes.fromhex("08c379a0")  # Error(string)
PANIC_SELECTOR = bytes.fromhex("4e487b71")  # Panic(uint256)


def artifacts_dir() -> Path:
    env = os.environ.get("POLNET_ARTIFACTS")
    if env:
        return Path(env)
    repo_out = Path(__file__).resolve().parents[2] / "contracts" / "out"
    if repo_out.is_dir():
        return repo_out
    return Path(__file__).resolve().parent / "_artifacts"


@dataclass(frozen=True)
class Artifact:
    name: str
    abi: list[dict[str, Any]]
    bytecode: str
    deployed_bytecode: str


def load_artifact(name: str, directory: Path | None = None) -> Artifact:
    path = (directory or artifacts_dir()) / f"{name}.json"
    try:
        raw = json.loads(path.read_text())
    except FileNotFoundError:
        raise ChainError(
            f"no compiled artifact {path}: run `make contracts` to build the contracts"
        ) from None
    return Artifact(name=raw.get("contractName", name), abi=raw["abi"],
                    bytecode=raw["bytecode"], deployed_bytecode=raw.get("deployedBytecode", ""))


@dataclass(frozen=True)
class ErrorDef:
    name: str
    inputs: tuple[dict[str, Any], ...]
    contract: str = ""

    @property
    def signature(self) -> str:
        return f"{self.name}({','.join(canonical_type(i) for i in self.inputs)})"

    @property
    def selector(self) -> bytes:
        return keccak(text=self.signature)[:4]


@dataclass
class ErrorTable:
    """Maps 4-byte selectors to custom errors, and turns revert data into ContractRevert."""

    by_selector: dict[bytes, ErrorDef] = field(default_factory=dict)

    def add_abi(self, abi: list[dict[str, Any]], contract: str = "") -> None:
        for item in abi:
            if item.get("type") == "error":
                err = ErrorDef(item["name"], tuple(item.get("inputs", [])), contract)
                self.by_selector.setdefault(err.selector, err)

    def decode(self, data: bytes | str | None) -> ContractRevert:
        """A ContractRevert for raw revert data (never raises on garbage)."""
        if isinstance(data, str):
            data = bytes.fromhex(data.removeprefix("0x"))
        if not data:
            return ContractRevert("Reverted", {}, "contract reverted without data")
        sel, body = data[:4], data[4:]
        try:
            if sel == ERROR_STRING_SELECTOR:
                (msg,) = abi_decode(["string"], body)
                return ContractRevert("Error", {"message": msg}, f"contract reverted: {msg}")
            if sel == PANIC_SELECTOR:
                (code,) = abi_decode(["uint256"], body)
                return ContractRevert("Panic", {"code": code},
                                      f"contract panicked with code 0x{code:02x}")
            err = self.by_selector.get(sel)
            if err is not None:
                values = [to_checksum_address(v) if i["type"] == "address" else v
                          for i, v in zip(err.inputs, abi_decode(
                              [canonical_type(i) for i in err.inputs], body), strict=True)]
                names = [i.get("name") or f"arg{n}" for n, i in enumerate(err.inputs)]
                return ContractRevert(err.name, dict(zip(names, values, strict=True)))
        except Exception:  # malformed payload: fall through to the raw form  # noqa: BLE001
            pass
        return ContractRevert("Unknown", {"data": "0x" + data.hex()},
                              f"contract reverted with unknown error 0x{data.hex()}")


@lru_cache(maxsize=8)
def _load_error_table(directory: Path) -> ErrorTable:
    table = ErrorTable()
    errors_json = directory / "errors.json"
    if errors_json.is_file():
        for sel, item in json.loads(errors_json.read_text()).items():
            err = ErrorDef(item["name"], tuple(item.get("inputs", [])), item.get("contract", ""))
            table.by_selector[bytes.fromhex(sel.removeprefix("0x"))] = err
    # ABIs too: errors.json may lag behind, and library errors appear in ABIs.
    for path in sorted(directory.glob("*.json")):
        if path.name == "errors.json":
            continue
        try:
            raw = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(raw, dict) and isinstance(raw.get("abi"), list):
            table.add_abi(raw["abi"], raw.get("contractName", path.stem))
    return table


def load_error_table(directory: Path | None = None) -> ErrorTable:
    return _load_error_table((directory or artifacts_dir()).resolve())
