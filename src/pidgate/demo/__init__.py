"""``pidgate demo`` and the embedded tansu broker it (and the integration tests) start.

An entry point, at the top of the layering: may import ``pidgate.proxy`` and below; nothing
imports it but ``pidgate.cli`` and tests.
"""
