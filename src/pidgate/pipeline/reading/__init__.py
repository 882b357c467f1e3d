"""Reading a job's inputs: input checks, the PID event log (Spark schema and the pyarrow facts
reader), broker log directories, Kafka segments and producer snapshots, and flat schemas
written once as Spark DDL.

Imports only the pure packages; every other pipeline room may import it.
"""
