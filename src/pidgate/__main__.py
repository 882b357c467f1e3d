"""``python -m pidgate`` is the ``pidgate`` command."""

import sys

from pidgate.cli import main

sys.exit(main())
