"""Which error code a throttled client gets, chosen from its ApiVersions client_software_name."""

from __future__ import annotations

from pidgate.config import RejectionSettings
from pidgate.proxy.admission import rejection_error_code

TABLE = RejectionSettings().error_codes


def test_librdkafka_based_clients_get_a_code_librdkafka_retries() -> None:
    # librdkafka fails a message permanently on 89; 19 NOT_ENOUGH_REPLICAS is retried.
    assert rejection_error_code("confluent-kafka-python", TABLE) == 19
    assert rejection_error_code("librdkafka", TABLE) == 19
    assert rejection_error_code("confluent-kafka-go", TABLE) == 19


def test_java_kafka_python_and_unknown_clients_get_throttling_quota_exceeded() -> None:
    assert rejection_error_code("apache-kafka-java", TABLE) == 89
    assert rejection_error_code("kafka-python", TABLE) == 89
    assert rejection_error_code(None, TABLE) == 89  # ApiVersions < v3 (aiokafka) sends no name


def test_longest_match_wins_and_matching_ignores_case() -> None:
    table = {"default": 89, "kafka": 7, "confluent-kafka": 19}
    assert rejection_error_code("Confluent-Kafka-Python", table) == 19
    assert rejection_error_code("kafka-python", table) == 7
