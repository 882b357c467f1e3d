"""The admin HTTP listener: ``/metrics``, ``/healthz``, ``/readyz`` and the read-only ``/state``.

Owns: ``AdminHttpServer``, a deliberately tiny HTTP/1.1 server on asyncio streams (GET and HEAD
only, one request per connection, ``Connection: close``). It serves operators and Prometheus a
few times a minute, so simplicity beats speed; what matters is that nothing a peer sends can
crash it or hold memory: the request head is bounded (8 KiB), slow peers time out, concurrent
connections are capped, and every handler error becomes a 5xx answer.

It runs on the proxy's event loop, which is also what makes scraping ``ProxyMetrics`` safe. A
source that can render in steps (``render_in_steps``, as ``ProxyMetrics`` does) is driven a step
at a time with the loop let through between steps, so a scrape over many principals does not
stall the proxy's connections for its whole length.
It never writes: ``/state`` shows what the ``state`` callable returns, and the caller keeps
credentials out of it.

Must not import: the connection or server modules (the server wires us), quota internals.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import re
from collections.abc import Awaitable, Callable, Generator
from typing import Any, Final, Protocol, runtime_checkable

from prometheus_client.exposition import CONTENT_TYPE_PLAIN_0_0_4

from pidgate.proxy.logs import RateLimitedLog
from pidgate.proxy.operations.stepping import run_in_steps

__all__ = ["MAX_REQUEST_HEAD_BYTES", "AdminHttpServer"]

#: Request line plus headers; anything longer is not an operator's curl or a Prometheus scrape.
MAX_REQUEST_HEAD_BYTES: Final = 8 * 1024
_REASONS: Final = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    408: "Request Timeout",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    503: "Service Unavailable",
    505: "HTTP Version Not Supported",
}
_TEXT: Final = "text/plain; charset=utf-8"
_JSON: Final = "application/json"
_ROUTES: Final = frozenset({"/metrics", "/healthz", "/readyz", "/state"})

Address = tuple[str, int]


class _Response:
    __slots__ = ("body", "content_type", "status")

    def __init__(self, status: int, body: bytes, content_type: str = _TEXT) -> None:
        self.status = status
        self.body = body
        self.content_type = content_type


class _BadRequest(Exception):
    def __init__(self, response: _Response) -> None:
        super().__init__(response.status)
        self.response = response


#: Bytes never found in a request head: controls other than HTAB, CR, LF. Rejecting them on
#: arrival answers a TLS ClientHello or a Kafka frame sent here at once instead of after a
#: timeout.
_CONTROL: Final = re.compile(rb"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


async def _read_head(reader: asyncio.StreamReader) -> bytes | None:
    """The request line and headers (without the blank line), None if the peer sent nothing.

    Raises ``_BadRequest`` as soon as the bytes cannot be an HTTP request head, or when the
    head outgrows ``MAX_REQUEST_HEAD_BYTES``.
    """
    buf = b""
    while True:
        chunk = await reader.read(MAX_REQUEST_HEAD_BYTES + 1 - len(buf))
        if not chunk:
            if not buf:
                return None
            raise _BadRequest(_Response(400, b"incomplete request\n"))
        buf += chunk
        if not b"A" <= buf[:1] <= b"Z" or _CONTROL.search(chunk):
            raise _BadRequest(_Response(400, b"not an HTTP request\n"))
        # Bare LF line ends are tolerated (RFC 9112 section 2.2), so either blank line ends it.
        ends = [end for end in (buf.find(b"\r\n\r\n"), buf.find(b"\n\n")) if end >= 0]
        if ends and min(ends) <= MAX_REQUEST_HEAD_BYTES:
            return buf[: min(ends)]
        if len(buf) > MAX_REQUEST_HEAD_BYTES:
            raise _BadRequest(_Response(431, b"request head too large\n"))


class MetricsSource(Protocol):
    """What /metrics renders: a ``ProxyMetrics``, or the --workers supervisor's merge."""

    def render(self) -> bytes | Awaitable[bytes]: ...


@runtime_checkable
class SteppedMetricsSource(Protocol):
    """A source whose render is cut into steps: a generator that yields between bounded pieces
    of work and returns the body."""

    def render_in_steps(self) -> Generator[None, None, bytes]: ...


class AdminHttpServer:
    """Serves the admin endpoints; ``start`` binds, ``stop`` closes every connection."""

    def __init__(
        self,
        metrics: MetricsSource,
        state: Callable[[], dict[str, Any] | Awaitable[dict[str, Any]]],
        ready: Callable[[], Awaitable[bool | str]],
        *,
        read_timeout_s: float = 10.0,
        ready_timeout_s: float = 5.0,
        max_connections: int = 64,
        log: RateLimitedLog | None = None,
    ) -> None:
        self._metrics = metrics
        self._state = state
        self._ready = ready
        self._read_timeout_s = read_timeout_s
        # Prometheus scrapes with a 10 s timeout by default: answer 503 well before that.
        self._ready_timeout_s = ready_timeout_s
        self._max_connections = max_connections
        self._log = log if log is not None else RateLimitedLog(max_events=5, interval_ms=60_000)
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def start(self, host: str, port: int) -> None:
        if self._server is not None:
            raise RuntimeError("AdminHttpServer already started")
        self._server = await asyncio.start_server(self._serve, host, port, reuse_address=True)

    async def stop(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        for writer in list(self._writers):
            writer.close()
        # 3.12+ wait_closed also waits for handlers; bound it so a stuck peer cannot hold
        # shutdown.
        with contextlib.suppress(Exception):
            await asyncio.wait_for(server.wait_closed(), 1.0)

    @property
    def address(self) -> Address:
        if self._server is None or not self._server.sockets:
            raise RuntimeError("AdminHttpServer is not listening")
        host, port = self._server.sockets[0].getsockname()[:2]
        return (host, port)

    # -- one connection ------------------------------------------------------------------------

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if len(self._writers) >= self._max_connections:
            writer.close()  # a flood of idle sockets must not starve the proxy's own fds
            return
        self._writers.add(writer)
        try:
            head_only = False
            try:
                head = await asyncio.wait_for(_read_head(reader), timeout=self._read_timeout_s)
            except _BadRequest as bad:
                response = bad.response
            except TimeoutError:
                response = _Response(408, b"request timeout\n")
            else:
                if head is None:
                    return  # connected and closed without a byte: nobody to answer
                method, response = await self._respond(head)
                head_only = method == "HEAD"
            await self._write(writer, response, head_only)
        except (ConnectionError, OSError):
            pass  # the peer went away mid-answer; nothing to clean up beyond closing
        except Exception as error:  # never let one connection take the listener down
            self._log.warning("admin_http_failed", key="serve", error=repr(error))
        finally:
            self._writers.discard(writer)
            writer.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(writer.wait_closed(), 1.0)

    async def _respond(self, head: bytes) -> tuple[str, _Response]:
        request_line = head.split(b"\n", 1)[0].rstrip(b"\r")
        parts = request_line.split(b" ")
        if len(parts) != 3:
            return "", _Response(400, b"bad request line\n")
        method_b, target_b, version_b = parts
        if not (method_b.isalpha() and method_b.isupper() and target_b and b"\x00" not in target_b):
            return "", _Response(400, b"bad request line\n")
        if not version_b.startswith(b"HTTP/"):
            return "", _Response(400, b"bad request line\n")
        if version_b not in (b"HTTP/1.0", b"HTTP/1.1"):
            return "", _Response(505, b"HTTP/1.0 or HTTP/1.1 only\n")
        method = method_b.decode("ascii")
        path = target_b.decode("latin-1").split("?", 1)[0]
        if not path.startswith("/"):
            return method, _Response(400, b"origin-form request target required\n")
        if path not in _ROUTES:
            return method, _Response(404, b"not found\n")
        if method not in ("GET", "HEAD"):
            return method, _Response(405, b"GET or HEAD only\n")
        try:
            return method, await self._route(path)
        except Exception as error:
            self._log.warning("admin_http_failed", key=path, path=path, error=repr(error))
            return method, _Response(500, b"internal error\n")

    async def _route(self, path: str) -> _Response:
        if path == "/metrics":
            if isinstance(self._metrics, SteppedMetricsSource):
                return _Response(
                    200,
                    await run_in_steps(self._metrics.render_in_steps()),
                    CONTENT_TYPE_PLAIN_0_0_4,
                )
            rendered = self._metrics.render()
            if inspect.isawaitable(rendered):  # the --workers supervisor asks its workers
                rendered = await rendered
            return _Response(200, rendered, CONTENT_TYPE_PLAIN_0_0_4)
        if path == "/healthz":
            # The event loop answered: the process runs. Upstream trouble is /readyz's business,
            # so a broker outage never gets pidgate restarted by its liveness probe.
            return _Response(200, b"ok\n")
        if path == "/readyz":
            # ``ready`` answers True, False, or why it is not ready (a string).
            try:
                ok = await asyncio.wait_for(self._ready(), timeout=self._ready_timeout_s)
            except Exception as error:  # TimeoutError included: not ready is the honest answer
                self._log.warning("readiness_check_failed", key="ready", error=repr(error))
                ok = False
            if ok is True:
                return _Response(200, b"ready\n")
            reason = f": {ok}" if isinstance(ok, str) and ok else ""
            return _Response(503, f"not ready{reason}\n".encode())
        state = self._state()
        if inspect.isawaitable(state):
            state = await state
        text = json.dumps(state, indent=2, sort_keys=True, default=str) + "\n"
        return _Response(200, text.encode("utf-8"), _JSON)

    @staticmethod
    async def _write(writer: asyncio.StreamWriter, response: _Response, head_only: bool) -> None:
        headers = [
            f"HTTP/1.1 {response.status} {_REASONS[response.status]}",
            f"Content-Type: {response.content_type}",
            f"Content-Length: {len(response.body)}",
            "Cache-Control: no-store",
            "X-Content-Type-Options: nosniff",
            "Connection: close",
        ]
        if response.status == 405:
            headers.append("Allow: GET, HEAD")
        writer.write(("\r\n".join(headers) + "\r\n\r\n").encode("ascii"))
        if not head_only:
            writer.write(response.body)
        await writer.drain()
