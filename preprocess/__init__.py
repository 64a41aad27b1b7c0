"""Spark (PySpark 4) jobs around the dqcep engine: preprocessing and the distributed engine.

- ``preprocess.partitioning``: how queries are split over partitions (keyed or
  time slices with overlap), without losing or repeating a match;
- ``preprocess.executor``: what runs in the Python workers (pushdown filter,
  partition assignment, the native engine per partition) over pandas batches;
- ``preprocess.stages``: the preprocessing stages as DataFrame transformations;
- ``preprocess.source``: event files as a Spark data source, positions kept;
- ``preprocess.batch``: the batch job behind ``dqcep spark run``.

See docs/spark.md.
"""
