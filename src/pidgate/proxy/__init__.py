"""The only package with sockets: the asyncio/uvloop Kafka proxy, grouped by job.

- ``serving``: bytes between clients and brokers (connections, flow control, routing, TLS,
  ordering, identity).
- ``quota_control``: who may bring new producer IDs (admission, waiting room, observe mode,
  quotas in force, the PID frontier, fleet sync, the shared store, the state file).
- ``operations``: what an operator sees and touches (metrics, the admin HTTP listener, the event
  log, notices, the ``pidgate quotas`` client).
- ``server``, ``runtime``, ``workers``, ``background``: the proxy assembled and run as a process,
  with ``housekeeping`` (periodic chores) and ``decision_counters`` under the server;
  ``logs``, ``upstream_check``, ``with_block`` and ``ports`` sit under every room.

Imports run down that list: serving -> operations -> quota_control -> (logs, upstream_check),
enforced by import-linter (pyproject.toml). May import ``pidgate.protocol``, ``pidgate.quota``
and ``pidgate.config``; nothing imports it except the entry points (``pidgate.cli``,
``pidgate.demo``).
"""
