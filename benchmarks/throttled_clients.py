"""What a throttled producer experiences, per client library and per throttle cap.

For each client (librdkafka via confluent-kafka, kafka-python, aiokafka) and each value of
``rejection.max_throttle_time_ms``, with every client setting at its default except
idempotence: a fresh pidgate (ANONYMOUS quota 1 new PID per ``--window`` seconds) whose token was
just spent, then a new producer that sends ``--records`` records to one partition. The token
comes back within the window, well inside every client's delivery timeout (120 s, librdkafka
300 s), so a producer that never gives up a record is what the quota means.

Printed per run: rejected Produce requests (each one a retry the client made), seconds until
its first and last record were acknowledged, records failed, records never resolved by the
deadline, and the PIDs/epochs its batches carry in the broker's log (a reset or epoch bump
shows as more than one). Everything is real: tansu, pidgate, the client libraries; aiokafka
goes through the same InitProducerId peer the tests use (tansu cannot start it otherwise).

    .venv/bin/python benchmarks/throttled_clients.py [--window 30] [--caps 1000,3000,10000,30000]
    .venv/bin/python benchmarks/throttled_clients.py --kafka-python-expiry [--caps 3000]

``--kafka-python-expiry`` shows a kafka-python 3.0 bug instead: its idempotent producer with
``delivery_timeout_ms=30000`` is throttled for 45 s (window 45 s), so its first 100 records
expire; 50 s in it sends 100 more, which never resolve (it reset its producer ID on the expiry
and never asks for a new one), whatever the cap.
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.integration.broker_log import fetch_batch_headers
from tests.integration.conftest import anonymous_quota, proxy_settings
from tests.integration.helpers import (
    KafkaSocket,
    create_topic,
    init_producer_id,
    produce_frame,
    unique_name,
)
from tests.integration.init_pid_shim import InitProducerIdShim

from pidgate.demo.broker import EmbeddedBroker, free_port
from pidgate.proxy.background import BackgroundProxy

DEADLINE_S = 200.0


@dataclass
class Outcome:
    acked_s: list[float] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def ack(self, started: float) -> None:
        with self.lock:
            self.acked_s.append(time.monotonic() - started)

    def fail(self, error: object) -> None:
        with self.lock:
            self.failed.append(str(error)[:120])


def run_librdkafka(bootstrap: str, topic: str, records: int, outcome: Outcome) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    started = time.monotonic()

    def on_delivery(error: Any, _message: Any) -> None:
        if error is None:
            outcome.ack(started)
        else:
            outcome.fail(error)

    for i in range(records):
        producer.produce(topic, b"r%d" % i, partition=0, on_delivery=on_delivery)
    producer.flush(DEADLINE_S)


def run_kafka_python(bootstrap: str, topic: str, records: int, outcome: Outcome) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True)
    started = time.monotonic()
    futures = [producer.send(topic, b"r%d" % i, partition=0) for i in range(records)]
    for future in futures:
        future.add_callback(lambda _m: outcome.ack(started))
        future.add_errback(outcome.fail)
    producer.flush(DEADLINE_S)
    producer.close(5)


def run_aiokafka(bootstrap: str, topic: str, records: int, outcome: Outcome) -> None:
    from aiokafka import AIOKafkaProducer

    async def main() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True)
        await producer.start()
        started = time.monotonic()
        try:
            futures = [await producer.send(topic, b"r%d" % i, partition=0) for i in range(records)]
            for future in futures:
                future.add_done_callback(
                    lambda f: outcome.fail(f.exception()) if f.exception() else outcome.ack(started)
                )
            await asyncio.wait(futures, timeout=DEADLINE_S)
        finally:
            await producer.stop()

    asyncio.run(main())


CLIENTS = {"librdkafka": run_librdkafka, "kafka-python": run_kafka_python, "aiokafka": run_aiokafka}


def measure(
    broker: EmbeddedBroker, client: str, cap_ms: int, window_s: int, records: int
) -> dict[str, Any]:
    listen = f"127.0.0.1:{free_port()}"
    with InitProducerIdShim(broker.bootstrap) as upstream:
        settings = proxy_settings(
            broker,
            quota=anonymous_quota(1, window_s),
            rejection={"max_throttle_time_ms": cap_ms},
            proxy={
                "mode": "sidecar",
                "upstream": [upstream],
                "listen": listen,
                "advertised_endpoints": {broker.bootstrap: listen},
            },
        )
        with BackgroundProxy(settings) as proxy:
            topic = unique_name(f"throttled-{client}")
            create_topic(proxy.bootstrap, topic)
            spender, _ = init_producer_id(proxy.bootstrap)
            with KafkaSocket(proxy.bootstrap) as conn:
                conn.sendall(produce_frame(topic, spender, 1))  # the token is gone
                conn.recv_frame()
            outcome = Outcome()
            worker = threading.Thread(
                target=CLIENTS[client], args=(proxy.bootstrap, topic, records, outcome)
            )
            worker.start()
            worker.join(DEADLINE_S + 30)
            rejected = proxy.call_and_wait(lambda: proxy.server.counters.produce_requests_rejected)
    headers = [
        h for h in fetch_batch_headers(broker.bootstrap, topic, [0]) if h.producer_id != spender
    ]
    return {
        "client": client,
        "cap_ms": cap_ms,
        "rejected_requests": rejected,
        "first_ack_s": round(min(outcome.acked_s), 1) if outcome.acked_s else None,
        "last_ack_s": round(max(outcome.acked_s), 1) if outcome.acked_s else None,
        "acked": len(outcome.acked_s),
        "failed": len(outcome.failed),
        "unresolved": records - len(outcome.acked_s) - len(outcome.failed),
        "pid_epochs_in_log": sorted({(h.producer_id, h.producer_epoch) for h in headers}),
        "first_error": outcome.failed[0] if outcome.failed else "",
    }


def kafka_python_expiry(broker: EmbeddedBroker, cap_ms: int) -> dict[str, Any]:
    from kafka import KafkaProducer

    window_s = 45
    with BackgroundProxy(
        proxy_settings(
            broker, quota=anonymous_quota(1, window_s), rejection={"max_throttle_time_ms": cap_ms}
        )
    ) as proxy:
        topic = unique_name("kafka-python-expiry")
        create_topic(proxy.bootstrap, topic)
        spender, _ = init_producer_id(proxy.bootstrap)
        with KafkaSocket(proxy.bootstrap) as conn:
            conn.sendall(produce_frame(topic, spender, 1))
            conn.recv_frame()
        producer = KafkaProducer(
            bootstrap_servers=proxy.bootstrap, enable_idempotence=True, delivery_timeout_ms=30_000
        )
        outcomes: dict[str, Outcome] = {"before_expiry": Outcome(), "after_expiry": Outcome()}
        started = time.monotonic()
        for name in outcomes:
            if name == "after_expiry":
                time.sleep(window_s + 5 - (time.monotonic() - started))
            for i in range(100):
                future = producer.send(topic, b"%s-%d" % (name.encode(), i), partition=0)
                future.add_callback(lambda _m, o=outcomes[name]: o.ack(started))
                future.add_errback(outcomes[name].fail)
        try:
            producer.flush(60)
        except Exception as error:  # kafka-python raises KafkaTimeoutError when stuck
            print(f"flush: {error!r}"[:120])
        producer.close(5)
    return {
        "cap_ms": cap_ms,
        **{
            name: {
                "acked": len(o.acked_s),
                "failed": len(o.failed),
                "unresolved": 100 - len(o.acked_s) - len(o.failed),
            }
            for name, o in outcomes.items()
        },
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--window", type=int, default=30, help="quota window, seconds")
    parser.add_argument("--caps", default="1000,3000,10000,30000", help="max_throttle_time_ms")
    parser.add_argument("--records", type=int, default=100)
    parser.add_argument("--clients", default=",".join(CLIENTS))
    parser.add_argument("--kafka-python-expiry", action="store_true")
    args = parser.parse_args()
    with EmbeddedBroker() as broker:
        if args.kafka_python_expiry:
            for cap in (int(c) for c in args.caps.split(",")):
                print("EXPIRY", kafka_python_expiry(broker, cap), flush=True)
            return
        for client in args.clients.split(","):
            for cap in (int(c) for c in args.caps.split(",")):
                print(
                    "THROTTLED", measure(broker, client, cap, args.window, args.records), flush=True
                )


if __name__ == "__main__":
    main()
