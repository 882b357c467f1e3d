"""The ``rejection`` section of the settings tree: how a throttled Produce is answered (error
code per client library, throttle_time_ms, holding a Produce until its tokens are there).

Owns: :class:`RejectionSettings`. Must not import: ``pidgate.config.settings`` (the root
imports this), asyncio, socket, structlog, prometheus_client, ``pidgate.proxy``.
"""

from __future__ import annotations

from pydantic import Field, field_validator, model_validator

from pidgate.config.sections import FrozenSection


class RejectionSettings(FrozenSection):
    """How a throttled Produce is answered (DESIGN.md "Rejection that every client survives")."""

    # Every client pidgate can run retries 19 NOT_ENOUGH_REPLICAS with the same PID and sequence
    # (librdkafka, kafka-python, aiokafka; the Java client's NotEnoughReplicasException is
    # retriable too). 89 THROTTLING_QUOTA_EXCEEDED says what happened, but librdkafka fails a
    # message permanently on it, aiokafka 0.14 reports it as an unknown error and gives up, and
    # Java clients before 2.7 do not know it: so 19 is the default for any client pidgate cannot
    # identify, and 89 only goes to kafka-python, which retries it (tests/integration/
    # test_throttling.py and test_client_matrix.py show each).
    error_codes: dict[str, int] = Field(
        # confluent-kafka-python contains "kafka-python": the longer key keeps it on 19.
        default_factory=lambda: {
            "default": 19,
            "kafka-python": 89,
            "confluent-kafka": 19,
            "librdkafka": 19,
        },
        description="error code for a throttled Produce per client library, matched against "
        "ApiVersions client_software_name, else the request's client_id (substring, "
        "case-insensitive, longest wins); `default` otherwise",
    )
    # KIP-91: a producer gives a record up after delivery.timeout.ms (120 s by default) and
    # kafka-python 3.0 pauses a connection for the whole throttle_time_ms it is sent. A short
    # throttle keeps every client retrying, and each retry is judged again, so a producer waits
    # only as long as the quota really makes it (README, "What throttled clients experience").
    max_throttle_time_ms: int = Field(
        3000,
        ge=0,
        description="throttle_time_ms sent with a rejection that was not held (holding off "
        "or full) is at most this, and the client connection is not read (muted, KIP-219) "
        "for the same time",
    )
    # Issue "patience": a Produce that needs tokens is held (its connection not read) until
    # they are there, so a client spends one retry per hold instead of one per few seconds.
    # Kafka clients time a request out after request.timeout.ms (30 s by default in Java,
    # librdkafka, KafkaJS, kafka-python; 40 s in aiokafka) and send it as the Produce's
    # timeout_ms: a hold never exceeds two thirds of that, nor this.
    max_hold_ms: int = Field(
        20_000,
        ge=0,
        description="longest time a throttled Produce is held (not forwarded, not answered, "
        "its connection not read) waiting for its principal's tokens, and never past two "
        "thirds of the request's own timeout_ms; 0 answers every throttled Produce at once",
    )
    max_hold_throttle_time_ms: int = Field(
        120_000,
        ge=0,
        description="throttle_time_ms sent when a hold ends without tokens: the remaining "
        "wait, at most this (the Java producer's default delivery.timeout.ms)",
    )
    max_held_requests: int = Field(
        10_000,
        ge=0,
        description="Produce requests held at once per process; past it a throttled Produce "
        "is answered at once (as with max_hold_ms 0)",
    )
    max_held_bytes: int = Field(
        64 * 1024 * 1024,
        ge=0,
        description="bytes of held Produce requests per process; past it a throttled Produce "
        "is answered at once",
    )
    max_mute_ms: int | None = Field(
        None,
        ge=0,
        description="deprecated: the former name of max_throttle_time_ms, used only when that "
        "is not set",
    )

    @model_validator(mode="before")
    @classmethod
    def _former_name(cls, data: object) -> object:
        if (
            isinstance(data, dict)
            and data.get("max_mute_ms") is not None
            and "max_throttle_time_ms" not in data
        ):
            return {**data, "max_throttle_time_ms": data["max_mute_ms"]}
        return data

    @field_validator("error_codes")
    @classmethod
    def _has_default(cls, codes: dict[str, int]) -> dict[str, int]:
        if "default" not in codes:
            raise ValueError("must contain a 'default' entry")
        for name, code in codes.items():
            if not -1 <= code <= 32767 or code == 0:
                raise ValueError(f"{name}: {code} is not a Kafka error code (non-zero int16)")
        return codes
