"""The only package with sockets: the asyncio/uvloop Kafka proxy, routing, muting, logs.

May import ``pidgate.protocol``, ``pidgate.quota`` and ``pidgate.config``; nothing imports it
except the entry points (``pidgate.cli``, ``pidgate.demo``).
"""
