"""Structured logging for the proxy: structlog set up once, plus a per-key rate limiter so a
storm of identical decisions (thousands of rejected PIDs a second) writes a bounded number of
lines, and the next line that gets through says how many were suppressed.

Owns: log configuration and ``RateLimitedLog``. Never receives credentials: callers pass only
principals, client ids, PIDs and addresses. Sits under every room of the proxy: must not
import any other ``pidgate.proxy`` module.
"""

from __future__ import annotations

import logging
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import structlog

from pidgate.config import LoggingSettings


def configure_logging(settings: LoggingSettings) -> None:
    """JSON Lines when stderr is not a TTY (production), pretty console output on a TTY."""
    use_json = settings.format == "json" or (settings.format == "auto" and not sys.stderr.isatty())
    renderer: Any = (
        structlog.processors.JSONRenderer()
        if use_json
        else structlog.dev.ConsoleRenderer(colors=sys.stderr.isatty())
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(
            getattr(logging, settings.level.upper())
        ),
        logger_factory=structlog.PrintLoggerFactory(file=sys.stderr),
        cache_logger_on_first_use=False,
    )


def get_logger() -> Any:
    return structlog.get_logger("pidgate")


@dataclass
class _Window:
    started_ms: int
    emitted: int = 0
    suppressed: int = 0


@dataclass
class RateLimitedLog:
    """At most ``max_events`` lines per (event, key) per ``interval_ms``.

    The table of keys is bounded too (``max_keys``): when full, the oldest windows are dropped,
    which can only let a few more lines through, never hold memory.
    """

    max_events: int
    interval_ms: int
    max_keys: int = 10_000
    _windows: dict[tuple[str, str], _Window] = field(default_factory=dict)

    def warning(self, event: str, key: str, **fields: Any) -> None:
        self._emit("warning", event, key, fields)

    def info(self, event: str, key: str, **fields: Any) -> None:
        self._emit("info", event, key, fields)

    def _emit(self, level: str, event: str, key: str, fields: dict[str, Any]) -> None:
        now_ms = time.monotonic_ns() // 1_000_000
        slot = (event, key)
        window = self._windows.get(slot)
        if window is None or now_ms - window.started_ms >= self.interval_ms:
            suppressed = window.suppressed if window else 0
            if window is None and len(self._windows) >= self.max_keys:
                for stale in list(self._windows)[: self.max_keys // 10 or 1]:
                    del self._windows[stale]
            window = self._windows[slot] = _Window(started_ms=now_ms)
            if suppressed:
                fields = {**fields, "suppressed_since_last": suppressed}
        if window.emitted >= self.max_events:
            window.suppressed += 1
            return
        window.emitted += 1
        getattr(get_logger(), level)(event, **fields)
