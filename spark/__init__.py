"""Spark (PySpark 4) jobs around the dqcep engine: preprocessing and the distributed engine.

- ``dqcep.spark.partitioning``: how queries are split over partitions (keyed or
  time slices with overlap), without losing or repeating a match;
- ``dqcep.spark.executor``: what runs in the Python workers over Arrow batches
  (routing: late events, repeats, pushdown, partition assignment; the native
  engine per partition);
- ``dqcep.spark.source``: event files as a Spark data source, positions kept;
- ``dqcep.spark.batch``: the batch job behind ``dqcep spark run``;
- ``dqcep.spark.stream``: the streaming job behind ``dqcep spark stream``, reading the
  service's journal through ``dqcep.spark.journal_source`` (a replayable streaming
  source);
- ``dqcep.spark.session``: the SparkSession with the settings the jobs need;
- ``dqcep.spark.cli``: ``dqcep spark ...`` (pyspark imported on use), with the checks
  of ``dqcep.spark.paths`` run before the JVM starts;
- ``dqcep.spark.cluster``: a local standalone cluster (``dqcep spark cluster``);
  ``dqcep.spark.pack``: the executors' packed environment (``dqcep spark pack``).

The folder is ``spark/`` in the repository, an application above the library (as
``generator/``), installed as ``dqcep.spark``.

See docs/spark.md.
"""
