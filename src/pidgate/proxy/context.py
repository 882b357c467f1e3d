"""What every connection of one proxy shares: settings, the gatekeeper, the router, the log and
the set of open connections (for graceful shutdown).

Owns: ``ProxyContext`` (a plain holder; no behaviour of its own).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from pidgate.config import Settings
from pidgate.proxy.admission import ANONYMOUS_PRINCIPAL, Gatekeeper
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
    #: The principal of connections on a PLAINTEXT listener; SASL/TLS listeners will set their
    #: own per connection once authentication succeeds (the identity issue).
    principal_for_plaintext: str = ANONYMOUS_PRINCIPAL
    connections: set[ClientConnection] = field(default_factory=set)
