"""Which lane a client connection holds: the compiled express lane, or none.

Owns the choice (issue "native"): ``_express.ExpressLane`` (compiled from its .pyx by the normal
install) where ``pidgate.protocol.native`` chose the compiled path and the module is built, else
``PureLane``: no lane, every read and every broker answer takes the Python path. A connection
makes its lane at the end of its __init__ (``Lane(connection)``) and, where ``COMPILED``, lets
the lane's ``get_buffer`` and ``buffer_updated`` be its own. Both give the
same bytes out, decisions and errors (``scripts/path_twins.py``, tests/proxy/serving/
test_data_paths.py). ``COMPILED`` says which runs (``pidgate serve`` logs it at start).

Must not import the connection, response-path, upstream or produce-gate modules (the
connection builds on this one).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Final

from pidgate.protocol import native


class PureLane:
    """No express lane: what ``ClientConnection`` asks of its lane, answered for none."""

    def __init__(self, connection: object) -> None:
        pass

    @property
    def requests_taken(self) -> int:
        """Requests the lane took since the connection opened: none."""
        return 0

    @property
    def new_producer_ids_admitted(self) -> int:
        """PIDs the lane admitted as new since the connection opened: none."""
        return 0

    @property
    def express_owed(self) -> int:
        """Responses owed for requests the lane forwarded: none."""
        return 0

    def flush_counters(self) -> None:
        """The lane's counters go to the metrics at a scrape: it counts nothing."""

    def express_close(self) -> None:
        """The connection ended: nothing of the lane's to end."""

    def upstream_reader(self, upstream: object) -> Callable[[bytes], None] | None:
        """The broker side's ``data_received`` when the lane reads it: None, its own."""
        return None


def _choose() -> type[PureLane]:
    if native.compiled is None:
        return PureLane
    try:
        from pidgate.proxy.serving import _express  # type: ignore[attr-defined]
    except ImportError:  # a build of the protocol module without this one: the Python path
        return PureLane
    lane: type[PureLane] = _express.ExpressLane
    return lane


if TYPE_CHECKING:
    Lane = PureLane
else:
    #: What ``ClientConnection`` makes its lane with.
    Lane = _choose()

#: Whether the compiled lane runs.
COMPILED: Final[bool] = Lane is not PureLane
