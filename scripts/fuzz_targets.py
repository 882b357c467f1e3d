"""The fuzz targets and their seeds, for ``scripts/fuzz.py`` and the hypothesis properties in
``tests/protocol/test_fuzz_properties.py``.

Owns: ``TARGETS`` (name -> a function feeding one input to a sans-IO protocol entry point; the
leading byte(s) of the input select the version or mode) and ``build_seeds`` (valid messages
built with kafka-python). Imports only ``pidgate.protocol`` and kafka-python: no engine, no I/O.

The ``*_native`` targets (``NATIVE_TARGETS``, issue "native") run the compiled twin
``pidgate.protocol._speedups`` and the pure function on the same input: a different result, a
different exception type or message, or any exception but ``ProtocolError`` from either is a
crash (``NativeMismatch`` for a difference). They need the compiled module, imported directly
(so they run under ``PIDGATE_PURE_PYTHON=1`` too); ``COMPILED_MISSING`` says why when it is not
built, and the harness then skips them.
"""

from __future__ import annotations

import struct
from collections.abc import Callable
from typing import Any

from pidgate.protocol import api_versions, endpoints, headers
from pidgate.protocol import init_producer_id as ipid
from pidgate.protocol.client_quotas.alter import split_alter_request
from pidgate.protocol.client_quotas.describe import split_describe_request
from pidgate.protocol.client_quotas.entities import QuotaEntity
from pidgate.protocol.errors import ProtocolError
from pidgate.protocol.framing import FrameDecoder, pure_cut_frames
from pidgate.protocol.produce import parse_produce_request, pure_produce_acks_and_producer_ids
from pidgate.protocol.record_batches import iter_batch_headers
from pidgate.protocol.sasl import SaslObserver

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


# --- native targets: the compiled twin and the pure function on the same input --------------

_compiled: Any
try:
    from pidgate.protocol import _speedups as _compiled  # type: ignore[attr-defined,no-redef]
    from pidgate.quota import _bloomspeed  # type: ignore[attr-defined]  # noqa: F401

    COMPILED_MISSING: str | None = None
except ImportError as _error:
    _compiled = None
    COMPILED_MISSING = (
        f"a compiled module (pidgate.protocol._speedups, pidgate.quota._bloomspeed) is not "
        f"built ({_error}); reinstall "
        "pidgate where gcc and the Python headers are, or run "
        "cythonize -i src/pidgate/protocol/_speedups.pyx"
    )


class NativeMismatch(AssertionError):
    """The compiled and the pure function disagreed on one input."""


def _outcome(function: Callable[..., Any], *args: Any) -> tuple[Any, ...]:
    try:
        result = function(*args)
    except Exception as error:
        return ("raises", type(error), str(error), error)
    return ("returns", result, repr(result), None)


def _same_on_both(
    what: str, compiled: Callable[..., Any], pure: Callable[..., Any], *args: Any
) -> Any:
    """Run both; raise NativeMismatch on any difference, else re-raise the (common) error."""
    want = _outcome(pure, *args)
    got = _outcome(compiled, *args)
    if got[:3] != want[:3]:
        raise NativeMismatch(f"{what}: compiled {got[:3]!r} != pure {want[:3]!r}")
    if want[3] is not None:
        raise want[3]
    return want[1]


def _buffer(kind: int, data: bytes) -> bytes | bytearray | memoryview:
    """``data`` as bytes, a bytearray, a memoryview inside a bigger buffer, or (produce only) a
    memoryview of wider items (format 'I' or 'H' when the length allows)."""
    if kind == 0:
        return data
    if kind == 1:
        return bytearray(data)
    if kind == 2:
        return memoryview(b"HEAD" + data + b"TAIL")[4 : 4 + len(data)]
    if len(data) % 4 == 0:
        return memoryview(data).cast("I")
    return memoryview(data).cast("H") if len(data) % 2 == 0 else memoryview(data).cast("b")


def _need_compiled() -> Any:
    if _compiled is None:
        raise RuntimeError(COMPILED_MISSING)
    return _compiled


def t_produce_native(data: bytes) -> None:
    """data[0]: api_version (low 4 bits: 0..15, 3..13 supported) and buffer kind (bits 4-5)."""
    compiled = _need_compiled()
    if not data:
        return
    body = _buffer((data[0] >> 4) & 3, data[1:])
    _same_on_both(
        "produce_acks_and_producer_ids",
        compiled.produce_acks_and_producer_ids,
        pure_produce_acks_and_producer_ids,
        body,
        data[0] & 0x0F,
    )


def t_framing_native(data: bytes) -> None:
    """data[0]: max_frame_bytes ((low 6 bits) * 8 - 1; 63: 2**31 - 1) and buffer kind (bits 6-7:
    bytes, bytearray, memoryview slice, memoryview of a bytearray as FrameReader hands over)."""
    compiled = _need_compiled()
    if not data:
        return
    code = data[0] & 0x3F
    max_frame = 2**31 - 1 if code == 0x3F else code * 8 - 1
    kind = data[0] >> 6
    stream = _buffer(kind, data[1:]) if kind < 3 else memoryview(bytearray(data[1:]))
    frames, consumed, incomplete = _same_on_both(
        "cut_frames", compiled.cut_frames, pure_cut_frames, stream, max_frame
    )
    left = len(stream) - consumed
    assert b"".join(frames) == bytes(stream[:consumed]), "frames are not the input in order"
    assert left < incomplete if incomplete else left < 4, "a whole frame or size left uncut"


def t_produce_response_native(data: bytes) -> None:
    """data[0]: the Produce version it is read as (9..14) and buffer kind (bits 4-5); the rest:
    a response frame after its size prefix. Compiled and pure ``produce_response_passes_unchanged``
    must agree (neither raises)."""
    from pidgate.protocol.endpoints import pure_produce_response_passes_unchanged

    compiled = _need_compiled()
    if not data:
        return
    payload = _buffer((data[0] >> 4) & 3, data[1:])
    _same_on_both(
        "produce_response_passes_unchanged",
        compiled.produce_response_passes_unchanged,
        pure_produce_response_passes_unchanged,
        payload,
        (data[0] & 0x0F) % 6 + 9,
    )


_bloom_filter: Any = None


def _bloom_filter_and_time() -> tuple[Any, int]:
    """A principal's filter of 12 live layers (fresh and stale, one full of PIDs 0..4999),
    built once; and a time inside its window."""
    global _bloom_filter
    if _bloom_filter is None:
        from pidgate.quota.layer_plan import LayerPlan
        from pidgate.quota.layered import LayeredBloomFilter

        seen = LayeredBloomFilter(LayerPlan(window_ms=60_000, window_num=6))
        for pid in range(5_000):
            now_ms = 1_000_000 + pid * 10
            seen.add(seen.positions(pid), now_ms)
        _bloom_filter = seen
    return _bloom_filter, 1_000_000 + 5_000 * 10


def t_bloom_native(data: bytes) -> None:
    """data[0:8]: a PID (big-endian, signed; short inputs padded with zeros), data[8]: the hash
    count (1..64), data[9:11]: how far (in 10 ms) after the filter's last write it is asked:
    the compiled positions and layer scan (pidgate.quota._bloomspeed) against the pure ones."""
    from pidgate.quota import _bloomspeed  # type: ignore[attr-defined]
    from pidgate.quota.bloom import pure_universal_positions

    padded = data.ljust(11, b"\0")
    pid = int.from_bytes(padded[:8], "big", signed=True)
    hash_count = padded[8] % 64 + 1
    _same_on_both(
        "universal_positions",
        _bloomspeed.universal_positions,
        pure_universal_positions,
        pid,
        hash_count,
    )
    seen, now_ms = _bloom_filter_and_time()
    now_ms += int.from_bytes(padded[9:11], "big") * 10
    positions = pure_universal_positions(pid, seen._max_hashes)
    plan = seen.plan
    _same_on_both(
        "find",
        lambda: _bloomspeed.find(
            seen._bits,
            seen._meta,
            seen._first,
            positions,
            now_ms,
            plan.window_ms,
            plan.fresh_divisor,
        ),
        lambda: seen.find_pure(pid, positions, now_ms),
    )


_known_managers: Any = None
_KNOWN_PRINCIPALS = ("alice", "bob", "unlimited")
#: Time steps past 15 ms, for data[1] >= 240 (most steps are data[1] % 16 ms: PIDs repeat within
#: a fresh layer, so the known-PID check answers yes often; these age, roll and expire layers).
_KNOWN_LONG_STEPS_MS = (
    30,
    120,
    250,
    499,
    500,
    501,
    999,
    1000,
    1001,
    1500,
    2600,
    10_000,
    0,
    1,
    2,
    3,
)


def _known_pid_managers() -> Any:
    """Two managers, kept in step: one asks the compiled known-PID check and one-PID shortcut,
    one the pure."""
    global _known_managers
    if _known_managers is None:
        import types

        from pidgate.quota.manager import QuotaManager, QuotaPolicy

        def manager() -> QuotaManager:
            return QuotaManager(
                QuotaPolicy(
                    window_ms=1000,
                    window_num=4,
                    min_layer_items=3,
                    max_layer_items=3,
                    user_producer_ids_rates={"alice": 12, "bob": 12},
                )
            )

        compiled, pure = manager(), manager()
        speed = _need_compiled_quota()
        compiled.admit_known = types.MethodType(speed.admit_known, compiled)  # type: ignore[method-assign]
        compiled.admit_single = types.MethodType(speed.admit_single, compiled)  # type: ignore[method-assign]
        pure.admit_known = pure.admit_known_pure  # type: ignore[method-assign]
        pure.admit_single = pure.admit_single_pure  # type: ignore[method-assign]
        _known_managers = [compiled, pure, 1_000_000]
    return _known_managers


def _need_compiled_quota() -> Any:
    try:
        from pidgate.quota import _bloomspeed  # type: ignore[attr-defined]
    except ImportError as error:
        raise RuntimeError(COMPILED_MISSING) from error
    return _bloomspeed


def t_known_native(data: bytes) -> None:
    """data[0]: the principal (of alice, bob, an unlimited one; bit 7: PIDs as a tuple, else a
    list), data[1]: the time step (``_KNOWN_LONG_STEPS_MS``), data[2]:
    how many PIDs (0..4), then 1 byte each (PIDs 0..7, so most repeat): one Produce through
    the compiled known-PID check (``QuotaManager.admit_known``, pidgate.quota._bloomspeed) and
    then ``admit`` (which tries the compiled one-PID shortcut, ``admit_single``), on one
    manager, and through the pure ones on its twin, kept in step over the whole run: the same
    answers, decisions and layers after every input."""
    compiled, pure, now_ms = _known_pid_managers()
    padded = data.ljust(3, b"\0")
    principal = _KNOWN_PRINCIPALS[padded[0] % 3]
    step = padded[1]
    now_ms += step % 16 if step < 240 else _KNOWN_LONG_STEPS_MS[step - 240]
    _known_managers[2] = now_ms
    pids = [byte % 8 for byte in padded[3 : 3 + padded[2] % 5]]
    ids = tuple(pids) if padded[0] & 0x80 else pids
    _same_on_both(
        "admit_known",
        lambda: compiled.admit_known(principal, ids, now_ms),
        lambda: pure.admit_known(principal, ids, now_ms),
    )
    _same_on_both(
        "admit",
        lambda: compiled.admit(principal, ids, now_ms),
        lambda: pure.admit(principal, ids, now_ms),
    )
    _same_on_both(
        "layers",
        lambda: [(name, state.seen._meta) for name, state in compiled._principals.items()],
        lambda: [(name, state.seen._meta) for name, state in pure._principals.items()],
    )


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
    "produce_native": t_produce_native,
    "framing_native": t_framing_native,
    "bloom_native": t_bloom_native,
    "produce_response_native": t_produce_response_native,
    "known_native": t_known_native,
}
#: Targets that need the compiled module (skipped, with COMPILED_MISSING, when it is absent).
NATIVE_TARGETS = (
    "produce_native",
    "framing_native",
    "bloom_native",
    "produce_response_native",
    "known_native",
)

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
    _native_seeds(seeds)
    for name in TARGETS:
        seeds[name].append(b"")
    return seeds


def _native_seeds(seeds: dict[str, list[bytes]]) -> None:
    """Valid Produce bodies of v3..v13 (tagged fields, padded varints, legacy batches, long
    names: tests/protocol/test_native.py builds them) as bytes, bytearray and memoryview
    slices; streams of whole and cut frames, and framed bodies."""
    from tests.protocol.test_native import native_seed_bodies

    bodies = native_seed_bodies()
    for index, (version, body) in enumerate(bodies):
        seeds["produce_native"].append(bytes([(index % 3) << 4 | version]) + body)
    stream = b"".join(struct.pack(">i", len(p)) + p for p in (b"abc", b"", b"q" * 40))
    framed = stream + struct.pack(">i", 60) + b"x" * 60
    for kind in range(4):
        seeds["framing_native"] += [
            bytes([kind << 6 | 0x3F]) + framed,
            bytes([kind << 6 | 8]) + framed,  # max 63
            bytes([kind << 6 | 0x3F]) + framed[:-7],  # cut inside the last frame
        ]
    from tests.protocol.test_endpoints import produce as produce_response

    for version in range(10, 14):
        for with_endpoints in (False, True):
            body = produce_response(version, with_endpoints)
            seeds["produce_response_native"].append(
                bytes([version - 9]) + (7).to_bytes(4, "big") + b"\x00" + body
            )
    seeds["bloom_native"] += [
        struct.pack(">qBH", pid, hashes, later)
        for pid, hashes, later in ((0, 13, 0), (4999, 13, 1), (-1, 63, 6000), (2**62, 0, 65535))
    ]
    seeds["known_native"] += [
        bytes([0, 0, 1, 5]),
        bytes([0, 1, 1, 5]),
        bytes([0x80, 2, 2, 5, 6]),
        bytes([1, 4, 4, 5, 6, 7, 5]),
        bytes([2, 8, 1, 9]),
    ]
    for _version, body in bodies[:: len(bodies) // 4]:
        seeds["framing_native"].append(bytes([0x3F]) + struct.pack(">i", len(body)) + body)
