"""Settings from file, environment and CLI: precedence, Kafka key names, and errors that name
the offending key."""

from __future__ import annotations

from pathlib import Path

import pytest

from pidgate.cli import build_parser, serve_overrides
from pidgate.config import ConfigError, env_var_name, load_settings

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
