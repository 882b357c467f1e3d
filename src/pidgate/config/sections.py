"""What every settings section is built from: the frozen, strict base model, and the
``HOST:PORT`` field type the listener sections share.

Owns: :class:`FrozenSection`, :data:`ListenAddress`, :func:`host_port_from_text`. Must not
import: the settings sections (they import this), asyncio, socket, structlog,
prometheus_client, ``pidgate.proxy``.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, BeforeValidator, ConfigDict

from pidgate.config.addresses import HostPort, parse_host_port


class FrozenSection(BaseModel):
    """A settings section: immutable, unknown keys refused, fields settable by name or alias."""

    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)


def host_port_from_text(value: object) -> object:
    """``HOST:PORT`` text as a :class:`HostPort`; anything else as it is, for pydantic to judge."""
    return parse_host_port(value) if isinstance(value, str) else value


#: A listener's address, written ``HOST:PORT`` (or as a host/port mapping).
ListenAddress = Annotated[HostPort, BeforeValidator(host_port_from_text)]
