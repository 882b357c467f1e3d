"""Does an upstream broker answer, and if none does, why not, in words an operator acts on: the
reason ``/readyz`` puts in its 503 body and the warning ``serve`` gives at start.

Owns: ``unanswered_reason`` (a TCP connection to each address in turn, no Kafka request),
``connect_error_text`` and ``describe_error`` (an exception named once, for any message).
Never sends a byte upstream; never logs (the callers decide). Sits under every room of the
proxy: must not import any other ``pidgate.proxy`` module.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterable


def describe_error(error: BaseException) -> str:
    """``Type: message``, the type named once: kafka-python's ``str()`` already starts with it
    (``KafkaTimeoutError: Unable to bootstrap``, or just ``KafkaTimeoutError``)."""
    text, name = str(error), type(error).__name__
    return text if text.startswith(name) else f"{name}: {text}" if text else name


#: How long one address gets to accept a connection.
CONNECT_TIMEOUT_S = 2.0


def connect_error_text(error: BaseException, timeout_s: float = CONNECT_TIMEOUT_S) -> str:
    """``connection refused``, ``no answer within 2 s``, ``host name not resolved: ...``."""
    if isinstance(error, ConnectionRefusedError):
        return "connection refused"
    if isinstance(error, TimeoutError):
        return f"no answer within {timeout_s:g} s"
    if isinstance(error, socket.gaierror):
        return f"host name not resolved: {error.strerror or error}"
    text = (error.strerror if isinstance(error, OSError) else None) or str(error)
    return (text[:1].lower() + text[1:]) or type(error).__name__


async def unanswered_reason(
    addresses: Iterable[tuple[str, int]], timeout_s: float = CONNECT_TIMEOUT_S
) -> str | None:
    """None as soon as one address accepts a TCP connection (tried in order); otherwise
    ``no upstream broker answered at 127.0.0.1:9 (connection refused)``, every address named."""
    failures: list[str] = []
    for host, port in addresses:
        try:
            _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
        except (OSError, TimeoutError, UnicodeError) as error:  # UnicodeError: a bad host
            failures.append(f"{host}:{port} ({connect_error_text(error, timeout_s)})")
            continue
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return None
    if not failures:
        return "no upstream broker configured"
    return "no upstream broker answered at " + ", ".join(failures)
