"""The broker side of one client connection: connecting to the first broker that answers, and
the protocol that passes the broker's frames to the client connection's response path.

Owns: ``UpstreamConnection``, ``open_upstream`` and ``UpstreamClient`` (what the broker side
needs of its client connection). Must not import the connection, response-path or produce-gate
modules (they use this one): the client is reached through ``UpstreamClient`` only.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Protocol, cast

from pidgate.config import Settings
from pidgate.protocol.errors import ProtocolError
from pidgate.protocol.framing import Frame, FrameDecoder
from pidgate.proxy.serving.context import ProxyContext
from pidgate.proxy.serving.flow_control import ReadGate
from pidgate.proxy.serving.routing import Address


class UpstreamClient(Protocol):
    """What the broker side needs of its client connection (``connection.ClientConnection``)."""

    peer: str

    @property
    def settings(self) -> Settings: ...

    def on_upstream_frames(self, frames: list[bytes]) -> None: ...
    def upstream_reader(self, upstream: UpstreamConnection) -> Callable[[bytes], None] | None:
        """What reads the broker's bytes instead of ``decode_and_pass`` (the compiled express
        lane's reader, which hands it what it does not take), or None."""
        ...

    def fail_upstream(self, event: str, reason: str) -> None: ...
    def on_upstream_lost(self) -> None: ...
    def on_upstream_backpressure(self, full: bool) -> None:
        """The broker's socket cannot take more: stop (or resume) reading the client."""
        ...


class UpstreamConnection(asyncio.Protocol):
    """The broker side of one client connection. Its fields are slots (the express lane reads
    ``transport`` and ``_decoder`` at their offsets, as it reads its client's)."""

    __slots__ = ("_client", "_decoder", "_high", "data_received", "gate", "transport")

    #: What the event loop calls with the broker's bytes, bound once: the express lane's
    #: reader where it runs (answers to its ring in C), else ``decode_and_pass``.
    data_received: Callable[[bytes], None]  # type: ignore[assignment]

    def __init__(self, client: UpstreamClient) -> None:
        self._client = client
        settings = client.settings.proxy
        self._decoder = FrameDecoder(settings.max_response_frame_bytes)
        self._high = settings.write_buffer_high_bytes
        self.gate = ReadGate()
        self.transport: asyncio.Transport | None = None
        # Set before the transport exists: the event loop binds data_received then.
        self.data_received = client.upstream_reader(self) or self.decode_and_pass

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport = cast(asyncio.Transport, transport)
        self.transport = transport
        transport.set_write_buffer_limits(high=self._high, low=self._high // 4)
        self.gate.attach(transport)

    def decode_and_pass(self, data: bytes) -> None:
        """The broker's bytes cut into frames and handed to the client's response path."""
        try:
            frames = self._decoder.feed(data)
        except ProtocolError as error:
            self._client.fail_upstream("bad_response_frame", str(error))
            return
        if frames:
            self._client.on_upstream_frames(frames)

    def connection_lost(self, exc: Exception | None) -> None:
        self._client.on_upstream_lost()

    def pause_writing(self) -> None:
        self._client.on_upstream_backpressure(True)

    def resume_writing(self) -> None:
        self._client.on_upstream_backpressure(False)

    def write_frames(self, frames: list[Frame]) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.writelines(frames)

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()


async def open_upstream(
    client: UpstreamClient, context: ProxyContext, targets: list[Address]
) -> UpstreamConnection | None:
    """The broker side for ``client``: the first of ``targets`` that accepts within
    ``proxy.upstream_connect_timeout_ms`` (the client's settings: those it was accepted
    with); None (logged) when none does."""
    loop = asyncio.get_running_loop()
    timeout_s = client.settings.proxy.upstream_connect_timeout_ms / 1000
    last_error: BaseException | None = None
    for host, port in targets:
        try:
            _, upstream = await asyncio.wait_for(
                loop.create_connection(
                    lambda: UpstreamConnection(client),
                    host,
                    port,
                    ssl=context.upstream_ssl,
                    server_hostname=host if context.upstream_ssl else None,
                ),
                timeout_s,
            )
        except asyncio.CancelledError:
            raise
        except Exception as error:  # OSError, timeout, and e.g. UnicodeError for bad hosts
            last_error = error
            continue
        return upstream
    context.log.warning(
        "upstream_unreachable",
        key="upstream_unreachable",
        upstreams=[f"{host}:{port}" for host, port in targets],
        error=str(last_error) if last_error else "no upstream configured",
        client=client.peer,
    )
    return None
