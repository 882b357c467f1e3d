"""Steady-state memory of the quota manager for 1M active producer IDs (issue #12 "lean").

Two scenarios, both 1M active PIDs at p = 0.001 with the default window (1 h in 11 layers):

* 10k principals with 100 active PIDs each;
* 100 principals with 10k active PIDs each.

Each principal's rate equals its PID count, so every PID is admitted. Every PID first
appears at a random time of the first window (as producers of a running system come and go),
then produces once in every layer span (window / window.num) at a time fixed per caller
("phase"), spread uniformly over the span. The quota clock advances over ``--windows`` windows
(default 3). Callers are of two kinds: most PIDs arrive in batches (one ``admit``
call with 10 PIDs for the 10k-principal case, 100 for the other, as a Produce request with many
partitions would carry), and ``--single-share`` (10%) of them in 1-PID calls (one producer,
one request).

Memory is measured with tracemalloc, after ``gc.collect()``. Tracing the whole run would make it
~3x slower (every temporary int and tuple is traced), so the run goes untraced to the steady
state, then the manager's state is moved, under tracing, into a new manager
(``QuotaManager.export`` then ``restore``: every object the manager holds is allocated again,
as it is on a restart from a state file), and ``--traced-calls`` more admit calls (the start of
the next span) run traced, so the location cache fills and buffers get the slack of live use.
The figure is that manager's traced memory plus the principal name strings it keys on
(allocated by the benchmark, counted with sys.getsizeof). It is printed with ``total_bits``
(the Bloom bits alone) and the number of live layers.

Then, with tracing stopped, it times ``admit`` on the steady-state manager: a known PID called
again and again (a busy producer: its PID is in the manager's small positions/location cache),
known PIDs called round-robin across all principals (cache misses: hashing plus the layer scan),
and a new PID (admitted).

The last line is machine-parsable::

    BENCH memory_mb_10k_principals=… memory_mb_100_principals=… bytes_per_pid_10k=… \
        bytes_per_pid_100=… admit_known_us_10k=… admit_known_us_100=…

Run ``python benchmarks/memory.py``: about 10 minutes on the 2-core VM (each scenario puts
~35M PID sightings through ``admit``, which costs 2–8 µs each when, as here, the PIDs far
outnumber the manager's 4096-entry location cache); ``--quick`` (1 window) or ``--only 10k``
while iterating. To measure another source tree the same way (it only uses the
public API of ``pidgate.quota``): ``PYTHONPATH=/tmp/before/src python benchmarks/memory.py``.
"""

from __future__ import annotations

import argparse
import functools
import gc
import random
import statistics
import sys
import time
import tracemalloc
from collections.abc import Callable
from dataclasses import dataclass

from pidgate.quota import Admitted, QuotaManager, QuotaPolicy

print = functools.partial(print, flush=True)  # progress lines while it runs

WINDOW_MS = 3_600_000
WINDOW_NUM = 11
T0 = 1_700_000_000_000


@dataclass
class Result:
    name: str
    principals: int
    pids: int
    memory_bytes: int
    total_bits: int
    layers: int
    admit_calls: int
    seconds: float
    known_hot_us: float
    known_cold_us: float
    new_us: float

    @property
    def bytes_per_pid(self) -> float:
        return self.memory_bytes / self.pids


Caller = tuple[float, int, str, tuple[int, ...]]


def _callers(
    principals: int, per_principal: int, batch: int, single_share: float, rng: random.Random
) -> list[Caller]:
    """(phase in [0, 1), first appearance in ms after T0, principal, PIDs) per caller, sorted
    by phase: every span replays them in this order at T0 + span_start + phase * span."""
    callers: list[Caller] = []
    pid = 1_000_000
    singles = round(per_principal * single_share)
    for p in range(principals):
        name = f"User:u{p}"
        ids = list(range(pid, pid + per_principal))
        pid += per_principal
        groups = [(one,) for one in ids[:singles]]
        rest = ids[singles:]
        groups += [tuple(rest[i : i + batch]) for i in range(0, len(rest), batch)]
        for group in groups:
            callers.append((rng.random(), rng.randrange(WINDOW_MS), name, group))
    callers.sort(key=lambda c: c[0])
    return callers


def _timeit(fn: Callable[[], object], calls: int, repeat: int = 5) -> float:
    """Median µs per call over ``repeat`` runs of ``calls`` calls."""
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - start) / calls * 1e6)
    return statistics.median(samples)


def _traffic(
    admit: Callable[[str, tuple[int, ...], int], object],
    callers: list[Caller],
    offsets: list[int],
    span_start: int,
) -> int:
    """One span: every caller that has appeared calls admit once, at its phase."""
    now = span_start
    for (_, joins, principal, pids), offset in zip(callers, offsets, strict=False):
        now = span_start + offset
        if now - T0 >= joins:
            decision = admit(principal, pids, now)
            if not isinstance(decision, Admitted):
                raise SystemExit(f"{principal} was throttled: {decision}")
    return now


def run(
    name: str,
    principals: int,
    per_principal: int,
    *,
    windows: float,
    batch: int,
    single_share: float,
    traced_calls: int,
    seed: int = 12,
) -> Result:
    rng = random.Random(seed)
    callers = _callers(principals, per_principal, batch, single_share, rng)
    names = {principal for _, _, principal, _ in callers}
    span = WINDOW_MS / WINDOW_NUM
    spans = int(windows * WINDOW_NUM + 0.5)
    offsets = [int(phase * span) for phase, _, _, _ in callers]
    policy = QuotaPolicy(
        window_ms=WINDOW_MS,
        window_num=WINDOW_NUM,
        false_positive_rate=0.001,
        default_producer_ids_rate=per_principal,
        max_total_bits=2**40,
        max_principals=10**6,
    )
    pids = principals * per_principal
    print(
        f"\n{name}: {principals:,} principals x {per_principal:,} PIDs = {pids:,} active PIDs, "
        f"p = 0.001, window {WINDOW_MS // 1000} s in {WINDOW_NUM} layers; {len(callers):,} "
        f"callers ({single_share:.0%} of PIDs in 1-PID calls, the rest in batches of {batch}); "
        f"{spans} spans untraced + {traced_calls:,} calls traced"
    )
    manager = QuotaManager(policy)
    calls = 0
    started = time.perf_counter()
    now = T0
    for s in range(spans):
        now = _traffic(manager.admit, callers, offsets, T0 + int(s * span))
        calls += len(callers)
        if (s + 1) % WINDOW_NUM == 0:
            manager.expire(now)  # the proxy's periodic cleanup
            layers = sum(state.layer_count for state in manager.snapshot(now))
            print(
                f"  after {(s + 1) / WINDOW_NUM:3.1f} windows: Bloom bits "
                f"{manager.total_bits / 8 / 1e6:6.2f} MB ({manager.total_bits / pids:5.1f} "
                f"bits/PID), {layers:,} layers ({layers / principals:.1f}/principal), "
                f"{time.perf_counter() - started:5.0f} s"
            )
    # Re-home the steady state under tracing (see the module docstring), then one more span.
    records = manager.export()
    del manager
    gc.collect()
    tracemalloc.start(1)
    base = tracemalloc.get_traced_memory()[0]
    manager = QuotaManager(policy)
    manager.restore(records)
    del records
    traced = min(traced_calls, len(callers))
    now = _traffic(manager.admit, callers[:traced], offsets[:traced], T0 + int(spans * span))
    calls += traced
    manager.expire(now)
    gc.collect()
    traced = tracemalloc.get_traced_memory()[0] - base
    tracemalloc.stop()
    used = traced + sum(sys.getsizeof(n) for n in names)
    seconds = time.perf_counter() - started
    total_bits = manager.total_bits
    layers = sum(state.layer_count for state in manager.snapshot(now))
    admit = manager.admit

    # Known-PID admit: a busy producer (the same PID again and again) ...
    _, _, hot_principal, hot_pids = callers[-1]
    hot = (hot_pids[0],)
    known_hot = _timeit(lambda: admit(hot_principal, hot, now), 20_000)
    # ... and known PIDs round-robin over many callers (cache misses: hash + layer scan).
    cold = [
        (principal, (ids[0],))
        for _, _, principal, ids in callers[:: max(1, len(callers) // 50_000)]
    ]
    it = iter(range(10**12))

    def cold_call() -> None:
        principal, pid = cold[next(it) % len(cold)]
        admit(principal, pid, now)

    known_cold = _timeit(cold_call, 20_000)
    # A new PID (the bucket holds tokens: its refill since the start).
    fresh = iter(range(10**15, 10**16))
    new_us = _timeit(lambda: admit(hot_principal, (next(fresh),), now), 20, repeat=5)
    print(
        f"  steady state: {used / 1e6:.1f} MB ({used / pids:.1f} B per active PID; principal "
        f"names {(used - traced) / 1e6:.1f} MB of it), Bloom bits {total_bits / 8 / 1e6:.1f} MB, "
        f"{layers:,} layers ({layers / principals:.1f}/principal); {calls:,} admit calls in "
        f"{seconds:.0f} s"
    )
    print(
        f"  admit: known PID, same PID again {known_hot:.2f} us; known PIDs round-robin "
        f"(cache misses) {known_cold:.2f} us; new PID admitted {new_us:.2f} us"
    )
    return Result(
        name,
        principals,
        pids,
        used,
        total_bits,
        layers,
        calls,
        seconds,
        known_hot,
        known_cold,
        new_us,
    )


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--windows", type=float, default=3.0)
    parser.add_argument("--quick", action="store_true", help="1 window instead")
    parser.add_argument("--single-share", type=float, default=0.1)
    parser.add_argument("--traced-calls", type=int, default=20_000)
    parser.add_argument("--seed", type=int, default=12)
    parser.add_argument("--only", choices=["10k", "100"], help="run one scenario")
    args = parser.parse_args()
    windows = 1.0 if args.quick else args.windows
    results: dict[str, Result] = {}
    # (key, label, principals, PIDs each, PIDs per multi-PID call)
    for key, label, principals, pids_each, batch in (
        ("10k", "10k principals", 10_000, 100, 10),
        ("100", "100 principals", 100, 10_000, 100),
    ):
        if args.only in (None, key):
            results[key] = run(
                label,
                principals,
                pids_each,
                windows=windows,
                batch=batch,
                single_share=args.single_share,
                traced_calls=args.traced_calls,
                seed=args.seed,
            )
    fields = []
    for key, label in (("10k", "10k_principals"), ("100", "100_principals")):
        if key in results:
            fields.append(f"memory_mb_{label}={results[key].memory_bytes / 1e6:.1f}")
    for key in ("10k", "100"):
        if key in results:
            fields.append(f"bytes_per_pid_{key}={results[key].bytes_per_pid:.1f}")
    for key in ("10k", "100"):
        if key in results:
            fields.append(f"admit_known_us_{key}={results[key].known_hot_us:.2f}")
    print("BENCH " + " ".join(fields))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
