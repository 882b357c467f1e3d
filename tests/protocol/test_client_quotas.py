"""Tests for pidgate.protocol.client_quotas (KIP-546 client-quota APIs, our producer_ids_rate).

Requests are built and responses decoded with kafka-python's message classes (the reference);
the "broker" is a response body built the same way.
"""

from __future__ import annotations

import math
import struct
from typing import Any

import pytest
from kafka.protocol.admin.client_quotas import (
    AlterClientQuotasRequest,
    AlterClientQuotasResponse,
    DescribeClientQuotasRequest,
    DescribeClientQuotasResponse,
)

from pidgate.protocol.client_quotas.alter import (
    AlterPlan,
    changes_to_apply,
    encode_alter_response,
    split_alter_request,
)
from pidgate.protocol.client_quotas.describe import encode_describe_response, split_describe_request
from pidgate.protocol.client_quotas.entities import (
    INVALID_REQUEST,
    MATCH_ANY,
    MATCH_DEFAULT,
    MATCH_EXACT,
    PRODUCER_IDS_RATE,
    UNKNOWN_SERVER_ERROR,
    UNSUPPORTED_VERSION,
    QuotaChange,
    QuotaEntity,
    validate_producer_ids_rate,
)
from pidgate.protocol.errors import MalformedMessageError, UnsupportedApiError
from pidgate.protocol.headers import parse_request_header

VERSIONS = (0, 1)
ALICE = QuotaEntity.named("alice")
BOB = QuotaEntity.named("bob")
DEFAULT = QuotaEntity.default()

Entity = list[tuple[str, str | None]]
Op = tuple[str, float, bool]  # key, value, remove

# --- builders ----------------------------------------------------------------------------------


def alter_body(
    version: int, entries: list[tuple[Entity, list[Op]]], validate_only: bool = False
) -> bytes:
    R = AlterClientQuotasRequest
    request = R(
        entries=[
            R.EntryData(
                entity=[R.EntryData.EntityData(entity_type=t, entity_name=n) for t, n in entity],
                ops=[R.EntryData.OpData(key=k, value=v, remove=rm) for k, v, rm in ops],
            )
            for entity, ops in entries
        ],
        validate_only=validate_only,
    )
    return bytes(request.encode(version=version))


def alter_broker_response(
    version: int, results: list[tuple[Entity, int, str | None]], throttle_time_ms: int = 0
) -> bytes:
    R = AlterClientQuotasResponse
    response = R(
        throttle_time_ms=throttle_time_ms,
        entries=[
            R.EntryData(
                error_code=code,
                error_message=message,
                entity=[R.EntryData.EntityData(entity_type=t, entity_name=n) for t, n in entity],
            )
            for entity, code, message in results
        ],
    )
    return bytes(response.encode(version=version))


def describe_body(
    version: int, components: list[tuple[str, int, str | None]], strict: bool = False
) -> bytes:
    R = DescribeClientQuotasRequest
    request = R(
        components=[
            R.ComponentData(entity_type=t, match_type=m, match=n) for t, m, n in components
        ],
        strict=strict,
    )
    return bytes(request.encode(version=version))


def describe_broker_response(
    version: int,
    entries: list[tuple[Entity, dict[str, float]]] | None,
    error: tuple[int, str | None] = (0, None),
    throttle_time_ms: int = 0,
) -> bytes:
    R = DescribeClientQuotasResponse
    response = R(
        throttle_time_ms=throttle_time_ms,
        error_code=error[0],
        error_message=error[1],
        entries=None
        if entries is None
        else [
            R.EntryData(
                entity=[R.EntryData.EntityData(entity_type=t, entity_name=n) for t, n in entity],
                values=[R.EntryData.ValueData(key=k, value=v) for k, v in values.items()],
            )
            for entity, values in entries
        ],
    )
    return bytes(response.encode(version=version))


def unframe(cls: Any, framed: bytes, version: int, correlation_id: int) -> Any:
    (size,) = struct.unpack_from(">i", framed, 0)
    assert size == len(framed) - 4
    response = cls.decode(framed[4:], version=version, header=True)
    assert response.header.correlation_id == correlation_id
    return response


def alter_results(framed: bytes, version: int) -> list[tuple[Entity, int, str | None]]:
    response = unframe(AlterClientQuotasResponse, framed, version, 77)
    return [
        (
            [(e.entity_type, e.entity_name) for e in entry.entity],
            entry.error_code,
            entry.error_message,
        )
        for entry in response.entries
    ]


def described(framed: bytes, version: int) -> Any:
    return unframe(DescribeClientQuotasResponse, framed, version, 78)


def described_entries(framed: bytes, version: int) -> list[tuple[Entity, dict[str, float]]]:
    response = described(framed, version)
    assert response.error_code == 0, response.error_message
    return [
        (
            [(e.entity_type, e.entity_name) for e in entry.entity],
            {v.key: v.value for v in entry.values},
        )
        for entry in response.entries
    ]


def forwarded(plan: AlterPlan) -> list[tuple[Entity, list[Op]]]:
    assert plan.forward_body is not None
    request = AlterClientQuotasRequest.decode(plan.forward_body, version=plan.api_version)
    assert request.validate_only == plan.validate_only
    return [
        (
            [(e.entity_type, e.entity_name) for e in entry.entity],
            [(op.key, op.value, op.remove) for op in entry.ops],
        )
        for entry in request.entries
    ]


USER_ALICE: Entity = [("user", "alice")]
USER_DEFAULT: Entity = [("user", None)]
CLIENT_X: Entity = [("client-id", "x")]

# --- validate_producer_ids_rate -------------------------------------------------------------


@pytest.mark.parametrize("value", [0.0, 1.0, 50.0, 2**31 - 1, 7.0000001])
def test_valid_values(value: float) -> None:
    assert validate_producer_ids_rate(value) == (0, None)


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            -1.0,
            "Quota producer_ids_rate must not be negative (0 allows no new producer IDs), got -1.0",
        ),
        (-math.inf, "Quota producer_ids_rate must not be negative"),
        (1.5, "producer_ids_rate cannot be a fractional value."),
        (4.9999999, "producer_ids_rate cannot be a fractional value."),
        (1e12, "Proposed value for producer_ids_rate is too large for an INT."),
        (2.0**31, "Proposed value for producer_ids_rate is too large for an INT."),
        (math.inf, "Proposed value for producer_ids_rate is too large for an INT."),
        (math.nan, "Quota producer_ids_rate must be a number, not NaN"),
    ],
)
def test_invalid_values(value: float, message: str) -> None:
    code, text = validate_producer_ids_rate(value)
    assert code == INVALID_REQUEST
    assert text is not None and text.startswith(message)


def test_quota_entity_is_named_xor_default() -> None:
    assert QuotaEntity("alice", False) == ALICE
    assert QuotaEntity(None, True) == DEFAULT
    with pytest.raises(ValueError):
        QuotaEntity("alice", True)
    with pytest.raises(ValueError):
        QuotaEntity(None, False)


# --- AlterClientQuotas ---------------------------------------------------------------------


@pytest.mark.parametrize("version", VERSIONS)
def test_alter_only_ours_is_answered_locally(version: int) -> None:
    body = alter_body(
        version,
        [
            (USER_ALICE, [(PRODUCER_IDS_RATE, 50.0, False)]),
            (USER_DEFAULT, [(PRODUCER_IDS_RATE, 5.0, False)]),
        ],
    )
    plan = split_alter_request(body, version)
    assert plan.forward_body is None
    assert not plan.validate_only
    assert [(e.index, e.entity, e.change, e.error_code) for e in plan.our_changes] == [
        (0, ALICE, QuotaChange(ALICE, 50.0), 0),
        (1, DEFAULT, QuotaChange(DEFAULT, 5.0), 0),
    ]
    assert changes_to_apply(plan, None) == (
        (0, QuotaChange(ALICE, 50.0)),
        (1, QuotaChange(DEFAULT, 5.0)),
    )
    assert QuotaChange(ALICE, 50.0).rate == 50
    framed = encode_alter_response(version, 77, plan, {}, None)
    assert alter_results(framed, version) == [(USER_ALICE, 0, None), (USER_DEFAULT, 0, None)]


@pytest.mark.parametrize("version", VERSIONS)
def test_alter_only_broker_keys_is_forwarded_untouched(version: int) -> None:
    entries: list[tuple[Entity, list[Op]]] = [
        (USER_ALICE, [("producer_byte_rate", 1024.0, False)]),
        (CLIENT_X, [("consumer_byte_rate", 2048.0, False), ("request_percentage", 0.0, True)]),
    ]
    plan = split_alter_request(alter_body(version, entries), version)
    assert plan.our_changes == ()
    assert forwarded(plan) == entries
    assert changes_to_apply(plan, b"") == ()  # nothing of ours; broker body not even read
    broker = alter_broker_response(
        version,
        # Kafka builds the response from a map: any order.
        [(CLIENT_X, 42, "Invalid configuration key consumer_byte_ratez"), (USER_ALICE, 0, None)],
        throttle_time_ms=12,
    )
    framed = encode_alter_response(version, 77, plan, {}, broker)
    assert alter_results(framed, version) == [
        (USER_ALICE, 0, None),
        (CLIENT_X, 42, "Invalid configuration key consumer_byte_ratez"),
    ]
    assert unframe(AlterClientQuotasResponse, framed, version, 77).throttle_time_ms == 12


@pytest.mark.parametrize("version", VERSIONS)
def test_alter_mixed_splits_and_merges_in_order(version: int) -> None:
    user_client: Entity = [("user", "bob"), ("client-id", "app")]
    entries: list[tuple[Entity, list[Op]]] = [
        (CLIENT_X, [("consumer_byte_rate", 2048.0, False)]),  # broker only
        (USER_ALICE, [("producer_byte_rate", 1e6, False), (PRODUCER_IDS_RATE, 50.0, False)]),
        (USER_DEFAULT, [(PRODUCER_IDS_RATE, 10.0, False)]),  # ours only
        ([("user", "bob")], [(PRODUCER_IDS_RATE, 7.0, False), ("producer_byte_rate", 1.0, False)]),
        (user_client, [("request_percentage", 50.0, False)]),  # broker only
    ]
    plan = split_alter_request(alter_body(version, entries), version)
    assert forwarded(plan) == [
        (CLIENT_X, [("consumer_byte_rate", 2048.0, False)]),
        (USER_ALICE, [("producer_byte_rate", 1e6, False)]),
        ([("user", "bob")], [("producer_byte_rate", 1.0, False)]),
        (user_client, [("request_percentage", 50.0, False)]),
    ]
    assert PRODUCER_IDS_RATE.encode() not in (plan.forward_body or b"")
    # The broker accepts alice but refuses bob (e.g. an authorizer): bob's rate must not change.
    broker = alter_broker_response(
        version,
        [
            (CLIENT_X, 0, None),
            ([("user", "bob")], 29, "Cluster authorization failed."),
            (list(reversed(user_client)), 0, None),
            (USER_ALICE, 0, None),
        ],
    )
    assert changes_to_apply(plan, broker) == (
        (1, QuotaChange(ALICE, 50.0)),
        (2, QuotaChange(DEFAULT, 10.0)),
    )
    # Applying the default failed locally (e.g. the state file): that entity reports it.
    framed = encode_alter_response(
        version, 77, plan, {2: (UNKNOWN_SERVER_ERROR, "disk full")}, broker
    )
    assert alter_results(framed, version) == [
        (CLIENT_X, 0, None),
        (USER_ALICE, 0, None),
        (USER_DEFAULT, UNKNOWN_SERVER_ERROR, "disk full"),
        ([("user", "bob")], 29, "Cluster authorization failed."),
        (user_client, 0, None),
    ]


@pytest.mark.parametrize("version", VERSIONS)
def test_alter_mixed_with_invalid_rate_forwards_nothing_for_that_entity(version: int) -> None:
    entries: list[tuple[Entity, list[Op]]] = [
        (USER_ALICE, [("producer_byte_rate", 1e6, False), (PRODUCER_IDS_RATE, -1.0, False)]),
        (CLIENT_X, [("consumer_byte_rate", 2048.0, False)]),
    ]
    plan = split_alter_request(alter_body(version, entries), version)
    assert forwarded(plan) == [(CLIENT_X, [("consumer_byte_rate", 2048.0, False)])]
    broker = alter_broker_response(version, [(CLIENT_X, 0, None)])
    assert changes_to_apply(plan, broker) == ()
    results = alter_results(encode_alter_response(version, 77, plan, {}, broker), version)
    assert results[0][:2] == (USER_ALICE, INVALID_REQUEST)
    assert results[0][2] is not None and "must not be negative" in results[0][2]
    assert results[1] == (CLIENT_X, 0, None)


@pytest.mark.parametrize("version", VERSIONS)
def test_alter_validate_only_validates_but_changes_nothing(version: int) -> None:
    entries: list[tuple[Entity, list[Op]]] = [
        (USER_ALICE, [(PRODUCER_IDS_RATE, 50.0, False), ("producer_byte_rate", 1.0, False)]),
        (USER_DEFAULT, [(PRODUCER_IDS_RATE, 1.5, False)]),
    ]
    plan = split_alter_request(alter_body(version, entries, validate_only=True), version)
    assert plan.validate_only
    assert forwarded(plan) == [(USER_ALICE, [("producer_byte_rate", 1.0, False)])]  # flag kept
    broker = alter_broker_response(version, [(USER_ALICE, 0, None)])
    assert changes_to_apply(plan, broker) == ()
    assert alter_results(encode_alter_response(version, 77, plan, {}, broker), version) == [
        (USER_ALICE, 0, None),
        (USER_DEFAULT, INVALID_REQUEST, "producer_ids_rate cannot be a fractional value."),
    ]


@pytest.mark.parametrize("version", VERSIONS)
def test_alter_remove(version: int) -> None:
    entries: list[tuple[Entity, list[Op]]] = [
        (USER_ALICE, [(PRODUCER_IDS_RATE, -12345.0, True)]),  # value ignored on remove (Kafka)
        (USER_DEFAULT, [(PRODUCER_IDS_RATE, 0.0, True)]),
    ]
    plan = split_alter_request(alter_body(version, entries), version)
    assert plan.forward_body is None
    assert changes_to_apply(plan, None) == (
        (0, QuotaChange(ALICE, None)),
        (1, QuotaChange(DEFAULT, None)),
    )
    assert QuotaChange(ALICE, None).rate is None
    assert alter_results(encode_alter_response(version, 77, plan, {}, None), version) == [
        (USER_ALICE, 0, None),
        (USER_DEFAULT, 0, None),
    ]


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(
    ("value", "message"),
    [
        (
            -1.0,
            "Quota producer_ids_rate must not be negative (0 allows no new producer IDs), got -1.0",
        ),
        (1.5, "producer_ids_rate cannot be a fractional value."),
        (1e12, "Proposed value for producer_ids_rate is too large for an INT."),
    ],
)
def test_alter_bad_values(version: int, value: float, message: str) -> None:
    body = alter_body(
        version,
        [
            (USER_ALICE, [(PRODUCER_IDS_RATE, value, False)]),
            (USER_DEFAULT, [(PRODUCER_IDS_RATE, 3.0, False)]),
        ],
    )
    plan = split_alter_request(body, version)
    assert plan.forward_body is None
    assert plan.our_changes[0].change is None
    assert changes_to_apply(plan, None) == ((1, QuotaChange(DEFAULT, 3.0)),)
    assert alter_results(encode_alter_response(version, 77, plan, {}, None), version) == [
        (USER_ALICE, INVALID_REQUEST, message),
        (USER_DEFAULT, 0, None),
    ]


@pytest.mark.parametrize(
    ("entity", "message"),
    [
        (CLIENT_X, "producer_ids_rate is a per-user quota (KIP-936)"),
        ([("user", "a"), ("client-id", "b")], "producer_ids_rate is a per-user quota (KIP-936)"),
        ([("ip", "10.0.0.1")], "producer_ids_rate is a per-user quota (KIP-936)"),
        ([("client-id", None)], "producer_ids_rate is a per-user quota (KIP-936)"),
        ([], "Invalid empty client quota entity"),
        ([("user", "")], "Empty user not supported"),
        ([("group", "g")], "Unhandled client quota entity type: group"),
        (
            [("user", "a"), ("user", "b")],
            "Invalid client quota entity, duplicate entity entry user",
        ),
    ],
)
def test_alter_our_key_on_a_non_user_entity(entity: Entity, message: str) -> None:
    for version in VERSIONS:
        body = alter_body(
            version,
            [(entity, [(PRODUCER_IDS_RATE, 5.0, False), ("producer_byte_rate", 1.0, False)])],
        )
        plan = split_alter_request(body, version)
        assert plan.forward_body is None  # the entity fails as a whole
        [(echoed, code, text)] = alter_results(
            encode_alter_response(version, 77, plan, {}, None), version
        )
        assert (echoed, code) == (entity, INVALID_REQUEST)
        assert text is not None and text.startswith(message), text


def test_alter_per_user_message_names_the_tools() -> None:
    plan = split_alter_request(alter_body(1, [(CLIENT_X, [(PRODUCER_IDS_RATE, 5.0, False)])]), 1)
    assert plan.our_changes[0].error_message == (
        "producer_ids_rate is a per-user quota (KIP-936): set it on a user entity "
        "(--entity-type users with --entity-name or --entity-default), not on client-id"
    )


def test_alter_duplicates_like_kafka() -> None:
    body = alter_body(
        1,
        [
            (USER_ALICE, [(PRODUCER_IDS_RATE, 5.0, False)]),
            (USER_ALICE, [(PRODUCER_IDS_RATE, 6.0, False)]),
            (USER_DEFAULT, [(PRODUCER_IDS_RATE, 5.0, False), (PRODUCER_IDS_RATE, 6.0, False)]),
        ],
    )
    plan = split_alter_request(body, 1)
    assert changes_to_apply(plan, None) == ((0, QuotaChange(ALICE, 5.0)),)
    assert alter_results(encode_alter_response(1, 77, plan, {}, None), 1) == [
        (USER_ALICE, 0, None),
        (
            USER_ALICE,
            INVALID_REQUEST,
            "Ignoring duplicate entity ClientQuotaEntity(entries={user=alice})",
        ),
        (
            USER_DEFAULT,
            INVALID_REQUEST,
            "Duplicate quota key producer_ids_rate not updating quota for this entity "
            "ClientQuotaEntity(entries={user=null})",
        ),
    ]


@pytest.mark.parametrize("version", VERSIONS)
def test_alter_without_broker_support(version: int) -> None:
    entries: list[tuple[Entity, list[Op]]] = [
        (USER_ALICE, [(PRODUCER_IDS_RATE, 50.0, False)]),
        (CLIENT_X, [("consumer_byte_rate", 2048.0, False)]),
        (USER_DEFAULT, [(PRODUCER_IDS_RATE, 5.0, False), ("producer_byte_rate", 1.0, False)]),
        ([("user", "bob")], []),
    ]
    plan = split_alter_request(alter_body(version, entries), version, broker_supports=False)
    assert plan.forward_body is None
    assert changes_to_apply(plan, None) == ((0, QuotaChange(ALICE, 50.0)),)
    results = alter_results(encode_alter_response(version, 77, plan, {}, None), version)
    assert [(e, c) for e, c, _ in results] == [
        (USER_ALICE, 0),
        (CLIENT_X, UNSUPPORTED_VERSION),
        (USER_DEFAULT, UNSUPPORTED_VERSION),
        ([("user", "bob")], 0),
    ]
    assert results[1][2] is not None
    assert results[1][2].startswith("the upstream broker does not support client quotas")


def test_alter_broker_unreachable_and_missing_results() -> None:
    entries: list[tuple[Entity, list[Op]]] = [
        (USER_ALICE, [(PRODUCER_IDS_RATE, 50.0, False), ("producer_byte_rate", 1.0, False)]),
        (CLIENT_X, [("consumer_byte_rate", 2048.0, False)]),
    ]
    plan = split_alter_request(alter_body(1, entries), 1)
    with pytest.raises(ValueError):
        encode_alter_response(1, 77, plan, {}, None)
    error = (7, "upstream broker timed out")
    assert changes_to_apply(plan, None, broker_error=error) == ()
    framed = encode_alter_response(1, 77, plan, {}, None, broker_error=error)
    assert alter_results(framed, 1) == [(USER_ALICE, *error), (CLIENT_X, *error)]
    # A broker answer that forgets an entity: that entity fails, ours is not applied.
    broker = alter_broker_response(1, [(CLIENT_X, 0, None)])
    assert changes_to_apply(plan, broker) == ()
    assert alter_results(encode_alter_response(1, 77, plan, {}, broker), 1)[0][:2] == (
        USER_ALICE,
        UNKNOWN_SERVER_ERROR,
    )


def test_alter_flexible_header_and_throttle() -> None:
    plan = split_alter_request(alter_body(1, [(USER_ALICE, [(PRODUCER_IDS_RATE, 1.0, False)])]), 1)
    framed = encode_alter_response(1, 77, plan, {}, None, throttle_time_ms=250)
    assert framed[4:8] == struct.pack(">i", 77) and framed[8] == 0  # header v1: no tagged fields
    assert unframe(AlterClientQuotasResponse, framed, 1, 77).throttle_time_ms == 250
    framed0 = encode_alter_response(
        0,
        77,
        split_alter_request(alter_body(0, [(USER_ALICE, [(PRODUCER_IDS_RATE, 1.0, False)])]), 0),
        {},
        None,
    )
    assert unframe(AlterClientQuotasResponse, framed0, 0, 77).entries[0].error_code == 0


def test_alter_rejects_bad_input() -> None:
    with pytest.raises(UnsupportedApiError):
        split_alter_request(alter_body(1, []), 2)
    with pytest.raises(MalformedMessageError):
        split_alter_request(b"\x00\x00\x00\x05\x00", 0)
    plan = split_alter_request(alter_body(1, []), 1)
    with pytest.raises(ValueError):
        encode_alter_response(0, 77, plan, {}, None)


# --- DescribeClientQuotas ------------------------------------------------------------------

OURS = {ALICE: 50.0, BOB: 7.0, DEFAULT: 5.0}


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize(
    ("components", "strict", "expected"),
    [
        # kafka-configs --describe --entity-type users --entity-name alice (strict)
        ([("user", MATCH_EXACT, "alice")], True, [ALICE]),
        ([("user", MATCH_EXACT, "alice")], False, [ALICE]),
        ([("user", MATCH_EXACT, "carol")], False, []),
        # --entity-default
        ([("user", MATCH_DEFAULT, None)], True, [DEFAULT]),
        # --entity-type users: any user, the default included (ClientQuotasImage)
        ([("user", MATCH_ANY, None)], True, [DEFAULT, ALICE, BOB]),
        # no components: everything, or nothing when strict
        ([], False, [DEFAULT, ALICE, BOB]),
        ([], True, []),
        # a client-id component: our user-only entities never have one
        ([("client-id", MATCH_ANY, None)], False, []),
        ([("user", MATCH_EXACT, "alice"), ("client-id", MATCH_DEFAULT, None)], False, []),
    ],
)
def test_describe_matching_local(
    version: int,
    components: list[tuple[str, int, str | None]],
    strict: bool,
    expected: list[QuotaEntity],
) -> None:
    plan = split_describe_request(
        describe_body(version, components, strict), version, broker_supports=False
    )
    assert plan.forward_body is None and not plan.ask_broker
    framed = encode_describe_response(version, 78, plan, OURS, None)
    assert described_entries(framed, version) == [
        ([("user", e.user)], {PRODUCER_IDS_RATE: OURS[e]}) for e in expected
    ]


@pytest.mark.parametrize("version", VERSIONS)
def test_describe_merges_broker_entries(version: int) -> None:
    body = describe_body(version, [("user", MATCH_ANY, None)], strict=False)
    plan = split_describe_request(body, version)
    assert plan.ask_broker and plan.forward_body == body  # forwarded unchanged
    user_client: Entity = [("user", "alice"), ("client-id", "app")]
    broker = describe_broker_response(
        version,
        [
            (USER_ALICE, {"producer_byte_rate": 1024.0}),
            (user_client, {"consumer_byte_rate": 2048.0}),
            ([("user", "carol")], {"request_percentage": 50.0}),
            # a broker that claims our key: pidgate owns it, the broker's value is dropped
            ([("user", "dave")], {PRODUCER_IDS_RATE: 999.0}),
        ],
        throttle_time_ms=3,
    )
    framed = encode_describe_response(version, 78, plan, OURS, broker)
    assert described_entries(framed, version) == [
        (USER_ALICE, {"producer_byte_rate": 1024.0, PRODUCER_IDS_RATE: 50.0}),
        (user_client, {"consumer_byte_rate": 2048.0}),
        ([("user", "carol")], {"request_percentage": 50.0}),
        (USER_DEFAULT, {PRODUCER_IDS_RATE: 5.0}),
        ([("user", "bob")], {PRODUCER_IDS_RATE: 7.0}),
    ]
    assert described(framed, version).throttle_time_ms == 3


@pytest.mark.parametrize("version", VERSIONS)
def test_describe_strict_exact_with_broker(version: int) -> None:
    # What kafka-configs sends before --delete-config: strict, exact user.
    plan = split_describe_request(
        describe_body(version, [("user", MATCH_EXACT, "alice")], True), version
    )
    broker = describe_broker_response(version, [(USER_ALICE, {"producer_byte_rate": 1.0})])
    assert described_entries(
        encode_describe_response(version, 78, plan, OURS, broker), version
    ) == [(USER_ALICE, {"producer_byte_rate": 1.0, PRODUCER_IDS_RATE: 50.0})]
    empty = describe_broker_response(version, [])
    assert described_entries(encode_describe_response(version, 78, plan, OURS, empty), version) == [
        (USER_ALICE, {PRODUCER_IDS_RATE: 50.0})
    ]
    assert described_entries(encode_describe_response(version, 78, plan, {}, empty), version) == []


@pytest.mark.parametrize("version", VERSIONS)
def test_describe_broker_error_wins(version: int) -> None:
    plan = split_describe_request(describe_body(version, [("user", MATCH_ANY, None)]), version)
    broker = describe_broker_response(version, None, error=(31, "Cluster authorization failed."))
    response = described(encode_describe_response(version, 78, plan, OURS, broker), version)
    assert (response.error_code, response.error_message) == (31, "Cluster authorization failed.")
    assert response.entries is None
    unreachable = described(
        encode_describe_response(version, 78, plan, OURS, None, broker_error=(7, "timed out")),
        version,
    )
    assert (unreachable.error_code, unreachable.entries) == (7, None)
    with pytest.raises(ValueError):
        encode_describe_response(version, 78, plan, OURS, None)


@pytest.mark.parametrize(
    ("components", "code", "message"),
    [
        ([("", MATCH_ANY, None)], INVALID_REQUEST, "Invalid empty entity type."),
        (
            [("user", MATCH_ANY, None), ("user", MATCH_DEFAULT, None)],
            INVALID_REQUEST,
            "Entity type user cannot appear more than once in the filter.",
        ),
        ([("group", MATCH_ANY, None)], UNSUPPORTED_VERSION, "Unsupported entity type group"),
        (
            [("user", MATCH_EXACT, None)],
            INVALID_REQUEST,
            "Request specified MATCH_TYPE_EXACT, but set match string to null.",
        ),
        (
            [("user", MATCH_DEFAULT, "alice")],
            INVALID_REQUEST,
            "Request specified MATCH_TYPE_DEFAULT, but also specified a match string.",
        ),
        (
            [("user", MATCH_ANY, "alice")],
            INVALID_REQUEST,
            "Request specified MATCH_TYPE_SPECIFIED, but also specified a match string.",
        ),
        ([("user", 7, None)], INVALID_REQUEST, "Unknown match type 7"),
        (
            [("ip", MATCH_ANY, None), ("user", MATCH_ANY, None)],
            INVALID_REQUEST,
            "Invalid entity filter component combination. IP filter component should not be "
            "used with user or clientId filter component.",
        ),
    ],
)
def test_describe_bad_filters(
    components: list[tuple[str, int, str | None]], code: int, message: str
) -> None:
    for version in VERSIONS:
        body = describe_body(version, components)
        local = split_describe_request(body, version, broker_supports=False)
        assert (local.error_code, local.error_message) == (code, message)
        response = described(encode_describe_response(version, 78, local, OURS, None), version)
        assert (response.error_code, response.error_message, response.entries) == (
            code,
            message,
            None,
        )
        # With a broker, the broker's verdict is passed on; ours only stops our entries.
        remote = split_describe_request(body, version)
        assert not remote.matches(ALICE)
        broker = describe_broker_response(version, [])
        assert (
            described_entries(encode_describe_response(version, 78, remote, OURS, broker), version)
            == []
        )


def test_describe_rejects_bad_input() -> None:
    with pytest.raises(UnsupportedApiError):
        split_describe_request(describe_body(1, []), 2)
    with pytest.raises(MalformedMessageError):
        split_describe_request(b"\x00\x00", 0)
    plan = split_describe_request(describe_body(1, []), 1)
    with pytest.raises(MalformedMessageError):
        encode_describe_response(1, 78, plan, OURS, b"\x00")


@pytest.mark.parametrize("version", VERSIONS)
def test_full_frames_as_a_client_sends_them(version: int) -> None:
    """The path the proxy takes: framed request -> header -> split -> framed response."""
    R = AlterClientQuotasRequest
    request = R(
        entries=[
            R.EntryData(
                entity=[R.EntryData.EntityData(entity_type="user", entity_name="alice")],
                ops=[R.EntryData.OpData(key=PRODUCER_IDS_RATE, value=50.0, remove=False)],
            )
        ],
        validate_only=False,
    )
    request.with_header(correlation_id=77, client_id="kafka-configs")
    payload = bytes(request.encode(version=version, header=True, framed=True))[4:]
    header = parse_request_header(payload)
    assert (header.api_key, header.api_version, header.correlation_id) == (49, version, 77)
    plan = split_alter_request(payload[header.header_bytes :], header.api_version)
    assert changes_to_apply(plan, None) == ((0, QuotaChange(ALICE, 50.0)),)
    framed = encode_alter_response(version, header.correlation_id, plan, {}, None)
    assert alter_results(framed, version) == [(USER_ALICE, 0, None)]

    D = DescribeClientQuotasRequest
    describe = D(
        components=[D.ComponentData(entity_type="user", match_type=MATCH_EXACT, match="alice")],
        strict=True,
    )
    describe.with_header(correlation_id=78, client_id="kafka-configs")
    payload = bytes(describe.encode(version=version, header=True, framed=True))[4:]
    header = parse_request_header(payload)
    dplan = split_describe_request(
        payload[header.header_bytes :], header.api_version, broker_supports=False
    )
    framed = encode_describe_response(version, header.correlation_id, dplan, {ALICE: 50.0}, None)
    assert described_entries(framed, version) == [(USER_ALICE, {PRODUCER_IDS_RATE: 50.0})]
