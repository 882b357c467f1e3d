"""pidgate: a Kafka-protocol proxy that throttles producer-ID explosions per principal (KIP-936).

Packages and the one rule between them (enforced by import-linter, see pyproject.toml):
imports only go downward, ``cli/demo -> proxy -> (config | quota | protocol)``; ``quota`` and
``protocol`` never import each other, asyncio, sockets, clocks, structlog or prometheus_client.
"""

__version__ = "0.1.0"
