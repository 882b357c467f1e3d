"""Who a client connection is charged to (DESIGN.md "Identity").

- PLAINTEXT, or TLS without a client certificate: ``User:ANONYMOUS``, as Kafka names it.
- TLS with a client certificate (and no SASL): ``User:<subject DN mapped through
  ssl.principal.mapping.rules>`` (KIP-371).
- SASL (over PLAINTEXT or TLS): nobody until the broker says the exchange pidgate observed
  succeeded; then ``User:<the user of that exchange>``, or the configured fallback principal
  when pidgate cannot read the mechanism (GSSAPI, unknown ones, unreadable tokens).

pidgate never authenticates anyone itself, so a client can never be charged to, or hide
behind, a name the broker did not accept. Owns: ``IdentityPolicy``. Credentials never pass
through here: only user names.
"""

from __future__ import annotations

from typing import Any

from pidgate.config import Settings
from pidgate.config.principal_mapping import (
    PrincipalMapper,
    PrincipalMappingError,
    distinguished_name,
)
from pidgate.protocol.sasl import SaslClaim, SaslObserver

ANONYMOUS_PRINCIPAL = "User:ANONYMOUS"


class UnmappablePrincipalError(Exception):
    """The client certificate's subject matches no mapping rule: Kafka fails authentication."""


class IdentityPolicy:
    def __init__(self, settings: Settings) -> None:
        self._sasl = settings.identity.sasl
        self._fallback = settings.identity.fallback_principal
        self._claim = settings.identity.oauthbearer_principal_claim
        tls = settings.client_tls
        self._use_certificates = tls.enabled and tls.client_auth != "none" and not self._sasl
        self._mapper = PrincipalMapper.parse(tls.principal_mapping_rules)

    @property
    def uses_sasl(self) -> bool:
        return self._sasl

    def new_sasl_observer(self) -> SaslObserver | None:
        return SaslObserver(self._claim) if self._sasl else None

    def principal_for_connection(self, peer_certificate: dict[str, Any] | None) -> str | None:
        """The principal a new connection starts with; None means "not yet: SASL decides"."""
        if self._sasl:
            return None
        if self._use_certificates and peer_certificate and peer_certificate.get("subject"):
            subject = distinguished_name(peer_certificate["subject"])
            try:
                return "User:" + self._mapper.map(subject)
            except PrincipalMappingError as error:
                raise UnmappablePrincipalError(str(error)) from None
        return ANONYMOUS_PRINCIPAL

    def principal_for_sasl(self, claim: SaslClaim) -> str:
        return f"User:{claim.user}" if claim.user else self._fallback
