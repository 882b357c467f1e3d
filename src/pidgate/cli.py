"""The ``pidgate`` command line: ``serve`` and ``demo`` (the names are a contract, DESIGN.md).

Every ``serve`` flag maps onto a settings key, which also has a config-file key and a
``PIDGATE_*`` environment variable; flags win over the environment, which wins over the file.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pidgate import __version__
from pidgate.config import DEFAULT_USER_ENTITY, ConfigError, env_var_name, load_settings

_WINDOW_SECONDS_KEY = "producer.id.quota.window.size.seconds"
_WINDOW_NUM_KEY = "producer.id.quota.window.num"


def _env(section: str, key: str) -> str:
    return f"(env {env_var_name(section, key)})"


def _user_rate(text: str) -> tuple[str, int]:
    user, sep, rate = text.partition("=")
    if not sep or not user or not rate.isdigit():
        raise argparse.ArgumentTypeError(f"expected USER=N (e.g. ANONYMOUS=5), got {text!r}")
    return user.removeprefix("User:"), int(rate)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pidgate",
        description="Throttle producer-ID explosions per principal (KIP-936) in front of Kafka.",
    )
    parser.add_argument("--version", action="version", version=f"pidgate {__version__}")
    commands = parser.add_subparsers(dest="command", required=True)

    serve = commands.add_parser("serve", help="run the proxy")
    serve.add_argument("--config", type=Path, help="YAML config file (env PIDGATE_CONFIG)")
    serve.add_argument(
        "--upstream",
        action="append",
        metavar="HOST:PORT",
        help="upstream broker; repeat for several bootstrap brokers " + _env("proxy", "upstream"),
    )
    serve.add_argument(
        "--listen", metavar="HOST:PORT", help="bootstrap listener " + _env("proxy", "listen")
    )
    serve.add_argument(
        "--advertised-host",
        metavar="HOST",
        help="host put into rewritten broker endpoints; default: the listen host "
        + _env("proxy", "advertised_host"),
    )
    serve.add_argument(
        "--broker-port-base",
        type=int,
        metavar="N",
        help="gateway mode: broker node_id is fronted on port N + node_id; default: listen "
        "port + 1 " + _env("proxy", "broker_port_base"),
    )
    serve.add_argument(
        "--mode", choices=("gateway", "sidecar"), help="routing mode " + _env("proxy", "mode")
    )
    serve.add_argument(
        "--default-producer-ids-rate",
        type=int,
        metavar="N",
        help="new PIDs per window for users without their own quota (users.<default>) "
        + _env("quota", "users"),
    )
    serve.add_argument(
        "--producer-ids-rate",
        action="append",
        type=_user_rate,
        metavar="USER=N",
        help="new PIDs per window for one user; ANONYMOUS=5 targets PLAINTEXT clients "
        + _env("quota", "users"),
    )
    serve.add_argument(
        "--quota-window-seconds",
        type=int,
        metavar="S",
        help="producer.id.quota.window.size.seconds, default 3600 "
        + _env("quota", _WINDOW_SECONDS_KEY),
    )
    serve.add_argument(
        "--quota-window-num",
        type=int,
        metavar="N",
        help="producer.id.quota.window.num, default 11 " + _env("quota", _WINDOW_NUM_KEY),
    )
    serve.add_argument(
        "--http",
        metavar="HOST:PORT",
        help="admin HTTP (/metrics /healthz /readyz /state), default 127.0.0.1:9404 "
        + _env("admin", "listen"),
    )
    serve.add_argument(
        "--event-log",
        metavar="DIR",
        help="write the PID event log (JSON Lines) to DIR; off by default "
        + _env("event_log", "directory"),
    )
    serve.add_argument(
        "--log-level",
        choices=("debug", "info", "warning", "error"),
        help=_env("logging", "level"),
    )

    from pidgate.pipeline.cli import add_analyze_parser

    add_analyze_parser(commands)

    demo = commands.add_parser(
        "demo",
        help="embedded broker + pidgate + a steady producer and a restart storm, shown live",
    )
    demo.add_argument(
        "--duration", type=float, default=45.0, metavar="S", help="stop after S seconds (45)"
    )
    demo.add_argument(
        "--event-log",
        metavar="DIR",
        help="write pidgate's PID event log to DIR, for `pidgate analyze activity --events DIR`",
    )
    return parser


def serve_overrides(args: argparse.Namespace) -> dict[str, Any]:
    proxy: dict[str, Any] = {}
    quota: dict[str, Any] = {}
    if args.upstream:
        proxy["upstream"] = list(args.upstream)
    for flag, key in (
        ("listen", "listen"),
        ("advertised_host", "advertised_host"),
        ("broker_port_base", "broker_port_base"),
        ("mode", "mode"),
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


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "analyze":
        from pidgate.pipeline.cli import run_analyze

        return run_analyze(args)
    if args.command == "demo":
        from pidgate.demo.scenario import run_demo

        return run_demo(duration_s=args.duration, event_log=args.event_log)

    environ = dict(os.environ)
    config_file = args.config or (
        Path(environ["PIDGATE_CONFIG"]) if environ.get("PIDGATE_CONFIG") else None
    )
    environ.pop("PIDGATE_CONFIG", None)
    overrides = serve_overrides(args)
    try:
        settings = load_settings(config_file, environ, overrides)
    except ConfigError as error:
        print(f"pidgate: {error}", file=sys.stderr)
        return 2
    from pidgate.proxy.runtime import run_proxy

    return run_proxy(settings, lambda: load_settings(config_file, environ, overrides))


if __name__ == "__main__":
    sys.exit(main())
