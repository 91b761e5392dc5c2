"""Contract error names, checked against the compiled ABIs.

A role that treats a revert as benign ("someone else did it first") names the
error; a name no contract has would silently turn that revert into a crash or a
stuck phase. ``errors(...)`` refuses unknown names when the module that calls it
is imported, and ``Runtime.transact_ok`` checks its ``benign`` names again.
"""

from __future__ import annotations

from functools import cache

from node.chain.artifacts import load_error_table
from node.errors import ConfigError


@cache
def known_errors() -> frozenset[str]:
    """Every custom error name in the committed contract artifacts."""
    return frozenset(e.name for e in load_error_table().by_selector.values())


def errors(*names: str) -> tuple[str, ...]:
    """``names`` as a tuple, after checking that some contract declares each one."""
    unknown = [n for n in names if n not in known_errors()]
    if unknown:
        raise ConfigError(f"no contract declares the error(s) {unknown}: fix the name "
                          "(see contracts/out/errors.json) or rebuild the contracts")
    return names
