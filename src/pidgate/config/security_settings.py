"""The security sections of the settings tree: who pays for a connection's new PIDs
(``identity``: SASL, the fallback principal) and TLS on either side of pidgate (``client_tls``,
``upstream_tls``).

Owns: those section models and the certificate-file field type they share. Must not import:
``pidgate.config.settings`` (the root imports this), asyncio, socket, ssl, structlog,
prometheus_client, ``pidgate.proxy``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import AfterValidator, Field, field_validator, model_validator

from pidgate.config.principal_mapping import PrincipalMapper, PrincipalMappingError
from pidgate.config.sections import FrozenSection


def _must_exist(path: Path | None) -> Path | None:
    if path is not None and not path.is_file():
        raise ValueError(f"no such file: {path}")
    return path


#: A certificate, key or CA bundle (PEM) that must exist when given.
ExistingFile = Annotated[Path | None, AfterValidator(_must_exist)]


class IdentitySettings(FrozenSection):
    """Who pays for a connection's new PIDs (DESIGN.md "Identity"). pidgate never authenticates
    anyone: with SASL it observes the exchange and believes only the broker's verdict."""

    sasl: bool = Field(
        False,
        description="clients authenticate with SASL against the broker, through pidgate; the "
        "principal is the user the broker accepted (until then, Produce closes the connection)",
    )
    fallback_principal: str = Field(
        "User:UNIDENTIFIED",
        description="principal for a successful SASL exchange pidgate cannot read (GSSAPI, "
        "an unknown mechanism, an unreadable token)",
    )
    oauthbearer_principal_claim: str = Field(
        "sub", min_length=1, description="JWT claim that names the OAUTHBEARER principal"
    )

    @field_validator("fallback_principal")
    @classmethod
    def _is_a_principal(cls, value: str) -> str:
        kind, sep, name = value.partition(":")
        if not sep or not kind or not name:
            raise ValueError(f"expected a principal like User:NAME, got {value!r}")
        return value


class ClientTlsSettings(FrozenSection):
    """TLS terminated by pidgate on every client listener."""

    enabled: bool = Field(False, description="clients connect with TLS (SSL / SASL_SSL)")
    certfile: ExistingFile = Field(None, description="server certificate chain (PEM)")
    keyfile: ExistingFile = Field(None, description="server private key (PEM)")
    cafile: ExistingFile = Field(
        None, description="CA bundle (PEM) that client certificates chain to"
    )
    client_auth: Literal["none", "requested", "required"] = Field(
        "none",
        description="client certificates (ssl.client.auth); with one, and without SASL, the "
        "principal is User:<mapped certificate subject>",
    )
    principal_mapping_rules: str = Field(
        "DEFAULT",
        description="Kafka's ssl.principal.mapping.rules (KIP-371), applied to the subject DN",
    )
    reload_interval_ms: int = Field(
        30_000, ge=100, description="how often certificate files are checked for changes"
    )

    @field_validator("principal_mapping_rules")
    @classmethod
    def _rules_parse(cls, rules: str) -> str:
        try:
            PrincipalMapper.parse(rules)
        except PrincipalMappingError as error:
            raise ValueError(str(error)) from None
        return rules

    @model_validator(mode="after")
    def _complete(self) -> ClientTlsSettings:
        if self.enabled and (self.certfile is None or self.keyfile is None):
            raise ValueError("enabled needs certfile and keyfile")
        if self.enabled and self.client_auth != "none" and self.cafile is None:
            raise ValueError("client_auth needs cafile to verify client certificates")
        return self


class UpstreamTlsSettings(FrozenSection):
    """TLS from pidgate to the brokers (independent of the client side)."""

    enabled: bool = Field(False, description="connect to brokers with TLS")
    cafile: ExistingFile = Field(
        None, description="CA bundle for broker certificates; default: system CAs"
    )
    certfile: ExistingFile = Field(
        None, description="client certificate for brokers that require one"
    )
    keyfile: ExistingFile = Field(None, description="its private key")
    check_hostname: bool = Field(True, description="verify the broker certificate's host name")

    @model_validator(mode="after")
    def _pair(self) -> UpstreamTlsSettings:
        if (self.certfile is None) != (self.keyfile is None):
            raise ValueError("certfile and keyfile go together")
        return self
