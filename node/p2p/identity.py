"""The node's persistent libp2p identity (Ed25519, so peer ids embed the public key)."""

from __future__ import annotations

import os
from pathlib import Path

from libp2p.crypto.ed25519 import create_new_key_pair
from libp2p.crypto.keys import KeyPair
from libp2p.crypto.serialization import deserialize_private_key
from libp2p.peer.id import ID

from node.errors import ConfigError
from node.fsutil import atomic_write
from node.logs import get_logger

log = get_logger(__name__)


def load_or_create_keypair(path: str | os.PathLike[str]) -> KeyPair:
    """Read the key file, or create it (mode 0600) on first run."""
    p = Path(path)
    if p.exists():
        if p.stat().st_mode & 0o077:
            log.warning("key_file_too_open", path=str(p), mode=oct(p.stat().st_mode & 0o777))
        try:
            priv = deserialize_private_key(p.read_bytes())
        except Exception as exc:
            raise ConfigError(f"{p}: not a libp2p private key ({exc}); move it away") from exc
        return KeyPair(priv, priv.get_public_key())
    p.parent.mkdir(parents=True, exist_ok=True)
    kp = create_new_key_pair()
    atomic_write(p, kp.private_key.serialize(), private=True)
    log.info("identity_created", path=str(p), peer_id=ID.from_pubkey(kp.public_key).to_base58())
    return kp


def peer_id_of(kp: KeyPair) -> ID:
    return ID.from_pubkey(kp.public_key)
