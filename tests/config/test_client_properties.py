"""Kafka client .properties files (``--command-config``) read as Kafka's tools read them."""

from __future__ import annotations

from pathlib import Path

import pytest

from pidgate.config.client_properties import (
    ClientPropertiesError,
    client_settings,
    parse_properties,
    read_client_properties,
)


def test_java_properties_syntax() -> None:
    text = (
        "# comment\n! also a comment\n\n"
        "security.protocol = SASL_SSL\n"
        "sasl.mechanism:SCRAM-SHA-512\n"
        "sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required \\\n"
        '    username="ops" \\\n'
        '    password="a b=c;d";\n'
        "key\\ with\\ spaces=v\n"
    )
    properties = parse_properties(text)
    assert properties["security.protocol"] == "SASL_SSL"
    assert properties["sasl.mechanism"] == "SCRAM-SHA-512"
    assert properties["sasl.jaas.config"].endswith('username="ops" password="a b=c;d";')
    assert properties["key with spaces"] == "v"


def test_sasl_and_pem_tls_map_onto_kafka_python(tmp_path: Path) -> None:
    ca = tmp_path / "ca.pem"
    ca.write_text("pem")
    client = client_settings(
        {
            "security.protocol": "SASL_SSL",
            "sasl.mechanism": "SCRAM-SHA-256",
            "sasl.jaas.config": "org.apache.kafka.common.security.scram.ScramLoginModule "
            'required username="ops" password="p w";',
            "ssl.truststore.location": str(ca),
            "ssl.truststore.type": "PEM",
            "ssl.endpoint.identification.algorithm": "",
            "client.id": "x",
        }
    )
    assert client.kafka_python == {
        "security_protocol": "SASL_SSL",
        "sasl_mechanism": "SCRAM-SHA-256",
        "sasl_plain_username": "ops",
        "sasl_plain_password": "p w",
        "ssl_cafile": str(ca),
        "ssl_check_hostname": False,
    }
    assert client.ignored == ("client.id",)
    assert client_settings({}).kafka_python == {"security_protocol": "PLAINTEXT"}


@pytest.mark.parametrize(
    ("properties", "message"),
    [
        ({"security.protocol": "TLS"}, "security.protocol must be one of"),
        ({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN"}, "needs sasl.jaas"),
        (
            {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
             "sasl.jaas.config": "PlainLoginModule required username=\"x\";"},
            "username=",
        ),
        ({"security.protocol": "SSL", "ssl.truststore.location": "/t.jks"}, "type is JKS"),
        (
            {"security.protocol": "SSL", "ssl.truststore.location": "/nope.pem",
             "ssl.truststore.type": "PEM"},
            "no such file",
        ),
        ({"security.protocol": "SASL_SSL", "sasl.mechanism": "OAUTHBEARER"}, "OAUTHBEARER"),
    ],
)  # fmt: skip
def test_unusable_configs_name_the_file_and_key(properties: dict[str, str], message: str) -> None:
    with pytest.raises(ClientPropertiesError, match=message) as raised:
        client_settings(properties, "client.properties")
    assert str(raised.value).startswith("client.properties: ")


def test_unreadable_file_is_named(tmp_path: Path) -> None:
    with pytest.raises(ClientPropertiesError, match=r"missing\.properties: cannot read"):
        read_client_properties(tmp_path / "missing.properties")
