"""Every subcommand's --help says what it does, and every option its default (or that it is
required): operators read --help before they read the README."""

from __future__ import annotations

import argparse
from collections.abc import Iterator

import pytest

from pidgate.cli import build_parser


def parsers(
    parser: argparse.ArgumentParser, path: str = "pidgate"
) -> Iterator[tuple[str, argparse.ArgumentParser]]:
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                yield from parsers(child, f"{path} {name}")


ALL = list(parsers(build_parser()))


def test_every_command_is_reached() -> None:
    names = {path for path, _ in ALL}
    assert {
        "pidgate serve", "pidgate demo", "pidgate quotas describe", "pidgate quotas set",
        "pidgate quotas delete", "pidgate analyze activity", "pidgate analyze snapshots",
        "pidgate test-broker",
    } <= names  # fmt: skip


def test_test_broker_help_names_its_real_default_port() -> None:
    from pidgate.demo.next_steps import TEST_BROKER_PORT

    (test_broker,) = [parser for path, parser in ALL if path == "pidgate test-broker"]
    (port,) = [a for a in test_broker._actions if "--port" in a.option_strings]
    assert f"default {TEST_BROKER_PORT}," in (port.help or "")


@pytest.mark.parametrize(("path", "parser"), ALL, ids=[path for path, _ in ALL])
def test_help_has_a_description_and_defaults(path: str, parser: argparse.ArgumentParser) -> None:
    assert parser.description, f"{path}: no description"
    for action in parser._actions:
        if not action.option_strings or isinstance(
            action, (argparse._HelpAction, argparse._VersionAction)
        ):
            continue
        text = (action.help or "").lower()
        if isinstance(action, argparse._StoreTrueAction):
            assert text, f"{path} {action.option_strings[0]}: no help"
            continue
        assert action.required or "default" in text or "required" in text, (
            f"{path} {action.option_strings[0]}: help names no default: {action.help!r}"
        )
