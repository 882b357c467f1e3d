"""Kafka client configuration files (``--command-config client.properties``), as Kafka's own
tools read them, turned into kafka-python client settings for ``pidgate quotas``.

Understood keys: ``security.protocol``, ``sasl.mechanism``, ``sasl.jaas.config`` (PlainLoginModule
and ScramLoginModule: ``username`` / ``password``), ``sasl.kerberos.service.name``,
``ssl.truststore.location`` / ``ssl.keystore.location`` of ``type=PEM`` (kafka-python reads PEM
files only: JKS and PKCS12 stores are refused with the conversion to do), ``ssl.key.password``,
``ssl.endpoint.identification.algorithm`` (empty = no host name check). Other keys are reported
back as ignored, as Kafka's tools warn about unknown configs.

Owns: ``read_client_properties``, ``parse_properties``, ``client_settings``. Never prints or
logs a value: passwords pass through.

Must not import: asyncio, socket, structlog, prometheus_client, ``pidgate.proxy``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

__all__ = [
    "ClientPropertiesError",
    "ClientSettings",
    "client_settings",
    "parse_properties",
    "read_client_properties",
]

_PROTOCOLS = ("PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL")
_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512", "GSSAPI", "OAUTHBEARER")
_JAAS_OPTION = re.compile(r'(\w[\w.-]*)\s*=\s*(?:"((?:[^"\\]|\\.)*)"|([^\s;]+))')
_KNOWN = frozenset(
    {
        "security.protocol",
        "sasl.mechanism",
        "sasl.jaas.config",
        "sasl.kerberos.service.name",
        "ssl.truststore.location",
        "ssl.truststore.type",
        "ssl.keystore.location",
        "ssl.keystore.type",
        "ssl.key.password",
        "ssl.keystore.password",
        "ssl.truststore.password",
        "ssl.endpoint.identification.algorithm",
    }
)


class ClientPropertiesError(Exception):
    """The client configuration cannot be used; the message names the file and key."""


@dataclass(frozen=True)
class ClientSettings:
    #: kafka-python client keyword arguments (security_protocol, sasl_*, ssl_*).
    kafka_python: dict[str, Any] = field(default_factory=dict)
    #: Keys present in the file that pidgate does not use.
    ignored: tuple[str, ...] = ()


def parse_properties(text: str) -> dict[str, str]:
    """Java ``.properties`` syntax: ``key=value`` or ``key: value`` or ``key value``, ``#`` and
    ``!`` comments, a trailing backslash continues the line, ``\\`` escapes."""
    logical: list[str] = []
    pending = ""
    for raw in text.splitlines():
        line = raw.lstrip()
        if not pending and (not line or line[0] in "#!"):
            continue
        trailing = len(line) - len(line.rstrip("\\"))
        if trailing % 2 == 1:
            pending += line[:-1]
            continue
        logical.append(pending + line)
        pending = ""
    if pending:
        logical.append(pending)
    properties: dict[str, str] = {}
    for line in logical:
        match = re.match(r"((?:[^\\:=\s]|\\.)*)\s*[:=\s]\s*(.*)$", line)
        key, value = (match.group(1), match.group(2)) if match else (line, "")
        properties[_unescape(key)] = _unescape(value.rstrip())
    return properties


def _unescape(text: str) -> str:
    return re.sub(r"\\(.)", lambda m: {"t": "\t", "n": "\n", "r": "\r"}.get(m[1], m[1]), text)


def _jaas_options(source: str, jaas: str) -> dict[str, str]:
    options = {}
    for match in _JAAS_OPTION.finditer(jaas):
        value = match.group(2) if match.group(2) is not None else match.group(3)
        options[match.group(1)] = re.sub(r"\\(.)", r"\1", value)
    if not options.get("username") or "password" not in options:
        raise ClientPropertiesError(
            f'{source}: sasl.jaas.config needs username="..." password="..." '
            "(PlainLoginModule or ScramLoginModule)"
        )
    return options


def _pem_store(source: str, properties: dict[str, str], store: str) -> str | None:
    location = properties.get(f"ssl.{store}.location")
    if not location:
        return None
    kind = properties.get(f"ssl.{store}.type", "JKS").upper()
    if kind != "PEM":
        raise ClientPropertiesError(
            f"{source}: ssl.{store}.type is {kind}, but pidgate reads PEM files only: convert "
            f"the store (keytool -importkeystore ... -deststoretype PKCS12, then openssl pkcs12 "
            f"-nodes) and set ssl.{store}.type=PEM"
        )
    if not Path(location).is_file():
        raise ClientPropertiesError(f"{source}: ssl.{store}.location: no such file: {location}")
    return location


def client_settings(properties: dict[str, str], source: str = "client config") -> ClientSettings:
    """kafka-python settings for ``properties`` (Kafka's key names)."""
    settings: dict[str, Any] = {}
    protocol = properties.get("security.protocol", "PLAINTEXT").upper()
    if protocol not in _PROTOCOLS:
        raise ClientPropertiesError(
            f"{source}: security.protocol must be one of {', '.join(_PROTOCOLS)}, got {protocol}"
        )
    settings["security_protocol"] = protocol
    if protocol.startswith("SASL_"):
        mechanism = properties.get("sasl.mechanism", "GSSAPI").upper()
        if mechanism not in _MECHANISMS:
            raise ClientPropertiesError(
                f"{source}: sasl.mechanism must be one of {', '.join(_MECHANISMS)}, got {mechanism}"
            )
        settings["sasl_mechanism"] = mechanism
        if mechanism in ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"):
            jaas = properties.get("sasl.jaas.config")
            if not jaas:
                raise ClientPropertiesError(
                    f"{source}: sasl.mechanism {mechanism} needs "
                    "sasl.jaas.config with username and password"
                )
            options = _jaas_options(source, jaas)
            settings["sasl_plain_username"] = options["username"]
            settings["sasl_plain_password"] = options["password"]
        elif mechanism == "GSSAPI":
            settings["sasl_kerberos_service_name"] = properties.get(
                "sasl.kerberos.service.name", "kafka"
            )
        else:
            raise ClientPropertiesError(
                f"{source}: sasl.mechanism OAUTHBEARER needs a token provider; pidgate quotas "
                "does not support it (use a PLAIN or SCRAM user, or the Java AdminClient)"
            )
    if protocol.endswith("SSL"):
        cafile = _pem_store(source, properties, "truststore")
        if cafile:
            settings["ssl_cafile"] = cafile
        certfile = _pem_store(source, properties, "keystore")
        if certfile:
            settings["ssl_certfile"] = certfile  # key and chain in one PEM file, as Kafka's
            password = properties.get("ssl.key.password")
            if password:
                settings["ssl_password"] = password
        if properties.get("ssl.endpoint.identification.algorithm", "https") == "":
            settings["ssl_check_hostname"] = False
    ignored = tuple(sorted(key for key in properties if key not in _KNOWN))
    return ClientSettings(kafka_python=settings, ignored=ignored)


def read_client_properties(path: Path) -> ClientSettings:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise ClientPropertiesError(f"{path}: cannot read it: {error.strerror}") from None
    return client_settings(parse_properties(text), str(path))
