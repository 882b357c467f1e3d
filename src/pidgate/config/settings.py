"""The settings tree: every key pidgate understands, its default, its unit and its validation.

Owns the schema only (pydantic models, frozen): the root (:class:`Settings`, one field per
section, in the order of the configuration reference) and its sections, except those with a
module of their own: ``rejection`` (:mod:`pidgate.config.rejection_settings`) and ``identity``,
``client_tls``, ``upstream_tls`` (:mod:`pidgate.config.security_settings`); the base model
and ``HOST:PORT`` field type are in :mod:`pidgate.config.sections`. Loading and merging sources
lives in ``pidgate.config.loader``. Kafka's own names are kept where Kafka has one
(``producer.id.quota.window.size.seconds`` and friends from KIP-936), so an operator can carry
values over from a broker config.

Must not import: asyncio, socket, structlog, prometheus_client, ``pidgate.proxy``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator

from pidgate.config.addresses import HostPort, parse_host_port
from pidgate.config.rejection_settings import RejectionSettings
from pidgate.config.sections import FrozenSection, ListenAddress, host_port_from_text
from pidgate.config.security_settings import (
    ClientTlsSettings,
    IdentitySettings,
    UpstreamTlsSettings,
)

#: The user entity Kafka uses for "every user without an explicit quota" (``users.<default>``).
DEFAULT_USER_ENTITY = "<default>"

#: Kafka's socket.request.max.bytes default (100 MiB): a frame larger than this is refused by a
#: broker too, so refusing it earlier loses nothing a broker would have accepted.
KAFKA_SOCKET_REQUEST_MAX_BYTES = 104_857_600


#: ``enforce`` throttles; ``observe`` decides the same, records what it would have throttled
#: (metrics, event log ``would_reject``, /state) and forwards every request.
QuotaMode = Literal["enforce", "observe"]


class UserQuota(FrozenSection):
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


class QuotaSettings(FrozenSection):
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


class ProxySettings(FrozenSection):
    """Listeners, upstream brokers, routing and per-connection limits."""

    listen: ListenAddress = Field(
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

    @field_validator("upstream", mode="before")
    @classmethod
    def _parse_upstream(cls, value: object) -> object:
        if isinstance(value, str):
            value = [part for part in value.split(",") if part.strip()]
        if isinstance(value, list):
            return [host_port_from_text(item) for item in value]
        return value

    @field_validator("advertised_endpoints", mode="before")
    @classmethod
    def _parse_endpoint_map(cls, value: object) -> object:
        if isinstance(value, dict):
            return {str(key): host_port_from_text(target) for key, target in value.items()}
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


class LoggingSettings(FrozenSection):
    level: Literal["debug", "info", "warning", "error"] = Field("info", description="log level")
    format: Literal["auto", "json", "console"] = Field(
        "auto", description="auto: pretty on a TTY, JSON Lines otherwise"
    )
    rate_limit_events: int = Field(
        5, ge=1, description="at most this many lines of one event per key per interval"
    )
    rate_limit_interval_ms: int = Field(10_000, ge=1, description="the rate-limit interval")


class AdminSettings(FrozenSection):
    """The operator's HTTP endpoint: /metrics, /healthz, /readyz, /state."""

    enabled: bool = Field(True, description="serve the admin HTTP endpoint")
    listen: ListenAddress = Field(
        HostPort(host="127.0.0.1", port=9404),
        description="admin HTTP HOST:PORT; loopback unless you say otherwise (it has no auth)",
    )
    max_user_labels: int = Field(
        1000, ge=1, description="per-user metric label sets at most; the rest is user=__other__"
    )


class StateSettings(FrozenSection):
    """Quota overrides and Bloom/bucket state kept across restarts."""

    path: Path | None = Field(
        None, description="state file (written atomically); none = nothing survives a restart"
    )
    persist_interval_ms: int = Field(
        10_000, ge=100, description="how often the state file is rewritten (and at shutdown)"
    )


class SharedStoreSettings(FrozenSection):
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


class FleetSettings(FrozenSection):
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


class EventLogSettings(FrozenSection):
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


class Settings(FrozenSection):
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
