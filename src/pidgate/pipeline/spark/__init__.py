"""Getting Spark to run a job: the one SparkSession, ``--master`` checks, shipping pidgate to a
cluster's executors and checking them, progress lines, and the root cause of a failed job.

May import ``pipeline.reading`` (input errors); never a job.
"""
