"""How the demo and ``pidgate test-broker`` name pidgate in the commands they print: the way the
user's shell finds this installation, so each runs as printed after the quick start."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from pidgate.config import load_settings
from pidgate.demo import next_steps
from pidgate.demo.next_steps import (
    SERVE_HTTP,
    SERVE_LISTEN,
    analyze_install_hint,
    demo_next_steps,
    pidgate_command,
    serve_lines,
)


def venv_with_script(root: Path) -> Path:
    bin_dir = root / ".venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "python").write_text("")
    script = bin_dir / "pidgate"
    script.write_text("#!/bin/sh\n")
    script.chmod(0o755)
    return script


def test_a_venv_not_on_path_is_named_by_its_path(tmp_path: Path) -> None:
    script = venv_with_script(tmp_path / "clone")
    # ./scripts/demo from the clone's root: the plain shell's PATH lacks .venv/bin.
    assert pidgate_command(str(script), "", "/usr/bin:/bin", tmp_path / "clone") == (
        ".venv/bin/pidgate"
    )
    # Started from elsewhere (clone/scripts/demo from the home directory): the full path.
    elsewhere = tmp_path / "home"
    elsewhere.mkdir()
    assert pidgate_command(str(script), "", "/usr/bin:/bin", elsewhere) == str(script)


def test_a_venv_on_path_is_just_pidgate(tmp_path: Path) -> None:
    script = venv_with_script(tmp_path)
    path_env = f"{script.parent}:/usr/bin:/bin"  # source .venv/bin/activate
    assert pidgate_command(str(script), "", path_env, tmp_path / "x") == "pidgate"
    # Another pidgate earlier on PATH is not this one: the path is.
    other = venv_with_script(tmp_path / "other")
    path_env = f"{other.parent}:{script.parent}"
    assert pidgate_command(str(script), "", path_env, tmp_path) == ".venv/bin/pidgate"


def test_python_m_pidgate_names_the_venvs_script_or_the_module(tmp_path: Path) -> None:
    script = venv_with_script(tmp_path)
    python = str(script.parent / "python")
    module_main = "/somewhere/pidgate/__main__.py"
    assert pidgate_command(module_main, python, "/usr/bin", tmp_path) == ".venv/bin/pidgate"
    bare = tmp_path / "py dir" / "python3"
    assert pidgate_command(module_main, str(bare), "/usr/bin", tmp_path) == (
        f"{shlex.quote(str(bare))} -m pidgate"
    )


def test_the_demos_next_steps_use_that_name_and_real_paths(tmp_path: Path) -> None:
    events, report = tmp_path / "events", tmp_path / "pidgate-demo-report"
    lines = demo_next_steps(".venv/bin/pidgate", events, report)
    text = "\n".join(lines)
    analyze = f".venv/bin/pidgate analyze activity --events {events} --output {report}"
    assert f"       {analyze} --window-seconds 10" in lines
    assert f"in a browser: file://{report}/report.html" in text
    assert "       .venv/bin/pidgate test-broker" in lines
    assert "install" not in text
    # Without the analyze extra, the command that installs it comes first.
    with_install = demo_next_steps("pidgate", events, report, "python -m pip install x")
    assert with_install.index("       python -m pip install x") < with_install.index(
        f"       pidgate analyze activity --events {events} --output {report} --window-seconds 10"
    )


def test_the_serve_line_names_the_broker_and_the_same_pidgate() -> None:
    lines = serve_lines(".venv/bin/pidgate", "127.0.0.1:19092")
    assert (
        "  .venv/bin/pidgate serve --upstream 127.0.0.1:19092 --producer-ids-rate ANONYMOUS=5 "
        "--quota-window-seconds 60" in lines
    )
    assert "  .venv/bin/pidgate quotas describe --bootstrap-server 127.0.0.1:9092" in lines


def test_the_printed_client_addresses_are_serves_defaults() -> None:
    """The serve line sets neither --listen nor --http: the lines after it rely on these."""
    settings = load_settings(cli_overrides={"proxy": {"upstream": ["127.0.0.1:19092"]}})
    assert str(settings.proxy.listen) == SERVE_LISTEN
    assert str(settings.admin.listen) == SERVE_HTTP


def test_without_the_analyze_extra_the_install_line_targets_this_tree(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After ./scripts/demo alone (the demo extra only), step 1 installs the analyze extra
    into the same venv, editable from the clone as ./scripts/test would."""
    monkeypatch.setattr(next_steps, "ANALYZE_MODULES", ("json", "no_such_module_here"))
    tree = Path(next_steps.__file__).resolve().parents[3]
    assert (tree / "pyproject.toml").is_file()
    python = str(tree / ".venv" / "bin" / "python")
    assert analyze_install_hint(python, tree) == (".venv/bin/python -m pip install -e '.[analyze]'")
    assert analyze_install_hint(python, tree / "src") == (
        f"{shlex.quote(python)} -m pip install -e {shlex.quote(str(tree) + '[analyze]')}"
    )
    monkeypatch.setattr(next_steps, "ANALYZE_MODULES", ("json",))
    assert analyze_install_hint(python, tree) is None
