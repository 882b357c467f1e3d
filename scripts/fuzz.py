#!/usr/bin/env python3
"""Bounded fuzz harness for pidgate's sans-IO protocol package (issue 7, "Fuzzing").

Every target feeds one input to a protocol entry point. The only allowed exception is
``pidgate.protocol.errors.ProtocolError`` (and subclasses); anything else is a crash: the input is
printed as hex, written to ``tests/protocol/fuzz_crashers/<target>-<sha1>.bin`` and the run exits 1.

Engine: atheris (coverage-guided libFuzzer) when importable and ``--engine atheris`` is asked for;
by default a plain-Python mutation fuzzer (seeds built with kafka-python, then byte flips,
inserts, deletes, splices, interesting integers and pure random bytes) that is deterministic for a
given ``--seed`` and round-robins over the targets. Bounded by ``--inputs`` (total) and
``--seconds``. The ``*_native`` targets compare the compiled module with the pure functions
(a difference is a crash); without the compiled module they are skipped, with a line saying
why. Memory: RSS (VmRSS/VmHWM from /proc/self/status) is sampled and printed; with
``--tracemalloc`` the Python heap peak is printed too (slower). A run whose RSS grows by more than
``--max-rss-growth-mb`` fails.

    .venv/bin/python scripts/fuzz.py --inputs 1000000 --seconds 600
    .venv/bin/python scripts/fuzz.py --targets produce,sasl --inputs 50000
    .venv/bin/python scripts/fuzz.py --targets produce_native,framing_native --inputs 1000000
    .venv/bin/python scripts/fuzz.py --engine atheris --targets framing -- -runs=100000
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import resource
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SCRIPTS = Path(__file__).resolve().parent
if str(SCRIPTS) not in sys.path:
    sys.path.insert(0, str(SCRIPTS))

from fuzz_targets import COMPILED_MISSING, NATIVE_TARGETS, TARGETS, build_seeds  # noqa: E402

from pidgate.protocol.errors import ProtocolError  # noqa: E402

CRASH_DIR = ROOT / "tests" / "protocol" / "fuzz_crashers"

# --- the mutation engine -----------------------------------------------------------------------

_INTERESTING = (
    b"\x00",
    b"\xff",
    b"\x7f",
    b"\x80",
    b"\x00\x00",
    b"\xff\xff",
    b"\x7f\xff",
    b"\x80\x00",
    b"\x00\x00\x00\x00",
    b"\xff\xff\xff\xff",
    b"\x7f\xff\xff\xff",
    b"\x80\x00\x00\x00",
    b"\xff\xff\xff\xff\x0f",
    b"\x80\x80\x80\x80\x80\x01",
)


def mutate(rng: random.Random, data: bytes, pool: list[bytes]) -> bytes:
    buf = bytearray(data)
    for _ in range(1 + int(rng.expovariate(0.7))):
        op = rng.randrange(8)
        n = len(buf)
        if op == 0 and n:  # flip bits
            i = rng.randrange(n)
            buf[i] ^= 1 << rng.randrange(8)
        elif op == 1 and n:  # random byte
            buf[rng.randrange(n)] = rng.randrange(256)
        elif op == 2:  # insert random bytes
            i = rng.randrange(n + 1)
            buf[i:i] = rng.randbytes(rng.choice((1, 1, 2, 4, 16)))
        elif op == 3 and n:  # delete a run
            i = rng.randrange(n)
            del buf[i : i + rng.choice((1, 1, 2, 4, 16))]
        elif op == 4 and n:  # overwrite with an interesting integer
            v = rng.choice(_INTERESTING)
            i = rng.randrange(n)
            buf[i : i + len(v)] = v
        elif op == 5 and n:  # truncate
            del buf[rng.randrange(n) :]
        elif op == 6 and pool:  # splice with another seed
            other = rng.choice(pool)
            i = rng.randrange(n + 1)
            j = rng.randrange(len(other) + 1)
            buf = buf[:i] + other[j:]
        elif op == 7 and n:  # duplicate a run
            i = rng.randrange(n)
            buf[i:i] = buf[i : i + rng.randrange(1, 32)]
    return bytes(buf)


def _rss_kb() -> tuple[int, int]:
    rss = hwm = 0
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    rss = int(line.split()[1])
                elif line.startswith("VmHWM:"):
                    hwm = int(line.split()[1])
    except OSError:
        pass
    return rss, hwm


def save_crash(name: str, data: bytes, exc: BaseException) -> Path:
    CRASH_DIR.mkdir(parents=True, exist_ok=True)
    path = CRASH_DIR / f"{name}-{hashlib.sha1(data).hexdigest()}.bin"
    path.write_bytes(data)
    import traceback

    print(f"CRASH in {name}: {type(exc).__name__}: {exc}", file=sys.stderr)
    traceback.print_exception(exc, limit=-3, file=sys.stderr)
    print(f"input ({len(data)} bytes): {data.hex()}", file=sys.stderr)
    print(f"written to {path}", file=sys.stderr)
    return path


def run_one(name: str, data: bytes) -> BaseException | None:
    try:
        TARGETS[name](data)
    except ProtocolError:
        return None
    except Exception as exc:
        return exc
    return None


def run_python(args: argparse.Namespace, names: list[str]) -> int:
    rng = random.Random(args.seed)
    seeds = build_seeds()
    corpus = {n: list(seeds[n]) for n in names}
    counts = dict.fromkeys(names, 0)
    if args.tracemalloc:
        tracemalloc.start()
    rss0, _ = _rss_kb()
    start = time.monotonic()
    deadline = start + args.seconds
    crashes = 0
    total = 0
    # seeds first: each must be accepted (no exception at all is expected for them)
    for n in names:
        for s in seeds[n]:
            exc = run_one(n, s)
            if exc is not None:
                save_crash(n, s, exc)
                crashes += 1
    while total < args.inputs and crashes < args.max_crashes:
        for n in names:
            pool = corpus[n]
            for _ in range(200):
                r = rng.random()
                if r < 0.05:
                    data = rng.randbytes(rng.randrange(64))
                else:
                    data = mutate(rng, rng.choice(pool), pool)
                exc = run_one(n, data)
                if exc is not None:
                    save_crash(n, data, exc)
                    crashes += 1
                # keep a few mutants as further seeds (cheap diversity, bounded)
                if len(pool) < 256 and rng.random() < 0.001:
                    pool.append(data)
            counts[n] += 200
            total += 200
        if time.monotonic() > deadline:
            print(f"time bound reached ({args.seconds}s)", file=sys.stderr)
            break
    elapsed = time.monotonic() - start
    rss1, hwm = _rss_kb()
    print(
        f"engine=python seed={args.seed} inputs={total} elapsed={elapsed:.1f}s "
        f"rate={total / elapsed:,.0f}/s crashes={crashes}"
    )
    for n in names:
        print(f"  {n:24s} {counts[n]:>10,d}")
    print(
        f"memory: VmRSS start={rss0 / 1024:.1f} MiB end={rss1 / 1024:.1f} MiB "
        f"VmHWM={hwm / 1024:.1f} MiB"
    )
    if args.tracemalloc:
        _cur, peak = tracemalloc.get_traced_memory()
        print(f"tracemalloc peak={peak / 1024 / 1024:.1f} MiB")
    growth_mb = (rss1 - rss0) / 1024
    if growth_mb > args.max_rss_growth_mb:
        print(f"FAIL: RSS grew by {growth_mb:.1f} MiB (> {args.max_rss_growth_mb})")
        return 1
    return 1 if crashes else 0


def run_atheris(args: argparse.Namespace, names: list[str], rest: list[str]) -> int:
    """Several targets: one child process each (libFuzzer's loop never returns), the input and
    time budgets split evenly, peak RSS per child reported. One target: fuzz it in-process,
    starting from the same seed corpus as the python engine."""
    if len(names) > 1:
        return _atheris_children(args, names, rest)
    import atheris  # type: ignore[import-not-found,import-untyped,unused-ignore]

    name = names[0]
    target = TARGETS[name]

    def one(data: bytes) -> None:
        try:
            target(data)
        except ProtocolError:
            return
        except Exception as exc:
            save_crash(name, data, exc)
            raise

    corpus = Path(tempfile.mkdtemp(prefix=f"pidgate-fuzz-{name}-"))
    for index, seed in enumerate(build_seeds()[name]):
        (corpus / f"seed-{index}").write_bytes(seed)
    atheris.instrument_all()
    atheris.Setup(
        [
            sys.argv[0],
            f"-runs={args.inputs}",
            f"-max_total_time={max(1, int(args.seconds))}",
            f"-rss_limit_mb={int(args.rss_limit_mb)}",
            "-max_len=65536",
            f"-seed={args.seed}",
            *rest,
            str(corpus),
        ],
        one,
    )
    atheris.Fuzz()  # exits the process: 0 when the bound is reached, non-zero on a crash
    return 0


def _atheris_children(args: argparse.Namespace, names: list[str], rest: list[str]) -> int:
    inputs_each = max(1, args.inputs // len(names))
    seconds_each = max(1.0, args.seconds / len(names))
    failed: list[str] = []
    total_runs = 0
    started = time.monotonic()
    for name in names:
        command = [
            sys.executable,
            str(Path(__file__).resolve()),
            "--engine",
            "atheris",
            "--targets",
            name,
            "--inputs",
            str(inputs_each),
            "--seconds",
            str(seconds_each),
            "--seed",
            str(args.seed),
            "--rss-limit-mb",
            str(args.rss_limit_mb),
            "--",
            *rest,
        ]
        before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        peak_kb = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        runs = [line for line in done.stderr.splitlines() if line.startswith("Done ")]
        runs_count = int(runs[-1].split()[1]) if runs else 0
        total_runs += runs_count
        status = "ok" if done.returncode == 0 else f"FAILED (exit {done.returncode})"
        peak = f"{peak_kb / 1024:.0f} MiB" if peak_kb > before else "<= previous"
        print(f"  {name:24s} {runs_count:>10,d} runs  peak RSS {peak}  {status}", flush=True)
        if done.returncode != 0:
            failed.append(name)
            print(done.stderr[-4000:], file=sys.stderr)
    elapsed = time.monotonic() - started
    print(
        f"engine=atheris seed={args.seed} inputs={total_runs} elapsed={elapsed:.0f}s "
        f"crashes={len(failed)}"
    )
    return 1 if failed else 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    rest: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, rest = argv[:i], argv[i + 1 :]
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--inputs", type=int, default=1_000_000, help="total inputs (all targets)")
    p.add_argument("--seconds", type=float, default=900.0, help="wall-clock bound")
    p.add_argument("--targets", default=",".join(TARGETS), help="comma-separated target names")
    p.add_argument("--seed", type=int, default=int(os.environ.get("FUZZ_SEED", "1")))
    p.add_argument("--engine", choices=("python", "atheris"), default="python")
    p.add_argument("--tracemalloc", action="store_true", help="also report the Python heap peak")
    p.add_argument("--max-rss-growth-mb", type=float, default=256.0)
    p.add_argument("--max-crashes", type=int, default=20)
    p.add_argument(
        "--rss-limit-mb", type=int, default=1024, help="atheris: libFuzzer's -rss_limit_mb"
    )
    p.add_argument("--list", action="store_true", help="print the target names and exit")
    args = p.parse_args(argv)
    if args.list:
        print("\n".join(TARGETS))
        return 0
    names = [n for n in args.targets.split(",") if n]
    unknown = [n for n in names if n not in TARGETS]
    if unknown:
        p.error(f"unknown targets {unknown}; known: {', '.join(TARGETS)}")
    skipped = [n for n in names if n in NATIVE_TARGETS] if COMPILED_MISSING else []
    if skipped:
        print(f"skipping {', '.join(skipped)}: {COMPILED_MISSING}", flush=True)
        names = [n for n in names if n not in skipped]
        if not names:
            return 0
    if args.engine == "atheris":
        return run_atheris(args, names, rest)
    return run_python(args, names)


if __name__ == "__main__":
    sys.exit(main())
