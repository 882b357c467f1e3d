"""The configuration reference (every key, its environment variable, default and meaning),
generated from the settings models so the README cannot drift from the code
(tests/config/test_reference.py checks the README holds exactly this table).

Must not import: asyncio, socket, structlog, prometheus_client, ``pidgate.proxy``.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from pidgate.config.loader import env_var_name
from pidgate.config.settings import Settings


def _default(field: Any) -> str:
    if field.default_factory is not None:
        value = field.default_factory()
    elif field.default is PydanticUndefined:
        return "(required)"
    else:
        value = field.default
    if value is None:
        return "none"
    if isinstance(value, BaseModel):
        return str(value)
    return json.dumps(list(value) if isinstance(value, tuple) else value)


def reference_rows() -> list[tuple[str, str, str, str]]:
    rows = []
    for section, section_field in Settings.model_fields.items():
        model = section_field.annotation
        assert isinstance(model, type) and issubclass(model, BaseModel)
        for name, field in model.model_fields.items():
            key = field.alias or name
            rows.append(
                (
                    f"`{section}.{key}`",
                    f"`{env_var_name(section, key)}`",
                    f"`{_default(field)}`",
                    (field.description or "").replace("|", "\\|"),
                )
            )
    return rows


def markdown_reference() -> str:
    lines = ["| key | environment variable | default | meaning |", "|---|---|---|---|"]
    lines += [
        f"| {key} | {env} | {default} | {about} |" for key, env, default, about in reference_rows()
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(markdown_reference())
