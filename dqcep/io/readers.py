"""Event files -> Events, with the position of every bad record.

Formats (chosen from the file extension, or given explicitly):

- ``jsonl``: one JSON event object per line (spec section 1); blank lines are skipped.
- ``msgpack``: a stream of msgpack objects, each an event map or a batch
  ``{"events": [<event map>, ...]}`` (the MQTT payload form).
- ``parquet``: the generator's layout (``id``, ``type``, ``ts``, a column per
  attribute; null = absent); positions are ``row N``.
- ``csv``: a header row naming ``id``, ``type``, ``ts`` and attribute columns;
  cells are typed as integer, decimal, ``true``/``false``, or else string; an
  empty cell is an absent attribute.

Readers yield ``(location, event)``; a bad record is an EventInputError naming
``file:line:col`` (text formats), ``file:record N (byte B)`` (msgpack) or
``file:row N`` (Parquet).
"""
from __future__ import annotations

import csv
import io
import itertools
import json
import re
import sys
from pathlib import Path
from typing import IO, Callable, Iterator

import msgpack

from dqcep.core.errors import UserError
from dqcep.core.events import Event, EventError, batch_items, event_from_mapping

FORMATS = ("jsonl", "msgpack", "csv", "parquet")
EXTENSIONS = {".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl",
               ".msgpack": "msgpack", ".mpk": "msgpack", ".csv": "csv",
              ".parquet": "parquet"}


class EventInputError(UserError):
    def __init__(self, source: str, where: str, reason: str):
        self.source, self.where, self.reason = source, where, reason
        super().__init__(f"{source}:{where}: {reason}")


# the generator's ground truth beside its events (``dqcep generate --plant``): JSON
# Lines of matches, not events, so a walked directory leaves it out
TRUTH_SUFFIX = ".truth.jsonl"


def list_event_files(paths: list[str]) -> list[str]:
    """Files of the inputs (directories walked, ground-truth files left out), sorted
    within each input, in order; absolute, since Spark executors run in other working
    directories."""
    out = []
    for p in paths:
        path = Path(p).resolve()  # executors run in other working directories
        if path.is_dir():
            found = sorted(str(f) for f in path.rglob("*") if f.is_file()
                           and f.suffix.lower() in EXTENSIONS
                           and not f.name.startswith((".", "_"))
                           and not f.name.endswith(TRUTH_SUFFIX))
            if not found:
                raise UserError(f"no event files ({', '.join(sorted(EXTENSIONS))}) under {p}")
            out += found
        elif path.is_file():
            out.append(str(path))
        else:
            raise UserError(f"no such input file or directory: {p}")
    return out


def format_for(path: str, fmt: str | None) -> str:
    if fmt:
        if fmt not in FORMATS:
            raise UserError(f"unknown event format {fmt!r}; expected one of {', '.join(FORMATS)}")
        return fmt
    if path == "-":
        return "jsonl"
    ext = Path(path).suffix.lower()
    if ext not in EXTENSIONS:
        raise UserError(f"cannot tell the format of {path!r} from its extension; "
                        f"use --format {'|'.join(FORMATS)}")
    return EXTENSIONS[ext]


def _reject_constant(name: str):
    raise ValueError(f"{name} is not a valid number")


def _event(obj, source: str, where: str) -> tuple[str, Event] | EventInputError:
    try:
        return where, event_from_mapping(obj)
    except EventError as err:
        return EventInputError(source, where, str(err))


# Text files are read with errors="surrogateescape": a byte that is no UTF-8 becomes
# one of these code points, found per line, so one bad line is one bad record.
_NOT_UTF8 = re.compile("[\udc80-\udcff]")


def _not_utf8(text: str, source: str, lineno: int) -> EventInputError | None:
    bad = _NOT_UTF8.search(text)
    if bad is None:
        return None
    byte = ord(bad.group()) - 0xDC00
    return EventInputError(source, f"{lineno}:{bad.start() + 1}",
                           f"not UTF-8 text (byte 0x{byte:02x})")


def jsonl_lines(stream: IO[str], source: str, first_line: int = 1) -> Iterator:
    """The events (or errors) of JSON Lines text whose first line is ``first_line``."""
    for lineno, line in enumerate(stream, start=first_line):
        if not line.strip():
            continue
        bad = _not_utf8(line, source, lineno)
        if bad is not None:
            yield bad
            continue
        try:
            obj = json.loads(line.rstrip("\r\n"), parse_constant=_reject_constant)
        except json.JSONDecodeError as err:
            yield EventInputError(source, f"{lineno}:{err.colno}", f"invalid JSON: {err.msg}")
            continue
        except RecursionError:
            yield EventInputError(source, f"{lineno}:1", "invalid JSON: nested too deeply")
            continue
        except ValueError as err:
            yield EventInputError(source, f"{lineno}:1", f"invalid JSON: {err}")
            continue
        yield _event(obj, source, f"{lineno}:1")


def msgpack_stream(stream: IO[bytes], source: str, base: int = 0, record: int = 0) -> Iterator:
    """The events (or errors) of a msgpack stream that starts at byte ``base`` of its
    file, after ``record`` records. A broken msgpack stream cannot be resynchronised:
    such errors are raised."""
    unpacker = msgpack.Unpacker(stream, raw=False, strict_map_key=False)
    while True:
        offset = base + unpacker.tell()
        record += 1
        try:
            obj = unpacker.unpack()
        except msgpack.OutOfData:
            if base + unpacker.tell() != offset:
                raise EventInputError(source, f"record {record} (byte {offset})",
                                      "truncated msgpack data") from None
            return
        except (msgpack.FormatError, msgpack.StackError, ValueError, TypeError) as err:
            # TypeError: a map or list as a map key (unhashable in Python)
            raise EventInputError(source, f"record {record} (byte {offset})",
                                  f"invalid msgpack: {err}") from None
        yield from msgpack_record(obj, source, f"record {record} (byte {offset})")


def msgpack_record(obj, source: str, where: str) -> Iterator:
    """The events (or errors) of one decoded msgpack record: an event or a batch."""
    try:
        batch = batch_items(obj)
    except EventError as err:
        yield EventInputError(source, where, str(err))
        return
    if batch is None:
        yield _event(obj, source, where)
        return
    for i, item in enumerate(batch):
        yield _event(item, source, f"{where} event {i}")


# How a CSV cell is typed (the one place; the columnar reader runs the same patterns
# through Arrow's RE2, which reads them alike): integer, else decimal, else
# true/false in any case, else string. "Any case" is ASCII case: no other character
# lower-cases into these letters.
CSV_INT = r"[+-]?[0-9]+"
CSV_DEC = r"[+-]?([0-9]+\.[0-9]*|\.[0-9]+|[0-9]+)([eE][+-]?[0-9]+)?"
CSV_TRUE = r"[Tt][Rr][Uu][Ee]"
CSV_BOOL = rf"{CSV_TRUE}|[Ff][Aa][Ll][Ss][Ee]"
_INT, _DEC, _BOOL, _TRUE = (re.compile(p) for p in (CSV_INT, CSV_DEC, CSV_BOOL, CSV_TRUE))


def _csv_cell(text: str):
    if _INT.fullmatch(text):
        return int(text)
    if _DEC.fullmatch(text):
        return float(text)
    if _BOOL.fullmatch(text):
        return _TRUE.fullmatch(text) is not None
    return text


def _csv(stream: IO[str], source: str, texts=None) -> Iterator:
    reader = csv.reader(stream)
    try:
        header = next(reader)
    except StopIteration:
        return
    csv_header(header, source)
    yield from csv_rows(reader, header, source, 0, texts)


def csv_header(header: list[str], source: str) -> None:
    """Raise the error of a CSV header that is not one (line 1)."""
    missing = [c for c in ("id", "type", "ts") if c not in header]
    if missing:
        raise EventInputError(source, "1:1", f"CSV header lacks column(s) {', '.join(missing)}")
    bad = _not_utf8(",".join(header), source, 1)
    if bad is not None:
        raise bad


def csv_text_attrs(schemas) -> dict[str, frozenset[str]]:
    """By event type, the attributes its schema declares STRING (``EVENT Type(...)``): a
    CSV cell of those is text whatever it looks like (room ``101`` stays ``'101'``);
    every other cell is typed by its look (``_csv_cell``)."""
    out = {s.type: frozenset(a.name for a in s.attrs if a.type == "STRING") for s in schemas}
    return {t: attrs for t, attrs in out.items() if attrs}


def csv_rows(reader, header: list[str], source: str, lines_before: int,
             texts: dict[str, frozenset[str]] | None = None) -> Iterator:
    """The events (or errors) of the rows a ``csv.reader`` yields after the header;
    ``lines_before``: lines of the file before the reader's first (positions);
    ``texts``: ``csv_text_attrs`` of the declared schemas."""
    type_at = header.index("type") if texts and "type" in header else None
    for row in reader:
        lineno = lines_before + reader.line_num
        if not any(cell.strip() for cell in row):
            continue
        bad = _not_utf8(",".join(row), source, lineno)
        if bad is not None:
            yield bad
            continue
        if len(row) != len(header):
            yield EventInputError(source, f"{lineno}:1",
                                  f"row has {len(row)} cells, the header has {len(header)}")
            continue
        obj = {}
        text = texts.get(row[type_at], ()) if type_at is not None else ()
        for name, cell in zip(header, row):
            if cell == "":
                continue
            obj[name] = cell if name == "type" or name in text else _csv_cell(cell)
        yield _event(obj, source, f"{lineno}:1")


PARQUET_BATCH_ROWS = 10_000  # rows read at a time; an unreadable batch is named by its first


def parquet_batches(parquet, row_groups=None, batch_rows: int | None = None) -> Iterator:
    """Record batches of a ``pyarrow.parquet.ParquetFile`` (or of the ``row_groups``
    given), row group by row group: a batch never spans two row groups, so a file read
    in runs of row groups has the batches, and the unreadable batch, of a whole read."""
    groups = range(parquet.metadata.num_row_groups) if row_groups is None else row_groups
    for g in groups:
        yield from parquet.iter_batches(batch_size=batch_rows or PARQUET_BATCH_ROWS,
                                        row_groups=[g])


def _parquet(stream: IO[bytes], source: str) -> Iterator:
    """Rows of a Parquet file (the generator's layout: id, type, ts, one column per
    attribute); a null cell is an absent attribute."""
    import pyarrow.parquet as pq  # a plain dependency

    row = 0
    try:
        for batch in parquet_batches(pq.ParquetFile(stream)):
            yield from parquet_rows(batch, source, row)
            row += batch.num_rows
    except (OSError, ValueError) as err:  # pyarrow's ArrowInvalid / ArrowIOError
        raise EventInputError(source, f"row {row + 1}", f"invalid Parquet: {err}") from None



def parquet_rows(batch, source: str, rows_before: int) -> Iterator:
    """The events (or errors) of one record batch of a Parquet file; a null cell is an
    absent attribute."""
    for row, obj in enumerate(batch.to_pylist(), start=rows_before + 1):
        yield _event({k: v for k, v in obj.items() if v is not None}, source, f"row {row}")


def read_events(path: str, fmt: str | None = None,
                on_error: Callable[[EventInputError], None] | None = None,
                texts: dict[str, frozenset[str]] | None = None,
                ) -> Iterator[tuple[str, Event]]:
    """Yield (location, event) from a file, or from stdin when path is '-'.

    A bad record raises EventInputError, or, when ``on_error`` is given, is passed
    to it and reading goes on (unless the stream itself is broken). ``texts``: the
    CSV cells read as text (``csv_text_attrs`` of the declared schemas).
    """
    fmt = format_for(path, fmt)
    source = "<stdin>" if path == "-" else path
    try:
        if fmt in ("msgpack", "parquet"):
            stream = sys.stdin.buffer if path == "-" else open(path, "rb")
        else:
            stream = (io.TextIOWrapper(sys.stdin.buffer, encoding="utf-8", newline="",
                                       errors="surrogateescape")
                      if path == "-" else open(path, encoding="utf-8", newline="",
                                               errors="surrogateescape"))
    except OSError as err:
        raise UserError(f"cannot read event file {path}: {err.strerror}") from None
    decode = {"jsonl": jsonl_lines, "msgpack": msgpack_stream, "parquet": _parquet,
              "csv": lambda stream, source: _csv(stream, source, texts)}[fmt]
    with stream:
        try:
            for item in decode(stream, source):
                if isinstance(item, EventInputError):
                    if on_error is None:
                        raise item
                    on_error(item)
                else:
                    yield item
        except UnicodeDecodeError as err:
            raise EventInputError(source, f"byte {err.start}",
                                  f"not UTF-8 text ({err.reason})") from None


SAMPLE_EVENTS = 10_000


def sample_rates(path: str, fmt: str | None = None, events: int = SAMPLE_EVENTS
                 ) -> dict[str, float] | None:
    """Events per second of each type over the first ``events`` events of a file (the
    span of their ts), for the cost model when no --rates are given; None when the
    file cannot be read twice (stdin) or gives nothing to measure. Bad records are
    left to the run that reads the file after it."""
    if path == "-":
        return None
    try:
        return rates_of(e for _, e in itertools.islice(
            read_events(path, fmt, on_error=lambda err: None), events))
    except (UserError, EventInputError):
        return None


def rates_of(events) -> dict[str, float] | None:
    """Events per second of each type among ``events`` (Event objects), over the span of
    their ts (at least 1 ms); None when there are none. The one rule of the cost
    model's measured rates: a file's first events (``sample_rates``), a service's
    journal (``dqcep.service.streaming``)."""
    counts: dict[str, int] = {}
    lo = hi = None
    for e in events:
        counts[e.type] = counts.get(e.type, 0) + 1
        lo = e.ts if lo is None else min(lo, e.ts)
        hi = e.ts if hi is None else max(hi, e.ts)
    if not counts:
        return None
    seconds = max(hi - lo, 1) / 1000.0
    return {t: n / seconds for t, n in counts.items()}
