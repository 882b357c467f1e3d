"""Ctrl-C (SIGINT) and SIGTERM for the demo: turned into an exception while it runs, ignored
while it cleans up.

Owns: ``StopSignal``, ``raise_stop_signal`` and ``stop_signals``. Standard library only; must
not import anything from pidgate.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Callable, Iterator
from typing import Any

_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


class StopSignal(KeyboardInterrupt):
    """Ctrl-C (SIGINT) or SIGTERM: stop the demo cleanly."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def raise_stop_signal(signum: int, _frame: object) -> None:
    raise StopSignal(signum)


@contextlib.contextmanager
def stop_signals(handler: Callable[[int, Any], None] | int) -> Iterator[None]:
    """SIGINT and SIGTERM handled by ``handler`` inside the block (main thread only; elsewhere
    Python cannot install handlers and the block runs as is). Installing the raising handler
    explicitly also makes Ctrl-C work when the demo was started with SIGINT ignored (a shell's
    background job); ``signal.SIG_IGN`` keeps a second Ctrl-C from cutting the bounded cleanup."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {signum: signal.signal(signum, handler) for signum in _STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)
