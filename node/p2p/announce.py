"""Signed gossip announcements: small, strictly validated, paced.

Wire form (JSON): {"v":1,"kind":K,"sender":PEER_ID,"seq":N,"ts_ms":T,"payload":{...},"sig":HEX}.
`sig` is the sender's libp2p (Ed25519) signature over the canonical JSON of
every other field, prefixed with a domain tag; receivers verify it against the
public key embedded in `sender`, so a relayed or forged message cannot claim
someone else's identity. Anything unsigned, malformed, oversized, of an
unknown kind or badly signed is dropped and counted.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from typing import Annotated, Any, Literal

from libp2p.crypto.keys import PrivateKey
from libp2p.peer.id import ID
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from node.boundary import decode_json_object
from node.errors import MalformedInput
from node.store.manifest import HEX64

DOMAIN = b"polnet-announce-v1\n"
# Gossipsub drops messages over 1 MiB silently; stay far below.
MAX_ANNOUNCE_BYTES = 16 * 1024
Hex32 = Annotated[str, Field(pattern=HEX64)]
Bytes32 = Annotated[str, Field(pattern=r"^0x[0-9a-fA-F]{64}$")]


class _Strict(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)


StrictPayload = _Strict  # base for payload models other layers register with register_kind


class JobPosted(_Strict):
    job_id: int = Field(ge=0)
    spec_hash: Bytes32
    dataset_id: Hex32
    spec_id: Hex32 | None = None


class ResultCommitted(_Strict):
    job_id: int = Field(ge=0)
    trace_root: Bytes32
    final_state_hash: Bytes32
    artifact_ids: list[Hex32] = Field(default_factory=list, max_length=256)


class ArtifactAvailable(_Strict):
    artifact_ids: list[Hex32] = Field(min_length=1, max_length=256)
    job_id: int | None = Field(default=None, ge=0)
    note: str = Field(default="", max_length=256)


class PeerAddrs(_Strict):
    """A node's relayed addresses (/p2p-circuit, each ending in its own peer id)."""

    addrs: list[Annotated[str, Field(max_length=400)]] = Field(min_length=1, max_length=8)


# kind -> (payload model, topic). Topics are per kind so each gets its own pace.
KINDS: dict[str, tuple[type[_Strict], str]] = {
    "job_posted": (JobPosted, "polnet/jobs/1"),
    "result_committed": (ResultCommitted, "polnet/results/1"),
    "artifact_available": (ArtifactAvailable, "polnet/artifacts/1"),
    "peer_addrs": (PeerAddrs, "polnet/peers/1"),
}


def register_kind(kind: str, model: type[_Strict], topic: str) -> None:
    """Add an announcement kind (its payload model must be strict, extra=forbid)."""
    KINDS[kind] = (model, topic)


def topic_of(kind: str) -> str:
    if kind not in KINDS:
        raise ValueError(f"unknown announcement kind {kind!r}; known: {sorted(KINDS)}")
    return KINDS[kind][1]


class Announcement(_Strict):
    v: Literal[1] = 1
    kind: str = Field(max_length=64)
    sender: str = Field(min_length=10, max_length=128)
    seq: int = Field(ge=0)
    ts_ms: int = Field(ge=0)
    payload: dict[str, Any]
    sig: str = Field(pattern=r"^[0-9a-f]{2,256}$")

    def typed_payload(self) -> BaseModel:
        return KINDS[self.kind][0].model_validate(self.payload, strict=True)


def _signing_bytes(fields: dict[str, Any]) -> bytes:
    body = {k: v for k, v in fields.items() if k != "sig"}
    return DOMAIN + json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def make_announcement(key: PrivateKey, sender: ID, kind: str, payload: BaseModel | dict[str, Any],
                      seq: int) -> bytes:
    """Validate, sign and encode an announcement. Raises ValueError if invalid or too big."""
    model = KINDS[kind][0] if kind in KINDS else None
    if model is None:
        raise ValueError(f"unknown announcement kind {kind!r}; known: {sorted(KINDS)}")
    data = payload.model_dump(mode="json") if isinstance(payload, BaseModel) else payload
    model.model_validate(data, strict=True)
    fields: dict[str, Any] = {"v": 1, "kind": kind, "sender": sender.to_base58(), "seq": seq,
                              "ts_ms": int(time.time() * 1000), "payload": data}
    fields["sig"] = key.sign(_signing_bytes(fields)).hex()
    raw = json.dumps(fields, separators=(",", ":")).encode()
    if len(raw) > MAX_ANNOUNCE_BYTES:
        raise ValueError(f"announcement of {len(raw)} bytes exceeds {MAX_ANNOUNCE_BYTES}")
    return raw


class AnnouncementVerifier:
    """Parses and checks received announcements; counts every drop by reason."""

    def __init__(self) -> None:
        self.dropped: Counter[str] = Counter()
        self.accepted = 0

    def verify(self, raw: bytes, topic: str | None = None,
               from_peer: ID | None = None) -> Announcement | None:
        reason, ann = self._check(raw, topic, from_peer)
        if ann is None:
            self.dropped[reason] += 1
            return None
        self.accepted += 1
        return ann

    @staticmethod
    def _check(raw: bytes, topic: str | None,
               from_peer: ID | None) -> tuple[str, Announcement | None]:
        if len(raw) > MAX_ANNOUNCE_BYTES:
            return "oversized", None
        try:
            obj = decode_json_object(raw, max_bytes=MAX_ANNOUNCE_BYTES, what="announcement")
        except MalformedInput:
            return "malformed", None
        if not obj.get("sig"):
            return "unsigned", None
        try:
            ann = Announcement.model_validate(obj, strict=True)
        except ValidationError:
            return "malformed", None
        if ann.kind not in KINDS or (topic is not None and KINDS[ann.kind][1] != topic):
            return "unknown_kind", None
        try:
            ann.typed_payload()
        except ValidationError:
            return "bad_payload", None
        try:
            sender = ID.from_base58(ann.sender)
            pub = sender.extract_public_key()  # garbage key bytes raise: drop, never propagate
        except Exception:
            return "bad_sender", None
        if from_peer is not None and from_peer != sender:
            return "sender_mismatch", None
        if pub is None:
            return "bad_sender", None
        try:
            ok = pub.verify(_signing_bytes(obj), bytes.fromhex(ann.sig))
        except Exception:
            ok = False
        if not ok:
            return "bad_signature", None
        return "", ann
