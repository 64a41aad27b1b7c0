"""Spark (PySpark 4) jobs around the dqcep engine: preprocessing and the distributed engine.

- ``dqcep.spark.partitioning``: how queries are split over partitions (keyed or
  time slices with overlap), without losing or repeating a match;
- ``dqcep.spark.executor``: what runs in the Python workers over Arrow batches
  (routing: late events, repeats, pushdown, partition assignment; the native
  engine per partition);
- ``dqcep.spark.source``: event files as a Spark data source, positions kept;
- ``dqcep.spark.batch``: the batch job behind ``dqcep spark run``.

See docs/spark.md.
"""
