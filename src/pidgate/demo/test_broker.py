"""``pidgate test-broker``: the demo's embedded tansu broker on its own, to try ``pidgate serve``,
``pidgate quotas`` and Kafka clients against by hand. Prints its bootstrap address and the exact
``pidgate serve`` line, runs until Ctrl-C (or SIGTERM), then stops the broker by PID and removes
its log; its data lives in memory, so nothing is left behind.

Owns: ``run_test_broker``. Must not import the demo's scenario, producers or display.
"""

from __future__ import annotations

import errno
import signal
import socket
import sys
import time
from collections.abc import Iterable

from pidgate.demo.broker import TANSU_NODE_ID, EmbeddedBroker
from pidgate.demo.next_steps import TEST_BROKER_PORT, pidgate_command, serve_lines
from pidgate.demo.signals import StopSignal, raise_stop_signal, stop_signals

_EXIT_OK = 0
_EXIT_FAILED = 1


def _out(lines: Iterable[str]) -> None:
    for line in lines:
        print(line, flush=True)


def _port_taken(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as probe:
        try:
            probe.bind((host, port))
        except OSError as error:
            return error.errno == errno.EADDRINUSE
    return False


def run_test_broker(port: int | None = None) -> int:
    """Serve a tansu broker on 127.0.0.1 until a signal: on ``port``, or on
    ``TEST_BROKER_PORT`` (any free port when that one is taken). 0 when stopped by Ctrl-C or
    SIGTERM, 1 when it could not start or died."""
    if port is not None and _port_taken(port):
        print(
            f"pidgate test-broker: port {port} is in use: stop what listens there, or choose "
            "another with --port N (--port 0: any free port)",
            file=sys.stderr,
        )
        return _EXIT_FAILED
    chosen = TEST_BROKER_PORT if port is None else port
    if port is None and _port_taken(chosen):
        chosen = 0  # the default is taken: any free port; the lines below name it
    broker = EmbeddedBroker(port=chosen or None)
    with stop_signals(raise_stop_signal):
        try:
            broker.start()
            _out(
                [
                    f"pidgate test-broker: tansu (in memory, node id {TANSU_NODE_ID}) listening "
                    f"on {broker.bootstrap}  broker_pid={broker.pid}",
                    f"  log  {broker.log_path} (removed when it stops)",
                    "",
                    *serve_lines(pidgate_command(), broker.bootstrap),
                    "",
                    "Ctrl-C stops the broker (its data is in memory: nothing is left behind).",
                ]
            )
            while broker.running():
                time.sleep(0.5)
            print(
                f"pidgate test-broker: tansu exited on its own; its log ends: "
                f"{broker.log_tail(500)}",
                file=sys.stderr,
            )
            return _EXIT_FAILED
        except StopSignal as signalled:
            with stop_signals(signal.SIG_IGN):
                broker.cleanup()
            _out([f"pidgate test-broker: stopped ({signalled} received)"])
            return _EXIT_OK
        except RuntimeError as error:  # tansu did not start
            print(f"pidgate test-broker: {error}", file=sys.stderr)
            return _EXIT_FAILED
        finally:
            with stop_signals(signal.SIG_IGN):
                broker.cleanup()  # idempotent
