"""The floor: the simplest uvloop process doing pidgate's I/O, a byte-copying TCP forwarder.

    python benchmarks/forwarder.py LISTEN_PORT UPSTREAM_HOST:UPSTREAM_PORT

One asyncio.Protocol pair per client connection, copying bytes both ways with
``transport.write`` as they arrive: no framing, no parsing, no flow control. Whatever CPU
pidgate spends per request above this process's is pidgate's own Python. Not a test.
"""

from __future__ import annotations

import asyncio
import sys
from typing import cast

import uvloop


class Upstream(asyncio.Protocol):
    def __init__(self, client: asyncio.Transport) -> None:
        self.client = client

    def data_received(self, data: bytes) -> None:
        self.client.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        self.client.close()


class Client(asyncio.Protocol):
    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.upstream: asyncio.Transport | None = None
        self.pending: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        upstream, _ = await loop.create_connection(
            lambda: Upstream(self.transport), self.host, self.port
        )
        self.upstream = upstream
        for data in self.pending:
            upstream.write(data)
        self.pending.clear()

    def data_received(self, data: bytes) -> None:
        if self.upstream is None:
            self.pending.append(data)
        else:
            self.upstream.write(data)

    def connection_lost(self, exc: Exception | None) -> None:
        if self.upstream is not None:
            self.upstream.close()


async def serve(listen_port: int, host: str, port: int) -> None:
    loop = asyncio.get_running_loop()
    server = await loop.create_server(lambda: Client(host, port), "127.0.0.1", listen_port)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    upstream_host, _, upstream_port = sys.argv[2].rpartition(":")
    uvloop.run(serve(int(sys.argv[1]), upstream_host, int(upstream_port)))
