"""The batch job: ``dqcep spark run QUERIES.cep --input PATH... --output DIR``.

Reads event files, runs the preprocessing stages and the native engine in the
executors, and writes under DIR:

- ``matches/``: the spec's match lines (JSON Lines part files), or Parquet
  (``query``, ``detected_at``, ``events`` map) with ``--output-format parquet``;
- ``dead-letter/``: ``{"where", "reason"}`` per record that is not an event;
- ``late/``: ``{"where", "event"}`` per event beyond the lateness;
- ``_stats.json``: counts of each.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path

from pyspark.sql import functions as F

from dqcep.errors import UserError
from dqcep.spark.executor import JobSpec, record_lines
from dqcep.spark.paths import check_output_dir
from dqcep.spark.partitioning import plan_partitioning
from dqcep.spark.source import load_events
from dqcep.spark.stages import (deduplicate, mark_late, partition, pushdown, run_engines,
                               split_valid)

SLICES_PER_TASK = 4


@dataclass
class BatchStats:
    records: int
    dead_letter: int
    duplicates: int
    late: int
    after_pushdown: int
    matches: int
    partitioning: dict   # per query: PartitionPlan.describe()
    slice_ms: int
    assigned: int | None = None  # event copies after partition assignment (count_copies)


def slice_length(events, window: int, tasks: int) -> int:
    """Slice length L: a few slices per task, never shorter than the window
    (the overlap is one window on each side, so shorter slices repeat more)."""
    row = events.agg(F.min("ts").alias("lo"), F.max("ts").alias("hi")).first()
    if row.lo is None:
        return max(window, 1)
    span = row.hi - row.lo + 1
    return max(window, 1, -(-span // (tasks * SLICES_PER_TASK)))


def run_batch(spark, queries_text: str, inputs: list[str], output: str, *,
              fmt: str | None = None, partitions: int = 4, lateness: int = 0,
              output_format: str = "json", strategy: str = "auto",
              slice_ms: int | None = None, overwrite: bool = False,
              count_copies: bool = False) -> BatchStats:
    from dqcep.lang import parse
    if output_format not in ("json", "parquet"):
        raise UserError("--output-format must be json or parquet")
    if partitions < 1:
        raise UserError("--partitions must be >= 1")
    out = Path(output).resolve()  # executors write from other working directories
    check_output_dir(output, overwrite)
    queries = parse(queries_text).queries
    plan = plan_partitioning(queries, strategy)
    mode = "overwrite" if overwrite else "errorifexists"

    # persisted: what more than one output or count reads is computed once
    rows = load_events(spark, inputs, fmt).persist()
    events, dead = split_valid(rows)
    first, _ = deduplicate(events)
    first = first.persist()
    on_time, late = mark_late(first, lateness)
    late = late.persist()
    spec = JobSpec(queries_text, plan, partitions)
    kept = pushdown(on_time, spec).persist()
    if plan.sliced:
        spec = JobSpec(queries_text, plan, partitions,
                       slice_ms or slice_length(kept, plan.slice_window, partitions))
    parted = partition(kept, spec, partitions)
    matches = run_engines(parted, spec).persist()

    if output_format == "json":
        matches.select("line").write.mode(mode).text(str(out / "matches"))
    else:
        (matches.select(F.from_json("line", "query string, detected_at long, "
                                    "events map<string,long>").alias("m")).select("m.*")
         .write.mode(mode).parquet(str(out / "matches")))
    _record_lines(dead, "dead").write.mode(mode).text(str(out / "dead-letter"))
    _record_lines(late, "late").write.mode(mode).text(str(out / "late"))
    n_rows, n_dead, n_first = rows.count(), dead.count(), first.count()
    stats = BatchStats(
        records=n_rows, dead_letter=n_dead, duplicates=n_rows - n_dead - n_first,
        late=late.count(), after_pushdown=kept.count(), matches=matches.count(),
        partitioning=plan.describe(), slice_ms=spec.slice_ms,
        assigned=parted.count() if count_copies else None)
    (out / "_stats.json").write_text(json.dumps(asdict(stats), indent=2) + "\n")
    for df in (rows, first, late, kept, matches):
        df.unpersist()
    return stats


def _record_lines(df, kind: str):
    """Dead-letter or late records as JSON lines (``record_lines``), in arrival order."""
    columns = ["where", "reason" if kind == "dead" else "event"]

    def lines(batches):
        import pandas as pd
        for b in batches:
            yield pd.DataFrame({"value": record_lines(b, kind)})
    return df.orderBy("file_index", "seq").select(*columns).mapInPandas(lines, "value string")
