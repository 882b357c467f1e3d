"""The request path's per-connection shortcuts (issue "lean") never change what a client sees:
a connection reuses its last Produce header only while the bytes after the correlation id are
the same, so a client_id that changes mid-connection is seen at once."""

from __future__ import annotations

import pytest

from tests.integration.conftest import anonymous_quota
from tests.integration.helpers import (
    REJECTED_DEFAULT,
    THROTTLING_QUOTA_EXCEEDED,
    KafkaSocket,
    create_topic,
    decode_produce,
    encode_request,
    init_producer_id,
    produce_partition_errors,
    produce_request,
    record_batch,
    unique_name,
)

pytestmark = pytest.mark.integration


def _produce(topic: str, producer_id: int, correlation_id: int, client_id: str) -> bytes:
    request = produce_request(8, topic, record_batch(producer_id, 0, base_sequence=0))
    return encode_request(request, 8, correlation_id, client_id=client_id)


def test_a_client_id_changed_mid_connection_picks_the_rejection_code_at_once(
    start_proxy,
) -> None:
    # One new PID per hour: the first Produce takes the token, every later new PID is rejected.
    proxy = start_proxy(quota=anonymous_quota(1, 3600))
    topic = unique_name("request-path")
    create_topic(proxy.bootstrap, topic)
    pids = [init_producer_id(proxy.bootstrap)[0] for _ in range(4)]

    with KafkaSocket(proxy.bootstrap, timeout_s=20) as conn:
        # No ApiVersions first: the code table is matched on client_id (aiokafka's case).
        sent = [
            ("plain-client", pids[0]),  # admitted: takes the only token
            ("plain-client", pids[1]),  # the same header bytes as before: the reused header
            ("kafka-python", pids[2]),  # another client_id of the same length: must be seen
            ("plain-client", pids[3]),  # and back again
        ]
        codes = []
        for correlation_id, (client_id, pid) in enumerate(sent, start=1):
            conn.sendall(_produce(topic, pid, correlation_id, client_id))
            response = decode_produce(conn.recv_frame(), 8)
            assert response.header.correlation_id == correlation_id
            codes.append(produce_partition_errors(response))
            # The rejection mutes the connection for its throttle (capped at 3 s by default);
            # the next request is read after it, then judged on its own header.
    assert codes == [
        [0],
        [REJECTED_DEFAULT],
        [THROTTLING_QUOTA_EXCEEDED],
        [REJECTED_DEFAULT],
    ]
