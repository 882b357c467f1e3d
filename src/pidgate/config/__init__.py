"""One validated, immutable settings tree, built once in ``main()`` from a YAML file,
``PIDGATE_*`` environment variables and CLI flags (later sources win).

Modules: ``settings`` (the root and most sections), ``rejection_settings`` and
``security_settings`` (sections with a module of their own), ``sections`` (their base model and
shared field types), ``loader`` (sources merged and validated), ``reference`` (the README's
table), ``serve_flags`` (``pidgate serve``'s flags as settings), ``command_table`` (command
lines declared as rows), ``addresses``, ``principal_mapping``, ``client_properties``.

The bottom layer: may import pydantic, yaml and the standard library, nothing else of pidgate.
Must not import: asyncio, socket, structlog, prometheus_client, or ``pidgate.proxy``.
"""

from pidgate.config.addresses import HostPort, parse_host_port
from pidgate.config.loader import ConfigError, env_var_name, load_settings
from pidgate.config.rejection_settings import RejectionSettings
from pidgate.config.security_settings import (
    ClientTlsSettings,
    IdentitySettings,
    UpstreamTlsSettings,
)
from pidgate.config.settings import (
    DEFAULT_USER_ENTITY,
    AdminSettings,
    LoggingSettings,
    ProxySettings,
    QuotaSettings,
    Settings,
    StateSettings,
    UserQuota,
)

__all__ = [
    "DEFAULT_USER_ENTITY",
    "AdminSettings",
    "ClientTlsSettings",
    "ConfigError",
    "HostPort",
    "IdentitySettings",
    "LoggingSettings",
    "ProxySettings",
    "QuotaSettings",
    "RejectionSettings",
    "Settings",
    "StateSettings",
    "UpstreamTlsSettings",
    "UserQuota",
    "env_var_name",
    "load_settings",
    "parse_host_port",
]
