"""Event files as a Spark data source (``pyspark.sql.datasource``), positions kept.

``spark.read.format("dqcep_events").option("paths", json.dumps([...])).load()``
gives one row per record of event files (JSON Lines, msgpack, CSV, Parquet), in file
order, with the record's position; each file is one input partition, read in
an executor by the same readers as ``dqcep run`` (one set of validation rules
and the same positions). A bad record becomes a row with its ``reason``
instead of an event; a msgpack stream broken beyond resynchronisation ends its
file with one such row.

Columns: ``file_index`` (position of the file in the sorted listing: arrival
order across files), ``seq`` (arrival order within the file), ``where``
(as ``dqcep.io.readers`` names positions), ``id``,
``type``, ``ts``, ``event`` (the event map as msgpack) and ``reason``.

The files must be readable at the same path from every executor (a local
directory for ``local[*]`` and ``local-cluster``, a shared filesystem on a real
cluster).
"""
from __future__ import annotations

import json
from pathlib import Path

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

from dqcep.errors import UserError
from dqcep.io.readers import EXTENSIONS, format_for

SCHEMA = ("file_index int, seq long, `where` string, id long, type string, ts long, "
          "event binary, reason string")
BATCH_ROWS = 10_000


def list_event_files(paths: list[str]) -> list[str]:
    """Files of the inputs (directories walked), sorted within each input, in order."""
    out = []
    for p in paths:
        path = Path(p).resolve()  # executors run in other working directories
        if path.is_dir():
            found = sorted(str(f) for f in path.rglob("*")
                           if f.is_file() and f.suffix.lower() in EXTENSIONS and not f.name.startswith((".", "_")))
            if not found:
                raise UserError(f"no event files ({', '.join(sorted(EXTENSIONS))}) under {p}")
            out += found
        elif path.is_file():
            out.append(str(path))
        else:
            raise UserError(f"no such input file or directory: {p}")
    return out


def read_file(index: int, path: str, fmt: str):
    """Rows of one file, as tuples in SCHEMA order."""
    import msgpack

    from dqcep.io.readers import EventInputError, read_events

    seq = 0

    def good(where, ev):
        return (index, seq, where, ev.id, ev.type, ev.ts,
                msgpack.packb({"id": ev.id, "type": ev.type, "ts": ev.ts, **ev.attrs}), None)

    def bad(where, reason):
        return (index, seq, where, None, None, None, None, reason)

    errors: list[EventInputError] = []
    items = read_events(path, fmt, on_error=errors.append)
    while True:
        try:
            where, ev = next(items)
        except StopIteration:
            break
        except EventInputError as err:  # the stream itself is broken: nothing more to read
            errors.append(err)
            ev = None
        for err in errors:  # bad records come in file order, before the next good one
            yield bad(f"{err.source}:{err.where}", err.reason)
            seq += 1
        errors.clear()
        if ev is None:
            break
        yield good(f"{path}:{where}", ev)
        seq += 1
    for err in errors:
        yield bad(f"{err.source}:{err.where}", err.reason)
        seq += 1


ARROW_TYPES = ("int32", "int64", "string", "int64", "string", "int64", "binary", "string")
NAMES = ("file_index", "seq", "where", "id", "type", "ts", "event", "reason")


def _record_batch(pa, columns):
    return pa.RecordBatch.from_arrays(
        [pa.array(c, type=getattr(pa, t)()) for c, t in zip(columns, ARROW_TYPES)],
        names=list(NAMES))


class EventFilesReader(DataSourceReader):
    def __init__(self, options):
        self.files = json.loads(options["paths"])
        self.fmt = options.get("format") or None

    def partitions(self):
        return [InputPartition((i, path, format_for(path, self.fmt)))
                for i, path in enumerate(self.files)]

    def read(self, partition):
        """Arrow record batches of BATCH_ROWS rows (much cheaper for Spark than tuples)."""
        import pyarrow as pa
        index, path, fmt = partition.value
        columns = [[] for _ in ARROW_TYPES]
        for row in read_file(index, path, fmt):
            for col, value in zip(columns, row):
                col.append(value)
            if len(columns[0]) >= BATCH_ROWS:
                yield _record_batch(pa, columns)
                columns = [[] for _ in ARROW_TYPES]
        if columns[0]:
            yield _record_batch(pa, columns)


class EventFilesSource(DataSource):
    """Options: ``paths`` (a JSON list of files, in arrival order), ``format``."""

    @classmethod
    def name(cls):
        return "dqcep_events"

    def schema(self):
        return SCHEMA

    def reader(self, schema):
        return EventFilesReader(self.options)


def load_events(spark, paths: list[str], fmt: str | None = None):
    """The source's DataFrame over the files of ``paths`` (listed on the driver)."""
    files = list_event_files(paths)
    for f in files:
        format_for(f, fmt)  # an unknown extension is an error before any task starts
    spark.dataSource.register(EventFilesSource)
    return (spark.read.format("dqcep_events").option("paths", json.dumps(files))
            .option("format", fmt or "").load())


