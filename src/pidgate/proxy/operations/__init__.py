"""The operator's surface: Prometheus metrics, the admin HTTP listener (/metrics, /healthz,
/readyz, /state), the PID event log, run-time notices, per-principal work in event-loop steps,
and the client side of ``pidgate quotas``.

Where each part lives: ``metrics`` (``ProxyMetrics``, the request path's counters) declares
nothing itself: every family is one row of ``metric_families``, built at scrape time by
``metrics_scrape`` and, for the KIP-91 waits, ``metrics_waits``. ``event_log`` is the queue and
writer thread, ``event_format`` what a line and a file look like. ``http``, ``notices``,
``stepping`` and ``quota_client`` stand alone.

May import ``pidgate.proxy.quota_control`` (it reports the decisions made there),
``pidgate.proxy.logs``, ``pidgate.proxy.upstream_check`` and the pure packages; never
``serving``.
"""
