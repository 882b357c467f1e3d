"""Which error code a throttled client gets, chosen from its ApiVersions client_software_name."""

from __future__ import annotations

from pidgate.config import RejectionSettings
from pidgate.proxy.quota_control.admission import rejection_error_code

TABLE = RejectionSettings().error_codes


def test_librdkafka_based_clients_get_a_code_librdkafka_retries() -> None:
    # librdkafka fails a message permanently on 89; 19 NOT_ENOUGH_REPLICAS is retried.
    assert rejection_error_code("confluent-kafka-python", TABLE) == 19
    assert rejection_error_code("librdkafka", TABLE) == 19
    assert rejection_error_code("confluent-kafka-go", TABLE) == 19


def test_kafka_python_gets_throttling_quota_exceeded_which_it_retries() -> None:
    assert rejection_error_code("kafka-python", TABLE) == 89


def test_unidentified_clients_get_a_code_every_client_retries() -> None:
    # 89 is unknown to aiokafka 0.14 (it gives the record up) and to Java clients before 2.7;
    # 19 NOT_ENOUGH_REPLICAS is retriable in every client.
    assert rejection_error_code(None, TABLE) == 19
    assert rejection_error_code("apache-kafka-java", TABLE) == 19
    assert rejection_error_code("some-new-client", TABLE) == 19


def test_a_client_that_names_no_software_is_matched_by_its_client_id() -> None:
    # aiokafka sends ApiVersions v0 (no client_software_name); its client_id says who it is.
    table = {"default": 89, "aiokafka": 19}
    assert rejection_error_code(None, table, "aiokafka-producer-3") == 19
    assert rejection_error_code(None, table, "my-app") == 89
    assert rejection_error_code(None, table, None) == 89
    # A client that names its software is taken at its word, whatever its client_id says.
    assert rejection_error_code("kafka-python", table, "aiokafka-producer-1") == 89


def test_longest_match_wins_and_matching_ignores_case() -> None:
    table = {"default": 89, "kafka": 7, "confluent-kafka": 19}
    assert rejection_error_code("Confluent-Kafka-Python", table) == 19
    assert rejection_error_code("kafka-python", table) == 7
