"""Structured logging: human console output by default, JSON lines with ``--log-json``.

Third-party libraries (libp2p, web3) log through the standard library; their
records go through the same renderer, so ``--log-json`` output is JSON on every
line.
"""

from __future__ import annotations

import logging
import sys

import structlog

# libp2p warns about every peer that left (its dials, DHT pushes and cached failures):
# routine on a network with churn, and most of a node's log otherwise. Kept at DEBUG.
_DEPARTED_PEER_NOISE = ("Failed to open TCP stream", "ADD_PROVIDER", "negative cache",
                        "Failed to open stream", "unable to connect to",
                        "all attempts to connect",
                        # A peer's stale or duplicated signed record (a restarted node, or
                        # before the identity lock two processes under one name) and
                        # gossipsub's per-forwarder limit (raised: p2p.gossip_receive_rate):
                        # what is left of them is one peer's problem, not this node's.
                        "Rate limit exceeded", "Certified-Addr-Book",
                        "invalid-signed-record", "Equivocation detected")


class DepartedPeerFilter(logging.Filter):
    """Drops libp2p's warnings about unreachable peers unless the node logs at DEBUG."""

    def __init__(self, keep: bool) -> None:
        super().__init__()
        self.keep = keep

    def filter(self, record: logging.LogRecord) -> bool:
        if self.keep or not record.name.startswith("libp2p"):
            return True
        msg = record.getMessage()
        return not any(s in msg for s in _DEPARTED_PEER_NOISE)


LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")


def parse_level(level: str) -> int:
    """A level name (any case) as logging's number; ConfigError naming the choices."""
    from node.errors import ConfigError  # noqa: PLC0415

    if level.upper() not in LEVELS:
        raise ConfigError(f"log level {level!r} is not one of {', '.join(LEVELS)}")
    return logging.getLevelNamesMapping()[level.upper()]


def configure(json: bool = False, level: str = "INFO", p2p_level: str | None = None) -> None:
    """Our logs at ``level``; libp2p's own loggers, through the same renderer, at
    ``p2p_level`` (default: WARNING, or DEBUG when ``level`` is DEBUG), since at INFO
    libp2p reports every dial and stream."""
    lvl = parse_level(level)
    if p2p_level is not None:
        p2p_lvl = parse_level(p2p_level)
    else:
        p2p_lvl = lvl if lvl <= logging.DEBUG else max(lvl, logging.WARNING)
    shared: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if json
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty()))
    if json:
        shared.append(structlog.processors.format_exc_info)
    structlog.configure(
        processors=[*shared, renderer],
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(structlog.stdlib.ProcessorFormatter(
        processors=[structlog.stdlib.ProcessorFormatter.remove_processors_meta, renderer],
        foreign_pre_chain=[structlog.stdlib.add_logger_name, *shared]))
    handler.addFilter(DepartedPeerFilter(keep=p2p_lvl <= logging.DEBUG))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    # Other libraries (web3, urllib3) are chatty too: warnings and up unless debugging.
    root.setLevel(max(lvl, logging.WARNING) if lvl > logging.DEBUG else lvl)
    logging.getLogger("libp2p").setLevel(p2p_lvl)
    # The DHT warns on every stream a peer closes after its answer (normal): errors
    # only, unless libp2p itself is being debugged.
    logging.getLogger("libp2p.kad_dht.kad_dht").setLevel(
        logging.NOTSET if p2p_lvl <= logging.DEBUG else max(p2p_lvl, logging.ERROR))


def get_logger(name: str) -> structlog.typing.FilteringBoundLogger:
    return structlog.get_logger(name)  # type: ignore[no-any-return]
