"""The settings of the kafka-python clients quota control opens on the upstream cluster for its
own topics (the fleet topic, the shared quota store): one place for their timeouts.

Owns: ``cluster_client_config``. Builds a dict and reads the monotonic clock, nothing more; must
not import ``serving``, ``operations`` or the server (quota control's rule), nor kafka-python.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["cluster_client_config"]

REQUEST_TIMEOUT_MS = 10_000
#: Reconnect quickly once the broker is back (kafka-python's default backs off to 30 s).
RECONNECT_BACKOFF_MAX_MS = 2_000
#: The longest a client waits to bootstrap, however far the deadline.
MAX_BOOTSTRAP_TIMEOUT_MS = 30_000


def cluster_client_config(
    bootstrap: Sequence[str], client_id: str, deadline: float, security: Mapping[str, Any]
) -> dict[str, Any]:
    """kafka-python client settings: bootstrap within what is left until ``deadline`` (a
    ``time.monotonic()`` instant; at least 100 ms, at most 30 s), then ``security``."""
    remaining_ms = max(100, int((deadline - time.monotonic()) * 1000))
    return {
        "bootstrap_servers": bootstrap,
        "client_id": client_id,
        "bootstrap_timeout_ms": min(remaining_ms, MAX_BOOTSTRAP_TIMEOUT_MS),
        "request_timeout_ms": REQUEST_TIMEOUT_MS,
        "reconnect_backoff_max_ms": RECONNECT_BACKOFF_MAX_MS,
        **security,
    }
