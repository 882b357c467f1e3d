"""AdminHttpServer over real loopback sockets: routes, content types, errors, and that no
request, however malformed, stops it from serving the next one."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Awaitable, Callable, Generator
from typing import Any

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pidgate.proxy.operations.http import MAX_REQUEST_HEAD_BYTES, AdminHttpServer
from pidgate.proxy.operations.metrics import ProxyMetrics
from pidgate.quota.manager import QuotaManager
from pidgate.quota.policy import QuotaPolicy

Response = tuple[int, dict[str, str], bytes]


def run(test: Callable[[AdminHttpServer, dict[str, Any]], Awaitable[None]]) -> None:
    """Start a server on an ephemeral loopback port, run ``test`` against it, stop it."""

    async def main() -> None:
        metrics = ProxyMetrics(QuotaManager(QuotaPolicy(default_producer_ids_rate=5)), lambda: 0)
        metrics.request(0, 123)
        knobs: dict[str, Any] = {"ready": True, "state": {"principals": 2, "quotas": {"a": 5}}}

        async def ready() -> bool | str:
            if isinstance(knobs["ready"], Exception):
                raise knobs["ready"]
            ready = knobs["ready"]
            return ready if isinstance(ready, str) else bool(ready)

        server = AdminHttpServer(metrics, lambda: knobs["state"], ready, read_timeout_s=2.0)
        await server.start("127.0.0.1", 0)
        try:
            await test(server, knobs)
        finally:
            await server.stop()

    asyncio.run(asyncio.wait_for(main(), 30))


async def exchange(server: AdminHttpServer, raw: bytes, half_close: bool = False) -> Response:
    host, port = server.address
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(raw)
    if half_close:
        writer.write_eof()
    data = await reader.read()  # the server closes after one answer
    writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("ascii").split("\r\n")
    status = int(lines[0].split(" ")[1])
    headers = {k.lower(): v.strip() for k, v in (line.split(":", 1) for line in lines[1:])}
    return status, headers, body


async def get(server: AdminHttpServer, path: str, method: str = "GET") -> Response:
    return await exchange(server, f"{method} {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())


def test_metrics_route_serves_prometheus_text() -> None:
    async def test(server: AdminHttpServer, _: dict[str, Any]) -> None:
        status, headers, body = await get(server, "/metrics")
        assert status == 200
        assert headers["content-type"] == "text/plain; version=0.0.4; charset=utf-8"
        assert int(headers["content-length"]) == len(body)
        assert headers["connection"] == "close"
        families = {f.name: f for f in text_string_to_metric_families(body.decode())}
        assert families["pidgate_requests"].samples[0].value == 1
        assert families["pidgate_request_bytes"].samples[0].value == 123
        assert (await get(server, "/metrics?name[]=x"))[0] == 200  # query strings ignored

    run(test)


def test_healthz_and_head() -> None:
    async def test(server: AdminHttpServer, _: dict[str, Any]) -> None:
        assert await get(server, "/healthz") == (
            200,
            {
                "content-type": "text/plain; charset=utf-8",
                "content-length": "3",
                "cache-control": "no-store",
                "x-content-type-options": "nosniff",
                "connection": "close",
            },
            b"ok\n",
        )
        status, headers, body = await get(server, "/healthz", "HEAD")
        assert (status, headers["content-length"], body) == (200, "3", b"")

    run(test)


def test_readyz_follows_the_ready_callable() -> None:
    async def test(server: AdminHttpServer, knobs: dict[str, Any]) -> None:
        assert (await get(server, "/readyz"))[0] == 200
        knobs["ready"] = False
        assert (await get(server, "/readyz"))[:3:2] == (503, b"not ready\n")
        knobs["ready"] = ConnectionRefusedError("upstream down")
        assert (await get(server, "/readyz"))[0] == 503
        knobs["ready"] = "broker listener for node 1: 127.0.0.1:9 in use"
        assert (await get(server, "/readyz"))[:3:2] == (
            503,
            b"not ready: broker listener for node 1: 127.0.0.1:9 in use\n",
        )
        knobs["ready"] = True
        assert (await get(server, "/readyz"))[0] == 200

    run(test)


def test_state_is_json() -> None:
    async def test(server: AdminHttpServer, knobs: dict[str, Any]) -> None:
        status, headers, body = await get(server, "/state")
        assert status == 200
        assert headers["content-type"] == "application/json"
        assert json.loads(body) == {"principals": 2, "quotas": {"a": 5}}
        knobs["state"] = {"odd": object()}  # not JSON-native: still an answer
        assert (await get(server, "/state"))[0] == 200

    run(test)


def test_unknown_path_and_method() -> None:
    async def test(server: AdminHttpServer, _: dict[str, Any]) -> None:
        assert (await get(server, "/nope"))[0] == 404
        assert (await get(server, "/"))[0] == 404
        status, headers, _body = await get(server, "/state", "POST")
        assert status == 405
        assert headers["allow"] == "GET, HEAD"
        assert (await get(server, "/state", "DELETE"))[0] == 405

    run(test)


def test_garbage_gets_400_and_the_server_keeps_serving() -> None:
    async def test(server: AdminHttpServer, _: dict[str, Any]) -> None:
        cases = [
            b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03",  # a TLS ClientHello
            b"\x00\x00\x00\x15\x00\x12\x00\x03",  # a Kafka ApiVersions frame
            b"hello\r\n\r\n",
            b"GET\r\n\r\n",
            b"GET /metrics\r\n\r\n",  # HTTP/0.9
            b"GET /metrics FTP/1.0\r\n\r\n",
            b"GET metrics HTTP/1.1\r\n\r\n",
            b"GET  /metrics HTTP/1.1\r\n\r\n",
            b"GET /metrics HTTP/1.1\r\nX: \x01\r\n\r\n",
        ]
        for raw in cases:
            assert (await exchange(server, raw))[0] == 400, raw
        assert (await exchange(server, b"GET /metri", half_close=True))[0] == 400
        assert (await exchange(server, b"GET /metrics HTTP/2.0\r\n\r\n"))[0] == 505
        too_long = b"GET /metrics HTTP/1.1\r\nX: " + b"a" * MAX_REQUEST_HEAD_BYTES + b"\r\n\r\n"
        assert (await exchange(server, too_long))[0] == 431
        # Connect and close without a byte: nothing to answer, nothing breaks.
        _reader, writer = await asyncio.open_connection(*server.address)
        writer.close()
        assert (await get(server, "/healthz"))[0] == 200
        # Bare LF line ends are accepted.
        assert (await exchange(server, b"GET /healthz HTTP/1.0\n\n"))[0] == 200

    run(test)


def test_a_silent_peer_times_out_without_blocking_others() -> None:
    async def test(server: AdminHttpServer, _: dict[str, Any]) -> None:
        reader, writer = await asyncio.open_connection(*server.address)
        writer.write(b"GET /healthz HTTP/1.1\r\n")  # never finishes its head
        assert (await get(server, "/healthz"))[0] == 200
        data = await asyncio.wait_for(reader.read(), 5)
        assert data.startswith(b"HTTP/1.1 408 ")
        writer.close()

    run(test)


def test_handler_errors_become_500() -> None:
    async def test(server: AdminHttpServer, knobs: dict[str, Any]) -> None:
        knobs["state"] = None

        def broken() -> dict[str, Any]:
            raise RuntimeError("bug")

        server._state = broken
        assert (await get(server, "/state"))[0] == 500
        assert (await get(server, "/healthz"))[0] == 200

    run(test)


def test_stop_closes_open_connections() -> None:
    async def main() -> None:
        metrics = ProxyMetrics(QuotaManager(QuotaPolicy()), lambda: 0)

        async def ready() -> bool | str:
            return True

        server = AdminHttpServer(metrics, dict, ready)
        await server.start("127.0.0.1", 0)
        reader, writer = await asyncio.open_connection(*server.address)
        writer.write(b"GET /he")
        await asyncio.sleep(0.05)
        await asyncio.wait_for(server.stop(), 3)
        assert await asyncio.wait_for(reader.read(), 3) == b""
        writer.close()
        with pytest.raises(RuntimeError):
            _ = server.address  # not listening any more

    asyncio.run(main())


def test_a_scrape_over_many_principals_lets_the_event_loop_run_between_its_steps() -> None:
    """/metrics drives ProxyMetrics.render_in_steps, giving the loop back between steps: the
    proxy's connections are served during a scrape over many principals instead of waiting for
    all of it (one go took ~0.7 s at 100k principals on the development VM)."""
    events: list[str] = []

    class Traced(ProxyMetrics):
        def render_in_steps(
            self, step_principals: int = 1000, step_labels: int = 100
        ) -> Generator[None, None, bytes]:
            inner = super().render_in_steps(step_principals, step_labels)
            while True:
                try:
                    next(inner)
                except StopIteration as done:
                    body: bytes = done.value
                    return body
                events.append("step")
                yield

    async def main() -> None:
        quota = QuotaManager(QuotaPolicy(default_producer_ids_rate=5))
        for i in range(3_000):
            quota.admit(f"User:u{i}", [i], 1_000)
        metrics = Traced(quota, lambda: 2_000)
        server = AdminHttpServer(metrics, dict, _ready_true)
        await server.start("127.0.0.1", 0)
        stop = asyncio.Event()

        async def other_work() -> None:  # stands for the proxy's connections
            while not stop.is_set():
                events.append("tick")
                await asyncio.sleep(0)

        ticker = asyncio.create_task(other_work())
        try:
            status, _, body = await get(server, "/metrics")
        finally:
            stop.set()
            await ticker
            await server.stop()
        assert status == 200
        families = {f.name: f for f in text_string_to_metric_families(body.decode())}
        assert families["pidgate_principals_tracked"].samples[0].value == 3_000
        first, last = events.index("step"), len(events) - 1 - events[::-1].index("step")
        during = events[first : last + 1]
        assert during.count("step") >= 2 * 3 + 1001 // 100  # two passes over 3,000, labels
        # Between every two steps the loop ran the other task: never two steps in a row.
        assert ("step", "step") not in set(itertools.pairwise(during))

    asyncio.run(asyncio.wait_for(main(), 30))


async def _ready_true() -> bool:
    return True
