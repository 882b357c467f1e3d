"""What the benchmark scripts share: the processes they start and measure
(:mod:`support.processes`), py-spy sampling (:mod:`support.pyspy`), and the pieces of the
broker-protection run (:mod:`support.storm`: raw Kafka frames and the storm of new producers;
:mod:`support.broker_heap`: the broker JVM's live heap).

The scripts in ``benchmarks/`` import it as ``support`` (their own folder is first on
``sys.path`` when run as ``python benchmarks/<script>.py``). It may import pidgate, the test
helpers under ``tests/`` and third-party clients; it never imports a benchmark script, so no
script imports another through it.
"""
