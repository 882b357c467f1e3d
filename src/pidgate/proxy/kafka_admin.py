"""Opening a kafka-python admin client without leaking its network thread.

Owns :func:`open_admin_client`, the one way pidgate creates a ``KafkaAdminClient`` (the PID
frontier probe, the fleet and shared store topics, ``pidgate quotas``). Must not import
anything of pidgate's: every room of the proxy may use it.

Why: kafka-python 3's ``KafkaAdminClient`` starts its network thread (``kafka-io-<client_id>``)
and then bootstraps, in its constructor. When the bootstrap fails (no broker answers within
``bootstrap_timeout_ms``, a listener that refuses the connection) the constructor raises and
the thread it started lives on, reconnecting for the rest of the process, with nothing left
to close it: one thread more for every failed attempt, and the fleet retries its topic set-up
every 0.2 s until its deadline. Checked with kafka-python 3.0.12 against a refused port: the
thread was still alive after the error.
"""

from __future__ import annotations

import contextlib
from typing import Any

from kafka import KafkaAdminClient

__all__ = ["open_admin_client"]


class _AdminClientClosedOnFailure(KafkaAdminClient):  # type: ignore[misc]
    def __init__(self, **configs: Any) -> None:
        try:
            super().__init__(**configs)
        except BaseException:
            self._close_what_started()
            raise

    def _close_what_started(self) -> None:
        # What KafkaAdminClient.close() closes, as far as the constructor got.
        for part, method in (("_client", "close"), ("_net", "stop"), ("_metrics", "close")):
            started = getattr(self, part, None)
            if started is not None:
                with contextlib.suppress(Exception):
                    getattr(started, method)()


def open_admin_client(**configs: Any) -> Any:
    """A ``KafkaAdminClient`` with ``configs``; when it cannot start, its error is raised and
    the network thread it started is stopped first."""
    return _AdminClientClosedOnFailure(**configs)
