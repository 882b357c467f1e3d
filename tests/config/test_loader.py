"""Settings from file, environment and CLI: precedence, Kafka key names, and errors that name
the offending key."""

from __future__ import annotations

from pathlib import Path

import pytest

from pidgate.cli import build_parser
from pidgate.config import ConfigError, env_var_name, load_settings
from pidgate.config.loader import PROCESS_VARIABLES, service_link_variables
from pidgate.config.serve_flags import serve_overrides
from pidgate.protocol import native

UPSTREAM = {"proxy": {"upstream": ["127.0.0.1:9092"]}}


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "pidgate.yaml"
    path.write_text(text)
    return path


def test_defaults_follow_kip_936() -> None:
    settings = load_settings(cli_overrides=UPSTREAM)
    assert settings.quota.window_size_seconds == 3600
    assert settings.quota.window_num == 11
    assert settings.quota.false_positive_rate == 0.001
    assert settings.quota.default_producer_ids_rate is None  # unlimited until configured
    assert settings.proxy.mode == "gateway"
    assert str(settings.proxy.listen) == "127.0.0.1:9092"


def test_file_uses_kafka_key_names_and_user_default_entity(tmp_path: Path) -> None:
    config = write(
        tmp_path,
        """
proxy:
  upstream: [broker-1:9092, broker-2:9092]
  listen: 127.0.0.1:19092
quota:
  producer.id.quota.window.size.seconds: 600
  producer.id.quota.window.num: 6
  users:
    <default>: {producer_ids_rate: 100}
    alice: {producer_ids_rate: 5}
""",
    )
    settings = load_settings(config)
    assert [str(u) for u in settings.proxy.upstream] == ["broker-1:9092", "broker-2:9092"]
    assert settings.quota.window_ms == 600_000
    assert settings.quota.window_num == 6
    assert settings.quota.default_producer_ids_rate == 100
    assert settings.quota.user_producer_ids_rates == {"alice": 5}
    assert settings.proxy.effective_broker_port_base == 19093


def test_environment_overrides_file_and_cli_overrides_environment(tmp_path: Path) -> None:
    config = write(tmp_path, "proxy: {upstream: [a:1]}\nquota: {producer.id.quota.window.num: 3}\n")
    environ = {
        env_var_name("quota", "producer.id.quota.window.num"): "5",
        "PIDGATE_PROXY_UPSTREAM": "b:2,c:3",
    }
    assert environ.keys() >= {"PIDGATE_QUOTA_PRODUCER_ID_QUOTA_WINDOW_NUM"}
    settings = load_settings(config, environ)
    assert settings.quota.window_num == 5
    assert [str(u) for u in settings.proxy.upstream] == ["b:2", "c:3"]
    settings = load_settings(config, environ, {"quota": {"producer.id.quota.window.num": 7}})
    assert settings.quota.window_num == 7


def test_cli_flags_map_onto_settings() -> None:
    args = build_parser().parse_args(
        [
            "serve",
            "--upstream", "127.0.0.1:9092",
            "--listen", "127.0.0.1:29092",
            "--broker-port-base", "30000",
            "--default-producer-ids-rate", "50",
            "--producer-ids-rate", "ANONYMOUS=5",
            "--producer-ids-rate", "User:bob=7",
            "--quota-window-seconds", "10",
            "--quota-window-num", "2",
        ]
    )  # fmt: skip
    settings = load_settings(cli_overrides=serve_overrides(args))
    assert settings.proxy.broker_listen_port(111) == 30111
    assert settings.quota.default_producer_ids_rate == 50
    assert settings.quota.user_producer_ids_rates == {"ANONYMOUS": 5, "bob": 7}
    assert settings.quota.window_ms == 10_000
    assert settings.quota.window_num == 2


@pytest.mark.parametrize(
    ("overrides", "named"),
    [
        ({"proxy": {"upstream": ["nope"]}}, "proxy.upstream"),
        ({"proxy": {"upstream": ["a:1"], "listne": "x:1"}}, "proxy.listne: unknown key"),
        ({"proxy": {"upstream": ["a:1"]}, "quota": {"producer.id.quota.window.num": 0}},
         "quota.producer.id.quota.window.num"),
        ({"proxy": {"upstream": ["a:1"]}, "quota": {"users": {"bob": {"producer_ids_rate": -1}}}},
         "quota.users.bob.producer_ids_rate"),
        ({"proxy": {"upstream": ["a:1"]}, "rejection": {"error_codes": {"librdkafka": 19}}},
         "rejection.error_codes"),
        ({}, "at least one upstream broker"),
        ({"proxy": {"upstream": ["a:1", "b:2"], "mode": "sidecar"}}, "exactly one broker"),
        ({"proxy": {"upstream": ["a:1"], "listen": "0.0.0.0:9092"}}, "advertised_host"),
    ],
)  # fmt: skip
def test_bad_values_stop_startup_naming_the_key(overrides: dict[str, object], named: str) -> None:
    with pytest.raises(ConfigError) as raised:
        load_settings(cli_overrides=overrides)
    assert named in str(raised.value)


def test_bad_files_and_unknown_environment_variables_are_named(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read"):
        load_settings(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_settings(write(tmp_path, "proxy: [unclosed"))
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_settings(write(tmp_path, "- a\n- b\n"))
    with pytest.raises(ConfigError, match="PIDGATE_PROXY_LISTN is not a pidgate setting"):
        load_settings(environ={"PIDGATE_PROXY_LISTN": "x:1"}, cli_overrides=UPSTREAM)


def test_settings_are_immutable() -> None:
    settings = load_settings(cli_overrides=UPSTREAM)
    with pytest.raises(ValueError, match="frozen"):
        settings.proxy.mode = "sidecar"  # type: ignore[misc]


@pytest.mark.parametrize(
    "name",
    [
        "PIDGATE_PORT",
        "PIDGATE_PORT_9092_TCP",
        "PIDGATE_PORT_9092_TCP_PROTO",
        "PIDGATE_PORT_9092_TCP_PORT",
        "PIDGATE_PORT_9092_TCP_ADDR",
        "PIDGATE_SERVICE_HOST",
        "PIDGATE_SERVICE_PORT",
        "PIDGATE_SERVICE_PORT_PIDGATE_CLIENT",
        "PIDGATE_ADMIN_PORT",
        "PIDGATE_ADMIN_SERVICE_HOST",
        "PIDGATE_ADMIN_PORT_9404_TCP_ADDR",
    ],
)
def test_kubernetes_service_links_are_ignored_and_listed(name: str) -> None:
    """A Service named pidgate (or pidgate-admin) injects these into every pod of the
    namespace; they must not crash-loop the pod."""
    environ = {name: "tcp://10.96.0.12:9092", "PIDGATE_PROXY_LISTEN": "127.0.0.1:19092"}
    settings = load_settings(environ=environ, cli_overrides=UPSTREAM)
    assert str(settings.proxy.listen) == "127.0.0.1:19092"
    assert service_link_variables(environ) == [name]


def test_settings_are_never_taken_for_service_links() -> None:
    environ = {"PIDGATE_ADMIN_LISTEN": "127.0.0.1:1", "PIDGATE_PROXY_MODE": "gateway"}
    assert service_link_variables(environ) == []
    # Only the exact Kubernetes shapes are ignored; anything else unknown still stops start-up.
    for name in ("PIDGATE_PROXY_PORTS", "PIDGATE_PORT_TCP", "PIDGATE_SERVICE_HOSTNAME"):
        with pytest.raises(ConfigError, match=f"{name} is not a pidgate setting"):
            load_settings(environ={name: "1"}, cli_overrides=UPSTREAM)


def test_typos_get_a_did_you_mean(tmp_path: Path) -> None:
    with pytest.raises(
        ConfigError, match=r"PIDGATE_PROXY_LISTN .*did you mean PIDGATE_PROXY_LISTEN"
    ):
        load_settings(environ={"PIDGATE_PROXY_LISTN": "x:1"}, cli_overrides=UPSTREAM)
    config = write(tmp_path, "proxy: {upstream: [a:1], listne: 'x:1'}\nqouta: {}\n")
    with pytest.raises(ConfigError) as raised:
        load_settings(config)
    message = str(raised.value)
    assert (
        f"proxy.listne: unknown key (did you mean listen?) (from config file {config})" in message
    )
    assert "qouta: unknown key (did you mean quota?)" in message


def test_typos_in_nested_keys_get_a_did_you_mean_too(tmp_path: Path) -> None:
    """Below a section: a user's quota (a map of models) and a model inside a section."""
    config = write(
        tmp_path,
        "proxy: {upstream: [a:1]}\n"
        "quota: {users: {alice: {producer_id_rate: 5}, <default>: {producer_ids_rat: 1}}}\n",
    )
    with pytest.raises(ConfigError) as raised:
        load_settings(config)
    message = str(raised.value)
    assert (
        "quota.users.alice.producer_id_rate: unknown key (did you mean producer_ids_rate?) "
        f"(from config file {config})" in message
    )
    assert (
        "quota.users.<default>.producer_ids_rat: unknown key (did you mean producer_ids_rate?)"
        in (message)
    )
    # Nothing close: no guess.
    with pytest.raises(ConfigError) as raised:
        load_settings(cli_overrides={**UPSTREAM, "quota": {"users": {"bob": {"colour": 1}}}})
    assert "quota.users.bob.colour: unknown key (from the command line)" in str(raised.value)


def test_errors_name_where_the_value_came_from(tmp_path: Path) -> None:
    config = write(tmp_path, "proxy: {upstream: [a:1], mode: sidecars}\n")
    with pytest.raises(ConfigError, match=f"proxy.mode: .*from config file {config}"):
        load_settings(config)
    with pytest.raises(
        ConfigError, match=r"proxy.mode: .*from environment variable PIDGATE_PROXY_MODE"
    ):
        load_settings(config, {"PIDGATE_PROXY_MODE": "sidecars"})
    with pytest.raises(ConfigError, match=r"proxy.mode: .*from the command line"):
        load_settings(config, {}, {"proxy": {"mode": "sidecars"}})


def test_process_variables_are_not_settings_and_do_not_stop_start_up() -> None:
    """PIDGATE_PURE_PYTHON is read by pidgate.protocol.native at import, not by the settings:
    the loader lets it through (and still stops on a near miss)."""
    assert set(PROCESS_VARIABLES) == {native.PURE_PYTHON_ENV}
    environ = {native.PURE_PYTHON_ENV: "1", "PIDGATE_PROXY_LISTEN": "127.0.0.1:19092"}
    settings = load_settings(environ=environ, cli_overrides=UPSTREAM)
    assert str(settings.proxy.listen) == "127.0.0.1:19092"
    with pytest.raises(ConfigError, match="PIDGATE_PURE_PYTON is not a pidgate setting"):
        load_settings(environ={"PIDGATE_PURE_PYTON": "1"}, cli_overrides=UPSTREAM)
