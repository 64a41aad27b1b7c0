"""Event files as a Spark data source (``pyspark.sql.datasource``), positions kept.

``spark.read.format("dqcep_events").option("units", json.dumps(event_units(...)))
.load()`` gives one row per record of event files (JSON Lines, msgpack, CSV,
Parquet), in file order, with the record's position; each unit (a file, or a run
of a large Parquet file's row groups) is one input partition, read in an executor
by the same readers as ``dqcep run`` (one set of validation rules and the same
positions). A bad record becomes a row with its ``reason``
instead of an event; a msgpack stream broken beyond resynchronisation ends its
file with one such row. The batch job's modes (``index``, ``ids``, ``route``)
read JSON Lines, CSV and Parquet through ``dqcep run``'s fast paths instead:
their clean blocks come as ``ColumnPiece``s (engine columns, no row per event),
the rest as rows.

Columns: ``file_index`` (position of the unit in ``event_units``: arrival order
across files and runs), ``seq`` (arrival order within the file), ``where``
(as ``dqcep.io.readers`` names positions), ``id``, ``ts``, ``file_before``
(the largest ts of the file's events before this row: for late events),
``event`` (the event map as msgpack) and ``reason`` (null for events).

The files must be readable at the same path from every executor (a local
directory for ``local[*]`` and ``local-cluster``, a shared filesystem on a real
cluster).
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Callable

import numpy as np

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from dqcep.io.readers import format_for, list_event_files
from dqcep.runtime import EventColumns

SCHEMA = ("file_index long, seq long, `where` string, id long, ts long, file_before long, "
          "event binary, reason string")
BATCH_ROWS = 10_000


class _Batches:
    """Builds Arrow record batches of the source's rows, a few columns at a time.

    Events of a well-formed msgpack record arrive as columns (ids, ts, the byte
    range of each event map in the record); others one by one. ``file_before``
    (the largest ts of the file's events before the row) is filled in here.
    """

    def __init__(self, index: int, latest=None, positions: bool = True, seq: int = 0):
        import pyarrow as pa
        self.pa, self.index, self.seq, self.latest = pa, index, seq, latest
        self.broken = False  # the read ended at a record that cannot be resynchronised
        self.positions = positions  # False: ``where`` and ``event`` stay null (the index)
        self._reset()

    def _reset(self):
        self.where, self.reason = [], []
        self.ids, self.ts, self.valid, self.timed = [], [], [], []
        self.data, self.offsets, self.size = [], [0], 0
        self.rows = 0

    def event(self, where: str, ev) -> None:
        import msgpack
        blob = msgpack.packb(ev.as_mapping())
        self._rows([where], [None], [ev.id], [ev.ts], [True], blob, [len(blob)])

    def encoded(self, where: list, ids, ts, blob: bytes, lengths) -> None:
        """Events of records the compiled map read, one a record: their event maps
        (msgpack) one after the other in ``blob``."""
        self._rows(where, [None] * len(where), ids, ts, np.ones(len(where), bool), blob,
                   lengths)

    def bad(self, where: str, reason: str) -> None:
        self._rows([where], [reason], [0], [0], [False], b"", [0])

    def tick(self, where: str, at: int) -> None:
        """A journal's tick (spec section 7): a row with its time as ts, no event and
        no reason; later rows count it in ``file_before``."""
        self._rows([where], [None], [0], [at], [False], b"", [0], timed=True)

    def record(self, prefix: str, payload: bytes, ids, ts, spans) -> None:
        """The n events of one well-formed record (``ColumnDecoder`` output)."""
        if not len(ids):
            return
        if not self.positions:
            self._rows([None] * len(ids), [None] * len(ids), ids, ts, [True] * len(ids), b"",
                       np.zeros(len(ids), np.int64))
            return
        region = payload[spans[0, 0]:spans[-1, 1]]  # event maps are contiguous in a batch
        lengths = spans[:, 1] - spans[:, 0]
        where = [prefix] if len(ids) == 1 and spans[0, 0] == 0 else \
            [f"{prefix} event {i}" for i in range(len(ids))]
        self._rows(where, [None] * len(ids), ids, ts, [True] * len(ids), region, lengths)

    def _rows(self, where, reason, ids, ts, valid, blob, lengths, timed=False) -> None:
        self.where += where
        self.reason += reason
        self.ids.append(np.asarray(ids, np.int64))
        self.ts.append(np.asarray(ts, np.int64))
        self.valid.append(np.asarray(valid, bool))
        self.timed.append(np.full(len(where), timed))
        self.data.append(blob)
        ends = self.size + np.cumsum(np.asarray(lengths, np.int64))
        self.offsets.append(ends)
        self.size = int(ends[-1]) if len(ends) else self.size
        self.rows += len(where)

    def full(self) -> bool:
        return self.rows >= BATCH_ROWS

    def _before(self, ts: np.ndarray) -> np.ndarray:
        """The largest ts of the file's events before each row (``_MIN``: none), for
        rows of these ``ts`` (``_MIN`` for a row that is no event); moves ``latest`` on."""
        running = np.maximum.accumulate(ts)
        before = np.empty(len(ts), np.int64)
        before[1:] = running[:-1]
        before[0] = _MIN
        if self.latest is not None:
            np.maximum(before, self.latest, out=before)
        if len(ts) and running[-1] != _MIN:
            top = int(running[-1])
            self.latest = top if self.latest is None else max(self.latest, top)
        return before

    def piece(self, sourced, path: str) -> ColumnPiece:
        """A fast-path piece's rows, numbered after the rows before it (take those first)."""
        cols = EventColumns(*sourced.columns)
        n = len(cols.ts)
        before = self._before(cols.ts)
        seq = np.arange(self.seq, self.seq + n, dtype=np.int64)
        self.seq += n
        return ColumnPiece(self.index, path, seq, before, cols, sourced.records)

    def take(self):
        pa, n = self.pa, self.rows
        ids, ts, valid, timed = (np.concatenate(x) for x in (self.ids, self.ts, self.valid,
                                                             self.timed))
        timed |= valid  # rows with a time: events and ticks
        before = self._before(np.where(timed, ts, _MIN))
        known = before != _MIN
        offsets = np.concatenate([np.zeros(1, np.int64)] + self.offsets[1:]).astype(np.int32)
        events = pa.Array.from_buffers(pa.binary(), n, [
            pa.py_buffer(np.packbits(valid & self.positions, bitorder="little")),
            pa.py_buffer(offsets), pa.py_buffer(b"".join(self.data))])
        batch = pa.RecordBatch.from_arrays([
            pa.array(np.full(n, self.index, np.int64)),
            pa.array(np.arange(self.seq, self.seq + n, dtype=np.int64)),
            pa.array(self.where, pa.string()),
            pa.array(ids, mask=~valid), pa.array(ts, mask=~timed),
            pa.array(before, mask=~known), events,
            pa.array(self.reason, pa.string())], names=NAMES)
        self.seq += n
        self._reset()
        return batch


@dataclass
class ColumnPiece:
    """Events of one file that a fast path read (``dqcep.io.columnar.read_sourced``):
    every row an event, in arrival order, in the columns of the engine it was read
    for; ``before``: the largest ts of the file's events before each; ``records()``:
    the rows as (position, Event), read again from the piece's bytes when asked."""

    file_index: int
    path: str
    seq: np.ndarray
    before: np.ndarray  # _MIN: no event before it
    columns: EventColumns
    records: Callable[[], list]


_MIN = np.iinfo(np.int64).min


def _broken(raw, offset: int) -> str:
    """Why the stream cannot go on at ``offset``, in the words of dqcep.io.readers
    (it decodes strings while parsing, so a bad string ahead of a cut wins)."""
    import msgpack
    raw.seek(offset)
    unpacker = msgpack.Unpacker(raw, raw=False, strict_map_key=False)
    try:
        unpacker.unpack()
    except msgpack.OutOfData:
        return "truncated msgpack data"
    except (msgpack.FormatError, msgpack.StackError, ValueError, TypeError) as err:
        return f"invalid msgpack: {err}"
    return "invalid msgpack"  # not reached: the record did not parse a moment ago


def _msgpack_rows(out: _Batches, path: str):
    """A msgpack file: each well-formed record decoded by the ColumnDecoder kernel
    (events kept as slices of the record, never re-encoded); any other record
    through the readers' Python path, which names what is wrong."""
    import msgpack

    from dqcep._kernels.msgpack_decode import ColumnDecoder
    from dqcep.io.readers import msgpack_record

    decoder = ColumnDecoder([], [], None)  # validation and ids/ts only
    with open(path, "rb") as f, open(path, "rb") as raw:
        unpacker = msgpack.Unpacker(f, raw=False, strict_map_key=False)
        record = 0
        while True:
            offset = unpacker.tell()
            record += 1
            prefix = f"{path}:record {record} (byte {offset})"
            try:
                unpacker.skip()
            except msgpack.OutOfData:
                if unpacker.tell() != offset:
                    out.bad(prefix, _broken(raw, offset))
                break
            except (msgpack.FormatError, msgpack.StackError, ValueError, TypeError):
                out.bad(prefix, _broken(raw, offset))
                break
            raw.seek(offset)
            payload = raw.read(unpacker.tell() - offset)
            if decoder.decode(payload) >= 0:
                spans = decoder.spans()
                ts, ids, *_ = decoder.take()
                out.record(prefix, payload, ids, ts, spans)
            else:
                try:
                    obj = msgpack.unpackb(payload, raw=False, strict_map_key=False)
                except (ValueError, TypeError) as err:  # not UTF-8; a map as a key
                    out.bad(prefix, f"invalid msgpack: {err}")
                    break
                for item in msgpack_record(obj, path, prefix[len(path) + 1:]):
                    if isinstance(item, tuple):
                        out.event(f"{path}:{item[0]}", item[1])
                    else:
                        out.bad(f"{item.source}:{item.where}", item.reason)
            if out.full():
                yield out.take()


def _after_errors(out: _Batches, read):
    """The items of ``read(on_error)`` (a reader whose bad records go to ``on_error``),
    each after the bad records reported before it, which become rows of ``out`` (in
    file order: before the next good item); a broken file ends the items."""
    from dqcep.io.readers import EventInputError

    errors: list[EventInputError] = []
    items = read(errors.append)
    while True:
        try:
            item = next(items)
        except StopIteration:
            item = None
        except EventInputError as err:  # the stream itself is broken: nothing more to read
            errors.append(err)
            out.broken = True
            item = None
        for err in errors:
            out.bad(f"{err.source}:{err.where}", err.reason)
        errors.clear()
        if item is None:
            return
        yield item


def _reader_rows(out: _Batches, path: str, fmt: str):
    """Any format through dqcep.io.readers, in file order (bad records included)."""
    from dqcep.io.readers import read_events

    for where, ev in _after_errors(out, lambda report: read_events(path, fmt, on_error=report)):
        out.event(f"{path}:{where}", ev)
        if out.full():
            yield out.take()


def _columnar_rows(out: _Batches, path: str, fmt: str, engine, row_groups=None,
                   first_row: int = 0):
    """A JSON Lines, CSV or Parquet file through the fast paths of ``dqcep run``
    (``read_sourced``: kernels and Arrow, no Python object per event) in ``engine``'s
    columns: ``ColumnPiece``s; records the fast path hands to the validator, and bad
    ones, as source rows in between."""
    from dqcep.io.columnar import Sourced, read_sourced

    for piece in _after_errors(out, lambda report: read_sourced(
            path, fmt, engine, report, row_groups=row_groups, first_row=first_row)):
        if isinstance(piece, Sourced):
            if out.rows:
                yield out.take()
            yield out.piece(piece, path)
            continue
        for where, ev in piece:
            out.event(f"{path}:{where}", ev)
            if out.full():
                yield out.take()


class IdsAndTs:
    """The column layout of a file read for its ids and ts alone (the batch job's
    index): no attribute, no type a query uses."""

    attrs: list = []
    types: list = []
    type_code: dict = {}
    dictionary = None

    @staticmethod
    def column_decoder():
        from dqcep._kernels.msgpack_decode import ColumnDecoder
        return ColumnDecoder([], [], None)


class _Refused(Exception):
    pass


def _refuse(_err) -> None:
    raise _Refused


def _msgpack_ids(out: _Batches, path: str):
    """A msgpack file's ids and ts (the index), by ``dqcep run``'s fast path: the kernel
    over whole blocks of records. Positions number the records' rows as the routing
    (``_msgpack_rows``) does only while every record is good, so the pieces are held
    (ids and ts: 16 bytes an event) until the file ends well; at the first bad record
    the file is read again record by record."""
    from dqcep.io.columnar import Sourced, read_columns
    from dqcep.io.readers import EventInputError

    pieces = []
    try:
        for piece in read_columns(path, "msgpack", IdsAndTs, on_error=_refuse):
            if not isinstance(piece, tuple):  # records the kernel left to the validator
                piece = (np.array([e.ts for e in piece], np.int64),
                         np.array([e.id for e in piece], np.int64),
                         np.full(len(piece), -1, np.int32), np.zeros((len(piece), 0)),
                         np.zeros((len(piece), 0), np.int8))
            pieces.append(piece)
    except (_Refused, EventInputError):
        yield from _msgpack_rows(out, path)
        return
    for piece in pieces:
        if len(piece[0]):
            yield out.piece(Sourced(piece, _no_records), path)


def _no_records() -> list:
    raise RuntimeError("a piece read for its ids and ts alone (the index) holds no records")


def read_file(index: int, path: str, fmt: str, positions: bool = True, engine=None,
              row_groups: tuple[int, int] | None = None, first_row: int = 0, out=None):
    """The rows of one file, in file order: Arrow record batches (``SCHEMA``), and,
    given an ``engine`` (``IdsAndTs`` for ids and ts only), ``ColumnPiece``s in its
    columns where the format has a fast path (JSON Lines, CSV, Parquet). ``positions=
    False``: the ``where`` and ``event`` of events in batches left null. ``row_groups``
    (a Parquet file's [first, end) row groups, from ``first_row`` on): that part of the
    file alone, its rows numbered from ``first_row`` (with an engine only)."""
    out = out or _Batches(index, positions=positions, seq=first_row)
    if fmt == "msgpack" and engine is IdsAndTs:
        rows = _msgpack_ids(out, path)
    elif fmt == "msgpack":
        rows = _msgpack_rows(out, path)
    elif engine is not None:
        rows = _columnar_rows(out, path, fmt, engine, row_groups, first_row)
    else:
        rows = _reader_rows(out, path, fmt)
    yield from rows
    if out.rows:
        yield out.take()


NAMES = ["file_index", "seq", "where", "id", "ts", "file_before", "event", "reason"]


# mode=index: one row per unit (its events' count, ts and id ranges, the ids it holds more
# than once with the seq of their first copy, whether its read broke off, and given a
# router, its timelines: ``Router.unit_timelines``); mode=ids:
# (unit, seq, id) per event
INDEX_SCHEMA = ("file_index long, events long, lo long, hi long, min_id long, max_id long, "
                "repeated array<long>, first_seq array<long>, broken boolean, "
                "timelines binary")
IDS_SCHEMA = "file_index long, seq long, id long"
SCHEMAS = {"rows": SCHEMA, "index": INDEX_SCHEMA, "ids": IDS_SCHEMA}


def file_index_row(index: int, batches, out: _Batches | None = None, router=None):
    """The index row of one unit from its rows (``positions=False`` batches), and from
    ``out``, the ``_Batches`` they came through, whether its read broke off. Given a
    ``router`` (a timeline attribute: its engine's columns, events in the batches),
    ``timelines``: the unit's ``Router.unit_timelines`` as msgpack."""
    import msgpack
    import pyarrow as pa
    ids, seq, ts, cols = [], [], [], []
    for b in batches:
        if isinstance(b, ColumnPiece):
            ids.append(b.columns.id)
            seq.append(b.seq)
            ts.append(b.columns.ts)
            cols.append(b.columns)
            continue
        valid = b.column("reason").is_null()
        ids.append(b.column("id").filter(valid).to_numpy())
        seq.append(b.column("seq").filter(valid).to_numpy())
        ts.append(b.column("ts").filter(valid).to_numpy())
        if router is not None and len(ids[-1]):
            from dqcep.spark.executor import event_columns
            cols.append(event_columns(router.assigner.engine,
                                      b.column("event").filter(valid).to_pylist()))
    timelines = None if router is None else msgpack.packb(router.unit_timelines(index, cols))
    ids, seq, ts = (np.concatenate(x) if x else np.zeros(0, np.int64) for x in (ids, seq, ts))
    distinct, first, count = np.unique(ids, return_index=True, return_counts=True)
    more = count > 1
    some = len(ids) > 0
    return pa.RecordBatch.from_pylist([{
        "file_index": index, "events": len(ids),
        "lo": int(ts.min()) if some else None, "hi": int(ts.max()) if some else None,
        "min_id": int(ids.min()) if some else None, "max_id": int(ids.max()) if some else None,
        "repeated": distinct[more].tolist(), "first_seq": seq[first[more]].tolist(),
        "broken": bool(out and out.broken), "timelines": timelines}],
        schema=pa.schema([("file_index", pa.int64()), ("events", pa.int64()),
                          ("lo", pa.int64()), ("hi", pa.int64()), ("min_id", pa.int64()),
                          ("max_id", pa.int64()), ("repeated", pa.list_(pa.int64())),
                          ("first_seq", pa.list_(pa.int64())), ("broken", pa.bool_()),
                          ("timelines", pa.binary())]))


class EventFilesReader(DataSourceReader):
    def __init__(self, options):
        self.units = json.loads(options["units"])
        self.only = json.loads(options.get("only") or "null")
        self.mode = options.get("mode") or "rows"
        # route: every row through it; index: given, a timeline's summary per unit
        self.router = _unpickle(options["router"]) if "router" in options else None

    def partitions(self):
        return [InputPartition((i, *unit)) for i, unit in enumerate(self.units)
                if self.only is None or i in self.only]

    def read(self, partition):
        import pyarrow as pa
        index, path, fmt, lo, hi, first_row = partition.value
        engine = {"rows": None, "ids": IdsAndTs}.get(
            self.mode, self.router.assigner.engine if self.router else IdsAndTs)
        positions = self.mode in ("rows", "route") or self.router is not None
        out = _Batches(index, positions=positions, seq=first_row)
        batches = read_file(index, path, fmt, positions=positions, engine=engine,
                            row_groups=None if lo is None else (lo, hi), first_row=first_row,
                            out=out)
        if self.mode == "index":
            yield file_index_row(index, batches, out, self.router)
            return
        for batch in batches:
            if isinstance(batch, ColumnPiece):
                if self.mode == "route":
                    yield self.router.route_piece(batch)
                else:  # ids
                    yield pa.RecordBatch.from_arrays(
                        [pa.array(np.full(len(batch.seq), index, np.int64)),
                         pa.array(batch.seq), pa.array(batch.columns.id)],
                        names=["file_index", "seq", "id"])
            elif self.mode == "ids":
                valid = batch.column("reason").is_null()
                yield batch.select(["file_index", "seq", "id"]).filter(valid)
            elif self.mode == "route":
                yield self.router.route(batch)
            else:
                yield batch


def _pickle(obj) -> str:
    import base64
    import pickle
    return base64.b64encode(pickle.dumps(obj)).decode()


def _unpickle(text: str):
    import base64
    import pickle
    return pickle.loads(base64.b64decode(text))


class EventFilesSource(DataSource):
    """Options: ``units`` (a JSON list of ``event_units``, in arrival order), ``only``
    (a JSON list of the indexes of the units to read; default all), ``mode``: ``rows``
    (``SCHEMA``, the default), ``index`` and ``ids`` (``INDEX_SCHEMA``, ``IDS_SCHEMA``: what
    the batch job's index needs) or ``route`` (each batch through ``router``, a pickled
    ``dqcep.spark.executor.Router``, in the reading task: its ``schema()``)."""

    @classmethod
    def name(cls):
        return "dqcep_events"

    def schema(self):
        mode = self.options.get("mode") or "rows"
        if mode == "route":
            return _unpickle(self.options["router"]).schema()
        return SCHEMAS[mode]

    def reader(self, schema):
        return EventFilesReader(self.options)


SPLIT_ROWS = 1 << 18  # a Parquet file's row groups are read in runs of about this many rows


def event_units(paths: list[str], fmt: str | None = None, split_rows: int | None = None
                ) -> list[list]:
    """The input tasks over the files of ``paths`` (listed on the driver), in arrival
    order: ``[path, format, first row group, end row group, first row]``, one per file,
    or, for a Parquet file of more than ``split_rows`` rows (default ``SPLIT_ROWS``; 0:
    never), one per run of its row groups of at least ``split_rows`` rows (from the
    file's footer; row groups null: the whole file). A unit's index in this list is its
    ``file_index``."""
    split_rows = SPLIT_ROWS if split_rows is None else split_rows
    units = []
    for path in list_event_files(paths):
        kind = format_for(path, fmt)  # an unknown extension is an error before any task starts
        runs = _row_group_runs(path, split_rows) if kind == "parquet" and split_rows else []
        if len(runs) < 2:
            units.append([path, kind, None, None, 0])
        else:
            units += [[path, kind, lo, hi, first] for lo, hi, first in runs]
    return units


def _row_group_runs(path: str, split_rows: int) -> list[tuple[int, int, int]]:
    """(first row group, end row group, first row) of runs of at least ``split_rows``
    rows; none for a file the footer reader refuses (its read reports why)."""
    import pyarrow.parquet as pq
    try:
        meta = pq.ParquetFile(path).metadata
    except (OSError, ValueError):
        return []
    runs, lo, first, rows = [], 0, 0, 0
    for g in range(meta.num_row_groups):
        rows += meta.row_group(g).num_rows
        if rows - first >= split_rows:
            runs.append((lo, g + 1, first))
            lo, first = g + 1, rows
    if lo < meta.num_row_groups:
        runs.append((lo, meta.num_row_groups, first))
    return runs


def load_events(spark, paths: list[str], fmt: str | None = None, *, mode: str = "rows",
                router=None, only: list[int] | None = None, units: list[list] | None = None):
    """The source's DataFrame over ``units`` (``event_units``; by default of ``paths``,
    Parquet files split by row groups except in ``rows`` mode)."""
    if units is None:
        units = event_units(paths, fmt, 0 if mode == "rows" else None)
    spark.dataSource.register(EventFilesSource)
    reader = (spark.read.format("dqcep_events").option("units", json.dumps(units))
              .option("mode", mode))
    if router is not None:
        reader = reader.option("router", _pickle(router))
    if only is not None:
        reader = reader.option("only", json.dumps(only))
    return reader.load()
