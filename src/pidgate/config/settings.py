"""The settings tree: every key pidgate understands, its default, its unit and its validation.

Owns the schema only (pydantic models, frozen). Loading and merging sources lives in
``pidgate.config.loader``. Kafka's own names are kept where Kafka has one
(``producer.id.quota.window.size.seconds`` and friends from KIP-936), so an operator can carry
values over from a broker config.

Must not import: asyncio, socket, structlog, prometheus_client, ``pidgate.proxy``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from pidgate.config.addresses import HostPort, parse_host_port
from pidgate.config.principal_mapping import PrincipalMapper, PrincipalMappingError

#: The user entity Kafka uses for "every user without an explicit quota" (``users.<default>``).
DEFAULT_USER_ENTITY = "<default>"

#: Kafka's socket.request.max.bytes default (100 MiB): a frame larger than this is refused by a
#: broker too, so refusing it earlier loses nothing a broker would have accepted.
KAFKA_SOCKET_REQUEST_MAX_BYTES = 104_857_600


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


#: ``enforce`` throttles; ``observe`` decides the same, records what it would have throttled
#: (metrics, event log ``would_reject``, /state) and forwards every request.
QuotaMode = Literal["enforce", "observe"]


class UserQuota(_Frozen):
    """Quota values for one user entity (``users.<name>`` or ``users.<default>``)."""

    producer_ids_rate: int | None = Field(
        None,
        ge=0,
        description="new PIDs this user may activate per quota window; none = unlimited",
    )
    mode: QuotaMode | None = Field(
        None,
        description="observe: this user's would-be throttles are recorded and every request "
        "forwarded; enforce: throttled; none = as users.<default>, else quota.mode",
    )


def _host_port(value: object) -> object:
    return parse_host_port(value) if isinstance(value, str) else value


class QuotaSettings(_Frozen):
    """KIP-936 quota configuration, under Kafka's own key names."""

    window_size_seconds: int = Field(
        3600,
        ge=1,
        alias="producer.id.quota.window.size.seconds",
        description="the quota window: producer_ids_rate is per this many seconds, and a PID "
        "is remembered this long after its last request (KIP-936)",
    )
    window_num: int = Field(
        11,
        ge=1,
        le=1000,
        alias="producer.id.quota.window.num",
        description="time layers of the per-principal Bloom filter across one window",
    )
    false_positive_rate: float = Field(
        0.001,
        gt=0.0,
        lt=1.0,
        alias="producer.id.quota.cache.false.positive.rate",
        description="Bloom false-positive rate: the chance a new PID passes free (fails open), "
        "over all the layers a lookup consults; each layer is built for a share of it",
    )
    cleanup_interval_ms: int = Field(
        10_000,
        ge=10,
        alias="producer.id.quota.cache.cleanup.scheduler.interval.ms",
        description="how often expired layers and idle principals are dropped",
    )
    mode: QuotaMode = Field(
        "enforce",
        description="enforce, or observe: decide as enforcement would, record would-be "
        "throttles (metrics, event log, /state) and forward every request; per user: "
        "users.<name>.mode; live: key producer_ids_observe (pidgate quotas set --observe)",
    )
    users: dict[str, UserQuota] = Field(
        default_factory=dict,
        description="per-user quotas, `{<default>: {producer_ids_rate: N}, alice: {...}}`, "
        "each also with `mode: observe | enforce`; precedence users.<name>, then "
        "users.<default>, then unlimited (mode: then quota.mode)",
    )
    max_principals: int = Field(
        100_000, ge=1, description="principals tracked at most; the idlest is evicted first"
    )
    max_total_bits: int = Field(
        2**30,
        ge=1024,
        description="Bloom bits across all principals at most (2^30 bits = 128 MiB); the "
        "idlest principal is evicted first",
    )
    grandfather_grace_ms: int | None = Field(
        None,
        ge=0,
        description="after a principal's enforcement begins (start without state, unlimited "
        "to limited, eviction), PIDs the cluster allocated before then (below the PID "
        "frontier; any, when no frontier could be learnt) pass without a token for this long; "
        "default one layer's span (window / window.num); 0 turns grandfathering off",
    )
    # A fresh Kafka 3.1 broker took 2-8 s to answer the probe on a loaded 2-core machine, and
    # Kafka 4 answers 14 COORDINATOR_LOAD_IN_PROGRESS first (retried within this bound).
    grandfather_probe_timeout_ms: int = Field(
        15_000,
        ge=100,
        le=600_000,
        description="how long pidgate waits for every broker's fresh PID when it learns the "
        "PID frontier; past it, learning mode (unknown PIDs admitted during the grace)",
    )

    @property
    def window_ms(self) -> int:
        return self.window_size_seconds * 1000

    @property
    def default_producer_ids_rate(self) -> int | None:
        default = self.users.get(DEFAULT_USER_ENTITY)
        return default.producer_ids_rate if default else None

    @property
    def user_producer_ids_rates(self) -> dict[str, int]:
        return {
            name: quota.producer_ids_rate
            for name, quota in self.users.items()
            if name != DEFAULT_USER_ENTITY and quota.producer_ids_rate is not None
        }

    @property
    def default_observe(self) -> bool | None:
        """The default user's observe mode: users.<default>.mode, else quota.mode (None when
        that is the default, enforce: nothing set)."""
        default = self.users.get(DEFAULT_USER_ENTITY)
        if default is not None and default.mode is not None:
            return default.mode == "observe"
        return True if self.mode == "observe" else None

    @property
    def user_observe(self) -> dict[str, bool]:
        return {
            name: quota.mode == "observe"
            for name, quota in self.users.items()
            if name != DEFAULT_USER_ENTITY and quota.mode is not None
        }

    @model_validator(mode="after")
    def _window_holds_its_layers(self) -> QuotaSettings:
        if self.window_ms < self.window_num:
            raise ValueError(
                "producer.id.quota.window.size.seconds must give each of the "
                "producer.id.quota.window.num layers at least 1 ms"
            )
        return self


class RejectionSettings(_Frozen):
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


class ProxySettings(_Frozen):
    """Listeners, upstream brokers, routing and per-connection limits."""

    listen: HostPort = Field(
        HostPort(host="127.0.0.1", port=9092),
        description="bootstrap listener HOST:PORT (loopback unless you say otherwise)",
    )
    upstream: tuple[HostPort, ...] = Field(
        (), description="upstream broker(s) HOST:PORT, tried in order for bootstrap (required)"
    )
    workers: int = Field(
        1,
        ge=1,
        le=64,
        description="processes serving the same listeners (Linux SO_REUSEPORT), each a fleet "
        'member; their admin HTTP is merged on admin.listen (README "Fleets")',
    )
    reuse_port: bool = Field(
        False,
        description="open listeners with SO_REUSEPORT so several processes share them (set "
        "for each worker by --workers)",
    )
    mode: Literal["gateway", "sidecar"] = Field(
        "gateway",
        description="gateway: one pidgate for a cluster; sidecar: one pidgate per broker",
    )
    advertised_host: str | None = Field(
        None, description="host put into rewritten broker endpoints; default the listen host"
    )
    broker_port_base: int | None = Field(
        None,
        ge=1,
        le=65535,
        description="gateway: broker node_id is fronted on this + node_id; default listen port + 1",
    )
    broker_ports: dict[int, Annotated[int, Field(ge=1, le=65535)]] = Field(
        default_factory=dict,
        description="gateway: explicit node_id -> port, overrides broker_port_base",
    )
    advertised_endpoints: dict[str, HostPort] = Field(
        default_factory=dict,
        description="sidecar: upstream HOST:PORT -> advertised HOST:PORT; unmapped endpoints "
        "are left as the broker sent them",
    )
    max_frame_bytes: int = Field(
        KAFKA_SOCKET_REQUEST_MAX_BYTES,
        ge=1024,
        description="largest request frame; larger closes the connection (Kafka's "
        "socket.request.max.bytes)",
    )
    max_response_frame_bytes: int = Field(
        4 * KAFKA_SOCKET_REQUEST_MAX_BYTES,
        ge=1024,
        description="largest response frame accepted from a broker",
    )
    max_in_flight_requests: int = Field(
        100, ge=1, description="requests awaiting a response before a client is no longer read"
    )
    write_buffer_high_bytes: int = Field(
        4 * 1024 * 1024,
        ge=1024,
        description="bytes queued towards one side before the other side is no longer read",
    )
    upstream_connect_timeout_ms: int = Field(
        10_000, ge=1, description="time to connect to a broker before the client is closed"
    )
    shutdown_grace_ms: int = Field(
        10_000, ge=0, description="on SIGTERM/SIGINT, time for in-flight requests to finish"
    )
    # Each client connection holds two sockets (client + broker): 10k of them fits a raised
    # `ulimit -n` (65536) with room to spare, and is far above what one gateway's producers need.
    max_connections: int = Field(
        10_000,
        ge=1,
        description="client connections open at once, all listeners together; one more is "
        "closed at once (each holds a client and a broker socket: keep 2x this under the file "
        "descriptor limit)",
    )
    # Kafka's max.connections.per.ip is unlimited by default; a proxy in front of the whole
    # cluster is where one host's reconnect storm or connection leak should stop, short of
    # taking every slot of max_connections.
    max_connections_per_ip: int = Field(
        1_000,
        ge=1,
        description="client connections open at once from one IP address; one more is closed "
        "at once, so one misbehaving host cannot take all of max_connections (raise it for "
        "clients behind NAT)",
    )
    idle_timeout_ms: int = Field(
        600_000,
        ge=0,
        description="a client connection with no bytes either way for this long and no "
        "response owed is closed; 0 = never. Kafka's broker default (connections.max.idle.ms): "
        "clients close idle connections first (at 540 s) and are used to brokers doing it",
    )
    # Fail open by default: KIP-936 quotas protect brokers from PID explosions, which are rare;
    # a pidgate bug that rejected every Produce would stop every producer, a far worse outage
    # than the one the quota guards against.
    quota_failure_policy: Literal["open", "closed"] = Field(
        "open",
        description="when the quota subsystem raises: open = forward the Produce unthrottled "
        "(default: a pidgate bug must not stop producers, which pass without pidgate anyway), "
        "closed = answer it as throttled for quota_failure_throttle_ms",
    )
    quota_failure_throttle_ms: int = Field(
        1_000,
        ge=1,
        description="throttle_time_ms of a Produce rejected because the quota subsystem failed "
        "(quota_failure_policy closed): clients retry after it",
    )

    _parse_listen = field_validator("listen", mode="before")(_host_port)

    @field_validator("upstream", mode="before")
    @classmethod
    def _parse_upstream(cls, value: object) -> object:
        if isinstance(value, str):
            value = [part for part in value.split(",") if part.strip()]
        if isinstance(value, list):
            return [_host_port(item) for item in value]
        return value

    @field_validator("advertised_endpoints", mode="before")
    @classmethod
    def _parse_endpoint_map(cls, value: object) -> object:
        if isinstance(value, dict):
            return {str(key): _host_port(target) for key, target in value.items()}
        return value

    @field_validator("advertised_endpoints")
    @classmethod
    def _keys_are_host_ports(cls, value: dict[str, HostPort]) -> dict[str, HostPort]:
        for key in value:
            parse_host_port(key)
        return value

    @property
    def effective_advertised_host(self) -> str:
        return self.advertised_host or self.listen.host

    @property
    def effective_broker_port_base(self) -> int:
        return self.broker_port_base if self.broker_port_base is not None else self.listen.port + 1

    def broker_listen_port(self, node_id: int) -> int:
        return self.broker_ports.get(node_id, self.effective_broker_port_base + node_id)

    @model_validator(mode="after")
    def _advertising_needs_a_routable_host(self) -> ProxySettings:
        if self.advertised_host is None and self.listen.host in ("0.0.0.0", "::", ""):
            raise ValueError(
                "listen binds every interface; set advertised_host (--advertised-host) to the "
                "name clients should connect to"
            )
        return self


class LoggingSettings(_Frozen):
    level: Literal["debug", "info", "warning", "error"] = Field("info", description="log level")
    format: Literal["auto", "json", "console"] = Field(
        "auto", description="auto: pretty on a TTY, JSON Lines otherwise"
    )
    rate_limit_events: int = Field(
        5, ge=1, description="at most this many lines of one event per key per interval"
    )
    rate_limit_interval_ms: int = Field(10_000, ge=1, description="the rate-limit interval")


class IdentitySettings(_Frozen):
    """Who pays for a connection's new PIDs (DESIGN.md "Identity"). pidgate never authenticates
    anyone: with SASL it observes the exchange and believes only the broker's verdict."""

    sasl: bool = Field(
        False,
        description="clients authenticate with SASL against the broker, through pidgate; the "
        "principal is the user the broker accepted (until then, Produce closes the connection)",
    )
    fallback_principal: str = Field(
        "User:UNIDENTIFIED",
        description="principal for a successful SASL exchange pidgate cannot read (GSSAPI, "
        "an unknown mechanism, an unreadable token)",
    )
    oauthbearer_principal_claim: str = Field(
        "sub", min_length=1, description="JWT claim that names the OAUTHBEARER principal"
    )

    @field_validator("fallback_principal")
    @classmethod
    def _is_a_principal(cls, value: str) -> str:
        kind, sep, name = value.partition(":")
        if not sep or not kind or not name:
            raise ValueError(f"expected a principal like User:NAME, got {value!r}")
        return value


def _must_exist(path: Path | None) -> Path | None:
    if path is not None and not path.is_file():
        raise ValueError(f"no such file: {path}")
    return path


class ClientTlsSettings(_Frozen):
    """TLS terminated by pidgate on every client listener."""

    enabled: bool = Field(False, description="clients connect with TLS (SSL / SASL_SSL)")
    certfile: Path | None = Field(None, description="server certificate chain (PEM)")
    keyfile: Path | None = Field(None, description="server private key (PEM)")
    cafile: Path | None = Field(
        None, description="CA bundle (PEM) that client certificates chain to"
    )
    client_auth: Literal["none", "requested", "required"] = Field(
        "none",
        description="client certificates (ssl.client.auth); with one, and without SASL, the "
        "principal is User:<mapped certificate subject>",
    )
    principal_mapping_rules: str = Field(
        "DEFAULT",
        description="Kafka's ssl.principal.mapping.rules (KIP-371), applied to the subject DN",
    )
    reload_interval_ms: int = Field(
        30_000, ge=100, description="how often certificate files are checked for changes"
    )

    _exists = field_validator("certfile", "keyfile", "cafile")(_must_exist)

    @field_validator("principal_mapping_rules")
    @classmethod
    def _rules_parse(cls, rules: str) -> str:
        try:
            PrincipalMapper.parse(rules)
        except PrincipalMappingError as error:
            raise ValueError(str(error)) from None
        return rules

    @model_validator(mode="after")
    def _complete(self) -> ClientTlsSettings:
        if self.enabled and (self.certfile is None or self.keyfile is None):
            raise ValueError("enabled needs certfile and keyfile")
        if self.enabled and self.client_auth != "none" and self.cafile is None:
            raise ValueError("client_auth needs cafile to verify client certificates")
        return self


class UpstreamTlsSettings(_Frozen):
    """TLS from pidgate to the brokers (independent of the client side)."""

    enabled: bool = Field(False, description="connect to brokers with TLS")
    cafile: Path | None = Field(
        None, description="CA bundle for broker certificates; default: system CAs"
    )
    certfile: Path | None = Field(
        None, description="client certificate for brokers that require one"
    )
    keyfile: Path | None = Field(None, description="its private key")
    check_hostname: bool = Field(True, description="verify the broker certificate's host name")

    _exists = field_validator("certfile", "keyfile", "cafile")(_must_exist)

    @model_validator(mode="after")
    def _pair(self) -> UpstreamTlsSettings:
        if (self.certfile is None) != (self.keyfile is None):
            raise ValueError("certfile and keyfile go together")
        return self


class AdminSettings(_Frozen):
    """The operator's HTTP endpoint: /metrics, /healthz, /readyz, /state."""

    enabled: bool = Field(True, description="serve the admin HTTP endpoint")
    listen: HostPort = Field(
        HostPort(host="127.0.0.1", port=9404),
        description="admin HTTP HOST:PORT; loopback unless you say otherwise (it has no auth)",
    )
    max_user_labels: int = Field(
        1000, ge=1, description="per-user metric label sets at most; the rest is user=__other__"
    )

    _parse_listen = field_validator("listen", mode="before")(_host_port)


class StateSettings(_Frozen):
    """Quota overrides and Bloom/bucket state kept across restarts."""

    path: Path | None = Field(
        None, description="state file (written atomically); none = nothing survives a restart"
    )
    persist_interval_ms: int = Field(
        10_000, ge=100, description="how often the state file is rewritten (and at shutdown)"
    )


class SharedStoreSettings(_Frozen):
    """Optional: quota overrides shared by every pidgate through a compacted topic."""

    topic: str | None = Field(
        None,
        description="compacted topic on the upstream cluster holding runtime quota overrides; "
        "none = this pidgate keeps its own",
    )
    instance_id: str | None = Field(
        None, description="this pidgate's name in the records it writes; default host:port"
    )
    security: dict[str, str] = Field(
        default_factory=dict,
        description="kafka-python security settings for reaching the cluster directly "
        "(security_protocol, sasl_*, ssl_*); never logged",
    )


class FleetSettings(_Frozen):
    """Optional: instances sharing ``fleet.id`` share known PIDs and token spending through a
    topic on the upstream cluster (README "Fleets"; proxy/quota_control/fleet.py has the record
    format)."""

    id: str | None = Field(
        None,
        pattern=r"^[A-Za-z0-9._-]+$",
        description="name of the fleet this pidgate belongs to; none = no fleet (it judges alone)",
    )
    topic: str | None = Field(
        None, description="fleet topic on the upstream cluster; default pidgate-fleet-<id>"
    )
    scope: Literal["fleet", "instance"] = Field(
        "fleet",
        description="fleet: producer_ids_rate holds per principal across the fleet (tokens "
        "taken anywhere are debited everywhere); instance: per pidgate, as KIP-936's per-broker "
        "quota (known PIDs are shared either way)",
    )
    flush_interval_ms: int = Field(
        100, ge=10, description="what this member admitted is sent to the fleet this often"
    )
    catch_up_timeout_ms: int = Field(
        30_000,
        ge=1000,
        description="at start, reading the fleet topic (one window back) may take this long "
        "before pidgate gives up starting",
    )
    max_pending_producer_ids: int = Field(
        100_000,
        ge=1,
        description="admitted PIDs kept for the fleet while its topic is unreachable; past "
        "it, they are counted and not announced",
    )

    @property
    def effective_topic(self) -> str | None:
        if self.id is None:
            return None
        return self.topic or f"pidgate-fleet-{self.id}"


class EventLogSettings(_Frozen):
    """The PID event log (JSON Lines) that ``pidgate analyze`` reads."""

    directory: Path | None = Field(
        None, description="directory for the PID event log; none = no event log"
    )
    gzip: bool = Field(False, description="gzip the event files")
    rotate_bytes: int = Field(
        128 * 1024 * 1024, ge=1024, description="start a new file after this many bytes"
    )
    rotate_interval_s: int = Field(3600, ge=1, description="start a new file after this long")
    max_queued_events: int = Field(
        100_000,
        ge=1,
        description="events waiting for the disk at most; past it events are dropped and "
        "counted, requests are never delayed",
    )
    instance: str | None = Field(
        None, description="this pidgate's name in the events; default host:port"
    )


class Settings(_Frozen):
    """The whole, validated, immutable configuration."""

    proxy: ProxySettings = Field(default_factory=ProxySettings)
    quota: QuotaSettings = Field(default_factory=QuotaSettings)
    rejection: RejectionSettings = Field(default_factory=RejectionSettings)
    identity: IdentitySettings = Field(default_factory=IdentitySettings)
    client_tls: ClientTlsSettings = Field(default_factory=ClientTlsSettings)
    upstream_tls: UpstreamTlsSettings = Field(default_factory=UpstreamTlsSettings)
    admin: AdminSettings = Field(default_factory=AdminSettings)
    state: StateSettings = Field(default_factory=StateSettings)
    shared_store: SharedStoreSettings = Field(default_factory=SharedStoreSettings)
    fleet: FleetSettings = Field(default_factory=FleetSettings)
    event_log: EventLogSettings = Field(default_factory=EventLogSettings)
    logging: LoggingSettings = Field(default_factory=LoggingSettings)

    @model_validator(mode="after")
    def _has_upstream(self) -> Settings:
        if not self.proxy.upstream:
            raise ValueError("proxy.upstream: at least one upstream broker (HOST:PORT) is required")
        if self.proxy.mode == "sidecar" and len(self.proxy.upstream) != 1:
            raise ValueError("proxy.upstream: sidecar mode forwards to exactly one broker")
        return self
