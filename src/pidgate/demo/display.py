"""The demo's text: the header, one live line a second and the closing summary (prose, then
``key=value`` lines that the integration tests parse).

Owns: ``header_lines``, ``COLUMN_LINES``, ``live_line`` and ``summary_lines``: pure functions
of data that return text. Prints nothing, starts nothing, reads no clock; must not import the
proxy's runtime (``pidgate.proxy.background``), the broker or confluent_kafka directly.
"""

from __future__ import annotations

import statistics
from pathlib import Path

from pidgate.demo.plan import (
    PRODUCER_IDS_RATE,
    STEADY_MSGS_PER_S,
    STORM_INTERVAL_S,
    STORM_RECORDS,
    STORM_START_S,
    WINDOW_SECONDS,
    storm_end_s,
)
from pidgate.demo.producers import SteadyProducer, StormProducer
from pidgate.demo.tracking import ProxyView
from pidgate.proxy.serving.identity import ANONYMOUS_PRINCIPAL

COLUMN_LINES = (
    f"{'':>6} | {'new PIDs':>8}  {'Produce':>8} {'PIDs':>7} | {'steady':>5}  {'':>6} | "
    f"{'storm':>7} {'producers':>9} {'':>7} {'':>6} | tokens",
    f"{'time':>6} | {'admitted':>8}  {'rejected':>8} {'waiting':>7} | "
    f"{'msg/s':>5}  {'errors':>6} | "
    f"{'started':>7} {'delivered':>9} {'waiting':>7} {'failed':>6} | left",
)

_COLUMN_LEGEND = (
    "pidgate: new PIDs admitted, Produce requests rejected, PIDs waiting (rejected, not",
    "admitted yet); steady producer: messages delivered per second, errors (stays 0);",
    "storm producers: started, delivered, waiting (nothing delivered yet), failed;",
    f"tokens left in {ANONYMOUS_PRINCIPAL}'s bucket (one token = one new producer ID).",
)


def header_lines(
    *,
    broker_bootstrap: str,
    broker_pid: int | None,
    proxy_bootstrap: str,
    admin_url: str,
    duration_s: float,
    log_path: Path,
) -> list[str]:
    """What runs, what the quota is, what to watch for, and the live view's column heads."""
    return [
        "pidgate demo: per-principal throttling of NEW producer IDs (KIP-936), live",
        "",
        f"  broker   tansu on {broker_bootstrap}  broker_pid={broker_pid}",
        f"  pidgate  {proxy_bootstrap} (gateway) -> {broker_bootstrap}; clients connect here",
        f"  metrics  {admin_url}/metrics  (and /state, /healthz, /readyz) while the demo runs",
        f"  quota    {ANONYMOUS_PRINCIPAL} may activate {PRODUCER_IDS_RATE} new producer IDs per "
        f"{WINDOW_SECONDS} s window (a token every {WINDOW_SECONDS / PRODUCER_IDS_RATE:.1f} s, "
        f"burst {PRODUCER_IDS_RATE})",
        f"  log      pidgate's own log (JSON lines, incl. pid_throttled events): {log_path}",
        "",
        f"  steady   one long-lived idempotent producer sends {STEADY_MSGS_PER_S} msg/s for the "
        "whole run.",
        "           Its producer ID is known after its first batch: pidgate never throttles it.",
        f"  storm    from {STORM_START_S:.0f} s to {storm_end_s(duration_s):.0f} s a NEW "
        f"idempotent producer starts every {STORM_INTERVAL_S} s",
        f"           (a crash-looping app: each restart is a new producer ID), sends "
        f"{STORM_RECORDS} records, flushes.",
        "           Past the quota, pidgate rejects their Produce requests (librdkafka gets",
        "           NOT_ENOUGH_REPLICAS and retries) and mutes the connection for the throttle",
        "           time; each one gets through when a token frees up. Nothing is lost.",
        f"  stop     after {duration_s:.0f} s, or Ctrl-C",
        "",
        *(("  columns  " if i == 0 else " " * 11) + line for i, line in enumerate(_COLUMN_LEGEND)),
        "",
        *COLUMN_LINES,
    ]


def live_line(
    elapsed_s: float,
    view: ProxyView | None,
    steady_rate: float,
    steady_errors: int,
    storm: list[StormProducer],
) -> str:
    """One row under ``COLUMN_LINES``; ``?`` where the proxy did not answer yet."""
    delivered = sum(1 for p in storm if p.delivered)
    waiting = sum(1 for p in storm if p.waiting)
    failed = sum(1 for p in storm if p.failed is not None)
    if view is None:
        proxy_part = f"{'?':>8}  {'?':>8} {'?':>7}"
        tokens = "?"
    else:
        proxy_part = (
            f"{view.new_producer_ids_admitted:>8}  {view.produce_requests_rejected:>8} "
            f"{view.producer_ids_waiting:>7}"
        )
        tokens = f"{view.tokens:.1f}/{PRODUCER_IDS_RATE}"
    return (
        f"{elapsed_s:>5.0f}s | {proxy_part} | {steady_rate:>5.0f}  {steady_errors:>6} | "
        f"{len(storm):>7} {delivered:>9} {waiting:>7} {failed:>6} | {tokens}"
    )


def _delivery_waits(producers: list[StormProducer]) -> list[float]:
    """Seconds from start to first delivery, sorted."""
    return sorted(p.delivered_at - p.started_at for p in producers if p.delivered_at is not None)


def _span(values: list[float]) -> str:
    low, high = values[0], values[-1]
    return f"{high:.1f} s" if round(low, 1) == round(high, 1) else f"{low:.1f} to {high:.1f} s"


def summary_lines(
    *,
    elapsed_s: float,
    interrupted: bool,
    view: ProxyView | None,
    steady: SteadyProducer,
    storm: list[StormProducer],
    throttled_client_ids: frozenset[str],
    log_path: Path,
    event_dir: Path | None = None,
) -> list[str]:
    """The closing summary: prose for the user, then ``key=value`` lines for scripts."""
    throttled = [p for p in storm if p.client_id in throttled_client_ids]
    recovered = [p for p in throttled if p.delivered]
    unthrottled_ok = [p for p in storm if p.delivered and p.client_id not in throttled_client_ids]
    failed = [p for p in storm if p.failed is not None]
    waiting = [p for p in storm if p.undelivered]
    recovered_waits = _delivery_waits(recovered)
    steady_ok = steady.errors == 0
    result = "interrupted" if interrupted else ("ok" if steady_ok and not failed else "errors")

    lines = [
        "",
        f"Summary after {elapsed_s:.1f} s{' (interrupted)' if interrupted else ''}:",
        f"  - steady producer: {steady.delivered} messages delivered, {steady.errors} errors.",
        "      Its producer ID was known, so pidgate never got in its way."
        if steady_ok
        else f"      Last error: {steady.last_error}",
        f"  - storm: {len(storm)} producers started, each with a new producer ID.",
    ]
    if unthrottled_ok:
        lines.append(
            f"      {len(unthrottled_ok)} got in at once, while tokens were left "
            f"(delivered in {_span(_delivery_waits(unthrottled_ok))});"
        )
    lines.append(
        f"      {len(throttled)} were throttled, and {len(recovered)} of those delivered once a "
        "token freed up"
        + (
            f",\n      after {_span(recovered_waits)} "
            f"(median {statistics.median(recovered_waits):.1f} s)."
            if recovered_waits
            else "."
        )
    )
    lines.append(
        f"      {len(failed)} failed, {len(waiting)} still waiting at the end"
        + (" (purged)." if waiting else ".")
    )
    if failed:
        lines.append(f"      First failure: {failed[0].failed}")
    if view is not None:
        ceiling = int(PRODUCER_IDS_RATE + PRODUCER_IDS_RATE * elapsed_s / WINDOW_SECONDS)
        lines += [
            f"  - pidgate: {view.new_producer_ids_admitted} new producer IDs admitted (the quota "
            f"allows at most {ceiling} in {elapsed_s:.0f} s),",
            f"      {view.produce_requests_rejected} Produce requests rejected.",
        ]
    lines.append(f"  - pidgate's log: {log_path}")
    if event_dir is not None:
        lines.append(f"  - pidgate's PID event log: {event_dir}")
    lines += ["", "summary (key=value):"]
    fields: dict[str, object] = {
        "result": result,
        "elapsed_s": f"{elapsed_s:.1f}",
        "producer_ids_rate": PRODUCER_IDS_RATE,
        "window_s": WINDOW_SECONDS,
        "new_producer_ids_admitted": view.new_producer_ids_admitted if view else -1,
        "produce_requests_rejected": view.produce_requests_rejected if view else -1,
        "producer_ids_waiting": view.producer_ids_waiting if view else -1,
        "steady_delivered": steady.delivered,
        "steady_errors": steady.errors,
        "storm_started": len(storm),
        "storm_delivered": sum(1 for p in storm if p.delivered),
        "storm_delivered_unthrottled": len(unthrottled_ok),
        "storm_throttled": len(throttled),
        "storm_delivered_after_throttle": len(recovered),
        "storm_waiting_at_end": len(waiting),
        "storm_failed": len(failed),
        "storm_throttled_wait_median_s": (
            f"{statistics.median(recovered_waits):.1f}" if recovered_waits else "-"
        ),
        "storm_throttled_wait_max_s": f"{recovered_waits[-1]:.1f}" if recovered_waits else "-",
    }
    if event_dir is not None:
        fields["event_log"] = str(event_dir)
    lines += [f"  {key}={value}" for key, value in fields.items()]
    return lines
