"""The one bounded JSON decoder for bytes that cross a trust boundary.

Frames, gossip, manifests, specs and file metadata all come from parties a
node does not trust, so each is decoded here under a size limit, a nesting
limit checked *before* ``json.loads`` (by a linear scan, no recursion), a cap
on integer digits and a finite-float rule; every failure is a
:class:`node.errors.MalformedInput` (or the caller's own ``PolnetError``).

Why the nesting scan: importing web3 pulls in py_ecc, which raises
``sys.setrecursionlimit`` to 100000, so 65,530 ``[`` overflow the C stack
inside ``json.loads`` (SIGSEGV, not an exception). ``pin_recursion_limit``
also puts the limit back to CPython's default once py_ecc is loaded.

Public API::

    decode_json(raw, max_bytes=..., what="...", error=MalformedInput) -> Any
    decode_json_object(raw, ...) -> dict[str, Any]     # the top level must be an object
    json_depth(text) -> int                            # deepest [ / { nesting
    check_fields(obj, {"step": "int", ...}, what=..., optional=...)  # JSON field types
    pin_recursion_limit() -> None                      # call once where web3 is imported
"""

from __future__ import annotations

import json
import math
import re
import sys
from collections.abc import Callable
from itertools import accumulate
from typing import Any, cast

from node.errors import MalformedInput, PolnetError

MAX_DEPTH = 64
# uint256 has 78 decimal digits; nothing a peer sends needs more.
MAX_INT_DIGITS = 100
SANE_RECURSION_LIMIT = 1000

ErrorFactory = Callable[[str], PolnetError]

# A JSON string literal; the depth scan blanks these so brackets inside strings
# do not count. The closing quote is optional so an unterminated string runs to
# the end in one match: a failed match would be retried from every escaped quote
# inside it (quadratic time on 64 KiB of backslash-quotes).
_STRING = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?', re.DOTALL)
_NOT_BRACKET = re.compile(r"[^\[\]{}]+")
_STEP = {"[": 1, "{": 1, "]": -1, "}": -1}


def json_depth(text: str) -> int:
    """The deepest nesting of ``[``/``{`` outside string literals.

    Exact for valid JSON; for invalid JSON it agrees with ``json.loads`` up to
    the first syntax error (both read left to right), which is all the parser
    ever recurses into."""
    brackets = _NOT_BRACKET.sub("", _STRING.sub("", text))
    return max(accumulate(map(_STEP.__getitem__, brackets)), default=0)


def _parse_int(s: str) -> int:
    digits = len(s.lstrip("-"))
    if digits > MAX_INT_DIGITS:
        raise ValueError(f"an integer of {digits} digits (at most {MAX_INT_DIGITS})")
    return int(s)


def _parse_float(s: str) -> float:
    value = float(s)
    if not math.isfinite(value):
        raise ValueError(f"number {s[:40]} overflows a float")
    return value


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not JSON")


def decode_json(raw: bytes | bytearray | memoryview | str, *, max_bytes: int,
                what: str = "input", max_depth: int = MAX_DEPTH,
                error: ErrorFactory = MalformedInput) -> Any:
    """Decode untrusted JSON or raise ``error(message)`` (a ``PolnetError``)."""
    size = len(raw)
    if size > max_bytes:
        raise error(f"{what} of {size} bytes exceeds the {max_bytes}-byte limit")
    if isinstance(raw, str):
        text = raw
    else:
        try:
            text = bytes(raw).decode("utf-8")
        except UnicodeDecodeError as exc:
            raise error(f"{what} is not UTF-8 (byte {exc.start})") from None
    depth = json_depth(text)
    if depth > max_depth:
        raise error(f"{what} nests {depth} levels deep (at most {max_depth})")
    try:
        return json.loads(text, parse_int=_parse_int, parse_float=_parse_float,
                          parse_constant=_reject_constant)
    except (ValueError, RecursionError) as exc:  # JSONDecodeError is a ValueError
        raise error(f"{what} is not valid JSON: {exc}") from None


def decode_json_object(raw: bytes | bytearray | memoryview | str, *, max_bytes: int,
                       what: str = "input", max_depth: int = MAX_DEPTH,
                       error: ErrorFactory = MalformedInput) -> dict[str, Any]:
    obj = decode_json(raw, max_bytes=max_bytes, what=what, max_depth=max_depth, error=error)
    if not isinstance(obj, dict):
        raise error(f"{what} must be a JSON object, not a {type(obj).__name__}")
    return cast(dict[str, Any], obj)


# Field kinds for check_fields: JSON types as Python sees them after decode_json.
# "int" excludes bools; "float" accepts ints; a "?" suffix allows null; "[k]" is a list of k.
_KINDS: dict[str, Callable[[Any], bool]] = {
    "int": lambda v: type(v) is int,
    "float": lambda v: type(v) in (int, float),
    "str": lambda v: isinstance(v, str),
    "bool": lambda v: isinstance(v, bool),
    "list": lambda v: isinstance(v, list),
    "dict": lambda v: isinstance(v, dict),
}


def _fits(value: Any, kind: str) -> bool:
    if kind.endswith("?"):
        return value is None or _fits(value, kind[:-1])
    if kind.startswith("["):
        return isinstance(value, list) and all(_fits(v, kind[1:-1]) for v in value)
    return _KINDS[kind](value)


def check_fields(obj: dict[str, Any], required: dict[str, str], *, what: str,
                 optional: dict[str, str] | None = None, extra_ok: bool = False,
                 error: ErrorFactory = MalformedInput) -> None:
    """Check a decoded object's field names and JSON types (kinds as in ``_KINDS``)."""
    optional = optional or {}
    missing = sorted(required.keys() - obj.keys())
    extra = sorted(obj.keys() - required.keys() - optional.keys())
    if missing:
        raise error(f"{what} lacks fields {missing}")
    if extra and not extra_ok:
        raise error(f"{what} has unknown fields {[k[:40] for k in extra[:5]]}")
    for name, kind in {**optional, **required}.items():
        if name in obj and not _fits(obj[name], kind):
            raise error(f"{what}: field {name!r} must be {kind}, "
                        f"not {type(obj[name]).__name__}")


def pin_recursion_limit() -> None:
    """Load py_ecc (which raises the recursion limit to 100000 on import) and put
    the limit back, so a deep recursion anywhere raises RecursionError instead of
    overflowing the C stack. Later imports of py_ecc do not run it again."""
    import py_ecc  # noqa: F401, PLC0415 - imported for its side effect, then undone

    if sys.getrecursionlimit() > SANE_RECURSION_LIMIT:
        sys.setrecursionlimit(SANE_RECURSION_LIMIT)
