"""PySpark jobs over pidgate's PID event log and over broker log directories: thin entry
points (``pidgate analyze <job>``) over pure DataFrame -> DataFrame transforms.

May import ``pidgate.quota`` (the backtest replays events through the proxy's own quota code),
``pidgate.protocol`` (record-batch headers) and ``pidgate.config``; never ``pidgate.proxy``.
"""
