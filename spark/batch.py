"""The batch job: ``dqcep spark run QUERIES.cep --input PATH... --output DIR``.

Two Spark jobs (docs/spark.md, "The stages"):

1. **index**: one row per file, read in the executors: the largest ts of each file
   (for late events across files), the smallest and largest ts (for the slice
   length), its id range and the ids it holds more than once with their first copy;
   only files whose id ranges overlap are read again for an aggregate by id (the
   repeats across files). A few rows reach the driver.
2. **route, shuffle, engines, write**: each reading task routes its rows
   (``dqcep.spark.executor.Router``: dead letters and late events become lines,
   repeats are dropped, needed events go to their (group, part) as engine
   columns); one shuffle by (group, part), a sort by (ts, arrival) within each
   Spark partition, the native engine over Arrow batches (``mapInArrow``), and
   one write of every output line, split by output.

Under DIR:

- ``matches/``: the spec's match lines (JSON Lines part files), or Parquet
  (``query``, ``detected_at``, ``events`` map) with ``--output-format parquet``;
- ``dead-letter/``: ``{"where", "reason"}`` per record that is not an event;
- ``late/``: ``{"where", "event", "reason"}`` per late event (spec section 7; reason
  ``lateness`` or, with ``--timeline``, ``skew``);
- ``_stats.json``: counts of each, summed from the tasks' own counts, and where the
  tasks ran (``executors``: each Python, its prefix and the dqcep it imported).
"""
from __future__ import annotations

import json
import shutil
from collections import Counter
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
from pyspark.sql import functions as F

from dqcep.runtime import STATE_BUDGET
from dqcep.core.errors import UserError
from dqcep.core.admission import AdmissionRule
from dqcep.spark.executor import (OUTPUT_SCHEMA, STATS, JobSpec, Router, broadcast_tables,
                                  chain_timelines, engine_batches, sum_task_counts)
from dqcep.spark.paths import check_output_dir
from dqcep.spark.partitioning import plan_partitioning
from dqcep.spark.source import event_units, load_events

SLICES_PER_TASK = 4
OUTPUTS = ("matches", "dead-letter", "late")


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
    partitions: int = 0          # key partitions and shuffle partitions of the run
    # where the tasks ran (reading the events, matching): [python, prefix, dqcep module]
    executors: list = field(default_factory=list)


@dataclass
class Index:
    """What the routing of a row needs from the rows before it, in other files too."""

    earlier: dict         # file index -> the largest ts of the files before it
    lo: int | None        # smallest and largest ts of the events
    hi: int | None
    repeated: np.ndarray  # sorted ids seen more than once, their first copy's position
    first_file: np.ndarray
    first_seq: np.ndarray
    units: list           # the source's units (``event_units``)
    kept: list | None     # the units to read (None: all); a broken file's later ones are not
    timelines: dict = field(default_factory=dict)  # ``Router.timelines`` (a timeline attribute)


REPEATS_SQL = """
SELECT id, count(*) AS n, min(named_struct('f', file_index, 's', seq)) AS first
FROM {view} GROUP BY id HAVING n > 1
"""


def job_index(spark, inputs: list[str], fmt: str | None, units: list | None = None,
              router: Router | None = None) -> Index:
    """One row per unit (a file, or a run of a Parquet file's row groups), read in the
    executors (no shuffle): its ts range, its id range and the ids it holds more than
    once. Only units whose id ranges overlap another's can share an id; for those
    alone, one aggregate by id finds the repeats across them. A file whose read broke
    off (a Parquet row group that cannot be read) ends there: its later units are left
    out (``Index.kept``), as a read of the whole file would stop. Given a ``router``
    whose rule has a timeline attribute, each unit's timelines too, chained here
    (``chain_timelines``: ``Index.timelines``)."""
    units = units if units is not None else event_units(inputs, fmt)
    rows = sorted(load_events(spark, inputs, fmt, mode="index", units=units,
                              router=router).collect())
    read, ended = [], set()
    for r in rows:  # in arrival order: a file's units are contiguous
        path = units[r.file_index][0]
        if path not in ended:
            read.append(r)
            if r.broken:
                ended.add(path)
    kept = None if len(read) == len(rows) else [r.file_index for r in read]
    rows = read
    earlier, running = {}, None
    for r in rows:
        if r.hi is None:
            continue
        if running is not None:
            earlier[r.file_index] = running
        running = r.hi if running is None else max(running, r.hi)
    shared = _overlapping([(r.min_id, r.max_id, r.file_index) for r in rows
                           if r.min_id is not None])
    repeats = [(i, r.file_index, s) for r in rows if r.file_index not in shared
               for i, s in zip(r.repeated, r.first_seq)]
    if shared:
        view = "dqcep_ids"
        load_events(spark, inputs, fmt, mode="ids", only=sorted(shared), units=units) \
            .createOrReplaceTempView(view)
        repeats += [(r.id, r.first.f, r.first.s)
                    for r in spark.sql(REPEATS_SQL.format(view=view)).collect()]
        spark.catalog.dropTempView(view)
    repeats.sort()
    repeated, first_file, first_seq = (np.array(c, np.int64).reshape(-1) for c in
                                       (zip(*repeats) if repeats else ([], [], [])))
    timelines = {}
    if router is not None:
        import msgpack
        timelines = chain_timelines([(r.file_index, msgpack.unpackb(r.timelines))
                                     for r in rows], router.rule, earlier)
    return Index(earlier, min((r.lo for r in rows if r.lo is not None), default=None),
                 running, repeated, first_file, first_seq, units, kept, timelines)


def _overlapping(ranges: list[tuple[int, int, int]]) -> set[int]:
    """The files whose [min id, max id] meets another file's."""
    out, reach, owner = set(), None, None
    for lo, hi, f in sorted(ranges):
        if reach is not None and lo <= reach:
            out |= {f, owner}
        if reach is None or hi > reach:
            reach, owner = hi, f
    return out


def slice_length(index: Index, window: int, tasks: int) -> int:
    """Slice length L: a few slices per task, never shorter than the window
    (the overlap is one window on each side, so shorter slices repeat more)."""
    if index.lo is None:
        return max(window, 1)
    span = index.hi - index.lo + 1
    return max(window, 1, -(-span // (tasks * SLICES_PER_TASK)))


def run_batch(spark, queries_text: str, inputs: list[str], output: str, *,
              fmt: str | None = None, partitions: int = 4,
              lateness: "AdmissionRule | int" = 0,
              output_format: str = "json", strategy: str = "auto",
              slice_ms: int | None = None, overwrite: bool = False,
              count_copies: bool = False, say=lambda line: None,
              budget: int = STATE_BUDGET) -> BatchStats:
    from dqcep.lang import parse
    if output_format not in ("json", "parquet"):
        raise UserError("--output-format must be json or parquet")
    if partitions < 1:
        raise UserError("--partitions must be >= 1")
    out = Path(output).resolve()  # executors write from other working directories
    check_output_dir(output, overwrite)
    parsed = parse(queries_text)
    plan = plan_partitioning(parsed.queries, strategy)

    say(f"stage 1 of 2: indexing {len(inputs)} input(s) (repeats, lateness, which "
        "events each query needs)")
    rule = AdmissionRule.of(lateness)
    tables = broadcast_tables(spark, parsed)
    spec = JobSpec(queries_text, plan, partitions, tables=tables, budget=budget)
    empty = np.zeros(0, np.int64)
    index = job_index(spark, inputs, fmt, router=None if rule.timeline is None
                      else Router(spec, rule, {}, empty, empty, empty))
    say(f"stage 2 of 2: routing the events to {partitions} partition(s), matching, "
        "writing")
    if plan.sliced:
        spec = JobSpec(queries_text, plan, partitions,
                       slice_ms or slice_length(index, plan.slice_window, partitions), tables,
                       budget)
    router = Router(spec, rule, index.earlier, index.repeated, index.first_file,
                    index.first_seq, index.timelines)
    lines = (load_events(spark, inputs, fmt, mode="route", router=router, only=index.kept,
                         units=index.units)
             .repartition(partitions, "group", "part")
             .sortWithinPartitions("group", "part", "ts", "file_index", "seq")
             .mapInArrow(lambda it: engine_batches(spec, it), OUTPUT_SCHEMA))
    staging = out / "_job"
    if staging.exists():
        shutil.rmtree(staging)
    with _conf(spark, WRITE_CONF):
        lines.write.partitionBy("output").text(str(staging))
    counts, executors = _counts(staging / f"output={STATS}")
    for name in OUTPUTS:
        target = out / name
        if target.exists():  # --overwrite
            shutil.rmtree(target)
        found = staging / f"output={name}"
        if found.exists():
            found.rename(target)
        else:
            target.mkdir(parents=True)
    shutil.rmtree(staging)
    if output_format == "parquet":
        _to_parquet(spark, out / "matches")
    stats = BatchStats(
        records=counts["records"], dead_letter=counts["dead_letter"],
        duplicates=counts["duplicates"], late=counts["late"],
        after_pushdown=counts["after_pushdown"], matches=counts["matches"],
        partitioning=plan.describe(), slice_ms=spec.slice_ms,
        assigned=counts["assigned"] if count_copies else None, partitions=partitions,
        executors=executors)
    (out / "_stats.json").write_text(json.dumps(asdict(stats), indent=2) + "\n")
    return stats


# One file writer open per output in each task, not a sort of every line by its output
# (the writer's default: a sort of millions of match lines in the JVM).
WRITE_CONF = {"spark.sql.optimizer.plannedWrite.enabled": "false",
              "spark.sql.maxConcurrentOutputFileWriters": str(len(OUTPUTS) + 1)}


@contextmanager
def _conf(spark, conf: dict):
    before = {k: spark.conf.get(k, None) for k in conf}
    for k, v in conf.items():
        spark.conf.set(k, v)
    try:
        yield
    finally:
        for k, v in before.items():
            if v is None:
                spark.conf.unset(k)
            else:
                spark.conf.set(k, v)


def _counts(directory: Path) -> tuple[Counter, list[list[str]]]:
    """The tasks' counts summed (a count no task gave is 0), and where they ran."""
    total, where = sum_task_counts(line for f in sorted(directory.glob("part-*"))
                                   for line in f.read_text().splitlines())
    return Counter(total), where


def _to_parquet(spark, matches: Path) -> None:
    """The match lines as Parquet (query, detected_at, events map), in place."""
    staging = matches.with_name("_matches.parquet")
    (spark.read.text(str(matches))
     .select(F.from_json("value", "query string, detected_at long, "
                         "events map<string,long>").alias("m")).select("m.*")
     .write.parquet(str(staging)))
    shutil.rmtree(matches)
    staging.rename(matches)
