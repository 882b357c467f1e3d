"""The executor check's probe runs as the kind of Python task the job runs, so that the job's
first tasks find its Python workers started and their imports done (Spark keeps one pool of
workers for RDD tasks and another for DataFrame ones).

A fresh ``local[2]`` session in a child process: the suite's shared session has idle workers of
earlier tests, which would make "the same workers" depend on the order tests ran in. The
cluster test (``test_cluster.py``) runs the probe on a real executor, and its fallback to the
RDD probe where Arrow cannot run (the executors without pidgate or pyarrow)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

_CHILD = textwrap.dedent(
    """
    import json
    from pidgate.pipeline.spark.executors import _probe_task, _probe_through_arrow
    from pidgate.pipeline.spark.session import spark_session, stop_session

    # A module no Python worker imports by itself: seen only where the probe ran.
    MARK = "wave"
    spark = spark_session("local[2]", app_name="pidgate-probe-test")
    sc = spark.sparkContext
    try:
        reports = _probe_through_arrow(spark, 2, _probe_task({}, [], (MARK,)))

        def seen(batches):
            import sys
            import pyarrow
            for _ in batches:
                pass
            yield pyarrow.RecordBatch.from_pydict({"warm": [MARK in sys.modules]})

        frame = spark.range(0, 2, 1, 2).mapInArrow(seen, "warm boolean")
        arrow_job = [row.warm for row in frame.collect()]

        def rdd_seen(_):
            import sys
            yield MARK in sys.modules

        rdd_job = sc.parallelize(range(2), 2).mapPartitions(rdd_seen).collect()
        print(json.dumps({"reports": reports, "arrow_job": arrow_job, "rdd_job": rdd_job}))
    finally:
        stop_session()
    """
)


def test_the_jobs_first_tasks_run_in_the_workers_the_arrow_probe_started() -> None:
    done = subprocess.run(
        [sys.executable, "-c", _CHILD],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(result["reports"]) == 2
    for _host, python, version, _machine, failed, problems in result["reports"]:
        assert failed == {} and problems == []
        assert version.startswith(f"{sys.version_info[0]}.{sys.version_info[1]}.")
        assert python
    # The DataFrame job's tasks found the probe's import: same workers, nothing booted again.
    assert result["arrow_job"] == [True, True]
    # RDD tasks have a pool of their own, which the Arrow probe did not warm (why the
    # segment jobs probe with an RDD task).
    assert result["rdd_job"] == [False, False]
