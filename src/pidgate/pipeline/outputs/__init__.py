"""What a job leaves behind: Parquet tables and a self-contained HTML report, with chart time
buckets chosen from the period covered.

Imports no other pipeline room.
"""
