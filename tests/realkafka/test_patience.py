"""Issue "patience" on real Apache Kafka 3.1: every client delivers every record exactly once
through a quota wait of ~60 s with its default settings, including the clients with a finite
retry budget (KafkaJS ``retries: 5``, the Java console producer's ``retries=3`` and a Java
producer set to ``retries=3``), and a raised quota relieves a held producer within a second.

Each client gets a pidgate of its own (in-process, its own quota state) in front of the shared
3.1 broker, with a bucket of one new PID per 60 s already spent: the client's one PID waits
~60 s for its token. The clients run at the same time, so the whole test takes one wait.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from confluent_kafka import Consumer, Producer
from confluent_kafka.admin import AdminClient, NewTopic

from pidgate.proxy.background import BackgroundProxy
from tests.integration.helpers import (
    KafkaSocket,
    decode_produce,
    init_producer_id,
    produce_frame,
    produce_partition_errors,
)
from tests.realkafka.gate import GateStarter
from tests.realkafka.kafka import KafkaRun

RECORDS = 5
WAIT_WINDOW_S = 60
KAFKAJS_VERSION = "2.2.4"

QUOTA = {
    "producer.id.quota.window.size.seconds": WAIT_WINDOW_S,
    "users": {"ANONYMOUS": {"producer_ids_rate": 1}},
}


def create_topic(kafka: KafkaRun, topic: str) -> None:
    admin = AdminClient({"bootstrap.servers": kafka.bootstrap})
    for future in admin.create_topics([NewTopic(topic, 1, 1)]).values():
        future.result(30)


def spend_the_token(gate: BackgroundProxy, topic: str) -> None:
    """One new PID takes the bucket's only token: the next one waits a whole window."""
    pid, _ = init_producer_id(gate.bootstrap)
    with KafkaSocket(gate.bootstrap, timeout_s=30) as conn:
        conn.sendall(produce_frame(topic, pid, 1))
        assert produce_partition_errors(decode_produce(conn.recv_frame(), 8)) == [0]


def read_back(kafka: KafkaRun, topic: str, expected: int, timeout_s: float = 30) -> list[str]:
    consumer = Consumer(
        {
            "bootstrap.servers": kafka.bootstrap,
            "group.id": f"readback-{topic}",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
            "isolation.level": "read_committed",
        }
    )
    consumer.subscribe([topic])
    values: list[str] = []
    deadline = time.monotonic() + timeout_s
    try:
        while time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is not None and not message.error():
                values.append(message.value().decode())
                if len(values) == expected:  # a little longer: a duplicate would show now
                    deadline = min(deadline, time.monotonic() + 1.5)
    finally:
        consumer.close()
    return values


def expected_values(client: str) -> list[str]:
    return [f"{client}-{n}" for n in range(RECORDS)]


# -- the clients, each with its default settings ------------------------------------------------


def run_console_producer(
    kafka: KafkaRun,
    gate: BackgroundProxy,
    topic: str,
    spend: Callable[[], None],
    name: str,
    *options: str,
) -> str:
    """3.1's kafka-console-producer; idempotence needs acks=all in 3.1 (its default is acks=1).
    The JVM starts first (an idempotent Java producer asks for its PID at once, through
    pidgate); only then is the token spent and the records typed, so the wait is a whole one."""
    process = subprocess.Popen(
        [
            kafka.tool("kafka-console-producer"),
            "--bootstrap-server",
            gate.bootstrap,
            "--topic",
            topic,
            "--producer-property",
            "enable.idempotence=true",
            "--producer-property",
            "acks=all",
            *options,
        ],
        env=kafka.tool_env(),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 90
        while not gate.call_and_wait(lambda: len(gate.server.context.connections)):
            assert time.monotonic() < deadline and process.poll() is None, "JVM did not start"
            time.sleep(0.1)
        spend()
        output, _ = process.communicate(
            "".join(f"{value}\n" for value in expected_values(name)), timeout=150
        )
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(10)
    return output


def kafkajs_folder() -> Path:
    """kafkajs from the npm registry, installed once per machine into a cache folder."""
    if shutil.which("node") is None or shutil.which("npm") is None:
        pytest.skip("KafkaJS needs node and npm")
    folder = Path(tempfile.gettempdir()) / f"pidgate-kafkajs-{KAFKAJS_VERSION}"
    if not (folder / "node_modules" / "kafkajs" / "package.json").exists():
        folder.mkdir(parents=True, exist_ok=True)
        subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", "--silent", f"kafkajs@{KAFKAJS_VERSION}"],
            cwd=folder,
            check=True,
            capture_output=True,
            timeout=300,
        )
    return folder


KAFKAJS_SCRIPT = """
const { Kafka, logLevel } = require('kafkajs');
const [bootstrap, topic, count] = process.argv.slice(2);
const kafka = new Kafka({
  clientId: 'kafkajs-patience', brokers: [bootstrap], logLevel: logLevel.ERROR,
});
const producer = kafka.producer({ idempotent: true, maxInFlightRequests: 1 });
(async () => {
  await producer.connect();
  const messages = [...Array(Number(count)).keys()].map(
    n => ({ key: `k${n}`, value: `kafkajs-${n}` }));
  try {
    await producer.send({ topic, messages });
    console.log(JSON.stringify({ delivered: messages.length }));
  } catch (e) {
    console.log(JSON.stringify({ failed: e.name + ': ' + e.message }));
  }
  await producer.disconnect();
})();
"""


def run_kafkajs(gate: BackgroundProxy, topic: str, spend: Callable[[], None]) -> str:
    bootstrap = gate.bootstrap
    folder = kafkajs_folder()
    script = folder / "patience.js"
    script.write_text(KAFKAJS_SCRIPT)
    spend()
    result = subprocess.run(
        ["node", str(script), bootstrap, topic, str(RECORDS)],
        cwd=folder,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    return result.stdout + result.stderr


def run_librdkafka(gate: BackgroundProxy, topic: str, spend: Callable[[], None]) -> str:
    spend()
    producer = Producer({"bootstrap.servers": gate.bootstrap, "enable.idempotence": True})
    failures: list[str] = []

    def report(error: Any, _message: Any) -> None:
        if error is not None:
            failures.append(str(error))

    for value in expected_values("librdkafka"):
        producer.produce(topic, value.encode(), callback=report)
    left = producer.flush(150)
    return json.dumps({"left": left, "failures": failures})


def run_kafka_python(gate: BackgroundProxy, topic: str, spend: Callable[[], None]) -> str:
    from kafka import KafkaProducer

    spend()
    producer = KafkaProducer(bootstrap_servers=gate.bootstrap, enable_idempotence=True)
    futures = [producer.send(topic, value.encode()) for value in expected_values("kafkapython")]
    failures = []
    for future in futures:
        try:
            future.get(timeout=150)
        except Exception as error:
            failures.append(repr(error))
    producer.close(10)
    return json.dumps({"failures": failures})


def run_aiokafka(gate: BackgroundProxy, topic: str, spend: Callable[[], None]) -> str:
    import asyncio

    bootstrap = gate.bootstrap
    spend()

    from aiokafka import AIOKafkaProducer

    async def main() -> list[str]:
        producer = AIOKafkaProducer(bootstrap_servers=bootstrap, enable_idempotence=True)
        await producer.start()
        failures = []
        try:
            sent = [await producer.send(topic, v.encode()) for v in expected_values("aiokafka")]
            for future in sent:
                try:
                    await asyncio.wait_for(future, 150)
                except Exception as error:
                    failures.append(repr(error))
        finally:
            await producer.stop()
        return failures

    return json.dumps({"failures": asyncio.run(main())})


def test_every_client_outlasts_a_60_s_quota_wait_with_its_default_settings(
    kafka3: KafkaRun, start_gate: GateStarter
) -> None:
    Client = Callable[[BackgroundProxy, str, Callable[[], None]], str]
    clients: dict[str, Client] = {
        # 3.1's console producer as shipped: retries=3, request.timeout.ms 1500
        "console": lambda gate, topic, spend: run_console_producer(
            kafka3, gate, topic, spend, "console"
        ),
        # a Java producer with retries=3 and the default request.timeout.ms (30 s)
        "java-retries3": lambda gate, topic, spend: run_console_producer(
            kafka3,
            gate,
            topic,
            spend,
            "java-retries3",
            "--producer-property",
            "retries=3",
            "--request-timeout-ms",
            "30000",
        ),
        "kafkajs": run_kafkajs,
        "librdkafka": run_librdkafka,
        "kafkapython": run_kafka_python,
        "aiokafka": run_aiokafka,
    }
    if shutil.which("node") and shutil.which("npm"):
        kafkajs_folder()  # installed before the clock starts
    else:  # the other clients still run; KafkaJS is reported as not run
        print("KafkaJS not run: it needs node and npm", file=sys.stderr)
        del clients["kafkajs"]
    suffix = os.urandom(3).hex()
    gates: dict[str, BackgroundProxy] = {}
    topics: dict[str, str] = {}
    for name in clients:
        topics[name] = f"patience-{name}-{suffix}"
        create_topic(kafka3, topics[name])
        gates[name] = start_gate(kafka3, quota=QUOTA)
    outputs: dict[str, str] = {}
    errors: dict[str, BaseException] = {}

    spent_at: dict[str, float] = {}

    def run(name: str) -> None:
        def spend() -> None:
            spend_the_token(gates[name], topics[name])
            spent_at[name] = time.monotonic()

        try:
            outputs[name] = clients[name](gates[name], topics[name], spend)
        except BaseException as error:
            errors[name] = error

    started = time.monotonic()
    threads = [threading.Thread(target=run, args=(name,), daemon=True) for name in clients]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(200)
    elapsed_s = time.monotonic() - started
    assert not errors, errors

    for name in clients:
        # "v0": the record whose PID spent the token
        values = read_back(kafka3, topics[name], RECORDS + 1)
        assert sorted(values) == sorted([*expected_values(name), "v0"]), (name, outputs[name])
        stats = gates[name].call_and_wait(
            lambda gate=gates[name]: dict(gate.server.context.waiting_room.stats.outcomes)
        )
        # The wait was real: the client's PID was held (at least once) before its token came.
        assert stats["released"] + stats["expired"] >= 1, (name, stats)
    for name in ("console", "java-retries3"):
        assert "Error when sending" not in outputs[name], outputs[name]
    if "kafkajs" in clients:
        assert '"delivered": 5' in outputs["kafkajs"].replace(":", ": "), outputs["kafkajs"]
    # Each client's PID waited for the token its pidgate's bucket refills a window after it was
    # spent (the read-back above shows none was lost on the way).
    assert set(spent_at) == set(clients)
    assert elapsed_s > WAIT_WINDOW_S * 0.9, "the quota did not make the clients wait"
    print(json.dumps({"elapsed_s": round(elapsed_s, 1), "outputs": outputs}), file=sys.stderr)


def test_a_raised_quota_relieves_a_held_java_producer_within_a_second(
    kafka3: KafkaRun, start_gate: GateStarter
) -> None:
    gate = start_gate(kafka3, quota={**QUOTA, "producer.id.quota.window.size.seconds": 3600})
    topic = f"patience-raise-{os.urandom(3).hex()}"
    create_topic(kafka3, topic)
    spend_the_token(gate, topic)
    producer = Producer({"bootstrap.servers": gate.bootstrap, "enable.idempotence": True})
    delivered_at: list[float] = []
    producer.produce(topic, b"raised", callback=lambda e, m: delivered_at.append(time.monotonic()))
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        producer.poll(0.1)
        held = gate.call_and_wait(lambda: gate.server.context.waiting_room.held_requests)
        if held:
            break
    assert held == 1
    producer.poll(1.0)
    assert not delivered_at  # still held: the quota allows one new PID an hour
    raise_quota = gate.server.quota_control
    raised_at = time.monotonic()
    gate.call_and_wait(lambda: raise_quota.apply_remote("ANONYMOUS", 10))
    while not delivered_at and time.monotonic() < raised_at + 10:
        producer.poll(0.05)
    producer.flush(10)
    assert delivered_at and delivered_at[0] - raised_at < 1.0
    assert read_back(kafka3, topic, 2) == ["v0", "raised"]
