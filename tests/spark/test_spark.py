"""The Spark jobs on a real Spark (local[2], and a multi-process standalone cluster):
exactly the reference's matches, whatever the partitioning, input format and
imperfections of the stream. Spark missing is a failure, never a skip."""
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from dqcep.io.mapping import TopicMap
from dqcep.io.readers import read_events
from dqcep.lang import parse
from dqcep.baseline.reference import ReferenceMatcher
from tests.support.examples import examples
from tests.support.workloads import (FORCED_DOOR_EVENTS, FORCED_DOOR_MATCHES, MISDECLARED_EVENTS,
                                     MISDECLARED_QUERY, SECTION5)
from tests.support.spark_jobs import IMPERFECT, LATENESS, QUERIES, expected, generate, job_lines
from tests.support.paths import ROOT

# one test process runs these (-n auto --dist loadgroup): one JVM for them all
pytestmark = [pytest.mark.xdist_group("spark"), pytest.mark.integration]
CLEAN = IMPERFECT[:-2]  # late events and repeats, no malformed record: the fast paths read it


@pytest.mark.parametrize("strategy,partitions,name,imperfect", [
    ("auto", 3, "events.jsonl", IMPERFECT), ("time", 3, "events.jsonl", IMPERFECT),
    ("auto", 1, "events.jsonl", IMPERFECT), ("auto", 2, "events.parquet", CLEAN),
    ("time", 2, "events.csv", CLEAN)])
def test_batch_job_gives_the_reference_matches(spark, tmp_path, strategy, partitions, name,
                                               imperfect):
    from dqcep.spark.batch import run_batch
    events = generate(tmp_path / name, 6000, *imperfect)
    want, errors, late = expected([events])
    stats = run_batch(spark, QUERIES.read_text(), [str(events)], str(tmp_path / "out"),
                      partitions=partitions, lateness=LATENESS, strategy=strategy)
    got = job_lines(tmp_path / "out")
    assert len(got) == len(set(got)), "a match was written twice"
    assert set(got) == want and len(want) > 20
    dead = [json.loads(x) for x in job_lines(tmp_path / "out", "dead-letter")]
    assert len(dead) == errors and (errors > 0) == (imperfect == IMPERFECT)
    assert all(d["where"].startswith(str(events)) and d["reason"] for d in dead)
    late_out = [json.loads(x)["event"]["id"] for x in job_lines(tmp_path / "out", "late")]
    assert sorted(late_out) == sorted(late) and late
    assert stats.duplicates > 0 and stats.matches == len(want)
    if strategy == "time":
        assert stats.slice_ms >= 60_000 and all(
            set(how) == {"time slices"} for how in stats.partitioning.values())
        # _stats.json holds the same structure (it was one newline-joined string)
        saved = json.loads((tmp_path / "out" / "_stats.json").read_text())
        assert saved["partitioning"] == stats.partitioning
        import dqcep  # local[2]'s Python workers import this checkout's dqcep
        assert saved["executors"] and {m for _, _, m in saved["executors"]} == {dqcep.__file__}


def test_formats_and_directories_agree(spark, tmp_path):
    """The same stream as msgpack files in a directory, and as Parquet; arrival order
    across files is their sorted order."""
    from dqcep.spark.batch import run_batch
    d = tmp_path / "in"
    d.mkdir()
    parts = [generate(d / f"part-{i}.msgpack", 2500, seed=i) for i in range(2)]
    parquet = generate(tmp_path / "events.parquet", 3000)
    for inputs, files in (([str(d)], parts), ([str(parquet)], [parquet])):
        want, _, _ = expected(files)
        out = tmp_path / ("out-" + Path(inputs[0]).name)
        run_batch(spark, QUERIES.read_text(), inputs, str(out), partitions=2,
                  lateness=LATENESS)
        assert set(job_lines(out)) == want and want


@pytest.mark.parametrize("corrupt", [False, True])
def test_parquet_split_by_row_groups_gives_the_whole_files_outputs(spark, tmp_path,
                                                                  monkeypatch, corrupt):
    """A Parquet file read as runs of row groups (one input task each) gives what one
    read of the file gives: matches, dead letters with the file's row numbers, late
    events, repeats across runs; a row group that cannot be read ends the file there."""
    import pyarrow.parquet as pq

    from dqcep.spark import source
    from dqcep.spark.batch import run_batch
    events = generate(tmp_path / "gen.parquet", 6000, *IMPERFECT)
    path = tmp_path / "events.parquet"
    pq.write_table(pq.read_table(events), path, row_group_size=700, compression="zstd")
    if corrupt:  # bytes in the middle of the data pages: one row group cannot be read
        data = bytearray(path.read_bytes())
        mid = pq.ParquetFile(path).metadata.row_group(4).column(6).data_page_offset
        data[mid + 20:mid + 60] = bytes(40)
        path.write_bytes(bytes(data))

    def run(split_rows, name):
        monkeypatch.setattr(source, "SPLIT_ROWS", split_rows)
        out = tmp_path / name
        stats = run_batch(spark, QUERIES.read_text(), [str(path)], str(out), partitions=2,
                          lateness=LATENESS)
        return stats, {what: sorted(job_lines(out, what))
                       for what in ("matches", "dead-letter", "late")}

    assert len(source.event_units([str(path)], split_rows=1500)) == 3  # 9 groups of 700
    whole, split = run(0, "whole"), run(1500, "split")
    assert split[1] == whole[1] and split[0] == whole[0]
    assert len(whole[1]["matches"]) > (5 if corrupt else 20) and whole[1]["late"] \
        and whole[0].duplicates
    assert any("row " in json.loads(x)["where"] for x in whole[1]["dead-letter"])
    broken = [x for x in whole[1]["dead-letter"] if "invalid Parquet" in x]
    assert bool(broken) == corrupt
    if not corrupt:
        want, errors, late = expected([path])
        assert set(whole[1]["matches"]) == want and len(whole[1]["dead-letter"]) == errors


def test_parquet_output_and_a_non_empty_output_directory(spark, tmp_path):
    from dqcep.core.errors import UserError
    from dqcep.spark.batch import run_batch
    events = generate(tmp_path / "events.jsonl", 3000)
    want, _, _ = expected([events])
    out = tmp_path / "out"
    run_batch(spark, QUERIES.read_text(), [str(events)], str(out), partitions=2,
              output_format="parquet", lateness=LATENESS)
    rows = spark.read.parquet(str(out / "matches")).collect()
    got = {(r.query, r.detected_at, tuple(sorted(r.events.items()))) for r in rows}
    assert len(rows) == len(got) == len(want) and got == {
        (m["query"], m["detected_at"], tuple(sorted(m["events"].items())))
        for m in map(json.loads, want)}
    with pytest.raises(UserError, match="not empty"):
        run_batch(spark, QUERIES.read_text(), [str(events)], str(out))


QUERY_A = "QUERY q PATTERN SEQ(A a, A b) WITHIN 1 ms"


def routed(router, batches):
    """Routed rows of source batches: (events (id, group, part), lines by output)."""
    import pyarrow as pa
    from dqcep.spark.source import ColumnPiece
    rows = pa.Table.from_batches([router.route_piece(b) if isinstance(b, ColumnPiece)
                                  else router.route(b) for b in batches]).to_pylist()
    lines = {}
    for r in rows:
        if r["group"] < 0:
            lines.setdefault(r["output"], []).append(r["line"])
    return ([(i, r["group"], r["part"]) for r in rows if r["group"] >= 0
             for i in block_events(router, r)[3].id.tolist()], lines)


def block_events(router, row):
    """(ts, file_index, seq, EventColumns) of a routed row's block, in the layout of a
    part engine of the router's spec (the router's, without a timeline column)."""
    from dqcep.spark.executor import decode_block
    return decode_block(router.assigner.engine, part_engine(router), row["block"])


def part_engine(router):
    if "_part_engine" not in router.__dict__:
        router._part_engine = router.spec.engine()
    return router._part_engine


def test_index_and_routing_late_and_duplicates(spark, tmp_path):
    """The index gives the maxima of earlier files and the repeated ids; routing follows
    arrival order across files, keeps the first copy of an id and diverts late events."""
    import msgpack

    from dqcep.spark.batch import job_index
    from dqcep.spark.executor import JobSpec, Router
    from dqcep.spark.partitioning import plan_partitioning
    from dqcep.spark.source import read_file
    files = {"a.msgpack": [(1, 100), (2, 50), (3, 80)], "b.msgpack": [(4, 60), (1, 100), (5, 80)]}
    paths = []
    for name, events in files.items():
        paths.append(tmp_path / name)
        paths[-1].write_bytes(b"".join(msgpack.packb({"id": i, "type": "A", "ts": t})
                                       for i, t in events))
    index = job_index(spark, [str(tmp_path)], None)
    assert index.earlier == {1: 100} and (index.lo, index.hi) == (50, 100)
    assert index.repeated.tolist() == [1] and (index.first_file[0], index.first_seq[0]) == (0, 0)
    # files whose ids do not overlap are not read again; repeats within a file still count
    (tmp_path / "c.msgpack").write_bytes(b"".join(msgpack.packb({"id": i, "type": "A", "ts": 90})
                                                  for i in (9, 7, 9, 8)))
    other = job_index(spark, [str(tmp_path)], None)
    assert other.repeated.tolist() == [1, 9] and other.first_file.tolist() == [0, 2] \
        and other.first_seq.tolist() == [0, 0] and other.earlier == {1: 100, 2: 100}
    (tmp_path / "c.msgpack").unlink()
    spec = JobSpec(QUERY_A, plan_partitioning(parse(QUERY_A).queries, "time"), 2, 1000)
    router = Router(spec, 20, index.earlier, index.repeated, index.first_file, index.first_seq)
    events, lines = routed(router, [b for i, p in enumerate(paths)
                                    for b in read_file(i, str(p), "msgpack")])
    late = [json.loads(x) for x in lines["late"]]
    # 100 - 50 > 20 and 100 - 60 > 20 (the maximum of the earlier file); 100 - 80 = 20: on time
    assert [x["event"]["id"] for x in late] == [2, 4] and late[0]["where"].endswith("a.msgpack:record 2 (byte 16)")
    assert sorted(i for i, _, _ in events) == [1, 3, 5]
    counts = [json.loads(x) for x in lines["_stats"]]
    assert sum(c["duplicates"] for c in counts) == 1 and sum(c["records"] for c in counts) == 6


@pytest.mark.parametrize("timeline", [None, "device"])
@pytest.mark.parametrize("fmt", ["jsonl", "csv", "parquet"])
def test_fast_paths_route_what_the_readers_route(tmp_path, monkeypatch, fmt, timeline):
    """JSON Lines, CSV and Parquet read by the kernels and Arrow (``ColumnPiece``s, in
    small blocks so that clean blocks take the fast path and others fall back) give the
    index and the routed rows the validator's path gives, late lines and their reasons
    included; with --timeline, the index's timelines too."""
    import msgpack
    import pyarrow as pa

    from dqcep.core.admission import AdmissionRule
    from dqcep.io import columnar
    from dqcep.runtime.compile import KIND_STR
    from dqcep.spark.executor import JobSpec, Router, sum_task_counts
    from dqcep.spark.partitioning import plan_partitioning
    from dqcep.spark.source import ColumnPiece, IdsAndTs, file_index_row, read_file
    monkeypatch.setattr(columnar, "JSON_BLOCK_BYTES", 3000)
    monkeypatch.setattr(columnar, "CSV_BLOCK_BYTES", 2000)
    monkeypatch.setattr(columnar, "FAST_PATH_MIN_BYTES", 0)
    monkeypatch.setattr(columnar, "PARQUET_BATCH_ROWS", 40)
    path = generate(tmp_path / f"events.{fmt}", 3000, *IMPERFECT)
    text = QUERIES.read_text()
    spec = JobSpec(text, plan_partitioning(parse(text).queries, "auto"), 3)

    rule = AdmissionRule(LATENESS, 3 * LATENESS, timeline) if timeline else LATENESS
    empty = np.zeros(0, np.int64)

    def run(fast):
        if timeline:  # the index reads every event's columns, its timeline among them
            indexer = Router(spec, rule, {}, empty, empty, empty)
            row = file_index_row(0, read_file(0, str(path), fmt, engine=indexer.assigner.engine
                                              if fast else None), router=indexer)
        else:
            row = file_index_row(0, read_file(0, str(path), fmt, positions=False,
                                              engine=IdsAndTs if fast else None))
        row = row.to_pylist()[0]
        # one file: the repeats are those within it, found by the index
        repeated = np.array(row["repeated"], np.int64)
        order = np.argsort(repeated)
        router = Router(spec, rule, {}, repeated[order], np.zeros(len(repeated), np.int64),
                        np.array(row["first_seq"], np.int64)[order])
        batches = list(read_file(0, str(path), fmt,
                                 engine=router.assigner.engine if fast else None))
        pieces = sum(isinstance(b, ColumnPiece) for b in batches)
        rows = pa.Table.from_batches([router.route_piece(b) if isinstance(b, ColumnPiece)
                                      else router.route(b) for b in batches]).to_pylist()
        events = []
        for r in rows:
            if r["group"] >= 0:
                ts, files, _, cols = block_events(router, r)
                # a string cell by its string: each run's dictionary codes them its own way
                words = part_engine(router).dictionary.values
                cells = [tuple(words[int(v)] if k == KIND_STR else v for v, k in zip(vs, ks))
                         for vs, ks in zip(cols.val.tolist(), cols.kind.tolist())]
                events += zip([r["group"]] * len(ts), [r["part"]] * len(ts), ts.tolist(),
                              files.tolist(), cols.id.tolist(), cols.type.tolist(), cells,
                              map(tuple, cols.kind.tolist()))
        events.sort()
        lines = {}
        for r in rows:
            if r["group"] < 0:
                lines.setdefault(r["output"], []).append(r["line"])
        stats, _ = sum_task_counts(lines.pop("_stats"))
        del row["first_seq"]
        return row, events, {k: sorted(v) for k, v in lines.items()}, stats, pieces

    slow, fast = run(False), run(True)
    assert slow[:4] == fast[:4]
    assert slow[4] == 0 and fast[4] > 3  # fast pieces and fallbacks both taken
    assert len(fast[2]["late"]) > 3 and len(fast[2]["dead-letter"]) > 3
    reasons = {json.loads(x)["reason"] for x in fast[2]["late"]}
    assert reasons == ({"lateness", "skew"} if timeline else {"lateness"})
    assert (len(msgpack.unpackb(fast[0]["timelines"])) > 10) if timeline \
        else fast[0]["timelines"] is None
    assert fast[3]["duplicates"] > 3 and fast[3]["records"] == 3000 + fast[3]["duplicates"]


def test_line_rows_write_the_same_bytes_as_one_row_per_line():
    """Spark's text writer ends each row with a newline: rows of lines joined by newlines
    give the file the lines' bytes; a row holds at most the limit unless one line is
    longer."""
    from hypothesis import given
    from hypothesis import strategies as st

    from dqcep.spark.executor import line_rows

    @given(st.lists(st.text(st.characters(blacklist_characters="\n"), max_size=12)),
           st.integers(1, 30))
    def check(lines, limit):
        data = "".join(x + "\n" for x in lines).encode()
        rows = line_rows(data, limit).to_pylist()
        assert "".join(r + "\n" for r in rows).encode() == data
        assert all(len(r.encode()) <= limit or "\n" not in r for r in rows)
        # greedy: the next row's first line would not have fitted in this one
        assert all(len(rows[i].encode()) + 1 + len(rows[i + 1].split("\n")[0].encode()) > limit
                   for i in range(len(rows) - 1))

    check()
    with pytest.raises(ValueError, match="newline"):
        line_rows(b"no end")


def test_routing_late_rule_is_the_engines_at_the_limits_of_time():
    """The batch job's late events are those ``dqcep.runtime.late_rule`` names, also for
    gaps near the ends of the ts range (no overflow) and rows with nothing before them."""
    import msgpack
    import pyarrow as pa

    from dqcep.core.events import TS_LIMIT
    from dqcep.runtime import late_rule
    from dqcep.spark.executor import JobSpec, Router
    from dqcep.spark.partitioning import plan_partitioning
    ts = [TS_LIMIT, -TS_LIMIT, TS_LIMIT - 7, 0, TS_LIMIT - 8, -TS_LIMIT]
    batch = pa.RecordBatch.from_pydict({
        "file_index": pa.array([0] * len(ts), pa.int64()),
        "seq": pa.array(range(len(ts)), pa.int64()),
        "where": [f"a:{i + 1}" for i in range(len(ts))],
        "id": pa.array([i + 1 for i in range(len(ts))], pa.int64()),
        "ts": pa.array(ts, pa.int64()),
        "file_before": pa.array([max(ts[:i]) if i else None for i in range(len(ts))],
                                pa.int64()),
        "event": [msgpack.packb({"id": i + 1, "type": "A", "ts": t}) for i, t in enumerate(ts)],
        "reason": pa.nulls(len(ts), pa.string())})
    before = np.array([TS_LIMIT] * (len(ts) - 1), np.int64)
    want = [2 + i for i in np.flatnonzero(late_rule(before, np.array(ts[1:], np.int64), 7))]
    spec = JobSpec(QUERY_A, plan_partitioning(parse(QUERY_A).queries, "time"), 2, 1000)
    empty = np.zeros(0, np.int64)
    _, lines = routed(Router(spec, 7, {}, empty, empty, empty), [batch])
    assert [json.loads(x)["event"]["id"] for x in lines["late"]] == want == [2, 4, 5, 6]


def test_source_rows_keep_positions_and_running_maxima(tmp_path):
    """The msgpack fast path and the readers' path give the same rows."""
    import msgpack
    import pyarrow as pa

    from dqcep.spark.source import read_file
    events = [{"id": i, "type": "A", "ts": ts} for i, ts in enumerate([5, 3, 9, 1], 1)]
    path = tmp_path / "e.msgpack"
    path.write_bytes(msgpack.packb({"events": events[:2]}) + msgpack.packb(events[2])
                     + msgpack.packb({"events": [events[3], {"ts": "x"}]}) + b"\xc1")
    rows = pa.Table.from_batches(list(read_file(3, str(path), "msgpack"))).to_pylist()
    assert [r["where"][len(str(path)) + 1:] for r in rows] == [
        "record 1 (byte 0) event 0", "record 1 (byte 0) event 1", "record 2 (byte 41)",
        "record 3 (byte 57) event 0", "record 3 (byte 57) event 1", "record 4 (byte 88)"]
    assert [r["id"] for r in rows] == [1, 2, 3, 4, None, None]
    assert [r["file_before"] for r in rows] == [None, 5, 5, 9, 9, 9]
    assert [msgpack.unpackb(r["event"]) if r["event"] else None for r in rows] == \
        events + [None, None]
    assert rows[4]["reason"].startswith("event has no 'type'") and "invalid msgpack" in rows[5]["reason"]
    assert [r["seq"] for r in rows] == list(range(6)) and {r["file_index"] for r in rows} == {3}


def test_msgpack_fast_path_reads_what_the_readers_read(tmp_path_factory):
    """Files of hostile and well-formed payloads: the kernel path and the readers'
    path give the same rows (positions, events, reasons)."""
    import msgpack
    import pyarrow as pa
    from hypothesis import HealthCheck, given, settings
    from hypothesis import strategies as st

    from dqcep.core.events import event_from_mapping
    from dqcep.spark.source import (IdsAndTs, _Batches, _msgpack_rows, _reader_rows,
                                    file_index_row, read_file)
    from tests.support.msgpack_payloads import payloads

    def rows(gen, out):
        batches = list(gen)
        if out.rows:
            batches.append(out.take())
        table = pa.Table.from_batches(batches) if batches else None
        out_rows = table.to_pylist() if table is not None else []
        for r in out_rows:
            if r["event"] is not None:
                r["event"] = event_from_mapping(msgpack.unpackb(r["event"], raw=False))
        return out_rows

    @settings(max_examples=examples(150), deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.lists(st.one_of(payloads(), payloads(good=True)), max_size=5))
    def check(records):
        path = tmp_path_factory.mktemp("mp") / "f.msgpack"
        path.write_bytes(b"".join(records))
        a, b = _Batches(0), _Batches(0)
        assert rows(_msgpack_rows(a, str(path)), a) == rows(_reader_rows(b, str(path),
                                                                         "msgpack"), b)
        # the index's fast read (whole blocks; record by record after a bad one) numbers
        # the events as the routing's read does
        assert index_row(path, IdsAndTs) == index_row(path, None)

    def index_row(path, engine):
        return file_index_row(0, read_file(0, str(path), "msgpack", positions=False,
                                           engine=engine)).to_pylist()

    check()


def test_journal_source_reads_closed_segments_once_with_the_running_maximum(spark, tmp_path):
    """One closed segment per micro-batch; file_before is the largest earlier ts of the
    whole journal; a restarted query reads only the segments it had not committed."""
    import msgpack

    from dqcep.io.journal import Journal
    from dqcep.spark.journal_source import JournalSource

    journal = Journal(tmp_path / "journal", fsync="never")

    def append(batch):
        journal.append("t", msgpack.packb({"events": batch}))
        journal.commit()
        journal._roll()  # close the segment: only closed segments are read

    ts = [10, 5, 30, 20, 25, 1]
    evs = [{"id": i, "type": "A", "ts": t} for i, t in enumerate(ts, 1)]
    append(evs[0:2])
    append(evs[2:4])
    spark.dataSource.register(JournalSource)

    def run():
        df = (spark.readStream.format("dqcep_journal").option("path", str(tmp_path / "journal"))
              .option("index", str(tmp_path / "ck" / "index")).load())
        got = []
        q = (df.writeStream.option("checkpointLocation", str(tmp_path / "ck" / "q"))
             .foreachBatch(lambda b, _: got.extend(b.collect())).start())
        q.processAllAvailable()
        q.stop()
        return [(r.id, r.file_before) for r in sorted(got, key=lambda r: (r.file_index, r.seq))]

    assert run() == [(1, None), (2, 10), (3, 10), (4, 30)]
    # the query registered as a consumer: retention deletes what it and the service read
    assert [p.name for p in (tmp_path / "journal" / "consumers").iterdir()][0].startswith("spark-")
    journal.checkpointed("service", 10**9)
    assert journal.trim() > 0  # Spark commits a micro-batch's end when the next one starts
    assert not (tmp_path / "journal" / "00000000000000000000.seg").exists()
    append(evs[4:6])
    journal.append("t", b"\xc1")  # in the open segment: not read yet
    journal.commit()
    assert run() == [(5, 30), (6, 30)]
    journal.close()


# ------------------------------------------------------------------ streaming

def journal_of(path: Path, tmp: Path, segment_bytes=60_000) -> Path:
    """The generated msgpack stream as a closed journal, and a payload that is not msgpack."""
    import msgpack

    from dqcep.io.journal import Journal
    journal = Journal(tmp / "journal", segment_bytes=segment_bytes, fsync="never")
    for obj in msgpack.Unpacker(open(path, "rb"), raw=False):
        journal.append("t", msgpack.packb(obj))
        journal.commit()
    journal.append("t", b"\xc1 not msgpack")
    journal.close()
    return tmp / "journal"


def stream_lines(out: Path, what="matches") -> list[str]:
    return [x for f in sorted((out / what).rglob("part-*")) for x in f.read_text().splitlines()]


STREAM_IMPERFECT = ("--batch-size", "200", "--out-of-order", "0.1", "--slack", "400",
                    "--late", "0.01", "--late-max", "5000", "--duplicates", "0.05",
                    "--malformed", "0.005")


@pytest.mark.parametrize("strategy", ["auto", "time"])
def test_stream_job_gives_the_reference_matches(spark, tmp_path, strategy):
    from dqcep.spark.stream import run_stream
    events = generate(tmp_path / "events.msgpack", 5000, *STREAM_IMPERFECT)
    want, errors, late = expected([events])
    journal = journal_of(events, tmp_path)
    run_stream(spark, QUERIES.read_text(), str(journal), str(tmp_path / "out"),
               str(tmp_path / "ck"), partitions=2, lateness=LATENESS, until_idle=True,
               trigger_seconds=0.5, strategy=strategy, slice_ms=90_000)
    got = stream_lines(tmp_path / "out")
    assert len(got) == len(set(got)) and set(got) == want and want
    late_out = [json.loads(x)["event"]["id"] for x in stream_lines(tmp_path / "out", "late")]
    # the streaming job decides lateness before dropping repeats: a late repeat of an
    # event is reported too (documented in docs/spark.md)
    late_rows, latest = [], None
    for _, e in read_events(str(events), on_error=lambda err: None):
        if latest is not None and latest - e.ts > LATENESS:
            late_rows.append(e.id)
        latest = e.ts if latest is None else max(latest, e.ts)
    assert sorted(late_out) == sorted(late_rows) and set(late) <= set(late_out) and late
    dead = [json.loads(x) for x in stream_lines(tmp_path / "out", "dead-letter")]
    assert len(dead) == errors + 1  # the generator's malformed events and the bad payload
    # the counts of the summary line, summed over the micro-batches
    from dqcep.spark.stream import stream_stats
    stats = stream_stats(str(tmp_path / "out"))
    import msgpack

    from dqcep.plan import build_plan
    from dqcep.runtime import Engine
    from dqcep.spark.executor import event_columns
    engine = Engine(build_plan(parse(QUERIES.read_text()).queries))
    rows = [e for _, e in read_events(str(events), on_error=lambda err: None)]
    needed = engine.needed(event_columns(engine, [
        msgpack.packb(e.as_mapping()) for e in rows]))
    seen, repeats, n_needed, latest = set(), 0, 0, None
    for e, used in zip(rows, needed):  # pushdown comes first: repeats of needed events count
        on_time = latest is None or latest - e.ts <= LATENESS
        latest = e.ts if latest is None else max(latest, e.ts)
        n_needed += bool(used) and on_time
        repeats += bool(used) and on_time and e.id in seen
        seen.add(e.id)
    assert repeats > 0
    assert (stats.records, stats.dead_letter, stats.late, stats.matches, stats.duplicates,
            stats.after_pushdown) == (len(rows) + errors + 1, len(dead), len(late_out),
                                      len(got), repeats, n_needed - repeats)


def test_stream_job_killed_and_restarted_loses_and_repeats_nothing(tmp_path):
    """SIGKILL while micro-batches are being written, then a restart from the
    checkpoint: every match exactly once."""
    import signal
    import time
    events = generate(tmp_path / "events.msgpack", 5000, "--batch-size", "200",
                      "--out-of-order", "0.1", "--slack", "400")
    want, _, _ = expected([events])
    journal = journal_of(events, tmp_path, segment_bytes=160_000)  # 4 micro-batches, 2 before the kill
    args = [sys.executable, "-m", "dqcep", "spark", "stream", str(QUERIES), "-i", str(journal),
            "-o", str(tmp_path / "out"), "--checkpoint", str(tmp_path / "ck"), "--master",
            "local[2]", "--partitions", "2", "--lateness", str(LATENESS), "--trigger", "0.5",
            "--until-idle"]
    log = tmp_path / "first-run.log"  # a file: a pipe nobody reads would fill and block
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=log.open("w"),
                            start_new_session=True)
    deadline = time.monotonic() + 240
    while len(list((tmp_path / "out" / "matches").glob("batch=*"))) < 2:
        assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
        time.sleep(0.2)
    os.killpg(proc.pid, signal.SIGKILL)  # the driver and its Python workers
    proc.wait()
    done = subprocess.run(args, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    got = stream_lines(tmp_path / "out")
    assert len(got) == len(set(got)), "a match was written twice"
    assert set(got) == want and want
    # the same summary line as dqcep spark run, counting each micro-batch once
    n_events = sum(1 for _ in read_events(str(events)))
    assert re.search(rf"dqcep spark stream: {n_events + 1} records, 1 dead-lettered, 0 "
                     rf"duplicates, \d+ late, \d+ after pushdown; {len(got)} matches -> ",
                     done.stderr.splitlines()[-1]), done.stderr[-3000:]


def test_a_segment_task_reads_its_segment_only(tmp_path):
    """A segment closed after the micro-batch was planned belongs to the next one."""
    import msgpack
    import pyarrow as pa

    from dqcep.io.journal import Journal
    from dqcep.spark.journal_source import (closed_segments, following, payload_reader,
                                            read_max, read_segment)
    journal = Journal(tmp_path / "j", fsync="never")
    for first in (1, 3):
        journal.append("t", msgpack.packb({"events": [{"id": i, "type": "A", "ts": i}
                                                      for i in (first, first + 1)]}))
        journal.commit()
        journal._roll()
    journal.close()
    segment = closed_segments(tmp_path / "j")[0]
    after = following(tmp_path / "j", segment)
    reader = payload_reader({"format": "msgpack"})
    rows = pa.Table.from_batches(list(read_segment(0, str(segment), None, reader,
                                                   str(tmp_path / "index"), after))).to_pylist()
    assert [r["id"] for r in rows] == [1, 2] and read_max(tmp_path / "index", after) == 2


def test_the_journal_source_parses_the_map_once_and_ships_the_rules(tmp_path, monkeypatch):
    """The stream reader parses the --map text it is given once; a task reads with the
    copy it is sent (the reader pickled), parsing nothing."""
    import pickle

    import msgpack
    import pyarrow as pa
    from pyspark.sql.datasource import InputPartition

    from dqcep.io.journal import Journal
    from dqcep.spark.journal_source import JournalStreamReader, closed_segments, following
    parses = []
    real = TopicMap.parse.__func__
    monkeypatch.setattr(TopicMap, "parse", classmethod(
        lambda cls, *a, **k: parses.append(a) or real(cls, *a, **k)))
    journal = Journal(tmp_path / "j", fsync="never")
    journal.append("sensors/kitchen/Temperature", b'{"value": 23.5}', 1_795_687_200_000_000)
    journal.commit()
    journal._roll()
    journal.close()
    text = (ROOT / "examples" / "sensors.toml").read_text()
    reader = JournalStreamReader({"path": str(tmp_path / "j"), "index": str(tmp_path / "ix"),
                                  "map": text, "map_name": "sensors.toml"})
    assert len(parses) == 1
    task = pickle.loads(pickle.dumps(reader))
    segment = closed_segments(tmp_path / "j")[0]
    part = InputPartition(("segment", int(segment.stem), str(segment), None,
                           following(tmp_path / "j", segment)))
    rows = pa.Table.from_batches(list(task.read(part))).to_pylist()
    events = [msgpack.unpackb(r["event"]) for r in rows]
    assert [(e["type"], e["room"]) for e in events] == [("Temperature", "kitchen")], rows
    assert len(parses) == 1


def test_event_log_gives_the_jobs_stages_and_the_model_its_figures(tmp_path):
    """bench/eventlog.py over a real job's event log (bench_spark.py --child on local[1]):
    the engine stage took every routed event, every stage that ran has task time, and the
    model, calibrated on this run, gives back its wall time."""
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import bench_spark
        from eventlog import log_files, read, summarize
    finally:
        sys.path.pop(0)
    events = generate(tmp_path / "events.jsonl", 3000)
    logs = tmp_path / "logs"
    logs.mkdir()
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "bench_spark.py"), "--child", "--master",
         "local[1]", "--partitions", "2", "--input", str(events), "--output",
         str(tmp_path / "out"), "--eventlog", str(logs)], capture_output=True, text=True,
        timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    figures = json.loads(proc.stdout.strip().splitlines()[-1])
    seconds = figures["seconds"]
    (log,) = log_files(logs)
    summary = summarize(read(log))
    assert summary["jobs"] >= 1 and summary["stages_run"] >= 1
    assert all(s["task_ms"] >= 0 and s["tasks"] >= 1 for s in summary["stages"])
    # the engine stage read every row the routing stage wrote into the shuffle: blocks of
    # events (one per source batch and part) and lines, far fewer rows than events
    shuffled = [s["records_in"] for s in summary["stages"] if s["records_in"] and any(
        t["records_out"] == s["records_in"] for t in summary["stages"] if t is not s)]
    assert shuffled and 0 < shuffled[0] < figures["after_pushdown"] / 10
    stages = bench_spark.calibrate(summary, summary)  # demand 1: no second run here
    busy = sum(bench_spark.stage_time(s, 1, 1) for s in stages)
    assert busy == pytest.approx(summary["task_ms"] / 1000)  # one slot: the work, in sequence
    fixed = seconds - busy
    assert bench_spark.predict(stages, fixed, 1, 1) == pytest.approx(seconds)
    assert bench_spark.predict(stages, fixed, 8, 2, 16) < seconds
    # the task time added events cost: a run with every stage's task time tripled, minus
    # this run, is twice each stage's; a stage only one run has is left out
    tripled = {**summary, "stages": [{**s, "task_ms": 3 * s["task_ms"]}
                                     for s in summary["stages"]]
               + [{"id": 10**6, "task_ms": 5}]}
    assert bench_spark.marginal_stages(summary, tripled) == {
        s["id"]: 2 * s["task_ms"] for s in summary["stages"]}




POLICIES = """
QUERY fire PATTERN SEQ(Temperature+ t[], Smoke s)
WHERE [room] AND t[i].value > t[i-1].value AND count(t) >= 2 WITHIN 3 s
AFTER MATCH SKIP PAST LAST EVENT;
-- a.room = b.room would key it, but a policy's partition is its [attr]s: not split
QUERY pairs PATTERN SEQ(Temperature a, Temperature b) WHERE a.room = b.room WITHIN 5 s
AFTER MATCH SKIP PAST LAST EVENT;
QUERY entered PATTERN SEQ(Door d, Motion m, NOT Door c) WHERE [room] WITHIN 20 s
AFTER MATCH SKIP TO NEXT EVENT;
QUERY unkeyed PATTERN SEQ(Motion m, Door d) WITHIN 4 s AFTER MATCH SKIP TO NEXT EVENT;
QUERY sliced PATTERN SEQ(Motion m, Door d) WITHIN 4 s
"""
POLICY_NAMES = ("fire", "pairs", "entered", "unkeyed", "sliced")


@pytest.mark.parametrize("strategy,partitions", [("auto", 3), ("time", 2)])
def test_batch_job_runs_kleene_items_and_strategies(spark, tmp_path, strategy, partitions):
    """Spec sections 5 and 6 on the batch job (windows small enough for the reference to
    enumerate every list): Kleene lists (owned by their first element's key
    or start), skip-till-next-match keyed and sliced, strict-contiguity (always sliced,
    slices of every type) and partition-contiguity (keyed; every type carrying the key
    goes to its partition): exactly the reference's matches."""
    from dqcep.spark.batch import run_batch
    events = generate(tmp_path / "events.jsonl", 4000, *CLEAN)
    text = SECTION5 + ";" + POLICIES
    want, _, _ = expected([events], text=text)
    stats = run_batch(spark, text, [str(events)], str(tmp_path / "out"),
                      partitions=partitions, lateness=LATENESS, strategy=strategy)
    got = job_lines(tmp_path / "out")
    assert len(got) == len(set(got)), "a match was written twice"
    assert set(got) == want
    names = {json.loads(x)["query"] for x in want}
    assert len(want) > 20 and {"rising", "forced_door", "smoke_after_door", "next_unkeyed",
                               "strict", "by_room", *POLICY_NAMES} <= names
    how = stats.partitioning
    assert "time slices" in how["strict"]
    if strategy == "auto":
        assert how["by_room"]["keyed"]["*"] == "room" and "keyed" in how["rising"]
    # section 6: a policy query is keyed by its [attr] or not split, under either choice
    assert "keyed" in how["fire"] and "keyed" in how["entered"]
    assert "not split" in how["pairs"] and "not split" in how["unkeyed"]
    assert "time slices" in how["sliced"]


def test_the_kleene_example_runs_on_the_batch_job(spark, tmp_path):
    """examples/iot-kleene.cep on the batch job: the one match dqcep run's engines give
    (tests/cli/test_cli.py; a dqcep spark run of its own took 40-75 s of .ci/run for a JVM)."""
    from dqcep.spark.batch import run_batch
    events = tmp_path / "e.jsonl"
    events.write_text(FORCED_DOOR_EVENTS)
    run_batch(spark, (ROOT / "examples/iot-kleene.cep").read_text(), [str(events)],
              str(tmp_path / "out"), partitions=2)
    assert job_lines(tmp_path / "out") == FORCED_DOOR_MATCHES


def test_events_a_declared_schema_refuses_are_dead_letters_of_the_batch_job(spark, tmp_path):
    """EVENT A(x INT): the batch job dead-letters the A whose x has a fraction or is a
    string, with their reasons, and gives the one match dqcep run's engines give
    (tests/cli/test_cli.py)."""
    from dqcep.spark.batch import run_batch
    events = tmp_path / "e.jsonl"
    events.write_text(MISDECLARED_EVENTS)
    stats = run_batch(spark, MISDECLARED_QUERY, [str(events)], str(tmp_path / "out"),
                      partitions=2)
    out = tmp_path / "out"
    assert [json.loads(x)["events"] for f in sorted((out / "matches").rglob("part-*"))
            for x in f.read_text().splitlines()] == [{"a": 1, "b": 5}]
    dead = sorted(json.loads(x)["reason"] for f in (out / "dead-letter").rglob("part-*")
                  for x in f.read_text().splitlines())
    assert dead == ["A.s is declared STRING, got a boolean",
                    "A.x is declared INT, got a number with a fraction"]
    assert stats.dead_letter == 2


def test_stream_job_reads_device_feeds_through_the_map(spark, tmp_path):
    """examples/sensors.toml's device feeds (tests/support/feeds.py: the messages
    tests/service/test_feeds.py publishes to the service), journaled as the service journals
    them (2 ms apart): dqcep spark stream over that journal with the same map gives the
    reference's matches once each, and dead-letters the misdeclared probes, named by
    their journal places."""
    import time
    from dqcep.io.journal import Journal
    from dqcep.spark.stream import run_stream
    from tests.support.feeds import MAP, QUERIES, expected, feed
    journal = tmp_path / "journal"
    writer = Journal(journal)
    start_us = int(time.time() * 1e6)
    sent = list(feed(1500))
    for i, (topic, payload, _) in enumerate(sent):
        writer.append(topic, payload, start_us + 2000 * i)
    writer.commit()
    writer.close()
    want = expected(journal, sent)
    assert len(want) > 20
    run_stream(spark, QUERIES.read_text(), str(journal), str(tmp_path / "spark"),
               str(tmp_path / "spark-ck"), partitions=2, lateness=30000, topic_map=TopicMap.load(MAP),
               until_idle=True, trigger_seconds=0.5)
    spark_lines = [x for f in sorted((tmp_path / "spark" / "matches").rglob("part-*"))
                   for x in f.read_text().splitlines()]
    assert len(spark_lines) == len(set(spark_lines)) and set(spark_lines) == want
    misdeclared = {i for i, (_, _, intent) in enumerate(sent) if intent is None}
    spark_dead = [json.loads(x) for f in (tmp_path / "spark" / "dead-letter").rglob("part-*")
                  for x in f.read_text().splitlines()]
    assert sorted(d["where"] for d in spark_dead) == sorted(
        f"{journal.resolve()}:offset {i}" for i in misdeclared) and misdeclared


def stream_to_the_end(spark, tmp_path, text: str, n: int) -> tuple[list[str], set[str]]:
    """A generated imperfect stream of n events through the streaming job until its
    end: (the matches it wrote, the reference's)."""
    from dqcep.spark.stream import run_stream
    events = generate(tmp_path / "events.msgpack", n, *STREAM_IMPERFECT)
    want, _, _ = expected([events], text=text)
    journal = journal_of(events, tmp_path)
    run_stream(spark, text, str(journal), str(tmp_path / "out"), str(tmp_path / "ck"),
               partitions=2, lateness=LATENESS, until_idle=True, trigger_seconds=0.5,
               slice_ms=90_000)
    return stream_lines(tmp_path / "out"), want


def test_stream_job_runs_kleene_items_strategies_and_policies(spark, tmp_path):
    """Sections 5 and 6 on the streaming job: a policy's state per key (and for the part
    not split) across micro-batches, its waiting matches decided by event-time timers."""
    got, want = stream_to_the_end(spark, tmp_path, SECTION5 + ";" + POLICIES, 3000)
    assert len(got) == len(set(got)) and set(got) == want and len(want) > 20
    assert set(POLICY_NAMES) <= {json.loads(x)["query"] for x in want}


def thresholds(tmp_path: Path) -> str:
    """examples/iot-thresholds.cep beside the iot queries, its table examples/rooms.sql
    in a SQLite file named by its absolute path (the executors' working directories
    are not ours)."""
    import sqlite3
    db = tmp_path / "rooms.db"
    with sqlite3.connect(db) as conn:
        conn.executescript((ROOT / "examples" / "rooms.sql").read_text())
    lookups = (ROOT / "examples" / "iot-thresholds.cep").read_text().replace(
        "sqlite:///rooms.db", f"sqlite:///{db}").replace("QUERY overheating", "QUERY hot")
    return lookups + ";\n" + QUERIES.read_text()


@pytest.mark.parametrize("strategy", ["auto", "time"])
def test_batch_job_reads_lookup_tables_from_a_broadcast(spark, tmp_path, strategy):
    """A threshold per room from a lookup table, read once on the driver and broadcast:
    the executors' engines (and the routing's pushdown, which reads the threshold)
    find exactly the reference's matches over the same table."""
    from dqcep.spark.batch import run_batch
    text = thresholds(tmp_path)
    events = generate(tmp_path / "events.jsonl", 6000, *CLEAN)
    want, _, _ = expected([events], text=text)
    run_batch(spark, text, [str(events)], str(tmp_path / "out"), partitions=2,
              lateness=LATENESS, strategy=strategy)
    got = job_lines(tmp_path / "out")
    assert len(got) == len(set(got)) and set(got) == want
    assert {json.loads(x)["query"] for x in want} >= {"hot", "overheating"}


def test_stream_job_reads_lookup_tables(spark, tmp_path):
    """The streaming job: the tables read once when it starts, shipped with its tasks.
    (This stream also ends with a match inside the last --lateness ms: the end-of-stream
    row once carried the watermark as its time, Spark dropped it as late, and that
    match was lost.)"""
    got, want = stream_to_the_end(spark, tmp_path, thresholds(tmp_path), 6000)
    assert len(got) == len(set(got)) and set(got) == want
    assert any(json.loads(x)["query"] == "hot" for x in want)


def test_a_task_over_the_budget_fails_the_job_with_the_line(spark, tmp_path):
    """A batch job whose task engine outgrows the budget (--max-partial-matches) fails
    with the query's line, as the CLI says it (exit 2), not an executor out of memory
    (tests/runtime/test_budget.py has the rule on the task's engine)."""
    from dqcep.core.errors import UserError
    from dqcep.spark.batch import run_batch
    from dqcep.spark.cli import _executor_errors
    from tests.support.workloads import RUNAWAY_QUERIES, runaway_events
    path = tmp_path / "e.jsonl"
    path.write_text("".join(json.dumps(e) + "\n" for e in runaway_events(rooms=("r1",), n=14)))
    with pytest.raises(UserError, match="^query rising stopped: KLEENE Temperature"):
        with _executor_errors():  # 2^14 lists: past a budget of 4096
            run_batch(spark, RUNAWAY_QUERIES, [str(path)], str(tmp_path / "out"), partitions=2,
                      budget=4096)



def test_stream_job_takes_the_journals_ticks_as_the_service_does(spark, tmp_path):
    """Spec section 7's ticks in a journal: the service and `dqcep spark stream` over
    the same journal give the same rows, and the reference's. door-3 opens at 1 s; a
    tick at 20 s makes its alert final (lateness 1 s), so door-3's close at 5 s that
    comes after it is late: without the tick it would be admitted and block the alert."""
    import msgpack

    from dqcep.core.admission import Tick
    from dqcep.core.events import Event
    from dqcep.io.journal import TICK_TOPIC, Journal, tick_payload
    from dqcep.spark.stream import run_stream
    from tests.support.journal_service import config, finish, lines

    text = ("QUERY left_open PATTERN SEQ(Door o, NOT Door c) WHERE o.open = true AND "
            "c.open = false AND c.device = o.device WITHIN 8 s")
    queries = tmp_path / "doors.cep"
    queries.write_text(text)
    records = [Event(1, "Door", 1000, {"device": "d3", "open": True}), Tick(20_000),
               Event(2, "Door", 5000, {"device": "d3", "open": False}),
               Event(3, "Door", 19_500, {"device": "d4", "open": True}),
               Event(4, "Door", 21_000, {"device": "d4", "open": False}), Tick(40_000),
               Event(5, "Door", 40_500, {"device": "d5", "open": True})]
    journal = Journal(tmp_path / "journal", segment_bytes=120, fsync="never")
    for r in records:
        if isinstance(r, Tick):
            journal.append(TICK_TOPIC, tick_payload(r.at))
        else:
            journal.append("t", msgpack.packb(r.as_mapping()))
        journal.commit()
    journal.close()
    reference = ReferenceMatcher(parse(text).queries, lateness=1000)
    want = {json.dumps(m.to_json_obj()) for m in reference.run(records)}
    assert len(want) == 2 and reference.late_ids == [2]
    run_stream(spark, text, str(tmp_path / "journal"), str(tmp_path / "out"),
               str(tmp_path / "ck"), partitions=2, lateness=1000, until_idle=True,
               trigger_seconds=0.5)
    assert set(stream_lines(tmp_path / "out")) == want
    assert [json.loads(x)["event"]["id"] for x in stream_lines(tmp_path / "out", "late")] \
        == [2]
    # (the service last: it deletes the closed segments it has checkpointed past)
    svc = finish(config(tmp_path, fmt=None, lateness=1000, queries=queries))
    assert {json.dumps(m) for m in lines(Path(svc.cfg.output))} == want
    assert [e["event"]["id"] for e in lines(Path(svc.cfg.late))] == [2]
    assert svc.counts["ticks"] == 2


def test_stream_job_admits_by_timeline_and_skew_as_the_service_does(spark, tmp_path):
    """--timeline device --skew (spec section 7) over a journal of many segments: device
    clocks 0, 3, 5 and 8 s behind, each up to 1.2 s out of order, and ticks. The stream
    job's router admits with the engines' kernel, the timelines running on from segment
    to segment: the same matches, late events and reasons as the service over the same
    journal and the reference matcher."""
    import random

    import msgpack

    from dqcep.core.admission import AdmissionRule, Tick
    from dqcep.core.events import Event
    from dqcep.io.journal import TICK_TOPIC, Journal, tick_payload
    from dqcep.spark.stream import run_stream
    from tests.support.journal_service import config, finish, lines

    text = ("QUERY rise PATTERN SEQ(T a, T b) WHERE b.device = a.device AND b.v > a.v "
            "WITHIN 3 s;\nQUERY quiet PATTERN SEQ(T a, NOT T n) WHERE n.device = a.device "
            "WITHIN 2 s")
    queries = tmp_path / "q.cep"
    queries.write_text(text)
    rng = random.Random(11)
    behind = {"d1": 0, "d2": 3000, "d3": 5000, "d4": 8000}
    records, i = [], 0
    for step in range(120):
        device = rng.choice(list(behind))
        i += 1
        ts = 20_000 + step * 150 - behind[device] - rng.randrange(0, 1200)
        records.append(Event(i, "T", ts, {"device": device, "v": rng.randrange(10)}))
        if step % 40 == 39:
            records.append(Tick(20_000 + step * 150 + 500))
    rule = AdmissionRule(500, 6000, "device")
    journal = Journal(tmp_path / "journal", segment_bytes=300, fsync="never")
    for r in records:
        journal.append(TICK_TOPIC, tick_payload(r.at)) if isinstance(r, Tick) else \
            journal.append("t", msgpack.packb(r.as_mapping()))
        journal.commit()
    journal.close()
    reference = ReferenceMatcher(parse(text).queries, lateness=rule)
    want = {json.dumps(m.to_json_obj()) for m in reference.run(records)}
    late = sorted(zip(reference.late_ids, reference.late_why))
    assert want and {w for _, w in late} == {"lateness", "skew"}  # both reasons occur
    run_stream(spark, text, str(tmp_path / "journal"), str(tmp_path / "out"),
               str(tmp_path / "ck"), partitions=2, lateness=rule, until_idle=True,
               trigger_seconds=0.5)
    got = stream_lines(tmp_path / "out")
    assert len(got) == len(set(got)) and set(got) == want
    assert sorted((json.loads(x)["event"]["id"], json.loads(x)["reason"])
                  for x in stream_lines(tmp_path / "out", "late")) == late
    svc = finish(config(tmp_path, fmt=None, lateness=500, skew=6000, timeline="device",
                        queries=queries))
    assert {json.dumps(m) for m in lines(Path(svc.cfg.output))} == want
    assert sorted((e["event"]["id"], e["reason"]) for e in lines(Path(svc.cfg.late))) == late


def test_batch_job_admits_by_timeline_and_skew_across_files(spark, tmp_path):
    """dqcep spark run --timeline device --skew (spec section 7) over 22 files read in
    parallel (JSON Lines, msgpack and Parquet), device clocks 0, 3, 5 and 8 s behind,
    each up to 1.2 s out of order, a repeated id and a misdeclared event: the index
    chains each file's timelines to the next, so the matches, late events and reasons
    are the reference's over the files in order (and dqcep run's)."""
    import random

    import msgpack
    import pyarrow as pa
    import pyarrow.parquet as pq

    from dqcep.core.admission import AdmissionRule
    from dqcep.core.events import Event
    from dqcep.spark.batch import run_batch

    text = ("EVENT T(device STRING, v INT);\n"
            "QUERY rise PATTERN SEQ(T a, T b) WHERE b.device = a.device AND b.v > a.v "
            "WITHIN 3 s;\nQUERY quiet PATTERN SEQ(T a, NOT T n) WHERE n.device = a.device "
            "WITHIN 2 s")
    rng = random.Random(5)
    behind = {"d1": 0, "d2": 3000, "d3": 5000, "d4": 8000}
    events = []
    for step in range(240):
        device = rng.choice(list(behind))
        ts = 20_000 + step * 150 - behind[device] - rng.randrange(0, 1200)
        events.append({"id": step + 1, "type": "T", "ts": ts, "device": device,
                       "v": rng.randrange(10)})
    events.insert(100, dict(events[60], v=99))       # a repeat: the first copy wins
    events.insert(150, dict(events[149], id=1000, v="x"))  # misdeclared: a dead letter
    rule = AdmissionRule(500, 6000, "device")
    inputs = tmp_path / "in"
    inputs.mkdir()
    for f in range(22):  # short files: a device's T(k) often comes from a file before
        chunk = events[f * 11:(f + 1) * 11]
        name = inputs / f"{f:02d}.{('jsonl', 'msgpack', 'parquet')[f % 3]}"  # in name order
        if f % 3 == 0:
            name.write_text("".join(json.dumps(e) + "\n" for e in chunk))
        elif f % 3 == 1:
            name.write_bytes(b"".join(msgpack.packb(e) for e in chunk))
        else:
            pq.write_table(pa.Table.from_pylist(chunk), name)
    seen, records = set(), []
    for e in events:
        if e["id"] not in seen and isinstance(e["v"], int):
            seen.add(e["id"])
            records.append(Event(e["id"], "T", e["ts"], {"device": e["device"], "v": e["v"]}))
    parsed = parse(text)
    reference = ReferenceMatcher(parsed.queries, (), parsed.tables, lateness=rule)
    want = {json.dumps(m.to_json_obj()) for m in reference.run(records)}
    late = sorted(zip(reference.late_ids, reference.late_why))
    assert want and {w for _, w in late} == {"lateness", "skew"}  # both reasons occur
    stats = run_batch(spark, text, [str(inputs)], str(tmp_path / "out"), partitions=2,
                      lateness=rule)
    got = job_lines(tmp_path / "out")
    assert len(got) == len(set(got)) and set(got) == want
    assert sorted((json.loads(x)["event"]["id"], json.loads(x)["reason"])
                  for x in job_lines(tmp_path / "out", "late")) == late
    assert stats.duplicates == 1 and stats.dead_letter == 1 and stats.late == len(late)
    (tmp_path / "q.cep").write_text(text)  # dqcep run: one file, the 22 in order
    (tmp_path / "all.jsonl").write_text("".join(json.dumps(e) + "\n" for e in events))
    run = subprocess.run([sys.executable, "-m", "dqcep", "run", str(tmp_path / "q.cep"),
                          "--input", str(tmp_path / "all.jsonl"), "--on-bad-event", "skip",
                          "--lateness", "500", "--skew", "6000", "--timeline", "device",
                          "--output", str(tmp_path / "run.jsonl")],
                         capture_output=True, text=True, cwd=ROOT)
    assert run.returncode == 0, run.stderr
    assert set((tmp_path / "run.jsonl").read_text().splitlines()) == want
    reasons = [w for _, w in late]
    assert (f"{len(late)} event(s) arrived late and were left out: "
            f"{reasons.count('lateness')} more than --lateness 500 ms behind their timeline; "
            f"{reasons.count('skew')} more than --skew 6000 ms") in run.stderr, run.stderr


def test_stream_router_admits_by_a_timeline_no_query_reads():
    """The timeline attribute is read for admission alone when no query names it: the
    stream's router drops it before pushdown and routing (it reached the pushdown,
    whose store has one column fewer)."""
    import msgpack
    import pandas as pd

    from dqcep.core.admission import AdmissionRule
    from dqcep.spark.executor import JobSpec
    from dqcep.spark.partitioning import plan_partitioning
    from dqcep.spark.stream import GROUP_LATE, route_batches

    class FirstSegment:  # the chain of a journal's first segment, its last too
        def load(self, segment):
            return None, []

        def save(self, segment, g, engine):
            pass

    text = "QUERY rise PATTERN SEQ(T a, T b) WHERE b.v > a.v WITHIN 3 s"
    spec = JobSpec(text, plan_partitioning(parse(text).queries, "auto"), 2, 1000)
    events = [(1, 10_000, "d1"), (2, 6_000, "d2"), (3, 10_100, "d1"), (4, 9_000, "d1"),
              (5, 6_100, "d2")]
    df = pd.DataFrame({
        "file_index": 0, "seq": range(len(events)), "where": [f"s:{i}" for i, *_ in events],
        "id": [i for i, *_ in events], "ts": [t for _, t, _ in events],
        "file_before": [max([t for _, t, _ in events[:n]] or [t])
                        for n, (_, t, _) in enumerate(events)],
        "event": [msgpack.packb({"id": i, "type": "T", "ts": t, "device": d, "v": i})
                  for i, t, d in events],
        "reason": None})
    rule = AdmissionRule(500, 5000, "device")
    out = pd.concat(route_batches(spec, rule, FirstSegment(), iter([df])))
    late = out[out["group"] == GROUP_LATE]
    assert sorted(zip(late["id"], late["reason"])) == [(4, "lateness")]
    routed = out[out["group"] >= 0]
    assert sorted(set(routed["id"].dropna().astype(int))) == [1, 2, 3, 5]
