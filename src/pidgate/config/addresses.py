"""``HOST:PORT`` values: parsing and the frozen model settings use for them.

Must not import: asyncio, socket, structlog, prometheus_client, ``pidgate.proxy``.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field


class HostPort(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    host: str
    port: Annotated[int, Field(ge=0, le=65535)]

    def __str__(self) -> str:
        return f"[{self.host}]:{self.port}" if ":" in self.host else f"{self.host}:{self.port}"


def parse_host_port(text: object) -> HostPort:
    """Parse ``host:port`` or ``[v6]:port``; raise ValueError naming the bad value."""
    if not isinstance(text, str):
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    value = text.strip()
    if value.startswith("["):
        host, sep, port_text = value[1:].partition("]:")
    else:
        host, sep, port_text = value.rpartition(":")
    if not sep or not host or not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ValueError(f"expected HOST:PORT, got {text!r}")
    return HostPort(host=host, port=int(port_text))
