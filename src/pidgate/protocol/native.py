"""Which implementation of the per-request primitives runs: compiled, or pure Python.

Owns the choice (issue "native"): ``pidgate.protocol._speedups``, compiled from its .pyx by the
normal install, unless it is missing (no C compiler when pip built pidgate) or the environment
variable ``PIDGATE_PURE_PYTHON`` is set to anything but ``""``/``0``. ``framing`` and
``produce`` bind their public names to the chosen functions at import; ``DATA_PATH`` and
``PURE_REASON`` say which runs and why (``pidgate serve`` logs them once at start: logging is not
this package's). Both paths give the same results and the same errors
(tests/protocol/test_native.py). Must not import: asyncio, socket, time, logging, structlog,
prometheus_client, or any pidgate package outside ``pidgate.protocol``.
"""

from __future__ import annotations

import os
from types import ModuleType
from typing import Final, Literal

PURE_PYTHON_ENV: Final = "PIDGATE_PURE_PYTHON"


def _choose() -> tuple[ModuleType | None, str | None]:
    forced = os.environ.get(PURE_PYTHON_ENV, "")
    if forced not in ("", "0"):
        return None, f"{PURE_PYTHON_ENV}={forced} is set"
    try:
        from pidgate.protocol import _speedups  # type: ignore[attr-defined]
    except ImportError as error:
        return None, (
            f"the compiled module pidgate.protocol._speedups is not built ({error}); "
            "reinstall pidgate where a C compiler is available (Debian: apt-get install gcc "
            "python3-dev) for the compiled path"
        )
    return _speedups, None


_CHOICE = _choose()
#: The compiled module, when it runs; None on the pure path.
compiled: Final[ModuleType | None] = _CHOICE[0]
#: Why the pure path runs (None when the compiled one does).
PURE_REASON: Final[str | None] = _CHOICE[1]
DATA_PATH: Final[Literal["compiled", "pure"]] = "compiled" if compiled is not None else "pure"
