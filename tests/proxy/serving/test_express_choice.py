"""Which lane a client connection holds (issue #25): the compiled express lane where the
compiled data path runs, none under ``PIDGATE_PURE_PYTHON=1`` (tests/proxy/serving/
test_data_paths.py and tests/integration/test_express_lane.py hold both to the same behaviour).
"""

from __future__ import annotations

from dataclasses import FrozenInstanceError, fields
from typing import Any

import pytest

from pidgate.proxy.serving.express import COMPILED as EXPRESS_LANE
from pidgate.quota.manager import Admitted

from ...compiled_modules import import_compiled, printed_by_fresh_interpreter

EXPRESS, NOT_BUILT = import_compiled("pidgate.proxy.serving._express")


def _choice(pure_python: str | None) -> dict[str, Any]:
    code = """if True:
        import json
        from pidgate.proxy.serving import express
        print(json.dumps({
            "compiled": express.COMPILED,
            "lane": f"{express.Lane.__module__}.{express.Lane.__name__}",
        }))
    """
    return printed_by_fresh_interpreter(code, pure_python)


def test_the_express_lane_is_built_and_reads_first() -> None:
    assert EXPRESS is not None, NOT_BUILT
    choice = _choice(None)
    assert choice == {"compiled": True, "lane": "pidgate.proxy.serving._express.ExpressLane"}


def test_pidgate_pure_python_leaves_every_read_to_the_python_path() -> None:
    choice = _choice("1")
    assert choice == {"compiled": False, "lane": "pidgate.proxy.serving.express.PureLane"}


def test_the_decision_the_lane_tells_is_the_one_admit_makes() -> None:
    """The lane builds ``Admitted(new_producer_ids, 0)`` slot by slot (the frozen dataclass's
    ``__init__`` costs half a microsecond per new PID): every field equal to what ``__init__``
    sets, its hash too, and still frozen."""
    assert EXPRESS is not None, NOT_BUILT
    made, expected = EXPRESS.admitted((5, 7)), Admitted((5, 7), 0)
    assert type(made) is Admitted
    assert [getattr(made, f.name) for f in fields(Admitted)] == [
        getattr(expected, f.name) for f in fields(Admitted)
    ]
    assert made == expected and hash(made) == hash(expected)
    with pytest.raises(FrozenInstanceError):
        made.refreshed_count = 1  # type: ignore[misc]


# -- the fields the lane reads at their slots' offsets (pidgate/_slots.pxd) -------------------

#: Connections hold the lane only where the compiled path runs (not under the suite's pure pass).
lane_runs = pytest.mark.skipif(
    not EXPRESS_LANE, reason="the express lane runs on the compiled path only"
)


def _busy_connection(connection_class: type | None = None) -> Any:
    """A client connection on fake transports (scripts/path_twins.py's), its broker side
    open, after two Produce requests of one PID and their answers: the lane's steady state."""
    import sys
    from pathlib import Path

    scripts = str(Path(__file__).resolve().parents[3] / "scripts")
    if scripts not in sys.path:
        sys.path.insert(0, scripts)
    import path_twins

    from pidgate.proxy.serving.upstream import UpstreamConnection

    side = path_twins._Side(path_twins.settings_for(0), {})
    if connection_class is not None:  # the same connection, made of another class
        conn = connection_class(side.server.context, lambda: [("127.0.0.1", 9)])
        conn.transport = side.client_transport
        conn.principal = side.conn.principal
        conn._gate.attach(side.client_transport)
        upstream = UpstreamConnection(conn)
        upstream.transport = side.upstream_transport
        conn._upstream = upstream
        side.conn, side.upstream = conn, upstream
    body = path_twins._produce_body(9, 1, (5,))
    for correlation_id in (1, 2):
        request = path_twins._header(0, 9, b"rdkafka", True) + body
        request = request[:4] + correlation_id.to_bytes(4, "big") + request[8:]
        side.conn.data_received(path_twins._frame(request))
        side.upstream.data_received(path_twins._produce_response(9, correlation_id))
    return side.conn


def _by_name(conn: Any) -> dict[str, Any]:
    header, upstream = conn._produce_header, conn._upstream
    return {
        "closed": conn.closed,
        "principal": conn.principal,
        "_produce_header": header,
        "_upstream": upstream,
        "transport": conn.transport,
        "last_active_s": conn.last_active_s,
        "_reader._big": conn._reader._big,
        "_reader._pending": conn._reader._pending,
        "_order_guard.withheld": conn._order_guard.withheld,
        "_produce_header.header_bytes": header.header_bytes,
        "_produce_header.api_version": header.api_version,
        "_produce_header.after_correlation_id": header.after_correlation_id,
        "_upstream.transport": upstream.transport,
        "_upstream._decoder._buffered": upstream._decoder._buffered,
        "client_id": conn.client_id,
        "_produce_context": conn._produce_context,
        "_produce_context.client_id": conn._produce_context.client_id,
    }


@lane_runs
def test_the_lane_reads_each_field_of_a_connection_where_its_name_says() -> None:
    """The lane reads a connection's fields (and its header's, reader's, order guard's and
    broker side's) at their slots' offsets: each the very object ``getattr`` gives; the
    requests it took and the idle clock it restarted show it read and wrote them."""
    assert EXPRESS is not None, NOT_BUILT
    conn = _busy_connection()
    taken = conn._lane.requests_taken
    before_s = conn.last_active_s
    read = EXPRESS.read_fields(conn)
    by_name = _by_name(conn)
    assert read.keys() == by_name.keys()
    for name, value in by_name.items():
        assert read[name] is value, name
    assert taken >= 1  # the second request was the lane's
    conn.data_received(b"\x00\x00")  # half a size prefix: the Python path's, touched anyway
    assert conn.last_active_s >= before_s


@lane_runs
def test_a_connection_of_another_class_is_read_by_name() -> None:
    """A subclass of the connection (no offsets were read from it) is read by name, and the
    lane still takes its steady state."""
    assert EXPRESS is not None, NOT_BUILT
    from pidgate.proxy.serving.connection import ClientConnection

    class Subclassed(ClientConnection):
        __slots__ = ("extra",)

    conn = _busy_connection(Subclassed)
    assert type(conn) is Subclassed
    read = EXPRESS.read_fields(conn)
    for name, value in _by_name(conn).items():
        assert read[name] is value, name
    assert conn._lane.requests_taken >= 1
