"""Builds the one ``Settings`` object from its sources: defaults < YAML file < ``PIDGATE_*``
environment variables < CLI flags. Any error stops start-up with a message naming the key.

Environment variable names are derived from the key path, so every key has one:
``PIDGATE_<SECTION>_<KEY>`` with dots turned into underscores, e.g. ``PIDGATE_PROXY_LISTEN``,
``PIDGATE_QUOTA_PRODUCER_ID_QUOTA_WINDOW_SIZE_SECONDS``. Values are read as YAML scalars, so
maps and lists can be given inline (``PIDGATE_QUOTA_USERS='{alice: {producer_ids_rate: 5}}'``).

Must not import: asyncio, socket, structlog, prometheus_client, ``pidgate.proxy``.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from pidgate.config.settings import Settings

ENV_PREFIX = "PIDGATE_"

#: Keys whose values are host names / addresses: read verbatim, never as YAML (YAML 1.1 would
#: read some ``a:b`` strings as base-60 numbers).
_VERBATIM_KEYS = frozenset(
    {
        "listen",
        "upstream",
        "advertised_host",
        "certfile",
        "keyfile",
        "cafile",
        "principal_mapping_rules",
    }
)


class ConfigError(Exception):
    """The configuration cannot be used; the message names every offending key."""


def env_var_name(section: str, key: str) -> str:
    return ENV_PREFIX + f"{section}_{key}".upper().replace(".", "_")


def _section_keys(model: type[BaseModel]) -> list[str]:
    return [field.alias or name for name, field in model.model_fields.items()]


def env_var_names() -> dict[str, tuple[str, str]]:
    """Every recognised environment variable -> (section, key)."""
    names: dict[str, tuple[str, str]] = {}
    for section, field in Settings.model_fields.items():
        annotation = field.annotation
        assert isinstance(annotation, type) and issubclass(annotation, BaseModel)
        for key in _section_keys(annotation):
            names[env_var_name(section, key)] = (section, key)
    return names


def read_config_file(path: Path) -> dict[str, Any]:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as error:
        raise ConfigError(f"config file {path}: cannot read it: {error.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ConfigError(f"config file {path}: not valid YAML: {error}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {path}: the top level must be a mapping of sections")
    return data


def overrides_from_env(environ: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    known = env_var_names()
    overrides: dict[str, dict[str, Any]] = {}
    for name, raw in environ.items():
        if not name.startswith(ENV_PREFIX):
            continue
        if name not in known:
            raise ConfigError(f"environment variable {name} is not a pidgate setting")
        section, key = known[name]
        try:
            value = raw if key in _VERBATIM_KEYS else yaml.safe_load(raw)
        except yaml.YAMLError as error:
            raise ConfigError(f"environment variable {name}: not a valid value: {error}") from None
        overrides.setdefault(section, {})[key] = value
    return overrides


def merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Deep-merge two nested dicts; ``override`` wins, nested mappings merge key by key."""
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def _describe(error: ValidationError) -> str:
    lines = []
    for detail in error.errors():
        key = ".".join(str(part) for part in detail["loc"]) or "(top level)"
        message = detail["msg"]
        if detail["type"] == "extra_forbidden":
            message = "unknown key"
        lines.append(f"  {key}: {message}")
    return "invalid configuration:\n" + "\n".join(lines)


def load_settings(
    config_file: Path | None = None,
    environ: Mapping[str, str] | None = None,
    cli_overrides: Mapping[str, Any] | None = None,
) -> Settings:
    """Merge every source and validate once. Raise ConfigError with every bad key named."""
    data: dict[str, Any] = read_config_file(config_file) if config_file else {}
    data = merge(data, overrides_from_env(environ or {}))
    data = merge(data, cli_overrides or {})
    try:
        return Settings.model_validate(data)
    except ValidationError as error:
        raise ConfigError(_describe(error)) from None
