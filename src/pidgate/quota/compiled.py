"""Which implementation of the Bloom filter's per-PID arithmetic runs: compiled, or pure.

Owns the choice for ``pidgate.quota`` (issue "native"), made once at import like
``pidgate.protocol.native``'s for the wire: ``pidgate.quota._bloomspeed``, built from its .pyx
by the normal install, unless it is missing (no C compiler when pip built pidgate) or
``PIDGATE_PURE_PYTHON`` is set to anything but ``""``/``0``. ``bloom`` and ``layered`` call it
where it runs; both paths give the same positions, lookups and bits (tests/quota/test_compiled.py).
Must not import: asyncio, socket, time, logging, structlog, prometheus_client, or any other
pidgate package.
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import Final

#: What the compiled module must define: a build from an older source (an in-place build left
#: behind by a checkout) lacks the newer names and is not used at all, rather than half.
REQUIRED_NAMES = ("universal_positions", "find", "set_positions", "admit_known", "admit_single")


def _choose() -> ModuleType | None:
    if os.environ.get("PIDGATE_PURE_PYTHON", "") not in ("", "0"):
        return None
    try:
        from pidgate.quota import _bloomspeed  # type: ignore[attr-defined]
    except ImportError:
        return None
    module: ModuleType = _bloomspeed
    if not all(hasattr(module, name) for name in REQUIRED_NAMES):
        return None
    return module


#: The compiled module, when it runs; None on the pure path.
bloomspeed: Final[ModuleType | None] = _choose()
