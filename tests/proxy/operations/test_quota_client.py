"""What ``pidgate quotas describe`` prints: kafka-configs' lines, Java's number format."""

from __future__ import annotations

import pytest

from pidgate.proxy.operations.quota_client import DescribedEntry, format_describe, java_double


@pytest.mark.parametrize(
    ("value", "text"),
    [(50, "50.0"), (0.0, "0.0"), (0.5, "0.5"), (9999999.0, "9999999.0"), (1e7, "1.0E7"),
     (12345678.0, "1.2345678E7"), (0.001, "0.001"), (0.0001, "1.0E-4"), (-2e8, "-2.0E8")],
)  # fmt: skip
def test_numbers_print_as_javas_double_to_string(value: float, text: str) -> None:
    assert java_double(value) == text


def test_lines_match_kafka_configs_describe_with_pidgates_keys_as_integers() -> None:
    entries = [
        DescribedEntry(
            (("user", None),), (("producer_ids_rate", 100.0), ("producer_ids_observe", 1.0))
        ),
        DescribedEntry(
            (("user", "alice"),), (("producer_byte_rate", 1048576.0), ("producer_ids_rate", 5.0))
        ),
        DescribedEntry((("client-id", "c1"), ("user", "bob")), (("request_percentage", 50.0),)),
    ]
    # Kafka's keys as kafka-configs prints them (Java doubles); pidgate's as the integers they
    # are (a quota of 3 is 3 new PIDs, not 3.0).
    assert format_describe(entries) == (
        "Quota configs for the default user-principal are producer_ids_rate=100, "
        "producer_ids_observe=1\n"
        "Quota configs for user-principal 'alice' are producer_byte_rate=1048576.0, "
        "producer_ids_rate=5\n"
        "Quota configs for user-principal 'bob', client-id 'c1' are request_percentage=50.0\n"
    )
