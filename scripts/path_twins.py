"""pidgate's compiled data path and its pure-Python one fed the same bytes (issue #25): one
client connection per path, each in its own process (the path is chosen once per process:
``PIDGATE_PURE_PYTHON``), driven by the same programs, compared after every operation.

    python scripts/path_twins.py --programs 3334 --operations 300     # ~1M operations
    python scripts/path_twins.py --programs 50 --seed 7 --rate 1 --in-flight 2

A program is a sequence of operations drawn from a seeded generator: a request from a table
of valid and malformed frames (Produce v3..v11 with known, new and no PIDs, each acks, three
client ids, one cut short, one from a future version; requests pidgate forwards untouched;
ApiVersions; a frame shorter than any header; stray bytes), sent whole or split across two
reads; the broker answering what it owes, validly, with a wrong correlation id, cut short or
with a byte flipped. After every operation each process records what a user could see: the
bytes written to the client and to the broker, whether either side closed, how many responses
are owed and requests wait, whether reading is paused, the traffic and protocol-error
counters. The run fails at the first operation where the two differ, naming what differs.

``compare`` (used by tests/proxy/serving/test_data_paths.py) runs this script twice, once per
path, and compares; run alone (``--path-record``) it prints one process's record as JSON lines.
Needs the compiled modules (``COMPILED_MISSING`` says why not). Holding is off
(``rejection.max_hold_ms: 0``): a rejection is answered at once, so nothing depends on timers.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import os
import random
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

from kafka.protocol.producer.produce import ProduceResponse

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # the tests' Kafka builders (kafka-python, the reference)

from tests.protocol.kafka_builders import BatchSpec, build_records, produce_request_body  # noqa: E402

from pidgate.config import load_settings  # noqa: E402
from pidgate.protocol.produce import produce_acks_and_producer_ids  # noqa: E402
from pidgate.proxy.server import ProxyServer  # noqa: E402
from pidgate.proxy.serving.connection import ClientConnection  # noqa: E402
from pidgate.proxy.serving.upstream import UpstreamConnection  # noqa: E402


class PathsDiffer(AssertionError):
    """The compiled and the pure data paths did something different with the same bytes."""


class RecordingTransport:
    """Just enough of asyncio.Transport: records bytes written, closing, reading paused."""

    def __init__(self) -> None:
        self.written = bytearray()
        self.closing = False
        self.reading = True

    def write(self, data: bytes) -> None:
        self.written += data

    def writelines(self, data: list[bytes]) -> None:
        for chunk in data:
            self.written += chunk

    def is_closing(self) -> bool:
        return self.closing

    def is_reading(self) -> bool:
        return self.reading

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True

    def close(self) -> None:
        self.closing = True

    def abort(self) -> None:
        self.closing = True

    def get_extra_info(self, name: str, default: object = None) -> object:
        return default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass


# --- the frames a program picks from ---------------------------------------------------------

_TOPIC = "twins"
_CLIENT_IDS = (b"rdkafka", b"other-client", None)


def _produce_body(version: int, acks: int, producer_ids: tuple[int, ...]) -> bytes:
    """One topic, a partition per PID (one idempotent batch of one record each), or one
    partition of a batch without a PID."""
    partitions = [
        (index, build_records([BatchSpec(2, 0, producer_id, 0, 0, False, 1)]))
        for index, producer_id in enumerate(producer_ids or (-1,))
    ]
    return produce_request_body(version, None, acks, 30000, [(_TOPIC, bytes(16), partitions)])


def _header(api_key: int, version: int, client_id: bytes | None, flexible: bool) -> bytes:
    """A request header past the size prefix, correlation id 0 (patched when sent)."""
    encoded_id = b"\xff\xff" if client_id is None else struct.pack(">h", len(client_id)) + client_id
    return struct.pack(">hhi", api_key, version, 0) + encoded_id + (b"\x00" if flexible else b"")


def _frame(payload: bytes) -> bytes:
    return struct.pack(">i", len(payload)) + payload


#: A PID the busy-producer operation may replace with one never seen, in every copy it sends
#: (``Driver._renewed``): many new PIDs in one read, some admitted and some not.
_RENEWED_PID = 0x7E57_0000_0000_0008
_RENEWED_BYTES = _RENEWED_PID.to_bytes(8, "big")


def _request_table() -> list[bytes]:
    """Whole request frames (correlation id 0): Produce v3..v11 with 0..2 PIDs from a small
    set (most repeat: known PIDs), each acks, three client ids; requests pidgate forwards
    untouched; ApiVersions v0..v2; a Produce from pidgate's future and one with a bad body."""
    table: list[bytes] = []
    pid_sets: tuple[tuple[int, ...], ...] = ((), (5,), (6,), (5, 7), (1000 + 1,), (_RENEWED_PID,))
    for version in range(3, 12):
        flexible = version >= 9
        for acks in (1, -1, 0):
            for pids in pid_sets:
                body = _produce_body(version, acks, pids)
                for client_id in _CLIENT_IDS:
                    table.append(_frame(_header(0, version, client_id, flexible) + body))
    for version in range(0, 3):  # ListOffsets v0..v2: forwarded untouched, answered unread
        table.append(_frame(_header(2, version, b"rdkafka", False) + b"\x00" * 12))
    for version in range(0, 3):
        table.append(_frame(_header(18, version, b"rdkafka", False)))
    table.append(_frame(_header(0, 99, b"rdkafka", False) + b"\x00" * 8))  # unknown version
    body = _produce_body(9, 1, (5,))
    table.append(_frame(_header(0, 9, b"rdkafka", True) + body[: len(body) // 2]))  # cut short
    table.append(_frame(b"\x00\x00"))  # shorter than any header
    return table


_REQUESTS = _request_table()


def _produce_response(version: int, correlation_id: int) -> bytes:
    R = ProduceResponse
    T = R.TopicProduceResponse
    P = T.PartitionProduceResponse
    partition = P(
        index=0,
        error_code=0,
        base_offset=1,
        log_append_time_ms=-1,
        log_start_offset=0,
        record_errors=[],
        error_message=None,
    )
    body = bytes(
        R(
            version=version,
            responses=[T(name=_TOPIC, partition_responses=[partition])],
            throttle_time_ms=0,
        ).encode(version=version)
    )
    flexible = version >= 9
    return _frame(struct.pack(">i", correlation_id) + (b"\x00" if flexible else b"") + body)


def _api_versions_response(version: int, correlation_id: int) -> bytes:
    apis = [(0, 3, 11), (2, 0, 2), (18, 0, 2)]
    body = struct.pack(">hi", 0, len(apis)) + b"".join(struct.pack(">hhh", *api) for api in apis)
    if version >= 1:
        body += struct.pack(">i", 0)
    return _frame(struct.pack(">i", correlation_id) + body)


def _response_for(api_key: int, version: int, correlation_id: int) -> bytes:
    if api_key == 0:
        return _produce_response(version, correlation_id)
    if api_key == 18:
        return _api_versions_response(version, correlation_id)
    return _frame(struct.pack(">i", correlation_id) + b"\x00" * 10)


# --- the twins --------------------------------------------------------------------------------


class _Side:
    """One proxy of this process's data path, and its current client connection with the
    broker side and what the broker still owes it."""

    def __init__(self, settings: Any, coverage: dict[str, int]) -> None:
        self.server = ProxyServer(settings)
        #: What the programs made happen, counted (shared by every side of one process).
        self.coverage = coverage
        self.connect()

    def connect(self) -> None:
        """A new client connection on this proxy (the last one closed)."""
        context = self.server.context
        conn = ClientConnection(context, lambda: [("127.0.0.1", 9)])
        self.client_transport = RecordingTransport()
        conn.transport = self.client_transport  # type: ignore[assignment]
        conn.principal = context.identity.principal_for_connection(None)
        conn._gate.attach(self.client_transport)  # type: ignore[arg-type]
        upstream = UpstreamConnection(conn)
        self.upstream_transport = RecordingTransport()
        upstream.transport = self.upstream_transport  # type: ignore[assignment]
        conn._upstream = upstream
        self.conn = conn
        self.upstream = upstream
        #: (api_key, api_version, correlation_id) the broker owes, oldest first.
        self.owed: list[tuple[int, int, int]] = []
        self._forwarded_at = 0

    @property
    def closing(self) -> bool:
        return self.client_transport.closing

    def note_forwarded(self) -> None:
        """Read the requests forwarded since the last call into ``owed``."""
        written = self.upstream_transport.written
        at = self._forwarded_at
        while len(written) - at >= 4:
            size = struct.unpack_from(">i", written, at)[0]
            payload = bytes(written[at + 4 : at + 4 + size])
            at += 4 + size
            api_key, version, correlation_id = struct.unpack_from(">hhi", payload)
            if api_key == 0:
                header_end = 10 + max(struct.unpack_from(">h", payload, 8)[0], 0)
                header_end += 1 if version >= 9 else 0
                acks, _ = produce_acks_and_producer_ids(memoryview(payload)[header_end:], version)
                if acks == 0:
                    continue  # a Kafka broker never answers acks=0
            self.owed.append((api_key, version, correlation_id))
            self.coverage["requests forwarded"] += 1
        self._forwarded_at = at

    def seen(self) -> tuple[Any, ...]:
        """What a user could see since the last call (the bytes written are taken)."""
        self.note_forwarded()
        conn = self.conn
        conn.flush_counters()  # what the express lane counted (a scrape does the same)
        traffic = self.server.metrics
        client_bytes = bytes(self.client_transport.written)
        upstream_bytes = bytes(self.upstream_transport.written)
        self.client_transport.written.clear()
        self.upstream_transport.written.clear()
        self._forwarded_at = 0
        return (
            client_bytes.hex(),
            upstream_bytes.hex(),
            self.client_transport.closing,
            self.upstream_transport.closing,
            conn.responses_owed,
            len(conn._inbox),
            self.client_transport.reading,
            list(traffic._requests),
            list(traffic._request_bytes),
            list(traffic._response_bytes),
            sorted(traffic._protocol_errors.items()),
            sorted(
                (key, user.new_producer_ids, user.produce_requests_rejected)
                for key, user in traffic._users.items()
            ),
        )


SEEN = (
    "client bytes",
    "upstream bytes",
    "client closed",
    "upstream closed",
    "responses owed",
    "requests waiting",
    "reading",
    "requests",
    "request bytes",
    "response bytes",
    "protocol errors",
    "quota decisions",
)


#: What a run counts it made happen (``compare`` returns it).
COVERAGE = (
    "requests forwarded",
    "responses from the broker",
    "produce requests rejected",
    "connections closed",
)
#: And, on the compiled path only, the requests its express lane took and the PIDs its quota
#: question admitted as new.
EXPRESS = "requests the express lane took"
EXPRESS_NEW = "new PIDs the express lane admitted"


RATES = (1, 3, 1_000, 1_000)


def settings_for(seed: int) -> Any:
    """The settings of one program: a quota of 1, 3 or 1,000 new PIDs per hour (rejections,
    or none), at most 1, 2, 5 or 100 requests in flight."""
    rng = random.Random(seed)
    return load_settings(
        cli_overrides={
            "proxy": {
                "upstream": ["127.0.0.1:9"],
                "listen": "127.0.0.1:0",
                "max_in_flight_requests": rng.choice([1, 2, 5, 100]),
            },
            # Half the programs never reject: a rejection mutes the connection for good here
            # (timers never fire), and the steady state needs requests read.
            "quota": {"users": {"<default>": {"producer_ids_rate": rng.choice(RATES)}}},
            "rejection": {"max_hold_ms": 0},
            "admin": {"enabled": False},
        }
    )


def program_for(seed: int, operations: int) -> bytes:
    """``operations`` operations of two bytes each."""
    rng = random.Random(seed ^ 0x5EED)
    return bytes(rng.randrange(256) for _ in range(2 * operations))


class Driver:
    """One connection of this process's path, fed a program; a new connection once it closed."""

    def __init__(self, settings: Any, coverage: dict[str, int]) -> None:
        self.side = _Side(settings, coverage)
        self.coverage = coverage
        self.correlation_id = 0
        #: Client bytes not yet delivered (a frame split across reads).
        self.pending = b""
        #: Broker bytes not yet delivered (answers cut short), and the last request sent.
        self.broker_pending = b""
        self.last_request = _REQUESTS[0]
        #: Requests the compiled express lane took, and new PIDs it admitted, on the
        #: connections closed so far.
        self.requests_taken = self.new_admitted = 0
        #: PIDs handed out in place of ``_RENEWED_PID`` so far.
        self.renewed = 0

    def run(self, program: bytes) -> list[tuple[Any, ...]]:
        """What a user could see after each operation of ``program``. Inside an event loop that
        never runs a callback: timers a connection sets (a mute's end, the hang-up probe) are
        made and never fired, on both paths alike."""
        loop = asyncio.new_event_loop()
        try:
            return loop.run_until_complete(self._run(program))
        finally:
            loop.close()

    async def _run(self, program: bytes) -> list[tuple[Any, ...]]:
        # Never awaits: every operation runs in this one step, so no callback or timer a
        # connection schedules runs in between (those due run as the loop stops, after the
        # last record: nothing recorded depends on how long the program took).
        seen = []
        for at in range(0, len(program) - 1, 2):
            self._step(program[at], program[at + 1])
            seen.append(self.side.seen())
            if self.side.closing:
                self.coverage["connections closed"] += 1
                self._count_express()
                self.side.connect()
                self.pending = self.broker_pending = b""
        self._count_express()
        return seen

    def _count_express(self) -> None:
        self.requests_taken += self.side.conn.express_requests_taken
        self.new_admitted += self.side.conn.express_new_producer_ids

    def _step(self, op: int, argument: int) -> None:
        kind = op % 8
        if kind <= 4:
            if kind in (2, 3):
                # A busy producer: its last request again, 1 to 4 times in one read (the
                # steady state the compiled path takes in its express lane).
                requests = [self.last_request] * (1 + argument % 4)
                if argument & 16:
                    requests = [self._renewed(request) for request in requests]
            else:
                requests = [_REQUESTS[(op // 8 * 256 + argument) % len(_REQUESTS)]]
                self.last_request = requests[0]
            data = self.pending + b"".join(self._numbered(r) for r in requests)
            if kind == 4 and len(data) > 1:
                cut = 1 + argument % (len(data) - 1)  # split: the rest comes with the next
                data, self.pending = data[:cut], data[cut:]
            else:
                self.pending = b""
            self.side.conn.data_received(data)
        elif kind == 5:
            # 1 to 4 answers, one read each or together; together, sometimes cut short (the
            # rest comes with the next answers).
            self._answer(1 + argument % 4, None, joined=bool(argument & 4), cut=argument // 8)
        elif kind == 6:
            self._answer(1, corrupt=argument)
        elif argument < 8:
            self.side.conn.data_received(bytes([argument]) * (1 + argument))  # a bad frame
        else:
            self._answer(len(_REQUESTS), corrupt=None)  # everything owed

    def _renewed(self, request: bytes) -> bytes:
        """``request`` with a PID never seen in place of ``_RENEWED_PID``, if it carries it."""
        if _RENEWED_BYTES not in request:
            return request
        self.renewed += 1
        return request.replace(_RENEWED_BYTES, (_RENEWED_PID + self.renewed).to_bytes(8, "big"))

    def _numbered(self, request: bytes) -> bytes:
        """``request`` with the next correlation id (when it has room for one)."""
        if len(request) < 12:
            return request
        self.correlation_id = (self.correlation_id + 1) & 0x7FFFFFFF
        numbered = bytearray(request)
        struct.pack_into(">i", numbered, 8, self.correlation_id)
        return bytes(numbered)

    def _answer(self, count: int, corrupt: int | None, joined: bool = False, cut: int = 0) -> None:
        side = self.side
        side.note_forwarded()
        responses = []
        for _ in range(min(count, len(side.owed))):
            api_key, version, correlation_id = side.owed.pop(0)
            response = _response_for(api_key, version, correlation_id)
            if corrupt is not None:
                response = _corrupted(response, corrupt)
            responses.append(response)
            self.coverage["responses from the broker"] += 1
        reads = [b"".join(responses)] if joined else responses
        if self.broker_pending:
            reads = [self.broker_pending + (reads[0] if reads else b""), *reads[1:]]
            self.broker_pending = b""
        if joined and cut and len(reads[-1]) > 1:
            at = 1 + cut % (len(reads[-1]) - 1)
            reads[-1], self.broker_pending = reads[-1][:at], reads[-1][at:]
        for data in reads:
            if side.upstream_transport.closing:
                break
            side.upstream.data_received(data)


def _digest(seen: tuple[Any, ...]) -> str:
    return hashlib.sha1(repr(seen).encode()).hexdigest()[:10]


def record(programs: int, seed: int, operations: int, verbose: int | None) -> None:
    """This process's record, as JSON lines: its path, then per program one digest per
    operation (``verbose``: that program's full record instead)."""
    from pidgate.protocol import native
    from pidgate.quota import compiled

    quota = "compiled" if compiled.bloomspeed is not None else "pure"
    print(json.dumps({"path": native.DATA_PATH, "quota": quota}), flush=True)
    coverage = dict.fromkeys(COVERAGE, 0)
    taken = new_admitted = 0
    for index in range(programs) if verbose is None else (verbose,):
        program_seed = seed * 1_000_003 + index
        driver = Driver(settings_for(program_seed), coverage)
        seen = driver.run(program_for(program_seed, operations))
        taken += driver.requests_taken
        new_admitted += driver.new_admitted
        # From what the last operation left (the quota decisions' rejected counts), not from
        # the metrics now: callbacks the connection scheduled ran when the loop stopped.
        coverage["produce requests rejected"] += (
            sum(user[2] for user in seen[-1][-1]) if seen else 0
        )
        if verbose is None:
            print(json.dumps([index, [_digest(s) for s in seen]]), flush=True)
        else:
            print(json.dumps([index, seen]), flush=True)
    print(
        json.dumps({"coverage": coverage, "express": taken, "express_new": new_admitted}),
        flush=True,
    )


def _record_in(
    path: str, programs: int, seed: int, operations: int, verbose: int | None = None
) -> tuple[list[Any], dict[str, int]]:
    import pidgate

    env = dict(os.environ)
    env.pop("PIDGATE_PURE_PYTHON", None)
    # The subprocess imports this very pidgate (a test's tree, not another installed one).
    source = str(Path(pidgate.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(filter(None, (source, env.get("PYTHONPATH"))))
    if path == "pure":
        env["PIDGATE_PURE_PYTHON"] = "1"
    command = [
        sys.executable,
        __file__,
        "--path-record",
        "--programs",
        str(programs),
        "--seed",
        str(seed),
        "--operations",
        str(operations),
    ]
    if verbose is not None:
        command += ["--verbose", str(verbose)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"the {path} run failed ({done.returncode}): {done.stderr[-2000:]}")
    lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith(("{", "["))]
    header, records, footer = lines[0], lines[1:-1], lines[-1]
    if header["path"] != path or header["quota"] != path:
        raise RuntimeError(f"asked for the {path} path, the process ran {header}")
    express = {EXPRESS: footer["express"], EXPRESS_NEW: footer["express_new"]}
    return records, {**footer["coverage"], **express}


def compare(programs: int, seed: int = 0, operations: int = 300) -> tuple[int, dict[str, int]]:
    """Both paths, the same programs: how many operations were compared and what they made
    happen (on the compiled path; the pure one's must be the same). Raises ``PathsDiffer``
    naming the first program, operation and what a user would see differ."""
    compiled, compiled_coverage = _record_in("compiled", programs, seed, operations)
    pure, pure_coverage = _record_in("pure", programs, seed, operations)
    express = {name: compiled_coverage.pop(name) for name in (EXPRESS, EXPRESS_NEW)}
    if pure_coverage.pop(EXPRESS) or pure_coverage.pop(EXPRESS_NEW):
        raise PathsDiffer("the pure path's connections took requests in an express lane")

    def full_record(path: str, index: int, step: int) -> list[Any]:
        records, _ = _record_in(path, programs, seed, operations, index)
        return list(records[0][1][step])

    compared = compare_records(compiled, pure, full_record, f"seed {seed}")
    if compiled_coverage != pure_coverage:
        raise PathsDiffer(
            f"the paths made different things happen: {compiled_coverage} against {pure_coverage}"
        )
    return compared, {**compiled_coverage, **express}


def compare_records(ours: list[Any], theirs: list[Any], full_record: Any, where: str) -> int:
    """The operations compared; ``PathsDiffer`` at the first difference, naming what differs
    from both full records of that operation (``full_record(path, program, operation)``)."""
    compared = 0
    if len(ours) != len(theirs):
        raise PathsDiffer(f"{where}: {len(ours)} programs against {len(theirs)}")
    for (index, a_digests), (_, b_digests) in zip(ours, theirs, strict=True):
        for step, (a, b) in enumerate(zip(a_digests, b_digests, strict=False)):
            if a != b:
                full_a = full_record("compiled", index, step)
                full_b = full_record("pure", index, step)
                what = [n for n, x, y in zip(SEEN, full_a, full_b, strict=True) if x != y]
                raise PathsDiffer(
                    f"{where}, program {index}, operation {step}: the paths differ in "
                    f"{', '.join(what) or 'nothing but the digest'}"
                )
            compared += 1
        if len(a_digests) != len(b_digests):
            raise PathsDiffer(f"{where}, program {index}: the runs have different lengths")
    return compared


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--programs", type=int, default=100)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--operations", type=int, default=300, help="per program")
    parser.add_argument("--path-record", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--verbose", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.path_record:
        record(args.programs, args.seed, args.operations, args.verbose)
        return 0
    compared, coverage = compare(args.programs, args.seed, args.operations)
    made = ", ".join(f"{name} {count:,}" for name, count in coverage.items())
    print(f"{args.programs} programs, {compared:,} operations the same on both paths ({made})")
    return 0


def _corrupted(response: bytes, how: int) -> bytes:
    """A broker response gone wrong: a wrong correlation id, cut short, or a byte flipped."""
    kind = how % 3
    if kind == 0:
        return (
            response[:4]
            + struct.pack(">i", struct.unpack_from(">i", response, 4)[0] + 1)
            + (response[8:])
        )
    if kind == 1:
        keep = 4 + how % 6
        return struct.pack(">i", keep - 4) + response[4:keep]
    flipped = bytearray(response)
    flipped[4 + how % (len(response) - 4)] ^= 0x5A
    return bytes(flipped)


if __name__ == "__main__":
    sys.exit(main())
