"""The ``pidgate serve`` flags: each one a settings key (which also has a config-file key and a
``PIDGATE_*`` environment variable), declared as command-table rows, and turned into the
overrides :func:`pidgate.config.load_settings` lays over the file and the environment.

Owns: the serve option rows (their ``--help`` texts name each flag's environment variable) and
:func:`serve_overrides`. Must not import: ``pidgate.proxy``, ``pidgate.pipeline``,
``pidgate.cli``, asyncio, socket, structlog, prometheus_client.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from pidgate.config.command_table import option
from pidgate.config.loader import env_var_name
from pidgate.config.settings import DEFAULT_USER_ENTITY

_WINDOW_SECONDS_KEY = "producer.id.quota.window.size.seconds"
_WINDOW_NUM_KEY = "producer.id.quota.window.num"


def _env(section: str, key: str) -> str:
    return f"(env {env_var_name(section, key)})"


def _user_rate(text: str) -> tuple[str, int]:
    user, sep, rate = text.partition("=")
    if not sep or not user or not rate.isdigit():
        raise argparse.ArgumentTypeError(f"expected USER=N (e.g. ANONYMOUS=5), got {text!r}")
    return user.removeprefix("User:"), int(rate)


#: The ``serve`` flags in ``--help`` order; each help ends with its environment variable.
SERVE_OPTIONS = (
    option("--config", "YAML config file; default: none (env PIDGATE_CONFIG)", type=Path),
    option(
        "--upstream",
        "upstream broker; repeat for several bootstrap brokers; required here, in the file or "
        "in the environment " + _env("proxy", "upstream"),
        action="append",
        metavar="HOST:PORT",
    ),
    option(
        "--listen",
        "bootstrap listener, default 127.0.0.1:9092 " + _env("proxy", "listen"),
        metavar="HOST:PORT",
    ),
    option(
        "--advertised-host",
        "host put into rewritten broker endpoints; default: the listen host "
        + _env("proxy", "advertised_host"),
        metavar="HOST",
    ),
    option(
        "--broker-port-base",
        "gateway mode: broker node_id is fronted on port N + node_id; default: listen "
        "port + 1 " + _env("proxy", "broker_port_base"),
        type=int,
        metavar="N",
    ),
    option(
        "--mode",
        "routing mode, default gateway " + _env("proxy", "mode"),
        choices=("gateway", "sidecar"),
    ),
    option(
        "--default-producer-ids-rate",
        "new PIDs per window for users without their own quota (users.<default>); "
        "default: unlimited " + _env("quota", "users"),
        type=int,
        metavar="N",
    ),
    option(
        "--producer-ids-rate",
        "new PIDs per window for one user; ANONYMOUS=5 targets PLAINTEXT clients; "
        "default: none " + _env("quota", "users"),
        action="append",
        type=_user_rate,
        metavar="USER=N",
    ),
    option(
        "--observe",
        "observe mode: decide as enforcement would, record would-be throttles (metrics, "
        "event log, /state) and forward every request; default: enforce " + _env("quota", "mode"),
        action="store_const",
        const="observe",
        dest="quota_mode",
    ),
    option(
        "--quota-window-seconds",
        "producer.id.quota.window.size.seconds, default 3600 " + _env("quota", _WINDOW_SECONDS_KEY),
        type=int,
        metavar="S",
    ),
    option(
        "--quota-window-num",
        "producer.id.quota.window.num, default 11 " + _env("quota", _WINDOW_NUM_KEY),
        type=int,
        metavar="N",
    ),
    option(
        "--http",
        "admin HTTP (/metrics /healthz /readyz /state), default 127.0.0.1:9404 "
        + _env("admin", "listen"),
        metavar="HOST:PORT",
    ),
    option(
        "--event-log",
        "write the PID event log (JSON Lines) to DIR; off by default "
        + _env("event_log", "directory"),
        metavar="DIR",
    ),
    option(
        "--workers",
        "serve with N processes sharing the listeners (Linux), one fleet; default 1 "
        + _env("proxy", "workers"),
        type=int,
        metavar="N",
    ),
    option(
        "--log-level",
        "log level, default info " + _env("logging", "level"),
        choices=("debug", "info", "warning", "error"),
    ),
)


def serve_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The settings the given ``serve`` flags set, as a nested dict (sections, then keys); flags
    not given are left out, so the file and the environment decide them."""
    proxy: dict[str, Any] = {}
    quota: dict[str, Any] = {}
    if args.upstream:
        proxy["upstream"] = list(args.upstream)
    for flag, key in (
        ("listen", "listen"),
        ("advertised_host", "advertised_host"),
        ("broker_port_base", "broker_port_base"),
        ("mode", "mode"),
        ("workers", "workers"),
    ):
        if getattr(args, flag) is not None:
            proxy[key] = getattr(args, flag)
    users: dict[str, dict[str, int]] = {}
    if args.default_producer_ids_rate is not None:
        users[DEFAULT_USER_ENTITY] = {"producer_ids_rate": args.default_producer_ids_rate}
    for user, rate in args.producer_ids_rate or ():
        users[user] = {"producer_ids_rate": rate}
    if users:
        quota["users"] = users
    if args.quota_mode is not None:
        quota["mode"] = args.quota_mode
    if args.quota_window_seconds is not None:
        quota[_WINDOW_SECONDS_KEY] = args.quota_window_seconds
    if args.quota_window_num is not None:
        quota[_WINDOW_NUM_KEY] = args.quota_window_num
    overrides: dict[str, Any] = {}
    if proxy:
        overrides["proxy"] = proxy
    if quota:
        overrides["quota"] = quota
    if args.log_level:
        overrides["logging"] = {"level": args.log_level}
    if args.http:
        overrides["admin"] = {"listen": args.http}
    if args.event_log:
        overrides["event_log"] = {"directory": args.event_log}
    return overrides
