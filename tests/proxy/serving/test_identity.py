"""Who a connection is charged to, from its listener's security and what the broker accepted."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from pidgate.config import load_settings
from pidgate.protocol.sasl import SaslClaim
from pidgate.proxy.serving.identity import (
    ANONYMOUS_PRINCIPAL,
    IdentityPolicy,
    UnmappablePrincipalError,
)

# getpeercert() lists RDNs as in the certificate (most general first); DNs put CN first.
ALICE_CERT = {"subject": ((("organizationalUnitName", "clients"),), (("commonName", "alice"),))}


def policy(tmp_path: Path, **sections: Any) -> IdentityPolicy:
    for name in ("cert.pem", "key.pem", "ca.pem"):
        (tmp_path / name).write_text("placeholder")
    overrides: dict[str, Any] = {"proxy": {"upstream": ["127.0.0.1:9092"]}, **sections}
    return IdentityPolicy(load_settings(cli_overrides=overrides))


def tls(tmp_path: Path, **extra: Any) -> dict[str, Any]:
    return {
        "enabled": True,
        "certfile": str(tmp_path / "cert.pem"),
        "keyfile": str(tmp_path / "key.pem"),
        "cafile": str(tmp_path / "ca.pem"),
        **extra,
    }


def test_plaintext_is_anonymous(tmp_path: Path) -> None:
    assert policy(tmp_path).principal_for_connection(None) == ANONYMOUS_PRINCIPAL


def test_client_certificate_subject_is_mapped(tmp_path: Path) -> None:
    rules = "RULE:^CN=(.*?),OU=clients$/$1/U,DEFAULT"
    identity = policy(
        tmp_path,
        client_tls=tls(tmp_path, client_auth="required", principal_mapping_rules=rules),
    )
    assert identity.principal_for_connection(ALICE_CERT) == "User:ALICE"
    assert identity.principal_for_connection(None) == ANONYMOUS_PRINCIPAL  # no certificate


def test_a_subject_no_rule_maps_is_refused(tmp_path: Path) -> None:
    identity = policy(
        tmp_path,
        client_tls=tls(
            tmp_path, client_auth="required", principal_mapping_rules="RULE:^CN=bob$/bob/"
        ),
    )
    with pytest.raises(UnmappablePrincipalError):
        identity.principal_for_connection(ALICE_CERT)


def test_with_sasl_nobody_until_the_broker_accepts_then_the_observed_user(
    tmp_path: Path,
) -> None:
    identity = policy(
        tmp_path,
        identity={"sasl": True, "fallback_principal": "User:gssapi-users"},
        client_tls=tls(tmp_path, client_auth="required"),
    )
    # The certificate does not decide on a SASL_SSL listener; SASL does (as in Kafka).
    assert identity.principal_for_connection(ALICE_CERT) is None
    assert identity.new_sasl_observer() is not None
    assert identity.principal_for_sasl(SaslClaim("PLAIN", "carol")) == "User:carol"
    assert identity.principal_for_sasl(SaslClaim("GSSAPI", None)) == "User:gssapi-users"


def test_tls_settings_name_what_is_missing(tmp_path: Path) -> None:
    from pidgate.config import ConfigError

    with pytest.raises(ConfigError, match=r"client_tls\.certfile"):
        policy(tmp_path, client_tls={"enabled": True, "certfile": str(tmp_path / "nope.pem")})
    with pytest.raises(ConfigError, match="client_auth needs cafile"):
        policy(
            tmp_path,
            client_tls={**tls(tmp_path, client_auth="required"), "cafile": None},
        )
    with pytest.raises(ConfigError, match="principal_mapping_rules"):
        policy(tmp_path, client_tls={"principal_mapping_rules": "RULE:broken"})
