"""Senders that served us something unusable, remembered on disk (issue 37).

An announcer whose artifact was malformed, wrong or never served is charged once:
its peer id and, when the registry names it, its account, so neither a restart
nor a new peer id through ``updateNode`` buys it another try. Bounded (oldest
out first); a damaged file starts an empty list (the cost is one more try each).
"""

from __future__ import annotations

import json
import time
from collections import OrderedDict
from pathlib import Path

from node.fsutil import atomic_write
from node.logs import get_logger

log = get_logger("polnet.bans")

MAX_BANS = 4096
REASON_CHARS = 200


class BanList:
    def __init__(self, path: Path, limit: int = MAX_BANS) -> None:
        self.path = path
        self.limit = limit
        self._bans: OrderedDict[str, str] = OrderedDict()
        try:
            raw = json.loads(path.read_text())
            if isinstance(raw, dict):
                self._bans.update((str(k), str(v)[:REASON_CHARS]) for k, v in raw.items())
        except FileNotFoundError:
            pass
        except (OSError, ValueError) as exc:
            log.warning("ban_list_unreadable", path=str(path), error=str(exc))
        while len(self._bans) > limit:
            self._bans.popitem(last=False)

    def banned(self, *keys: str | None) -> bool:
        return any(k is not None and _norm(k) in self._bans for k in keys)

    def ban(self, reason: str, *keys: str | None) -> None:
        """Ban every key given (a peer id, an account) and write the list at once."""
        for k in keys:
            if k is not None:
                self._bans[_norm(k)] = f"{int(time.time())} {reason}"[:REASON_CHARS]
                self._bans.move_to_end(_norm(k))
        while len(self._bans) > self.limit:
            self._bans.popitem(last=False)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write(self.path, json.dumps(self._bans, indent=1).encode(), durable=False)

    def __len__(self) -> int:
        return len(self._bans)


def _norm(key: str) -> str:
    """Accounts in any case are one; peer ids (base58) are case-sensitive."""
    return key.lower() if key.startswith("0x") else key
