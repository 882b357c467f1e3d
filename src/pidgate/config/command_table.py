"""The command line as data: options, option groups and subcommands declared as rows, and the
one function that turns those rows into argparse parsers.

``pidgate.cli`` (``pidgate serve``, ``quotas``, ``demo``, ...) and ``pidgate.pipeline.cli``
(``pidgate analyze <job>``) declare their commands here instead of in repeated ``add_parser`` /
``add_argument`` blocks; what a flag does with its value stays with the command's handler.

Owns: the row types (:class:`Option`, :class:`Exclusive`, :class:`Group`, :class:`Command`) and
:func:`add_commands`. Must not import: any other ``pidgate`` module (it sits below both command
lines), asyncio, socket, structlog, prometheus_client, pydantic.

The rows are named tuples rather than dataclasses: every ``pidgate`` command builds them at
start, and named tuples are created several times faster (``pidgate quotas`` must start fast).
"""

from __future__ import annotations

import argparse
from collections.abc import Mapping
from typing import Any, Generic, NamedTuple, TypeVar

HandlerT = TypeVar("HandlerT")


class Option(NamedTuple):
    """One flag: its name, its help and argparse's other keyword arguments (type, metavar, ...)."""

    flag: str
    help: str
    argparse_kwargs: Mapping[str, Any]


def option(flag: str, help: str, **argparse_kwargs: Any) -> Option:
    return Option(flag, help, argparse_kwargs)


class Exclusive(NamedTuple):
    """Options of which at most one may be given (exactly one when ``required``)."""

    options: tuple[Option, ...]
    required: bool = False


class Group(NamedTuple):
    """Options listed under their own heading in ``--help``."""

    title: str
    options: tuple[Option, ...]


Argument = Option | Exclusive | Group


class Command(NamedTuple, Generic[HandlerT]):
    """One subcommand: its name, its one-line help (also its ``--help`` description unless it
    has its own), its arguments in ``--help`` order, what runs it, and its own subcommands
    (whose chosen name argparse stores as ``subcommand_dest``)."""

    name: str
    help: str
    arguments: tuple[Argument, ...] = ()
    handler: HandlerT | None = None
    description: str | None = None
    subcommands: tuple[Command[Any], ...] = ()
    subcommand_dest: str = ""
    subcommand_metavar: str | None = None


def add_commands(
    subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
    commands: tuple[Command[Any], ...],
) -> None:
    """Add ``commands`` (and their subcommands, all required) to an ``add_subparsers()``."""
    for command in commands:
        # Every --help says what the command does: the one-line help as a sentence, unless
        # the command has a longer description of its own.
        description = command.description or command.help[0].upper() + command.help[1:] + "."
        parser = subparsers.add_parser(command.name, help=command.help, description=description)
        for argument in command.arguments:
            _add_argument(parser, argument)
        if command.subcommands:
            children = parser.add_subparsers(
                dest=command.subcommand_dest,
                required=True,
                metavar=command.subcommand_metavar,
            )
            add_commands(children, command.subcommands)


def _add_argument(parser: argparse.ArgumentParser, argument: Argument) -> None:
    if isinstance(argument, Option):
        parser.add_argument(argument.flag, help=argument.help, **argument.argparse_kwargs)
        return
    if isinstance(argument, Exclusive):
        target: Any = parser.add_mutually_exclusive_group(required=argument.required)
    else:
        target = parser.add_argument_group(argument.title)
    for member in argument.options:
        target.add_argument(member.flag, help=member.help, **member.argparse_kwargs)
