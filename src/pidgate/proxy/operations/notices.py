"""Misconfigurations pidgate can see at run time but must not stop for, said once each with the
fix in the message: a SASL handshake through a pidgate whose ``identity.sasl`` is off (every
such client is charged to ``User:ANONYMOUS``), no quota configured at all (nothing is
throttled), and listeners that cannot bind (which also make ``/readyz`` not ready). Warnings at
start (``startup_warning``: no upstream answering, sidecar mode without a fleet) also get one
plain line on stderr, readable whatever the log format.

Owns: ``OperatorNotices``. Never receives credentials: only addresses and setting names.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

from pidgate.proxy.logs import get_logger


@dataclass
class OperatorNotices:
    #: Events already logged; each is said once per process.
    said: set[str] = field(default_factory=set)
    #: Listener name -> why it is not serving; non-empty means /readyz answers 503.
    listener_failures: dict[str, str] = field(default_factory=dict)

    def once(self, event: str, **fields: Any) -> bool:
        """Log ``event`` as a warning unless it was logged before; True when logged now."""
        if event in self.said:
            return False
        self.said.add(event)
        get_logger().warning(event, **fields)
        return True

    def startup_warning(self, event: str, line: str, **fields: Any) -> None:
        """At start: the warning ``event`` in the log, and ``pidgate: warning: <line>`` on
        stderr (the line names the cause and the setting to change)."""
        if self.once(event, **fields):
            print(f"pidgate: warning: {line}", file=sys.stderr, flush=True)

    def upstream_unreachable_at_start(self, reason: str) -> None:
        """``reason``: ``no upstream broker answered at HOST:PORT (why)``."""
        self.startup_warning(
            "upstream_unreachable_at_start",
            f"{reason}: check that the broker runs and that --upstream (proxy.upstream) is its "
            "listener's HOST:PORT as reachable from here",
            reason=reason,
            consequence="clients are disconnected and /readyz answers 503 until a broker "
            "answers; pidgate keeps trying",
            check="the broker runs, and --upstream / proxy.upstream / PIDGATE_PROXY_UPSTREAM is "
            "its listener's HOST:PORT as reachable from this host (firewall, DNS)",
        )

    def sidecar_without_fleet(self) -> None:
        self.startup_warning(
            "sidecar_without_fleet",
            "sidecar mode without fleet.id: when a partition leader moves, the new leader's "
            "sidecar does not know the producers and charges their PIDs as new (steady "
            "producers can be rejected); set the same fleet.id on every sidecar "
            "(PIDGATE_FLEET_ID=<name>)",
            consequence="each sidecar judges alone: after a leader failover or partition "
            "reassignment the new leader's sidecar has never seen the producers writing there, "
            "charges their PIDs as new and, past the quota, rejects steady producers",
            fix="give every sidecar of the cluster the same fleet.id (config file "
            'fleet: {id: <name>}, or PIDGATE_FLEET_ID=<name>); README "Fleets"',
        )

    def sasl_without_identity(self, client: str) -> None:
        """A client started a SASL handshake but ``identity.sasl`` is off (connection hot
        path: a set lookup after the first time)."""
        self.once(
            "sasl_handshake_while_identity_sasl_off",
            client=client,
            consequence="SASL clients are all charged to User:ANONYMOUS, not to their user",
            fix="set identity.sasl: true (PIDGATE_IDENTITY_SASL=true) so each client is "
            "charged to the user the broker authenticated",
        )

    def no_quota(self) -> None:
        self.once(
            "no_quota_configured",
            consequence="producer_ids_rate is unlimited for every user: nothing is throttled",
            fix="set quota.users.<default>.producer_ids_rate (--default-producer-ids-rate N) or "
            "a per-user quota, or `pidgate quotas set --default --producer-ids-rate N`",
        )

    def listener_failed(self, name: str, reason: str) -> None:
        self.listener_failures[name] = reason

    def listener_opened(self, name: str) -> None:
        self.listener_failures.pop(name, None)

    @property
    def not_ready_reason(self) -> str | None:
        if not self.listener_failures:
            return None
        return "; ".join(
            f"{name}: {reason}" for name, reason in sorted(self.listener_failures.items())
        )
