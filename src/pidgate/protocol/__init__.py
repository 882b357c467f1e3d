"""Sans-IO Kafka wire codec: bytes in, frozen dataclasses or bytes out.

Owns framing, request/response headers, the hand-written Produce walk, locally built
ProduceResponses, ApiVersions narrowing and broker-endpoint rewriting.

Must not import: asyncio, socket, time, logging, structlog, prometheus_client, or
``pidgate.quota`` / ``pidgate.proxy`` / ``pidgate.config``. Like h11, it never does I/O and never
reads a clock, so every function here is deterministic and testable without a socket.
"""
