"""TLS for pidgate's listeners (terminated here) and towards the brokers (originated here),
independent of each other, plus certificate reload without restart.

Reload works by loading the new files into the *same* ``ssl.SSLContext`` the listeners use:
new handshakes get the new certificate, established connections keep theirs. A CA bundle is
added to, not replaced (OpenSSL offers no way to drop trusted CAs from a live context), so
removing a CA needs a restart.

Owns: ``client_ssl_context``, ``upstream_ssl_context``, ``CertificateReloader``.
"""

from __future__ import annotations

import os
import ssl
from pathlib import Path

from pidgate.config import ClientTlsSettings, UpstreamTlsSettings

_CLIENT_AUTH = {
    "none": ssl.CERT_NONE,
    "requested": ssl.CERT_OPTIONAL,
    "required": ssl.CERT_REQUIRED,
}


def _load_client_side(context: ssl.SSLContext, settings: ClientTlsSettings) -> None:
    assert settings.certfile is not None and settings.keyfile is not None
    context.load_cert_chain(settings.certfile, settings.keyfile)
    if settings.cafile is not None:
        context.load_verify_locations(cafile=str(settings.cafile))


def client_ssl_context(settings: ClientTlsSettings) -> ssl.SSLContext | None:
    """The server-side context for client listeners, or None for plaintext listeners."""
    if not settings.enabled:
        return None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    _load_client_side(context, settings)
    context.verify_mode = _CLIENT_AUTH[settings.client_auth]
    return context


def upstream_ssl_context(settings: UpstreamTlsSettings) -> ssl.SSLContext | None:
    """The client-side context for broker connections, or None for plaintext."""
    if not settings.enabled:
        return None
    context = ssl.create_default_context(
        ssl.Purpose.SERVER_AUTH, cafile=str(settings.cafile) if settings.cafile else None
    )
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    context.check_hostname = settings.check_hostname
    if settings.certfile is not None and settings.keyfile is not None:
        context.load_cert_chain(settings.certfile, settings.keyfile)
    return context


def _mtimes(paths: list[Path]) -> tuple[float, ...]:
    stamps = []
    for path in paths:
        try:
            stamps.append(os.stat(path).st_mtime)
        except OSError:
            stamps.append(-1.0)
    return tuple(stamps)


class CertificateReloader:
    """Reloads the client-side certificate files into the live context when they change."""

    def __init__(self, context: ssl.SSLContext, settings: ClientTlsSettings) -> None:
        self._context = context
        self._settings = settings
        self._paths = [p for p in (settings.certfile, settings.keyfile, settings.cafile) if p]
        self._stamps = _mtimes(self._paths)

    def reload_if_changed(self) -> bool:
        """True when new files were loaded; raises (ssl.SSLError, OSError) when they are bad,
        leaving the previous certificate in use."""
        stamps = _mtimes(self._paths)
        if stamps == self._stamps:
            return False
        _load_client_side(self._context, self._settings)
        self._stamps = stamps
        return True
