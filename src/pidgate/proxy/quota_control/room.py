"""Quota control assembled for one proxy: the quotas in force (``QuotaControl``) with what plugs
into them while pidgate runs: fleet sync, the shared quota store, the PID frontier probe when a
principal's enforcement begins, and the state file's writes. The server builds one, joins the
cluster through it before serving and leaves after.

Owns: ``QuotaControlRoom``. Reports to the metrics only through the callback it is given
(``frontier_probed``); the server registers the fleet's collector. Must not import ``serving``,
``operations`` or the server (quota control's rule: they call it).
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import threading
from collections.abc import Callable, Mapping
from typing import Any

from pidgate.config import Settings
from pidgate.protocol.client_quotas.entities import PRODUCER_IDS_RATE, QuotaChange
from pidgate.proxy.logs import RateLimitedLog, get_logger
from pidgate.proxy.quota_control.admission import quota_clock_ms
from pidgate.proxy.quota_control.fleet import FleetError, FleetOutbox, FleetRecord, FleetSync
from pidgate.proxy.quota_control.pid_frontier import FrontierProber, FrontierResult
from pidgate.proxy.quota_control.quota_admin import entity_key
from pidgate.proxy.quota_control.quotas_in_force import (
    EncodedSave,
    QuotaControl,
    snapshot_for_saving,
    write_encoded,
    write_snapshot,
)
from pidgate.proxy.quota_control.shared_store import QuotaOverride, SharedQuotaStore
from pidgate.proxy.upstream_check import describe_error
from pidgate.quota.grandfather import Enforcement

__all__ = ["QuotaControlRoom"]

#: Called when a PID frontier probe finished: (frontier or None when it failed, quota clock ms).
FrontierProbed = Callable[[int | None, int], None]


class QuotaControlRoom:
    """``quota_control``'s fleet, shared store, frontier probes and state file, on the event
    loop of the proxy that built it. ``log``: the proxy's rate-limited log for warnings that can
    repeat."""

    def __init__(
        self,
        settings: Settings,
        quota_control: QuotaControl,
        log: RateLimitedLog,
        frontier_probed: FrontierProbed,
    ) -> None:
        self.settings = settings
        self.quota_control = quota_control
        self.quota = quota_control.manager
        self._log = log
        self._frontier_probed = frontier_probed
        #: What this member admitted, for the fleet (None: no fleet.id).
        self.fleet_outbox = self._open_fleet_outbox(settings)
        self.fleet: FleetSync | None = None
        self._shared_store: SharedQuotaStore | None = None
        #: Held while the state file is written: a periodic write still running in its thread
        #: when pidgate stops is never left to replace the final, newer one.
        self._state_write_lock = threading.Lock()
        self._probes: set[asyncio.Future[None]] = set()
        self._prober = FrontierProber(
            [str(upstream) for upstream in settings.proxy.upstream],
            security=dict(settings.shared_store.security),
            timeout_ms=settings.quota.grandfather_probe_timeout_ms,
        )
        #: The latest PID frontier probe (for /state), and when it finished (quota clock).
        self.last_frontier: FrontierResult | None = None
        self.last_frontier_ms: int | None = None
        quota_control.on_enforcement_began = self._enforcement_began

    def reload(self, settings: Settings) -> None:
        """A re-read config file (SIGHUP): its quotas, under the runtime overrides."""
        self.quota_control.reload(settings)
        self.settings = settings

    def state(self) -> dict[str, Any]:
        """For /state: the quotas in force, the latest frontier probe and the fleet."""
        state = self.quota_control.state()
        probe = self.last_frontier
        state["grandfather"]["last_probe"] = (
            None
            if probe is None
            else {
                "frontier": probe.frontier,
                "reason": probe.reason,
                "brokers": {str(node): list(pids) for node, pids in probe.per_broker.items()},
                "finished_ms": self.last_frontier_ms,
                "elapsed_ms": probe.elapsed_ms,
            }
        )
        if self.fleet is not None:
            state["fleet"] = {"id": self.settings.fleet.id, "scope": self.settings.fleet.scope}
            state["fleet"].update(self.fleet.status())
        return state

    def apply_quota_changes(
        self, changes: list[tuple[int, QuotaChange]]
    ) -> Mapping[int, tuple[int, str | None]]:
        """AlterClientQuotas changes (``QuotaAdmin``'s apply): failures per index."""
        failures = self.quota_control.apply_changes(changes)
        for _, change in changes:
            if change.key != PRODUCER_IDS_RATE:
                continue  # a mode change: quota_control logs quota_mode_changed itself
            get_logger().info(
                "quota_changed",
                user=entity_key(change.entity),
                producer_ids_rate=change.rate,
                source="client_quotas_api",
            )
        return failures

    # -- the cluster: joined before serving, left at stop ---------------------------------------

    async def start_fleet(self) -> None:
        """Join the fleet before serving: read the fleet topic one window back and apply it,
        so every PID the fleet admitted within the window is known here and every bucket has
        the fleet's level (issue "fleet")."""
        outbox = self.fleet_outbox
        topic = self.settings.fleet.effective_topic
        if outbox is None or topic is None:
            return
        loop = asyncio.get_running_loop()

        def on_records(records: list[FleetRecord]) -> None:  # on the fleet thread
            loop.call_soon_threadsafe(self._apply_fleet, records)

        fleet = FleetSync(
            [str(upstream) for upstream in self.settings.proxy.upstream],
            topic,
            outbox,
            on_records,
            window_ms=self.settings.quota.window_ms,
            flush_interval_ms=self.settings.fleet.flush_interval_ms,
            security=dict(self.settings.shared_store.security),
        )
        try:
            await asyncio.to_thread(fleet.start, self.settings.fleet.catch_up_timeout_ms / 1000)
        except FleetError as error:
            raise OSError(f"fleet {self.settings.fleet.id!r}: {error}") from error
        # Records the reader handed over before it reported the catch-up are applied by now:
        # the loop runs call_soon_threadsafe callbacks in order.
        self.fleet = fleet

    async def start_shared_store(self) -> None:
        """Join the fleet's shared quota topic: catch up on its overrides before serving, then
        publish local changes and apply remote ones as they come."""
        shared = self.settings.shared_store
        if shared.topic is None:
            return
        loop = asyncio.get_running_loop()
        listen = self.settings.proxy.listen

        def on_change(override: QuotaOverride) -> None:  # on the store's reader thread
            loop.call_soon_threadsafe(self._apply_shared, override)

        store = SharedQuotaStore(
            [str(upstream) for upstream in self.settings.proxy.upstream],
            shared.topic,
            shared.instance_id or f"{self.settings.proxy.effective_advertised_host}:{listen.port}",
            on_change,
            security=dict(shared.security),
        )
        await asyncio.to_thread(store.start)
        self._shared_store = store

        def publish(user: str, rate: int | None) -> None:
            future = loop.run_in_executor(None, store.publish, QuotaOverride(user, rate))
            future.add_done_callback(self._published)

        self.quota_control.listeners.append(publish)

    async def leave_cluster(self) -> None:
        """Stop the shared store and the fleet, close the frontier prober's connections."""
        if self._shared_store is not None:
            await asyncio.to_thread(self._shared_store.stop)
        if self.fleet is not None:
            await asyncio.to_thread(self.fleet.stop)
        await asyncio.to_thread(self._prober.close)

    async def stop(self) -> None:
        """After ``leave_cluster`` and the periodic save: cancel frontier probes still running,
        then write the state file a last time."""
        for task in list(self._probes):
            task.cancel()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await task
        if self.settings.state.path is not None:
            # After the periodic save is cancelled: this is the last write (the lock waits for
            # one that was already running in its thread).
            self.save_state_now()

    def _open_fleet_outbox(self, settings: Settings) -> FleetOutbox | None:
        fleet = settings.fleet
        if fleet.id is None:
            return None
        self.quota.announce_refreshes = True
        listen = settings.proxy.listen
        instance = settings.shared_store.instance_id or (
            f"{settings.proxy.effective_advertised_host}_{listen.port}"
        )
        # A per-process suffix: this process skips its own records, but a restarted member
        # replays those of its previous incarnation.
        member = f"{instance}-{secrets.token_hex(4)}"
        return FleetOutbox(member, quota_clock_ms, fleet.max_pending_producer_ids)

    def _apply_fleet(self, records: list[FleetRecord]) -> None:
        """Other members' admissions, on the event loop: their PIDs become known here and, in
        fleet scope, their tokens are debited here, each at the time it was taken."""
        fleet_scope = self.settings.fleet.scope == "fleet"
        now_ms = quota_clock_ms()
        for record in records:
            self.quota.learn(
                record.principal,
                record.new_producer_ids + record.known_producer_ids,
                len(record.new_producer_ids) if fleet_scope else 0,
                min(record.ts_ms, now_ms),
            )

    def _published(self, future: asyncio.Future[None]) -> None:
        error = future.exception()
        if error is not None:  # applied here already; the fleet learns it on a later change
            self._log.warning("shared_store_publish_failed", key="publish", error=str(error))

    def _apply_shared(self, override: QuotaOverride) -> None:
        if self.quota_control.apply_remote(override.user, override.producer_ids_rate):
            get_logger().info(
                "quota_changed",
                user=override.user,
                producer_ids_rate=override.producer_ids_rate,
                source="shared_store",
            )

    # -- grandfathering: the PID frontier --------------------------------------------------------

    async def learn_frontier_at_start(self) -> None:
        """Enforcement begins now for every principal without saved state: learn the PID
        frontier before the first request is read (bounded by the probe timeout)."""
        await self._resolve_enforcement(self.quota.begin_enforcement(quota_clock_ms()), "start")

    def _enforcement_began(self, enforcement: Enforcement) -> None:
        """A policy change made principals limited (on the event loop): probe the frontier now;
        until it answers (milliseconds), their unknown PIDs are admitted as in learning mode."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # changed from outside the loop (tests): nothing can probe
            enforcement.resolve(None, "quota changed outside the event loop: no probe")
            return
        task = loop.create_task(self._resolve_enforcement(enforcement, "quota_change"))
        self._probes.add(task)
        task.add_done_callback(self._probes.discard)

    async def _resolve_enforcement(self, enforcement: Enforcement, cause: str) -> None:
        policy = self.quota.policy
        if enforcement.grace_ms == 0:
            enforcement.disable("grandfathering off (quota.grandfather_grace_ms = 0)")
            return
        if cause == "start" and (
            policy.default_producer_ids_rate is None and not policy.user_producer_ids_rates
        ):
            # Nobody is limited: a later change that limits someone probes then. (No
            # connection is made before that: pidgate talks to the brokers only for clients.)
            enforcement.disable("no principal limited at start")
            return
        try:
            result = await asyncio.to_thread(self._prober.probe)
        except Exception as error:  # probe_frontier reports failures; this is a bug guard
            result = FrontierResult(None, f"probe crashed: {describe_error(error)}")
        now = quota_clock_ms()
        self.last_frontier, self.last_frontier_ms = result, now
        enforcement.resolve(result.frontier, result.reason)
        self._frontier_probed(result.frontier, now)
        if result.frontier is not None:
            get_logger().info(
                "pid_frontier_learnt",
                cause=cause,
                frontier=result.frontier,
                brokers={str(node): pids for node, pids in result.per_broker.items()},
                elapsed_ms=result.elapsed_ms,
                retries=result.retries,
                reason=result.reason,
                enforcement_began_ms=enforcement.began_ms,
                grace_ms=enforcement.grace_ms,
            )
        else:
            get_logger().warning(
                "grandfather_learning_mode",
                cause=cause,
                reason=result.reason,
                elapsed_ms=result.elapsed_ms,
                grace_ms=enforcement.grace_ms,
                action="unknown PIDs of principals whose enforcement began now are admitted "
                "and recorded, never rejected, until the grace period ends",
            )

    # -- the state file -------------------------------------------------------------------------

    def save_state_now(self) -> None:
        """Copy, encode and write the state file here and now (at stop)."""
        try:
            snapshot = snapshot_for_saving(self.quota_control)
            with self._state_write_lock:
                write_snapshot(snapshot, self.settings)
        except OSError as error:
            get_logger().error(
                "state_file_write_failed", path=str(self.settings.state.path), error=str(error)
            )
            return
        get_logger().info("state_saved", path=str(self.settings.state.path))

    def write_encoded(self, save: EncodedSave) -> None:
        """Write a save encoded on the loop (the periodic save; in a thread)."""
        with self._state_write_lock:
            write_encoded(save, self.settings)
