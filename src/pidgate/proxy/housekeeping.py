"""The proxy's periodic chores, each its own task from start to stop: forgetting principals
whose layers expired (always), saving the state file (``state.path`` set), reloading the client
TLS certificate when its files changed (client TLS on). A chore that fails says so and runs
again at its next interval; none takes the proxy down.

Owns: ``Housekeeping`` and ``run_every``. Called by the server; must not import the server,
``runtime``, ``workers`` or ``background`` (they sit above it).
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable

from pidgate.config import Settings
from pidgate.proxy.logs import RateLimitedLog, get_logger
from pidgate.proxy.operations.stepping import LOOP_STEP_PRINCIPALS, run_in_steps
from pidgate.proxy.quota_control.admission import quota_clock_ms
from pidgate.proxy.quota_control.quotas_in_force import encode_for_saving_in_steps
from pidgate.proxy.quota_control.room import QuotaControlRoom
from pidgate.proxy.serving.tls import CertificateReloader

__all__ = ["Housekeeping", "run_every"]


async def run_every(interval_ms: int, chore: Callable[[], Awaitable[None]]) -> None:
    """``chore`` every ``interval_ms``, the first one interval after the start, until
    cancelled."""
    interval_s = interval_ms / 1000
    while True:
        await asyncio.sleep(interval_s)
        await chore()


class Housekeeping:
    """``settings``: the settings in force now (a SIGHUP replaces them); intervals are read at
    ``start``. ``log``: the proxy's rate-limited log for warnings that can repeat."""

    def __init__(
        self,
        settings: Callable[[], Settings],
        quota_room: QuotaControlRoom,
        certificates: CertificateReloader | None,
        log: RateLimitedLog,
    ) -> None:
        self._settings = settings
        self._quota_room = quota_room
        self._certificates = certificates
        self._log = log
        self._tasks: list[asyncio.Future[None]] = []

    def start(self) -> None:
        settings = self._settings()
        expiring = asyncio.ensure_future(
            run_every(settings.quota.cleanup_interval_ms, self._forget_expired_principals)
        )
        saving = (
            asyncio.ensure_future(run_every(settings.state.persist_interval_ms, self._save_state))
            if settings.state.path is not None
            else None
        )
        reloading = (
            asyncio.ensure_future(
                run_every(settings.client_tls.reload_interval_ms, self._reload_certificates)
            )
            if self._certificates is not None
            else None
        )
        self._tasks = [task for task in (expiring, reloading, saving) if task is not None]

    async def stop(self) -> None:
        for task in self._tasks:
            task.cancel()
            with contextlib.suppress(Exception, asyncio.CancelledError):
                await task

    async def _forget_expired_principals(self) -> None:
        # A step of principals at a time, the loop let through between steps.
        try:
            forgotten = await run_in_steps(
                self._quota_room.quota.expire_in_steps(quota_clock_ms(), LOOP_STEP_PRINCIPALS)
            )
        except Exception as error:  # keep expiring next time; never take shutdown down
            self._log.warning("quota_expiry_failed", key="expire", error=repr(error))
            return
        if forgotten:
            get_logger().debug("principals_forgotten", count=forgotten)

    async def _save_state(self) -> None:
        try:
            # Copied and encoded on the loop a step of principals at a time (each principal
            # copied whole), the loop let through between steps; compressed and written in a
            # thread.
            save = await run_in_steps(
                encode_for_saving_in_steps(self._quota_room.quota_control, LOOP_STEP_PRINCIPALS)
            )
            await asyncio.to_thread(self._quota_room.write_encoded, save)
        except OSError as error:
            self._log.warning(
                "state_file_write_failed",
                key="state",
                path=str(self._settings().state.path),
                error=str(error),
            )
        except Exception as error:  # a bug: keep saving next time, say so now
            self._log.warning("state_save_failed", key="state", error=repr(error))

    async def _reload_certificates(self) -> None:
        assert self._certificates is not None
        certfile = str(self._settings().client_tls.certfile)
        try:
            if self._certificates.reload_if_changed():
                get_logger().info("certificates_reloaded", certfile=certfile)
        except (OSError, ValueError) as error:  # ssl.SSLError is an OSError
            self._log.warning(
                "certificates_reload_failed", key="reload", error=str(error), certfile=certfile
            )
