"""The ``pidgate analyze`` jobs, each a thin entry point over pure DataFrame transforms:
activity (its hourly counts, recommendations and charts beside it), backtest, footprint (and its
executor-side scan), snapshots, and the synthetic event-log generator.

May import ``reading``, ``outputs`` and ``spark``; only ``pipeline.cli`` imports it.
"""
