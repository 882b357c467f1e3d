#!/usr/bin/env python3
"""Bounded fuzz harness for pidgate's sans-IO protocol package (issue 7, "Fuzzing").

Every target feeds one input to a protocol entry point. The only allowed exception is
``pidgate.protocol.errors.ProtocolError`` (and subclasses); anything else is a crash: the input is
printed as hex, written to ``tests/protocol/fuzz_crashers/<target>-<sha1>.bin`` and the run exits 1.

Engine: atheris (coverage-guided libFuzzer) when importable and ``--engine atheris`` is asked for;
by default a plain-Python mutation fuzzer (seeds built with kafka-python, then byte flips,
inserts, deletes, splices, interesting integers and pure random bytes) that is deterministic for a
given ``--seed`` and round-robins over the targets. Bounded by ``--inputs`` (total) and
``--seconds``. Memory: RSS (VmRSS/VmHWM from /proc/self/status) is sampled and printed; with
``--tracemalloc`` the Python heap peak is printed too (slower). A run whose RSS grows by more than
``--max-rss-growth-mb`` fails.

    .venv/bin/python scripts/fuzz.py --inputs 1000000 --seconds 600
    .venv/bin/python scripts/fuzz.py --targets produce,sasl --inputs 50000
    .venv/bin/python scripts/fuzz.py --engine atheris --targets framing -- -runs=100000
"""

from __future__ import annotations

import argparse
import hashlib
import os
import random
import resource
import struct
import subprocess
import sys
import tempfile
import time
import tracemalloc
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from pidgate.protocol import api_versions, endpoints, headers  # noqa: E402
from pidgate.protocol import init_producer_id as ipid  # noqa: E402
from pidgate.protocol.client_quotas.alter import split_alter_request  # noqa: E402
from pidgate.protocol.client_quotas.describe import split_describe_request  # noqa: E402
from pidgate.protocol.client_quotas.entities import QuotaEntity  # noqa: E402
from pidgate.protocol.errors import ProtocolError  # noqa: E402
from pidgate.protocol.framing import FrameDecoder  # noqa: E402
from pidgate.protocol.produce import parse_produce_request  # noqa: E402
from pidgate.protocol.record_batches import iter_batch_headers  # noqa: E402
from pidgate.protocol.sasl import SaslObserver  # noqa: E402

CRASH_DIR = ROOT / "tests" / "protocol" / "fuzz_crashers"

# --- targets: bytes -> None; the leading byte(s) select the version / mode -------------------


def t_framing(data: bytes) -> None:
    if not data:
        return
    max_frame = data[0] * 8
    dec = FrameDecoder(max_frame)
    rest = data[1:]
    i = 0
    out = bytearray()
    step = 1 + (data[0] % 13)
    while i < len(rest):
        chunk = rest[i : i + step]
        i += step
        for f in dec.feed(chunk):
            size = struct.unpack(">i", f[:4])[0]
            assert size == len(f) - 4 <= max_frame, "frame size mismatch"
            out += f
        assert dec.buffered_bytes <= max_frame + 4, "decoder buffers more than one frame"
    assert bytes(out) == rest[: len(out)], "frames are not the input in order"


def t_produce(data: bytes) -> None:
    if not data:
        return
    summary = parse_produce_request(data[1:], 3 + data[0] % 11)
    for _t, _p, batch in summary.iter_batches():
        _ = (batch.is_transactional, batch.is_control, batch.compression_type)
    pids = summary.producer_ids()
    _ = summary.partition_count
    for pid in sorted(pids)[:3]:
        summary.first_batch_for(pid)


def t_batches(data: bytes) -> None:
    if not data:
        return
    for batch in iter_batch_headers(data[1:], allow_partial_tail=bool(data[0] & 1)):
        _ = (batch.is_transactional, batch.is_control, batch.compression_type)


def t_sasl(data: bytes) -> None:
    """A sequence of observer calls: [op, version, len, body...]*; errors end only that call."""
    obs = SaslObserver()
    pos = 0
    while pos + 3 <= len(data):
        op, version, n = data[pos], data[pos + 1], data[pos + 2]
        body = data[pos + 3 : pos + 3 + n]
        pos += 3 + n
        try:
            match op % 7:
                case 0:
                    obs.on_handshake_request(body, version % 3)
                case 1:
                    obs.on_handshake_response(body, version % 3)
                case 2:
                    obs.on_authenticate_request(body, version % 4)
                case 3:
                    obs.on_authenticate_response(body, version % 4)
                case 4:
                    if not obs.raw_client_frame_is_request(body):
                        obs.on_raw_client_token(body)
                case 5:
                    obs.on_raw_client_token(body)
                case _:
                    obs.on_raw_server_token(body)
        except ProtocolError:
            pass
        _ = (obs.authenticated, obs.session_lifetime_ms, obs.in_progress, obs.expects_raw_tokens)
        _ = (obs.authzid_mismatch, obs.last_error_code, repr(obs))


_ENDPOINT_KEYS = (0, 3, 10, 60)


def _to_proxy(ep: endpoints.BrokerEndpoint) -> tuple[str, int]:
    return "pidgate.local", 19000 + (ep.node_id & 0xFF)


def t_endpoints(data: bytes) -> None:
    if len(data) < 2:
        return
    key = _ENDPOINT_KEYS[data[0] % 4]
    version = data[1] % 16
    body = data[2:]
    endpoints.rewrite_endpoints(key, version, body, _to_proxy)
    endpoints.endpoints_in_response(key, version, body)


def t_api_versions_request(data: bytes) -> None:
    if data:
        api_versions.parse_api_versions_request(data[1:], data[0] % 6)


_LIMITS = api_versions.proxy_api_version_limits()
_LOCAL = {48: (0, 1), 49: (0, 1)}


def t_api_versions_response(data: bytes) -> None:
    if data:
        local = _LOCAL if data[0] & 0x80 else None
        api_versions.narrow_api_versions_response(data[1:], (data[0] & 0x7F) % 6, _LIMITS, local)


def t_request_header(data: bytes) -> None:
    headers.parse_request_header(data)


def t_response_header(data: bytes) -> None:
    if len(data) >= 2:
        headers.parse_response_header(data[2:], data[0] % 80, data[1] % 20)


def t_alter_quotas(data: bytes) -> None:
    if data:
        plan = split_alter_request(
            data[1:], (data[0] & 0x7F) % 3, broker_supports=bool(data[0] & 0x80)
        )
        _ = plan.our_changes


def t_describe_quotas(data: bytes) -> None:
    if data:
        plan = split_describe_request(
            data[1:], (data[0] & 0x7F) % 3, broker_supports=bool(data[0] & 0x80)
        )
        plan.matches(QuotaEntity.named("alice"))
        plan.matches(QuotaEntity.default())


def t_init_pid_request(data: bytes) -> None:
    if data:
        ipid.parse_init_producer_id_request(data[1:], data[0] % 8)


def t_init_pid_response(data: bytes) -> None:
    if data:
        ipid.parse_init_producer_id_response(data[1:], data[0] % 8)


TARGETS: dict[str, Callable[[bytes], None]] = {
    "framing": t_framing,
    "produce": t_produce,
    "batches": t_batches,
    "sasl": t_sasl,
    "endpoints": t_endpoints,
    "api_versions_request": t_api_versions_request,
    "api_versions_response": t_api_versions_response,
    "request_header": t_request_header,
    "response_header": t_response_header,
    "alter_quotas": t_alter_quotas,
    "describe_quotas": t_describe_quotas,
    "init_pid_request": t_init_pid_request,
    "init_pid_response": t_init_pid_response,
}

# --- seeds: valid messages built with kafka-python ---------------------------------------------


def _sasl_ops(*ops: tuple[int, int, bytes]) -> bytes:
    return b"".join(bytes([op, v, len(b)]) + b for op, v, b in ops)


def build_seeds() -> dict[str, list[bytes]]:
    from kafka.protocol.metadata.api_versions import ApiVersionsRequest, ApiVersionsResponse
    from kafka.protocol.sasl import (
        SaslAuthenticateRequest,
        SaslAuthenticateResponse,
        SaslHandshakeRequest,
        SaslHandshakeResponse,
    )
    from tests.protocol import test_client_quotas as tcq
    from tests.protocol import test_endpoints as tep
    from tests.protocol import test_init_producer_id as tip
    from tests.protocol.kafka_builders import BatchSpec, build_records, produce_request_body

    seeds: dict[str, list[bytes]] = {name: [] for name in TARGETS}
    records = [
        build_records(
            [BatchSpec(2, 0, 1000, 3, 7, False, 3), BatchSpec(2, 1, 1001, 0, 0, True, 2)]
        ),
        build_records([BatchSpec(1, 0, -1, -1, -1, False, 2)]),
        build_records([BatchSpec(2, 0, -1, -1, -1, False, 1)]),
    ]
    for v in range(3, 14):
        for i, rec in enumerate(records):
            if v >= 3 and rec is records[1]:
                continue
            body = produce_request_body(
                v,
                "tx" if i == 0 else None,
                -1,
                30000,
                [
                    ("orders", bytes(range(16)), [(0, rec), (1, None)]),
                    ("t2", bytes(16), [(3, rec)]),
                ],
            )
            seeds["produce"].append(bytes([v - 3]) + body)
    for rec in records:
        seeds["batches"] += [b"\x00" + rec, b"\x01" + rec + rec[:30]]
    for mf, payload in ((255, b"abc"), (2, b"xyz"), (1, b"")):
        seeds["framing"].append(
            bytes([mf]) + b"".join(struct.pack(">i", len(p)) + p for p in (payload, b"q" * 7))
        )
    plain = b"\x00alice\x00secret"
    scram = b"n,,n=alice,r=abcdef"
    oauth = b"n,,\x01auth=Bearer eyJhbGciOiJub25lIn0.eyJzdWIiOiJhbGljZSJ9.\x01\x01"

    def hs(v: int, mech: str) -> bytes:
        return bytes(SaslHandshakeRequest(mechanism=mech).encode(version=v))

    hs_ok = bytes(SaslHandshakeResponse(error_code=0, mechanisms=["PLAIN"]).encode(version=1))
    for v in (0, 1, 2):
        auth_ok = bytes(
            SaslAuthenticateResponse(
                error_code=0, error_message=None, auth_bytes=b"", session_lifetime_ms=3600000
            ).encode(version=v)
        )
        for mech, token in (("PLAIN", plain), ("SCRAM-SHA-256", scram), ("OAUTHBEARER", oauth)):
            auth = bytes(SaslAuthenticateRequest(auth_bytes=token).encode(version=v))
            seeds["sasl"].append(
                _sasl_ops((0, 1, hs(1, mech)), (1, 1, hs_ok), (2, v, auth), (3, v, auth_ok))
            )
            seeds["sasl"].append(
                _sasl_ops((0, 0, hs(0, mech)), (1, 0, hs_ok), (5, 0, token), (6, 0, b""))
            )
        seeds["sasl"].append(
            _sasl_ops((0, 0, hs(0, "GSSAPI")), (1, 0, hs_ok), (4, 0, b"\x60\x01"), (4, 0, b""))
        )
    for v in range(0, 14):
        seeds["endpoints"].append(bytes([1, v]) + tep.metadata(v))
        if v >= 3:
            seeds["endpoints"].append(bytes([0, v]) + tep.produce(v, with_endpoints=True))
    for v in range(0, 7):
        seeds["endpoints"].append(bytes([2, v]) + tep.find_coordinator(v))
    for v in range(0, 3):
        seeds["endpoints"].append(bytes([3, v]) + tep.describe_cluster(v))
    for v in range(0, 5):
        req = ApiVersionsRequest(
            version=v, client_software_name="librdkafka", client_software_version="2.3.0"
        )
        seeds["api_versions_request"].append(bytes([v]) + bytes(req.encode(version=v)))
        resp = ApiVersionsResponse(
            version=v,
            error_code=0,
            api_keys=[
                ApiVersionsResponse.ApiVersion(api_key=k, min_version=lo, max_version=hi)
                for k, lo, hi in ((0, 0, 11), (3, 0, 12), (18, 0, 4), (48, 0, 1))
            ],
            throttle_time_ms=0,
        )
        seeds["api_versions_response"].append(bytes([v | 0x80]) + bytes(resp.encode(version=v)))
    for key, ver in ((0, 9), (3, 12), (18, 3), (0, 3), (22, 4)):
        cid = b"\x00\x06client"
        tags = b"\x00" if headers.request_is_flexible(key, ver) else b""
        seeds["request_header"].append(struct.pack(">hhi", key, ver, 42) + cid + tags)
        seeds["response_header"].append(bytes([key, ver]) + struct.pack(">i", 42) + b"\x00")
    for v in (0, 1):
        seeds["alter_quotas"] += [
            bytes([v | 0x80])
            + tcq.alter_body(
                v,
                [
                    ([("user", "alice")], [("producer_ids_rate", 5.0, False)]),
                    ([("user", None)], [("producer_byte_rate", 1e6, False)]),
                    ([("client-id", "c")], [("producer_ids_rate", 1.0, True)]),
                ],
            ),
            bytes([v]) + tcq.alter_body(v, [([("user", "bob")], [("producer_ids_rate", 1, 0)])]),
        ]
        seeds["describe_quotas"] += [
            bytes([v | 0x80]) + tcq.describe_body(v, [("user", 0, "alice")], strict=True),
            bytes([v]) + tcq.describe_body(v, [("user", 1, None), ("client-id", 2, None)]),
        ]
    for v in range(0, 7):
        seeds["init_pid_request"] += [
            bytes([v]) + tip._request(v, "tx-1"),
            bytes([v]) + tip._request(v, None),
        ]
        seeds["init_pid_response"].append(bytes([v]) + tip._response(v))
    for name in TARGETS:
        seeds[name].append(b"")
    return seeds


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
    if args.engine == "atheris":
        return run_atheris(args, names, rest)
    return run_python(args, names)


if __name__ == "__main__":
    sys.exit(main())
