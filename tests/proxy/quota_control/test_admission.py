"""Which error code a throttled client gets, chosen from its ApiVersions client_software_name;
which observers the Gatekeeper hands the request's full walk."""

from __future__ import annotations

from pidgate.config import RejectionSettings
from pidgate.demo.tracking import StormDecisionTracker
from pidgate.protocol.produce import ProduceRequestSummary
from pidgate.proxy.decision_counters import DecisionCounters
from pidgate.proxy.operations.event_log import EventLog
from pidgate.proxy.operations.metrics import ProxyMetrics
from pidgate.proxy.quota_control.admission import (
    UNREAD_REQUEST,
    Gatekeeper,
    ProduceContext,
    reads_request,
    rejection_error_code,
)
from pidgate.proxy.quota_control.fleet import FleetOutbox
from pidgate.quota.manager import Admitted, Decision, QuotaManager
from pidgate.quota.policy import QuotaPolicy

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


# -- which observers are handed the request's full walk (issue #25) ---------------------------

CONTEXT = ProduceContext(
    principal="User:alice", client_id="c", client_software_name=None, peer="127.0.0.1:1"
)
SUMMARY = ProduceRequestSummary(None, -1, 1000, ())


class Told:
    """An observer that reads the request (says nothing about it: the default)."""

    def __init__(self) -> None:
        self.told: list[tuple[ProduceRequestSummary, Decision]] = []

    def on_decision(
        self, context: ProduceContext, request: ProduceRequestSummary, decision: Decision
    ) -> None:
        self.told.append((request, decision))


class ToldBlind(Told):
    reads_request = False


def _gatekeeper(*observers: Told) -> Gatekeeper:
    policy = QuotaPolicy(default_producer_ids_rate=10, grandfather_grace_ms=0)
    return Gatekeeper(QuotaManager(policy), observers)


def test_a_new_pid_is_not_walked_in_full_when_no_told_observer_reads_the_request() -> None:
    walks: list[int] = []

    def summarize() -> ProduceRequestSummary:
        walks.append(1)
        return SUMMARY

    blind = ToldBlind()
    gate = _gatekeeper(blind)
    decision = gate.check_producer_ids(CONTEXT, (1,), summarize)
    assert decision == Admitted((1,), 0)
    assert walks == []
    assert blind.told == [(UNREAD_REQUEST, decision)]
    # One observer that reads it: walked once, and every observer gets the real summary.
    reader = ToldBlind(), Told()
    gate = _gatekeeper(*reader)
    decision = gate.check_producer_ids(CONTEXT, (2,), summarize)
    assert walks == [1]
    assert reader[0].told == reader[1].told == [(SUMMARY, decision)]


def test_the_express_lanes_admission_is_told_as_the_decision_would_be() -> None:
    checked, told = Told(), Told()
    _gatekeeper(checked).check_producer_ids(CONTEXT, (5,), lambda: SUMMARY)
    lane = _gatekeeper(told)
    lane.last_decision_failed = True
    lane.tell_admitted_new(CONTEXT, Admitted((5,), 0), lambda: SUMMARY)
    assert told.told == checked.told == [(SUMMARY, Admitted((5,), 0))]
    assert lane.last_decision_failed is False


def test_pidgates_own_observers_say_whether_they_read_the_request() -> None:
    # Only the event log writes the request's batches (topic, partition, epoch) into its lines.
    assert reads_request(EventLog)
    for counting in (DecisionCounters, ProxyMetrics, FleetOutbox, StormDecisionTracker):
        assert not reads_request(counting), counting
