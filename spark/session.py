"""A SparkSession with the settings dqcep's jobs need (see docs/spark.md).

The same code runs on ``local[*]``, on ``local-cluster[N,C,MB]`` and on a
standalone cluster (``spark://host:7077``): the master is the only difference.
"""
from __future__ import annotations

import os
import sys

DEFAULT_SHUFFLE_PARTITIONS = 4


def spark_session(master: str | None = None, app: str = "dqcep", partitions: int | None = None,
                  conf: dict[str, str] | None = None):
    """Build (or get) the session. ``partitions`` sets the shuffle partitions; ``conf``
    adds settings (e.g. ``dqcep.spark.pack.spark_conf`` for a packed environment)."""
    # Python workers must run this interpreter (with dqcep, numpy and pyarrow), not
    # whatever python3 is first on PATH; Spark reads these before it starts them.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    from pyspark.sql import SparkSession

    builder = SparkSession.builder.appName(app)
    if master:
        builder = builder.master(master)
    settings = {
        "spark.sql.shuffle.partitions": str(partitions or DEFAULT_SHUFFLE_PARTITIONS),
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.streaming.stateStore.providerClass":
            "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
        **(conf or {}),
    }
    for k, v in settings.items():
        builder = builder.config(k, v)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    return spark
