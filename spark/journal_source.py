"""The MQTT ingest journal as a replayable Spark streaming source.

``spark.readStream.format("dqcep_journal").option("path", JOURNAL).option("index",
DIR).load()`` reads the journal's **closed** segments (``*.seg``: fsynced,
renamed into place atomically, in increasing name order; see
``dqcep/io/journal.py``), one segment per micro-batch. The offset is
``{"next": s}``: the name (first record offset) of the next segment to read,
recorded by Spark in the query's checkpoint, so a restarted query reads exactly
what it had not committed, and segments deleted by the journal's retention
shift nothing. On commit the query registers itself as a consumer of the
journal (``consumers/spark-<hash of the index dir>.offset``), so retention keeps
what it has not read.

Rows have the batch source's columns (``dqcep.spark.source``): ``file_index`` is
the segment's name, ``where`` is ``journal:offset N [event i]``, and
``file_before`` is the largest ts of the events (and ticks: a tick is a row with
a ts and neither an event nor a reason) that came before the row in the whole journal — the engine's late rule needs that maximum, and a task only
sees its own segment. So each task, after reading a segment, writes the
running maximum through it to ``index/<name of the following segment>.max``
(atomically); the driver hands the next segment's task the maximum stored
under its own name. One segment per micro-batch keeps that chain exact.

Records are read as in the streaming service (``dqcep.io.ingest``): through the map
(option ``map``: the map file's text), else as event payloads (the
``ColumnDecoder`` kernel for well-formed msgpack ones; ``format``, or each
payload's own), with ``max_future`` (ms; 0: off).
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
from pyspark.sql.datasource import DataSource, DataSourceStreamReader, InputPartition

from dqcep.spark.source import SCHEMA, _Batches

SEG = ".seg"
END_WHERE = "<end of stream>"  # the ``where`` of the control row that closes the stream


def closed_segments(journal: str | Path) -> list[Path]:
    return sorted(Path(journal).glob("*" + SEG), key=lambda p: int(p.stem))


def following(journal: str | Path, segment: Path) -> int:
    """Name of the segment after ``segment`` (closed or open; a segment is closed only
    once the next one exists)."""
    from dqcep.io.journal import segments
    return min(int(p.stem) for p in segments(journal) if int(p.stem) > int(segment.stem))


def _index_file(index: str | Path, n: int) -> Path:
    return Path(index) / f"{n:012d}.max"


def read_max(index: str | Path, n: int):
    """The largest ts of every event before offset n, the name of a segment (None: no
    event yet), or KeyError when the segment before it has not been read."""
    path = _index_file(index, n)
    if not path.exists():
        raise KeyError(n)
    return json.loads(path.read_text())["max"]


def write_max(index: str | Path, n: int, value) -> None:
    path = _index_file(index, n)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"max": value}))
    os.replace(tmp, path)


def read_segment(n: int, path: str, earlier, reader, index: str, after: int):
    """Arrow batches of one closed segment's events and bad payloads (that segment
    only: later ones belong to later micro-batches). Records are read as the
    streaming service reads them (``dqcep.io.ingest.PayloadReader``: the map, the
    format or each payload's own, --max-future); with a map, a segment of intact
    records is read in blocks by the compiled map (``MappedColumns.encode``), each
    record it leaves by the map in Python."""
    from dqcep._kernels.msgpack_decode import ColumnDecoder
    from dqcep.io.journal import segment_items

    out = _Batches(n, earlier)
    decoder = ColumnDecoder([], [], None)
    journal = str(Path(path).parent)
    items = _record_blocks(path) if reader.map is not None else None
    if items is not None:
        yield from _mapped_blocks(items, out, decoder, reader, journal)
    else:
        for record in segment_items(path):
            _read_record(out, record, decoder, reader, journal)
            if out.full():
                yield out.take()
    if out.rows:
        yield out.take()
    write_max(index, after, out.latest)


BLOCK_RECORDS = 65_536  # records scanned at once
EVENTS_BYTES = 4 << 20  # bytes of encoded events written before they become rows


def _record_blocks(path: str):
    """The segment's records as ``RecordBlock``s, and the service's own records (a tick)
    each alone, in order; None unless every byte of it is an intact record in order
    (damage, gaps: the Python reader reports them)."""
    from dqcep._kernels.journal_records import END, LIMIT, STOP_TOPIC, scan_records
    from dqcep.io.journal import SERVICE_TOPICS
    from dqcep.io.journal_tail import RecordBlock
    data = Path(path).read_bytes()
    items, pos, offset = [], 0, int(Path(path).stem)
    stop = SERVICE_TOPICS.encode()
    while pos < len(data):
        spans = np.empty((BLOCK_RECORDS, 6), np.int64)
        end, count, why = scan_records(data, pos, offset, BLOCK_RECORDS, stop, spans)
        if count:
            items.append(RecordBlock(data, offset, spans[:count]))
            pos, offset = end, offset + count
        if why == STOP_TOPIC:  # one record of the service's own, read by the scanner
            one = np.empty((1, 6), np.int64)
            end, count, _ = scan_records(data, pos, offset, 1, b"", one)
            if count != 1:
                return None
            items.append(RecordBlock(data, offset, one).record(0))
            pos, offset = end, offset + 1
        elif not count or why not in (END, LIMIT) or (why == END and end != len(data)):
            return None
    return items


def _mapped_blocks(blocks, out, decoder, reader, journal: str):
    from dqcep._kernels.map_decode import FULL
    from dqcep.io.journal_tail import RecordBlock
    from dqcep.io.mapping import MappedColumns
    mapped = MappedColumns(reader.map, decoder, [], [])
    events = np.empty(EVENTS_BYTES, np.uint8)
    for block in blocks:
        if not isinstance(block, RecordBlock):  # a tick
            _read_record(out, block, decoder, reader, journal)
            continue
        ends = np.zeros(block.count, np.int64)
        ids, ts = np.zeros(block.count, np.int64), np.zeros(block.count, np.int64)
        lo = 0
        while lo < block.count:
            hi, why, at = mapped.encode(block, lo, events, 0, ends, ids, ts)
            if hi > lo:
                lengths = np.diff(ends[lo:hi], prepend=0)
                out.encoded([f"{journal}:offset {block.first + i}" for i in range(lo, hi)],
                            ids[lo:hi], ts[lo:hi], events[:at].tobytes(), lengths)
            elif why == FULL:  # one event larger than the buffer
                events = np.empty(2 * len(events), np.uint8)
            if why != FULL and hi < block.count:
                _read_record(out, block.record(hi), decoder, reader, journal)
                hi += 1
            lo = hi
            if out.full():
                yield out.take()


def _read_record(out, record, decoder, reader, journal: str) -> None:
    """One record into ``out`` as the streaming service reads it."""
    from dqcep.io.ingest import ahead_rows
    from dqcep.io.journal import TICK_TOPIC, Gap, tick_time
    from dqcep.io.payloads import MAX_PAYLOAD
    payload = record.payload
    prefix = f"{journal}:offset {record.offset}"
    if isinstance(payload, Gap):  # damaged records: reported where they were
        out.bad(prefix, f"{payload.count} journal record(s) lost: {payload.reason}")
        return
    if record.topic == TICK_TOPIC:  # time passes (spec section 7): G moves, no event
        at = tick_time(payload)
        if at is None:
            out.bad(prefix, "a tick record without a time")
        else:
            out.tick(prefix, at)
        return
    if reader.event_payloads and isinstance(payload, bytes) and \
            len(payload) <= MAX_PAYLOAD and decoder.decode(payload) >= 0:
        spans = decoder.spans()
        ts, ids, *_ = decoder.take()
        arrival = -1 if record.arrival_us is None else record.arrival_us // 1000
        if not ahead_rows(ts, np.full(len(ts), arrival), reader.max_future).any():
            out.record(prefix, payload, ids, ts, spans)
            return
    events, rejected = reader.read(record)  # names what is wrong with each part
    for r in rejected:
        out.bad(prefix if r.index is None else f"{prefix} event {r.index}", r.reason)
    for ev in events:  # positions of good events in a mixed batch are not kept
        out.event(prefix, ev)


def payload_reader(options: dict):
    """The ``PayloadReader`` the source's options describe (``format``, ``map`` (the
    map file's text) and ``map_name``, ``max_future``)."""
    from dqcep.core.events import MAX_FUTURE_MS
    from dqcep.io.ingest import PayloadReader
    from dqcep.io.mapping import TopicMap
    text = options.get("map") or None
    return PayloadReader(options.get("format") or None,
                         TopicMap.parse(text, options.get("map_name") or "the map") if text
                         else None, int(options.get("max_future") or MAX_FUTURE_MS))


def end_row(latest):
    """One row that tells the partitions the stream is closed (held matches out)."""
    out = _Batches(-1, latest)
    out.bad(END_WHERE, None)
    yield out.take()


class JournalStreamReader(DataSourceStreamReader):
    """Offsets ``{"next": s}``; ``{"next": s, "end": 1}`` once the ``end`` file
    (option) exists and every closed segment is read: a micro-batch of one control
    row that closes the stream. New segments later open it again."""

    def __init__(self, options):
        self.journal = options["path"]
        self.index = options["index"]
        self.end = options.get("end") or None
        # parsed here once; the tasks read with the copy each is sent
        self.payloads = payload_reader(options)

    def _unread(self, start) -> list[Path]:
        return [p for p in closed_segments(self.journal) if int(p.stem) >= start["next"]]

    def initialOffset(self):
        return {"next": 0}

    def latestOffset(self, start=None, limit=None):
        start = start or self.initialOffset()
        unread = self._unread(start)
        if unread:
            return {"next": following(self.journal, unread[0])}
        if self.end and Path(self.end).exists() and not start.get("end"):
            return {"next": start["next"], "end": 1}
        return start

    def _earlier(self, start, name: int):
        """The largest ts before segment ``name`` (None: the first segment read)."""
        return None if start["next"] == 0 and not start.get("end") and \
            not _index_file(self.index, name).exists() else read_max(self.index, name)

    def partitions(self, start, end):
        parts = []
        for seg in self._unread(start):
            if int(seg.stem) >= end["next"]:
                break
            earlier = self._earlier(start, int(seg.stem))
            parts.append(InputPartition(("segment", int(seg.stem), str(seg), earlier,
                                         following(self.journal, seg))))
        if end.get("end") and not start.get("end"):
            n = end["next"]
            parts.append(InputPartition(("end", n, None, self._earlier(start, n), None)))
        return parts

    def read(self, partition):
        what, n, path, earlier, after = partition.value
        if what == "end":
            yield from end_row(earlier)
        else:
            yield from read_segment(n, path, earlier, self.payloads, self.index, after)

    def commit(self, end):
        """The journal may delete what this query has read (its retention)."""
        import hashlib

        from dqcep.io.journal import write_consumer_offset
        name = hashlib.sha256(str(Path(self.index).resolve()).encode()).hexdigest()[:12]
        write_consumer_offset(self.journal, f"spark-{name}", end["next"])


class JournalSource(DataSource):
    """Options: ``path`` (journal directory), ``index`` (a directory for the
    per-segment maxima, e.g. under the query's checkpoint), ``format``, ``map``,
    ``map_name``, ``max_future``."""

    @classmethod
    def name(cls):
        return "dqcep_journal"

    def schema(self):
        return SCHEMA

    def streamReader(self, schema):
        return JournalStreamReader(self.options)
