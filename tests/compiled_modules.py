"""The compiled twins under test (issue "native"): imported directly, whichever path the process
runs, so the comparisons with the pure functions hold under ``PIDGATE_PURE_PYTHON=1`` too.

Used by tests/protocol/test_native.py and tests/quota/test_compiled.py.
"""

from __future__ import annotations

import importlib
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

import pidgate

PURE_PYTHON_ENV = "PIDGATE_PURE_PYTHON"

#: How to get the compiled modules built (the failing test says so).
FIX = (
    "reinstall pidgate where gcc and the Python headers are (Debian: apt-get install gcc "
    "python3-dev; then pip install --force-reinstall --no-deps .)"
)


def import_compiled(name: str, fix: str = FIX) -> tuple[ModuleType | None, str]:
    """The module ``name``, or None and why it does not import (with ``fix``)."""
    try:
        return importlib.import_module(name), ""
    except ImportError as error:
        return None, f"{name} does not import ({error}): {fix}"


def needs(module: ModuleType | None, not_built: str, built_test: str) -> pytest.MarkDecorator:
    """Skip where ``module`` is not built, naming ``built_test``, the test that fails then."""
    return pytest.mark.skipif(module is None, reason=f"{not_built} ({built_test} fails)")


def printed_by_fresh_interpreter(code: str, pure_python: str | None) -> dict[str, Any]:
    """The JSON object ``code`` prints in a new interpreter importing this pidgate, with
    ``PIDGATE_PURE_PYTHON`` set to ``pure_python`` (None: unset): the choice is made at import."""
    env = dict(os.environ)
    env.pop(PURE_PYTHON_ENV, None)
    if pure_python is not None:
        env[PURE_PYTHON_ENV] = pure_python
    env["PYTHONPATH"] = str(Path(pidgate.__file__).resolve().parents[1])
    done = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout)
    return result
