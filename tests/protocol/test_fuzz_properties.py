"""Property fuzzing of the sans-IO protocol package (issue 7, "Fuzzing").

Every entry point must raise nothing but ``ProtocolError`` subclasses on any input: arbitrary
bytes, and valid messages built with kafka-python then mutated (bit flips, inserts, deletes,
truncations, interesting integers). The targets and seeds are those of ``scripts/fuzz.py`` (the
bounded 1M-input harness), so both fuzz exactly the same calls. Inputs the harness found
crashing live in ``tests/protocol/fuzz_crashers/`` and are replayed here as regression tests.
"""

from __future__ import annotations

import contextlib
import importlib.util
import random
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pidgate.protocol.errors import ProtocolError

ROOT = Path(__file__).resolve().parents[2]
CRASHERS = Path(__file__).resolve().parent / "fuzz_crashers"


def _load_harness() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "pidgate_fuzz_harness", ROOT / "scripts" / "fuzz.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


FUZZ: Any = _load_harness()
TARGETS: dict[str, Any] = FUZZ.TARGETS
SEEDS: dict[str, list[bytes]] = FUZZ.build_seeds()


def _target(name: str) -> Any:
    """A target name as a parameter; the native ones skipped when the compiled module is not
    built (tests/protocol/test_native.py fails then, naming the fix)."""
    if name in FUZZ.NATIVE_TARGETS and FUZZ.COMPILED_MISSING:
        return pytest.param(name, marks=pytest.mark.skip(reason=FUZZ.COMPILED_MISSING))
    return name


NAMES = [_target(name) for name in sorted(TARGETS)]

FUZZ_SETTINGS = settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


def only_protocol_errors(name: str, data: bytes) -> None:
    with contextlib.suppress(ProtocolError):
        TARGETS[name](data)


@pytest.mark.parametrize("name", NAMES)
def test_seeds_are_accepted(name: str) -> None:
    """The valid messages parse without any error (else the mutants would test little)."""
    assert SEEDS[name], name
    for seed in SEEDS[name]:
        if seed:  # b"" is a seed for the mutator, not a valid message
            TARGETS[name](seed)


@pytest.mark.parametrize("name", NAMES)
@FUZZ_SETTINGS
@given(data=st.binary(max_size=512))
def test_arbitrary_bytes(name: str, data: bytes) -> None:
    only_protocol_errors(name, data)


@pytest.mark.parametrize("name", NAMES)
@FUZZ_SETTINGS
@given(prefix=st.binary(min_size=1, max_size=3), data=st.binary(max_size=256))
def test_arbitrary_bytes_every_version(name: str, prefix: bytes, data: bytes) -> None:
    """The leading bytes pick version/mode: cover them independently of the body."""
    only_protocol_errors(name, prefix + data)


@st.composite
def mutated(draw: st.DrawFn, name: str) -> bytes:
    seed = draw(st.sampled_from(SEEDS[name]))
    buf = bytearray(seed)
    for _ in range(draw(st.integers(1, 6))):
        op = draw(st.sampled_from(["flip", "set", "insert", "delete", "truncate", "int"]))
        n = len(buf)
        i = draw(st.integers(0, n)) if n else 0
        if op == "flip" and i < n:
            buf[i] ^= 1 << draw(st.integers(0, 7))
        elif op == "set" and i < n:
            buf[i] = draw(st.integers(0, 255))
        elif op == "insert":
            buf[i:i] = draw(st.binary(min_size=1, max_size=8))
        elif op == "delete":
            del buf[i : i + draw(st.integers(1, 8))]
        elif op == "truncate":
            del buf[i:]
        elif op == "int" and i < n:
            v = draw(st.sampled_from(FUZZ._INTERESTING))
            buf[i : i + len(v)] = v
    return bytes(buf)


@pytest.mark.parametrize("name", NAMES)
@FUZZ_SETTINGS
@given(data=st.data())
def test_mutated_valid_messages(name: str, data: st.DataObject) -> None:
    only_protocol_errors(name, data.draw(mutated(name)))


@pytest.mark.parametrize("name", NAMES)
def test_harness_mutator_smoke(name: str) -> None:
    """The harness's own mutation engine, a few thousand inputs per target, fixed seed."""
    rng = random.Random(f"pidgate-{name}")
    pool = SEEDS[name]
    for _ in range(2000):
        only_protocol_errors(name, FUZZ.mutate(rng, rng.choice(pool), pool))


@pytest.mark.skipif(bool(FUZZ.COMPILED_MISSING), reason=str(FUZZ.COMPILED_MISSING))
def test_native_targets_report_any_difference(monkeypatch: pytest.MonkeyPatch) -> None:
    """A compiled function that answers differently from the pure one, or raises another
    message, is a crash (NativeMismatch), not a ProtocolError to shrug off."""
    targets = sys.modules[FUZZ.TARGETS["produce_native"].__module__]
    real = targets._compiled
    produce_seed = next(s for s in SEEDS["produce_native"] if s)
    framing_seed = next(s for s in SEEDS["framing_native"] if s)

    class Wrong:
        @staticmethod
        def produce_acks_and_producer_ids(body: Any, api_version: int) -> Any:
            acks, pids = real.produce_acks_and_producer_ids(body, api_version)
            return acks, (*pids, 1)

        @staticmethod
        def cut_frames(data: Any, max_frame_bytes: int) -> Any:
            raise ProtocolError("another message")

    monkeypatch.setattr(targets, "_compiled", Wrong)
    with pytest.raises(targets.NativeMismatch, match=r"compiled \('returns'"):
        TARGETS["produce_native"](produce_seed)
    with pytest.raises(targets.NativeMismatch, match="another message"):
        TARGETS["framing_native"](framing_seed)
    monkeypatch.setattr(targets, "_compiled", real)
    TARGETS["produce_native"](produce_seed)
    TARGETS["framing_native"](framing_seed)


# --- regressions: inputs the harness once crashed on ------------------------------------------


def _crashers() -> list[Any]:
    if not CRASHERS.is_dir():
        return []
    params = []
    for path in sorted(CRASHERS.glob("*.bin")):
        name = path.name.split("-", 1)[0]
        skip = name in FUZZ.NATIVE_TARGETS and FUZZ.COMPILED_MISSING
        marks = [pytest.mark.skip(reason=FUZZ.COMPILED_MISSING)] if skip else []
        params.append(pytest.param(name, path.read_bytes(), id=path.name, marks=marks))
    return params


@pytest.mark.parametrize(("name", "data"), _crashers())
def test_crasher_regressions(name: str, data: bytes) -> None:
    only_protocol_errors(name, data)
