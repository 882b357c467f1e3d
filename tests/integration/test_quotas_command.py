"""``pidgate quotas describe | set | delete`` against a real pidgate: in front of a real tansu
broker (PLAINTEXT, and TLS terminated by pidgate), and in front of the scripted SASL broker of
sasl_broker.py for SASL (tansu has no SASL; the scripted peer authenticates PLAIN and SCRAM the
way Kafka does). tansu lacks the client-quota APIs, so pidgate answers them alone here; the
describe lines are the ones kafka-configs prints (its Scala/Java ConfigCommand format)."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from pidgate.cli import main
from pidgate.config import LoggingSettings, load_settings
from pidgate.demo.broker import TANSU_NODE_ID, EmbeddedBroker, free_port
from pidgate.proxy.background import BackgroundProxy
from pidgate.proxy.logs import configure_logging
from tests.integration.certs import make_pki
from tests.integration.sasl_broker import ScriptedSaslBroker

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def _logs_to_stderr() -> None:
    """The in-process pidgate logs to stderr as in production, so stdout is the command's."""
    configure_logging(LoggingSettings(format="json"))


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["quotas", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def rates(proxy: BackgroundProxy) -> dict[str, int]:
    return proxy.call_and_wait(proxy.server.quota_control.effective_rates)


def test_set_describe_delete_through_pidgate_in_front_of_tansu(
    start_proxy: Callable[..., BackgroundProxy], capsys: pytest.CaptureFixture[str]
) -> None:
    proxy = start_proxy(quota={"users": {"<default>": {"producer_ids_rate": 7}}})
    server = ["--bootstrap-server", proxy.bootstrap]

    assert run(capsys, "describe", *server)[:2] == (
        0,
        "Quota configs for the default user-principal are producer_ids_rate=7\n",
    )
    assert run(capsys, "set", *server, "--user", "alice", "--producer-ids-rate", "50")[:2] == (
        0,
        "Completed updating config for user alice.\n",
    )
    assert rates(proxy) == {"<default>": 7, "alice": 50}
    assert run(capsys, "describe", *server)[1] == (
        "Quota configs for the default user-principal are producer_ids_rate=7\n"
        "Quota configs for user-principal 'alice' are producer_ids_rate=50\n"
    )
    assert run(capsys, "describe", *server, "--user", "User:alice")[1] == (
        "Quota configs for user-principal 'alice' are producer_ids_rate=50\n"
    )
    assert run(capsys, "describe", *server, "--user", "bob")[:2] == (0, "")
    assert run(capsys, "delete", *server, "--default")[:2] == (
        0,
        "Completed updating default config for users in the cluster.\n",
    )
    assert rates(proxy) == {"alice": 50}
    assert run(capsys, "set", *server, "--default", "--producer-ids-rate", "0")[0] == 0
    assert rates(proxy) == {"alice": 50, "<default>": 0}

    # A value pidgate refuses comes back as Kafka's error, exit code 1.
    code, _, err = run(capsys, "set", *server, "--user", "alice", "--producer-ids-rate", "-3")
    assert code == 1
    assert "AlterClientQuotas failed with" in err and "(42)" in err
    assert rates(proxy)["alice"] == 50


def test_the_command_as_a_process(start_proxy: Callable[..., BackgroundProxy]) -> None:
    proxy = start_proxy(quota={"users": {"carol": {"producer_ids_rate": 3}}})
    done = subprocess.run(
        [sys.executable, "-m", "pidgate", "quotas", "describe", "--bootstrap-server",
         proxy.bootstrap],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout == "Quota configs for user-principal 'carol' are producer_ids_rate=3\n"


def test_unreachable_and_bad_client_config_fail_clearly(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    dead = f"127.0.0.1:{free_port()}"
    code, _, err = run(capsys, "describe", "--bootstrap-server", dead, "--timeout-ms", "2000")
    assert code == 1 and f"cannot reach {dead}" in err
    # The exception is named once: kafka-python's str() already starts with its class name.
    reason = err.split(f"cannot reach {dead}: ", 1)[1]
    name = reason.split(":", 1)[0].strip()
    assert reason.count(name) == 1, err
    config = tmp_path / "client.properties"
    config.write_text("security.protocol=SSL\nssl.truststore.location=/x.jks\n")
    code, _, err = run(
        capsys, "describe", "--bootstrap-server", dead, "--command-config", str(config)
    )
    assert code == 2 and "ssl.truststore.type is JKS" in err and str(config) in err


@pytest.fixture
def tls_proxy(broker: EmbeddedBroker, tmp_path: Path) -> Iterator[tuple[BackgroundProxy, Path]]:
    pki = make_pki(tmp_path / "pki", [])
    settings = load_settings(
        cli_overrides={
            "proxy": {
                "upstream": [broker.bootstrap],
                "listen": f"127.0.0.1:{free_port()}",
                "broker_ports": {TANSU_NODE_ID: free_port()},
            },
            "quota": {"users": {"<default>": {"producer_ids_rate": 4}}},
            "admin": {"enabled": False},
            "client_tls": {
                "enabled": True,
                "certfile": str(pki.server_cert),
                "keyfile": str(pki.server_key),
            },
            "logging": {"format": "json"},
        }
    )
    with BackgroundProxy(settings) as proxy:
        yield proxy, pki.ca_cert


def test_tls_with_a_pem_truststore(
    tls_proxy: tuple[BackgroundProxy, Path], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    proxy, ca_cert = tls_proxy
    config = tmp_path / "client.properties"
    config.write_text(
        "# as for kafka-configs --command-config\n"
        "security.protocol=SSL\n"
        f"ssl.truststore.location={ca_cert}\n"
        "ssl.truststore.type=PEM\n"
        "client.id=ops\n"
    )
    args = ["--bootstrap-server", proxy.bootstrap, "--command-config", str(config)]
    code, _, err = run(capsys, "set", *args, "--user", "dave", "--producer-ids-rate", "9")
    assert code == 0, err
    assert "ignoring client.id" in err
    assert run(capsys, "describe", *args, "--user", "dave")[1] == (
        "Quota configs for user-principal 'dave' are producer_ids_rate=9\n"
    )
    # Without the truststore the server certificate is not trusted: no quota is changed.
    plain = tmp_path / "plain.properties"
    plain.write_text("security.protocol=SSL\n")
    code, _, _ = run(
        capsys, "delete", "--bootstrap-server", proxy.bootstrap, "--command-config", str(plain),
        "--user", "dave", "--timeout-ms", "3000",
    )  # fmt: skip
    assert code == 1
    assert rates(proxy) == {"<default>": 4, "dave": 9}


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
def test_sasl_through_a_pidgate_observing_sasl(
    mechanism: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with ScriptedSaslBroker(users={"admin": "s3cret;x"}) as sasl_broker:
        settings = load_settings(
            cli_overrides={
                "proxy": {
                    "upstream": [sasl_broker.bootstrap],
                    "listen": f"127.0.0.1:{free_port()}",
                    "broker_ports": {sasl_broker.node_id: free_port()},
                },
                "identity": {"sasl": True},
                "admin": {"enabled": False},
                "logging": {"format": "json"},
            }
        )
        with BackgroundProxy(settings) as proxy:
            module = "plain.PlainLoginModule" if mechanism == "PLAIN" else "scram.ScramLoginModule"
            config = tmp_path / "client.properties"
            config.write_text(
                "security.protocol=SASL_PLAINTEXT\n"
                f"sasl.mechanism={mechanism}\n"
                f"sasl.jaas.config=org.apache.kafka.common.security.{module} required \\\n"
                '    username="admin" password="s3cret;x";\n'
            )
            args = ["--bootstrap-server", proxy.bootstrap, "--command-config", str(config)]
            code, _, err = run(capsys, "set", *args, "--default", "--producer-ids-rate", "12")
            assert code == 0, err
            assert rates(proxy) == {"<default>": 12}
            assert run(capsys, "describe", *args)[1] == (
                "Quota configs for the default user-principal are producer_ids_rate=12\n"
            )
            # A wrong password: the broker refuses, nothing changes.
            config.write_text(config.read_text().replace("s3cret;x", "wrong"))
            code, _, _ = run(capsys, "delete", *args, "--default", "--timeout-ms", "3000")
            assert code == 1
            assert rates(proxy) == {"<default>": 12}


def test_each_node_goes_through_every_listener_metadata_names(
    start_proxy: Callable[..., BackgroundProxy], capsys: pytest.CaptureFixture[str]
) -> None:
    """--each-node: one AlterClientQuotas per node in the (rewritten) metadata. In sidecar mode
    those are the fleet's pidgates; one tansu broker makes no fleet, so this checks the path
    through the gateway's per-broker listener (node 111)."""
    proxy = start_proxy()
    code, out, err = run(
        capsys, "set", "--bootstrap-server", proxy.bootstrap, "--each-node", "--user", "erin",
        "--producer-ids-rate", "6",
    )  # fmt: skip
    assert code == 0, err
    assert out == f"node {TANSU_NODE_ID}: done\nCompleted updating config for user erin.\n"
    assert rates(proxy) == {"erin": 6}
