"""The streaming job: ``dqcep spark stream QUERIES.cep --input JOURNAL --output DIR
--checkpoint DIR``.

    journal (closed segments, one per micro-batch; dqcep.spark.journal_source)
      -> route: dead letters and late events to their outputs; the events the
         queries need to every (group, part) they must reach (as the batch job)
      -> withWatermark(clock) -> groupBy(group, part)
      -> transformWithStateInPandas(EngineProcessor): a PartRunner per key whose
         whole state (engine snapshot, recent ids, recent events' keys) lives in
         Spark's state store; event-time timers release held matches
      -> foreachBatch: DIR/matches, DIR/dead-letter, DIR/late, one directory per
         micro-batch, overwritten whole when Spark re-runs the batch after a
         crash (exactly once)

Late events follow the engines' rule (spec section 7: ``--lateness``, ``--skew``,
``--timeline``), applied by the router in journal order with the engines' own kernel
(``Engine.admit_columns``): G and each timeline's T(k) run on from segment to segment
through the job's index directory (``TimelineChain``), and a tick row moves G. The
part engines behind the router then only hold events for D (``--skew``): an event
the router admitted is at most D behind any part's latest. ``clock = max(file_before,
ts)`` never decreases along the journal, so it is the watermark column, with a delay
of 1 ms: Spark's stateful operator drops a row at the watermark itself, and a
segment whose events are all behind G (a device far behind, a skew) leaves the clock
where it was, so that the next one's first rows would sit at it and be lost. The
watermark is the largest clock of earlier batches less 1 ms.
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Iterator

import numpy as np
import pandas as pd

from dqcep.core.admission import LATE_REASONS, AdmissionRule
from dqcep.core.events import MAX_FUTURE_MS
from dqcep.io.mapping import TopicMap
from dqcep.runtime import STATE_BUDGET
from dqcep.spark.executor import (GROUP_KEYED, GROUP_SLICED, GROUP_WHOLE, Assigner, JobSpec, PartRunner,
                                  event_columns, read_tables, record_lines)
from dqcep.spark.journal_source import END_WHERE
from dqcep.spark.source import SCHEMA

GROUP_DEAD, GROUP_LATE, GROUP_CLOCK = -1, -2, -3
# counts: on the one clock row of each routed batch, that batch's records and events
# left after pushdown (JSON); null on every other row
ROUTED_SCHEMA = SCHEMA + ", group int, part long, clock long, counts string"
OUTPUT_SCHEMA = "kind string, line string"


def route_batches(spec: JobSpec, rule: AdmissionRule, chain: "TimelineChain",
                  batches: Iterator[pd.DataFrame]):
    """Source rows -> rows keyed by (group, part); one clock row per batch keeps the
    watermark moving even when every event of the batch is dropped.

    Events are admitted by spec section 7 in journal order (``Engine.admit_columns``,
    the engines' one rule), from G and the timelines that the segment before left in
    ``chain``; a tick row moves G. Late events go to the late output with their reason."""
    assigner = Assigner(spec, rule)
    engine = assigner.engine
    segment = g = None
    for df in batches:
        if not len(df):
            continue
        df = df.assign(counts=None)
        end = (df["where"] == END_WHERE) & df["reason"].isna()
        if end.any():  # the stream is closed: every part that may hold state flushes
            yield _end_rows(spec, rule.tolerance, df[end].iloc[[0]])
            df = df[~end]
            if not len(df):
                continue
        if segment is None:  # the segment's first rows: where the one before left time
            segment = int(df["file_index"].iloc[0])
            g, timelines = chain.load(segment)
            engine.add_timelines(timelines)
            if g is None:  # no chain (the first segment): G as the source counted it
                g = int(df["file_before"].iloc[0])
        # run_stream filled the nulls of ts and file_before, so both are exact int64
        clock = np.maximum(df["file_before"], df["ts"])
        df = df.assign(clock=clock)
        if engine.schema_checks:  # misdeclared events are dead letters, as in the service
            rows = np.flatnonzero(df["reason"].isna().to_numpy())
            bad, found = engine.misdeclared(event_columns(engine, df["event"].iloc[rows]
                                                          .tolist()))
            if bad.any():
                reason = df["reason"].to_numpy(object).copy()
                reason[rows[bad]] = [why for _, _, why in found]
                df = df.assign(reason=reason)
        dead = df["reason"].notna().to_numpy()
        tick = df["event"].isna().to_numpy() & ~dead  # only moves the clock and G
        rows = np.flatnonzero(~dead & ~tick)
        why = np.zeros(len(rows), np.int8)
        cols = event_columns(engine, df["event"].iloc[rows].tolist()) if len(rows) else None
        start = 0
        ts = df["ts"].to_numpy()
        for p in np.flatnonzero(tick).tolist() + [len(df)]:  # events between the ticks
            stop = int(np.searchsorted(rows, p))
            if stop > start:
                why[start:stop], g = engine.admit_columns(cols.take(slice(start, stop)), g)
            if p < len(df):
                g = int(ts[p]) if g is None else max(g, int(ts[p]))
            start = stop
        late_rows = rows[why != 0]
        late = df.iloc[late_rows].assign(
            group=GROUP_LATE, part=0, reason=[LATE_REASONS[w - 1] for w in why[why != 0]])
        out = [df[dead].assign(group=GROUP_DEAD, part=0), late]
        n_needed = 0
        if len(rows) and (why == 0).any():
            events = df.iloc[rows[why == 0]]
            cols = engine.stored_columns(cols.take(np.flatnonzero(why == 0)))
            needed = engine.needed(cols)
            n_needed = int(needed.sum())
            if n_needed:  # each row keeps its clock; None: no part wants them
                out.append(assigner.assign(events[needed], cols.take(needed)))
        marker = df.iloc[[int(np.argmax(clock.to_numpy()))]]
        counts = json.dumps({"records": len(df), "needed": n_needed})
        out.append(marker.assign(group=GROUP_CLOCK, part=0, event=None, counts=counts))
        yield pd.concat(out, ignore_index=True)
    if segment is not None:
        chain.save(segment, g, engine)


class TimelineChain:
    """What admission needs from the segments before one (spec section 7): G and T(k)
    per timeline, kept in the job's index directory, ``<segment>.timelines`` for the
    state before each. A micro-batch's router reads its segment's and writes the next
    one's (one segment a micro-batch, in order, as the source's ``.max`` chain): a
    micro-batch run again reads the same and writes the same."""

    def __init__(self, index: str, journal: str):
        self.index, self.journal = Path(index), journal

    def _path(self, segment: int) -> Path:
        return self.index / f"{segment:012d}.timelines"

    def load(self, segment: int) -> tuple[int | None, list]:
        """(G, timelines) before ``segment`` ((None, []): none written)."""
        import msgpack
        try:
            state = msgpack.unpackb(self._path(segment).read_bytes())
        except FileNotFoundError:
            return None, []
        return state["g"], state["timelines"]

    def save(self, segment: int, g: int | None, engine) -> None:
        import msgpack
        from dqcep.spark.journal_source import following
        if g is not None:  # a timeline within the skew of G says nothing more
            engine.state.timelines.forget_at_most(g - engine.state.tolerance + engine.lateness)
        self.index.mkdir(parents=True, exist_ok=True)
        path = self._path(following(self.journal, Path(f"{segment:020d}.seg")))
        tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(msgpack.packb({"g": g, "timelines": engine.timeline_values()}))
        os.replace(tmp, path)


def _end_rows(spec: JobSpec, tolerance: int, row: pd.DataFrame) -> pd.DataFrame:
    """The end-of-stream row, once for each (group, part) that may hold state: every
    key partition; the slices near the end of event time; the part of the queries not
    split."""
    p = spec.partitioning
    clock = int(row["file_before"].iloc[0])
    keys = []
    if p.keyed:
        keys += [(GROUP_KEYED, k) for k in range(spec.partitions)]
    if p.sliced:
        w, length = p.slice_window, spec.slice_ms
        lo, hi = (clock - tolerance - 2 * w) // length - 1, (clock + w) // length + 1
        keys += [(GROUP_SLICED, k) for k in range(lo, hi + 1)]
    if p.whole:
        keys.append((GROUP_WHOLE, 0))
    out = row.iloc[[0] * len(keys)].reset_index(drop=True)
    # one ms after the latest event: a row at the watermark itself is late for Spark's
    # stateful operator and dropped, and with it the flush of the events the parts
    # still buffer (the last --lateness ms of the stream: their matches were lost)
    return out.assign(group=[g for g, _ in keys], part=[k for _, k in keys],
                      clock=clock + 1)


def processor_class(spec: JobSpec, lateness: int):
    """The StatefulProcessor for transformWithStateInPandas (built here so pyspark is
    imported only when a streaming job runs). ``lateness``: how far behind a part's
    latest event one admitted by the router may come: the stream's D (--skew)."""
    from pyspark.sql.streaming.stateful_processor import StatefulProcessor

    class EngineProcessor(StatefulProcessor):
        def init(self, handle) -> None:
            self.handle = handle
            self.state = handle.getValueState("part", "blob binary, recent binary")

        def _load(self, group: int, part: int):
            from dqcep.runtime.duplicates import recent_ids
            runner, recent = PartRunner(spec, group, part, lateness), recent_ids()
            self.stored = None
            if self.state.exists():
                blob, ids = self.state.get()
                self.stored = (bytes(blob), bytes(ids))
                runner.restore(self.stored[0])
                recent.admit(np.frombuffer(self.stored[1], np.int64).copy())
            return runner, recent

        def _save(self, runner, recent) -> None:
            for t in list(self.handle.listTimers()):
                self.handle.deleteTimer(t)
            if runner.group == GROUP_SLICED:
                # no event of this slice can come once event time - lateness is past
                # its end, (part + 1) L + W: then nothing is held either
                done = (runner.part + 1) * spec.slice_ms + spec.partitioning.slice_window
                wm = runner.engine.wm
                if wm is not None and wm > done and runner.engine.next_release() is None:
                    self.state.clear()
                    return
                self.handle.registerTimer(done + lateness + 1)
            state = (runner.snapshot(), recent.ids().tobytes())
            if state != self.stored:  # written back only when it changed
                self.state.update(state)
            due = runner.engine.next_release()
            if due is not None:  # event time must pass due + lateness (see advance)
                self.handle.registerTimer(due + lateness)

        def handleInputRows(self, key, rows, timerValues):
            group, part = int(key[0]), int(key[1])
            df = pd.concat(list(rows), ignore_index=True)
            if group == GROUP_DEAD:
                yield pd.DataFrame({"kind": "dead", "line": record_lines(df, "dead")})
                return
            if group == GROUP_LATE:
                yield pd.DataFrame({"kind": "late", "line": record_lines(df, "late")})
                return
            if group == GROUP_CLOCK:  # the routed batches' counts, for the summary
                yield pd.DataFrame({"kind": "counts", "line": df["counts"].dropna()})
                return
            end = (df["where"] == END_WHERE) & df["event"].isna()
            if end.all() and not self.state.exists():
                return  # nothing held here
            runner, recent = self._load(group, part)
            df = df[~end].sort_values(["file_index", "seq"], kind="stable")
            first = recent.admit(df["id"].to_numpy(np.int64))  # first copy of an id wins
            if not first.all():  # named by position: an event sent to two parts counts once
                repeats = df[~first]
                yield pd.DataFrame({"kind": "repeat", "line": repeats["file_index"].astype(str)
                                    + ":" + repeats["seq"].astype(str)})
                df = df[first]
            df = df.sort_values(["ts", "file_index", "seq"], kind="stable")
            outs = [runner.feed(event_columns(runner.engine, df["event"].tolist()))] \
                if len(df) else []
            outs.append(self._advance(runner, timerValues))
            if end.any():
                outs.append(runner.flush())
            self._save(runner, recent)
            for out in outs:
                if out is not None:
                    yield pd.DataFrame({"kind": "match", "line": out.decode().splitlines()})

        def _advance(self, runner, timerValues):
            wm = timerValues.getCurrentWatermarkInMs()
            # every event still to come has ts >= (largest earlier ts) - lateness >= wm - lateness
            return runner.advance(wm - lateness) if wm > 0 else None

        def handleExpiredTimer(self, key, timerValues, expiredTimerInfo):
            runner, recent = self._load(int(key[0]), int(key[1]))
            out = self._advance(runner, timerValues)
            self._save(runner, recent)
            if out is not None:
                yield pd.DataFrame({"kind": "match", "line": out.decode().splitlines()})

        def close(self) -> None:
            pass

    return EngineProcessor


def run_stream(spark, queries_text: str, journal: str, output: str, checkpoint: str, *,
               partitions: int = 4, lateness: "AdmissionRule | int" = 0,
               fmt: str | None = None,
               topic_map: TopicMap | None = None, max_future: int = MAX_FUTURE_MS,
               strategy: str = "auto", slice_ms: int | None = None,
               trigger_seconds: float = 1.0, until_idle: bool = False,
               budget: int = STATE_BUDGET):
    """Start the streaming query; with ``until_idle``, stop once the journal's closed
    segments are all processed (and event-time timers have fired). ``topic_map``: the
    --map file's rules (its text goes to the journal source, whose reader parses it
    once and ships the rules to the tasks)."""
    from pyspark.sql import functions as F

    from dqcep.lang import parse
    from dqcep.spark.journal_source import JournalSource
    from dqcep.spark.partitioning import plan_partitioning

    parsed = parse(queries_text)
    plan = plan_partitioning(parsed.queries, strategy)
    window = plan.slice_window
    # lookup tables: read once, when the job starts (a restart reads them again), and
    # shipped by value with the tasks: the stateful processor's runner loads no
    # broadcast variable (BROADCAST_VARIABLE_NOT_LOADED)
    spec = JobSpec(queries_text, plan, partitions, slice_ms or max(10 * window, 1000),
                   read_tables(parsed), budget)
    out, ck = Path(output).resolve(), Path(checkpoint).resolve()
    spark.dataSource.register(JournalSource)
    end_marker = ck / "end-of-stream"
    end_marker.unlink(missing_ok=True)  # this run's end is decided by this run
    rows = (spark.readStream.format("dqcep_journal").option("path", str(Path(journal).resolve()))
            .option("index", str(ck / "journal-index")).option("end", str(end_marker))
            .option("format", fmt or "").option("max_future", str(max_future))
            .option("map", topic_map.text if topic_map else "")
            .option("map_name", topic_map.source if topic_map else "").load())
    # No null ts or file_before reaches pandas (a null would make the column float64,
    # inexact beyond 2**53): nothing before a row -> its own ts; a dead row's ts -> 0
    # (only its where and reason are used).
    rows = (rows.withColumn("file_before", F.coalesce("file_before", "ts", F.lit(0)))
            .withColumn("ts", F.coalesce("ts", F.lit(0))))
    rule = AdmissionRule.of(lateness)
    chain = TimelineChain(str(ck / "journal-index"), str(Path(journal).resolve()))
    routed = (rows.mapInPandas(lambda it: route_batches(spec, rule, chain, it), ROUTED_SCHEMA)
              .withColumn("clock", F.timestamp_millis("clock"))
              .withWatermark("clock", "1 millisecond"))
    results = routed.groupBy("group", "part").transformWithStateInPandas(
        processor_class(spec, rule.tolerance)(), OUTPUT_SCHEMA, "Append", "EventTime")

    def write(batch, batch_id: int) -> None:
        batch = batch.persist()
        stats = _batch_counts(batch)
        written = {"match": stats.matches, "dead": stats.dead_letter, "late": stats.late}
        for kind, name in (("match", "matches"), ("dead", "dead-letter"), ("late", "late")):
            where = out / name / f"batch={batch_id:010d}"
            if written[kind]:
                (batch.where(F.col("kind") == kind).select("line").coalesce(1).write
                 .mode("overwrite").text(str(where)))
            else:  # no job for nothing; what an earlier attempt of the batch wrote goes
                shutil.rmtree(where, ignore_errors=True)
        _write_stats(stats, out / "_stats" / f"batch={batch_id:010d}.json")
        batch.unpersist()

    query = (results.writeStream.option("checkpointLocation", str(ck / "query"))
             .trigger(processingTime=f"{trigger_seconds} seconds").foreachBatch(write).start())
    if not until_idle:
        return query
    try:
        query.processAllAvailable()
        end_marker.parent.mkdir(parents=True, exist_ok=True)
        end_marker.touch()  # the source closes the stream: held matches come out
        query.processAllAvailable()
    finally:
        query.stop()
    return query


@dataclass
class StreamStats:
    """What the streaming job did, summed over every micro-batch it wrote (restarts
    included): the counts of ``dqcep spark run``'s ``_stats.json``."""
    records: int = 0
    dead_letter: int = 0
    duplicates: int = 0
    late: int = 0
    after_pushdown: int = 0
    matches: int = 0


def _batch_counts(batch) -> StreamStats:
    """One micro-batch's counts, in one job (a micro-batch's fixed cost is mostly its
    jobs): each kind's count, and the lines of the few rows that carry counts or name
    a repeat."""
    from pyspark.sql import functions as F

    rows = batch.groupBy("kind").agg(
        F.count("*").alias("count"),
        F.collect_list(F.when(F.col("kind").isin("counts", "repeat"), F.col("line")))
        .alias("lines")).collect()
    n = {r["kind"]: r["count"] for r in rows}
    lines = {r["kind"]: r["lines"] for r in rows}
    routed = [json.loads(line) for line in lines.get("counts", [])]
    repeats = set(lines.get("repeat", []))
    needed = sum(c["needed"] for c in routed)
    return StreamStats(records=sum(c["records"] for c in routed),
                       dead_letter=n.get("dead", 0), duplicates=len(repeats),
                       late=n.get("late", 0), after_pushdown=needed - len(repeats),
                       matches=n.get("match", 0))


def _write_stats(stats: StreamStats, path: Path) -> None:
    """One micro-batch's counts as ``DIR/_stats/batch=N.json``, replaced whole when Spark
    re-runs the batch (so the sum over the files counts every batch once)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    part = path.with_suffix(".part")
    part.write_text(json.dumps(asdict(stats)) + "\n")
    os.replace(part, path)


def stream_stats(output: str) -> StreamStats:
    """The counts of every micro-batch written to ``output`` so far."""
    total = StreamStats()
    for f in sorted((Path(output) / "_stats").glob("batch=*.json")):
        for name, value in json.loads(f.read_text()).items():
            setattr(total, name, getattr(total, name) + value)
    return total
