"""The preprocessing stages, each a DataFrame transformation (PySpark 4).

    load_events -> split_valid -> deduplicate -> mark_late -> pushdown
                -> partition -> run_engines

Event rows carry ``file_index``/``seq`` (arrival order), ``id``, ``type``,
``ts`` and ``event`` (the event map as msgpack); see ``dqcep.spark.source``.
Row work that needs the engine (pushdown, partition assignment, the engine
itself) runs in the Python workers over Arrow batches (``mapInPandas``); the
rest is Spark SQL. Nothing is collected to the driver but per-file aggregates.
"""
from __future__ import annotations

import pandas as pd
from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from dqcep.spark.executor import (JobSpec, assign_batches, engine_batches, late_flags,
                                  pushdown_batches)

EVENT_COLUMNS = ["file_index", "seq", "where", "id", "ts", "file_before", "event"]
EVENT_SCHEMA = ("file_index long, seq long, `where` string, id long, ts long, file_before long, "
                "event binary")
ASSIGNED_SCHEMA = EVENT_SCHEMA + ", group int, part long"
MATCH_SCHEMA = "query string, detected_at long, line string"


def split_valid(rows: DataFrame) -> tuple[DataFrame, DataFrame]:
    """(events, dead letters): rows that decoded to an event, and the others with
    their position and reason."""
    events = rows.where(F.col("reason").isNull()).select(*EVENT_COLUMNS)
    dead = rows.where(F.col("reason").isNotNull()).select("file_index", "seq", "where",
                                                          "reason")
    return events, dead


def deduplicate(events: DataFrame) -> tuple[DataFrame, DataFrame]:
    """(first occurrence of each event id in arrival order, the repeats).

    Only (id, file_index, seq) are shuffled to find the repeats; the events
    themselves are not moved (an anti-join against the repeats, usually few).
    """
    first = Window.partitionBy("id").orderBy("file_index", "seq")
    repeats = (events.select("id", "file_index", "seq")
               .withColumn("_rank", F.row_number().over(first))
               .where("_rank > 1").select("file_index", "seq"))
    return (events.join(repeats, ["file_index", "seq"], "left_anti"),
            events.join(repeats, ["file_index", "seq"], "left_semi"))


def mark_late(events: DataFrame, lateness: int) -> tuple[DataFrame, DataFrame]:
    """(on time, late): an event is late when its ts is more than ``lateness`` ms
    below the largest ts that arrived before it — the engine's K-slack rule
    (docs/runtime.md), so a file replayed here and the same stream run live
    divert the same events; the rule itself is ``dqcep.runtime.late_rule``, applied in
    the Python workers (``late_flags``) as the streaming job and the engine apply it.

    Arrival order is (file, position): within a file the source gives each row
    ``file_before``, the running maximum before it; across files, the maxima of
    the files before (one aggregate row per file, combined on the driver). A
    repeated id never moves the maximum (it repeats an earlier ts), so this may
    run before or after ``deduplicate``.
    """
    spark = events.sparkSession
    maxima = sorted(events.groupBy("file_index").agg(F.max("ts").alias("m")).collect())
    prefix, running = [], None
    for row in maxima:
        prefix.append((row.file_index, running))
        running = row.m if running is None else max(running, row.m)
    earlier = spark.createDataFrame(prefix or [(0, None)],
                                    "file_index int, earlier_max long")

    @F.pandas_udf("boolean")
    def is_late(before: pd.Series, ts: pd.Series) -> pd.Series:
        return pd.Series(late_flags(before, ts, lateness))

    # Only the two long columns travel to the Python workers, not the events; no null
    # among them (late_flags), and an event with nothing before it is never late.
    before = F.coalesce(F.greatest("file_before", "earlier_max"), F.col("ts"))
    marked = (events.join(F.broadcast(earlier), "file_index", "left")
              .withColumn("_late", is_late(before, "ts")))
    return (marked.where(~F.col("_late")).select(*EVENT_COLUMNS),
            marked.where(F.col("_late")).select(*EVENT_COLUMNS))


def pushdown(events: DataFrame, spec: JobSpec) -> DataFrame:
    """Drop events no query can use (their type, key attributes, leaf predicates)."""
    return events.mapInPandas(lambda it: pushdown_batches(spec, it), EVENT_SCHEMA)


def partition(events: DataFrame, spec: JobSpec, tasks: int) -> DataFrame:
    """Each event once per (group, part) it must reach, parts spread over ``tasks``
    Spark partitions, each sorted by (group, part, ts, arrival)."""
    assigned = events.mapInPandas(lambda it: assign_batches(spec, it), ASSIGNED_SCHEMA)
    return (assigned.repartition(tasks, "group", "part")
            .sortWithinPartitions("group", "part", "ts", "file_index", "seq"))


def run_engines(parted: DataFrame, spec: JobSpec) -> DataFrame:
    """The native engine over each part; the matches each part owns, as JSON lines."""
    return parted.mapInPandas(lambda it: engine_batches(spec, it), MATCH_SCHEMA)
