"""Client-quota APIs (KIP-546): pidgate answers for ``producer_ids_rate`` and
``producer_ids_observe`` (1.0 observe mode, 0.0 enforce), the broker for the rest.

Owns the sans-IO side of DescribeClientQuotas (api key 48) and AlterClientQuotas (api key 49) as
seen through pidgate, so that ``pidgate quotas``, the Java AdminClient's
alterClientQuotas/describeClientQuotas and ``kafka-configs --describe`` work unchanged
(``kafka-configs --alter`` refuses the name ``producer_ids_rate`` itself, before sending):

* ``split_alter_request``: validates every op on the KIP-936 key ``producer_ids_rate`` (user and
  user-default entities only) the way Kafka's controller validates its own quota values, and
  re-encodes the request without that key for the broker (``AlterPlan.forward_body``).
* ``changes_to_apply``: the validated changes to apply once the broker has answered (none for
  ``validate_only``; none for an entity whose broker part failed, keeping each entity
  all-or-nothing like Kafka).
* ``encode_alter_response``: one result per entity of the original request, in request order.
* ``split_describe_request`` / ``encode_describe_response``: KIP-546 filter semantics (match_type
  0 exact / 1 default / 2 any, ``strict``), the broker's entries plus our ``producer_ids_rate``.
* ``validate_producer_ids_rate`` / ``validate_producer_ids_observe``: the Kafka error for a bad
  value. Both keys are "ours" alike: split off, validated, answered and merged the same way.

Error semantics follow the KRaft broker and controller (Kafka 3.5+): every validation failure is
INVALID_REQUEST (42), never INVALID_CONFIG (40) — ``ClientQuotaControlManager.validateEntity``
/ ``validateQuotaKeyValue`` (KAFKA-14943 added "must be greater than 0") and
``ClientQuotasImage.describe`` (UNSUPPORTED_VERSION (35) for an unknown entity type in a
describe filter). One deliberate deviation: a rate of 0 is accepted, because pidgate's own
configuration allows it (0 = no new producer IDs for that user, ``QuotaPolicy``).

Without broker support (``broker_supports=False``, e.g. tansu, which lacks both APIs) pidgate
answers alone: our key works as usual; an entity carrying any other key fails as a whole with
UNSUPPORTED_VERSION (35) — what Java's admin client reports (UnsupportedVersionException) when a
broker does not offer an API — and the message "the upstream broker does not support client
quotas ...". Describe then lists only pidgate's own entries.

Modules: ``entities`` (our keys, Kafka's codes, QuotaEntity/QuotaChange and value validation),
``codec`` (kafka-python decoding, framing and entity reading shared by both APIs), ``alter``
(AlterClientQuotas) and ``describe`` (DescribeClientQuotas). Decoding and encoding go through
kafka-python's message classes (rare admin traffic, not the hot path).

May import: kafka-python's client-quota message classes and ``pidgate.protocol``'s errors,
framing and headers. Must not import: asyncio, socket, time, logging, structlog,
prometheus_client, or any pidgate package outside ``pidgate.protocol``.
"""
