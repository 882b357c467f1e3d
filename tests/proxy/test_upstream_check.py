"""How pidgate names an exception and a failed connection in the messages an operator reads."""

from __future__ import annotations

import asyncio
import socket

from kafka.errors import KafkaConnectionError, KafkaTimeoutError

from pidgate.demo.broker import free_port
from pidgate.proxy.upstream_check import connect_error_text, describe_error, unanswered_reason


def test_an_exception_is_named_once() -> None:
    # kafka-python's str() starts with the class name already; the builtins' does not.
    assert describe_error(KafkaTimeoutError()) == "KafkaTimeoutError"
    assert describe_error(KafkaTimeoutError("Unable to bootstrap")) == (
        "KafkaTimeoutError: Unable to bootstrap"
    )
    assert describe_error(KafkaConnectionError("reset")) == "KafkaConnectionError: reset"
    assert describe_error(ValueError("bad")) == "ValueError: bad"
    assert describe_error(TimeoutError()) == "TimeoutError"


def test_connect_errors_in_words() -> None:
    assert connect_error_text(ConnectionRefusedError(111, "Connection refused")) == (
        "connection refused"
    )
    assert connect_error_text(TimeoutError(), 2.0) == "no answer within 2 s"
    assert connect_error_text(OSError(101, "Network is unreachable")) == "network is unreachable"
    resolved = connect_error_text(socket.gaierror(-2, "Name or service not known"))
    assert resolved == "host name not resolved: Name or service not known"


def test_every_unanswered_address_is_named_and_one_answer_is_enough() -> None:
    dead_a, dead_b = free_port(), free_port()
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        alive = listening.getsockname()[1]
        reason = asyncio.run(unanswered_reason([("127.0.0.1", dead_a), ("127.0.0.1", dead_b)]))
        assert reason == (
            f"no upstream broker answered at 127.0.0.1:{dead_a} (connection refused), "
            f"127.0.0.1:{dead_b} (connection refused)"
        )
        assert asyncio.run(unanswered_reason([("127.0.0.1", dead_a), ("127.0.0.1", alive)])) is None
