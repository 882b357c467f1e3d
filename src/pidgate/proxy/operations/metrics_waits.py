"""KIP-91 for the metrics: how long producer IDs rejected by the quota have been waiting.

A throttled producer retries until ``delivery.timeout.ms`` (120 s by default), then fails its
records. ``ProducerIdWaits`` remembers when each rejected PID was first rejected until a token
admits it, its client's connection closes, or it is forgotten (table full, or waiting far
longer than any client would); it says so once when a PID has waited half of the timeout and
once when it has waited all of it, and builds the wait families at scrape time.

Owns: ``ProducerIdWaits``. Must not import: ``metrics`` (``ProxyMetrics`` calls us), asyncio,
socket, structlog, the connection or server modules.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Final

from prometheus_client.metrics_core import Metric

from pidgate.proxy.operations import metric_families as families
from pidgate.proxy.operations.metric_families import OTHER_USER
from pidgate.proxy.operations.metrics_scrape import LabelValues, UserCounters, empty_families

__all__ = ["WAIT_FORGET_MS_DEFAULT", "ProducerIdWaits"]

#: KIP-91 caps delivery.timeout.ms only by the user's patience; 2x the usual upper setting
#: (5 min) covers clients that raised it, after which a PID still "waiting" is a producer that
#: gave up or went away, and keeping it would only hold memory.
WAIT_FORGET_MS_DEFAULT: Final = 2 * 5 * 60_000


class ProducerIdWaits:
    """The waits of rejected PIDs, by (user label key, PID), oldest first.

    ``on_long_wait`` is told (principal, producer_id, waited_ms, threshold_ms) once when a
    rejected PID is rejected again past half of ``delivery_timeout_ms``, and once past all of
    it (the server logs it).
    """

    __slots__ = (
        "_delivery_timeout_ms",
        "_forget_ms",
        "_max_waiting_pids",
        "_on_long_wait",
        "_per_peer",
        "dropped",
        "table",
    )

    def __init__(
        self,
        max_waiting_pids: int,
        delivery_timeout_ms: int,
        forget_ms: int,
        on_long_wait: Callable[[str, int, int, int], None] | None,
    ) -> None:
        self._max_waiting_pids = max_waiting_pids
        self._delivery_timeout_ms = delivery_timeout_ms
        self._forget_ms = forget_ms
        self._on_long_wait = on_long_wait
        #: (user label key, PID) -> (first rejection ms * 4 + thresholds reported, the client
        #: connection it was last rejected on), oldest first. One small tuple per wait (up to
        #: max_waiting_pids of them): a PID storm fills this table.
        self.table: OrderedDict[tuple[str, int], tuple[int, str]] = OrderedDict()
        #: Waits no longer tracked because the table was full.
        self.dropped = 0
        #: Waits per client connection: a wait ends with its client's connection (a producer
        #: that went away is not waiting), found by one scan when such a connection closes.
        self._per_peer: dict[str, int] = {}

    def connection_closed(self, peer: str) -> None:
        """The PIDs waiting on the client connection ``peer`` stop waiting."""
        if self._per_peer.pop(peer, 0):
            table = self.table
            for key in [key for key, (_, on) in table.items() if on == peer]:
                del table[key]

    def admitted(self, key: str, producer_ids: tuple[int, ...]) -> None:
        """``producer_ids`` of user ``key`` were admitted: their waits end."""
        table = self.table
        for pid in producer_ids:
            self._drop(table.pop((key, pid), None))

    def rejected(
        self,
        key: str,
        producer_ids: tuple[int, ...],
        principal: str,
        peer: str,
        now_ms: int,
        user: UserCounters,
    ) -> None:
        """``producer_ids`` of user ``key`` were rejected on connection ``peer``: a first
        rejection starts a wait (and counts in ``user.producer_ids_throttled``), a retry keeps
        the wait it started."""
        self.forget_old(now_ms)
        table = self.table
        per_peer = self._per_peer
        for pid in producer_ids:
            wait_key = (key, pid)
            wait = table.get(wait_key)
            if wait is not None:  # a retry: the wait started at the first rejection
                packed = wait[0]
                if self._on_long_wait is not None:
                    packed = self._report_long_wait(principal, pid, packed, now_ms)
                if packed != wait[0] or wait[1] != peer:  # reported, or a new connection
                    self._drop(wait)
                    table[wait_key] = (packed, peer)
                    per_peer[peer] = per_peer.get(peer, 0) + 1
                continue
            user.producer_ids_throttled += 1
            if len(table) >= self._max_waiting_pids:
                self._drop(table.popitem(last=False)[1])
                self.dropped += 1
            table[wait_key] = (now_ms * 4, peer)
            per_peer[peer] = per_peer.get(peer, 0) + 1

    def forget_old(self, now_ms: int) -> None:
        table = self.table
        horizon = now_ms - self._forget_ms
        while table:
            first_ms = next(iter(table.values()))[0] // 4
            if first_ms > horizon:
                break
            self._drop(table.popitem(last=False)[1])

    def _drop(self, wait: tuple[int, str] | None) -> None:
        if wait is None:
            return
        peer = wait[1]
        left = self._per_peer.get(peer, 0) - 1
        if left > 0:
            self._per_peer[peer] = left
        else:
            self._per_peer.pop(peer, None)

    def _report_long_wait(self, principal: str, pid: int, packed: int, now_ms: int) -> int:
        """KIP-91: say so once when a PID has waited half of delivery.timeout.ms (the operator
        can still raise the quota before records fail) and once when it has waited all of it.
        ``packed`` is first rejection ms * 4 + thresholds reported; returns it updated."""
        first_ms, reported = divmod(packed, 4)
        waited_ms = now_ms - first_ms
        for level, threshold_ms in enumerate(
            (self._delivery_timeout_ms // 2, self._delivery_timeout_ms), start=1
        ):
            if reported < level and waited_ms >= threshold_ms:
                reported = level
                assert self._on_long_wait is not None
                self._on_long_wait(principal, pid, waited_ms, threshold_ms)
        return first_ms * 4 + reported

    def families(
        self,
        now_ms: int,
        *,
        users: Mapping[str, UserCounters],
        labelled: list[tuple[str, UserCounters]],
        other_used: bool,
        label_values: LabelValues,
    ) -> list[Metric]:
        """The wait families: per label, the longest wait and the waits over half of and over
        all of delivery.timeout.ms; a wait of a user without a label of its own counts under
        ``__other__``."""
        oldest: dict[str, int] = {}
        count: dict[str, int] = {}
        over: dict[str, int] = {}
        over_half: dict[str, int] = {}
        late = now_ms - self._delivery_timeout_ms
        half_late = now_ms - self._delivery_timeout_ms // 2
        for (key, _pid), (packed, _) in self.table.items():  # oldest first
            first_ms = packed // 4
            label = key if key in users else OTHER_USER
            if label not in oldest:
                oldest[label] = first_ms
            count[label] = count.get(label, 0) + 1
            if first_ms < half_late:
                over_half[label] = over_half.get(label, 0) + 1
                if first_ms < late:
                    over[label] = over.get(label, 0) + 1
        wait_max = families.PRODUCER_ID_WAIT_SECONDS_MAX.labelled()
        counted = empty_families(
            (
                (families.PRODUCER_IDS_WAITING, count),
                (families.PRODUCER_IDS_WAITING_OVER_HALF_DELIVERY_TIMEOUT, over_half),
                (families.PRODUCER_IDS_WAITING_OVER_DELIVERY_TIMEOUT, over),
            )
        )
        labels = [label for label, _ in labelled]
        if OTHER_USER in oldest and not other_used:
            labels.append(OTHER_USER)  # waits of users whose label was freed while idle
        for label in labels:
            values = label_values(label)
            first = oldest.get(label)
            wait_max.add_metric(values, 0.0 if first is None else (now_ms - first) / 1000)
            for family, counts in counted:
                family.add_metric(values, counts.get(label, 0))
        return [
            wait_max,
            *(family for family, _ in counted),
            families.PRODUCER_ID_WAITS_DROPPED.of(self.dropped),
        ]
