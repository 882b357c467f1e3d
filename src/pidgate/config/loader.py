"""Builds the one ``Settings`` object from its sources: defaults < YAML file < ``PIDGATE_*``
environment variables < CLI flags. Any error stops start-up with a message naming the key.

Environment variable names are derived from the key path, so every key has one:
``PIDGATE_<SECTION>_<KEY>`` with dots turned into underscores, e.g. ``PIDGATE_PROXY_LISTEN``,
``PIDGATE_QUOTA_PRODUCER_ID_QUOTA_WINDOW_SIZE_SECONDS``. Values are read as YAML scalars, so
maps and lists can be given inline (``PIDGATE_QUOTA_USERS='{alice: {producer_ids_rate: 5}}'``).

Must not import: asyncio, socket, structlog, prometheus_client, ``pidgate.proxy``.
"""

from __future__ import annotations

import difflib
import re
import types
import typing
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from pidgate.config.settings import Settings

ENV_PREFIX = "PIDGATE_"

_UNIONS = (typing.Union, types.UnionType)

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


#: Kubernetes injects "service links" for every Service in the namespace: a Service named
#: ``pidgate`` gives ``PIDGATE_PORT=tcp://10.0.0.1:9092``, ``PIDGATE_SERVICE_HOST``,
#: ``PIDGATE_SERVICE_PORT[_<port name>]`` and ``PIDGATE_PORT_<n>_<PROTO>[_PROTO|_PORT|_ADDR]``;
#: a Service named ``pidgate-admin`` the same with ``PIDGATE_ADMIN_`` in front.
_SERVICE_LINK = re.compile(
    r"PIDGATE(?:_[A-Z0-9_]+?)?_(?:SERVICE_HOST|SERVICE_PORT(?:_[A-Z0-9_]+)?"
    r"|PORT(?:_[0-9]+_(?:TCP|UDP|SCTP)(?:_(?:PROTO|PORT|ADDR))?)?)"
)


#: ``PIDGATE_*`` variables that are not settings: read before any setting, by the module named.
PROCESS_VARIABLES = {
    "PIDGATE_PURE_PYTHON": "pidgate.protocol.native (forces the pure-Python data path)",
}


def is_service_link(name: str) -> bool:
    """``name`` has the shape of a Kubernetes service-link variable (and is no setting)."""
    return _SERVICE_LINK.fullmatch(name) is not None and name not in env_var_names()


def service_link_variables(environ: Mapping[str, str]) -> list[str]:
    """The ``PIDGATE_*`` variables that ``overrides_from_env`` ignores as Kubernetes service
    links, sorted, for one warning at start-up."""
    return sorted(name for name in environ if name.startswith(ENV_PREFIX) and is_service_link(name))


def _did_you_mean(word: str, choices: list[str] | set[str] | Mapping[str, Any]) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.75)
    return f" (did you mean {close[0]}?)" if close else ""


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
    """Settings from ``PIDGATE_*`` variables. An unknown one stops start-up (a typo must not
    pass silently), except Kubernetes service links (``service_link_variables``)."""
    known = env_var_names()
    overrides: dict[str, dict[str, Any]] = {}
    for name, raw in environ.items():
        if not name.startswith(ENV_PREFIX):
            continue
        if name not in known:
            if is_service_link(name) or name in PROCESS_VARIABLES:
                continue
            raise ConfigError(
                f"environment variable {name} is not a pidgate setting{_did_you_mean(name, known)}"
            )
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


def _model_at(annotation: Any) -> type[BaseModel] | None:
    """The settings model ``annotation`` names, through ``X | None``; else None."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation) if typing.get_origin(annotation) in _UNIONS else ():
        if isinstance(arg, type) and issubclass(arg, BaseModel):
            return arg
    return None


def _known_keys(loc: tuple[int | str, ...]) -> list[str]:
    """The keys valid where ``loc`` points (for "did you mean"), at any depth: model fields by
    name or alias; a map's or list's own key (``quota.users.alice``) stands for its values."""
    annotation: Any = Settings
    for part in loc[:-1]:
        model = _model_at(annotation)
        if model is not None:
            field = model.model_fields.get(str(part)) or next(
                (f for f in model.model_fields.values() if f.alias == part), None
            )
            if field is None:
                return []
            annotation = field.annotation
        elif typing.get_origin(annotation) in (dict, list):
            annotation = typing.get_args(annotation)[-1]
        else:
            return []
    model = _model_at(annotation)
    return _section_keys(model) if model is not None else []


def _source(loc: tuple[int | str, ...], sources: Mapping[tuple[str, str], str]) -> str:
    if len(loc) >= 2:
        where = sources.get((str(loc[0]), str(loc[1])))
        if where:
            return f" (from {where})"
    return ""


def _describe(error: ValidationError, sources: Mapping[tuple[str, str], str]) -> str:
    lines = []
    for detail in error.errors():
        loc = tuple(detail["loc"])
        key = ".".join(str(part) for part in loc) or "(top level)"
        message = detail["msg"]
        if detail["type"] == "extra_forbidden":
            message = "unknown key" + _did_you_mean(str(loc[-1]), _known_keys(loc))
        lines.append(f"  {key}: {message}{_source(loc, sources)}")
    return "invalid configuration:\n" + "\n".join(lines)


def _record_sources(
    sources: dict[tuple[str, str], str], data: Mapping[str, Any], where: str
) -> None:
    for section, keys in data.items():
        if isinstance(keys, Mapping):
            for key in keys:
                sources[(str(section), str(key))] = where


def load_settings(
    config_file: Path | None = None,
    environ: Mapping[str, str] | None = None,
    cli_overrides: Mapping[str, Any] | None = None,
) -> Settings:
    """Merge every source and validate once. Raise ConfigError with every bad key named."""
    sources: dict[tuple[str, str], str] = {}
    data: dict[str, Any] = read_config_file(config_file) if config_file else {}
    _record_sources(sources, data, f"config file {config_file}")
    from_env = overrides_from_env(environ or {})
    for section, keys in from_env.items():
        for key in keys:
            sources[(section, key)] = f"environment variable {env_var_name(section, key)}"
    data = merge(data, from_env)
    _record_sources(sources, cli_overrides or {}, "the command line")
    data = merge(data, cli_overrides or {})
    try:
        return Settings.model_validate(data)
    except ValidationError as error:
        raise ConfigError(_describe(error, sources)) from None
