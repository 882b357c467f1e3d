"""The quota state as bytes: every principal's token bucket and Bloom layers, plus the quota
overrides set at run time, so that a restart changes nothing a client can observe.

Owns the state format (``format``: its description, header, errors and the decoded
``StateSnapshot``), the run-time quota overrides it carries (``run_time_overrides``), writing it
(``encode``), reading it (``decode``) and fitting saved state to the policy in force at load time
(``load``). Pure: no file I/O, no clock, no logging (``pidgate.proxy.quota_control.state_file``
writes the file atomically and logs).

May import: the rest of ``pidgate.quota`` (manager, principal table, layers, buckets,
grandfathering, policy) and bitarray. Must not import: asyncio, socket, time, logging, structlog,
prometheus_client, or ``pidgate.protocol`` / ``pidgate.proxy`` / ``pidgate.config``.
"""
