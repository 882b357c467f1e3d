"""Quota administration through pidgate in front of real Kafka 3.1 and 4.1 (KIP-546 client-quota
APIs): pidgate answers ``producer_ids_rate`` itself and sends every other quota key to the broker.

What an operator does, with the tools they already have: the Java AdminClient
(``java/QuotaAdmin.java``: alterClientQuotas / describeClientQuotas), ``kafka-configs
--describe`` and ``--alter``, and ``pidgate quotas``; then what the producers of the user whose
quota changed see. Everything goes through pidgate's SASL_PLAINTEXT listener as ``admin``;
the producers authenticate as ``alice``.

Broker-side quotas are set on a user name of this test's own (``qa-<random>``), so the shared
session brokers keep no state another test could notice.
"""

from __future__ import annotations

import re
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from kafka import KafkaProducer

from pidgate.cli import main
from pidgate.proxy.background import BackgroundProxy
from tests.realkafka.gate import GateStarter
from tests.realkafka.javaprog import run_java
from tests.realkafka.kafka import SASL_USERS, KafkaRun

pytestmark = pytest.mark.realkafka

ADMIN_JAAS = (
    "org.apache.kafka.common.security.plain.PlainLoginModule required "
    f'username="admin" password="{SASL_USERS["admin"]}";'
)

#: kafka-python settings for the same login (pidgate's own connections to the cluster).
ADMIN_SECURITY = {
    "security_protocol": "SASL_PLAINTEXT",
    "sasl_mechanism": "PLAIN",
    "sasl_plain_username": "admin",
    "sasl_plain_password": SASL_USERS["admin"],
}


def admin_properties(folder: Path) -> Path:
    """Client properties for the SASL listener as ``admin`` (Java tools and ``pidgate quotas``)."""
    path = folder / "admin.properties"
    path.write_text(
        f"security.protocol=SASL_PLAINTEXT\nsasl.mechanism=PLAIN\nsasl.jaas.config={ADMIN_JAAS}\n"
    )
    return path


def quota_admin(kafka: KafkaRun, bootstrap: str, config: Path, *ops: str) -> list[str]:
    """Run java/QuotaAdmin.java (the distribution's own AdminClient); its output lines."""
    result = run_java(
        kafka.home, "QuotaAdmin.java", bootstrap, *ops, properties={"admin.config": str(config)}
    )
    assert result.returncode == 0, result.stdout + result.stderr[-3000:]
    return result.stdout.splitlines()


def rates(gate: BackgroundProxy) -> dict[str, int]:
    return gate.call_and_wait(gate.server.quota_control.effective_rates)


def user_counter(gate: BackgroundProxy, name: str, user: str) -> float:
    """A per-user counter from pidgate's /metrics text, e.g. ``pidgate_producer_ids_new_total``
    (new PIDs admitted with a token) or ``pidgate_producer_ids_throttled_total`` (distinct PIDs
    rejected); labelled by the quota entity's name (``alice``)."""
    text = gate.call_and_wait(lambda: gate.server.metrics.render().decode())
    pattern = rf'^{name}{{[^}}]*\buser="{re.escape(user)}"[^}}]*}} (\S+)$'
    match = re.search(pattern, text, re.MULTILINE)
    return float(match.group(1)) if match else 0.0


def throttled_ids(gate: BackgroundProxy, user: str) -> float:
    return user_counter(gate, "pidgate_producer_ids_throttled_total", user)


def alice_producer(gate: BackgroundProxy) -> KafkaProducer:
    """A new idempotent producer as ``alice`` (SASL PLAIN): a new PID at its first send."""
    return KafkaProducer(
        bootstrap_servers=gate.bootstrap,
        security_protocol="SASL_PLAINTEXT",
        sasl_mechanism="PLAIN",
        sasl_plain_username="alice",
        sasl_plain_password=SASL_USERS["alice"],
        enable_idempotence=True,
        acks="all",
        client_id=f"quota-admin-{uuid.uuid4().hex[:6]}",
    )


def pidgate_quotas(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["quotas", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def quota_lines(output: str, entity: str) -> list[dict[str, str]]:
    """Each ``Quota configs for <entity> are a=1.0, b=2.0`` line of ``output`` as
    {"a": "1.0", "b": "2.0"} (kafka-configs prints the keys in no documented order; other lines,
    e.g. SCRAM credentials or pidgate's own log, are skipped)."""
    prefix = f"Quota configs for {entity} are "
    return [
        dict(pair.split("=", 1) for pair in line.removeprefix(prefix).split(", "))
        for line in output.splitlines()
        if line.startswith(prefix)
    ]


def test_quota_admin_through_pidgate(
    any_kafka: KafkaRun,
    start_gate: GateStarter,
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
) -> None:
    # A broker fresh from its start hands out no PID until it has its first PID block (4.1
    # answers COORDINATOR_LOAD_IN_PROGRESS, a fresh 3.1 stalls): get one straight from it first,
    # so the probe at pidgate's start finds the frontier. Cold starts are another test's topic.
    warm = KafkaProducer(bootstrap_servers=any_kafka.first_bootstrap, enable_idempotence=True)
    try:
        warm.send(f"quota-admin-warm-{uuid.uuid4().hex[:8]}", b"warm").get(timeout=60)
    finally:
        warm.close(timeout=5)
    # pidgate reaches the SASL listener itself for the PID frontier probe that begins every
    # user's enforcement at its start (users.<default> limits alice too) with
    # shared_store.security; without it alice's unknown PIDs would pass free in learning mode
    # for the grace period.
    gate = start_gate(
        any_kafka,
        sasl=True,
        quota={"users": {"<default>": {"producer_ids_rate": 100}}},
        shared_store={"security": ADMIN_SECURITY},
    )
    config = admin_properties(tmp_path)
    qa = f"qa-{uuid.uuid4().hex[:8]}"
    topic = f"quota-admin-{uuid.uuid4().hex[:8]}"

    # The Java AdminClient: a mixed alter is split (the byte rate to the broker, producer_ids_rate
    # kept by pidgate), describe merges both; a fractional rate is refused as Kafka refuses one.
    lines = quota_admin(
        any_kafka,
        gate.bootstrap,
        config,
        f"alter:{qa}:producer_ids_rate=4,producer_byte_rate=1048576",
        "alter:alice:producer_ids_rate=2",
        f"await:{qa}:producer_byte_rate,producer_ids_rate",
        "alter:alice:producer_ids_rate=2.5",
    )
    assert lines == [
        f"ALTERED {qa}",
        "ALTERED alice",
        f"DESCRIBED {qa} producer_byte_rate=1048576.0,producer_ids_rate=4.0",
        "FAILED alter:alice:producer_ids_rate=2.5 InvalidRequestException: "
        "producer_ids_rate cannot be a fractional value.",
    ]
    assert rates(gate) == {"<default>": 100, qa: 4, "alice": 2}

    # kafka-configs, four runs at once (each is a JVM start): straight at the broker only the
    # byte rate exists; through pidgate both keys show; --alter refuses producer_ids_rate in the
    # tool itself, before sending anything.
    through = ["--bootstrap-server", gate.bootstrap, "--command-config", str(config)]
    users = ["--entity-type", "users"]
    with ThreadPoolExecutor(4) as pool:
        runs = [
            pool.submit(any_kafka.run_tool, "kafka-configs", *args)
            for args in (
                [
                    "--bootstrap-server",
                    any_kafka.first_bootstrap,
                    "--describe",
                    *users,
                    "--entity-name",
                    qa,
                ],
                [*through, "--describe", *users, "--entity-name", qa],
                [*through, "--describe", *users, "--entity-default"],
                [
                    *through,
                    "--alter",
                    *users,
                    "--entity-name",
                    "alice",
                    "--add-config",
                    "producer_ids_rate=5",
                ],
            )
        ]
        direct, merged, default, refused = (run.result() for run in runs)
    for result in (direct, merged, default):
        assert result.returncode == 0, result.stderr[-2000:]
    entity = f"user-principal '{qa}'"
    assert quota_lines(direct.stdout, entity) == [{"producer_byte_rate": "1048576.0"}]
    assert quota_lines(merged.stdout, entity) == [
        {"producer_byte_rate": "1048576.0", "producer_ids_rate": "4.0"}
    ]
    # (only our key: the default user's broker quotas, if a test set any, may show beside it)
    assert [
        values.get("producer_ids_rate")
        for values in quota_lines(default.stdout, "the default user-principal")
    ] == ["100.0"]
    assert refused.returncode == 1
    assert (
        "Only quota and SCRAM credential configs can be added for 'users' using "
        "--bootstrap-server. Unexpected config names: Set(producer_ids_rate)"
    ) in refused.stdout + refused.stderr
    assert rates(gate)["alice"] == 2

    # pidgate's own CLI reads the same merged view; it prints its own key as the integer it is
    # and Kafka's keys as kafka-configs prints them.
    command = ["--bootstrap-server", gate.bootstrap, "--command-config", str(config)]
    code, out, err = pidgate_quotas(capsys, "describe", *command, "--user", qa)
    assert code == 0, err
    assert quota_lines(out, entity) == [
        {"producer_byte_rate": "1048576.0", "producer_ids_rate": "4"}
    ]

    # Enforcement: alice's quota of 2 admits two new producers; the third is held back...
    producers: list[KafkaProducer] = []
    try:
        for n in range(2):
            producers.append(alice_producer(gate))
            producers[-1].send(topic, f"admitted-{n}".encode()).get(timeout=60)
        new_ids = user_counter(gate, "pidgate_producer_ids_new_total", "alice")
        assert new_ids == 2, gate.call_and_wait(lambda: gate.server.last_frontier)
        assert throttled_ids(gate, "alice") == 0
        producers.append(alice_producer(gate))
        held = producers[-1].send(topic, b"held")
        deadline = time.monotonic() + 30
        while throttled_ids(gate, "alice") == 0 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert throttled_ids(gate, "alice") == 1
        assert not held.is_done
        # ... until `pidgate quotas set` raises it: the held producer's record then goes through.
        # A raise keeps the bucket's level (empty) and refills it at the new rate: 10,000 per
        # hour is a token per 0.36 s.
        code, out, err = pidgate_quotas(
            capsys, "set", *command, "--user", "alice", "--producer-ids-rate", "10000"
        )
        assert code == 0, err
        assert "Completed updating config for user alice." in out.splitlines()
        held.get(timeout=60)
        assert rates(gate)["alice"] == 10000
        assert throttled_ids(gate, "alice") == 1
    finally:
        for producer in producers:
            producer.close(timeout=5)
