"""Structured logging: human console output by default, JSON lines with ``--log-json``."""

from __future__ import annotations

import logging
import sys

import structlog


def configure(json: bool = False, level: str = "INFO") -> None:
    lvl = logging.getLevelNamesMapping().get(level.upper(), logging.INFO)
    processors: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
    ]
    if json:
        processors += [structlog.processors.format_exc_info, structlog.processors.JSONRenderer()]
    else:
        processors += [structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())]
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(lvl),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )
    # Third-party libraries log through stdlib logging; keep them quiet unless debugging.
    logging.basicConfig(level=max(lvl, logging.WARNING), stream=sys.stderr)


def get_logger(name: str) -> structlog.typing.FilteringBoundLogger:
    return structlog.get_logger(name)  # type: ignore[no-any-return]
