"""What every connection of one proxy shares: settings, the gatekeeper, the router, the log and
the set of open connections (for graceful shutdown).

Owns: ``ProxyContext`` (a plain holder; no behaviour of its own).
"""

from __future__ import annotations

import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pidgate.config import Settings
from pidgate.proxy.admission import Gatekeeper
from pidgate.proxy.identity import IdentityPolicy
from pidgate.proxy.logs import RateLimitedLog
from pidgate.proxy.routing import Router

if TYPE_CHECKING:
    from pidgate.proxy.connection import ClientConnection


@dataclass
class ProxyContext:
    settings: Settings
    gatekeeper: Gatekeeper
    router: Router
    log: RateLimitedLog
    #: api_key -> (min, max) versions pidgate advertises and accepts.
    api_version_limits: Mapping[int, tuple[int, int]]
    #: Who each connection is charged to (PLAINTEXT, TLS certificates, observed SASL).
    identity: IdentityPolicy
    #: TLS towards the brokers, or None for plaintext.
    upstream_ssl: ssl.SSLContext | None = None
    connections: set[ClientConnection] = field(default_factory=set)
