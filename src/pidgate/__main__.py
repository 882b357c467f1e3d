"""``python -m pidgate`` is the ``pidgate`` command."""

from pidgate.cli import console_main

console_main()
