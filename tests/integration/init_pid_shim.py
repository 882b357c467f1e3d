"""A forwarder in front of tansu that answers InitProducerId v0/v1 by asking tansu with v4.

tansu 0.6.0 answers InitProducerId v0-2 with UNKNOWN_SERVER_ERROR, and aiokafka 0.14 only
speaks v0, so aiokafka's idempotent producer cannot start on tansu at all. This peer forwards
every byte untouched except those requests: it re-encodes them as v4 (same transactional id and
timeout, a new PID asked for), and turns tansu's v4 answer into the v0/v1 answer the client
expects. The PID, epoch and every Produce still come from and go to the real broker.
"""

from __future__ import annotations

import asyncio
import struct
import threading
from collections import deque
from typing import cast

from kafka.protocol.producer import InitProducerIdRequest, InitProducerIdResponse

from pidgate.demo.broker import free_port
from pidgate.protocol.framing import FrameDecoder

_INIT_PRODUCER_ID = 22
_TANSU_VERSION = 4
_HEADER = struct.Struct(">hhi")


def _encode(message: object, version: int, correlation_id: int, client_id: str | None) -> bytes:
    message.API_VERSION = version  # type: ignore[attr-defined]
    if client_id is None:
        message.with_header(correlation_id=correlation_id)  # type: ignore[attr-defined]
    else:
        message.with_header(correlation_id=correlation_id, client_id=client_id)  # type: ignore[attr-defined]
    return bytes(message.encode(header=True, framed=True))  # type: ignore[attr-defined]


class _Broker(asyncio.Protocol):
    def __init__(self, client: _Client) -> None:
        self.client = client
        self.decoder = FrameDecoder(max_frame_bytes=256 << 20)
        self.transport: asyncio.Transport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        for frame in self.decoder.feed(data):
            self.client.from_broker(frame)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.client.transport is not None:
            self.client.transport.close()


class _Client(asyncio.Protocol):
    def __init__(self, target: tuple[str, int]) -> None:
        self.target = target
        self.decoder = FrameDecoder(max_frame_bytes=256 << 20)
        self.transport: asyncio.Transport | None = None
        self.broker: _Broker | None = None
        self.pending: list[bytes] = []
        #: Per request forwarded, in order: the client's InitProducerId version, or None.
        self.translations: deque[tuple[int, int] | None] = deque()
        self.connecting: asyncio.Task[None] | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)
        self.connecting = asyncio.ensure_future(self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            _, self.broker = await loop.create_connection(lambda: _Broker(self), *self.target)
        except OSError:
            assert self.transport is not None
            self.transport.close()
            return
        for frame in self.pending:
            self._forward(frame)
        self.pending.clear()

    def data_received(self, data: bytes) -> None:
        for frame in self.decoder.feed(data):
            if self.broker is None:
                self.pending.append(frame)
            else:
                self._forward(frame)

    def _forward(self, frame: bytes) -> None:
        api_key, version, correlation_id = _HEADER.unpack_from(frame, 4)
        if api_key == _INIT_PRODUCER_ID and version < 2:
            request = InitProducerIdRequest.decode(frame[4:], version=version, header=True)
            frame = _encode(
                InitProducerIdRequest(
                    version=_TANSU_VERSION,
                    transactional_id=request.transactional_id,
                    transaction_timeout_ms=request.transaction_timeout_ms,
                    producer_id=-1,
                    producer_epoch=-1,
                ),
                _TANSU_VERSION,
                correlation_id,
                "init-pid-shim",
            )
            self.translations.append((version, correlation_id))
        else:
            # Every request here expects an answer: aiokafka's idempotent producer sends
            # acks=all, and tansu answers even acks=0.
            self.translations.append(None)
        assert self.broker is not None and self.broker.transport is not None
        self.broker.transport.write(frame)

    def from_broker(self, frame: bytes) -> None:
        translation = self.translations.popleft() if self.translations else None
        if translation is not None:
            version, correlation_id = translation
            answer = InitProducerIdResponse.decode(frame[4:], version=_TANSU_VERSION, header=True)
            frame = _encode(
                InitProducerIdResponse(
                    version=version,
                    throttle_time_ms=answer.throttle_time_ms,
                    error_code=answer.error_code,
                    producer_id=answer.producer_id,
                    producer_epoch=answer.producer_epoch,
                ),
                version,
                correlation_id,
                None,
            )
        if self.transport is not None and not self.transport.is_closing():
            self.transport.write(frame)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.broker is not None and self.broker.transport is not None:
            self.broker.transport.close()


class InitProducerIdShim:
    """``with InitProducerIdShim(tansu_address) as address:`` a broker address aiokafka's
    idempotent producer can start against."""

    def __init__(self, target: str) -> None:
        host, _, port = target.rpartition(":")
        self.target = (host, int(port))
        self.address = f"127.0.0.1:{free_port()}"
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self._server: asyncio.Server | None = None

    def __enter__(self) -> str:
        self._thread.start()
        host, _, port = self.address.rpartition(":")

        async def serve() -> asyncio.Server:
            return await self._loop.create_server(lambda: _Client(self.target), host, int(port))

        self._server = asyncio.run_coroutine_threadsafe(serve(), self._loop).result(10)
        return self.address

    def __exit__(self, *exc: object) -> None:
        server = self._server

        async def stop() -> None:
            if server is not None:
                server.close()

        asyncio.run_coroutine_threadsafe(stop(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
