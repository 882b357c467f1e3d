"""A reference point between the floor and pidgate: the least a Kafka-aware gate does per
request, in pure Python on uvloop.

    python benchmarks/minimal_gate.py LISTEN_PORT UPSTREAM_HOST:UPSTREAM_PORT [--quota] [--typed]

Per request: cut the frame out of the stream, read its header (api_key, api_version,
correlation_id), for a Produce read 8 bytes of the body and count them in a dict (a stand-in
for finding the PID and asking whether it is known: no walk), and remember the correlation id;
per response: cut the frame, check its correlation id against the oldest one owed, pass it on.
No quota, no metrics, no flow control, no endpoint rewriting (so only raw-frame workloads can
go through it). What it costs above ``forwarder.py`` is what any Python process that reads
Kafka frames pays on this machine; what pidgate costs above it is pidgate's own work
(``small_requests.py --minimal-gate``). Not a test, not a product.

``--quota`` replaces the dict stand-in with the work KIP-936 cannot skip, done by pidgate's own
functions: the lean walk of the Produce body (``produce_acks_and_producer_ids``: acks and every
batch's PID) and the quota decision for those PIDs (``QuotaManager.admit``, one principal, quota
high enough that nothing is rejected). Nothing else of pidgate (no order guard, observers,
metrics, flow control, idle checks): what this costs above the floor is the least a pure-Python
gate with a PID quota pays. The request header is cut by hand for the benchmark's own frames
(a client_id, no tagged fields), not parsed in general.

``--typed`` runs the same gate written as typed Cython classes (``minimal_gate_typed.pyx``,
compiled here by pyximport on first use: Cython must be importable): frames cut and headers
read in C, the walk and the quota still pidgate's Python-level calls. What it costs above the
floor is what a compiled per-connection path could reach with the quota as it is (issue #25).
"""

from __future__ import annotations

import asyncio
import struct
import sys
import tempfile
import time
from collections import deque
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import cast

import uvloop

from pidgate.protocol.produce import produce_acks_and_producer_ids
from pidgate.quota.manager import QuotaManager, QuotaPolicy

_HEADER = struct.Struct(">ihhi")  # size, api_key, api_version, correlation_id
_CORRELATION_ID = struct.Struct(">i")
_SIZE = struct.Struct(">i")
seen_producer_ids: dict[int, int] = {}
quota: QuotaManager | None = None  # set by --quota


def cut_frames(buffer: bytearray) -> list[bytes]:
    """Every complete size-prefixed frame at the start of ``buffer``, removed from it."""
    frames = []
    while len(buffer) >= 4:
        end = 4 + _SIZE.unpack_from(buffer)[0]
        if len(buffer) < end:
            break
        frames.append(bytes(buffer[:end]))
        del buffer[:end]
    return frames


class Upstream(asyncio.Protocol):
    def __init__(self, client: Client) -> None:
        self.client = client
        self.buffer = bytearray()

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        owed = self.client.owed
        frames = cut_frames(self.buffer)
        for response in frames:
            if _CORRELATION_ID.unpack_from(response, 4)[0] != owed.popleft():
                raise RuntimeError("a response out of order")
        if frames:
            self.client.transport.write(b"".join(frames))

    def connection_lost(self, exc: Exception | None) -> None:
        self.client.transport.close()


class Client(asyncio.Protocol):
    def __init__(self, host: str, port: int) -> None:
        self.host, self.port = host, port
        self.upstream: asyncio.Transport | None = None
        self.pending: list[bytes] = []
        self.buffer = bytearray()
        self.owed: deque[int] = deque()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass
        asyncio.get_running_loop().create_task(self._connect())

    async def _connect(self) -> None:
        loop = asyncio.get_running_loop()
        upstream, _ = await loop.create_connection(lambda: Upstream(self), self.host, self.port)
        self.upstream = upstream
        for data in self.pending:
            upstream.write(data)
        self.pending.clear()

    def data_received(self, data: bytes) -> None:
        self.buffer += data
        frames = cut_frames(self.buffer)
        for request in frames:
            _, api_key, api_version, correlation_id = _HEADER.unpack_from(request)
            if api_key == 0 and quota is not None:
                client_id_bytes = int.from_bytes(request[12:14], "big", signed=True)
                body_at = 14 + max(client_id_bytes, 0) + (1 if api_version >= 9 else 0)
                _, producer_ids = produce_acks_and_producer_ids(
                    memoryview(request)[body_at:], api_version
                )
                if producer_ids:
                    quota.admit("benchmark", producer_ids, time.time_ns() // 1_000_000)
            elif api_key == 0 and len(request) > 120:
                stand_in = int.from_bytes(request[-118:-110], "big")
                seen_producer_ids[stand_in] = seen_producer_ids.get(stand_in, 0) + 1
            self.owed.append(correlation_id)
        if not frames:
            return
        data = b"".join(frames)
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


def _typed_serve() -> Callable[[int, str, int], Coroutine[None, None, None]]:
    """``minimal_gate_typed.serve``, the module compiled on first use (its quota set)."""
    try:
        import pyximport
    except ImportError:
        sys.exit("minimal_gate.py --typed needs Cython: .venv/bin/pip install 'Cython>=3.0'")
    sys.path.insert(0, str(Path(__file__).parent))
    pyximport.install(language_level=3, build_dir=str(Path(tempfile.gettempdir()) / "pidgate-pyx"))
    import minimal_gate_typed  # type: ignore[import-not-found]

    minimal_gate_typed.quota = quota
    minimal_gate_typed.inline = "--inline" in sys.argv[3:]
    return cast(Callable[[int, str, int], Coroutine[None, None, None]], minimal_gate_typed.serve)


if __name__ == "__main__":
    if "--quota" in sys.argv[3:]:
        quota = QuotaManager(QuotaPolicy(default_producer_ids_rate=1_000_000_000))
    upstream_host, _, upstream_port = sys.argv[2].rpartition(":")
    run_server = _typed_serve() if "--typed" in sys.argv[3:] else serve
    uvloop.run(run_server(int(sys.argv[1]), upstream_host, int(upstream_port)))
