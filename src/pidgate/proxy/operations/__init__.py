"""The operator's surface: Prometheus metrics, the admin HTTP listener (/metrics, /healthz,
/readyz, /state), the PID event log, run-time notices, per-principal work in event-loop steps,
and the client side of ``pidgate quotas``.

May import ``pidgate.proxy.quota_control`` (it reports the decisions made there),
``pidgate.proxy.logs``, ``pidgate.proxy.upstream_check`` and the pure packages; never
``serving``.
"""
