"""The compiled per-request primitives (issue "native"): built by the normal install, chosen
unless ``PIDGATE_PURE_PYTHON`` says otherwise, and indistinguishable from the pure ones.

The properties feed the compiled module (imported directly, so they run on the pure path too)
and the pure functions the same input: valid ProduceRequest bodies of every version (built here
byte by byte, so tagged fields and padded varints can be spelled), the same bodies broken
(flips, truncations, insertions, deletions, splices), random bytes, every api_version 0..15, as
bytes, bytearray and memoryviews; random and framed streams for ``cut_frames`` and
``FrameReader``. Both must give the same result, or raise the same exception type with the same
message. ``scripts/fuzz.py`` runs the same comparison (targets ``produce_native``,
``framing_native``) over its mutation engine, seeded with :func:`native_seed_bodies`.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pidgate.protocol import framing, native, produce
from pidgate.protocol._wire import write_uvarint
from pidgate.protocol.errors import FrameTooLargeError, MalformedMessageError
from pidgate.protocol.framing import (
    Frame,
    FrameBufferBudget,
    FrameReader,
    frame,
    pure_cut_frames,
)
from pidgate.protocol.produce import parse_produce_request, pure_produce_acks_and_producer_ids

from ..compiled_modules import import_compiled, needs, printed_by_fresh_interpreter
from .kafka_builders import BatchSpec, build_records

FIX = (
    "reinstall pidgate where gcc and the Python headers are (Debian: apt-get install gcc "
    "python3-dev; then pip install --force-reinstall --no-deps .), or rebuild in place with "
    "cythonize -i src/pidgate/protocol/_speedups.pyx"
)


# The compiled module whichever path runs, so the comparisons hold under PIDGATE_PURE_PYTHON=1.
COMPILED, NOT_BUILT = import_compiled("pidgate.protocol._speedups", FIX)
needs_compiled = needs(COMPILED, NOT_BUILT, "test_the_compiled_module_is_built")


# --- the install and the choice -------------------------------------------------------------


def _run_choice(env_value: str | None) -> dict[str, Any]:
    """What a fresh interpreter importing pidgate's protocol modules chose."""
    code = """if True:
        import json
        from pidgate.protocol import framing, native, produce
        compiled = native.compiled
        print(json.dumps({
            "data_path": native.DATA_PATH,
            "reason": native.PURE_REASON,
            "compiled_name": None if compiled is None else compiled.__name__,
            "produce_is_pure":
                produce.produce_acks_and_producer_ids
                is produce.pure_produce_acks_and_producer_ids,
            "cut_is_pure": framing.cut_frames is framing.pure_cut_frames,
            "produce_is_compiled": compiled is not None
                and produce.produce_acks_and_producer_ids
                is compiled.produce_acks_and_producer_ids,
            "cut_is_compiled": compiled is not None
                and framing.cut_frames is compiled.cut_frames,
        }))
    """
    return printed_by_fresh_interpreter(code, env_value)


def test_the_compiled_module_is_built() -> None:
    assert COMPILED is not None, NOT_BUILT
    choice = _run_choice(None)
    assert choice["data_path"] == "compiled", (
        f"without {native.PURE_PYTHON_ENV} the pure path runs ({choice['reason']}): {FIX}"
    )
    assert choice["reason"] is None
    assert choice["compiled_name"] == "pidgate.protocol._speedups"
    assert choice["produce_is_compiled"] and choice["cut_is_compiled"]
    assert not choice["produce_is_pure"] and not choice["cut_is_pure"]


def test_pidgate_pure_python_forces_the_pure_path() -> None:
    choice = _run_choice("1")
    assert choice["data_path"] == "pure"
    assert choice["compiled_name"] is None
    assert choice["reason"] == "PIDGATE_PURE_PYTHON=1 is set"
    assert choice["produce_is_pure"] and choice["cut_is_pure"]


@needs_compiled
@pytest.mark.parametrize("value", ["0", ""])
def test_pidgate_pure_python_0_or_empty_keeps_the_compiled_path(value: str) -> None:
    choice = _run_choice(value)
    assert (choice["data_path"], choice["reason"]) == ("compiled", None)
    assert choice["produce_is_compiled"] and choice["cut_is_compiled"]


def test_this_process_binds_the_public_names_to_the_chosen_path() -> None:
    if native.DATA_PATH == "compiled":
        assert COMPILED is not None and native.compiled is COMPILED
        assert produce.produce_acks_and_producer_ids is COMPILED.produce_acks_and_producer_ids
        assert framing.cut_frames is COMPILED.cut_frames
    else:
        assert native.PURE_REASON
        assert produce.produce_acks_and_producer_ids is pure_produce_acks_and_producer_ids
        assert framing.cut_frames is pure_cut_frames


# --- comparing the two -----------------------------------------------------------------------


def outcome(function: Callable[..., Any], *args: Any) -> tuple[Any, ...]:
    """What a call gives, comparably: its result (and its repr, so a list is no tuple), or
    the exception's type and message."""
    try:
        result = function(*args)
    except Exception as error:
        return ("raises", type(error), str(error))
    return ("returns", result, repr(result))


def assert_same_walk(body: bytes | bytearray | memoryview, api_version: int) -> tuple[Any, ...]:
    assert COMPILED is not None, NOT_BUILT
    want = outcome(pure_produce_acks_and_producer_ids, body, api_version)
    got = outcome(COMPILED.produce_acks_and_producer_ids, body, api_version)
    assert got == want, (api_version, bytes(body).hex())
    return want


def assert_same_cut(data: bytes | bytearray | memoryview, max_frame_bytes: int) -> tuple[Any, ...]:
    assert COMPILED is not None, NOT_BUILT
    want = outcome(pure_cut_frames, data, max_frame_bytes)
    got = outcome(COMPILED.cut_frames, data, max_frame_bytes)
    assert got == want, (max_frame_bytes, bytes(data).hex())
    if want[0] == "returns":
        assert all(type(f) is bytes for f in got[1][0])
    return want


BUFFER_KINDS = ("bytes", "bytearray", "memoryview", "memoryview-slice", "memoryview-wide")


def as_buffer(data: bytes, kind: str) -> bytes | bytearray | memoryview:
    """``data`` as the given kind of bytes-like object: a memoryview slice is one inside a
    bigger buffer (as the connection hands a body over); a wide one has items of 4, 2 or 1
    bytes whose format is not 'B' (``cast('I')`` when the length allows)."""
    if kind == "bytes":
        return data
    if kind == "bytearray":
        return bytearray(data)
    if kind == "memoryview":
        return memoryview(data)
    if kind == "memoryview-slice":
        return memoryview(b"\x00\x01HEADER" + data + b"TAIL")[8 : 8 + len(data)]
    if len(data) % 4 == 0:
        return memoryview(data).cast("I")
    if len(data) % 2 == 0:
        return memoryview(data).cast("H")
    return memoryview(data).cast("b")


# --- ProduceRequest bodies, byte by byte -----------------------------------------------------

TaggedFields = tuple[tuple[int, bytes], ...]


@dataclass(frozen=True)
class PartitionSpec:
    index: int
    records: bytes | None
    tags: TaggedFields = ()


@dataclass(frozen=True)
class TopicSpec:
    name: str | None
    """v3-v12 (null is legal on the wire)."""
    topic_id: bytes
    """v13: 16 bytes."""
    partitions: tuple[PartitionSpec, ...] | None
    """None: a null array."""
    tags: TaggedFields = ()


@dataclass(frozen=True)
class BodySpec:
    version: int
    transactional_id: str | None
    acks: int
    timeout_ms: int
    topics: tuple[TopicSpec, ...] | None
    tags: TaggedFields = ()
    varint_padding: int = 0
    """Flexible versions: continuation bytes added to every varint (legal, not minimal)."""


def encode_body(spec: BodySpec) -> bytes:
    """A ProduceRequest body (after the request header) as a client would send it."""
    flexible = spec.version >= 9

    def uvarint(value: int) -> bytes:
        out = bytearray(write_uvarint(value))
        pad = min(spec.varint_padding, 5 - len(out))
        if pad > 0:
            out[-1] |= 0x80
            out += b"\x80" * (pad - 1) + b"\x00"
        return bytes(out)

    def string(value: str | None) -> bytes:
        raw = None if value is None else value.encode()
        if flexible:
            # A null compact string stays one byte here; padded, it has its own test
            # (test_the_walk_reads_a_padded_null_string below).
            return b"\x00" if raw is None else uvarint(len(raw) + 1) + raw
        return struct.pack(">h", -1) if raw is None else struct.pack(">h", len(raw)) + raw

    def array_len(n: int | None) -> bytes:
        if flexible:
            return uvarint(0 if n is None else n + 1)
        return struct.pack(">i", -1 if n is None else n)

    def tags(fields: TaggedFields) -> bytes:
        if not flexible:
            return b""
        return uvarint(len(fields)) + b"".join(
            uvarint(tag) + uvarint(len(raw)) + raw for tag, raw in fields
        )

    out = [string(spec.transactional_id), struct.pack(">hi", spec.acks, spec.timeout_ms)]
    out.append(array_len(None if spec.topics is None else len(spec.topics)))
    for topic in spec.topics or ():
        out.append(topic.topic_id if spec.version >= 13 else string(topic.name))
        out.append(array_len(None if topic.partitions is None else len(topic.partitions)))
        for partition in topic.partitions or ():
            out.append(struct.pack(">i", partition.index))
            records = partition.records
            if flexible:
                out.append(uvarint(0) if records is None else uvarint(len(records) + 1))
            else:
                out.append(struct.pack(">i", -1 if records is None else len(records)))
            out.append(records or b"")
            out.append(tags(partition.tags))
        out.append(tags(topic.tags))
    out.append(tags(spec.tags))
    return b"".join(out)


def _records(*specs: BatchSpec) -> bytes:
    return build_records(list(specs))


# Record blobs built once (kafka-python is slow): v2 batches with and without PIDs, transactional,
# compressed, the largest PID, legacy magic 0 and 1 message sets, v2 and legacy mixed, and one
# over 16 KiB (a three-byte compact length).
RECORDS: tuple[bytes, ...] = (
    b"",
    _records(BatchSpec(2, 0, 1000, 3, 7, False, 2)),
    _records(BatchSpec(2, 0, 1001, 0, 0, True, 1), BatchSpec(2, 0, -1, -1, -1, False, 1)),
    _records(BatchSpec(2, 1, 2**63 - 1, 5, 0, False, 2)),
    _records(BatchSpec(2, 0, 0, 0, 0, False, 1)),
    _records(BatchSpec(0, 0, -1, -1, -1, False, 1)),
    _records(BatchSpec(1, 0, -1, -1, -1, False, 2)),
    _records(
        BatchSpec(2, 0, 7, 0, 0, False, 1),
        BatchSpec(1, 0, -1, -1, -1, False, 1),
        BatchSpec(2, 0, 8, 0, 0, False, 1),
    ),
)
BIG_RECORDS = _records(*[BatchSpec(2, 0, 12, 0, 0, False, 3)] * 60)
assert len(BIG_RECORDS) > 0x3FFF

tagged_fields = st.lists(
    st.tuples(st.integers(0, 2**31 - 1), st.binary(max_size=140)), max_size=2
).map(tuple)
# Drawn from fixed choices where only lengths matter to the walks (generation is what costs).
names = st.sampled_from(
    (None, "", "t", "orders", "ümlaut-名前", "t" * 126, "t" * 127, "t" * 300, "t" * 16_400)
)
RECORD_CHOICES: tuple[bytes | None, ...] = (
    None,
    *RECORDS,
    BIG_RECORDS,
    *(a + b for a in RECORDS[1:] for b in RECORDS[1:]),
    RECORDS[5] + RECORDS[1] + RECORDS[6],
)
records = st.sampled_from(RECORD_CHOICES)
partition_specs = st.builds(
    PartitionSpec,
    index=st.integers(-(2**31), 2**31 - 1),
    records=records,
    tags=st.one_of(st.just(()), tagged_fields),
)
small_partition_specs = st.builds(
    PartitionSpec,
    index=st.integers(-(2**31), 2**31 - 1),
    records=st.one_of(st.none(), st.sampled_from(RECORDS)),
)
topic_specs = st.builds(
    TopicSpec,
    name=names,
    topic_id=st.binary(min_size=16, max_size=16),
    partitions=st.one_of(
        st.lists(partition_specs, max_size=3).map(tuple),
        st.none(),
        small_partition_specs.map(lambda p: (p,) * 130),  # a two-byte compact array length
    ),
    tags=st.one_of(st.just(()), tagged_fields),
)
body_specs = st.builds(
    BodySpec,
    version=st.integers(3, 13),
    transactional_id=st.one_of(names, st.just("tx")),
    acks=st.sampled_from([-1, 0, 1, 2, -2]),
    timeout_ms=st.integers(-(2**31), 2**31 - 1),
    topics=st.one_of(st.lists(topic_specs, max_size=3).map(tuple), st.none()),
    tags=st.one_of(st.just(()), tagged_fields),
    varint_padding=st.sampled_from([0, 0, 0, 1, 2]),
)


def native_seed_bodies() -> list[tuple[int, bytes]]:
    """(version, valid body) pairs covering the shapes above, for the fuzz harness's seeds."""
    rich = (
        TopicSpec(
            "orders", bytes(range(16)), (PartitionSpec(0, RECORDS[2]), PartitionSpec(1, None))
        ),
        TopicSpec(
            "t" * 200,
            bytes(16),
            (PartitionSpec(3, RECORDS[7], ((1, b"x"),)), PartitionSpec(4, RECORDS[1] + RECORDS[3])),
            ((0, b"tag"),),
        ),
        TopicSpec(None, b"\xff" * 16, (PartitionSpec(5, b""), PartitionSpec(6, RECORDS[5]))),
    )
    seeds: list[tuple[int, bytes]] = []
    for version in range(3, 14):
        for transactional_id, padding, top_tags in (
            (None, 0, ()),
            ("tx", 0, ()),
            ("x" * 150, 1, ((2, b"top"),)),
        ):
            spec = BodySpec(version, transactional_id, -1, 30000, rich, top_tags, padding)
            seeds.append((version, encode_body(spec)))
        plain = (TopicSpec("p", bytes(16), (PartitionSpec(0, RECORDS[1]),)),)
        seeds.append((version, encode_body(BodySpec(version, None, 1, 1000, plain))))
        seeds.append((version, encode_body(BodySpec(version, None, 0, 0, None))))
    return seeds


def test_the_builder_writes_what_kafka_python_reads() -> None:
    """The hand-built bodies are real ProduceRequests (so the properties walk valid input)."""
    from kafka.protocol.producer.produce import ProduceRequest

    for version, body in native_seed_bodies():
        decoded = ProduceRequest.decode(body, version=version)
        summary = parse_produce_request(body, version)
        assert (decoded.transactional_id, decoded.acks) == (
            summary.transactional_id,
            summary.acks,
        )
        topics = decoded.topic_data or []
        assert [len(t.partition_data or []) for t in topics] == [
            len(t.partitions) for t in summary.topics
        ]


# --- the Produce walk -------------------------------------------------------------------------

SEED_BODIES = native_seed_bodies()

MAIN = settings(
    max_examples=2000,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
ALL_VERSIONS = range(16)

_INTERESTING = (b"\x00", b"\xff", b"\x7f", b"\x80", b"\x80\x00", b"\xff\xff\xff\xff", b"\x7f\xff")


@st.composite
def mutated(draw: st.DrawFn, body: bytes) -> bytes:
    """``body`` broken a few times: bit flips, bytes set, interesting integers, insertions,
    deletions, truncations, and splices with another valid body."""
    buf = bytearray(body)
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "set", "int", "insert", "delete", "cut", "splice"]))
        n = len(buf)
        i = draw(st.integers(0, n))
        if op == "flip" and i < n:
            buf[i] ^= 1 << draw(st.integers(0, 7))
        elif op == "set" and i < n:
            buf[i] = draw(st.integers(0, 255))
        elif op == "int":
            value = draw(st.sampled_from(_INTERESTING))
            buf[i : i + len(value)] = value
        elif op == "insert":
            buf[i:i] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete":
            del buf[i : i + draw(st.integers(1, 8))]
        elif op == "cut":
            del buf[i:]
        elif op == "splice":
            _version, other = draw(st.sampled_from(SEED_BODIES))
            buf = buf[:i] + other[draw(st.integers(0, len(other))) :]
    return bytes(buf)


@needs_compiled
@MAIN
@given(spec=body_specs, kind=st.sampled_from(BUFFER_KINDS))
def test_valid_bodies_give_the_same_acks_and_pids(spec: BodySpec, kind: str) -> None:
    body = encode_body(spec)
    result = assert_same_walk(as_buffer(body, kind), spec.version)
    summary = parse_produce_request(body, spec.version)
    pids = tuple(b.producer_id for _t, _p, b in summary.iter_batches() if b.producer_id != -1)
    assert result[:2] == ("returns", (spec.acks, pids))
    for api_version in ALL_VERSIONS:  # read as every other version: mostly broken
        assert_same_walk(as_buffer(body, kind), api_version)


@needs_compiled
@MAIN
@given(spec=body_specs, kind=st.sampled_from(BUFFER_KINDS), data=st.data())
def test_broken_bodies_give_the_same_result_or_error(
    spec: BodySpec, kind: str, data: st.DataObject
) -> None:
    body = data.draw(mutated(encode_body(spec)))
    for api_version in ALL_VERSIONS:
        assert_same_walk(as_buffer(body, kind), api_version)


@needs_compiled
@settings(MAIN, max_examples=1000)
@given(body=st.binary(max_size=300), kind=st.sampled_from(BUFFER_KINDS))
def test_random_bytes_give_the_same_result_or_error(body: bytes, kind: str) -> None:
    for api_version in ALL_VERSIONS:
        assert_same_walk(as_buffer(body, kind), api_version)


@needs_compiled
def test_every_truncation_of_the_seeds_gives_the_same_error() -> None:
    """Every prefix of the small seeds, every 5th of the others (a prefix is never whole)."""
    for version, body in SEED_BODIES:
        for cut in range(0, len(body), 1 if len(body) < 400 else 5):
            result = assert_same_walk(body[:cut], version)
            assert result[0] == "raises", (version, cut)


@needs_compiled
def test_the_walk_agrees_on_the_shapes_it_hands_to_the_pure_walk() -> None:
    """Known shapes next to the compiled walk's edges: a long transactional id, padded
    (non-minimal) varints, a non-empty tagged-field section at each level, two- and three-byte
    records lengths, a legacy batch between v2 ones, and a v2 batch too short for its header."""
    partitions = (PartitionSpec(1, RECORDS[7]), PartitionSpec(2, BIG_RECORDS, ((3, b"p"),)))
    topic = TopicSpec("t", bytes(16), partitions)
    pids = (7, 8) + (12,) * 60
    for version in range(3, 14):
        for spec, want in (
            (BodySpec(version, "x" * 300, 1, 5, (topic,)), pids),
            (BodySpec(version, None, 1, 5, (topic,), varint_padding=1), pids),
            (BodySpec(version, None, 1, 5, (TopicSpec("t", bytes(16), (), ((7, b"v"),)),)), ()),
            (BodySpec(version, None, 1, 5, (topic,), ((9, b"top"),)), pids),
        ):
            assert assert_same_walk(encode_body(spec), version)[:2] == ("returns", (1, want))
    short_v2 = bytearray(RECORDS[1])
    short_v2[8:12] = struct.pack(">i", 48)  # batch_length below the v2 minimum (49)
    short_topic = TopicSpec("t", bytes(16), (PartitionSpec(0, bytes(short_v2)),))
    for version in range(3, 14):
        result = assert_same_walk(
            encode_body(BodySpec(version, None, 1, 5, (short_topic,))), version
        )
        assert result[:2] == ("raises", MalformedMessageError)
        assert "below the minimum 49 for magic 2" in result[2]


@pytest.mark.parametrize("version", [9, 12])
@pytest.mark.parametrize("where", ["transactional_id", "topic name"])
def test_the_walk_reads_a_padded_null_string(version: int, where: str) -> None:
    """Regression: a compact null string as a non-minimal varint (0x80 0x00) is null to the full
    walk, to kafka-python and to Kafka (which read up to 5 varint bytes); the lean walk (pure,
    and the compiled one, which hands it such lengths) read the rest of the body one byte early,
    so the quota could have seen other PIDs than the broker."""
    topic = TopicSpec(
        "t" if where == "transactional_id" else None, bytes(16), (PartitionSpec(0, RECORDS[1]),)
    )
    body = bytearray(encode_body(BodySpec(version, None, -1, 30000, (topic,))))
    at = 0 if where == "transactional_id" else 1 + 6 + 1  # after txn id, acks/timeout, count
    assert body[at] == 0
    body[at : at + 1] = b"\x80\x00"
    full = parse_produce_request(bytes(body), version)
    assert (full.acks, full.producer_ids()) == (-1, frozenset({1000}))
    assert pure_produce_acks_and_producer_ids(bytes(body), version) == (-1, (1000,))


@needs_compiled
@pytest.mark.parametrize("version", [3, 9, 13])
def test_views_that_are_not_flat_bytes_go_to_the_pure_walk(version: int) -> None:
    """Regression: the compiled walk read any buffer's bytes, the pure one indexes items. A 2-D
    byte view gave (acks, pids) compiled and NotImplementedError pure (flexible versions); both
    now give the pure walk's answer. A
    strided view raises BufferError in both; a view of 4-byte items reads its bytes in both."""
    body = encode_body(
        BodySpec(version, None, 1, 5, (TopicSpec("t", bytes(16), (PartitionSpec(0, RECORDS[1]),)),))
    )
    body += bytes(-len(body) % 4)  # trailing bytes are not read
    rows = memoryview(body).cast("B", (2, len(body) // 2))
    rows_outcome = assert_same_walk(rows, version)
    if version >= 9:  # the pure walk's buf[0] on a 2-D view
        assert rows_outcome[:2] == ("raises", NotImplementedError)
    strided = memoryview(body + body)[::2]
    assert assert_same_walk(strided, version)[:2] == ("raises", BufferError)
    assert assert_same_walk(memoryview(body).cast("I"), version)[:2] == ("returns", (1, (1000,)))
    assert assert_same_walk("not bytes", version)[:2] == ("raises", TypeError)  # type: ignore[arg-type]


# --- cutting frames ---------------------------------------------------------------------------

max_frame_sizes = st.one_of(
    st.integers(-2, 300), st.sampled_from([0, 4, 2**31 - 1, 2**40]), st.integers(0, 2**31)
)
FRAME_KINDS = ("bytes", "bytearray", "memoryview", "memoryview-slice")


@st.composite
def streams(draw: st.DrawFn) -> bytes:
    """Valid frames back to back, maybe cut short, maybe followed by garbage."""
    payloads = draw(st.lists(st.binary(max_size=80), max_size=8))
    stream = b"".join(frame(p) for p in payloads)
    stream = stream[: draw(st.integers(0, len(stream)))] if draw(st.booleans()) else stream
    return stream + draw(st.one_of(st.just(b""), st.binary(max_size=12)))


@needs_compiled
@settings(MAIN, max_examples=1000)
@given(
    data=st.one_of(st.binary(max_size=200), streams()),
    max_frame_bytes=max_frame_sizes,
    kind=st.sampled_from(FRAME_KINDS),
)
def test_cut_frames_gives_the_same_frames_or_error(
    data: bytes, max_frame_bytes: int, kind: str
) -> None:
    assert_same_cut(as_buffer(data, kind), max_frame_bytes)


@needs_compiled
def test_cut_frames_every_cut_point_of_a_stream() -> None:
    stream = b"".join(frame(bytes([i]) * i) for i in (0, 1, 5, 60, 3)) + struct.pack(">i", 100)
    for cut in range(len(stream) + 1):
        for max_frame_bytes in (59, 60, 100, 10**6):
            for kind in FRAME_KINDS:
                assert_same_cut(as_buffer(stream[:cut], kind), max_frame_bytes)
    assert assert_same_cut(stream, 100)[1][1:] == (sum(4 + i for i in (0, 1, 5, 60, 3)), 104)
    error = assert_same_cut(stream, 59)
    assert error == (
        "raises",
        FrameTooLargeError,
        "frame size prefix 60 bytes exceeds max_frame_bytes=59",
    )
    assert assert_same_cut(b"\xff\xff\xff\xfe", 10)[1:] == (
        FrameTooLargeError,
        "negative frame size prefix -2",
    )


@needs_compiled
def test_cut_frames_hands_views_that_are_not_flat_bytes_to_the_pure_cut() -> None:
    """Regression: a 12-byte view of 4-byte items held two frames for the compiled cut and
    none for the pure one (whose len counts items); a strided view of 3 items raised
    BufferError compiled and cut nothing pure; a str of 2 characters likewise."""
    stream = frame(b"abcd") + frame(b"")
    assert assert_same_cut(memoryview(stream).cast("I"), 100)[1] == ([], 0, 0)
    assert assert_same_cut(memoryview(stream).cast("B", (3, 4)), 100)[1] == ([], 0, 0)
    assert assert_same_cut(memoryview(b"abcdef")[::2], 100)[1] == ([], 0, 0)
    assert assert_same_cut("ab", 100)[1] == ([], 0, 0)  # type: ignore[arg-type]
    assert assert_same_cut(memoryview(stream).cast("b"), 100)[1] == (
        [frame(b"abcd"), frame(b"")],
        12,
        0,
    )


def read_all(reader: FrameReader, data: bytes, read_sizes: list[int]) -> list[Frame]:
    """An event loop's reads into the buffers ``reader`` lends, of the sizes given in turn."""
    frames: list[Frame] = []
    turn = 0
    while data:
        target = reader.get_buffer()
        count = min(len(target), len(data), read_sizes[turn % len(read_sizes)])
        turn += 1
        target[:count] = data[:count]
        data = data[count:]
        frames += reader.buffer_updated(count)
    return frames


def _read_with(
    cut: Callable[..., Any], stream: bytes, read_sizes: list[int], budget_bytes: int
) -> tuple[Any, ...]:
    scratch = bytearray(64)
    budget = FrameBufferBudget(budget_bytes)
    reader = FrameReader(2000, scratch, budget, big_frame_bytes=24)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(framing, "cut_frames", cut)
        try:
            frames = read_all(reader, stream, read_sizes)
        except FrameTooLargeError as error:
            return ("raises", str(error), reader.buffered_bytes, budget.available_bytes)
    assert scratch == bytes(64)
    seen = [(type(f).__name__, bytes(f)) for f in frames]
    return ("returns", seen, reader.buffered_bytes, budget.available_bytes)


@needs_compiled
@settings(max_examples=300, deadline=None)
@given(
    payloads=st.lists(
        st.one_of(
            st.binary(max_size=30),
            st.integers(25, 1500).map(lambda n: bytes(i % 251 for i in range(n))),
        ),
        max_size=8,
    ),
    tail=st.one_of(st.just(b""), st.binary(max_size=10), st.just(struct.pack(">i", 2001))),
    read_sizes=st.lists(st.integers(1, 100), min_size=1, max_size=6),
    budget_bytes=st.sampled_from([0, 100, 2000, 10_000]),
)
def test_frame_reader_reads_the_same_frames_on_both_paths(
    payloads: list[bytes], tail: bytes, read_sizes: list[int], budget_bytes: int
) -> None:
    """Small frames and big ones (over 24 bytes: their own buffer while the budget lasts), read
    in random sizes: the same frames (bytes or bytearray alike), the same bytes kept, the same
    budget left, or the same FrameTooLargeError."""
    assert COMPILED is not None, NOT_BUILT
    stream = b"".join(frame(p) for p in payloads) + tail
    want = _read_with(pure_cut_frames, stream, read_sizes, budget_bytes)
    got = _read_with(COMPILED.cut_frames, stream, read_sizes, budget_bytes)
    assert got == want
    if want[0] == "returns" and not tail:
        assert [f for _kind, f in want[1]] == [frame(p) for p in payloads]
